// The driver's "quantize_fp8" op: torch.ops.flash3.quantize_fp8_sm90 through the host layer
// (csrc/flash3/host/quantize.cpp, the code csrc/quantize_fp8_binding.cpp runs), launching
// csrc/flash3/fp8/quantize.cu.
//
// case.txt: tensors x out descale, optional signs mean channel_descale; scalars block_size layout.
// Outputs: out descale.
#include "sim_case.h"

#include "flash3/host/quantize.h"

namespace {

using namespace simdrv;

void quantize_fp8(const Case& c, flash3::host::Backend& be) {
  const auto signs = view(c.opt("signs")), mean = view(c.opt("mean")), cd = view(c.opt("channel_descale"));
  flash3::host::quantize_fp8_sm90(be, view(c.t("x")), ptr(signs), ptr(mean), ptr(cd), c.integer("block_size"),
                                  c.integer("layout"), view(c.t("out")), view(c.t("descale")));
}

// The op is compiled for both input dtypes in every build (setup.py compiles quantize.cu always);
// fwd_binding.cpp's kernel_info() does not list it, so tools/smoke/smoke.py adds the same entry on a GPU.
std::string quantize_info() { return "\"quantize_fp8\": [\"bf16\", \"fp16\"]"; }

const RegisterOp reg_quantize{{"quantize_fp8", quantize_fp8, {"out", "descale"}, quantize_info}};

}  // namespace
