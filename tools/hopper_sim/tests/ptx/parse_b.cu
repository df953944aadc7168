#include <cstdint>
struct Base { __device__ virtual int f(int x) { return x + 1; } };
struct Der : Base { __device__ int f(int x) override { return x * 3; } };
__device__ int (*fp)(int);
__device__ int twice(int x) { return 2 * x; }
__device__ int (*fptab[2])(int) = {twice, twice};
__global__ void kv(int* out, int sel) {
  Base b; Der d; Base* p = sel ? (Base*)&d : &b;
  out[0] = p->f(out[1]);
  out[2] = fptab[sel & 1](out[3]);
}
__global__ void ka(uint64_t* out, uint32_t a) {
  uint32_t lo, hi; uint64_t v = out[0];
  asm volatile("mov.b64 {%0, _}, %2;\n\tmov.b64 {_, %1}, %2;" : "=r"(lo), "=r"(hi) : "l"(v));
  asm volatile("{\n .reg .b64 t;\n mov.b64 t, {%0, %1};\n st.global.u64 [%2+-16], t;\n}" :: "r"(lo), "r"(hi), "l"(out + 4));
  float f; asm volatile("mov.f32 %0, 1.5;" : "=f"(f));
  asm volatile("add.f32 %0, %0, 0fBF800000;" : "+f"(f));
  double dd; asm volatile("mov.f64 %0, 0d3FF0000000000000;" : "=d"(dd));
  uint32_t o; asm volatile("mov.b32 %0, 0x1234;\n\tadd.u32 %0, %0, 017;\n\tadd.u32 %0, %0, 0b101;\n\tadd.u32 %0, %0, 0xFFFFFFFF;" : "=r"(o));
  asm volatile("ld.local.u32 %0, [0x10];" : "=r"(o));
  out[1] = lo + hi + (uint64_t)f + (uint64_t)dd + o;
  __shared__ alignas(8) uint64_t bar;
  uint32_t sb = (uint32_t)__cvta_generic_to_shared(&bar);
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(sb), "r"(1));
  asm volatile("{\n .reg .pred P1;\n LAB_WAIT:\n mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n @!P1 bra LAB_WAIT;\n}" :: "r"(sb), "r"(0));
  asm volatile("{\n .reg .pred P1;\n LAB_WAIT:\n mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n @!P1 bra.uni LAB_WAIT;\n}" :: "r"(sb), "r"(1));
  asm volatile("fence.proxy.async.shared::cta;");
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], 16, [%2];" :: "r"(sb), "l"(out), "r"(sb));
  asm volatile("wgmma.fence.sync.aligned;");
}
