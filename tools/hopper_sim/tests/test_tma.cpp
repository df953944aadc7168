// Unit tests for the TMA host logic (tma.cpp). Expected values are worked by hand from the
// driver documentation (cuda.h, cuTensorMapEncodeTiled) and the PTX ISA (5.5.3 tiled mode,
// 5.5.7 swizzling modes); the reasoning is in the comments next to each value.
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <vector>

#include "check.h"
#include "tma.h"

using namespace hsim::tma;

namespace {

// CUtensorMapDataType values used here.
constexpr uint32_t U8 = 0, U16 = 1, U32 = 2, F16 = 6, F32 = 7, F64 = 8, BF16 = 9, TF32_FTZ = 12;

struct Run { uint32_t smem; uint64_t g; uint32_t bytes; bool in; };

std::vector<Run> walk(const TensorMap& m, std::vector<int32_t> c, uint32_t base = 0) {
  std::vector<Run> runs;
  walk_box(m, c.data(), base, [&](uint32_t s, uint64_t g, uint32_t n, bool in) { runs.push_back({s, g, n, in}); });
  return runs;
}

// smem byte offset -> global byte address (or ~0 for an out-of-bounds byte), from the runs.
std::map<uint32_t, uint64_t> byte_map(const std::vector<Run>& runs) {
  std::map<uint32_t, uint64_t> mm;
  for (const Run& r : runs)
    for (uint32_t i = 0; i < r.bytes; ++i) mm[r.smem + i] = r.in ? r.g + i : ~0ull;
  return mm;
}

// Invariants every walk must satisfy: runs within one 16-byte chunk of (base + offset), no smem
// byte written twice, total = box_bytes.
void check_invariants(const TensorMap& m, const std::vector<Run>& runs, uint32_t base) {
  uint64_t total = 0;
  bool chunk_ok = true;
  for (const Run& r : runs) {
    total += r.bytes;
    const uint32_t a = base + r.smem;
    if (r.bytes == 0 || r.bytes > 16 || (a & ~15u) != ((a + r.bytes - 1) & ~15u)) chunk_ok = false;
  }
  CHECK(chunk_ok);
  CHECK_EQ(total, uint64_t(box_bytes(m)));
  CHECK_EQ(byte_map(runs).size(), size_t(box_bytes(m)));
}

// A fake device address: the encoder never dereferences it.
void* dev(uint64_t a) { return reinterpret_cast<void*>(uintptr_t(a)); }
constexpr uint64_t A = 0x100000;

alignas(128) uint8_t g_map[256];

// A baseline 2-D bf16 map that every rule test perturbs one field of.
struct Args {
  void* map = g_map;
  uint32_t dtype = BF16, rank = 2;
  uint64_t addr = A;
  uint64_t dims[5] = {64, 32, 4, 4, 4};
  uint64_t strides[4] = {128, 4096, 16384, 65536};
  uint32_t box[5] = {64, 8, 1, 1, 1};
  uint32_t es[5] = {1, 1, 1, 1, 1};
  uint32_t il = 0, swz = 3, l2 = 0, oob = 0;
  int run() {
    return encode_tiled(map, dtype, rank, dev(addr), dims, strides, box, es, il, swz, l2, oob);
  }
};

TensorMap make(uint32_t dtype, uint32_t rank, std::vector<uint64_t> dims, std::vector<uint64_t> strides,
               std::vector<uint32_t> box, std::vector<uint32_t> es, uint32_t swz = 0, uint32_t il = 0,
               uint32_t oob = 0) {
  alignas(64) uint8_t buf[128];
  int rc = encode_tiled(buf, dtype, rank, dev(A), dims.data(), strides.empty() ? nullptr : strides.data(),
                        box.data(), es.data(), il, swz, 0, oob);
  CHECK_EQ(rc, 0);
  if (rc) std::printf("  encode failed: %s\n", last_encode_error());
  TensorMap m;
  std::string err;
  CHECK(decode(buf, &m, &err));
  return m;
}

void test_validation() {
  // Baseline: bf16 box inner 64*2 = 128 B, exactly the 128B swizzle span; all else in range.
  { Args a; CHECK_EQ(a.run(), 0); }

  // tensorMap: 64-byte aligned required ([DRV] "tensorMap address must be aligned to 64 bytes").
  { Args a; a.map = nullptr; CHECK_EQ(a.run(), 1); }
  { Args a; a.map = g_map + 32; CHECK_EQ(a.run(), 1); }   // 32 mod 64: rejected
  { Args a; a.map = g_map + 64; CHECK_EQ(a.run(), 0); }   // 64-aligned (not 128): accepted

  // dtype: enum 0..15; 13..15 (packed U4/U6) are valid enums we refuse as NOT_SUPPORTED (801).
  { Args a; a.dtype = 16; CHECK_EQ(a.run(), 1); }
  { Args a; a.dtype = 13; CHECK_EQ(a.run(), 801); }
  { Args a; a.dtype = 15; CHECK_EQ(a.run(), 801); }
  { Args a; a.dtype = TF32_FTZ; a.box[0] = 32; CHECK_EQ(a.run(), 0); }  // 32*4 = 128 B

  // rank 1..5.
  { Args a; a.rank = 0; CHECK_EQ(a.run(), 1); }
  { Args a; a.rank = 6; CHECK_EQ(a.run(), 1); }
  { Args a; a.rank = 5; CHECK_EQ(a.run(), 0); }
  { Args a; a.rank = 1; CHECK_EQ(encode_tiled(g_map, BF16, 1, dev(A), a.dims, nullptr, a.box, a.es, 0, 3, 0, 0), 0); }
  // interleave needs rank >= 3.
  { Args a; a.il = 1; a.swz = 0; CHECK_EQ(a.run(), 1); }
  { Args a; a.il = 1; a.swz = 0; a.rank = 3; CHECK_EQ(a.run(), 0); }

  // null arrays.
  { Args a; CHECK_EQ(encode_tiled(g_map, BF16, 2, dev(A), nullptr, a.strides, a.box, a.es, 0, 3, 0, 0), 1); }
  { Args a; CHECK_EQ(encode_tiled(g_map, BF16, 2, dev(A), a.dims, nullptr, a.box, a.es, 0, 3, 0, 0), 1); }

  // globalAddress: 16-byte aligned; 32 with INTERLEAVE_32B.
  { Args a; a.addr = A + 8; CHECK_EQ(a.run(), 1); }
  { Args a; a.addr = A + 16; CHECK_EQ(a.run(), 0); }
  { Args a; a.rank = 3; a.il = 2; a.swz = 1; a.box[0] = 16; a.addr = A + 16; CHECK_EQ(a.run(), 1); }
  { Args a; a.rank = 3; a.il = 2; a.swz = 1; a.box[0] = 16; a.addr = A + 32; CHECK_EQ(a.run(), 0); }

  // globalDim 1..2^32.
  { Args a; a.dims[1] = 0; CHECK_EQ(a.run(), 1); }
  { Args a; a.dims[1] = 1ull << 32; CHECK_EQ(a.run(), 0); }
  { Args a; a.dims[1] = (1ull << 32) + 1; CHECK_EQ(a.run(), 1); }

  // globalStrides: multiple of 16, < 2^40; multiple of 32 with INTERLEAVE_32B.
  { Args a; a.strides[0] = 120; CHECK_EQ(a.run(), 1); }
  { Args a; a.strides[0] = 1ull << 40; CHECK_EQ(a.run(), 1); }
  { Args a; a.strides[0] = (1ull << 40) - 16; CHECK_EQ(a.run(), 0); }
  { Args a; a.rank = 3; a.il = 2; a.swz = 1; a.box[0] = 16; a.strides[0] = 48; CHECK_EQ(a.run(), 1); }
  { Args a; a.rank = 3; a.il = 2; a.swz = 1; a.box[0] = 16; a.strides[0] = 64; CHECK_EQ(a.run(), 0); }

  // boxDim 1..256.
  { Args a; a.box[1] = 0; CHECK_EQ(a.run(), 1); }
  { Args a; a.box[1] = 257; CHECK_EQ(a.run(), 1); }
  { Args a; a.box[1] = 256; CHECK_EQ(a.run(), 0); }
  // boxDim[0] * elemsize multiple of 16 without interleave: bf16 4 -> 8 B rejected, 8 -> 16 B ok.
  { Args a; a.swz = 0; a.box[0] = 4; CHECK_EQ(a.run(), 1); }
  { Args a; a.swz = 0; a.box[0] = 8; CHECK_EQ(a.run(), 0); }
  // ... but not required with interleave (8 B inner box accepted).
  { Args a; a.rank = 3; a.il = 1; a.swz = 0; a.box[0] = 4; CHECK_EQ(a.run(), 0); }

  // elementStrides 1..8 (entry 0 is range-checked too).
  { Args a; a.es[1] = 0; CHECK_EQ(a.run(), 1); }
  { Args a; a.es[1] = 9; CHECK_EQ(a.run(), 1); }
  { Args a; a.es[1] = 8; CHECK_EQ(a.run(), 0); }
  { Args a; a.es[0] = 9; CHECK_EQ(a.run(), 1); }

  // Swizzle span limits on the inner box (interleave none): 128B <= 128, 64B <= 64, 32B <= 32.
  { Args a; a.box[0] = 72; CHECK_EQ(a.run(), 1); }               // 144 B > 128
  { Args a; a.swz = 2; a.box[0] = 32; CHECK_EQ(a.run(), 0); }    // 64 B
  { Args a; a.swz = 2; a.box[0] = 40; CHECK_EQ(a.run(), 1); }    // 80 B > 64
  { Args a; a.swz = 1; a.box[0] = 16; CHECK_EQ(a.run(), 0); }    // 32 B
  { Args a; a.swz = 1; a.box[0] = 24; CHECK_EQ(a.run(), 1); }    // 48 B > 32
  { Args a; a.swz = 0; a.box[0] = 256; CHECK_EQ(a.run(), 0); }   // no swizzle: 512 B fine
  // Swizzle enum: 7 is not a value; 4..6 (128B_ATOM_*) exist but are sm_100: NOT_SUPPORTED.
  { Args a; a.swz = 7; CHECK_EQ(a.run(), 1); }
  { Args a; a.swz = 4; CHECK_EQ(a.run(), 801); }
  // INTERLEAVE_32B requires SWIZZLE_32B.
  { Args a; a.rank = 3; a.il = 2; a.swz = 0; a.box[0] = 16; CHECK_EQ(a.run(), 1); }
  { Args a; a.rank = 3; a.il = 2; a.swz = 3; a.box[0] = 16; CHECK_EQ(a.run(), 1); }
  // interleave enum.
  { Args a; a.rank = 3; a.il = 3; CHECK_EQ(a.run(), 1); }
  // l2Promotion 0..3.
  { Args a; a.l2 = 3; CHECK_EQ(a.run(), 0); }
  { Args a; a.l2 = 4; CHECK_EQ(a.run(), 1); }
  // oobFill 0..1; NaN fill only on float types.
  { Args a; a.oob = 1; CHECK_EQ(a.run(), 0); }                  // bf16
  { Args a; a.oob = 1; a.dtype = U16; CHECK_EQ(a.run(), 1); }   // integer type
  { Args a; a.oob = 2; CHECK_EQ(a.run(), 1); }
  // The failure reason is recorded.
  { Args a; a.box[1] = 0; a.run(); CHECK(std::strlen(last_encode_error()) > 0); }
}

void test_roundtrip() {
  alignas(64) uint8_t buf[128];
  const uint64_t dims[3] = {100, 7, 3};
  const uint64_t strides[2] = {416, 416 * 7};
  const uint32_t box[3] = {16, 4, 2}, es[3] = {1, 2, 3};
  CHECK_EQ(encode_tiled(buf, F32, 3, dev(A + 64), dims, strides, box, es, 0, 2, 2, 1), 0);
  TensorMap m;
  std::string err;
  CHECK(decode(buf, &m, &err));
  CHECK_EQ(m.dtype, F32);
  CHECK_EQ(m.elem_bytes, 4u);
  CHECK_EQ(m.rank, 3u);
  CHECK_EQ(m.global_address, A + 64);
  CHECK_EQ(m.dims[0], 100u); CHECK_EQ(m.dims[1], 7u); CHECK_EQ(m.dims[2], 3u);
  CHECK_EQ(m.strides[0], 4u); CHECK_EQ(m.strides[1], 416u); CHECK_EQ(m.strides[2], 2912u);
  CHECK_EQ(m.box[0], 16u); CHECK_EQ(m.box[1], 4u); CHECK_EQ(m.box[2], 2u);
  CHECK_EQ(m.elem_strides[0], 1u); CHECK_EQ(m.elem_strides[1], 2u); CHECK_EQ(m.elem_strides[2], 3u);
  CHECK_EQ(m.interleave, 0u); CHECK_EQ(m.swizzle, 2u); CHECK_EQ(m.l2_promotion, 2u); CHECK_EQ(m.oob_fill, 1u);

  // Any copy decodes, e.g. one at an odd address (kernel params are not 64-byte aligned).
  uint8_t copy[129];
  std::memcpy(copy + 1, buf, 128);
  TensorMap m2;
  CHECK(decode(copy + 1, &m2, &err));
  CHECK_EQ(m2.dims[0], 100u);
  // Largest dimension (2^32) survives the dims-1 encoding.
  const uint64_t big[1] = {1ull << 32};
  const uint32_t b1[1] = {4}, e1[1] = {1};
  CHECK_EQ(encode_tiled(buf, F32, 1, dev(A), big, nullptr, b1, e1, 0, 0, 0, 0), 0);
  CHECK(decode(buf, &m2, &err));
  CHECK_EQ(m2.dims[0], 1ull << 32);
  // write_map/decode round trip (tensormap.replace style edit).
  m2.global_address = A + 4096;
  write_map(m2, copy + 1);
  TensorMap m3;
  CHECK(decode(copy + 1, &m3, &err));
  CHECK_EQ(m3.global_address, A + 4096);
  // Not a map: zeros, or a modified byte.
  uint8_t zeros[128] = {0};
  CHECK(!decode(zeros, &m3, &err));
  CHECK(!err.empty());
  copy[1 + 40] ^= 1;
  CHECK(!decode(copy + 1, &m3, &err));
}

void test_plain_boxes() {
  // 1-D f32, dims 100, box 8 at x = 4: element k at global A + (4+k)*4, smem 4k; 32 B in two
  // 16-byte chunks.
  {
    TensorMap m = make(F32, 1, {100}, {}, {8}, {1});
    auto r = walk(m, {4});
    CHECK_EQ(r.size(), size_t(2));
    CHECK_EQ(r[0].smem, 0u); CHECK_EQ(r[0].g, A + 16); CHECK_EQ(r[0].bytes, 16u); CHECK(r[0].in);
    CHECK_EQ(r[1].smem, 16u); CHECK_EQ(r[1].g, A + 32); CHECK_EQ(r[1].bytes, 16u); CHECK(r[1].in);
    CHECK_EQ(box_bytes(m), 32u);
    check_invariants(m, r, 0);
  }
  // 2-D u16, dims {40, 10}, row stride 96 B, box {8, 3} at (5, 2): row r at global
  // A + (2+r)*96 + 5*2 = A + 202 + 96r, smem 16r (16-byte rows, one run each).
  {
    TensorMap m = make(U16, 2, {40, 10}, {96}, {8, 3}, {1, 1});
    auto r = walk(m, {5, 2});
    CHECK_EQ(r.size(), size_t(3));
    for (uint32_t i = 0; i < 3 && i < r.size(); ++i) {
      CHECK_EQ(r[i].smem, 16 * i);
      CHECK_EQ(r[i].g, A + 202 + 96 * i);
      CHECK_EQ(r[i].bytes, 16u);
    }
    check_invariants(m, r, 0);
  }
  // 3-D f16, dims {16, 6, 5}, strides {32, 192}, box {8, 2, 3} at (8, 4, 1): rows (i1, i2) at
  // smem 16*(i1 + 2*i2), global A + 8*2 + (4+i1)*32 + (1+i2)*192.
  {
    TensorMap m = make(F16, 3, {16, 6, 5}, {32, 192}, {8, 2, 3}, {1, 1, 1});
    auto mm = byte_map(walk(m, {8, 4, 1}));
    CHECK_EQ(mm.size(), size_t(96));
    CHECK_EQ(mm[0], A + 16 + 128 + 192);              // (0,0): 336
    CHECK_EQ(mm[16], A + 16 + 160 + 192);             // (1,0)
    CHECK_EQ(mm[32 + 2], A + 16 + 128 + 384 + 2);     // (0,1), element 1
    CHECK_EQ(mm[80 + 14], A + 16 + 160 + 576 + 14);   // (1,2), last element
  }
  // 4-D u32, dims {8, 3, 3, 3} dense (strides 32, 96, 288), box {4, 1, 2, 2} at (4, 2, 1, 0):
  // rows (i2, i3) at smem 16*(i2 + 2*i3), global A + 16 + 2*32 + (1+i2)*96 + i3*288.
  {
    TensorMap m = make(U32, 4, {8, 3, 3, 3}, {32, 96, 288}, {4, 1, 2, 2}, {1, 1, 1, 1});
    auto r = walk(m, {4, 2, 1, 0});
    CHECK_EQ(r.size(), size_t(4));
    const uint64_t want[4] = {A + 16 + 64 + 96, A + 16 + 64 + 192, A + 16 + 64 + 96 + 288, A + 16 + 64 + 192 + 288};
    for (uint32_t i = 0; i < 4 && i < r.size(); ++i) { CHECK_EQ(r[i].smem, 16 * i); CHECK_EQ(r[i].g, want[i]); }
    check_invariants(m, r, 0);
  }
  // 5-D u8, dims {32, 4, 4, 4, 4} dense (strides 32, 128, 512, 2048), box {16, 2, 2, 2, 2} at
  // (16, 1, 2, 1, 1): 16 rows; row (i1..i4) at smem 16*(i1 + 2 i2 + 4 i3 + 8 i4), global
  // A + 16 + (1+i1)*32 + (2+i2)*128 + (1+i3)*512 + (1+i4)*2048.
  {
    TensorMap m = make(U8, 5, {32, 4, 4, 4, 4}, {32, 128, 512, 2048}, {16, 2, 2, 2, 2}, {1, 1, 1, 1, 1});
    auto r = walk(m, {16, 1, 2, 1, 1});
    CHECK_EQ(r.size(), size_t(16));
    CHECK_EQ(r[0].g, A + 16 + 32 + 256 + 512 + 2048);              // 2864
    CHECK_EQ(r[15].smem, 240u);
    CHECK_EQ(r[15].g, A + 16 + 64 + 384 + 1024 + 4096);            // 5584
    CHECK_EQ(r[5].smem, 80u);                                      // (1,0,1,0)
    CHECK_EQ(r[5].g, A + 16 + 64 + 256 + 1024 + 2048);
    check_invariants(m, r, 0);
  }
}

void test_out_of_bounds() {
  // f32 dims {10, 5}, row stride 48, box {8, 4} at (-2, 3). Rows y = 3..6; y = 5, 6 are past
  // dims[1] = 5. In a row, x = -2..5: k = 0, 1 (8 B) OOB, k = 2..7 (x = 0..5) in bounds.
  {
    TensorMap m = make(F32, 2, {10, 5}, {48}, {8, 4}, {1, 1});
    auto r = walk(m, {-2, 3});
    check_invariants(m, r, 0);
    CHECK_EQ(r.size(), size_t(10));  // row 0: 8+8+16, row 1: same, rows 2, 3: two OOB chunks each
    if (r.size() == 10) {
      CHECK(!r[0].in); CHECK_EQ(r[0].smem, 0u); CHECK_EQ(r[0].bytes, 8u);
      CHECK(r[1].in); CHECK_EQ(r[1].smem, 8u); CHECK_EQ(r[1].bytes, 8u); CHECK_EQ(r[1].g, A + 144);
      CHECK(r[2].in); CHECK_EQ(r[2].smem, 16u); CHECK_EQ(r[2].bytes, 16u); CHECK_EQ(r[2].g, A + 152);
      CHECK(!r[3].in); CHECK_EQ(r[3].smem, 32u);
      CHECK(r[4].in); CHECK_EQ(r[4].g, A + 192);
      for (int i = 6; i < 10; ++i) CHECK(!r[i].in);
      CHECK_EQ(r[6].smem, 64u);
    }
  }
  // Past the end: 1-D f32 dims 10, box 8 at x = 6: x = 6..9 in (16 B from A + 24), 10..13 OOB.
  {
    TensorMap m = make(F32, 1, {10}, {}, {8}, {1});
    auto r = walk(m, {6});
    CHECK_EQ(r.size(), size_t(2));
    CHECK(r[0].in); CHECK_EQ(r[0].g, A + 24); CHECK_EQ(r[0].bytes, 16u);
    CHECK(!r[1].in); CHECK_EQ(r[1].smem, 16u);
  }
  // Wholly out of bounds: every byte OOB, count still box_bytes (loads fill it all).
  {
    TensorMap m = make(F32, 2, {10, 5}, {48}, {8, 4}, {1, 1});
    for (auto c : std::vector<std::vector<int32_t>>{{100, 0}, {-8, 0}, {0, -4}, {0, 5}, {-2147483647 - 1, 2147483647}}) {
      auto r = walk(m, c);
      bool any_in = false;
      for (auto& x : r) any_in |= x.in;
      CHECK(!any_in);
      check_invariants(m, r, 0);
    }
  }
}

void test_element_strides() {
  // f32 dims {16, 20}, stride 64, box {4, 6}, elementStrides {2, 2} at (0, 1): the dim-0 stride is
  // ignored without interleave (4 elements), dim 1 takes ceil(6/2) = 3 rows: y = 1, 3, 5.
  {
    TensorMap m = make(F32, 2, {16, 20}, {64}, {4, 6}, {2, 2});
    CHECK_EQ(box_elems(m, 0), 4u);
    CHECK_EQ(box_elems(m, 1), 3u);
    CHECK_EQ(box_bytes(m), 48u);
    auto r = walk(m, {0, 1});
    CHECK_EQ(r.size(), size_t(3));
    CHECK_EQ(r[0].g, A + 64); CHECK_EQ(r[1].g, A + 192); CHECK_EQ(r[2].g, A + 320);
    CHECK_EQ(r[2].smem, 32u);
    check_invariants(m, r, 0);
  }
  // box 5 with stride 2: ceil(5/2) = 3 as well; a row landing past the end (y = 1 + 2*2 = 5 with
  // dims[1] = 5) is OOB.
  {
    TensorMap m = make(F32, 2, {16, 5}, {64}, {4, 5}, {1, 2});
    auto r = walk(m, {0, 1});
    CHECK_EQ(r.size(), size_t(3));
    CHECK(r[1].in); CHECK_EQ(r[1].g, A + 192);
    CHECK(!r[2].in);
  }
  // Interleaved (16B) u16 rank 3 honours elementStrides[0] = 2: box 8 -> 4 elements at
  // x = 2, 4, 6, 8 (dims[0] = 8, so x = 8 is OOB), packed at smem 0, 2, 4, 6.
  {
    TensorMap m = make(U16, 3, {8, 4, 2}, {16, 64}, {8, 1, 1}, {2, 1, 1}, 0, 1);
    CHECK_EQ(box_elems(m, 0), 4u);
    auto r = walk(m, {2, 0, 0});
    CHECK_EQ(r.size(), size_t(4));
    if (r.size() == 4) {
      CHECK_EQ(r[0].smem, 0u); CHECK_EQ(r[0].g, A + 4); CHECK_EQ(r[0].bytes, 2u);
      CHECK_EQ(r[2].smem, 4u); CHECK_EQ(r[2].g, A + 12);
      CHECK(!r[3].in); CHECK_EQ(r[3].smem, 6u);
    }
  }
}

void test_swizzle() {
  // The XOR rule on absolute addresses ([PTX 5.5.7] tables: cell ^= line).
  CHECK_EQ(swizzle_address(3, 128), 144u);       // line 1, cell 0 -> cell 1
  CHECK_EQ(swizzle_address(3, 1022), 910u);      // line 7, cell 7 -> cell 0: 896 + 14
  CHECK_EQ(swizzle_address(2, 208), 192u);       // bits 7-8 = 1, cell bits 4-5 = 1 -> 0
  CHECK_EQ(swizzle_address(1, 188), 172u);       // bit 7 = 1 flips bit 4
  CHECK_EQ(swizzle_address(0, 188), 188u);

  // 128B: bf16 box {64, 8} (128-byte rows), tensor {64, 8} dense (stride 128), base 0.
  // Element (x, y) is unswizzled at 128y + 2x; cell x/8 becomes (x/8) ^ y.
  {
    TensorMap m = make(BF16, 2, {64, 8}, {128}, {64, 8}, {1, 1}, 3);
    auto r = walk(m, {0, 0});
    check_invariants(m, r, 0);
    auto mm = byte_map(r);
    auto g = [](uint32_t x, uint32_t y) { return A + 128 * y + 2 * x; };
    CHECK_EQ(mm[0], g(0, 0));        // row 0 unchanged
    CHECK_EQ(mm[144], g(0, 1));      // (0,1): 128 -> cell 0^1 = 1 -> 144
    CHECK_EQ(mm[128], g(8, 1));      // (8,1): 144 -> cell 1^1 = 0 -> 128
    CHECK_EQ(mm[754], g(17, 5));     // (17,5): 674 = 640+32+2 -> cell 2^5 = 7 -> 640+112+2
    CHECK_EQ(mm[910], g(63, 7));     // (63,7): 1022 -> cell 7^7 = 0 -> 896+14
  }
  // 64B: bf16 box {32, 8} (64-byte rows), stride 64. Element (x, y) at 64y + 2x before swizzle;
  // bits [4,6) ^= bits [7,9).
  {
    TensorMap m = make(BF16, 2, {32, 8}, {64}, {32, 8}, {1, 1}, 2);
    CHECK_EQ(smem_row_pitch(m), 64u);
    auto r = walk(m, {0, 0});
    check_invariants(m, r, 0);
    auto mm = byte_map(r);
    auto g = [](uint32_t x, uint32_t y) { return A + 64 * y + 2 * x; };
    CHECK_EQ(mm[144], g(0, 2));      // 128: line 1, cell 0 -> 1
    CHECK_EQ(mm[192], g(8, 3));      // 208: line 1, cell 1 -> 0
    CHECK_EQ(mm[506], g(5, 7));      // 458: line 3, cell 0 -> 3: 458 + 48
    CHECK_EQ(mm[64], g(0, 1));       // 64: line 0, bits 4-5 = 0: unchanged
  }
  // 32B: f32 box {8, 8} (32-byte rows; 8 rows so address bit 7 toggles), stride 32.
  // Element (x, y) at 32y + 4x; bit 4 ^= bit 7.
  {
    TensorMap m = make(F32, 2, {8, 8}, {32}, {8, 8}, {1, 1}, 1);
    auto r = walk(m, {0, 0});
    check_invariants(m, r, 0);
    auto mm = byte_map(r);
    auto g = [](uint32_t x, uint32_t y) { return A + 32 * y + 4 * x; };
    CHECK_EQ(mm[144], g(0, 4));      // 128 -> 144
    CHECK_EQ(mm[128], g(4, 4));      // 144 -> 128
    CHECK_EQ(mm[48], g(4, 1));       // 48: bit 7 = 0, unchanged
    CHECK_EQ(mm[172], g(7, 5));      // 188 -> 172
  }
  // 128B with a base that is 128- but not 1024-aligned: base = 3*1024 + 384 = 3456 (line 3 of
  // the pattern). [PTX] base offset = (3456/128) % 8 = 3, so row y uses cell ^ ((y+3) % 8).
  {
    const uint32_t base = 3456;
    TensorMap m = make(BF16, 2, {64, 8}, {128}, {64, 8}, {1, 1}, 3);
    auto r = walk(m, {0, 0}, base);
    check_invariants(m, r, base);
    auto mm = byte_map(r);
    auto g = [](uint32_t x, uint32_t y) { return A + 128 * y + 2 * x; };
    CHECK_EQ(mm[48], g(0, 0));            // cell 0 ^ 3 = 3
    CHECK_EQ(mm[32], g(8, 0));            // cell 1 ^ 3 = 2
    CHECK_EQ(mm[512 + 112], g(0, 4));     // (4+3)%8 = 7
    CHECK_EQ(mm[640], g(0, 5));           // (5+3)%8 = 0: abs 4096, unchanged
  }
  // Inner box narrower than the span: bf16 box {32, 4} with 128B swizzle. Rows take a whole
  // 128-byte span (see smem_row_pitch); data bytes 256, footprint 512.
  {
    TensorMap m = make(BF16, 2, {64, 8}, {128}, {32, 4}, {1, 1}, 3);
    CHECK_EQ(smem_row_pitch(m), 128u);
    CHECK_EQ(box_bytes(m), 256u);
    CHECK_EQ(smem_footprint(m), 512u);
    auto r = walk(m, {0, 0});
    check_invariants(m, r, 0);
    auto mm = byte_map(r);
    CHECK_EQ(mm[144], A + 128);           // (0,1): 128 -> cell 1
    CHECK_EQ(mm[304], A + 256 + 16);      // (8,2): 272 -> cell 1^2 = 3 -> 304
    CHECK(mm.count(64) == 0);             // (row 0, bytes 64..127) is padding
  }
}

void test_oob_value() {
  uint8_t v[8];
  TensorMap bf = make(BF16, 1, {64}, {}, {8}, {1}, 0, 0, 1);
  oob_value(bf, v);
  CHECK_EQ(v[0], 0xFF); CHECK_EQ(v[1], 0x7F);       // bf16 quiet NaN 0x7FFF
  TensorMap f32z = make(F32, 1, {64}, {}, {4}, {1});
  std::memset(v, 0xAA, 8);
  oob_value(f32z, v);
  CHECK_EQ(v[0], 0); CHECK_EQ(v[3], 0);
  TensorMap f64n = make(F64, 1, {64}, {}, {2}, {1}, 0, 0, 1);
  oob_value(f64n, v);
  uint64_t d; std::memcpy(&d, v, 8);
  CHECK(d == 0x7FFFFFFFFFFFFFFFull);
  TensorMap u = make(U32, 1, {64}, {}, {4}, {1});
  oob_value(u, v);
  CHECK_EQ(v[0], 0);
}

void test_performance() {
  // A 64x128 bf16 box with 128B swizzle (16 KiB, 1024 chunks) must walk in a few microseconds.
  TensorMap m = make(BF16, 2, {4096, 4096}, {8192}, {64, 128}, {1, 1}, 3);
  const int32_t c[2] = {64, 256};
  uint64_t sink = 0;
  const int iters = 2000;
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i)
    walk_box(m, c, 0, [&](uint32_t s, uint64_t g, uint32_t n, bool) { sink += s + g + n; });
  auto t1 = std::chrono::steady_clock::now();
  const double us = std::chrono::duration<double, std::micro>(t1 - t0).count() / iters;
  std::printf("walk_box 64x128 bf16 swizzle128: %.2f us per box (sink %llu)\n", us, (unsigned long long)(sink & 1));
  CHECK(us < 50.0);  // generous bound against noisy machines; expected a few us
}

}  // namespace

// tensormap.replace (PTX ISA, .tile fields): CUTLASS's grouped GEMM (example 57) encodes one map on
// the host and, per group, replaces global_address, global_dim 0..4 and global_stride 0..3 in a
// shared-memory copy. Expectations worked from the ISA: global_dim ord i = extent of dim i,
// global_stride ord i = byte stride of dim i + 1 (a multiple of 16), rank field = rank - 1.
void test_replace() {
  alignas(64) uint8_t buf[128];
  const uint64_t dims[2] = {64, 32}, strides[1] = {128};
  const uint32_t box[2] = {64, 8}, es[2] = {1, 1};
  CHECK_EQ(encode_tiled(buf, BF16, 2, dev(A), dims, strides, box, es, 0, 3, 0, 0), 0);
  std::string err;
  CHECK_EQ(replace_field_id("global_stride"), 4);
  CHECK_EQ(replace_field_id("b1024"), -1);
  // a 3-D group: 96 x 48 x 5 bf16 with rows padded to 256 B and 48 rows per batch
  CHECK(replace_field(buf, replace_field_id("global_address"), 0, A + 0x4000, &err));
  CHECK(replace_field(buf, replace_field_id("rank"), 0, 2, &err));
  CHECK(replace_field(buf, replace_field_id("global_dim"), 0, 96, &err));
  CHECK(replace_field(buf, replace_field_id("global_dim"), 1, 48, &err));
  CHECK(replace_field(buf, replace_field_id("global_dim"), 2, 5, &err));
  CHECK(replace_field(buf, replace_field_id("global_stride"), 0, 256, &err));
  CHECK(replace_field(buf, replace_field_id("global_stride"), 1, 256 * 48, &err));
  CHECK(replace_field(buf, replace_field_id("box_dim"), 2, 1, &err));
  CHECK(replace_field(buf, replace_field_id("element_stride"), 2, 1, &err));
  CHECK(replace_field(buf, replace_field_id("box_dim"), 1, 16, &err));
  CHECK(replace_field(buf, replace_field_id("swizzle_mode"), 0, 2, &err));
  CHECK(replace_field(buf, replace_field_id("fill_mode"), 0, 1, &err));
  TensorMap m;
  CHECK(decode(buf, &m, &err));
  CHECK_EQ(m.rank, 3u);
  CHECK_EQ(m.global_address, A + 0x4000);
  CHECK_EQ(m.dims[0], 96u); CHECK_EQ(m.dims[1], 48u); CHECK_EQ(m.dims[2], 5u);
  CHECK_EQ(m.strides[1], 256u); CHECK_EQ(m.strides[2], 12288u);
  CHECK_EQ(m.box[0], 64u); CHECK_EQ(m.box[1], 16u); CHECK_EQ(m.box[2], 1u);
  CHECK_EQ(m.swizzle, 2u); CHECK_EQ(m.oob_fill, 1u); CHECK_EQ(m.dtype, BF16);
  // box 64 x 16 x 1 bf16 = 2048 bytes
  CHECK_EQ(box_bytes(m), 2048u);
  // values a field cannot hold, and the fields not simulated
  CHECK(!replace_field(buf, replace_field_id("global_stride"), 0, 24, &err));
  CHECK(!replace_field(buf, replace_field_id("global_stride"), 4, 256, &err));
  CHECK(!replace_field(buf, replace_field_id("box_dim"), 0, 257, &err));
  CHECK(!replace_field(buf, replace_field_id("rank"), 0, 5, &err));
  CHECK(!replace_field(buf, replace_field_id("elemtype"), 0, 9, &err));
  CHECK(err.find("not simulated") != std::string::npos);
  uint8_t junk[128] = {0};
  CHECK(!replace_field(junk, 0, 0, A, &err));
  // the failed replaces left the map as it was
  CHECK(decode(buf, &m, &err));
  CHECK_EQ(m.strides[1], 256u);
}

int main() {
  test_validation();
  test_roundtrip();
  test_plain_boxes();
  test_out_of_bounds();
  test_element_strides();
  test_swizzle();
  test_oob_value();
  test_replace();
  test_performance();
  return hsim_test::finish();
}
