// Compile-time configuration of the backward kernel for one (dtype, d, d_v): tile sizes (from
// attn_logic.h's bwd_tile_shape, where the choice is explained), shared-memory layouts, the five
// WGMMA tiled MMAs, TMA types, shared storage and the kernel's parameter block.
//
// Every tiled MMA is one warpgroup's (64 rows of M); a warpgroup selects its own slices of the
// shared tiles (its 64 keys, or in split_d mode its half of the columns). Products, per step of
// 64 queries (M x N x K):
//   S^T  = K_w Q^T       64 x 64 x d     SS  (K, Q K-major)
//   dP^T = V_w dO^T      64 x 64 x d_v   SS
//   dV  += P^T dO        64 x dv_w x 64  RS  (P^T = S^T's accumulator; dO^T MN-major view)
//   dK  += dS^T Q        64 x dk_w x 64  RS
//   dQ   = dS K          64 x d/2 x bn   SS  (dS MN-major in shared memory, K^T MN-major view)
// The half-column slices (dQ always, dK/dV in split_d mode) must start on a swizzle-atom boundary,
// so Q, dO and K use the widest atom that divides half their head dim.
#pragma once


#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cutlass/numeric_types.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "flash3/bwd/params.h"
#include "flash3/common/attn_logic.h"
#include "flash3/common/smem_atom.cuh"
#include "flash3/common/softmax.cuh"
#include "flash3/common/wgmma_shapes.h"

namespace flash3 {

template <class Element_, int kHeadDim_, int kHeadDimV_>
struct BwdTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kHeadDimV = kHeadDimV_;
  static constexpr BwdTileShape kTile = bwd_tile_shape(kHeadDim, kHeadDimV);
  static constexpr int kBlockM = kTile.block_m;  // queries per step
  static constexpr int kBlockN = kTile.block_n;  // keys per CTA
  static constexpr int kStagesQ = kTile.stages_q;
  static constexpr int kStagesDo = kTile.stages_do;
  static constexpr bool kSplitD = kTile.split_d;
  static constexpr int kNumConsumers = 2;
  static constexpr int kNumConsumerThreads = 128 * kNumConsumers;
  static constexpr int kNumThreads = 128 + kNumConsumerThreads;
  static_assert(kBlockN == (kSplitD ? 64 : 64 * kNumConsumers), "a warpgroup owns 64 keys");
  static_assert(kHeadDim % 32 == 0 || kHeadDim == 96, "dQ's half columns are multiples of 16");

  // Registers: the launch allocation of 384 threads is 168 each; the producer warpgroup (a TMA warp
  // and the dQ writer warp, both plain loops) keeps 24 so the consumers get 240. At d = 256 its
  // TMA loop (four boxes per Q/dO tile) spilled at 24: 32 and 232.
  static constexpr int kProducerRegs = kHeadDim > 192 ? 32 : 24;
  static constexpr int kConsumerRegs = kHeadDim > 192 ? 232 : 240;
  static_assert(128 * kProducerRegs + kNumConsumerThreads * kConsumerRegs <= 168 * kNumThreads, "register budget");

  // Columns of dK / dV a warpgroup accumulates, and of dQ.
  static constexpr int kDKCols = kSplitD ? kHeadDim / 2 : kHeadDim;
  static constexpr int kDVCols = kSplitD ? kHeadDimV / 2 : kHeadDimV;
  static constexpr int kDQCols = kHeadDim / 2;

  using BlkM = cute::Int<kBlockM>;
  using BlkN = cute::Int<kBlockN>;
  using HD = cute::Int<kHeadDim>;
  using HDV = cute::Int<kHeadDimV>;
  using Slab = cute::_64;  // keys per warpgroup

  // Shared memory. Q (m, d, stage), dO (m, d_v, stage), K (n, d), V (n, d_v): K-major; their
  // transposed views (composition: the same bytes) are the MN-major B operands of dK, dV and dQ.
  using SmemLayoutQ = decltype(cute::tile_to_shape(gmma_smem_atom<cute::GMMA::Major::K, Element, kHeadDim / 2>(),
                                                   cute::Shape<BlkM, HD, cute::Int<kStagesQ>>{}));
  using SmemLayoutQt = decltype(cute::composition(
      SmemLayoutQ{}, cute::make_layout(cute::Shape<HD, BlkM, cute::Int<kStagesQ>>{},
                                       cute::Stride<BlkM, cute::_1, cute::Int<kBlockM * kHeadDim>>{})));
  using SmemLayoutDo = decltype(cute::tile_to_shape(gmma_smem_atom<cute::GMMA::Major::K, Element, kHeadDimV / 2>(),
                                                    cute::Shape<BlkM, HDV, cute::Int<kStagesDo>>{}));
  using SmemLayoutDot = decltype(cute::composition(
      SmemLayoutDo{}, cute::make_layout(cute::Shape<HDV, BlkM, cute::Int<kStagesDo>>{},
                                        cute::Stride<BlkM, cute::_1, cute::Int<kBlockM * kHeadDimV>>{})));
  using SmemLayoutK = decltype(cute::tile_to_shape(gmma_smem_atom<cute::GMMA::Major::K, Element, kHeadDim / 2>(),
                                                   cute::Shape<BlkN, HD>{}));
  using SmemLayoutKt = decltype(cute::composition(
      SmemLayoutK{}, cute::make_layout(cute::Shape<HD, BlkN>{}, cute::Stride<BlkN, cute::_1>{})));
  using SmemLayoutV = decltype(cute::tile_to_shape(gmma_smem_atom<cute::GMMA::Major::K, Element, kHeadDimV>(),
                                                   cute::Shape<BlkN, HDV>{}));
  // dS (m, n, buffer), queries contiguous: the MN-major A operand of dQ; its transposed view
  // (n, m, buffer) is where the warpgroups store dS^T from registers (pairs of queries: 32-bit stores).
  using SmemLayoutDs = decltype(cute::tile_to_shape(gmma_smem_atom<cute::GMMA::Major::MN, Element, kBlockM>(),
                                                    cute::Shape<BlkM, BlkN, cute::_2>{}));
  using SmemLayoutDst = decltype(cute::composition(
      SmemLayoutDs{}, cute::make_layout(cute::Shape<BlkN, BlkM, cute::_2>{},
                                        cute::Stride<BlkM, cute::_1, cute::Int<kBlockM * kBlockN>>{})));

  // WGMMA, one warpgroup each.
  using TiledMmaS = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float, cute::Shape<Slab, BlkM, HD>>()));
  using TiledMmaDp = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float, cute::Shape<Slab, BlkM, HDV>>()));
  using TiledMmaDv = decltype(cute::make_tiled_mma(
      cute::GMMA::rs_op_selector<Element, Element, float, cute::Shape<Slab, cute::Int<kDVCols>, BlkM>,
                                 cute::GMMA::Major::K, cute::GMMA::Major::MN>()));
  using TiledMmaDk = decltype(cute::make_tiled_mma(
      cute::GMMA::rs_op_selector<Element, Element, float, cute::Shape<Slab, cute::Int<kDKCols>, BlkM>,
                                 cute::GMMA::Major::K, cute::GMMA::Major::MN>()));
  using TiledMmaDq = decltype(cute::make_tiled_mma(
      ss_op<Element, kDQCols, kBlockN, cute::GMMA::Major::MN, cute::GMMA::Major::MN>()));
  // S^T, dP^T, dV, dK: CuTe's atoms (basic n); dQ: ss_op (48 at d 96).
  FLASH3_WGMMA_N_CHECK(wgmma_basic_n(kBlockM) && wgmma_basic_n(kDVCols) && wgmma_basic_n(kDKCols) &&
                       wgmma_n_ok(kDQCols));

  using LayoutS = decltype(cute::partition_fragment_C(TiledMmaS{}, cute::Shape<Slab, BlkM>{}).layout());
  using LayoutP = decltype(acc_as_a_operand(LayoutS{}));  // P^T / dS^T as the A operand of dV / dK
  using LayoutDq = decltype(cute::partition_fragment_C(TiledMmaDq{}, cute::Shape<BlkM, cute::Int<kDQCols>>{}).layout());
  // dQ floats one thread holds; the shared/global dQ tile is [warpgroup][value][thread] (fragment
  // order: consecutive threads write consecutive words, no bank conflicts).
  static constexpr int kDqValues = decltype(cute::size(LayoutDq{}))::value;
  static_assert(kDqValues * kNumConsumerThreads == kBlockM * kHeadDim, "dQ fragment covers the tile");

  using ShapeRows = cute::Shape<int32_t, int32_t, int32_t, int32_t>;
  using StrideRows = cute::Stride<int64_t, cute::_1, int64_t, int64_t>;
  using GmemRows = decltype(cute::make_tensor(cute::make_gmem_ptr(static_cast<Element const*>(nullptr)),
                                              ShapeRows{}, StrideRows{}));
  using TmaQ = decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, std::declval<GmemRows>(),
                                            cute::take<0, 2>(SmemLayoutQ{}), cute::Shape<BlkM, HD>{}, cute::_1{}));
  using TmaDo = decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, std::declval<GmemRows>(),
                                             cute::take<0, 2>(SmemLayoutDo{}), cute::Shape<BlkM, HDV>{}, cute::_1{}));
  using TmaK = decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, std::declval<GmemRows>(), SmemLayoutK{},
                                            cute::Shape<BlkN, HD>{}, cute::_1{}));
  using TmaV = decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, std::declval<GmemRows>(), SmemLayoutV{},
                                            cute::Shape<BlkN, HDV>{}, cute::_1{}));

  static constexpr uint32_t kQBytes = kBlockM * kHeadDim * sizeof(Element) + kBlockM * sizeof(float);  // + lse
  static constexpr uint32_t kDoBytes = kBlockM * kHeadDimV * sizeof(Element) + kBlockM * sizeof(float);  // + dpsum
  static constexpr uint32_t kKVBytes = kBlockN * (kHeadDim + kHeadDimV) * sizeof(Element);

  using PipelineQ = cutlass::PipelineTmaAsync<kStagesQ>;
  using PipelineDo = cutlass::PipelineTmaAsync<kStagesDo>;
  using PipelineState = cutlass::PipelineState<kStagesQ>;
  using PipelineStateDo = cutlass::PipelineState<kStagesDo>;

  // Named barriers (user ids).
  static constexpr uint32_t kBarDsReady = 0;  // consumers: both warpgroups stored this step's dS
  // d, d_v <= 128: the warpgroups run apart within a step (BwdKernel::step), so each hands its own
  // part of the staged dQ tile to the writer (a barrier pair and a bulk reduce-add each); split_d
  // runs them in lockstep and hands the tile over whole (per part it measured 0.7% slower).
  static constexpr bool kOverlap = !kSplitD;
  static constexpr int kDqParts = kOverlap ? kNumConsumers : 1;
  static constexpr int kDqPart = kBlockM * kHeadDim / kDqParts;  // floats
  static constexpr uint32_t kDqHandoffThreads = kNumConsumerThreads / kDqParts + 32;  // + the writer warp
  static constexpr uint32_t kBarDqFull = 1;   // + part: staged -> dQ writer
  static constexpr uint32_t kBarDqEmpty = kBarDqFull + kDqParts;  // + part: the writer read it
  static constexpr uint32_t kBarIssueOrder = kBarDqEmpty + kDqParts;  // warpgroup 0 -> 1: S^T, dP^T issued
  static constexpr uint32_t kBarDqIssued = kBarIssueOrder + 1;  // warpgroup 0 -> 1: dQ issued (its dS stored)

  struct SharedStorage {
    alignas(1024) cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> q;
    alignas(1024) cute::array_aligned<Element, cute::cosize_v<SmemLayoutDo>, 1024> dout;
    alignas(1024) cute::array_aligned<Element, cute::cosize_v<SmemLayoutK>, 1024> k;
    alignas(1024) cute::array_aligned<Element, cute::cosize_v<SmemLayoutV>, 1024> v;
    alignas(1024) cute::array_aligned<Element, cute::cosize_v<SmemLayoutDs>, 1024> ds;
    alignas(1024) cute::array_aligned<float, kBlockM * kHeadDim, 1024> dq;
    alignas(16) float lse[kStagesQ][kBlockM];    // lse * log2(e) of the stage's queries
    alignas(16) float dpsum[kStagesDo][kBlockM];  // rowsum(dO * O) - dlse
    typename PipelineQ::SharedStorage pipe_q;
    typename PipelineDo::SharedStorage pipe_do;
    uint64_t kv_full;
    uint64_t tail;  // the producer's own barrier for a tile whose rows past the sequence end it zeroes
    float overlap_pin[kNumConsumerThreads];  // written, never read: see BwdKernel::pin_before_wait
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  static_assert(kSmemBytes <= 227 * 1024, "shared memory over the 227 KB opt-in limit");

  struct KernelParams {
    TmaQ tma_q;
    TmaDo tma_do;
    TmaK tma_k;
    TmaV tma_v;
    ShapeRows shape_q, shape_do, shape_k, shape_v;
    BwdParams p;
    ScoreMod mod;  // softcap, ALiBi and the exp2 scale of raw scores (common/score_mod.h)
  };
};

}  // namespace flash3
