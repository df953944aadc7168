// The two sides of the mainloop for one tile.
//  Producer (one warp of warpgroup 0, one elected thread issuing): TMA loads of Q (own transaction
//   barrier) and of K and V (one mbarrier ring each), key blocks from end - 1 down to begin.
//  Consumer (one warpgroup per 64 query rows): S = Q K^T by WGMMA SS, online softmax, O += P V by
//   WGMMA RS. Step n issues S_n and O += P_{n+1} V_{n+1} together and runs the softmax of S_n while
//   the P.V WGMMA is in flight (intra-warpgroup overlap); the issue of GEMMs is serialized across
//   consumer warpgroups by named barriers (pingpong) so one warpgroup's softmax hides under the
//   other's GEMMs.
// FwdConsumer is the 16-bit algorithm; the e4m3 kernel's own steps (descales, e4m3 P, two-level P.V
// accumulation) are FwdFp8Steps (fp8_steps.cuh), entered at its `Tr::kFp8` hooks.
// Every step is a __forceinline__ function, not a lambda: ptxas outlines large lambdas (a CALL and a
// stack frame), which serializes every wgmma (C7519/C7520).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "flash3/common/barriers.cuh"
#include "flash3/common/softmax.cuh"
#include "flash3/common/wgmma.cuh"
#include "flash3/fwd/fp8_steps.cuh"
#include "flash3/fwd/scheduler.cuh"
#include "flash3/fwd/traits.cuh"

namespace flash3 {

template <class Tr>
struct FwdProducer {
  using Element = typename Tr::Element;
  using PipelineState = typename Tr::PipelineState;
  using PipelineStateV = typename Tr::PipelineStateV;
  using SharedStorage = typename Tr::SharedStorage;

  // Wait for a free stage (of K's pipeline or V's), then (leader) post the bytes the TMA will deliver.
  template <class Storage, class State>
  static __device__ __forceinline__ void acquire(Storage& pipe, State const& s, uint32_t bytes, bool leader, Wait what,
                                                 int tile) {
    mbarrier_wait(Tr::empty_barrier(pipe, s.index()), s.phase(), what, tile);
    if (leader) cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(Tr::full_barrier(pipe, s.index()), bytes);
  }

  // V of a key block whose rows past seqlen_k lie inside the tensor (a kv cache's unused tail; varlen:
  // the next sequence, or the packed tensor's unused rows after cu_seqlens_k[-1]): load it under the
  // producer's own barrier, zero those rows, then mark the stage full. P is 0 there, but 0 * NaN is
  // NaN, so garbage must not reach the P.V WGMMA. (K's rows there are harmless: a partial block is
  // always masked, and apply_mask replaces their scores by -inf. Q's rows past seqlen_q only feed
  // their own O/lse rows, which are never stored.)
  // Order: the wait on v_tail makes the TMA's bytes visible to this warp; the zeros follow; the proxy
  // fence orders them before the consumers' WGMMA (async proxy) reads, which wait on the full
  // barrier that this warp arrives on (release) only after __syncwarp.
  template <class SrcV, class SVt>
  static __device__ __forceinline__ void load_v_zero_tail(typename Tr::KernelParams const& params, SharedStorage& smem,
                                                          SrcV const& src, SVt& sVt, PipelineStateV const& s,
                                                          int valid_rows, uint32_t& tail_phase, bool leader, int tile) {
    auto issue = [&](uint64_t& bar) {
      if (leader) cute::copy(params.tma_v.with(bar), src, sVt(cute::_, s.index()));
    };
    load_v_zero_tail_by(smem, issue, s, valid_rows, tail_phase, leader, tile);
  }
  // The same with the block's V issued by `issue(barrier)`, which every lane of the warp calls (the
  // decode kernel's TMA pieces shuffle page ids) and whose copies the leader issues.
  template <class Issue>
  static __device__ __forceinline__ void load_v_zero_tail_by(SharedStorage& smem, Issue&& issue, PipelineStateV const& s,
                                                             int valid_rows, uint32_t& tail_phase, bool leader, int tile) {
    using namespace cute;
    mbarrier_wait(Tr::empty_barrier(smem.pipe_v, s.index()), s.phase(), Wait::VEmpty, tile);
    if (leader) cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&smem.v_tail, Tr::kVBytes);
    issue(smem.v_tail);
    mbarrier_wait(&smem.v_tail, tail_phase, Wait::VTail, tile);
    tail_phase ^= 1;
    Tensor sV = make_tensor(make_smem_ptr(smem.v.data()), typename Tr::SmemLayoutVt{});  // (d_v, n, stage)
    constexpr int kChunks = Tr::kHeadDimV / 8;  // 16-byte chunks: the swizzle never splits one
    const int lane = threadIdx.x % 32;
    if constexpr (Tr::kHeadDimV > 256) {
      // MLA (d_v 512): a row's chunks, kChunks / 32 to a lane; the flat loop below, unrolled,
      // spilled the producer's registers (compile-check).
      static_assert(kChunks % 32 == 0, "a V row is whole warps of 16-byte chunks");
#pragma unroll 1
      for (int r = valid_rows; r < Tr::kBlockN; ++r) {
        CUTE_UNROLL
        for (int j = 0; j < kChunks / 32; ++j)
          *reinterpret_cast<uint4*>(&sV((lane + 32 * j) * 8, r, s.index())) = make_uint4(0, 0, 0, 0);
      }
    } else {
      for (int i = lane; i < (Tr::kBlockN - valid_rows) * kChunks; i += 32) {
        const int r = valid_rows + i / kChunks, c = (i % kChunks) * 8;
        *reinterpret_cast<uint4*>(&sV(c, r, s.index())) = make_uint4(0, 0, 0, 0);
      }
    }
    cutlass::arch::fence_view_async_shared();  // generic writes -> the consumers' WGMMA (async proxy)
    __syncwarp();
    if (leader) cutlass::arch::ClusterBarrier::arrive(Tr::full_barrier(smem.pipe_v, s.index()));
  }

  // Warp 0 alone loads (the kernel lets the other producer warps go).
  static __device__ __forceinline__ constexpr bool all_warps(typename Tr::KernelParams const&) { return false; }

  // Loads one tile's Q and K/V blocks. `tile_count` = tiles with work this CTA already loaded.
  // Q's buffer is reused once the previous tile's last Q.K^T is done (q_free); V's buffer holds the
  // previous tile's O until its epilogue has stored it (o_free). The first K block goes out before
  // either wait, and Q before the O wait, so both overlap the previous tile's epilogue.
  // kClusterM 2 (Tr::kMulticastKV, the kernel's 2-CTA cluster): K and V by halves, multicast.
  template <int kClusterM = 1>
  static __device__ __forceinline__ void load(typename Tr::KernelParams const& params, SharedStorage& smem,
                                              PipelineState& state_k, PipelineStateV& state_v, const WorkTile& w,
                                              int tile_count, uint32_t& tail_phase, bool leader) {
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
    // FP8 varlen: Vt's sequences start at multiples of 16 (fp8_varlen_vt_offset), not at offset_k.
    const int offset_vt = Tr::kFp8 && p.cu_seqlens_k != nullptr
                              ? int(fp8_varlen_vt_offset(w.seq.offset_k, w.coord.batch))
                              : w.seq.offset_k;
    Tensor gVt = local_tile(domain_offset(make_coord(_0{}, offset_vt), mVt(_, _, w.head_k, bk)),
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
    const int tile = w.index;

    // The copies of key block nk into a stage: the whole block, or in a 2-CTA cluster this CTA's
    // half of it, multicast into both CTAs' stage (each CTA's full barrier expects the whole block:
    // its half and the peer's).
    static_assert(kClusterM == 1 || (kClusterM == 2 && Tr::kMulticastKV), "K/V multicast: 2-CTA clusters");
    auto copy_k = [&](int nk) {
      uint64_t& bar = *Tr::full_barrier(smem.pipe_k, state_k.index());
      if constexpr (kClusterM > 1) {
        auto tkm = tma_partition(params.tma_k_mc, int(cute::block_rank_in_cluster()), Layout<_2>{},
                                 group_modes<0, 2>(sK), group_modes<0, 2>(gK));
        copy(params.tma_k_mc.with(bar, uint16_t(0b11)), get<0>(tkm)(_, nk), get<1>(tkm)(_, state_k.index()));
      } else {
        copy(params.tma_k.with(bar), tKgK(_, nk), tKsK(_, state_k.index()));
      }
    };
    auto copy_v = [&](int nv) {
      uint64_t& bar = *Tr::full_barrier(smem.pipe_v, state_v.index());
      if constexpr (kClusterM > 1) {
        auto tvm = tma_partition(params.tma_v_mc, int(cute::block_rank_in_cluster()), Layout<_2>{},
                                 group_modes<0, 2>(sVt), group_modes<0, 2>(gVt));
        copy(params.tma_v_mc.with(bar, uint16_t(0b11)), get<0>(tvm)(_, nv), get<1>(tvm)(_, state_v.index()));
      } else {
        copy(params.tma_v.with(bar), tVgV(_, nv), tVsV(_, state_v.index()));
      }
    };

    int n = w.blocks.end - 1;
    acquire(smem.pipe_k, state_k, Tr::kKBytes, leader, Wait::KEmpty, tile);
    if (leader) copy_k(n);
    ++state_k;
    if (tile_count > 0) mbarrier_wait(&smem.q_free, (tile_count - 1) & 1, Wait::QFree, tile);
    if (leader) {
      cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&smem.q_full, Tr::kQBytes);
      copy(params.tma_q.with(smem.q_full), tQgQ, tQsQ);
    }
    if (!Tr::kOwnOBuffer && tile_count > 0) mbarrier_wait(&smem.o_free, (tile_count - 1) & 1, Wait::OFree, tile);
    // K runs one block ahead of V: the consumers' step n waits for K_n (S_n = Q K_n^T) before V_{n+1}
    // (P_{n+1} V_{n+1}), so K_n goes out before V_{n+1}; with V first, K_n queued behind V_{n+1}'s
    // slot wait and bytes (the timing model showed the consumers stalled on K's full barrier).
    // The rightmost block's V (the only one with rows past seqlen_k) goes out after K_{n-1}, with
    // its tail check; the loop then carries plain K_n, V_{n+1} pairs, as light as before (a tail
    // check per block spilled the d 256 producer's 40 registers).
    auto load_k = [&](int nk) {
      acquire(smem.pipe_k, state_k, Tr::kKBytes, leader, Wait::KEmpty, tile);
      if (leader) copy_k(nk);
      ++state_k;
    };
    auto load_v = [&](int nv) {
      acquire(smem.pipe_v, state_v, Tr::kVBytes, leader, Wait::VEmpty, tile);
      if (leader) copy_v(nv);
      ++state_v;
    };
    // With a third V stage (FwdTraits::kStagesV), V_{n+1}'s slot (V_{n+4}'s) frees about a step
    // before K_n's (K_{n+2}'s), though a step releases its V only after its P.V: V_{n+1} goes first,
    // the pairs become V_{n+1}, K_n (the rightmost V right after Q). Issued after K_n, it waited for
    // K_n's slot, and in the timing model the third stage bought nothing (attn_logic.h fwd_v_stages).
    constexpr bool kVFirst = Tr::kStagesV > Tr::kStages;
    if (!kVFirst && n - 1 >= w.blocks.begin) load_k(n - 1);
    // Rows past seqlen_k in the first (rightmost) block lie inside the tensor with a kv cache or
    // packed sequences; batched tensors end at seqlen_k, where TMA fills zeros. FP8 takes no kv
    // cache, and its packed vt (fp8.pack_v_fp8_varlen) holds zeros past each sequence's used keys
    // (seqused_k), between sequences and past cu_seqlens_k[-1]; the next sequence's columns are
    // finite (e4m3 v must be finite).
    const int valid_rows = w.seq.seqlen_k - n * Tr::kBlockN;
    const bool rows_past_end_in_tensor = p.seqused_k != nullptr || p.cu_seqlens_k != nullptr;
    // (The 2-CTA kernel never gets such a call: fwd/launch.cuh clusters batched keys without
    // seqused_k only; a block loaded by one CTA alone would leave the peer's full barrier short.)
    if (!Tr::kFp8 && kClusterM == 1 && rows_past_end_in_tensor && valid_rows < Tr::kBlockN) {
      if constexpr (!Tr::kFp8) load_v_zero_tail(params, smem, tVgV(_, n), tVsV, state_v, valid_rows, tail_phase, leader, tile);
      ++state_v;
    } else {
      load_v(n);
    }
    if constexpr (kVFirst) {
      for (n -= 1; n >= w.blocks.begin; --n) {
        load_k(n);
        load_v(n);
      }
    } else {
      for (n -= 2; n >= w.blocks.begin; --n) {
        load_k(n);
        load_v(n + 1);
      }
      if (w.blocks.begin < w.blocks.end - 1) load_v(w.blocks.begin);
    }
  }
};

template <class Tr>
struct FwdConsumer {
  using Element = typename Tr::Element;
  using PipelineKV = typename Tr::PipelineKV;
  using PipelineV = typename Tr::PipelineV;
  using PipelineState = typename Tr::PipelineState;
  using PipelineStateV = typename Tr::PipelineStateV;
  using SharedStorage = typename Tr::SharedStorage;
  static constexpr int kPingpongThreads = 2 * 128;  // the waiting warpgroup + the one that releases it
  static constexpr int kRows = Tr::kRowsPerThread;
  using Fp8 = FwdFp8Steps<Tr, FwdConsumer>;  // the e4m3 kernel's steps (fp8_steps.cuh)
  // Key blocks of 24k keys (bf16 d 96): the masked loops' run bounds in the R2P-friendly layout,
  // made once per tile (softmax.cuh spread_runs). Packed GQA rows (decode) take theirs per token.
  static constexpr bool kSpreadMask = !Tr::kDecode && spread_mask_fits<Tr::kBlockN / 4>();
  // An attention chunk's per-row bounds in the forward (Tr::kChunk): made once per tile
  // (chunk_runs: a floored division per row), each key block then takes one shift off them. Made
  // per block (apply_mask's chunk path) they cost ~110-130 more instructions a masked block (SASS,
  // d 256 chunk tile: 596 / 448 against 466 / 341).
  static constexpr bool kChunkRuns = Tr::kChunk && !Tr::kDecode;
  // The previous tile's epilogue runs while this tile's first Q.K^T is on the tensor cores
  // (fwd_kernel passes it to compute as `pending`): the tile boundary's store no longer leaves
  // them idle. Only where O has its own buffer (FwdTraits::kOwnOBuffer: each warp stores its rows
  // alone, and each warpgroup takes its next tile alone), so one warpgroup's store does not wait
  // for the other's last P.V; the others store after compute.
  static constexpr bool kOverlapEpilogue = Tr::kOwnOBuffer;

  // Pingpong: warpgroup c may issue GEMMs once the previous warpgroup (ring order) has issued its own.
  static __device__ __forceinline__ void pingpong_wait(int consumer, int tile) {
    named_sync(kPingpongThreads, Tr::kBarPingpong0 + consumer, Wait::Pingpong, tile);
  }
  static __device__ __forceinline__ void pingpong_pass(int consumer) {
    const int next = consumer + 1 == Tr::kNumConsumers ? 0 : consumer + 1;
    named_arrive(kPingpongThreads, Tr::kBarPingpong0 + next);
  }
  // Once at start: the last warpgroup acts as if it had just issued, releasing warpgroup 0.
  static __device__ __forceinline__ void pingpong_start(int consumer) {
    if (consumer == Tr::kNumConsumers - 1) pingpong_pass(consumer);
  }

  // Everything one consumer thread holds across the key blocks of a tile (besides O).
  struct Frags {
    typename Tr::TiledMmaS mma_s;
    typename Tr::TiledMmaO mma_o;
    // P (16-bit or e4m3) in the A-operand register layout of P.V, written from S's accumulator.
    decltype(cute::make_tensor<Element>(typename Tr::LayoutP{})) tOrP;
    OnlineSoftmax<kRows, Tr::kFp8 ? 8 : 0> softmax;
    float scale_o[kRows];  // factor for O before (or after) the next P.V
    bool rescale;          // whether O needs it (false: the running maxes stayed, scale_o is stale)
    // FP8 (set by Fp8): this slab's q descale, the v descale of the block whose P is in tOrP, and
    // q_descale * k_descale of the block whose S is in flight (read before its WGMMA is waited on);
    // o_unit, vd_max: O's registers hold O / o_unit (FwdFp8Steps::Fold); k_next / v_next: the next block's
    // k and v descales, read a step ahead from the tile's descale rows k_row / v_row.
    float q_descale, v_descale_p, s_descale, o_unit, vd_max, k_next, v_next;
    int k_row, v_row;
    // Decode with ALiBi: the rows' terms (alibi_rows), once per tile: a packed row's head and token
    // take a division, which the key loop should not repeat.
    float alibi_slope[Tr::kDecode && Tr::kAlibi ? kRows : 1];
    int alibi_diag[Tr::kDecode && Tr::kAlibi ? kRows : 1];
    // kSpreadMask: the rows' runs relative to the next right / window masked block (spread_runs).
    SpreadRuns<kSpreadMask ? kRows : 1> runs;
    // kChunkRuns: the rows' chunk-aware runs, as counts of this thread's columns before their ends
    // in key block 0 (thread_cols_before; block n takes n * kBlockN / 4 off: kBlockN % 8 == 0).
    int chunk_lo[kChunkRuns ? kRows : 1], chunk_hi[kChunkRuns ? kRows : 1];
    uint32_t pin_slot;  // this thread's overlap_pin slot (pin_before_wait), an S2R and a LEA a step if recomputed
  };

  // S = softcap/mask/online softmax of one key block, left as 16-bit P in fr.tOrP (FA3's order: all
  // row maxes first, then the exponentials, so the exponentials can run under the P.V WGMMA).
  // kExpCols: the columns of each row whose exponentials are taken here (the rest: exp_rest, after
  // the wait for the P.V in flight; step's kPinCols).
  template <Masking kMask, bool kFirst, int kExpCols = Tr::kBlockN / 4, class TensorS, class TensorCS, class F>
  static __device__ __forceinline__ void softmax_block(typename Tr::KernelParams const& params, TensorS& tSrS,
                                                       TensorCS const& tScS_rc, const WorkTile& w, int n, F& fr) {
    using namespace cute;
    constexpr bool kMasked = kMask != Masking::none;
    Tensor s_rc = make_tensor(tSrS.data(), acc_rowcol(tSrS.layout()));
    // FP8: the scores' descale, applied here only before a score mod (softcap); otherwise folded
    // into the max and the exponentials (Fp8::descale_or_fold).
    [[maybe_unused]] float fold = 1.f;
    if constexpr (Tr::kFp8) fold = Fp8::descale_or_fold(tSrS, fr, params.mod.active());
    const int row0 = w.coord.m_block * Tr::kBlockM;
    if (params.mod.active()) {  // softcap / ALiBi (common/score_mod.h)
      const ScoreMod& mod = params.mod;
      if constexpr (!Tr::kAlibi) {  // softcap only (kAlibi)
        float slope[1];
        int diag[1];
        apply_score_mod<false>(s_rc, tScS_rc, mod, 0, slope, diag);
      } else if constexpr (Tr::kDecode) {  // packed GQA rows: their terms were computed once per tile
        apply_score_mod(s_rc, tScS_rc, mod, n * Tr::kBlockN, fr.alibi_slope, fr.alibi_diag);
      } else {
        float slope[kRows];
        int diag[kRows];
        alibi_rows<false>(slope, diag, tScS_rc, mod, row0, w.mask.offset(), w.coord.batch, w.coord.head);
        apply_score_mod(s_rc, tScS_rc, mod, n * Tr::kBlockN, slope, diag);
      }
    }
    static_assert(Tr::kBlockN % 8 == 0, "apply_mask takes a key block origin that is a multiple of 8");
    if constexpr (kChunkRuns && (kMask == Masking::chunk || kMask == Masking::both)) {
      if (kMask == Masking::chunk || w.mask.chunk > 0) {
        const int shift = n * Tr::kBlockN / 4;
        CUTE_UNROLL
        for (int mi = 0; mi < kRows; ++mi)
          fill_outside_run(s_rc, mi, fr.chunk_lo[mi] - shift, fr.chunk_hi[mi] - shift, -INFINITY);
      } else
        apply_mask<false, Masking::window>(s_rc, tScS_rc, w.mask, row0, n * Tr::kBlockN);
    } else if constexpr (kMasked && Tr::kDecode)  // packed GQA rows: the mask acts on their tokens
      apply_mask<true, kMask, Tr::kChunk>(s_rc, tScS_rc, w.mask, row0, n * Tr::kBlockN, params.mod.group);
    else if constexpr (kSpreadMask && (kMask == Masking::right || kMask == Masking::window)) {
      apply_mask_spread<kMask>(s_rc, fr.runs);  // runs relative to block n, then to block n - 1
      fr.runs.template advance<Tr::kBlockN>(1);
    } else if constexpr (kMasked)
      apply_mask<false, kMask>(s_rc, tScS_rc, w.mask, row0, n * Tr::kBlockN);
    // An unmasked block: every row sees all its keys, so the new row max is finite (rows past
    // seqlen_q may be NaN; they are never stored) and the -inf guards can go.
    if constexpr (Tr::kFp8) {
      static_assert(kExpCols == Tr::kBlockN / 4, "FP8 takes all its exponentials at once");
      fr.rescale = fr.softmax.template rescale_max<kFirst, kMasked, false>(s_rc, fr.scale_o, fold);
      fr.softmax.template exp_and_sum<kMasked>(s_rc, fold);
    } else {
      fr.rescale = fr.softmax.template rescale_max<kFirst, kMasked, true>(s_rc, fr.scale_o);
      fr.softmax.template exp_and_sum_cols<0, kExpCols, kMasked>(s_rc);
    }
  }
  // The exponentials softmax_block<..., kExpCols> left: columns [kExpCols, end) of each row.
  template <Masking kMask, int kExpCols, class TensorS, class F>
  static __device__ __forceinline__ void exp_rest(TensorS& tSrS, F& fr) {
    using namespace cute;
    Tensor s_rc = make_tensor(tSrS.data(), acc_rowcol(tSrS.layout()));
    fr.softmax.template exp_and_sum_cols<kExpCols, Tr::kBlockN / 4, kMask != Masking::none>(s_rc);
  }

  // kChunkRuns: each row's visible keys [key_floor(row), last_key(row + 1)) as this thread's column
  // counts in key block 0 (the counts apply_mask's chunk path makes per block).
  template <class TensorCS, class F>
  static __device__ __forceinline__ void chunk_runs(F& fr, TensorCS const& tScS_rc, const Mask& mask, int row0) {
    using namespace cute;
    const int tcol = get<1>(tScS_rc(0, 0));
    CUTE_UNROLL
    for (int mi = 0; mi < kRows; ++mi) {
      const int row = row0 + get<0>(tScS_rc(mi, 0));
      fr.chunk_lo[mi] = thread_cols_before(mask.key_floor(row) - tcol);
      fr.chunk_hi[mi] = thread_cols_before(mask.last_key(row + 1) - tcol);
    }
  }

  template <class TensorS, class TensorP>
  static __device__ __forceinline__ void store_p_to(TensorS const& tSrS, TensorP& tOrP) {
    using namespace cute;
    if constexpr (Tr::kFp8) {
      Fp8::store_p_to(tSrS, tOrP);
    } else {
      // tOrP is S's registers re-read as the A operand (same offsets): convert pairwise in place of
      // a whole converted fragment and a 16-bit copy (~200 instructions at block_n 128, 32 F2FP now).
      convert_pairs_into<Element>(tSrS, tOrP);
    }
  }
  template <class TensorS, class F>
  static __device__ __forceinline__ void store_p(TensorS const& tSrS, F& fr) {
    store_p_to(tSrS, fr.tOrP);
  }

  template <class TensorO>
  static __device__ __forceinline__ void rescale_o(TensorO& tOrO, const float (&scale)[kRows]) {
    using namespace cute;
    Tensor o_rc = make_tensor(tOrO.data(), acc_rowcol(tOrO.layout()));
    CUTE_UNROLL
    for (int mi = 0; mi < kRows; ++mi) {
      CUTE_UNROLL
      for (int ni = 0; ni < size<1>(o_rc); ++ni) o_rc(mi, ni) *= scale[mi];
    }
  }

  // ptxas places the wait for an in-flight WGMMA (WARPGROUP.DEPBAR) where its latency model says
  // the GEMM is done, which is above the softmax meant to run under it (0 of 64 exponentials
  // overlapped). It keeps the wait below earlier shared-memory stores, so one store of a value
  // that depends on every exponential of the step (the row sums) pins the wait after all of them.
  // The slot is per thread and never read.
  static __device__ __forceinline__ uint32_t pin_slot(SharedStorage& smem) {
    return cute::cast_smem_ptr_to_uint(&smem.overlap_pin[consumer_thread_idx()]);
  }
  static __device__ __forceinline__ uint32_t pin_slot(SharedStorage&, Frags const& fr) { return fr.pin_slot; }
  template <class F>  // other consumers' fragments (decode/mla_mainloop.cuh)
  static __device__ __forceinline__ uint32_t pin_slot(SharedStorage& smem, F const&) { return pin_slot(smem); }
  // kPart: the exponentials were split (Tr::kPinCols): pin on the first part's running sums, so the
  // wait follows those exponentials only and the rest may run after it.
  template <bool kPart = false, class F>
  static __device__ __forceinline__ void pin_before_wait(SharedStorage& smem, F const& fr) {
    float sum = 0.f;
    CUTE_UNROLL
    for (int mi = 0; mi < kRows; ++mi) sum += kPart ? fr.softmax.part[mi] : fr.softmax.row_sum[mi];
    asm volatile("st.shared.f32 [%0], %1;" ::"r"(pin_slot(smem, fr)), "f"(sum) : "memory");
  }

  template <class Storage, class State>
  static __device__ __forceinline__ void wait_full(Storage& pipe, State const& s, Wait what, int tile) {
    mbarrier_wait(Tr::full_barrier(pipe, s.index()), s.phase(), what, tile);
  }

  // One key block n with intra-warpgroup overlap: issue S_n, issue O += P_{n+1} V_{n+1}, then the
  // softmax of S_n while that P.V runs; P_n replaces P_{n+1} only after the P.V has finished.
  template <Masking kMask, class TensorO, class TQ, class TK, class TV, class TensorCS, class F>
  static __device__ __forceinline__ void step(typename Tr::KernelParams const& params, SharedStorage& smem,
                                              PipelineKV& pipe_k, PipelineV& pipe_v, PipelineState& state_k,
                                              PipelineStateV& state_v, const WorkTile& w, int n, int consumer,
                                              TQ const& tSrQ, TK const& tSrK, TV const& tOrV, TensorCS const& tScS_rc,
                                              TensorO& tOrO, F& fr) {
    using namespace cute;
    Tensor tSrS = partition_fragment_C(fr.mma_s, Shape<typename Tr::BlkM, typename Tr::BlkN>{});
    wait_full(smem.pipe_k, state_k, Wait::KFull, w.index);
    pingpong_wait(consumer, w.index);
    gemm_async<true>(fr.mma_s, tSrQ, tSrK(_, _, _, state_k.index()), tSrS);
    if constexpr (Tr::kRescaleOBeforeGemm)
      if (fr.rescale) rescale_o(tOrO, fr.scale_o);
    wait_full(smem.pipe_v, state_v, Wait::VFull, w.index);
    gemm_async<false>(fr.mma_o, fr.tOrP, tOrV(_, _, _, state_v.index()), tOrO);
    pingpong_pass(consumer);
    warpgroup_wait<1>();  // S_n is ready; P.V still running
    pipe_k.consumer_release(state_k);
    ++state_k;
    // The exponentials of the first kPinCols columns run under the P.V; the wait for it follows
    // them (pinned), the rest run after it, beside P's conversion (FwdTraits::kPinCols).
    constexpr int kPinCols = Tr::kPinCols;
    constexpr bool kSplit = kPinCols < Tr::kBlockN / 4;
    softmax_block<kMask, false, kPinCols>(params, tSrS, tScS_rc, w, n, fr);
    pin_before_wait<kSplit>(smem, fr);
    warpgroup_wait<0>();  // P.V done: O and the P registers may be touched again
    pipe_v.consumer_release(state_v);
    ++state_v;
    if constexpr (kSplit) exp_rest<kMask, kPinCols>(tSrS, fr);
    store_p(tSrS, fr);
    if constexpr (!Tr::kRescaleOBeforeGemm)
      if (fr.rescale) rescale_o(tOrO, fr.scale_o);
  }

  template <Masking kMask, class TensorO, class TQ, class TK, class TV, class TensorCS, class F>
  static __device__ __forceinline__ void any_step(typename Tr::KernelParams const& params, SharedStorage& smem,
                                                  PipelineKV& pipe_k, PipelineV& pipe_v, PipelineState& state_k,
                                                  PipelineStateV& state_v, const WorkTile& w, int n, int consumer,
                                                  TQ const& tSrQ, TK const& tSrK, TV const& tOrV,
                                                  TensorCS const& tScS_rc, TensorO& tOrO, F& fr) {
    if constexpr (Tr::kFp8 && !Tr::kFastAccum) {
      Fp8::template step<kMask>(params, smem, pipe_k, pipe_v, state_k, state_v, w, n, consumer, tSrQ, tSrK, tOrV, tScS_rc, tOrO, fr);
    } else {
      if constexpr (Tr::kFp8) Fp8::next_scores(params, fr, n);  // fast accumulation: the 16-bit step
      step<kMask>(params, smem, pipe_k, pipe_v, state_k, state_v, w, n, consumer, tSrQ, tSrK, tOrV, tScS_rc, tOrO, fr);
    }
  }

  // No previous tile's O to store (compute's default `pending`).
  struct NothingPending {
    template <class TensorO>
    __device__ __forceinline__ void operator()(TensorO const&, const float (&)[kRows]) const {}
  };

  // Runs the mainloop of one tile. On return tOrO holds O normalized by the row sums (0 for rows
  // that saw no key) and lse the natural-log LSE of the thread's rows. Q's buffer has been released
  // to the producer (q_free) as soon as the last Q.K^T finished. On entry tOrO and lse may still
  // hold the previous tile's results: `pending(tOrO, lse)` (kOverlapEpilogue) stores them while
  // the first Q.K^T runs, before tOrO is cleared.
  template <class TensorO, class Pending = NothingPending>
  static __device__ __forceinline__ void compute(typename Tr::KernelParams const& params, SharedStorage& smem,
                                                 PipelineKV& pipe_k, PipelineV& pipe_v, PipelineState& state_k,
                                                 PipelineStateV& state_v, const WorkTile& w, int tile_count,
                                                 int consumer, TensorO& tOrO, float (&lse)[kRows],
                                                 Pending const& pending = Pending{}) {
    constexpr bool kPending = !cute::is_same_v<Pending, NothingPending>;
    static_assert(!kPending || kOverlapEpilogue, "the e4m3 and decode kernels store after compute");
    using namespace cute;
    const int tidx = consumer_thread_idx();
    Frags fr;
    auto thr_s = fr.mma_s.get_thread_slice(tidx);
    // The operand descriptors depend on the warpgroup only: slicing by the warp-uniform `consumer`
    // (not the opaque tidx) keeps them in uniform registers, not rebuilt (R2UR) for every WGMMA
    // (Tr::kUniformOperandSlices says where that costs spills instead).
    const int slice_idx = Tr::kUniformOperandSlices ? consumer * 128 : tidx;
    auto wg_s = fr.mma_s.get_thread_slice(slice_idx);
    auto wg_o = fr.mma_o.get_thread_slice(slice_idx);

    Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), typename Tr::SmemLayoutQ{});
    Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), typename Tr::SmemLayoutK{});
    Tensor sVt = make_tensor(make_smem_ptr(smem.v.data()), typename Tr::SmemLayoutVt{});
    Tensor tSrQ = wg_s.partition_fragment_A(sQ);   // (MMA, MMA_M, MMA_K) descriptors
    Tensor tSrK = wg_s.partition_fragment_B(sK);   // (MMA, MMA_N, MMA_K, stages)
    Tensor tOrV = wg_o.partition_fragment_B(sVt);  // (MMA, MMA_N, MMA_K, stages)

    // (row, col) coordinates of this thread's S values within the tile.
    Tensor cS = make_identity_tensor(Shape<typename Tr::BlkM, typename Tr::BlkN>{});
    Tensor tScS = thr_s.partition_C(cS);
    Tensor tScS_rc = make_tensor(tScS.data(), acc_rowcol(tScS.layout()));

    fr.softmax.init(params.mod.scale_log2);
    fr.pin_slot = pin_slot(smem);
    if constexpr (Tr::kDecode && Tr::kAlibi)
      alibi_rows<true>(fr.alibi_slope, fr.alibi_diag, tScS_rc, params.mod, w.coord.m_block * Tr::kBlockM,
                       w.mask.offset(), w.coord.batch, w.head_k);
    if constexpr (kChunkRuns) {
      if (w.mask.chunk > 0) chunk_runs(fr, tScS_rc, w.mask, w.coord.m_block * Tr::kBlockM);
    }
    if constexpr (!kPending) clear(tOrO);
    if constexpr (Tr::kFp8) Fp8::init(params, w, consumer, fr);

    // Q of this tile (the tile_count-th tile with work of this CTA).
    mbarrier_wait(&smem.q_full, tile_count & 1, Wait::QFull, w.index);

    // First block (rightmost, always masked unless the whole range is unmasked): S only.
    {
      const int n = w.blocks.end - 1;
      Tensor tSrS = partition_fragment_C(fr.mma_s, Shape<typename Tr::BlkM, typename Tr::BlkN>{});
      wait_full(smem.pipe_k, state_k, Wait::KFull, w.index);
      pingpong_wait(consumer, w.index);
      gemm_async<true>(fr.mma_s, tSrQ, tSrK(_, _, _, state_k.index()), tSrS);
      pingpong_pass(consumer);
      if constexpr (kPending) {
        pending(tOrO, lse);  // the previous tile's epilogue, under this Q.K^T
        clear(tOrO);
      }
      warpgroup_wait<0>();
      pipe_k.consumer_release(state_k);
      ++state_k;
      if (n >= w.unmasked.end || n < w.unmasked.begin) {
        softmax_block<Masking::both, true>(params, tSrS, tScS_rc, w, n, fr);
      } else {
        softmax_block<Masking::none, true>(params, tSrS, tScS_rc, w, n, fr);
      }
      store_p(tSrS, fr);  // O is still 0: no rescale needed (scale_o is 1)
    }

    // Right masked blocks (causal diagonal, seqlen_k tail), then the unmasked middle, then the left
    // masked blocks of a sliding window. Without a left bound (causal, or a seqlen_k tail) the right
    // blocks' mask has one bound per row: its own loop (FA3 makes that a separate kernel). Not in
    // the decode kernel: packed GQA rows take each row's bounds anyway, and a third masked loop
    // spilled its d 192 / 256 registers. An attention chunk (kernels with Tr::kChunk; the others'
    // masks have chunk 0) is a left bound too, with per-row bounds: in the forward, masked loops of
    // its own, so the sliding window's carry no chunk branch; the decode's packed rows take each
    // token's bounds anyway (apply_mask's kRowRuns).
    int n = w.blocks.end - 2;
    if constexpr (kSpreadMask)
      fr.runs = spread_runs<kRows>(tScS_rc, w.mask, w.coord.m_block * Tr::kBlockM, n * Tr::kBlockN);
    const bool chunked = Tr::kChunk && !Tr::kDecode && w.mask.chunk > 0;
    if (!Tr::kDecode && w.mask.left < 0 && w.mask.chunk == 0) {
#pragma unroll 1
      for (; n >= w.blocks.begin && n >= w.unmasked.end; --n)
        any_step<Masking::right>(params, smem, pipe_k, pipe_v, state_k, state_v, w, n, consumer, tSrQ, tSrK, tOrV, tScS_rc, tOrO, fr);
    } else if (chunked) {
#pragma unroll 1
      for (; n >= w.blocks.begin && n >= w.unmasked.end; --n)
        any_step<Masking::chunk>(params, smem, pipe_k, pipe_v, state_k, state_v, w, n, consumer, tSrQ, tSrK, tOrV, tScS_rc, tOrO, fr);
    } else {
#pragma unroll 1
      for (; n >= w.blocks.begin && n >= w.unmasked.end; --n)
        any_step<Masking::window>(params, smem, pipe_k, pipe_v, state_k, state_v, w, n, consumer, tSrQ, tSrK, tOrV, tScS_rc, tOrO, fr);
    }
    [[maybe_unused]] const int n_unmasked = n;  // kSpreadMask: the runs skip the unmasked blocks
#pragma unroll 1
    for (; n >= w.blocks.begin && n >= w.unmasked.begin; --n)
      any_step<Masking::none>(params, smem, pipe_k, pipe_v, state_k, state_v, w, n, consumer, tSrQ, tSrK, tOrV, tScS_rc, tOrO, fr);
    if constexpr (kSpreadMask) fr.runs.template advance<Tr::kBlockN>(n_unmasked - n);
    if (chunked) {
#pragma unroll 1
      for (; n >= w.blocks.begin; --n)
        any_step<Masking::chunk>(params, smem, pipe_k, pipe_v, state_k, state_v, w, n, consumer, tSrQ, tSrK, tOrV, tScS_rc, tOrO, fr);
    } else {
#pragma unroll 1
      for (; n >= w.blocks.begin; --n)
        any_step<Masking::window>(params, smem, pipe_k, pipe_v, state_k, state_v, w, n, consumer, tSrQ, tSrK, tOrV, tScS_rc, tOrO, fr);
    }

    // Every Q.K^T of this tile has completed (each step waited for its S): Q's buffer is free.
    cutlass::arch::ClusterBarrier::arrive(&smem.q_free);

    if constexpr (Tr::kFp8 && !Tr::kFastAccum) {
      Fp8::finish(params, smem, pipe_v, state_v, w, consumer, tOrV, tOrO, fr, lse);
      return;
    }

    // Last P.V.
    if constexpr (Tr::kRescaleOBeforeGemm)
      if (fr.rescale) rescale_o(tOrO, fr.scale_o);
    wait_full(smem.pipe_v, state_v, Wait::VFull, w.index);
    pingpong_wait(consumer, w.index);
    gemm_async<false>(fr.mma_o, fr.tOrP, tOrV(_, _, _, state_v.index()), tOrO);
    pingpong_pass(consumer);
    float inv_sum[kRows];
    fr.softmax.finalize(inv_sum, lse);
    warpgroup_wait<0>();
    pipe_v.consumer_release(state_v);
    ++state_v;
    if constexpr (Tr::kFp8) Fp8::fast_finish(fr, inv_sum);  // v's descale with the row sums
    rescale_o(tOrO, inv_sum);  // every block's rescale is already in O
    if constexpr (Tr::kFp8) Fp8::scale_columns(params.p, w, tOrO);
  }
};

}  // namespace flash3
