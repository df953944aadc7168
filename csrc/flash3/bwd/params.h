// Plain description of one backward call, shared by the torch binding (bwd_binding.cpp) and the
// kernels. No torch and no CUDA headers.
//
// Workspace (fp32/int32, allocated by the binding, sized by bwd_workspace()): the per-row buffers
// have every sequence padded to a multiple of kBwdBlockM rows, so the main kernel reads whole
// 64-row blocks of them with bulk copies and never crosses into another sequence:
//   row r of batch entry b, head h  ->  ws_row(b, h, r) (batched: (b, h, s_q_pad); varlen:
//   (h, padded total) with sequence b at padded_seq_offset(cu_seqlens_q[b], b, kBwdBlockM)).
//   lse_log2  lse * log2(e), +inf for padding rows and rows that saw no key (P = 0 there);
//   dpsum     rowsum(dO * O) - dlse, 0 for padding rows;
//   dq_accum  head_dim floats per row, per 64-row block in the main kernel's fragment order
//             (bwd/kernel.cuh), zeroed by the preprocess, summed into by the main kernel, scaled
//             and converted into dq by the postprocess;
//   dq_semaphore  one int32 per (b, h, query block): deterministic mode's ordering counter.
//
// Attention sinks (gpt-oss: one fp32 logit per query head joining every row's softmax denominator,
// no value): the forward's lse already includes the sink, so P = exp(S - lse) and dpsum need
// nothing new and dq/dk/dv are unchanged. With `sinks` given the preprocess is followed by
// bwd_sink_grad_kernel (bwd/prepost.cuh), which writes
//   dsinks[h] = -sum over batch entries and real rows of head h of exp(sinks[h] - lse) * dpsum
// (0 where lse = -inf) in a fixed order: bitwise reproducible, no atomics.
#pragma once
#include <cstdint>

#include "flash3/common/attn_logic.h"

namespace flash3 {

struct BwdParams {
  // Inputs. Element strides, last dim contiguous. Batched: (b, s, heads, dim); varlen: (total, heads,
  // dim) with rows offset by cu_seqlens (batch strides unused). lse/dlse: batched (b, h, s_q),
  // varlen (h, total_q).
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* o = nullptr;
  const void* dout = nullptr;
  const float* lse = nullptr;
  const float* dlse = nullptr;  // optional: the gradient flowing into lse
  const float* sinks = nullptr;  // optional (num_heads,): attention sink logits (natural-log units)
  float* dsinks = nullptr;       // (num_heads,): their gradient; required with sinks
  int64_t q_batch_stride = 0, q_row_stride = 0, q_head_stride = 0;
  int64_t k_batch_stride = 0, k_row_stride = 0, k_head_stride = 0;
  int64_t v_batch_stride = 0, v_row_stride = 0, v_head_stride = 0;
  int64_t o_batch_stride = 0, o_row_stride = 0, o_head_stride = 0;
  int64_t do_batch_stride = 0, do_row_stride = 0, do_head_stride = 0;
  int64_t lse_batch_stride = 0, lse_head_stride = 0;
  int64_t dlse_batch_stride = 0, dlse_head_stride = 0;

  // Outputs, same layouts as q/k/v.
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  int64_t dq_batch_stride = 0, dq_row_stride = 0, dq_head_stride = 0;
  int64_t dk_batch_stride = 0, dk_row_stride = 0, dk_head_stride = 0;
  int64_t dv_batch_stride = 0, dv_row_stride = 0, dv_head_stride = 0;

  // Shapes; varlen: seqlen_* are max_seqlen_*, total_* the packed sizes.
  int batch = 0, seqlen_q = 0, seqlen_k = 0, num_heads = 0, num_heads_k = 0;
  int head_dim = 0, head_dim_v = 0;
  int total_q = 0, total_k = 0;
  const int* cu_seqlens_q = nullptr;
  const int* cu_seqlens_k = nullptr;
  // (b), varlen only, as FwdParams::seqused_q: sequence i's queries are its first seqused_q[i] packed
  // rows (clamped); the others are padding rows of the workspace (P = 0, dpsum = 0), their dq stays 0.
  const int* seqused_q = nullptr;

  float softmax_scale = 1.f;
  float softcap = 0.f;
  // ALiBi slopes as in FwdParams (common/score_mod.h): null = none.
  const float* alibi_slopes = nullptr;
  int64_t alibi_batch_stride = 0;
  bool is_causal = false;
  int window_left = -1, window_right = -1;
  int attention_chunk = 0;  // 0 = off; as FwdParams::attention_chunk
  bool deterministic = false;
  bool is_bf16 = true;

  // Workspace (see above), device pointers.
  float* lse_log2 = nullptr;
  float* dpsum = nullptr;
  float* dq_accum = nullptr;
  int* dq_semaphore = nullptr;
};

// Padded rows per (batch, head) of the batched workspace, or per head of the varlen one.
FLASH3_HD int64_t bwd_padded_rows(const BwdParams& p) {
  return p.cu_seqlens_q != nullptr ? padded_seq_offset(p.total_q, p.batch, kBwdBlockM)
                                   : int64_t(ceil_div(p.seqlen_q, kBwdBlockM)) * kBwdBlockM;
}

struct BwdWorkspace {
  int64_t row_floats;      // lse_log2 and dpsum: floats each
  int64_t dq_floats;       // dq_accum
  int64_t semaphore_ints;  // dq_semaphore (0 unless deterministic)
};

// kernel_head_dim: the compiled kernel's d (its dQ tiles are 64 x that, whatever p.head_dim).
inline BwdWorkspace bwd_workspace(const BwdParams& p, int kernel_head_dim) {
  const int64_t rows = bwd_padded_rows(p) * p.num_heads * (p.cu_seqlens_q != nullptr ? 1 : p.batch);
  const int64_t m_blocks = ceil_div(p.seqlen_q, kBwdBlockM);
  return {rows, rows * kernel_head_dim,
          p.deterministic ? int64_t(p.batch) * p.num_heads * m_blocks : 0};
}

}  // namespace flash3
