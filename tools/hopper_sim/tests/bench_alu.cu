#include <cstdio>
#include <chrono>
// ALU-heavy: integer hash + float FMA chain per thread.
__global__ void alu(unsigned* out, int iters) {
  unsigned x = threadIdx.x + blockIdx.x * blockDim.x;
  float f = x * 0.5f;
  for (int i = 0; i < iters; ++i) {
    x = x * 1664525u + 1013904223u;
    x ^= x >> 13;
    f = fmaf(f, 0.999f, (float)(x & 255));
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = x + (unsigned)f;
}
int main(int argc, char** argv) {
  int iters = argc > 1 ? atoi(argv[1]) : 2000;
  unsigned* o; cudaMalloc(&o, 4 * 256 * 8);
  auto t0 = std::chrono::steady_clock::now();
  alu<<<8, 256>>>(o, iters);
  cudaDeviceSynchronize();
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  printf("%.3f s\n", s);
  return 0;
}
