// Epilogue of one tile: LSE from registers, O converted to 16 bits and staged in shared memory
// (kOwnOBuffer: O's own buffer, each warp its 16-row slab, stored by the warp alone:
// store_warp_slab; else V's buffer, free after the tile's last P.V) with stmatrix, then written by one TMA store
// (batched layout; TMA clips rows >= seqlen_q and columns >= d_v) or by predicated 16-byte stores
// (varlen, where a TMA store of the tile would overwrite the next sequence's rows; with seqused_q
// the rows past the used queries up to the packed length are stored too, as O = 0, LSE = -inf). Ends by
// releasing the buffer to the producer (o_free), after the TMA store has finished reading it.
// Q's buffer was released earlier (q_free, after the last Q.K^T), so the next tile's Q and K
// loads overlap this epilogue.
#pragma once

#include <cute/tensor.hpp>
#include <cute/arch/copy_sm90.hpp>
#include <cutlass/arch/barrier.h>

#include "flash3/common/barriers.cuh"
#include "flash3/fwd/scheduler.cuh"
#include "flash3/common/softmax.cuh"
#include "flash3/fwd/traits.cuh"

namespace flash3 {

template <class Tr>
struct FwdEpilogue {
  using Element = typename Tr::ElementOut;  // O's type (bf16 for the FP8 kernel)

  static __device__ __forceinline__ void sync_consumers(int tile) {
    named_sync(Tr::kNumConsumerThreads, Tr::kBarEpilogue, Wait::Epilogue, tile);
  }

  // Start of the O rows of (batch, head) in global memory; rows are then o_row_stride apart.
  static __device__ __forceinline__ Element* o_base(const FwdParams& p, const WorkTile& w) {
    Element* o = static_cast<Element*>(p.o) + int64_t(w.coord.head) * p.o_head_stride;
    return p.cu_seqlens_q != nullptr ? o + int64_t(w.seq.offset_q) * p.o_row_stride
                                     : o + int64_t(w.coord.batch) * p.o_batch_stride;
  }
  static __device__ __forceinline__ float* lse_base(const FwdParams& p, const WorkTile& w) {
    float* l = p.lse + int64_t(w.coord.head) * p.lse_head_stride;
    return p.cu_seqlens_q != nullptr ? l + w.seq.offset_q : l + int64_t(w.coord.batch) * p.lse_batch_stride;
  }

  // Decode (packed GQA): tile row `row` (m_block's rows counted from 0) is (token, query head),
  // token counted within the batch entry's w.seq.seqlen_q queries (varlen: packed row offset_q +
  // token of q/o/lse); false past the last packed row.
  struct PackedRow {
    int token, head;
  };
  static __device__ __forceinline__ bool packed_row(const FwdParams& p, const WorkTile& w, int row, PackedRow& r) {
    const int g = p.num_heads / p.num_heads_k, packed = w.coord.m_block * Tr::kBlockM + row;
    if (packed >= w.seq.seqlen_q * g) return false;
    r.token = packed / g;
    r.head = w.head_k * g + (packed - r.token * g);
    return true;
  }

  // O row and LSE entry of tile row `row`, nullptr when the row is not stored.
  static __device__ __forceinline__ Element* o_row(const FwdParams& p, const WorkTile& w, int row) {
    if constexpr (Tr::kDecode) {
      PackedRow r;
      if (!packed_row(p, w, row, r)) return nullptr;
      // Varlen q: packed rows (no batch stride); batched: offset_q is 0.
      const int64_t batch_off = p.cu_seqlens_q != nullptr ? 0 : int64_t(w.coord.batch) * p.o_batch_stride;
      return static_cast<Element*>(p.o) + batch_off + int64_t(w.seq.offset_q + r.token) * p.o_row_stride +
             int64_t(r.head) * p.o_head_stride;
    } else {
      row += w.coord.m_block * Tr::kBlockM;
      return row < w.seq.rows_q ? o_base(p, w) + int64_t(row) * p.o_row_stride : nullptr;
    }
  }
  static __device__ __forceinline__ float* lse_entry(const FwdParams& p, const WorkTile& w, int row) {
    if constexpr (Tr::kDecode) {
      PackedRow r;
      if (!packed_row(p, w, row, r)) return nullptr;
      // Varlen q: lse (h, total_q); batched: (b, h, s_q).
      const int64_t batch_off = p.cu_seqlens_q != nullptr ? 0 : int64_t(w.coord.batch) * p.lse_batch_stride;
      return p.lse + batch_off + int64_t(r.head) * p.lse_head_stride + (w.seq.offset_q + r.token);
    } else {
      row += w.coord.m_block * Tr::kBlockM;
      return row < w.seq.rows_q ? lse_base(p, w) + row : nullptr;
    }
  }

  // Split-KV partials of tile row `row` (FwdParams: o_partial, lse_partial), nullptr past the rows.
  // Varlen q: indexed by packed row, o_partial (num_splits, total_q, h, d_v) and lse_partial
  // (num_splits, h, total_q): the batched layout with b = 1 and s_q = total_q (combine.cu runs so).
  static __device__ __forceinline__ float* o_partial_row(const FwdParams& p, const WorkTile& w, int row) {
    PackedRow r;
    if (!packed_row(p, w, row, r)) return nullptr;
    const int64_t entry = p.cu_seqlens_q != nullptr
                              ? int64_t(w.split) * p.total_q + w.seq.offset_q + r.token
                              : (int64_t(w.split) * p.batch + w.coord.batch) * p.seqlen_q + r.token;
    return p.o_partial + (entry * p.num_heads + r.head) * p.head_dim_v;
  }
  static __device__ __forceinline__ float* lse_partial_entry(const FwdParams& p, const WorkTile& w, int row) {
    PackedRow r;
    if (!packed_row(p, w, row, r)) return nullptr;
    if (p.cu_seqlens_q != nullptr)
      return p.lse_partial + (int64_t(w.split) * p.num_heads + r.head) * p.total_q + w.seq.offset_q + r.token;
    const int64_t entry = (int64_t(w.split) * p.batch + w.coord.batch) * p.num_heads + r.head;
    return p.lse_partial + entry * p.seqlen_q + r.token;
  }
  static __device__ __forceinline__ bool split_output(const FwdParams& p) {
    if constexpr (Tr::kDecode) return p.num_splits > 1;
    else return false;
  }

  // Attention sinks (FwdParams::sinks): on the stored O and LSE only; split partials stay
  // sink-free (the combine adds the sink once).
  static __device__ __forceinline__ bool has_sinks(const FwdParams& p) {
    return p.sinks != nullptr && !split_output(p);
  }
  // The sink of tile row `row`'s head (decode: the packed row's query head; -inf, no sink, past
  // the last packed row, which is not stored).
  static __device__ __forceinline__ float row_sink(const FwdParams& p, const WorkTile& w, int row) {
    if constexpr (Tr::kDecode) {
      PackedRow r;
      return packed_row(p, w, row, r) ? p.sinks[r.head] : -INFINITY;
    } else {
      return p.sinks[w.coord.head];
    }
  }
  // logaddexp(lse, sink) without overflow, and in `factor` exp(lse - that), which O is scaled by
  // (0 for a row that saw no key: lse -inf). Neither term (both -inf): lse unchanged, factor 1.
  static __device__ __forceinline__ float add_sink(float lse, float sink, float& factor) {
    const float m = fmaxf(lse, sink);
    if (m == -INFINITY) {
      factor = 1.f;
      return lse;
    }
    const float out = m + log1pf(expf(-fabsf(lse - sink)));
    factor = expf(lse - out);
    return out;
  }
  // This thread's (row, col) in the O tile, in the accumulator's (row, col) view: tOcO_rc(mi, ni)
  // is where o_rc(mi, ni) goes.
  static __device__ __forceinline__ auto o_coords(int tidx) {
    using namespace cute;
    typename Tr::TiledMmaO mma_o;
    Tensor tOcO = mma_o.get_thread_slice(tidx).partition_C(
        make_identity_tensor(Shape<typename Tr::BlkM, typename Tr::HDV>{}));
    return make_tensor(tOcO.data(), acc_rowcol(tOcO.layout()));
  }

  template <class TensorO, int kRows>
  static __device__ __forceinline__ void apply_sinks(const FwdParams& p, const WorkTile& w, TensorO& tOrO,
                                                     float (&lse)[kRows]) {
    using namespace cute;
    Tensor tOcO_rc = o_coords(consumer_thread_idx());
    Tensor o_rc = make_tensor(tOrO.data(), acc_rowcol(tOrO.layout()));
    CUTE_UNROLL
    for (int mi = 0; mi < kRows; ++mi) {
      float factor;
      lse[mi] = add_sink(lse[mi], row_sink(p, w, get<0>(tOcO_rc(mi, 0))), factor);
      CUTE_UNROLL
      for (int ni = 0; ni < size<1>(o_rc); ++ni) o_rc(mi, ni) *= factor;
    }
  }

  // seqused_q: the tile's rows from seqlen_q to rows_q are packed rows past the sequence's used
  // queries, computed like queries (their scores are not): O = 0 and LSE = -inf instead.
  template <class TensorO, int kRows>
  static __device__ __forceinline__ void clear_unused_rows(const WorkTile& w, TensorO& tOrO, float (&lse)[kRows]) {
    using namespace cute;
    Tensor tOcO_rc = o_coords(consumer_thread_idx());
    Tensor o_rc = make_tensor(tOrO.data(), acc_rowcol(tOrO.layout()));
    const int used = w.seq.seqlen_q - w.coord.m_block * Tr::kBlockM;  // tile rows below it are queries
    CUTE_UNROLL
    for (int mi = 0; mi < kRows; ++mi) {
      if (get<0>(tOcO_rc(mi, 0)) < used) continue;
      lse[mi] = -INFINITY;
      CUTE_UNROLL
      for (int ni = 0; ni < size<1>(o_rc); ++ni) o_rc(mi, ni) = 0.f;
    }
  }

  // LSE: after the quad reduction the four threads of a quad agree; the one holding column 0 writes.
  template <int kRows>
  static __device__ __forceinline__ void store_lse(const FwdParams& p, const WorkTile& w,
                                                   const float (&lse)[kRows]) {
    const int tidx = consumer_thread_idx();
    using namespace cute;
    if (p.lse == nullptr && !split_output(p)) return;
    Tensor tOcO_rc = o_coords(tidx);
    CUTE_UNROLL
    for (int mi = 0; mi < kRows; ++mi) {
      const int row = get<0>(tOcO_rc(mi, 0));
      float* l = split_output(p) ? lse_partial_entry(p, w, row) : lse_entry(p, w, row);
      if (get<1>(tOcO_rc(mi, 0)) == 0 && l != nullptr) *l = lse[mi];
    }
  }

  // Split-KV: O (normalized over the split's keys) straight from the accumulators as fp32 pairs;
  // shared memory is not touched.
  template <class TensorO>
  static __device__ __forceinline__ void store_partial(const FwdParams& p, const WorkTile& w, TensorO const& tOrO) {
    using namespace cute;
    Tensor tOcO_rc = o_coords(consumer_thread_idx());
    Tensor o_rc = make_tensor(tOrO.data(), acc_rowcol(tOrO.layout()));
    static_assert(decltype(size<1>(o_rc))::value % 2 == 0, "accumulator columns come in pairs");
    CUTE_UNROLL
    for (int mi = 0; mi < size<0>(o_rc); ++mi) {
      float* o = o_partial_row(p, w, get<0>(tOcO_rc(mi, 0)));
      if (o == nullptr) continue;
      CUTE_UNROLL
      for (int ni = 0; ni < size<1>(o_rc); ni += 2) {
        const int col = get<1>(tOcO_rc(mi, ni));  // even; col + 1 is the pair's second value
        if (col < p.head_dim_v) *reinterpret_cast<float2*>(o + col) = make_float2(o_rc(mi, ni), o_rc(mi, ni + 1));
      }
    }
  }

  // O and LSE of a tile after its mainloop (tOrO is scaled in place when sinks are on).
  template <class TensorO, int kRows>
  static __device__ __forceinline__ void store(typename Tr::KernelParams const& params,
                                               typename Tr::SharedStorage& smem, const WorkTile& w,
                                               TensorO& tOrO, const float (&lse_in)[kRows]) {
    using namespace cute;
    const FwdParams& p = params.p;
    float lse[kRows];
    CUTE_UNROLL
    for (int mi = 0; mi < kRows; ++mi) lse[mi] = lse_in[mi];
    if (has_sinks(p)) apply_sinks(p, w, tOrO, lse);
    if constexpr (!Tr::kDecode) {
      if (w.seq.seqlen_q < w.seq.rows_q) clear_unused_rows(w, tOrO, lse);
    }
    store_lse(p, w, lse);
    const int tidx = consumer_thread_idx();
    if (split_output(p)) {
      store_partial(p, w, tOrO);
      cutlass::arch::ClusterBarrier::arrive(&smem.o_free);  // V's buffer was not used for O
      return;
    }

    Tensor sO = make_tensor(make_smem_ptr(Tr::o_buffer(smem)), typename Tr::SmemLayoutO{});
    Tensor rO = convert_fragment<Element>(tOrO);
    // stmatrix: each warp writes 8x8 16-bit matrices straight from the accumulator layout.
    using StsmOp = std::conditional_t<Tr::kHeadDimV % 16 == 0, SM90_U32x4_STSM_N, SM90_U32x2_STSM_N>;
    typename Tr::TiledMmaO mma_o;
    auto smem_copy = make_tiled_copy_C(Copy_Atom<StsmOp, Element>{}, mma_o);
    auto thr_copy = smem_copy.get_thread_slice(tidx);
    Tensor src = thr_copy.retile_S(rO);
    Tensor dst = thr_copy.partition_D(sO);

    if constexpr (Tr::kOwnOBuffer) {
      store_warp_slab(params, w, sO, smem_copy, src, dst);
      return;
    }
    sync_consumers(w.index);  // every warpgroup's last P.V has finished reading V's buffer
    copy(smem_copy, src, dst);

    if (p.cu_seqlens_q == nullptr && !Tr::kDecode) {
      cutlass::arch::fence_view_async_shared();  // make the generic-proxy writes visible to TMA
      sync_consumers(w.index);
      if (tidx == 0) {
        Tensor mO = params.tma_o.get_tma_tensor(params.shape_o);  // (s_q, d_v, h, b)
        Tensor gO = local_tile(mO(_, _, w.coord.head, w.coord.batch), Shape<typename Tr::BlkM, typename Tr::HDV>{},
                               make_coord(w.coord.m_block, _0{}));
        auto [tOgO, tOsO] = tma_partition(params.tma_o, _0{}, Layout<_1>{}, group_modes<0, 2>(sO),
                                          group_modes<0, 2>(gO));
        copy(params.tma_o, tOsO, tOgO);
        tma_store_arrive();
        tma_store_wait<0>();  // the store has read the buffer; the producer may reuse it
      }
    } else {
      sync_consumers(w.index);
      constexpr int kChunks = Tr::kHeadDimV / 8;  // 16-byte chunks per row; unswizzled within a chunk
      for (int i = tidx; i < Tr::kBlockM * kChunks; i += Tr::kNumConsumerThreads) {
        const int r = i / kChunks, c = (i % kChunks) * 8;
        Element* o = o_row(p, w, r);
        if (o != nullptr && c < p.head_dim_v)
          *reinterpret_cast<uint4*>(o + c) = *reinterpret_cast<uint4 const*>(&sO(r, c));
      }
    }
    // Our generic-proxy accesses of the buffer come before the producer's next TMA (async proxy) write.
    cutlass::arch::fence_view_async_shared();
    cutlass::arch::ClusterBarrier::arrive(&smem.o_free);
  }

  // kOwnOBuffer: O's buffer is the epilogue's alone, in 16-row slabs, and warp k (of the consumer
  // threads) holds rows 16k..16k+15 of the accumulator (the WGMMA layout), so each warp stages and
  // stores its own slab with no barrier beyond its own: lane 0 issues its slab's TMA store (batched)
  // or the warp copies it out (varlen). Before overwriting the slab, lane 0 waits for its previous
  // store to have read it (issued a whole tile earlier); drain() waits for the last one before exit.
  template <class TensorSO, class SmemCopy, class Src, class Dst>
  static __device__ __forceinline__ void store_warp_slab(typename Tr::KernelParams const& params, const WorkTile& w,
                                                         TensorSO const& sO, SmemCopy const& smem_copy,
                                                         Src const& src, Dst& dst) {
    using namespace cute;
    const FwdParams& p = params.p;
    const int lane = threadIdx.x % 32;
    const int slab = consumer_thread_idx() / 32;  // this warp's 16 rows of the tile
    if (lane == 0) tma_store_wait<0>();
    __syncwarp();
    copy(smem_copy, src, dst);
    if (p.cu_seqlens_q == nullptr) {
      cutlass::arch::fence_view_async_shared();  // the warp's generic-proxy writes, visible to TMA
      __syncwarp();
      if (lane == 0) {
        Tensor mO = params.tma_o.get_tma_tensor(params.shape_o);  // (s_q, d_v, h, b)
        Tensor gO = local_tile(mO(_, _, w.coord.head, w.coord.batch), Shape<_16, typename Tr::HDV>{},
                               make_coord(w.coord.m_block * (Tr::kBlockM / 16) + slab, _0{}));
        Tensor sSlab = make_tensor(sO.data() + slab * cute::cosize_v<typename Tr::SmemLayoutOWarp>,
                                   typename Tr::SmemLayoutOWarp{});
        auto [tOgO, tOsO] = tma_partition(params.tma_o, _0{}, Layout<_1>{}, group_modes<0, 2>(sSlab),
                                          group_modes<0, 2>(gO));
        copy(params.tma_o, tOsO, tOgO);
        tma_store_arrive();
      }
    } else {
      __syncwarp();
      constexpr int kChunks = Tr::kHeadDimV / 8;  // 16-byte chunks per row; unswizzled within a chunk
      for (int i = lane; i < 16 * kChunks; i += 32) {
        const int r = slab * 16 + i / kChunks, c = (i % kChunks) * 8;
        Element* o = o_row(p, w, r);
        if (o != nullptr && c < p.head_dim_v)
          *reinterpret_cast<uint4*>(o + c) = *reinterpret_cast<uint4 const*>(&sO(r, c));
      }
      __syncwarp();  // the slab is read before the next tile's stmatrix overwrites it
    }
  }
  // kOwnOBuffer: before the kernel exits, each warp's last TMA store has read its slab.
  static __device__ __forceinline__ void drain() {
    if constexpr (Tr::kOwnOBuffer) {
      if (threadIdx.x % 32 == 0) cute::tma_store_wait<0>();
    }
  }

  // A tile whose rows see no key at all: O = 0 and LSE = -inf (with sinks: the row's sink),
  // straight to global memory (the producer loads nothing for it, so shared memory is not touched).
  static __device__ __forceinline__ void store_empty(const FwdParams& p, const WorkTile& w) {
    const int tidx = consumer_thread_idx();
    if (split_output(p)) {  // this split saw no key of these rows: o = 0, lse = -inf
      for (int i = tidx; i < Tr::kBlockM * p.head_dim_v; i += Tr::kNumConsumerThreads) {
        float* o = o_partial_row(p, w, i / p.head_dim_v);
        if (o != nullptr) o[i % p.head_dim_v] = 0.f;
      }
      for (int r = tidx; r < Tr::kBlockM; r += Tr::kNumConsumerThreads) {
        float* l = lse_partial_entry(p, w, r);
        if (l != nullptr) *l = -INFINITY;
      }
      return;
    }
    constexpr int kChunks = Tr::kHeadDimV / 8;
    for (int i = tidx; i < Tr::kBlockM * kChunks; i += Tr::kNumConsumerThreads) {
      const int r = i / kChunks, c = (i % kChunks) * 8;
      Element* o = o_row(p, w, r);
      if (o != nullptr && c < p.head_dim_v) *reinterpret_cast<uint4*>(o + c) = make_uint4(0, 0, 0, 0);
    }
    if (p.lse != nullptr) {
      for (int r = tidx; r < Tr::kBlockM; r += Tr::kNumConsumerThreads) {
        float* l = lse_entry(p, w, r);
        if (l != nullptr) *l = has_sinks(p) ? row_sink(p, w, r) : -INFINITY;
      }
    }
  }
};

}  // namespace flash3
