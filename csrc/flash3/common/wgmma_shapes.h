// Which WGMMA n-extents a TU may use. CuTe has two lists of m64nNk atoms: the basic one (n in
// {8, 16, 32, 64, 96, 128, 192, 256}) and the "extended" one (every other multiple of 8), compiled
// only under CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED. The extended list is ~77k lines of headers
// that every pass of nvcc parses: ~32 s of cudafe++ and cicc per TU (nvcc --time on a TU with
// no instantiation: 49 s with it, 17 s without), a third of CI's compile-check. So a generated TU
// defines the macro only when its tiles need it (csrc/generate_kernels.py: EXTENDED_WGMMA), and the
// traits assert that choice both ways (FLASH3_WGMMA_SHAPES_CHECK).
#pragma once

#if defined(CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED)
#define FLASH3_WGMMA_EXTENDED true
#else
#define FLASH3_WGMMA_EXTENDED false
#endif

namespace flash3 {

constexpr bool wgmma_basic_n(int n) {
  return n == 8 || n == 16 || n == 32 || n == 64 || n == 96 || n == 128 || n == 192 || n == 256;
}

}  // namespace flash3

// In a traits struct: `all_basic` says whether every WGMMA n-extent it selects is in the basic list.
// Without the extended atoms, CuTe's selectors would quietly split e.g. n = 176 into eleven n = 16
// instructions; with them where nothing needs them, the TU compiles ~32 s longer.
#define FLASH3_WGMMA_SHAPES_CHECK(all_basic)                                                        \
  static_assert(FLASH3_WGMMA_EXTENDED || (all_basic),                                              \
                "this kernel's WGMMA n-extents need CuTe's extended shapes: add it to "           \
                "csrc/generate_kernels.py's EXTENDED_WGMMA");                                     \
  static_assert(!FLASH3_WGMMA_EXTENDED || !(all_basic),                                            \
                "this kernel's WGMMA n-extents are all basic: drop it from "                       \
                "csrc/generate_kernels.py's EXTENDED_WGMMA (the extended atoms cost ~32 s per TU)")
