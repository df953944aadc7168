#include "flash3/host/fwd_params.h"

#include <exception>
#include <sstream>

#include "flash3/host/mask.h"

namespace flash3::host {

void set_q_k_out(FwdParams& p, const TensorView& q, const TensorView& k, const TensorView& out, const TensorView& lse,
                 const TensorView* cu_seqlens_q, const TensorView* cu_seqlens_k, int64_t batch, int64_t s_q,
                 int64_t s_k) {
  const bool varlen = cu_seqlens_q != nullptr;
  const int dim = varlen ? 3 : 4;
  auto strides = [&](const TensorView& t, int64_t& bs, int64_t& rs, int64_t& hs) {
    bs = varlen ? 0 : tma_stride(t, 0);
    rs = tma_stride(t, dim - 3);
    hs = tma_stride(t, dim - 2);
  };
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.o = out.data_ptr();
  p.lse = lse.ptr<float>();
  strides(q, p.q_batch_stride, p.q_row_stride, p.q_head_stride);
  strides(k, p.k_batch_stride, p.k_row_stride, p.k_head_stride);
  strides(out, p.o_batch_stride, p.o_row_stride, p.o_head_stride);
  p.lse_batch_stride = varlen ? 0 : lse.stride(0);
  p.lse_head_stride = lse.stride(varlen ? 0 : 1);

  p.batch = to_int(batch, "batch");
  p.seqlen_q = to_int(s_q, "seqlen_q");
  p.seqlen_k = to_int(s_k, "seqlen_k");
  p.num_heads = to_int(q.size(-2), "num_heads");
  p.num_heads_k = to_int(k.size(-2), "num_heads_k");
  p.head_dim = static_cast<int>(q.size(-1));
  p.head_dim_v = static_cast<int>(out.size(-1));
  // Batched: b * s (a KV cache's b * capacity) may pass 2^31, the kernels never read it there.
  p.total_q = total_rows(varlen ? q.size(0) : batch * s_q, varlen, "total_q");
  p.total_k = total_rows(varlen ? k.size(0) : batch * s_k, varlen, "total_k");
  p.cu_seqlens_q = varlen ? cu_seqlens_q->ptr<const int>() : nullptr;
  p.cu_seqlens_k = varlen ? cu_seqlens_k->ptr<const int>() : nullptr;
}

void set_mask_and_launch(FwdParams& p, FwdLauncher launch, Backend& be, const DeviceInfo& dev, double softmax_scale,
                         double softcap, int64_t window_left, int64_t window_right, const char* op,
                         const char* dtype, int64_t attention_chunk) {
  auto tag = [&] {
    std::ostringstream os;
    os << op << " (";
    if (dtype != nullptr) os << dtype << ", ";
    os << "d=" << p.head_dim << ", d_v=" << p.head_dim_v << ")";
    return os.str();
  };
  p.softmax_scale = static_cast<float>(softmax_scale);
  p.softcap = static_cast<float>(softcap);
  set_mask(p, window_left, window_right, attention_chunk);

  p.num_sms = dev.num_sms;
  p.l2_bytes = dev.l2_bytes;
  // Causal, local and varlen tiles differ in cost: the kernel's dynamic scheduler takes them from
  // an atomic counter (fwd/scheduler.cuh). A fresh zeroed int32 per call, on the call's stream, so
  // calls on different streams never share it and CUDA graphs capture it.
  if (fwd_uses_dynamic_scheduler(p)) p.tile_counter = static_cast<int*>(be.alloc(1, DType::i32, Init::zero));

  if (be.tracing()) {
    std::ostringstream os;
    os << op << (dtype ? " " : "") << (dtype ? dtype : "") << " d=" << p.head_dim << " d_v=" << p.head_dim_v
       << " b=" << p.batch << " s_q=" << p.seqlen_q << " s_k=" << p.seqlen_k << " h=" << p.num_heads
       << " h_k=" << p.num_heads_k << " window=(" << p.window_left << ","
       << p.window_right << ")" << (p.attention_chunk ? " attention_chunk=" : "")
       << (p.attention_chunk ? std::to_string(p.attention_chunk) : std::string()) << " softcap=" << p.softcap << " varlen=" << int(p.cu_seqlens_q != nullptr)
       << " seqused_k=" << int(p.seqused_k != nullptr) << " seqused_q=" << int(p.seqused_q != nullptr) << " dynamic=" << int(p.tile_counter != nullptr)
       << " num_sms=" << p.num_sms;
    be.trace(os.str());
  }
  try {
    launch(p, be.stream());
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(tag() + ": kernel launch failed: " + e.what());
  }
  const char* err = last_launch_error();
  check(err == nullptr, tag(), ": CUDA error after launch: ", err ? err : "");
}

}  // namespace flash3::host
