// mbarrier phase sequences, named barriers, and a 2-CTA cluster barrier with DSMEM reads. `sync FAMILY`.
// Expected values are worked by hand from the PTX ISA: 9.7.13.15 mbarrier (phase completes when the
// pending arrival count and the tx-count both reach zero; then the phase advances and the pending count
// resets to the expected count; test_wait/try_wait with a state token report whether the phase the token
// was taken in has completed; .parity P refers to the current phase if its parity is P, otherwise to the
// immediately preceding phase, which has completed; arrive_drop also lowers the expected count of later
// phases), 9.7.13.1 bar/barrier (bar.sync/bar.arrive with a thread count; bar.red), 9.7.13.3
// barrier.cluster and 9.7.9.x mapa / ld.shared::cluster.
#include "isa.h"

__device__ __forceinline__ uint32_t tw_parity(uint64_t* b, uint32_t par) {
  uint32_t r;
  asm volatile("{.reg .pred p; mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p;}" : "=r"(r) : "r"(su32(b)), "r"(par) : "memory");
  return r;
}
__device__ __forceinline__ uint32_t try_parity(uint64_t* b, uint32_t par) {
  uint32_t r;
  asm volatile("{.reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, 0; selp.u32 %0, 1, 0, p;}" : "=r"(r) : "r"(su32(b)), "r"(par) : "memory");
  return r;
}
__device__ __forceinline__ uint32_t tw_state(uint64_t* b, uint64_t st) {
  uint32_t r;
  asm volatile("{.reg .pred p; mbarrier.test_wait.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p;}" : "=r"(r) : "r"(su32(b)), "l"(st) : "memory");
  return r;
}
__device__ __forceinline__ uint64_t arrive(uint64_t* b) {
  uint64_t s; asm volatile("mbarrier.arrive.shared::cta.b64 %0, [%1];" : "=l"(s) : "r"(su32(b)) : "memory"); return s;
}
__device__ __forceinline__ uint64_t arrive_n(uint64_t* b, uint32_t n) {
  uint64_t s; asm volatile("mbarrier.arrive.shared::cta.b64 %0, [%1], %2;" : "=l"(s) : "r"(su32(b)), "r"(n) : "memory"); return s;
}
__device__ __forceinline__ void expect_tx(uint64_t* b, uint32_t n) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" :: "r"(su32(b)), "r"(n) : "memory");
}
__device__ __forceinline__ void complete_tx(uint64_t* b, uint32_t n) {
  asm volatile("mbarrier.complete_tx.relaxed.cta.shared::cta.b64 [%0], %1;" :: "r"(su32(b)), "r"(n) : "memory");
}
// Encodes (test_wait.parity 0, test_wait.parity 1) as p0 | p1 << 1.
#define PAR(b) (tw_parity(b, 0) | tw_parity(b, 1) << 1)

// full = 0: only the checks whose answer is "complete" (test_wait returning True), so that a simulator
// whose test_wait blocks on an incomplete phase can still run the phase sequence.
#define CPAR(name, b, want) do { if (full) chk(name, PAR(b), want); \
  else chk(name, tw_parity(b, (want) == 1 ? 0 : 1), 1); } while (0)
#define CFALSE(name, expr) do { if (full) chk(name, expr, 0); } while (0)
__global__ void k_mbarrier(int full) {
  __shared__ alignas(8) uint64_t bar, bar2;
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 2;" :: "r"(su32(&bar)) : "memory");
  // phase 0 (parity 0) in progress: parity 0 -> current, incomplete; parity 1 -> preceding phase, complete
  CPAR("init: parity0/1", &bar, 2);
  chk("init: try_wait.parity 1", try_parity(&bar, 1), 1);
  uint64_t s0 = arrive(&bar);
  CFALSE("ph0 1/2: test_wait(s0)", tw_state(&bar, s0));
  CPAR("ph0 1/2: parity0/1", &bar, 2);
  uint64_t s1 = arrive(&bar);  // completes phase 0
  chk("ph0 done: test_wait(s0)", tw_state(&bar, s0), 1);
  chk("ph0 done: test_wait(s1)", tw_state(&bar, s1), 1);
  CPAR("ph0 done: parity0/1", &bar, 1);
  chk("ph0 done: try_wait.parity 0", try_parity(&bar, 0), 1);
  // phase 1 (parity 1)
  uint64_t s2 = arrive(&bar);
  CFALSE("ph1 1/2: test_wait(s2)", tw_state(&bar, s2));
  chk("ph1 1/2: test_wait(s0) (old phase)", tw_state(&bar, s0), 1);
  CPAR("ph1 1/2: parity0/1", &bar, 1);
  arrive_n(&bar, 1);
  chk("ph1 done: test_wait(s2)", tw_state(&bar, s2), 1);
  CPAR("ph1 done: parity0/1", &bar, 2);
  // phase 2: one arrive with count 2 completes it
  uint64_t s3 = arrive_n(&bar, 2);
  chk("ph2 arrive count 2: test_wait(s3)", tw_state(&bar, s3), 1);
  CPAR("ph2 done: parity0/1", &bar, 1);
  // phase 3: noComplete arrival, pending_count from its state
  uint64_t s4;
  asm volatile("mbarrier.arrive.noComplete.shared::cta.b64 %0, [%1], 1;" : "=l"(s4) : "r"(su32(&bar)) : "memory");
  if (full) {
    uint32_t pc;
    asm volatile("mbarrier.pending_count.b64 %0, %1;" : "=r"(pc) : "l"(s4));
    chk("ph3 noComplete: pending_count", pc, 1);
  }
  CPAR("ph3 1/2: parity0/1", &bar, 1);
  arrive(&bar);
  CPAR("ph3 done: parity0/1", &bar, 2);
  // phase 4 (parity 0): expect_tx 16, both arrivals, tx still pending -> incomplete until complete_tx
  expect_tx(&bar, 16);
  arrive(&bar); arrive(&bar);
  CPAR("ph4 arrivals done, tx 16 pending", &bar, 2);
  complete_tx(&bar, 8);
  CPAR("ph4 tx 8 pending", &bar, 2);
  complete_tx(&bar, 8);
  CPAR("ph4 done", &bar, 1);
  // phase 5 (parity 1): tx reaches zero before the arrivals
  expect_tx(&bar, 8);
  complete_tx(&bar, 8);
  CPAR("ph5 tx 0, 2 arrivals pending", &bar, 1);
  arrive(&bar);
  CPAR("ph5 1 arrival pending", &bar, 1);
  arrive(&bar);
  CPAR("ph5 done", &bar, 2);
  // phase 6 (parity 0): arrive.expect_tx
  uint64_t s6;
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 %0, [%1], 32;" : "=l"(s6) : "r"(su32(&bar)) : "memory");
  arrive(&bar);
  CFALSE("ph6 arrivals done, tx 32", tw_state(&bar, s6));
  complete_tx(&bar, 32);
  chk("ph6 done test_wait(s6)", tw_state(&bar, s6), 1);
  CPAR("ph6 done", &bar, 1);
  // arrive_drop: init 2; drop + arrive completes phase 0; later phases need only 1 arrival
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 2;" :: "r"(su32(&bar2)) : "memory");
  asm volatile("mbarrier.arrive_drop.shared::cta.b64 _, [%0];" :: "r"(su32(&bar2)) : "memory");
  CPAR("drop: ph0 1/2", &bar2, 2);
  arrive(&bar2);
  CPAR("drop: ph0 done", &bar2, 1);
  arrive(&bar2);
  CPAR("drop: ph1 done with 1 arrival", &bar2, 2);
  arrive(&bar2);
  CPAR("drop: ph2 done with 1 arrival", &bar2, 1);
}
static void mbarrier() { k_mbarrier<<<1, 1>>>(1); }
static void mbarrier_done() { k_mbarrier<<<1, 1>>>(0); }

// Two warps: warp 1 writes data then arrives; warp 0 waits with try_wait.parity and reads it.
__global__ void k_mbar_pc(uint32_t* out) {
  __shared__ alignas(8) uint64_t bar;
  __shared__ uint32_t data[32];
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 32;" :: "r"(su32(&bar)) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x >= 32) {
    data[threadIdx.x - 32] = 1000 + threadIdx.x;
    asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];" :: "r"(su32(&bar)) : "memory");
  } else {
    asm volatile("{.reg .pred p; W: mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 p, [%0], 0; @!p bra W;}" :: "r"(su32(&bar)) : "memory");
    out[threadIdx.x] = data[31 - threadIdx.x];
  }
}
static void mbar_pc() {
  uint32_t* d; CK(cudaMalloc(&d, 128));
  k_mbar_pc<<<1, 64>>>(d);
  uint32_t h[32]; CK(cudaMemcpy(h, d, 128, cudaMemcpyDeviceToHost));
  char nm[32];
  for (int i = 0; i < 32; ++i) { snprintf(nm, sizeof nm, "thread%d", i); hchk(nm, h[i], 1000 + 32 + 31 - i); }
}

// ---- bar: warps 0-1 and warps 2-3 sync on separate named barriers with 64 threads; warps 2-3 produce
// and bar.arrive on barrier 3 (128 threads) while warps 0-1 bar.sync on it and consume; bar.red.popc
// counts the predicate over all 128 threads, bar.red.and/or.pred reduce it. ----
__global__ void k_bar(uint32_t* out) {
  __shared__ uint32_t data[128];
  uint32_t tid = threadIdx.x, w = tid / 32;
  data[tid] = 0;
  __syncthreads();
  if (w < 2) asm volatile("bar.sync 1, 64;" ::: "memory");
  else asm volatile("bar.sync 2, 64;" ::: "memory");
  if (w >= 2) {
    data[tid - 64] = 5000 + tid;
    asm volatile("bar.arrive 3, 128;" ::: "memory");
  } else {
    asm volatile("bar.sync 3, 128;" ::: "memory");
    out[tid] = data[tid];
  }
}
__global__ void k_barred(uint32_t* out) {
  uint32_t tid = threadIdx.x;
  uint32_t cnt, all, any;
  asm volatile("{.reg .pred p; setp.eq.u32 p, %1, 0; bar.red.popc.u32 %0, 4, p;}" : "=r"(cnt) : "r"(tid % 3));
  asm volatile("{.reg .pred p, q; setp.lt.u32 p, %1, 200; bar.red.and.pred q, 5, p; selp.u32 %0, 1, 0, q;}" : "=r"(all) : "r"(tid));
  asm volatile("{.reg .pred p, q; setp.eq.u32 p, %1, 77; bar.red.or.pred q, 6, p; selp.u32 %0, 1, 0, q;}" : "=r"(any) : "r"(tid));
  out[128 + tid] = cnt | all << 16 | any << 17;
  asm volatile("{.reg .pred p, q; setp.ne.u32 p, %1, 77; bar.red.and.pred q, 7, p; selp.u32 %0, 1, 0, q;}" : "=r"(all) : "r"(tid));
  out[256 + tid] = all;
}
static void bar() {
  uint32_t* d; CK(cudaMalloc(&d, 384 * 4));
  k_bar<<<1, 128>>>(d);
  uint32_t h[384]; CK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
  char nm[48];
  for (int t = 0; t < 64; ++t) { snprintf(nm, sizeof nm, "bar.arrive data t%d", t); hchk(nm, h[t], 5000 + 64 + t); }
}
static void bar_red() {
  uint32_t* d; CK(cudaMalloc(&d, 384 * 4));
  k_barred<<<1, 128>>>(d);
  uint32_t h[384]; CK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
  char nm[48];
  // popc of (tid % 3 == 0) for tid 0..127: 0,3,...,126 -> 43
  for (int t = 0; t < 128; ++t) { snprintf(nm, sizeof nm, "bar.red popc/and/or t%d", t); hchk(nm, h[128 + t], 43 | 1 << 16 | 1 << 17); }
  for (int t = 0; t < 128; ++t) { snprintf(nm, sizeof nm, "bar.red.and false t%d", t); hchk(nm, h[256 + t], 0); }
}

// ---- cluster: 2 CTAs; each writes 1000 + rank into its shared memory, barrier.cluster.arrive.release
// + wait.acquire, then reads the peer's value through mapa.shared::cluster + ld.shared::cluster. ----
__global__ void __cluster_dims__(2, 1, 1) k_cluster(uint32_t* out) {
  __shared__ uint32_t v[32];
  uint32_t rank, nrank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(nrank));
  v[threadIdx.x] = 1000 + rank * 100 + threadIdx.x;
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
  uint32_t peer = rank ^ 1, addr, x;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(addr) : "r"(su32(&v[31 - threadIdx.x])), "r"(peer));
  asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(x) : "r"(addr) : "memory");
  out[blockIdx.x * 64 + threadIdx.x] = x;
  out[blockIdx.x * 64 + 32 + threadIdx.x] = rank | nrank << 8;
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");   // keep shared memory alive for the peer
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
static void cluster() {
  uint32_t* d; CK(cudaMalloc(&d, 128 * 4));
  k_cluster<<<2, 32>>>(d);
  uint32_t h[128]; CK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
  char nm[48];
  for (int b = 0; b < 2; ++b)
    for (int t = 0; t < 32; ++t) {
      // block b has rank b (cluster of 2 along x)
      snprintf(nm, sizeof nm, "cta%d t%d peer value", b, t); hchk(nm, h[b * 64 + t], 1000 + (b ^ 1) * 100 + (31 - t));
      snprintf(nm, sizeof nm, "cta%d t%d rank/nrank", b, t); hchk(nm, h[b * 64 + 32 + t], (uint32_t)b | 2u << 8);
    }
}

FAMILIES({"mbarrier", mbarrier}, {"mbarrier_done", mbarrier_done}, {"mbar_pc", mbar_pc}, {"bar", bar}, {"bar_red", bar_red},
         {"cluster", cluster})
