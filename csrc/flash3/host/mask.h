// The mask as the kernels' parameters take it (FwdParams, BwdParams). An op gets the mask as one
// window (left, right), -1 = unbounded and causal = right 0, folded from `causal` once, at the Python
// API (flash3/masking.py normalize_window), and checked by check_score_options; and an attention
// chunk (0 = none, checked by check_attention_chunk) that intersects it.
#pragma once
#include <cstdint>

namespace flash3::host {

template <class Params>
inline void set_mask(Params& p, int64_t window_left, int64_t window_right, int64_t attention_chunk = 0) {
  p.window_left = static_cast<int>(window_left);
  p.window_right = static_cast<int>(window_right);
  p.attention_chunk = static_cast<int>(attention_chunk);
  // Mask::make (attn_logic.h) still takes a causal flag; right = 0 is the same mask, so it is
  // derived here, and only here, to leave the kernels as they are.
  p.is_causal = window_right == 0;
}

}  // namespace flash3::host
