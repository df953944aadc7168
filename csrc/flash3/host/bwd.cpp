#include "flash3/host/bwd.h"

#include <algorithm>
#include <exception>
#include <sstream>

#include "flash3/bwd/api.h"
#include "flash3/bwd/params.h"
#include "flash3/host/check.h"
#include "flash3/host/device.h"
#include "flash3/host/kernel_pick.h"
#include "flash3/host/mask.h"

namespace flash3::host {
namespace {

constexpr const char* kOp = "flash3.bwd_sm90";

// Element strides of a (b, s, h, d) or packed (total, h, d) tensor, as the kernel takes them.
void rows_strides(const TensorView& t, const char* name, bool varlen, int64_t& bs, int64_t& rs, int64_t& hs) {
  const int dim = varlen ? 3 : 4;
  check_tma_layout(t, name, kOp);
  bs = varlen ? 0 : tma_stride(t, 0);
  rs = tma_stride(t, dim - 3);
  hs = tma_stride(t, dim - 2);
}

}  // namespace

void bwd_sm90(Backend& be, const TensorView& dout, const TensorView& q, const TensorView& k, const TensorView& v,
              const TensorView& out, const TensorView& lse, const TensorView* dlse, const TensorView& dq,
              const TensorView& dk, const TensorView& dv, const TensorView* cu_seqlens_q,
              const TensorView* cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k, double softmax_scale,
              int64_t window_left, int64_t window_right, double softcap, bool deterministic,
              const TensorView* sinks, const TensorView* dsinks, const TensorView* alibi_slopes,
              const TensorView* seqused_q, int64_t attention_chunk) {
  check(q.device.kind == DeviceKind::cuda, kOp, ": q must be a CUDA tensor, got ", q.device);
  const DeviceInfo& dev = device_info(q.device.index);
  check_hopper(dev, q, kOp);
  const DType dtype = q.dtype;  // bf16/fp16: the pick's check
  for (auto [t, name] : {std::make_pair(&dout, "dout"), std::make_pair(&k, "k"), std::make_pair(&v, "v"),
                         std::make_pair(&out, "out"), std::make_pair(&dq, "dq"), std::make_pair(&dk, "dk"),
                         std::make_pair(&dv, "dv")}) {
    check(t->device == q.device, kOp, ": ", name, " must be on ", q.device, ", got ", t->device);
    check(t->dtype == dtype, kOp, ": ", name, " must have q's dtype ", q.dtype_name, ", got ", t->dtype_name);
  }
  for (auto [t, name] : {std::make_pair(&lse, "lse"), std::make_pair(dlse ? dlse : &lse, "dlse")}) {
    check(t->device == q.device && t->dtype == DType::f32, kOp, ": ", name, " must be float32 on ", q.device);
    check(t->stride(-1) == 1 || t->size(-1) <= 1, kOp, ": ", name, " must have a contiguous last dimension");
  }

  const QkvShape s =
      check_qkv_shapes(kOp, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k);
  const bool varlen = s.varlen;
  const int64_t batch = s.batch, h = s.h, d = s.d, h_k = s.h_k, d_v = s.d_v, s_q = s.s_q, s_k = s.s_k;
  const int64_t total_q = s.total_q, total_k = s.total_k;
  check_shape(dout, "dout", out.sizes());
  check_shape(dq, "dq", q.sizes());
  check_shape(dk, "dk", k.sizes());
  check_shape(dv, "dv", v.sizes());
  if (dlse) check_shape(*dlse, "dlse", lse.sizes());
  check((sinks != nullptr) == (dsinks != nullptr), kOp,
        ": pass both sinks and dsinks (its gradient, written), or neither");
  for (auto [t, name] : {std::make_pair(sinks, "sinks"), std::make_pair(dsinks, "dsinks")}) {
    if (t == nullptr) continue;
    check(t->device == q.device, kOp, ": ", name, " must be on ", q.device, ", got ", t->device);
    check(t->dtype == DType::f32, kOp, ": ", name, " must be float32, got ", t->dtype_name);
    check_shape(*t, name, {h});
    check(t->is_contiguous(), kOp, ": ", name, " must be contiguous");
  }
  int64_t alibi_stride = 0;
  const float* alibi_ptr = check_alibi(alibi_slopes, batch, h, q, kOp, &alibi_stride);
  check_seqlens(seqused_q, "seqused_q", batch, q);
  check(seqused_q == nullptr || varlen, kOp, ": seqused_q needs packed queries (cu_seqlens_q)");
  check(seqused_q == nullptr || sinks == nullptr, kOp, ": seqused_q is not supported with sinks");
  check_heads(kOp, h, h_k);
  check_score_options(kOp, softcap, window_left, window_right);
  check_attention_chunk(kOp, attention_chunk);
  const bool is_bf16 = dtype == DType::bf16;
  const BwdKernelEntry* kernel =
      checked_pick(kOp, be.build_name(), KernelFamily::bwd, q, d, d_v, softmax_scale).bwd;
  if (be.tracing()) {
    std::ostringstream os;
    os << "kernel bwd " << dtype_name(kernel->is_bf16) << " d=" << kernel->head_dim << " d_v=" << kernel->head_dim_v;
    be.trace(os.str());
  }

  // Tokens outside every sequence get 0 (the reference's rule); the kernels write only real rows.
  if (varlen) {
    be.fill(dq, 0.f);
    be.fill(dk, 0.f);
    be.fill(dv, 0.f);
  }
  const bool no_rows = total_q == 0 || h == 0 || batch == 0 || s_q == 0;
  if (no_rows || total_k == 0) {  // nothing sees anything
    be.fill(dq, 0.f);
    be.fill(dk, 0.f);
    be.fill(dv, 0.f);
    if (dsinks) be.fill(*dsinks, 0.f);
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
  p.lse = lse.ptr<const float>();
  p.lse_batch_stride = varlen ? 0 : lse.stride(0);
  p.lse_head_stride = lse.stride(varlen ? 0 : 1);
  if (dlse) {
    p.dlse = dlse->ptr<const float>();
    p.dlse_batch_stride = varlen ? 0 : dlse->stride(0);
    p.dlse_head_stride = dlse->stride(varlen ? 0 : 1);
  }
  if (sinks) {
    p.sinks = sinks->ptr<const float>();
    p.dsinks = dsinks->ptr<float>();
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
  p.cu_seqlens_q = varlen ? cu_seqlens_q->ptr<const int>() : nullptr;
  p.cu_seqlens_k = varlen ? cu_seqlens_k->ptr<const int>() : nullptr;
  p.seqused_q = seqused_q != nullptr ? seqused_q->ptr<const int>() : nullptr;
  p.softmax_scale = static_cast<float>(softmax_scale);
  p.softcap = static_cast<float>(softcap);
  p.alibi_slopes = alibi_ptr, p.alibi_batch_stride = alibi_stride;
  set_mask(p, window_left, window_right, attention_chunk);
  p.deterministic = deterministic;
  p.is_bf16 = is_bf16;

  // Workspace, on the call's stream's allocator: no host synchronization, capturable.
  const BwdWorkspace ws = bwd_workspace(p, kernel->head_dim);
  p.lse_log2 = static_cast<float*>(be.alloc(2 * ws.row_floats + ws.dq_floats, DType::f32, Init::none));
  p.dpsum = p.lse_log2 + ws.row_floats;
  p.dq_accum = p.dpsum + ws.row_floats;
  if (deterministic)
    p.dq_semaphore = static_cast<int*>(be.alloc(std::max<int64_t>(ws.semaphore_ints, 1), DType::i32, Init::none));

  if (be.tracing()) {
    std::ostringstream os;
    os << kOp << " " << dtype_name(is_bf16) << " d=" << p.head_dim << " d_v=" << p.head_dim_v << " b=" << p.batch
       << " s_q=" << p.seqlen_q << " s_k=" << p.seqlen_k << " h=" << p.num_heads << " h_k=" << p.num_heads_k
       << " window=(" << p.window_left << "," << p.window_right << ")"
       << (p.attention_chunk ? " attention_chunk=" : "")
       << (p.attention_chunk ? std::to_string(p.attention_chunk) : std::string()) << " softcap=" << p.softcap << " varlen=" << int(varlen) << " dlse=" << int(p.dlse != nullptr)
       << " deterministic=" << int(p.deterministic) << " sinks=" << int(p.sinks != nullptr)
       << " seqused_q=" << int(p.seqused_q != nullptr);
    be.trace(os.str());
  }
  try {
    kernel->launch(p, be.stream());
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    std::ostringstream os;
    os << kOp << " (" << dtype_name(is_bf16) << ", d=" << d << ", d_v=" << d_v << "): " << e.what();
    throw Error(os.str());
  }
  const char* err = last_launch_error();
  check(err == nullptr, kOp, ": CUDA error after launch: ", err ? err : "");
}

}  // namespace flash3::host
