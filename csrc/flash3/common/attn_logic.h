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
// Mask. Query i sees key j iff 0 <= j < seqlen_k and, with p = i + seqlen_k - seqlen_q (the
// bottom-right aligned diagonal),
//   (left  < 0 || j >= p - left) and (right < 0 || j <= p + right)      (the window)
//   (chunk == 0 || chunk_start(p) <= j < chunk_start(p) + chunk)        (attention_chunk)
// causal acting as right = 0. -1 means unbounded; chunk 0 means no chunks. chunk_start(p) =
// p - (p mod chunk), the mod floored as Python's (a row with p < 0 sees no key then: its chunk ends
// at or before key 0). The window bounds are linear in the row (window_floor, window_last_key: the
// kernels' fast masks rely on it); the chunk bounds are not, so the full bounds (key_floor,
// last_key) take them only when chunk > 0.
// A run of keys [lo, hi) (empty when lo >= hi).
struct KeyRun {
  int lo, hi;
};

struct Mask {
  int seqlen_q, seqlen_k, left, right;
  int chunk = 0;

  FLASH3_HD static Mask make(int seqlen_q, int seqlen_k, bool causal, int window_left,
                             int window_right, int chunk = 0) {
    return Mask{seqlen_q, seqlen_k, window_left < 0 ? -1 : window_left,
                causal ? 0 : (window_right < 0 ? -1 : window_right), chunk > 0 ? chunk : 0};
  }
  FLASH3_HD int offset() const { return seqlen_k - seqlen_q; }
  // First key of the chunk holding key (or diagonal) position `pos` (chunk > 0).
  FLASH3_HD int chunk_start(int pos) const { return floor_div(pos, chunk) * chunk; }
  // The same from one unsigned division, for the decode kernels' per-row bounds (row_keys): a row
  // with pos < 0 sees no key either way (its chunk ends at or before key 0), so it gets the chunk
  // [-chunk, 0) instead of its own (chunk > 0).
  FLASH3_HD int row_chunk_start(int pos) const {
    return pos < 0 ? -chunk : int(unsigned(pos) / unsigned(chunk)) * chunk;
  }
  FLASH3_HD bool visible(int i, int j) const {
    return j >= 0 && j < seqlen_k && j >= key_floor(i) && j < last_key(i + 1);
  }
  // The window's own bounds (no chunk clamp). window_floor: no key below it is visible to row
  // `row`, before the clamp at key 0; it grows by exactly 1 per row (a later row's follows from an
  // earlier one's). kNoLeftBound without a left bound.
  static constexpr int kNoLeftBound = -(1 << 30);
  FLASH3_HD int window_floor(int row) const { return left < 0 ? kNoLeftBound : row + offset() - left; }
  FLASH3_HD int window_last_key(int row_end) const {
    return right < 0 ? seqlen_k : imin(seqlen_k, row_end - 1 + offset() + right + 1);
  }
  // The full bounds of a row: key_floor(row) <= j < last_key(row + 1). Both are nondecreasing in
  // the row, and a row with p >= 0 sees key p, so the keys any rows [row_begin, row_end) see are
  // [first_key(row_begin), last_key(row_end)) (empty when first >= last).
  FLASH3_HD int key_floor(int row) const {
    const int w = window_floor(row);
    return chunk > 0 ? imax(w, chunk_start(row + offset())) : w;
  }
  FLASH3_HD int first_key(int row_begin) const { return imax(0, key_floor(row_begin)); }
  FLASH3_HD int last_key(int row_end) const {
    const int w = window_last_key(row_end);
    return chunk > 0 ? imin(w, chunk_start(row_end - 1 + offset()) + chunk) : w;
  }
  // Keys row `row` sees (<= 0: none). Without chunks concave in the row (min of lines minus max of
  // lines); with chunks it drops at every chunk start.
  FLASH3_HD int key_count(int row) const { return last_key(row + 1) - first_key(row); }
  // The keys row `row` sees as one run [lo, hi): [first_key(row), last_key(row + 1)) for a row
  // that sees a key, an empty run (lo >= hi) for one that sees none; lo and hi are nondecreasing in
  // the row as those are. The decode kernels' form (their mask and tile ranges): the chunk's
  // clamp takes one unsigned division (row_chunk_start), not two floored ones.
  FLASH3_HD KeyRun row_keys(int row) const {
    int lo = window_floor(row), hi = window_last_key(row + 1);
    if (chunk > 0) {
      const int start = row_chunk_start(row + offset());
      lo = imax(lo, start);
      hi = imin(hi, start + chunk);
    }
    return {imax(lo, 0), hi};
  }
  // The transpose, for the backward's (key, query) tiles: key `key` is seen by the queries in
  // [first_query(key), last_query(key)) (empty for a key outside [0, seqlen_k)). The chunk relation
  // is symmetric (same chunk), so its clamp is the key's chunk, moved to rows by the offset. Both
  // are nondecreasing in the key.
  FLASH3_HD int window_first_query(int key) const { return right < 0 ? 0 : imax(0, key - offset() - right); }
  FLASH3_HD int window_last_query(int key) const {
    if (key < 0 || key >= seqlen_k) return 0;
    return left < 0 ? seqlen_q : imin(seqlen_q, key - offset() + left + 1);
  }
  FLASH3_HD int first_query(int key) const {
    const int w = window_first_query(key);
    return chunk > 0 ? imax(w, chunk_start(key) - offset()) : w;
  }
  FLASH3_HD int last_query(int key) const {
    const int w = window_last_query(key);
    return chunk > 0 ? imin(w, chunk_start(key) + chunk - offset()) : w;
  }
};

// Half-open range of key blocks [begin, end). Loops run from end - 1 down to begin.
struct BlockRange {
  int begin, end;
  FLASH3_HD bool empty() const { return begin >= end; }
  FLASH3_HD int size() const { return end > begin ? end - begin : 0; }
};

// Key blocks holding at least one key visible to at least one of the query rows [row_begin,
// row_end) (empty when that is empty).
FLASH3_HD BlockRange key_block_range_rows(const Mask& mask, int row_begin, int row_end, int block_n) {
  if (row_begin >= row_end || mask.seqlen_k <= 0) return {0, 0};
  const int k0 = mask.first_key(row_begin), k1 = mask.last_key(row_end);
  if (k0 >= k1) return {0, 0};
  return {k0 / block_n, ceil_div(k1, block_n)};
}

// Blocks of key_block_range_rows in which every (row, key) pair is visible and the block is full,
// so the kernel can skip the mask there. The blocks of the outer range above `end` and below
// `begin` need masking. Returned clamped into the outer range (possibly empty).
FLASH3_HD BlockRange unmasked_key_block_range_rows(const Mask& mask, int row_begin, int row_end,
                                                   int block_n) {
  const BlockRange outer = key_block_range_rows(mask, row_begin, row_end, block_n);
  if (outer.empty()) return outer;
  // The latest-starting row bounds the left edge; the earliest-ending row bounds the right edge
  // (both bounds are nondecreasing in the row; rows in different chunks share no key, so a tile
  // spanning a chunk start has no unmasked block). last_key <= seqlen_k keeps to full blocks.
  int lo = ceil_div(mask.first_key(row_end - 1), block_n);
  int hi = floor_div(mask.last_key(row_begin + 1), block_n);
  lo = imax(lo, outer.begin);
  hi = imin(hi, outer.end);
  if (lo >= hi) return {outer.end, outer.end};
  return {lo, hi};
}

// The same for query block m_block of block_m rows.
FLASH3_HD BlockRange key_block_range(const Mask& mask, int m_block, int block_m, int block_n) {
  return key_block_range_rows(mask, m_block * block_m, imin(m_block * block_m + block_m, mask.seqlen_q),
                              block_n);
}
FLASH3_HD BlockRange unmasked_key_block_range(const Mask& mask, int m_block, int block_m,
                                              int block_n) {
  return unmasked_key_block_range_rows(mask, m_block * block_m,
                                       imin(m_block * block_m + block_m, mask.seqlen_q), block_n);
}

// Packed GQA (the decode kernels): the g query heads sharing a kv head are rows of one tile, packed
// row R = token * g + j for head j of the group. Query block m_block of block_m packed rows holds
// the tokens [first, last) (rows past s_q * g hold none).
FLASH3_HD BlockRange packed_token_range(int m_block, int block_m, int g, int seqlen_q) {
  const int r0 = m_block * block_m, r1 = imin(r0 + block_m, seqlen_q * g);
  if (r0 >= r1) return {0, 0};
  return {r0 / g, ceil_div(r1, g)};
}

// Split-KV: split `split` of `num_splits` takes the contiguous key blocks [split * per,
// (split + 1) * per) of the row's n_blocks, per = ceil(n_blocks / num_splits), clipped (a split
// past the end is empty). csrc/flash3/decode/split_heuristic.h split_key_range is the same in keys.
FLASH3_HD BlockRange split_block_range(int split, int num_splits, int n_blocks) {
  const int per = n_blocks > 0 ? ceil_div(n_blocks, num_splits) : 0;
  return {imin(split * per, n_blocks), imin(split * per + per, n_blocks)};
}

// Intersection of two block ranges (empty ranges come out with begin >= end).
FLASH3_HD BlockRange intersect(BlockRange a, BlockRange b) {
  return {imax(a.begin, b.begin), imin(a.end, b.end)};
}

// A decode tile (packed query block m_block, split `split`): its tokens, the key blocks it visits
// (those its tokens see, cut to the split's share of the row; {0, 0} when none) and the sub-range
// that needs no mask ({end, end} when none), as fwd/scheduler.cuh decode_tile uses them.
struct DecodeRanges {
  BlockRange tokens, blocks, unmasked;
};

// kRowRuns (the decode kernels with an attention chunk, FwdTraits::kChunk): key_block_range_rows /
// unmasked_key_block_range_rows of the tokens from the first and last token's runs (Mask::row_keys:
// the chunk's clamp from one unsigned division per end token); else through those functions (the
// kernels without a chunk keep their code). The same ranges (tests/test_host_logic.py).
template <bool kRowRuns = true>
FLASH3_HD DecodeRanges decode_block_ranges(const Mask& mask, int m_block, int block_m, int block_n, int g,
                                           int split, int num_splits) {
  DecodeRanges r;
  r.tokens = packed_token_range(m_block, block_m, g, mask.seqlen_q);
  const BlockRange share = split_block_range(split, num_splits, ceil_div(imax(mask.seqlen_k, 0), block_n));
  if constexpr (kRowRuns) {
    BlockRange outer{0, 0}, inner{0, 0};
    if (!r.tokens.empty() && mask.seqlen_k > 0) {
      const KeyRun first = mask.row_keys(r.tokens.begin), last = mask.row_keys(r.tokens.end - 1);
      if (first.lo < last.hi) {
        outer = {first.lo / block_n, ceil_div(last.hi, block_n)};
        // The latest-starting token bounds the left edge, the earliest-ending one the right edge.
        inner = {imax(ceil_div(last.lo, block_n), outer.begin), imin(floor_div(first.hi, block_n), outer.end)};
      }
    }
    r.blocks = intersect(outer, share);
    if (r.blocks.empty()) r.blocks = BlockRange{0, 0};
    r.unmasked = intersect(inner, r.blocks);
  } else {
    r.blocks = intersect(key_block_range_rows(mask, r.tokens.begin, r.tokens.end, block_n), share);
    if (r.blocks.empty()) r.blocks = BlockRange{0, 0};
    r.unmasked = intersect(unmasked_key_block_range_rows(mask, r.tokens.begin, r.tokens.end, block_n), r.blocks);
  }
  if (r.unmasked.empty()) r.unmasked = BlockRange{r.blocks.end, r.blocks.end};
  return r;
}

// The backward's transpose: query blocks with a row that sees key block n_block. Key j is seen by
// rows j - offset - right .. j - offset + left (cut to its chunk's rows), an interval whose ends
// are nondecreasing in the key; the keys no row sees are a prefix (those before every row's
// window or chunk), so the rows seeing any key of the block form one interval
// (flash3/masking.py: query_block_range).
FLASH3_HD BlockRange query_block_range(const Mask& mask, int n_block, int block_m, int block_n) {
  const int key_begin = n_block * block_n;
  const int key_end = imin(key_begin + block_n, mask.seqlen_k);
  if (key_begin >= key_end || mask.seqlen_q <= 0) return {0, 0};
  const int r0 = mask.first_query(key_begin), r1 = mask.last_query(key_end - 1);
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
  // The last key bounds the rows from below, the first key bounds them from above (last_query <=
  // seqlen_q keeps to full blocks).
  int lo = ceil_div(mask.first_query(key_begin + block_n - 1), block_m);
  int hi = floor_div(mask.last_query(key_begin), block_m);
  lo = imax(lo, outer.begin);
  hi = imin(hi, outer.end);
  if (lo >= hi) return {outer.end, outer.end};
  return {lo, hi};
}

// ---------------------------------------------------------------------------------------------
// Tile shapes per (head dim, value head dim), shared by bf16 and fp16; block_m = 64 rows per
// consumer warpgroup. The budget, per consumer thread (a warpgroup owns 64 rows): S takes
// block_n / 2 fp32 registers, P block_n / 4 (16-bit pairs), O d_v / 2; setmaxnreg gives a consumer
// 232 registers with 2 consumer warpgroups, 160 with 3 (fwd/traits.cuh). Shared memory (16-bit elements,
// fwd_smem_bytes): Q, `stages` K blocks, fwd_v_stages V blocks, and O's own buffer where it fits
// (fwd_own_o_buffer; else O is staged in V's buffer after the tile's last P.V: block_m <=
// stages * block_n). block_n is a multiple of 16 (P.V k-steps).
//   d 64:   192 x 128, 3 consumers: S 64 + P 32 + O 32 = 128 of 160; smem 88 KB + 24 KB for O's
//           own buffer (fwd_own_o_buffer, as at d 96 and 128). FA3's non-causal
//           192 x 192 needs S 96 + P 48 + O 32 = 176 > 160: it passes P through shared memory.
//   d 96:   192 x 96, 3 consumers: S 48 + P 24 + O 48 = 120 of 160; smem 108 KB + 36 KB for O's
//           own buffer + 18 KB for a third V stage (fwd_v_stages). At 192 x 128
//           (144 + addressing) ptxas spilled.
//   d 128:  128 x 128: S 64 + P 32 + O 64 = 160 of 232; smem 160 KB, + 32 KB for O's own buffer
//           (fwd/traits.cuh kOwnOBuffer: the tile's epilogue under the next tile's first Q.K^T)
//           + 32 KB for a third V stage (fwd_v_stages): 224 KB.
//           FA3's full-attention 128 x 176 (208 KB) leaves no room for that buffer; in the timing
//           model the 128-key tile with it was 6-12% faster on full attention at s 1k-4k (one SM,
//           equal work; benchmarks/results/perf_model.md), so every call takes 128 x 128.
//   d 192:  128 x 112 for d_v 192: smem 48 + 2 * 2 * 42 = 216 KB (128 x 128 would be 240 KB);
//           128 x 128 for d_v 128: smem 48 + 2 * 2 * 40 = 208 KB; S 64 + P 32 + O 64 / 96.
//   d 256:  128 x 80: O alone is 128 registers; smem 64 + 2 * 2 * 40 = 224 KB.
struct TileShape {
  int block_m, block_n, stages, num_consumers;
};

FLASH3_HD constexpr TileShape fwd_tile_shape(int head_dim, int head_dim_v) {
  return head_dim <= 64    ? TileShape{192, 128, 2, 3}
         : head_dim <= 96  ? TileShape{192, 96, 2, 3}
         : head_dim <= 128 ? TileShape{128, 128, 2, 2}
         : head_dim <= 192 ? TileShape{128, head_dim_v <= 128 ? 128 : 112, 2, 2}
                           : TileShape{128, 80, 2, 2};
}

// The 16-bit forward's shared memory beyond its K and V stages and O: a float per consumer thread
// (FwdConsumer's overlap pin) and 1 KB for the barriers and alignment (fwd/traits.cuh SharedStorage).
FLASH3_HD constexpr int fwd_smem_overhead(TileShape t) { return 4 * 128 * t.num_consumers + 1024; }
// Q, K's stages and v_stages V blocks (16-bit elements).
FLASH3_HD constexpr int fwd_mainloop_bytes(TileShape t, int head_dim, int head_dim_v, int v_stages) {
  return 2 * (t.block_m * head_dim + t.stages * t.block_n * head_dim + v_stages * t.block_n * head_dim_v);
}
// Whether Q, K's stages, v_stages V blocks and O's own buffer fit in the 227 KB opt-in limit.
FLASH3_HD constexpr bool fwd_fits_with_own_o(TileShape t, int head_dim, int head_dim_v, int v_stages) {
  return fwd_mainloop_bytes(t, head_dim, head_dim_v, v_stages) + 2 * t.block_m * head_dim_v + fwd_smem_overhead(t) <=
         227 * 1024;
}
// O's own buffer (fwd/traits.cuh kOwnOBuffer: each warp stores its rows while the next tile's first
// Q.K^T runs) where it fits beside the two-stage mainloop.
FLASH3_HD constexpr bool fwd_own_o_buffer(TileShape t, int head_dim, int head_dim_v) {
  return fwd_fits_with_own_o(t, head_dim, head_dim_v, t.stages);
}
// V's stages: one more than K's where that still fits beside O's own buffer, at d 96 and d 128. A
// step releases its K stage after S's WGMMA but its V stage only after the P.V WGMMA and the
// exponentials pinned before its wait (fwd/mainloop.cuh FwdConsumer::step), so with two stages each
// V_{n+1}'s slot (V_{n+3}'s) frees last: ~2000 cycles before step n needs it at d 128, against
// ~2560 for K_n, and a block's TMA bytes and latency come out of that. The timing model's TMA
// latency (timing_params.h kTmaLatency, 500 cycles) is an assumption; at 1500 (one SM, b 4 s 4096,
// full) the two-stage kernel lost 7.7% (d 128) and 9.1% (d 96), FA3 1.5% (d 128), and with a third
// V stage flash3 1.6% (d 128) and 4.4% (d 96); at 500 the third stage changed d 128 by +0.08% and
// d 96 by -0.03% (cycles). d 64 (MUFU 82% busy) lost 1.4% at 500 with it (0.6% with K issued
// first) and keeps two.
FLASH3_HD constexpr int fwd_v_stages(TileShape t, int head_dim, int head_dim_v) {
  return head_dim > 64 && fwd_fits_with_own_o(t, head_dim, head_dim_v, t.stages + 1) ? t.stages + 1 : t.stages;
}

// FA3's attention_chunk in the 16-bit forward: fwd_tile_shape's tiles up to d 192 take it
// (FwdTraits::kChunk: the chunked mask's loops). At d 256 the 128 x 80 tile has no registers left
// for them (compile-check, nvcc 13.0: a 16-40 byte spill however the rows' bounds were carried), so
// a call with a chunk runs on fwd_chunk_tile_shape's 128 x 64 tile instead (S and P 12 registers a
// thread fewer), built beside the plain one in the same TU (fwd/launch.cuh run_fwd).
FLASH3_HD constexpr bool fwd_tile_takes_chunk(int head_dim, int head_dim_v) {
  return head_dim <= 192 && head_dim_v <= 192;
}
FLASH3_HD constexpr TileShape fwd_chunk_tile_shape(int head_dim, int head_dim_v) {
  return fwd_tile_takes_chunk(head_dim, head_dim_v) ? fwd_tile_shape(head_dim, head_dim_v) : TileShape{128, 64, 2, 2};
}

// FP8 (e4m3) forward tiles: 2 consumer warpgroups of 64 rows (the q descales are per 64-row
// slab). Registers per consumer thread (232): S block_n/2, P block_n/8, O d_v/2 and the fresh
// two-level accumulator: d_v/2 with one P.V chunk (d_v <= 64: all live at once while the softmax
// runs under P.V), or 64 (two 64-column chunks in turn, FwdTraits::kOChunks > 1: P.V before S, no
// softmax overlap inside the warpgroup). d = 64 keeps 128 keys (64 + 16 + 32 + 32); d = 128 takes
// 128 keys with chunks (O 64 + chunks 64, then S 64 + P 16; with one chunk and the overlap, 128
// keys needed 208 at once and spilled, and 64-key blocks ran 5.4 instructions a key against 3.9:
// benchmarks/results/perf_model.md, History), 3 stages; d = 256 (O 128 + chunks 64) 64 keys, 3
// stages. block_n divides 128: k/v descales per 128 keys hold per tile.
FLASH3_HD constexpr TileShape fwd_fp8_tile_shape(int head_dim, int head_dim_v) {
  return head_dim <= 64 && head_dim_v <= 64     ? TileShape{128, 128, 2, 2}
         : head_dim <= 128 && head_dim_v <= 128 ? TileShape{128, 128, 3, 2}
                                                : TileShape{128, 64, 3, 2};
}
// FP8 with fast accumulation (FwdTraits::kFastAccum: P.V accumulates in O itself, no fresh
// accumulator): the 16-bit kernel's structure, S, P and O live at once with the softmax under the
// P.V WGMMA. 128 keys everywhere (k descales per 128 keys hold per tile): S 64 + P 16 + O d_v/2 =
// 208 at d 256 (FA3's FP8 d 256 tile; FwdTraits gives these consumers FA3's 240 registers, at 232
// ptxas spilled), smem 32 + 2 * (32 + 32) = 160 KB with 2 stages; below
// d 256 the two-level tiles' stages. No attention chunk (its bounds need registers d 256 lacks).
FLASH3_HD constexpr TileShape fwd_fp8_fast_tile_shape(int head_dim, int head_dim_v) {
  return head_dim <= 128 && head_dim_v <= 128 ? fwd_fp8_tile_shape(head_dim, head_dim_v) : TileShape{128, 128, 2, 2};
}
// An attention chunk in the FP8 forward: the d <= 128 tiles take it as they are; above (O beside
// two 64-column fresh chunks), whose consumers sit at the register limit, its bounds spilled on the
// 64-key tile (compile-check, 2026-11-29: 4-15 LDL, whether carried per tile or made per block; with
// 128-column chunks then), so a call with a chunk runs on a tile of 32 keys (S and P 20 registers a
// thread fewer; 4 stages of the half-size K/V blocks), built beside the plain one (fwd/launch.cuh
// run_fwd_fp8). Its key tiles are the emulation's too (flash3/fp8_quant.py kernel_tile_n).
FLASH3_HD constexpr bool fwd_fp8_tile_takes_chunk(int head_dim, int head_dim_v) {
  return head_dim <= 128 && head_dim_v <= 128;
}
FLASH3_HD constexpr TileShape fwd_fp8_chunk_tile_shape(int head_dim, int head_dim_v) {
  return fwd_fp8_tile_takes_chunk(head_dim, head_dim_v) ? fwd_fp8_tile_shape(head_dim, head_dim_v)
                                                        : TileShape{128, 32, 4, 2};
}

// Decode (KV-cache) kernel tiles: the plain tiles with 2 consumer warpgroups everywhere. A decode
// step has few rows (s_q * g packed), so the 192-row tiles of d <= 96 would mostly compute padding,
// and their 3 consumers at 152 registers (the decode producer needs more for its gathered loads)
// spilled P at d = 64; 128 rows with 2 consumers at 216 registers (fwd/traits.cuh) fit every d.
// Shared memory of the decode kernel (an upper bound: fwd/traits.cuh asserts it): Q (128 rows), 2
// stages of K and V (V's buffer also stages the 128 x d_v O tile, so it is at least that), 2 KB of
// barriers and padding, and for an FP8 (e4m3) cache (fp8_cache) two raw stages: the gathered bytes
// of a key block's K and V rows and their per-row descales, before the producer converts them into
// K/V's 16-bit stages (decode/load.cuh). block_n drops in steps of 16 until it fits the 227 KB
// opt-in limit: d 128 -> 112, (192, 192) -> 64, (192, 128) -> 80, 256 -> 48; d 64 and 96 keep
// theirs. 16-bit caches keep the plain block_n.
FLASH3_HD constexpr int decode_smem_bytes(int head_dim, int head_dim_v, int block_n, bool fp8_cache) {
  const int raw = fp8_cache ? (2 * (block_n * (head_dim + head_dim_v) + 2 * 4 * block_n) + 1023) / 1024 * 1024 : 0;
  const int v = 2 * block_n * head_dim_v > 128 * head_dim_v ? 2 * block_n * head_dim_v : 128 * head_dim_v;
  return raw + 2 * (128 * head_dim + 2 * block_n * head_dim + v) + 2048;
}
// MLA (d_v > 256, d <= 64; decode/mla_traits.cuh): 64 packed rows by 64 keys, both consumer
// warpgroups on the same rows, each with half of O's d_v columns (a 64 x 512 fp32 O is 256
// registers a thread for one warpgroup); smem: Q, qv (64 x d_v), 2 stages of K and V = 216 KB at
// d_v 512. block_n 64 is also FA3's page size for MLA caches (TMA per block).
FLASH3_HD constexpr TileShape decode_tile_shape(int head_dim, int head_dim_v, bool fp8_cache = false) {
  if (head_dim_v > 256) return TileShape{64, 64, 2, 2};
  TileShape t{128, fwd_tile_shape(head_dim, head_dim_v).block_n, 2, 2};
  while (fp8_cache && t.block_n > 16 && decode_smem_bytes(head_dim, head_dim_v, t.block_n, fp8_cache) > 227 * 1024)
    t.block_n -= 16;
  return t;
}

// FA3's attention_chunk in the decode kernels (16-bit and FP8 caches; FwdTraits::kChunk): the plain
// tiles take it for head dims up to this, where the chunked mask (Mask::row_keys per packed row in
// the masked blocks) leaves the consumers without spills (compile-check, nvcc 13.0: at d 256 the
// 16-bit-cache kernel spilled 16 bytes and took an 8-byte stack frame). The MLA decode kernel
// (d_v > 256, decode/mla_traits.cuh) takes it too: its masks are consumer 0's, which holds half of
// O (compile-check: no spills with the chunk).
constexpr int kDecodeChunkMaxHeadDim = 192;
FLASH3_HD constexpr bool decode_takes_chunk(int head_dim, int head_dim_v) {
  return head_dim_v > 256 || (head_dim <= kDecodeChunkMaxHeadDim && head_dim_v <= kDecodeChunkMaxHeadDim);
}
// Above it, a call with a chunk runs on a decode tile of its own, built beside the plain one (as
// fwd_chunk_tile_shape): 16 keys fewer (d 256: 16-bit cache 80 -> 64, FP8 cache 48 -> 32), S and
// P 12 registers a thread fewer (decode/launch.cuh run_decode; no spills, 2026-11-29). The host
// sizes the split count by the tile the call runs on (host/kvcache.cpp).
FLASH3_HD constexpr TileShape decode_chunk_tile_shape(int head_dim, int head_dim_v, bool fp8_cache = false) {
  TileShape t = decode_tile_shape(head_dim, head_dim_v, fp8_cache);
  if (!decode_takes_chunk(head_dim, head_dim_v)) t.block_n -= 16;
  return t;
}

// A packed tensor whose sequences each start at a multiple of `align` rows: sequence `batch`, whose
// rows start at `first_row` in the unpadded packing, starts at padded_seq_offset(first_row, batch,
// align), computed from (first_row, batch) alone (no prefix sum, no host sync) and at least
// round_up(len, align) before the next sequence's (first_row grows by len, the rest by align - 1).
// padded_seq_offset(total, batch count, align) is the padded size. Used by the FP8 varlen Vt
// (align 16) and the backward's per-row buffers (align kBwdBlockM).
// FP8 varlen Vt (h_k, d_v, columns): sequence `batch`, whose keys start at `first_key` in the packed
// k, starts at this column: a multiple of 16 (V_PERM16 groups must line up with the kernel's key
// blocks), computed from (first_key, batch) alone so nothing needs a prefix sum, and at least
// round_up(len, 16) before the next sequence's (first_key grows by len, 15 * batch by 15).
// fp8_varlen_vt_offset(total_k, batch count) is the number of columns (flash3/fp8_quant.py twin).
FLASH3_HD constexpr long long padded_seq_offset(long long first_row, long long batch, int align) {
  return (first_row + (align - 1) * (batch + 1)) / align * align;
}
FLASH3_HD constexpr long long fp8_varlen_vt_offset(long long first_key, long long batch) {
  return padded_seq_offset(first_key, batch, 16);
}

// Shared memory of the 16-bit forward's tiles: Q, K's and V's stages, and O's own buffer where it
// has one (without, O is staged through V's buffer after the tile's last P.V: nothing extra).
FLASH3_HD constexpr int fwd_smem_bytes(int head_dim, int head_dim_v) {
  const TileShape t = fwd_tile_shape(head_dim, head_dim_v);
  return fwd_mainloop_bytes(t, head_dim, head_dim_v, fwd_v_stages(t, head_dim, head_dim_v)) +
         (fwd_own_o_buffer(t, head_dim, head_dim_v) ? 2 * t.block_m * head_dim_v : 0);
}

// ---------------------------------------------------------------------------------------------
// Backward tiles (csrc/flash3/bwd/). One CTA per (key block, kv head, batch) keeps K and V of its
// key block in shared memory and walks the query blocks of kBwdBlockM rows that see it
// (query_block_range), for every query head of its kv head: GQA sums dK/dV over the group in
// registers, without atomics or repeated K/V. Two consumer warpgroups; a warpgroup's WGMMA M is 64,
// so keys go along M and the scores are computed transposed:
//   S^T = K Q^T, dP^T = V dO^T   SS, 64 keys x 64 queries per warpgroup;
//   dV += P^T dO, dK += dS^T Q   RS: P^T and dS^T are the S^T/dP^T accumulators as they stand;
//   dQ  = dS K                   SS, dS through shared memory, each warpgroup d/2 columns.
// Registers per consumer thread (240 after setmaxnreg): dK d/2 + dV d_v/2 held over the loop;
// S^T 32 + dP^T 32, P 16 + dS 16 per step; dQ d/4 once those are dead.
//   d, d_v <= 128: 128 keys per CTA, warpgroup w owns keys [64w, 64w + 64): dK + dV <= 128.
//   larger (split_d): dK + dV would take 192..256 registers, so both warpgroups take the same 64
//     keys and each keeps half of dK's and dV's columns; both compute S^T and dP^T (1.4x the FLOPs
//     of the five products: the price of holding 256 columns without a P/dS round trip through
//     shared memory).
// Shared memory (16-bit): Q and dO stages of 64 rows, K and V of block_n rows, dS twice (a step
// writes dS while the other warpgroup may still read the previous one in its dQ product), dQ in
// fp32 for the bulk reduce-add: 2 (st_q 64 d + st_do 64 d_v + bn (d + d_v) + 2 64 bn) + 4 64 d bytes.
//   d 64: 112 KB; 96: 152 KB; 128: 192 KB; 192: 208 KB; 192x128: 184 KB; 256 (one Q/dO stage): 208 KB.
constexpr int kBwdBlockM = 64;

struct BwdTileShape {
  int block_m, block_n, stages_q, stages_do;
  bool split_d;
};

FLASH3_HD constexpr BwdTileShape bwd_tile_shape(int head_dim, int head_dim_v) {
  return head_dim <= 128 && head_dim_v <= 128 ? BwdTileShape{kBwdBlockM, 128, 2, 2, false}
         : head_dim <= 192                    ? BwdTileShape{kBwdBlockM, 64, 2, 2, true}
                                              : BwdTileShape{kBwdBlockM, 64, 1, 1, true};
}

FLASH3_HD constexpr int bwd_smem_bytes(int head_dim, int head_dim_v) {
  return 2 * (bwd_tile_shape(head_dim, head_dim_v).stages_q * kBwdBlockM * head_dim +
              bwd_tile_shape(head_dim, head_dim_v).stages_do * kBwdBlockM * head_dim_v +
              bwd_tile_shape(head_dim, head_dim_v).block_n * (head_dim + head_dim_v) +
              2 * kBwdBlockM * bwd_tile_shape(head_dim, head_dim_v).block_n) +
         4 * kBwdBlockM * head_dim;
}

// Deterministic dQ: the key blocks adding into query block m_block do so in descending order, key
// block n as the (last - n)-th, last = key_block_range(m_block).end - 1. A CTA waits until the query
// block's semaphore reaches this rank. Why descending: key block n starts at its first query block,
// which never decreases with n (causal, local, chunk; 0 for every block without a mask), so key
// block n + 1 reaches query block m as early as n does or earlier; in ascending order each key block
// waited on the one below it, and causal CTAs all ran as long as key block 0's (2x the work's time,
// measured on an H200: +78% at s 2k, +110% at s 8k). The grid (key blocks, kv heads, batch) runs key
// blocks fastest and, in deterministic mode, last key block first (bwd_key_block), so every CTA a wait
// depends on has a lower block index: launched earlier, resident or done.
FLASH3_HD int bwd_dq_rank(const Mask& mask, int m_block, int n_block, int block_m, int block_n) {
  return key_block_range(mask, m_block, block_m, block_n).end - 1 - n_block;
}

// The key block of the backward CTA with blockIdx.x = block_x of n_blocks: reversed in deterministic
// mode (bwd_dq_rank), ascending otherwise (with a causal mask the longest CTAs first).
FLASH3_HD int bwd_key_block(int block_x, int n_blocks, bool deterministic) {
  return deterministic ? n_blocks - 1 - block_x : block_x;
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

// (3) with 2-CTA clusters (at_pair_tile: the forward's K/V multicast, fwd/traits.cuh kMulticastKV)
//     tiles 2i and 2i + 1 are query blocks 2j and 2j + 1 of one (head, batch): the pairs are
//     numbered as tiles of num_m_blocks / 2 blocks (even), so a cluster's two CTAs, taking tiles c
//     and c + 1 (c even) of a static schedule with an even grid, share every key block.
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

  FLASH3_HD TileCoord at(int idx) const { return at_of(idx, num_m_blocks); }
  // The 2-CTA clusters' numbering (3): num_m_blocks even. A function of its own, not a flag of
  // at(): the kernels without clusters keep at()'s code (a run-time test there cost the d 256
  // decode kernel's consumers registers: 60 bytes of spills).
  FLASH3_HD TileCoord at_pair_tile(int idx) const {
    TileCoord c = at_of(idx >> 1, num_m_blocks >> 1);
    c.m_block = 2 * c.m_block + (idx & 1);
    return c;
  }

 private:
  FLASH3_HD TileCoord at_of(int idx, int m_blocks) const {
    const int per_batch = m_blocks * num_heads;
    const int b = idx / per_batch;
    int r = idx - b * per_batch;
    const int group_size_full = heads_per_group * m_blocks;
    const int g = r / group_size_full;
    r -= g * group_size_full;
    const int head0 = g * heads_per_group;
    const int heads_here = imin(heads_per_group, num_heads - head0);  // last group may be short
    const int m = r / heads_here;
    const int h = head0 + (r - m * heads_here);
    return TileCoord{heaviest_first ? m_blocks - 1 - m : m, h, b};
  }
};

}  // namespace flash3
