#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
#include <cuda/barrier>
namespace cg = cooperative_groups;
__global__ void __cluster_dims__(2,1,1) kc(float* out, const __half2* h, const __nv_bfloat16* b, int n) {
  extern __shared__ __align__(16) unsigned char smem[];
  cg::cluster_group cl = cg::this_cluster();
  float* s = (float*)smem;
  unsigned r = cl.block_rank();
  s[threadIdx.x] = r;
  cl.sync();
  float* peer = cl.map_shared_rank(s, r ^ 1);
  __half2 x = h[threadIdx.x];
  x = __hmul2(x, x);
  float v = __low2float(x) + __high2float(x) + __bfloat162float(b[threadIdx.x]) + peer[threadIdx.x];
  cl.sync();
  auto warp = cg::tiled_partition<32>(cg::this_thread_block());
  v = cg::reduce(warp, v, cg::plus<float>());
  atomicAdd((int*)&s[1], 1);
  unsigned long long m = __match_any_sync(0xffffffff, (int)v);
  if (__any_sync(0xffffffff, v > 1.f) && __all_sync(0xffffffff, n > 0)) out[threadIdx.x] = v + m + __popc(n) + __clz(n) + __brev(n) + __ffs(n);
  out[blockIdx.x] = sqrtf(v) + __expf(v) + rsqrtf(v) + __sinf(v) + log2f(v) + fmaxf(v, 1.0f) + (float)__double2float_rn((double)v / 3.0);
  __nanosleep(100);
  __threadfence(); __threadfence_block();
  out[2] = __fdividef(v, 3.0f) + __ldg(out+3) + __int_as_float(0x7f800000) + (v != v ? 1.0f : -0.0f);
}
