// The simulated device as the runtime library (cudart.cpp) sees it: modules, kernels, global
// memory registry, launches. One process-wide instance; single-threaded.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace hsim {

struct Dim3 { uint32_t x = 1, y = 1, z = 1; };

struct LaunchParams {
  Dim3 grid, block, cluster;   // cluster (1,1,1) unless given (launch attribute or .reqnctapercluster)
  size_t dyn_smem = 0;
};

struct Options {               // from the environment (simrun sets them), see Device::instance()
  uint64_t seed = 1;           // HSIM_SEED: warp interleaving and async completion order
  int sms = 4;                 // HSIM_SMS: simulated SM count
  bool strict = true;          // HSIM_STRICT=0 turns the strict checks off
  bool check_uninit = false;   // HSIM_UNINIT=1: reads of never-written registers / shared memory
  int verbose = 0;             // HSIM_VERBOSE
  bool timing = false;         // HSIM_TIMING=1: record and replay each launch on the timing model
  std::string timing_json;     // HSIM_TIMING_JSON: append one JSON record per launch to this file
  int timing_sample = 0;       // HSIM_TIMING_SAMPLE=K: run only the CTAs K of the 132 SMs would get
  std::string timing_only;     // HSIM_TIMING_ONLY=S: with timing, launches of kernels whose name lacks
                               // S are skipped (not run at all: e.g. a program's reference GEMM)
  bool timing_sample_atomics = false;   // HSIM_TIMING_SAMPLE_ATOMICS=1: with sampling, a global integer
                               // atom.add adds its value times (SM groups / sampled groups): the
                               // skipped SMs take their share of an atomic tile counter
};

constexpr int kStrictExit = 86;
// Prints "hopper_sim: <check>: <details>" to stderr and exits with kStrictExit.
[[noreturn]] void fail_check(const std::string& check, const std::string& details);
// Prints "hopper_sim: <what>" and exits with status 87 (unsupported feature / internal error).
[[noreturn]] void fail_unsupported(const std::string& what);

struct KernelInfo {
  std::string name;                 // mangled
  int module = -1, function = -1;   // where it lives
  std::vector<uint32_t> param_offsets, param_sizes;   // in the param buffer, per formal parameter
  uint32_t param_bytes = 0;
  uint32_t static_smem = 0;         // bytes of .shared variables the kernel uses (incl. reserved)
  uint32_t max_threads = 1024;      // from .maxntid/.reqntid (product), else 1024
  uint32_t num_regs = 0;            // per thread at launch (estimate: see exec.cpp)
  uint32_t req_cluster[3] = {0, 0, 0};  // .reqnctapercluster, 0 = none
  // Attributes set by cudaFuncSetAttribute.
  int max_dynamic_smem = 48 * 1024;
  int preferred_smem_carveout = -1;
  bool non_portable_cluster_ok = false;
};

constexpr size_t kMaxSmemPerBlockOptin = 232448;   // 227 KB: the sm_90 opt-in limit
constexpr size_t kSmemPerSM = 233472;              // 228 KB
constexpr size_t kReservedSmemPerBlock = 1024;

class Device {
 public:
  static Device& instance();        // reads Options from the environment on first use
  Options& options();

  // Parses and loads a PTX module (module-scope .global/.const variables get host memory and are
  // registered as allocations). Returns the module index. Throws std::runtime_error on parse errors.
  int add_module(const std::string& ptx, const std::string& name);
  KernelInfo* kernel(const std::string& mangled_name);          // nullptr if no such .entry
  void* symbol_address(const std::string& name, size_t* size);  // module-scope variable, or nullptr

  // Global memory registry: accesses outside every registered range are out of bounds.
  void add_allocation(const void* p, size_t n, const char* what);
  bool remove_allocation(const void* p);                         // false if p is not a base
  bool is_allocation(const void* p, size_t n) const;

  // Runs a kernel to completion (all CTAs). Returns 0 or a cudaError_t value for a bad launch
  // configuration (the kernel then does not run). Strict-check failures exit the process.
  int launch(KernelInfo* k, const LaunchParams& lp, void** args);
  // Resident CTAs per SM for this kernel and block (occupancy: threads, shared memory, registers).
  int occupancy(const KernelInfo* k, uint32_t block_threads, size_t dyn_smem) const;
  // Statistics: thread-instructions executed so far, seconds spent in launches.
  uint64_t instructions() const;
  double launch_seconds() const;

 struct Impl;   // engine.h

 private:
  Device();
  Impl* impl_;
};

}  // namespace hsim
