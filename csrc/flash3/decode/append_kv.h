// The fused KV-cache append of attention_with_kvcache: new k/v (optionally rotated) written into
// the cache at positions cache_seqlens[b] + t, and q rotated at its positions, in one launch with
// no host synchronization. Plain C++ (no torch, no CUDA headers): the binding fills AppendKvParams.
//
// Semantics are flash3/reference/__init__.py's kvcache_write and flash3/rotary.py's kvcache_rotary:
//  - batch entry b's new tokens t: k[b, t] (batched), or with cu_seqlens_k_new (FA3's packed new
//    keys) packed row cu_seqlens_k_new[b] + t, t < cu_seqlens_k_new[b + 1] - cu_seqlens_k_new[b];
//    its query tokens likewise, q[b, t] or with cu_seqlens_q packed row cu_seqlens_q[b] + t. A
//    packed row no entry holds (past cu[batch]) is no entry's: its k/v are not appended, its q is
//    copied to q_out unrotated. With a cu that is not non-decreasing, which rows an entry gets is
//    unspecified (validation mode refuses such offsets), but every access stays in bounds;
//  - key position pos = cache_seqlens[b] + t; contiguous cache: slot (b, pos); paged cache: slot
//    (page_table[b][pos / page_size], pos % page_size) (decode::page_slot);
//  - a slot outside the cache (pos < 0, pos >= capacity or max_pages * page_size, a page id
//    outside [0, num_pages)) is skipped: never written, whatever cache_seqlens/page_table hold;
//  - rotary (rotary_dim > 0): pairs (c, c + rotary_dim / 2) (GPT-NeoX) or (2c, 2c + 1) (GPT-J,
//    interleaved) of the first rotary_dim channels, computed in fp32 and rounded once; the
//    table row is the position clamped to [0, seqlen_ro - 1]; new k token t at r + t, q token t
//    at r + t (q_per_token) or r, where r = rotary_seqlens[b] (FA3's seqlens_rotary) when given,
//    else cache_seqlens[b] (the key position);
//  - FP8 (e4m3) caches (k_descale set): the (rotated) value x, rounded to q's dtype, is stored as
//    e4m3(clamp(x / descale, -448, 448)) (IEEE division, nearest even, NaN kept) with the descale of
//    its slab and kv head (flash3.reference quantize_fp8_cache);
//  - e4m3 new k/v (kv_e4m3, FA3's FP8 cache with descales per batch entry): copied into the e4m3
//    cache byte for byte (they share their entry's descales, applied by the decode kernel); no
//    descales here. With rotary (FA3's: q is e4m3 too) the rotated channels of k and q are
//    computed in fp32 from the e4m3 values as above and rounded once to e4m3, saturating at +-448
//    (NaN keeps its sign; which sign a rotated NaN gets is unspecified); the rest copied.
#pragma once

#include <cstdint>

namespace flash3 {

struct AppendKvParams {
  // (b, s_new, h_k, d) new keys, (b, s_new, h_k, d_v) new values; element strides. Packed
  // (cu_seqlens_k_new): (total_new, h_k, ·), batch strides 0.
  const void* k;
  const void* v;
  int64_t k_batch_stride, k_row_stride, k_head_stride;
  int64_t v_batch_stride, v_row_stride, v_head_stride;
  // Caches: (b or num_pages, capacity or page_size, h_k, d | d_v).
  void* k_cache;
  void* v_cache;
  int64_t kc_batch_stride, kc_row_stride, kc_head_stride;
  int64_t vc_batch_stride, vc_row_stride, vc_head_stride;
  // q (b, s_q, h, d) and its rotated copy q_out (same shape); only read/written with rotary.
  // Packed (cu_seqlens_q): (total_q, h, d), batch strides 0.
  const void* q;
  void* q_out;
  int64_t q_batch_stride, q_row_stride, q_head_stride;
  int64_t qo_batch_stride, qo_row_stride, qo_head_stride;
  const int32_t* cache_seqlens;  // (b,)
  const int32_t* page_table;     // (b, max_pages) with row stride, or nullptr (contiguous)
  int64_t page_table_stride;
  int max_pages;
  int64_t num_pages;             // paged: cache dim 0; contiguous: unused
  int page_size;                 // paged: cache dim 1; contiguous: capacity (cache dim 1)
  // Rotary tables, fp32 (seqlen_ro, rotary_dim / 2), contiguous rows; nullptr = no rotary.
  const float* rotary_cos;
  const float* rotary_sin;
  const int32_t* rotary_seqlens;  // (b,) rotary position of token 0; nullptr = cache_seqlens
  int seqlen_ro;
  int rotary_dim;
  bool rotary_interleaved;
  bool q_per_token;
  int batch, s_new, s_q, h, h_k, d, d_v;
  // FA3's packed layouts, int32 (batch + 1,) each, or nullptr (batched). With one, s_new / s_q is
  // the packed row count (total_new / total_q).
  const int32_t* cu_seqlens_k_new;
  const int32_t* cu_seqlens_q;
  bool is_bf16;
  // FP8 caches: fp32 descales (slabs, h_k), element strides; nullptr: caches of q's dtype.
  const float* k_descale;
  const float* v_descale;
  int64_t kd_slab_stride, kd_head_stride, vd_slab_stride, vd_head_stride;
  bool kv_e4m3;  // k/v, the caches (and q, q_out) float8_e4m3fn: stored as they are or rotated (k_descale unset)
};

// Launches the append (and the q rotation when rotary) on `stream` (a cudaStream_t).
// Returns 0 or a cudaError_t value.
int run_append_kv(const AppendKvParams& params, void* stream);

}  // namespace flash3
