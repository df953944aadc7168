// The sim driver's op "quantize_fp8": csrc/fp8_quantize_binding.cpp quantize_fp8_sm90_cuda line for
// line on simdrv::Tensor, launching csrc/flash3/fp8/quantize.cu (plan_quantize, run_quantize_fp8).
//
// case.txt: tensors x out descale, optional signs mean channel_descale; scalars block_size layout.
// Outputs: out descale. The binding's device checks (every tensor on x's device) and
// at::assert_no_overlap have no counterpart: the driver's tensors are separate allocations on its
// one device.
#include "sim_case.h"

#include "flash3/fp8/quantize.h"

namespace {

using namespace simdrv;

// at::Tensor::is_contiguous(): row-major strides on every dimension of size > 1.
bool is_contiguous(const Tensor& t) {
  int64_t expected = 1;
  for (int d = t.dim() - 1; d >= 0; --d) {
    if (t.size(d) != 1 && t.stride(d) != expected) return t.numel() == 0;
    expected *= t.size(d);
  }
  return true;
}

// The binding's own to_int (its message names the op; simdrv::to_int is binding_common.h's).
int quant_to_int(int64_t v, const char* what) {
  check(v >= 0 && v <= std::numeric_limits<int32_t>::max(), "flash3.quantize_fp8_sm90: ", what, " = ", v,
        " does not fit in int32");
  return static_cast<int>(v);
}

// (b, h, d) fp32 with contiguous channels; returns its data and (b, h) strides.
const float* per_head(const Tensor* t, const char* name, const Tensor& x, int64_t* stride_b, int64_t* stride_h) {
  *stride_b = 0, *stride_h = 0;
  if (t == nullptr) return nullptr;
  const Tensor& v = *t;
  check(v.dtype == DType::f32, "flash3.quantize_fp8_sm90: ", name, " must be float32, got ", dtype_str(v.dtype));
  check(v.dim() == 3 && v.size(0) == x.size(0) && v.size(1) == x.size(2) && v.size(2) == x.size(3),
        "flash3.quantize_fp8_sm90: ", name, " must have shape (", x.size(0), ", ", x.size(2), ", ", x.size(3),
        "), got ", shape_str(v.sizes));
  check(v.stride(2) == 1 || v.size(2) == 1, "flash3.quantize_fp8_sm90: ", name,
        " must have a contiguous last dimension");
  *stride_b = v.stride(0), *stride_h = v.stride(1);
  return static_cast<const float*>(v.data_ptr());
}

void quantize_fp8_sm90(const Case& c, const DeviceInfo&) {
  const Tensor &x = c.t("x"), &out = c.t("out"), &descale = c.t("descale");
  const Tensor *signs = c.opt("signs"), *mean = c.opt("mean"), *channel_descale = c.opt("channel_descale");
  const int64_t block_size = c.integer("block_size"), layout = c.integer("layout");

  check(x.dtype == DType::bf16 || x.dtype == DType::fp16,
        "flash3.quantize_fp8_sm90: x must be bfloat16 or float16, got ", dtype_str(x.dtype));
  check(x.dim() == 4, "flash3.quantize_fp8_sm90: x must be 4-D (b, s, h, d), got shape ", shape_str(x.sizes));
  check(x.stride(3) == 1 || x.size(3) == 1, "flash3.quantize_fp8_sm90: x must have a contiguous last dimension");
  const int64_t b = x.size(0), s = x.size(1), h = x.size(2), d = x.size(3);
  check(block_size > 0 && block_size <= std::numeric_limits<int32_t>::max(),
        "flash3.quantize_fp8_sm90: block_size must be a positive int32, got ", block_size);
  check(layout == flash3::kQuantLayoutRows || layout == flash3::kQuantLayoutVPacked,
        "flash3.quantize_fp8_sm90: layout must be 0 (rows) or 1 (v_packed), got ", layout);

  flash3::QuantizeParams p{};
  p.x = x.data_ptr();
  p.x_batch_stride = x.stride(0), p.x_row_stride = x.stride(1), p.x_head_stride = x.stride(2);
  if (signs != nullptr) {
    const Tensor& sg = *signs;
    check(sg.dtype == DType::f32 && sg.dim() == 1 && sg.size(0) == d && is_contiguous(sg),
          "flash3.quantize_fp8_sm90: signs must be a contiguous float32 (", d, ",) tensor");
    p.signs = static_cast<const float*>(sg.data_ptr());
  }
  p.mean = per_head(mean, "mean", x, &p.mean_batch_stride, &p.mean_head_stride);
  p.channel_descale = per_head(channel_descale, "channel_descale", x, &p.cd_batch_stride, &p.cd_head_stride);
  p.batch = quant_to_int(b, "batch"), p.seqlen = quant_to_int(s, "seqlen");
  p.heads = quant_to_int(h, "heads"), p.d = quant_to_int(d, "head dim");
  p.block_size = static_cast<int>(block_size);
  p.layout = static_cast<int>(layout);
  p.is_bf16 = x.dtype == DType::bf16;
  const flash3::QuantizePlan plan = flash3::plan_quantize(p);
  check(plan.error == nullptr, "flash3.quantize_fp8_sm90: unsupported arguments (d = ", d, ", block_size = ",
        block_size, ", layout = ", layout, ", hadamard = ", signs != nullptr, "): ", plan.error ? plan.error : "");

  const int64_t nb = plan.num_blocks;
  check(out.dtype == DType::e4m3 && is_contiguous(out),
        "flash3.quantize_fp8_sm90: out must be a contiguous float8_e4m3fn tensor");
  if (layout == flash3::kQuantLayoutRows) {
    check(out.sizes == x.sizes, "flash3.quantize_fp8_sm90: out must have shape ", shape_str(x.sizes), ", got ",
          shape_str(out.sizes));
  } else {
    check(out.dim() == 4 && out.size(0) == b && out.size(1) == h && out.size(2) == d && out.size(3) == plan.s_pad,
          "flash3.quantize_fp8_sm90: out (v_packed) must have shape (", b, ", ", h, ", ", d, ", ", plan.s_pad,
          "), got ", shape_str(out.sizes));
  }
  check(descale.dtype == DType::f32 && is_contiguous(descale) && descale.dim() == 3 && descale.size(0) == b &&
            descale.size(1) == h && descale.size(2) == nb,
        "flash3.quantize_fp8_sm90: descale must be a contiguous float32 (", b, ", ", h, ", ", nb,
        ") tensor, got ", dtype_str(descale.dtype), " ", shape_str(descale.sizes));
  p.out = out.data_ptr();
  p.descale = static_cast<float*>(descale.data_ptr());
  std::fprintf(stderr, "sim_driver: flash3.quantize_fp8_sm90 %s b=%d s=%d h=%d d=%d block_size=%d layout=%d "
               "hadamard=%d (m=%d) mean=%d channel_descale=%d threads=%d blocks=%d vec_loads=%d\n",
               dtype_name(p.is_bf16), p.batch, p.seqlen, p.heads, p.d, p.block_size, p.layout, int(p.signs != nullptr),
               plan.m, int(p.mean != nullptr), int(p.channel_descale != nullptr), plan.threads, plan.num_blocks,
               int(plan.vec_loads));
  const int err = flash3::run_quantize_fp8(p, nullptr);  // the default stream (torch's current stream)
  check(err == 0, "flash3.quantize_fp8_sm90: launch failed: ", cudaGetErrorString(static_cast<cudaError_t>(err)));
}

// The op is compiled for both input dtypes in every build (setup.py compiles quantize.cu always);
// binding.cpp's kernel_info() does not list it, so tools/smoke.py adds the same entry on a GPU.
std::string quantize_info() { return "\"quantize_fp8\": [\"bf16\", \"fp16\"]"; }

const RegisterOp reg_quantize{{"quantize_fp8", quantize_fp8_sm90, {"out", "descale"}, quantize_info}};

}  // namespace
