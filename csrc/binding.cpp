// The torch side of flash3._C: the ops under torch.ops.flash3 and a minimal Python module.
//
//   flash3::fwd_sm90(q, k, v, out!, lse!, cu_seqlens_q?, cu_seqlens_k?, seqused_k?, max_seqlen_q,
//                    max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap,
//                    sinks?=None, alibi_slopes?=None) -> ()
//       CUDA: checks the arguments, fills flash3::FwdParams, runs the registered kernel for
//       (dtype, d, d_v) on the current stream. sinks: float32 (h,), attention sinks (one logit
//       per query head, joining every row's softmax denominator; lse includes it). Meta: nothing (shapes of out/lse are the caller's),
//       so torch.compile can trace calls.
//   flash3::fwd_fp8_sm90(q, k, vt, out!, lse!, q_descale, k_descale, v_descale, v_channel_descale?,
//                        q_block, kv_block, softmax_scale, causal, window_left, window_right, softcap,
//                        cu_seqlens_q?, cu_seqlens_k?, max_seqlen_q, max_seqlen_k) -> ()
//       The same for e4m3 q/k and a transposed, permuted v (flash3/fp8_quant.py), bf16 out. No
//       sinks argument: attention sinks are not offered with FP8 inputs (flash3/_checks.py sinks).
//   flash3::kernel_info() -> str
//       JSON: {"fwd": [["bf16", 128, 128], ...], "fwd_fp8": [[128, 128], ...], "bwd": [...], "decode": [...],
//       "decode_fp8_cache": [["bf16", 128, 128], ...] (16-bit q, FP8 cache), "arch": "sm_90a", "cutlass": "4.2.0"}.
//
// The Python layer (flash3/) validates and allocates first; the checks here are a defence.
// Only light torch headers (no torch/extension.h, no pybind11) to keep this TU fast to compile;
// the kernels live in csrc/generated/*.cu and never see a torch header.
#include <Python.h>

#include <ATen/core/Tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/core/ScalarType.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <exception>
#include <limits>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "binding_common.h"
#include "flash3/common/attn_logic.h"
#include "flash3/bwd/api.h"
#include "flash3/fwd/api.h"
#include "flash3/fwd/params.h"

#ifndef FLASH3_CUTLASS_MAJOR
#define FLASH3_CUTLASS_MAJOR 0
#define FLASH3_CUTLASS_MINOR 0
#define FLASH3_CUTLASS_PATCH 0
#endif

namespace flash3 {
namespace {

using at::Tensor;

void fwd_sm90_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                   const Tensor& lse, const std::optional<Tensor>& cu_seqlens_q,
                   const std::optional<Tensor>& cu_seqlens_k,
                   const std::optional<Tensor>& seqused_k, int64_t max_seqlen_q,
                   int64_t max_seqlen_k, double softmax_scale, bool causal, int64_t window_left,
                   int64_t window_right, double softcap, const std::optional<Tensor>& sinks,
                   const std::optional<Tensor>& alibi_slopes) {
  // Device and dtypes.
  TORCH_CHECK(q.is_cuda(), "flash3.fwd_sm90: q must be a CUDA tensor, got ", q.device());
  for (const Tensor* t : {&k, &v, &out, &lse})
    TORCH_CHECK(t->device() == q.device(), "flash3.fwd_sm90: all tensors must be on ", q.device(),
                ", got one on ", t->device());
  c10::cuda::CUDAGuard guard(q.device());
  const DeviceInfo& dev = device_info(q.get_device());
  TORCH_CHECK(dev.major == 9 && dev.minor == 0, "flash3.fwd_sm90 needs an sm_90 (Hopper) GPU; ",
              q.device(), " is sm_", dev.major, dev.minor);
  const auto dtype = q.scalar_type();
  TORCH_CHECK(dtype == at::kBFloat16 || dtype == at::kHalf,
              "flash3.fwd_sm90: q must be bfloat16 or float16, got ", dtype);
  TORCH_CHECK(k.scalar_type() == dtype && v.scalar_type() == dtype,
              "flash3.fwd_sm90: q, k and v must have the same dtype, got ", dtype, ", ",
              k.scalar_type(), ", ", v.scalar_type());
  TORCH_CHECK(out.scalar_type() == dtype, "flash3.fwd_sm90: out must have q's dtype ", dtype,
              ", got ", out.scalar_type());
  TORCH_CHECK(lse.scalar_type() == at::kFloat, "flash3.fwd_sm90: lse must be float32, got ",
              lse.scalar_type());
  const bool is_bf16 = dtype == at::kBFloat16;

  // Shapes.
  const bool varlen = cu_seqlens_q.has_value();
  TORCH_CHECK(cu_seqlens_q.has_value() == cu_seqlens_k.has_value(),
              "flash3.fwd_sm90: pass both cu_seqlens_q and cu_seqlens_k, or neither");
  const int qdim = varlen ? 3 : 4;
  for (auto [t, name] : {std::make_tuple(&q, "q"), std::make_tuple(&k, "k"),
                         std::make_tuple(&v, "v"), std::make_tuple(&out, "out")})
    TORCH_CHECK(t->dim() == qdim, "flash3.fwd_sm90: ", name, " must be ", qdim, "-D (",
                varlen ? "varlen: (total, heads, dim)" : "(batch, seqlen, heads, dim)", "), got ",
                t->sizes());
  const int64_t batch = varlen ? cu_seqlens_q->numel() - 1 : q.size(0);
  TORCH_CHECK(batch >= 0, "flash3.fwd_sm90: cu_seqlens_q must have batch + 1 >= 1 entries");
  const int64_t h = q.size(-2), d = q.size(-1);
  const int64_t h_k = k.size(-2), d_v = v.size(-1);
  const int64_t seqlen_q = varlen ? max_seqlen_q : q.size(1);
  const int64_t seqlen_k = varlen ? max_seqlen_k : k.size(1);
  const int64_t total_q = varlen ? q.size(0) : batch * seqlen_q;
  const int64_t total_k = varlen ? k.size(0) : batch * seqlen_k;
  if (varlen) {
    check_shape(k, "k", {total_k, h_k, d});
    check_shape(v, "v", {total_k, h_k, d_v});
    check_shape(out, "out", {total_q, h, d_v});
    check_shape(lse, "lse", {h, total_q});
    TORCH_CHECK(max_seqlen_q >= 0 && max_seqlen_k >= 0,
                "flash3.fwd_sm90: max_seqlen_q/max_seqlen_k must be >= 0 for varlen");
  } else {
    check_shape(k, "k", {batch, seqlen_k, h_k, d});
    check_shape(v, "v", {batch, seqlen_k, h_k, d_v});
    check_shape(out, "out", {batch, seqlen_q, h, d_v});
    check_shape(lse, "lse", {batch, h, seqlen_q});
  }
  check_seqlens(cu_seqlens_q, "cu_seqlens_q", batch + 1, q);
  check_seqlens(cu_seqlens_k, "cu_seqlens_k", batch + 1, q);
  check_seqlens(seqused_k, "seqused_k", batch, q);
  TORCH_CHECK(h_k > 0 && h % h_k == 0, "flash3.fwd_sm90: the number of query heads (", h,
              ") must be a multiple of the number of kv heads (", h_k, ")");
  TORCH_CHECK(d % 8 == 0 && d_v % 8 == 0 && d > 0 && d_v > 0 && d <= 256 && d_v <= 256,
              "flash3.fwd_sm90: head dims must be multiples of 8 in [8, 256], got d=", d,
              " d_v=", d_v);
  TORCH_CHECK(softcap >= 0.0, "flash3.fwd_sm90: softcap must be >= 0 (0 = off), got ", softcap);
  // The online softmax takes row maxes of the raw scores, which is only right for a positive scale.
  TORCH_CHECK(softmax_scale > 0.0 && std::isfinite(softmax_scale),
              "flash3.fwd_sm90: softmax_scale must be finite and > 0, got ", softmax_scale);
  TORCH_CHECK(window_left >= -1 && window_right >= -1,
              "flash3.fwd_sm90: window sizes must be >= -1 (-1 = unbounded)");
  const float* sinks_ptr = check_sinks(sinks, h, q, "flash3.fwd_sm90");
  int64_t alibi_stride = 0;
  const float* alibi_ptr = check_alibi(alibi_slopes, batch, h, q, "flash3.fwd_sm90", &alibi_stride);

  // Head dims without their own kernel run on the next compiled one up (TMA zero-fills the extra
  // columns); full attention takes the wide-tile variant where (d, d_v) has one.
  const bool wide = !causal && window_left < 0 && window_right < 0;
  const FwdLauncher launch = find_fwd_kernel(is_bf16, static_cast<int>(d), static_cast<int>(d_v), wide);
  TORCH_CHECK(launch != nullptr, "flash3.fwd_sm90: no ", dtype_name(is_bf16), " kernel for head dim (",
              d, ", ", d_v, ") or larger in this build of flash3._C; see torch.ops.flash3.kernel_info() "
              "and rebuild with FLASH3_HDIMS/FLASH3_DTYPES unset to compile every kernel");

  if (total_q == 0 || h == 0 || batch == 0 || seqlen_q == 0) return;  // nothing to compute
  if (total_k == 0) {  // no keys at all: every row sees nothing (out 0, lse -inf or the sink, as the reference)
    out.zero_();
    fill_empty_lse(lse, sinks, varlen ? 0 : 1);
    return;
  }

  check_tma_layout(q, "q");
  check_tma_layout(k, "k");
  check_tma_layout(v, "v");
  check_tma_layout(out, "out");
  TORCH_CHECK(lse.stride(-1) == 1 || lse.size(-1) <= 1,
              "flash3.fwd_sm90: lse must have a contiguous last dimension");

  FwdParams p;
  set_q_k_out(p, q, k, out, lse, cu_seqlens_q, cu_seqlens_k, batch, seqlen_q, seqlen_k);
  p.v = v.data_ptr();
  p.v_batch_stride = varlen ? 0 : tma_stride(v, 0);
  p.v_row_stride = tma_stride(v, qdim - 3);
  p.v_head_stride = tma_stride(v, qdim - 2);
  p.seqused_k = seqused_k.has_value() ? seqused_k->data_ptr<int>() : nullptr;
  p.sinks = sinks_ptr;
  p.alibi_slopes = alibi_ptr, p.alibi_batch_stride = alibi_stride;

  p.is_bf16 = is_bf16;
  set_mask_and_launch(p, launch, q, dev, softmax_scale, softcap, causal, window_left, window_right,
                      "flash3.fwd_sm90", dtype_name(is_bf16));
}

// A per-block descale (b, heads, blocks of `block` rows) as the kernel's Descale, one entry per
// kernel block of `kernel_block` rows: `block` must be a multiple of it; coarser blocks are repeated
// on the device (repeat_interleave with a constant count: no host sync). `keep` holds the copy.
Descale fp8_descale(const Tensor& t, const char* name, const Tensor& q, int64_t b, int64_t heads,
                    int64_t rows, int64_t block, int64_t kernel_block, Tensor& keep) {
  TORCH_CHECK(t.scalar_type() == at::kFloat, "flash3.fwd_fp8_sm90: ", name, " must be float32, got ",
              t.scalar_type());
  TORCH_CHECK(t.device() == q.device(), "flash3.fwd_fp8_sm90: ", name, " must be on ", q.device());
  TORCH_CHECK(block > 0 && block % kernel_block == 0, "flash3.fwd_fp8_sm90: the block of ", name, " (",
              block, " rows) must be a multiple of the kernel's ", kernel_block);
  const int64_t nb = (rows + block - 1) / block, nk = (rows + kernel_block - 1) / kernel_block;
  check_shape(t, name, {b, heads, nb});
  keep = block == kernel_block ? t : t.repeat_interleave(block / kernel_block, 2).narrow(2, 0, nk);
  Descale d;
  d.ptr = keep.data_ptr<float>();
  d.batch_stride = keep.stride(0);
  d.head_stride = keep.stride(1);
  d.index_stride = keep.size(2) > 1 ? keep.stride(2) : 0;
  d.count = static_cast<int>(nk);
  return d;
}

// The FP8 forward: q (b, s_q, h, d), k (b, s_k, h_k, d) and vt (b, h_k, d_v, s_pad) in e4m3, vt
// holding V transposed with tokens permuted within every 16 (flash3/fp8_quant.py pack_v_fp8), s_pad a
// multiple of 16 >= s_k. Descales (float32, any strides): q (b, h, ceil(s_q / q_block)), k and v
// (b, h_k, ceil(s_k / kv_block)), optional v_channel (b, h_k, d_v). out (b, s_q, h, d_v) bf16.
// Varlen (cu_seqlens_q/k given): q (total_q, h, d), k (total_k, h_k, d), vt (h_k, d_v, columns)
// with sequence i at column fp8_varlen_vt_offset(cu_seqlens_k[i], i) (fp8.pack_v_fp8_varlen),
// out (total_q, h, d_v), lse (h, total_q); descale blocks count from each sequence's start, s_q and
// s_k above being max_seqlen_q/k.
void fwd_fp8_sm90_cuda(const Tensor& q, const Tensor& k, const Tensor& vt, const Tensor& out,
                       const Tensor& lse, const Tensor& q_descale, const Tensor& k_descale,
                       const Tensor& v_descale, const std::optional<Tensor>& v_channel_descale,
                       int64_t q_block, int64_t kv_block, double softmax_scale, bool causal,
                       int64_t window_left, int64_t window_right, double softcap,
                       const std::optional<Tensor>& cu_seqlens_q, const std::optional<Tensor>& cu_seqlens_k,
                       int64_t max_seqlen_q, int64_t max_seqlen_k) {
  TORCH_CHECK(q.is_cuda(), "flash3.fwd_fp8_sm90: q must be a CUDA tensor, got ", q.device());
  for (const Tensor* t : {&k, &vt, &out, &lse})
    TORCH_CHECK(t->device() == q.device(), "flash3.fwd_fp8_sm90: all tensors must be on ", q.device(),
                ", got one on ", t->device());
  c10::cuda::CUDAGuard guard(q.device());
  const DeviceInfo& dev = device_info(q.get_device());
  TORCH_CHECK(dev.major == 9 && dev.minor == 0, "flash3.fwd_fp8_sm90 needs an sm_90 (Hopper) GPU; ",
              q.device(), " is sm_", dev.major, dev.minor);
  for (auto [t, name] : {std::make_tuple(&q, "q"), std::make_tuple(&k, "k"), std::make_tuple(&vt, "vt")})
    TORCH_CHECK(t->scalar_type() == at::kFloat8_e4m3fn, "flash3.fwd_fp8_sm90: ", name,
                " must be float8_e4m3fn, got ", t->scalar_type());
  TORCH_CHECK(out.scalar_type() == at::kBFloat16, "flash3.fwd_fp8_sm90: out must be bfloat16");
  TORCH_CHECK(lse.scalar_type() == at::kFloat, "flash3.fwd_fp8_sm90: lse must be float32");
  const bool varlen = cu_seqlens_q.has_value();
  TORCH_CHECK(cu_seqlens_q.has_value() == cu_seqlens_k.has_value(),
              "flash3.fwd_fp8_sm90: pass both cu_seqlens_q and cu_seqlens_k, or neither");
  const int qdim = varlen ? 3 : 4;
  for (auto [t, name] : {std::make_tuple(&q, "q"), std::make_tuple(&k, "k"), std::make_tuple(&vt, "vt"),
                         std::make_tuple(&out, "out")})
    TORCH_CHECK(t->dim() == qdim, "flash3.fwd_fp8_sm90: ", name, " must be ", qdim, "-D, got ", t->sizes());
  const int64_t b = varlen ? cu_seqlens_q->numel() - 1 : q.size(0);
  TORCH_CHECK(b >= 0, "flash3.fwd_fp8_sm90: cu_seqlens_q must have batch + 1 >= 1 entries");
  const int64_t h = q.size(-2), d = q.size(-1), h_k = k.size(-2);
  const int64_t d_v = vt.size(-2), cols = vt.size(-1);
  const int64_t s_q = varlen ? max_seqlen_q : q.size(1), s_k = varlen ? max_seqlen_k : k.size(1);
  const int64_t total_q = varlen ? q.size(0) : b * s_q, total_k = varlen ? k.size(0) : b * s_k;
  if (varlen) {
    TORCH_CHECK(max_seqlen_q >= 0 && max_seqlen_k >= 0,
                "flash3.fwd_fp8_sm90: max_seqlen_q/max_seqlen_k must be >= 0 for varlen");
    check_shape(k, "k", {total_k, h_k, d});
    check_shape(vt, "vt", {h_k, d_v, static_cast<int64_t>(fp8_varlen_vt_offset(total_k, b))});
    check_shape(out, "out", {total_q, h, d_v});
    check_shape(lse, "lse", {h, total_q});
    check_seqlens(cu_seqlens_q, "cu_seqlens_q", b + 1, q);
    check_seqlens(cu_seqlens_k, "cu_seqlens_k", b + 1, q);
  } else {
    check_shape(k, "k", {b, s_k, h_k, d});
    TORCH_CHECK(vt.size(0) == b && vt.size(1) == h_k && cols % 16 == 0 && cols >= s_k,
                "flash3.fwd_fp8_sm90: vt must be (b, h_k, d_v, s_pad) with s_pad a multiple of 16 >= s_k, got ",
                vt.sizes());
    check_shape(out, "out", {b, s_q, h, d_v});
    check_shape(lse, "lse", {b, h, s_q});
  }
  TORCH_CHECK(h_k > 0 && h % h_k == 0, "flash3.fwd_fp8_sm90: the number of query heads (", h,
              ") must be a multiple of the number of kv heads (", h_k, ")");
  TORCH_CHECK(d % 16 == 0 && d_v % 16 == 0 && d > 0 && d_v > 0 && d <= 256 && d_v <= 256,
              "flash3.fwd_fp8_sm90: head dims must be multiples of 16 in [16, 256], got d=", d, " d_v=", d_v);
  TORCH_CHECK(softcap >= 0.0, "flash3.fwd_fp8_sm90: softcap must be >= 0 (0 = off), got ", softcap);
  TORCH_CHECK(softmax_scale > 0.0 && std::isfinite(softmax_scale),
              "flash3.fwd_fp8_sm90: softmax_scale must be finite and > 0, got ", softmax_scale);
  TORCH_CHECK(window_left >= -1 && window_right >= -1,
              "flash3.fwd_fp8_sm90: window sizes must be >= -1 (-1 = unbounded)");
  const FwdKernelEntry* picked =
      pick_fwd_kernel(fwd_fp8_kernels(), true, static_cast<int>(d), static_cast<int>(d_v), false);
  TORCH_CHECK(picked != nullptr, "flash3.fwd_fp8_sm90: no FP8 kernel for head dim (", d, ", ", d_v,
              ") or larger in this build of flash3._C; see torch.ops.flash3.kernel_info()");
  const FwdLauncher launch = picked->launch;
  // The tile of the kernel that runs (possibly a larger head dim's): descales index its key blocks.
  const TileShape tile = fwd_fp8_tile_shape(picked->head_dim, picked->head_dim_v);

  if (b == 0 || h == 0 || s_q == 0 || total_q == 0) return;
  if (s_k == 0 || total_k == 0) {
    out.zero_();
    lse.fill_(-std::numeric_limits<float>::infinity());
    return;
  }
  check_tma_layout(q, "q");
  check_tma_layout(k, "k");
  check_tma_layout(vt, "vt");
  check_tma_layout(out, "out");
  TORCH_CHECK(lse.stride(-1) == 1 || lse.size(-1) <= 1, "flash3.fwd_fp8_sm90: lse must have a contiguous last dimension");

  FwdParams p;
  Tensor keep_q, keep_k, keep_v;
  p.fp8.q = fp8_descale(q_descale, "q_descale", q, b, h, s_q, q_block, 64, keep_q);
  p.fp8.k = fp8_descale(k_descale, "k_descale", q, b, h_k, s_k, kv_block, tile.block_n, keep_k);
  p.fp8.v = fp8_descale(v_descale, "v_descale", q, b, h_k, s_k, kv_block, tile.block_n, keep_v);
  if (v_channel_descale.has_value()) {
    const Tensor& vc = *v_channel_descale;
    TORCH_CHECK(vc.scalar_type() == at::kFloat && vc.device() == q.device(),
                "flash3.fwd_fp8_sm90: v_channel_descale must be float32 on ", q.device());
    check_shape(vc, "v_channel_descale", {b, h_k, d_v});
    p.fp8.v_channel = Descale{vc.data_ptr<float>(), vc.stride(0), vc.stride(1), vc.stride(2), static_cast<int>(d_v)};
  }
  set_q_k_out(p, q, k, out, lse, cu_seqlens_q, cu_seqlens_k, b, s_q, s_k);
  to_int(cols, "vt columns");
  p.v = vt.data_ptr();
  // Vt: ([batch,] head, d_v, tokens); v_row_stride = the stride of the d_v index (tokens are contiguous).
  p.v_batch_stride = varlen ? 0 : tma_stride(vt, 0);
  p.v_head_stride = tma_stride(vt, qdim - 3);
  p.v_row_stride = tma_stride(vt, qdim - 2);
  p.is_bf16 = true;
  set_mask_and_launch(p, launch, q, dev, softmax_scale, softcap, causal, window_left, window_right,
                      "flash3.fwd_fp8_sm90", nullptr);
}

void fwd_fp8_sm90_meta(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                       const Tensor&, const Tensor&, const Tensor&, const std::optional<Tensor>&, int64_t,
                       int64_t, double, bool, int64_t, int64_t, double, const std::optional<Tensor>&,
                       const std::optional<Tensor>&, int64_t, int64_t) {}

// Shapes and dtypes of out/lse are fixed by the caller, so the fake/meta kernel has nothing to do.
void fwd_sm90_meta(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                   const std::optional<Tensor>&, const std::optional<Tensor>&,
                   const std::optional<Tensor>&, int64_t, int64_t, double, bool, int64_t, int64_t,
                   double, const std::optional<Tensor>&, const std::optional<Tensor>&) {}

std::string kernel_info() {
  std::vector<std::tuple<int, int, int>> entries;  // (dtype order, d, d_v)
  for (const FwdKernelEntry& e : fwd_kernels())
    entries.emplace_back(e.is_bf16 ? 0 : 1, e.head_dim, e.head_dim_v);
  std::sort(entries.begin(), entries.end());
  entries.erase(std::unique(entries.begin(), entries.end()), entries.end());
  std::ostringstream os;
  os << "{\"fwd\": [";
  for (size_t i = 0; i < entries.size(); ++i) {
    if (i) os << ", ";
    os << "[\"" << (std::get<0>(entries[i]) == 0 ? "bf16" : "fp16") << "\", "
       << std::get<1>(entries[i]) << ", " << std::get<2>(entries[i]) << "]";
  }
  std::vector<std::pair<int, int>> fp8;  // the FP8 (e4m3 in, bf16 out) kernels: (d, d_v)
  for (const FwdKernelEntry& e : fwd_fp8_kernels()) fp8.emplace_back(e.head_dim, e.head_dim_v);
  std::sort(fp8.begin(), fp8.end());
  fp8.erase(std::unique(fp8.begin(), fp8.end()), fp8.end());
  os << "], \"fwd_fp8\": [";
  for (size_t i = 0; i < fp8.size(); ++i) os << (i ? ", " : "") << "[" << fp8[i].first << ", " << fp8[i].second << "]";
    std::vector<std::tuple<int, int, int>> bwd;  // the backward kernels: (dtype order, d, d_v)
  for (const BwdKernelEntry& e : bwd_kernels()) bwd.emplace_back(e.is_bf16 ? 0 : 1, e.head_dim, e.head_dim_v);
  std::sort(bwd.begin(), bwd.end());
  bwd.erase(std::unique(bwd.begin(), bwd.end()), bwd.end());
  os << "], \"bwd\": [";
  for (size_t i = 0; i < bwd.size(); ++i)
    os << (i ? ", " : "") << "[\"" << (std::get<0>(bwd[i]) == 0 ? "bf16" : "fp16") << "\", " << std::get<1>(bwd[i])
       << ", " << std::get<2>(bwd[i]) << "]";
  // The decode (KV-cache) kernels, caches of q's dtype then FP8 caches: (q dtype, d, d_v).
  for (bool fp8_cache : {false, true}) {
    std::vector<std::tuple<int, int, int>> dec;  // (dtype order, d, d_v)
    for (const FwdKernelEntry& e : fwd_decode_kernels(fp8_cache))
      dec.emplace_back(e.is_bf16 ? 0 : 1, e.head_dim, e.head_dim_v);
    std::sort(dec.begin(), dec.end());
    dec.erase(std::unique(dec.begin(), dec.end()), dec.end());
    os << (fp8_cache ? "], \"decode_fp8_cache\": [" : "], \"decode\": [");
    for (size_t i = 0; i < dec.size(); ++i)
      os << (i ? ", " : "") << "[\"" << (std::get<0>(dec[i]) == 0 ? "bf16" : "fp16") << "\", "
         << std::get<1>(dec[i]) << ", " << std::get<2>(dec[i]) << "]";
  }
  os << "], \"arch\": \"sm_90a\", \"cutlass\": \"" << FLASH3_CUTLASS_MAJOR << "."
     << FLASH3_CUTLASS_MINOR << "." << FLASH3_CUTLASS_PATCH << "\"}";
  return os.str();
}

}  // namespace
}  // namespace flash3

TORCH_LIBRARY(flash3, m) {
  m.def(
      "fwd_sm90(Tensor q, Tensor k, Tensor v, Tensor(a!) out, Tensor(b!) lse, "
      "Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, Tensor? seqused_k, int max_seqlen_q, "
      "int max_seqlen_k, float softmax_scale, bool causal, int window_left, int window_right, "
      "float softcap, Tensor? sinks=None, Tensor? alibi_slopes=None) -> ()");
  m.def(
      "fwd_fp8_sm90(Tensor q, Tensor k, Tensor vt, Tensor(a!) out, Tensor(b!) lse, Tensor q_descale, "
      "Tensor k_descale, Tensor v_descale, Tensor? v_channel_descale, int q_block, int kv_block, "
      "float softmax_scale, bool causal, int window_left, int window_right, float softcap, "
      "Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_k=None, int max_seqlen_q=0, int max_seqlen_k=0) -> ()");
  // No tensor arguments: a catch-all kernel, callable without a GPU.
  m.def("kernel_info() -> str", &flash3::kernel_info);
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
