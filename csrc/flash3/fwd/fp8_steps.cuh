// The FP8 (e4m3) consumer's own steps, out of FwdConsumer (mainloop.cuh) so that it reads as the
// 16-bit algorithm with FP8 hooks: the descales (q per slab, k/v per key block, v per channel), P as
// e4m3 in the A-operand layout, and the two-level P.V accumulation (each block's P.V into a fresh
// fp32 accumulator, added to O here: the FP8 WGMMA keeps fewer mantissa bits while accumulating).
// C is FwdConsumer<Tr>, whose waits, pingpong, softmax and P store these steps share. Every step is
// __forceinline__, as in mainloop.cuh (an outlined call serializes every wgmma).
#pragma once

#include <cute/tensor.hpp>

#include "flash3/common/barriers.cuh"
#include "flash3/common/softmax.cuh"
#include "flash3/common/wgmma.cuh"
#include "flash3/fwd/scheduler.cuh"
#include "flash3/fwd/traits.cuh"

namespace flash3 {

template <class Tr, class C>
struct FwdFp8Steps {
  using Element = typename Tr::Element;
  using PipelineKV = typename Tr::PipelineKV;
  using PipelineState = typename Tr::PipelineState;
  using SharedStorage = typename Tr::SharedStorage;
  static constexpr int kRows = Tr::kRowsPerThread;

  // Once per tile: this slab's q descale, and the k and v descales of the first block (end - 1).
  template <class F>
  static __device__ __forceinline__ void init(typename Tr::KernelParams const& params, const WorkTile& w,
                                              int consumer, F& fr) {
    // The last tile's second slab may lie wholly past seqlen_q (its rows are never stored): clamp.
    const int slab = imin(w.coord.m_block * Tr::kNumConsumers + consumer, (w.seq.seqlen_q - 1) / 64);
    fr.q_descale = params.p.fp8.q.at(w.coord.batch, w.coord.head, slab);
    fr.v_descale_p = params.p.fp8.v.at(w.coord.batch, w.head_k, w.blocks.end - 1);
    fr.s_descale = fr.q_descale * params.p.fp8.k.at(w.coord.batch, w.head_k, w.blocks.end - 1);
  }

  // The raw scores of block n times q_descale * k_descale[n] (fr.s_descale; before softcap and mask).
  template <class TensorS, class F>
  static __device__ __forceinline__ void descale_scores(TensorS& tSrS, F const& fr) {
    CUTE_UNROLL
    for (int i = 0; i < cute::size(tSrS); ++i) tSrS(i) *= fr.s_descale;
  }

  // P as e4m3: converted in S's register order, then byte moves into the A-operand layout.
  template <class TensorS, class TensorP>
  static __device__ __forceinline__ void store_p_to(TensorS const& tSrS, TensorP& tOrP) {
    using namespace cute;
    Tensor p_low = convert_fragment<Element>(tSrS);  // S's register order
    copy(make_tensor(p_low.data(), acc_as_a_operand_fp8(p_low.layout())), tOrP);  // byte moves
  }

  // Two-level accumulation of one chunk of O, where fresh is the block's P.V from a
  // zero-initialized accumulator: O = (O + fresh * v_descale) * scale, the rescale after the add
  // (overlapped step), or with kScaleFirst O = O * scale + fresh * v_descale (a rescale still
  // pending on O, chunked step).
  template <bool kScaleFirst = false, class TensorOc, class TensorF>
  static __device__ __forceinline__ void add_fresh(TensorOc& o, TensorF const& fresh, float v_descale,
                                                   const float (&scale)[kRows]) {
    using namespace cute;
    Tensor o_rc = make_tensor(o.data(), acc_rowcol(fresh.layout()));
    Tensor f_rc = make_tensor(fresh.data(), acc_rowcol(fresh.layout()));
    CUTE_UNROLL
    for (int mi = 0; mi < kRows; ++mi) {
      CUTE_UNROLL
      for (int ni = 0; ni < size<1>(o_rc); ++ni) {
        o_rc(mi, ni) = kScaleFirst ? fmaf(f_rc(mi, ni), v_descale, o_rc(mi, ni) * scale[mi])
                                   : fmaf(f_rc(mi, ni), v_descale, o_rc(mi, ni)) * scale[mi];
      }
    }
  }

  // Chunk c of O's fragment (kOChunks n-tiles of the P.V WGMMA), as a tensor shaped like `fresh`.
  template <class TensorO>
  static __device__ __forceinline__ auto o_chunk(TensorO& tOrO, int c) {
    using namespace cute;
    Tensor chunk = tOrO(_, _, c);
    return make_tensor(chunk.data(), make_layout(append(shape(chunk), _1{})));
  }

  // O's columns times the per-channel v descale (one load per column the thread holds).
  template <class TensorO>
  static __device__ __forceinline__ void scale_columns(const FwdParams& p, const WorkTile& w, TensorO& tOrO) {
    using namespace cute;
    const Descale& vc = p.fp8.v_channel;
    if (vc.ptr == nullptr) return;
    typename Tr::TiledMmaO mma_o;
    Tensor cO = make_identity_tensor(Shape<typename Tr::BlkM, typename Tr::HDV>{});
    Tensor tOcO = mma_o.get_thread_slice(consumer_thread_idx()).partition_C(cO);
    Tensor tOcO_rc = make_tensor(tOcO.data(), acc_rowcol(tOcO.layout()));
    Tensor o_rc = make_tensor(tOrO.data(), acc_rowcol(tOrO.layout()));
    CUTE_UNROLL
    for (int ni = 0; ni < size<1>(o_rc); ++ni) {
      const int col = get<1>(tOcO_rc(0, ni));
      const float f = col < p.head_dim_v ? vc.at(w.coord.batch, w.head_k, col) : 0.f;
      CUTE_UNROLL
      for (int mi = 0; mi < size<0>(o_rc); ++mi) o_rc(mi, ni) *= f;
    }
  }

  // The P.V B operand of O chunk c in stage s, with its (here single) n-tile mode kept.
  template <class TV>
  static __device__ __forceinline__ auto v_chunk(TV const& tOrV, int c, int stage) {
    using namespace cute;
    Tensor b = tOrV(_, c, _, stage);  // (MMA, MMA_K)
    return make_tensor(b.data(), make_layout(layout<0>(b), Layout<_1>{}, layout<1>(b)));
  }

  // Several O chunks: P.V one chunk at a time, each chunk's fresh accumulator added (O = O * scale +
  // fresh * v_descale) before the next is issued. `scale` is the rescale still pending on O.
  template <class TV, class TensorO, class F>
  static __device__ __forceinline__ void pv_chunks(TV const& tOrV, int stage, TensorO& tOrO, F& fr,
                                                   const float (&scale)[kRows]) {
    using namespace cute;
    Tensor fresh = partition_fragment_C(fr.mma_o, Shape<typename Tr::BlkM, Int<Tr::kOChunkCols>>{});
    CUTE_UNROLL
    for (int c = 0; c < Tr::kOChunks; ++c) {
      gemm_async<true>(fr.mma_o, fr.tOrP, v_chunk(tOrV, c, stage), fresh);
      warpgroup_wait<0>();
      Tensor oc = o_chunk(tOrO, c);
      add_fresh<true>(oc, fresh, fr.v_descale_p, scale);
    }
  }

  // Step for block n: S_n = Q K_n^T and the fresh accumulator of P_{n+1} V_{n+1}.
  //  One O chunk (d_v <= 128): issued together, the softmax of S_n runs under the P.V WGMMA, as in
  //  C::step; then O = (O + fresh * v_descale[n+1]) * rescale(n).
  //  Several chunks (d_v > 128, where O and a fresh chunk leave no room for S): P_{n+1} V_{n+1}
  //  first, chunk by chunk (pv_chunks, applying the rescale left pending by the previous softmax),
  //  then S_n and its softmax, whose rescale stays pending. No softmax/P.V overlap inside the
  //  warpgroup; the other warpgroup's softmax still runs under these GEMMs through pingpong.
  template <Masking kMask, class TensorO, class TQ, class TK, class TV, class TensorCS, class F>
  static __device__ __forceinline__ void step(typename Tr::KernelParams const& params, SharedStorage& smem,
                                              PipelineKV& pipe_k, PipelineKV& pipe_v, PipelineState& state_k,
                                              PipelineState& state_v, const WorkTile& w, int n, int consumer,
                                              TQ const& tSrQ, TK const& tSrK, TV const& tOrV,
                                              TensorCS const& tScS_rc, TensorO& tOrO, F& fr) {
    using namespace cute;
    Tensor tSrS = partition_fragment_C(fr.mma_s, Shape<typename Tr::BlkM, typename Tr::BlkN>{});
    const float v_descale_n = params.p.fp8.v.at(w.coord.batch, w.head_k, n);
    if constexpr (Tr::kOChunks > 1) {
      C::wait_full(smem.pipe_v, state_v, Wait::VFull, w.index);
      C::pingpong_wait(consumer, w.index);
      pv_chunks(tOrV, state_v.index(), tOrO, fr, fr.scale_o);
      pipe_v.consumer_release(state_v);
      ++state_v;
      C::wait_full(smem.pipe_k, state_k, Wait::KFull, w.index);
    } else {
      C::wait_full(smem.pipe_k, state_k, Wait::KFull, w.index);
      C::pingpong_wait(consumer, w.index);
    }
    // One chunk: k's descale read under S_n's WGMMA, not after its wait (a global load the softmax
    // would wait out: -11.6% cycles at d 128 in the timing model). Several chunks: after the wait,
    // as before (read early it cost 1.9% there: that softmax runs under the other warpgroup's
    // GEMMs anyway).
    const auto k_descale = [&] { fr.s_descale = fr.q_descale * params.p.fp8.k.at(w.coord.batch, w.head_k, n); };
    if constexpr (Tr::kOChunks == 1) k_descale();
    gemm_async<true>(fr.mma_s, tSrQ, tSrK(_, _, _, state_k.index()), tSrS);
    if constexpr (Tr::kOChunks == 1) {
      Tensor fresh = partition_fragment_C(fr.mma_o, Shape<typename Tr::BlkM, Int<Tr::kOChunkCols>>{});
      C::wait_full(smem.pipe_v, state_v, Wait::VFull, w.index);
      gemm_async<true>(fr.mma_o, fr.tOrP, tOrV(_, _, _, state_v.index()), fresh);
      C::pingpong_pass(consumer);
      warpgroup_wait<1>();  // S_n is ready; P.V still running
      pipe_k.consumer_release(state_k);
      ++state_k;
      C::template softmax_block<kMask, false>(params, tSrS, tScS_rc, w, n, fr);
      C::pin_before_wait(smem, fr);
      warpgroup_wait<0>();
      pipe_v.consumer_release(state_v);
      ++state_v;
      add_fresh(tOrO, fresh, fr.v_descale_p, fr.scale_o);
    } else {
      // (P_{n+1} V_{n+1} was issued above, before S_n: see the comment of this function.)
      C::pingpong_pass(consumer);
      warpgroup_wait<0>();
      pipe_k.consumer_release(state_k);
      ++state_k;
      k_descale();
      C::template softmax_block<kMask, false>(params, tSrS, tScS_rc, w, n, fr);
    }
    C::store_p(tSrS, fr);
    fr.v_descale_p = v_descale_n;
  }

  // The tile's last P.V (block `begin`), added without a rescale (already in O).
  template <class TensorO, class TV, class F>
  static __device__ __forceinline__ void last_pv(SharedStorage& smem, PipelineKV& pipe_v, PipelineState& state_v,
                                                 const WorkTile& w, int consumer, TV const& tOrV, TensorO& tOrO,
                                                 F& fr, float (&inv_sum)[kRows], float (&lse)[kRows]) {
    using namespace cute;
    Tensor fresh = partition_fragment_C(fr.mma_o, Shape<typename Tr::BlkM, Int<Tr::kOChunkCols>>{});
    float one[kRows];
    CUTE_UNROLL
    for (int mi = 0; mi < kRows; ++mi) one[mi] = 1.f;
    C::wait_full(smem.pipe_v, state_v, Wait::VFull, w.index);
    C::pingpong_wait(consumer, w.index);
    if constexpr (Tr::kOChunks == 1) {
      gemm_async<true>(fr.mma_o, fr.tOrP, v_chunk(tOrV, 0, state_v.index()), fresh);
      C::pingpong_pass(consumer);
      fr.softmax.finalize(inv_sum, lse);  // under the WGMMA
      warpgroup_wait<0>();
      add_fresh(tOrO, fresh, fr.v_descale_p, one);  // O already carries every rescale
    } else {
      pv_chunks(tOrV, state_v.index(), tOrO, fr, fr.scale_o);
      C::pingpong_pass(consumer);
      fr.softmax.finalize(inv_sum, lse);
    }
    pipe_v.consumer_release(state_v);
    ++state_v;
  }

  // The tile's end: the last P.V, the row sums, the per-channel v descale.
  template <class TensorO, class TV, class F>
  static __device__ __forceinline__ void finish(typename Tr::KernelParams const& params, SharedStorage& smem,
                                                PipelineKV& pipe_v, PipelineState& state_v, const WorkTile& w,
                                                int consumer, TV const& tOrV, TensorO& tOrO, F& fr,
                                                float (&lse)[kRows]) {
    float inv_sum[kRows];
    last_pv(smem, pipe_v, state_v, w, consumer, tOrV, tOrO, fr, inv_sum, lse);
    C::rescale_o(tOrO, inv_sum);
    scale_columns(params.p, w, tOrO);
  }
};

}  // namespace flash3
