#include "flash3/host/quantize.h"

#include <limits>
#include <sstream>

#include "flash3/fp8/quantize.h"
#include "flash3/host/check.h"
#include "flash3/host/device.h"

namespace flash3::host {
namespace {

constexpr const char* kOp = "flash3.quantize_fp8_sm90";

// (b, h, d) fp32 on x's device with contiguous channels; returns its data and (b, h) strides.
const float* per_head(const TensorView* t, const char* name, const TensorView& x, int64_t* stride_b,
                      int64_t* stride_h) {
  *stride_b = 0, *stride_h = 0;
  if (t == nullptr) return nullptr;
  const TensorView& v = *t;
  check(v.device == x.device, kOp, ": ", name, " must be on ", x.device, ", got ", v.device);
  check(v.dtype == DType::f32, kOp, ": ", name, " must be float32, got ", v.dtype_name);
  check(v.dim() == 3 && v.size(0) == x.size(0) && v.size(1) == x.size(2) && v.size(2) == x.size(3), kOp, ": ", name,
        " must have shape (", x.size(0), ", ", x.size(2), ", ", x.size(3), "), got ", v.sizes());
  check(v.stride(2) == 1 || v.size(2) == 1, kOp, ": ", name, " must have a contiguous last dimension");
  *stride_b = v.stride(0), *stride_h = v.stride(1);
  return v.ptr<const float>();
}

}  // namespace

void quantize_fp8_sm90(Backend& be, const TensorView& x, const TensorView* signs, const TensorView* mean,
                       const TensorView* channel_descale, int64_t block_size, int64_t layout, const TensorView& out,
                       const TensorView& descale) {
  check(x.device.kind == DeviceKind::cuda, kOp, ": x must be a CUDA tensor");
  check(x.dtype == DType::bf16 || x.dtype == DType::fp16, kOp, ": x must be bfloat16 or float16, got ", x.dtype_name);
  check(x.dim() == 4, kOp, ": x must be 4-D (b, s, h, d), got shape ", x.sizes());
  check(x.stride(3) == 1 || x.size(3) == 1, kOp, ": x must have a contiguous last dimension");
  const int64_t b = x.size(0), s = x.size(1), h = x.size(2), d = x.size(3);
  check(block_size > 0 && block_size <= std::numeric_limits<int32_t>::max(), kOp,
        ": block_size must be a positive int32, got ", block_size);
  check(layout == kQuantLayoutRows || layout == kQuantLayoutVPacked, kOp,
        ": layout must be 0 (rows) or 1 (v_packed), got ", layout);

  QuantizeParams p{};
  p.x = x.data_ptr();
  p.x_batch_stride = x.stride(0), p.x_row_stride = x.stride(1), p.x_head_stride = x.stride(2);
  if (signs != nullptr) {
    const TensorView& sg = *signs;
    check(sg.device == x.device && sg.dtype == DType::f32 && sg.dim() == 1 && sg.size(0) == d && sg.is_contiguous(),
          kOp, ": signs must be a contiguous float32 (", d, ",) tensor on ", x.device);
    p.signs = sg.ptr<const float>();
  }
  p.mean = per_head(mean, "mean", x, &p.mean_batch_stride, &p.mean_head_stride);
  p.channel_descale = per_head(channel_descale, "channel_descale", x, &p.cd_batch_stride, &p.cd_head_stride);
  p.batch = to_int(b, "batch", kOp), p.seqlen = to_int(s, "seqlen", kOp);
  p.heads = to_int(h, "heads", kOp), p.d = to_int(d, "head dim", kOp);
  p.block_size = static_cast<int>(block_size);
  p.layout = static_cast<int>(layout);
  p.is_bf16 = x.dtype == DType::bf16;
  const QuantizePlan plan = plan_quantize(p);
  check(plan.error == nullptr, kOp, ": unsupported arguments (d = ", d, ", block_size = ", block_size,
        ", layout = ", layout, ", hadamard = ", signs != nullptr, "): ", plan.error ? plan.error : "");

  const int64_t nb = plan.num_blocks;
  check(out.device == x.device && out.dtype == DType::e4m3 && out.is_contiguous(), kOp,
        ": out must be a contiguous float8_e4m3fn tensor on ", x.device);
  if (layout == kQuantLayoutRows) {
    check(out.sizes() == x.sizes(), kOp, ": out must have shape ", x.sizes(), ", got ", out.sizes());
  } else {
    check(out.dim() == 4 && out.size(0) == b && out.size(1) == h && out.size(2) == d && out.size(3) == plan.s_pad, kOp,
          ": out (v_packed) must have shape (", b, ", ", h, ", ", d, ", ", plan.s_pad, "), got ", out.sizes());
  }
  check(descale.device == x.device && descale.dtype == DType::f32 && descale.is_contiguous() && descale.dim() == 3 &&
            descale.size(0) == b && descale.size(1) == h && descale.size(2) == nb,
        kOp, ": descale must be a contiguous float32 (", b, ", ", h, ", ", nb, ") tensor on ", x.device, ", got ",
        descale.dtype_name, " ", descale.sizes());
  if (out.numel() > 0) be.assert_no_overlap(out, x);
  if (descale.numel() > 0) be.assert_no_overlap(descale, x);
  p.out = out.data_ptr();
  p.descale = descale.ptr<float>();
  if (be.tracing()) {
    std::ostringstream os;
    os << kOp << " " << dtype_name(p.is_bf16) << " b=" << p.batch << " s=" << p.seqlen << " h=" << p.heads
       << " d=" << p.d << " block_size=" << p.block_size << " layout=" << p.layout
       << " hadamard=" << int(p.signs != nullptr) << " (m=" << plan.m << ") mean=" << int(p.mean != nullptr)
       << " channel_descale=" << int(p.channel_descale != nullptr) << " threads=" << plan.threads
       << " blocks=" << plan.num_blocks << " vec_loads=" << int(plan.vec_loads);
    be.trace(os.str());
  }
  const int err = run_quantize_fp8(p, be.stream());
  check(err == 0, kOp, ": launch failed: ", cuda_error_string(err));
}

}  // namespace flash3::host
