// Issuing an asynchronous WGMMA batch, shared by the forward and backward consumers.
#pragma once

#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>

namespace flash3 {

// Issues (does not wait for) an asynchronous WGMMA batch C (+)= A B over the k-blocks of A.
// The fences pin the register operands (C, and A when it comes from registers) around the
// asynchronous window so the compiler neither moves their reads/writes across it nor reuses them.
template <bool kZeroInit, class Mma, class TA, class TB, class TC>
__device__ __forceinline__ void gemm_async(Mma& mma, TA& a, TB const& b, TC& c) {
  using namespace cute;
  constexpr bool kRegA = !is_base_of<GMMA::DescriptorIterator, typename Mma::FrgTypeA>::value;
  if constexpr (kRegA) warpgroup_fence_operand(a);
  warpgroup_fence_operand(c);
  warpgroup_arrive();
  if constexpr (kZeroInit) mma.accumulate_ = GMMA::ScaleOut::Zero;
  CUTE_UNROLL
  for (int k = 0; k < size<2>(a); ++k) {
    cute::gemm(mma, a(_, _, k), b(_, _, k), c);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  warpgroup_fence_operand(c);
  if constexpr (kRegA) warpgroup_fence_operand(a);
}

}  // namespace flash3
