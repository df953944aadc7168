// Two TUs of the hang-diagnosis build link into one program (`make hang-build-check` compiles this
// file twice, SIDE=1 and SIDE=2, and links both objects): the extension links every kernel TU into
// one .so, so nothing debug_hang.cuh defines may have external linkage (a non-static function's
// host stub was defined in every TU: "multiple definition of flash3::debug_hang::expire", H200,
// 2026-11-30). Never run; linking is the check.
#define FLASH3_DEBUG_HANG 1
#include "flash3/common/barriers.cuh"

#define FLASH3_CAT2(a, b) a##b
#define FLASH3_CAT(a, b) FLASH3_CAT2(a, b)

__global__ void FLASH3_CAT(link_check_kernel_, SIDE)(uint64_t* bar) {
  flash3::debug_hang_init(blockDim.x);
  flash3::mbarrier_wait(bar, 0, flash3::Wait::KFull, 0);
  flash3::named_sync(64, 1, flash3::Wait::Pingpong, 0);
}

#if SIDE == 1
int main() { return 0; }
#endif
