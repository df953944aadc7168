// The hang-diagnosis build (nvcc -DFLASH3_DEBUG_HANG=1; included by barriers.cuh instead of the
// release wrappers). Same four functions, but no wait can last forever: a wait still pending after
// FLASH3_HANG_CYCLES SM cycles (default 2^31, ~1 s) prints, from one lane per stuck warp,
//   flash3 hang: block B warpgroup W thread T waits on NAME phase P tile I
// then spins a grace period (so every other stuck warp reports too) and traps: the launch fails
// with an error instead of freezing the GPU, and the lines name who waits on which barrier.
//
// Named barriers: bar.sync cannot be polled, so they are emulated with one counter per id in
// static shared memory (16 words). As in hardware, a warp's arrival counts 32 threads. The counter
// never resets: a sync takes a ticket (the count before its warp's arrival) and waits until the
// count reaches the end of the ticket's round, (ticket / n + 1) * n. With no reset there is no
// window in which an early arrival for the next round could be lost (fine for < 2^32 / n
// arrivals per CTA and launch). Release/acquire: __syncwarp + fence before the arrival, fence after
// the wait, as bar.sync orders memory among its participants.
//
// Costs: 64 B of static shared memory (ptxas reports 1 KB: the kernel's 1 KB-aligned dynamic
// buffer starts after it; hdim 256 then needs 225 + 1 of the 227 KB). The slow path is a call, so
// ptxas serializes wgmma (advisory C7510) and keeps a stack frame and a few spills (hdim 128:
// 76/148 B): timing differs from the release build; use it to name a hang, not to time. Checked
// by `make hang-build-check` (compile) and tools/build/debug_hang_selftest.cu (on a GPU).
#pragma once

#include <cstdint>
#include <cstdio>

#include <cutlass/arch/barrier.h>

#ifndef FLASH3_HANG_CYCLES
#define FLASH3_HANG_CYCLES (1ll << 31)
#endif

namespace flash3 {
namespace debug_hang {

constexpr uint32_t kMaxIds = 16;          // named-barrier ids the kernels use are < 16
constexpr unsigned kMaxReports = 64;      // lines per loaded module: enough to see every role
constexpr long long kGraceCycles = 1ll << 28;

static __device__ unsigned reports;  // static: one per TU, no clash when TUs link into one .so

__device__ __forceinline__ unsigned* counters() {
  __shared__ unsigned count[kMaxIds];
  return count;
}

__device__ __forceinline__ const char* wait_name(int w) {
  switch (Wait(w)) {
    case Wait::QFull: return "QFull";
    case Wait::QFree: return "QFree";
    case Wait::OFree: return "OFree";
    case Wait::KFull: return "KFull";
    case Wait::KEmpty: return "KEmpty";
    case Wait::VFull: return "VFull";
    case Wait::VEmpty: return "VEmpty";
    case Wait::VTail: return "VTail";
    case Wait::Pingpong: return "Pingpong";
    case Wait::Epilogue: return "Epilogue";
    case Wait::TileFull: return "TileFull";
    case Wait::TileEmpty: return "TileEmpty";
    case Wait::KVFull: return "KVFull";
    case Wait::QEmpty: return "QEmpty";
    case Wait::DoFull: return "DoFull";
    case Wait::DoEmpty: return "DoEmpty";
    case Wait::DsReady: return "DsReady";
    case Wait::DqFull: return "DqFull";
    case Wait::DqEmpty: return "DqEmpty";
    case Wait::Gather: return "Gather";
    case Wait::RowTail: return "RowTail";
    case Wait::PFull: return "PFull";
    case Wait::PEmpty: return "PEmpty";
  }
  return "named barrier id >= 16 (debug_hang.cuh kMaxIds)";
}

// The slow path, out of line and never returning: a call that does not return needs no registers
// saved around it, which keeps setmaxnreg and most of the release build's register allocation.
// static: each TU its own copy (the host stub of an external one clashed when the extension's
// kernel TUs linked: the H200, 2026-11-30; `make hang-build-check` links two TUs since).
[[noreturn]] static __device__ __noinline__ void expire(int what, uint32_t phase, int tile) {
  const bool report = int(threadIdx.x & 31) == __ffs(__activemask()) - 1;  // a lane per warp
  if (report && atomicAdd(&reports, 1u) < kMaxReports)
    printf("flash3 hang: block %d warpgroup %d thread %d waits on %s phase %u tile %d\n",
           int(blockIdx.x), int(threadIdx.x / 128), int(threadIdx.x), wait_name(what), phase, tile);
  const long long t0 = clock64();
  while (clock64() - t0 < kGraceCycles) {  // let the other stuck warps report too
  }
  __trap();
}

// The bounded loops are single asm statements, like CUTLASS's unbounded wait: no C++ loop at each
// of the ~40 wait sites (loops there made cicc several times slower). They return 1 on timeout.
__device__ __forceinline__ uint32_t mbarrier_wait_bounded(uint64_t const* bar, uint32_t phase) {
  uint32_t expired;
  asm volatile(
      "{\n\t"
      ".reg .pred p;\n\t"
      ".reg .u64 t0, t;\n\t"
      "mov.u64 t0, %%clock64;\n\t"
      "LAB_WAIT:\n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
      "@p bra DONE;\n\t"
      "mov.u64 t, %%clock64;\n\t"
      "sub.u64 t, t, t0;\n\t"
      "setp.lt.u64 p, t, %3;\n\t"
      "@p bra LAB_WAIT;\n\t"
      "DONE:\n\t"
      "selp.u32 %0, 0, 1, p;\n\t"
      "}"
      : "=r"(expired)
      : "r"(cute::cast_smem_ptr_to_uint(bar)), "r"(phase), "l"(FLASH3_HANG_CYCLES));
  return expired;
}

// Spins until the emulated barrier's count has reached `target` (wrapping compare).
__device__ __forceinline__ uint32_t count_wait_bounded(unsigned const* count, unsigned target) {
  uint32_t expired;
  asm volatile(
      "{\n\t"
      ".reg .pred p;\n\t"
      ".reg .u64 t0, t;\n\t"
      ".reg .u32 c;\n\t"
      "mov.u64 t0, %%clock64;\n\t"
      "LAB_SPIN:\n\t"
      "ld.volatile.shared.u32 c, [%1];\n\t"
      "sub.u32 c, c, %2;\n\t"
      "setp.ge.s32 p, c, 0;\n\t"
      "@p bra DONE;\n\t"
      "mov.u64 t, %%clock64;\n\t"
      "sub.u64 t, t, t0;\n\t"
      "setp.lt.u64 p, t, %3;\n\t"
      "@p bra LAB_SPIN;\n\t"
      "DONE:\n\t"
      "selp.u32 %0, 0, 1, p;\n\t"
      "}"
      : "=r"(expired)
      : "r"(cute::cast_smem_ptr_to_uint(count)), "r"(target), "l"(FLASH3_HANG_CYCLES));
  return expired;
}

// This warp's arrival on emulated barrier `id`; returns the count before it (the ticket).
__device__ __forceinline__ unsigned warp_arrive(uint32_t id) {
  if (id >= kMaxIds) expire(-1, id, -1);
  const unsigned mask = __activemask();
  const int leader = __ffs(mask) - 1;
  __syncwarp(mask);  // the warp's earlier writes happen before the leader's arrival
  unsigned ticket = 0;
  if (int(threadIdx.x & 31) == leader) {
    __threadfence_block();  // release
    ticket = atomicAdd(&counters()[id], 32u);
  }
  return __shfl_sync(mask, ticket, leader);
}

}  // namespace debug_hang

__device__ __forceinline__ void mbarrier_wait(uint64_t const* bar, uint32_t phase, Wait what, int tile) {
  if (debug_hang::mbarrier_wait_bounded(bar, phase)) debug_hang::expire(int(what), phase, tile);
  asm volatile("" ::: "memory");  // as the release build: later smem accesses stay after the wait
}

__device__ __forceinline__ void named_sync(uint32_t num_threads, uint32_t id, Wait what, int tile) {
  const unsigned ticket = debug_hang::warp_arrive(id);
  const unsigned round = ticket / num_threads;  // completes when the count reaches (round + 1) * n
  if (debug_hang::count_wait_bounded(&debug_hang::counters()[id], (round + 1) * num_threads))
    debug_hang::expire(int(what), round, tile);
  __threadfence_block();  // acquire: the other participants' writes before their arrival
}

__device__ __forceinline__ void named_arrive(uint32_t /*num_threads*/, uint32_t id) {
  debug_hang::warp_arrive(id);
}

// Every thread calls this before the kernel's prologue __syncthreads, which orders the zeroing
// before any barrier use.
__device__ __forceinline__ void debug_hang_init(int /*num_threads*/) {
  if (threadIdx.x == 0)
    for (uint32_t i = 0; i < debug_hang::kMaxIds; ++i) debug_hang::counters()[i] = 0;
}

}  // namespace flash3
