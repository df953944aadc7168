// Compile-time configuration of the forward kernel for one (dtype, d, d_v): tile sizes (taken from
// attn_logic.h's fwd_tile_shape, not re-decided here), shared-memory layouts, the two WGMMA tiled
// MMAs, the TMA copy types, the shared-storage struct and the kernel's parameter block.
#pragma once


#include <type_traits>

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
#include "flash3/common/wgmma_shapes.h"  // n-extents such as 80 and 112 (block_n of d 192/256)
#include "flash3/fwd/kv_sync.cuh"
#include "flash3/fwd/params.h"

namespace flash3 {

// Element: bf16, fp16, or e4m3 (the FP8 kernel: output bf16, per-block descales, P in e4m3 and
// two-level P.V accumulation; see fp8_steps.cuh). kDecode: the KV-cache kernel (paged or contiguous
// cache, packed GQA, split-KV; FwdParams' KV-cache block), same tiles as the plain kernel.
// Cache: the decode kernel's KV-cache element, Element or e4m3 (kFp8Cache: 16-bit q against an FP8
// cache; the producer converts the gathered bytes into K/V's 16-bit stages, decode/load.cuh).
// kChunkTile: the forward's (16-bit or FP8) or decode's tile for calls with an attention chunk where
// the plain tile has no registers for it (attn_logic.h fwd_chunk_tile_shape, fwd_fp8_chunk_tile_shape,
// decode_chunk_tile_shape; fwd/launch.cuh run_fwd / run_fwd_fp8 and decode/launch.cuh run_decode pick it).
// kFastAccum: the FP8 kernel's opt-in single accumulation (FA3's, torch._scaled_mm's use_fast_accum):
// P.V accumulates over all key blocks in the WGMMA accumulator (O), as the 16-bit kernel does, with
// the FP8 tensor cores' truncating adds; v's descale is one per (batch, kv head), applied at the end
// (attn_logic.h fwd_fp8_fast_tile_shape; fp8_steps.cuh).
template <class Element_, int kHeadDim_, int kHeadDimV_, bool kDecode_ = false, class Cache_ = Element_,
          bool kChunkTile_ = false, bool kFastAccum_ = false>
struct FwdTraits;

// FwdTraits' tile (its reasons live in attn_logic.h, unit-tested on the CPU): a function of the
// template parameters, so the base (the pipeline and barrier ids) gets its stages and consumers.
template <class Element, class Cache, int kHeadDim, int kHeadDimV, bool kDecode, bool kChunkTile, bool kFastAccum>
inline constexpr TileShape kFwdTraitsTile =
    sizeof(Element) == 1 ? (kFastAccum   ? fwd_fp8_fast_tile_shape(kHeadDim, kHeadDimV)
                            : kChunkTile ? fwd_fp8_chunk_tile_shape(kHeadDim, kHeadDimV)
                                         : fwd_fp8_tile_shape(kHeadDim, kHeadDimV))
    : kDecode && kChunkTile ? decode_chunk_tile_shape(kHeadDim, kHeadDimV, !std::is_same_v<Cache, Element>)
    : kDecode            ? decode_tile_shape(kHeadDim, kHeadDimV, !std::is_same_v<Cache, Element>)
    : kChunkTile         ? fwd_chunk_tile_shape(kHeadDim, kHeadDimV)
                         : fwd_tile_shape(kHeadDim, kHeadDimV);

// V's stages (fwd/kv_sync.cuh kStagesV): attn_logic.h fwd_v_stages in the 16-bit forward (a third
// at d 96 and 128, beside O's own buffer), else K's.
template <class Element, class Cache, int kHeadDim, int kHeadDimV, bool kDecode, bool kChunkTile, bool kFastAccum>
inline constexpr int kFwdTraitsStagesV =
    sizeof(Element) == 2 && !kDecode
        ? fwd_v_stages(kFwdTraitsTile<Element, Cache, kHeadDim, kHeadDimV, kDecode, kChunkTile, kFastAccum>, kHeadDim,
                       kHeadDimV)
        : kFwdTraitsTile<Element, Cache, kHeadDim, kHeadDimV, kDecode, kChunkTile, kFastAccum>.stages;

template <class Element_, int kHeadDim_, int kHeadDimV_, bool kDecode_, class Cache_, bool kChunkTile_, bool kFastAccum_>
struct FwdTraits
    : FwdKvSync<kFwdTraitsTile<Element_, Cache_, kHeadDim_, kHeadDimV_, kDecode_, kChunkTile_, kFastAccum_>.stages,
                kFwdTraitsTile<Element_, Cache_, kHeadDim_, kHeadDimV_, kDecode_, kChunkTile_, kFastAccum_>.num_consumers,
                kFwdTraitsStagesV<Element_, Cache_, kHeadDim_, kHeadDimV_, kDecode_, kChunkTile_, kFastAccum_>> {
  static constexpr bool kDecode = kDecode_;
  static constexpr bool kMla = false;  // decode/mla_traits.cuh: the MLA decode kernel's traits
  static constexpr bool kQv = false;   // no qv rows to pack (decode/load.cuh)
  using Element = Element_;
  using CacheElement = Cache_;
  static constexpr bool kFp8 = sizeof(Element) == 1;
  // ALiBi (the score mod's position term) is compiled for 16-bit head dims up to 128: at 256 its
  // terms spilled registers (compile-check, 2026-11-28: 20 bytes forward, 232 decode), so those
  // kernels keep softcap only and launch_fwd refuses slopes (flash3/_backend.py routes such calls
  // to the reference, ALIBI_MAX_HEAD_DIM).
  static constexpr bool kAlibi = !kFp8 && kHeadDim_ <= 128 && kHeadDimV_ <= 128;
  static constexpr bool kFp8Cache = !std::is_same_v<Cache_, Element_>;
  // FA3's attention_chunk: the forward (16-bit, FP8) and decode tiles that have registers for it
  // (attn_logic.h fwd_tile_takes_chunk, fwd_fp8_tile_takes_chunk, decode_takes_chunk) and the chunk
  // tiles (kChunkTile, built for the others) take it (launch_fwd checks).
  static constexpr bool kChunkTile = kChunkTile_;
  static constexpr bool kFastAccum = kFastAccum_;
  static_assert(!kFastAccum || (sizeof(Element_) == 1 && !kDecode_ && !kChunkTile_), "fast accumulation: the FP8 forward's");
  static constexpr bool kChunk = kChunkTile_ || (kDecode_     ? decode_takes_chunk(kHeadDim_, kHeadDimV_)
                                                 : kFastAccum_ ? false
                                                 : kFp8        ? fwd_fp8_tile_takes_chunk(kHeadDim_, kHeadDimV_)
                                                               : fwd_tile_takes_chunk(kHeadDim_, kHeadDimV_));
  static_assert(!kFp8Cache || (kDecode && !kFp8 && sizeof(Cache_) == 1), "an FP8 cache is a decode kernel's");
  using ElementOut = std::conditional_t<kFp8, cutlass::bfloat16_t, Element>;

  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kHeadDimV = kHeadDimV_;
  static constexpr TileShape kTile = kFwdTraitsTile<Element_, Cache_, kHeadDim_, kHeadDimV_, kDecode_, kChunkTile_, kFastAccum_>;
  static constexpr int kBlockM = kTile.block_m;
  static constexpr int kBlockN = kTile.block_n;
  static constexpr int kStages = kTile.stages;  // K's
  static constexpr int kStagesV = kFwdTraitsStagesV<Element_, Cache_, kHeadDim_, kHeadDimV_, kDecode_, kChunkTile_, kFastAccum_>;
  static constexpr int kNumConsumers = kTile.num_consumers;  // consumer warpgroups, 64 rows each
  static constexpr int kNumConsumerThreads = 128 * kNumConsumers;
  // An FP8 cache up to d 128 has two producer warpgroups, K's (warpgroup 0) and V's (the last):
  // each gathers, converts and publishes its own side of every key block (decode/load.cuh
  // load_fp8). With one, its one warp per sub-partition converting every value was the decode's
  // bound in the timing model (a chain of conversions per warp, the consumers waiting ~65%).
  static constexpr bool kWideFp8CacheProducer = kFp8Cache && kHeadDim_ <= 128 && kHeadDimV_ <= 128;
  static constexpr int kProducerWarpgroups = kWideFp8CacheProducer ? 2 : 1;
  static constexpr int kNumThreads = 128 * kProducerWarpgroups + kNumConsumerThreads;
  // (the decode kernels' static schedule: no tile hand-off for V's producer to join, fwd/kernel.cuh)
  static_assert(kProducerWarpgroups == 1 || kDecode_, "two producer warpgroups: the FP8-cache decode's");

  // setmaxnreg moves registers within the CTA's pool: the launch allocation (64K / threads, rounded
  // down to a multiple of 8: 168 for 384 threads, 128 for 512) times the threads. With 2 consumers
  // the producer keeps 40, not FA3's 24: its tile bookkeeping (dynamic scheduler, kv-cache tail)
  // spilled at 24 and 32 (d = 192); the consumers keep 232. 3 consumers: 32 + 160 fill the
  // 512-thread pool exactly.
  // The decode kernel's producer is the whole warpgroup (gathered K/V loads of small pages, the
  // packed Q load) and needs more: 64 (at 40 it spilled, at 56 by 12 bytes for d = 96), taken
  // from the consumers (216; its tiles, decode_tile_shape, all have 2 consumers and at most the
  // plain kernel's 128 x 80..128: d = 256 holds O 128 + S 40 + P 20).
  // An FP8 cache's producer (gather, convert) fits in 56, and its consumers need the 224 that
  // frees: at 216 the d = 256 tile (block_n 48) spilled 28 bytes. Up to d 128 its producer copies
  // whole passes of rows and takes a block's page ids once (decode/load.cuh gather_raw), which
  // spilled at 56 (d 128: 24 bytes): 64 / 216 there, as the 16-bit cache's.
  // FP8 fast accumulation at d 256 (O 128 + S 64 + P 16 at once) needs FA3's 24 / 240: at 232 ptxas
  // serialized the WGMMAs and spilled (compile-check, 2026-11-30: 18 LDL, 28 STL).
  // Two FP8-cache producer warpgroups (512 threads, a pool of 128 a thread): 64 each, the consumers
  // 192 (no spill at d 64, 96, 128, compile-check 2026-12-01).
  static constexpr bool kWideConsumers = kFastAccum_ && kHeadDimV_ > 128;
  static constexpr int kProducerRegs =
      kWideFp8CacheProducer ? 64 : kFp8Cache ? 56 : kDecode ? 64 : kWideConsumers ? 24 : kNumConsumers == 2 ? 40 : 32;
  static constexpr int kConsumerRegs =
      kNumConsumers == 2
          ? (kWideFp8CacheProducer ? 192 : kFp8Cache ? 224 : kDecode ? 216 : kWideConsumers ? 240 : 232)
          : 160;
  // WGMMA operand descriptors sliced by the warp-uniform consumer index live in uniform registers
  // (no R2UR per HGMMA), but the 16-bit-cache decode consumers at d > 128 (216 registers, O of
  // 128 + S + P) then spilled (d 256: 124/204 bytes): they slice by thread index as before.
  static constexpr bool kUniformOperandSlices = !(kDecode && !kFp8Cache && kHeadDim > 128);
  static_assert(!kDecode || kNumConsumers == 2, "decode tiles have 2 consumer warpgroups");
  static constexpr int kRegPool = (65536 / kNumThreads) / 8 * 8 * kNumThreads;
  static_assert(128 * kProducerWarpgroups * kProducerRegs + kNumConsumerThreads * kConsumerRegs <= kRegPool,
                "register budget");

  static_assert(kBlockM == 64 * kNumConsumers, "one 64-row WGMMA slab per consumer warpgroup");
  static constexpr int kMmaK = kFp8 ? 32 : 16;  // k-extent of one WGMMA instruction
  static_assert(kBlockN % kMmaK == 0, "block_n is the k-extent of P.V");
  // FP8: each P.V block goes into a fresh fp32 accumulator that is then added to O (two-level
  // accumulation). Past d_v = 128, or at d_v = 128 on 128-key blocks, that accumulator would not
  // fit beside O and S, so P.V runs in chunks of 64 columns, two fresh accumulators in turn (64
  // registers): a chunk is added to O while the next one's WGMMA runs (fp8_steps.cuh
  // FwdFp8Steps::pv_chunks), without the softmax overlap (FwdFp8Steps::step). Chunking the columns
  // leaves each output's sums (over the keys) as they were.
  // (kFastAccum: no fresh accumulator, O is the P.V WGMMA's accumulator: one chunk.)
  static constexpr int kOChunks =
      kFp8 && !kFastAccum && (kHeadDimV > 128 || (kHeadDimV > 64 && kBlockN > 64)) ? kHeadDimV / 64 : 1;
  static constexpr int kOChunkCols = kHeadDimV / kOChunks;
  static_assert(kHeadDim % 16 == 0 && kHeadDimV % 16 == 0, "head dims must be multiples of 16");

  using BlkM = cute::Int<kBlockM>;
  using BlkN = cute::Int<kBlockN>;
  using HD = cute::Int<kHeadDim>;
  using HDV = cute::Int<kHeadDimV>;
  using Stages = cute::Int<kStages>;
  using StagesV = cute::Int<kStagesV>;

  // Shared memory. Q, K: (rows, d) with d contiguous (K-major operands of Q.K^T).
  // V is kept as Vt (d_v, block_n). 16-bit: d_v contiguous, the MN-major B operand of P.V, which is
  // exactly V's row-major layout in global memory, so TMA loads it without any transpose.
  // FP8 (8-bit WGMMA takes K-major operands only): tokens contiguous, loaded from a V stored
  // transposed as (b, h_k, d_v, tokens) by the quantizer, tokens permuted within every 16 so that
  // P's accumulator registers are the A operand as they stand (flash3/fp8_quant.py V_PERM16).
  static constexpr cute::GMMA::Major kVMajor = kFp8 ? cute::GMMA::Major::K : cute::GMMA::Major::MN;
  using SmemLayoutQ = decltype(cute::tile_to_shape(
      gmma_smem_atom<cute::GMMA::Major::K, Element, kHeadDim>(), cute::Shape<BlkM, HD>{}));
  using SmemLayoutK = decltype(cute::tile_to_shape(
      gmma_smem_atom<cute::GMMA::Major::K, Element, kHeadDim>(), cute::Shape<BlkN, HD, Stages>{}));
  // 16-bit: the (64 d_v x 8 token) swizzle atoms are tiled tokens first, so each 64-wide slice of
  // d_v is one (64, block_n) 128B-swizzled box in smem: V of a block arrives in d_v / 64 TMA
  // requests (2 at d_v 128), not one per atom (32 at 128 x 128 with d_v first).
  using VtTileOrder = std::conditional_t<kFp8, cute::Step<cute::_1, cute::_2, cute::_3>,
                                         cute::Step<cute::_2, cute::_1, cute::_3>>;
  using SmemLayoutVt = decltype(cute::tile_to_shape(
      gmma_smem_atom<kVMajor, Element, kFp8 ? kBlockN : kHeadDimV>(), cute::Shape<HDV, BlkN, StagesV>{},
      VtTileOrder{}));
  // O staging tile (block_m, d_v), d_v contiguous. Where shared memory has room (the 16-bit
  // forward at d <= 128), O has a buffer of its own, in 16-row slabs, one per warp: each
  // warp stores its rows by TMA as soon as they are written, and the consumer warpgroups cross a
  // tile boundary independently (FwdConsumer::kOverlapEpilogue: the store runs under the next
  // tile's first Q.K^T). Elsewhere O aliases V's buffer after the tile's last P.V (FA3's choice):
  // Q's buffer is then free for the next tile while this one's epilogue runs.
  using SmemLayoutOWarp = decltype(cute::tile_to_shape(
      gmma_smem_atom<cute::GMMA::Major::K, ElementOut, kHeadDimV>(), cute::Shape<cute::_16, HDV>{}));
  static constexpr int kOBytes = kBlockM * kHeadDimV * int(sizeof(ElementOut));
  static constexpr bool kOwnOBuffer = !kFp8 && !kDecode && !kFp8Cache && fwd_own_o_buffer(kTile, kHeadDim, kHeadDimV);
  static_assert(!kOwnOBuffer || (cute::cosize_v<SmemLayoutQ> + cute::cosize_v<SmemLayoutK> + cute::cosize_v<SmemLayoutVt>) *
                                        int(sizeof(Element)) ==
                                    fwd_mainloop_bytes(kTile, kHeadDim, kHeadDimV, kStagesV),
                "attn_logic.h fwd_mainloop_bytes counts the stages' layouts");
  using SmemLayoutO = std::conditional_t<
      kOwnOBuffer, decltype(cute::tile_to_shape(SmemLayoutOWarp{}, cute::Shape<BlkM, HDV>{})),
      decltype(cute::tile_to_shape(gmma_smem_atom<cute::GMMA::Major::K, ElementOut, kHeadDimV>(),
                                   cute::Shape<BlkM, HDV>{}))>;
  // What one TMA store of O covers: a warp's 16 rows, or the whole tile.
  using BlkMO = std::conditional_t<kOwnOBuffer, cute::_16, BlkM>;
  using SmemLayoutOBox = std::conditional_t<kOwnOBuffer, SmemLayoutOWarp, SmemLayoutO>;
  // V's buffer, in elements: grown where the 16-bit O tile is larger than the V stages and shares
  // it (FP8, and the FP8-cache decode tiles of d 256).
  static constexpr int kVBufferElems =
      kOwnOBuffer || cute::cosize_v<SmemLayoutVt> * int(sizeof(Element)) >= kOBytes
          ? cute::cosize_v<SmemLayoutVt>
          : kOBytes / int(sizeof(Element));
  static_assert(kFp8 || kFp8Cache || kVBufferElems == cute::cosize_v<SmemLayoutVt>,
                "16-bit O must fit in V's buffer");

  // WGMMA: one 64 x N atom per consumer warpgroup, stacked along M.
  using AtomLayout = cute::Layout<cute::Shape<cute::Int<kNumConsumers>, cute::_1, cute::_1>>;
  // S = Q K^T, both operands from shared memory (SS).
  using TiledMmaS = decltype(cute::make_tiled_mma(
      ss_op<Element, kBlockN, kHeadDim>(),
      AtomLayout{}));
  // O += P V, P from registers (RS), V as B (MN-major for 16 bits, K-major for FP8), one WGMMA
  // n-extent per O chunk (O's fragment then has kOChunks tiles along N).
  using TiledMmaO = decltype(cute::make_tiled_mma(
      cute::GMMA::rs_op_selector<Element, Element, float, cute::Shape<cute::_64, cute::Int<kOChunkCols>, BlkN>,
                                 cute::GMMA::Major::K, kVMajor>(),
      AtomLayout{}));
  FLASH3_WGMMA_N_CHECK(wgmma_n_ok(kBlockN) && wgmma_basic_n(kOChunkCols));  // P.V: CuTe's RS atoms

  // Global tensors as TMA sees them. Rows tensors: (row, dim, head, batch); Vt: (dim, row, head, batch).
  using ShapeRows = cute::Shape<int32_t, int32_t, int32_t, int32_t>;
  using StrideRows = cute::Stride<int64_t, cute::_1, int64_t, int64_t>;
  // Vt: (d_v, tokens); 16-bit V is row-major (d_v contiguous), FP8 V arrives transposed.
  using StrideVt = std::conditional_t<kFp8, cute::Stride<int64_t, cute::_1, int64_t, int64_t>,
                                      cute::Stride<cute::_1, int64_t, int64_t, int64_t>>;
  using GmemRowsIn = decltype(cute::make_tensor(cute::make_gmem_ptr(static_cast<Element const*>(nullptr)),
                                                ShapeRows{}, StrideRows{}));
  using GmemVtIn = decltype(cute::make_tensor(cute::make_gmem_ptr(static_cast<Element const*>(nullptr)),
                                              ShapeRows{}, StrideVt{}));
  using GmemRowsOut = decltype(cute::make_tensor(cute::make_gmem_ptr(static_cast<ElementOut*>(nullptr)),
                                                 ShapeRows{}, StrideRows{}));

  // Per-thread accumulator layouts and the rows a thread owns (2: rows r and r + 8 of its warp).
  using LayoutS = decltype(cute::partition_fragment_C(TiledMmaS{}, cute::Shape<BlkM, BlkN>{}).layout());
  using LayoutO = decltype(cute::partition_fragment_C(TiledMmaO{}, cute::Shape<BlkM, HDV>{}).layout());
  static constexpr int kRowsPerThread = decltype(cute::size<0>(acc_rowcol(LayoutO{})))::value;
  // FA3's rule (by Q/K's head dim): past 128, rescale O before issuing the next P.V rather than
  // after the last one finished, so the multiplies do not queue behind the softmax at the end of
  // the step.
  static constexpr bool kRescaleOBeforeGemm = (!kFp8 || kFastAccum) && kHeadDim > 128;
  // Where a step's wait for its P.V goes (FwdConsumer::step): after the exponentials of the first
  // kPinCols of each row's block_n / 4 columns; the rest, P's conversion and the loop's bookkeeping
  // after it. Pinned after all of them (before 2026-11-30), those ~120 cycles (SASS, d 128: 32
  // F2FP at 2 cycles, the V release, the loop test) ran after the last exponential on every step,
  // long after the P.V had finished. The P.V of one warpgroup, issued right behind its Q.K^T, takes
  // d_v * block_n / 32 tensor cycles (2 * 64 * d_v * block_n FLOP at 4096 a cycle per SM: 989.4
  // dense TFLOP/s [WP] over 132 SMs at 1830 MHz); the softmax reaches its first exponential about
  // block_n + 100 cycles after the Q.K^T (SASS, d 128: 231: the row maxes at 2 cycles an FMNMX,
  // the quad shuffles, the lazy-rescale test) and then takes 16 cycles a column (the two rows'
  // MUFU.EX2, 8 cycles each on a sub-partition), plus the wgmma latency (timing_params.h, 32).
  // So the wait is pinned at the column where the P.V should be done, at most all of them (d 192 x
  // 192, d 256: the P.V outlasts the softmax) and at least a quarter and one (d 64's short P.V would
  // take 4 of 32: compile-check's overlap floor, a quarter of the exponentials before the wait,
  // guards against ptxas hoisting the wait above the softmax and cannot tell the two apart). FP8
  // keeps its own steps; decode as before.
  static constexpr int kPinCols = [] {
    constexpr int cols = kBlockN / 4;
    if (kFp8 || kDecode) return cols;
    const int at = (kHeadDimV * kBlockN / 32 + 32 - (kBlockN + 100) + 15) / 16;
    return at < cols / 4 + 1 ? cols / 4 + 1 : at > cols ? cols : at;
  }();
  // P in the A-operand register layout of P.V. 16-bit: S's accumulator registers as they are.
  // FP8: a compact ((4,2,2), M, block_n/32) fragment that store_p fills from S's registers
  // (acc_as_a_operand_fp8 says which value goes where).
  using LayoutP = std::conditional_t<
      kFp8,
      decltype(cute::make_layout(cute::Shape<cute::Shape<cute::_4, cute::_2, cute::_2>,
                                             decltype(cute::size<1>(LayoutS{})), cute::Int<kBlockN / 32>>{})),
      decltype(acc_as_a_operand(LayoutS{}))>;

  using TmaQ = decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, std::declval<GmemRowsIn>(), SmemLayoutQ{},
                                            cute::Shape<BlkM, HD>{}, cute::_1{}));
  using TmaK = decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, std::declval<GmemRowsIn>(),
                                            cute::take<0, 2>(SmemLayoutK{}), cute::Shape<BlkN, HD>{},
                                            cute::_1{}));
  using TmaV = decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, std::declval<GmemVtIn>(),
                                            cute::take<0, 2>(SmemLayoutVt{}), cute::Shape<HDV, BlkN>{},
                                            cute::_1{}));
  // Decode, 16-bit paged cache whose pages hold kPieceRows-row pieces of a key block (page_size a
  // multiple of kPieceRows, not of block_n): K and V of a block arrive as block_n / kPieceRows TMA
  // pieces, each from its own page (decode/load.cuh load_tma). A piece is a slice of the stage's
  // layout (rows 16j.. of K, tokens 16j.. of Vt: whole swizzle atoms, so the slice is the stage's
  // layout at an offset of 16j rows).
  static constexpr int kPieceRows = 16;
  static constexpr bool kTmaPieces = kDecode && !kFp8Cache && kBlockN % kPieceRows == 0;
  using PieceRows = cute::Int<kPieceRows>;
  using SmemLayoutKPiece = decltype(cute::composition(cute::take<0, 2>(SmemLayoutK{}),
                                                      cute::make_tile(cute::Layout<PieceRows>{}, cute::Layout<HD>{})));
  using SmemLayoutVtPiece = decltype(cute::composition(cute::take<0, 2>(SmemLayoutVt{}),
                                                       cute::make_tile(cute::Layout<HDV>{}, cute::Layout<PieceRows>{})));
  // The piece descriptors' types, formed only where pieces exist (other traits get an empty type).
  struct NoTma {};
  template <bool kOn, class = void>
  struct PieceTmas {
    using K = NoTma;
    using V = NoTma;
  };
  template <class Dummy>
  struct PieceTmas<true, Dummy> {
    using K = decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, std::declval<GmemRowsIn>(), SmemLayoutKPiece{},
                                           cute::Shape<PieceRows, HD>{}, cute::_1{}));
    using V = decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, std::declval<GmemVtIn>(), SmemLayoutVtPiece{},
                                           cute::Shape<HDV, PieceRows>{}, cute::_1{}));
  };
  using TmaKPiece = typename PieceTmas<kTmaPieces>::K;
  using TmaVPiece = typename PieceTmas<kTmaPieces>::V;
  // 2-CTA clusters (FA3's ClusterM 2): the two CTAs of a cluster take adjacent query blocks of one
  // (batch, head), whose key blocks are the same under full attention, and each loads half of every
  // K and V block, multicast into both (the L2 reads of K and V halve). On the H200 (2026-11-30)
  // flash3's d 128 forward read 49% of L2's throughput against FA3's 30% and ran at 0.93x its speed.
  // Such traits get a second kernel, fwd_kernel<..., 2> (fwd/kernel.cuh), which fwd/launch.cuh
  // launches in clusters of 2 for statically scheduled calls with an even number of query blocks.
  static constexpr bool kMulticastKV = !kFp8 && !kDecode && !kChunkTile_ && kHeadDim == 128 && kHeadDimV == 128;
  template <bool kOn, class = void>
  struct McastTmas {
    using K = NoTma;
    using V = NoTma;
  };
  template <class Dummy>
  struct McastTmas<true, Dummy> {
    using K = decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD_MULTICAST{}, std::declval<GmemRowsIn>(),
                                           cute::take<0, 2>(SmemLayoutK{}), cute::Shape<BlkN, HD>{}, cute::_2{}));
    using V = decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD_MULTICAST{}, std::declval<GmemVtIn>(),
                                           cute::take<0, 2>(SmemLayoutVt{}), cute::Shape<HDV, BlkN>{}, cute::_2{}));
  };
  // The peer's producer waits only for the stages' release, not for this CTA's epilogue: O must not
  // be staged in V's buffer (d 192 / 256 do; they would need o_free counted across the pair).
  static_assert(!kMulticastKV || kOwnOBuffer, "K/V multicast: O needs its own buffer");
  using TmaKMcast = typename McastTmas<kMulticastKV>::K;
  using TmaVMcast = typename McastTmas<kMulticastKV>::V;
  using TmaO = decltype(cute::make_tma_copy(cute::SM90_TMA_STORE{}, std::declval<GmemRowsOut>(), SmemLayoutOBox{},
                                            cute::Shape<BlkMO, HDV>{}, cute::_1{}));

  static constexpr uint32_t kQBytes = kBlockM * kHeadDim * sizeof(Element);
  static constexpr uint32_t kKBytes = kBlockN * kHeadDim * sizeof(Element);  // one stage
  static constexpr uint32_t kVBytes = kBlockN * kHeadDimV * sizeof(Element);

  // The K and V pipelines (PipelineKV, PipelineState, PipeStorage; PipelineV, PipelineStateV,
  // PipeStorageV; full_barrier, empty_barrier) and the
  // named-barrier ids (kBar*, kTileHandoffThreads): the base, fwd/kv_sync.cuh (a dependent base:
  // named through FwdTraits:: here).

  // FP8 cache: two raw stages, each the gathered e4m3 rows of one key block (row-major, d or d_v
  // bytes a row) and every row's descale (0 for rows past the keys or behind a bad page id).
  static constexpr int kRawStages = 2;
  struct RawStage {
    alignas(128) uint8_t k[kBlockN * kHeadDim];
    alignas(128) uint8_t v[kBlockN * kHeadDimV];
    alignas(16) float k_scale[kBlockN];
    alignas(16) float v_scale[kBlockN];
  };
  struct RawStorage {
    RawStage raw[kRawStages];
  };
  struct NoRawStorage {};  // an empty base: no bytes for the other kernels

  struct OBuffer {
    alignas(1024) cute::array_aligned<ElementOut, cute::cosize_v<SmemLayoutO>, 1024> o;
  };
  struct NoOBuffer {};  // O shares V's buffer

  struct SharedStorage : std::conditional_t<kFp8Cache, RawStorage, NoRawStorage>,
                         std::conditional_t<kOwnOBuffer, OBuffer, NoOBuffer> {
    // 1024-byte alignment: the 128-byte swizzle pattern repeats every 1 KB.
    alignas(1024) cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> q;
    alignas(1024) cute::array_aligned<Element, cute::cosize_v<SmemLayoutK>, 1024> k;
    alignas(1024) cute::array_aligned<Element, kVBufferElems, 1024> v;  // V (then O, unless kOwnOBuffer)
    typename FwdTraits::PipeStorage pipe_k;
    typename FwdTraits::PipeStorageV pipe_v;
    uint64_t q_full;  // TMA transaction barrier: Q of the current tile has landed
    uint64_t q_free;  // consumers: the previous tile's last Q.K^T is done (Q may be overwritten)
    uint64_t o_free;  // consumers: the previous tile's O left V's buffer (V may be overwritten)
    uint64_t v_tail;  // producer's own barrier for a V block whose tail rows it zeroes
    int next_tile;    // dynamic scheduler: the tile the producer fetched for the consumers
    float overlap_pin[kNumConsumerThreads];  // written, never read: see FwdConsumer::pin_before_wait
  };
  // Where the epilogue stages O.
  static __device__ __forceinline__ ElementOut* o_buffer(SharedStorage& s) {
    if constexpr (kOwnOBuffer) return s.o.data();
    else return reinterpret_cast<ElementOut*>(s.v.data());
  }
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  static_assert(kSmemBytes <= 227 * 1024, "shared memory over the 227 KB opt-in limit");
  static_assert(!kDecode || kSmemBytes <= decode_smem_bytes(kHeadDim, kHeadDimV, kBlockN, kFp8Cache),
                "decode_smem_bytes (attn_logic.h) undercounts the decode kernel's shared memory");

  // Everything the kernel reads, passed as a __grid_constant__ (TMA descriptors must live in
  // param/const/global memory).
  struct KernelParams {
    TmaQ tma_q;
    TmaK tma_k;
    TmaV tma_v;
    TmaO tma_o;
    ShapeRows shape_q, shape_k, shape_vt, shape_o;
    FwdParams p;          // raw call description (pointers, strides, lengths, mask)
    TileOrder order;      // persistent schedule
    ScoreMod mod;         // softcap, ALiBi and the exp2 scale of raw scores (common/score_mod.h)
    // Decode: K/V gathered row by row (a page table whose pages do not hold whole key blocks), and
    // log2(slab_rows) when it is a power of two (else -1): page addressing without a division.
    bool gather_kv = false;
    int slab_shift = -1;
    // Decode: K/V by TMA pieces of kPieceRows rows, each from its page (kTmaPieces, set_params).
    bool tma_pieces = false;
    TmaKPiece tma_k_piece{};
    TmaVPiece tma_v_piece{};
    // kMulticastKV, the 2-CTA kernel: K and V in half blocks, each CTA's half multicast to both.
    TmaKMcast tma_k_mc{};
    TmaVMcast tma_v_mc{};
  };
  static_assert(!kFp8 || kNumConsumers == 2, "FP8: q descales are per 64-row slab = per consumer");
  static_assert(!(kFp8 && kDecode), "the decode kernel takes 16-bit q and caches");
};

}  // namespace flash3
