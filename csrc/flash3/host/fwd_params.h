// What the forward ops (fwd.cpp, kvcache.cpp) fill alike in FwdParams, and their launch.
#pragma once
#include <cstdint>

#include "flash3/fwd/api.h"
#include "flash3/fwd/params.h"
#include "flash3/host/backend.h"
#include "flash3/host/device.h"

namespace flash3::host {

// q, k, out and lse (pointers, element strides) and the sizes. Batched tensors are (b, s, h, d);
// packed (varlen, cu_seqlens given) ones (total, h, d), with no batch stride and s_q/s_k the max
// lengths. Each op sets its own v.
void set_q_k_out(FwdParams& p, const TensorView& q, const TensorView& k, const TensorView& out, const TensorView& lse,
                 const TensorView* cu_seqlens_q, const TensorView* cu_seqlens_k, int64_t batch, int64_t s_q,
                 int64_t s_k);

// The mask and softmax fields of `p`, its launch resources, then the launch on the backend's
// stream. Errors name the call: "<op> (<dtype>, d=.., d_v=..)", the dtype left out when null.
void set_mask_and_launch(FwdParams& p, FwdLauncher launch, Backend& be, const DeviceInfo& dev, double softmax_scale,
                         double softcap, int64_t window_left, int64_t window_right, const char* op,
                         const char* dtype, int64_t attention_chunk = 0);

}  // namespace flash3::host
