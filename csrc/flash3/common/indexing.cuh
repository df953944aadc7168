// Device index helpers every kernel (forward, decode, backward) shares: a sequence's rows in a
// packed tensor, the consumer thread index, and ints hidden from the optimizer.
#pragma once

#include "flash3/common/attn_logic.h"

namespace flash3 {

// Rows [cu[batch], cu[batch + 1]) of a packed tensor of `total` rows, clamped into [0, total]: no
// value in cu_seqlens makes the kernel address rows outside the tensors (a bad one gives a wrong,
// in-bounds result; flash3's validation mode reports it).
__device__ __forceinline__ void packed_rows(const int* cu, int batch, int total, int& offset, int& len) {
  offset = imin(imax(cu[batch], 0), total);
  len = imin(imax(cu[batch + 1], offset), total) - offset;
}

// Index of this thread among the consumer threads (threadIdx.x - 128), read through a volatile asm
// so the compiler recomputes it where it is used: otherwise every thread-dependent address of the
// epilogue is hoisted out of the persistent loop and stays live (spilled) across the mainloop.
__device__ __forceinline__ int consumer_thread_idx() {
  int t;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
  return t - 128;
}

// The same int, hidden from the optimizer: used to recompute per-tile values after the mainloop
// instead of keeping them live (in registers the mainloop needs) across it.
__device__ __forceinline__ int opaque_int(int x) {
  asm volatile("" : "+r"(x));
  return x;
}

}  // namespace flash3
