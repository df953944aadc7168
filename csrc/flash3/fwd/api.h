// The entry points between the torch binding and the forward kernels. Every generated kernel TU
// (csrc/generated/fwd_*.cu, one instantiation each) registers its launcher here at load time,
// so the binding dispatches to whatever subset the build compiled (FLASH3_HDIMS, FLASH3_DTYPES)
// without preprocessor flags. No torch or CUDA headers: the stream travels as void*.
#pragma once
#include <string>
#include <vector>

#include "flash3/fwd/params.h"

namespace flash3 {

using FwdLauncher = void (*)(const FwdParams& params, void* cuda_stream);

struct FwdKernelEntry {
  bool is_bf16;
  int head_dim, head_dim_v;
  FwdLauncher launch;
};

// All launchers compiled into this build (filled by static initializers of the kernel TUs).
std::vector<FwdKernelEntry>& fwd_kernels();

// The launcher for (dtype, head_dim, head_dim_v), or nullptr when that kernel was not built.
FwdLauncher find_fwd_kernel(bool is_bf16, int head_dim, int head_dim_v);

struct FwdKernelRegistration {
  FwdKernelRegistration(bool is_bf16, int head_dim, int head_dim_v, FwdLauncher launch) {
    fwd_kernels().push_back({is_bf16, head_dim, head_dim_v, launch});
  }
};

// Defined in fwd_launch.cuh and explicitly instantiated once per generated TU.
template <bool kIsBf16, int kHeadDim, int kHeadDimV>
void run_fwd(const FwdParams& params, void* cuda_stream);

}  // namespace flash3
