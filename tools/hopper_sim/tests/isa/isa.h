// Instruction-semantics tests for the Hopper simulator: shared helpers.
//
// Each program holds several families, run as `PROGRAM FAMILY`. A family's kernel executes the exact
// PTX instruction under test (inline `asm volatile`) and records (name, got, want) triples, where
// `want` is a literal worked out by hand from the PTX ISA text (the section is cited next to each
// case), or the host fills `want` from an independent host-side formula written from the ISA text.
// Nothing is ever copied from the simulator's output.
//
// Output: one line per case,  `CASE <family> <name> ok|FAIL got=0x... want=0x...`, then
// `FAMILY <family> <passed> <failed>`. run_isa.py parses these lines (and applies expected failures).
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <string>
#include <cuda_runtime.h>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
  printf("%s failed: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)

struct Rec { uint64_t got, want; char name[48]; };
constexpr int kMaxRec = 2048;
__device__ Rec g_rec[kMaxRec];
__device__ unsigned g_nrec;

// Record one case. Called by a single thread at a time (each family's recording thread), so a plain
// counter is enough (no atomics: those are under test too).
__device__ __noinline__ void chk(const char* name, uint64_t got, uint64_t want) {
  unsigned i = g_nrec;
  if (i >= kMaxRec) return;
  g_rec[i].got = got;
  g_rec[i].want = want;
  int k = 0;
  for (; k < 47 && name[k]; ++k) g_rec[i].name[k] = name[k];
  g_rec[i].name[k] = 0;
  g_nrec = i + 1;
}
__device__ __forceinline__ uint32_t fb(float f) { return __float_as_uint(f); }
__device__ __forceinline__ uint32_t su32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

// ---- host side ----
struct HostRec { std::string name; uint64_t got, want; };
static std::vector<HostRec> g_host;
inline void hchk(const std::string& name, uint64_t got, uint64_t want) { g_host.push_back({name, got, want}); }

inline void reset_records() {
  unsigned z = 0;
  CK(cudaMemcpyToSymbol(g_nrec, &z, sizeof z));
}
// Pull the device records (after the family's kernels ran) into g_host.
inline void collect_records() {
  CK(cudaDeviceSynchronize());
  unsigned n = 0;
  CK(cudaMemcpyFromSymbol(&n, g_nrec, sizeof n));
  if (n > kMaxRec) n = kMaxRec;
  std::vector<Rec> r(n);
  if (n) CK(cudaMemcpyFromSymbol(r.data(), g_rec, n * sizeof(Rec)));
  for (auto& x : r) g_host.push_back({x.name, x.got, x.want});
}

struct Family { const char* name; void (*run)(); };

inline int run_families(const Family* f, int n, int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s FAMILY|--list\n", argv[0]);
    return 2;
  }
  if (!strcmp(argv[1], "--list")) {
    for (int i = 0; i < n; ++i) printf("%s\n", f[i].name);
    return 0;
  }
  for (int i = 0; i < n; ++i)
    if (!strcmp(f[i].name, argv[1])) {
      reset_records();
      f[i].run();
      collect_records();
      cudaError_t e = cudaGetLastError();
      if (e != cudaSuccess) { printf("cudaGetLastError: %s\n", cudaGetErrorString(e)); return 1; }
      int pass = 0, fail = 0;
      for (auto& r : g_host) {
        bool ok = r.got == r.want;
        printf("CASE %s %s %s got=0x%llx want=0x%llx\n", f[i].name, r.name.c_str(), ok ? "ok" : "FAIL",
               (unsigned long long)r.got, (unsigned long long)r.want);
        (ok ? pass : fail)++;
      }
      printf("FAMILY %s %d %d\n", f[i].name, pass, fail);
      return 0;
    }
  fprintf(stderr, "unknown family %s\n", argv[1]);
  return 2;
}
#define FAMILIES(...) static const Family kFamilies[] = {__VA_ARGS__}; \
  int main(int argc, char** argv) { return run_families(kFamilies, sizeof kFamilies / sizeof kFamilies[0], argc, argv); }

// Single-thread kernel helper: define `__global__ void k_NAME()` and `static void NAME()` launching it <<<1,1>>>.
#define SCALAR_FAMILY(NAME) \
  __global__ void k_##NAME(); \
  static void NAME() { k_##NAME<<<1, 1>>>(); } \
  __global__ void k_##NAME()
