#include "flash3/fwd/api.h"

namespace flash3 {

std::vector<FwdKernelEntry>& fwd_kernels() {
  static std::vector<FwdKernelEntry> kernels;  // function-local: safe from static-init order
  return kernels;
}

FwdLauncher find_fwd_kernel(bool is_bf16, int head_dim, int head_dim_v) {
  for (const FwdKernelEntry& e : fwd_kernels())
    if (e.is_bf16 == is_bf16 && e.head_dim == head_dim && e.head_dim_v == head_dim_v) return e.launch;
  return nullptr;
}

}  // namespace flash3
