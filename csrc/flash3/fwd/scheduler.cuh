// Persistent tile scheduler of the forward kernel and the per-tile facts every role derives the
// same way from a tile index. grid = min(num_tiles, num_sms) CTAs; CTA c starts with tile c of the
// flash3::TileOrder numbering (heads grouped for L2 reuse, heaviest query blocks first when the
// mask is causal/local), then
//  - static (full attention, batched: every tile costs the same): tiles c + grid, c + 2*grid, ...;
//    no atomics, no hand-off, producer and consumers walk the same sequence independently;
//  - dynamic (causal, local, varlen: fwd_uses_dynamic_scheduler): the producer warp takes the next
//    index from an atomic counter as soon as it has issued a tile's loads (so the heaviest-first
//    order becomes longest-processing-time-first across SMs), skips varlen tiles without rows, and
//    hands the index to the consumers through shared memory (named barriers TileFull/TileEmpty).
// Tile indices are int: batch * heads * m_blocks must stay below 2^31 (checked by the launcher).
#pragma once

#include <cuda_runtime.h>

#include "flash3/common/attn_logic.h"
#include "flash3/common/indexing.cuh"
#include "flash3/fwd/params.h"

namespace flash3 {

// Lengths and packed-row offsets of one batch entry.
struct SeqInfo {
  int seqlen_q, seqlen_k;  // this batch entry's lengths (queries: after seqused_q, keys: after seqused_k)
  int rows_q;              // the query rows the epilogue writes: seqlen_q, or with seqused_q the packed
                           // length (rows from seqlen_q on get O = 0, LSE = -inf)
  int offset_q, offset_k;  // first row in the packed (varlen) tensors; 0 when batched; decode:
                           // offset_k is the cache position of key 0 (cache_leftpad, else 0)
};

__device__ __forceinline__ SeqInfo seq_info(const FwdParams& p, int batch) {
  SeqInfo s;
  if (p.cu_seqlens_q != nullptr) {
    packed_rows(p.cu_seqlens_q, batch, p.total_q, s.offset_q, s.seqlen_q);
  } else {
    s.offset_q = 0;
    s.seqlen_q = p.seqlen_q;
  }
  if (p.cu_seqlens_k != nullptr) {
    packed_rows(p.cu_seqlens_k, batch, p.total_k, s.offset_k, s.seqlen_k);
  } else {
    s.offset_k = 0;
    s.seqlen_k = p.seqlen_k;
  }
  // Keys beyond seqused_k are ignored; it cannot extend the keys there are. Queries likewise.
  if (p.seqused_k != nullptr) s.seqlen_k = imin(imax(p.seqused_k[batch], 0), s.seqlen_k);
  s.rows_q = s.seqlen_q;
  if (p.seqused_q != nullptr) s.seqlen_q = imin(imax(p.seqused_q[batch], 0), s.seqlen_q);
  return s;
}

// A KV cache's left padding (decode: FwdParams::cache_leftpad): keys start at cache position
// leftpad, clamped into the row's keys, so any value leaves a key range inside the cache.
__device__ __forceinline__ void apply_cache_leftpad(const FwdParams& p, int batch, SeqInfo& s) {
  if (p.cache_leftpad == nullptr) return;
  s.offset_k = imin(imax(p.cache_leftpad[batch], 0), s.seqlen_k);
  s.seqlen_k -= s.offset_k;
}

// One unit of work: query block m_block of (head, batch), with its mask and key-block ranges.
// Decode kernels: coord.head numbers (kv head, split) pairs, m_block counts packed GQA rows.
struct WorkTile {
  int index;           // in the TileOrder numbering (printed by the hang-diagnosis build)
  TileCoord coord;
  int head_k;          // GQA/MQA: the KV head serving this query head
  int split;           // decode: the split-KV index (0 without splits)
  SeqInfo seq;
  Mask mask;
  BlockRange blocks;   // key blocks to visit, iterated from end - 1 down to begin
  BlockRange unmasked; // sub-range that needs no mask
  bool has_rows;       // the query block holds at least one row < seq.rows_q (else nothing to do)
};

// kChunk: the kernel takes p.attention_chunk (FwdTraits::kChunk); else its masks have none.
// kClusterM 2: the 2-CTA clusters' tile numbering (TileOrder::at_pair_tile; fwd/kernel.cuh).
template <int kBlockM, int kBlockN, bool kDecode = false, bool kChunk = false, int kClusterM = 1>
struct TileScheduler {
  const FwdParams& p;
  TileOrder order;

  __device__ __forceinline__ TileCoord coord(int idx) const {
    if constexpr (kClusterM > 1) return order.at_pair_tile(idx);
    else return order.at(idx);
  }

  __device__ __forceinline__ bool dynamic() const { return p.tile_counter != nullptr; }
  __device__ __forceinline__ int first() const { return int(blockIdx.x); }
  __device__ __forceinline__ bool done(int idx) const { return idx >= order.num_tiles(); }

  __device__ __forceinline__ bool has_rows(int idx) const {
    const TileCoord c = coord(idx);
    return c.m_block * kBlockM < seq_info(p, c.batch).rows_q;
  }

  // Query heads per kv head: packed into the rows of one decode tile.
  __device__ __forceinline__ int group() const { return p.num_heads / p.num_heads_k; }

  // Producer warp (all lanes): the tile after `idx` for this CTA. Dynamic: lane 0 takes indices from
  // the counter (offset by the grid, whose first tiles were taken by blockIdx) until one has rows.
  __device__ __forceinline__ int fetch_next(int idx) const {
    if (!dynamic()) return idx + int(gridDim.x);
    int next = 0;
    if (threadIdx.x % 32 == 0) {
      do {
        next = atomicAdd(p.tile_counter, 1) + int(gridDim.x);
      } while (!done(next) && p.cu_seqlens_q != nullptr && !has_rows(next));
    }
    return __shfl_sync(0xffffffff, next, 0);
  }

  __device__ __forceinline__ WorkTile tile(int idx) const {
    if constexpr (kDecode) return decode_tile(idx);
    WorkTile w;
    w.index = idx;
    w.split = 0;
    w.coord = coord(idx);
    w.head_k = w.coord.head / (p.num_heads / p.num_heads_k);
    w.seq = seq_info(p, w.coord.batch);
    w.has_rows = w.coord.m_block * kBlockM < w.seq.rows_q;
    w.mask = Mask::make(w.seq.seqlen_q, w.seq.seqlen_k, p.is_causal, p.window_left, p.window_right,
                        kChunk ? p.attention_chunk : 0);
    // A block wholly past seqused_q but inside the packed rows: no keys, so the epilogue's
    // store_empty writes its zeros and -inf.
    if (w.coord.m_block * kBlockM < w.seq.seqlen_q) {
      w.blocks = key_block_range(w.mask, w.coord.m_block, kBlockM, kBlockN);
      w.unmasked = unmasked_key_block_range(w.mask, w.coord.m_block, kBlockM, kBlockN);
    } else {
      w.blocks = BlockRange{0, 0};
      w.unmasked = BlockRange{0, 0};
    }
    return w;
  }

  // Decode: tile (packed query block, kv head * num_splits + split, batch). The mask acts on
  // tokens; the key blocks are those the tile's tokens see, cut to the split's share of the row.
  __device__ __forceinline__ WorkTile decode_tile(int idx) const {
    WorkTile w;
    w.index = idx;
    w.coord = coord(idx);
    w.head_k = w.coord.head / p.num_splits;
    w.split = w.coord.head - w.head_k * p.num_splits;
    w.seq = seq_info(p, w.coord.batch);
    apply_cache_leftpad(p, w.coord.batch, w.seq);
    // The chunk acts on tokens as the window does (key positions count from cache_leftpad); the
    // split's share of the row is cut from the whole row's blocks, so a chunk only narrows what a
    // split visits. Kernels without it (kChunk false) fold its branches away.
    w.mask = Mask::make(w.seq.seqlen_q, w.seq.seqlen_k, p.is_causal, p.window_left, p.window_right,
                        kChunk ? p.attention_chunk : 0);
    const DecodeRanges r =
        decode_block_ranges<kChunk>(w.mask, w.coord.m_block, kBlockM, kBlockN, group(), w.split, p.num_splits);
    w.has_rows = !r.tokens.empty();
    w.blocks = r.blocks;
    w.unmasked = r.unmasked;
    return w;
  }
};

// Host side: the schedule for a call (same arguments on every launch of a given shape; the
// decode kernel's: decode/launch.cuh).
inline TileOrder make_tile_order(const FwdParams& p, int block_m) {
  const int num_m_blocks = ceil_div(p.seqlen_q, block_m);
  const bool causal_or_local = p.is_causal || p.window_left >= 0 || p.window_right >= 0 || p.attention_chunk > 0;
  return TileOrder::make(num_m_blocks, p.num_heads, p.batch, p.seqlen_k, p.head_dim, p.head_dim_v,
                         p.num_heads_k, p.l2_bytes, causal_or_local);
}

}  // namespace flash3
