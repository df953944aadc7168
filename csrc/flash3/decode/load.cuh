// The decode kernel's producer (FwdTraits::kDecode): one tile's Q, K and V for the same consumers,
// pipelines and barriers as the plain forward (fwd/mainloop.cuh), with
//  - Q packed (GQA): the g query heads of the tile's kv head are its rows, row R = token * g + j,
//    loaded by warp 0 with plain loads into the swizzled layout (a TMA box cannot span (token,
//    head) pairs for every g), zero past the last row;
//  - K/V from a KV cache: contiguous (slab = batch row) or paged (slab = page_table entry).
//    TMA per key block when a block lies inside one slab (no page table, or page_size a multiple
//    of block_n); TMA per 16-row piece when pages are a multiple of 16 rows (16, 32, 48, 64, ...
//    without left padding: Tr::kTmaPieces, each piece from its page); otherwise gathered: the whole
//    producer warpgroup copies 16-byte chunks of rows with cp.async, zero-filled past the row's
//    keys and for page ids outside the cache. (On an H200 the gathered pages of 16 ran at 25-38% of
//    the copy bandwidth where contiguous caches' TMA reached 92-97%.)
//  - cache_leftpad: key j of a row is cache position w.seq.offset_k + j. Its blocks start there
//    (a TMA box at any row: no row before the first key is ever loaded; a box's rows past the
//    cache read zeros), so the keys' tail is the only partial block, as without padding. A paged
//    cache with left padding is always gathered (launch.cuh: its blocks straddle pages).
//    The loads walk a tile's blocks by cache position (KeyPositions), so the padding costs the
//    producer no register in its loops (a block index plus an offset spilled at d 64 and for the
//    FP8 cache at d 96).
// Proxies: Q's stores and the gathered chunks are generic-proxy writes that the consumers' WGMMA
// reads through the async proxy, so every writing thread completes its writes, fences
// (fence.proxy.async), and the warp or warpgroup synchronizes before one thread arrives on the
// full barrier (count 1, no transaction bytes). TMA needs none of this.
// FP8 cache (Tr::kFp8Cache): always gathered, into raw stages (the e4m3 bytes and each row's
// descale, two blocks in flight), then converted by the whole warpgroup into K/V's 16-bit stages
// (x8 * descale rounded once to q's dtype) and published as above; up to d 128 by two producer
// warpgroups, K's and V's, each its own side (Tr::kProducerWarpgroups).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "flash3/common/barriers.cuh"
#include "flash3/common/fp32_rn.cuh"
#include "flash3/fwd/mainloop.cuh"
#include "flash3/fwd/scheduler.cuh"
#include "flash3/fwd/traits.cuh"

namespace flash3 {

// Slab and row of key position pos of batch row `batch` (FwdParams' KV-cache block). A page id
// outside [0, num_slabs) becomes num_slabs: a TMA box there lies outside the tensor (zero-filled),
// and the gathered path zero-fills it.
struct KvSlot {
  int slab, row;
};

// Key position pos of a paged cache: its page-table index and its row in that page.
__device__ __forceinline__ KvSlot page_index_row(const FwdParams& p, int pos, int slab_shift) {
  if (slab_shift >= 0) return {pos >> slab_shift, pos & (p.slab_rows - 1)};
  const int idx = pos / p.slab_rows;
  return {idx, pos - idx * p.slab_rows};
}

__device__ __forceinline__ KvSlot kv_slot(const FwdParams& p, int batch, int pos, int slab_shift) {
  if (p.page_table == nullptr) return {batch, pos};
  const KvSlot ir = page_index_row(p, pos, slab_shift);
  const int idx = ir.slab, row = ir.row;
  int page = p.page_table[int64_t(batch) * p.page_table_stride + idx];
  if (page < 0 || page >= p.num_slabs) page = p.num_slabs;
  return {page, row};
}

// Copies the first src_bytes (0..16) of a 16-byte chunk and zero-fills the rest.
__device__ __forceinline__ void cp_async_16(uint32_t smem_addr, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr), "l"(src), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_16(uint32_t smem_addr, const void* src, bool valid) {
  cp_async_16(smem_addr, src, valid ? 16 : 0);
}
__device__ __forceinline__ void cp_async_4(uint32_t smem_addr, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr), "l"(src), "r"(valid ? 4 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// A 16-byte shared-memory store (a pointer taken from a CuTe smem tensor is generic to the compiler).
__device__ __forceinline__ void st_shared_128(uint32_t smem_addr, uint4 v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}
__device__ __forceinline__ void st_shared_128(const void* smem_ptr, uint4 v) {
  st_shared_128(cute::cast_smem_ptr_to_uint(smem_ptr), v);
}

// 8 e4m3 values (x, little-endian bytes) times `scale`, rounded once to T (bf16 or fp16): 16 bytes.
// e4m3 -> f16 is exact (hardware, two at a time), so the product is x8 * scale in fp32 (mul_rn:
// products below 2^-126, which bf16 holds, are not flushed by fast math).
template <class T>
__device__ __forceinline__ uint4 e4m3x8_scaled(uint2 x, float scale) {
  uint32_t in[2] = {x.x, x.y}, out[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __nv_fp8x2_storage_t pair = __nv_fp8x2_storage_t(in[i / 2] >> (16 * (i % 2)));
    const float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3)));
    if constexpr (std::is_same_v<T, cutlass::bfloat16_t>) {
      const __nv_bfloat162 y = __floats2bfloat162_rn(mul_rn(f.x, scale), mul_rn(f.y, scale));
      out[i] = *reinterpret_cast<const uint32_t*>(&y);
    } else {
      const __half2 y = __floats2half2_rn(mul_rn(f.x, scale), mul_rn(f.y, scale));
      out[i] = *reinterpret_cast<const uint32_t*>(&y);
    }
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

// A tile's key blocks as cache positions: block n starts at first - (blocks.end - 1 - n) * block_n,
// the last visited one (blocks.begin) at stop; keys end at `end` (the row's key count past its
// padding). Iterate pos = first, first - block_n, ... while pos >= stop.
struct KeyPositions {
  int first, stop, end;
};
__device__ __forceinline__ KeyPositions key_positions(const WorkTile& w, int block_n) {
  const int key0 = w.seq.offset_k;
  return {key0 + (w.blocks.end - 1) * block_n, key0 + w.blocks.begin * block_n, key0 + w.seq.seqlen_k};
}

template <class Tr>
struct DecodeProducer {
  using Element = typename Tr::Element;
  using PipelineState = typename Tr::PipelineState;
  using PipelineStateV = typename Tr::PipelineStateV;
  using SharedStorage = typename Tr::SharedStorage;
  using Base = FwdProducer<Tr>;
  static constexpr int kThreads = 128;  // the producer warpgroup (gathered loads)

  // Warp 0: the tile's packed Q rows (after the previous tile released Q's buffer).
  static __device__ __forceinline__ void load_q(typename Tr::KernelParams const& params, SharedStorage& smem,
                                                const WorkTile& w, int tile_count) {
    using namespace cute;
    const FwdParams& p = params.p;
    if (tile_count > 0) mbarrier_wait(&smem.q_free, (tile_count - 1) & 1, Wait::QFree, w.index);
    Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), typename Tr::SmemLayoutQ{});
    const int g = p.num_heads / p.num_heads_k;
    // The batch entry's queries, read here rather than taken from w.seq: the FP8-cache producer
    // calls this inside its block loop, where keeping w.seq's two ints live would spill its 56
    // registers (compile-check: decode_bf16_kve4m3_hdim96). Varlen q: packed rows offset_q..
    int offset_q = 0, seqlen_q = p.seqlen_q;
    if (p.cu_seqlens_q != nullptr) packed_rows(p.cu_seqlens_q, w.coord.batch, p.total_q, offset_q, seqlen_q);
    const int rows = seqlen_q * g, row0 = w.coord.m_block * Tr::kBlockM;
    const Element* q = static_cast<const Element*>(p.q) +
                       (p.cu_seqlens_q != nullptr ? int64_t(offset_q) * p.q_row_stride
                                                  : int64_t(w.coord.batch) * p.q_batch_stride);
    constexpr int kChunks = Tr::kHeadDim / 8;  // 16-byte chunks per row; the swizzle never splits one
    const int lane = threadIdx.x % 32;
    for (int i = lane; i < Tr::kBlockM * kChunks; i += 32) {
      const int r = i / kChunks, c = (i % kChunks) * 8, packed = row0 + r;
      uint4 val = make_uint4(0, 0, 0, 0);
      if (packed < rows && c < p.head_dim) {
        const int t = packed / g, head = w.head_k * g + (packed - t * g);
        val = *reinterpret_cast<const uint4*>(q + int64_t(t) * p.q_row_stride + int64_t(head) * p.q_head_stride + c);
      }
      st_shared_128(&sQ(r, c), val);
    }
    if constexpr (Tr::kQv) {  // MLA: qv's rows the same way (null qv: the consumers skip Qv V^T)
      if (p.qv != nullptr) {
        Tensor sQv = make_tensor(make_smem_ptr(smem.qv.data()), typename Tr::SmemLayoutQv{});
        const Element* qv = static_cast<const Element*>(p.qv) +
                            (p.cu_seqlens_q != nullptr ? int64_t(offset_q) * p.qv_row_stride
                                                       : int64_t(w.coord.batch) * p.qv_batch_stride);
        // A row's kHeadDimV / 8 chunks, kPerLane to a lane: one division per row (unrolled by
        // chunk, per chunk, the loop's addresses spilled the producer's registers).
        constexpr int kPerLane = Tr::kHeadDimV / 8 / 32;
        static_assert(kPerLane * 32 * 8 == Tr::kHeadDimV, "qv rows are whole warps of 16-byte chunks");
#pragma unroll 1
        for (int r = 0; r < Tr::kBlockM; ++r) {
          const int packed = row0 + r;
          const Element* src = nullptr;
          if (packed < rows) {
            const int t = packed / g, head = w.head_k * g + (packed - t * g);
            src = qv + int64_t(t) * p.qv_row_stride + int64_t(head) * p.qv_head_stride;
          }
          CUTE_UNROLL
          for (int j = 0; j < kPerLane; ++j) {
            const int c = (lane + 32 * j) * 8;
            uint4 val = make_uint4(0, 0, 0, 0);
            if (src != nullptr && c < p.head_dim_v) val = *reinterpret_cast<const uint4*>(src + c);
            st_shared_128(&sQv(r, c), val);
          }
        }
      }
    }
    cutlass::arch::fence_view_async_shared();  // generic stores -> the consumers' WGMMA
    __syncwarp();
    if (lane == 0) cutlass::arch::ClusterBarrier::arrive(&smem.q_full);
  }

  // TMA path (warp 0, `leader` issues). Every block lies in one slab: its box starts at the
  // block's first key, any row of the slab (cache_leftpad: not a multiple of block_n).
  static __device__ __forceinline__ void load_tma(typename Tr::KernelParams const& params, SharedStorage& smem,
                                                  PipelineState& state_k, PipelineStateV& state_v, const WorkTile& w,
                                                  int tile_count, uint32_t& tail_phase, bool leader) {
    using namespace cute;
    const FwdParams& p = params.p;
    Tensor mK = params.tma_k.get_tma_tensor(params.shape_k);    // (slab_rows, d, h_k, slabs)
    Tensor mVt = params.tma_v.get_tma_tensor(params.shape_vt);  // (d_v, slab_rows, h_k, slabs)
    Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), typename Tr::SmemLayoutK{});
    Tensor sVt = make_tensor(make_smem_ptr(smem.v.data()), typename Tr::SmemLayoutVt{});
    Tensor tKsK = get<1>(tma_partition(params.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK),
                                       group_modes<0, 2>(local_tile(mK(_, _, 0, 0), Shape<typename Tr::BlkN, typename Tr::HD>{},
                                                                    make_coord(0, _0{})))));  // (TMA, stages)
    Tensor tVsV = get<1>(tma_partition(params.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sVt),
                                       group_modes<0, 2>(local_tile(mVt(_, _, 0, 0), Shape<typename Tr::HDV, typename Tr::BlkN>{},
                                                                    make_coord(_0{}, 0)))));
    // The boxes of the block at cache position pos: rows s.row.. of slab s.
    auto k_box = [&](const KvSlot& s) {
      Tensor g = local_tile(domain_offset(make_coord(s.row, _0{}), mK(_, _, w.head_k, s.slab)),
                            Shape<typename Tr::BlkN, typename Tr::HD>{}, make_coord(_0{}, _0{}));
      return get<0>(tma_partition(params.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(g)));
    };
    auto v_box = [&](const KvSlot& s) {
      Tensor g = local_tile(domain_offset(make_coord(_0{}, s.row), mVt(_, _, w.head_k, s.slab)),
                            Shape<typename Tr::HDV, typename Tr::BlkN>{}, make_coord(_0{}, _0{}));
      return get<0>(tma_partition(params.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sVt), group_modes<0, 2>(g)));
    };
    const int tile = w.index;
    const KeyPositions kp = key_positions(w, Tr::kBlockN);
    // Where the block at cache position pos lies, resolved once for its K and its V (one page-table
    // read): its box's slab and row (kv_slot), or with tma_pieces the block's page ids (every lane
    // holds one, block_pages) and the row of its first key in its page.
    struct Where {
      KvSlot box;
      BlockPages pages;
      int row;
    };
    auto where = [&](int pos) {
      if constexpr (Tr::kTmaPieces)
        if (params.tma_pieces)
          return Where{{0, 0}, block_pages(params, w, pos, kp.end), page_index_row(p, pos, params.slab_shift).row};
      return Where{kv_slot(p, w.coord.batch, pos, params.slab_shift), {-1, 0}, 0};
    };
    // One TMA copy from global tile g to shared tile d (the leader's).
    auto copy_tile = [&](auto const& tma, uint64_t& bar, auto const& g, auto const& d) {
      auto t = tma_partition(tma, _0{}, Layout<_1>{}, group_modes<0, 2>(d), group_modes<0, 2>(g));
      copy(tma.with(bar), get<0>(t), get<1>(t));
    };
    // The K (V) of the block at `at` onto barrier `bar` into stage `stage`: one box, or with
    // tma_pieces one 16-row piece per page-table entry; a piece past the row's keys or behind a bad
    // page id reads zeros (its page is num_slabs, outside the tensor). Every lane of the warp calls
    // it (the pages' shuffles); the leader copies.
    auto issue = [&](auto is_v, const Where& at, uint64_t& bar, int stage) {
      constexpr bool kV = decltype(is_v)::value;
      if constexpr (Tr::kTmaPieces) {
        if (params.tma_pieces) {
          // Piece j's page-table entry and row: the block's first, then +16 rows a piece, the next
          // entry at a page's end (no division per piece).
          int entry = 0, row = at.row;
          CUTE_UNROLL
          for (int j = 0; j < Tr::kBlockN / Tr::kPieceRows; ++j, row += Tr::kPieceRows) {
            if (row == p.slab_rows) row = 0, ++entry;
            const int page = __shfl_sync(0xffffffffu, at.pages.page, entry);
            if (!leader) continue;
            using Rows = typename Tr::PieceRows;
            if constexpr (kV) {
              Tensor mVp = params.tma_v_piece.get_tma_tensor(params.shape_vt);
              copy_tile(params.tma_v_piece, bar,
                        local_tile(domain_offset(make_coord(_0{}, row), mVp(_, _, w.head_k, page)),
                                   Shape<typename Tr::HDV, Rows>{}, make_coord(_0{}, _0{})),
                        local_tile(sVt(_, _, stage), Shape<typename Tr::HDV, Rows>{}, make_coord(_0{}, j)));
            } else {
              Tensor mKp = params.tma_k_piece.get_tma_tensor(params.shape_k);
              copy_tile(params.tma_k_piece, bar,
                        local_tile(domain_offset(make_coord(row, _0{}), mKp(_, _, w.head_k, page)),
                                   Shape<Rows, typename Tr::HD>{}, make_coord(_0{}, _0{})),
                        local_tile(sK(_, _, stage), Shape<Rows, typename Tr::HD>{}, make_coord(j, _0{})));
            }
          }
          return;
        }
      }
      if (!leader) return;
      if constexpr (kV) copy(params.tma_v.with(bar), v_box(at.box), tVsV(_, stage));
      else copy(params.tma_k.with(bar), k_box(at.box), tKsK(_, stage));
    };
    using IsK = cute::false_type;
    using IsV = cute::true_type;
    int pos = kp.first;
    Where at = where(pos);
    Base::acquire(smem.pipe_k, state_k, Tr::kKBytes, leader, Wait::KEmpty, tile);
    issue(IsK{}, at, *Tr::full_barrier(smem.pipe_k, state_k.index()), state_k.index());
    ++state_k;
    load_q(params, smem, w, tile_count);
    if (tile_count > 0) mbarrier_wait(&smem.o_free, (tile_count - 1) & 1, Wait::OFree, tile);
    const int valid_rows = kp.end - pos;
    if (valid_rows < Tr::kBlockN) {  // the cache's rows past the keys are not ours to trust
      const int stage = state_v.index();
      Base::load_v_zero_tail_by(smem, [&](uint64_t& bar) { issue(IsV{}, at, bar, stage); }, state_v, valid_rows,
                                tail_phase, leader, tile);
    } else {
      Base::acquire(smem.pipe_v, state_v, Tr::kVBytes, leader, Wait::VEmpty, tile);
      issue(IsV{}, at, *Tr::full_barrier(smem.pipe_v, state_v.index()), state_v.index());
    }
    ++state_v;
    for (pos -= Tr::kBlockN; pos >= kp.stop; pos -= Tr::kBlockN) {
      at = where(pos);
      Base::acquire(smem.pipe_k, state_k, Tr::kKBytes, leader, Wait::KEmpty, tile);
      issue(IsK{}, at, *Tr::full_barrier(smem.pipe_k, state_k.index()), state_k.index());
      ++state_k;
      Base::acquire(smem.pipe_v, state_v, Tr::kVBytes, leader, Wait::VEmpty, tile);
      issue(IsV{}, at, *Tr::full_barrier(smem.pipe_v, state_v.index()), state_v.index());
      ++state_v;
    }
  }

  // The pages of the key block at cache position pos0 (keys end at `end`), read once per block:
  // lane L of every producer warp holds the page id of the block's L-th page-table entry, and a
  // chunk's row takes its page by shuffle. A page-table read per chunk (row_offset's general
  // path) left the producer waiting on a global load every chunk: on an H200 paged decode ran at
  // 13-20% of the copy bandwidth against up to 92% for contiguous caches (TMA), and in the timing
  // model that load was the producer's largest stall.
  // first < 0: no page table, or the block spans more than 32 entries (pages of fewer than
  // kBlockN / 31 rows): row_offset's general path.
  struct BlockPages {
    int first;  // the block's first page-table index
    int page;   // this lane's page id (num_slabs: outside the cache, or past the row's keys)
  };
  static __device__ __forceinline__ BlockPages block_pages(typename Tr::KernelParams const& params,
                                                           const WorkTile& w, int pos0, int end) {
    const FwdParams& p = params.p;
    const int last = imin(pos0 + Tr::kBlockN, end) - 1;
    if (p.page_table == nullptr || last < pos0) return {-1, 0};
    const int i0 = page_index_row(p, pos0, params.slab_shift).slab;
    const int i1 = page_index_row(p, last, params.slab_shift).slab;
    if (i1 - i0 >= 32) return {-1, 0};
    const int idx = i0 + int(threadIdx.x % 32);
    int page = p.num_slabs;
    if (idx <= i1) {  // only entries of the row's keys: the table may end there
      page = p.page_table[int64_t(w.coord.batch) * p.page_table_stride + idx];
      if (page < 0 || page >= p.num_slabs) page = p.num_slabs;
    }
    return {i0, page};
  }

  // For chunk i (kChunks a row) of the key block at cache position pos0 (keys end at `end`): its
  // row's element offset in the cache, slab * slab_stride + row * row_stride, or -1 past the row's
  // keys or for a page id outside the cache (kv_slot). A warp's 32 consecutive chunks span a few
  // rows: lane j resolves the j-th (one page-table read and division per row, not per chunk) and
  // each lane takes its row's by shuffle. Every lane of the warp calls it with the same pos0 and
  // i - lane.
  template <int kChunks>
  static __device__ __forceinline__ int64_t row_offset(typename Tr::KernelParams const& params, const WorkTile& w,
                                                       int pos0, int end, int i, int64_t slab_stride,
                                                       int64_t row_stride, const BlockPages& bp) {
    static_assert(Tr::kBlockN * kChunks % 32 == 0, "a warp's chunks must end with the block");
    const FwdParams& p = params.p;
    if (bp.first >= 0) {  // every lane shuffles, then rows past the keys drop out
      const int pos = pos0 + i / kChunks;
      const KvSlot ir = page_index_row(p, pos, params.slab_shift);
      const int page = __shfl_sync(0xffffffffu, bp.page, (ir.slab - bp.first) & 31);
      if (pos >= end || page >= p.num_slabs) return -1;
      return int64_t(page) * slab_stride + int64_t(ir.row) * row_stride;
    }
    const int lane = threadIdx.x % 32;
    const int r0 = (i - lane) / kChunks, r = r0 + lane, pos = pos0 + r;
    int64_t off = -1;
    if (r <= (i - lane + 31) / kChunks && pos < end) {
      const KvSlot s = kv_slot(p, w.coord.batch, pos, params.slab_shift);
      if (s.slab < p.num_slabs) off = int64_t(s.slab) * slab_stride + int64_t(s.row) * row_stride;
    }
    return __shfl_sync(0xffffffffu, off, i / kChunks - r0);
  }

  // Gathered rows of the key block at cache position pos0 (keys end at `end`) into a K stage
  // (kIsV false) or a V stage: every thread copies
  // 16-byte chunks i = tid, tid + 128, ... of the block's rows; rows past the row's keys and
  // pages outside the cache are zero-filled (cp.async with source size 0 reads nothing).
  template <bool kIsV>
  static __device__ __forceinline__ void gather(typename Tr::KernelParams const& params, SharedStorage& smem,
                                                const WorkTile& w, int pos0, int end, int stage,
                                                const BlockPages& bp) {
    using namespace cute;
    const FwdParams& p = params.p;
    constexpr int kCols = kIsV ? Tr::kHeadDimV : Tr::kHeadDim;
    constexpr int kChunks = kCols / 8;
    const int cols = kIsV ? p.head_dim_v : p.head_dim;
    const Element* base = static_cast<const Element*>(kIsV ? p.v : p.k) +
                          int64_t(w.head_k) * (kIsV ? p.v_head_stride : p.k_head_stride);
    const int64_t slab_stride = kIsV ? p.v_batch_stride : p.k_batch_stride;
    const int64_t row_stride = kIsV ? p.v_row_stride : p.k_row_stride;
    Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), typename Tr::SmemLayoutK{});    // (n, d, stage)
    Tensor sVt = make_tensor(make_smem_ptr(smem.v.data()), typename Tr::SmemLayoutVt{});  // (d_v, n, stage)
    const int tid = threadIdx.x % kThreads;
    auto copy = [&](int i, int r, int c) {  // chunk i: row r, column c
      const int64_t off = row_offset<kChunks>(params, w, pos0, end, i, slab_stride, row_stride, bp);
      const bool valid = off >= 0 && c < cols;
      const Element* src = valid ? base + off + c : base;
      Element* dst;
      if constexpr (kIsV) dst = &sVt(c, r, stage);
      else dst = &sK(r, c, stage);
      cp_async_16(cast_smem_ptr_to_uint(dst), src, valid);
    };
    constexpr int kRowsPerPass = kThreads / kChunks;  // rows one pass of the warpgroup copies
    if constexpr (kThreads % kChunks == 0 && Tr::kBlockN % kRowsPerPass == 0) {
      // A thread keeps its column and steps by whole passes: no division per chunk, and unrolled,
      // the passes' address arithmetic overlaps (one chunk at a time, a chunk's ~45-instruction
      // chain was the producer's critical path in the timing model).
      const int c = (tid % kChunks) * 8, r0 = tid / kChunks;
      if (bp.first >= 0 && params.slab_shift >= 0) {
        // Pages of 2^shift rows with the block's page ids in the lanes: a chunk's row costs a
        // shift, a shuffle and its address. Every lane shuffles; invalid rows drop out after.
        const int shift = params.slab_shift, row_mask = p.slab_rows - 1, pos_r = pos0 + r0;
        const bool col_ok = c < cols;
        auto smem_at = [&](int r) {
          if constexpr (kIsV) return cast_smem_ptr_to_uint(&sVt(c, r, stage));
          else return cast_smem_ptr_to_uint(&sK(r, c, stage));
        };
        // Passes of 8 rows (d 128): the 128-byte swizzle repeats every 8 rows of 128 bytes (it
        // XORs address bits [4,7) with [7,10)), so pass k's destination is pass 0's plus k steps;
        // the smoke cases check every row. Otherwise each pass evaluates the layout (d 64's passes
        // of 16 rows would qualify, but the step's registers made its producer spill).
        constexpr bool kStep = kRowsPerPass == 8;
        const uint32_t dst0 = smem_at(r0), step = kStep ? smem_at(r0 + kRowsPerPass) - dst0 : 0;
#pragma unroll 4  // fully unrolled, ptxas spills the producer's 64 registers
        for (int k = 0; k < Tr::kBlockN / kRowsPerPass; ++k) {
          const int pos = pos_r + k * kRowsPerPass;
          const int page = __shfl_sync(0xffffffffu, bp.page, ((pos >> shift) - bp.first) & 31);
          const bool valid = col_ok && pos < end && page < p.num_slabs;
          const Element* src =
              valid ? base + int64_t(page) * slab_stride + int64_t(pos & row_mask) * row_stride + c : base;
          cp_async_16(kStep ? dst0 + k * step : smem_at(r0 + k * kRowsPerPass), src, valid);
        }
      } else {
#pragma unroll 4
        for (int k = 0; k < Tr::kBlockN / kRowsPerPass; ++k) copy(tid + k * kThreads, r0 + k * kRowsPerPass, c);
      }
    } else {
      CUTE_NO_UNROLL
      for (int i = tid; i < Tr::kBlockN * kChunks; i += kThreads) copy(i, i / kChunks, (i % kChunks) * 8);
    }
    cp_async_commit();
  }

  // K and/or V of stage `stage` are written by every thread of the warpgroup (generic proxy):
  // fence them for the consumers' WGMMA (async proxy), then one arrival per full barrier.
  // bar: the warpgroup's named barrier (V's producer warpgroup has its own, Tr::kBarProducerV).
  template <bool kK = true, bool kV = true>
  static __device__ __forceinline__ void publish_stage(SharedStorage& smem, int stage, int tile,
                                                       uint32_t bar = Tr::kBarProducer) {
    cutlass::arch::fence_view_async_shared();
    named_sync(kThreads, bar, Wait::Gather, tile);
    if (threadIdx.x % kThreads == 0) {
      if (kK) cutlass::arch::ClusterBarrier::arrive(Tr::full_barrier(smem.pipe_k, stage));
      if (kV) cutlass::arch::ClusterBarrier::arrive(Tr::full_barrier(smem.pipe_v, stage));
    }
  }

  // The gathered chunks of K and V stage `stage` landed for every thread of the warpgroup.
  template <int kPending>
  static __device__ __forceinline__ void publish(SharedStorage& smem, int stage, int tile) {
    cp_async_wait<kPending>();
    publish_stage(smem, stage, tile);
  }

  // Gathered path (all 128 producer threads). Block n's K and V are published once block n - 1's
  // K is in flight (so two blocks' loads overlap), and before waiting for V's stage of block n - 1:
  // that stage held V(n + 1), released by the consumers' step n (S_n, then P_{n+1} V_{n+1}),
  // which cannot start before K(n) is published.
  // K and V advance together here (one stage each per block), so one stage index serves both.
  static __device__ __forceinline__ void load_gather(typename Tr::KernelParams const& params, SharedStorage& smem,
                                                     PipelineState& state_k, PipelineStateV& state_v,
                                                     const WorkTile& w, int tile_count) {
    const int tile = w.index;
    const bool warp0 = threadIdx.x < 32;
    int prev = 0;  // the stage of block n + 1
    const KeyPositions kp = key_positions(w, Tr::kBlockN);  // block n at cache position pos
    for (int pos = kp.first; pos >= kp.stop; pos -= Tr::kBlockN) {
      const BlockPages bp = block_pages(params, w, pos, kp.end);  // K's and V's rows of block n
      mbarrier_wait(Tr::empty_barrier(smem.pipe_k, state_k.index()), state_k.phase(), Wait::KEmpty, tile);
      gather<false>(params, smem, w, pos, kp.end, state_k.index(), bp);
      if (pos == kp.first) {
        if (warp0) load_q(params, smem, w, tile_count);
        if (tile_count > 0) mbarrier_wait(&smem.o_free, (tile_count - 1) & 1, Wait::OFree, tile);
      } else {
        publish<1>(smem, prev, tile);  // block n + 1: all but the K group just issued
      }
      mbarrier_wait(Tr::empty_barrier(smem.pipe_v, state_v.index()), state_v.phase(), Wait::VEmpty, tile);
      gather<true>(params, smem, w, pos, kp.end, state_v.index(), bp);
      prev = state_k.index();
      ++state_k;
      ++state_v;
    }
    publish<0>(smem, prev, tile);
  }

  // ---- FP8 cache ----
  // The e4m3 rows of K and V of the key block at cache position pos0 (keys end at `end`) into raw
  // stage `slot` (one cp.async group per call): 16-byte
  // chunks, the bytes past the head dim, the row's keys or a bad page id zero-filled; each row's
  // descale too (0 for such rows, so no descale is read outside its tensor): the descale of the row's
  // slab, or of the tile's batch entry (FwdParams' k/v_cache_descale say which).
  // kK / kV: the sides this warpgroup loads (both with one FP8-cache producer warpgroup).
  template <bool kK, bool kV>
  static __device__ __forceinline__ void gather_raw(typename Tr::KernelParams const& params, SharedStorage& smem,
                                                    const WorkTile& w, int pos0, int end, int slot) {
    using namespace cute;
    const FwdParams& p = params.p;
    auto& raw = smem.raw[slot];
    const int tid = threadIdx.x % kThreads;
    // Up to d 128 (FwdTraits::kProducerRegs: 64 there) a thread copies whole passes of rows (below);
    // paged, the block's page ids are read once (block_pages: one per lane, then shuffles), as the
    // 16-bit gather does, where the per-chunk lookup waited on a page-table load every pass. Above
    // d 128 the 56-register producer spilled with either (d 192 x 128, compile-check).
    constexpr bool kPasses = Tr::kHeadDim <= 128 && Tr::kHeadDimV <= 128;
    BlockPages bp{-1, 0};
    if constexpr (kPasses) {
      if (p.page_table != nullptr && params.slab_shift >= 0) bp = block_pages(params, w, pos0, end);
    }
    auto rows = [&](auto is_v) {
      constexpr bool kIsV = decltype(is_v)::value;
      constexpr int kCols = kIsV ? Tr::kHeadDimV : Tr::kHeadDim;
      constexpr int kChunks = kCols / 16;
      const int cols = kIsV ? p.head_dim_v : p.head_dim;
      const uint8_t* base = static_cast<const uint8_t*>(kIsV ? p.v : p.k) +
                            int64_t(w.head_k) * (kIsV ? p.v_head_stride : p.k_head_stride);
      const int64_t slab_stride = kIsV ? p.v_batch_stride : p.k_batch_stride;
      const int64_t row_stride = kIsV ? p.v_row_stride : p.k_row_stride;
      uint8_t* dst = kIsV ? raw.v : raw.k;
      constexpr int kRowsPerPass = kThreads / kChunks;  // rows one pass of the warpgroup copies
      constexpr int kUnroll = kCols >= 128 ? 2 : 1;      // d 64 unrolled spilled (8 bytes)
      bool copied = false;
      if constexpr (kPasses && kThreads % kChunks == 0 && Tr::kBlockN % kRowsPerPass == 0) {
        if (p.page_table == nullptr) {
          // Contiguous: slab = batch row (kv_slot), so a thread keeps its chunk column and steps
          // by whole passes of rows, its source and destination moving by constants, where the
          // per-chunk lookup (a division and a shuffle of the row's offset) was most of a chunk's
          // instructions.
          const int c = (tid % kChunks) * 16, r0 = tid / kChunks;
          // (kv_slot's slab check: a batch row outside the cache reads nothing)
          const int bytes = c < cols && w.coord.batch < p.num_slabs ? (cols - c < 16 ? cols - c : 16) : 0;
          const uint8_t* row = base + int64_t(w.coord.batch) * slab_stride + int64_t(pos0 + r0) * row_stride + c;
          const int64_t pass_stride = int64_t(kRowsPerPass) * row_stride;
          const uint32_t dst0 = cast_smem_ptr_to_uint(dst + r0 * kCols + c);
#pragma unroll kUnroll
          for (int k = 0; k < Tr::kBlockN / kRowsPerPass; ++k, row += pass_stride) {
            const bool valid = pos0 + r0 + k * kRowsPerPass < end && bytes > 0;
            cp_async_16(dst0 + k * kRowsPerPass * kCols, valid ? row : base, valid ? bytes : 0);
          }
          copied = true;
        } else if (bp.first >= 0) {
          // Pages of 2^shift rows with the block's page ids in the lanes: a pass's row takes its
          // page by shuffle (every lane shuffles; invalid rows drop out after).
          const int shift = params.slab_shift, row_mask = p.slab_rows - 1;
          const int c = (tid % kChunks) * 16, r0 = tid / kChunks;
          const int bytes = c < cols ? (cols - c < 16 ? cols - c : 16) : 0;
          const uint32_t dst0 = cast_smem_ptr_to_uint(dst + r0 * kCols + c);
#pragma unroll kUnroll
          for (int k = 0; k < Tr::kBlockN / kRowsPerPass; ++k) {
            const int pos = pos0 + r0 + k * kRowsPerPass;
            const int page = __shfl_sync(0xffffffffu, bp.page, ((pos >> shift) - bp.first) & 31);
            const bool valid = bytes > 0 && pos < end && page < p.num_slabs;
            const uint8_t* src =
                valid ? base + int64_t(page) * slab_stride + int64_t(pos & row_mask) * row_stride + c : base;
            cp_async_16(dst0 + k * kRowsPerPass * kCols, src, valid ? bytes : 0);
          }
          copied = true;
        }
      }
      // The per-row lookup (row_offset's general path): with the page ids live, the 56-register
      // FP8 producer spilled at d 192 (compile-check).
      constexpr BlockPages no_pages{-1, 0};
      CUTE_NO_UNROLL
      for (int i = tid; !copied && i < Tr::kBlockN * kChunks; i += kThreads) {
        const int r = i / kChunks, c = (i % kChunks) * 16;
        const int64_t off = row_offset<kChunks>(params, w, pos0, end, i, slab_stride, row_stride, no_pages);
        const uint8_t* src = base;
        int bytes = 0;
        if (off >= 0 && c < cols) {
          src = base + off + c;
          bytes = cols - c < 16 ? cols - c : 16;
        }
        cp_async_16(cast_smem_ptr_to_uint(dst + r * kCols + c), src, bytes);
      }
      const Descale& ds = kIsV ? p.v_cache_descale : p.k_cache_descale;
      // Per slab (index_stride) or per batch entry (batch_stride, FA3's layout): the host sets one
      // of the two strides, the other is 0.
      auto descale_of = [&](int slab) {
        return ds.ptr + int64_t(slab) * ds.index_stride + int64_t(w.coord.batch) * ds.batch_stride +
               int64_t(w.head_k) * ds.head_stride;
      };
      float* scale = kIsV ? raw.v_scale : raw.k_scale;
      if (bp.first >= 0 && Tr::kBlockN <= kThreads) {  // row tid's page by shuffle, as its chunks'
        const int pos = pos0 + tid;
        const int page = __shfl_sync(0xffffffffu, bp.page, ((pos >> params.slab_shift) - bp.first) & 31);
        if (tid < Tr::kBlockN) {
          const bool valid = pos < end && page < p.num_slabs;
          cp_async_4(cast_smem_ptr_to_uint(&scale[tid]), valid ? descale_of(page) : ds.ptr, valid);
        }
        return;
      }
      for (int r = tid; r < Tr::kBlockN; r += kThreads) {
        const int pos = pos0 + r;
        const float* src = ds.ptr;
        bool valid = false;
        if (pos < end) {
          const KvSlot s = kv_slot(p, w.coord.batch, pos, params.slab_shift);
          valid = s.slab < p.num_slabs;
          if (valid) src = descale_of(s.slab);
        }
        cp_async_4(cast_smem_ptr_to_uint(&scale[r]), src, valid);
      }
    };
    if constexpr (kK) rows(cute::false_type{});
    if constexpr (kV) rows(cute::true_type{});
    cp_async_commit();
  }

  // Raw stage `slot` -> K's (kIsV false) or V's 16-bit stage `stage`: 8 values a step (an 8-byte
  // shared load, 16-byte store into the swizzled layout; consecutive threads take consecutive
  // 16-byte chunks of a row, so neither side has bank conflicts for the 128-byte swizzle).
  template <bool kIsV>
  static __device__ __forceinline__ void convert(SharedStorage& smem, int slot, int stage) {
    using namespace cute;
    constexpr int kCols = kIsV ? Tr::kHeadDimV : Tr::kHeadDim;
    constexpr int kUnits = kCols / 8;
    const auto& raw = smem.raw[slot];
    const uint8_t* src = kIsV ? raw.v : raw.k;
    const float* scale = kIsV ? raw.v_scale : raw.k_scale;
    Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), typename Tr::SmemLayoutK{});    // (n, d, stage)
    Tensor sVt = make_tensor(make_smem_ptr(smem.v.data()), typename Tr::SmemLayoutVt{});  // (d_v, n, stage)
    auto dst_at = [&](int r, int c) {  // row r, column c of the stage
      if constexpr (kIsV) return cast_smem_ptr_to_uint(&sVt(c, r, stage));
      else return cast_smem_ptr_to_uint(&sK(r, c, stage));
    };
    const int tid = threadIdx.x % kThreads;
    constexpr int kRowsPerPass = kThreads / kUnits;  // rows one pass of the warpgroup converts
    if constexpr (kThreads % kUnits == 0 && Tr::kBlockN % kRowsPerPass == 0 && kRowsPerPass % 8 == 0) {
      // A thread keeps its 8 columns and steps by whole passes: the raw row, its descale and the
      // destination move by constants (the 128-byte swizzle repeats every 8 rows, so a pass's
      // destination is the previous one's plus a step), where a division and the layout per step
      // were ~15 of a step's ~42 instructions (SASS, d 128); the smoke cases check every row.
      // Two passes a step, their shared loads first: ptxas keeps a load after the previous
      // pass's store (it cannot tell the raw stage from K/V's), so one pass at a time waited out
      // a shared-load latency each; the two conversions' chains overlap.
      const int c = (tid % kUnits) * 8, r0 = tid / kUnits;
      const uint32_t dst0 = dst_at(r0, c), step = dst_at(r0 + kRowsPerPass, c) - dst0;
      const uint8_t* row = src + r0 * kCols + c;
      const float* row_scale = scale + r0;
      constexpr int kPasses = Tr::kBlockN / kRowsPerPass;
      auto raw8 = [&](int k) { return *reinterpret_cast<const uint2*>(row + k * kRowsPerPass * kCols); };
#pragma unroll 1
      for (int k = 0; k + 1 < kPasses; k += 2) {
        const uint2 a = raw8(k), b = raw8(k + 1);
        const float sa = row_scale[k * kRowsPerPass], sb = row_scale[(k + 1) * kRowsPerPass];
        const uint4 ya = e4m3x8_scaled<Element>(a, sa), yb = e4m3x8_scaled<Element>(b, sb);
        st_shared_128(dst0 + k * step, ya);
        st_shared_128(dst0 + (k + 1) * step, yb);
      }
      if constexpr (kPasses % 2 == 1)
        st_shared_128(dst0 + (kPasses - 1) * step,
                      e4m3x8_scaled<Element>(raw8(kPasses - 1), row_scale[(kPasses - 1) * kRowsPerPass]));
    } else {
#pragma unroll 2
      for (int i = tid; i < Tr::kBlockN * kUnits; i += kThreads) {
        const int r = i / kUnits, c = (i % kUnits) * 8;
        const uint4 y = e4m3x8_scaled<Element>(*reinterpret_cast<const uint2*>(src + r * kCols + c), scale[r]);
        st_shared_128(dst_at(r, c), y);
      }
    }
  }

  // FP8 path (all 128 threads of a producer warpgroup; kK / kV: the sides it loads, both with one
  // FP8-cache producer warpgroup, else K here and V in the last warpgroup, Tr::kProducerWarpgroups).
  // Raw loads run two blocks ahead of the conversion: block n - 2 is gathered into block n's raw
  // stage once every thread has converted it (the publish barrier ends all reads of it). Waits, in
  // order: block n's raw bytes (own cp.async groups, then the warpgroup barrier for everyone's),
  // K's stage (released by the consumers' S of block n + 2), V's stage (their P.V of block n + 2,
  // in step n + 1): each depends only on blocks published before, so the loop cannot deadlock; two
  // warpgroups wait only on the consumers, never on each other. K(n) is published before the V
  // wait, so the consumers' S of block n (and a new tile's first S, before o_free) runs meanwhile.
  template <bool kK, bool kV>
  static __device__ __forceinline__ void load_fp8(typename Tr::KernelParams const& params, SharedStorage& smem,
                                                  PipelineState& state_k, PipelineStateV& state_v, const WorkTile& w,
                                                  int tile_count) {
    const int tile = w.index;
    const KeyPositions kp = key_positions(w, Tr::kBlockN);  // block n at cache position pos
    constexpr int kN = Tr::kBlockN;
    constexpr uint32_t kBar = kK ? Tr::kBarProducer : Tr::kBarProducerV;
    gather_raw<kK, kV>(params, smem, w, kp.first, kp.end, 0);
    if (kp.first - kN >= kp.stop) gather_raw<kK, kV>(params, smem, w, kp.first - kN, kp.end, 1);
    else cp_async_commit();  // an empty group keeps "all but the newest group" the right wait
    int slot = 0;
    for (int pos = kp.first; pos >= kp.stop; pos -= kN) {
      cp_async_wait<1>();
      named_sync(kThreads, kBar, Wait::Gather, tile);
      if constexpr (kK) {
        mbarrier_wait(Tr::empty_barrier(smem.pipe_k, state_k.index()), state_k.phase(), Wait::KEmpty, tile);
        convert<false>(smem, slot, state_k.index());
        publish_stage<true, false>(smem, state_k.index(), tile, kBar);
        if (pos == kp.first && threadIdx.x < 32) load_q(params, smem, w, tile_count);
        ++state_k;
      }
      if constexpr (kV) {
        if (pos == kp.first && tile_count > 0) mbarrier_wait(&smem.o_free, (tile_count - 1) & 1, Wait::OFree, tile);
        mbarrier_wait(Tr::empty_barrier(smem.pipe_v, state_v.index()), state_v.phase(), Wait::VEmpty, tile);
        convert<true>(smem, slot, state_v.index());
        publish_stage<false, true>(smem, state_v.index(), tile, kBar);
        ++state_v;
      }
      if (pos - 2 * kN >= kp.stop) gather_raw<kK, kV>(params, smem, w, pos - 2 * kN, kp.end, slot);
      else cp_async_commit();
      slot ^= 1;
    }
    cp_async_wait<0>();  // the empty groups: nothing in flight past the tile
  }

  // V's producer warpgroup (Tr::kProducerWarpgroups == 2; fwd/kernel.cuh).
  static __device__ __forceinline__ void load_v(typename Tr::KernelParams const& params, SharedStorage& smem,
                                                PipelineStateV& state_v, const WorkTile& w, int tile_count) {
    PipelineState no_k;
    load_fp8<false, true>(params, smem, no_k, state_v, w, tile_count);
  }

  // Gathering producers load with the whole warpgroup (an FP8 cache is always gathered).
  static __device__ __forceinline__ bool all_warps(typename Tr::KernelParams const& params) { return params.gather_kv; }

  static __device__ __forceinline__ void load(typename Tr::KernelParams const& params, SharedStorage& smem,
                                              PipelineState& state_k, PipelineStateV& state_v, const WorkTile& w,
                                              int tile_count, uint32_t& tail_phase, bool leader) {
    if constexpr (Tr::kFp8Cache) load_fp8<true, Tr::kProducerWarpgroups == 1>(params, smem, state_k, state_v, w, tile_count);
    else if (params.gather_kv) load_gather(params, smem, state_k, state_v, w, tile_count);
    else load_tma(params, smem, state_k, state_v, w, tile_count, tail_phase, leader);
  }
};

}  // namespace flash3
