// The decode (KV-cache) attention op, torch-free: torch.ops.flash3.fwd_kvcache_sm90
// (csrc/fwd_kvcache_binding.cpp adapts it; the simulator driver calls it). Optional tensors are nullptr
// when absent.
//   q (b, s_q, h, d) against caches (b, capacity, h_k, d|d_v), or paged (num_pages, page_size, h_k,
//   d|d_v) with int32 page_table (b, max_pages); row i sees its first seqused_k[i] keys (clamped to
//   the cache). Packed GQA, split-KV (num_splits 0: decode/split_heuristic.h, from shapes only)
//   merged by the combine kernel. Caches of q's dtype, or float8_e4m3fn with float32
//   k_descale/v_descale (num_slabs, h_k), or (b, h_k) with descale_per_batch (FA3's: row i's keys
//   read with its own descales, whatever slab holds them; paged caches too). sinks: float32 (h,) (the kernel's epilogue without
//   splits, else the combine). Packed queries (cu_seqlens_q int32 (b + 1,), max_seqlen_q): q
//   (total_q, h, d), out (total_q, h, d_v), lse (h, total_q); rows of no sequence get out 0, lse
//   -inf. cache_leftpad: int32 (b,), FA3's left padding: row i's keys are cache positions
//   [cache_leftpad[i], seqused_k[i]) (clamped into the row's keys by the kernel), masks counting
//   keys from there. qv: FA3's MLA query part (b, s_q, h, d_v) (packed: (total_q, h, d_v)) in q's
//   dtype, scores softmax_scale * (q.k + qv.v); only with the MLA decode kernel (d <= 64,
//   256 < d_v <= 512, caches of q's dtype), which also runs such calls without qv.
//   attention_chunk: FA3's chunked local attention (0 = off; attn_logic.h Mask) on the tokens'
//   positions (bottom-right aligned on each row's keys), intersecting the window; every decode
//   kernel takes it (above kDecodeChunkMaxHeadDim on its chunk tile), the MLA kernel too. No host
//   synchronization.
#pragma once
#include <cstdint>

#include "flash3/host/backend.h"

namespace flash3::host {

void fwd_kvcache_sm90(Backend& be, const TensorView& q, const TensorView& k_cache, const TensorView& v_cache,
                      const TensorView& out, const TensorView& lse, const TensorView& seqused_k,
                      const TensorView* page_table, double softmax_scale, int64_t window_left,
                      int64_t window_right, double softcap, int64_t num_splits, const TensorView* k_descale,
                      const TensorView* v_descale, const TensorView* sinks, const TensorView* cu_seqlens_q,
                      int64_t max_seqlen_q, const TensorView* alibi_slopes,
                      const TensorView* cache_leftpad = nullptr, bool descale_per_batch = false,
                      const TensorView* qv = nullptr, int64_t attention_chunk = 0);

}  // namespace flash3::host
