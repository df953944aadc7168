// Epilogue of one tile: LSE from registers, O converted to 16 bits and staged in shared memory
// (V's buffer, free after the tile's last P.V) with stmatrix, then written by one TMA store
// (batched layout; TMA clips rows >= seqlen_q and columns >= d_v) or by predicated 16-byte stores
// (varlen, where a TMA store of the tile would overwrite the next sequence's rows). Ends by
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

  // LSE: after the quad reduction the four threads of a quad agree; the one holding column 0 writes.
  template <int kRows>
  static __device__ __forceinline__ void store_lse(const FwdParams& p, const WorkTile& w,
                                                   const float (&lse)[kRows]) {
    const int tidx = consumer_thread_idx();
    using namespace cute;
    if (p.lse == nullptr) return;
    typename Tr::TiledMmaO mma_o;
    Tensor cO = make_identity_tensor(Shape<typename Tr::BlkM, typename Tr::HDV>{});
    Tensor tOcO = mma_o.get_thread_slice(tidx).partition_C(cO);
    Tensor tOcO_rc = make_tensor(tOcO.data(), acc_rowcol(tOcO.layout()));
    float* lse_ptr = lse_base(p, w);
    CUTE_UNROLL
    for (int mi = 0; mi < kRows; ++mi) {
      const int row = w.coord.m_block * Tr::kBlockM + get<0>(tOcO_rc(mi, 0));
      if (get<1>(tOcO_rc(mi, 0)) == 0 && row < w.seq.seqlen_q) lse_ptr[row] = lse[mi];
    }
  }

  template <class TensorO, int kRows>
  static __device__ __forceinline__ void store(typename Tr::KernelParams const& params,
                                               typename Tr::SharedStorage& smem, const WorkTile& w,
                                               TensorO const& tOrO, const float (&lse)[kRows]) {
    using namespace cute;
    const FwdParams& p = params.p;
    store_lse(p, w, lse);
    const int tidx = consumer_thread_idx();

    Tensor sO = make_tensor(make_smem_ptr(reinterpret_cast<Element*>(smem.v.data())), typename Tr::SmemLayoutO{});
    Tensor rO = convert_fragment<Element>(tOrO);
    // stmatrix: each warp writes 8x8 16-bit matrices straight from the accumulator layout.
    using StsmOp = std::conditional_t<Tr::kHeadDimV % 16 == 0, SM90_U32x4_STSM_N, SM90_U32x2_STSM_N>;
    typename Tr::TiledMmaO mma_o;
    auto smem_copy = make_tiled_copy_C(Copy_Atom<StsmOp, Element>{}, mma_o);
    auto thr_copy = smem_copy.get_thread_slice(tidx);
    Tensor src = thr_copy.retile_S(rO);
    Tensor dst = thr_copy.partition_D(sO);

    sync_consumers(w.index);  // every warpgroup's last P.V has finished reading V's buffer
    copy(smem_copy, src, dst);

    if (p.cu_seqlens_q == nullptr) {
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
      Element* o = o_base(p, w);
      const int row0 = w.coord.m_block * Tr::kBlockM;
      for (int i = tidx; i < Tr::kBlockM * kChunks; i += Tr::kNumConsumerThreads) {
        const int r = i / kChunks, c = (i % kChunks) * 8;
        if (row0 + r < w.seq.seqlen_q && c < p.head_dim_v)
          *reinterpret_cast<uint4*>(o + int64_t(row0 + r) * p.o_row_stride + c) =
              *reinterpret_cast<uint4 const*>(&sO(r, c));
      }
    }
    // Our generic-proxy accesses of the buffer come before the producer's next TMA (async proxy) write.
    cutlass::arch::fence_view_async_shared();
    cutlass::arch::ClusterBarrier::arrive(&smem.o_free);
  }

  // A tile whose rows see no key at all: O = 0 and LSE = -inf, straight to global memory (the
  // producer loads nothing for it, so shared memory is not touched).
  static __device__ __forceinline__ void store_empty(const FwdParams& p, const WorkTile& w) {
    const int tidx = consumer_thread_idx();
    constexpr int kChunks = Tr::kHeadDimV / 8;
    Element* o = o_base(p, w);
    const int row0 = w.coord.m_block * Tr::kBlockM;
    for (int i = tidx; i < Tr::kBlockM * kChunks; i += Tr::kNumConsumerThreads) {
      const int r = i / kChunks, c = (i % kChunks) * 8;
      if (row0 + r < w.seq.seqlen_q && c < p.head_dim_v)
        *reinterpret_cast<uint4*>(o + int64_t(row0 + r) * p.o_row_stride + c) = make_uint4(0, 0, 0, 0);
    }
    if (p.lse != nullptr) {
      float* l = lse_base(p, w);
      for (int r = tidx; r < Tr::kBlockM; r += Tr::kNumConsumerThreads)
        if (row0 + r < w.seq.seqlen_q) l[row0 + r] = -INFINITY;
    }
  }
};

}  // namespace flash3
