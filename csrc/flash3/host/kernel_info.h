// The kernel lists of torch.ops.flash3.kernel_info() (and of the simulator driver's --info): the
// registered kernels of this build, as JSON members without the enclosing braces.
#pragma once
#include <string>

namespace flash3::host {

// "fwd": [["bf16", 128, 128], ...], "fwd_fp8": [[128, 128], ...], "bwd": [...], "decode": [...],
// "decode_fp8_cache": [...] (16-bit q, FP8 cache); each list sorted, bf16 first, no repeats.
std::string kernel_lists_json();

}  // namespace flash3::host
