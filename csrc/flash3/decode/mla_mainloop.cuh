// The MLA decode kernel's consumers (decode/mla_traits.cuh) on one 64-row slab that both share,
// each accumulating half of O's 512 columns:
//  - consumer 0 runs the forward's algorithm (fwd/mainloop.cuh FwdConsumer: its softmax, masks,
//    P conversion and overlap are reused as they are): S = Q K^T, plus Qv V^T when the call has
//    qv, the online softmax, O[:, 0:256) += P V with P in its registers (RS); and it stages each
//    block's 16-bit P and the rows' O factor in shared memory (stage_p), and at the end the rows'
//    1 / row sum and LSE;
//  - consumer 1 takes them (named barriers PFull / PEmpty, one staged block at a time), scales
//    its O[:, 256:512) and adds P V from the staged P (SS). It issues no S GEMM and no softmax
//    (FA3's LargeHeadDimV split, built on flash3's own pieces).
// With qv, S_n needs V_n (qv's keys) as well as K_n: step n waits for V_n's stage (one past the
// stage of V_{n+1}, whose P.V it also issues); the producer's order (K_n, then V_{n+1}; V_n after
// K_{n-1}) and the two V stages hold both, so nothing waits on a release that needs it.
// Both consumers release every K and V stage (the pipelines count 256 consumer arrivals; consumer
// 1 releases K_n once P_n is staged: S_n is done), and arrive on q_free / o_free.
// No pingpong: consumer 1's only GEMMs wait on consumer 0's staging anyway.
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
  static constexpr uint32_t kPairThreads = 2 * 128;  // the staging warpgroup and the one that reads

  // The staging buffer starts free: consumer 1 says so once (consumer 0 waits for it before
  // every staging; each later PEmpty follows consumer 1's read of the staged block).
  static __device__ __forceinline__ void pingpong_start(int consumer) {
    if (consumer == 1) named_arrive(kPairThreads, Tr::kBarPEmpty);
  }

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

  // Consumer 0: the 16-bit P now in fr.tOrP and the factor O takes before its P.V (1 where the
  // running max stayed), for consumer 1, once it has read the previous block's.
  template <class TensorCS>
  static __device__ __forceinline__ void stage_p(SharedStorage& smem, Frags& fr, TensorCS const& tScS_rc, int tile) {
    using namespace cute;
    named_sync(kPairThreads, Tr::kBarPEmpty, Wait::PEmpty, tile);
    Tensor sP = make_tensor(make_smem_ptr(smem.p.data()), typename Tr::SmemLayoutP{});
    auto stsm = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, fr.mma_s);
    auto thr = stsm.get_thread_slice(consumer_thread_idx());
    Tensor rP = make_tensor(fr.tOrP.data(), typename Tr::LayoutS{});  // P's registers as S's (C) layout
    copy(stsm, thr.retile_S(rP), thr.partition_D(sP));
    CUTE_UNROLL
    for (int mi = 0; mi < kRows; ++mi)  // the quad's thread holding column 0 writes its rows'
      if (get<1>(tScS_rc(mi, 0)) == 0) smem.row_scale[get<0>(tScS_rc(mi, 0))] = fr.rescale ? fr.scale_o[mi] : 1.f;
    cutlass::arch::fence_view_async_shared();  // stmatrix (generic proxy) -> consumer 1's WGMMA
    named_arrive(kPairThreads, Tr::kBarPFull);
  }

  template <Masking kMask, class TensorO, class Ops, class TensorCS>
  static __device__ __forceinline__ void step(typename Tr::KernelParams const& params, SharedStorage& smem,
                                              PipelineKV& pipe_k, PipelineKV& pipe_v, PipelineState& state_k,
                                              PipelineState& state_v, const WorkTile& w, int n, bool has_qv,
                                              Ops const& ops, TensorCS const& tScS_rc, TensorO& tOrO, Frags& fr) {
    using namespace cute;
    Tensor tSrS = partition_fragment_C(fr.mma_s, Shape<typename Tr::BlkM, typename Tr::BlkN>{});
    PipelineState state_vn = state_v;  // V_n: the stage after V_{n+1}'s
    ++state_vn;
    Base::wait_full(smem.pipe_k, state_k, Wait::KFull, w.index);
    if (has_qv) Base::wait_full(smem.pipe_v, state_vn, Wait::VFull, w.index);
    issue_s(fr, ops, state_k.index(), state_vn.index(), has_qv, tSrS);
    Base::wait_full(smem.pipe_v, state_v, Wait::VFull, w.index);
    gemm_async<false>(fr.mma_o, fr.tOrP, ops.vt(_, _, _, state_v.index()), tOrO);
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
    stage_p(smem, fr, tScS_rc, w.index);
  }

  // Consumer 0's tile: S, softmax, its half of O; on return tOrO is normalized and lse holds the
  // rows' LSE (FwdConsumer::compute's contract), and both are staged for consumer 1.
  template <class TensorO>
  static __device__ __forceinline__ void compute_s(typename Tr::KernelParams const& params, SharedStorage& smem,
                                                   PipelineKV& pipe_k, PipelineKV& pipe_v, PipelineState& state_k,
                                                   PipelineState& state_v, const WorkTile& w, int tile_count,
                                                   TensorO& tOrO, float (&lse)[kRows]) {
    using namespace cute;
    Frags fr;
    // One warpgroup's S: thread tidx (< 128) of TiledMmaS; operand descriptors are the
    // warpgroup's (slice 0), O's those of consumer 0's half (slice 0 too).
    auto thr_s = fr.mma_s.get_thread_slice(consumer_thread_idx());
    auto wg_s = fr.mma_s.get_thread_slice(0);
    auto wg_qv = fr.mma_qv.get_thread_slice(0);
    auto wg_o = fr.mma_o.get_thread_slice(0);

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
      issue_s(fr, ops, state_k.index(), state_v.index(), has_qv, tSrS);
      warpgroup_wait<0>();
      pipe_k.consumer_release(state_k);
      ++state_k;
      if (n >= w.unmasked.end || n < w.unmasked.begin) {
        Base::template softmax_block<Masking::both, true>(params, tSrS, tScS_rc, w, n, fr);
      } else {
        Base::template softmax_block<Masking::none, true>(params, tSrS, tScS_rc, w, n, fr);
      }
      Base::store_p(tSrS, fr);
      fr.rescale = false;  // O is 0: consumer 1's factor is 1
      stage_p(smem, fr, tScS_rc, w.index);
    }

    // Masked blocks right of the unmasked range, the unmasked ones, then masked ones left of it
    // (a window); packed GQA rows take each row's bounds (Masking::both), as in the decode kernel.
    int n = w.blocks.end - 2;
#pragma unroll 1
    for (; n >= w.blocks.begin && n >= w.unmasked.end; --n)
      step<Masking::both>(params, smem, pipe_k, pipe_v, state_k, state_v, w, n, has_qv, ops, tScS_rc, tOrO, fr);
#pragma unroll 1
    for (; n >= w.blocks.begin && n >= w.unmasked.begin; --n)
      step<Masking::none>(params, smem, pipe_k, pipe_v, state_k, state_v, w, n, has_qv, ops, tScS_rc, tOrO, fr);
#pragma unroll 1
    for (; n >= w.blocks.begin; --n)
      step<Masking::both>(params, smem, pipe_k, pipe_v, state_k, state_v, w, n, has_qv, ops, tScS_rc, tOrO, fr);

    // Every S GEMM of this tile has completed: Q's and qv's buffers are free.
    cutlass::arch::ClusterBarrier::arrive(&smem.q_free);

    // Last P.V.
    Base::wait_full(smem.pipe_v, state_v, Wait::VFull, w.index);
    gemm_async<false>(fr.mma_o, fr.tOrP, ops.vt(_, _, _, state_v.index()), tOrO);
    float inv_sum[kRows];
    fr.softmax.finalize(inv_sum, lse);
    warpgroup_wait<0>();
    pipe_v.consumer_release(state_v);
    ++state_v;
    Base::rescale_o(tOrO, inv_sum);
    // The rows' 1 / sum and LSE for consumer 1 (plain shared-memory reads after PFull).
    named_sync(kPairThreads, Tr::kBarPEmpty, Wait::PEmpty, w.index);
    CUTE_UNROLL
    for (int mi = 0; mi < kRows; ++mi) {
      if (get<1>(tScS_rc(mi, 0)) != 0) continue;
      const int row = get<0>(tScS_rc(mi, 0));
      smem.row_scale[row] = inv_sum[mi];
      smem.row_lse[row] = lse[mi];
    }
    named_arrive(kPairThreads, Tr::kBarPFull);
  }

  // Consumer 1's tile: per key block, the staged P and factor of consumer 0, then its half of O.
  template <class TensorO>
  static __device__ __forceinline__ void compute_pv(typename Tr::KernelParams const& params, SharedStorage& smem,
                                                    PipelineKV& pipe_k, PipelineKV& pipe_v, PipelineState& state_k,
                                                    PipelineState& state_v, const WorkTile& w,
                                                    TensorO& tOrO, float (&lse)[kRows]) {
    using namespace cute;
    typename Tr::TiledMmaOSmem mma;
    auto wg = mma.get_thread_slice(128);  // consumer 1's half of O
    Tensor sP = make_tensor(make_smem_ptr(smem.p.data()), typename Tr::SmemLayoutP{});
    Tensor sVt = make_tensor(make_smem_ptr(smem.v.data()), typename Tr::SmemLayoutVt{});
    Tensor tOrP = wg.partition_fragment_A(sP);
    Tensor tOrV = wg.partition_fragment_B(sVt);
    // This thread's O rows (the accumulator layout is TiledMmaO's: thread 128 + t).
    Tensor tOcO = mma.get_thread_slice(consumer_thread_idx())
                      .partition_C(make_identity_tensor(Shape<typename Tr::BlkM, typename Tr::HDV>{}));
    Tensor tOcO_rc = make_tensor(tOcO.data(), acc_rowcol(tOcO.layout()));
    Tensor o_rc = make_tensor(tOrO.data(), acc_rowcol(tOrO.layout()));
    auto scale_rows = [&](const float* per_row) {
      CUTE_UNROLL
      for (int mi = 0; mi < kRows; ++mi) {
        const float f = per_row[get<0>(tOcO_rc(mi, 0))];
        CUTE_UNROLL
        for (int ni = 0; ni < size<1>(o_rc); ++ni) o_rc(mi, ni) *= f;
      }
    };
    clear(tOrO);
    cutlass::arch::ClusterBarrier::arrive(&smem.q_free);  // consumer 1 never reads Q or qv
#pragma unroll 1
    for (int n = w.blocks.end - 1; n >= w.blocks.begin; --n) {
      named_sync(kPairThreads, Tr::kBarPFull, Wait::PFull, w.index);  // P_n: S_n is done with K_n
      pipe_k.consumer_release(state_k);
      ++state_k;
      scale_rows(smem.row_scale);
      Base::wait_full(smem.pipe_v, state_v, Wait::VFull, w.index);
      gemm_async<false>(mma, tOrP, tOrV(_, _, _, state_v.index()), tOrO);
      warpgroup_wait<0>();
      named_arrive(kPairThreads, Tr::kBarPEmpty);
      pipe_v.consumer_release(state_v);
      ++state_v;
    }
    named_sync(kPairThreads, Tr::kBarPFull, Wait::PFull, w.index);  // 1 / row sum and LSE
    scale_rows(smem.row_scale);
    CUTE_UNROLL
    for (int mi = 0; mi < kRows; ++mi) lse[mi] = smem.row_lse[get<0>(tOcO_rc(mi, 0))];
    named_arrive(kPairThreads, Tr::kBarPEmpty);
  }

  template <class TensorO>
  static __device__ __forceinline__ void compute(typename Tr::KernelParams const& params, SharedStorage& smem,
                                                 PipelineKV& pipe_k, PipelineKV& pipe_v, PipelineState& state_k,
                                                 PipelineState& state_v, const WorkTile& w, int tile_count,
                                                 int consumer, TensorO& tOrO, float (&lse)[kRows]) {
    if (consumer == 0) compute_s(params, smem, pipe_k, pipe_v, state_k, state_v, w, tile_count, tOrO, lse);
    else compute_pv(params, smem, pipe_k, pipe_v, state_k, state_v, w, tOrO, lse);
  }
};

}  // namespace flash3
