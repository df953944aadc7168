#include <cassert>
#include <cstdio>
__device__ int table_sel(int s, int* p) {
  switch (s) { case 0: return p[3]; case 1: return p[7]*2; case 2: return p[1]+5; case 3: return p[9]^3; case 4: return p[2]-1;
    case 5: return p[4]*p[5]; case 6: return p[6]; case 7: return p[8]<<2; case 8: return p[0]>>1; case 9: return ~p[1];
    case 10: return p[11]; case 11: return p[12]+p[13]; default: return -1; }
}
__global__ void ke(int* p, int s) {
  assert(p != nullptr);
  int v = table_sel(s, p);
  if (v == 12345) __trap();
  __syncwarp();
  __shared__ int sh[32];
  atomicAdd_block(&sh[threadIdx.x & 31], v);
  atomicOr_system(p + 20, v);
  unsigned short us = atomicCAS((unsigned short*)p + 50, (unsigned short)1, (unsigned short)2);
  __syncthreads();
  p[threadIdx.x] = sh[threadIdx.x & 31] + us + __reduce_add_sync(0xffffffff, v) + __activemask();
  printf("%d %lld %f %c\n", v, (long long)p, 1.0, 'x');
}
