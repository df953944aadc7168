// The torch side of flash3._C: the ops under torch.ops.flash3 and a minimal Python module.
//
//   flash3::fwd_sm90(q, k, v, out!, lse!, cu_seqlens_q?, cu_seqlens_k?, seqused_k?, max_seqlen_q,
//                    max_seqlen_k, softmax_scale, window_left, window_right, softcap,
//                    sinks?=None, alibi_slopes?=None, seqused_q?=None, attention_chunk=0) -> ()
//       CUDA: csrc/flash3/host/fwd.cpp checks the arguments, fills flash3::FwdParams, runs the
//       registered kernel for (dtype, d, d_v) on the current stream. sinks: float32 (h,), attention sinks (one logit
//       per query head, joining every row's softmax denominator; lse includes it). seqused_q: int32 (b,), varlen,
//       not with sinks: sequence i's first seqused_q[i] packed rows are queries, its other rows get out 0,
//       lse -inf (FA3's seqused_q). Meta: nothing (shapes of out/lse are the caller's),
//       so torch.compile can trace calls.
//   flash3::fwd_fp8_sm90(q, k, vt, out!, lse!, q_descale, k_descale, v_descale, v_channel_descale?,
//                        q_block, kv_block, softmax_scale, window_left, window_right, softcap,
//                        cu_seqlens_q?, cu_seqlens_k?, max_seqlen_q, max_seqlen_k, seqused_q?,
//                        seqused_k?, attention_chunk, fast_accum=False) -> ()
//       The same for e4m3 q/k and a transposed, permuted v (flash3/fp8_quant.py), bf16 out;
//       fast_accum: P.V accumulated in the tensor cores over all keys (FA3's), v_descale (b, h_k, 1);
//       seqused_q/k with packed q/k only. No sinks argument: attention sinks are not offered with
//       FP8 inputs (flash3/_checks.py sinks).
//   Every op takes the mask as one window (window_left, window_right): -1 = unbounded, causal =
//   (-1, 0), folded once at the Python API (flash3/masking.py normalize_window); fwd_sm90,
//   fwd_fp8_sm90 (and bwd_sm90) also FA3's attention_chunk (chunked local attention, 0 = off)
//   intersecting it.
//   flash3::pick_kernel(family, dtype, d, d_v, softmax_scale, attention_chunk=0) -> str
//       Whether a kernel of family ("fwd", "fwd_fp8", "decode", "decode_fp8_cache", "bwd") runs such
//       a call (dtype: torch's name, "bfloat16"), by the rule the ops refuse by
//       (csrc/flash3/host/kernel_pick.h): {"kernel": [head_dim, head_dim_v]} or {"reason": ...}.
//       flash3/_backend.py asks it to choose between a kernel and the reference. No GPU needed.
//   flash3::kernel_info() -> str
//       JSON: {"fwd": [["bf16", 128, 128], ...], "fwd_fp8": [[128, 128], ...], "bwd": [...], "decode": [...],
//       "decode_fp8_cache": [["bf16", 128, 128], ...] (16-bit q, FP8 cache), "arch": "sm_90a", "cutlass": "4.2.0"}.
//
// The Python layer (flash3/) validates and allocates first; the host layer's checks are a defence.
// Each op here adapts at::Tensor to the torch-free host layer (csrc/torch_adapter.h), which the
// simulator driver (tools/hopper_sim/flash3/) runs too. Only light torch headers (no
// torch/extension.h, no pybind11) to keep this TU fast to compile; the kernels live in
// csrc/generated/*.cu and never see a torch header.
#include <Python.h>

#include <torch/library.h>

#include <cstdint>
#include <optional>
#include <string>

#include "flash3/host/fwd.h"
#include "flash3/host/kernel_info.h"
#include "flash3/host/kernel_pick.h"
#include "torch_adapter.h"

#ifndef FLASH3_CUTLASS_MAJOR
#define FLASH3_CUTLASS_MAJOR 0
#define FLASH3_CUTLASS_MINOR 0
#define FLASH3_CUTLASS_PATCH 0
#endif

namespace flash3 {
namespace {

void fwd_sm90_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                   const Tensor& lse, const std::optional<Tensor>& cu_seqlens_q,
                   const std::optional<Tensor>& cu_seqlens_k,
                   const std::optional<Tensor>& seqused_k, int64_t max_seqlen_q,
                   int64_t max_seqlen_k, double softmax_scale, int64_t window_left,
                   int64_t window_right, double softcap, const std::optional<Tensor>& sinks,
                   const std::optional<Tensor>& alibi_slopes, const std::optional<Tensor>& seqused_q,
                   int64_t attention_chunk) {
  const auto cu_q = view(cu_seqlens_q), cu_k = view(cu_seqlens_k), used = view(seqused_k), sk = view(sinks),
             al = view(alibi_slopes), used_q = view(seqused_q);
  run_host_op(q, [&](host::Backend& be) {
    host::fwd_sm90(be, view(q), view(k), view(v), view(out), view(lse), ptr(cu_q), ptr(cu_k), ptr(used),
                   max_seqlen_q, max_seqlen_k, softmax_scale, window_left, window_right, softcap, ptr(sk),
                   ptr(al), ptr(used_q), attention_chunk);
  });
}

// The FP8 forward (csrc/flash3/host/fwd.h fwd_fp8_sm90 has the layouts).
void fwd_fp8_sm90_cuda(const Tensor& q, const Tensor& k, const Tensor& vt, const Tensor& out,
                       const Tensor& lse, const Tensor& q_descale, const Tensor& k_descale,
                       const Tensor& v_descale, const std::optional<Tensor>& v_channel_descale,
                       int64_t q_block, int64_t kv_block, double softmax_scale,
                       int64_t window_left, int64_t window_right, double softcap,
                       const std::optional<Tensor>& cu_seqlens_q, const std::optional<Tensor>& cu_seqlens_k,
                       int64_t max_seqlen_q, int64_t max_seqlen_k, const std::optional<Tensor>& seqused_q,
                       const std::optional<Tensor>& seqused_k, int64_t attention_chunk, bool fast_accum) {
  const auto vc = view(v_channel_descale), cu_q = view(cu_seqlens_q), cu_k = view(cu_seqlens_k),
             used_q = view(seqused_q), used_k = view(seqused_k);
  run_host_op(q, [&](host::Backend& be) {
    host::fwd_fp8_sm90(be, view(q), view(k), view(vt), view(out), view(lse), view(q_descale), view(k_descale),
                       view(v_descale), ptr(vc), q_block, kv_block, softmax_scale, window_left, window_right,
                       softcap, ptr(cu_q), ptr(cu_k), max_seqlen_q, max_seqlen_k, ptr(used_q), ptr(used_k),
                       attention_chunk, fast_accum);
  });
}

void fwd_fp8_sm90_meta(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                       const Tensor&, const Tensor&, const Tensor&, const std::optional<Tensor>&, int64_t,
                       int64_t, double, int64_t, int64_t, double, const std::optional<Tensor>&,
                       const std::optional<Tensor>&, int64_t, int64_t, const std::optional<Tensor>&,
                       const std::optional<Tensor>&, int64_t, bool) {}

// Shapes and dtypes of out/lse are fixed by the caller, so the fake/meta kernel has nothing to do.
void fwd_sm90_meta(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                   const std::optional<Tensor>&, const std::optional<Tensor>&,
                   const std::optional<Tensor>&, int64_t, int64_t, double, int64_t, int64_t,
                   double, const std::optional<Tensor>&, const std::optional<Tensor>&,
                   const std::optional<Tensor>&, int64_t) {}

std::string kernel_info() {
  return "{" + host::kernel_lists_json() + ", \"arch\": \"sm_90a\", \"cutlass\": \"" +
         std::to_string(FLASH3_CUTLASS_MAJOR) + "." + std::to_string(FLASH3_CUTLASS_MINOR) + "." +
         std::to_string(FLASH3_CUTLASS_PATCH) + "\"}";
}

std::string pick_kernel(std::string family, std::string dtype, int64_t d, int64_t d_v, double softmax_scale,
                        int64_t attention_chunk) {
  return host::kernel_pick_json(family, dtype, d, d_v, softmax_scale, attention_chunk);
}

}  // namespace
}  // namespace flash3

TORCH_LIBRARY(flash3, m) {
  m.def(
      "fwd_sm90(Tensor q, Tensor k, Tensor v, Tensor(a!) out, Tensor(b!) lse, "
      "Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, Tensor? seqused_k, int max_seqlen_q, "
      "int max_seqlen_k, float softmax_scale, int window_left, int window_right, "
      "float softcap, Tensor? sinks=None, Tensor? alibi_slopes=None, Tensor? seqused_q=None, "
      "int attention_chunk=0) -> ()");
  m.def(
      "fwd_fp8_sm90(Tensor q, Tensor k, Tensor vt, Tensor(a!) out, Tensor(b!) lse, Tensor q_descale, "
      "Tensor k_descale, Tensor v_descale, Tensor? v_channel_descale, int q_block, int kv_block, "
      "float softmax_scale, int window_left, int window_right, float softcap, "
      "Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_k=None, int max_seqlen_q=0, int max_seqlen_k=0, "
      "Tensor? seqused_q=None, Tensor? seqused_k=None, int attention_chunk=0, bool fast_accum=False) -> ()");
  // No tensor arguments: a catch-all kernel, callable without a GPU.
  m.def("kernel_info() -> str", &flash3::kernel_info);
  m.def("pick_kernel(str family, str dtype, int d, int d_v, float softmax_scale, int attention_chunk=0) -> str",
        &flash3::pick_kernel);
}

TORCH_LIBRARY_IMPL(flash3, CUDA, m) {
  m.impl("fwd_sm90", &flash3::fwd_sm90_cuda);
  m.impl("fwd_fp8_sm90", &flash3::fwd_fp8_sm90_cuda);
}

TORCH_LIBRARY_IMPL(flash3, Meta, m) {
  m.impl("fwd_sm90", &flash3::fwd_sm90_meta);
  m.impl("fwd_fp8_sm90", &flash3::fwd_fp8_sm90_meta);
}

// `import flash3._C` loads this library, whose static initializers register the ops above and the
// kernels (csrc/generated/*.cu). The module itself is empty: no pybind11.
static struct PyModuleDef flash3_c_module = {
    PyModuleDef_HEAD_INIT, "_C",
    "flash3 CUDA kernels; the ops are torch.ops.flash3.fwd_sm90 and torch.ops.flash3.kernel_info.",
    -1, nullptr, nullptr, nullptr, nullptr, nullptr};

PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&flash3_c_module); }
