// The host layer's argument checks (shared by every op in csrc/flash3/host/): a refused call throws
// host::Error with the message the torch bindings raise (they rethrow it as TORCH_CHECK does).
//
// Who checks what, once per layer crossing:
//  - flash3/_checks.py: what a user passes to the public functions (types, shapes, ranges), with
//    Python exceptions naming the argument, before anything is allocated or launched.
//  - here: every argument of an op (torch.ops.flash3.*, the simulator driver), refused before
//    anything is written, since those callers skip _checks.py. What a kernel takes (q's dtype, the
//    scale, head dims) and which kernel runs is kernel_pick.h's rule alone: the ops refuse by it,
//    flash3/_backend.py asks it (flash3::pick_kernel) to choose between a kernel and the reference.
//  - the kernels check nothing.
#pragma once
#include <algorithm>
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "flash3/common/total_rows.h"
#include "flash3/host/tensor_view.h"

namespace flash3::host {

// A refused call: bad arguments, no kernel, a failed launch.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// TORCH_CHECK's contract: the message is built (operator<< of every part) only when !ok.
template <class... A>
inline void check(bool ok, const A&... parts) {
  if (ok) return;
  std::ostringstream os;
  (os << ... << parts);
  throw Error(os.str());
}

inline const char* dtype_name(bool is_bf16) { return is_bf16 ? "bf16" : "fp16"; }

// TMA (and 16-byte cp.async) needs 16-byte aligned base addresses and 16-byte multiple strides
// (8 elements of 16 bits, 16 of 8). The stride of a dimension of size 1 is never used to address
// memory; give it a harmless value.
inline int64_t tma_stride(const TensorView& t, int dim) {
  if (t.size(dim) > 1) return t.stride(dim);
  const int64_t unit = 16 / t.element_size();
  int64_t s = unit;
  for (int d = dim + 1; d < t.dim(); ++d) s = std::max(s, t.stride(d) * t.size(d));
  return (s + unit - 1) / unit * unit;
}

inline void check_tma_layout(const TensorView& t, const char* name, const char* op = "flash3.fwd_sm90") {
  check(t.stride(-1) == 1 || t.size(-1) == 1, op, ": ", name, " must have a contiguous last dimension (stride ",
        t.stride(-1), ")");
  for (int d = 0; d + 1 < t.dim(); ++d) {
    // A broadcast (expanded) dimension: TMA would walk past a one-copy allocation.
    check(tma_stride(t, d) > 0, op, ": ", name, ".stride(", d, ") is ", t.stride(d), " on a dimension of size ",
          t.size(d), " (a broadcast/expanded tensor); pass a contiguous copy");
    check(tma_stride(t, d) * t.element_size() % 16 == 0, op, ": ", name, ".stride(", d, ") = ", t.stride(d),
          " must be a multiple of ", 16 / t.element_size(), " elements (16 bytes, for TMA)");
  }
  check(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, op, ": ", name, " must be 16-byte aligned (for TMA)");
}

inline void check_shape(const TensorView& t, const char* name, std::vector<int64_t> expected) {
  check(t.sizes() == expected, "flash3: ", name, " has shape ", t.sizes(), ", expected ", Sizes(expected));
}

// cu_seqlens_q/k, seqused_k, seqused_q: contiguous int32 (numel,) on q's device, when given.
inline void check_seqlens(const TensorView* t, const char* name, int64_t numel, const TensorView& q) {
  if (t == nullptr) return;
  check(t->dtype == DType::i32, "flash3: ", name, " must be int32, got ", t->dtype_name);
  check(t->device == q.device, "flash3: ", name, " must be on ", q.device, ", got ", t->device);
  check(t->dim() == 1 && t->numel() == numel, "flash3: ", name, " must have shape (", numel, "), got ", t->sizes());
  check(t->is_contiguous(), "flash3: ", name, " must be contiguous");
}

// ALiBi slopes (FwdParams/BwdParams alibi_slopes): nullptr without, else the data of a contiguous
// float32 (num_heads,) or (batch, num_heads) tensor on q's device; *batch_stride gets 0 or num_heads.
inline const float* check_alibi(const TensorView* slopes, int64_t batch, int64_t num_heads, const TensorView& q,
                                const char* op, int64_t* batch_stride) {
  *batch_stride = 0;
  if (slopes == nullptr) return nullptr;
  const TensorView& s = *slopes;
  check(s.dtype == DType::f32, op, ": alibi_slopes must be float32, got ", s.dtype_name);
  check(s.device == q.device, op, ": alibi_slopes must be on ", q.device, ", got ", s.device);
  check((s.dim() == 1 && s.size(0) == num_heads) || (s.dim() == 2 && s.size(0) == batch && s.size(1) == num_heads),
        op, ": alibi_slopes must have shape (", num_heads, ",) or (", batch, ", ", num_heads, "), got ", s.sizes());
  check(s.is_contiguous(), op, ": alibi_slopes must be contiguous");
  *batch_stride = s.dim() == 2 ? num_heads : 0;
  return s.ptr<const float>();
}

// Attention sinks (FwdParams::sinks): nullptr without, else the data of a contiguous float32
// (num_heads,) tensor on q's device, one logit per query head.
inline const float* check_sinks(const TensorView* sinks, int64_t num_heads, const TensorView& q, const char* op) {
  if (sinks == nullptr) return nullptr;
  const TensorView& s = *sinks;
  check(s.dtype == DType::f32, op, ": sinks must be float32, got ", s.dtype_name);
  check(s.device == q.device, op, ": sinks must be on ", q.device, ", got ", s.device);
  check(s.dim() == 1 && s.size(0) == num_heads, op, ": sinks must have shape (", num_heads,
        ",) (one logit per query head), got ", s.sizes());
  check(s.is_contiguous(), op, ": sinks must be contiguous");
  return s.ptr<const float>();
}

// The score options every attention op takes but the scale (kernel_pick.h: the reference takes
// any finite scale, the kernels a positive one). The window is the mask: -1 = unbounded, causal =
// (-1, 0), folded once at the Python API (flash3/masking.py normalize_window).
inline void check_score_options(const char* op, double softcap, int64_t window_left, int64_t window_right) {
  check(softcap >= 0.0, op, ": softcap must be >= 0 (0 = off), got ", softcap);
  check(window_left >= -1 && window_right >= -1, op, ": window sizes must be >= -1 (-1 = unbounded), got (",
        window_left, ", ", window_right, ")");
}

// FA3's attention_chunk (chunked local attention): 0 = off, else the chunk length in keys.
inline void check_attention_chunk(const char* op, int64_t attention_chunk) {
  check(attention_chunk >= 0 && attention_chunk <= (int64_t{1} << 30), op,
        ": attention_chunk must be >= 0 (0 = off) and at most 2^30, got ", attention_chunk);
}

// GQA: the query heads come in groups of the kv heads' count.
inline void check_heads(const char* op, int64_t h, int64_t h_k) {
  check(h_k > 0 && h % h_k == 0, op, ": the number of query heads (", h,
        ") must be a multiple of the number of kv heads (", h_k, ")");
}

// The sizes of an attention call over q (b, s_q, h, d), k (b, s_k, h_k, d), v (b, s_k, h_k, d_v),
// or packed (varlen: cu_seqlens_q/k given) q (total_q, h, d), k/v (total_k, h_k, .) with s_q/s_k the
// max lengths.
struct QkvShape {
  bool varlen;
  int64_t batch, h, h_k, d, d_v, s_q, s_k, total_q, total_k;
};

// q/k/v/out/lse of the forward and backward ops: their ranks, then k, v, out and lse against q's
// sizes (out (.., h, d_v), lse (b, h, s_q) or (h, total_q)), and cu_seqlens_q/k.
inline QkvShape check_qkv_shapes(const char* op, const TensorView& q, const TensorView& k, const TensorView& v,
                                 const TensorView& out, const TensorView& lse, const TensorView* cu_seqlens_q,
                                 const TensorView* cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k) {
  QkvShape s{};
  s.varlen = cu_seqlens_q != nullptr;
  check(s.varlen == (cu_seqlens_k != nullptr), op, ": pass both cu_seqlens_q and cu_seqlens_k, or neither");
  const int qdim = s.varlen ? 3 : 4;
  for (auto [t, name] : {std::make_pair(&q, "q"), std::make_pair(&k, "k"), std::make_pair(&v, "v"),
                         std::make_pair(&out, "out")})
    check(t->dim() == qdim, op, ": ", name, " must be ", qdim, "-D (",
          s.varlen ? "varlen: (total, heads, dim)" : "(batch, seqlen, heads, dim)", "), got ", t->sizes());
  s.batch = s.varlen ? cu_seqlens_q->numel() - 1 : q.size(0);
  check(s.batch >= 0, op, ": cu_seqlens_q must have batch + 1 >= 1 entries");
  s.h = q.size(-2), s.d = q.size(-1), s.h_k = k.size(-2), s.d_v = v.size(-1);
  s.s_q = s.varlen ? max_seqlen_q : q.size(1);
  s.s_k = s.varlen ? max_seqlen_k : k.size(1);
  s.total_q = s.varlen ? q.size(0) : s.batch * s.s_q;
  s.total_k = s.varlen ? k.size(0) : s.batch * s.s_k;
  if (s.varlen) {
    check_shape(k, "k", {s.total_k, s.h_k, s.d});
    check_shape(v, "v", {s.total_k, s.h_k, s.d_v});
    check_shape(out, "out", {s.total_q, s.h, s.d_v});
    check_shape(lse, "lse", {s.h, s.total_q});
    check(max_seqlen_q >= 0 && max_seqlen_k >= 0, op, ": max_seqlen_q/max_seqlen_k must be >= 0 for varlen");
  } else {
    check_shape(k, "k", {s.batch, s.s_k, s.h_k, s.d});
    check_shape(v, "v", {s.batch, s.s_k, s.h_k, s.d_v});
    check_shape(out, "out", {s.batch, s.s_q, s.h, s.d_v});
    check_shape(lse, "lse", {s.batch, s.h, s.s_q});
  }
  check_seqlens(cu_seqlens_q, "cu_seqlens_q", s.batch + 1, q);
  check_seqlens(cu_seqlens_k, "cu_seqlens_k", s.batch + 1, q);
  return s;
}

inline int to_int(int64_t v, const char* what, const char* op = "flash3") {
  check(v >= 0 && v <= INT32_MAX, op, ": ", what, " = ", v, " does not fit in int32");
  return static_cast<int>(v);
}

// total_q / total_k for the kernels (kernel_total_rows): varlen must fit int32, batched is clamped.
inline int total_rows(int64_t total, bool varlen, const char* what) {
  const long long v = kernel_total_rows(total, varlen);
  check(v >= 0, "flash3: ", what, " = ", total, " packed rows do not fit in int32 (varlen calls index them in 32 bits)");
  return static_cast<int>(v);
}

}  // namespace flash3::host
