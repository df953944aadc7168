// torch side of the decode kernels (a fragment of the flash3 op library; binding.cpp defines it).
//
//   flash3::append_kv_sm90(q, k_cache!, v_cache!, k, v, cache_seqlens, page_table?, rotary_cos?,
//                          rotary_sin?, rotary_interleaved, q_per_token, q_out!, k_descale?,
//                          v_descale?) -> ()
//       CUDA: writes k/v (rotated when rotary tables are given) into the cache at
//       cache_seqlens[b] + t, skipping slots outside the cache, and q rotated into q_out; no host
//       synchronization (csrc/flash3/decode/append_kv.h). float8_e4m3fn caches take float32
//       descales (slabs, h_k) and store e4m3(clamp(x / descale, +-448)). Meta: nothing.
// flash3/ops.py validates first; these checks are a defence of the kernel's memory accesses.
#include <ATen/MemoryOverlap.h>
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/library.h>

#include <cstdint>
#include <limits>
#include <optional>

#include "flash3/decode/append_kv.h"

namespace flash3 {
namespace {

using at::Tensor;

// `fp8`: a cache that may be float8_e4m3fn instead of q's dtype.
void check_rows(const Tensor& t, const char* name, const Tensor& q, int64_t dim0, int64_t dim2,
                int64_t dim3, bool fp8 = false) {
  TORCH_CHECK(t.device() == q.device(), "flash3.append_kv_sm90: ", name, " must be on ",
              q.device(), ", got ", t.device());
  const auto dtype = fp8 ? at::kFloat8_e4m3fn : q.scalar_type();
  TORCH_CHECK(t.scalar_type() == dtype, "flash3.append_kv_sm90: ", name, " must have dtype ", dtype,
              ", got ", t.scalar_type());
  TORCH_CHECK(t.dim() == 4 && (dim0 < 0 || t.size(0) == dim0) && t.size(2) == dim2 &&
                  t.size(3) == dim3,
              "flash3.append_kv_sm90: ", name, " has shape ", t.sizes(), ", expected (",
              dim0, ", *, ", dim2, ", ", dim3, ")");
  TORCH_CHECK(t.stride(3) == 1 || t.size(3) == 1, "flash3.append_kv_sm90: ", name,
              " must have a contiguous last dimension");
}

int to_int(int64_t v, const char* what) {
  TORCH_CHECK(v >= 0 && v <= std::numeric_limits<int32_t>::max(), "flash3.append_kv_sm90: ",
              what, " = ", v, " does not fit in int32");
  return static_cast<int>(v);
}

void append_kv_sm90_cuda(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                         const Tensor& k, const Tensor& v, const Tensor& cache_seqlens,
                         const std::optional<Tensor>& page_table,
                         const std::optional<Tensor>& rotary_cos,
                         const std::optional<Tensor>& rotary_sin, bool rotary_interleaved,
                         bool q_per_token, const Tensor& q_out,
                         const std::optional<Tensor>& k_descale,
                         const std::optional<Tensor>& v_descale) {
  TORCH_CHECK(q.is_cuda(), "flash3.append_kv_sm90: q must be a CUDA tensor");
  TORCH_CHECK(q.scalar_type() == at::kBFloat16 || q.scalar_type() == at::kHalf,
              "flash3.append_kv_sm90: q must be bfloat16 or float16, got ", q.scalar_type());
  const c10::cuda::CUDAGuard guard(q.device());
  const int64_t b = q.size(0), s_q = q.size(1), h = q.size(2), d = q.size(3);
  const int64_t h_k = k_cache.size(2), d_v = v_cache.size(3), s_new = k.size(1);
  check_rows(q, "q", q, b, h, d);
  check_rows(q_out, "q_out", q, b, h, d);
  TORCH_CHECK(q_out.size(1) == s_q, "flash3.append_kv_sm90: q_out must have q's shape");
  const bool fp8 = k_cache.scalar_type() == at::kFloat8_e4m3fn;
  check_rows(k_cache, "k_cache", q, -1, h_k, d, fp8);
  check_rows(v_cache, "v_cache", q, k_cache.size(0), h_k, d_v, fp8);
  TORCH_CHECK(k_descale.has_value() == fp8 && v_descale.has_value() == fp8,
              "flash3.append_kv_sm90: k_descale and v_descale go with (and only with) a float8_e4m3fn cache");
  if (fp8)
    for (const Tensor* t : {&*k_descale, &*v_descale})
      TORCH_CHECK(t->device() == q.device() && t->scalar_type() == at::kFloat && t->dim() == 2 &&
                      t->size(0) == k_cache.size(0) && t->size(1) == h_k,
                  "flash3.append_kv_sm90: descales must be float32 (", k_cache.size(0), ", ", h_k, ") on ",
                  q.device(), ", got ", t->scalar_type(), " ", t->sizes());
  TORCH_CHECK(v_cache.size(1) == k_cache.size(1), "flash3.append_kv_sm90: v_cache must match k_cache");
  check_rows(k, "k", q, b, h_k, d);
  check_rows(v, "v", q, b, h_k, d_v);
  TORCH_CHECK(v.size(1) == s_new, "flash3.append_kv_sm90: v must have k's number of tokens");
  TORCH_CHECK(cache_seqlens.device() == q.device() && cache_seqlens.scalar_type() == at::kInt &&
                  cache_seqlens.dim() == 1 && cache_seqlens.size(0) == b &&
                  cache_seqlens.is_contiguous(),
              "flash3.append_kv_sm90: cache_seqlens must be a contiguous int32 (", b, ",) tensor on ",
              q.device());

  // Written tensors: no element twice (an expanded view), and with rotary no input read by
  // another thread after it is overwritten (q_out is q itself only without rotary: untouched).
  at::assert_no_internal_overlap(k_cache);
  at::assert_no_internal_overlap(v_cache);
  at::assert_no_overlap(k_cache, k);
  at::assert_no_overlap(v_cache, v);
  if (rotary_cos.has_value()) {
    at::assert_no_internal_overlap(q_out);
    at::assert_no_overlap(q_out, q);
  }

  AppendKvParams p{};
  p.k = k.data_ptr(), p.v = v.data_ptr();
  p.k_batch_stride = k.stride(0), p.k_row_stride = k.stride(1), p.k_head_stride = k.stride(2);
  p.v_batch_stride = v.stride(0), p.v_row_stride = v.stride(1), p.v_head_stride = v.stride(2);
  p.k_cache = k_cache.data_ptr(), p.v_cache = v_cache.data_ptr();
  p.kc_batch_stride = k_cache.stride(0), p.kc_row_stride = k_cache.stride(1);
  p.kc_head_stride = k_cache.stride(2);
  p.vc_batch_stride = v_cache.stride(0), p.vc_row_stride = v_cache.stride(1);
  p.vc_head_stride = v_cache.stride(2);
  p.q = q.data_ptr(), p.q_out = q_out.data_ptr();
  p.q_batch_stride = q.stride(0), p.q_row_stride = q.stride(1), p.q_head_stride = q.stride(2);
  p.qo_batch_stride = q_out.stride(0), p.qo_row_stride = q_out.stride(1);
  p.qo_head_stride = q_out.stride(2);
  p.cache_seqlens = cache_seqlens.data_ptr<int32_t>();
  if (page_table.has_value()) {
    const Tensor& pt = *page_table;
    TORCH_CHECK(pt.device() == q.device() && pt.scalar_type() == at::kInt && pt.dim() == 2 &&
                    pt.size(0) == b && (pt.stride(1) == 1 || pt.size(1) == 1),
                "flash3.append_kv_sm90: page_table must be int32 (", b,
                ", max_pages) with contiguous rows on ", q.device());
    p.page_table = pt.data_ptr<int32_t>();
    p.page_table_stride = pt.stride(0);
    p.max_pages = to_int(pt.size(1), "page_table.size(1)");
    p.num_pages = k_cache.size(0);
  } else {
    TORCH_CHECK(k_cache.size(0) == b, "flash3.append_kv_sm90: k_cache must have batch ", b);
  }
  p.page_size = to_int(k_cache.size(1), "k_cache.size(1)");
  TORCH_CHECK(int64_t(p.max_pages) * p.page_size <= std::numeric_limits<int32_t>::max(),
              "flash3.append_kv_sm90: page_table addresses more than 2^31 keys per row");
  TORCH_CHECK(rotary_cos.has_value() == rotary_sin.has_value(),
              "flash3.append_kv_sm90: rotary_cos and rotary_sin go together");
  if (rotary_cos.has_value()) {
    const Tensor &c = *rotary_cos, &s = *rotary_sin;
    for (const Tensor* t : {&c, &s})
      TORCH_CHECK(t->device() == q.device() && t->scalar_type() == at::kFloat && t->dim() == 2 &&
                      t->is_contiguous() && t->sizes() == c.sizes() && t->size(0) >= 1 &&
                      2 * t->size(1) <= d,
                  "flash3.append_kv_sm90: rotary tables must be contiguous float32 "
                  "(seqlen_ro >= 1, rotary_dim / 2) with rotary_dim <= ", d, ", same shape");
    p.rotary_cos = c.data_ptr<float>(), p.rotary_sin = s.data_ptr<float>();
    p.seqlen_ro = to_int(c.size(0), "rotary_cos.size(0)");
    p.rotary_dim = to_int(2 * c.size(1), "rotary_dim");
  }
  p.rotary_interleaved = rotary_interleaved;
  p.q_per_token = q_per_token;
  p.batch = to_int(b, "batch"), p.s_new = to_int(s_new, "k.size(1)");
  p.s_q = to_int(s_q, "q.size(1)");
  p.h = to_int(h, "q.size(2)"), p.h_k = to_int(h_k, "k_cache.size(2)");
  p.d = to_int(d, "q.size(3)"), p.d_v = to_int(d_v, "v_cache.size(3)");
  p.is_bf16 = q.scalar_type() == at::kBFloat16;
  if (fp8) {
    p.k_descale = k_descale->data_ptr<float>(), p.v_descale = v_descale->data_ptr<float>();
    p.kd_slab_stride = k_descale->stride(0), p.kd_head_stride = k_descale->stride(1);
    p.vd_slab_stride = v_descale->stride(0), p.vd_head_stride = v_descale->stride(1);
  }
  const int err = run_append_kv(p, c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == 0, "flash3.append_kv_sm90: launch failed: ",
              cudaGetErrorString(static_cast<cudaError_t>(err)));
}

void append_kv_sm90_meta(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                         const Tensor&, const Tensor&, const std::optional<Tensor>&,
                         const std::optional<Tensor>&, const std::optional<Tensor>&, bool, bool,
                         const Tensor&, const std::optional<Tensor>&, const std::optional<Tensor>&) {}

}  // namespace
}  // namespace flash3

TORCH_LIBRARY_FRAGMENT(flash3, m) {
  m.def(
      "append_kv_sm90(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor k, Tensor v, "
      "Tensor cache_seqlens, Tensor? page_table, Tensor? rotary_cos, Tensor? rotary_sin, "
      "bool rotary_interleaved, bool q_per_token, Tensor(c!) q_out, Tensor? k_descale=None, "
      "Tensor? v_descale=None) -> ()");
}

TORCH_LIBRARY_IMPL(flash3, CUDA, m) { m.impl("append_kv_sm90", &flash3::append_kv_sm90_cuda); }

TORCH_LIBRARY_IMPL(flash3, Meta, m) { m.impl("append_kv_sm90", &flash3::append_kv_sm90_meta); }
