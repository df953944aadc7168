// The fused KV-cache append (see append_kv.h for the semantics). Memory-bound and tiny per
// decode step (b * s_new * h_k rows), so the design is plain: one CTA per row of k/v (and per row
// of q when rotating), one thread per channel. Every cache write is guarded by the slot check, so
// no value of cache_seqlens/page_table can make it write outside the cache or into another row's
// pages (a bad page id is skipped, not clamped).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "flash3/common/fp32_rn.cuh"  // mul_rn, add_rn, sub_rn: no ftz, as torch
#include "flash3/decode/append_kv.h"

namespace flash3 {
namespace {

constexpr int kThreads = 128;

using E4m3 = __nv_fp8_storage_t;  // an e4m3 byte (FA3's FP8 q, new keys and cache)

// The e4m3 byte of y: clamped to +-448 (FA3's saturating conversion), rounded to nearest even;
// NaN keeps its sign (0x7F / 0xFF, as torch converts it).
__device__ __forceinline__ E4m3 e4m3_rn_sat(float y) {
  if (isnan(y)) return signbit(y) ? 0xFF : 0x7F;
  y = y > 448.f ? 448.f : (y < -448.f ? -448.f : y);
  return __nv_cvt_float_to_fp8(y, __NV_SATFINITE, __NV_E4M3);
}

template <class T> __device__ __forceinline__ float to_float(T x);
template <> __device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <> __device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
template <> __device__ __forceinline__ float to_float(E4m3 x) {  // exact (every e4m3 value is an f16)
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(x, __NV_E4M3)));
}
template <class T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ __half from_float(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ E4m3 from_float(float x) { return e4m3_rn_sat(x); }

// Channel c of a rotated row x (the first rotary_dim channels; the rest copied). Products and
// sums are rounded separately (no FMA contraction), as flash3/rotary.py computes them in fp32.
template <class T>
__device__ __forceinline__ T rotate(const T* x, int c, int pos, const AppendKvParams& p) {
  if (p.rotary_cos == nullptr || c >= p.rotary_dim) return x[c];
  const int half = p.rotary_dim / 2;
  const int row = pos < 0 ? 0 : (pos >= p.seqlen_ro ? p.seqlen_ro - 1 : pos);
  int i, j0, j1;  // angle index and the pair (x0, x1)
  bool second;
  if (p.rotary_interleaved) {
    i = c / 2, j0 = 2 * i, j1 = j0 + 1, second = c & 1;
  } else {
    second = c >= half, i = second ? c - half : c, j0 = i, j1 = i + half;
  }
  const float cs = p.rotary_cos[int64_t(row) * half + i];
  const float sn = p.rotary_sin[int64_t(row) * half + i];
  const float x0 = to_float(x[j0]), x1 = to_float(x[j1]);
  const float r = second ? add_rn(mul_rn(x0, sn), mul_rn(x1, cs))
                         : sub_rn(mul_rn(x0, cs), mul_rn(x1, sn));
  return from_float<T>(r);
}

// The e4m3 byte of x / descale: IEEE division (div_rn: no fast-math ftz), then e4m3_rn_sat:
// flash3/reference/__init__.py quantize_fp8_cache.
__device__ __forceinline__ E4m3 quantize_e4m3(float x, float descale) { return e4m3_rn_sat(div_rn(x, descale)); }

// Batch entry b and token t of token row `row`: batched (cu == nullptr), row = b * s + t; packed,
// the last entry b with cu[b] <= row, holding it when row < cu[b + 1] (b = -1 otherwise: no entry's
// row). A binary search reading only cu[0 .. batch], whatever cu holds.
struct Entry {
  int b, t;
};

__device__ __forceinline__ Entry entry_of(const int32_t* cu, int batch, int s, int row) {
  if (cu == nullptr) {
    const int b = row / s;
    return {b, row - b * s};
  }
  int lo = -1, hi = batch;  // cu[lo] <= row (lo -1: none found yet); hi == batch or cu[hi] > row
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;  // in [0, batch - 1]
    if (cu[mid] <= row) lo = mid;
    else hi = mid;
  }
  if (lo < 0 || row >= cu[lo + 1]) return {-1, 0};
  return {lo, row - cu[lo]};
}

// Cache slot (dim-0 index, row) of key position pos of batch row b; slab < 0 when outside.
struct Slot {
  int64_t slab, row;
};

__device__ __forceinline__ Slot cache_slot(const AppendKvParams& p, int b, int64_t pos) {
  if (pos < 0) return {-1, 0};
  if (p.page_table == nullptr) {
    if (pos >= p.page_size) return {-1, 0};  // page_size holds the capacity here
    return {b, pos};
  }
  if (pos >= int64_t(p.max_pages) * p.page_size) return {-1, 0};
  const int idx = int(pos) / p.page_size, off = int(pos) % p.page_size;  // pos < 2^31 here
  const int64_t page = p.page_table[b * p.page_table_stride + idx];
  if (page < 0 || page >= p.num_pages) return {-1, 0};
  return {page, off};
}

// Row r of the new keys, one (new token, kv head) row of k and v, as both kernels find it: its
// entry b (-1: not appended, no entry's row or a slot outside the cache; the rest unset then),
// token t, key position pos, row of k/v (packed: the packed row) and cache slot.
struct NewKv {
  int b, t, hk, row;
  int64_t pos;
  Slot slot;
};

__device__ __forceinline__ NewKv new_kv(const AppendKvParams& p, int r) {
  NewKv x;
  x.hk = r % p.h_k;
  const int tok = r / p.h_k;
  const auto [b, t] = entry_of(p.cu_seqlens_k_new, p.batch, p.s_new, tok);
  x.b = -1;
  if (b < 0) return x;  // no entry's row
  x.pos = int64_t(p.cache_seqlens[b]) + t;
  x.slot = cache_slot(p, b, x.pos);
  if (x.slot.slab < 0) return x;
  x.b = b, x.t = t;
  x.row = p.cu_seqlens_k_new != nullptr ? tok : t;  // packed: batch strides 0
  return x;
}

// The k/v rows (S: the new keys' element) and cache rows (C: the cache's) of an appended row x.
// Computed after the b < 0 exit, from the kernel's parameters: the compiler then knows they are
// global pointers (LDG/STG, not generic loads and stores).
template <class S, class C>
struct KvRows {
  const S *k, *v;
  C *kc, *vc;
};

template <class S, class C>
__device__ __forceinline__ KvRows<S, C> kv_rows(const AppendKvParams& p, const NewKv& x) {
  return {static_cast<const S*>(p.k) + x.b * p.k_batch_stride + x.row * p.k_row_stride + x.hk * p.k_head_stride,
          static_cast<const S*>(p.v) + x.b * p.v_batch_stride + x.row * p.v_row_stride + x.hk * p.v_head_stride,
          static_cast<C*>(p.k_cache) + x.slot.slab * p.kc_batch_stride + x.slot.row * p.kc_row_stride +
              x.hk * p.kc_head_stride,
          static_cast<C*>(p.v_cache) + x.slot.slab * p.vc_batch_stride + x.slot.row * p.vc_row_stride +
              x.hk * p.vc_head_stride};
}

// T: q's and the new keys' element; C: the cache's, T, or E4m3 for an FP8 cache: with 16-bit T
// quantized on the way in (descales per slab), with T = E4m3 (FA3's FP8 q, new keys and cache,
// descales per batch entry) stored as they are, rotated (in fp32, rounded once to e4m3) or not.
template <class T, class C>
__global__ void __launch_bounds__(kThreads) append_kv_kernel(const AppendKvParams p) {
  constexpr bool kFp8 = sizeof(C) == 1 && sizeof(T) != 1;
  // 32-bit index arithmetic (the host caps the grid at 2^31 rows): a 64-bit division is a call.
  // Token rows: batch * s_new (s_q), or the packed rows (s_new / s_q hold their count then).
  const int k_rows = (p.cu_seqlens_k_new != nullptr ? p.s_new : p.batch * p.s_new) * p.h_k;
  int r = blockIdx.x;
  if (r < k_rows) {  // one (new token, kv head) row of k and v (a cache row)
    const NewKv x = new_kv(p, r);
    if (x.b < 0) return;  // not appended
    const auto [k, v, kc, vc] = kv_rows<T, C>(p, x);
    const int64_t pos_r = p.rotary_seqlens != nullptr ? int64_t(p.rotary_seqlens[x.b]) + x.t : x.pos;
    const int pos_ro = pos_r > 0x7fffffff ? 0x7fffffff : (pos_r < 0 ? 0 : int(pos_r));
    if constexpr (kFp8) {
      const float kd = p.k_descale[x.slot.slab * p.kd_slab_stride + x.hk * p.kd_head_stride];
      const float vd = p.v_descale[x.slot.slab * p.vd_slab_stride + x.hk * p.vd_head_stride];
      for (int c = threadIdx.x; c < p.d; c += kThreads) kc[c] = quantize_e4m3(to_float(rotate(k, c, pos_ro, p)), kd);
      for (int c = threadIdx.x; c < p.d_v; c += kThreads) vc[c] = quantize_e4m3(to_float(v[c]), vd);
    } else {
      for (int c = threadIdx.x; c < p.d; c += kThreads) kc[c] = rotate(k, c, pos_ro, p);
      for (int c = threadIdx.x; c < p.d_v; c += kThreads) vc[c] = v[c];
    }
    return;
  }
  r -= k_rows;  // one (query token, head) row of q (rotary only)
  const int hq = r % p.h;
  const int tok = r / p.h;
  const auto [b, t] = entry_of(p.cu_seqlens_q, p.batch, p.s_q, tok);
  if (b >= p.batch) return;
  // Packed: the packed row, batch strides 0 (b is -1 for a row of no entry).
  const int row = p.cu_seqlens_q != nullptr ? tok : t;
  const T* q = static_cast<const T*>(p.q) + b * p.q_batch_stride + row * p.q_row_stride + hq * p.q_head_stride;
  T* qo = static_cast<T*>(p.q_out) + b * p.qo_batch_stride + row * p.qo_row_stride + hq * p.qo_head_stride;
  if (b < 0) {  // a packed row of no entry: no position, copied as is
    for (int c = threadIdx.x; c < p.d; c += kThreads) qo[c] = q[c];
    return;
  }
  const int64_t pos = int64_t(p.rotary_seqlens != nullptr ? p.rotary_seqlens[b] : p.cache_seqlens[b]) +
                      (p.q_per_token ? t : 0);
  const int pos_ro = pos > 0x7fffffff ? 0x7fffffff : (pos < 0 ? 0 : int(pos));
  for (int c = threadIdx.x; c < p.d; c += kThreads) qo[c] = rotate(q, c, pos_ro, p);
}

}  // namespace

int run_append_kv(const AppendKvParams& p, void* stream) {
  const int64_t k_tokens = p.cu_seqlens_k_new != nullptr ? p.s_new : int64_t(p.batch) * p.s_new;
  const int64_t q_tokens = p.cu_seqlens_q != nullptr ? p.s_q : int64_t(p.batch) * p.s_q;
  const int64_t rows = k_tokens * p.h_k + (p.rotary_cos != nullptr ? q_tokens * p.h : 0);
  if (rows == 0) return 0;
  if (rows > 0x7fffffff || int64_t(p.max_pages) * p.page_size > 0x7fffffff)
    return int(cudaErrorInvalidConfiguration);
  const dim3 grid(static_cast<unsigned>(rows));
  auto s = static_cast<cudaStream_t>(stream);
  if (p.kv_e4m3) {  // e4m3 q (read with rotary only), k/v and caches; no descales here
    if (p.k_descale != nullptr) return int(cudaErrorInvalidValue);
    append_kv_kernel<E4m3, E4m3><<<grid, kThreads, 0, s>>>(p);
    return int(cudaGetLastError());
  }
  const bool fp8 = p.k_descale != nullptr;
  if (p.is_bf16) {
    if (fp8) append_kv_kernel<__nv_bfloat16, E4m3><<<grid, kThreads, 0, s>>>(p);
    else append_kv_kernel<__nv_bfloat16, __nv_bfloat16><<<grid, kThreads, 0, s>>>(p);
  } else {
    if (fp8) append_kv_kernel<__half, E4m3><<<grid, kThreads, 0, s>>>(p);
    else append_kv_kernel<__half, __half><<<grid, kThreads, 0, s>>>(p);
  }
  return int(cudaGetLastError());
}

}  // namespace flash3
