#include "flash3/fwd/api.h"

namespace flash3 {

std::vector<FwdKernelEntry>& fwd_kernels() {
  static std::vector<FwdKernelEntry> kernels;  // function-local: safe from static-init order
  return kernels;
}

std::vector<FwdKernelEntry>& fwd_fp8_kernels() {
  static std::vector<FwdKernelEntry> kernels;
  return kernels;
}

FwdLauncher find_fwd_fp8_kernel(int head_dim, int head_dim_v) {
  const FwdKernelEntry* best = pick_fwd_kernel(fwd_fp8_kernels(), true, head_dim, head_dim_v);
  return best != nullptr ? best->launch : nullptr;
}

FwdLauncher find_fwd_kernel(bool is_bf16, int head_dim, int head_dim_v) {
  const FwdKernelEntry* best = pick_fwd_kernel(fwd_kernels(), is_bf16, head_dim, head_dim_v);
  return best != nullptr ? best->launch : nullptr;
}

}  // namespace flash3
