// Regression cases for interpreter bugs a review found (each was reproduced, then fixed); expected
// values worked from the PTX ISA text as cited.
#include "isa.h"

// cp.async.bulk.wait_group.read N (9.7.9.25.4.3): all but the N most recent bulk async-groups have
// finished reading their sources, whatever order the copies complete in. Two groups, wait .read 1,
// then overwrite the OLDER group's source: the bytes it stored must be the old ones (a = 0..31).
__global__ void k_bulkgroup(float* g) {
  __shared__ alignas(128) float a[32], b[32];
  for (int i = 0; i < 32; ++i) { a[i] = i; b[i] = 100 + i; }
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], 128;" :: "l"(g), "r"(su32(a)) : "memory");
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], 128;" :: "l"(g + 32), "r"(su32(b)) : "memory");
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
  asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
  asm volatile("st.shared.f32 [%0], %1;" :: "r"(su32(a)), "f"(-1.f) : "memory");
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}
static void bulkgroup() {
  float* g; CK(cudaMalloc(&g, 256));
  k_bulkgroup<<<1, 1>>>(g);
  float h[64]; CK(cudaMemcpy(h, g, 256, cudaMemcpyDeviceToHost));
  hchk("wait_group.read 1 covers the older group: a[0]", (uint32_t)h[0], 0);
  hchk("older group's data: a[31]", (uint32_t)h[31], 31);
  hchk("newer group's data: b[0]", (uint32_t)h[32], 100);
}

// barrier.cluster (9.7.13.4): arrive, then a CTA barrier, then wait (CUTLASS's pattern) is legal; a
// warp that arrived and exited does not release the barrier before the others arrive.
__global__ void k_clusterexit(int* g) {
  __shared__ int flag;
  int w = threadIdx.x / 32;
  if (threadIdx.x == 0) flag = 0;
  __syncthreads();
  if (w == 0) { asm volatile("barrier.cluster.arrive.aligned;" ::: "memory"); return; }
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
  asm volatile("bar.sync 1, 64;" ::: "memory");   // warps 1 and 2: a barrier between arrive and wait
  if (w == 2) {
    volatile int s = 0;
    for (int i = 0; i < 500; ++i) s = s + i;
  }
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
  if (threadIdx.x == 32) g[0] = 1;
}
static void clusterexit() {
  int* g; CK(cudaMalloc(&g, 4)); CK(cudaMemset(g, 0, 4));
  k_clusterexit<<<1, 96>>>(g);
  int h; CK(cudaMemcpy(&h, g, 4, cudaMemcpyDeviceToHost));
  hchk("arrive; bar.sync; wait completes", h, 1);
}

// cp.async with the ignore-src predicate (9.7.9.25.3.1): p true -> zero fill, false -> copy.
__global__ void k_ignoresrc(const uint32_t* src) {
  __shared__ alignas(16) uint32_t s[2];
  s[0] = s[1] = 0xdeadbeef;
  asm volatile("{ .reg .pred p; setp.ne.u32 p, %2, 0;\n cp.async.ca.shared.global [%0], [%1], 4, p; }"
               :: "r"(su32(s)), "l"(src), "r"(0u) : "memory");
  asm volatile("{ .reg .pred p; setp.ne.u32 p, %2, 0;\n cp.async.ca.shared.global [%0], [%1], 4, p; }"
               :: "r"(su32(s + 1)), "l"(src), "r"(1u) : "memory");
  asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;" ::: "memory");
  chk("ignore-src false copies", s[0], 0x12345678);
  chk("ignore-src true zero-fills", s[1], 0);
}
static void ignoresrc() {
  uint32_t* g; CK(cudaMalloc(&g, 16));
  uint32_t v = 0x12345678; CK(cudaMemcpy(g, &v, 4, cudaMemcpyHostToDevice));
  k_ignoresrc<<<1, 1>>>(g);
}

// setp.f16x2 / bf16x2 (9.7.4.4): p compares the lower halves, q the upper halves.
// add.u16x2 / .s16x2 (9.7.1.1, sm_90): lanes wrap without carrying into each other.
// max.xorsign.abs.f16 (9.7.4.8): max(|a|,|b|) with the sign of a xor b: max(-2, 1) -> -2 (0xc000).
__global__ void k_packed() {
  uint32_t a = 0x3c00 | (0x4200u << 16), b = 0x4000 | (0x4000u << 16);   // lo 1 < 2; hi 3 > 2
  uint32_t p, q;
  asm volatile("{ .reg .pred p, q; setp.lt.f16x2 p|q, %2, %3; selp.u32 %0, 1, 0, p; selp.u32 %1, 1, 0, q; }"
               : "=r"(p), "=r"(q) : "r"(a), "r"(b));
  chk("setp.lt.f16x2 p (lo 1<2)", p, 1);
  chk("setp.lt.f16x2 q (hi 3<2)", q, 0);
  uint32_t ab = 0x3f80 | (0x4040u << 16), bb = 0x4000 | (0x4000u << 16);   // bf16: lo 1 < 2; hi 3 > 2
  asm volatile("{ .reg .pred p, q; setp.lt.bf16x2 p|q, %2, %3; selp.u32 %0, 1, 0, p; selp.u32 %1, 1, 0, q; }"
               : "=r"(p), "=r"(q) : "r"(ab), "r"(bb));
  chk("setp.lt.bf16x2 p", p, 1);
  chk("setp.lt.bf16x2 q", q, 0);
  uint32_t r;
  asm volatile("add.u16x2 %0, %1, %2;" : "=r"(r) : "r"(0x0001ffffu), "r"(0x00000001u));
  chk("add.u16x2 no carry", r, 0x00010000);
  asm volatile("add.s16x2 %0, %1, %2;" : "=r"(r) : "r"(0x7fff0001u), "r"(0x00010001u));
  chk("add.s16x2 wraps per lane", r, 0x80000002);
  uint16_t x;
  asm volatile("{ .reg .b16 a, b; mov.b16 a, 0xc000; mov.b16 b, 0x3c00; max.xorsign.abs.f16 %0, a, b; }" : "=h"(x));
  chk("max.xorsign.abs.f16(-2, 1)", x, 0xc000);
}
static void packed() { k_packed<<<1, 1>>>(); }

// cp.reduce.async.bulk.shared::cluster.shared::cta...add.u32 (9.7.9.25.4.2): dst += src.
__global__ void k_s2sreduce(uint32_t* out) {
  __shared__ alignas(128) uint32_t d[4], s[4];
  __shared__ alignas(8) uint64_t bar;
  for (int i = 0; i < 4; ++i) { d[i] = 10; s[i] = 5; }
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(su32(&bar)) : "memory");
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], 16;" :: "r"(su32(&bar)) : "memory");
  asm volatile("cp.reduce.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes.add.u32 [%0], [%1], 16, [%2];"
               :: "r"(su32(d)), "r"(su32(s)), "r"(su32(&bar)) : "memory");
  asm volatile("{ .reg .pred P; W: mbarrier.try_wait.parity.shared::cta.b64 P, [%0], 0; @!P bra W; }"
               :: "r"(su32(&bar)) : "memory");
  chk("cp.reduce.async.bulk s2s add.u32", d[0], 15);
}
static void s2sreduce() { uint32_t* o; CK(cudaMalloc(&o, 4)); k_s2sreduce<<<1, 1>>>(o); }

FAMILIES({"bulkgroup", bulkgroup}, {"clusterexit", clusterexit}, {"ignoresrc", ignoresrc}, {"packed", packed},
         {"s2sreduce", s2sreduce})
