// The backward op, torch-free: torch.ops.flash3.bwd_sm90 (csrc/bwd_binding.cpp adapts it; the
// simulator driver calls it). dq, dk, dv of attention (the forward's out and lse given), with the
// gradient dlse flowing into lse when given, as flash3/reference/__init__.py backward defines them;
// with attention sinks (float32 (h,)) also their gradient into dsinks (required with sinks). The
// workspace (csrc/flash3/bwd/params.h) comes from the backend's allocator; nothing is read back to
// the host. Batched tensors (b, s, heads, dim), lse/dlse (b, h, s_q); varlen (total, heads, dim),
// lse/dlse (h, total_q). Optional tensors are nullptr when absent. seqused_q int32 (b,), varlen only,
// not with sinks (as fwd_sm90's): rows past it get dq = 0 and add nothing to dk/dv (last, with a
// default: the simulator driver's bwd op compiles unchanged).
#pragma once
#include <cstdint>

#include "flash3/host/backend.h"

namespace flash3::host {

void bwd_sm90(Backend& be, const TensorView& dout, const TensorView& q, const TensorView& k, const TensorView& v,
              const TensorView& out, const TensorView& lse, const TensorView* dlse, const TensorView& dq,
              const TensorView& dk, const TensorView& dv, const TensorView* cu_seqlens_q,
              const TensorView* cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k, double softmax_scale,
              int64_t window_left, int64_t window_right, double softcap, bool deterministic,
              const TensorView* sinks, const TensorView* dsinks, const TensorView* alibi_slopes,
              const TensorView* seqused_q = nullptr,
              int64_t attention_chunk = 0);  // FA3's chunked local attention (fwd.h), 0 = off

}  // namespace flash3::host
