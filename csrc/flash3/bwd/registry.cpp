#include "flash3/bwd/api.h"

namespace flash3 {

std::vector<BwdKernelEntry>& bwd_kernels() {
  static std::vector<BwdKernelEntry> kernels;  // function-local: safe from static-init order
  return kernels;
}

const BwdKernelEntry* find_bwd_kernel(bool is_bf16, int head_dim, int head_dim_v) {
  const BwdKernelEntry* best = nullptr;
  for (const BwdKernelEntry& e : bwd_kernels())
    if (e.is_bf16 == is_bf16 && e.head_dim >= head_dim && e.head_dim_v >= head_dim_v &&
        (best == nullptr || e.head_dim < best->head_dim ||
         (e.head_dim == best->head_dim && e.head_dim_v < best->head_dim_v)))
      best = &e;
  return best;
}

}  // namespace flash3
