// Self-test of the hang-diagnosis wrappers (csrc/flash3/common/debug_hang.cuh) on a Hopper GPU,
// so that a hang report from the debug build can be trusted. tools/device/device_check.sh runs both modes.
//
//   debug_hang_selftest sync   the emulated named barriers in the kernel's two patterns, 132 CTAs:
//                              pingpong between two consumer warpgroups (256 threads, ids 0/1) and
//                              the producer-warp -> consumers tile handoff (288 threads, ids 2/3);
//                              every round checks the other side's shared-memory write. Exit 0.
//   debug_hang_selftest hang mbar|named   an mbarrier that never completes (warpgroup 1), or a
//                              named barrier with no partner (warpgroup 2): the launch must fail
//                              and the stuck warps must have printed their "flash3 hang: ..." line
//                              (read back from stdout). One kind per process (see hang_kernel).
//
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 --expt-relaxed-constexpr -Icsrc
//        -I$CUTLASS/include tools/build/debug_hang_selftest.cu -o build/debug_hang_selftest
#define FLASH3_DEBUG_HANG 1
#define FLASH3_HANG_CYCLES (1ll << 27)  // ~70 ms: the hang mode waits on purpose

#include <cstdio>
#include <cstring>
#include <string>

#include <unistd.h>

#include "flash3/common/barriers.cuh"

using flash3::Wait;

__global__ void __launch_bounds__(384, 1) sync_kernel(int* errors, int rounds) {
  __shared__ int pingpong_value, slot;
  flash3::debug_hang_init(blockDim.x);
  if (threadIdx.x == 0) pingpong_value = -1;
  __syncthreads();
  const int wg = threadIdx.x / 128, lead = threadIdx.x % 128 == 0;
  if (wg == 0) {  // the producer: one warp posts tiles, the other three leave (as in the kernel)
    if (threadIdx.x >= 32) return;
    for (int r = 0; r < rounds; ++r) {
      if (r > 0) flash3::named_sync(288, 3, Wait::TileEmpty, r);
      if (threadIdx.x == 0) slot = r;
      flash3::named_arrive(288, 2);
    }
    return;
  }
  const int c = wg - 1;  // consumer 0 or 1
  for (int r = 0; r < rounds; ++r) {
    flash3::named_sync(288, 2, Wait::TileFull, r);
    if (slot != r) atomicAdd(errors, 1);
    if (r + 1 < rounds) flash3::named_arrive(288, 3);
  }
  if (c == 1) flash3::named_arrive(256, 0);  // pingpong start: release consumer 0
  for (int r = 0; r < rounds; ++r) {
    flash3::named_sync(256, c, Wait::Pingpong, r);
    if (lead) {
      if (pingpong_value != 2 * r + c - 1) atomicAdd(errors, 1);
      pingpong_value = 2 * r + c;
    }
    flash3::named_arrive(256, 1 - c);
  }
}

// kind 0: warpgroup 1 waits on an mbarrier that never completes; kind 1: warpgroup 2 on a named
// barrier with no partner. One kind per process: the first bounded wait to expire traps, which
// ends the grid (and the CUDA context) before another warp's report is guaranteed to be printed
// (seen on an H200: only the named-barrier line came out when both waited in one launch).
__global__ void __launch_bounds__(384, 1) hang_kernel(int kind) {
  __shared__ alignas(8) uint64_t never;
  flash3::debug_hang_init(blockDim.x);
  if (threadIdx.x == 0) cutlass::arch::ClusterBarrier::init(&never, 1);
  cutlass::arch::fence_barrier_init();
  __syncthreads();
  const int wg = threadIdx.x / 128;
  if (kind == 0 && wg == 1) flash3::mbarrier_wait(&never, 0, Wait::KFull, 7);
  if (kind == 1 && wg == 2) flash3::named_sync(256, 0, Wait::Pingpong, 7);
}

int main(int argc, char** argv) {
  const bool hang = argc > 1 && std::strcmp(argv[1], "hang") == 0;
  const int kind = argc > 2 && std::strcmp(argv[2], "named") == 0 ? 1 : 0;  // hang [mbar|named]
  if (hang) {  // device printf goes to fd 1: point it at a file for the launch, then read it
    std::fflush(stdout);
    FILE* cap = std::tmpfile();
    const int saved = dup(1);
    dup2(fileno(cap), 1);
    hang_kernel<<<1, 384>>>(kind);
    cudaError_t e = cudaDeviceSynchronize();
    std::fflush(stdout);
    dup2(saved, 1);
    std::string text(1 << 16, '\0');
    std::rewind(cap);
    text.resize(std::fread(&text[0], 1, text.size(), cap));
    std::fputs(text.c_str(), stdout);
    const bool lines = text.find(kind == 0 ? "warpgroup 1 thread 128 waits on KFull phase 0 tile 7"
                                           : "warpgroup 2 thread 256 waits on Pingpong phase 0 tile 7") != text.npos;
    std::printf("debug_hang_selftest hang %s: launch %s (%s), hang lines %s\n", kind == 0 ? "mbar" : "named",
                e == cudaSuccess ? "SUCCEEDED" : "failed", cudaGetErrorString(e), lines ? "found" : "MISSING");
    return e != cudaSuccess && lines ? 0 : 1;
  }
  int* errors = nullptr;
  cudaMalloc(&errors, sizeof(int));
  cudaMemset(errors, 0, sizeof(int));
  const int rounds = 2000;
  sync_kernel<<<132, 384>>>(errors, rounds);
  cudaError_t e = cudaDeviceSynchronize();
  int h = -1;
  if (e == cudaSuccess) cudaMemcpy(&h, errors, sizeof(int), cudaMemcpyDeviceToHost);
  std::printf("debug_hang_selftest sync: %s, %d ordering errors in 132 CTAs x %d rounds\n",
              cudaGetErrorString(e), h, rounds);
  return e == cudaSuccess && h == 0 ? 0 : 1;
}
