// Host- and device-side logic that needs no GPU to be right: the mask predicate, which key blocks
// a query block visits (and which of them need no mask) and its transpose for the backward, the tile
// size per head dim, and the persistent scheduler's tile order. Plain C++17; unit-tested on the
// CPU against flash3/masking.py (tests/test_host_logic.py) and used unchanged by the kernels.
#pragma once

#if defined(__CUDACC__)
#define FLASH3_HD __host__ __device__ __forceinline__
#else
#define FLASH3_HD inline
#endif

namespace flash3 {

FLASH3_HD constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }
// Floor division that is right for negative numerators (C++ '/' truncates toward zero).
FLASH3_HD constexpr int floor_div(int a, int b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
FLASH3_HD constexpr int imin(int a, int b) { return a < b ? a : b; }
FLASH3_HD constexpr int imax(int a, int b) { return a > b ? a : b; }

// ---------------------------------------------------------------------------------------------
// Mask. Query i sees key j iff j < seqlen_k and
//   (left  < 0 || j >= i + seqlen_k - seqlen_q - left) and
//   (right < 0 || j <= i + seqlen_k - seqlen_q + right),
// causal acting as right = 0 (bottom-right aligned). -1 means unbounded.
struct Mask {
  int seqlen_q, seqlen_k, left, right;

  FLASH3_HD static Mask make(int seqlen_q, int seqlen_k, bool causal, int window_left,
                             int window_right) {
    return Mask{seqlen_q, seqlen_k, window_left < 0 ? -1 : window_left,
                causal ? 0 : (window_right < 0 ? -1 : window_right)};
  }
  FLASH3_HD int offset() const { return seqlen_k - seqlen_q; }
  FLASH3_HD bool visible(int i, int j) const {
    return j >= 0 && j < seqlen_k && (left < 0 || j >= i + offset() - left) &&
           (right < 0 || j <= i + offset() + right);
  }
  // First and one-past-last key any row in [row_begin, row_end) may see (before clipping to
  // block granularity). Empty when first >= last.
  FLASH3_HD int first_key(int row_begin) const {
    return left < 0 ? 0 : imax(0, row_begin + offset() - left);
  }
  FLASH3_HD int last_key(int row_end) const {
    return right < 0 ? seqlen_k : imin(seqlen_k, row_end - 1 + offset() + right + 1);
  }
};

// Half-open range of key blocks [begin, end). Loops run from end - 1 down to begin.
struct BlockRange {
  int begin, end;
  FLASH3_HD bool empty() const { return begin >= end; }
  FLASH3_HD int size() const { return end > begin ? end - begin : 0; }
};

// Key blocks holding at least one key visible to at least one row of query block m_block.
FLASH3_HD BlockRange key_block_range(const Mask& mask, int m_block, int block_m, int block_n) {
  const int row_begin = m_block * block_m;
  const int row_end = imin(row_begin + block_m, mask.seqlen_q);
  if (row_begin >= row_end || mask.seqlen_k <= 0) return {0, 0};
  const int k0 = mask.first_key(row_begin), k1 = mask.last_key(row_end);
  if (k0 >= k1) return {0, 0};
  return {k0 / block_n, ceil_div(k1, block_n)};
}

// Blocks of key_block_range in which every (row < seqlen_q, key) pair is visible and the block
// is full, so the kernel can skip the mask there. The blocks of the outer range above `end` and
// below `begin` need masking. Returned clamped into the outer range (possibly empty).
FLASH3_HD BlockRange unmasked_key_block_range(const Mask& mask, int m_block, int block_m,
                                              int block_n) {
  const BlockRange outer = key_block_range(mask, m_block, block_m, block_n);
  if (outer.empty()) return outer;
  const int row_begin = m_block * block_m;
  const int row_end = imin(row_begin + block_m, mask.seqlen_q);
  // The latest-starting row bounds the left edge; the earliest-ending row bounds the right edge.
  int lo = mask.left < 0 ? 0 : ceil_div(imax(0, row_end - 1 + mask.offset() - mask.left), block_n);
  int hi = mask.seqlen_k / block_n;  // full blocks only
  if (mask.right >= 0) hi = imin(hi, floor_div(row_begin + mask.offset() + mask.right + 1, block_n));
  lo = imax(lo, outer.begin);
  hi = imin(hi, outer.end);
  if (lo >= hi) return {outer.end, outer.end};
  return {lo, hi};
}

// The backward's transpose: query blocks with a row that sees key block n_block. Key j is seen by
// rows j - offset - right .. j - offset + left, an interval shifting by one per key, so the rows
// seeing any key of the block form one interval (flash3/masking.py: query_block_range).
FLASH3_HD BlockRange query_block_range(const Mask& mask, int n_block, int block_m, int block_n) {
  const int key_begin = n_block * block_n;
  const int key_end = imin(key_begin + block_n, mask.seqlen_k);
  if (key_begin >= key_end || mask.seqlen_q <= 0) return {0, 0};
  const int r0 = mask.right < 0 ? 0 : imax(0, key_begin - mask.offset() - mask.right);
  const int r1 = mask.left < 0 ? mask.seqlen_q
                               : imin(mask.seqlen_q, key_end - 1 - mask.offset() + mask.left + 1);
  if (r0 >= r1) return {0, 0};
  return {r0 / block_m, ceil_div(r1, block_m)};
}

// Query blocks of query_block_range that need no mask against key block n_block: both blocks
// full and every (row, key) pair visible. Clamped into the outer range (possibly empty).
FLASH3_HD BlockRange unmasked_query_block_range(const Mask& mask, int n_block, int block_m,
                                                int block_n) {
  const BlockRange outer = query_block_range(mask, n_block, block_m, block_n);
  const int key_begin = n_block * block_n;
  if (outer.empty() || key_begin + block_n > mask.seqlen_k) return {outer.end, outer.end};
  // The last key bounds the rows from below, the first key bounds them from above.
  int lo = mask.right < 0 ? 0
                          : ceil_div(imax(0, key_begin + block_n - 1 - mask.offset() - mask.right),
                                     block_m);
  int hi = mask.seqlen_q / block_m;  // full blocks only
  if (mask.left >= 0) hi = imin(hi, floor_div(key_begin - mask.offset() + mask.left + 1, block_m));
  lo = imax(lo, outer.begin);
  hi = imin(hi, outer.end);
  if (lo >= hi) return {outer.end, outer.end};
  return {lo, hi};
}

// ---------------------------------------------------------------------------------------------
// Tile shapes per (head dim, value head dim), shared by bf16 and fp16; block_m = 64 rows per
// consumer warpgroup. The budget, per consumer thread (a warpgroup owns 64 rows): S takes
// block_n / 2 fp32 registers, P block_n / 4 (16-bit pairs), O d_v / 2; setmaxnreg gives a consumer
// 232 registers with 2 consumer warpgroups, 160 with 3 (fwd/traits.cuh). Shared memory (16-bit elements):
// 2 * (block_m * d + stages * block_n * (d + d_v)) bytes of the 227 KB; O is staged in V's buffer,
// so it costs nothing (block_m <= stages * block_n). block_n is a multiple of 16 (P.V k-steps).
//   d 64:   192 x 128, 3 consumers: S 64 + P 32 + O 32 = 128 of 160; smem 88 KB. FA3's non-causal
//           192 x 192 needs S 96 + P 48 + O 32 = 176 > 160: it passes P through shared memory.
//   d 96:   192 x 96, 3 consumers: S 48 + P 24 + O 48 = 120 of 160; smem 108 KB. At 192 x 128
//           (144 + addressing) ptxas spilled.
//   d 128:  128 x 128 (causal/local): S 64 + P 32 + O 64 = 160 of 232; smem 160 KB.
//           wide (full attention, FA3's choice): 128 x 176: S 88 + P 44 + O 64 = 196 of 232;
//           smem 32 + 2 * 2 * 44 = 208 KB. Causal keeps 128: a narrower diagonal block wastes less.
//   d 192:  128 x 112 for d_v 192: smem 48 + 2 * 2 * 42 = 216 KB (128 x 128 would be 240 KB);
//           128 x 128 for d_v 128: smem 48 + 2 * 2 * 40 = 208 KB; S 64 + P 32 + O 64 / 96.
//   d 256:  128 x 80: O alone is 128 registers; smem 64 + 2 * 2 * 40 = 224 KB.
struct TileShape {
  int block_m, block_n, stages, num_consumers;
};

// `wide`: the tile for full (unmasked) attention where it differs; see fwd_has_wide_tile.
FLASH3_HD constexpr TileShape fwd_tile_shape(int head_dim, int head_dim_v, bool wide = false) {
  return head_dim <= 64    ? TileShape{192, 128, 2, 3}
         : head_dim <= 96  ? TileShape{192, 96, 2, 3}
         : head_dim <= 128 ? TileShape{128, wide ? 176 : 128, 2, 2}
         : head_dim <= 192 ? TileShape{128, head_dim_v <= 128 ? 128 : 112, 2, 2}
                           : TileShape{128, 80, 2, 2};
}

// FP8 (e4m3) forward tiles: 2 consumer warpgroups of 64 rows (the q descales are per 64-row
// slab). Registers per consumer thread (232): S block_n/2, P block_n/8, O d_v/2 and the fresh
// two-level accumulator d_v/2 (d_v <= 128) or 64 (a 128-column chunk), all live at once while the
// softmax runs under P.V. d = 64 keeps 128 keys (64 + 16 + 32 + 32); at d = 128, 128 keys need
// 208 and spilled (ptxas), so 64 keys (32 + 8 + 64 + 64) with 4 stages; d = 256 (O 128 + chunk 64,
// no overlap) 64 keys, 3 stages. block_n divides 128: k/v descales per 128 keys hold per tile.
FLASH3_HD constexpr TileShape fwd_fp8_tile_shape(int head_dim, int head_dim_v) {
  return head_dim <= 64 && head_dim_v <= 64     ? TileShape{128, 128, 2, 2}
         : head_dim <= 128 && head_dim_v <= 128 ? TileShape{128, 64, 4, 2}
                                                : TileShape{128, 64, 3, 2};
}

// FP8 varlen Vt (h_k, d_v, columns): sequence `batch`, whose keys start at `first_key` in the packed
// k, starts at this column: a multiple of 16 (V_PERM16 groups must line up with the kernel's key
// blocks), computed from (first_key, batch) alone so nothing needs a prefix sum, and at least
// round_up(len, 16) before the next sequence's (first_key grows by len, 15 * batch by 15).
// fp8_varlen_vt_offset(total_k, batch count) is the number of columns (flash3/fp8.py twin).
FLASH3_HD constexpr long long fp8_varlen_vt_offset(long long first_key, long long batch) {
  return (first_key + 15 * batch + 15) / 16 * 16;
}

// Whether (d, d_v) has a second kernel with a wider tile for calls without a causal/local mask.
FLASH3_HD constexpr bool fwd_has_wide_tile(int head_dim, int head_dim_v) {
  return fwd_tile_shape(head_dim, head_dim_v, true).block_n != fwd_tile_shape(head_dim, head_dim_v).block_n;
}

// Shared memory the mainloop needs for 16-bit elements: Q, and `stages` copies of K and V.
// O is staged through V's buffer after the tile's last P.V, so it costs nothing extra.
FLASH3_HD constexpr int fwd_smem_bytes(int head_dim, int head_dim_v, bool wide = false) {
  return 2 * (fwd_tile_shape(head_dim, head_dim_v, wide).block_m * head_dim +
              fwd_tile_shape(head_dim, head_dim_v, wide).stages *
                  fwd_tile_shape(head_dim, head_dim_v, wide).block_n * (head_dim + head_dim_v));
}

// ---------------------------------------------------------------------------------------------
// Persistent tile scheduler order. A tile is (m_block, head, batch). Tiles are numbered so that
// (1) heads are grouped so the K and V of one group fit in about half of L2 and stay resident
//     while every query block of the group runs (GQA heads sharing a KV head are adjacent), and
// (2) inside a group the heaviest query blocks come first when the mask is causal/local
//     (with bottom-right causal the last query blocks see the most keys), so the tail of the
//     schedule holds short tiles.
struct TileCoord {
  int m_block, head, batch;
};

struct TileOrder {
  int num_m_blocks, num_heads, batch, heads_per_group;
  bool heaviest_first;

  FLASH3_HD static TileOrder make(int num_m_blocks, int num_heads, int batch, int seqlen_k,
                                  int head_dim, int head_dim_v, int num_heads_k, int l2_bytes,
                                  bool causal_or_local) {
    // Bytes of K + V for one KV head; q heads per KV head share them.
    const long long kv_bytes = 2LL * seqlen_k * (head_dim + head_dim_v);
    const int q_per_kv = num_heads / (num_heads_k > 0 ? num_heads_k : 1);
    long long groups_of_kv = kv_bytes > 0 ? (l2_bytes / 2) / kv_bytes : num_heads_k;
    int hpg = (int)(groups_of_kv < 1 ? 1 : groups_of_kv) * q_per_kv;
    hpg = imax(1, imin(hpg, num_heads));
    return TileOrder{num_m_blocks, num_heads, batch, hpg, causal_or_local};
  }
  FLASH3_HD int num_tiles() const { return num_m_blocks * num_heads * batch; }

  FLASH3_HD TileCoord at(int idx) const {
    const int per_batch = num_m_blocks * num_heads;
    const int b = idx / per_batch;
    int r = idx - b * per_batch;
    const int group_size_full = heads_per_group * num_m_blocks;
    const int g = r / group_size_full;
    r -= g * group_size_full;
    const int head0 = g * heads_per_group;
    const int heads_here = imin(heads_per_group, num_heads - head0);  // last group may be short
    const int m = r / heads_here;
    const int h = head0 + (r - m * heads_here);
    return TileCoord{heaviest_first ? num_m_blocks - 1 - m : m, h, b};
  }
};

}  // namespace flash3
