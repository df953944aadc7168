// Strict check global-async-order: bulk stores/reductions to global memory are complete (and
// visible to the issuing thread) only after cp.async.bulk.wait_group without .read; another CTA may
// rely on them only through a release by the issuer after that wait, which it acquires.
// `gmem CASE bad|good`; the bad run trips global-async-order, the good twin runs clean.
#include "common.h"

__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, const void* src, uint32_t n) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;"
               :: "l"(dst), "r"(su32(src)), "r"(n) : "memory");
}
__device__ __forceinline__ int ld_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ int ld_relaxed(const int* p) {
  int v;
  asm volatile("ld.relaxed.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release(int* p, int v) {
  asm volatile("st.release.gpu.global.s32 [%0], %1;" :: "l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;" ::: "memory"); }

// The deterministic-reduction hand-off (flash3's dQ semaphore): CTA r waits until the semaphore
// reads r (ld.acquire), bulk-reduce-adds its tile onto the shared accumulator, and bumps the
// semaphore for CTA r + 1. `mode` picks how the bump is ordered after the reduction:
//   0 (good): wait_group 0, fence.proxy.async.global, __threadfence(), atomicAdd
//   1 (dq_read_wait bad): wait_group.read 0 (the source is free, the sum is not complete), then the
//     same fences and atomicAdd: the release comes before the reduction completed
//   2 (dq_no_release bad): wait_group 0, then a relaxed atomicAdd with no fence before it
constexpr int kTile = 64;   // floats
__global__ void k_dq(float* acc, int* sem, int mode) {
  __shared__ alignas(128) float tile[kTile];
  const int r = blockIdx.x;
  if (threadIdx.x != 0) return;
  for (int i = 0; i < kTile; ++i) tile[i] = float(r + 1);
  fence_proxy_async();
  while (ld_acquire(sem) != r) {}
  fence_proxy_async_global();
  bulk_reduce_add_f32(acc, tile, kTile * sizeof(float));
  bulk_commit();
  if (mode == 1) bulk_wait_read0();
  else bulk_wait0();
  if (mode != 2) {
    fence_proxy_async_global();
    __threadfence();
  }
  atomicAdd(sem, 1);
  bulk_wait0();
}
static void run_dq(int mode) {
  const int ctas = 3;
  float* acc; int* sem;
  CK(cudaMalloc(&acc, kTile * sizeof(float))); CK(cudaMalloc(&sem, sizeof(int)));
  CK(cudaMemset(acc, 0, kTile * sizeof(float))); CK(cudaMemset(sem, 0, sizeof(int)));
  k_dq<<<ctas, 32>>>(acc, sem, mode);
  CK(cudaDeviceSynchronize());
  float h[kTile];
  CK(cudaMemcpy(h, acc, sizeof h, cudaMemcpyDeviceToHost));
  for (int i = 0; i < kTile; ++i)
    if (h[i] != 6.f) { printf("acc[%d] = %g, expected 6\n", i, h[i]); exit(1); }
}
static void dq_read_wait(bool bad) { run_dq(bad ? 1 : 0); }
static void dq_no_release(bool bad) { run_dq(bad ? 2 : 0); }

// A bulk store handed to another CTA that reads it with ordinary loads. CTA 0 stores the tile,
// then publishes a flag; CTA 1 waits for the flag and reads the tile.
//   0 (good): wait_group 0, st.release flag / reader ld.acquire
//   1 (store_read_wait bad): wait_group.read 0, st.release flag (released before completion)
//   2 (flag_no_acquire bad): wait_group 0, st.release flag, but the reader polls with ld.relaxed and
//     no fence before reading the tile
__global__ void k_store(uint32_t* data, int* flag, uint32_t* out, int mode) {
  __shared__ alignas(128) uint32_t tile[kTile];
  if (threadIdx.x != 0) return;
  if (blockIdx.x == 0) {
    for (int i = 0; i < kTile; ++i) st_shared_u32(&tile[i], 100 + i);
    fence_proxy_async();
    bulk_s2g(data, tile, kTile * 4);
    bulk_commit();
    if (mode == 1) bulk_wait_read0();
    else bulk_wait0();
    st_release(flag, 1);
    bulk_wait0();
  } else {
    if (mode == 2) while (ld_relaxed(flag) != 1) {}
    else while (ld_acquire(flag) != 1) {}
    uint32_t s = 0;
    for (int i = 0; i < kTile; ++i) s += data[i];
    out[0] = s;
  }
}
static void run_store(int mode) {
  uint32_t *data, *out; int* flag;
  CK(cudaMalloc(&data, kTile * 4)); CK(cudaMalloc(&out, 4)); CK(cudaMalloc(&flag, 4));
  CK(cudaMemset(data, 0, kTile * 4)); CK(cudaMemset(flag, 0, 4));
  k_store<<<2, 32>>>(data, flag, out, mode);
  CK(cudaDeviceSynchronize());
  uint32_t h;
  CK(cudaMemcpy(&h, out, 4, cudaMemcpyDeviceToHost));
  uint32_t want = 0;
  for (int i = 0; i < kTile; ++i) want += 100 + i;
  if (h != want) { printf("sum %u, expected %u\n", h, want); exit(1); }
}
static void store_read_wait(bool bad) { run_store(bad ? 1 : 0); }
static void flag_no_acquire(bool bad) { run_store(bad ? 2 : 0); }

// unordered_reduce (clean only): CTAs bulk-reduce onto the same accumulator with no hand-off at all
// (flash3's non-deterministic backward): reductions are atomic, nothing claims an order.
__global__ void k_unordered(float* acc) {
  __shared__ alignas(128) float tile[kTile];
  if (threadIdx.x != 0) return;
  for (int i = 0; i < kTile; ++i) tile[i] = 1.f;
  fence_proxy_async();
  bulk_reduce_add_f32(acc, tile, kTile * sizeof(float));
  bulk_commit();
  bulk_wait_read0();
}
static void unordered_reduce(bool) {
  float* acc;
  CK(cudaMalloc(&acc, kTile * sizeof(float)));
  CK(cudaMemset(acc, 0, kTile * sizeof(float)));
  k_unordered<<<4, 32>>>(acc);
  CK(cudaDeviceSynchronize());
  float h[kTile];
  CK(cudaMemcpy(h, acc, sizeof h, cudaMemcpyDeviceToHost));
  for (int i = 0; i < kTile; ++i)
    if (h[i] != 4.f) { printf("acc[%d] = %g, expected 4\n", i, h[i]); exit(1); }
}

CASES({"dq_read_wait", dq_read_wait}, {"dq_no_release", dq_no_release}, {"store_read_wait", store_read_wait},
      {"flag_no_acquire", flag_no_acquire}, {"unordered_reduce", unordered_reduce})
