// The shared-race check (racecheck's job): plain shared-memory accesses by different threads, at
// least one a write, that no synchronization orders. `race CASE bad|good`; the bad run trips
// shared-race, the good twin (the same accesses with the synchronization the PTX memory model
// needs) none. The cases are written so that the reported pair happens in that order whatever the
// interleaving (a spin on a volatile flag, which orders nothing, or a lane writing after the other).
#include "common.h"

// rw: thread 0 writes x, then raises a volatile flag; thread 32 spins on the flag and reads x.
// A relaxed flag orders nothing: the read races with the write (bad). good: bar.sync between.
__global__ void k_rw(int bad, uint32_t* out) {
  __shared__ uint32_t x;
  __shared__ volatile int flag;
  if (threadIdx.x == 0) flag = 0;
  __syncthreads();
  if (bad) {
    if (threadIdx.x == 0) { st_shared_u32(&x, 7); flag = 1; }
    if (threadIdx.x == 32) { while (flag == 0) {} out[0] = ld_shared_u32(&x); }
  } else {
    if (threadIdx.x == 0) st_shared_u32(&x, 7);
    __syncthreads();
    if (threadIdx.x == 32) out[0] = ld_shared_u32(&x);
  }
}

// ww_warp: lanes 0 and 1 of one warp both write x; good: __syncwarp between the two writes.
__global__ void k_ww_warp(int bad, uint32_t* out) {
  __shared__ uint32_t x;
  if (threadIdx.x == 0) st_shared_u32(&x, 1);
  if (!bad) __syncwarp();
  if (threadIdx.x == 1) st_shared_u32(&x, 7);
  __syncwarp();
  if (threadIdx.x == 0) out[0] = ld_shared_u32(&x);
}

// mbar: thread 0 hands x to thread 32 through an mbarrier; bad: it writes x after its arrive (the
// arrive releases only what came before it), so thread 32's write after its wait races.
__global__ void k_mbar(int bad, uint32_t* out) {
  __shared__ uint32_t x;
  __shared__ alignas(8) uint64_t bar;
  if (threadIdx.x == 0) { mbar_init(&bar, 1); mbar_init_fence(); }
  __syncthreads();
  if (threadIdx.x == 0) {
    if (!bad) st_shared_u32(&x, 1);
    mbar_arrive(&bar);
    if (bad) st_shared_u32(&x, 1);
  }
  if (threadIdx.x == 32) {
    mbar_wait(&bar, 0);
    st_shared_u32(&x, 7);
  }
  __syncthreads();
  if (threadIdx.x == 0) out[0] = ld_shared_u32(&x);
}

// war: thread 32 reads x, then raises a volatile flag; thread 0 waits for the flag and overwrites x
// (the write-after-read a consumer releasing a buffer by a plain flag makes). good: bar.sync.
__global__ void k_war(int bad, uint32_t* out) {
  __shared__ uint32_t x;
  __shared__ volatile int flag;
  if (threadIdx.x == 0) { flag = 0; st_shared_u32(&x, 7); }
  __syncthreads();
  uint32_t seen = 0;
  if (threadIdx.x == 32) { seen = ld_shared_u32(&x); if (bad) flag = 1; }
  if (!bad) __syncthreads();
  if (threadIdx.x == 0) { if (bad) while (flag == 0) {} st_shared_u32(&x, 9); }
  if (threadIdx.x == 32) out[0] = seen;
}

// store_src: warp 1 writes a 16-byte staging buffer, thread 0 stores it to global with a bulk copy.
// bad: handed over by a volatile flag (and warp 1's own proxy fence), which orders nothing; good:
// bar.sync.
__global__ void k_store_src(int bad, uint32_t* out) {
  __shared__ alignas(16) uint32_t buf[4];
  __shared__ volatile int flag;
  if (threadIdx.x == 0) flag = 0;
  __syncthreads();
  if (threadIdx.x >= 32 && threadIdx.x < 36) {
    st_shared_u32(&buf[threadIdx.x - 32], 7);
    fence_proxy_async();
    if (bad && threadIdx.x == 32) flag = 1;
  }
  if (!bad) __syncthreads();
  if (threadIdx.x == 0) {
    if (bad) while (flag == 0) {}
    bulk_s2g(out, buf, 16);
    bulk_commit();
    bulk_wait0();
  }
}

template <class K> static void run(K k, bool bad, uint32_t want) {
  uint32_t* d;
  CK(cudaMalloc(&d, 16));   // (store_src writes 16 bytes)
  k<<<1, 64>>>(bad, d);
  uint32_t h;
  CK(cudaMemcpy(&h, d, 4, cudaMemcpyDeviceToHost));
  if (h != want) { printf("race: got %u, expected %u\n", h, want); exit(1); }
}
static void shared_race_rw(bool bad) { run(k_rw, bad, 7); }
static void shared_race_ww_warp(bool bad) { run(k_ww_warp, bad, 7); }
static void shared_race_mbar(bool bad) { run(k_mbar, bad, 7); }

static void shared_race_war(bool bad) { run(k_war, bad, 7); }
static void shared_race_store_src(bool bad) { run(k_store_src, bad, 7); }

CASES({"shared_race_rw", shared_race_rw}, {"shared_race_ww_warp", shared_race_ww_warp},
      {"shared_race_mbar", shared_race_mbar}, {"shared_race_war", shared_race_war},
      {"shared_race_store_src", shared_race_store_src})
