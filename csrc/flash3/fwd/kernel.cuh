// The forward kernel: barrier setup, the warp-specialized role split and the persistent loop.
// Warpgroup 0 is the producer (lowers its registers; one warp runs the TMA loop), warpgroups
// 1..kNumConsumers are consumers (raise their registers; 64 query rows each); with two producer
// warpgroups (Tr::kProducerWarpgroups, an FP8 cache's decode), the last is V's producer. Both
// sides walk the same tile sequence (scheduler.cuh) and skip the same tiles, so they stay in step
// through the barriers. Where O has its own buffer (FwdTraits::kOwnOBuffer), each consumer
// warpgroup takes the next tile at its own barrier and stores the previous tile's O under the next
// tile's first Q.K^T (FwdConsumer::kOverlapEpilogue), so the tensor cores do not idle across a
// tile boundary.
// Producer: the tile's loads (FwdProducer, mainloop.cuh; the decode kernel's DecodeProducer,
// decode/load.cuh).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "flash3/common/barriers.cuh"
#include "flash3/fwd/epilogue.cuh"
#include "flash3/fwd/mainloop.cuh"
#include "flash3/fwd/scheduler.cuh"
#include "flash3/fwd/traits.cuh"

namespace flash3 {

// Consumers that take the previous tile's epilogue into compute (FwdConsumer::kOverlapEpilogue).
template <class C, class = void>
struct overlaps_epilogue : cute::false_type {};
template <class C>
struct overlaps_epilogue<C, cute::void_t<decltype(C::kOverlapEpilogue)>> : cute::bool_constant<C::kOverlapEpilogue> {};

// The previous tile's epilogue, when there is one (w), run by compute under the next tile's
// first Q.K^T.
template <class Epilogue, class Tr>
struct PendingEpilogue {
  typename Tr::KernelParams const& params;
  typename Tr::SharedStorage& smem;
  const WorkTile& w;
  bool pending;
  template <class TensorO, int kRows>
  __device__ __forceinline__ void operator()(TensorO& tOrO, const float (&lse)[kRows]) const {
    if (pending) Epilogue::store(params, smem, w, tOrO, lse);
  }
};

// Consumer / Epilogue: FwdConsumer / FwdEpilogue, or a family's own (the MLA decode kernel's,
// decode/mla_mainloop.cuh), with the same entry points.
// kClusterM: CTAs per cluster, 1 or (FwdTraits::kMulticastKV) 2: the pair shares each K and V block
// by multicast (fwd/launch.cuh launches it in clusters of 2). A kernel of its own, so unclustered
// launches keep their static single-CTA barrier releases in the consumers.
template <class Tr, class Producer, class Consumer = FwdConsumer<Tr>, class Epilogue = FwdEpilogue<Tr>,
          int kClusterM = 1>
__global__ void __launch_bounds__(Tr::kNumThreads, 1)
    fwd_kernel(CUTE_GRID_CONSTANT typename Tr::KernelParams const params) {
  using namespace cute;
  using PipelineKV = typename Tr::PipelineKV;
  using PipelineV = typename Tr::PipelineV;
  using PipelineState = typename Tr::PipelineState;
  using PipelineStateV = typename Tr::PipelineStateV;
  using SharedStorage = typename Tr::SharedStorage;

  extern __shared__ __align__(1024) char smem_raw[];
  SharedStorage& smem = *reinterpret_cast<SharedStorage*>(smem_raw);

  // The consumer warpgroups cross tile boundaries on their own (FwdConsumer::kOverlapEpilogue).
  constexpr bool kOverlap = overlaps_epilogue<Consumer>::value;
  const int warp_idx = cutlass::canonical_warp_idx_sync();
  const int warpgroup = warp_idx / 4;

  if (warp_idx == 0 && cute::elect_one_sync()) {
    cute::prefetch_tma_descriptor(params.tma_q.get_tma_descriptor());
    if constexpr (!Tr::kFp8Cache) {  // an FP8 cache is gathered: no K/V tensor maps
      cute::prefetch_tma_descriptor(params.tma_k.get_tma_descriptor());
      cute::prefetch_tma_descriptor(params.tma_v.get_tma_descriptor());
    }
    cute::prefetch_tma_descriptor(params.tma_o.get_tma_descriptor());
    cutlass::arch::ClusterTransactionBarrier::init(&smem.q_full, 1);
    cutlass::arch::ClusterBarrier::init(&smem.q_free, Tr::kNumConsumerThreads);
    cutlass::arch::ClusterBarrier::init(&smem.o_free, Tr::kNumConsumerThreads);
    cutlass::arch::ClusterTransactionBarrier::init(&smem.v_tail, 1);
  }

  // K and V pipelines: one producer arrival (with the TMA byte count) per stage fill, one arrival
  // per consumer thread per release; in a 2-CTA cluster one arrival per consumer warpgroup of
  // either CTA (both CTAs' producers write every stage). Barriers are initialized by warp 0 inside
  // the constructor.
  typename PipelineKV::Params pp;
  const bool producer = warpgroup == 0 || warpgroup > Tr::kNumConsumers;
  pp.role = producer ? PipelineKV::ThreadCategory::Producer : PipelineKV::ThreadCategory::Consumer;
  pp.is_leader = threadIdx.x == 0;
  pp.num_consumers = Tr::kNumConsumerThreads;
  pp.num_producers = 1;
  pp.transaction_bytes = Tr::kKBytes;
  PipelineKV pipe_k(smem.pipe_k, pp, Shape<Int<kClusterM>, _1, _1>{});
  typename PipelineV::Params pv;  // V's (its own type where V has its own stage count)
  pv.role = producer ? PipelineV::ThreadCategory::Producer : PipelineV::ThreadCategory::Consumer;
  pv.is_leader = pp.is_leader;
  pv.num_consumers = pp.num_consumers;
  pv.num_producers = pp.num_producers;
  pv.transaction_bytes = Tr::kVBytes;
  PipelineV pipe_v(smem.pipe_v, pv, Shape<Int<kClusterM>, _1, _1>{});

  debug_hang_init(Tr::kNumThreads);
  cutlass::arch::fence_barrier_init();
  if constexpr (kClusterM > 1) {  // the peer CTA's producer and consumers signal this CTA's barriers too
    cute::cluster_arrive();  // release: the initializations above (debug_hang_init's stores too)
    cute::cluster_wait();
  } else {
    __syncthreads();  // barrier initialization visible to every thread before first use
  }

  TileScheduler<Tr::kBlockM, Tr::kBlockN, Tr::kDecode, Tr::kChunk, kClusterM> sched{params.p, params.order};

  if (producer) {
    cutlass::arch::warpgroup_reg_dealloc<Tr::kProducerRegs>();
    // One warp drives TMA and the scheduler; the others have nothing to do, unless the producer
    // loads with the whole warpgroup (static schedule: every producer warp walks the same tiles).
    if (warp_idx != 0 && !Producer::all_warps(params)) return;
    const bool leader = threadIdx.x == 0;  // the one thread that posts expected bytes and issues TMA
    PipelineState state_k = cutlass::make_producer_start_state<PipelineKV>();
    PipelineStateV state_v = cutlass::make_producer_start_state<PipelineV>();
    uint32_t tail_phase = 0;
    int tile_count = 0;
    bool posted = false;  // dynamic: the consumers have an unread index in smem.next_tile
    for (int idx = sched.first(); !sched.done(idx);) {
      const WorkTile w = sched.tile(idx);
      if (w.has_rows && !w.blocks.empty()) {  // consumers write other tiles without shared memory
        if (warpgroup == 0) {
          if constexpr (kClusterM > 1) Producer::template load<kClusterM>(params, smem, state_k, state_v, w, tile_count, tail_phase, leader);
          else Producer::load(params, smem, state_k, state_v, w, tile_count, tail_phase, leader);
        } else if constexpr (Tr::kProducerWarpgroups == 2) {
          Producer::load_v(params, smem, state_v, w, tile_count);
        }
        ++tile_count;
      }
      idx = sched.fetch_next(idx);
      if (sched.dynamic()) {
        if (posted) named_sync(Tr::kTileHandoffThreads, Tr::kBarTileEmpty, Wait::TileEmpty, w.index);
        if (leader) smem.next_tile = idx;
        if constexpr (kOverlap) {  // each consumer warpgroup takes it at its own barrier
          for (int c = 0; c < Tr::kNumConsumers; ++c) named_arrive(Tr::kWgHandoffThreads, Tr::bar_tile_full_of(c));
        } else {
          named_arrive(Tr::kTileHandoffThreads, Tr::kBarTileFull);
        }
        posted = true;
      }
    }
    // In a cluster the peer's consumers release this CTA's stages and the peer's TMA writes into
    // them: the CTA may exit only once every stage has been released by both CTAs (no signal or
    // write can then still be on its way to this CTA's shared memory).
    if constexpr (kClusterM > 1) {
      for (int i = 0; i < Tr::kStages; ++i, ++state_k)
        mbarrier_wait(Tr::empty_barrier(smem.pipe_k, state_k.index()), state_k.phase(), Wait::KEmpty, -1);
      for (int i = 0; i < Tr::kStagesV; ++i, ++state_v)
        mbarrier_wait(Tr::empty_barrier(smem.pipe_v, state_v.index()), state_v.phase(), Wait::VEmpty, -1);
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<Tr::kConsumerRegs>();
    const int consumer = warpgroup - 1;
    PipelineState state_k;
    PipelineStateV state_v;
    Consumer::pingpong_start(consumer);

    Tensor tOrO = make_tensor<float>(typename Tr::LayoutO{});
    float lse[Tr::kRowsPerThread];

    int tile_count = 0;
    // kOverlap: the tile whose O and LSE wait in tOrO / lse, if any. Kept live (recomputing it
    // under the GEMM instead cost the mainloop ~10 uniform-datapath instructions per key block).
    WorkTile w_prev;
    bool pending = false;
    for (int idx = sched.first(); !sched.done(idx);) {
      const WorkTile w = sched.tile(idx);
      if (w.has_rows) {  // varlen: a query block past this sequence's end has nothing to write
        if (w.blocks.empty()) {
          if constexpr (kOverlap) PendingEpilogue<Epilogue, Tr>{params, smem, w_prev, pending}(tOrO, lse);
          pending = false;
          Epilogue::store_empty(params.p, w);
        } else if constexpr (kOverlap) {
          Consumer::compute(params, smem, pipe_k, pipe_v, state_k, state_v, w, tile_count, consumer, tOrO, lse,
                            PendingEpilogue<Epilogue, Tr>{params, smem, w_prev, pending});
          w_prev = w;
          pending = true;
          ++tile_count;
        } else {
          Consumer::compute(params, smem, pipe_k, pipe_v, state_k, state_v, w, tile_count, consumer, tOrO, lse);
          // Recomputed (not kept live through the mainloop) to spare registers.
          Epilogue::store(params, smem, sched.tile(opaque_int(idx)), tOrO, lse);
          ++tile_count;
        }
      }
      if (sched.dynamic()) {
        if constexpr (kOverlap) named_sync(Tr::kWgHandoffThreads, Tr::bar_tile_full_of(consumer), Wait::TileFull, idx);
        else named_sync(Tr::kTileHandoffThreads, Tr::kBarTileFull, Wait::TileFull, idx);
        idx = smem.next_tile;
        if (!sched.done(idx)) named_arrive(Tr::kTileHandoffThreads, Tr::kBarTileEmpty);
      } else {
        idx += int(gridDim.x);
      }
    }
    if constexpr (kOverlap) {
      PendingEpilogue<Epilogue, Tr>{params, smem, w_prev, pending}(tOrO, lse);
      Epilogue::drain();
    }
  }
}

}  // namespace flash3
