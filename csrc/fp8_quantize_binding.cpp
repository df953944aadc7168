// torch side of the fused FP8 rotate-and-quantize kernel (a fragment of the flash3 op library;
// binding.cpp defines it).
//
//   flash3::quantize_fp8_sm90(x, signs?, mean?, channel_descale?, block_size, layout, out!,
//                             descale!) -> ()
//       CUDA: x (b, s, h, d) bf16/fp16 (any strides, contiguous channels) -> out e4m3 and
//       descale fp32 (b, h, ceil(s / block_size)), both contiguous; layout 0: out (b, s, h, d),
//       layout 1 (V packed): out (b, h, d, ceil(s / 16) * 16). signs (d,) fp32 = rotate first
//       (flash3.hadamard); mean / channel_descale (b, h, d) fp32 with contiguous channels.
//       No host synchronization (csrc/flash3/fp8/quantize.h). Meta: nothing.
// flash3/_quantize.py validates first; these checks are a defence of the kernel's memory accesses.
#include <ATen/MemoryOverlap.h>
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/library.h>

#include <cstdint>
#include <limits>
#include <optional>

#include "flash3/fp8/quantize.h"

namespace flash3 {
namespace {

using at::Tensor;

int to_int(int64_t v, const char* what) {
  TORCH_CHECK(v >= 0 && v <= std::numeric_limits<int32_t>::max(), "flash3.quantize_fp8_sm90: ",
              what, " = ", v, " does not fit in int32");
  return static_cast<int>(v);
}

// (b, h, d) fp32 on x's device with contiguous channels; returns its data and (b, h) strides.
const float* per_head(const std::optional<Tensor>& t, const char* name, const Tensor& x,
                      int64_t* stride_b, int64_t* stride_h) {
  *stride_b = 0, *stride_h = 0;
  if (!t.has_value()) return nullptr;
  const Tensor& v = *t;
  TORCH_CHECK(v.device() == x.device(), "flash3.quantize_fp8_sm90: ", name, " must be on ",
              x.device(), ", got ", v.device());
  TORCH_CHECK(v.scalar_type() == at::kFloat, "flash3.quantize_fp8_sm90: ", name,
              " must be float32, got ", v.scalar_type());
  TORCH_CHECK(v.dim() == 3 && v.size(0) == x.size(0) && v.size(1) == x.size(2) &&
                  v.size(2) == x.size(3),
              "flash3.quantize_fp8_sm90: ", name, " must have shape (", x.size(0), ", ", x.size(2),
              ", ", x.size(3), "), got ", v.sizes());
  TORCH_CHECK(v.stride(2) == 1 || v.size(2) == 1, "flash3.quantize_fp8_sm90: ", name,
              " must have a contiguous last dimension");
  *stride_b = v.stride(0), *stride_h = v.stride(1);
  return v.data_ptr<float>();
}

void quantize_fp8_sm90_cuda(const Tensor& x, const std::optional<Tensor>& signs,
                            const std::optional<Tensor>& mean,
                            const std::optional<Tensor>& channel_descale, int64_t block_size,
                            int64_t layout, const Tensor& out, const Tensor& descale) {
  TORCH_CHECK(x.is_cuda(), "flash3.quantize_fp8_sm90: x must be a CUDA tensor");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf,
              "flash3.quantize_fp8_sm90: x must be bfloat16 or float16, got ", x.scalar_type());
  TORCH_CHECK(x.dim() == 4, "flash3.quantize_fp8_sm90: x must be 4-D (b, s, h, d), got shape ",
              x.sizes());
  TORCH_CHECK(x.stride(3) == 1 || x.size(3) == 1,
              "flash3.quantize_fp8_sm90: x must have a contiguous last dimension");
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t b = x.size(0), s = x.size(1), h = x.size(2), d = x.size(3);
  TORCH_CHECK(block_size > 0 && block_size <= std::numeric_limits<int32_t>::max(),
              "flash3.quantize_fp8_sm90: block_size must be a positive int32, got ", block_size);
  TORCH_CHECK(layout == kQuantLayoutRows || layout == kQuantLayoutVPacked,
              "flash3.quantize_fp8_sm90: layout must be 0 (rows) or 1 (v_packed), got ", layout);

  QuantizeParams p{};
  p.x = x.data_ptr();
  p.x_batch_stride = x.stride(0), p.x_row_stride = x.stride(1), p.x_head_stride = x.stride(2);
  if (signs.has_value()) {
    const Tensor& sg = *signs;
    TORCH_CHECK(sg.device() == x.device() && sg.scalar_type() == at::kFloat && sg.dim() == 1 &&
                    sg.size(0) == d && sg.is_contiguous(),
                "flash3.quantize_fp8_sm90: signs must be a contiguous float32 (", d,
                ",) tensor on ", x.device());
    p.signs = sg.data_ptr<float>();
  }
  p.mean = per_head(mean, "mean", x, &p.mean_batch_stride, &p.mean_head_stride);
  p.channel_descale =
      per_head(channel_descale, "channel_descale", x, &p.cd_batch_stride, &p.cd_head_stride);
  p.batch = to_int(b, "batch"), p.seqlen = to_int(s, "seqlen");
  p.heads = to_int(h, "heads"), p.d = to_int(d, "head dim");
  p.block_size = static_cast<int>(block_size);
  p.layout = static_cast<int>(layout);
  p.is_bf16 = x.scalar_type() == at::kBFloat16;
  const QuantizePlan plan = plan_quantize(p);
  TORCH_CHECK(plan.error == nullptr, "flash3.quantize_fp8_sm90: unsupported arguments (d = ", d,
              ", block_size = ", block_size, ", layout = ", layout,
              ", hadamard = ", signs.has_value(), "): ", plan.error ? plan.error : "");

  const int64_t nb = plan.num_blocks;
  TORCH_CHECK(out.device() == x.device() && out.scalar_type() == at::kFloat8_e4m3fn &&
                  out.is_contiguous(),
              "flash3.quantize_fp8_sm90: out must be a contiguous float8_e4m3fn tensor on ",
              x.device());
  if (layout == kQuantLayoutRows) {
    TORCH_CHECK(out.sizes() == x.sizes(), "flash3.quantize_fp8_sm90: out must have shape ",
                x.sizes(), ", got ", out.sizes());
  } else {
    TORCH_CHECK(out.dim() == 4 && out.size(0) == b && out.size(1) == h && out.size(2) == d &&
                    out.size(3) == plan.s_pad,
                "flash3.quantize_fp8_sm90: out (v_packed) must have shape (", b, ", ", h, ", ", d,
                ", ", plan.s_pad, "), got ", out.sizes());
  }
  TORCH_CHECK(descale.device() == x.device() && descale.scalar_type() == at::kFloat &&
                  descale.is_contiguous() && descale.dim() == 3 && descale.size(0) == b &&
                  descale.size(1) == h && descale.size(2) == nb,
              "flash3.quantize_fp8_sm90: descale must be a contiguous float32 (", b, ", ", h, ", ",
              nb, ") tensor on ", x.device(), ", got ", descale.scalar_type(), " ",
              descale.sizes());
  if (out.numel() > 0) at::assert_no_overlap(out, x);
  if (descale.numel() > 0) at::assert_no_overlap(descale, x);
  p.out = out.data_ptr();
  p.descale = descale.data_ptr<float>();
  const int err = run_quantize_fp8(p, c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == 0, "flash3.quantize_fp8_sm90: launch failed: ",
              cudaGetErrorString(static_cast<cudaError_t>(err)));
}

void quantize_fp8_sm90_meta(const Tensor&, const std::optional<Tensor>&,
                            const std::optional<Tensor>&, const std::optional<Tensor>&, int64_t,
                            int64_t, const Tensor&, const Tensor&) {}

}  // namespace
}  // namespace flash3

TORCH_LIBRARY_FRAGMENT(flash3, m) {
  m.def(
      "quantize_fp8_sm90(Tensor x, Tensor? signs, Tensor? mean, Tensor? channel_descale, "
      "int block_size, int layout, Tensor(a!) out, Tensor(b!) descale) -> ()");
}

TORCH_LIBRARY_IMPL(flash3, CUDA, m) {
  m.impl("quantize_fp8_sm90", &flash3::quantize_fp8_sm90_cuda);
}

TORCH_LIBRARY_IMPL(flash3, Meta, m) {
  m.impl("quantize_fp8_sm90", &flash3::quantize_fp8_sm90_meta);
}
