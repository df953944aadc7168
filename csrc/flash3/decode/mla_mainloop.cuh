// The MLA decode kernel's consumer (decode/mla_traits.cuh): the forward's algorithm
// (fwd/mainloop.cuh FwdConsumer: its softmax, masks, P conversion and pingpong are reused as they
// are) on one 64-row slab that both consumer warpgroups share:
//  - each warpgroup issues the whole S = Q K^T, plus Qv V^T when the call has qv, and runs the
//    online softmax of all 64 x block_n scores (the two compute bit-identical S, row maxes and P);
//  - each then accumulates its half of O's columns, O[:, 256 c .. 256 c + 256) += P V[:, ...],
//    P from its own registers (RS, P rounded to q's dtype as in every 16-bit kernel).
// With qv, S_n needs V_n (qv's keys) as well as K_n: step n waits for V_n's stage (one past the
// stage of V_{n+1}, whose P.V it also issues); the producer's order (K_n, then V_{n+1}; V_n after
// K_{n-1}) and the two V stages hold both, so nothing waits on a release that needs it.
// Both warpgroups release every K and V stage (the pipelines count 256 consumer arrivals), and
// arrive on q_free / o_free as the forward's consumers do.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "flash3/common/barriers.cuh"
#include "flash3/common/softmax.cuh"
#include "flash3/common/wgmma.cuh"
#include "flash3/decode/mla_traits.cuh"
#include "flash3/fwd/mainloop.cuh"
#include "flash3/fwd/scheduler.cuh"

namespace flash3 {

template <class Tr>
struct MlaConsumer {
  static_assert(Tr::kMla, "MLA traits");
  using Base = FwdConsumer<Tr>;
  using Element = typename Tr::Element;
  using PipelineKV = typename Tr::PipelineKV;
  using PipelineState = typename Tr::PipelineState;
  using SharedStorage = typename Tr::SharedStorage;
  static constexpr int kRows = Tr::kRowsPerThread;

  static __device__ __forceinline__ void pingpong_start(int consumer) { Base::pingpong_start(consumer); }

  // What Base::softmax_block and store_p read (no ALiBi: Tr::kAlibi is false), and the MMAs.
  struct Frags {
    typename Tr::TiledMmaS mma_s;
    typename Tr::TiledMmaQv mma_qv;
    typename Tr::TiledMmaO mma_o;
    decltype(cute::make_tensor<Element>(typename Tr::LayoutP{})) tOrP;
    OnlineSoftmax<kRows, 0> softmax;
    float scale_o[kRows];
    bool rescale;
  };

  // S of key block n into tSrS: Q K_n^T from K's stage sk, + Qv V_n^T from V's stage sv (qv only).
  template <class TS, class Ops>
  static __device__ __forceinline__ void issue_s(Frags& fr, Ops const& ops, int sk, int sv, bool has_qv, TS& tSrS) {
    using namespace cute;
    gemm_async<true>(fr.mma_s, ops.q, ops.k(_, _, _, sk), tSrS);
    if (has_qv) gemm_async<false>(fr.mma_qv, ops.qv, ops.vk(_, _, _, sv), tSrS);
  }

  template <Masking kMask, class TensorO, class Ops, class TensorCS>
  static __device__ __forceinline__ void step(typename Tr::KernelParams const& params, SharedStorage& smem,
                                              PipelineKV& pipe_k, PipelineKV& pipe_v, PipelineState& state_k,
                                              PipelineState& state_v, const WorkTile& w, int n, int consumer,
                                              bool has_qv, Ops const& ops, TensorCS const& tScS_rc, TensorO& tOrO,
                                              Frags& fr) {
    using namespace cute;
    Tensor tSrS = partition_fragment_C(fr.mma_s, Shape<typename Tr::BlkM, typename Tr::BlkN>{});
    PipelineState state_vn = state_v;  // V_n: the stage after V_{n+1}'s
    ++state_vn;
    Base::wait_full(smem.pipe_k, state_k, Wait::KFull, w.index);
    if (has_qv) Base::wait_full(smem.pipe_v, state_vn, Wait::VFull, w.index);
    Base::pingpong_wait(consumer, w.index);
    issue_s(fr, ops, state_k.index(), state_vn.index(), has_qv, tSrS);
    Base::wait_full(smem.pipe_v, state_v, Wait::VFull, w.index);
    gemm_async<false>(fr.mma_o, fr.tOrP, ops.vt(_, _, _, state_v.index()), tOrO);
    Base::pingpong_pass(consumer);
    warpgroup_wait<1>();  // S_n is ready (both of its batches); P.V still running
    pipe_k.consumer_release(state_k);
    ++state_k;
    Base::template softmax_block<kMask, false>(params, tSrS, tScS_rc, w, n, fr);
    Base::pin_before_wait(smem, fr);
    warpgroup_wait<0>();
    pipe_v.consumer_release(state_v);
    ++state_v;
    Base::store_p(tSrS, fr);
    if (fr.rescale) Base::rescale_o(tOrO, fr.scale_o);
  }

  // One tile; on return tOrO holds this warpgroup's O columns normalized by the row sums and lse
  // the rows' natural-log LSE (FwdConsumer::compute's contract).
  template <class TensorO>
  static __device__ __forceinline__ void compute(typename Tr::KernelParams const& params, SharedStorage& smem,
                                                 PipelineKV& pipe_k, PipelineKV& pipe_v, PipelineState& state_k,
                                                 PipelineState& state_v, const WorkTile& w, int tile_count,
                                                 int consumer, TensorO& tOrO, float (&lse)[kRows]) {
    using namespace cute;
    const int tidx = consumer_thread_idx();
    Frags fr;
    // S is one warpgroup's: this thread is thread tidx % 128 of it; its operand descriptors are
    // the warpgroup's (slice 0). O's descriptors: this consumer's half (slice 128 c).
    auto thr_s = fr.mma_s.get_thread_slice(tidx % 128);
    auto wg_s = fr.mma_s.get_thread_slice(0);
    auto wg_qv = fr.mma_qv.get_thread_slice(0);
    auto wg_o = fr.mma_o.get_thread_slice(consumer * 128);

    Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), typename Tr::SmemLayoutQ{});
    Tensor sQv = make_tensor(make_smem_ptr(smem.qv.data()), typename Tr::SmemLayoutQv{});
    Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), typename Tr::SmemLayoutK{});
    Tensor sV = make_tensor(make_smem_ptr(smem.v.data()), typename Tr::SmemLayoutV{});    // (n, d_v, stage)
    Tensor sVt = make_tensor(make_smem_ptr(smem.v.data()), typename Tr::SmemLayoutVt{});  // (d_v, n, stage)
    struct {
      decltype(wg_s.partition_fragment_A(sQ)) q;
      decltype(wg_s.partition_fragment_B(sK)) k;
      decltype(wg_qv.partition_fragment_A(sQv)) qv;
      decltype(wg_qv.partition_fragment_B(sV)) vk;
      decltype(wg_o.partition_fragment_B(sVt)) vt;
    } ops{wg_s.partition_fragment_A(sQ), wg_s.partition_fragment_B(sK), wg_qv.partition_fragment_A(sQv),
          wg_qv.partition_fragment_B(sV), wg_o.partition_fragment_B(sVt)};

    Tensor cS = make_identity_tensor(Shape<typename Tr::BlkM, typename Tr::BlkN>{});
    Tensor tScS = thr_s.partition_C(cS);
    Tensor tScS_rc = make_tensor(tScS.data(), acc_rowcol(tScS.layout()));

    fr.softmax.init(params.mod.scale_log2);
    clear(tOrO);
    const bool has_qv = params.p.qv != nullptr;

    mbarrier_wait(&smem.q_full, tile_count & 1, Wait::QFull, w.index);

    // First (rightmost) block: S only. Its V stays for the next step's P.V.
    {
      const int n = w.blocks.end - 1;
      Tensor tSrS = partition_fragment_C(fr.mma_s, Shape<typename Tr::BlkM, typename Tr::BlkN>{});
      Base::wait_full(smem.pipe_k, state_k, Wait::KFull, w.index);
      if (has_qv) Base::wait_full(smem.pipe_v, state_v, Wait::VFull, w.index);
      Base::pingpong_wait(consumer, w.index);
      issue_s(fr, ops, state_k.index(), state_v.index(), has_qv, tSrS);
      Base::pingpong_pass(consumer);
      warpgroup_wait<0>();
      pipe_k.consumer_release(state_k);
      ++state_k;
      if (n >= w.unmasked.end || n < w.unmasked.begin) {
        Base::template softmax_block<Masking::both, true>(params, tSrS, tScS_rc, w, n, fr);
      } else {
        Base::template softmax_block<Masking::none, true>(params, tSrS, tScS_rc, w, n, fr);
      }
      Base::store_p(tSrS, fr);
    }

    // Masked blocks right of the unmasked range, the unmasked ones, then masked ones left of it
    // (a window); packed GQA rows take each row's bounds (Masking::both), as in the decode kernel.
    int n = w.blocks.end - 2;
#pragma unroll 1
    for (; n >= w.blocks.begin && n >= w.unmasked.end; --n)
      step<Masking::both>(params, smem, pipe_k, pipe_v, state_k, state_v, w, n, consumer, has_qv, ops, tScS_rc, tOrO, fr);
#pragma unroll 1
    for (; n >= w.blocks.begin && n >= w.unmasked.begin; --n)
      step<Masking::none>(params, smem, pipe_k, pipe_v, state_k, state_v, w, n, consumer, has_qv, ops, tScS_rc, tOrO, fr);
#pragma unroll 1
    for (; n >= w.blocks.begin; --n)
      step<Masking::both>(params, smem, pipe_k, pipe_v, state_k, state_v, w, n, consumer, has_qv, ops, tScS_rc, tOrO, fr);

    // Every S GEMM of this tile has completed: Q's and qv's buffers are free.
    cutlass::arch::ClusterBarrier::arrive(&smem.q_free);

    // Last P.V.
    Base::wait_full(smem.pipe_v, state_v, Wait::VFull, w.index);
    Base::pingpong_wait(consumer, w.index);
    gemm_async<false>(fr.mma_o, fr.tOrP, ops.vt(_, _, _, state_v.index()), tOrO);
    Base::pingpong_pass(consumer);
    float inv_sum[kRows];
    fr.softmax.finalize(inv_sum, lse);
    warpgroup_wait<0>();
    pipe_v.consumer_release(state_v);
    ++state_v;
    Base::rescale_o(tOrO, inv_sum);
  }
};

}  // namespace flash3
