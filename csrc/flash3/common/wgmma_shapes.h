// WGMMA atoms for every n-extent the tiles use. CuTe has two lists of m64nNk atoms: the basic one
// (n in {8, 16, 32, 64, 96, 128, 192, 256}) and the "extended" one (every other multiple of 8),
// compiled only under CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED: ~77k lines of headers that every pass of
// nvcc parses, ~46 s per TU (nvcc --time: cudafe++ 32 -> 4 s, cicc 37 -> 23 s on fwd_bf16_hdim128),
// about a third of CI's compile-check. flash3 needs four extended n-extents, all in SS products
// (csrc/generate_kernels.py EXTRA_WGMMA_N: 48, 80, 112, 176), so it defines those atoms itself: the fma
// bodies are generated (csrc/generated/wgmma_extra.h), the traits below are CuTe's generic GMMA
// layouts. ss_op picks CuTe's selector for a basic n and these otherwise; FLASH3_WGMMA_N_CHECK in the
// traits turns an n-extent in neither list into a compile error (CuTe's selector would quietly split
// it into n = 16 instructions).
#pragma once

#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cutlass/numeric_types.h>

namespace cute::SM90::GMMA {
// m64 n{N} k16, fp32 accumulators, A and B 16-bit (T) from shared-memory descriptors.
template <class T, int N, Major tnspA, Major tnspB>
struct Flash3SS;
}  // namespace cute::SM90::GMMA

#include "generated/wgmma_extra.h"

namespace cute {
template <class T, int N, SM90::GMMA::Major tnspA, SM90::GMMA::Major tnspB>
struct MMA_Traits<SM90::GMMA::Flash3SS<T, N, tnspA, tnspB>> {
  using ValTypeD = float;
  using ValTypeA = T;
  using ValTypeB = T;
  using ValTypeC = float;
  using FrgTypeA = GMMA::smem_desc<tnspA>;
  using FrgTypeB = GMMA::smem_desc<tnspB>;
  using Shape_MNK = Shape<_64, Int<N>, _16>;
  using ThrID = Layout<_128>;
  using ALayout = GMMA::ABLayout<64, 16>;
  using BLayout = GMMA::ABLayout<N, 16>;
  using CLayout = GMMA::CLayout_64xN<N>;
  GMMA::ScaleOut accumulate_ = GMMA::ScaleOut::One;
};
}  // namespace cute

namespace flash3 {

constexpr bool wgmma_basic_n(int n) {
  return n == 8 || n == 16 || n == 32 || n == 64 || n == 96 || n == 128 || n == 192 || n == 256;
}
// wgmma_extra_n (the generated header): flash3's own atoms.
constexpr bool wgmma_n_ok(int n) { return wgmma_basic_n(n) || wgmma_extra_n(n); }

// The SS atom for a (64, N, K) product of T with fp32 accumulators: CuTe's selector for a basic N,
// flash3's own atom (one instruction of n = N) for the extra ones.
template <class T, int N, int K, cute::GMMA::Major kMajorA = cute::GMMA::Major::K,
          cute::GMMA::Major kMajorB = cute::GMMA::Major::K>
CUTE_HOST_DEVICE constexpr auto ss_op() {
  static_assert(wgmma_n_ok(N), "a WGMMA n-extent outside CuTe's basic list and EXTRA_WGMMA_N "
                               "(csrc/generate_kernels.py): add it there");
  if constexpr (wgmma_basic_n(N))
    return cute::GMMA::ss_op_selector<T, T, float, cute::Shape<cute::_64, cute::Int<N>, cute::Int<K>>, kMajorA,
                                      kMajorB>();
  else
    return cute::SM90::GMMA::Flash3SS<T, N, kMajorA, kMajorB>{};
}

}  // namespace flash3

// In a traits struct: every WGMMA n-extent it uses is basic or one of flash3's own (EXTRA_WGMMA_N).
#define FLASH3_WGMMA_N_CHECK(all_ok) \
  static_assert(all_ok, "a WGMMA n-extent outside CuTe's basic list and EXTRA_WGMMA_N (csrc/generate_kernels.py)")
