#include "flash3/host/kernel_pick.h"

#include <cmath>
#include <sstream>
#include <vector>

#include "flash3/common/attn_logic.h"

namespace flash3::host {

KernelPick pick_kernel(KernelFamily family, DType dtype, int64_t d, int64_t d_v, double softmax_scale,
                       const char* dtype_name, int64_t /*attention_chunk: every kernel takes it*/) {
  KernelPick k;
  auto refuse = [&k](auto... parts) {
    std::ostringstream os;
    (os << ... << parts);
    k.reason = os.str();
    return k;
  };
  const bool fp8 = family == KernelFamily::fwd_fp8;
  if (fp8 ? dtype != DType::e4m3 : dtype != DType::bf16 && dtype != DType::fp16)
    return refuse("q must be ", fp8 ? "float8_e4m3fn" : "bfloat16 or float16", ", got ",
                  dtype_name != nullptr ? dtype_name : dtype_torch_name(dtype), " (no kernel for it: ",
                  fp8 ? "e4m3" : "bf16/fp16", " only)");
  if (!(softmax_scale > 0.0 && std::isfinite(softmax_scale)))
    return refuse("softmax_scale must be finite and > 0, got ", softmax_scale);
  const int64_t m = fp8 ? 16 : 8;
  // MLA: d_v in (256, 512] runs on the MLA decode kernel (d <= 64, a 16-bit cache) only.
  const bool mla = family == KernelFamily::decode && d_v > 256;
  if (d % m || d_v % m || d <= 0 || d_v <= 0 || d > 256 || d_v > (mla ? 512 : 256))
    return refuse("head dims must be multiples of ", m, " in [", m, ", 256], got d=", d, " d_v=", d_v,
                  family == KernelFamily::decode || family == KernelFamily::decode_fp8_cache
                      ? " (d_v up to 512 with d <= 64: the MLA decode kernel, 16-bit caches)"
                      : "");
  if (mla && d > 64)
    return refuse("d_v above 256 runs on the MLA decode kernel, which takes d <= 64, got d=", d, " d_v=", d_v);
  const bool is_bf16 = dtype != DType::fp16;
  const int di = static_cast<int>(d), dvi = static_cast<int>(d_v);
  switch (family) {
    case KernelFamily::fwd:
      k.fwd = pick_fwd_kernel(fwd_kernels(), is_bf16, di, dvi);
      break;
    case KernelFamily::fwd_fp8: k.fwd = pick_fwd_kernel(fwd_fp8_kernels(), true, di, dvi); break;
    case KernelFamily::decode:
    case KernelFamily::decode_fp8_cache: {
      // The MLA kernel (d_v > 256) serves only calls with d_v > 256: a smaller d_v keeps the
      // plain decode tiles even where the MLA kernel's head dims are the smallest that cover it.
      std::vector<FwdKernelEntry> entries;
      for (const FwdKernelEntry& e : fwd_decode_kernels(family == KernelFamily::decode_fp8_cache))
        if ((e.head_dim_v > 256) == mla) entries.push_back(e);
      const FwdKernelEntry* e = pick_fwd_kernel(entries, is_bf16, di, dvi);
      // The registry's own entry (entries is a local copy).
      if (e != nullptr)
        for (const FwdKernelEntry& r : fwd_decode_kernels(family == KernelFamily::decode_fp8_cache))
          if (r.launch == e->launch) k.fwd = &r;
      break;
    }
    case KernelFamily::bwd: k.bwd = find_bwd_kernel(is_bf16, di, dvi); break;
  }
  if (k.fwd == nullptr && k.bwd == nullptr) {
    k.not_built = true;
    const char* what = family == KernelFamily::fwd_fp8            ? "FP8"
                       : family == KernelFamily::decode_fp8_cache ? " FP8-cache decode"
                       : family == KernelFamily::decode           ? " decode"
                       : family == KernelFamily::bwd              ? " backward"
                                                                  : "";
    return refuse("no ", fp8 ? "" : (is_bf16 ? "bf16" : "fp16"), mla ? " MLA" : "", what, " kernel for head dim (",
                  d, ", ", d_v, ") or larger in this build", mla ? " (MLA: bf16, d 64, d_v 512)" : "");
  }
  return k;
}

std::string kernel_pick_json(const std::string& family, const std::string& dtype, int64_t d, int64_t d_v,
                             double softmax_scale, int64_t attention_chunk) {
  KernelFamily f = KernelFamily::fwd;
  if (family == "fwd_fp8") f = KernelFamily::fwd_fp8;
  else if (family == "decode") f = KernelFamily::decode;
  else if (family == "decode_fp8_cache") f = KernelFamily::decode_fp8_cache;
  else if (family == "bwd") f = KernelFamily::bwd;
  else if (family != "fwd") return "{\"reason\": \"no kernel family '" + family + "'\"}";
  // torch's dtype names (str(torch.bfloat16) without "torch.").
  const DType t = dtype == "bfloat16" ? DType::bf16
                  : dtype == "float16" ? DType::fp16
                  : dtype == "float8_e4m3fn" ? DType::e4m3
                                             : DType::other;
  const KernelPick k =
      pick_kernel(f, t, d, d_v, softmax_scale, dtype.c_str(), attention_chunk);
  std::ostringstream os;
  if (!k.reason.empty()) {
    os << "{\"reason\": \"";
    for (char c : k.reason) os << (c == '"' || c == '\\' ? "\\" : "") << c;
    os << "\"}";
  } else if (k.fwd != nullptr) {
    os << "{\"kernel\": [" << k.fwd->head_dim << ", " << k.fwd->head_dim_v << "]}";
  } else {
    os << "{\"kernel\": [" << k.bwd->head_dim << ", " << k.bwd->head_dim_v << "]}";
  }
  return os.str();
}

}  // namespace flash3::host
