// The score modification ("score mod"): the one place that defines how a raw score s = q.k becomes
// the logit the softmax sees, and the derivative the backward multiplies dS by. Used by the forward
// consumer's softmax and the decode kernel (fwd/mainloop.cuh softmax_block) and by the backward's
// score recomputation (bwd/kernel.cuh); the launchers fill it (ScoreMod::make). No torch, no CUDA
// headers: host code includes it too.
//
// The logit of query row i (bottom-right aligned: i + seqlen_k - seqlen_q is its diagonal key) and
// key j, in the space of softmax_scale * q.k:
//   logit = softcap(softmax_scale * s) - slope(batch, head) * |i + seqlen_k - seqlen_q - j|
// with softcap(x) = cap * tanh(x / cap) when softcap > 0 (else x), and the ALiBi term when slopes are
// given (FlashAttention-2's convention; per sequence in varlen; the row's key count for a KV cache).
// The kernels keep scores in "raw units", where the softmax multiplies by scale_log2 inside exp2:
//   raw(s) = tanh(s * softcap_in) - alibi_raw_slope * |dist|   (softcap: scale_log2 = cap * log2 e)
//   raw(s) = s - alibi_raw_slope * |dist|                      (else:    scale_log2 = scale * log2 e)
// so raw * scale_log2 = logit * log2 e, with alibi_raw_slope = slope * log2 e / scale_log2.
// d logit / d (softmax_scale * s) = 1 - tanh^2 with softcap, 1 without: the ALiBi term is a constant
// (no gradient to the slopes).
//
// Cost: the default path (no softcap, no ALiBi) tests `active` once per key block, as the softcap
// flag alone did before; everything else sits behind that test.
#pragma once

#include <cstdint>

#include "flash3/common/attn_logic.h"

namespace flash3 {

struct ScoreMod {
  float scale_log2 = 0.f;   // multiplies raw scores inside exp2 (softmax_scale*log2e, or cap*log2e)
  float softcap_in = 0.f;   // softmax_scale / softcap with softcap, else 0
  const float* alibi = nullptr;    // fp32 slopes: slope of (batch, head) at alibi[batch * alibi_batch_stride + head]
  int alibi_batch_stride = 0;      // 0: one slope per head (h,); num_heads: per batch row (b, h)
  int group = 1;            // query heads per kv head: packed GQA rows per token (decode: mask, ALiBi head)
  // kSoftcap | kAlibi for the tests inside the branch (one word, not a flag and a pointer held in
  // uniform registers across the key loop), and `on` for the default path's test: measured on the
  // d 128 decode kernels, either alone cost the default path's loop one instruction per key block.
  static constexpr int kSoftcap = 1, kAlibi = 2;
  int flags = 0;
  bool on = false;  // flags != 0, a byte of its own: the default path's test reads only it

  FLASH3_HD bool active() const { return on; }  // the single test the default path pays
  FLASH3_HD bool has_softcap() const { return (flags & kSoftcap) != 0; }
  FLASH3_HD bool has_alibi() const { return (flags & kAlibi) != 0; }

  static ScoreMod make(float softmax_scale, float softcap, const float* alibi, int64_t alibi_batch_stride,
                       int group = 1) {
    constexpr float kLog2e = 1.4426950408889634f;
    ScoreMod m;
    const bool has_softcap = softcap > 0.f;
    m.scale_log2 = has_softcap ? softcap * kLog2e : softmax_scale * kLog2e;
    m.softcap_in = has_softcap ? softmax_scale / softcap : 0.f;
    m.alibi = alibi;
    m.alibi_batch_stride = int(alibi_batch_stride);
    m.group = group;
    m.flags = (has_softcap ? kSoftcap : 0) | (alibi != nullptr ? kAlibi : 0);
    m.on = m.flags != 0;
    return m;
  }

#if defined(__CUDACC__)
  // ALiBi slope of (batch, head) in raw units (0 without ALiBi).
  __device__ __forceinline__ float alibi_raw_slope(int batch, int head) const {
    // The index stays inside the caller's ALiBi branch: computed ahead of it (ptxas hoists such
    // uniform products), the loop-invariant operands held uniform registers across the mainloop and
    // cost the default path re-materialized descriptors.
    asm volatile("" : "+r"(batch), "+r"(head));
    constexpr float kLog2e = 1.4426950408889634f;
    return has_alibi() ? alibi[batch * alibi_batch_stride + head] * (kLog2e / scale_log2) : 0.f;
  }
  // The transform of one raw score before the position term (softcap's tanh, or s itself).
  __device__ __forceinline__ float transform(float s) const { return has_softcap() ? tanhf(s * softcap_in) : s; }
  // Its derivative factor for dS, from transform(s) (1 - t^2 with softcap, else 1).
  __device__ __forceinline__ float grad_factor(float t) const { return has_softcap() ? 1.f - t * t : 1.f; }
  // The position term in raw units: -raw_slope * |dist| (dist = i + seqlen_k - seqlen_q - j).
  static __device__ __forceinline__ float position(float raw_slope, float dist) { return -raw_slope * fabsf(dist); }
#endif
};

}  // namespace flash3
