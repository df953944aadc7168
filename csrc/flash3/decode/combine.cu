// The split-KV combine (see combine.h for the math). Memory-bound and small: one warp per output
// row (batch, token, head); the row's split weights go through shared memory, then every lane
// accumulates 4 columns at a time over the splits in fp32 and writes them once.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "flash3/decode/combine.h"

namespace flash3 {
namespace {

constexpr int kWarps = 4;
constexpr int kMaxSplits = 128;  // split_heuristic.h kMaxSplits; the binding checks

__device__ __forceinline__ void store4(__nv_bfloat16* o, float4 v) {
  __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
  uint2 u;
  u.x = *reinterpret_cast<uint32_t*>(&a);
  u.y = *reinterpret_cast<uint32_t*>(&b);
  *reinterpret_cast<uint2*>(o) = u;
}
__device__ __forceinline__ void store4(__half* o, float4 v) {
  __half2 a = __floats2half2_rn(v.x, v.y), b = __floats2half2_rn(v.z, v.w);
  uint2 u;
  u.x = *reinterpret_cast<uint32_t*>(&a);
  u.y = *reinterpret_cast<uint32_t*>(&b);
  *reinterpret_cast<uint2*>(o) = u;
}

template <class T>
__global__ void __launch_bounds__(kWarps * 32) combine_kernel(const CombineParams p) {
  __shared__ float weights[kWarps][kMaxSplits];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row = int64_t(blockIdx.x) * kWarps + warp;  // (b, t, head), head fastest
  const int64_t rows = int64_t(p.batch) * p.seqlen_q * p.num_heads;
  if (row >= rows) return;
  const int head = int(row % p.num_heads);
  const int t = int((row / p.num_heads) % p.seqlen_q);
  if (p.seq_end != nullptr && t >= *p.seq_end) return;  // a packed row of no sequence: left as filled
  const int b = int(row / (int64_t(p.num_heads) * p.seqlen_q));
  const int64_t split_lse = int64_t(p.batch) * p.num_heads * p.seqlen_q;  // one split's lse entries
  const float* lse_in = p.lse_partial + (int64_t(b) * p.num_heads + head) * p.seqlen_q + t;

  float m = -INFINITY;
  for (int s = lane; s < p.num_splits; s += 32) m = fmaxf(m, lse_in[s * split_lse]);
  for (int off = 16; off > 0; off /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  const float sink = p.sinks != nullptr ? p.sinks[head] : -INFINITY;  // a term with no value
  m = fmaxf(m, sink);
  if (m == -INFINITY) m = 0.f;  // every split empty (and no sink): the weights below are exactly 0
  float sum = 0.f;
  for (int s = lane; s < p.num_splits; s += 32) sum += expf(lse_in[s * split_lse] - m);
  for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  sum += expf(sink - m);  // every lane holds the full sum: each adds the sink's term once (0 without)
  const float lse = m + logf(sum);  // log(0) = -inf: no split saw the row (and no sink)
  const float inv = sum > 0.f ? 1.f / sum : 0.f;
  for (int s = lane; s < p.num_splits; s += 32) weights[warp][s] = expf(lse_in[s * split_lse] - m) * inv;
  __syncwarp();
  if (lane == 0 && p.lse != nullptr) p.lse[b * p.lse_batch_stride + head * p.lse_head_stride + t] = lse;

  const int64_t split_o = split_lse * p.head_dim_v;  // one split's partial O elements
  const float* o_in = p.o_partial + ((int64_t(b) * p.seqlen_q + t) * p.num_heads + head) * p.head_dim_v;
  T* out = static_cast<T*>(p.out) + b * p.o_batch_stride + t * p.o_row_stride + head * p.o_head_stride;
  for (int c = lane * 4; c < p.head_dim_v; c += 128) {
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int s = 0; s < p.num_splits; ++s) {
      const float w = weights[warp][s];
      if (w == 0.f) continue;  // an empty split's partial is never read
      const float4 o = *reinterpret_cast<const float4*>(o_in + s * split_o + c);
      acc.x = fmaf(w, o.x, acc.x), acc.y = fmaf(w, o.y, acc.y);
      acc.z = fmaf(w, o.z, acc.z), acc.w = fmaf(w, o.w, acc.w);
    }
    store4(out + c, acc);
  }
}

}  // namespace

int run_combine(const CombineParams& p, void* stream) {
  const int64_t rows = int64_t(p.batch) * p.seqlen_q * p.num_heads;
  if (rows == 0) return 0;
  if (p.num_splits < 1 || p.num_splits > kMaxSplits || p.head_dim_v % 4 != 0)
    return int(cudaErrorInvalidValue);
  const int64_t blocks = (rows + kWarps - 1) / kWarps;
  if (blocks > 0x7fffffff) return int(cudaErrorInvalidConfiguration);
  auto s = static_cast<cudaStream_t>(stream);
  if (p.is_bf16) combine_kernel<__nv_bfloat16><<<unsigned(blocks), kWarps * 32, 0, s>>>(p);
  else combine_kernel<__half><<<unsigned(blocks), kWarps * 32, 0, s>>>(p);
  return int(cudaGetLastError());
}

}  // namespace flash3
