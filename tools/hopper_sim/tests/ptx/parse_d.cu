#include <cstdint>
__global__ void kw(float* out, uint64_t da, uint64_t db, const void* tmap) {
  __shared__ alignas(128) float smem[64 * 8 * 2];
  __shared__ alignas(8) uint64_t mbar;
  uint32_t sb = (uint32_t)__cvta_generic_to_shared(&mbar);
  uint32_t sd = (uint32_t)__cvta_generic_to_shared(smem);
  float d[4] = {0, 0, 0, 0};
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(sb), "r"(1));
    asm volatile("fence.mbarrier_init.release.cluster;");
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(sb), "r"(4096));
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
                 :: "r"(sd), "l"(tmap), "r"(0), "r"(0), "r"(sb) : "memory");
  }
  asm volatile("{\n.reg .pred P1;\nWAIT:\nmbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n@!P1 bra.uni WAIT;\n}" :: "r"(sb), "r"(0));
  asm volatile("wgmma.fence.sync.aligned;");
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n8k8.f32.tf32.tf32 {%0, %1, %2, %3}, %4, %5, p, 1, 1;\n}"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "l"(da), "l"(db), "r"(1));
  asm volatile("wgmma.commit_group.sync.aligned;");
  asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(0));
  asm volatile("stmatrix.sync.aligned.x4.m8n8.shared.b16 [%0], {%1, %2, %3, %4};" :: "r"(sd), "r"(1), "r"(2), "r"(3), "r"(4));
  uint32_t r0, r1, r2, r3;
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];" : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(sd));
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];" :: "l"(tmap), "r"(0), "r"(0), "r"(sd) : "memory");
  asm volatile("cp.async.bulk.commit_group;");
  asm volatile("cp.async.bulk.wait_group.read 0;");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 240;");
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;");
  asm volatile("{ .reg .pred p; elect.sync _|p, 0xffffffff; }");
  out[threadIdx.x] = d[0] + d[1] + d[2] + d[3] + r0 + r1 + r2 + r3;
}
