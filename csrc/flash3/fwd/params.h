// Plain description of one forward call, shared by the torch binding (fwd_binding.cpp) and the
// kernels. No torch and no CUDA headers here: kernel TUs include it without pulling in torch.
#pragma once
#include <cstdint>

namespace flash3 {

// One fp32 descale per (batch, head, index); element strides, any of which may be 0 (broadcast).
// A null pointer means 1.
struct Descale {
  const float* ptr = nullptr;
  int64_t batch_stride = 0, head_stride = 0, index_stride = 0;
  int count = 1;  // entries along the index: a longer sequence than max_seqlen reads the last one
#if defined(__CUDACC__)
  __host__ __device__
#endif
  float at(int batch, int head, int index) const {
    index = index < count ? index : count - 1;
    return ptr == nullptr ? 1.f : ptr[batch * batch_stride + head * head_stride + index * index_stride];
  }
};

// The FP8 kernel's descales (fwd/fp8_steps.cuh): x = x8 * descale.
//  q: per 64-row slab, index = row / 64;  k, v: per key block of the kernel's tile, index = key / block_n
//  (v's is folded into the two-level accumulation);  v_channel: per column of O, index = column.
struct Fp8Descales {
  Descale q, k, v, v_channel;
  // Fast accumulation (FwdTraits::kFastAccum): P.V accumulates over every key block in the WGMMA
  // accumulator; v then has one descale per (batch, kv head) (count 1), applied with the row sums.
  bool fast_accum = false;
};

struct FwdParams {
  // Tensors. Element strides; the last (head) dim is contiguous for every tensor, except the FP8
  // kernel's v, which is Vt (b, h_k, d_v, tokens) with tokens contiguous (permuted within every 16,
  // flash3/fp8_quant.py V_PERM16): there v_row_stride is the stride of the d_v index.
  // Batched: q (b, s_q, h, d), k (b, s_k, h_k, d), v (b, s_k, h_k, d_v), o (b, s_q, h, d_v).
  // Varlen: the batch stride is unused and rows are offset by cu_seqlens_{q,k}[batch].
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  float* lse = nullptr;  // batched: (b, h, s_q); varlen: (h, total_q)
  int64_t q_batch_stride = 0, q_row_stride = 0, q_head_stride = 0;
  int64_t k_batch_stride = 0, k_row_stride = 0, k_head_stride = 0;
  int64_t v_batch_stride = 0, v_row_stride = 0, v_head_stride = 0;
  int64_t o_batch_stride = 0, o_row_stride = 0, o_head_stride = 0;
  int64_t lse_batch_stride = 0, lse_head_stride = 0;

  // Shapes. For varlen, seqlen_q/seqlen_k are the max lengths (max_seqlen_*), total_* the packed sizes.
  int batch = 0, seqlen_q = 0, seqlen_k = 0, num_heads = 0, num_heads_k = 0;
  int head_dim = 0, head_dim_v = 0;
  int total_q = 0, total_k = 0;

  // Optional per-batch lengths (device pointers, int32).
  const int* cu_seqlens_q = nullptr;  // (b + 1): varlen queries
  const int* cu_seqlens_k = nullptr;  // (b + 1): varlen keys
  const int* seqused_k = nullptr;     // (b): keys actually used per batch row (kv cache)
  // (b), varlen q only (not the FP8 or decode kernels, no sinks): sequence i's queries are its first
  // seqused_q[i] packed rows (clamped into [0, its packed length]); its other packed rows get O = 0
  // and LSE = -inf (FA3's seqused_q). Masks are aligned on the used count.
  const int* seqused_q = nullptr;

  // Semantics (see attn_logic.h): window -1 = unbounded; causal means window_right = 0.
  float softmax_scale = 1.f;
  float softcap = 0.f;  // 0 = off
  bool is_causal = false;
  int window_left = -1, window_right = -1;
  // Chunked local attention (FA3's attention_chunk, Llama 4): 0 = off, else query row i (diagonal
  // p = i + seqlen_k - seqlen_q) also sees only keys in [p - p mod c, p - p mod c + c), p mod c
  // floored (attn_logic.h Mask). The 16-bit forward kernels and the decode kernels (16-bit and
  // FP8 caches; tokens' positions, keys counted from cache_leftpad), not FP8 (FwdTraits::kChunk).
  int attention_chunk = 0;

  // Attention sinks (gpt-oss): one fp32 logit per query head, in the space of softmax_scale * q.k
  // after softcap, joining every row's softmax denominator with no value: the epilogue stores
  // lse' = logaddexp(lse, sink) and O * exp(lse - lse') (a row that sees no key: O = 0, lse' = sink).
  // Split-KV partials stay sink-free; the combine adds the sink once (decode/combine.h).
  const float* sinks = nullptr;  // (num_heads) fp32 logits; null = none

  // ALiBi (common/score_mod.h): fp32 slopes, slope of (batch, head) at
  // alibi_slopes[batch * alibi_batch_stride + head] (stride 0: (h,), num_heads: (b, h); varlen and
  // packed queries: batch = sequence). Adds -slope * |i + seqlen_k - seqlen_q - j| to the logits.
  const float* alibi_slopes = nullptr;  // null = none
  int64_t alibi_batch_stride = 0;

  bool is_bf16 = true;  // else fp16 (the FP8 kernel: inputs e4m3, output bf16)
  Fp8Descales fp8;

  // KV cache (the decode kernels, FwdTraits::kDecode). k and v are caches of num_slabs slabs of
  // slab_rows rows: (b, capacity, h_k, d) without a page table (slab = batch row), else
  // (num_pages, page_size, h_k, d) with key position pos of batch row b in slab
  // page_table[b * page_table_stride + pos / slab_rows], row pos % slab_rows. seqused_k (required)
  // holds each row's key count; seqlen_k is the most any row can hold (capacity, or max_pages *
  // page_size), and seqused_k is clamped to it. A page id outside [0, num_slabs) reads as zeros.
  const int* page_table = nullptr;
  int64_t page_table_stride = 0;
  int slab_rows = 0, num_slabs = 0;
  // FA3's cache_leftpad (b) int32, null = none: row b's keys are positions [leftpad, seqused_k) of
  // its cache, key j at position leftpad + j (masks and ALiBi count keys from there). The kernel
  // clamps leftpad into [0, clamped seqused_k] (scheduler.cuh apply_cache_leftpad: SeqInfo::offset_k).
  const int* cache_leftpad = nullptr;
  // Packed GQA: the num_heads / num_heads_k query heads of a kv head are rows of one tile.
  // Split-KV (num_splits > 1): split s of a row writes its O normalized over its own keys, fp32,
  // to o_partial (num_splits, b, s_q, h, d_v) and its LSE to lse_partial (num_splits, b, h, s_q),
  // both contiguous; combine.cu merges them into o and lse.
  int num_splits = 1;
  float* o_partial = nullptr;
  float* lse_partial = nullptr;
  // FP8 (e4m3) cache (FwdTraits::kFp8Cache; k/v point at e4m3 bytes, strides in bytes): the stored
  // x8 at (slab, row, kv head) of batch entry b stands for
  // x8 * descale[slab * index_stride + b * batch_stride + head * head_stride], rounded once to q's
  // dtype in shared memory: fp32 per (slab, kv head) (batch_stride 0), or per (batch entry, kv head)
  // (index_stride 0; FA3's descales, a page shared by rows read with each row's own).
  Descale k_cache_descale, v_cache_descale;
  // MLA (FA3's qv; the decode kernel for d_v > 256, decode/mla_*.cuh only): qv (b, s_q, h, d_v), or
  // (total_q, h, d_v) with cu_seqlens_q, in q's dtype; null = none. Scores are
  // softmax_scale * (q.k + qv.v): v's rows are both the values and qv's keys.
  const void* qv = nullptr;
  int64_t qv_batch_stride = 0, qv_row_stride = 0, qv_head_stride = 0;

  // Launch resources filled by the binding.
  int num_sms = 132;
  int l2_bytes = 50 << 20;
  int* tile_counter = nullptr;  // zeroed int32 in device memory when fwd_uses_dynamic_scheduler()
};

// Causal, local and varlen calls take their tiles from an atomic counter (tiles differ in cost, so a
// static stride leaves SMs idle); the caller passes a zeroed int32 in device memory as tile_counter.
// Uniform (full, batched) calls keep the static stride: no atomics, no hand-off between roles.
// The decode kernels (a KV cache: slab_rows > 0) keep the static stride: their few tiles are one
// wave, and the gathering producer warps walk the tile sequence without a hand-off.
inline bool fwd_uses_dynamic_scheduler(const FwdParams& p) {
  if (p.slab_rows > 0) return false;
  return p.is_causal || p.window_left >= 0 || p.window_right >= 0 || p.attention_chunk > 0 ||
         p.cu_seqlens_q != nullptr;
}

}  // namespace flash3
