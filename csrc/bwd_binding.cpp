// torch side of the backward kernels (a fragment of the flash3 op library; binding.cpp defines it).
//
//   flash3::bwd_sm90(dout, q, k, v, out, lse, dlse?, dq!, dk!, dv!, cu_seqlens_q?, cu_seqlens_k?,
//                    max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right,
//                    softcap, deterministic, sinks?=None, dsinks!?=None, alibi_slopes?=None) -> ()
//       CUDA: dq, dk, dv of attention (the forward's out and lse given), with the gradient dlse
//       flowing into lse when given, exactly as flash3/reference/__init__.py backward defines them;
//       with attention sinks (float32 (num_heads,); lse then includes them, dq/dk/dv need nothing
//       else) also their gradient into dsinks (float32 (num_heads,), required with sinks), summed in
//       a fixed order (bitwise reproducible whatever `deterministic`); the
//       workspace (csrc/flash3/bwd/params.h) is allocated on the current stream, nothing is read
//       back to the host. deterministic: bitwise reproducible run to run. Meta: nothing.
// Batched tensors (b, s, heads, dim), lse/dlse (b, h, s_q); varlen (total, heads, dim), lse/dlse
// (h, total_q). flash3/ops.py validates first; these checks defend the kernel's memory accesses.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/library.h>

#include <cmath>
#include <exception>
#include <optional>

#include "binding_common.h"
#include "flash3/bwd/api.h"
#include "flash3/bwd/params.h"

namespace flash3 {
namespace {

constexpr const char* kOp = "flash3.bwd_sm90";

// Element strides of a (b, s, h, d) or packed (total, h, d) tensor, as the kernel takes them.
void rows_strides(const Tensor& t, const char* name, bool varlen, int64_t& bs, int64_t& rs, int64_t& hs) {
  const int dim = varlen ? 3 : 4;
  check_tma_layout(t, name, kOp);
  bs = varlen ? 0 : tma_stride(t, 0);
  rs = tma_stride(t, dim - 3);
  hs = tma_stride(t, dim - 2);
}

void bwd_sm90_cuda(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                   const Tensor& lse, const std::optional<Tensor>& dlse, const Tensor& dq, const Tensor& dk,
                   const Tensor& dv, const std::optional<Tensor>& cu_seqlens_q,
                   const std::optional<Tensor>& cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
                   double softmax_scale, bool causal, int64_t window_left, int64_t window_right, double softcap,
                   bool deterministic, const std::optional<Tensor>& sinks, const std::optional<Tensor>& dsinks,
                   const std::optional<Tensor>& alibi_slopes) {
  TORCH_CHECK(q.is_cuda(), kOp, ": q must be a CUDA tensor, got ", q.device());
  const c10::cuda::CUDAGuard guard(q.device());
  const DeviceInfo& dev = device_info(q.get_device());
  TORCH_CHECK(dev.major == 9 && dev.minor == 0, kOp, " needs an sm_90 (Hopper) GPU; ", q.device(), " is sm_",
              dev.major, dev.minor);
  const auto dtype = q.scalar_type();
  TORCH_CHECK(dtype == at::kBFloat16 || dtype == at::kHalf, kOp, ": q must be bfloat16 or float16, got ", dtype);
  for (auto [t, name] : {std::make_pair(&dout, "dout"), std::make_pair(&k, "k"), std::make_pair(&v, "v"),
                         std::make_pair(&out, "out"), std::make_pair(&dq, "dq"), std::make_pair(&dk, "dk"),
                         std::make_pair(&dv, "dv")}) {
    TORCH_CHECK(t->device() == q.device(), kOp, ": ", name, " must be on ", q.device(), ", got ", t->device());
    TORCH_CHECK(t->scalar_type() == dtype, kOp, ": ", name, " must have q's dtype ", dtype, ", got ",
                t->scalar_type());
  }
  for (auto [t, name] : {std::make_pair(&lse, "lse"), std::make_pair(dlse ? &*dlse : &lse, "dlse")}) {
    TORCH_CHECK(t->device() == q.device() && t->scalar_type() == at::kFloat, kOp, ": ", name,
                " must be float32 on ", q.device());
    TORCH_CHECK(t->stride(-1) == 1 || t->size(-1) <= 1, kOp, ": ", name, " must have a contiguous last dimension");
  }

  const bool varlen = cu_seqlens_q.has_value();
  TORCH_CHECK(cu_seqlens_q.has_value() == cu_seqlens_k.has_value(), kOp,
              ": pass both cu_seqlens_q and cu_seqlens_k, or neither");
  const int qdim = varlen ? 3 : 4;
  for (auto [t, name] : {std::make_pair(&q, "q"), std::make_pair(&k, "k"), std::make_pair(&v, "v")})
    TORCH_CHECK(t->dim() == qdim, kOp, ": ", name, " must be ", qdim, "-D, got ", t->sizes());
  const int64_t batch = varlen ? cu_seqlens_q->numel() - 1 : q.size(0);
  TORCH_CHECK(batch >= 0, kOp, ": cu_seqlens_q must have batch + 1 >= 1 entries");
  const int64_t h = q.size(-2), d = q.size(-1), h_k = k.size(-2), d_v = v.size(-1);
  const int64_t s_q = varlen ? max_seqlen_q : q.size(1), s_k = varlen ? max_seqlen_k : k.size(1);
  const int64_t total_q = varlen ? q.size(0) : batch * s_q, total_k = varlen ? k.size(0) : batch * s_k;
  if (varlen) {
    check_shape(k, "k", {total_k, h_k, d});
    check_shape(v, "v", {total_k, h_k, d_v});
    check_shape(out, "out", {total_q, h, d_v});
    check_shape(lse, "lse", {h, total_q});
    TORCH_CHECK(max_seqlen_q >= 0 && max_seqlen_k >= 0, kOp, ": max_seqlen_q/k must be >= 0");
  } else {
    check_shape(k, "k", {batch, s_k, h_k, d});
    check_shape(v, "v", {batch, s_k, h_k, d_v});
    check_shape(out, "out", {batch, s_q, h, d_v});
    check_shape(lse, "lse", {batch, h, s_q});
  }
  check_shape(dout, "dout", out.sizes().vec());
  check_shape(dq, "dq", q.sizes().vec());
  check_shape(dk, "dk", k.sizes().vec());
  check_shape(dv, "dv", v.sizes().vec());
  if (dlse) check_shape(*dlse, "dlse", lse.sizes().vec());
  TORCH_CHECK(sinks.has_value() == dsinks.has_value(), kOp,
              ": pass both sinks and dsinks (its gradient, written), or neither");
  for (auto [t, name] : {std::make_pair(sinks ? &*sinks : nullptr, "sinks"),
                         std::make_pair(dsinks ? &*dsinks : nullptr, "dsinks")}) {
    if (t == nullptr) continue;
    TORCH_CHECK(t->device() == q.device(), kOp, ": ", name, " must be on ", q.device(), ", got ", t->device());
    TORCH_CHECK(t->scalar_type() == at::kFloat, kOp, ": ", name, " must be float32, got ", t->scalar_type());
    check_shape(*t, name, {h});
    TORCH_CHECK(t->is_contiguous(), kOp, ": ", name, " must be contiguous");
  }
  int64_t alibi_stride = 0;
  const float* alibi_ptr = check_alibi(alibi_slopes, batch, h, q, kOp, &alibi_stride);
  check_seqlens(cu_seqlens_q, "cu_seqlens_q", batch + 1, q);
  check_seqlens(cu_seqlens_k, "cu_seqlens_k", batch + 1, q);
  TORCH_CHECK(h_k > 0 && h % h_k == 0, kOp, ": the number of query heads (", h,
              ") must be a multiple of the number of kv heads (", h_k, ")");
  TORCH_CHECK(d % 8 == 0 && d_v % 8 == 0 && d > 0 && d_v > 0 && d <= 256 && d_v <= 256, kOp,
              ": head dims must be multiples of 8 in [8, 256], got d=", d, " d_v=", d_v);
  TORCH_CHECK(softcap >= 0.0, kOp, ": softcap must be >= 0 (0 = off), got ", softcap);
  TORCH_CHECK(softmax_scale > 0.0 && std::isfinite(softmax_scale), kOp,
              ": softmax_scale must be finite and > 0, got ", softmax_scale);
  TORCH_CHECK(window_left >= -1 && window_right >= -1, kOp, ": window sizes must be >= -1 (-1 = unbounded)");
  const bool is_bf16 = dtype == at::kBFloat16;
  const BwdKernelEntry* kernel = find_bwd_kernel(is_bf16, static_cast<int>(d), static_cast<int>(d_v));
  TORCH_CHECK(kernel != nullptr, kOp, ": no ", dtype_name(is_bf16), " backward kernel for head dim (", d, ", ", d_v,
              ") or larger in this build of flash3._C; see torch.ops.flash3.kernel_info()");

  // Tokens outside every sequence get 0 (the reference's rule); the kernels write only real rows.
  if (varlen) {
    dq.zero_();
    dk.zero_();
    dv.zero_();
  }
  const bool no_rows = total_q == 0 || h == 0 || batch == 0 || s_q == 0;
  if (no_rows || total_k == 0) {  // nothing sees anything
    dq.zero_();
    dk.zero_();
    dv.zero_();
    if (dsinks) dsinks->zero_();
    // With sinks and queries but no key, the sink still has a gradient (every row's P_sink is 1):
    // the launcher runs only the preprocess and the sink kernel then.
    if (no_rows || !sinks) return;
  }

  BwdParams p;
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.o = out.data_ptr();
  p.dout = dout.data_ptr();
  p.dq = dq.data_ptr();
  p.dk = dk.data_ptr();
  p.dv = dv.data_ptr();
  rows_strides(q, "q", varlen, p.q_batch_stride, p.q_row_stride, p.q_head_stride);
  rows_strides(k, "k", varlen, p.k_batch_stride, p.k_row_stride, p.k_head_stride);
  rows_strides(v, "v", varlen, p.v_batch_stride, p.v_row_stride, p.v_head_stride);
  rows_strides(out, "out", varlen, p.o_batch_stride, p.o_row_stride, p.o_head_stride);
  rows_strides(dout, "dout", varlen, p.do_batch_stride, p.do_row_stride, p.do_head_stride);
  rows_strides(dq, "dq", varlen, p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride);
  rows_strides(dk, "dk", varlen, p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride);
  rows_strides(dv, "dv", varlen, p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride);
  p.lse = lse.data_ptr<float>();
  p.lse_batch_stride = varlen ? 0 : lse.stride(0);
  p.lse_head_stride = lse.stride(varlen ? 0 : 1);
  if (dlse) {
    p.dlse = dlse->data_ptr<float>();
    p.dlse_batch_stride = varlen ? 0 : dlse->stride(0);
    p.dlse_head_stride = dlse->stride(varlen ? 0 : 1);
  }
  if (sinks) {
    p.sinks = sinks->data_ptr<float>();
    p.dsinks = dsinks->data_ptr<float>();
  }
  p.batch = to_int(batch, "batch");
  p.seqlen_q = to_int(s_q, "seqlen_q");
  p.seqlen_k = to_int(s_k, "seqlen_k");
  p.num_heads = to_int(h, "num_heads");
  p.num_heads_k = to_int(h_k, "num_heads_k");
  p.head_dim = static_cast<int>(d);
  p.head_dim_v = static_cast<int>(d_v);
  p.total_q = total_rows(total_q, varlen, "total_q");  // as the forward: batched b * s may pass 2^31
  p.total_k = total_rows(total_k, varlen, "total_k");
  p.cu_seqlens_q = varlen ? cu_seqlens_q->data_ptr<int>() : nullptr;
  p.cu_seqlens_k = varlen ? cu_seqlens_k->data_ptr<int>() : nullptr;
  p.softmax_scale = static_cast<float>(softmax_scale);
  p.softcap = static_cast<float>(softcap);
  p.alibi_slopes = alibi_ptr, p.alibi_batch_stride = alibi_stride;
  p.is_causal = causal;
  p.window_left = static_cast<int>(std::max<int64_t>(window_left, -1));
  p.window_right = causal ? 0 : static_cast<int>(std::max<int64_t>(window_right, -1));
  p.deterministic = deterministic;
  p.is_bf16 = is_bf16;

  // Workspace, on the current stream's allocator: no host synchronization, capturable.
  const BwdWorkspace ws = bwd_workspace(p, kernel->head_dim);
  const Tensor rows = at::empty({2 * ws.row_floats + ws.dq_floats}, q.options().dtype(at::kFloat));
  p.lse_log2 = rows.data_ptr<float>();
  p.dpsum = p.lse_log2 + ws.row_floats;
  p.dq_accum = p.dpsum + ws.row_floats;
  Tensor semaphore;
  if (deterministic) {
    semaphore = at::empty({std::max<int64_t>(ws.semaphore_ints, 1)}, q.options().dtype(at::kInt));
    p.dq_semaphore = semaphore.data_ptr<int>();
  }

  cudaStream_t stream = c10::cuda::getCurrentCUDAStream(q.get_device()).stream();
  try {
    kernel->launch(p, static_cast<void*>(stream));
  } catch (const c10::Error&) {
    throw;
  } catch (const std::exception& e) {
    TORCH_CHECK(false, kOp, " (", dtype_name(is_bf16), ", d=", d, ", d_v=", d_v, "): ", e.what());
  }
  const cudaError_t err = cudaGetLastError();
  TORCH_CHECK(err == cudaSuccess, kOp, ": CUDA error after launch: ", cudaGetErrorString(err));
}

void bwd_sm90_meta(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                   const std::optional<Tensor>&, const Tensor&, const Tensor&, const Tensor&,
                   const std::optional<Tensor>&, const std::optional<Tensor>&, int64_t, int64_t, double, bool,
                   int64_t, int64_t, double, bool, const std::optional<Tensor>&, const std::optional<Tensor>&,
                   const std::optional<Tensor>&) {}

}  // namespace
}  // namespace flash3

TORCH_LIBRARY_FRAGMENT(flash3, m) {
  m.def(
      "bwd_sm90(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor? dlse, "
      "Tensor(a!) dq, Tensor(b!) dk, Tensor(c!) dv, Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, "
      "int max_seqlen_q, int max_seqlen_k, float softmax_scale, bool causal, int window_left, "
      "int window_right, float softcap, bool deterministic, Tensor? sinks=None, Tensor(d!)? dsinks=None, "
      "Tensor? alibi_slopes=None) -> ()");
}

TORCH_LIBRARY_IMPL(flash3, CUDA, m) { m.impl("bwd_sm90", &flash3::bwd_sm90_cuda); }

TORCH_LIBRARY_IMPL(flash3, Meta, m) { m.impl("bwd_sm90", &flash3::bwd_sm90_meta); }
