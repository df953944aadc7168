// Whether a compiled kernel runs a call, and which: the one rule. The ops refuse by it (fwd.cpp,
// kvcache.cpp, bwd.cpp), and flash3/_backend.py asks it (torch.ops.flash3.pick_kernel, the JSON of
// kernel_pick_json) before it chooses between a kernel and the reference backend.
#pragma once
#include <cstdint>
#include <string>

#include "flash3/bwd/api.h"
#include "flash3/decode/api.h"
#include "flash3/fwd/api.h"
#include "flash3/host/check.h"
#include "flash3/host/tensor_view.h"

namespace flash3::host {

// fwd_fp8: e4m3 q/k/v; decode / decode_fp8_cache: 16-bit q over caches of q's dtype / e4m3.
enum class KernelFamily { fwd, fwd_fp8, decode, decode_fp8_cache, bwd };

struct KernelPick {
  std::string reason;                   // why no kernel runs the call; empty when one does
  bool not_built = false;               // the reason is this build's kernel set
  const FwdKernelEntry* fwd = nullptr;  // the forward families' kernel
  const BwdKernelEntry* bwd = nullptr;  // bwd's
};

// The kernel of `family` for q's dtype, head dims (d, d_v) and softmax_scale (the mask chooses no
// kernel: one forward tile per head dim serves every window): bf16/fp16 (e4m3 for fwd_fp8), a
// finite scale > 0 (the online softmax takes row maxes of the raw scores), head dims multiples of
// 8 (FP8: 16) in [8, 256] for TMA, then the next compiled head dims up (api.h pick_fwd_kernel,
// find_bwd_kernel). dtype_name names q's dtype in the reason (dtype_torch_name when null).
// An attention chunk (> 0) chooses no kernel: the 16-bit forward and decode kernels take it at
// every head dim (above d 192 on tiles of their own: fwd/launch.cuh run_fwd, decode/launch.cuh
// run_decode), the MLA decode kernel too; the FP8 forward's op has none. attention_chunk stays in
// the signature for its callers (torch.ops.flash3.pick_kernel).
KernelPick pick_kernel(KernelFamily family, DType dtype, int64_t d, int64_t d_v, double softmax_scale,
                       const char* dtype_name = nullptr, int64_t attention_chunk = 0);

// pick_kernel by names (family: "fwd", "fwd_fp8", "decode", "decode_fp8_cache", "bwd"; dtype as torch
// names it: "bfloat16", "float16", "float8_e4m3fn", ...), as JSON: {"kernel": [head_dim, head_dim_v]}
// or {"reason": "..."}.
// An op's pick: refuses (host::Error "<op>: <reason>", naming the build when it lacks the kernel).
inline KernelPick checked_pick(const char* op, const char* build_name, KernelFamily family, const TensorView& q,
                               int64_t d, int64_t d_v, double softmax_scale, int64_t attention_chunk = 0) {
  KernelPick k = pick_kernel(family, q.dtype, d, d_v, softmax_scale, q.dtype_name, attention_chunk);
  check(k.reason.empty(), op, ": ", k.reason, k.not_built ? " of " : "", k.not_built ? build_name : "",
        k.not_built ? " and rebuild with FLASH3_HDIMS/FLASH3_DTYPES unset to compile every kernel" : "");
  return k;
}

std::string kernel_pick_json(const std::string& family, const std::string& dtype, int64_t d, int64_t d_v,
                             double softmax_scale, int64_t attention_chunk = 0);

}  // namespace flash3::host
