// Tensor Memory Accelerator: cuTensorMapEncodeTiled (validated as the driver does, stored in the
// 128-byte CUtensorMap in our own layout) and the box walk of cp.async.bulk.tensor loads, stores and
// reductions (tile mode, 1-5 D, out-of-bounds fill, swizzle none/32/64/128 B).
#pragma once
#include <cstdint>
#include <functional>
#include <string>

namespace hsim::tma {

struct TensorMap {
  uint32_t dtype = 0;           // CUtensorMapDataType value
  uint32_t elem_bytes = 0;      // bytes per element (from dtype; 4-bit/6-bit packed types rejected)
  uint32_t rank = 0;            // 1..5
  uint64_t global_address = 0;
  uint64_t dims[5] = {0};       // elements
  uint64_t strides[5] = {0};    // bytes; strides[0] = elem_bytes (implicit), strides[i] for dim i
  uint32_t box[5] = {0};        // elements
  uint32_t elem_strides[5] = {0};
  uint32_t interleave = 0;      // CUtensorMapInterleave
  uint32_t swizzle = 0;         // CUtensorMapSwizzle: 0 none, 1 32B, 2 64B, 3 128B (others rejected)
  uint32_t l2_promotion = 0;
  uint32_t oob_fill = 0;        // 0: zeros, 1: NaN-request-zero FMA (fill with NaN for floats)
};

// cuTensorMapEncodeTiled with the driver's argument checks; returns a CUresult value (0 success,
// 1 CUDA_ERROR_INVALID_VALUE, ...). On success writes the map into tensor_map (128 bytes, 64-byte
// aligned as the driver requires).
int encode_tiled(void* tensor_map, uint32_t dtype, uint32_t rank, void* global_address,
                 const uint64_t* global_dim, const uint64_t* global_strides /*rank-1 entries*/,
                 const uint32_t* box_dim, const uint32_t* element_strides, uint32_t interleave,
                 uint32_t swizzle, uint32_t l2_promotion, uint32_t oob_fill);
// Reads a map written by encode_tiled; false (with *err) if the 128 bytes are not one.
bool decode(const void* tensor_map, TensorMap* out, std::string* err);

// Size in bytes of the shared-memory box of a tile-mode copy (what complete_tx counts).
uint32_t box_bytes(const TensorMap& m);

// Walks a tile-mode box at `coords` (rank int32 coordinates of the box's first element, may be
// negative or past the end). For each contiguous run of elements it calls
//   fn(smem_offset, global_address, bytes, in_bounds)
// smem_offset is relative to the destination/source start and already swizzled (the swizzle XORs
// address bits [4,7) with bits [7,10) as the mode says, taken from (smem_base + offset) so a base
// that is not 1024-aligned is handled as the hardware does); global_address is valid only when
// in_bounds. Out-of-bounds elements are reported with in_bounds = false (loads fill them, stores
// skip them). Runs never cross a 16-byte swizzle chunk.
void walk_box(const TensorMap& m, const int32_t* coords, uint32_t smem_base,
              const std::function<void(uint32_t smem_offset, uint64_t global_address, uint32_t bytes,
                                       bool in_bounds)>& fn);

// The fill bytes for an out-of-bounds element of this map (zero, or a NaN pattern when oob_fill
// asks for NaN on a float type).
void oob_value(const TensorMap& m, uint8_t* out /*elem_bytes*/);

// ---- Additions (beyond the original contract) ----

// Why the last encode_tiled on this thread failed ("" after a success): names the violated rule.
const char* last_encode_error();

// Writes `m` into the 128-byte map in our layout without validating it (for tensormap.replace-style
// updates: decode, change a field, write back). tensor_map needs no particular alignment here.
void write_map(const TensorMap& m, void* tensor_map);

// Elements the box covers along dim i: ceil(box[i] / elem_strides[i]); dim 0 ignores its stride
// when interleave is none (the driver documents elementStrides[0] as ignored then).
uint32_t box_elems(const TensorMap& m, uint32_t dim);

// Shared-memory bytes between consecutive box rows (dim-1 steps): the inner box in bytes, rounded
// up to the swizzle span (32/64/128 B) when a swizzle mode is set (see tma.cpp for why).
uint32_t smem_row_pitch(const TensorMap& m);

// Shared-memory bytes the box occupies including row padding (>= box_bytes).
uint32_t smem_footprint(const TensorMap& m);

// The hardware swizzle of an absolute shared address: bits [4,7)^=[7,10) (128B), [4,6)^=[7,9)
// (64B), bit 4 ^= bit 7 (32B); identity for none.
uint32_t swizzle_address(uint32_t swizzle, uint32_t smem_address);

// tensormap.replace.tile: the field a modifier names (global_address, rank, box_dim, global_dim,
// global_stride, element_stride, interleave_layout, swizzle_mode, fill_mode, elemtype), -1 if none.
int replace_field_id(const char* modifier);
// Replaces one field of the 128-byte map in place (PTX ISA tensormap.replace, values as the
// instruction takes them: rank is rank - 1, global_stride ord i is the byte stride of dimension
// i + 1, the rest are the field's value). The map need not be valid before (a sequence of replaces
// may pass through invalid states); cp.async.bulk.tensor decodes and checks it at use. Returns false
// with *err for a value the field cannot hold or a field not simulated.
bool replace_field(void* tensor_map, int field, uint32_t ord, uint64_t value, std::string* err);

}  // namespace hsim::tma
