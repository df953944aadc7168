// The shared-race check (racecheck's job): plain shared-memory accesses by different threads, at
// least one a write, that no synchronization orders. `race CASE bad|good`; the bad run trips
// shared-race, the good twin (the same accesses with the synchronization the PTX memory model
// needs) none. Write-write cases trip whatever the interleaving (the second write finds the first).
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

template <class K> static void run(K k, bool bad, uint32_t want) {
  uint32_t* d;
  CK(cudaMalloc(&d, 4));
  k<<<1, 64>>>(bad, d);
  uint32_t h;
  CK(cudaMemcpy(&h, d, 4, cudaMemcpyDeviceToHost));
  if (h != want) { printf("race: got %u, expected %u\n", h, want); exit(1); }
}
static void shared_race_rw(bool bad) { run(k_rw, bad, 7); }
static void shared_race_ww_warp(bool bad) { run(k_ww_warp, bad, 7); }
static void shared_race_mbar(bool bad) { run(k_mbar, bad, 7); }

CASES({"shared_race_rw", shared_race_rw}, {"shared_race_ww_warp", shared_race_ww_warp},
      {"shared_race_mbar", shared_race_mbar})
