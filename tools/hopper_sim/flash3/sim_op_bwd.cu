// The driver's "bwd" op: torch.ops.flash3.bwd_sm90 (csrc/bwd_binding.cpp bwd_sm90_cuda) line for
// line on simdrv::Tensor, so BwdParams and the workspace get exactly what the torch binding gives
// them. Keep the two in step.
//   tensors: dout q k v out lse dq dk dv, optional dlse cu_seqlens_q cu_seqlens_k sinks dsinks
//   scalars: max_seqlen_q max_seqlen_k softmax_scale causal window_left window_right softcap
//            deterministic
//   outputs: dq dk dv, dsinks (when given)
#include "sim_case.h"

#include "flash3/bwd/api.h"
#include "flash3/bwd/params.h"

namespace {

using namespace simdrv;

constexpr const char* kOp = "flash3.bwd_sm90";

// Element strides of a (b, s, h, d) or packed (total, h, d) tensor, as the kernel takes them.
void rows_strides(const Tensor& t, const char* name, bool varlen, int64_t& bs, int64_t& rs, int64_t& hs) {
  const int dim = varlen ? 3 : 4;
  check_tma_layout(t, name, kOp);
  bs = varlen ? 0 : tma_stride(t, 0);
  rs = tma_stride(t, dim - 3);
  hs = tma_stride(t, dim - 2);
}

// An at::empty buffer of the binding: uninitialized (simrun --uninit fills it with 0xFF).
void* scratch(size_t bytes) {
  void* ptr = nullptr;
  ck(cudaMalloc(&ptr, std::max<size_t>(bytes, 16)), "cudaMalloc");
  g_scratch.push_back(ptr);
  return ptr;
}

void bwd_sm90(const Case& c, const DeviceInfo& dev) {
  const Tensor &dout = c.t("dout"), &q = c.t("q"), &k = c.t("k"), &v = c.t("v"), &out = c.t("out"),
               &lse = c.t("lse"), &dq = c.t("dq"), &dk = c.t("dk"), &dv = c.t("dv");
  const Tensor *dlse = c.opt("dlse"), *cu_seqlens_q = c.opt("cu_seqlens_q"), *cu_seqlens_k = c.opt("cu_seqlens_k");
  const Tensor *sinks = c.opt("sinks"), *dsinks = c.opt("dsinks");
  const int64_t max_seqlen_q = c.integer("max_seqlen_q"), max_seqlen_k = c.integer("max_seqlen_k");
  const double softmax_scale = c.num("softmax_scale"), softcap = c.num("softcap");
  const bool causal = c.integer("causal") != 0, deterministic = c.integer("deterministic") != 0;
  const int64_t window_left = c.integer("window_left"), window_right = c.integer("window_right");

  check(dev.major == 9 && dev.minor == 0, kOp, " needs an sm_90 (Hopper) GPU; it is sm_", dev.major, dev.minor);
  const DType dtype = q.dtype;
  check(dtype == DType::bf16 || dtype == DType::fp16, kOp, ": q must be bfloat16 or float16, got ", dtype_str(dtype));
  for (auto [t, name] : {std::make_pair(&dout, "dout"), std::make_pair(&k, "k"), std::make_pair(&v, "v"),
                         std::make_pair(&out, "out"), std::make_pair(&dq, "dq"), std::make_pair(&dk, "dk"),
                         std::make_pair(&dv, "dv")})
    check(t->dtype == dtype, kOp, ": ", name, " must have q's dtype ", dtype_str(dtype), ", got ", dtype_str(t->dtype));
  for (auto [t, name] : {std::make_pair(&lse, "lse"), std::make_pair(dlse ? dlse : &lse, "dlse")}) {
    check(t->dtype == DType::f32, kOp, ": ", name, " must be float32");
    check(t->stride(-1) == 1 || t->size(-1) <= 1, kOp, ": ", name, " must have a contiguous last dimension");
  }

  const bool varlen = cu_seqlens_q != nullptr;
  check((cu_seqlens_q != nullptr) == (cu_seqlens_k != nullptr), kOp,
        ": pass both cu_seqlens_q and cu_seqlens_k, or neither");
  const int qdim = varlen ? 3 : 4;
  for (auto [t, name] : {std::make_pair(&q, "q"), std::make_pair(&k, "k"), std::make_pair(&v, "v")})
    check(t->dim() == qdim, kOp, ": ", name, " must be ", qdim, "-D, got ", shape_str(t->sizes));
  const int64_t batch = varlen ? cu_seqlens_q->numel() - 1 : q.size(0);
  check(batch >= 0, kOp, ": cu_seqlens_q must have batch + 1 >= 1 entries");
  const int64_t h = q.size(-2), d = q.size(-1), h_k = k.size(-2), d_v = v.size(-1);
  const int64_t s_q = varlen ? max_seqlen_q : q.size(1), s_k = varlen ? max_seqlen_k : k.size(1);
  const int64_t total_q = varlen ? q.size(0) : batch * s_q, total_k = varlen ? k.size(0) : batch * s_k;
  if (varlen) {
    check_shape(k, "k", {total_k, h_k, d});
    check_shape(v, "v", {total_k, h_k, d_v});
    check_shape(out, "out", {total_q, h, d_v});
    check_shape(lse, "lse", {h, total_q});
    check(max_seqlen_q >= 0 && max_seqlen_k >= 0, kOp, ": max_seqlen_q/k must be >= 0");
  } else {
    check_shape(k, "k", {batch, s_k, h_k, d});
    check_shape(v, "v", {batch, s_k, h_k, d_v});
    check_shape(out, "out", {batch, s_q, h, d_v});
    check_shape(lse, "lse", {batch, h, s_q});
  }
  check_shape(dout, "dout", out.sizes);
  check_shape(dq, "dq", q.sizes);
  check_shape(dk, "dk", k.sizes);
  check_shape(dv, "dv", v.sizes);
  if (dlse) check_shape(*dlse, "dlse", lse.sizes);
  check((sinks != nullptr) == (dsinks != nullptr), kOp, ": pass both sinks and dsinks (its gradient, written), or neither");
  for (auto [t, name] : {std::make_pair(sinks, "sinks"), std::make_pair(dsinks, "dsinks")}) {
    if (t == nullptr) continue;
    check(t->dtype == DType::f32, kOp, ": ", name, " must be float32, got ", dtype_str(t->dtype));
    check_shape(*t, name, {h});
    check(t->stride(0) == 1 || t->size(0) <= 1, kOp, ": ", name, " must be contiguous");
  }
  check_seqlens(cu_seqlens_q, "cu_seqlens_q", batch + 1);
  check_seqlens(cu_seqlens_k, "cu_seqlens_k", batch + 1);
  check(h_k > 0 && h % h_k == 0, kOp, ": the number of query heads (", h,
        ") must be a multiple of the number of kv heads (", h_k, ")");
  check(d % 8 == 0 && d_v % 8 == 0 && d > 0 && d_v > 0 && d <= 256 && d_v <= 256, kOp,
        ": head dims must be multiples of 8 in [8, 256], got d=", d, " d_v=", d_v);
  check(softcap >= 0.0, kOp, ": softcap must be >= 0 (0 = off), got ", softcap);
  check(softmax_scale > 0.0 && std::isfinite(softmax_scale), kOp, ": softmax_scale must be finite and > 0, got ",
        softmax_scale);
  check(window_left >= -1 && window_right >= -1, kOp, ": window sizes must be >= -1 (-1 = unbounded)");
  const bool is_bf16 = dtype == DType::bf16;
  const flash3::BwdKernelEntry* kernel = flash3::find_bwd_kernel(is_bf16, static_cast<int>(d), static_cast<int>(d_v));
  check(kernel != nullptr, kOp, ": no ", dtype_name(is_bf16), " backward kernel for head dim (", d, ", ", d_v,
        ") or larger in this build of sim_driver");
  std::fprintf(stderr, "sim_driver: kernel bwd %s d=%d d_v=%d\n", dtype_name(kernel->is_bf16), kernel->head_dim,
               kernel->head_dim_v);

  // Tokens outside every sequence get 0 (the reference's rule); the kernels write only real rows.
  if (varlen) {
    fill(dq, 0.f);
    fill(dk, 0.f);
    fill(dv, 0.f);
  }
  const bool no_rows = total_q == 0 || h == 0 || batch == 0 || s_q == 0;
  if (no_rows || total_k == 0) {  // nothing sees anything
    fill(dq, 0.f);
    fill(dk, 0.f);
    fill(dv, 0.f);
    if (dsinks) fill(*dsinks, 0.f);
    // With sinks and queries but no key, the sink still has a gradient (every row's P_sink is 1):
    // the launcher runs only the preprocess and the sink kernel then.
    if (no_rows || !sinks) return;
  }

  flash3::BwdParams p;
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
  p.lse = static_cast<const float*>(lse.data_ptr());
  p.lse_batch_stride = varlen ? 0 : lse.stride(0);
  p.lse_head_stride = lse.stride(varlen ? 0 : 1);
  if (dlse) {
    p.dlse = static_cast<const float*>(dlse->data_ptr());
    p.dlse_batch_stride = varlen ? 0 : dlse->stride(0);
    p.dlse_head_stride = dlse->stride(varlen ? 0 : 1);
  }
  if (sinks) {
    p.sinks = static_cast<const float*>(sinks->data_ptr());
    p.dsinks = static_cast<float*>(dsinks->data_ptr());
  }
  p.batch = to_int(batch, "batch");
  p.seqlen_q = to_int(s_q, "seqlen_q");
  p.seqlen_k = to_int(s_k, "seqlen_k");
  p.num_heads = to_int(h, "num_heads");
  p.num_heads_k = to_int(h_k, "num_heads_k");
  p.head_dim = static_cast<int>(d);
  p.head_dim_v = static_cast<int>(d_v);
  p.total_q = to_int(total_q, "total_q");
  p.total_k = to_int(total_k, "total_k");
  p.cu_seqlens_q = varlen ? static_cast<const int*>(cu_seqlens_q->data_ptr()) : nullptr;
  p.cu_seqlens_k = varlen ? static_cast<const int*>(cu_seqlens_k->data_ptr()) : nullptr;
  p.softmax_scale = static_cast<float>(softmax_scale);
  p.softcap = static_cast<float>(softcap);
  p.alibi_slopes = check_alibi(c.opt("alibi_slopes"), batch, h, kOp, &p.alibi_batch_stride);
  p.is_causal = causal;
  p.window_left = static_cast<int>(std::max<int64_t>(window_left, -1));
  p.window_right = causal ? 0 : static_cast<int>(std::max<int64_t>(window_right, -1));
  p.deterministic = deterministic;
  p.is_bf16 = is_bf16;

  // Workspace: at::empty in the binding.
  const flash3::BwdWorkspace ws = flash3::bwd_workspace(p, kernel->head_dim);
  p.lse_log2 = static_cast<float*>(scratch(size_t(2 * ws.row_floats + ws.dq_floats) * 4));
  p.dpsum = p.lse_log2 + ws.row_floats;
  p.dq_accum = p.dpsum + ws.row_floats;
  if (deterministic) p.dq_semaphore = static_cast<int*>(scratch(size_t(std::max<int64_t>(ws.semaphore_ints, 1)) * 4));

  std::fprintf(stderr, "sim_driver: %s %s d=%d d_v=%d b=%d s_q=%d s_k=%d h=%d h_k=%d causal=%d window=(%d,%d) "
               "softcap=%g varlen=%d dlse=%d deterministic=%d sinks=%d\n", kOp, dtype_name(is_bf16), p.head_dim,
               p.head_dim_v, p.batch, p.seqlen_q, p.seqlen_k, p.num_heads, p.num_heads_k, int(p.is_causal),
               p.window_left, p.window_right, p.softcap, int(varlen), int(p.dlse != nullptr), int(p.deterministic),
               int(p.sinks != nullptr));
  try {
    kernel->launch(p, nullptr);  // the default stream (the binding: torch's current stream)
  } catch (const std::exception& e) {
    std::ostringstream os;
    os << kOp << " (" << dtype_name(is_bf16) << ", d=" << d << ", d_v=" << d_v << "): " << e.what();
    throw Refused(os.str());
  }
  const cudaError_t err = cudaGetLastError();
  check(err == cudaSuccess, kOp, ": CUDA error after launch: ", cudaGetErrorString(err));
}

// kernel_info()'s "bwd" list, as binding.cpp prints it.
std::string bwd_info() {
  std::vector<std::tuple<int, int, int>> bwd;  // (dtype order, d, d_v)
  for (const flash3::BwdKernelEntry& e : flash3::bwd_kernels()) bwd.emplace_back(e.is_bf16 ? 0 : 1, e.head_dim, e.head_dim_v);
  std::sort(bwd.begin(), bwd.end());
  bwd.erase(std::unique(bwd.begin(), bwd.end()), bwd.end());
  std::ostringstream os;
  os << "\"bwd\": [";
  for (size_t i = 0; i < bwd.size(); ++i)
    os << (i ? ", " : "") << "[\"" << (std::get<0>(bwd[i]) == 0 ? "bf16" : "fp16") << "\", " << std::get<1>(bwd[i])
       << ", " << std::get<2>(bwd[i]) << "]";
  os << "]";
  return os.str();
}

const RegisterOp reg_bwd{{"bwd", bwd_sm90, {"dq", "dk", "dv", "dsinks"}, bwd_info}};

}  // namespace
