// Every wait a kernel does goes through these wrappers, so one build switch can bound them all.
//
// Release builds: the plain mbarrier / named-barrier instructions (nothing added).
// FLASH3_DEBUG_HANG=1 builds (tools/device/device_check.sh makes one when a smoke launch hangs): every
// wait is bounded with clock64; on expiry the waiting thread prints block, warpgroup, barrier,
// phase and tile, then traps, so a hang names its barrier instead of freezing the GPU. Named
// barriers (bar.sync cannot be polled) are emulated there by counters in static shared memory (a
// ticket barrier counting 32 per warp, as the hardware does); see debug_hang.cuh.
#pragma once

#include <cstdint>

#include <cutlass/arch/barrier.h>

namespace flash3 {

// What a wait is for: printed by the hang-diagnosis build.
enum class Wait : int {
  QFull,       // consumers: Q of the tile has landed
  QFree,       // producer: consumers are done reading Q of the previous tile
  OFree,       // producer: the previous epilogue no longer needs V's buffer (O staging)
  KFull,       // consumers: a K stage has landed
  KEmpty,      // producer: a K stage was released
  VFull,       // consumers: a V stage has landed
  VEmpty,      // producer: a V stage was released
  VTail,       // producer: its own V load landed (kv-cache tail zeroing)
  Pingpong,    // consumers: our turn to issue GEMMs
  Epilogue,    // consumers: all warpgroups reached the epilogue step
  TileFull,    // consumers: the producer posted the next tile (dynamic scheduler)
  TileEmpty,   // producer: consumers read the previous tile index (dynamic scheduler)
  // Backward (bwd/kernel.cuh).
  KVFull,      // consumers: K and V of the key block have landed
  QEmpty,      // producer: a Q (+ lse) stage was released
  DoFull,      // consumers: a dO (+ dpsum) stage has landed
  DoEmpty,     // producer: a dO stage was released
  DsReady,     // consumers: both warpgroups stored this step's dS
  DqFull,      // dQ writer: the consumers staged a dQ tile
  DqEmpty,     // consumers: the dQ writer finished reading the staged tile
  // Decode (fwd kernel, kDecode).
  Gather,      // producer warpgroup: every thread's gathered K/V rows have landed
  // Backward again (appended: the values above keep their numbers).
  RowTail,     // producer: its own load of a tile with rows past the sequence end landed (zeroing)
  // MLA decode (decode/mla_mainloop.cuh; appended).
  PFull,       // consumer 1: consumer 0 staged P (or the final row sums) in shared memory
  PEmpty,      // consumer 0: consumer 1's P.V finished reading the staged P
};

}  // namespace flash3

namespace flash3 {

// CUTLASS's barrier and fence asm carries no "memory" clobber, so the compiler may move plain C++
// loads and stores of shared memory across it (e.g. the epilogue's reads of staged O, the kv-cache
// tail zeroing, the scheduler's hand-off slot, the backward's dS and dQ staging). These compiler
// fences keep them on their side.
__device__ __forceinline__ void compiler_fence() { asm volatile("" ::: "memory"); }

}  // namespace flash3

#if defined(FLASH3_DEBUG_HANG) && FLASH3_DEBUG_HANG
#include "flash3/common/debug_hang.cuh"
#else

namespace flash3 {

// Wait until the mbarrier at `bar` completes the phase with parity `phase`.
__device__ __forceinline__ void mbarrier_wait(uint64_t const* bar, uint32_t phase, Wait, int /*tile*/) {
  cutlass::arch::ClusterBarrier::wait(bar, phase);
  compiler_fence();
}

// bar.sync / bar.arrive on named barrier `id` (a user id: CUTLASS adds its reserved offset).
__device__ __forceinline__ void named_sync(uint32_t num_threads, uint32_t id, Wait, int /*tile*/) {
  compiler_fence();
  cutlass::arch::NamedBarrier::sync(num_threads, id);
  compiler_fence();
}
__device__ __forceinline__ void named_arrive(uint32_t num_threads, uint32_t id) {
  compiler_fence();
  cutlass::arch::NamedBarrier::arrive(num_threads, id);
}

// Called once by every thread at kernel start, before the first named barrier (the debug build
// initializes its emulation there; `num_threads` = the CTA's threads).
__device__ __forceinline__ void debug_hang_init(int /*num_threads*/) {}

}  // namespace flash3

#endif
