// A stand-in hsim::Device for testing the runtime library (cudart.cpp) without the interpreter:
// add_module finds `.entry NAME(` and the parameter sizes crudely, module variables get zeroed
// host memory, and launch prints what it was asked to run instead of running it.
// Build a throwaway runtime from it (not part of the Makefile):
//   g++ -std=c++17 -fPIC -Isrc -c tests/fake_device.cpp -o /tmp/fake_device.o
//   g++ -shared -Wl,-soname,libcudart.so.13 -Wl,--version-script=src/libcudart.map \
//     -o /tmp/fakelib/libcudart.so.13 build/obj/cudart.o /tmp/fake_device.o build/obj/tma.o -ldl
//   LD_LIBRARY_PATH=/tmp/fakelib HSIM_VERBOSE=1 ./program
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <regex>
#include <stdexcept>
#include <string>
#include <vector>

#include "sim.h"

namespace hsim {

void fail_check(const std::string& check, const std::string& details) {
  fprintf(stderr, "hopper_sim: %s: %s\n", check.c_str(), details.c_str());
  exit(kStrictExit);
}
void fail_unsupported(const std::string& what) {
  fprintf(stderr, "hopper_sim: %s\n", what.c_str());
  exit(87);
}

struct Device::Impl {
  Options opt;
  std::vector<std::string> modules;
  std::map<std::string, std::unique_ptr<KernelInfo>> kernels;
  struct Var { std::vector<char>* mem; size_t size; };
  std::map<std::string, Var> vars;
  std::map<const char*, size_t> allocs;   // base -> size
  uint64_t launches = 0;
};

Device::Device() : impl_(new Impl) {
  if (const char* s = getenv("HSIM_SEED")) impl_->opt.seed = strtoull(s, nullptr, 10);
  if (const char* s = getenv("HSIM_SMS")) impl_->opt.sms = atoi(s);
  if (const char* s = getenv("HSIM_STRICT")) impl_->opt.strict = atoi(s) != 0;
  if (const char* s = getenv("HSIM_UNINIT")) impl_->opt.check_uninit = atoi(s) != 0;
  if (const char* s = getenv("HSIM_VERBOSE")) impl_->opt.verbose = atoi(s);
}

Device& Device::instance() {
  static Device* d = new Device;
  return *d;
}
Options& Device::options() { return impl_->opt; }

static uint32_t type_bytes(const std::string& t) {
  if (t.size() < 3) return 0;
  int bits = atoi(t.c_str() + 2);
  return bits / 8;
}

int Device::add_module(const std::string& ptx, const std::string& name) {
  int m = (int)impl_->modules.size();
  impl_->modules.push_back(name);
  // Entries and their parameter lists.
  size_t pos = 0;
  int fn = 0;
  while ((pos = ptx.find(".entry ", pos)) != std::string::npos) {
    size_t open = ptx.find('(', pos);
    size_t close = ptx.find(')', open);
    if (open == std::string::npos || close == std::string::npos) break;
    std::string kname = ptx.substr(pos + 7, open - pos - 7);
    while (!kname.empty() && isspace((unsigned char)kname.back())) kname.pop_back();
    auto k = std::make_unique<KernelInfo>();
    k->name = kname;
    k->module = m;
    k->function = fn++;
    std::string params = ptx.substr(open + 1, close - open - 1);
    static const std::regex prm(R"(\.param\s+(?:\.align\s+(\d+)\s+)?(\.[a-z]\d+)\s+(?:\.ptr\s+(?:\.\w+\s+)?(?:\.align\s+\d+\s+)?)?\w+(?:\[(\d+)\])?)");
    uint32_t off = 0;
    for (auto it = std::sregex_iterator(params.begin(), params.end(), prm); it != std::sregex_iterator(); ++it) {
      auto& mt = *it;
      uint32_t eb = type_bytes(mt[2].str());
      uint32_t count = mt[3].matched ? (uint32_t)atoi(mt[3].str().c_str()) : 1;
      uint32_t align = mt[1].matched ? (uint32_t)atoi(mt[1].str().c_str()) : eb;
      if (!align) align = 1;
      off = (off + align - 1) / align * align;
      k->param_offsets.push_back(off);
      k->param_sizes.push_back(eb * count);
      off += eb * count;
    }
    k->param_bytes = off;
    size_t body_end = ptx.find('{', close);
    std::string attrs = ptx.substr(close, body_end == std::string::npos ? 0 : body_end - close);
    std::smatch cm;
    static const std::regex rc(R"(\.reqnctapercluster\s+(\d+)\s*(?:,\s*(\d+))?\s*(?:,\s*(\d+))?)");
    if (std::regex_search(attrs, cm, rc)) {
      k->req_cluster[0] = atoi(cm[1].str().c_str());
      k->req_cluster[1] = cm[2].matched ? atoi(cm[2].str().c_str()) : 1;
      k->req_cluster[2] = cm[3].matched ? atoi(cm[3].str().c_str()) : 1;
    }
    impl_->kernels[kname] = std::move(k);
    pos = close;
  }
  // Module-scope variables: ".global"/".const" at the start of a line (after .visible/.extern).
  static const std::regex var(R"((?:^|\n)\s*(?:\.visible\s+|\.weak\s+)?\.(?:global|const)\s+(?:\.align\s+(\d+)\s+)?(\.[a-z]\d+)\s+(\w+)(?:\[(\d+)\])?)");
  for (auto it = std::sregex_iterator(ptx.begin(), ptx.end(), var); it != std::sregex_iterator(); ++it) {
    auto& mt = *it;
    size_t sz = type_bytes(mt[2].str()) * (mt[4].matched ? atoll(mt[4].str().c_str()) : 1);
    if (!sz) continue;
    auto* mem = new std::vector<char>(sz + 64, 0);
    impl_->vars[mt[3].str()] = {mem, sz};
    add_allocation(mem->data(), sz, "module variable");
  }
  fprintf(stderr, "fake_device: add_module %d %s: %zu bytes of PTX, %zu kernels, %zu variables so far\n", m,
          name.c_str(), ptx.size(), impl_->kernels.size(), impl_->vars.size());
  return m;
}

KernelInfo* Device::kernel(const std::string& n) {
  auto it = impl_->kernels.find(n);
  return it == impl_->kernels.end() ? nullptr : it->second.get();
}

void* Device::symbol_address(const std::string& n, size_t* size) {
  auto it = impl_->vars.find(n);
  if (it == impl_->vars.end()) return nullptr;
  if (size) *size = it->second.size;
  return it->second.mem->data();
}

void Device::add_allocation(const void* p, size_t n, const char*) { impl_->allocs[(const char*)p] = n; }
bool Device::remove_allocation(const void* p) { return impl_->allocs.erase((const char*)p) > 0; }
bool Device::is_allocation(const void* p, size_t n) const {
  auto it = impl_->allocs.upper_bound((const char*)p);
  if (it == impl_->allocs.begin()) return false;
  --it;
  return (const char*)p + n <= it->first + it->second;
}

int Device::launch(KernelInfo* k, const LaunchParams& lp, void** args) {
  ++impl_->launches;
  printf("fake_device: launch %s grid (%u,%u,%u) block (%u,%u,%u) cluster (%u,%u,%u) dyn_smem %zu params %zu (%u bytes)\n",
         k->name.c_str(), lp.grid.x, lp.grid.y, lp.grid.z, lp.block.x, lp.block.y, lp.block.z,
         lp.cluster.x, lp.cluster.y, lp.cluster.z, lp.dyn_smem, k->param_sizes.size(), k->param_bytes);
  for (size_t i = 0; i < k->param_sizes.size() && i < 4; ++i) {
    const unsigned char* b = (const unsigned char*)args[i];
    uint32_t n = k->param_sizes[i];
    printf("  param %zu (%u bytes):", i, n);
    if (n == 8) printf(" 0x%llx", (unsigned long long)*(const uint64_t*)b);
    else if (n == 4) printf(" 0x%x (%d, %g)", *(const uint32_t*)b, *(const int32_t*)b, *(const float*)b);
    else for (uint32_t j = 0; j < n && j < 24; ++j) printf(" %02x", b[j]);
    printf("\n");
  }
  fflush(stdout);
  return 0;
}

int Device::occupancy(const KernelInfo* k, uint32_t threads, size_t dyn_smem) const {
  size_t smem = dyn_smem + k->static_smem + kReservedSmemPerBlock;
  int by_threads = 2048 / (int)std::max<uint32_t>(threads, 1);
  int by_smem = (int)(kSmemPerSM / smem);
  return std::max(0, std::min(std::min(by_threads, by_smem), 32));
}
uint64_t Device::instructions() const { return 0; }
double Device::launch_seconds() const { return 0; }

}  // namespace hsim
