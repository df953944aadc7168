// torch side of the backward kernels (a fragment of the flash3 op library; fwd_binding.cpp defines it).
//
//   flash3::bwd_sm90(dout, q, k, v, out, lse, dlse?, dq!, dk!, dv!, cu_seqlens_q?, cu_seqlens_k?,
//                    max_seqlen_q, max_seqlen_k, softmax_scale, window_left, window_right,
//                    softcap, deterministic, sinks?=None, dsinks!?=None, alibi_slopes?=None,
//                    seqused_q?=None, attention_chunk=0) -> ()
//       CUDA: dq, dk, dv of attention (the forward's out and lse given), with the gradient dlse
//       flowing into lse when given, exactly as flash3/reference/__init__.py backward defines them;
//       with attention sinks (float32 (num_heads,); lse then includes them, dq/dk/dv need nothing
//       else) also their gradient into dsinks (float32 (num_heads,), required with sinks), summed in
//       a fixed order (bitwise reproducible whatever `deterministic`); the
//       workspace (csrc/flash3/bwd/params.h) is allocated on the current stream, nothing is read
//       back to the host. deterministic: bitwise reproducible run to run. seqused_q: as fwd_sm90's
//       (varlen, no sinks): rows past it get dq = 0 and add nothing to dk/dv. Meta: nothing.
// Batched tensors (b, s, heads, dim), lse/dlse (b, h, s_q); varlen (total, heads, dim), lse/dlse
// (h, total_q). flash3/ops.py validates first; the host layer's checks defend the kernel's memory
// accesses: csrc/flash3/host/bwd.cpp checks the arguments, allocates the workspace through the
// adapter and launches; this file adapts it to at::Tensor.
#include <torch/library.h>

#include <cstdint>
#include <optional>

#include "flash3/host/bwd.h"
#include "torch_adapter.h"

namespace flash3 {
namespace {

void bwd_sm90_cuda(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                   const Tensor& lse, const std::optional<Tensor>& dlse, const Tensor& dq, const Tensor& dk,
                   const Tensor& dv, const std::optional<Tensor>& cu_seqlens_q,
                   const std::optional<Tensor>& cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
                   double softmax_scale, int64_t window_left, int64_t window_right, double softcap,
                   bool deterministic, const std::optional<Tensor>& sinks, const std::optional<Tensor>& dsinks,
                   const std::optional<Tensor>& alibi_slopes, const std::optional<Tensor>& seqused_q,
                   int64_t attention_chunk) {
  const auto dl = view(dlse), cu_q = view(cu_seqlens_q), cu_k = view(cu_seqlens_k), sk = view(sinks),
             dsk = view(dsinks), al = view(alibi_slopes), used_q = view(seqused_q);
  run_host_op(q, [&](host::Backend& be) {
    host::bwd_sm90(be, view(dout), view(q), view(k), view(v), view(out), view(lse), ptr(dl), view(dq), view(dk),
                   view(dv), ptr(cu_q), ptr(cu_k), max_seqlen_q, max_seqlen_k, softmax_scale, window_left,
                   window_right, softcap, deterministic, ptr(sk), ptr(dsk), ptr(al), ptr(used_q),
                   attention_chunk);
  });
}

void bwd_sm90_meta(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                   const std::optional<Tensor>&, const Tensor&, const Tensor&, const Tensor&,
                   const std::optional<Tensor>&, const std::optional<Tensor>&, int64_t, int64_t, double,
                   int64_t, int64_t, double, bool, const std::optional<Tensor>&, const std::optional<Tensor>&,
                   const std::optional<Tensor>&, const std::optional<Tensor>&, int64_t) {}

}  // namespace
}  // namespace flash3

TORCH_LIBRARY_FRAGMENT(flash3, m) {
  m.def(
      "bwd_sm90(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor? dlse, "
      "Tensor(a!) dq, Tensor(b!) dk, Tensor(c!) dv, Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, "
      "int max_seqlen_q, int max_seqlen_k, float softmax_scale, int window_left, "
      "int window_right, float softcap, bool deterministic, Tensor? sinks=None, Tensor(d!)? dsinks=None, "
      "Tensor? alibi_slopes=None, Tensor? seqused_q=None, int attention_chunk=0) -> ()");
}

TORCH_LIBRARY_IMPL(flash3, CUDA, m) { m.impl("bwd_sm90", &flash3::bwd_sm90_cuda); }

TORCH_LIBRARY_IMPL(flash3, Meta, m) { m.impl("bwd_sm90", &flash3::bwd_sm90_meta); }
