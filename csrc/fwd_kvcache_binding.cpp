// torch side of the decode (KV-cache) attention kernels (a fragment of the flash3 op library;
// fwd_binding.cpp defines it).
//
//   flash3::fwd_kvcache_sm90(q, k_cache, v_cache, out!, lse!, seqused_k, page_table?, softmax_scale,
//                            window_left, window_right, softcap, num_splits, k_descale?,
//                            v_descale?, sinks?, cu_seqlens_q?, max_seqlen_q, alibi_slopes?,
//                            cache_leftpad?, descale_per_batch, qv?, attention_chunk) -> ()
//       CUDA: q (b, s_q, h, d) against caches (b, capacity, h_k, d|d_v), or paged
//       (num_pages, page_size, h_k, d|d_v) with int32 page_table (b, max_pages); row i sees its
//       first seqused_k[i] keys (clamped to the cache). Packed GQA, split-KV (num_splits 0: the
//       heuristic of decode/split_heuristic.h, from shapes only) merged by the combine kernel.
//       Caches of q's dtype, or float8_e4m3fn with float32 k_descale/v_descale (num_slabs, h_k):
//       the stored x8 of slab s, kv head j is x8 * descale[s, j]; with descale_per_batch they are
//       (b, h_k), FA3's: x8 read for batch entry i, kv head j is x8 * descale[i, j]. sinks: float32 (h,), attention
//       sinks (the kernel's epilogue without splits, else the combine; lse includes them).
//       Packed (varlen) queries (cu_seqlens_q int32 (b + 1,), max_seqlen_q): q (total_q, h, d),
//       out (total_q, h, d_v), lse (h, total_q); sequence i's queries are rows
//       cu_seqlens_q[i]..cu_seqlens_q[i+1] (0 allowed), masks bottom-right per sequence; rows of
//       no sequence get out 0, lse -inf (the op zero-fills out and fills lse first; no tile and,
//       through CombineParams::seq_end, no combine writes them); split-KV partials are indexed by
//       packed row (combined as one batch of total_q rows).
//       cache_leftpad: int32 (b,), FA3's left padding: row i's keys are cache positions
//       [cache_leftpad[i], seqused_k[i]), masks counting keys from there (the kernel clamps it
//       into the row's keys; a paged cache is then gathered, not loaded by TMA).
//       qv: FA3's MLA query part (b, s_q, h, d_v) (packed: (total_q, h, d_v)), q's dtype: scores
//       softmax_scale * (q.k + qv.v), on the MLA decode kernel (d <= 64, 256 < d_v <= 512).
//       attention_chunk: FA3's chunked local attention (0 = off), on the tokens' positions
//       (bottom-right aligned on each row's keys), intersecting the window; head dims up to 192.
//       No host synchronization: capturable in a CUDA graph. Meta: nothing.
// flash3/ops.py validates first; the host layer's checks are a defence of the kernels' memory
// accesses: csrc/flash3/host/kvcache.cpp checks the arguments, picks the kernel and launches it (and the
// combine); this file adapts it to at::Tensor.
#include <torch/library.h>

#include <cstdint>
#include <optional>

#include "flash3/host/kvcache.h"
#include "torch_adapter.h"

namespace flash3 {
namespace {

void fwd_kvcache_sm90_cuda(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& out,
                           const Tensor& lse, const Tensor& seqused_k, const std::optional<Tensor>& page_table,
                           double softmax_scale, int64_t window_left, int64_t window_right,
                           double softcap, int64_t num_splits, const std::optional<Tensor>& k_descale,
                           const std::optional<Tensor>& v_descale, const std::optional<Tensor>& sinks,
                           // ---- varlen (packed) queries: appended last, defaults keep old callers valid
                           const std::optional<Tensor>& cu_seqlens_q, int64_t max_seqlen_q,
                           const std::optional<Tensor>& alibi_slopes, const std::optional<Tensor>& cache_leftpad,
                           bool descale_per_batch, const std::optional<Tensor>& qv, int64_t attention_chunk) {
  const auto pt = view(page_table), kd = view(k_descale), vd = view(v_descale), sk = view(sinks),
             cu_q = view(cu_seqlens_q), al = view(alibi_slopes), lp = view(cache_leftpad),
             qv_v = view(qv);
  run_host_op(q, [&](host::Backend& be) {
    host::fwd_kvcache_sm90(be, view(q), view(k_cache), view(v_cache), view(out), view(lse), view(seqused_k), ptr(pt),
                           softmax_scale, window_left, window_right, softcap, num_splits, ptr(kd), ptr(vd),
                           ptr(sk), ptr(cu_q), max_seqlen_q, ptr(al), ptr(lp), descale_per_batch, ptr(qv_v),
                           attention_chunk);
  });
}

void fwd_kvcache_sm90_meta(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                           const std::optional<Tensor>&, double, int64_t, int64_t, double, int64_t,
                           const std::optional<Tensor>&, const std::optional<Tensor>&,
                           const std::optional<Tensor>&, const std::optional<Tensor>&, int64_t,
                           const std::optional<Tensor>&, const std::optional<Tensor>&, bool,
                           const std::optional<Tensor>&, int64_t) {}

}  // namespace
}  // namespace flash3

TORCH_LIBRARY_FRAGMENT(flash3, m) {
  m.def(
      "fwd_kvcache_sm90(Tensor q, Tensor k_cache, Tensor v_cache, Tensor(a!) out, Tensor(b!) lse, "
      "Tensor seqused_k, Tensor? page_table, float softmax_scale, int window_left, "
      "int window_right, float softcap, int num_splits, Tensor? k_descale=None, Tensor? v_descale=None, "
      "Tensor? sinks=None"
      // varlen (packed) queries: keep these last
      ", Tensor? cu_seqlens_q=None, int max_seqlen_q=0"
      ", Tensor? alibi_slopes=None"
      ", Tensor? cache_leftpad=None"
      ", bool descale_per_batch=False"
      ", Tensor? qv=None, int attention_chunk=0"
      ") -> ()");
}

TORCH_LIBRARY_IMPL(flash3, CUDA, m) { m.impl("fwd_kvcache_sm90", &flash3::fwd_kvcache_sm90_cuda); }

TORCH_LIBRARY_IMPL(flash3, Meta, m) { m.impl("fwd_kvcache_sm90", &flash3::fwd_kvcache_sm90_meta); }
