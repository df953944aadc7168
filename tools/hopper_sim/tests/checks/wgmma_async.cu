// Strict checks on wgmma operands as asynchronous reads: a wgmma reads its shared-memory operands
// until the wgmma.wait_group that covers it, and operand bytes a copy delivered need the
// mbarrier phase observed. `wgmma_async CASE bad|good`. The wgmma is m64n8k16 f32 += f16*f16 from
// shared memory (A 64x16, B 8x16, K-major, no swizzle: LBO 128 B, SBO 256 B), A = B = 1 copied
// from global memory by cp.async.bulk, so every accumulator ends up 16.
#include "common.h"

__device__ __forceinline__ uint64_t desc(const void* p) {
  uint64_t a = su32(p);
  return ((a & 0x3FFFF) >> 4) | (uint64_t(128 >> 4) << 16) | (uint64_t(256 >> 4) << 32);
}

__device__ __forceinline__ void wgmma_issue(float (&d)[4], uint64_t da, uint64_t db) {
  asm volatile(
      "{\n\t"
      "wgmma.fence.sync.aligned;\n\t"
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {%0, %1, %2, %3}, %4, %5, 0, 1, 1, 0, 0;\n\t"
      "wgmma.commit_group.sync.aligned;\n\t}"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "l"(da), "l"(db) : "memory");
}
__device__ __forceinline__ void wgmma_wait0(float (&d)[4]) {
  asm volatile("wgmma.wait_group.sync.aligned 0;" : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) :: "memory");
}

// overwrite: thread 0 refills the B stage with a bulk copy (bad: before the wgmma.wait_group that
// covers the wgmma reading it, the early release of a pipeline stage; good: after it).
// unobserved: the operands are delivered by a bulk copy; bad: only warp 4 waits on the mbarrier
// and tells the warpgroup through a volatile flag (no acquire: the wgmma races with the copy);
// good: the warpgroup's threads wait on the mbarrier themselves.
__global__ void k_async(int mode, const uint16_t* ga, const uint16_t* gb, float* out) {
  __shared__ alignas(128) uint16_t A[64 * 16];
  __shared__ alignas(128) uint16_t B[8 * 16];
  __shared__ alignas(8) uint64_t full, refill;
  __shared__ volatile int flag;
  if (threadIdx.x == 0) {
    mbar_init(&full, 1);
    mbar_init(&refill, 1);
    flag = 0;
    mbar_init_fence();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    mbar_arrive_tx(&full, sizeof A + sizeof B);
    bulk_g2s(A, ga, sizeof A, &full);
    bulk_g2s(B, gb, sizeof B, &full);
  }
  if (threadIdx.x >= 128) {   // warp 4
    if (mode == 1) {
      mbar_wait(&full, 0);
      if (threadIdx.x == 128) flag = 1;
    }
    return;
  }
  if (mode == 1) while (flag == 0) {}
  else mbar_wait(&full, 0);
  float d[4] = {0.f, 0.f, 0.f, 0.f};
  wgmma_issue(d, desc(A), desc(B));
  if (mode == 2 && threadIdx.x == 0) {   // refill before the wait
    mbar_arrive_tx(&refill, sizeof B);
    bulk_g2s(B, gb, sizeof B, &refill);
  }
  wgmma_wait0(d);
  if (mode != 2 && threadIdx.x == 0) {   // refill after the wait
    mbar_arrive_tx(&refill, sizeof B);
    bulk_g2s(B, gb, sizeof B, &refill);
  }
  mbar_wait(&refill, 0);
  for (int r = 0; r < 4; ++r) out[threadIdx.x * 4 + r] = d[r];
}

// early_release: a one-stage pipeline, warp 4 producing B by bulk copy, the warpgroup consuming it
// with a wgmma per iteration. bad: thread 0 arrives on the empty barrier (releasing the stage)
// before the wgmma.wait_group of the wgmma that reads it; good: after. Whether the producer's refill
// is issued inside that window depends on the schedule (run with several seeds).
__global__ void k_pipeline(int bad, const uint16_t* ga, const uint16_t* gb, float* out) {
  __shared__ alignas(128) uint16_t A[64 * 16];
  __shared__ alignas(128) uint16_t B[8 * 16];
  __shared__ alignas(8) uint64_t full, empty, afull;
  const int iters = 16;
  if (threadIdx.x == 0) {
    mbar_init(&full, 1);
    mbar_init(&empty, 1);
    mbar_init(&afull, 1);
    mbar_init_fence();
  }
  __syncthreads();
  if (threadIdx.x == 128) {   // producer
    mbar_arrive_tx(&afull, sizeof A);
    bulk_g2s(A, ga, sizeof A, &afull);
    for (int i = 0; i < iters; ++i) {
      if (i > 0) mbar_wait(&empty, (i - 1) & 1);
      mbar_arrive_tx(&full, sizeof B);
      bulk_g2s(B, gb, sizeof B, &full);
    }
  }
  if (threadIdx.x >= 128) return;
  mbar_wait(&afull, 0);
  float d[4] = {0.f, 0.f, 0.f, 0.f};
  for (int i = 0; i < iters; ++i) {
    mbar_wait(&full, i & 1);
    asm volatile(
        "{\n\t"
        "wgmma.fence.sync.aligned;\n\t"
        "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {%0, %1, %2, %3}, %4, %5, 1, 1, 1, 0, 0;\n\t"
        "wgmma.commit_group.sync.aligned;\n\t}"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "l"(desc(A)), "l"(desc(B)) : "memory");
    if (bad && threadIdx.x == 0 && i + 1 < iters) mbar_arrive(&empty);
    wgmma_wait0(d);
    if (!bad && threadIdx.x == 0 && i + 1 < iters) mbar_arrive(&empty);
  }
  for (int r = 0; r < 4; ++r) out[threadIdx.x * 4 + r] = d[r] / iters;
}

static void run_async(int mode) {
  uint16_t h[64 * 16];
  for (auto& x : h) x = 0x3C00;   // f16 1.0
  uint16_t *ga, *gb;
  float* d;
  CK(cudaMalloc(&ga, sizeof h));
  CK(cudaMalloc(&gb, 8 * 16 * 2));
  CK(cudaMalloc(&d, 128 * 4 * sizeof(float)));
  CK(cudaMemcpy(ga, h, sizeof h, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(gb, h, 8 * 16 * 2, cudaMemcpyHostToDevice));
  if (mode == 3 || mode == 4) k_pipeline<<<1, 160>>>(mode == 3, ga, gb, d);
  else k_async<<<1, 160>>>(mode, ga, gb, d);
  float o[128 * 4];
  CK(cudaMemcpy(o, d, sizeof o, cudaMemcpyDeviceToHost));
  for (int i = 0; i < 128 * 4; ++i)
    if (o[i] != 16.f) { printf("wgmma_async: d[%d] = %g, expected 16\n", i, o[i]); exit(1); }
}
static void wgmma_operand_overwrite(bool bad) { run_async(bad ? 2 : 0); }
static void wgmma_unobserved(bool bad) { run_async(bad ? 1 : 0); }
static void early_release(bool bad) { run_async(bad ? 3 : 4); }

CASES({"wgmma_operand_overwrite", wgmma_operand_overwrite}, {"wgmma_unobserved", wgmma_unobserved},
      {"early_release", early_release})
