#include <cstdio>
#include <cuda_fp16.h>
__device__ int gcount = 7;
__device__ float gtab[4] = {1.0f, 2.5f, -3.0f, 0.1f};
__device__ double gd[2] = {1.0, 2.0};
__device__ short gs[3] = {1, -2, 3};
__device__ char gc[5] = "abcd";
__device__ long long gl = -5;
__constant__ int cvals[8] = {1,2,3,4,5,6,7,8};
__device__ int* gptr = &gcount;
struct S { int a; float* p; int* q; };
__device__ S gsarr[2] = {{1, gtab + 1, &gcount}, {2, nullptr, nullptr}};
__device__ __noinline__ int helper(int a, float b) { return a * (int)b + gcount; }
__device__ __noinline__ void vhelper(int* p) { atomicAdd(p, 1); }
extern __shared__ float dyn[];
__global__ void __launch_bounds__(256, 2) k1(float* out, const int* in, int n, float s) {
  __shared__ float tile[128];
  int local[16];
  int t = threadIdx.x + blockIdx.y * blockDim.z;
  for (int i = 0; i < 16; ++i) local[i] = in[(t + i) % n];
  tile[t % 128] = s; dyn[t] = s * 2;
  __syncthreads();
  float v = tile[(t + 1) % 128] + dyn[t ^ 1];
  v += __shfl_xor_sync(0xffffffff, v, 1);
  v += __shfl_down_sync(0xffffffff, v, 2);
  int r = local[in[t] & 15];
  r += helper(r, v);
  vhelper(&gcount);
  atomicAdd(out, v);
  atomicCAS((int*)out + 1, 3, r);
  atomicMax((int*)out + 2, r);
  atomicExch((unsigned long long*)out + 4, 7ull);
  double dd = (double)v * 1.5 + gd[t & 1];
  if (t == 0) printf("hello %d %f %s\n", r, dd, gc);
  out[t] = v + cvals[t & 7] + gtab[t & 3] + gs[t % 3] + (float)gl + *gptr + *gsarr[0].p;
  __half h = __float2half(v); out[t + 1] = __half2float(h * h);
  long long c = clock64(); unsigned e; asm volatile("mov.u32 %0, %%envreg3;" : "=r"(e));
  unsigned gt; asm volatile("mov.u32 %0, %%globaltimer_lo;" : "=r"(gt));
  out[t + 2] = (float)(c + e + gt);
  #pragma unroll 1
  for (int i = 0; i < n; ++i) out[i] += __ballot_sync(0xffffffff, i & 1);
}
__global__ void __cluster_dims__(2,1,1) k2(int* p) {
  unsigned r; asm volatile("mov.u32 %0, %%cluster_ctaid.z;" : "=r"(r));
  unsigned q; asm volatile("{ .reg .pred p; setp.ne.u32 p, %1, 0; selp.u32 %0, 1, 0, p; }" : "=r"(q) : "r"(r));
  unsigned w; asm volatile("{ .reg .pred p; setp.eq.u32 p, %1, 0; selp.u32 %0, 1, 0, !p; }" : "=r"(w) : "r"(r));
  p[threadIdx.x] = r + q + w;
}
__global__ void __maxnreg__(64) k3(int* p, int sel) {
  switch (sel) { case 0: p[0] = 1; break; case 1: p[1]=4; break; case 2: p[5]=9; break; case 3: p[3]=2; break; case 4: p[7]=3; break; case 5: p[2] = 11; break; case 6: p[9]=1; break; case 7: p[11]=2; break; default: break; }
}
