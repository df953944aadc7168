// The backward main kernel: one CTA per (key block, kv head, batch), grid (key blocks, h_k, b) with
// key blocks fastest, the last first in deterministic mode (that order: attn_logic.h bwd_dq_rank).
//  Warpgroup 0 (24 registers): warp 0 loads K and V once, then per step Q + lse and dO + dpsum
//   through two mbarrier rings (TMA, bulk copies); warp 1 writes dQ: it sums each step's staged
//   fp32 dQ tile into the global accumulator with one bulk reduce-add per consumer warpgroup's part
//   (ordered by a semaphore per query block in deterministic mode).
//  Warpgroups 1, 2 (240 registers): the five products of traits.cuh per step of 64 queries; dK and
//   dV stay in registers over every step (every query head of the kv head: GQA sums there) and are
//   stored at the end.
// A step (d <= 128): S^T and dP^T are issued together (warpgroup 1 after warpgroup 0); P =
// exp2(S^T * scale - lse) runs while dP^T is in flight; dS = P (dP - dpsum); dV += P^T dO is issued
// from registers and runs while dS goes to shared memory; then dQ = dS K (both warpgroups' dS) and
// dK += dS^T Q (warpgroup 0 issues dK before dQ's barrier, warpgroup 1 after dQ: its dQ is staged
// for the writer warp while dK runs). split_d issues dV and dK after dS's store and dQ after both
// (BwdTraits::kOverlap).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "flash3/bwd/traits.cuh"
#include "flash3/common/barriers.cuh"
#include "flash3/common/indexing.cuh"
#include "flash3/common/softmax.cuh"
#include "flash3/common/wgmma.cuh"

namespace flash3 {

// One batch entry as the backward sees it (cu_seqlens clamped into the packed tensors).
struct BwdSeq {
  int offset_q, seqlen_q, offset_k, seqlen_k;
  int64_t ws_head_stride, ws_base;  // workspace row of (head 0, query 0); add head * ws_head_stride
};

__device__ __forceinline__ BwdSeq bwd_seq(const BwdParams& p, int batch) {
  BwdSeq s;
  const int64_t padded = bwd_padded_rows(p);
  if (p.cu_seqlens_q != nullptr) {
    packed_rows(p.cu_seqlens_q, batch, p.total_q, s.offset_q, s.seqlen_q);
    s.ws_head_stride = padded;
    s.ws_base = padded_seq_offset(s.offset_q, batch, kBwdBlockM);
  } else {
    s.offset_q = 0;
    s.seqlen_q = p.seqlen_q;
    s.ws_head_stride = padded;
    s.ws_base = int64_t(batch) * p.num_heads * padded;
  }
  if (p.cu_seqlens_k != nullptr) {
    packed_rows(p.cu_seqlens_k, batch, p.total_k, s.offset_k, s.seqlen_k);
  } else {
    s.offset_k = 0;
    s.seqlen_k = p.seqlen_k;
  }
  // A sequence longer than max_seqlen (a bad call with validation off) is cut there: the grids,
  // the semaphores and the per-row workspace are sized by it.
  s.seqlen_q = imin(s.seqlen_q, p.seqlen_q);
  s.seqlen_k = imin(s.seqlen_k, p.seqlen_k);
  // Queries past seqused_q are no queries: every kernel treats them as the workspace's padding rows
  // (the producer zeroes their Q/dO, the postprocess writes no dq for them).
  if (p.seqused_q != nullptr) s.seqlen_q = imin(imax(p.seqused_q[batch], 0), s.seqlen_q);
  return s;
}

__device__ __forceinline__ Mask bwd_mask(const BwdParams& p, const BwdSeq& s) {
  return Mask::make(s.seqlen_q, s.seqlen_k, p.is_causal, p.window_left, p.window_right, p.attention_chunk);
}

// Sets the entries of a transposed (key, query) accumulator that the mask hides to `fill`: the
// queries that see a key are one run (first_query, last_query), so the forward's per-row bit mask
// serves (fill_outside_run). Keys past seqlen_k see no query: each row computes its own bounds.
// An attention chunk cuts the run to the key's chunk (a runtime branch; keys are >= 0 here, so
// the chunk start is an unsigned division).
template <class TensorS, class TensorC>
__device__ __forceinline__ void apply_mask_transposed(TensorS& s_rc, TensorC const& coord_rc, const Mask& mask,
                                                      int key0, int query0, float fill) {
  using namespace cute;
  check_rowcol_layout<decltype(coord_rc.layout())>();
  const int tc = query0 + get<1>(coord_rc(0, 0));  // this thread's first query column
  CUTE_UNROLL
  for (int mi = 0; mi < size<0>(s_rc); ++mi) {
    const int key = key0 + get<0>(coord_rc(mi, 0));
    int lo = mask.window_first_query(key), hi = mask.window_last_query(key);
    if (mask.chunk > 0) {
      const int start = int(unsigned(key) / unsigned(mask.chunk)) * mask.chunk - mask.offset();
      lo = imax(lo, start);
      hi = imin(hi, start + mask.chunk);
    }
    fill_outside_run(s_rc, mi, thread_cols_before(lo - tc), thread_cols_before(hi - tc), fill);
  }
}

__device__ __forceinline__ void bulk_reduce_add_f32(float* gmem, const float* smem, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(gmem),
               "r"(cute::cast_smem_ptr_to_uint(smem)), "r"(bytes)
               : "memory");
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}

template <class Tr>
struct BwdKernel {
  using Element = typename Tr::Element;
  using SharedStorage = typename Tr::SharedStorage;
  using PipelineQ = typename Tr::PipelineQ;
  using PipelineDo = typename Tr::PipelineDo;
  using StateQ = typename Tr::PipelineState;
  using StateDo = typename Tr::PipelineStateDo;
  // Tr::kOverlap (d, d_v <= 128): a step overlaps dV with dS's math and dK with dQ's staging
  // (step()). split_d keeps the serial order: its dQ accumulator needs P's and dS's registers dead
  // first.

  // What every role derives alike from the block index.
  struct Work {
    int n_block, head_k, batch, group;
    BwdSeq seq;
    Mask mask;
    BlockRange queries;   // query blocks that see this key block
    BlockRange unmasked;  // of which these need no mask
  };

  static __device__ __forceinline__ Work work(const BwdParams& p) {
    Work w;
    w.n_block = bwd_key_block(int(blockIdx.x), int(gridDim.x), p.deterministic);
    w.head_k = int(blockIdx.y);
    w.batch = int(blockIdx.z);
    w.group = p.num_heads / p.num_heads_k;
    w.seq = bwd_seq(p, w.batch);
    w.mask = bwd_mask(p, w.seq);
    w.queries = query_block_range(w.mask, w.n_block, Tr::kBlockM, Tr::kBlockN);
    w.unmasked = unmasked_query_block_range(w.mask, w.n_block, Tr::kBlockM, Tr::kBlockN);
    return w;
  }

  // ------------------------------------------------------------------------ producer (warp 0)
  // Varlen: a tile's rows past its sequence's end lie inside the packed tensor (the next sequence,
  // or unused rows after cu_seqlens[-1], possibly NaN/Inf). They would reach real gradients as
  // 0 * NaN: K/V rows past seqlen_k through dP = V dO^T and dQ = dS K (dS = P (dP - dpsum) with
  // P = 0), Q/dO rows past seqlen_q through dK = dS^T Q and dV = P^T dO. (Batched tensors end at the
  // sequence end, where TMA fills zeros.) Such a tile is loaded under the producer's own `tail`
  // barrier, those rows are zeroed, then the consumers' barrier gets the arrival (publish).
  // Order: the wait on `tail` makes the TMA's bytes visible to this warp; the zeros follow; the proxy
  // fence orders them before the consumers' WGMMA (async proxy) reads; __syncwarp, then the arrive
  // (release) that the consumers' wait (acquire) observes. lse/dpsum of those rows come from the
  // workspace padding (+inf / 0: P = 0, dS = 0).

  // Rows [valid, kRows) of a K-major tile to 0, in whole 16-byte chunks (the swizzle moves chunks
  // within a row, never splits one).
  template <int kRows, int kCols, class STile>
  static __device__ __forceinline__ void zero_rows(STile&& s, int valid) {
    constexpr int kChunks = kCols * int(sizeof(Element)) / 16;
    constexpr int kPerChunk = 16 / int(sizeof(Element));
#pragma unroll 1  // the producer runs on 24 registers (setmaxnreg): an unrolled loop spills
    for (int i = int(threadIdx.x % 32); i < (kRows - valid) * kChunks; i += 32) {
      const int r = valid + i / kChunks, c = (i % kChunks) * kPerChunk;
      *reinterpret_cast<uint4*>(&s(r, c)) = make_uint4(0, 0, 0, 0);
    }
  }

  static __device__ __forceinline__ void wait_own_load(SharedStorage& smem, uint32_t& tail_phase, int tile) {
    mbarrier_wait(&smem.tail, tail_phase, Wait::RowTail, tile);
    tail_phase ^= 1;
  }

  // After the zeroing: the consumers' barrier `full` gets the arrival the TMA did not make.
  static __device__ __forceinline__ void publish(uint64_t* full, bool leader) {
    compiler_fence();  // the stores stay above the fence (CUTLASS's asm has no memory clobber)
    cutlass::arch::fence_view_async_shared();  // generic stores -> the consumers' WGMMA (async proxy)
    __syncwarp();
    if (leader) cutlass::arch::ClusterBarrier::arrive(full);
  }

  // One query block of Q (with its lse row) or dO (with its dpsum row) into `stage` of its ring: the
  // TMA tile and the bulk copy of the row's floats complete on the stage's full barrier or, for a
  // varlen tile running past its sequence, on `tail`, and then its rows past `valid` are zeroed and
  // the full barrier published.
  template <int kCols, class Ring, class Tma, class TSrc, class TDst, class STile>
  static __device__ __forceinline__ void load_query_block(SharedStorage& smem, Ring& ring, int stage, uint32_t phase,
                                                          Wait empty_wait, uint32_t bytes, Tma const& tma,
                                                          TSrc const& src, TDst&& dst, STile&& tile,
                                                          const float* row_floats, float* smem_floats, bool zero,
                                                          int valid, bool leader, uint32_t& tail_phase, int m) {
    mbarrier_wait(empty_barrier(ring, stage), phase, empty_wait, m);
    uint64_t* full = full_barrier(ring, stage);
    uint64_t* bar = zero ? &smem.tail : full;
    if (leader) {
      cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(bar, bytes);
      cute::copy(tma.with(*bar), src, dst);
      cute::SM90_BULK_COPY_G2S::copy(row_floats, bar, smem_floats, Tr::kBlockM * sizeof(float));
    }
    if (zero) {
      wait_own_load(smem, tail_phase, m);
      zero_rows<Tr::kBlockM, kCols>(tile, valid);
      publish(full, leader);
    }
  }

  static __device__ __forceinline__ void produce(typename Tr::KernelParams const& params, SharedStorage& smem,
                                                 const Work& w) {
    using namespace cute;
    const BwdParams& p = params.p;
    const bool leader = cute::elect_one_sync();
    const int bq = p.cu_seqlens_q != nullptr ? 0 : w.batch;
    const int bk = p.cu_seqlens_k != nullptr ? 0 : w.batch;
    Tensor mK = params.tma_k.get_tma_tensor(params.shape_k);
    Tensor mV = params.tma_v.get_tma_tensor(params.shape_v);
    Tensor gK = local_tile(domain_offset(make_coord(w.seq.offset_k, _0{}), mK(_, _, w.head_k, bk)),
                           Shape<typename Tr::BlkN, typename Tr::HD>{}, make_coord(w.n_block, _0{}));
    Tensor gV = local_tile(domain_offset(make_coord(w.seq.offset_k, _0{}), mV(_, _, w.head_k, bk)),
                           Shape<typename Tr::BlkN, typename Tr::HDV>{}, make_coord(w.n_block, _0{}));
    Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), typename Tr::SmemLayoutK{});
    Tensor sV = make_tensor(make_smem_ptr(smem.v.data()), typename Tr::SmemLayoutV{});
    auto tk = tma_partition(params.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
    auto tv = tma_partition(params.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV), group_modes<0, 2>(gV));
    uint32_t tail_phase = 0;
    const int valid_k = w.seq.seqlen_k - w.n_block * Tr::kBlockN;
    const bool zero_kv = p.cu_seqlens_k != nullptr && valid_k < Tr::kBlockN;
    uint64_t* kv_bar = zero_kv ? &smem.tail : &smem.kv_full;
    if (leader) {
      cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(kv_bar, Tr::kKVBytes);
      copy(params.tma_k.with(*kv_bar), get<0>(tk), get<1>(tk));
      copy(params.tma_v.with(*kv_bar), get<0>(tv), get<1>(tv));
    }
    if (zero_kv) {
      wait_own_load(smem, tail_phase, w.n_block);
      zero_rows<Tr::kBlockN, Tr::kHeadDim>(sK, valid_k);
      zero_rows<Tr::kBlockN, Tr::kHeadDimV>(sV, valid_k);
      publish(&smem.kv_full, leader);
    }

    Tensor mQ = params.tma_q.get_tma_tensor(params.shape_q);
    Tensor mDo = params.tma_do.get_tma_tensor(params.shape_do);
    Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), typename Tr::SmemLayoutQ{});
    Tensor sDo = make_tensor(make_smem_ptr(smem.dout.data()), typename Tr::SmemLayoutDo{});
    StateQ sq = cutlass::make_producer_start_state<PipelineQ>();
    StateDo sd = cutlass::make_producer_start_state<PipelineDo>();
    for (int head = w.head_k * w.group; head < (w.head_k + 1) * w.group; ++head) {
      Tensor gQ = local_tile(domain_offset(make_coord(w.seq.offset_q, _0{}), mQ(_, _, head, bq)),
                             Shape<typename Tr::BlkM, typename Tr::HD>{}, make_coord(_, _0{}));
      Tensor gDo = local_tile(domain_offset(make_coord(w.seq.offset_q, _0{}), mDo(_, _, head, bq)),
                              Shape<typename Tr::BlkM, typename Tr::HDV>{}, make_coord(_, _0{}));
      auto tq = tma_partition(params.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
      auto td = tma_partition(params.tma_do, _0{}, Layout<_1>{}, group_modes<0, 2>(sDo), group_modes<0, 2>(gDo));
      const int64_t ws_row = w.seq.ws_base + int64_t(head) * w.seq.ws_head_stride;
      for (int m = w.queries.begin; m < w.queries.end; ++m) {
        const int valid_q = w.seq.seqlen_q - m * Tr::kBlockM;
        const bool zero_q = p.cu_seqlens_q != nullptr && valid_q < Tr::kBlockM;
        load_query_block<Tr::kHeadDim>(smem, smem.pipe_q, sq.index(), sq.phase(), Wait::QEmpty, Tr::kQBytes,
                                       params.tma_q, get<0>(tq)(_, m), get<1>(tq)(_, sq.index()),
                                       sQ(_, _, sq.index()), p.lse_log2 + ws_row + m * Tr::kBlockM,
                                       smem.lse[sq.index()], zero_q, valid_q, leader, tail_phase, m);
        ++sq;
        load_query_block<Tr::kHeadDimV>(smem, smem.pipe_do, sd.index(), sd.phase(), Wait::DoEmpty, Tr::kDoBytes,
                                        params.tma_do, get<0>(td)(_, m), get<1>(td)(_, sd.index()),
                                        sDo(_, _, sd.index()), p.dpsum + ws_row + m * Tr::kBlockM,
                                        smem.dpsum[sd.index()], zero_q, valid_q, leader, tail_phase, m);
        ++sd;
      }
    }
  }

  template <class Storage>
  static __device__ __forceinline__ uint64_t* full_barrier(Storage& s, int stage) {
    return reinterpret_cast<uint64_t*>(&s.full_barrier_[stage]);
  }
  template <class Storage>
  static __device__ __forceinline__ uint64_t* empty_barrier(Storage& s, int stage) {
    return reinterpret_cast<uint64_t*>(&s.empty_barrier_[stage]);
  }

  // ------------------------------------------------------------------------ dQ writer (warp 1)
  static __device__ __forceinline__ void write_dq(const BwdParams& p, SharedStorage& smem, const Work& w) {
    const int lane = int(threadIdx.x % 32);
    const int m_blocks = ceil_div(p.seqlen_q, Tr::kBlockM);
    const int steps = w.group * w.queries.size();
    int step = 0;
    for (int head = w.head_k * w.group; head < (w.head_k + 1) * w.group; ++head) {
      const int64_t ws_row = w.seq.ws_base + int64_t(head) * w.seq.ws_head_stride;
      for (int m = w.queries.begin; m < w.queries.end; ++m, ++step) {
        float* dst = p.dq_accum + (ws_row + int64_t(m) * Tr::kBlockM) * Tr::kHeadDim;
        int* sem = p.dq_semaphore + (int64_t(w.batch) * p.num_heads + head) * m_blocks + m;
        // Tr::kOverlap: each warpgroup hands over its own part of the tile (its own barrier pair), so
        // one that is ahead never waits for the other at the hand-off.
#pragma unroll 1
        for (int g = 0; g < Tr::kDqParts; ++g) {
          named_sync(Tr::kDqHandoffThreads, Tr::kBarDqFull + g, Wait::DqFull, m);
          if (lane == 0) {
            if (p.deterministic && g == 0) {
              const int rank = bwd_dq_rank(w.mask, m, w.n_block, Tr::kBlockM, Tr::kBlockN);
              // The turns before ours are other CTAs' (microseconds each): poll with a sleep
              // doubling from 32 ns to 256 ns, leaving the issue slots and the L2 to the work we
              // wait for, and waking at most ~256 ns late.
              unsigned sleep_ns = 32;
              for (;;) {
                int seen;
                asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(seen) : "l"(sem) : "memory");
                if (seen == rank) break;
                __nanosleep(sleep_ns);
                sleep_ns = sleep_ns < 256 ? 2 * sleep_ns : 256;
              }
              asm volatile("fence.proxy.async.global;\n" ::: "memory");
            }
            bulk_reduce_add_f32(dst + g * Tr::kDqPart, smem.dq.data() + g * Tr::kDqPart, Tr::kDqPart * sizeof(float));
            if (p.deterministic && g + 1 == Tr::kDqParts) {
              // The sum (both parts) is complete in global memory before the next key block may add.
              asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
              asm volatile("fence.proxy.async.global;\n" ::: "memory");
              __threadfence();
              atomicAdd(sem, 1);
            } else {
              asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
            }
          }
          __syncwarp();
          if (step + 1 < steps) named_arrive(Tr::kDqHandoffThreads, Tr::kBarDqEmpty + g);
        }
      }
    }
    if (lane == 0) asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
  }

  // ------------------------------------------------------------------------ consumers
  struct Frags {
    typename Tr::TiledMmaS mma_s;
    typename Tr::TiledMmaDp mma_dp;
    typename Tr::TiledMmaDv mma_dv;
    typename Tr::TiledMmaDk mma_dk;
    typename Tr::TiledMmaDq mma_dq;
  };

  // The per-query values (lse or dpsum) of a thread's score columns, read from shared memory into
  // registers: read while the WGMMA that needs them runs, their latency (behind the WGMMAs' operand
  // traffic) is hidden; read after its wait, each step waited for them.
  template <int kCols, class TensorC>
  static __device__ __forceinline__ cute::array<float, kCols> column_values(TensorC const& coord_rc,
                                                                          const float* rows) {
    cute::array<float, kCols> v;
    CUTE_UNROLL
    for (int ni = 0; ni < kCols; ++ni) v[ni] = rows[cute::get<1>(coord_rc(0, ni))];
    return v;
  }

  // P = exp2(S^T scale - lse) in place (lse already in the log2 domain, +inf for rows without keys
  // and padding rows: P = 0 there). Without softcap; masked entries were set to -inf.
  template <class TensorS, class Cols>
  static __device__ __forceinline__ void exp_scores(TensorS& s_rc, Cols const& lse,
                                                    float scale_log2) {
    using namespace cute;
    CUTE_UNROLL
    for (int ni = 0; ni < size<1>(s_rc); ++ni) {
      CUTE_UNROLL
      for (int mi = 0; mi < size<0>(s_rc); ++mi) s_rc(mi, ni) = exp2f(s_rc(mi, ni) * scale_log2 - lse[ni]);
    }
  }

  // dS = P (dP - dpsum) in dP's registers.
  template <class TensorP, class TensorDp, class Cols>
  static __device__ __forceinline__ void grad_scores(TensorP const& p_rc, TensorDp& dp_rc, Cols const& dpsum) {
    using namespace cute;
    CUTE_UNROLL
    for (int ni = 0; ni < size<1>(dp_rc); ++ni) {
      CUTE_UNROLL
      for (int mi = 0; mi < size<0>(dp_rc); ++mi) dp_rc(mi, ni) = p_rc(mi, ni) * (dp_rc(mi, ni) - dpsum[ni]);
    }
  }

  // The score mod (common/score_mod.h: softcap, ALiBi): logit = transform(s) + position term,
  // P = exp2(logit scale_log2 - lse), dS = P (dP - dpsum) grad_factor(t), in one pass once both S^T
  // and dP^T are done (t is not kept: that would be 32 more registers). S^T's rows are keys key0 + r,
  // its columns queries query0 + c; offset = seqlen_k - seqlen_q; raw_slope: the head's ALiBi slope
  // in raw units (kAlibi).
  template <bool kAlibi, class TensorS, class TensorDp, class TensorC>
  static __device__ __forceinline__ void modded_scores(const ScoreMod& mod, TensorS& s_rc, TensorDp& dp_rc,
                                                       TensorC const& coord_rc, const float* lse, const float* dpsum,
                                                       int key0, int query0, int offset, float raw_slope) {
    using namespace cute;
    const int tq = get<1>(coord_rc(0, 0));  // this thread's first query column
    CUTE_UNROLL
    for (int ni = 0; ni < size<1>(s_rc); ++ni) {
      const int col = get<1>(coord_rc(0, ni));
      const float l = lse[col], dd = dpsum[col];
      CUTE_UNROLL
      for (int mi = 0; mi < size<0>(s_rc); ++mi) {
        const float t = mod.transform(s_rc(mi, ni));
        float logit = t;
        if constexpr (kAlibi) {
          const int key = key0 + get<0>(coord_rc(mi, 0));
          logit += ScoreMod::position(raw_slope, float(query0 + tq + offset - key) + float(col - tq));
        }
        const float pv = exp2f(logit * mod.scale_log2 - l);
        s_rc(mi, ni) = pv;
        dp_rc(mi, ni) = pv * (dp_rc(mi, ni) - dd) * mod.grad_factor(t);
      }
    }
  }

  // One-hot rows (the reference's ONE_HOT_TOL says why): where a query row that sees exactly one
  // key has P within 2^-14 of 1 there, P = 1 and, without dlse, dS = 0 (its softmax is 1, D is that
  // key's dP), instead of P = 1 +- 1e-6 from the lse round trip and dS = dP - D of a few ulps. Such
  // rows exist only in masked steps (their key block holds keys they cannot see); one_key_step
  // tells the steps that may hold one.
  template <class TensorS, class TensorDs, class TensorC>
  static __device__ __forceinline__ void one_hot_rows(TensorS& p_rc, TensorDs& ds_rc, TensorC const& coord_rc,
                                                      const Mask& mask, int query0, bool zero_ds) {
    using namespace cute;
    CUTE_UNROLL
    for (int ni = 0; ni < size<1>(p_rc); ++ni) {
      if (mask.key_count(query0 + get<1>(coord_rc(0, ni))) != 1) continue;
      CUTE_UNROLL
      for (int mi = 0; mi < size<0>(p_rc); ++mi) {
        if (fabsf(p_rc(mi, ni) - 1.f) <= 0x1p-14f) {  // masked entries are 0, NaN stays
          p_rc(mi, ni) = 1.f;
          if (zero_ds) ds_rc(mi, ni) = 0.f;
        }
      }
    }
  }

  // Whether some row of the query block at query0 sees at most one key: as key_count is concave,
  // the minimum over the block is at its first or last row. Per step, the same in every thread.
  // With an attention chunk key_count is not concave (a row at a chunk start under causal sees one
  // key): every masked step may hold such rows, and one_hot_rows checks each row.
  static __device__ __forceinline__ bool one_key_step(const Mask& mask, int query0) {
    const int last = imin(query0 + Tr::kBlockM, mask.seqlen_q) - 1;
    return mask.chunk > 0 || imin(mask.key_count(query0), mask.key_count(last)) <= 1;
  }

  // ptxas hoists the wait for dP^T above the exponentials meant to run under it (5 of 32 stayed
  // there); it keeps the wait below earlier shared-memory stores, so storing a value that depends on
  // every P pins it after all of them (fwd/mainloop.cuh pin_before_wait). The slot is never read.
  template <class TensorS>
  static __device__ __forceinline__ void pin_before_wait(SharedStorage& smem, TensorS const& s_rc) {
    float sum = 0.f;
    CUTE_UNROLL
    for (int i = 0; i < cute::size(s_rc); ++i) sum += s_rc(i);
    const uint32_t slot = cute::cast_smem_ptr_to_uint(&smem.overlap_pin[consumer_thread_idx()]);
    asm volatile("st.shared.f32 [%0], %1;" ::"r"(slot), "f"(sum) : "memory");
  }

  // dS^T from the accumulator layout to shared memory by stmatrix: an 8x8 matrix's row is 8 queries
  // of one key, 16 contiguous bytes of the MN-major dS (its swizzle moves whole 16-byte chunks), so
  // four instructions store a thread's 32 values where 16-bit generic stores took 32 and 32 address
  // registers.
  static __device__ __forceinline__ auto ds_store_copy(Frags const& fr) {
    return cute::make_tiled_copy_C(cute::Copy_Atom<cute::SM90_U32x4_STSM_N, Element>{}, fr.mma_s);
  }

  template <class TensorAcc>
  static __device__ __forceinline__ void stage_dq(SharedStorage& smem, TensorAcc const& acc, int wg, int lt) {
    float* dst = smem.dq.data() + wg * Tr::kDqValues * 128 + lt;
    CUTE_UNROLL
    for (int i = 0; i < Tr::kDqValues; ++i) dst[i * 128] = acc(i);
  }

  // One step: query block m of query head `head`.
  template <class TK, class TV, class TQ, class TDo, class TDoT, class TQT, class TDs, class TKT, class TDsStore,
            class TensorCS, class TensorDV, class TensorDK>
  static __device__ __forceinline__ void step(typename Tr::KernelParams const& params, SharedStorage& smem,
                                              PipelineQ& pipe_q, PipelineDo& pipe_do, StateQ& sq, StateDo& sd,
                                              const Work& w, int head, int m, int step_idx, int wg, int lt, Frags& fr,
                                              TK const& tSrK, TQ const& tSrQ, TV const& tdPrV, TDo const& tdPrDo,
                                              TDoT const& tdVrDo, TQT const& tdKrQ, TDs const& tdQrDs,
                                              TKT const& tdQrK, TDsStore& tSsDs, TensorCS const& tScS_rc,
                                              TensorDV& dv, TensorDK& dk) {
    using namespace cute;
    const int key0 = w.n_block * Tr::kBlockN + (Tr::kSplitD ? 0 : 64 * wg);
    const int query0 = m * Tr::kBlockM;
    const bool masked = m < w.unmasked.begin || m >= w.unmasked.end;

    Tensor tSrS = partition_fragment_C(fr.mma_s, Shape<typename Tr::Slab, typename Tr::BlkM>{});
    Tensor tdPrdP = partition_fragment_C(fr.mma_dp, Shape<typename Tr::Slab, typename Tr::BlkM>{});
    Tensor s_rc = make_tensor(tSrS.data(), acc_rowcol(tSrS.layout()));
    Tensor dp_rc = make_tensor(tdPrdP.data(), acc_rowcol(tdPrdP.layout()));

    // Tr::kOverlap: warpgroup 1 issues its S^T and dP^T after warpgroup 0's, so the tensor pipe runs
    // them in that order instead of interleaved: warpgroup 0's P and dS math runs under warpgroup
    // 1's products, and its dV and dK fill the pipe while warpgroup 1 computes dS (interleaved, both
    // warpgroups reached their dS math at once and the pipe idled there).
    if (Tr::kOverlap && wg == 1) named_sync(Tr::kNumConsumerThreads, Tr::kBarIssueOrder, Wait::Pingpong, m);
    mbarrier_wait(full_barrier(smem.pipe_q, sq.index()), sq.phase(), Wait::QFull, m);
    gemm_async<true>(fr.mma_s, tSrK, tSrQ(_, _, _, sq.index()), tSrS);
    mbarrier_wait(full_barrier(smem.pipe_do, sd.index()), sd.phase(), Wait::DoFull, m);
    gemm_async<true>(fr.mma_dp, tdPrV, tdPrDo(_, _, _, sd.index()), tdPrdP);
    if (Tr::kOverlap && wg == 0) named_arrive(Tr::kNumConsumerThreads, Tr::kBarIssueOrder);
    const float* lse = smem.lse[sq.index()];
    const float* dpsum = smem.dpsum[sd.index()];
    if (!params.mod.active()) {
      constexpr int kCols = decltype(size<1>(s_rc))::value;
      const auto lse_r = column_values<kCols>(tScS_rc, lse);  // under S^T's WGMMA
      warpgroup_wait<1>();  // S^T is ready; dP^T still running
      if (masked) apply_mask_transposed(s_rc, tScS_rc, w.mask, key0, query0, -INFINITY);
      exp_scores(s_rc, lse_r, params.mod.scale_log2);
      const auto dpsum_r = column_values<kCols>(tScS_rc, dpsum);  // under dP^T's
      pin_before_wait(smem, s_rc);
      warpgroup_wait<0>();
      grad_scores(s_rc, dp_rc, dpsum_r);
    } else {
      warpgroup_wait<0>();
      if (params.mod.has_alibi())
        modded_scores<true>(params.mod, s_rc, dp_rc, tScS_rc, lse, dpsum, key0, query0, w.mask.offset(),
                            params.mod.alibi_raw_slope(w.batch, head));
      else
        modded_scores<false>(params.mod, s_rc, dp_rc, tScS_rc, lse, dpsum, key0, query0, 0, 0.f);
      if (masked) {
        apply_mask_transposed(s_rc, tScS_rc, w.mask, key0, query0, 0.f);
        apply_mask_transposed(dp_rc, tScS_rc, w.mask, key0, query0, 0.f);
      }
    }
    if (masked && one_key_step(w.mask, query0))
      one_hot_rows(s_rc, dp_rc, tScS_rc, w.mask, query0, params.p.dlse == nullptr);

    // P^T and dS^T in 16 bits, in the A-operand layout of dV and dK (same registers).
    Tensor p16 = convert_fragment<Element>(tSrS);
    Tensor tOrP = make_tensor(p16.data(), typename Tr::LayoutP{});
    // Tr::kOverlap: dV = P^T dO runs under dS's conversion and store (issued earlier, under P's
    // exponentials, it left ptxas too few registers: C7512, serialized WGMMA).
    if constexpr (Tr::kOverlap) gemm_async<false>(fr.mma_dv, tOrP, tdVrDo(_, _, _, sd.index()), dv);
    Tensor ds16 = convert_fragment<Element>(tdPrdP);
    Tensor tOrDs = make_tensor(ds16.data(), typename Tr::LayoutP{});

    // dS to shared memory (this step's buffer) for the dQ product of both warpgroups.
    const int buf = step_idx & 1;
    if (!Tr::kSplitD || wg == 0) {
      auto ds_copy = ds_store_copy(fr);
      copy(ds_copy, ds_copy.get_thread_slice(lt).retile_S(ds16), tSsDs(_, _, _, buf));
      compiler_fence();  // the stores stay above the fence (CUTLASS's asm has no memory clobber)
      cutlass::arch::fence_view_async_shared();  // generic stores -> the WGMMA's async proxy
    }

    Tensor dq = partition_fragment_C(fr.mma_dq, Shape<typename Tr::BlkM, Int<Tr::kDQCols>>{});
    Tensor ds_a = tdQrDs(_, _, _, buf);
    if constexpr (Tr::kOverlap) {
      // Warpgroup 0 (ahead) issues dK before dQ's barrier: it runs while warpgroup 1 computes dS.
      // Warpgroup 1 issues it after dQ: its dQ result is staged for the writer while dK runs.
      // Warpgroup 1 issues its dQ after warpgroup 0's, so warpgroup 0's dQ completes first and its
      // staging and next S^T run under warpgroup 1's dQ and dK. Warpgroup 0 learns that warpgroup
      // 1's dS is stored at kBarDsReady; warpgroup 1 that warpgroup 0's is at kBarDqIssued.
      if (wg == 0) {
        gemm_async<false>(fr.mma_dk, tOrDs, tdKrQ(_, _, _, sq.index()), dk);
        named_sync(Tr::kNumConsumerThreads, Tr::kBarDsReady, Wait::DsReady, m);
        gemm_async<true>(fr.mma_dq, ds_a, tdQrK, dq);
        named_arrive(Tr::kNumConsumerThreads, Tr::kBarDqIssued);
        warpgroup_wait<0>();
      } else {
        named_arrive(Tr::kNumConsumerThreads, Tr::kBarDsReady);
        named_sync(Tr::kNumConsumerThreads, Tr::kBarDqIssued, Wait::DsReady, m);
        gemm_async<true>(fr.mma_dq, ds_a, tdQrK, dq);
        gemm_async<false>(fr.mma_dk, tOrDs, tdKrQ(_, _, _, sq.index()), dk);
        warpgroup_wait<1>();  // dV and dQ are done: dO is free; dK still reads Q^T
      }
      pipe_do.consumer_release(sd);
      ++sd;
    } else {
      gemm_async<false>(fr.mma_dv, tOrP, tdVrDo(_, _, _, sd.index()), dv);
      gemm_async<false>(fr.mma_dk, tOrDs, tdKrQ(_, _, _, sq.index()), dk);
      named_sync(Tr::kNumConsumerThreads, Tr::kBarDsReady, Wait::DsReady, m);
      // split_d (d > 128): dQ's accumulator is d/4 >= 48 registers; P and dS must be dead first.
      warpgroup_wait<0>();
      gemm_async<true>(fr.mma_dq, ds_a, tdQrK, dq);
      warpgroup_wait<0>();
      pipe_q.consumer_release(sq);
      ++sq;
      pipe_do.consumer_release(sd);
      ++sd;
    }

    const int part = Tr::kDqParts > 1 ? wg : 0;
    if (step_idx > 0) named_sync(Tr::kDqHandoffThreads, Tr::kBarDqEmpty + part, Wait::DqEmpty, m);
    stage_dq(smem, dq, wg, lt);
    compiler_fence();
    cutlass::arch::fence_view_async_shared();  // generic stores -> the bulk reduce (async proxy)
    named_arrive(Tr::kDqHandoffThreads, Tr::kBarDqFull + part);
    if constexpr (Tr::kOverlap) {
      warpgroup_wait<0>();  // dK is done with Q^T (and with dS^T's registers)
      pipe_q.consumer_release(sq);
      ++sq;
    }
  }

  // dK (times softmax_scale) or dV of this warpgroup's keys and kCols columns from col0, straight
  // from registers: each pair of accumulator values is two adjacent columns of one row (32 bits).
  template <int kCols, class TensorAcc, class Mma>
  static __device__ __forceinline__ void store_grad(TensorAcc const& acc, Mma const& mma, int lt, Element* base,
                                                    int64_t row_stride, int key0, int col0, int rows, int cols,
                                                    float scale) {
    using namespace cute;
    Tensor tc = mma.get_thread_slice(lt).partition_C(make_identity_tensor(Shape<typename Tr::Slab, Int<kCols>>{}));
    static_assert(decltype(size(tc))::value == decltype(size(acc))::value, "accumulator coordinates");
    // Addresses from the thread's first coordinate: the offsets of the others are compile-time (a
    // thread's values lie on two rows), so no 64-bit row product per pair.
    const int row0 = key0 + get<0>(tc(0)), col_0 = col0 + get<1>(tc(0));
    Element* p0 = base + int64_t(row0) * row_stride + col_0;
    CUTE_UNROLL
    for (int i = 0; i < size(acc); i += 2) {
      const int dr = get<0>(tc(i)) - get<0>(tc(0)), dc = get<1>(tc(i)) - get<1>(tc(0));
      if (row0 + dr < rows && col_0 + dc < cols)  // one packed conversion per pair (two scalar ones cost twice the cvt slots)
        *reinterpret_cast<uint32_t*>(p0 + dr * row_stride + dc) = pack_pair<Element>(acc(i) * scale, acc(i + 1) * scale);
    }
  }

  static __device__ __forceinline__ void consume(typename Tr::KernelParams const& params, SharedStorage& smem,
                                                 PipelineQ& pipe_q, PipelineDo& pipe_do, const Work& w, int wg) {
    using namespace cute;
    const BwdParams& p = params.p;
    const int lt = consumer_thread_idx() % 128;
    Frags fr;
    auto thr_s = fr.mma_s.get_thread_slice(lt);
    auto thr_dp = fr.mma_dp.get_thread_slice(lt);
    auto thr_dv = fr.mma_dv.get_thread_slice(lt);
    auto thr_dk = fr.mma_dk.get_thread_slice(lt);
    auto thr_dq = fr.mma_dq.get_thread_slice(lt);
    const int slab = Tr::kSplitD ? 0 : wg;  // this warpgroup's 64 keys within the block
    const int half = Tr::kSplitD ? wg : 0;  // this warpgroup's dK/dV columns (split_d)

    Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), typename Tr::SmemLayoutK{});
    Tensor sV = make_tensor(make_smem_ptr(smem.v.data()), typename Tr::SmemLayoutV{});
    Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), typename Tr::SmemLayoutQ{});
    Tensor sDo = make_tensor(make_smem_ptr(smem.dout.data()), typename Tr::SmemLayoutDo{});
    Tensor sQt = make_tensor(make_smem_ptr(smem.q.data()), typename Tr::SmemLayoutQt{});
    Tensor sDot = make_tensor(make_smem_ptr(smem.dout.data()), typename Tr::SmemLayoutDot{});
    Tensor sKt = make_tensor(make_smem_ptr(smem.k.data()), typename Tr::SmemLayoutKt{});
    Tensor sDs = make_tensor(make_smem_ptr(smem.ds.data()), typename Tr::SmemLayoutDs{});
    Tensor sDst = make_tensor(make_smem_ptr(smem.ds.data()), typename Tr::SmemLayoutDst{});

    Tensor tSrK = thr_s.partition_fragment_A(
        local_tile(sK, Shape<typename Tr::Slab, typename Tr::HD>{}, make_coord(slab, _0{})));
    Tensor tSrQ = thr_s.partition_fragment_B(sQ);  // (MMA, MMA_N, MMA_K, stage)
    Tensor tdPrV = thr_dp.partition_fragment_A(
        local_tile(sV, Shape<typename Tr::Slab, typename Tr::HDV>{}, make_coord(slab, _0{})));
    Tensor tdPrDo = thr_dp.partition_fragment_B(sDo);
    Tensor tdVrDo = thr_dv.partition_fragment_B(local_tile(
        sDot, Shape<Int<Tr::kDVCols>, typename Tr::BlkM, Int<Tr::kStagesDo>>{}, make_coord(half, _0{}, _0{})));
    Tensor tdKrQ = thr_dk.partition_fragment_B(local_tile(
        sQt, Shape<Int<Tr::kDKCols>, typename Tr::BlkM, Int<Tr::kStagesQ>>{}, make_coord(half, _0{}, _0{})));
    Tensor tdQrDs = thr_dq.partition_fragment_A(sDs);  // (MMA, MMA_M, MMA_K, buffer)
    Tensor tdQrK = thr_dq.partition_fragment_B(
        local_tile(sKt, Shape<Int<Tr::kDQCols>, typename Tr::BlkN>{}, make_coord(wg, _0{})));
    // Where this thread's dS^T values go in the warpgroup's key slab, as stmatrix partitions them.
    Tensor tSsDs = ds_store_copy(fr).get_thread_slice(lt).partition_D(
        local_tile(sDst, Shape<typename Tr::Slab, typename Tr::BlkM, _2>{}, make_coord(slab, _0{}, _0{})));

    Tensor cS = make_identity_tensor(Shape<typename Tr::Slab, typename Tr::BlkM>{});
    Tensor tScS = thr_s.partition_C(cS);
    Tensor tScS_rc = make_tensor(tScS.data(), acc_rowcol(tScS.layout()));

    Tensor dv = partition_fragment_C(fr.mma_dv, Shape<typename Tr::Slab, Int<Tr::kDVCols>>{});
    Tensor dk = partition_fragment_C(fr.mma_dk, Shape<typename Tr::Slab, Int<Tr::kDKCols>>{});
    clear(dv);
    clear(dk);

    StateQ sq;
    StateDo sd;
    mbarrier_wait(&smem.kv_full, 0, Wait::KVFull, 0);
    int step_idx = 0;
    for (int head = w.head_k * w.group; head < (w.head_k + 1) * w.group; ++head) {
#pragma unroll 1
      for (int m = w.queries.begin; m < w.queries.end; ++m, ++step_idx)
        step(params, smem, pipe_q, pipe_do, sq, sd, w, head, m, step_idx, wg, lt, fr, tSrK, tSrQ, tdPrV, tdPrDo, tdVrDo,
             tdKrQ, tdQrDs, tdQrK, tSsDs, tScS_rc, dv, dk);
    }

    // Epilogue: this warpgroup's keys (rows) and columns of dK and dV.
    const int key0 = w.n_block * Tr::kBlockN + 64 * slab;
    Element* dk_base = static_cast<Element*>(p.dk) + int64_t(w.head_k) * p.dk_head_stride +
                       (p.cu_seqlens_k != nullptr ? int64_t(w.seq.offset_k) * p.dk_row_stride
                                                  : int64_t(w.batch) * p.dk_batch_stride);
    Element* dv_base = static_cast<Element*>(p.dv) + int64_t(w.head_k) * p.dv_head_stride +
                       (p.cu_seqlens_k != nullptr ? int64_t(w.seq.offset_k) * p.dv_row_stride
                                                  : int64_t(w.batch) * p.dv_batch_stride);
    store_grad<Tr::kDKCols>(dk, fr.mma_dk, lt, dk_base, p.dk_row_stride, key0, half * Tr::kDKCols, w.seq.seqlen_k, p.head_dim,
               p.softmax_scale);
    store_grad<Tr::kDVCols>(dv, fr.mma_dv, lt, dv_base, p.dv_row_stride, key0, half * Tr::kDVCols, w.seq.seqlen_k, p.head_dim_v,
               1.f);
  }
};

template <class Tr>
__global__ void __launch_bounds__(Tr::kNumThreads, 1)
    bwd_kernel(CUTE_GRID_CONSTANT typename Tr::KernelParams const params) {
  using namespace cute;
  using K = BwdKernel<Tr>;
  using PipelineQ = typename Tr::PipelineQ;
  using PipelineDo = typename Tr::PipelineDo;
  extern __shared__ __align__(1024) char smem_raw[];
  typename Tr::SharedStorage& smem = *reinterpret_cast<typename Tr::SharedStorage*>(smem_raw);

  const typename K::Work w = K::work(params.p);
  // A key block past this sequence's keys (varlen: the grid covers max_seqlen_k) has nothing to do.
  if (w.n_block * Tr::kBlockN >= w.seq.seqlen_k) return;

  const int warp_idx = cutlass::canonical_warp_idx_sync();
  const int warpgroup = warp_idx / 4;
  if (warp_idx == 0 && cute::elect_one_sync()) {
    cute::prefetch_tma_descriptor(params.tma_q.get_tma_descriptor());
    cute::prefetch_tma_descriptor(params.tma_do.get_tma_descriptor());
    cute::prefetch_tma_descriptor(params.tma_k.get_tma_descriptor());
    cute::prefetch_tma_descriptor(params.tma_v.get_tma_descriptor());
    cutlass::arch::ClusterTransactionBarrier::init(&smem.kv_full, 1);
    cutlass::arch::ClusterTransactionBarrier::init(&smem.tail, 1);
  }
  typename PipelineQ::Params pq;
  pq.role = warpgroup == 0 ? PipelineQ::ThreadCategory::Producer : PipelineQ::ThreadCategory::Consumer;
  pq.is_leader = threadIdx.x == 0;
  pq.num_consumers = Tr::kNumConsumerThreads;
  pq.num_producers = 1;
  pq.transaction_bytes = Tr::kQBytes;
  PipelineQ pipe_q(smem.pipe_q, pq, Shape<_1, _1, _1>{});
  typename PipelineDo::Params pd;
  pd.role = warpgroup == 0 ? PipelineDo::ThreadCategory::Producer : PipelineDo::ThreadCategory::Consumer;
  pd.is_leader = threadIdx.x == 0;
  pd.num_consumers = Tr::kNumConsumerThreads;
  pd.num_producers = 1;
  pd.transaction_bytes = Tr::kDoBytes;
  PipelineDo pipe_do(smem.pipe_do, pd, Shape<_1, _1, _1>{});

  debug_hang_init(Tr::kNumThreads);
  cutlass::arch::fence_barrier_init();
  __syncthreads();

  if (warpgroup == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Tr::kProducerRegs>();
    if (warp_idx == 0) K::produce(params, smem, w);
    else if (warp_idx == 1) K::write_dq(params.p, smem, w);
  } else {
    cutlass::arch::warpgroup_reg_alloc<Tr::kConsumerRegs>();
    K::consume(params, smem, pipe_q, pipe_do, w, warpgroup - 1);
  }
}

}  // namespace flash3
