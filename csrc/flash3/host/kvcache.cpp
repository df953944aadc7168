#include "flash3/host/kvcache.h"

#include <cmath>
#include <sstream>

#include "flash3/common/attn_logic.h"
#include "flash3/decode/api.h"
#include "flash3/decode/combine.h"
#include "flash3/decode/split_heuristic.h"
#include "flash3/host/fwd_params.h"
#include "flash3/host/kernel_pick.h"

namespace flash3::host {

void fwd_kvcache_sm90(Backend& be, const TensorView& q, const TensorView& k_cache, const TensorView& v_cache,
                      const TensorView& out, const TensorView& lse, const TensorView& seqused_k,
                      const TensorView* page_table, double softmax_scale, int64_t window_left,
                      int64_t window_right, double softcap, int64_t num_splits, const TensorView* k_descale,
                      const TensorView* v_descale, const TensorView* sinks, const TensorView* cu_seqlens_q,
                      int64_t max_seqlen_q, const TensorView* alibi_slopes, const TensorView* cache_leftpad,
                      bool descale_per_batch, const TensorView* qv, int64_t attention_chunk) {
  constexpr const char* kOp = "flash3.fwd_kvcache_sm90";
  check(q.device.kind == DeviceKind::cuda, kOp, ": q must be a CUDA tensor, got ", q.device);
  for (const TensorView* t : {&k_cache, &v_cache, &out, &lse, &seqused_k})
    check(t->device == q.device, kOp, ": all tensors must be on ", q.device, ", got one on ", t->device);
  const DeviceInfo& dev = device_info(q.device.index);
  check_hopper(dev, q, kOp);
  const DType dtype = q.dtype;  // bf16/fp16: the pick's check
  check(out.dtype == dtype, kOp, ": out must have q's dtype ", q.dtype_name);
  const bool fp8_cache = k_cache.dtype == DType::e4m3;
  check(fp8_cache ? v_cache.dtype == DType::e4m3 : k_cache.dtype == dtype && v_cache.dtype == dtype, kOp,
        ": k_cache and v_cache must both have q's dtype ", q.dtype_name, " or both be float8_e4m3fn, got ",
        k_cache.dtype_name, " and ", v_cache.dtype_name);
  check((k_descale != nullptr) == fp8_cache && (v_descale != nullptr) == fp8_cache, kOp,
        fp8_cache ? ": an FP8 cache needs k_descale and v_descale" : ": descales go with an FP8 cache only");
  check(lse.dtype == DType::f32, kOp, ": lse must be float32");
  const bool is_bf16 = dtype == DType::bf16;
  const bool varlen_q = cu_seqlens_q != nullptr;
  const int64_t q_dims = varlen_q ? 3 : 4;  // varlen: q/out (total_q, h, ·)
  for (auto [t, name] : {std::make_pair(&q, "q"), std::make_pair(&out, "out")})
    check(t->dim() == q_dims, kOp, ": ", name, " must be ", q_dims, "-D", varlen_q ? " with cu_seqlens_q" : "",
          ", got ", t->sizes());
  for (auto [t, name] : {std::make_pair(&k_cache, "k_cache"), std::make_pair(&v_cache, "v_cache")})
    check(t->dim() == 4, kOp, ": ", name, " must be 4-D, got ", t->sizes());
  if (varlen_q) {
    const TensorView& cu = *cu_seqlens_q;
    check(cu.device == q.device, kOp, ": cu_seqlens_q must be on ", q.device, ", got ", cu.device);
    check(cu.dtype == DType::i32, kOp, ": cu_seqlens_q must be int32, got ", cu.dtype_name);
    check(cu.dim() == 1 && cu.size(0) >= 1 && cu.is_contiguous(), kOp,
          ": cu_seqlens_q must be a contiguous (batch + 1,) vector, got ", cu.sizes());
    check(max_seqlen_q >= 0, kOp, ": max_seqlen_q must be >= 0, got ", max_seqlen_q);
  } else {
    check(max_seqlen_q == 0, kOp, ": max_seqlen_q goes with cu_seqlens_q");
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
  if (qv != nullptr) {  // MLA: the query's latent part, q's rows with d_v columns
    check(qv->device == q.device && qv->dtype == dtype, kOp, ": qv must have q's dtype ", q.dtype_name,
          " and device ", q.device, ", got ", qv->dtype_name, " on ", qv->device);
    check(d_v > 256 && !fp8_cache, kOp,
          ": qv runs on the MLA decode kernel only (d <= 64, 256 < d_v <= 512, caches of q's dtype), got d_v=", d_v);
    if (varlen_q) check_shape(*qv, "qv", {total_q, h, d_v});
    else check_shape(*qv, "qv", {b, s_q, h, d_v});
  }
  check_seqlens(&seqused_k, "seqused_k", b, q);
  check_seqlens(cache_leftpad, "cache_leftpad", b, q);
  check_heads(kOp, h, h_k);
  check_score_options(kOp, softcap, window_left, window_right);
  check_attention_chunk(kOp, attention_chunk);
  check(num_splits >= 0, kOp, ": num_splits must be >= 0 (0 = automatic)");
  const float* sinks_ptr = check_sinks(sinks, h, q, kOp);
  int64_t alibi_stride = 0;
  const float* alibi_ptr = check_alibi(alibi_slopes, b, h, q, kOp, &alibi_stride);
  int64_t capacity = slab_rows;  // keys a row can hold
  if (page_table != nullptr) {
    const TensorView& pt = *page_table;
    check(pt.device == q.device && pt.dtype == DType::i32 && pt.dim() == 2 && pt.size(0) == b &&
              (pt.stride(1) == 1 || pt.size(1) == 1),
          kOp, ": page_table must be int32 (", b, ", max_pages) with contiguous rows on ", q.device);
    capacity = pt.size(1) * slab_rows;
  } else {
    check(slabs == b, kOp, ": a cache without page_table must have batch ", b, " rows, got ", slabs);
  }
  // 2^30: key and packed-row indices plus a tile stay inside int32 on the device.
  check(capacity <= (int64_t(1) << 30), kOp, ": more than 2^30 keys per row");
  check(s_q * (h / h_k) <= (int64_t(1) << 30), kOp, ": s_q * (h / h_k) must be <= 2^30");

  check(fp8_cache || !descale_per_batch, kOp, ": descale_per_batch goes with an FP8 cache only");
  // Descales per slab (page or contiguous row), or per batch entry (FA3's (b, h_k), any cache).
  const int64_t ds_rows = descale_per_batch ? b : slabs;
  if (fp8_cache)
    for (auto [t, name] : {std::make_pair(k_descale, "k_descale"), std::make_pair(v_descale, "v_descale")})
      check(t->device == q.device && t->dtype == DType::f32 && t->dim() == 2 && t->size(0) == ds_rows &&
                t->size(1) == h_k,
            kOp, ": ", name, " must be float32 (", ds_rows, ", ", h_k, ")", descale_per_batch ? " (per batch)" : "",
            " on ", q.device, ", got ", t->dtype_name, " ", t->sizes());
  const FwdKernelEntry* entry =
      checked_pick(kOp, be.build_name(), fp8_cache ? KernelFamily::decode_fp8_cache : KernelFamily::decode, q, d, d_v,
                   softmax_scale, attention_chunk)
          .fwd;
  if (be.tracing()) {
    std::ostringstream os;
    os << "kernel decode " << dtype_name(entry->is_bf16) << (fp8_cache ? " kve4m3" : "") << " d=" << entry->head_dim
       << " d_v=" << entry->head_dim_v;
    be.trace(os.str());
  }
  if (total_q == 0 || h == 0) return;
  if (varlen_q) {  // rows of no sequence (cu_seqlens_q[b] < total_q) are never visited by a tile
    be.fill(out, 0.f);
    be.fill(lse, -INFINITY);
  }
  if (b == 0 || s_q == 0) return;
  if (slabs == 0 || slab_rows == 0 || capacity == 0) {  // no keys: out 0, lse -inf (or the sink)
    be.fill(out, 0.f);
    be.fill_empty_lse(lse, sinks, varlen_q ? 0 : 1);
    if (varlen_q && sinks != nullptr) be.neg_inf_rows_past_end(lse, *cu_seqlens_q, b);
    return;
  }
  check_tma_layout(q, "q", kOp);
  check_tma_layout(k_cache, "k_cache", kOp);
  check_tma_layout(v_cache, "v_cache", kOp);
  check_tma_layout(out, "out", kOp);
  if (qv != nullptr) check_tma_layout(*qv, "qv", kOp);  // 16-byte rows (the producer's loads)
  check(lse.stride(-1) == 1 || lse.size(-1) <= 1, kOp, ": lse must have a contiguous last dimension");

  FwdParams p;
  set_q_k_out(p, q, k_cache, out, lse, nullptr, nullptr, b, s_q, capacity);
  if (varlen_q) {  // packed q/out rows (no batch stride), lse (h, total_q)
    p.q_batch_stride = 0, p.q_row_stride = tma_stride(q, 0), p.q_head_stride = tma_stride(q, 1);
    p.o_batch_stride = 0, p.o_row_stride = tma_stride(out, 0), p.o_head_stride = tma_stride(out, 1);
    p.lse_batch_stride = 0, p.lse_head_stride = lse.stride(0);
    p.total_q = total_rows(total_q, true, "total_q");
    p.cu_seqlens_q = cu_seqlens_q->ptr<const int>();
  }
  p.v = v_cache.data_ptr();
  p.v_batch_stride = tma_stride(v_cache, 0);
  p.v_row_stride = tma_stride(v_cache, 1);
  p.v_head_stride = tma_stride(v_cache, 2);
  if (qv != nullptr) {
    p.qv = qv->data_ptr();
    p.qv_batch_stride = varlen_q ? 0 : tma_stride(*qv, 0);
    p.qv_row_stride = tma_stride(*qv, varlen_q ? 0 : 1);
    p.qv_head_stride = tma_stride(*qv, varlen_q ? 1 : 2);
  }
  p.seqused_k = seqused_k.ptr<const int>();
  if (cache_leftpad != nullptr) p.cache_leftpad = cache_leftpad->ptr<const int>();
  p.slab_rows = to_int(slab_rows, "slab_rows");
  p.num_slabs = to_int(slabs, "num_slabs");
  if (page_table != nullptr) {
    p.page_table = page_table->ptr<const int>();
    p.page_table_stride = page_table->stride(0);
  }
  p.is_bf16 = is_bf16;
  p.sinks = sinks_ptr;  // the epilogue adds them without splits; split partials stay sink-free
  p.alibi_slopes = alibi_ptr, p.alibi_batch_stride = alibi_stride;
  if (fp8_cache) {
    auto descale = [&](const TensorView& t) {  // one of index_stride (slab) / batch_stride is 0
      Descale ds;
      ds.ptr = t.ptr<const float>();
      (descale_per_batch ? ds.batch_stride : ds.index_stride) = t.stride(0);
      ds.head_stride = t.stride(1);
      return ds;
    };
    p.k_cache_descale = descale(*k_descale);
    p.v_cache_descale = descale(*v_descale);
  }

  // Split count from shapes only (the lengths live on the device): the capacity bounds the keys.
  const TileShape tile = attention_chunk > 0 ? decode_chunk_tile_shape(entry->head_dim, entry->head_dim_v, fp8_cache)
                                             : decode_tile_shape(entry->head_dim, entry->head_dim_v, fp8_cache);
  const int tiles = decode::decode_tiles(int(b), int(s_q), int(h), int(h_k), tile.block_m);
  const int n_blocks = int(decode::ceil_div64(capacity, tile.block_n));
  p.num_splits = decode::resolve_num_splits(int(num_splits), tiles, dev.num_sms, n_blocks);
  if (p.num_splits > 1) {
    // Varlen: by packed row, -inf for rows of no sequence (no tile writes them).
    const int64_t rows = varlen_q ? total_q : b * s_q;
    p.o_partial = static_cast<float*>(be.alloc(p.num_splits * rows * h * d_v, DType::f32, Init::none));
    p.lse_partial =
        static_cast<float*>(be.alloc(p.num_splits * h * rows, DType::f32, varlen_q ? Init::neg_inf : Init::none));
  }
  if (be.tracing()) {
    std::ostringstream os;
    os << kOp << " block_n=" << tile.block_n << " capacity=" << capacity << " paged=" << int(page_table != nullptr)
       << " leftpad=" << int(cache_leftpad != nullptr)
       << " descale_per_batch=" << int(descale_per_batch)
       << " slab_rows=" << p.slab_rows << " num_splits=" << p.num_splits << " (asked " << num_splits << ")";
    be.trace(os.str());
  }
  set_mask_and_launch(p, entry->launch, be, dev, softmax_scale, softcap, window_left, window_right, kOp,
                      dtype_name(is_bf16), attention_chunk);
  if (p.num_splits > 1) {
    CombineParams c{};
    c.o_partial = p.o_partial;
    c.lse_partial = p.lse_partial;
    c.out = out.data_ptr();
    c.o_batch_stride = out.stride(0), c.o_row_stride = out.stride(1), c.o_head_stride = out.stride(2);
    c.lse = lse.ptr<float>();
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
    const int err = run_combine(c, be.stream());
    check(err == 0, kOp, ": combine launch failed: ", cuda_error_string(err));
  }
}

}  // namespace flash3::host
