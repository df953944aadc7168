#include "flash3/decode/api.h"

namespace flash3 {

std::vector<FwdKernelEntry>& fwd_decode_kernels(bool fp8_cache) {
  static std::vector<FwdKernelEntry> kernels, fp8_cache_kernels;  // function-local: safe from static-init order
  return fp8_cache ? fp8_cache_kernels : kernels;
}

FwdLauncher find_fwd_decode_kernel(bool is_bf16, int head_dim, int head_dim_v, bool fp8_cache) {
  const FwdKernelEntry* best =
      pick_fwd_kernel(fwd_decode_kernels(fp8_cache), is_bf16, head_dim, head_dim_v);
  return best != nullptr ? best->launch : nullptr;
}

}  // namespace flash3
