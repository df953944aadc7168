// The fused FP8 rotate-and-quantize op, torch-free: torch.ops.flash3.quantize_fp8_sm90
// (csrc/quantize_fp8_binding.cpp adapts it; the simulator driver calls it). x (b, s, h, d)
// bf16/fp16 (any strides, contiguous channels) -> out e4m3 and descale fp32 (b, h, ceil(s /
// block_size)), both contiguous; layout 0: out (b, s, h, d), layout 1 (V packed): out (b, h, d,
// ceil(s / 16) * 16). signs (d,) fp32 = rotate first (flash3.hadamard); mean / channel_descale
// (b, h, d) fp32 with contiguous channels. No host synchronization (csrc/flash3/fp8/quantize.h).
#pragma once
#include <cstdint>

#include "flash3/host/backend.h"

namespace flash3::host {

void quantize_fp8_sm90(Backend& be, const TensorView& x, const TensorView* signs, const TensorView* mean,
                       const TensorView* channel_descale, int64_t block_size, int64_t layout, const TensorView& out,
                       const TensorView& descale);

}  // namespace flash3::host
