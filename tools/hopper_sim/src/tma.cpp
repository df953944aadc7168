// Tensor Memory Accelerator: host-side tensor map encoding (cuTensorMapEncodeTiled) and the
// tile-mode box walk used by cp.async.bulk.tensor.
//
// Sources for the rules below:
//  [DRV] cuda.h (CUDA 13.0), the comment above cuTensorMapEncodeTiled, and the enums
//        CUtensorMapDataType / Interleave / Swizzle / L2promotion / FloatOOBfill.
//  [PTX] PTX ISA 5.5.3 (tiled mode: bounding box, traversal stride, out-of-bound access) and
//        5.5.7 (swizzling modes: the 16-byte-cell tables, "swizzle base offset = (dstMem/128)%N").
//  [PG]  CUDA C++ Programming Guide, "TMA swizzle" (the swizzle requirements table and
//        "if the swizzle width exceeds the inner dimension, allocate the full swizzle width").
#include "tma.h"

#include <cstdio>
#include <cstdlib>

#include <algorithm>
#include <cstring>

namespace hsim::tma {

namespace {

// CUresult values we return.
constexpr int kSuccess = 0;
constexpr int kInvalidValue = 1;    // CUDA_ERROR_INVALID_VALUE
constexpr int kNotSupported = 801;  // CUDA_ERROR_NOT_SUPPORTED: valid enum values we do not model

// CUtensorMapDataType values [DRV].
enum : uint32_t {
  kU8 = 0, kU16, kU32, kS32, kU64, kS64, kF16, kF32, kF64, kBF16, kF32Ftz, kTF32, kTF32Ftz,
  k16U4Align8B, k16U4Align16B, k16U6Align16B
};

// Our layout of the 128 bytes (little-endian, read and written with memcpy so any copy of the map,
// at any alignment, decodes):
//   0 u32 magic   4 u32 checksum (FNV-1a of bytes 8..127, catches maps that are not ours)
//   8 u8 dtype, rank, interleave, swizzle, l2_promotion, oob_fill, elem_bytes, 0
//  16 u64 global_address
//  24 u32 dims[5] - 1     (dims are 1..2^32, so dims-1 fits 32 bits)
//  44 u16 box[5]          (1..256)
//  54 u8  elem_strides[5] (1..8)
//  64 u64 strides[1..4]   (bytes, < 2^40)
//  96..127 zero
constexpr uint32_t kMagic = 0x4D545348u;  // "HSTM"

uint32_t fnv1a(const uint8_t* p, size_t n) {
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < n; ++i) { h ^= p[i]; h *= 16777619u; }
  return h;
}

template <typename T> void put(uint8_t* b, size_t off, T v) { std::memcpy(b + off, &v, sizeof v); }
template <typename T> T get(const uint8_t* b, size_t off) { T v; std::memcpy(&v, b + off, sizeof v); return v; }

thread_local std::string g_last_error;

// The driver says nothing about why an encode failed; HSIM_VERBOSE=1 prints our reason.
int fail(int code, const char* why) {
  g_last_error = why;
  const char* v = getenv("HSIM_VERBOSE");
  if (v && *v && *v != '0') fprintf(stderr, "hopper_sim: cuTensorMapEncodeTiled returns %d: %s\n", code, why);
  return code;
}

// Bytes per element of the byte-sized types; 0 for the packed sub-byte types and unknown values.
uint32_t dtype_bytes(uint32_t dt) {
  switch (dt) {
    case kU8: return 1;
    case kU16: case kF16: case kBF16: return 2;
    case kU32: case kS32: case kF32: case kF32Ftz: case kTF32: case kTF32Ftz: return 4;
    case kU64: case kS64: case kF64: return 8;
    default: return 0;
  }
}

bool is_float(uint32_t dt) {
  return dt == kF16 || dt == kF32 || dt == kF64 || dt == kBF16 || dt == kF32Ftz || dt == kTF32 ||
         dt == kTF32Ftz;
}

uint32_t swizzle_span(uint32_t swz) { return swz >= 1 && swz <= 3 ? (16u << swz) : 0; }

}  // namespace

const char* last_encode_error() { return g_last_error.c_str(); }

int encode_tiled(void* tensor_map, uint32_t dtype, uint32_t rank, void* global_address,
                 const uint64_t* global_dim, const uint64_t* global_strides,
                 const uint32_t* box_dim, const uint32_t* element_strides, uint32_t interleave,
                 uint32_t swizzle, uint32_t l2_promotion, uint32_t oob_fill) {
  g_last_error.clear();
  // [DRV] "tensorMap address must be aligned to 64 bytes."
  if (!tensor_map) return fail(kInvalidValue, "tensorMap is null");
  if (reinterpret_cast<uintptr_t>(tensor_map) % 64) return fail(kInvalidValue, "tensorMap not 64-byte aligned");

  // [DRV] tensorDataType must be a CUtensorMapDataType. The packed 4/6-bit types (13..15) are
  // valid enum values but move sub-byte data we do not model: refused as not supported.
  if (dtype >= k16U4Align8B && dtype <= k16U6Align16B)
    return fail(kNotSupported, "packed sub-byte data types (16U4/16U6) are not modelled");
  const uint32_t eb = dtype_bytes(dtype);
  if (!eb) return fail(kInvalidValue, "tensorDataType is not a CUtensorMapDataType");

  // [DRV] interleave / swizzle / l2Promotion / oobFill must be values of their enums.
  if (interleave > 2) return fail(kInvalidValue, "interleave is not a CUtensorMapInterleave");
  if (swizzle > 6) return fail(kInvalidValue, "swizzle is not a CUtensorMapSwizzle");
  // The 128B_ATOM_* swizzles (4..6) are sm_100 features: not supported on this Hopper model.
  if (swizzle >= 4) return fail(kNotSupported, "128B_ATOM_* swizzle modes are not modelled (sm_100+)");
  if (l2_promotion > 3) return fail(kInvalidValue, "l2Promotion is not a CUtensorMapL2promotion");
  if (oob_fill > 1) return fail(kInvalidValue, "oobFill is not a CUtensorMapFloatOOBfill");

  // [DRV] rank non-zero, <= 5; >= 3 when interleave is not NONE.
  if (rank == 0 || rank > 5) return fail(kInvalidValue, "tensorRank must be 1..5");
  if (interleave != 0 && rank < 3) return fail(kInvalidValue, "interleaved layouts need tensorRank >= 3");

  if (!global_dim || !box_dim || !element_strides || (rank > 1 && !global_strides))
    return fail(kInvalidValue, "null globalDim/globalStrides/boxDim/elementStrides array");

  // [DRV] globalAddress 16-byte aligned; 32-byte aligned with INTERLEAVE_32B.
  const uint64_t ga = reinterpret_cast<uintptr_t>(global_address);
  if (ga % 16) return fail(kInvalidValue, "globalAddress not 16-byte aligned");
  if (interleave == 2 && ga % 32) return fail(kInvalidValue, "globalAddress not 32-byte aligned (INTERLEAVE_32B)");

  // [DRV] globalDim non-zero and <= 2^32.
  for (uint32_t i = 0; i < rank; ++i)
    if (global_dim[i] == 0 || global_dim[i] > (1ull << 32))
      return fail(kInvalidValue, "globalDim must be 1..2^32");

  // [DRV] globalStrides multiple of 16 and < 2^40; multiple of 32 with INTERLEAVE_32B.
  // (The documented "globalStrides[i] >= globalDim[i]" pseudo-assert is not enforced: it is shown
  // as an illustration of padding, not listed as a requirement.)
  for (uint32_t i = 0; i + 1 < rank; ++i) {
    const uint64_t s = global_strides[i];
    if (s % 16) return fail(kInvalidValue, "globalStrides must be multiples of 16");
    if (s >= (1ull << 40)) return fail(kInvalidValue, "globalStrides must be < 2^40");
    if (interleave == 2 && s % 32) return fail(kInvalidValue, "globalStrides must be multiples of 32 (INTERLEAVE_32B)");
  }

  // [DRV] boxDim non-zero and <= 256; boxDim[0]*elemsize multiple of 16 when interleave NONE.
  for (uint32_t i = 0; i < rank; ++i)
    if (box_dim[i] == 0 || box_dim[i] > 256) return fail(kInvalidValue, "boxDim must be 1..256");
  const uint64_t inner_bytes = uint64_t(box_dim[0]) * eb;
  if (interleave == 0 && inner_bytes % 16)
    return fail(kInvalidValue, "boxDim[0] * element size must be a multiple of 16 bytes");

  // [DRV] elementStrides non-zero and <= 8 (entry 0 is range-checked too, then ignored when
  // interleave is NONE).
  for (uint32_t i = 0; i < rank; ++i)
    if (element_strides[i] == 0 || element_strides[i] > 8)
      return fail(kInvalidValue, "elementStrides must be 1..8");

  // [DRV] interleave NONE with a swizzle: inner box bytes <= swizzle span (32/64/128).
  if (interleave == 0 && swizzle != 0 && inner_bytes > swizzle_span(swizzle))
    return fail(kInvalidValue, "boxDim[0] * element size exceeds the swizzle span");
  // [DRV] INTERLEAVE_32B requires SWIZZLE_32B.
  if (interleave == 2 && swizzle != 1) return fail(kInvalidValue, "INTERLEAVE_32B requires SWIZZLE_32B");
  // [DRV] NAN_REQUEST_ZERO_FMA only for floating-point data types.
  if (oob_fill == 1 && !is_float(dtype))
    return fail(kInvalidValue, "NaN OOB fill needs a floating-point data type");

  TensorMap m;
  m.dtype = dtype;
  m.elem_bytes = eb;
  m.rank = rank;
  m.global_address = ga;
  m.strides[0] = eb;
  for (uint32_t i = 0; i < rank; ++i) {
    m.dims[i] = global_dim[i];
    m.box[i] = box_dim[i];
    m.elem_strides[i] = element_strides[i];
    if (i > 0) m.strides[i] = global_strides[i - 1];
  }
  m.interleave = interleave;
  m.swizzle = swizzle;
  m.l2_promotion = l2_promotion;
  m.oob_fill = oob_fill;
  write_map(m, tensor_map);
  return kSuccess;
}

void write_map(const TensorMap& m, void* tensor_map) {
  uint8_t b[128] = {0};
  b[8] = uint8_t(m.dtype);
  b[9] = uint8_t(m.rank);
  b[10] = uint8_t(m.interleave);
  b[11] = uint8_t(m.swizzle);
  b[12] = uint8_t(m.l2_promotion);
  b[13] = uint8_t(m.oob_fill);
  b[14] = uint8_t(m.elem_bytes);
  put<uint64_t>(b, 16, m.global_address);
  for (uint32_t i = 0; i < 5; ++i) {
    const bool used = i < m.rank;
    put<uint32_t>(b, 24 + 4 * i, used && m.dims[i] ? uint32_t(m.dims[i] - 1) : 0);
    put<uint16_t>(b, 44 + 2 * i, used ? uint16_t(m.box[i]) : 0);
    b[54 + i] = used ? uint8_t(m.elem_strides[i]) : 0;
    if (i >= 1) put<uint64_t>(b, 64 + 8 * (i - 1), used ? m.strides[i] : 0);
  }
  put<uint32_t>(b, 0, kMagic);
  put<uint32_t>(b, 4, fnv1a(b + 8, 120));
  std::memcpy(tensor_map, b, 128);
}

namespace {
const char* const kReplaceFields[] = {"global_address", "rank", "box_dim", "global_dim", "global_stride",
                                      "element_stride", "interleave_layout", "swizzle_mode", "fill_mode",
                                      "elemtype"};
}

int replace_field_id(const char* modifier) {
  for (int i = 0; i < 10; ++i)
    if (!std::strcmp(modifier, kReplaceFields[i])) return i;
  return -1;
}

bool replace_field(void* tensor_map, int field, uint32_t ord, uint64_t v, std::string* err) {
  auto bad = [&](const std::string& why) { if (err) *err = why; return false; };
  uint8_t b[128];
  std::memcpy(b, tensor_map, 128);
  if (get<uint32_t>(b, 0) != kMagic) return bad("tensormap.replace on bytes that are not a tensor map (bad magic)");
  bool per_dim = field >= 2 && field <= 5;
  if (per_dim && ord >= (field == 4 ? 4u : 5u))
    return bad("ordinal " + std::to_string(ord) + " out of range for " + kReplaceFields[field]);
  switch (field) {
    case 0: put<uint64_t>(b, 16, v); break;
    case 1:
      if (v > 4) return bad("rank field " + std::to_string(v) + " (rank - 1) above 4");
      b[9] = uint8_t(v + 1);
      break;
    case 2:
      if (v < 1 || v > 256) return bad("box_dim " + std::to_string(v) + " outside [1, 256]");
      put<uint16_t>(b, 44 + 2 * ord, uint16_t(v));
      break;
    case 3:
      if (v < 1 || v > (1ull << 32)) return bad("global_dim " + std::to_string(v) + " outside [1, 2^32]");
      put<uint32_t>(b, 24 + 4 * ord, uint32_t(v - 1));
      break;
    case 4:
      if (v % 16 || v >= (1ull << 40)) return bad("global_stride " + std::to_string(v) + " not a multiple of 16 below 2^40");
      put<uint64_t>(b, 64 + 8 * ord, v);
      break;
    case 5:
      if (v < 1 || v > 8) return bad("element_stride " + std::to_string(v) + " outside [1, 8]");
      b[54 + ord] = uint8_t(v);
      break;
    case 6:
      if (v > 2) return bad("interleave_layout " + std::to_string(v));
      b[10] = uint8_t(v);
      break;
    case 7:
      if (v > 3) return bad("swizzle_mode " + std::to_string(v) + " (96B and others are not sm_90 modes)");
      b[11] = uint8_t(v);
      break;
    case 8:
      if (v > 1) return bad("fill_mode " + std::to_string(v));
      b[13] = uint8_t(v);
      break;
    default:
      return bad(std::string("tensormap.replace.") + kReplaceFields[field] + " is not simulated");
  }
  put<uint32_t>(b, 4, fnv1a(b + 8, 120));
  std::memcpy(tensor_map, b, 128);
  return true;
}

bool decode(const void* tensor_map, TensorMap* out, std::string* err) {
  auto bad = [&](const char* why) { if (err) *err = why; return false; };
  if (!tensor_map) return bad("tensor map pointer is null");
  uint8_t b[128];
  std::memcpy(b, tensor_map, 128);
  if (get<uint32_t>(b, 0) != kMagic) return bad("not a tensor map written by cuTensorMapEncodeTiled (bad magic)");
  if (get<uint32_t>(b, 4) != fnv1a(b + 8, 120)) return bad("tensor map bytes were modified (checksum mismatch)");
  TensorMap m;
  m.dtype = b[8];
  m.rank = b[9];
  m.interleave = b[10];
  m.swizzle = b[11];
  m.l2_promotion = b[12];
  m.oob_fill = b[13];
  m.elem_bytes = b[14];
  if (m.rank < 1 || m.rank > 5 || m.elem_bytes != dtype_bytes(m.dtype) || m.swizzle > 3 || m.interleave > 2)
    return bad("tensor map fields out of range");
  m.global_address = get<uint64_t>(b, 16);
  m.strides[0] = m.elem_bytes;
  for (uint32_t i = 0; i < m.rank; ++i) {
    m.dims[i] = uint64_t(get<uint32_t>(b, 24 + 4 * i)) + 1;
    m.box[i] = get<uint16_t>(b, 44 + 2 * i);
    m.elem_strides[i] = b[54 + i];
    if (i >= 1) m.strides[i] = get<uint64_t>(b, 64 + 8 * (i - 1));
    if (m.box[i] == 0 || m.elem_strides[i] == 0) return bad("tensor map box fields out of range");
  }
  if (out) *out = m;
  return true;
}

uint32_t box_elems(const TensorMap& m, uint32_t dim) {
  if (dim >= m.rank) return 1;
  // [DRV] elementStrides[0] is ignored without interleave; [PTX 5.5.3.2] the dim-0 traversal
  // stride must be 1 for non-interleaved layouts. [DRV] ceil(boxDim[i] / elementStrides[i]).
  const uint32_t s = (dim == 0 && m.interleave == 0) ? 1 : std::max<uint32_t>(1, m.elem_strides[dim]);
  return (m.box[dim] + s - 1) / s;
}

uint32_t box_bytes(const TensorMap& m) {
  uint32_t n = m.elem_bytes;
  for (uint32_t i = 0; i < m.rank; ++i) n *= box_elems(m, i);
  return n;
}

// Row pitch. With a swizzle mode the hardware treats each box row as one swizzle span: [PG] says
// that when the swizzle width exceeds the inner dimension the shared memory must be allocated for
// the full swizzle width, i.e. a narrower row still occupies a whole span (the rest is padding that
// the copy does not write). Without swizzle rows are packed at the inner-box size ([PTX 5.5]:
// shared memory holds the box as linear data).
uint32_t smem_row_pitch(const TensorMap& m) {
  const uint32_t inner = box_elems(m, 0) * m.elem_bytes;
  const uint32_t span = swizzle_span(m.swizzle);
  if (!span) return inner;
  return (inner + span - 1) / span * span;
}

uint32_t smem_footprint(const TensorMap& m) {
  uint32_t n = smem_row_pitch(m);
  for (uint32_t i = 1; i < m.rank; ++i) n *= box_elems(m, i);
  return n;
}

// [PTX 5.5.7] tables (cells of 16 B, rows of 128 B): 32B mode row 1 is 1 0 3 2 5 4 7 6 (cell
// index ^ (row & 1)); 64B mode rows 0..3 are cell ^ row; 128B mode rows 0..7 are cell ^ row. The
// row is address bits [7,10), the cell bits [4,7), hence the XORs below; the "swizzle base offset =
// (dstMem / 128) % 8|4|2" formula says the row is taken from the absolute address.
uint32_t swizzle_address(uint32_t swizzle, uint32_t a) {
  switch (swizzle) {
    case 1: return a ^ ((a >> 3) & 0x10u);
    case 2: return a ^ ((a >> 3) & 0x30u);
    case 3: return a ^ ((a >> 3) & 0x70u);
    default: return a;
  }
}

void walk_box(const TensorMap& m, const int32_t* coords, uint32_t smem_base,
              const std::function<void(uint32_t, uint64_t, uint32_t, bool)>& fn) {
  const uint32_t rank = m.rank;
  if (rank < 1 || rank > 5) return;
  const uint32_t eb = m.elem_bytes;
  const uint32_t swz = m.swizzle;
  uint32_t n[5], step[5], pitch[5];
  for (uint32_t i = 0; i < rank; ++i) {
    n[i] = box_elems(m, i);
    step[i] = (i == 0 && m.interleave == 0) ? 1 : std::max<uint32_t>(1, m.elem_strides[i]);
  }
  // Shared memory: box elements densely, innermost first; dim-1 rows at smem_row_pitch.
  pitch[0] = eb;
  if (rank > 1) pitch[1] = smem_row_pitch(m);
  for (uint32_t i = 2; i < rank; ++i) pitch[i] = pitch[i - 1] * n[i - 1];

  const int64_t dim0 = int64_t(m.dims[0]);
  const int64_t c0 = coords[0];
  const uint32_t row_bytes = n[0] * eb;

  // Emits bytes [b0, b1) of the current row (unswizzled row offset `row_off`), split at absolute
  // 16-byte chunks because the swizzle permutes whole chunks.
  auto emit = [&](uint32_t row_off, uint32_t b0, uint32_t b1, uint64_t g0, bool in) {
    uint32_t b = b0;
    while (b < b1) {
      const uint32_t abs = smem_base + row_off + b;
      const uint32_t len = std::min<uint32_t>(b1 - b, 16u - (abs & 15u));
      fn(swizzle_address(swz, abs) - smem_base, in ? g0 + (b - b0) : 0, len, in);
      b += len;
    }
  };

  uint32_t idx[5] = {0, 0, 0, 0, 0};
  for (;;) {
    // Outer dims: the row is in bounds only if every outer coordinate is.
    bool row_in = true;
    uint64_t gbase = m.global_address;
    uint32_t row_off = 0;
    for (uint32_t i = 1; i < rank; ++i) {
      const int64_t g = int64_t(coords[i]) + int64_t(idx[i]) * step[i];
      if (g < 0 || g >= int64_t(m.dims[i])) row_in = false;
      else gbase += uint64_t(g) * m.strides[i];
      row_off += idx[i] * pitch[i];
    }
    if (step[0] == 1) {
      // Elements k in [lo, hi) are in bounds (global x = c0 + k in [0, dim0)).
      int64_t lo = 0, hi = 0;
      if (row_in) {
        lo = std::clamp<int64_t>(-c0, 0, n[0]);
        hi = std::clamp<int64_t>(dim0 - c0, 0, n[0]);
        if (hi < lo) hi = lo;
      }
      const uint32_t blo = uint32_t(lo) * eb, bhi = uint32_t(hi) * eb;
      if (blo > 0) emit(row_off, 0, blo, 0, false);
      if (bhi > blo) emit(row_off, blo, bhi, gbase + uint64_t(c0 + lo) * eb, true);
      if (row_bytes > bhi) emit(row_off, bhi, row_bytes, 0, false);
    } else {
      // Strided dim 0 (interleaved layouts only): one element at a time.
      for (uint32_t k = 0; k < n[0]; ++k) {
        const int64_t x = c0 + int64_t(k) * step[0];
        const bool in = row_in && x >= 0 && x < dim0;
        emit(row_off, k * eb, (k + 1) * eb, in ? gbase + uint64_t(x) * eb : 0, in);
      }
    }
    uint32_t i = 1;
    while (i < rank) {
      if (++idx[i] < n[i]) break;
      idx[i] = 0;
      ++i;
    }
    if (i >= rank) break;
  }
}

void oob_value(const TensorMap& m, uint8_t* out) {
  std::memset(out, 0, m.elem_bytes);
  if (m.oob_fill != 1 || !is_float(m.dtype)) return;
  // [PTX 5.5.3.3] OOB-NaN fill: a "special NaN". Its exact bits are not documented; we use the
  // positive quiet NaN with all mantissa bits set, in the element's format.
  switch (m.elem_bytes) {
    case 2: { uint16_t v = 0x7FFF; std::memcpy(out, &v, 2); break; }          // f16 and bf16
    case 4: { uint32_t v = 0x7FFFFFFFu; std::memcpy(out, &v, 4); break; }     // f32 / tf32
    case 8: { uint64_t v = 0x7FFFFFFFFFFFFFFFull; std::memcpy(out, &v, 8); break; }
    default: break;
  }
}

}  // namespace hsim::tma
