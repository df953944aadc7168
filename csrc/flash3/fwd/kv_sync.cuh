// The forward kernel's synchronization ids and types, shared by the traits of every kernel that
// runs fwd/kernel.cuh (fwd/traits.cuh FwdTraits, decode/mla_traits.cuh MlaTraits) as their base:
// the K and V TMA pipelines (kStages stages of K, kStagesV of V), their raw mbarriers, and the
// named-barrier ids.
#pragma once

#include <cstdint>

#include <cutlass/pipeline/sm90_pipeline.hpp>

namespace flash3 {

template <int kStages, int kNumConsumers, int kStagesV = kStages>
struct FwdKvSync {
  using PipelineKV = cutlass::PipelineTmaAsync<kStages>;  // K's (and V's where kStagesV == kStages)
  using PipelineState = typename PipelineKV::PipelineState;
  using PipeStorage = typename PipelineKV::SharedStorage;
  using PipelineV = cutlass::PipelineTmaAsync<kStagesV>;
  using PipelineStateV = typename PipelineV::PipelineState;
  using PipeStorageV = typename PipelineV::SharedStorage;
  // The raw mbarriers of a pipeline stage, K's or V's (waits go through flash3::mbarrier_wait).
  template <class Storage>
  static __device__ __forceinline__ uint64_t* full_barrier(Storage& s, int stage) {
    return reinterpret_cast<uint64_t*>(&s.full_barrier_[stage]);
  }
  template <class Storage>
  static __device__ __forceinline__ uint64_t* empty_barrier(Storage& s, int stage) {
    return reinterpret_cast<uint64_t*>(&s.empty_barrier_[stage]);
  }

  // Named barriers (user ids; CUTLASS adds its reserved offset). Pingpong: one per consumer.
  static constexpr uint32_t kBarPingpong0 = 0;
  static constexpr uint32_t kBarEpilogue = kNumConsumers;
  static constexpr uint32_t kBarTileFull = kNumConsumers + 1;   // producer -> consumers: next tile posted
  static constexpr uint32_t kBarTileEmpty = kNumConsumers + 2;  // consumers -> producer: slot read
  static constexpr uint32_t kTileHandoffThreads = 32 + 128 * kNumConsumers;  // producer warp + consumers
  static constexpr uint32_t kBarProducer = kNumConsumers + 3;  // decode: the gathering producer warpgroup
  static constexpr uint32_t kBarProducerV = kNumConsumers + 4;  // decode, FP8 cache: V's producer warpgroup
  // Kernels whose consumer warpgroups cross tile boundaries on their own (FwdTraits::kOwnOBuffer):
  // each takes the next tile at its own barrier, which the producer arrives on. Past the first,
  // from kBarProducer on: it is the decode kernel's, which never crosses tiles this way. CUTLASS
  // keeps 8 of the 16 hardware barriers, so user ids end at 7.
  static __device__ __forceinline__ constexpr uint32_t bar_tile_full_of(int consumer) {
    return consumer == 0 ? kBarTileFull : kBarProducer + uint32_t(consumer) - 1;
  }
  static_assert(kBarProducer + kNumConsumers - 2 <= 7 && kBarProducerV <= 7, "named barrier ids 0..7");
  static constexpr uint32_t kWgHandoffThreads = 32 + 128;  // producer warp + one consumer warpgroup
};

}  // namespace flash3
