// torch side of the fused FP8 rotate-and-quantize kernel (a fragment of the flash3 op library;
// fwd_binding.cpp defines it).
//
//   flash3::quantize_fp8_sm90(x, signs?, mean?, channel_descale?, block_size, layout, out!,
//                             descale!) -> ()
//       CUDA: x (b, s, h, d) bf16/fp16 (any strides, contiguous channels) -> out e4m3 and
//       descale fp32 (b, h, ceil(s / block_size)), both contiguous; layout 0: out (b, s, h, d),
//       layout 1 (V packed): out (b, h, d, ceil(s / 16) * 16). signs (d,) fp32 = rotate first
//       (flash3.hadamard); mean / channel_descale (b, h, d) fp32 with contiguous channels.
//       No host synchronization (csrc/flash3/fp8/quantize.h). Meta: nothing.
// flash3/_quantize.py validates first; the host layer's checks are a defence of the kernel's memory
// accesses: csrc/flash3/host/quantize.cpp checks the arguments and launches; this file adapts it to
// at::Tensor.
#include <torch/library.h>

#include <cstdint>
#include <optional>

#include "flash3/host/quantize.h"
#include "torch_adapter.h"

namespace flash3 {
namespace {

void quantize_fp8_sm90_cuda(const Tensor& x, const std::optional<Tensor>& signs,
                            const std::optional<Tensor>& mean,
                            const std::optional<Tensor>& channel_descale, int64_t block_size,
                            int64_t layout, const Tensor& out, const Tensor& descale) {
  const auto sg = view(signs), mn = view(mean), cd = view(channel_descale);
  run_host_op(x, [&](host::Backend& be) {
    host::quantize_fp8_sm90(be, view(x), ptr(sg), ptr(mn), ptr(cd), block_size, layout, view(out), view(descale));
  });
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
