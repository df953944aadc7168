// Exercises the host runtime paths the simulator's libcudart must handle: cudaMalloc, memcpy,
// a <<<>>> launch, cudaLaunchKernelEx with a cluster dimension, cudaFuncSetAttribute,
// cudaMemcpyToSymbol / cudaGetSymbolAddress. Prints what it checks; exits non-zero on an error.
#include <cstdio>
#include <cuda_runtime.h>

__device__ int g_scale;
__constant__ float c_bias[4];

__global__ void axpy(float* y, const float* x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] * g_scale + y[i] + c_bias[0];
}

struct Pod { int a; double b; char c[3]; };

__global__ void __cluster_dims__(1, 1, 1) clustered(int* out, Pod p, long long q) {
  extern __shared__ int smem[];
  smem[threadIdx.x] = p.a + (int)q;
  __syncthreads();
  out[blockIdx.x * blockDim.x + threadIdx.x] = smem[threadIdx.x];
}

__global__ void plain_cluster(int* out, int v) { out[blockIdx.x] = v; }

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { \
  printf("%s failed: %s (%s)\n", #x, cudaGetErrorString(e), cudaGetErrorName(e)); return 1; } } while (0)

int main() {
  int n = 1000;
  float *x, *y;
  CK(cudaMalloc(&x, n * sizeof(float)));
  CK(cudaMalloc(&y, n * sizeof(float)));
  float h[1000];
  for (int i = 0; i < n; ++i) h[i] = i;
  CK(cudaMemcpy(x, h, n * sizeof(float), cudaMemcpyHostToDevice));
  CK(cudaMemset(y, 0, n * sizeof(float)));
  int scale = 3;
  CK(cudaMemcpyToSymbol(g_scale, &scale, sizeof(int)));
  float bias[4] = {0.5f, 0, 0, 0};
  CK(cudaMemcpyToSymbol(c_bias, bias, sizeof(bias)));
  void* sym = nullptr;
  CK(cudaGetSymbolAddress(&sym, g_scale));
  printf("g_scale symbol at %p\n", sym);

  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("device %s cc %d.%d sms %d optin smem %zu\n", prop.name, prop.major, prop.minor,
         prop.multiProcessorCount, prop.sharedMemPerBlockOptin);

  printf("launch axpy x=%p y=%p\n", (void*)x, (void*)y);
  axpy<<<(n + 255) / 256, 256>>>(y, x, 2.0f, n);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());

  int* out;
  CK(cudaMalloc(&out, 4096 * sizeof(int)));
  CK(cudaFuncSetAttribute(clustered, cudaFuncAttributeMaxDynamicSharedMemorySize, 100000));
  cudaError_t bad = cudaFuncSetAttribute(clustered, cudaFuncAttributeMaxDynamicSharedMemorySize, 300000);
  printf("smem 300000 -> %s\n", cudaGetErrorName(bad));
  cudaGetLastError();  // clear the sticky-free last error
  Pod p{7, 2.5, {1, 2, 3}};
  clustered<<<4, 128, 100000>>>(out, p, 1234567890123LL);
  CK(cudaGetLastError());

  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(8, 2, 1);
  cfg.blockDim = dim3(64, 1, 1);
  cfg.dynamicSmemBytes = 0;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 2; attr[0].val.clusterDim.y = 1; attr[0].val.clusterDim.z = 1;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 2;
  CK(cudaLaunchKernelEx(&cfg, plain_cluster, out, 42));

  int blocks = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, axpy, 256, 0));
  printf("occupancy axpy 256 threads: %d\n", blocks);

  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
  CK(cudaEventRecord(e0)); CK(cudaEventRecord(e1)); CK(cudaEventSynchronize(e1));
  float ms = -1; CK(cudaEventElapsedTime(&ms, e0, e1));
  printf("event elapsed %s\n", ms >= 0 ? "ok" : "bad");

  CK(cudaMemcpy(h, y, n * sizeof(float), cudaMemcpyDeviceToHost));
  int bad_count = 0;
  for (int i = 0; i < n; ++i)
    if (h[i] != 2.0f * i * 3 + 0.5f) ++bad_count;
  printf("axpy: y[10] = %g (expect 60.5), %d mismatches\n", h[10], bad_count);
  int ho[4096];
  CK(cudaMemcpy(ho, out, 4096 * sizeof(int), cudaMemcpyDeviceToHost));
  int expect_c = 7 + (int)1234567890123LL;
  int bad_c = 0;
  for (int i = 8; i < 4 * 128; ++i) bad_c += ho[i] != expect_c;
  for (int i = 0; i < 8; ++i) bad_c += ho[i] != 42;
  printf("clustered/plain_cluster: %d mismatches\n", bad_c);
  if (bad_count || bad_c) return 1;
  CK(cudaFree(x)); CK(cudaFree(y)); CK(cudaFree(out));
  printf("done\n");
  return 0;
}
