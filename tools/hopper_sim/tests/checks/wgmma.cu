// Strict checks on the warpgroup machinery: wgmma register races, wgmma.fence, the proxy fence
// before wgmma reads shared memory. `wgmma CASE bad|good`; the bad run trips the named
// check, the good twin none. The wgmma is m64n8k16 f32 += f16*f16 from shared memory without
// swizzle (A 64x16 and B 8x16, both K-major, 8x8 core matrices: LBO 128 B along K, SBO 256 B
// along M/N); A = B = 1 so every accumulator ends up 16 whatever the layout.
#include "common.h"

__device__ __forceinline__ uint64_t desc(const void* p) {
  uint64_t a = su32(p);
  return ((a & 0x3FFFF) >> 4) | (uint64_t(128 >> 4) << 16) | (uint64_t(256 >> 4) << 32);
}

// Fills A and B with f16 1.0 through the generic proxy; `fence` adds the fence.proxy.async the
// async proxy (wgmma) needs to see those writes.
__device__ void fill_ab(uint16_t* a, uint16_t* b, bool fence) {
  for (int i = threadIdx.x; i < 64 * 16; i += 128) a[i] = 0x3C00;
  for (int i = threadIdx.x; i < 8 * 16; i += 128) b[i] = 0x3C00;
  if (fence) fence_proxy_async();
  __syncthreads();
}

// mode 0: clean; 1: read an accumulator before wgmma.wait_group (wgmma-register-race: PTX says
// the accumulators may not be accessed until the wait_group that covers the wgmma);
// 2: write an accumulator after wgmma.fence and before the wgmma (wgmma-fence: PTX requires
// wgmma.fence between a register write and the wgmma.mma_async that uses it);
// 3: no fence.proxy.async after filling A/B with st.shared (async-proxy-read).
__global__ void k_wgmma(int mode, float* out) {
  __shared__ alignas(128) uint16_t A[64 * 16];
  __shared__ alignas(128) uint16_t B[8 * 16];
  fill_ab(A, B, mode != 3);
  uint64_t da = desc(A), db = desc(B);
  float d0 = 0.f, d1 = 0.f, d2 = 0.f, d3 = 0.f, early = 0.f;
  if (mode == 1) {
    asm volatile(
        "{\n\t"
        "wgmma.fence.sync.aligned;\n\t"
        "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {%0, %1, %2, %3}, %5, %6, 0, 1, 1, 0, 0;\n\t"
        "wgmma.commit_group.sync.aligned;\n\t"
        "mov.b32 %4, %0;\n\t"
        "wgmma.wait_group.sync.aligned 0;\n\t}"
        : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3), "=f"(early) : "l"(da), "l"(db) : "memory");
  } else if (mode == 2) {
    asm volatile(
        "{\n\t"
        "wgmma.fence.sync.aligned;\n\t"
        "mov.b32 %0, 0;\n\t"
        "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {%0, %1, %2, %3}, %4, %5, 1, 1, 1, 0, 0;\n\t"
        "wgmma.commit_group.sync.aligned;\n\t"
        "wgmma.wait_group.sync.aligned 0;\n\t}"
        : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3) : "l"(da), "l"(db) : "memory");
  } else {
    // clean (and mode 3): write, fence, wgmma, commit, wait, then read
    asm volatile(
        "{\n\t"
        "mov.b32 %0, 0;\n\t"
        "wgmma.fence.sync.aligned;\n\t"
        "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {%0, %1, %2, %3}, %4, %5, 1, 1, 1, 0, 0;\n\t"
        "wgmma.commit_group.sync.aligned;\n\t"
        "wgmma.wait_group.sync.aligned 0;\n\t}"
        : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3) : "l"(da), "l"(db) : "memory");
  }
  float* o = out + threadIdx.x * 5;
  o[0] = d0; o[1] = d1; o[2] = d2; o[3] = d3; o[4] = early;
}
static void run_wgmma(int mode) {
  float* d; CK(cudaMalloc(&d, 128 * 5 * sizeof(float)));
  k_wgmma<<<1, 128>>>(mode, d);
  float h[128 * 5];
  CK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
  for (int t = 0; t < 128; ++t)
    for (int r = 0; r < 4; ++r)
      if (h[t * 5 + r] != 16.f) { printf("wgmma: thread %d d%d = %g, expected 16\n", t, r, h[t * 5 + r]); exit(1); }
}
static void wgmma_register_race(bool bad) { run_wgmma(bad ? 1 : 0); }
static void wgmma_fence(bool bad) { run_wgmma(bad ? 2 : 0); }
static void wgmma_proxy(bool bad) { run_wgmma(bad ? 3 : 0); }

CASES({"wgmma_register_race", wgmma_register_race}, {"wgmma_fence", wgmma_fence}, {"wgmma_proxy", wgmma_proxy})
