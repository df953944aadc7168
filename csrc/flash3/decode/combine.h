// The split-KV combine of the decode kernels: split s of a row wrote o_s (normalized over its own
// keys, fp32) and lse_s; the row's result is lse = m + log(sum_s exp(lse_s - m)) with m the largest
// lse_s (0 when all are -inf, so no inf - inf), out = sum_s exp(lse_s - lse) o_s, and out = 0,
// lse = -inf for a row no split saw (flash3/reference/__init__.py combine_splits is the specification).
// Attention sinks (sinks non-null, one fp32 logit per head): the sink is one more term of the
// logsumexp with no value (m also covers it), so lse includes it and a row no split saw gets out 0,
// lse = sink.
// Plain C++ (no torch, no CUDA headers): the binding fills CombineParams.
#pragma once

#include <cstdint>

namespace flash3 {

struct CombineParams {
  const float* o_partial;    // (num_splits, b, s_q, h, d_v), contiguous
  const float* lse_partial;  // (num_splits, b, h, s_q), contiguous
  void* out;                 // (b, s_q, h, d_v), element strides, d_v contiguous; bf16 or fp16
  int64_t o_batch_stride, o_row_stride, o_head_stride;
  float* lse;                // (b, h, s_q) with strides, or nullptr
  int64_t lse_batch_stride, lse_head_stride;
  int num_splits, batch, seqlen_q, num_heads, head_dim_v;
  bool is_bf16;
  const float* sinks = nullptr;  // (num_heads) fp32 logits, or nullptr
  // Packed (varlen) queries combined as one batch of total_q rows: rows t >= *seq_end (device int32,
  // cu_seqlens_q[b]) belong to no sequence and are not written (the caller filled out 0, lse -inf).
  const int* seq_end = nullptr;
};

// Launches the combine on `stream` (a cudaStream_t). Returns 0 or a cudaError_t value.
int run_combine(const CombineParams& params, void* stream);

}  // namespace flash3
