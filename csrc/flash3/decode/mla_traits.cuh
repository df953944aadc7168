// Compile-time configuration of the MLA decode kernel (DeepSeek's multi-head latent attention as
// FA3's flash_attn_with_kvcache(q, k_cache, v_cache, qv=...) serves it): d = 64 (the rope part of
// q and k), d_v = 512 (the latent: v's rows are both the values and, with qv, qv's keys), scores
// softmax_scale * (q.k + qv.v), many query heads on one kv head (packed GQA rows).
//
// A 64 x 512 fp32 O is 256 registers a thread for one warpgroup, so the two consumer warpgroups
// take the same 64 packed rows and split O's columns: warpgroup c accumulates columns
// [256 c, 256 c + 256) (TiledMmaO tiles its two 64 x 256 atoms along N). Consumer 0 alone computes
// S = Q K^T (+ Qv V^T) and the softmax; it keeps P in registers for its own P.V (RS, P rounded to
// q's dtype as in every 16-bit kernel) and stages the same 16-bit P and the rows' O scale in
// shared memory, from which consumer 1 runs its P.V (SS). See mla_mainloop.cuh.
//
// The members are those fwd/launch.cuh, fwd/kernel.cuh, decode/load.cuh and fwd/epilogue.cuh read
// from a traits type (fwd/traits.cuh documents them); the MLA ones are marked.
#pragma once

#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/copy_atom.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cutlass/numeric_types.h>
#include <cutlass/arch/barrier.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "flash3/common/attn_logic.h"
#include "flash3/common/smem_atom.cuh"
#include "flash3/common/softmax.cuh"
#include "flash3/common/wgmma_shapes.h"
#include "flash3/fwd/kv_sync.cuh"
#include "flash3/fwd/params.h"
#include "flash3/fwd/traits.cuh"  // TileOrder, ScoreMod via the forward's includes

namespace flash3 {

// The base: the forward kernel's K/V pipeline and named-barrier ids (fwd/kv_sync.cuh, as
// FwdTraits), for 2 stages and 2 consumers: literals, asserted equal to kStages and kNumConsumers
// below (a base cannot name the class's members; before it was a base, the pipeline type took a
// literal too: with kStages, formally dependent, cudafe++ dropped its `typename`s).
template <class Element_>
struct MlaTraits : FwdKvSync<2, 2> {
  static constexpr bool kMla = true;
  static constexpr bool kDecode = true;
  static constexpr bool kFp8 = false;
  static constexpr bool kFp8Cache = false;
  static constexpr bool kTmaPieces = false;  // a paged cache is gathered (decode/load.cuh load_tma)
  static constexpr bool kMulticastKV = false;  // no 2-CTA clusters (fwd/launch.cuh)
  // No ALiBi (the forward's rule: d_v > 128; launch_fwd refuses slopes). FA3's attention_chunk:
  // consumer 0's masks take each packed row's token bounds (Mask::row_keys) and the schedule the
  // chunk's key blocks, as in the 16-bit decode kernels (attn_logic.h decode_takes_chunk).
  static constexpr bool kAlibi = false;
  static constexpr bool kChunk = decode_takes_chunk(64, 512);
  static constexpr bool kQv = true;  // MLA: the producer also packs qv's rows (decode/load.cuh)
  using Element = Element_;
  using CacheElement = Element_;
  using ElementOut = Element_;
  static_assert(sizeof(Element) == 2, "MLA decode: 16-bit q and cache");

  static constexpr int kHeadDim = 64;
  static constexpr int kHeadDimV = 512;
  static constexpr TileShape kTile = decode_tile_shape(kHeadDim, kHeadDimV);
  static constexpr int kBlockM = kTile.block_m;  // 64 packed rows, shared by both consumers
  static constexpr int kBlockN = kTile.block_n;
  static constexpr int kStages = kTile.stages;
  static constexpr int kNumConsumers = kTile.num_consumers;
  static constexpr int kNumConsumerThreads = 128 * kNumConsumers;
  static constexpr int kProducerWarpgroups = 1;
  static constexpr int kNumThreads = 128 + kNumConsumerThreads;
  static_assert(kBlockM == 64 && kNumConsumers == 2, "MLA: one 64-row slab, O's columns split in two");
  static constexpr int kOCols = kHeadDimV / kNumConsumers;  // MLA: O columns per consumer warpgroup
  // The producer also packs qv's rows (decode/load.cuh load_q) and moves 64 chunks a V row: at
  // the decode kernel's 64 it spilled 24 bytes (compile-check), at 80 16 bytes; 88, with the
  // consumers at 208 (consumer 0: O 128 + S 32 + P 16 and the softmax; at 200 a consumer that
  // computed S spilled 112 bytes), fills the 168 x 384 pool exactly.
  static constexpr int kProducerRegs = 88;
  static constexpr int kConsumerRegs = 208;
  static constexpr int kRegPool = (65536 / kNumThreads) / 8 * 8 * kNumThreads;
  static_assert(128 * kProducerRegs + kNumConsumerThreads * kConsumerRegs <= kRegPool, "register budget");
  static constexpr bool kRescaleOBeforeGemm = false;
  static constexpr int kMmaK = 16;

  using BlkM = cute::Int<kBlockM>;
  using BlkN = cute::Int<kBlockN>;
  using HD = cute::Int<kHeadDim>;
  using HDV = cute::Int<kHeadDimV>;
  using Stages = cute::Int<kStages>;

  // Shared memory (as fwd/traits.cuh): Q and K (rows, d) K-major; V as Vt (d_v, n) with d_v
  // contiguous (the MN-major B of P.V, V's row-major bytes), tiled tokens first in 64-wide d_v
  // slices. MLA: qv (rows, d_v) K-major, and V's same bytes as the K-major (n, d_v) B of Qv V^T:
  // a 128-byte-swizzled MN-major (64 x 8) atom and a K-major (8 x 64) atom are one physical
  // layout, and both tilings step tokens first, so sV(j, c) and sVt(c, j) are one element.
  static constexpr cute::GMMA::Major kVMajor = cute::GMMA::Major::MN;
  using SmemLayoutQ = decltype(cute::tile_to_shape(
      gmma_smem_atom<cute::GMMA::Major::K, Element, kHeadDim>(), cute::Shape<BlkM, HD>{}));
  using SmemLayoutQv = decltype(cute::tile_to_shape(
      gmma_smem_atom<cute::GMMA::Major::K, Element, kHeadDimV>(), cute::Shape<BlkM, HDV>{}));
  using SmemLayoutK = decltype(cute::tile_to_shape(
      gmma_smem_atom<cute::GMMA::Major::K, Element, kHeadDim>(), cute::Shape<BlkN, HD, Stages>{}));
  using SmemLayoutVt = decltype(cute::tile_to_shape(
      gmma_smem_atom<cute::GMMA::Major::MN, Element, kHeadDimV>(), cute::Shape<HDV, BlkN, Stages>{},
      cute::Step<cute::_2, cute::_1, cute::_3>{}));
  using SmemLayoutV = decltype(cute::tile_to_shape(
      gmma_smem_atom<cute::GMMA::Major::K, Element, kHeadDimV>(), cute::Shape<BlkN, HDV, Stages>{}));
  static_assert(cute::cosize_v<SmemLayoutV> == cute::cosize_v<SmemLayoutVt>, "V's two views, one buffer");
  using SmemLayoutO = decltype(cute::tile_to_shape(
      gmma_smem_atom<cute::GMMA::Major::K, ElementOut, kHeadDimV>(), cute::Shape<BlkM, HDV>{}));
  static constexpr int kVBufferElems = cute::cosize_v<SmemLayoutVt>;
  static_assert(cute::cosize_v<SmemLayoutO> <= kVBufferElems, "O must fit in V's buffer");

  // S = Q K^T and S += Qv V^T: one warpgroup's 64 x block_n (each consumer computes all of S).
  using AtomOne = cute::Layout<cute::Shape<cute::_1, cute::_1, cute::_1>>;
  using TiledMmaS = decltype(cute::make_tiled_mma(ss_op<Element, kBlockN, kHeadDim>(), AtomOne{}));
  using TiledMmaQv = decltype(cute::make_tiled_mma(ss_op<Element, kBlockN, kHeadDimV>(), AtomOne{}));
  // O += P V: two 64 x 256 atoms along N, one per consumer warpgroup (thread 128 c + t of the
  // tiled MMA is thread t of consumer c). Consumer 0: P from registers (RS); consumer 1: P staged
  // in shared memory (SS, TiledMmaOSmem). Their accumulators have one layout.
  using AtomAlongN = cute::Layout<cute::Shape<cute::_1, cute::Int<kNumConsumers>, cute::_1>>;
  using TiledMmaO = decltype(cute::make_tiled_mma(
      cute::GMMA::rs_op_selector<Element, Element, float, cute::Shape<cute::_64, cute::Int<kOCols>, BlkN>,
                                 cute::GMMA::Major::K, kVMajor>(),
      AtomAlongN{}));
  using TiledMmaOSmem = decltype(cute::make_tiled_mma(
      ss_op<Element, kOCols, kBlockN, cute::GMMA::Major::K, kVMajor>(), AtomAlongN{}));
  // The staged P (block_m, block_n), K-major: the A operand of consumer 1's P.V.
  using SmemLayoutP = decltype(cute::tile_to_shape(
      gmma_smem_atom<cute::GMMA::Major::K, Element, kBlockN>(), cute::Shape<BlkM, BlkN>{}));
  FLASH3_WGMMA_N_CHECK(wgmma_basic_n(kBlockN) && wgmma_basic_n(kOCols));

  using ShapeRows = cute::Shape<int32_t, int32_t, int32_t, int32_t>;
  using StrideRows = cute::Stride<int64_t, cute::_1, int64_t, int64_t>;
  using StrideVt = cute::Stride<cute::_1, int64_t, int64_t, int64_t>;
  using GmemRowsIn = decltype(cute::make_tensor(cute::make_gmem_ptr(static_cast<Element const*>(nullptr)),
                                                ShapeRows{}, StrideRows{}));
  using GmemVtIn = decltype(cute::make_tensor(cute::make_gmem_ptr(static_cast<Element const*>(nullptr)),
                                              ShapeRows{}, StrideVt{}));
  using GmemRowsOut = decltype(cute::make_tensor(cute::make_gmem_ptr(static_cast<ElementOut*>(nullptr)),
                                                 ShapeRows{}, StrideRows{}));

  using LayoutS = decltype(cute::partition_fragment_C(TiledMmaS{}, cute::Shape<BlkM, BlkN>{}).layout());
  using LayoutO = decltype(cute::partition_fragment_C(TiledMmaO{}, cute::Shape<BlkM, HDV>{}).layout());
  static constexpr int kRowsPerThread = decltype(cute::size<0>(acc_rowcol(LayoutO{})))::value;
  static_assert(kRowsPerThread == decltype(cute::size<0>(acc_rowcol(LayoutS{})))::value, "S and O rows agree");
  using LayoutP = decltype(acc_as_a_operand(LayoutS{}));

  using TmaQ = decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, std::declval<GmemRowsIn>(), SmemLayoutQ{},
                                            cute::Shape<BlkM, HD>{}, cute::_1{}));
  using TmaK = decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, std::declval<GmemRowsIn>(),
                                            cute::take<0, 2>(SmemLayoutK{}), cute::Shape<BlkN, HD>{},
                                            cute::_1{}));
  using TmaV = decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, std::declval<GmemVtIn>(),
                                            cute::take<0, 2>(SmemLayoutVt{}), cute::Shape<HDV, BlkN>{},
                                            cute::_1{}));
  using TmaO = decltype(cute::make_tma_copy(cute::SM90_TMA_STORE{}, std::declval<GmemRowsOut>(), SmemLayoutO{},
                                            cute::Shape<BlkM, HDV>{}, cute::_1{}));

  static constexpr uint32_t kQBytes = kBlockM * kHeadDim * sizeof(Element);
  static constexpr uint32_t kKBytes = kBlockN * kHeadDim * sizeof(Element);
  static constexpr uint32_t kVBytes = kBlockN * kHeadDimV * sizeof(Element);

  static_assert(kStages == 2, "two K/V stages (the base's)");
  // The named barriers past the base's (kBarPingpong0 .. kBarProducer).
  static constexpr uint32_t kBarPFull = kNumConsumers + 4;   // MLA: consumer 0 -> 1, P staged
  static constexpr uint32_t kBarPEmpty = kNumConsumers + 5;  // MLA: consumer 1 -> 0, P read

  struct SharedStorage {
    alignas(1024) cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> q;
    alignas(1024) cute::array_aligned<Element, cute::cosize_v<SmemLayoutQv>, 1024> qv;  // MLA
    alignas(1024) cute::array_aligned<Element, cute::cosize_v<SmemLayoutK>, 1024> k;
    alignas(1024) cute::array_aligned<Element, kVBufferElems, 1024> v;  // V, then O
    alignas(1024) cute::array_aligned<Element, cute::cosize_v<SmemLayoutP>, 1024> p;  // MLA: staged P
    float row_scale[kBlockM];  // MLA: O's factor before the staged P's P.V; at the end 1 / row sum
    float row_lse[kBlockM];    // MLA: the rows' LSE (with the last 1 / row sum)
    PipeStorage pipe_k;
    PipeStorage pipe_v;
    uint64_t q_full;  // Q and qv of the current tile have landed
    uint64_t q_free;  // consumers: the previous tile's last S GEMMs are done (Q, qv may be overwritten)
    uint64_t o_free;
    uint64_t v_tail;
    int next_tile;
    float overlap_pin[kNumConsumerThreads];
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  static_assert(kSmemBytes <= 227 * 1024, "shared memory over the 227 KB opt-in limit");
  // FwdEpilogue's (fwd/traits.cuh): O is staged in V's buffer, stored by one TMA store per tile.
  static constexpr bool kOwnOBuffer = false;
  static __device__ __forceinline__ ElementOut* o_buffer(SharedStorage& s) {
    return reinterpret_cast<ElementOut*>(s.v.data());
  }

  struct KernelParams {
    TmaQ tma_q;
    TmaK tma_k;
    TmaV tma_v;
    TmaO tma_o;
    ShapeRows shape_q, shape_k, shape_vt, shape_o;
    FwdParams p;
    TileOrder order;
    ScoreMod mod;
    bool gather_kv = false;
    int slab_shift = -1;
  };
};

}  // namespace flash3
