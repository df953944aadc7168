// The backward's two small kernels around the main one, one CTA of 256 threads per (query block of
// 64 rows, head, batch):
//  preprocess  dpsum = rowsum(dO * O) - dlse and lse * log2(e) (+inf where lse is -inf and for
//              padding rows, so P = 0 there) into the padded per-row workspace; zeroes the block's
//              dQ accumulator tile and its deterministic-mode semaphore.
//  sink grad   (only with BwdParams::sinks) one CTA per query head, after the preprocess: d_sink.
//  postprocess dq = softmax_scale * dq_accum, read in the main kernel's fragment order (the dQ
//              tiled MMA's thread partition says which row and column each float is).
#pragma once

#include <cmath>

#include <cute/tensor.hpp>
#include <cutlass/array.h>

#include "flash3/bwd/kernel.cuh"
#include "flash3/bwd/traits.cuh"

namespace flash3 {

constexpr int kBwdPrePostThreads = 256;
// CTAs of them per SM the build is for: ptxas gives them ~32 registers, so 4 (at most 64 each) costs
// nothing and keeps many CTAs of these memory-bound kernels in flight. Stated rather than left to
// ptxas, so the occupancy is a property of the kernel (the timing model reads it from the PTX's
// .minnctapersm; without it, it must assume up to 255 registers: one CTA per SM).
constexpr int kBwdPrePostMinBlocks = 4;

template <class Tr>
__global__ void __launch_bounds__(kBwdPrePostThreads, kBwdPrePostMinBlocks) bwd_preprocess_kernel(BwdParams const p) {
  using Element = typename Tr::Element;
  const int m = int(blockIdx.x), head = int(blockIdx.y), batch = int(blockIdx.z);
  const BwdSeq s = bwd_seq(p, batch);
  if (m * kBwdBlockM >= s.seqlen_q) return;  // the main kernel never reads this block
  const int64_t ws_row = s.ws_base + int64_t(head) * s.ws_head_stride + int64_t(m) * kBwdBlockM;

  // Four threads per row (a quad), 16-byte loads of O and dO.
  const int r = int(threadIdx.x) / 4, part = int(threadIdx.x) % 4;
  const int row = m * kBwdBlockM + r;
  const bool valid = row < s.seqlen_q;
  const bool varlen = p.cu_seqlens_q != nullptr;
  const int64_t qrow = int64_t(s.offset_q) + row;
  float acc = 0.f;
  if (valid) {
    const Element* o = static_cast<const Element*>(p.o) + (varlen ? 0 : int64_t(batch) * p.o_batch_stride) +
                       qrow * p.o_row_stride + int64_t(head) * p.o_head_stride;
    const Element* d = static_cast<const Element*>(p.dout) + (varlen ? 0 : int64_t(batch) * p.do_batch_stride) +
                       qrow * p.do_row_stride + int64_t(head) * p.do_head_stride;
    using Vec = cutlass::Array<Element, 8>;
    for (int c = part * 8; c < p.head_dim_v; c += 32) {
      const Vec a = *reinterpret_cast<const Vec*>(o + c);
      const Vec b = *reinterpret_cast<const Vec*>(d + c);
      CUTE_UNROLL
      for (int i = 0; i < 8; ++i) acc = fmaf(float(a[i]), float(b[i]), acc);
    }
  }
  acc = quad_allreduce_sum(acc);
  if (part == 0) {
    float lse2 = INFINITY, dps = 0.f;
    if (valid) {
      const int64_t at = varlen ? qrow : row;
      const float l = p.lse[(varlen ? 0 : int64_t(batch) * p.lse_batch_stride) + int64_t(head) * p.lse_head_stride + at];
      lse2 = l == -INFINITY ? INFINITY : l * 1.4426950408889634f;
      dps = acc;
      if (p.dlse != nullptr)
        dps -= p.dlse[(varlen ? 0 : int64_t(batch) * p.dlse_batch_stride) + int64_t(head) * p.dlse_head_stride + at];
    }
    p.lse_log2[ws_row + r] = lse2;
    p.dpsum[ws_row + r] = dps;
  }

  float4* dq = reinterpret_cast<float4*>(p.dq_accum + ws_row * Tr::kHeadDim);
  for (int i = int(threadIdx.x); i < kBwdBlockM * Tr::kHeadDim / 4; i += kBwdPrePostThreads)
    dq[i] = make_float4(0.f, 0.f, 0.f, 0.f);
  if (p.dq_semaphore != nullptr && threadIdx.x == 0)
    p.dq_semaphore[(int64_t(batch) * p.num_heads + head) * ceil_div(p.seqlen_q, kBwdBlockM) + m] = 0;
}

// d_sink[head] = -sum over batch entries b and real rows r of exp(sink - lse[b, head, r]) *
// dpsum[b, head, r] (a row with lse = -inf: 0), dpsum = rowsum(dO * O) - dlse from the preprocess's
// workspace, lse the forward's natural-log one (it includes the sink) read as the preprocess reads
// it. One CTA per query head: thread t sums rows t, t + 256, ... of every batch entry in order, then
// a fixed shared-memory tree: the same order on every run and schedule (no atomics), fp32.
// Not templated on the traits (nothing here depends on them) and `static`: each backward TU that
// includes this header compiles its own copy of this small kernel without a host-stub clash at link.
static __global__ void __launch_bounds__(kBwdPrePostThreads, kBwdPrePostMinBlocks)
    bwd_sink_grad_kernel(BwdParams const p) {
  const int head = int(blockIdx.x);
  const float sink = p.sinks[head];
  const bool varlen = p.cu_seqlens_q != nullptr;
  // Rows the preprocess covers: its grid has ceil(seqlen_q / 64) blocks per sequence.
  const int covered = ceil_div(p.seqlen_q, kBwdBlockM) * kBwdBlockM;
  float acc = 0.f;
  for (int batch = 0; batch < p.batch; ++batch) {
    const BwdSeq s = bwd_seq(p, batch);
    const float* lse = p.lse + (varlen ? int64_t(s.offset_q) : int64_t(batch) * p.lse_batch_stride) +
                       int64_t(head) * p.lse_head_stride;
    const float* dpsum = p.dpsum + s.ws_base + int64_t(head) * s.ws_head_stride;
    const int rows = imin(s.seqlen_q, covered);
    for (int r = int(threadIdx.x); r < rows; r += kBwdPrePostThreads) {
      const float l = lse[r];
      const float p_sink = l == -INFINITY ? 0.f : expf(sink - l);
      acc = fmaf(p_sink, dpsum[r], acc);
    }
  }
  __shared__ float part[kBwdPrePostThreads];
  part[threadIdx.x] = acc;
  __syncthreads();
  CUTE_UNROLL
  for (int w = kBwdPrePostThreads / 2; w > 0; w /= 2) {
    if (int(threadIdx.x) < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) p.dsinks[head] = -part[0];
}

template <class Tr>
__global__ void __launch_bounds__(kBwdPrePostThreads, kBwdPrePostMinBlocks) bwd_postprocess_kernel(BwdParams const p) {
  using namespace cute;
  using Element = typename Tr::Element;
  static_assert(kBwdPrePostThreads == Tr::kNumConsumerThreads, "one thread per main-kernel consumer thread");
  const int m = int(blockIdx.x), head = int(blockIdx.y), batch = int(blockIdx.z);
  const BwdSeq s = bwd_seq(p, batch);
  if (m * kBwdBlockM >= s.seqlen_q) return;
  const int64_t ws_row = s.ws_base + int64_t(head) * s.ws_head_stride + int64_t(m) * kBwdBlockM;
  const int wg = int(threadIdx.x) / 128, lt = int(threadIdx.x) % 128;
  const float* src = p.dq_accum + ws_row * Tr::kHeadDim + wg * Tr::kDqValues * 128 + lt;

  typename Tr::TiledMmaDq mma;
  Tensor tc = mma.get_thread_slice(lt).partition_C(
      make_identity_tensor(Shape<typename Tr::BlkM, Int<Tr::kDQCols>>{}));
  const bool varlen = p.cu_seqlens_q != nullptr;
  Element* dq = static_cast<Element*>(p.dq) + (varlen ? int64_t(s.offset_q) * p.dq_row_stride
                                                      : int64_t(batch) * p.dq_batch_stride) +
                int64_t(head) * p.dq_head_stride;
  using Pair = cutlass::Array<Element, 2>;
  CUTE_UNROLL
  for (int i = 0; i < Tr::kDqValues; i += 2) {  // (i, i + 1): adjacent columns of one row
    const int row = m * kBwdBlockM + get<0>(tc(i)), col = wg * Tr::kDQCols + get<1>(tc(i));
    if (row < s.seqlen_q && col < p.head_dim) {
      Pair v;
      v[0] = Element(src[i * 128] * p.softmax_scale);
      v[1] = Element(src[(i + 1) * 128] * p.softmax_scale);
      *reinterpret_cast<Pair*>(dq + int64_t(row) * p.dq_row_stride + col) = v;
    }
  }
}

}  // namespace flash3
