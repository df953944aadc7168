// libcudart.so.13 replacement: programs built with `nvcc -cudart shared` (CUDA 13) run unchanged
// with build/lib first on LD_LIBRARY_PATH. Host and device share one address space: device
// pointers are host pointers registered with hsim::Device, copies are memmove, and every launch
// runs to completion on the calling thread, so streams and events are trivially ordered.
//
// Kernel images come from the fatbins the program registers: the PTX entry for sm_90a (raw, or
// zstd-compressed, decompressed through the system's libzstd; else `cuobjdump -ptx` as a fallback)
// is handed to Device::add_module when one of its kernels or variables is first used.
//
// Anything a program calls that is not implemented here fails loudly ("hopper_sim: unimplemented
// CUDA runtime call <name>", exit 87) instead of pretending to work.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <limits.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "sim.h"
#include "tma.h"

// We define the deprecated entry points too (cudaGetDriverEntryPoint); no warnings for that.
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

#define HSIM_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

using hsim::Device;

[[noreturn]] void unimplemented(const char* name) {
  fflush(stdout);
  fprintf(stderr, "hopper_sim: unimplemented CUDA runtime call %s\n", name);
  fflush(stderr);
  _exit(87);  // _exit: atexit handlers (fatbin unregistration) could call back into us
}

int verbose() { return Device::instance().options().verbose; }

// ---------------------------------------------------------------------------------------------
// Registry of fatbins, kernels and variables.

struct Fatbin;

struct KernelRec {          // one registered host stub; cudaKernel_t handles point at these
  uint32_t magic = 0x4b524543;  // lets a cudaKernel_t be told apart from a host stub address
  std::string name;             // mangled device name
  Fatbin* fb = nullptr;
  const void* host_fun = nullptr;
  hsim::KernelInfo* info = nullptr;   // resolved on first use
};

struct VarRec {
  std::string name;
  Fatbin* fb = nullptr;
  size_t size = 0;
  bool managed = false;
  void** managed_ptr = nullptr;      // __cudaRegisterManagedVar: host code reads *ptr
};

struct Fatbin {
  const void* wrapper = nullptr;
  void* handle_slot = nullptr;       // what __cudaRegisterFatBinary returns points here
  std::string origin;                // file that holds the fatbin (program or shared library)
  std::vector<std::string> ptx;      // PTX texts found (after decompression)
  std::string ptx_problem;           // why no PTX is available, reported on first use
  bool loaded = false;
  std::vector<VarRec*> managed;
};

struct Registry {
  std::mutex mu;
  std::vector<std::unique_ptr<Fatbin>> fatbins;
  std::unordered_map<const void*, KernelRec*> by_host;   // host stub -> kernel
  std::set<const void*> handles;                          // KernelRec* handed out
  std::unordered_map<const void*, VarRec*> vars;          // host shadow variable -> var
  std::set<std::string> loaded_origins_cuobjdump;         // fallback loads whole files once
};

Registry& reg() {
  static Registry* r = new Registry;  // leaked on purpose: used from atexit handlers
  return *r;
}

// Sticky "last error": set by every failing call, read (and reset) by cudaGetLastError.
thread_local cudaError_t t_last_error = cudaSuccess;

int verbose();
// __builtin_FUNCTION names the API call that failed, for the HSIM_VERBOSE trace.
cudaError_t ret(cudaError_t e, const char* fn = __builtin_FUNCTION()) {
  if (e != cudaSuccess) {
    t_last_error = e;
    if (verbose()) fprintf(stderr, "hopper_sim: %s returns error %d\n", fn, (int)e);
  }
  return e;
}

// ---------------------------------------------------------------------------------------------
// Fatbin parsing. Layout (found by dumping nvcc 13 output):
//   fatbin header (16 B): u32 magic 0xBA55ED50, u16 version 1, u16 header size (16),
//                         u64 size of the entries that follow
//   entry header: u16 kind (1 PTX, 2 ELF cubin), u16 version 0x0101, u32 header size (PTX 80,
//                 cubin 64), u64 payload size (padded), u32 compressed size, u32 ?,
//                 u16 minor, u16 major (PTX ISA version for PTX), u32 arch (90 for sm_90/90a),
//                 u32 name offset, u32 name length, u64 flags, u64 0, u64 uncompressed size
//   flags: 0x1 64-bit, 0x10 linux host, 0x2000 LZ4-compressed (older toolkits),
//          0x8000 zstd-compressed (CUDA 13 default), 0x100000 seen on sm_90a images.
// The fatbin wrapper passed to __cudaRegisterFatBinary is {int magic 0x466243b1; int version;
// const void* data; void* unused}.

constexpr uint32_t kWrapperMagic = 0x466243b1;
constexpr uint32_t kFatbinMagic = 0xBA55ED50;
constexpr uint64_t kFlagLz4 = 0x2000, kFlagZstd = 0x8000;

struct FatbinWrapper {
  int magic;
  int version;
  const void* data;
  void* unused;
};

#pragma pack(push, 1)
struct FatbinHeader {
  uint32_t magic;
  uint16_t version, header_size;
  uint64_t size;
};
struct EntryHeader {
  uint16_t kind, version;
  uint32_t header_size;
  uint64_t payload_size;
  uint32_t compressed_size, unknown0;
  uint16_t minor, major;
  uint32_t arch;
  uint32_t name_offset, name_len;
  uint64_t flags, zero;
  uint64_t uncompressed_size;
};
#pragma pack(pop)

// zstd through the system library, loaded on demand (no build-time dependency).
bool zstd_decompress(const void* src, size_t n, size_t out_size, std::string* out, std::string* err) {
  static void* lib = dlopen("libzstd.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) { *err = "libzstd.so.1 not available"; return false; }
  using Dec = size_t (*)(void*, size_t, const void*, size_t);
  using IsErr = unsigned (*)(size_t);
  using Name = const char* (*)(size_t);
  auto dec = (Dec)dlsym(lib, "ZSTD_decompress");
  auto is_err = (IsErr)dlsym(lib, "ZSTD_isError");
  auto name = (Name)dlsym(lib, "ZSTD_getErrorName");
  if (!dec || !is_err) { *err = "libzstd.so.1 lacks ZSTD_decompress"; return false; }
  out->assign(out_size, '\0');
  size_t r = dec(&(*out)[0], out_size, src, n);
  if (is_err(r)) { *err = std::string("zstd: ") + (name ? name(r) : "error"); return false; }
  out->resize(r);
  return true;
}

std::string cstr_prefix(const char* p, size_t n) { return std::string(p, strnlen(p, n)); }

// Collects the PTX entries of one fatbin: the sm_90a ones if any, else the highest arch <= 90.
void parse_fatbin(Fatbin* fb, const void* data) {
  auto* h = static_cast<const FatbinHeader*>(data);
  if (h->magic != kFatbinMagic) {
    fb->ptx_problem = "fatbin has an unknown magic number";
    return;
  }
  const char* p = static_cast<const char*>(data) + h->header_size;
  const char* end = p + h->size;
  struct Cand { uint32_t arch; bool arch_a; std::string text; };
  std::vector<Cand> cands;
  bool compressed_unreadable = false;
  std::string why;
  bool any_cubin = false;
  while (p + sizeof(EntryHeader) <= end) {
    auto* e = reinterpret_cast<const EntryHeader*>(p);
    if (e->header_size < 64 || e->header_size > 4096) break;
    const char* payload = p + e->header_size;
    if (e->kind == 2) any_cubin = true;
    if (e->kind == 1) {
      std::string text;
      bool ok = true;
      if (e->flags & kFlagZstd) {
        std::string err;
        static const bool no_zstd = getenv("HSIM_NO_ZSTD") != nullptr;  // tests the fallback
        size_t csize = e->compressed_size ? e->compressed_size : e->payload_size;
        if (no_zstd) {
          ok = false;
          why = "HSIM_NO_ZSTD set";
        } else if (!zstd_decompress(payload, csize, e->uncompressed_size + 1, &text, &err)) {
          ok = false;
          why = err;
        } else {
          text = cstr_prefix(text.data(), text.size());
        }
      } else if (e->flags & kFlagLz4) {
        ok = false;
        why = "LZ4-compressed PTX";
      } else {
        text = cstr_prefix(payload, e->payload_size);
      }
      if (!ok) {
        compressed_unreadable = true;
      } else {
        bool arch_a = text.find(".target sm_90a") != std::string::npos;
        cands.push_back({e->arch, arch_a, std::move(text)});
      }
    }
    p = payload + e->payload_size;
  }
  // Prefer sm_90a PTX (wgmma, setmaxnreg need it), then the newest arch the device can run.
  int best = -1;
  for (int i = 0; i < (int)cands.size(); ++i) {
    auto& c = cands[i];
    if (c.arch > 90) continue;
    if (best < 0 || (c.arch_a && !cands[best].arch_a) ||
        (c.arch_a == cands[best].arch_a && c.arch > cands[best].arch))
      best = i;
  }
  if (best >= 0) {
    for (auto& c : cands)
      if (c.arch == cands[best].arch && c.arch_a == cands[best].arch_a) fb->ptx.push_back(c.text);
  } else if (compressed_unreadable) {
    fb->ptx_problem = "compressed PTX (" + why + ")";
  } else if (!cands.empty()) {
    fb->ptx_problem = "PTX only for architectures newer than sm_90";
  } else {
    fb->ptx_problem = any_cubin ? "no PTX (only cubin)" : "no PTX";
  }
}

// Fallback for compressed PTX we cannot decompress: `cuobjdump -ptx <file>` prints every PTX
// image of the file; all sm_90a ones are loaded (once per file).
bool load_via_cuobjdump(Fatbin* fb) {
  const char* tool = getenv("HSIM_CUOBJDUMP");
  std::string cmd = std::string(tool && *tool ? tool : "cuobjdump") + " -ptx '" + fb->origin + "' 2>/dev/null";
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return false;
  std::string all;
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) all.append(buf, n);
  int rc = pclose(f);
  if (rc != 0 || all.empty()) return false;
  // Sections start with "Fatbin ptx code:"; the PTX text starts at the first ".version" after it.
  size_t pos = 0;
  const std::string marker = "Fatbin ptx code:";
  while ((pos = all.find(marker, pos)) != std::string::npos) {
    size_t next = all.find("Fatbin ", pos + marker.size());
    std::string sec = all.substr(pos, next == std::string::npos ? std::string::npos : next - pos);
    pos += marker.size();
    if (sec.find("arch = sm_90a") == std::string::npos) continue;
    size_t v = sec.find(".version");
    if (v == std::string::npos) continue;
    fb->ptx.push_back(sec.substr(v));
  }
  return !fb->ptx.empty();
}

void ensure_loaded_locked(Fatbin* fb) {
  if (fb->loaded) return;
  fb->loaded = true;
  if (fb->ptx.empty() && fb->ptx_problem.rfind("compressed", 0) == 0) {
    if (reg().loaded_origins_cuobjdump.count(fb->origin)) {
      fb->ptx_problem.clear();  // already loaded from this file through another fatbin
      return;
    }
    if (load_via_cuobjdump(fb)) {
      reg().loaded_origins_cuobjdump.insert(fb->origin);
      fb->ptx_problem.clear();
      if (verbose()) fprintf(stderr, "hopper_sim: PTX of %s read with cuobjdump\n", fb->origin.c_str());
    } else {
      fprintf(stderr, "hopper_sim: compressed PTX in %s: rebuild with the flags from `make sim-flags`\n",
              fb->origin.c_str());
      _exit(87);
    }
  }
  for (size_t i = 0; i < fb->ptx.size(); ++i) {
    std::string name = fb->origin + ":ptx" + std::to_string(i);
    try {
      int m = Device::instance().add_module(fb->ptx[i], name);
      if (verbose()) fprintf(stderr, "hopper_sim: loaded module %d from %s (%zu bytes)\n", m, name.c_str(), fb->ptx[i].size());
    } catch (const std::exception& e) {
      hsim::fail_unsupported("PTX of " + name + " does not load: " + e.what());
    }
  }
  fb->ptx.clear();
  fb->ptx.shrink_to_fit();
  for (VarRec* v : fb->managed) {
    size_t sz = 0;
    void* a = Device::instance().symbol_address(v->name, &sz);
    if (a && v->managed_ptr) *v->managed_ptr = a;
  }
}

// Host stub address (or cudaKernel_t handle) -> kernel with its KernelInfo resolved.
KernelRec* find_kernel(const void* func, cudaError_t* err) {
  auto& r = reg();
  std::lock_guard<std::mutex> g(r.mu);
  KernelRec* k = nullptr;
  auto it = r.by_host.find(func);
  if (it != r.by_host.end()) k = it->second;
  else if (r.handles.count(func)) k = (KernelRec*)func;
  if (!k) { *err = cudaErrorInvalidDeviceFunction; return nullptr; }
  if (!k->info) {
    ensure_loaded_locked(k->fb);
    k->info = Device::instance().kernel(k->name);
    if (!k->info) {
      std::string why = k->fb->ptx_problem.empty() ? "not found in its PTX" : k->fb->ptx_problem;
      fprintf(stderr, "hopper_sim: kernel %s (%s): %s; build with the flags from `make sim-flags`\n",
              k->name.c_str(), k->fb->origin.c_str(), why.c_str());
      *err = cudaErrorInvalidDeviceFunction;
      return nullptr;
    }
  }
  return k;
}

// Host shadow variable -> device address of the module variable.
void* find_symbol(const void* symbol, size_t* size, cudaError_t* err) {
  auto& r = reg();
  std::lock_guard<std::mutex> g(r.mu);
  auto it = r.vars.find(symbol);
  if (it == r.vars.end()) { *err = cudaErrorInvalidSymbol; return nullptr; }
  ensure_loaded_locked(it->second->fb);
  void* a = Device::instance().symbol_address(it->second->name, size);
  if (!a) *err = cudaErrorInvalidSymbol;
  return a;
}

std::string origin_of(const void* addr) {
  Dl_info info;
  if (dladdr(addr, &info) && info.dli_fname && *info.dli_fname) {
    // The main program reports its name as given on the command line (maybe found via PATH, so
    // without a slash); /proc/self/exe covers that case.
    char buf[PATH_MAX];
    if (strchr(info.dli_fname, '/') && realpath(info.dli_fname, buf)) return buf;
  }
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n > 0) { buf[n] = 0; return buf; }
  return "<program>";
}

// ---------------------------------------------------------------------------------------------
// Memory.

struct Alloc { size_t size; const char* what; };
std::mutex g_mem_mu;
std::map<const void*, Alloc>& allocs() { static auto* m = new std::map<const void*, Alloc>; return *m; }

cudaError_t sim_alloc(void** p, size_t n, const char* what) {
  if (!p) return cudaErrorInvalidValue;
  *p = nullptr;
  if (n == 0) return cudaSuccess;   // as the real runtime: success, null pointer
  size_t rounded = (n + 255) / 256 * 256;
  void* m = aligned_alloc(256, rounded);
  if (!m) return cudaErrorMemoryAllocation;
  // Fresh device memory holds whatever was there; with HSIM_UNINIT fill it with 0xFF (NaN for
  // floats) so outputs a kernel forgot to write stand out, else zeros for determinism.
  memset(m, Device::instance().options().check_uninit ? 0xFF : 0, rounded);
  Device::instance().add_allocation(m, n, what);
  std::lock_guard<std::mutex> g(g_mem_mu);
  allocs()[m] = {n, what};
  *p = m;
  return cudaSuccess;
}

cudaError_t sim_free(void* p) {
  if (!p) return cudaSuccess;
  {
    std::lock_guard<std::mutex> g(g_mem_mu);
    auto it = allocs().find(p);
    if (it == allocs().end()) return cudaErrorInvalidValue;
    allocs().erase(it);
  }
  Device::instance().remove_allocation(p);
  free(p);
  return cudaSuccess;
}

bool dev_ok(const void* p, size_t n) { return n == 0 || Device::instance().is_allocation(p, n); }

cudaError_t sim_memcpy(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  if (n == 0) return cudaSuccess;
  if (!dst || !src) return cudaErrorInvalidValue;
  switch (kind) {
    case cudaMemcpyHostToHost: break;
    case cudaMemcpyHostToDevice: if (!dev_ok(dst, n)) return cudaErrorInvalidValue; break;
    case cudaMemcpyDeviceToHost: if (!dev_ok(src, n)) return cudaErrorInvalidValue; break;
    case cudaMemcpyDeviceToDevice:
      if (!dev_ok(src, n) || !dev_ok(dst, n)) return cudaErrorInvalidValue;
      break;
    case cudaMemcpyDefault: break;
    default: return cudaErrorInvalidMemcpyDirection;
  }
  memmove(dst, src, n);
  return cudaSuccess;
}

// ---------------------------------------------------------------------------------------------
// Launch.

struct CallConfig { dim3 grid, block; size_t smem; void* stream; };
thread_local std::vector<CallConfig> t_call_stack;

void note_once(int id, const char* what) {
  static std::set<int> seen;
  if (verbose() && seen.insert(id).second)
    fprintf(stderr, "hopper_sim: note: %s (ignored)\n", what);
}

cudaError_t do_launch(const void* func, dim3 grid, dim3 block, size_t smem, void** args,
                      dim3 cluster, bool cluster_given) {
  cudaError_t err = cudaSuccess;
  KernelRec* k = find_kernel(func, &err);
  if (!k) return err;
  hsim::KernelInfo* ki = k->info;
  // The checks the hardware/driver makes before anything runs.
  uint64_t threads = (uint64_t)block.x * block.y * block.z;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || threads == 0 || block.x > 1024 ||
      block.y > 1024 || block.z > 64 || threads > 1024 || grid.y > 65535 || grid.z > 65535 ||
      grid.x > 0x7fffffffu)
    return cudaErrorInvalidConfiguration;
  if (threads > ki->max_threads) return cudaErrorInvalidConfiguration;
  if (smem > (size_t)ki->max_dynamic_smem ||
      smem + ki->static_smem > hsim::kMaxSmemPerBlockOptin)
    return cudaErrorInvalidValue;
  hsim::LaunchParams lp;
  lp.grid = {grid.x, grid.y, grid.z};
  lp.block = {block.x, block.y, block.z};
  lp.dyn_smem = smem;
  if (!cluster_given && (ki->req_cluster[0] || ki->req_cluster[1] || ki->req_cluster[2]))
    cluster = dim3(std::max(1u, ki->req_cluster[0]), std::max(1u, ki->req_cluster[1]),
                   std::max(1u, ki->req_cluster[2]));
  if (cluster.x == 0 || cluster.y == 0 || cluster.z == 0) return cudaErrorInvalidClusterSize;
  uint64_t csize = (uint64_t)cluster.x * cluster.y * cluster.z;
  if (csize > 16 || (csize > 8 && !ki->non_portable_cluster_ok) || grid.x % cluster.x ||
      grid.y % cluster.y || grid.z % cluster.z)
    return cudaErrorInvalidClusterSize;
  lp.cluster = {cluster.x, cluster.y, cluster.z};
  if (verbose())
    fprintf(stderr, "hopper_sim: launch %s grid (%u,%u,%u) block (%u,%u,%u) cluster (%u,%u,%u) smem %zu\n",
            k->name.c_str(), grid.x, grid.y, grid.z, block.x, block.y, block.z, cluster.x,
            cluster.y, cluster.z, smem);
  if (ki->param_offsets.size() && !args) return cudaErrorInvalidValue;
  int rc = Device::instance().launch(ki, lp, args);
  return (cudaError_t)rc;
}

// ---------------------------------------------------------------------------------------------
// Streams and events: launches are synchronous, so these only need identity and timestamps.

struct Stream { int priority = 0; unsigned flags = 0; };
struct Event { double t = 0; bool recorded = false; unsigned flags = 0; };

double now_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

// ---------------------------------------------------------------------------------------------
// Device facts: an H100-like sm_90 part, SM count from HSIM_SMS.

int sms() { return Device::instance().options().sms; }

void fill_props(cudaDeviceProp* p) {
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "hopper_sim (sm_90a)");
  for (int i = 0; i < 16; ++i) p->uuid.bytes[i] = (char)(0x40 + i);
  p->totalGlobalMem = 80ull << 30;
  p->sharedMemPerBlock = 49152;
  p->regsPerBlock = 65536;
  p->warpSize = 32;
  p->memPitch = 2147483647;
  p->maxThreadsPerBlock = 1024;
  p->maxThreadsDim[0] = 1024; p->maxThreadsDim[1] = 1024; p->maxThreadsDim[2] = 64;
  p->maxGridSize[0] = 2147483647; p->maxGridSize[1] = 65535; p->maxGridSize[2] = 65535;
  p->totalConstMem = 65536;
  p->major = 9;
  p->minor = 0;
  p->textureAlignment = 512;
  p->texturePitchAlignment = 32;
  p->multiProcessorCount = sms();
  p->integrated = 0;
  p->canMapHostMemory = 1;
  p->maxTexture1D = 131072;
  p->maxTexture2D[0] = 131072; p->maxTexture2D[1] = 65536;
  p->maxTexture3D[0] = p->maxTexture3D[1] = p->maxTexture3D[2] = 16384;
  p->surfaceAlignment = 512;
  p->concurrentKernels = 1;
  p->ECCEnabled = 1;
  p->pciBusID = 1;
  p->asyncEngineCount = 3;
  p->unifiedAddressing = 1;
  p->memoryBusWidth = 5120;
  p->l2CacheSize = 50 * 1024 * 1024;
  p->persistingL2CacheMaxSize = 30 * 1024 * 1024;
  p->maxThreadsPerMultiProcessor = 2048;
  p->streamPrioritiesSupported = 1;
  p->globalL1CacheSupported = 1;
  p->localL1CacheSupported = 1;
  p->sharedMemPerMultiprocessor = hsim::kSmemPerSM;
  p->regsPerMultiprocessor = 65536;
  p->managedMemory = 1;
  p->hostNativeAtomicSupported = 0;
  p->pageableMemoryAccess = 0;
  p->concurrentManagedAccess = 1;
  p->computePreemptionSupported = 1;
  p->canUseHostPointerForRegisteredMem = 1;
  p->cooperativeLaunch = 1;
  p->sharedMemPerBlockOptin = hsim::kMaxSmemPerBlockOptin;
  p->maxBlocksPerMultiProcessor = 32;
  p->accessPolicyMaxWindowSize = 134213632;
  p->reservedSharedMemPerBlock = hsim::kReservedSmemPerBlock;
  p->hostRegisterSupported = 1;
  p->memoryPoolsSupported = 1;
  p->clusterLaunch = 1;
  p->unifiedFunctionPointers = 1;
  p->hostNumaId = -1;
  p->deviceNumaId = -1;
}

bool device_attr(cudaDeviceAttr a, int* v) {
  switch ((int)a) {
    case cudaDevAttrMaxThreadsPerBlock: *v = 1024; return true;
    case cudaDevAttrMaxBlockDimX: case cudaDevAttrMaxBlockDimY: *v = 1024; return true;
    case cudaDevAttrMaxBlockDimZ: *v = 64; return true;
    case cudaDevAttrMaxGridDimX: *v = 2147483647; return true;
    case cudaDevAttrMaxGridDimY: case cudaDevAttrMaxGridDimZ: *v = 65535; return true;
    case cudaDevAttrMaxSharedMemoryPerBlock: *v = 49152; return true;
    case cudaDevAttrTotalConstantMemory: *v = 65536; return true;
    case cudaDevAttrWarpSize: *v = 32; return true;
    case cudaDevAttrMaxPitch: *v = 2147483647; return true;
    case cudaDevAttrMaxRegistersPerBlock: *v = 65536; return true;
    case cudaDevAttrClockRate: *v = 1980000; return true;
    case cudaDevAttrTextureAlignment: *v = 512; return true;
    case cudaDevAttrGpuOverlap: *v = 1; return true;
    case cudaDevAttrMultiProcessorCount: *v = sms(); return true;
    case cudaDevAttrKernelExecTimeout: *v = 0; return true;
    case cudaDevAttrIntegrated: *v = 0; return true;
    case cudaDevAttrCanMapHostMemory: *v = 1; return true;
    case cudaDevAttrComputeMode: *v = 0; return true;
    case cudaDevAttrConcurrentKernels: *v = 1; return true;
    case cudaDevAttrEccEnabled: *v = 1; return true;
    case cudaDevAttrPciBusId: *v = 1; return true;
    case cudaDevAttrPciDeviceId: case cudaDevAttrPciDomainId: *v = 0; return true;
    case cudaDevAttrTccDriver: *v = 0; return true;
    case cudaDevAttrMemoryClockRate: *v = 2619000; return true;
    case cudaDevAttrGlobalMemoryBusWidth: *v = 5120; return true;
    case cudaDevAttrL2CacheSize: *v = 50 * 1024 * 1024; return true;
    case cudaDevAttrMaxThreadsPerMultiProcessor: *v = 2048; return true;
    case cudaDevAttrAsyncEngineCount: *v = 3; return true;
    case cudaDevAttrUnifiedAddressing: *v = 1; return true;
    case cudaDevAttrComputeCapabilityMajor: *v = 9; return true;
    case cudaDevAttrComputeCapabilityMinor: *v = 0; return true;
    case cudaDevAttrStreamPrioritiesSupported: *v = 1; return true;
    case cudaDevAttrGlobalL1CacheSupported: case cudaDevAttrLocalL1CacheSupported: *v = 1; return true;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *v = (int)hsim::kSmemPerSM; return true;
    case cudaDevAttrMaxRegistersPerMultiprocessor: *v = 65536; return true;
    case cudaDevAttrManagedMemory: *v = 1; return true;
    case cudaDevAttrIsMultiGpuBoard: case cudaDevAttrMultiGpuBoardGroupID: *v = 0; return true;
    case cudaDevAttrHostNativeAtomicSupported: *v = 0; return true;
    case cudaDevAttrSingleToDoublePrecisionPerfRatio: *v = 2; return true;
    case cudaDevAttrPageableMemoryAccess: *v = 0; return true;
    case cudaDevAttrConcurrentManagedAccess: *v = 1; return true;
    case cudaDevAttrComputePreemptionSupported: *v = 1; return true;
    case cudaDevAttrCanUseHostPointerForRegisteredMem: *v = 1; return true;
    case cudaDevAttrCooperativeLaunch: *v = 1; return true;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = (int)hsim::kMaxSmemPerBlockOptin; return true;
    case cudaDevAttrCanFlushRemoteWrites: *v = 0; return true;
    case cudaDevAttrHostRegisterSupported: *v = 1; return true;
    case cudaDevAttrPageableMemoryAccessUsesHostPageTables: *v = 0; return true;
    case cudaDevAttrDirectManagedMemAccessFromHost: *v = 0; return true;
    case cudaDevAttrMaxBlocksPerMultiprocessor: *v = 32; return true;
    case cudaDevAttrMaxPersistingL2CacheSize: *v = 30 * 1024 * 1024; return true;
    case cudaDevAttrMaxAccessPolicyWindowSize: *v = 134213632; return true;
    case cudaDevAttrReservedSharedMemoryPerBlock: *v = (int)hsim::kReservedSmemPerBlock; return true;
    case cudaDevAttrSparseCudaArraySupported: *v = 0; return true;
    case cudaDevAttrHostRegisterReadOnlySupported: *v = 0; return true;
    case cudaDevAttrMemoryPoolsSupported: *v = 1; return true;
    case cudaDevAttrGPUDirectRDMASupported: *v = 0; return true;
    case cudaDevAttrClusterLaunch: *v = 1; return true;
    case cudaDevAttrIpcEventSupport: *v = 0; return true;
    case cudaDevAttrMemSyncDomainCount: *v = 4; return true;
    case cudaDevAttrNumaConfig: *v = 0; return true;
    case cudaDevAttrNumaId: case cudaDevAttrHostNumaId: *v = -1; return true;
    case cudaDevAttrMpsEnabled: *v = 0; return true;
    default: return false;
  }
}

// ---------------------------------------------------------------------------------------------
// Error names.

struct ErrName { int code; const char* name; const char* text; };
const ErrName kErrors[] = {
#define E(c, t) {c, #c, t}
    E(cudaSuccess, "no error"),
    E(cudaErrorInvalidValue, "invalid argument"),
    E(cudaErrorMemoryAllocation, "out of memory"),
    E(cudaErrorInitializationError, "initialization error"),
    E(cudaErrorCudartUnloading, "driver shutting down"),
    E(cudaErrorProfilerDisabled, "profiler disabled while using external profiling tool"),
    E(cudaErrorInvalidConfiguration, "invalid configuration argument"),
    E(cudaErrorInvalidPitchValue, "invalid pitch argument"),
    E(cudaErrorInvalidSymbol, "invalid device symbol"),
    E(cudaErrorInvalidHostPointer, "invalid host pointer"),
    E(cudaErrorInvalidDevicePointer, "invalid device pointer"),
    E(cudaErrorInvalidTexture, "invalid texture reference"),
    E(cudaErrorInvalidMemcpyDirection, "invalid copy direction for memcpy"),
    E(cudaErrorMissingConfiguration, "__global__ function call is not configured"),
    E(cudaErrorInvalidNormSetting, "invalid normalized texture read mode"),
    E(cudaErrorLaunchMaxDepthExceeded, "launch would exceed maximum depth of nested launches"),
    E(cudaErrorNotYetImplemented, "feature not yet implemented"),
    E(cudaErrorInsufficientDriver, "CUDA driver version is insufficient for CUDA runtime version"),
    E(cudaErrorInvalidSurface, "invalid surface reference"),
    E(cudaErrorDuplicateVariableName, "duplicate global variable looked up by string name"),
    E(cudaErrorDevicesUnavailable, "CUDA-capable device(s) is/are busy or unavailable"),
    E(cudaErrorIncompatibleDriverContext, "incompatible driver context"),
    E(cudaErrorMissingConfiguration, "__global__ function call is not configured"),
    E(cudaErrorNoDevice, "no CUDA-capable device is detected"),
    E(cudaErrorInvalidDevice, "invalid device ordinal"),
    E(cudaErrorStartupFailure, "device init failed"),
    E(cudaErrorInvalidKernelImage, "device kernel image is invalid"),
    E(cudaErrorDeviceUninitialized, "invalid device context"),
    E(cudaErrorMapBufferObjectFailed, "mapping of buffer object failed"),
    E(cudaErrorArrayIsMapped, "array is mapped"),
    E(cudaErrorAlreadyMapped, "resource already mapped"),
    E(cudaErrorNoKernelImageForDevice, "no kernel image is available for execution on the device"),
    E(cudaErrorAlreadyAcquired, "resource already acquired"),
    E(cudaErrorNotMapped, "resource not mapped"),
    E(cudaErrorUnsupportedLimit, "limit is not supported on this architecture"),
    E(cudaErrorInvalidPtx, "a PTX JIT compilation failed"),
    E(cudaErrorInvalidSource, "device kernel image is invalid"),
    E(cudaErrorFileNotFound, "file not found"),
    E(cudaErrorSharedObjectSymbolNotFound, "shared object symbol not found"),
    E(cudaErrorSharedObjectInitFailed, "shared object initialization failed"),
    E(cudaErrorOperatingSystem, "OS call failed or operation not supported on this OS"),
    E(cudaErrorInvalidResourceHandle, "invalid resource handle"),
    E(cudaErrorIllegalState, "the operation cannot be performed in the present state"),
    E(cudaErrorSymbolNotFound, "named symbol not found"),
    E(cudaErrorNotReady, "device not ready"),
    E(cudaErrorIllegalAddress, "an illegal memory access was encountered"),
    E(cudaErrorLaunchOutOfResources, "too many resources requested for launch"),
    E(cudaErrorLaunchTimeout, "the launch timed out and was terminated"),
    E(cudaErrorPeerAccessAlreadyEnabled, "peer access is already enabled"),
    E(cudaErrorPeerAccessNotEnabled, "peer access has not been enabled"),
    E(cudaErrorSetOnActiveProcess, "cannot set while device is active in this process"),
    E(cudaErrorContextIsDestroyed, "context is destroyed"),
    E(cudaErrorAssert, "device-side assert triggered"),
    E(cudaErrorHardwareStackError, "hardware stack error"),
    E(cudaErrorIllegalInstruction, "an illegal instruction was encountered"),
    E(cudaErrorMisalignedAddress, "misaligned address"),
    E(cudaErrorInvalidAddressSpace, "operation not supported on global/shared address space"),
    E(cudaErrorInvalidPc, "invalid program counter"),
    E(cudaErrorLaunchFailure, "unspecified launch failure"),
    E(cudaErrorCooperativeLaunchTooLarge, "too many blocks in cooperative launch"),
    E(cudaErrorNotPermitted, "operation not permitted"),
    E(cudaErrorNotSupported, "operation not supported"),
    E(cudaErrorStreamCaptureUnsupported, "operation not permitted when stream is capturing"),
    E(cudaErrorTimeout, "timeout reached"),
    E(cudaErrorInvalidClusterSize, "invalid cluster size"),
    E(cudaErrorFunctionNotLoaded, "function not loaded"),
    E(cudaErrorInvalidResourceType, "invalid resource type"),
    E(cudaErrorInvalidResourceConfiguration, "invalid resource configuration"),
    E(cudaErrorUnknown, "unknown error"),
#undef E
};

const ErrName* err_entry(int e) {
  for (auto& x : kErrors)
    if (x.code == e) return &x;
  return nullptr;
}

// ---------------------------------------------------------------------------------------------
// Driver entry points handed out by cudaGetDriverEntryPoint.

CUresult CUDAAPI drv_tensor_map_encode_tiled(CUtensorMap* map, CUtensorMapDataType dt, cuuint32_t rank,
                                             void* gaddr, const cuuint64_t* dims, const cuuint64_t* strides,
                                             const cuuint32_t* box, const cuuint32_t* estrides,
                                             CUtensorMapInterleave il, CUtensorMapSwizzle sw,
                                             CUtensorMapL2promotion l2, CUtensorMapFloatOOBfill oob) {
  return (CUresult)hsim::tma::encode_tiled(map, (uint32_t)dt, rank, gaddr, dims, strides, box, estrides,
                                           (uint32_t)il, (uint32_t)sw, (uint32_t)l2, (uint32_t)oob);
}

CUresult CUDAAPI drv_tensor_map_replace_address(CUtensorMap* map, void* gaddr) {
  hsim::tma::TensorMap m;
  std::string err;
  if (!map || !hsim::tma::decode(map, &m, &err)) return CUDA_ERROR_INVALID_VALUE;
  uint64_t strides[5] = {0};
  for (uint32_t i = 1; i < m.rank; ++i) strides[i - 1] = m.strides[i];
  return (CUresult)hsim::tma::encode_tiled(map, m.dtype, m.rank, gaddr, m.dims, strides, m.box,
                                           m.elem_strides, m.interleave, m.swizzle, m.l2_promotion,
                                           m.oob_fill);
}

CUresult CUDAAPI drv_tensor_map_encode_im2col(...) {
  unimplemented("cuTensorMapEncodeIm2col (driver entry point)");
}

const char* cu_err_name(CUresult r) {
  switch (r) {
    case CUDA_SUCCESS: return "CUDA_SUCCESS";
    case CUDA_ERROR_INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
    case CUDA_ERROR_OUT_OF_MEMORY: return "CUDA_ERROR_OUT_OF_MEMORY";
    case CUDA_ERROR_NOT_INITIALIZED: return "CUDA_ERROR_NOT_INITIALIZED";
    case CUDA_ERROR_NO_DEVICE: return "CUDA_ERROR_NO_DEVICE";
    case CUDA_ERROR_INVALID_DEVICE: return "CUDA_ERROR_INVALID_DEVICE";
    case CUDA_ERROR_INVALID_CONTEXT: return "CUDA_ERROR_INVALID_CONTEXT";
    case CUDA_ERROR_INVALID_HANDLE: return "CUDA_ERROR_INVALID_HANDLE";
    case CUDA_ERROR_NOT_FOUND: return "CUDA_ERROR_NOT_FOUND";
    case CUDA_ERROR_NOT_SUPPORTED: return "CUDA_ERROR_NOT_SUPPORTED";
    case CUDA_ERROR_LAUNCH_FAILED: return "CUDA_ERROR_LAUNCH_FAILED";
    case CUDA_ERROR_ILLEGAL_ADDRESS: return "CUDA_ERROR_ILLEGAL_ADDRESS";
    default: return nullptr;
  }
}
const char* cu_err_text(CUresult r) {
  switch (r) {
    case CUDA_SUCCESS: return "no error";
    case CUDA_ERROR_INVALID_VALUE: return "invalid argument";
    case CUDA_ERROR_OUT_OF_MEMORY: return "out of memory";
    case CUDA_ERROR_NOT_INITIALIZED: return "initialization error";
    case CUDA_ERROR_NO_DEVICE: return "no CUDA-capable device is detected";
    case CUDA_ERROR_INVALID_DEVICE: return "invalid device ordinal";
    case CUDA_ERROR_INVALID_CONTEXT: return "invalid device context";
    case CUDA_ERROR_INVALID_HANDLE: return "invalid resource handle";
    case CUDA_ERROR_NOT_FOUND: return "named symbol not found";
    case CUDA_ERROR_NOT_SUPPORTED: return "operation not supported";
    case CUDA_ERROR_LAUNCH_FAILED: return "unspecified launch failure";
    case CUDA_ERROR_ILLEGAL_ADDRESS: return "an illegal memory access was encountered";
    default: return nullptr;
  }
}

}  // namespace

// =============================================================================================
// Driver API functions some programs call directly (CUTLASS example 54 uses cuMemsetD32Async and
// cuGetErrorString); they are exported here so such programs resolve them from this library.

HSIM_EXPORT CUresult CUDAAPI cuGetErrorString(CUresult r, const char** s) {
  if (!s) return CUDA_ERROR_INVALID_VALUE;
  *s = cu_err_text(r);
  return *s ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
HSIM_EXPORT CUresult CUDAAPI cuGetErrorName(CUresult r, const char** s) {
  if (!s) return CUDA_ERROR_INVALID_VALUE;
  *s = cu_err_name(r);
  return *s ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
HSIM_EXPORT CUresult CUDAAPI cuTensorMapEncodeTiled(CUtensorMap* map, CUtensorMapDataType dt, cuuint32_t rank,
                                                   void* gaddr, const cuuint64_t* dims,
                                                   const cuuint64_t* strides, const cuuint32_t* box,
                                                   const cuuint32_t* estrides, CUtensorMapInterleave il,
                                                   CUtensorMapSwizzle sw, CUtensorMapL2promotion l2,
                                                   CUtensorMapFloatOOBfill oob) {
  return drv_tensor_map_encode_tiled(map, dt, rank, gaddr, dims, strides, box, estrides, il, sw, l2, oob);
}
HSIM_EXPORT CUresult CUDAAPI cuTensorMapReplaceAddress(CUtensorMap* map, void* gaddr) {
  return drv_tensor_map_replace_address(map, gaddr);
}
template <typename T>
static CUresult memset_n(CUdeviceptr p, T v, size_t n) {
  if (n && !dev_ok((void*)p, n * sizeof(T))) return CUDA_ERROR_INVALID_VALUE;
  T* d = (T*)p;
  for (size_t i = 0; i < n; ++i) d[i] = v;
  return CUDA_SUCCESS;
}
HSIM_EXPORT CUresult CUDAAPI cuMemsetD8Async(CUdeviceptr p, unsigned char v, size_t n, CUstream) { return memset_n<uint8_t>(p, v, n); }
HSIM_EXPORT CUresult CUDAAPI cuMemsetD16Async(CUdeviceptr p, unsigned short v, size_t n, CUstream) { return memset_n<uint16_t>(p, v, n); }
HSIM_EXPORT CUresult CUDAAPI cuMemsetD32Async(CUdeviceptr p, unsigned int v, size_t n, CUstream) { return memset_n<uint32_t>(p, v, n); }
HSIM_EXPORT CUresult CUDAAPI cuMemsetD8(CUdeviceptr p, unsigned char v, size_t n) { return memset_n<uint8_t>(p, v, n); }
HSIM_EXPORT CUresult CUDAAPI cuMemsetD16(CUdeviceptr p, unsigned short v, size_t n) { return memset_n<uint16_t>(p, v, n); }
HSIM_EXPORT CUresult CUDAAPI cuMemsetD32(CUdeviceptr p, unsigned int v, size_t n) { return memset_n<uint32_t>(p, v, n); }
HSIM_EXPORT CUresult CUDAAPI cuDriverGetVersion(int* v) { if (!v) return CUDA_ERROR_INVALID_VALUE; *v = 13000; return CUDA_SUCCESS; }
HSIM_EXPORT CUresult CUDAAPI cuInit(unsigned int) { return CUDA_SUCCESS; }

// =============================================================================================
// Registration (called from the program's static constructors).

HSIM_EXPORT void** CUDARTAPI __cudaRegisterFatBinary(void* fatCubin) {
  auto* w = static_cast<const FatbinWrapper*>(fatCubin);
  auto fb = std::make_unique<Fatbin>();
  fb->wrapper = fatCubin;
  fb->origin = origin_of(fatCubin);
  if (!w || (uint32_t)w->magic != kWrapperMagic || !w->data)
    fb->ptx_problem = "unknown fatbin wrapper";
  else
    parse_fatbin(fb.get(), w->data);
  fb->handle_slot = fb.get();
  auto& r = reg();
  std::lock_guard<std::mutex> g(r.mu);
  r.fatbins.push_back(std::move(fb));
  return &r.fatbins.back()->handle_slot;
}

HSIM_EXPORT void CUDARTAPI __cudaRegisterFatBinaryEnd(void**) {}

// Kernels stay runnable until exit (static destructors of other objects may still launch).
HSIM_EXPORT void CUDARTAPI __cudaUnregisterFatBinary(void**) {}

HSIM_EXPORT char CUDARTAPI __cudaInitModule(void** handle) {
  if (!handle) return 0;
  auto& r = reg();
  std::lock_guard<std::mutex> g(r.mu);
  ensure_loaded_locked(static_cast<Fatbin*>(*handle));
  return 1;
}

HSIM_EXPORT void CUDARTAPI __cudaRegisterFunction(void** handle, const char* hostFun, char* deviceFun,
                                                  const char* deviceName, int, uint3*, uint3*, dim3*,
                                                  dim3*, int*) {
  auto* k = new KernelRec;
  k->name = deviceName ? deviceName : (deviceFun ? deviceFun : "");
  k->fb = static_cast<Fatbin*>(*handle);
  k->host_fun = hostFun;
  auto& r = reg();
  std::lock_guard<std::mutex> g(r.mu);
  r.by_host[hostFun] = k;
  r.handles.insert(k);
}

HSIM_EXPORT void CUDARTAPI __cudaRegisterVar(void** handle, char* hostVar, char* deviceAddress,
                                             const char* deviceName, int, size_t size, int, int) {
  auto* v = new VarRec;
  v->name = deviceName ? deviceName : deviceAddress;
  v->fb = static_cast<Fatbin*>(*handle);
  v->size = size;
  auto& r = reg();
  std::lock_guard<std::mutex> g(r.mu);
  r.vars[hostVar] = v;
}

HSIM_EXPORT void CUDARTAPI __cudaRegisterManagedVar(void** handle, void** hostVarPtrAddress,
                                                    char* deviceAddress, const char* deviceName, int,
                                                    size_t size, int, int) {
  auto* v = new VarRec;
  v->name = deviceName ? deviceName : deviceAddress;
  v->fb = static_cast<Fatbin*>(*handle);
  v->size = size;
  v->managed = true;
  v->managed_ptr = hostVarPtrAddress;
  auto& r = reg();
  std::lock_guard<std::mutex> g(r.mu);
  r.vars[(const void*)hostVarPtrAddress] = v;
  v->fb->managed.push_back(v);
}

HSIM_EXPORT void CUDARTAPI __cudaRegisterTexture(void**, const void*, const void**, const char*, int, int, int) {
  unimplemented("__cudaRegisterTexture (texture references)");
}
HSIM_EXPORT void CUDARTAPI __cudaRegisterSurface(void**, const void*, const void**, const char*, int, int) {
  unimplemented("__cudaRegisterSurface (surface references)");
}

// =============================================================================================
// Launch.

HSIM_EXPORT unsigned CUDARTAPI __cudaPushCallConfiguration(dim3 grid, dim3 block, size_t smem,
                                                           struct CUstream_st* stream) {
  t_call_stack.push_back({grid, block, smem, stream});
  return 0;
}

HSIM_EXPORT cudaError_t CUDARTAPI __cudaPopCallConfiguration(dim3* grid, dim3* block, size_t* smem,
                                                             void* stream) {
  if (t_call_stack.empty()) return ret(cudaErrorMissingConfiguration);
  CallConfig c = t_call_stack.back();
  t_call_stack.pop_back();
  *grid = c.grid;
  *block = c.block;
  *smem = c.smem;
  *(void**)stream = c.stream;
  return cudaSuccess;
}

HSIM_EXPORT cudaError_t CUDARTAPI __cudaGetKernel(cudaKernel_t* out, const void* fun) {
  auto& r = reg();
  std::lock_guard<std::mutex> g(r.mu);
  auto it = r.by_host.find(fun);
  if (it == r.by_host.end()) return ret(cudaErrorInvalidDeviceFunction);
  *out = (cudaKernel_t)it->second;
  return cudaSuccess;
}

HSIM_EXPORT cudaError_t CUDARTAPI cudaGetKernel(cudaKernel_t* out, const void* fun) {
  return __cudaGetKernel(out, fun);
}

HSIM_EXPORT cudaError_t CUDARTAPI __cudaLaunchKernel(cudaKernel_t kernel, dim3 grid, dim3 block,
                                                     void** args, size_t smem, cudaStream_t) {
  return ret(do_launch((const void*)kernel, grid, block, smem, args, dim3(1, 1, 1), false));
}
HSIM_EXPORT cudaError_t CUDARTAPI __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 grid, dim3 block,
                                                          void** args, size_t smem, cudaStream_t s) {
  return __cudaLaunchKernel(kernel, grid, block, args, smem, s);
}

HSIM_EXPORT cudaError_t CUDARTAPI cudaLaunchKernel(const void* func, dim3 grid, dim3 block, void** args,
                                                   size_t smem, cudaStream_t) {
  return ret(do_launch(func, grid, block, smem, args, dim3(1, 1, 1), false));
}
HSIM_EXPORT cudaError_t CUDARTAPI cudaLaunchKernel_ptsz(const void* func, dim3 grid, dim3 block,
                                                        void** args, size_t smem, cudaStream_t s) {
  return cudaLaunchKernel(func, grid, block, args, smem, s);
}

HSIM_EXPORT cudaError_t CUDARTAPI cudaLaunchKernelExC(const cudaLaunchConfig_t* cfg, const void* func,
                                                      void** args) {
  if (!cfg) return ret(cudaErrorInvalidValue);
  dim3 cluster(1, 1, 1);
  bool given = false;
  for (unsigned i = 0; i < cfg->numAttrs; ++i) {
    const cudaLaunchAttribute& a = cfg->attrs[i];
    switch (a.id) {
      case cudaLaunchAttributeClusterDimension:
        cluster = dim3(a.val.clusterDim.x, a.val.clusterDim.y, a.val.clusterDim.z);
        given = true;
        break;
      case cudaLaunchAttributeIgnore:
        break;
      // Scheduling hints and PDL: every launch runs to completion before the next starts, which
      // is a legal execution of programmatic dependent launch too (griddepcontrol is the
      // interpreter's business). Cooperative launches need no extra support for the same reason.
      default:
        note_once((int)a.id, ("launch attribute " + std::to_string((int)a.id)).c_str());
        break;
    }
  }
  return ret(do_launch(func, cfg->gridDim, cfg->blockDim, cfg->dynamicSmemBytes, args, cluster, given));
}
HSIM_EXPORT cudaError_t CUDARTAPI cudaLaunchKernelExC_ptsz(const cudaLaunchConfig_t* cfg, const void* func,
                                                           void** args) {
  return cudaLaunchKernelExC(cfg, func, args);
}

HSIM_EXPORT cudaError_t CUDARTAPI cudaLaunchHostFunc(cudaStream_t, cudaHostFn_t fn, void* data) {
  if (!fn) return ret(cudaErrorInvalidValue);
  fn(data);  // everything before it in the stream has completed already
  return cudaSuccess;
}
HSIM_EXPORT cudaError_t CUDARTAPI cudaStreamAddCallback(cudaStream_t s, cudaStreamCallback_t cb, void* data,
                                                        unsigned int) {
  if (!cb) return ret(cudaErrorInvalidValue);
  cb(s, cudaSuccess, data);
  return cudaSuccess;
}

// =============================================================================================
// Function attributes and occupancy.

HSIM_EXPORT cudaError_t CUDARTAPI cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  cudaError_t err = cudaSuccess;
  KernelRec* k = find_kernel(func, &err);
  if (!k) return ret(err);
  hsim::KernelInfo* ki = k->info;
  switch (attr) {
    case cudaFuncAttributeMaxDynamicSharedMemorySize:
      // As the device: dynamic + static shared memory must fit the 227 KB opt-in limit.
      if (value < 0 || (size_t)value + ki->static_smem > hsim::kMaxSmemPerBlockOptin)
        return ret(cudaErrorInvalidValue);
      ki->max_dynamic_smem = value;
      return cudaSuccess;
    case cudaFuncAttributePreferredSharedMemoryCarveout:
      if (value < -1 || value > 100) return ret(cudaErrorInvalidValue);
      ki->preferred_smem_carveout = value;
      return cudaSuccess;
    case cudaFuncAttributeNonPortableClusterSizeAllowed:
      ki->non_portable_cluster_ok = value != 0;
      return cudaSuccess;
    case cudaFuncAttributeRequiredClusterWidth:
    case cudaFuncAttributeRequiredClusterHeight:
    case cudaFuncAttributeRequiredClusterDepth:
      return ret(cudaErrorNotPermitted);  // read-only, set by __cluster_dims__
    case cudaFuncAttributeClusterSchedulingPolicyPreference:
    case cudaFuncAttributeClusterDimMustBeSet:
      return cudaSuccess;
    default:
      return ret(cudaErrorInvalidValue);
  }
}

HSIM_EXPORT cudaError_t CUDARTAPI cudaFuncGetAttributes(cudaFuncAttributes* a, const void* func) {
  if (!a) return ret(cudaErrorInvalidValue);
  cudaError_t err = cudaSuccess;
  KernelRec* k = find_kernel(func, &err);
  if (!k) return ret(err);
  hsim::KernelInfo* ki = k->info;
  memset(a, 0, sizeof *a);
  a->sharedSizeBytes = ki->static_smem;
  a->maxThreadsPerBlock = (int)ki->max_threads;
  a->numRegs = (int)ki->num_regs;
  a->ptxVersion = 90;
  a->binaryVersion = 90;
  a->maxDynamicSharedSizeBytes = ki->max_dynamic_smem;
  a->preferredShmemCarveout = ki->preferred_smem_carveout;
  a->requiredClusterWidth = (int)ki->req_cluster[0];
  a->requiredClusterHeight = (int)ki->req_cluster[1];
  a->requiredClusterDepth = (int)ki->req_cluster[2];
  a->nonPortableClusterSizeAllowed = ki->non_portable_cluster_ok ? 1 : 0;
  return cudaSuccess;
}

HSIM_EXPORT cudaError_t CUDARTAPI cudaFuncSetCacheConfig(const void* func, cudaFuncCache) {
  cudaError_t err = cudaSuccess;
  return find_kernel(func, &err) ? cudaSuccess : ret(err);
}

HSIM_EXPORT cudaError_t CUDARTAPI cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
    int* n, const void* func, int block, size_t smem, unsigned int) {
  if (!n || block <= 0) return ret(cudaErrorInvalidValue);
  cudaError_t err = cudaSuccess;
  KernelRec* k = find_kernel(func, &err);
  if (!k) return ret(err);
  *n = Device::instance().occupancy(k->info, (uint32_t)block, smem);
  return cudaSuccess;
}
HSIM_EXPORT cudaError_t CUDARTAPI cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* n, const void* func,
                                                                               int block, size_t smem) {
  return cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(n, func, block, smem, 0);
}

// Clusters are placed whole on SMs of the simulated device: count how many fit at once.
HSIM_EXPORT cudaError_t CUDARTAPI cudaOccupancyMaxActiveClusters(int* n, const void* func,
                                                                 const cudaLaunchConfig_t* cfg) {
  if (!n || !cfg) return ret(cudaErrorInvalidValue);
  cudaError_t err = cudaSuccess;
  KernelRec* k = find_kernel(func, &err);
  if (!k) return ret(err);
  uint64_t csize = 0;
  for (unsigned i = 0; i < cfg->numAttrs; ++i)
    if (cfg->attrs[i].id == cudaLaunchAttributeClusterDimension) {
      auto& c = cfg->attrs[i].val.clusterDim;
      csize = (uint64_t)c.x * c.y * c.z;
    }
  if (!csize) {
    auto* rc = k->info->req_cluster;
    csize = rc[0] ? (uint64_t)rc[0] * std::max(1u, rc[1]) * std::max(1u, rc[2]) : 1;
  }
  if (csize > 16 || (csize > 8 && !k->info->non_portable_cluster_ok)) return ret(cudaErrorInvalidClusterSize);
  uint32_t threads = cfg->blockDim.x * cfg->blockDim.y * cfg->blockDim.z;
  int per_sm = Device::instance().occupancy(k->info, threads, cfg->dynamicSmemBytes);
  *n = (int)((uint64_t)per_sm * sms() / csize);
  return cudaSuccess;
}

// =============================================================================================
// Memory.

HSIM_EXPORT cudaError_t CUDARTAPI cudaMalloc(void** p, size_t n) { return ret(sim_alloc(p, n, "cudaMalloc")); }
HSIM_EXPORT cudaError_t CUDARTAPI cudaFree(void* p) { return ret(sim_free(p)); }
HSIM_EXPORT cudaError_t CUDARTAPI cudaMallocHost(void** p, size_t n) { return ret(sim_alloc(p, n, "cudaMallocHost")); }
HSIM_EXPORT cudaError_t CUDARTAPI cudaHostAlloc(void** p, size_t n, unsigned int) { return ret(sim_alloc(p, n, "cudaHostAlloc")); }
HSIM_EXPORT cudaError_t CUDARTAPI cudaFreeHost(void* p) { return ret(sim_free(p)); }
HSIM_EXPORT cudaError_t CUDARTAPI cudaMallocManaged(void** p, size_t n, unsigned int) {
  return ret(sim_alloc(p, n, "cudaMallocManaged"));
}
HSIM_EXPORT cudaError_t CUDARTAPI cudaMallocAsync(void** p, size_t n, cudaStream_t) {
  return ret(sim_alloc(p, n, "cudaMallocAsync"));
}
HSIM_EXPORT cudaError_t CUDARTAPI cudaMallocAsync_ptsz(void** p, size_t n, cudaStream_t s) { return cudaMallocAsync(p, n, s); }
HSIM_EXPORT cudaError_t CUDARTAPI cudaFreeAsync(void* p, cudaStream_t) { return ret(sim_free(p)); }
HSIM_EXPORT cudaError_t CUDARTAPI cudaFreeAsync_ptsz(void* p, cudaStream_t s) { return cudaFreeAsync(p, s); }
HSIM_EXPORT cudaError_t CUDARTAPI cudaMallocPitch(void** p, size_t* pitch, size_t w, size_t h) {
  if (!pitch) return ret(cudaErrorInvalidValue);
  *pitch = (w + 511) / 512 * 512;
  return ret(sim_alloc(p, *pitch * h, "cudaMallocPitch"));
}
HSIM_EXPORT cudaError_t CUDARTAPI cudaHostGetDevicePointer(void** d, void* h, unsigned int) {
  if (!d) return ret(cudaErrorInvalidValue);
  *d = h;
  return cudaSuccess;
}
HSIM_EXPORT cudaError_t CUDARTAPI cudaHostRegister(void* p, size_t n, unsigned int) {
  if (!p || !n) return ret(cudaErrorInvalidValue);
  Device::instance().add_allocation(p, n, "cudaHostRegister");
  return cudaSuccess;
}
HSIM_EXPORT cudaError_t CUDARTAPI cudaHostUnregister(void* p) {
  return Device::instance().remove_allocation(p) ? cudaSuccess : ret(cudaErrorHostMemoryNotRegistered);
}
HSIM_EXPORT cudaError_t CUDARTAPI cudaMemGetInfo(size_t* free_b, size_t* total) {
  if (free_b) *free_b = 79ull << 30;
  if (total) *total = 80ull << 30;
  return cudaSuccess;
}
HSIM_EXPORT cudaError_t CUDARTAPI cudaPointerGetAttributes(cudaPointerAttributes* a, const void* p) {
  if (!a) return ret(cudaErrorInvalidValue);
  memset(a, 0, sizeof *a);
  a->device = 0;
  a->devicePointer = const_cast<void*>(p);
  a->hostPointer = const_cast<void*>(p);
  const char* what = nullptr;
  {
    std::lock_guard<std::mutex> g(g_mem_mu);
    auto it = allocs().upper_bound(p);
    if (it != allocs().begin()) {
      --it;
      if ((const char*)p < (const char*)it->first + it->second.size) what = it->second.what;
    }
  }
  if (!what) a->type = Device::instance().is_allocation(p, 1) ? cudaMemoryTypeDevice : cudaMemoryTypeUnregistered;
  else if (!strcmp(what, "cudaMallocManaged")) a->type = cudaMemoryTypeManaged;
  else if (!strcmp(what, "cudaMallocHost") || !strcmp(what, "cudaHostAlloc")) a->type = cudaMemoryTypeHost;
  else a->type = cudaMemoryTypeDevice;
  return cudaSuccess;
}

HSIM_EXPORT cudaError_t CUDARTAPI cudaMemcpy(void* d, const void* s, size_t n, cudaMemcpyKind k) {
  return ret(sim_memcpy(d, s, n, k));
}
HSIM_EXPORT cudaError_t CUDARTAPI cudaMemcpy_ptds(void* d, const void* s, size_t n, cudaMemcpyKind k) {
  return cudaMemcpy(d, s, n, k);
}
HSIM_EXPORT cudaError_t CUDARTAPI cudaMemcpyAsync(void* d, const void* s, size_t n, cudaMemcpyKind k, cudaStream_t) {
  return ret(sim_memcpy(d, s, n, k));
}
HSIM_EXPORT cudaError_t CUDARTAPI cudaMemcpyAsync_ptsz(void* d, const void* s, size_t n, cudaMemcpyKind k,
                                                       cudaStream_t st) {
  return cudaMemcpyAsync(d, s, n, k, st);
}
HSIM_EXPORT cudaError_t CUDARTAPI cudaMemcpy2D(void* d, size_t dp, const void* s, size_t sp, size_t w, size_t h,
                                               cudaMemcpyKind k) {
  if (w > dp || w > sp) return ret(cudaErrorInvalidPitchValue);
  for (size_t r = 0; r < h; ++r) {
    cudaError_t e = sim_memcpy((char*)d + r * dp, (const char*)s + r * sp, w, k);
    if (e) return ret(e);
  }
  return cudaSuccess;
}
HSIM_EXPORT cudaError_t CUDARTAPI cudaMemcpy2DAsync(void* d, size_t dp, const void* s, size_t sp, size_t w,
                                                    size_t h, cudaMemcpyKind k, cudaStream_t) {
  return cudaMemcpy2D(d, dp, s, sp, w, h, k);
}
HSIM_EXPORT cudaError_t CUDARTAPI cudaMemset(void* p, int v, size_t n) {
  if (n == 0) return cudaSuccess;
  if (!p || !dev_ok(p, n)) return ret(cudaErrorInvalidValue);
  memset(p, v, n);
  return cudaSuccess;
}
HSIM_EXPORT cudaError_t CUDARTAPI cudaMemset_ptds(void* p, int v, size_t n) { return cudaMemset(p, v, n); }
HSIM_EXPORT cudaError_t CUDARTAPI cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t) { return cudaMemset(p, v, n); }
HSIM_EXPORT cudaError_t CUDARTAPI cudaMemsetAsync_ptsz(void* p, int v, size_t n, cudaStream_t s) {
  return cudaMemsetAsync(p, v, n, s);
}
HSIM_EXPORT cudaError_t CUDARTAPI cudaMemset2D(void* p, size_t pitch, int v, size_t w, size_t h) {
  for (size_t r = 0; r < h; ++r) {
    cudaError_t e = cudaMemset((char*)p + r * pitch, v, w);
    if (e) return e;
  }
  return cudaSuccess;
}

HSIM_EXPORT cudaError_t CUDARTAPI cudaMemcpyToSymbol(const void* sym, const void* src, size_t n, size_t off,
                                                     cudaMemcpyKind k) {
  cudaError_t err = cudaSuccess;
  size_t size = 0;
  char* a = (char*)find_symbol(sym, &size, &err);
  if (!a) return ret(err);
  if (off + n > size) return ret(cudaErrorInvalidValue);
  if (k == cudaMemcpyDeviceToHost || k == cudaMemcpyHostToHost) return ret(cudaErrorInvalidMemcpyDirection);
  return ret(sim_memcpy(a + off, src, n, k == cudaMemcpyDeviceToDevice ? k : cudaMemcpyDefault));
}
HSIM_EXPORT cudaError_t CUDARTAPI cudaMemcpyFromSymbol(void* dst, const void* sym, size_t n, size_t off,
                                                       cudaMemcpyKind k) {
  cudaError_t err = cudaSuccess;
  size_t size = 0;
  char* a = (char*)find_symbol(sym, &size, &err);
  if (!a) return ret(err);
  if (off + n > size) return ret(cudaErrorInvalidValue);
  if (k == cudaMemcpyHostToDevice || k == cudaMemcpyHostToHost) return ret(cudaErrorInvalidMemcpyDirection);
  return ret(sim_memcpy(dst, a + off, n, k == cudaMemcpyDeviceToDevice ? k : cudaMemcpyDefault));
}
HSIM_EXPORT cudaError_t CUDARTAPI cudaMemcpyToSymbolAsync(const void* sym, const void* src, size_t n, size_t off,
                                                          cudaMemcpyKind k, cudaStream_t) {
  return cudaMemcpyToSymbol(sym, src, n, off, k);
}
HSIM_EXPORT cudaError_t CUDARTAPI cudaMemcpyFromSymbolAsync(void* dst, const void* sym, size_t n, size_t off,
                                                            cudaMemcpyKind k, cudaStream_t) {
  return cudaMemcpyFromSymbol(dst, sym, n, off, k);
}
HSIM_EXPORT cudaError_t CUDARTAPI cudaMemcpyToSymbol_ptds(const void* sym, const void* src, size_t n, size_t off,
                                                          cudaMemcpyKind k) {
  return cudaMemcpyToSymbol(sym, src, n, off, k);
}
HSIM_EXPORT cudaError_t CUDARTAPI cudaMemcpyFromSymbol_ptds(void* dst, const void* sym, size_t n, size_t off,
                                                            cudaMemcpyKind k) {
  return cudaMemcpyFromSymbol(dst, sym, n, off, k);
}
HSIM_EXPORT cudaError_t CUDARTAPI cudaGetSymbolAddress(void** p, const void* sym) {
  if (!p) return ret(cudaErrorInvalidValue);
  cudaError_t err = cudaSuccess;
  size_t size = 0;
  *p = find_symbol(sym, &size, &err);
  return *p ? cudaSuccess : ret(err);
}
HSIM_EXPORT cudaError_t CUDARTAPI cudaGetSymbolSize(size_t* n, const void* sym) {
  if (!n) return ret(cudaErrorInvalidValue);
  cudaError_t err = cudaSuccess;
  return find_symbol(sym, n, &err) ? cudaSuccess : ret(err);
}

// =============================================================================================
// Device management.

HSIM_EXPORT cudaError_t CUDARTAPI cudaGetDeviceCount(int* n) { if (!n) return ret(cudaErrorInvalidValue); *n = 1; return cudaSuccess; }
HSIM_EXPORT cudaError_t CUDARTAPI cudaGetDevice(int* d) { if (!d) return ret(cudaErrorInvalidValue); *d = 0; return cudaSuccess; }
HSIM_EXPORT cudaError_t CUDARTAPI cudaSetDevice(int d) { return d == 0 ? cudaSuccess : ret(cudaErrorInvalidDevice); }
HSIM_EXPORT cudaError_t CUDARTAPI cudaInitDevice(int d, unsigned int, unsigned int) {
  return d == 0 ? cudaSuccess : ret(cudaErrorInvalidDevice);
}
HSIM_EXPORT cudaError_t CUDARTAPI cudaSetDeviceFlags(unsigned int) { return cudaSuccess; }
HSIM_EXPORT cudaError_t CUDARTAPI cudaGetDeviceFlags(unsigned int* f) { if (f) *f = 0; return cudaSuccess; }
HSIM_EXPORT cudaError_t CUDARTAPI cudaGetDeviceProperties(cudaDeviceProp* p, int d) {
  if (!p) return ret(cudaErrorInvalidValue);
  if (d != 0) return ret(cudaErrorInvalidDevice);
  fill_props(p);
  return cudaSuccess;
}
HSIM_EXPORT cudaError_t CUDARTAPI cudaDeviceGetAttribute(int* v, cudaDeviceAttr a, int d) {
  if (!v) return ret(cudaErrorInvalidValue);
  if (d != 0) return ret(cudaErrorInvalidDevice);
  if (!device_attr(a, v)) {
    std::string what = "cudaDeviceGetAttribute (attribute " + std::to_string((int)a) + ")";
    unimplemented(what.c_str());
  }
  return cudaSuccess;
}
HSIM_EXPORT cudaError_t CUDARTAPI cudaChooseDevice(int* d, const cudaDeviceProp*) { if (d) *d = 0; return cudaSuccess; }
HSIM_EXPORT cudaError_t CUDARTAPI cudaDeviceSynchronize() { return cudaSuccess; }
HSIM_EXPORT cudaError_t CUDARTAPI cudaDeviceReset() {
  std::vector<const void*> ps;
  {
    std::lock_guard<std::mutex> g(g_mem_mu);
    for (auto& a : allocs()) ps.push_back(a.first);
  }
  for (auto p : ps) sim_free(const_cast<void*>(p));
  t_last_error = cudaSuccess;
  return cudaSuccess;
}
HSIM_EXPORT cudaError_t CUDARTAPI cudaDeviceSetCacheConfig(cudaFuncCache) { return cudaSuccess; }
HSIM_EXPORT cudaError_t CUDARTAPI cudaDeviceGetCacheConfig(cudaFuncCache* c) { if (c) *c = cudaFuncCachePreferNone; return cudaSuccess; }
HSIM_EXPORT cudaError_t CUDARTAPI cudaDeviceSetLimit(cudaLimit, size_t) { return cudaSuccess; }
HSIM_EXPORT cudaError_t CUDARTAPI cudaDeviceGetLimit(size_t* v, cudaLimit l) {
  if (!v) return ret(cudaErrorInvalidValue);
  switch (l) {
    case cudaLimitStackSize: *v = 1024; break;
    case cudaLimitPrintfFifoSize: *v = 1 << 20; break;
    case cudaLimitMallocHeapSize: *v = 8 << 20; break;
    case cudaLimitMaxL2FetchGranularity: *v = 64; break;
    case cudaLimitPersistingL2CacheSize: *v = 0; break;
    default: return ret(cudaErrorUnsupportedLimit);
  }
  return cudaSuccess;
}
HSIM_EXPORT cudaError_t CUDARTAPI cudaDeviceGetStreamPriorityRange(int* lo, int* hi) {
  if (lo) *lo = 0;
  if (hi) *hi = -5;
  return cudaSuccess;
}
HSIM_EXPORT cudaError_t CUDARTAPI cudaDriverGetVersion(int* v) { if (!v) return ret(cudaErrorInvalidValue); *v = 13000; return cudaSuccess; }
HSIM_EXPORT cudaError_t CUDARTAPI cudaRuntimeGetVersion(int* v) { if (!v) return ret(cudaErrorInvalidValue); *v = 13000; return cudaSuccess; }
HSIM_EXPORT cudaError_t CUDARTAPI cudaProfilerStart() { return cudaSuccess; }
HSIM_EXPORT cudaError_t CUDARTAPI cudaProfilerStop() { return cudaSuccess; }

// =============================================================================================
// Errors.

HSIM_EXPORT cudaError_t CUDARTAPI cudaGetLastError() {
  cudaError_t e = t_last_error;
  t_last_error = cudaSuccess;
  return e;
}
HSIM_EXPORT cudaError_t CUDARTAPI cudaPeekAtLastError() { return t_last_error; }
HSIM_EXPORT const char* CUDARTAPI cudaGetErrorString(cudaError_t e) {
  const ErrName* x = err_entry(e);
  return x ? x->text : "unrecognized error code";
}
HSIM_EXPORT const char* CUDARTAPI cudaGetErrorName(cudaError_t e) {
  const ErrName* x = err_entry(e);
  return x ? x->name : "cudaErrorUnknown";
}

// =============================================================================================
// Streams and events.

HSIM_EXPORT cudaError_t CUDARTAPI cudaStreamCreate(cudaStream_t* s) {
  if (!s) return ret(cudaErrorInvalidValue);
  *s = (cudaStream_t) new Stream;
  return cudaSuccess;
}
HSIM_EXPORT cudaError_t CUDARTAPI cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) {
  if (!s) return ret(cudaErrorInvalidValue);
  auto* st = new Stream;
  st->flags = flags;
  *s = (cudaStream_t)st;
  return cudaSuccess;
}
HSIM_EXPORT cudaError_t CUDARTAPI cudaStreamCreateWithPriority(cudaStream_t* s, unsigned int flags, int prio) {
  if (!s) return ret(cudaErrorInvalidValue);
  auto* st = new Stream;
  st->flags = flags;
  st->priority = prio;
  *s = (cudaStream_t)st;
  return cudaSuccess;
}
static bool special_stream(cudaStream_t s) {
  return s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread;
}
HSIM_EXPORT cudaError_t CUDARTAPI cudaStreamDestroy(cudaStream_t s) {
  if (!special_stream(s)) delete (Stream*)s;
  return cudaSuccess;
}
HSIM_EXPORT cudaError_t CUDARTAPI cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
HSIM_EXPORT cudaError_t CUDARTAPI cudaStreamSynchronize_ptsz(cudaStream_t) { return cudaSuccess; }
HSIM_EXPORT cudaError_t CUDARTAPI cudaStreamQuery(cudaStream_t) { return cudaSuccess; }
HSIM_EXPORT cudaError_t CUDARTAPI cudaStreamQuery_ptsz(cudaStream_t) { return cudaSuccess; }
HSIM_EXPORT cudaError_t CUDARTAPI cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned int) { return cudaSuccess; }
HSIM_EXPORT cudaError_t CUDARTAPI cudaStreamWaitEvent_ptsz(cudaStream_t, cudaEvent_t, unsigned int) { return cudaSuccess; }
HSIM_EXPORT cudaError_t CUDARTAPI cudaStreamGetPriority(cudaStream_t s, int* p) {
  if (!p) return ret(cudaErrorInvalidValue);
  *p = special_stream(s) ? 0 : ((Stream*)s)->priority;
  return cudaSuccess;
}
HSIM_EXPORT cudaError_t CUDARTAPI cudaStreamGetFlags(cudaStream_t s, unsigned int* f) {
  if (!f) return ret(cudaErrorInvalidValue);
  *f = special_stream(s) ? 0 : ((Stream*)s)->flags;
  return cudaSuccess;
}
HSIM_EXPORT cudaError_t CUDARTAPI cudaStreamIsCapturing(cudaStream_t, cudaStreamCaptureStatus* st) {
  if (!st) return ret(cudaErrorInvalidValue);
  *st = cudaStreamCaptureStatusNone;
  return cudaSuccess;
}
HSIM_EXPORT cudaError_t CUDARTAPI cudaStreamIsCapturing_ptsz(cudaStream_t s, cudaStreamCaptureStatus* st) {
  return cudaStreamIsCapturing(s, st);
}
HSIM_EXPORT cudaError_t CUDARTAPI cudaStreamGetCaptureInfo(cudaStream_t, cudaStreamCaptureStatus* st,
                                                           unsigned long long* id, cudaGraph_t* graph,
                                                           const cudaGraphNode_t** deps,
                                                           const cudaGraphEdgeData** edges, size_t* ndeps) {
  if (!st) return ret(cudaErrorInvalidValue);
  *st = cudaStreamCaptureStatusNone;
  if (id) *id = 0;
  if (graph) *graph = nullptr;
  if (deps) *deps = nullptr;
  if (edges) *edges = nullptr;
  if (ndeps) *ndeps = 0;
  return cudaSuccess;
}
HSIM_EXPORT cudaError_t CUDARTAPI cudaStreamGetCaptureInfo_ptsz(cudaStream_t s, cudaStreamCaptureStatus* st,
                                                                unsigned long long* id, cudaGraph_t* g,
                                                                const cudaGraphNode_t** d,
                                                                const cudaGraphEdgeData** e, size_t* n) {
  return cudaStreamGetCaptureInfo(s, st, id, g, d, e, n);
}

HSIM_EXPORT cudaError_t CUDARTAPI cudaEventCreate(cudaEvent_t* e) {
  if (!e) return ret(cudaErrorInvalidValue);
  *e = (cudaEvent_t) new Event;
  return cudaSuccess;
}
HSIM_EXPORT cudaError_t CUDARTAPI cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int flags) {
  if (!e) return ret(cudaErrorInvalidValue);
  auto* ev = new Event;
  ev->flags = flags;
  *e = (cudaEvent_t)ev;
  return cudaSuccess;
}
HSIM_EXPORT cudaError_t CUDARTAPI cudaEventRecord(cudaEvent_t e, cudaStream_t) {
  if (!e) return ret(cudaErrorInvalidResourceHandle);
  auto* ev = (Event*)e;
  ev->t = now_ms();   // wall time: launches before it have already finished
  ev->recorded = true;
  return cudaSuccess;
}
HSIM_EXPORT cudaError_t CUDARTAPI cudaEventRecord_ptsz(cudaEvent_t e, cudaStream_t s) { return cudaEventRecord(e, s); }
HSIM_EXPORT cudaError_t CUDARTAPI cudaEventRecordWithFlags(cudaEvent_t e, cudaStream_t s, unsigned int) {
  return cudaEventRecord(e, s);
}
HSIM_EXPORT cudaError_t CUDARTAPI cudaEventRecordWithFlags_ptsz(cudaEvent_t e, cudaStream_t s, unsigned int f) {
  return cudaEventRecordWithFlags(e, s, f);
}
HSIM_EXPORT cudaError_t CUDARTAPI cudaEventSynchronize(cudaEvent_t e) {
  return e ? cudaSuccess : ret(cudaErrorInvalidResourceHandle);
}
HSIM_EXPORT cudaError_t CUDARTAPI cudaEventQuery(cudaEvent_t e) {
  return e ? cudaSuccess : ret(cudaErrorInvalidResourceHandle);
}
HSIM_EXPORT cudaError_t CUDARTAPI cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  if (!ms) return ret(cudaErrorInvalidValue);
  if (!a || !b) return ret(cudaErrorInvalidResourceHandle);
  auto *ea = (Event*)a, *eb = (Event*)b;
  if (!ea->recorded || !eb->recorded) return ret(cudaErrorInvalidResourceHandle);
  if ((ea->flags | eb->flags) & cudaEventDisableTiming) return ret(cudaErrorInvalidResourceHandle);
  *ms = (float)(eb->t - ea->t);
  return cudaSuccess;
}
HSIM_EXPORT cudaError_t CUDARTAPI cudaEventDestroy(cudaEvent_t e) {
  delete (Event*)e;
  return cudaSuccess;
}

// =============================================================================================
// Driver entry points.

HSIM_EXPORT cudaError_t CUDARTAPI cudaGetDriverEntryPointByVersion(const char* sym, void** fn, unsigned int,
                                                                   unsigned long long,
                                                                   cudaDriverEntryPointQueryResult* st) {
  if (!sym || !fn) return ret(cudaErrorInvalidValue);
  static const std::map<std::string, void*> table = {
      {"cuTensorMapEncodeTiled", (void*)&drv_tensor_map_encode_tiled},
      {"cuTensorMapReplaceAddress", (void*)&drv_tensor_map_replace_address},
      {"cuTensorMapEncodeIm2col", (void*)&drv_tensor_map_encode_im2col},
      {"cuGetErrorString", (void*)&cuGetErrorString},
      {"cuGetErrorName", (void*)&cuGetErrorName},
      {"cuMemsetD32Async", (void*)&cuMemsetD32Async},
      {"cuMemsetD16Async", (void*)&cuMemsetD16Async},
      {"cuMemsetD8Async", (void*)&cuMemsetD8Async},
      {"cuDriverGetVersion", (void*)&cuDriverGetVersion},
      {"cuInit", (void*)&cuInit},
  };
  auto it = table.find(sym);
  if (it == table.end()) {
    // As the driver: success with a null pointer. Say so, since a call through it will crash.
    fprintf(stderr, "hopper_sim: driver entry point %s is not provided by the simulator\n", sym);
    *fn = nullptr;
    if (st) *st = cudaDriverEntryPointSymbolNotFound;
    return cudaSuccess;
  }
  *fn = it->second;
  if (st) *st = cudaDriverEntryPointSuccess;
  return cudaSuccess;
}
HSIM_EXPORT cudaError_t CUDARTAPI cudaGetDriverEntryPoint(const char* sym, void** fn, unsigned long long flags,
                                                          cudaDriverEntryPointQueryResult* st) {
  return cudaGetDriverEntryPointByVersion(sym, fn, 13000, flags, st);
}
HSIM_EXPORT cudaError_t CUDARTAPI cudaGetDriverEntryPoint_ptsz(const char* sym, void** fn, unsigned long long flags,
                                                               cudaDriverEntryPointQueryResult* st) {
  return cudaGetDriverEntryPoint(sym, fn, flags, st);
}
HSIM_EXPORT cudaError_t CUDARTAPI cudaGetDriverEntryPointByVersion_ptsz(const char* sym, void** fn, unsigned int v,
                                                                        unsigned long long flags,
                                                                        cudaDriverEntryPointQueryResult* st) {
  return cudaGetDriverEntryPointByVersion(sym, fn, v, flags, st);
}

// =============================================================================================
// Everything else a program might call: fail loudly, naming the call. Declared with an asm label
// so the stub needs no matching prototype (the toolkit headers declare the real signatures).

#define HSIM_STUB(name)                                                                         \
  extern "C" __attribute__((visibility("default"), noreturn)) void hsim_stub_##name() __asm__(#name); \
  extern "C" void hsim_stub_##name() { unimplemented(#name); }

// Graphs and capture.
HSIM_STUB(cudaStreamBeginCapture)
HSIM_STUB(cudaStreamBeginCapture_ptsz)
HSIM_STUB(cudaStreamEndCapture)
HSIM_STUB(cudaStreamEndCapture_ptsz)
HSIM_STUB(cudaStreamBeginCaptureToGraph)
HSIM_STUB(cudaStreamUpdateCaptureDependencies)
HSIM_STUB(cudaThreadExchangeStreamCaptureMode)
HSIM_STUB(cudaGraphCreate)
HSIM_STUB(cudaGraphDestroy)
HSIM_STUB(cudaGraphInstantiate)
HSIM_STUB(cudaGraphInstantiateWithFlags)
HSIM_STUB(cudaGraphInstantiateWithParams)
HSIM_STUB(cudaGraphLaunch)
HSIM_STUB(cudaGraphLaunch_ptsz)
HSIM_STUB(cudaGraphUpload)
HSIM_STUB(cudaGraphExecDestroy)
HSIM_STUB(cudaGraphExecUpdate)
HSIM_STUB(cudaGraphAddKernelNode)
HSIM_STUB(cudaGraphAddMemcpyNode)
HSIM_STUB(cudaGraphAddMemsetNode)
HSIM_STUB(cudaGraphAddHostNode)
HSIM_STUB(cudaGraphAddEmptyNode)
HSIM_STUB(cudaGraphAddChildGraphNode)
HSIM_STUB(cudaGraphAddNode)
HSIM_STUB(cudaGraphGetNodes)
HSIM_STUB(cudaGraphClone)
HSIM_STUB(cudaGraphKernelNodeGetParams)
HSIM_STUB(cudaGraphKernelNodeSetParams)
HSIM_STUB(cudaGraphExecKernelNodeSetParams)
HSIM_STUB(cudaUserObjectCreate)
HSIM_STUB(cudaGraphRetainUserObject)
// Textures, surfaces, arrays.
HSIM_STUB(cudaCreateTextureObject)
HSIM_STUB(cudaDestroyTextureObject)
HSIM_STUB(cudaGetTextureObjectResourceDesc)
HSIM_STUB(cudaCreateSurfaceObject)
HSIM_STUB(cudaDestroySurfaceObject)
HSIM_STUB(cudaCreateChannelDesc)
HSIM_STUB(cudaMallocArray)
HSIM_STUB(cudaMalloc3DArray)
HSIM_STUB(cudaMallocMipmappedArray)
HSIM_STUB(cudaFreeArray)
HSIM_STUB(cudaFreeMipmappedArray)
HSIM_STUB(cudaMalloc3D)
HSIM_STUB(cudaMemcpy3D)
HSIM_STUB(cudaMemcpy3DAsync)
HSIM_STUB(cudaMemcpy2DToArray)
HSIM_STUB(cudaMemcpy2DFromArray)
HSIM_STUB(cudaMemcpy2DToArrayAsync)
HSIM_STUB(cudaMemcpy2DFromArrayAsync)
HSIM_STUB(cudaMemcpyBatchAsync)
HSIM_STUB(cudaMemcpy3DBatchAsync)
// IPC and peers.
HSIM_STUB(cudaIpcGetMemHandle)
HSIM_STUB(cudaIpcOpenMemHandle)
HSIM_STUB(cudaIpcCloseMemHandle)
HSIM_STUB(cudaIpcGetEventHandle)
HSIM_STUB(cudaIpcOpenEventHandle)
HSIM_STUB(cudaDeviceCanAccessPeer)
HSIM_STUB(cudaDeviceEnablePeerAccess)
HSIM_STUB(cudaDeviceDisablePeerAccess)
HSIM_STUB(cudaMemcpyPeer)
HSIM_STUB(cudaMemcpyPeerAsync)
HSIM_STUB(cudaMemcpy3DPeer)
HSIM_STUB(cudaMemcpy3DPeerAsync)
// Launch forms and misc.
HSIM_STUB(cudaLaunchCooperativeKernel)
HSIM_STUB(cudaLaunchCooperativeKernel_ptsz)
HSIM_STUB(cudaMemPrefetchAsync)
HSIM_STUB(cudaMemPrefetchAsync_ptsz)
HSIM_STUB(cudaMemPrefetchBatchAsync)
HSIM_STUB(cudaMemAdvise)
HSIM_STUB(cudaMemRangeGetAttribute)
HSIM_STUB(cudaStreamAttachMemAsync)
HSIM_STUB(cudaFuncGetName)
HSIM_STUB(cudaFuncGetParamInfo)
HSIM_STUB(cudaGetFuncBySymbol)
HSIM_STUB(cudaKernelSetAttributeForDevice)
HSIM_STUB(cudaLibraryLoadData)
HSIM_STUB(cudaLibraryLoadFromFile)
HSIM_STUB(cudaLibraryGetKernel)
HSIM_STUB(cudaLibraryUnload)
HSIM_STUB(cudaStreamSetAttribute)
HSIM_STUB(cudaStreamGetAttribute)
HSIM_STUB(cudaStreamCopyAttributes)
HSIM_STUB(cudaOccupancyMaxPotentialClusterSize)
HSIM_STUB(cudaOccupancyAvailableDynamicSMemPerBlock)
HSIM_STUB(cudaDeviceGetPCIBusId)
HSIM_STUB(cudaDeviceGetByPCIBusId)
HSIM_STUB(cudaDeviceGetDefaultMemPool)
HSIM_STUB(cudaDeviceGetMemPool)
HSIM_STUB(cudaDeviceSetMemPool)
HSIM_STUB(cudaDeviceGetP2PAttribute)
HSIM_STUB(cudaDeviceFlushGPUDirectRDMAWrites)
HSIM_STUB(cudaMemPoolCreate)
HSIM_STUB(cudaMemPoolDestroy)
HSIM_STUB(cudaMemPoolSetAttribute)
HSIM_STUB(cudaMemPoolGetAttribute)
HSIM_STUB(cudaMemPoolTrimTo)
HSIM_STUB(cudaMallocFromPoolAsync)
HSIM_STUB(cudaImportExternalMemory)
HSIM_STUB(cudaImportExternalSemaphore)
HSIM_STUB(cudaExternalMemoryGetMappedBuffer)
HSIM_STUB(cudaDestroyExternalMemory)
HSIM_STUB(cudaSignalExternalSemaphoresAsync)
HSIM_STUB(cudaWaitExternalSemaphoresAsync)
HSIM_STUB(cudaGraphicsMapResources)
HSIM_STUB(cudaGraphicsUnmapResources)
HSIM_STUB(cudaGraphicsResourceGetMappedPointer)
HSIM_STUB(cudaGraphicsUnregisterResource)
HSIM_STUB(cudaCtxResetPersistingL2Cache)
HSIM_STUB(cudaDeviceGetTexture1DLinearMaxWidth)
HSIM_STUB(cudaDeviceRegisterAsyncNotification)
HSIM_STUB(cudaGetExportTable)
