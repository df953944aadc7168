// torch side of the KV-cache append (a fragment of the flash3 op library; fwd_binding.cpp defines it).
//
//   flash3::append_kv_sm90(q, k_cache!, v_cache!, k, v, cache_seqlens, page_table?, rotary_cos?,
//                          rotary_sin?, rotary_interleaved, q_per_token, q_out!, k_descale?,
//                          v_descale?, rotary_seqlens?, cu_seqlens_q?, cu_seqlens_k_new?,
//                          descale_per_batch=False) -> ()
//       CUDA: writes k/v (rotated when rotary tables are given, at rotary_seqlens[b] + t when
//       given) into the cache at cache_seqlens[b] + t, skipping slots outside the cache, and q rotated into q_out; no host
//       synchronization (csrc/flash3/decode/append_kv.h). float8_e4m3fn caches take float32
//       descales (slabs, h_k) and store e4m3(clamp(x / descale, +-448)); with descale_per_batch
//       (FA3's descales per batch entry) float8_e4m3fn k/v are copied unchanged (no descales, no
//       rotary). FA3's packed layouts: cu_seqlens_q with q/q_out (total_q, h, d), cu_seqlens_k_new
//       with k/v (total_new, h_k, ·). Meta: nothing.
// flash3/ops.py validates first; the host layer's checks are a defence of the kernel's memory
// accesses: csrc/flash3/host/append_kv.cpp checks the arguments and launches; this file adapts it to
// at::Tensor.
#include <torch/library.h>

#include <optional>

#include "flash3/host/append_kv.h"
#include "torch_adapter.h"

namespace flash3 {
namespace {

void append_kv_sm90_cuda(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                         const Tensor& k, const Tensor& v, const Tensor& cache_seqlens,
                         const std::optional<Tensor>& page_table,
                         const std::optional<Tensor>& rotary_cos,
                         const std::optional<Tensor>& rotary_sin, bool rotary_interleaved,
                         bool q_per_token, const Tensor& q_out,
                         const std::optional<Tensor>& k_descale,
                         const std::optional<Tensor>& v_descale,
                         const std::optional<Tensor>& rotary_seqlens,
                         const std::optional<Tensor>& cu_seqlens_q,
                         const std::optional<Tensor>& cu_seqlens_k_new, bool descale_per_batch) {
  const auto pt = view(page_table), cos = view(rotary_cos), sin = view(rotary_sin), kd = view(k_descale),
             vd = view(v_descale), ro = view(rotary_seqlens), cu_q = view(cu_seqlens_q),
             cu_k = view(cu_seqlens_k_new);
  run_host_op(q, [&](host::Backend& be) {
    host::append_kv_sm90(be, view(q), view(k_cache), view(v_cache), view(k), view(v), view(cache_seqlens), ptr(pt),
                         ptr(cos), ptr(sin), rotary_interleaved, q_per_token, view(q_out), ptr(kd), ptr(vd),
                         ptr(ro), descale_per_batch, ptr(cu_q), ptr(cu_k));
  });
}

void append_kv_sm90_meta(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                         const Tensor&, const Tensor&, const std::optional<Tensor>&,
                         const std::optional<Tensor>&, const std::optional<Tensor>&, bool, bool,
                         const Tensor&, const std::optional<Tensor>&, const std::optional<Tensor>&,
                         const std::optional<Tensor>&, const std::optional<Tensor>&,
                         const std::optional<Tensor>&, bool) {}

}  // namespace
}  // namespace flash3

TORCH_LIBRARY_FRAGMENT(flash3, m) {
  m.def(
      "append_kv_sm90(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor k, Tensor v, "
      "Tensor cache_seqlens, Tensor? page_table, Tensor? rotary_cos, Tensor? rotary_sin, "
      "bool rotary_interleaved, bool q_per_token, Tensor(c!) q_out, Tensor? k_descale=None, "
      "Tensor? v_descale=None, Tensor? rotary_seqlens=None, Tensor? cu_seqlens_q=None, "
      "Tensor? cu_seqlens_k_new=None, bool descale_per_batch=False) -> ()");
}

TORCH_LIBRARY_IMPL(flash3, CUDA, m) { m.impl("append_kv_sm90", &flash3::append_kv_sm90_cuda); }

TORCH_LIBRARY_IMPL(flash3, Meta, m) { m.impl("append_kv_sm90", &flash3::append_kv_sm90_meta); }
