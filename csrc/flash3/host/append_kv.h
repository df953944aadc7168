// The fused KV-cache append op, torch-free: torch.ops.flash3.append_kv_sm90
// (csrc/append_kv_binding.cpp adapts it; the simulator driver calls it). Writes k/v (rotated when
// rotary tables are given) into the cache at cache_seqlens[b] + t, skipping slots outside the cache,
// and q rotated into q_out; no host synchronization (csrc/flash3/decode/append_kv.h). float8_e4m3fn
// caches take float32 descales (slabs, h_k) and store e4m3(clamp(x / descale, +-448)); with
// descales per batch entry (FA3's, descale_per_batch) the new k/v are float8_e4m3fn, copied
// unchanged (no descales passed: they share their entry's descales at attention), or with rotary
// (q float8_e4m3fn too) rotated in fp32 and rounded to e4m3 with q. FA3's
// packed layouts: cu_seqlens_q (b + 1,) with q/q_out (total_q, h, d), cu_seqlens_k_new (b + 1,)
// with k/v (total_new, h_k, ·); entry i's tokens are its packed rows (csrc/flash3/decode/append_kv.h).
#pragma once
#include "flash3/host/backend.h"

namespace flash3::host {

void append_kv_sm90(Backend& be, const TensorView& q, const TensorView& k_cache, const TensorView& v_cache,
                    const TensorView& k, const TensorView& v, const TensorView& cache_seqlens,
                    const TensorView* page_table, const TensorView* rotary_cos, const TensorView* rotary_sin,
                    bool rotary_interleaved, bool q_per_token, const TensorView& q_out, const TensorView* k_descale,
                    const TensorView* v_descale, const TensorView* rotary_seqlens,
                    bool descale_per_batch = false, const TensorView* cu_seqlens_q = nullptr,
                    const TensorView* cu_seqlens_k_new = nullptr);

}  // namespace flash3::host
