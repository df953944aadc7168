// The two sides of the mainloop for one tile.
//  Producer (one warp of warpgroup 0, one elected thread issuing): TMA loads of Q (own transaction
//   barrier) and of K and V (one PipelineTmaAsync each), key blocks from end - 1 down to begin.
//  Consumer (one warpgroup per 64 query rows): S = Q K^T by WGMMA SS, online softmax, O += P V by
//   WGMMA RS. Iteration j issues S_j and O += P_{j+1} V_{j+1} together and runs the softmax of S_j
//   while the P.V WGMMA is in flight (intra-warpgroup overlap); the issue of GEMMs is serialized
//   across consumer warpgroups by named barriers (pingpong) so one warpgroup's softmax hides under
//   the other's GEMMs.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "flash3/fwd/scheduler.cuh"
#include "flash3/common/softmax.cuh"
#include "flash3/fwd/traits.cuh"

namespace flash3 {

template <class Tr>
struct FwdProducer {
  using Element = typename Tr::Element;
  using PipelineKV = typename Tr::PipelineKV;
  using PipelineState = typename Tr::PipelineState;

  // Loads one tile's Q and K/V blocks. `tile_count` = number of tiles with work this CTA already
  // loaded: before overwriting Q's buffer (which holds the previous tile's O) the producer waits for
  // that tile's epilogue to release it. The first K block is issued before that wait so it
  // overlaps the previous epilogue.
  static __device__ __forceinline__ void load(typename Tr::KernelParams const& params,
                                              typename Tr::SharedStorage& smem, PipelineKV& pipe_k,
                                              PipelineKV& pipe_v, PipelineState& state_k,
                                              PipelineState& state_v, const WorkTile& w,
                                              int tile_count, bool leader) {
    using namespace cute;
    const FwdParams& p = params.p;
    const int bq = p.cu_seqlens_q != nullptr ? 0 : w.coord.batch;  // varlen: one packed "batch"
    const int bk = p.cu_seqlens_k != nullptr ? 0 : w.coord.batch;

    Tensor mQ = params.tma_q.get_tma_tensor(params.shape_q);    // (s_q, d, h, b)
    Tensor mK = params.tma_k.get_tma_tensor(params.shape_k);    // (s_k, d, h_k, b)
    Tensor mVt = params.tma_v.get_tma_tensor(params.shape_vt);  // (d_v, s_k, h_k, b)
    Tensor gQ = local_tile(domain_offset(make_coord(w.seq.offset_q, _0{}), mQ(_, _, w.coord.head, bq)),
                           Shape<typename Tr::BlkM, typename Tr::HD>{}, make_coord(w.coord.m_block, _0{}));
    Tensor gK = local_tile(domain_offset(make_coord(w.seq.offset_k, _0{}), mK(_, _, w.head_k, bk)),
                           Shape<typename Tr::BlkN, typename Tr::HD>{}, make_coord(_, _0{}));  // (n, d, blocks)
    Tensor gVt = local_tile(domain_offset(make_coord(_0{}, w.seq.offset_k), mVt(_, _, w.head_k, bk)),
                            Shape<typename Tr::HDV, typename Tr::BlkN>{}, make_coord(_0{}, _));  // (d_v, n, blocks)

    Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), typename Tr::SmemLayoutQ{});
    Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), typename Tr::SmemLayoutK{});
    Tensor sVt = make_tensor(make_smem_ptr(smem.v.data()), typename Tr::SmemLayoutVt{});

    // (TMA, ...) views; the TMA unit takes the whole of mode 0 per copy.
    auto tq = tma_partition(params.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
    auto tk = tma_partition(params.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
    auto tv = tma_partition(params.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sVt), group_modes<0, 2>(gVt));
    Tensor tQgQ = get<0>(tq);
    Tensor tQsQ = get<1>(tq);
    Tensor tKgK = get<0>(tk);  // (TMA, blocks)
    Tensor tKsK = get<1>(tk);  // (TMA, stages)
    Tensor tVgV = get<0>(tv);
    Tensor tVsV = get<1>(tv);

    auto load_k = [&](int n) {
      pipe_k.producer_acquire(state_k);  // leader also posts the expected bytes
      if (leader) copy(params.tma_k.with(*pipe_k.producer_get_barrier(state_k)), tKgK(_, n), tKsK(_, state_k.index()));
      ++state_k;
    };
    auto load_v = [&](int n) {
      pipe_v.producer_acquire(state_v);
      if (leader) copy(params.tma_v.with(*pipe_v.producer_get_barrier(state_v)), tVgV(_, n), tVsV(_, state_v.index()));
      ++state_v;
    };

    int n = w.blocks.end - 1;
    load_k(n);
    if (tile_count > 0) cutlass::arch::ClusterBarrier::wait(&smem.q_free, (tile_count - 1) & 1);
    if (leader) {
      cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&smem.q_full, Tr::kQBytes);
      copy(params.tma_q.with(smem.q_full), tQgQ, tQsQ);
    }
    load_v(n);
    for (--n; n >= w.blocks.begin; --n) {
      load_k(n);
      load_v(n);
    }
  }
};

template <class Tr>
struct FwdConsumer {
  using Element = typename Tr::Element;
  using PipelineKV = typename Tr::PipelineKV;
  using PipelineState = typename Tr::PipelineState;
  static constexpr int kPingpongThreads = 2 * 128;  // the waiting warpgroup + the one that releases it

  // Pingpong: warpgroup c may issue GEMMs once the previous warpgroup (ring order) has issued its own.
  static __device__ __forceinline__ void pingpong_wait(int consumer) {
    cutlass::arch::NamedBarrier::sync(kPingpongThreads, Tr::kBarPingpong0 + consumer);
  }
  static __device__ __forceinline__ void pingpong_pass(int consumer) {
    const int next = consumer + 1 == Tr::kNumConsumers ? 0 : consumer + 1;
    cutlass::arch::NamedBarrier::arrive(kPingpongThreads, Tr::kBarPingpong0 + next);
  }
  // Once at start: the last warpgroup acts as if it had just issued, releasing warpgroup 0.
  static __device__ __forceinline__ void pingpong_start(int consumer) {
    if (consumer == Tr::kNumConsumers - 1) pingpong_pass(consumer);
  }

  template <class TensorA, class TensorB, class TensorC>
  static __device__ __forceinline__ void gemm(typename Tr::TiledMmaS& mma, TensorA const& a, TensorB const& b,
                                              TensorC& c) {
    // S = Q K^T: clear-then-accumulate over the k16 blocks of the head dim.
    mma.accumulate_ = cute::GMMA::ScaleOut::Zero;
    CUTE_UNROLL
    for (int k = 0; k < cute::size<2>(a); ++k) {
      cute::gemm(mma, a(cute::_, cute::_, k), b(cute::_, cute::_, k), c);
      mma.accumulate_ = cute::GMMA::ScaleOut::One;
    }
  }

  // Runs the mainloop of one tile. On return tOrO holds O normalized by the row sums (0 for rows
  // that saw no key) and lse the natural-log LSE of the thread's rows. Q's buffer is no longer read.
  template <class TensorO, int kRows>
  static __device__ __forceinline__ void compute(typename Tr::KernelParams const& params,
                                                 typename Tr::SharedStorage& smem, PipelineKV& pipe_k,
                                                 PipelineKV& pipe_v, PipelineState& state_k,
                                                 PipelineState& state_v, const WorkTile& w, int tile_count,
                                                 int consumer, TensorO& tOrO, float (&lse)[kRows]) {
    using namespace cute;
    const int tidx = consumer_thread_idx();
    typename Tr::TiledMmaS mma_s;
    typename Tr::TiledMmaO mma_o;
    auto thr_s = mma_s.get_thread_slice(tidx);
    auto thr_o = mma_o.get_thread_slice(tidx);

    Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), typename Tr::SmemLayoutQ{});
    Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), typename Tr::SmemLayoutK{});
    Tensor sVt = make_tensor(make_smem_ptr(smem.v.data()), typename Tr::SmemLayoutVt{});
    Tensor tSrQ = thr_s.partition_fragment_A(sQ);   // (MMA, MMA_M, MMA_K) descriptors
    Tensor tSrK = thr_s.partition_fragment_B(sK);   // (MMA, MMA_N, MMA_K, stages)
    Tensor tOrV = thr_o.partition_fragment_B(sVt);  // (MMA, MMA_N, MMA_K, stages)

    // (row, col) coordinates of this thread's S values within the tile.
    Tensor cS = make_identity_tensor(Shape<typename Tr::BlkM, typename Tr::BlkN>{});
    Tensor tScS = thr_s.partition_C(cS);
    Tensor tScS_rc = make_tensor(tScS.data(), acc_rowcol(tScS.layout()));
    const int row0 = w.coord.m_block * Tr::kBlockM;

    Tensor tSrS_proto = partition_fragment_C(mma_s, Shape<typename Tr::BlkM, typename Tr::BlkN>{});
    using LayoutS = decltype(tSrS_proto.layout());
    // P (16-bit) in the A-operand register layout of P.V; lives across iterations.
    Tensor tOrP = make_tensor<Element>(acc_as_a_operand(LayoutS{}));
    Tensor tOrP_as_S = make_tensor(tOrP.data(), LayoutS{});  // same registers, S's indexing

    Tensor tOrO_rc = make_tensor(tOrO.data(), acc_rowcol(tOrO.layout()));
    static_assert(decltype(size<0>(tOrO_rc))::value == kRows, "rows per thread");

    OnlineSoftmax<kRows> softmax;
    softmax.init(params.scale_log2);
    clear(tOrO);

    // Scores of block n: softcap, then mask if this block needs it, then the online softmax.
    // Leaves P in tSrS; `correction` rescales O.
    auto softmax_step = [&](auto& tSrS, int n, bool masked, float (&correction)[kRows]) {
      Tensor s_rc = make_tensor(tSrS.data(), acc_rowcol(tSrS.layout()));
      if (params.has_softcap) apply_softcap(tSrS, params.softcap_in);
      if (masked) apply_mask(s_rc, tScS_rc, w.mask, row0, n * Tr::kBlockN);
      softmax.update(s_rc, correction);
    };
    auto store_p = [&](auto const& tSrS) {
      Tensor p16 = convert_fragment<Element>(tSrS);
      CUTE_UNROLL
      for (int i = 0; i < size(p16); ++i) tOrP_as_S(i) = p16(i);
    };
    auto issue_s = [&](auto& tSrS) {
      warpgroup_fence_operand(tSrS);
      warpgroup_arrive();
      gemm(mma_s, tSrQ, tSrK(_, _, _, state_k.index()), tSrS);
      warpgroup_commit_batch();
      warpgroup_fence_operand(tSrS);
    };
    auto issue_pv = [&]() {
      warpgroup_fence_operand(tOrO);
      warpgroup_arrive();
      CUTE_UNROLL
      for (int k = 0; k < size<2>(tOrP); ++k) cute::gemm(mma_o, tOrP(_, _, k), tOrV(_, _, k, state_v.index()), tOrO);
      warpgroup_commit_batch();
      warpgroup_fence_operand(tOrO);
    };

    // Q of this tile (the tile_count-th tile with work of this CTA).
    cutlass::arch::ClusterTransactionBarrier::wait(&smem.q_full, tile_count & 1);

    // First block (rightmost): S only.
    {
      int n = w.blocks.end - 1;
      Tensor tSrS = partition_fragment_C(mma_s, Shape<typename Tr::BlkM, typename Tr::BlkN>{});
      pipe_k.consumer_wait(state_k);
      pingpong_wait(consumer);
      issue_s(tSrS);
      pingpong_pass(consumer);
      warpgroup_wait<0>();
      pipe_k.consumer_release(state_k);
      ++state_k;
      float correction[kRows];
      softmax_step(tSrS, n, n >= w.unmasked.end || n < w.unmasked.begin, correction);
      store_p(tSrS);  // O is still 0: no rescale needed
    }

    // Blocks n = end-2 .. begin: S_n and P_{n+1} V_{n+1} in flight together.
    auto step = [&](int n, auto masked_tag) {
      constexpr bool kMasked = decltype(masked_tag)::value;
      Tensor tSrS = partition_fragment_C(mma_s, Shape<typename Tr::BlkM, typename Tr::BlkN>{});
      pipe_k.consumer_wait(state_k);
      pingpong_wait(consumer);
      issue_s(tSrS);
      pipe_v.consumer_wait(state_v);
      issue_pv();
      pingpong_pass(consumer);
      warpgroup_wait<1>();  // S_n is ready; P.V still running
      pipe_k.consumer_release(state_k);
      ++state_k;
      float correction[kRows];
      softmax_step(tSrS, n, kMasked, correction);
      warpgroup_wait<0>();  // P.V done: O and the P registers may be touched again
      pipe_v.consumer_release(state_v);
      ++state_v;
      CUTE_UNROLL
      for (int mi = 0; mi < kRows; ++mi) {
        CUTE_UNROLL
        for (int ni = 0; ni < size<1>(tOrO_rc); ++ni) tOrO_rc(mi, ni) *= correction[mi];
      }
      store_p(tSrS);
    };

    int n = w.blocks.end - 2;
    // Right masked blocks (causal diagonal, seqlen_k tail), then the unmasked middle, then the left
    // masked blocks of a sliding window.
    for (; n >= w.blocks.begin && n >= w.unmasked.end; --n) step(n, cute::true_type{});
    for (; n >= w.blocks.begin && n >= w.unmasked.begin; --n) step(n, cute::false_type{});
    for (; n >= w.blocks.begin; --n) step(n, cute::true_type{});

    // Last P.V.
    pipe_v.consumer_wait(state_v);
    pingpong_wait(consumer);
    issue_pv();
    pingpong_pass(consumer);
    warpgroup_wait<0>();
    pipe_v.consumer_release(state_v);
    ++state_v;

    float inv_sum[kRows];
    softmax.finalize(inv_sum, lse);
    CUTE_UNROLL
    for (int mi = 0; mi < kRows; ++mi) {
      CUTE_UNROLL
      for (int ni = 0; ni < size<1>(tOrO_rc); ++ni) tOrO_rc(mi, ni) *= inv_sum[mi];
    }
  }
};

}  // namespace flash3
