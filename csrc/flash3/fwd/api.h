// The entry points between the torch binding and the forward kernels. Every generated kernel TU
// (csrc/generated/fwd_*.cu, one instantiation each) registers its launcher here at load time,
// so the binding dispatches to whatever subset the build compiled (FLASH3_HDIMS, FLASH3_DTYPES)
// without preprocessor flags. No torch or CUDA headers: the stream travels as void*.
#pragma once
#include <string>
#include <tuple>
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

// The kernel a call with head dims (d, d_v) runs on: among `entries` of the dtype with
// head_dim >= d and head_dim_v >= d_v, the smallest head_dim, then the smallest head_dim_v
// (extra columns are zero-filled by TMA, so a larger kernel computes the same result). nullptr
// when none fits. host/kernel_pick.h applies it for the ops
// and for flash3/_backend.py (flash3::pick_kernel).
inline const FwdKernelEntry* pick_fwd_kernel(const std::vector<FwdKernelEntry>& entries, bool is_bf16, int d,
                                             int d_v) {
  const FwdKernelEntry* best = nullptr;
  auto rank = [](const FwdKernelEntry& e) { return std::make_tuple(e.head_dim, e.head_dim_v); };
  for (const FwdKernelEntry& e : entries)
    if (e.is_bf16 == is_bf16 && e.head_dim >= d && e.head_dim_v >= d_v && (best == nullptr || rank(e) < rank(*best)))
      best = &e;
  return best;
}

// The launcher for (dtype, head_dim, head_dim_v), or nullptr when that kernel was not built.
FwdLauncher find_fwd_kernel(bool is_bf16, int head_dim, int head_dim_v);

struct FwdKernelRegistration {
  FwdKernelRegistration(bool is_bf16, int head_dim, int head_dim_v, FwdLauncher launch) {
    fwd_kernels().push_back({is_bf16, head_dim, head_dim_v, launch});
  }
};

// The FP8 (e4m3 in, bf16 out) kernels: their own list, the same pick rule.
std::vector<FwdKernelEntry>& fwd_fp8_kernels();
FwdLauncher find_fwd_fp8_kernel(int head_dim, int head_dim_v);

struct Fp8KernelRegistration {
  Fp8KernelRegistration(int head_dim, int head_dim_v, FwdLauncher launch) {
    fwd_fp8_kernels().push_back({true, head_dim, head_dim_v, launch});
  }
};

// Defined in fwd/launch.cuh and explicitly instantiated once per generated TU.
template <bool kIsBf16, int kHeadDim, int kHeadDimV>
void run_fwd(const FwdParams& params, void* cuda_stream);
template <int kHeadDim, int kHeadDimV>
void run_fwd_fp8(const FwdParams& params, void* cuda_stream);

}  // namespace flash3
