// Strict checks on setmaxnreg. ptxas itself rejects a count that is not a multiple of 8, so the
// bad instruction of setmaxnreg_mult8 is compiled as `setmaxnreg.dec.sync.aligned.u32 56;` (the only
// 56 in the file) and run_checks.py patches the PTX embedded in the binary (uncompressed with
// -no-compress) to 52; the simulator runs the PTX, not the SASS.
// `setmaxnreg CASE bad|good`; the bad run trips `setmaxnreg`, the good twin nothing.
#include "common.h"

// setmaxnreg_dec: setmaxnreg.dec to 48 after a .dec to 40 (PTX: .dec releases registers; the
// new count must not exceed the current one). Good twin: .inc to 48.
__global__ void k_dec(int bad, int* out) {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 40;" ::: "memory");
  if (bad) asm volatile("setmaxnreg.dec.sync.aligned.u32 48;" ::: "memory");
  else asm volatile("setmaxnreg.inc.sync.aligned.u32 48;" ::: "memory");
  out[threadIdx.x] = threadIdx.x;
}
static void setmaxnreg_dec(bool bad) {
  int* d; CK(cudaMalloc(&d, 128 * sizeof(int)));
  k_dec<<<1, 128>>>(bad, d);
}

// setmaxnreg_mult8: setmaxnreg.dec to 52 (PTX: imm-reg-count must be a multiple of 8 in [24, 256]).
__global__ void k_mult8(int bad, int* out) {
  if (bad) asm volatile("setmaxnreg.dec.sync.aligned.u32 56;" ::: "memory");
  else asm volatile("setmaxnreg.dec.sync.aligned.u32 48;" ::: "memory");
  out[threadIdx.x] = threadIdx.x;
}
static void setmaxnreg_mult8(bool bad) {
  int* d; CK(cudaMalloc(&d, 128 * sizeof(int)));
  k_mult8<<<1, 128>>>(bad, d);
}

CASES({"setmaxnreg_dec", setmaxnreg_dec}, {"setmaxnreg_mult8", setmaxnreg_mult8})
