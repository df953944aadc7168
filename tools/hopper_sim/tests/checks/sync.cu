// Strict checks on synchronisation: deadlock, named barriers, mbarriers, warp collectives, trap,
// device assert. `sync CASE bad|good`; the bad run trips the named check, the good twin none.
#include <cassert>
#include "common.h"

// deadlock_bar: bar.sync 1, 64 that only warp 0 (32 threads) reaches while warp 1 exits: the
// barrier can never collect 64 arrivals (PTX: bar.sync waits for `b` threads).
__global__ void k_deadlock_bar(int bad) {
  if (!bad || threadIdx.x < 32) asm volatile("bar.sync 1, 64;" ::: "memory");
}
static void deadlock_bar(bool bad) { k_deadlock_bar<<<1, 64>>>(bad); }

// deadlock_mbar: try_wait.parity 0 on an mbarrier whose phase 0 nobody completes (no arrive).
__global__ void k_deadlock_mbar(int bad) {
  __shared__ alignas(8) uint64_t bar;
  if (threadIdx.x == 0) { mbar_init(&bar, 1); mbar_init_fence(); }
  __syncthreads();
  if (!bad && threadIdx.x == 0) mbar_arrive(&bar);
  mbar_wait(&bar, 0);
}
static void deadlock_mbar(bool bad) { k_deadlock_mbar<<<1, 64>>>(bad); }

// named_barrier_mismatch: in one round of barrier 1, warp 0 says 64 threads and warp 1 says 96
// (PTX: all threads of a barrier instance must give the same thread count).
__global__ void k_nb_mismatch(int bad) {
  if (threadIdx.x < 32) asm volatile("bar.sync 1, 64;" ::: "memory");
  else if (bad) asm volatile("bar.sync 1, 96;" ::: "memory");
  else asm volatile("bar.sync 1, 64;" ::: "memory");
}
static void named_barrier_mismatch(bool bad) { k_nb_mismatch<<<1, 64>>>(bad); }

// named_barrier_count: bar.sync 1, 48 (PTX: the thread count must be a multiple of the warp size);
// a register operand so ptxas cannot reject it.
__global__ void k_nb_count(int n) { asm volatile("bar.sync 1, %0;" :: "r"(n) : "memory"); }
static void named_barrier_count(bool bad) { k_nb_count<<<1, 64>>>(bad ? 48 : 64); }

// named_barrier_id: bar.sync 16 (PTX: barrier ids are 0..15).
__global__ void k_nb_id(int id) { asm volatile("bar.sync %0;" :: "r"(id) : "memory"); }
static void named_barrier_id(bool bad) { k_nb_id<<<1, 64>>>(bad ? 16 : 15); }

// mbar_overarrive: arrive with count 3 on an mbarrier initialised with 2 (PTX: the pending count
// of the current phase must not go below zero).
__global__ void k_overarrive(int cnt) {
  __shared__ alignas(8) uint64_t bar;
  mbar_init(&bar, 2);
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0], %1;" :: "r"(su32(&bar)), "r"(cnt) : "memory");
  mbar_wait(&bar, 0);
}
static void mbar_overarrive(bool bad) { k_overarrive<<<1, 1>>>(bad ? 3 : 2); }

// mbar_tx: expect_tx of 2^20 bytes (PTX: the tx-count range is [-(2^20-1), 2^20-1]).
__global__ void k_mbar_tx(uint32_t tx) {
  __shared__ alignas(8) uint64_t bar;
  mbar_init(&bar, 1);
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" :: "r"(su32(&bar)), "r"(tx) : "memory");
  asm volatile("mbarrier.complete_tx.relaxed.cta.shared::cta.b64 [%0], %1;" :: "r"(su32(&bar)), "r"(tx) : "memory");
  mbar_arrive(&bar);
  mbar_wait(&bar, 0);
}
static void mbar_tx(bool bad) { k_mbar_tx<<<1, 1>>>(bad ? (1u << 20) : (1u << 20) - 1); }

// mbar_uninit: arrive on an mbarrier that was never initialised (PTX: undefined behaviour).
__global__ void k_mbar_uninit(int bad) {
  __shared__ alignas(8) uint64_t bar;
  if (!bad) mbar_init(&bar, 1);
  mbar_arrive(&bar);
  mbar_wait(&bar, 0);
}
static void mbar_uninit(bool bad) { k_mbar_uninit<<<1, 1>>>(bad); }

// mbar_overwrite: st.shared over a live mbarrier object (PTX: modifying an mbarrier object other
// than through mbarrier instructions is undefined; mbarrier.inval first).
__global__ void k_mbar_overwrite(int bad) {
  __shared__ alignas(8) uint64_t bar;
  mbar_init(&bar, 1);
  mbar_arrive(&bar);
  mbar_wait(&bar, 0);
  if (!bad) asm volatile("mbarrier.inval.shared::cta.b64 [%0];" :: "r"(su32(&bar)) : "memory");
  st_shared_u32(&bar, 7);
}
static void mbar_overwrite(bool bad) { k_mbar_overwrite<<<1, 1>>>(bad); }

// warp_sync: shfl.sync whose membermask excludes the executing lane 0 (PTX: the executing thread
// must be in membermask, else undefined).
__global__ void k_warp_sync(unsigned mask, int* out) {
  int v = __shfl_sync(mask, (int)threadIdx.x, 1);
  out[threadIdx.x] = v;
}
static void warp_sync(bool bad) {
  int* d; CK(cudaMalloc(&d, 32 * sizeof(int)));
  k_warp_sync<<<1, 32>>>(bad ? 0xfffffffeu : 0xffffffffu, d);
}

// warp_divergence: lanes 0-15 and 16-31 execute two different ldmatrix.sync.aligned instructions
// (PTX: .aligned requires every thread of the warp to execute the same instruction).
__global__ void k_warp_div(int bad, uint32_t* out) {
  __shared__ alignas(16) uint16_t tile[8 * 8 * 2];
  for (int i = threadIdx.x; i < 128; i += 32) tile[i] = (uint16_t)i;
  __syncwarp();
  uint32_t a = su32(&tile[(threadIdx.x % 8) * 8]), r;
  if (bad && threadIdx.x >= 16)
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];" : "=r"(r) : "r"(a) : "memory");
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];" : "=r"(r) : "r"(a) : "memory");
  out[threadIdx.x] = r;
}
static void warp_divergence(bool bad) {
  uint32_t* d; CK(cudaMalloc(&d, 32 * sizeof(uint32_t)));
  k_warp_div<<<1, 32>>>(bad, d);
}

// shfl_source: lanes 0-15 (membermask 0xffff) shuffle from lane 20, which is not in membermask
// (PTX: the result is undefined when the source thread is not in membermask).
__global__ void k_shfl_src(int src, int* out) {
  if (threadIdx.x < 16) out[threadIdx.x] = __shfl_sync(0xffffu, (int)threadIdx.x, src);
}
static void shfl_source(bool bad) {
  int* d; CK(cudaMalloc(&d, 32 * sizeof(int)));
  k_shfl_src<<<1, 32>>>(bad ? 20 : 5, d);
}

// cluster_barrier: barrier.cluster.wait without a preceding barrier.cluster.arrive (PTX: each
// wait must pair with an arrive of the same thread).
__global__ void k_cluster_wait(int bad) {
  if (!bad) asm volatile("barrier.cluster.arrive.aligned;" ::: "memory");
  asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
}
static void cluster_barrier(bool bad) { k_cluster_wait<<<1, 32>>>(bad); }

// producer_consumer (clean only): warp 0 signals with bar.arrive 1, 64 and warp 1 waits with
// bar.sync 1, 64, four rounds; both warps then arrive on an mbarrier (count 64) that warp 1 waits
// on by parity across four phases and warp 0 by the state token of its arrive (test_wait), so warp
// 0 cannot start round r+1 before warp 1 has left round r's bar.sync.
__global__ void k_prodcons(int* out) {
  __shared__ int slot[4];
  __shared__ alignas(8) uint64_t bar;
  int w = threadIdx.x / 32, l = threadIdx.x % 32;
  if (threadIdx.x == 0) { mbar_init(&bar, 64); mbar_init_fence(); }
  __syncthreads();
  for (int r = 0; r < 4; ++r) {
    if (w == 0) {
      if (l == 0) slot[r] = r + 1;
      asm volatile("bar.arrive 1, 64;" ::: "memory");
      uint64_t st;
      asm volatile("mbarrier.arrive.shared::cta.b64 %0, [%1];" : "=l"(st) : "r"(su32(&bar)) : "memory");
      uint32_t done = 0;
      while (!done)
        asm volatile("{\n\t.reg .pred p;\n\tmbarrier.test_wait.shared::cta.b64 p, [%1], %2;\n\tselp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(done) : "r"(su32(&bar)), "l"(st) : "memory");
    } else {
      asm volatile("bar.sync 1, 64;" ::: "memory");
      if (l == 0) out[r] = slot[r];
      mbar_arrive(&bar);
      mbar_wait(&bar, r & 1);
    }
  }
}
static void producer_consumer(bool bad) {
  if (bad) { printf("producer_consumer has no bad twin\n"); exit(2); }
  int* d; CK(cudaMalloc(&d, 4 * sizeof(int)));
  k_prodcons<<<1, 64>>>(d);
  int h[4]; CK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
  for (int r = 0; r < 4; ++r) if (h[r] != r + 1) { printf("producer_consumer: out[%d] = %d\n", r, h[r]); exit(1); }
}

// trap: the kernel executes trap (an abort on the GPU).
__global__ void k_trap(int bad) { if (bad) asm volatile("trap;"); }
static void trap(bool bad) { k_trap<<<1, 32>>>(bad); }

// device_assert: assert(false) in a kernel (__assertfail aborts the launch).
__global__ void k_assert(int x) { assert(x == 0); }
static void device_assert(bool bad) { k_assert<<<1, 32>>>(bad); }

CASES({"deadlock_bar", deadlock_bar}, {"deadlock_mbar", deadlock_mbar},
      {"named_barrier_mismatch", named_barrier_mismatch}, {"named_barrier_count", named_barrier_count},
      {"named_barrier_id", named_barrier_id}, {"mbar_overarrive", mbar_overarrive}, {"mbar_tx", mbar_tx},
      {"mbar_uninit", mbar_uninit}, {"mbar_overwrite", mbar_overwrite}, {"warp_sync", warp_sync},
      {"warp_divergence", warp_divergence}, {"shfl_source", shfl_source},
      {"cluster_barrier", cluster_barrier}, {"producer_consumer", producer_consumer}, {"trap", trap}, {"device_assert", device_assert})
