// The GMMA shared-memory swizzle atom for a tile, shared by the forward and backward traits.
#pragma once

#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>

namespace flash3 {

// Largest GMMA swizzle atom whose contiguous extent divides the tile's contiguous extent.
// kMajor K: the atom is (8 rows, C contiguous); MN: (C contiguous, 8).
// The swizzle spans 128, 64 or 32 bytes, whatever the element size.
template <cute::GMMA::Major kMajor, class T, int kContig>
CUTE_HOST_DEVICE constexpr auto gmma_smem_atom() {
  using namespace cute;
  constexpr int kBytes = kContig * int(sizeof(T));
  if constexpr (kMajor == GMMA::Major::K) {
    if constexpr (kBytes % 128 == 0) return GMMA::Layout_K_SW128_Atom<T>{};
    else if constexpr (kBytes % 64 == 0) return GMMA::Layout_K_SW64_Atom<T>{};
    else if constexpr (kBytes % 32 == 0) return GMMA::Layout_K_SW32_Atom<T>{};
    else return GMMA::Layout_K_INTER_Atom<T>{};
  } else {
    if constexpr (kBytes % 128 == 0) return GMMA::Layout_MN_SW128_Atom<T>{};
    else if constexpr (kBytes % 64 == 0) return GMMA::Layout_MN_SW64_Atom<T>{};
    else if constexpr (kBytes % 32 == 0) return GMMA::Layout_MN_SW32_Atom<T>{};
    else return GMMA::Layout_MN_INTER_Atom<T>{};
  }
}

}  // namespace flash3
