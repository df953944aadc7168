// total_q / total_k of FwdParams and BwdParams, set the same way by the forward and the backward
// ops (csrc/flash3/host/check.h total_rows). Host only, no torch, no CUDA (tests/cpp/host_logic_driver).
#pragma once

namespace flash3 {

// From the packed row count of q or k (batched: b * s). Varlen calls read it (the TMA row extent;
// cu_seqlens are clamped into it), so it must fit int32: -1 where it does not. Batched calls never
// read it (their rows are addressed as batch * batch stride in 64 bits), so b * s may pass 2^31:
// clamped.
constexpr long long kernel_total_rows(long long total, bool varlen) {
  return total < 0 ? -1 : total <= 2147483647LL ? total : varlen ? -1 : 2147483647LL;
}

}  // namespace flash3
