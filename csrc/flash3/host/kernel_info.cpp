#include "flash3/host/kernel_info.h"

#include <algorithm>
#include <sstream>
#include <tuple>
#include <vector>

#include "flash3/bwd/api.h"
#include "flash3/decode/api.h"
#include "flash3/fwd/api.h"

namespace flash3::host {
namespace {

// One list: entries (dtype order: 0 bf16, 1 fp16, or -1 without a dtype; d; d_v), sorted, unique.
void write_list(std::ostringstream& os, const char* name, std::vector<std::tuple<int, int, int>> entries) {
  std::sort(entries.begin(), entries.end());
  entries.erase(std::unique(entries.begin(), entries.end()), entries.end());
  os << "\"" << name << "\": [";
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto [dtype, d, d_v] = entries[i];
    os << (i ? ", " : "") << "[";
    if (dtype >= 0) os << "\"" << (dtype == 0 ? "bf16" : "fp16") << "\", ";
    os << d << ", " << d_v << "]";
  }
  os << "]";
}

template <class Entry>
std::vector<std::tuple<int, int, int>> dtype_entries(const std::vector<Entry>& kernels) {
  std::vector<std::tuple<int, int, int>> out;
  for (const Entry& e : kernels) out.emplace_back(e.is_bf16 ? 0 : 1, e.head_dim, e.head_dim_v);
  return out;
}

}  // namespace

std::string kernel_lists_json() {
  std::ostringstream os;
  write_list(os, "fwd", dtype_entries(fwd_kernels()));
  std::vector<std::tuple<int, int, int>> fp8;  // the FP8 (e4m3 in, bf16 out) kernels: no dtype
  for (const FwdKernelEntry& e : fwd_fp8_kernels()) fp8.emplace_back(-1, e.head_dim, e.head_dim_v);
  os << ", ";
  write_list(os, "fwd_fp8", fp8);
  os << ", ";
  write_list(os, "bwd", dtype_entries(bwd_kernels()));
  // The decode (KV-cache) kernels, caches of q's dtype then FP8 caches: (q dtype, d, d_v).
  os << ", ";
  write_list(os, "decode", dtype_entries(fwd_decode_kernels(false)));
  os << ", ";
  write_list(os, "decode_fp8_cache", dtype_entries(fwd_decode_kernels(true)));
  return os.str();
}

}  // namespace flash3::host
