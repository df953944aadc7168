// torch side of the decode (KV-cache) attention kernels (a fragment of the flash3 op library;
// binding.cpp defines it).
//
//   flash3::fwd_kvcache_sm90(q, k_cache, v_cache, out!, lse!, seqused_k, page_table?, softmax_scale,
//                            causal, window_left, window_right, softcap, num_splits, k_descale?,
//                            v_descale?, sinks?, cu_seqlens_q?, max_seqlen_q) -> ()
//       CUDA: q (b, s_q, h, d) against caches (b, capacity, h_k, d|d_v), or paged
//       (num_pages, page_size, h_k, d|d_v) with int32 page_table (b, max_pages); row i sees its
//       first seqused_k[i] keys (clamped to the cache). Packed GQA, split-KV (num_splits 0: the
//       heuristic of decode/split_heuristic.h, from shapes only) merged by the combine kernel.
//       Caches of q's dtype, or float8_e4m3fn with float32 k_descale/v_descale (num_slabs, h_k):
//       the stored x8 of slab s, kv head j is x8 * descale[s, j]. sinks: float32 (h,), attention
//       sinks (the kernel's epilogue without splits, else the combine; lse includes them).
//       Packed (varlen) queries (cu_seqlens_q int32 (b + 1,), max_seqlen_q): q (total_q, h, d),
//       out (total_q, h, d_v), lse (h, total_q); sequence i's queries are rows
//       cu_seqlens_q[i]..cu_seqlens_q[i+1] (0 allowed), masks bottom-right per sequence; rows of
//       no sequence get out 0, lse -inf (the op zero-fills out and fills lse first; no tile and,
//       through CombineParams::seq_end, no combine writes them); split-KV partials are indexed by
//       packed row (combined as one batch of total_q rows).
//       No host synchronization: capturable in a CUDA graph. Meta: nothing.
// flash3/ops.py validates first; these checks are a defence of the kernels' memory accesses.
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>

#include "binding_common.h"
#include "flash3/common/attn_logic.h"
#include "flash3/decode/combine.h"
#include "flash3/decode/split_heuristic.h"
#include "flash3/fwd/api.h"
#include "flash3/fwd/params.h"

namespace flash3 {
namespace {

constexpr const char* kOp = "flash3.fwd_kvcache_sm90";

void fwd_kvcache_sm90_cuda(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& out,
                           const Tensor& lse, const Tensor& seqused_k, const std::optional<Tensor>& page_table,
                           double softmax_scale, bool causal, int64_t window_left, int64_t window_right,
                           double softcap, int64_t num_splits, const std::optional<Tensor>& k_descale,
                           const std::optional<Tensor>& v_descale, const std::optional<Tensor>& sinks,
                           // ---- varlen (packed) queries: appended last, defaults keep old callers valid
                           const std::optional<Tensor>& cu_seqlens_q, int64_t max_seqlen_q,
                           const std::optional<Tensor>& alibi_slopes) {
  TORCH_CHECK(q.is_cuda(), kOp, ": q must be a CUDA tensor, got ", q.device());
  for (const Tensor* t : {&k_cache, &v_cache, &out, &lse, &seqused_k})
    TORCH_CHECK(t->device() == q.device(), kOp, ": all tensors must be on ", q.device(), ", got one on ",
                t->device());
  c10::cuda::CUDAGuard guard(q.device());
  const DeviceInfo& dev = device_info(q.get_device());
  TORCH_CHECK(dev.major == 9 && dev.minor == 0, kOp, " needs an sm_90 (Hopper) GPU; ", q.device(), " is sm_",
              dev.major, dev.minor);
  const auto dtype = q.scalar_type();
  TORCH_CHECK(dtype == at::kBFloat16 || dtype == at::kHalf, kOp, ": q must be bfloat16 or float16, got ", dtype);
  TORCH_CHECK(out.scalar_type() == dtype, kOp, ": out must have q's dtype ", dtype);
  const bool fp8_cache = k_cache.scalar_type() == at::kFloat8_e4m3fn;
  TORCH_CHECK(fp8_cache ? v_cache.scalar_type() == at::kFloat8_e4m3fn
                        : k_cache.scalar_type() == dtype && v_cache.scalar_type() == dtype,
              kOp, ": k_cache and v_cache must both have q's dtype ", dtype, " or both be float8_e4m3fn, got ",
              k_cache.scalar_type(), " and ", v_cache.scalar_type());
  TORCH_CHECK(k_descale.has_value() == fp8_cache && v_descale.has_value() == fp8_cache, kOp,
              fp8_cache ? ": an FP8 cache needs k_descale and v_descale" : ": descales go with an FP8 cache only");
  TORCH_CHECK(lse.scalar_type() == at::kFloat, kOp, ": lse must be float32");
  const bool is_bf16 = dtype == at::kBFloat16;
  const bool varlen_q = cu_seqlens_q.has_value();
  const int64_t q_dims = varlen_q ? 3 : 4;  // varlen: q/out (total_q, h, ·)
  for (auto [t, name] : {std::make_pair(&q, "q"), std::make_pair(&out, "out")})
    TORCH_CHECK(t->dim() == q_dims, kOp, ": ", name, " must be ", q_dims, "-D", varlen_q ? " with cu_seqlens_q" : "",
                ", got ", t->sizes());
  for (auto [t, name] : {std::make_pair(&k_cache, "k_cache"), std::make_pair(&v_cache, "v_cache")})
    TORCH_CHECK(t->dim() == 4, kOp, ": ", name, " must be 4-D, got ", t->sizes());
  if (varlen_q) {
    const Tensor& cu = *cu_seqlens_q;
    TORCH_CHECK(cu.device() == q.device(), kOp, ": cu_seqlens_q must be on ", q.device(), ", got ", cu.device());
    TORCH_CHECK(cu.scalar_type() == at::kInt, kOp, ": cu_seqlens_q must be int32, got ", cu.scalar_type());
    TORCH_CHECK(cu.dim() == 1 && cu.size(0) >= 1 && cu.is_contiguous(), kOp,
                ": cu_seqlens_q must be a contiguous (batch + 1,) vector, got ", cu.sizes());
    TORCH_CHECK(max_seqlen_q >= 0, kOp, ": max_seqlen_q must be >= 0, got ", max_seqlen_q);
  } else {
    TORCH_CHECK(max_seqlen_q == 0, kOp, ": max_seqlen_q goes with cu_seqlens_q");
  }
  // Varlen: b from cu_seqlens_q, s_q = max_seqlen_q (sizes the tile grid), total_q = q.size(0).
  const int64_t b = varlen_q ? cu_seqlens_q->size(0) - 1 : q.size(0);
  const int64_t s_q = varlen_q ? max_seqlen_q : q.size(1), total_q = varlen_q ? q.size(0) : b * s_q;
  const int64_t h = q.size(-2), d = q.size(-1);
  const int64_t slabs = k_cache.size(0), slab_rows = k_cache.size(1), h_k = k_cache.size(2);
  const int64_t d_v = v_cache.size(3);
  check_shape(k_cache, "k_cache", {slabs, slab_rows, h_k, d});
  check_shape(v_cache, "v_cache", {slabs, slab_rows, h_k, d_v});
  if (varlen_q) {
    check_shape(out, "out", {total_q, h, d_v});
    check_shape(lse, "lse", {h, total_q});
  } else {
    check_shape(out, "out", {b, s_q, h, d_v});
    check_shape(lse, "lse", {b, h, s_q});
  }
  check_seqlens(seqused_k, "seqused_k", b, q);
  TORCH_CHECK(h_k > 0 && h % h_k == 0, kOp, ": the number of query heads (", h,
              ") must be a multiple of the number of kv heads (", h_k, ")");
  TORCH_CHECK(d % 8 == 0 && d_v % 8 == 0 && d > 0 && d_v > 0 && d <= 256 && d_v <= 256, kOp,
              ": head dims must be multiples of 8 in [8, 256], got d=", d, " d_v=", d_v);
  TORCH_CHECK(softcap >= 0.0, kOp, ": softcap must be >= 0 (0 = off)");
  TORCH_CHECK(softmax_scale > 0.0 && std::isfinite(softmax_scale), kOp, ": softmax_scale must be finite and > 0");
  TORCH_CHECK(window_left >= -1 && window_right >= -1, kOp, ": window sizes must be >= -1");
  TORCH_CHECK(num_splits >= 0, kOp, ": num_splits must be >= 0 (0 = automatic)");
  const float* sinks_ptr = check_sinks(sinks, h, q, kOp);
  int64_t alibi_stride = 0;
  const float* alibi_ptr = check_alibi(alibi_slopes, b, h, q, kOp, &alibi_stride);
  int64_t capacity = slab_rows;  // keys a row can hold
  if (page_table.has_value()) {
    const Tensor& pt = *page_table;
    TORCH_CHECK(pt.device() == q.device() && pt.scalar_type() == at::kInt && pt.dim() == 2 && pt.size(0) == b &&
                    (pt.stride(1) == 1 || pt.size(1) == 1),
                kOp, ": page_table must be int32 (", b, ", max_pages) with contiguous rows on ", q.device());
    capacity = pt.size(1) * slab_rows;
  } else {
    TORCH_CHECK(slabs == b, kOp, ": a cache without page_table must have batch ", b, " rows, got ", slabs);
  }
  // 2^30: key and packed-row indices plus a tile stay inside int32 on the device.
  TORCH_CHECK(capacity <= (int64_t(1) << 30), kOp, ": more than 2^30 keys per row");
  TORCH_CHECK(s_q * (h / h_k) <= (int64_t(1) << 30), kOp, ": s_q * (h / h_k) must be <= 2^30");

  if (fp8_cache)
    for (auto [t, name] : {std::make_pair(&*k_descale, "k_descale"), std::make_pair(&*v_descale, "v_descale")})
      TORCH_CHECK(t->device() == q.device() && t->scalar_type() == at::kFloat && t->dim() == 2 &&
                      t->size(0) == slabs && t->size(1) == h_k,
                  kOp, ": ", name, " must be float32 (", slabs, ", ", h_k, ") on ", q.device(), ", got ",
                  t->scalar_type(), " ", t->sizes());
  const FwdKernelEntry* entry =
      pick_fwd_kernel(fwd_decode_kernels(fp8_cache), is_bf16, int(d), int(d_v), false);
  TORCH_CHECK(entry != nullptr, kOp, ": no ", dtype_name(is_bf16), fp8_cache ? " FP8-cache" : "",
              " decode kernel for head dim (", d, ", ", d_v,
              ") or larger in this build of flash3._C; see torch.ops.flash3.kernel_info()");
  if (total_q == 0 || h == 0) return;
  if (varlen_q) {  // rows of no sequence (cu_seqlens_q[b] < total_q) are never visited by a tile
    out.zero_();
    lse.fill_(-std::numeric_limits<float>::infinity());
  }
  if (b == 0 || s_q == 0) return;
  if (slabs == 0 || slab_rows == 0 || capacity == 0) {  // no keys: out 0, lse -inf (or the sink)
    out.zero_();
    fill_empty_lse(lse, sinks, varlen_q ? 0 : 1);
    if (varlen_q && sinks.has_value()) {  // rows of no sequence: -inf (compared on the device, no sync)
      const Tensor past = at::arange(total_q, cu_seqlens_q->options()).ge(cu_seqlens_q->select(0, b));
      lse.masked_fill_(past.unsqueeze(0), -std::numeric_limits<float>::infinity());
    }
    return;
  }
  check_tma_layout(q, "q", kOp);
  check_tma_layout(k_cache, "k_cache", kOp);
  check_tma_layout(v_cache, "v_cache", kOp);
  check_tma_layout(out, "out", kOp);
  TORCH_CHECK(lse.stride(-1) == 1 || lse.size(-1) <= 1, kOp, ": lse must have a contiguous last dimension");

  FwdParams p;
  set_q_k_out(p, q, k_cache, out, lse, std::nullopt, std::nullopt, b, s_q, capacity);
  if (varlen_q) {  // packed q/out rows (no batch stride), lse (h, total_q)
    p.q_batch_stride = 0, p.q_row_stride = tma_stride(q, 0), p.q_head_stride = tma_stride(q, 1);
    p.o_batch_stride = 0, p.o_row_stride = tma_stride(out, 0), p.o_head_stride = tma_stride(out, 1);
    p.lse_batch_stride = 0, p.lse_head_stride = lse.stride(0);
    p.total_q = total_rows(total_q, true, "total_q");
    p.cu_seqlens_q = cu_seqlens_q->data_ptr<int>();
  }
  p.v = v_cache.data_ptr();
  p.v_batch_stride = tma_stride(v_cache, 0);
  p.v_row_stride = tma_stride(v_cache, 1);
  p.v_head_stride = tma_stride(v_cache, 2);
  p.seqused_k = seqused_k.data_ptr<int>();
  p.slab_rows = to_int(slab_rows, "slab_rows");
  p.num_slabs = to_int(slabs, "num_slabs");
  if (page_table.has_value()) {
    p.page_table = page_table->data_ptr<int>();
    p.page_table_stride = page_table->stride(0);
  }
  p.is_bf16 = is_bf16;
  p.sinks = sinks_ptr;  // the epilogue adds them without splits; split partials stay sink-free
  p.alibi_slopes = alibi_ptr, p.alibi_batch_stride = alibi_stride;
  if (fp8_cache) {
    auto descale = [](const Tensor& t) {
      Descale ds;
      ds.ptr = t.data_ptr<float>();
      ds.batch_stride = t.stride(0), ds.head_stride = t.stride(1);
      return ds;
    };
    p.k_cache_descale = descale(*k_descale);
    p.v_cache_descale = descale(*v_descale);
  }

  // Split count from shapes only (the lengths live on the device): the capacity bounds the keys.
  const TileShape tile = decode_tile_shape(entry->head_dim, entry->head_dim_v, fp8_cache);
  const int tiles = decode::decode_tiles(int(b), int(s_q), int(h), int(h_k), tile.block_m);
  const int n_blocks = int(decode::ceil_div64(capacity, tile.block_n));
  p.num_splits = decode::resolve_num_splits(int(num_splits), tiles, dev.num_sms, n_blocks);
  Tensor o_partial, lse_partial;
  if (p.num_splits > 1) {
    const auto f32 = q.options().dtype(at::kFloat);
    if (varlen_q) {  // by packed row; -inf for rows of no sequence (no tile writes them)
      o_partial = at::empty({p.num_splits, total_q, h, d_v}, f32);
      lse_partial = at::full({p.num_splits, h, total_q}, -std::numeric_limits<float>::infinity(), f32);
    } else {
      o_partial = at::empty({p.num_splits, b, s_q, h, d_v}, f32);
      lse_partial = at::empty({p.num_splits, b, h, s_q}, f32);
    }
    p.o_partial = o_partial.data_ptr<float>();
    p.lse_partial = lse_partial.data_ptr<float>();
  }
  set_mask_and_launch(p, entry->launch, q, dev, softmax_scale, softcap, causal, window_left, window_right, kOp,
                      dtype_name(is_bf16));
  if (p.num_splits > 1) {
    CombineParams c{};
    c.o_partial = p.o_partial;
    c.lse_partial = p.lse_partial;
    c.out = out.data_ptr();
    c.o_batch_stride = out.stride(0), c.o_row_stride = out.stride(1), c.o_head_stride = out.stride(2);
    c.lse = lse.data_ptr<float>();
    c.lse_batch_stride = lse.stride(0), c.lse_head_stride = lse.stride(1);
    c.num_splits = p.num_splits;
    c.batch = p.batch, c.seqlen_q = p.seqlen_q, c.num_heads = p.num_heads, c.head_dim_v = p.head_dim_v;
    if (varlen_q) {  // the packed layout is the batched one with b = 1, s_q = total_q
      c.o_batch_stride = 0, c.o_row_stride = out.stride(0), c.o_head_stride = out.stride(1);
      c.lse_batch_stride = 0, c.lse_head_stride = lse.stride(0);
      c.batch = 1, c.seqlen_q = p.total_q;
      c.seq_end = p.cu_seqlens_q + b;  // rows after the last sequence keep out 0, lse -inf
    }
    c.is_bf16 = is_bf16;
    c.sinks = sinks_ptr;  // the combine adds each row's sink once
    const int err = run_combine(c, c10::cuda::getCurrentCUDAStream(q.get_device()).stream());
    TORCH_CHECK(err == 0, kOp, ": combine launch failed: ", cudaGetErrorString(static_cast<cudaError_t>(err)));
  }
}

void fwd_kvcache_sm90_meta(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                           const std::optional<Tensor>&, double, bool, int64_t, int64_t, double, int64_t,
                           const std::optional<Tensor>&, const std::optional<Tensor>&,
                           const std::optional<Tensor>&, const std::optional<Tensor>&, int64_t,
                           const std::optional<Tensor>&) {}

}  // namespace
}  // namespace flash3

TORCH_LIBRARY_FRAGMENT(flash3, m) {
  m.def(
      "fwd_kvcache_sm90(Tensor q, Tensor k_cache, Tensor v_cache, Tensor(a!) out, Tensor(b!) lse, "
      "Tensor seqused_k, Tensor? page_table, float softmax_scale, bool causal, int window_left, "
      "int window_right, float softcap, int num_splits, Tensor? k_descale=None, Tensor? v_descale=None, "
      "Tensor? sinks=None"
      // varlen (packed) queries: keep these last
      ", Tensor? cu_seqlens_q=None, int max_seqlen_q=0"
      ", Tensor? alibi_slopes=None"
      ") -> ()");
}

TORCH_LIBRARY_IMPL(flash3, CUDA, m) { m.impl("fwd_kvcache_sm90", &flash3::fwd_kvcache_sm90_cuda); }

TORCH_LIBRARY_IMPL(flash3, Meta, m) { m.impl("fwd_kvcache_sm90", &flash3::fwd_kvcache_sm90_meta); }
