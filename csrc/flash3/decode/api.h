// The entry points between the host layer and the decode (KV-cache) kernels, as fwd/api.h is for
// the forward: every generated TU csrc/generated/decode_*.cu registers its launcher here at load
// time. Two lists, the forward's pick rule: 16-bit caches (q's dtype) and FP8
// (e4m3) caches with 16-bit q.
#pragma once
#include <vector>

#include "flash3/fwd/api.h"  // FwdLauncher, FwdKernelEntry, pick_fwd_kernel
#include "flash3/fwd/params.h"

namespace flash3 {

std::vector<FwdKernelEntry>& fwd_decode_kernels(bool fp8_cache = false);
FwdLauncher find_fwd_decode_kernel(bool is_bf16, int head_dim, int head_dim_v, bool fp8_cache = false);

struct DecodeKernelRegistration {
  DecodeKernelRegistration(bool is_bf16, int head_dim, int head_dim_v, bool fp8_cache, FwdLauncher launch) {
    fwd_decode_kernels(fp8_cache).push_back({is_bf16, head_dim, head_dim_v, launch});
  }
};

// Defined in decode/launch.cuh and explicitly instantiated once per generated TU.
template <bool kIsBf16, int kHeadDim, int kHeadDimV, bool kFp8Cache>
void run_decode(const FwdParams& params, void* cuda_stream);

// The MLA decode kernel (d 64, d_v 512, optional qv): decode/mla_launch.cuh, one generated TU.
template <bool kIsBf16>
void run_decode_mla(const FwdParams& params, void* cuda_stream);

}  // namespace flash3
