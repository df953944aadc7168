// The entry points between the torch binding and the backward kernels, as fwd/api.h is for the
// forward: each generated TU (csrc/generated/bwd_*.cu) registers its launcher at load time.
#pragma once
#include <vector>

#include "flash3/bwd/params.h"

namespace flash3 {

// Runs preprocess, (with params.sinks) the sink-gradient kernel, main kernel and postprocess on
// `cuda_stream` (a cudaStream_t); the workspace in `params` must be allocated (bwd_workspace) but
// need not be initialized. With sinks and no key at all (total_k / seqlen_k 0) only preprocess and
// sink gradient run (dq/dk/dv left to the caller: zeros).
using BwdLauncher = void (*)(const BwdParams& params, void* cuda_stream);

struct BwdKernelEntry {
  bool is_bf16;
  int head_dim, head_dim_v;
  BwdLauncher launch;
};

std::vector<BwdKernelEntry>& bwd_kernels();

// The kernel for (dtype, d, d_v): the smallest compiled head_dim >= d, then head_dim_v >= d_v
// (TMA zero-fills the extra columns), as for the forward; nullptr when none fits.
const BwdKernelEntry* find_bwd_kernel(bool is_bf16, int head_dim, int head_dim_v);

struct BwdKernelRegistration {
  BwdKernelRegistration(bool is_bf16, int head_dim, int head_dim_v, BwdLauncher launch) {
    bwd_kernels().push_back({is_bf16, head_dim, head_dim_v, launch});
  }
};

template <bool kIsBf16, int kHeadDim, int kHeadDimV>
void run_bwd(const BwdParams& params, void* cuda_stream);

}  // namespace flash3
