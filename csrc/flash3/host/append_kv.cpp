#include "flash3/host/append_kv.h"

#include <limits>
#include <sstream>

#include "flash3/decode/append_kv.h"
#include "flash3/host/check.h"
#include "flash3/host/device.h"

namespace flash3::host {
namespace {

constexpr const char* kOp = "flash3.append_kv_sm90";

// `fp8`: a cache that may be float8_e4m3fn instead of q's dtype. `packed`: FA3's packed layout,
// 3-D (rows, dim2, dim3) with any row count; else 4-D (dim0 (any when < 0), *, dim2, dim3).
void check_rows(const TensorView& t, const char* name, const TensorView& q, int64_t dim0, int64_t dim2, int64_t dim3,
                bool fp8 = false, bool packed = false) {
  check(t.device == q.device, kOp, ": ", name, " must be on ", q.device, ", got ", t.device);
  const DType dtype = fp8 ? DType::e4m3 : q.dtype;
  check(t.dtype == dtype, kOp, ": ", name, " must have dtype ", fp8 ? dtype_torch_name(DType::e4m3) : q.dtype_name,
        ", got ", t.dtype_name);
  if (packed)
    check(t.dim() == 3 && t.size(1) == dim2 && t.size(2) == dim3, kOp, ": ", name, " has shape ", t.sizes(),
          ", expected (*, ", dim2, ", ", dim3, ") (packed rows)");
  else
    check(t.dim() == 4 && (dim0 < 0 || t.size(0) == dim0) && t.size(2) == dim2 && t.size(3) == dim3, kOp, ": ", name,
          " has shape ", t.sizes(), ", expected (", dim0, ", *, ", dim2, ", ", dim3, ")");
  check(t.stride(-1) == 1 || t.size(-1) == 1, kOp, ": ", name, " must have a contiguous last dimension");
}

// A batch-sized int32 index vector (n entries: b, or b + 1 for cu_seqlens) the kernel reads.
void check_index(const TensorView& t, const char* name, const TensorView& q, int64_t n) {
  check(t.device == q.device && t.dtype == DType::i32 && t.dim() == 1 && t.size(0) == n && t.is_contiguous(), kOp,
        ": ", name, " must be a contiguous int32 (", n, ",) tensor on ", q.device, ", got ", t.dtype_name, " ",
        t.sizes());
}

}  // namespace

void append_kv_sm90(Backend& be, const TensorView& q, const TensorView& k_cache, const TensorView& v_cache,
                    const TensorView& k, const TensorView& v, const TensorView& cache_seqlens,
                    const TensorView* page_table, const TensorView* rotary_cos, const TensorView* rotary_sin,
                    bool rotary_interleaved, bool q_per_token, const TensorView& q_out, const TensorView* k_descale,
                    const TensorView* v_descale, const TensorView* rotary_seqlens,
                    bool descale_per_batch, const TensorView* cu_seqlens_q, const TensorView* cu_seqlens_k_new) {
  check(q.device.kind == DeviceKind::cuda, kOp, ": q must be a CUDA tensor");
  // e4m3 q: FA3's FP8 q, with descale_per_batch (checked below), rotated in e4m3 like the new keys.
  check(q.dtype == DType::bf16 || q.dtype == DType::fp16 || (q.dtype == DType::e4m3 && descale_per_batch), kOp,
        ": q must be bfloat16 or float16 (float8_e4m3fn with descale_per_batch), got ", q.dtype_name);
  // Packed q (total_q, h, d) / k, v (total_new, h_k, ·): s_q / s_new count their rows.
  const bool packed_q = cu_seqlens_q != nullptr, packed_k = cu_seqlens_k_new != nullptr;
  check(q.dim() == (packed_q ? 3 : 4), kOp, ": q must be ", packed_q ? "3-D (total_q, h, d) with cu_seqlens_q" : "4-D",
        ", got ", q.sizes());
  check(k.dim() == (packed_k ? 3 : 4), kOp, ": k must be ",
        packed_k ? "3-D (total_new, h_k, d) with cu_seqlens_k_new" : "4-D", ", got ", k.sizes());
  check(!packed_q || (cu_seqlens_q->dim() == 1 && cu_seqlens_q->size(0) >= 1), kOp,
        ": cu_seqlens_q must be a (batch + 1,) vector, got ", packed_q ? cu_seqlens_q->sizes() : q.sizes());
  const int64_t b = packed_q ? cu_seqlens_q->size(0) - 1 : q.size(0);
  const int64_t s_q = packed_q ? q.size(0) : q.size(1), h = q.size(-2), d = q.size(-1);
  const int64_t h_k = k_cache.size(2), d_v = v_cache.size(3), s_new = packed_k ? k.size(0) : k.size(1);
  if (packed_q) check_index(*cu_seqlens_q, "cu_seqlens_q", q, b + 1);
  if (packed_k) check_index(*cu_seqlens_k_new, "cu_seqlens_k_new", q, b + 1);
  check_rows(q, "q", q, b, h, d, false, packed_q);
  check_rows(q_out, "q_out", q, b, h, d, false, packed_q);
  check(q_out.size(packed_q ? 0 : 1) == s_q, kOp, ": q_out must have q's shape");
  const bool fp8 = k_cache.dtype == DType::e4m3;
  check_rows(k_cache, "k_cache", q, -1, h_k, d, fp8);
  check_rows(v_cache, "v_cache", q, k_cache.size(0), h_k, d_v, fp8);
  // Descales per batch entry (FA3's): the new keys are e4m3 bytes under their entry's descales,
  // copied unchanged (a slab may hold keys of several entries, so no per-slab quantization).
  if (descale_per_batch) {
    check(fp8, kOp, ": descale_per_batch goes with a float8_e4m3fn cache only");
    check(k.dtype == DType::e4m3 && v.dtype == DType::e4m3, kOp,
          ": with descale_per_batch the new k and v must be float8_e4m3fn (copied unchanged), got ", k.dtype_name,
          " and ", v.dtype_name);
    check(k_descale == nullptr && v_descale == nullptr, kOp,
          ": with descale_per_batch the append takes no k_descale/v_descale (the e4m3 bytes are copied; the "
          "decode kernel applies the batch entry's)");
    // Rotated e4m3 keys are rounded to e4m3 in the kernel, and q with them (FA3's FP8 q).
    check(q.dtype == DType::e4m3 || (rotary_cos == nullptr && rotary_sin == nullptr), kOp,
          ": rotary with descale_per_batch (e4m3 new keys) takes float8_e4m3fn q (FA3's), got ", q.dtype_name);
  } else {
    check((k_descale != nullptr) == fp8 && (v_descale != nullptr) == fp8, kOp,
          ": k_descale and v_descale go with (and only with) a float8_e4m3fn cache");
  }
  if (fp8 && !descale_per_batch)
    for (const TensorView* t : {k_descale, v_descale})
      check(t->device == q.device && t->dtype == DType::f32 && t->dim() == 2 && t->size(0) == k_cache.size(0) &&
                t->size(1) == h_k,
            kOp, ": descales must be float32 (", k_cache.size(0), ", ", h_k, ") on ", q.device, ", got ",
            t->dtype_name, " ", t->sizes());
  check(v_cache.size(1) == k_cache.size(1), kOp, ": v_cache must match k_cache");
  check_rows(k, "k", q, b, h_k, d, descale_per_batch, packed_k);
  check_rows(v, "v", q, b, h_k, d_v, descale_per_batch, packed_k);
  check(v.size(packed_k ? 0 : 1) == s_new, kOp, ": v must have k's number of tokens");
  check_index(cache_seqlens, "cache_seqlens", q, b);

  // Written tensors: no element twice (an expanded view), and with rotary no input read by
  // another thread after it is overwritten (q_out is q itself only without rotary: untouched).
  be.assert_no_internal_overlap(k_cache);
  be.assert_no_internal_overlap(v_cache);
  be.assert_no_overlap(k_cache, k);
  be.assert_no_overlap(v_cache, v);
  if (rotary_cos != nullptr) {
    be.assert_no_internal_overlap(q_out);
    be.assert_no_overlap(q_out, q);
  }

  AppendKvParams p{};
  p.k = k.data_ptr(), p.v = v.data_ptr();
  if (packed_k) {  // (total_new, h_k, ·): no batch stride
    p.k_row_stride = k.stride(0), p.k_head_stride = k.stride(1);
    p.v_row_stride = v.stride(0), p.v_head_stride = v.stride(1);
    p.cu_seqlens_k_new = cu_seqlens_k_new->ptr<const int32_t>();
  } else {
    p.k_batch_stride = k.stride(0), p.k_row_stride = k.stride(1), p.k_head_stride = k.stride(2);
    p.v_batch_stride = v.stride(0), p.v_row_stride = v.stride(1), p.v_head_stride = v.stride(2);
  }
  p.k_cache = k_cache.data_ptr(), p.v_cache = v_cache.data_ptr();
  p.kc_batch_stride = k_cache.stride(0), p.kc_row_stride = k_cache.stride(1);
  p.kc_head_stride = k_cache.stride(2);
  p.vc_batch_stride = v_cache.stride(0), p.vc_row_stride = v_cache.stride(1);
  p.vc_head_stride = v_cache.stride(2);
  p.q = q.data_ptr(), p.q_out = q_out.data_ptr();
  if (packed_q) {  // (total_q, h, d): no batch stride
    p.q_row_stride = q.stride(0), p.q_head_stride = q.stride(1);
    p.qo_row_stride = q_out.stride(0), p.qo_head_stride = q_out.stride(1);
    p.cu_seqlens_q = cu_seqlens_q->ptr<const int32_t>();
  } else {
    p.q_batch_stride = q.stride(0), p.q_row_stride = q.stride(1), p.q_head_stride = q.stride(2);
    p.qo_batch_stride = q_out.stride(0), p.qo_row_stride = q_out.stride(1);
    p.qo_head_stride = q_out.stride(2);
  }
  p.cache_seqlens = cache_seqlens.ptr<const int32_t>();
  if (page_table != nullptr) {
    const TensorView& pt = *page_table;
    check(pt.device == q.device && pt.dtype == DType::i32 && pt.dim() == 2 && pt.size(0) == b &&
              (pt.stride(1) == 1 || pt.size(1) == 1),
          kOp, ": page_table must be int32 (", b, ", max_pages) with contiguous rows on ", q.device);
    p.page_table = pt.ptr<const int32_t>();
    p.page_table_stride = pt.stride(0);
    p.max_pages = to_int(pt.size(1), "page_table.size(1)", kOp);
    p.num_pages = k_cache.size(0);
  } else {
    check(k_cache.size(0) == b, kOp, ": k_cache must have batch ", b);
  }
  p.page_size = to_int(k_cache.size(1), "k_cache.size(1)", kOp);
  check(int64_t(p.max_pages) * p.page_size <= std::numeric_limits<int32_t>::max(), kOp,
        ": page_table addresses more than 2^31 keys per row");
  check((rotary_cos != nullptr) == (rotary_sin != nullptr), kOp, ": rotary_cos and rotary_sin go together");
  if (rotary_cos != nullptr) {
    const TensorView &c = *rotary_cos, &s = *rotary_sin;
    for (const TensorView* t : {&c, &s})
      check(t->device == q.device && t->dtype == DType::f32 && t->dim() == 2 && t->is_contiguous() &&
                t->sizes() == c.sizes() && t->size(0) >= 1 && 2 * t->size(1) <= d,
            kOp, ": rotary tables must be contiguous float32 (seqlen_ro >= 1, rotary_dim / 2) with rotary_dim <= ", d,
            ", same shape");
    p.rotary_cos = c.ptr<const float>(), p.rotary_sin = s.ptr<const float>();
    p.seqlen_ro = to_int(c.size(0), "rotary_cos.size(0)", kOp);
    p.rotary_dim = to_int(2 * c.size(1), "rotary_dim", kOp);
  }
  if (rotary_seqlens != nullptr) {
    const TensorView& r = *rotary_seqlens;
    check(rotary_cos != nullptr, kOp, ": rotary_seqlens needs the rotary tables");
    check_index(r, "rotary_seqlens", q, b);
    p.rotary_seqlens = r.ptr<const int32_t>();
  }
  p.rotary_interleaved = rotary_interleaved;
  p.q_per_token = q_per_token;
  p.batch = to_int(b, "batch", kOp), p.s_new = to_int(s_new, "new tokens", kOp);
  p.s_q = to_int(s_q, "query tokens", kOp);
  p.h = to_int(h, "q.size(2)", kOp), p.h_k = to_int(h_k, "k_cache.size(2)", kOp);
  p.d = to_int(d, "q.size(3)", kOp), p.d_v = to_int(d_v, "v_cache.size(3)", kOp);
  p.is_bf16 = q.dtype == DType::bf16;
  p.kv_e4m3 = descale_per_batch;
  if (fp8 && !descale_per_batch) {
    p.k_descale = k_descale->ptr<const float>(), p.v_descale = v_descale->ptr<const float>();
    p.kd_slab_stride = k_descale->stride(0), p.kd_head_stride = k_descale->stride(1);
    p.vd_slab_stride = v_descale->stride(0), p.vd_head_stride = v_descale->stride(1);
  }
  if (be.tracing()) {
    std::ostringstream os;
    os << kOp << " b=" << p.batch << " s_new=" << p.s_new << " s_q=" << p.s_q << " h=" << p.h << " h_k=" << p.h_k
       << " d=" << p.d << " d_v=" << p.d_v << " paged=" << int(p.page_table != nullptr) << " page_size=" << p.page_size
       << " rotary_dim=" << p.rotary_dim << " interleaved=" << int(p.rotary_interleaved)
       << " per_token=" << int(p.q_per_token) << " fp8=" << int(fp8) << " kv_e4m3=" << int(p.kv_e4m3)
       << " packed_q=" << int(packed_q) << " packed_k=" << int(packed_k);
    be.trace(os.str());
  }
  const int err = run_append_kv(p, be.stream());
  check(err == 0, kOp, ": launch failed: ", cuda_error_string(err));
}

}  // namespace flash3::host
