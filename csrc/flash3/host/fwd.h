// The forward ops, torch-free: torch.ops.flash3.fwd_sm90 and fwd_fp8_sm90 (csrc/fwd_binding.cpp adapts
// them to at::Tensor; the simulator driver calls them on its case tensors). Optional tensors are
// nullptr when absent. Each checks its arguments (throwing host::Error with the binding's message),
// picks the kernel, fills FwdParams and launches on the backend's stream.
#pragma once
#include <cstdint>

#include "flash3/host/backend.h"

namespace flash3::host {

// q (b, s_q, h, d), k (b, s_k, h_k, d), v (b, s_k, h_k, d_v) of bf16/fp16, out like q with d_v,
// lse float32 (b, h, s_q); varlen (cu_seqlens_q/k int32 (b + 1,)): (total, heads, dim) and lse
// (h, total_q), s_q/s_k the max lengths. seqused_k int32 (b,), sinks float32 (h,),
// alibi_slopes float32 (h,) or (b, h). seqused_q int32 (b,), varlen only, not with sinks: sequence
// i's first seqused_q[i] packed rows are its queries, its other rows get out 0, lse -inf.
// attention_chunk: FA3's chunked local attention (0 = off; attn_logic.h Mask). Both last and
// defaulted so callers without them compile unchanged.
void fwd_sm90(Backend& be, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
              const TensorView& lse, const TensorView* cu_seqlens_q, const TensorView* cu_seqlens_k,
              const TensorView* seqused_k, int64_t max_seqlen_q, int64_t max_seqlen_k, double softmax_scale,
              int64_t window_left, int64_t window_right, double softcap, const TensorView* sinks,
              const TensorView* alibi_slopes, const TensorView* seqused_q = nullptr,
              int64_t attention_chunk = 0);

// The FP8 forward: q (b, s_q, h, d), k (b, s_k, h_k, d) and vt (b, h_k, d_v, s_pad) in e4m3, vt
// holding V transposed with tokens permuted within every 16 (flash3/fp8_quant.py pack_v_fp8), s_pad a
// multiple of 16 >= s_k. Descales (float32, any strides): q (b, h, ceil(s_q / q_block)), k and v
// (b, h_k, ceil(s_k / kv_block)), optional v_channel (b, h_k, d_v). out (b, s_q, h, d_v) bf16.
// Varlen (cu_seqlens_q/k given): q (total_q, h, d), k (total_k, h_k, d), vt (h_k, d_v, columns)
// with sequence i at column fp8_varlen_vt_offset(cu_seqlens_k[i], i) (fp8.pack_v_fp8_varlen),
// out (total_q, h, d_v), lse (h, total_q); descale blocks count from each sequence's start, s_q and
// s_k above being max_seqlen_q/k. seqused_q/seqused_k int32 (b,), varlen only: as fwd_sm90's (vt's
// columns past seqused_k must be finite: pack_v_fp8_varlen zeroes them). attention_chunk as
// fwd_sm90's.
void fwd_fp8_sm90(Backend& be, const TensorView& q, const TensorView& k, const TensorView& vt, const TensorView& out,
                  const TensorView& lse, const TensorView& q_descale, const TensorView& k_descale,
                  const TensorView& v_descale, const TensorView* v_channel_descale, int64_t q_block, int64_t kv_block,
                  double softmax_scale, int64_t window_left, int64_t window_right, double softcap,
                  const TensorView* cu_seqlens_q, const TensorView* cu_seqlens_k, int64_t max_seqlen_q,
                  int64_t max_seqlen_k, const TensorView* seqused_q = nullptr,
                  const TensorView* seqused_k = nullptr, int64_t attention_chunk = 0, bool fast_accum = false);

}  // namespace flash3::host
