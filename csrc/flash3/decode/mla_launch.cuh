// Host side of the MLA decode kernel (decode/mla_traits.cuh): the decode family (decode/launch.cuh:
// the producer, schedule, KV-cache checks) with the MLA consumer and the qv checks.
#pragma once

#include <cstdint>
#include <type_traits>

#include "flash3/decode/mla_traits.cuh"  // first, as the traits in fwd/launch.cuh
#include "flash3/decode/api.h"
#include "flash3/decode/launch.cuh"
#include "flash3/decode/mla_mainloop.cuh"

namespace flash3 {

template <class Tr>
struct MlaFamily : DecodeFamily<Tr> {
  static_assert(Tr::kMla, "MLA traits");
  using Consumer = MlaConsumer<Tr>;

  static void check(const FwdParams& p) {
    DecodeFamily<Tr>::check(p);
    // qv's rows are packed with 16-byte loads (decode/load.cuh load_q).
    const bool aligned = reinterpret_cast<uintptr_t>(p.qv) % 16 == 0 && p.qv_batch_stride % 8 == 0 &&
                         p.qv_row_stride % 8 == 0 && p.qv_head_stride % 8 == 0;
    detail::fwd_check(p.qv == nullptr || aligned,
                      "MLA decode: qv must be 16-byte aligned with strides that are multiples of 8 elements");
  }
};

template <bool kIsBf16>
void run_decode_mla(const FwdParams& p, void* cuda_stream) {
  detail::fwd_check(p.is_bf16 == kIsBf16, "dtype does not match the compiled kernel");
  using Element = std::conditional_t<kIsBf16, cutlass::bfloat16_t, cutlass::half_t>;
  using Tr = MlaTraits<Element>;
  launch_fwd<Tr, MlaFamily<Tr>>(p, cuda_stream);
}

}  // namespace flash3
