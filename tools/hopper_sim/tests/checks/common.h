// Shared helpers for the strict-check programs: each program holds several cases, picked by
// `PROGRAM CASE bad|good`. A "bad" run must trip exactly the simulator check the case names; its
// "good" twin is the same kernel done correctly and must trip none. run_checks.py drives them.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
  printf("%s failed: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)

// ---- device helpers (inline PTX so the compiler can neither drop nor reorder them) ----
__device__ __forceinline__ uint32_t su32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mbar_init(uint64_t* b, uint32_t n) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(su32(b)), "r"(n) : "memory");
}
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* b) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(su32(b)) : "memory");
}
__device__ __forceinline__ void mbar_arrive_tx(uint64_t* b, uint32_t tx) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(su32(b)), "r"(tx) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* b, uint32_t parity) {
  asm volatile(
      "{\n\t.reg .pred P1;\n"
      "LAB_WAIT:\n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n\t"
      "@P1 bra DONE;\n\t"
      "bra LAB_WAIT;\n"
      "DONE:\n\t}" :: "r"(su32(b)), "r"(parity) : "memory");
}
// cp.async.bulk global -> shared, completing tx bytes on the mbarrier
__device__ __forceinline__ void bulk_g2s(void* dst, const void* src, uint32_t n, uint64_t* b) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               :: "r"(su32(dst)), "l"(src), "r"(n), "r"(su32(b)) : "memory");
}
// cp.async.bulk shared -> global (bulk group)
__device__ __forceinline__ void bulk_s2g(void* dst, const void* src, uint32_t n) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" :: "l"(dst), "r"(su32(src)), "r"(n) : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_read0() { asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory"); }
__device__ __forceinline__ void bulk_wait0() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
__device__ __forceinline__ void st_shared_u32(void* p, uint32_t v) {
  asm volatile("st.shared.u32 [%0], %1;" :: "r"(su32(p)), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t ld_shared_u32(const void* p) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(su32(p)) : "memory");
  return v;
}

// ---- host side: a table of cases ----
struct Case { const char* name; void (*run)(bool bad); };

inline int run_case(const Case* cases, int n, int argc, char** argv) {
  if (argc < 3 || (strcmp(argv[2], "bad") && strcmp(argv[2], "good"))) {
    fprintf(stderr, "usage: %s CASE bad|good\ncases:", argv[0]);
    for (int i = 0; i < n; ++i) fprintf(stderr, " %s", cases[i].name);
    fprintf(stderr, "\n");
    return 2;
  }
  for (int i = 0; i < n; ++i)
    if (!strcmp(cases[i].name, argv[1])) {
      cases[i].run(!strcmp(argv[2], "bad"));
      cudaError_t e = cudaDeviceSynchronize();
      if (e != cudaSuccess) { printf("cudaDeviceSynchronize: %s\n", cudaGetErrorString(e)); return 1; }
      e = cudaGetLastError();
      if (e != cudaSuccess) { printf("cudaGetLastError: %s\n", cudaGetErrorString(e)); return 1; }
      printf("%s %s: ok\n", argv[1], argv[2]);
      return 0;
    }
  fprintf(stderr, "unknown case %s\n", argv[1]);
  return 2;
}
#define CASES(...) static const Case kCases[] = {__VA_ARGS__}; \
  int main(int argc, char** argv) { return run_case(kCases, sizeof kCases / sizeof kCases[0], argc, argv); }
