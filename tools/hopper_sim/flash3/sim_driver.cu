// Driver for flash3's ops under the Hopper simulator (tools/hopper_sim/simrun), without torch: one
// op call described by files. This file: main, and the forward ops: torch.ops.flash3.fwd_sm90,
// fwd_fp8_sm90, and one decode step (attention_kvcache's kernel path: append_kv_sm90 when new keys
// are given, then fwd_kvcache_sm90 and its combine). Other ops live in their own files
// (sim_op_*.cu, each registering itself with RegisterOp; sim_case.h has what they share).
//
//   sim_driver --info            print kernel_info()'s JSON ("fwd", "fwd_fp8", "bwd", "decode",
//                                "decode_fp8_cache", and the other ops' lists) for the linked TUs
//   sim_driver CASE_DIR          run the call in CASE_DIR/case.txt, write CASE_DIR/NAME.out.bin for
//                                output the op names (fwd, fwd_fp8: out lse; kvcache: out lse
//                                k_cache v_cache, and q_out when given; bwd: dq dk dv;
//                                quantize_fp8: out descale)
//
// It links flash3's real host code: the host layer (csrc/flash3/host/: each op's checks, kernel
// pick, parameters and launch, the code the torch bindings run), the registries and the generated
// kernel TUs the build selected. Each op here only turns case tensors into host::TensorViews and
// hands the host layer a Backend on the CUDA runtime (sim_case.h SimBackend).
//
// case.txt (written by tools/smoke/smoke_sim.py, write_case), one item per line, '#' comments:
//   flash3-sim-case 1
//   op fwd | fwd_fp8 | kvcache | bwd | quantize_fp8 | (the other ops' names)
//   tensor NAME DTYPE NDIM SIZE... STRIDE... [random|nan]
//                                                data: CASE_DIR/NAME.bin, the elements from offset 0
//                                                to the largest one addressed (row-major for
//                                                contiguous tensors), little endian; or made by the
//                                                driver: N(0,1) values / NaN (large timing cases)
//   NAME VALUE                                   scalars: max_seqlen_q max_seqlen_k softmax_scale
//                                                window_left window_right softcap q_block
//                                                kv_block, optional attention_chunk (fwd,
//                                                fwd_fp8, bwd, kvcache), fast_accum (fwd_fp8)
//                                                (floats in any strtod form, e.g. hex)
// DTYPE: bf16 fp16 e4m3 f32 i32. Tensors: q k v out lse (v is the op's vt for fwd_fp8), optional
// cu_seqlens_q cu_seqlens_k seqused_k seqused_q sinks (float32 (h,), attention sinks; not fwd_fp8) alibi_slopes
// (float32 (h,) or (b, h); fwd, kvcache, bwd); fwd_fp8:
// q_descale k_descale v_descale, optional v_channel_descale seqused_q seqused_k. kvcache: q k_cache v_cache out lse
// seqused_k, optional page_table, k_descale v_descale (FP8 caches), sinks, cache_leftpad, qv (MLA), cu_seqlens_q (varlen q:
// q/out (total_q, h, .), lse (h, total_q), scalar max_seqlen_q); scalars softmax_scale
// window_left window_right softcap num_splits, optional descale_per_batch (k/v descales (b, h_k),
// FA3's; the append then copies e4m3 k/v unchanged, or rotates them with an e4m3 q, and takes no
// descales; the decode then reads the rotated e4m3 q_out as bf16); the fused append when
// tensor k is given: k v cache_seqlens, optional rotary_cos rotary_sin q_out (q_out with rotary: the attention then takes
// q_out, as flash3/ops.py attention_kvcache does), cu_seqlens_k_new (FA3's packed new keys: k/v (total_new, h_k, .);
// cu_seqlens_q packs the append's q/q_out too), scalars rotary_interleaved q_per_token.
// seqused_k is what ops.py computes (cache_seqlens + s_new, clamped to int32). bwd (sim_op_bwd.cu,
// torch.ops.flash3.bwd_sm90): dout q k v out lse dq dk dv, optional dlse cu_seqlens_q cu_seqlens_k
// sinks dsinks; scalars max_seqlen_q max_seqlen_k softmax_scale window_left window_right
// softcap deterministic. quantize_fp8 (sim_op_quantize.cu, torch.ops.flash3.quantize_fp8_sm90): x
// out descale, optional signs mean channel_descale; scalars block_size layout. Outputs hold what the
// caller passed (NaN poison, the caches' old contents); after the launches the driver writes their
// whole buffers to NAME.out.bin.
//
// Exit: 0 launched and synchronized; 3 the call was refused (what TORCH_CHECK or the launcher would
// raise; the message goes to stderr as "sim_driver: error: ..."); 2 bad case files or CUDA errors.
#include "sim_case.h"

#include "flash3/host/append_kv.h"
#include "flash3/host/fwd.h"
#include "flash3/host/kernel_info.h"
#include "flash3/host/kvcache.h"

namespace {

using namespace simdrv;
namespace host = flash3::host;

// torch.ops.flash3.fwd_sm90
void fwd(const Case& c, host::Backend& be) {
  const auto cu_q = view(c.opt("cu_seqlens_q")), cu_k = view(c.opt("cu_seqlens_k")),
             used = view(c.opt("seqused_k")), sinks = view(c.opt("sinks")), alibi = view(c.opt("alibi_slopes")),
             used_q = view(c.opt("seqused_q"));
  host::fwd_sm90(be, view(c.t("q")), view(c.t("k")), view(c.t("v")), view(c.t("out")), view(c.t("lse")), ptr(cu_q),
                 ptr(cu_k), ptr(used), c.integer("max_seqlen_q"), c.integer("max_seqlen_k"), c.num("softmax_scale"),
                 c.integer("window_left"), c.integer("window_right"), c.num("softcap"), ptr(sinks),
                 ptr(alibi), ptr(used_q), c.has("attention_chunk") ? c.integer("attention_chunk") : 0);
}

// torch.ops.flash3.fwd_fp8_sm90 (tensor v is the op's vt)
void fwd_fp8(const Case& c, host::Backend& be) {
  const auto vc = view(c.opt("v_channel_descale")), cu_q = view(c.opt("cu_seqlens_q")),
             cu_k = view(c.opt("cu_seqlens_k")), used_q = view(c.opt("seqused_q")),
             used_k = view(c.opt("seqused_k"));
  host::fwd_fp8_sm90(be, view(c.t("q")), view(c.t("k")), view(c.t("v")), view(c.t("out")), view(c.t("lse")),
                     view(c.t("q_descale")), view(c.t("k_descale")), view(c.t("v_descale")), ptr(vc),
                     c.integer("q_block"), c.integer("kv_block"), c.num("softmax_scale"),
                     c.integer("window_left"), c.integer("window_right"), c.num("softcap"), ptr(cu_q), ptr(cu_k),
                     c.has("max_seqlen_q") ? c.integer("max_seqlen_q") : 0,
                     c.has("max_seqlen_k") ? c.integer("max_seqlen_k") : 0, ptr(used_q), ptr(used_k),
                     c.has("attention_chunk") ? c.integer("attention_chunk") : 0,
                     c.has("fast_accum") && c.integer("fast_accum") != 0);
}

// q_out.to(torch.bfloat16) of flash_attn_interface._fp8_rotary_on_kernel: FA3's rotated e4m3 q as the
// decode kernel's bf16 q (exact: every e4m3 value is a bf16), a driver-owned buffer of t's layout.
Tensor e4m3_as_bf16(const Tensor& t) {
  std::vector<uint8_t> src(t.bytes);
  if (t.bytes) ck(cudaMemcpy(src.data(), t.ptr, t.bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
  std::vector<uint16_t> dst(src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    const uint8_t x = src[i];
    const int e = (x >> 3) & 15, m = x & 7;
    float f;
    if (e == 15 && m == 7) f = std::numeric_limits<float>::quiet_NaN();
    else f = e == 0 ? std::ldexp(float(m), -9) : std::ldexp(float(8 + m), e - 10);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    dst[i] = uint16_t((bits >> 16) | (x & 0x80 ? 0x8000 : 0));  // exact: 3 mantissa bits fit bf16's 7
  }
  Tensor b = t;
  b.dtype = DType::bf16;
  b.bytes = dst.size() * 2;
  ck(cudaMalloc(&b.ptr, std::max<size_t>(b.bytes, 16)), "cudaMalloc");
  if (b.bytes) ck(cudaMemcpy(b.ptr, dst.data(), b.bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
  g_scratch.push_back(b.ptr);
  return b;
}

// flash3/ops.py attention_kvcache's kernel path: the fused append (torch.ops.flash3.append_kv_sm90,
// when the case has new keys), then the decode kernel (fwd_kvcache_sm90) on q_out (rotary) or q;
// an e4m3 q_out (FA3's FP8 q, rotated in e4m3 by the append) as bf16.
void kvcache_step(const Case& c, host::Backend& be) {
  const Tensor& q = c.t("q");
  const auto page_table = view(c.opt("page_table")), k_descale = view(c.opt("k_descale")),
             v_descale = view(c.opt("v_descale"));
  const Tensor* q_att = &q;
  const bool per_batch = c.has("descale_per_batch") && c.integer("descale_per_batch") != 0;
  const auto cu_q = view(c.opt("cu_seqlens_q"));
  if (c.opt("k") != nullptr) {
    const Tensor* q_out = c.opt("q_out");
    const auto cos = view(c.opt("rotary_cos")), sin = view(c.opt("rotary_sin")),
               ro = view(c.opt("rotary_seqlens")), cu_k_new = view(c.opt("cu_seqlens_k_new"));
    host::append_kv_sm90(be, view(q), view(c.t("k_cache")), view(c.t("v_cache")), view(c.t("k")), view(c.t("v")),
                         view(c.t("cache_seqlens")), ptr(page_table), ptr(cos), ptr(sin),
                         c.integer("rotary_interleaved") != 0, c.integer("q_per_token") != 0, view(q_out ? *q_out : q),
                         per_batch ? nullptr : ptr(k_descale), per_batch ? nullptr : ptr(v_descale), ptr(ro),
                         per_batch,  // per batch: e4m3 k/v copied, the descales are the attention's
                         ptr(cu_q), ptr(cu_k_new));
    if (q_out != nullptr) q_att = q_out;
  }
  Tensor q_bf16;
  if (q_att->dtype == DType::e4m3) {
    q_bf16 = e4m3_as_bf16(*q_att);
    q_att = &q_bf16;
  }
  const auto sinks = view(c.opt("sinks")), alibi = view(c.opt("alibi_slopes")),
             leftpad = view(c.opt("cache_leftpad")), qv = view(c.opt("qv"));
  host::fwd_kvcache_sm90(be, view(*q_att), view(c.t("k_cache")), view(c.t("v_cache")), view(c.t("out")),
                         view(c.t("lse")), view(c.t("seqused_k")), ptr(page_table), c.num("softmax_scale"),
                         c.integer("window_left"), c.integer("window_right"),
                         c.num("softcap"), c.integer("num_splits"), ptr(k_descale), ptr(v_descale), ptr(sinks),
                         ptr(cu_q), c.has("max_seqlen_q") ? c.integer("max_seqlen_q") : 0, ptr(alibi), ptr(leftpad),
                         per_batch, ptr(qv), c.has("attention_chunk") ? c.integer("attention_chunk") : 0);
}

// The kernel lists of kernel_info() (every registry the driver links: forward, FP8, backward, decode).
std::string kernel_lists() { return host::kernel_lists_json(); }

const RegisterOp reg_fwd{{"fwd", fwd, {"out", "lse"}, kernel_lists}};
const RegisterOp reg_fwd_fp8{{"fwd_fp8", fwd_fp8, {"out", "lse"}}};
const RegisterOp reg_kvcache{{"kvcache", kvcache_step, {"out", "lse", "k_cache", "v_cache", "q_out"}}};

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && !std::strcmp(argv[1], "--info")) {
    std::string s = "{";
    for (const Op& op : ops())
      if (op.info) s += op.info() + ", ";
    std::printf("%s\"arch\": \"sm_90a\", \"backend\": \"hopper_sim\"}\n", s.c_str());
    return 0;
  }
  if (argc != 2) {
    std::fprintf(stderr, "usage: sim_driver --info | sim_driver CASE_DIR\n");
    return 2;
  }
  const Case c = load_case(argv[1]);
  const Op* op = nullptr;
  for (const Op& o : ops())
    if (c.op == o.name) op = &o;
  if (op == nullptr) fatal("unknown op '" + c.op + "'");
  SimBackend be;
  try {
    op->run(c, be);
  } catch (const flash3::host::Error& e) {
    std::fprintf(stderr, "sim_driver: error: %s\n", e.what());
    return 3;
  }
  ck(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  // no_outputs 1: a timing case (tools/hopper_sim/perf_model.py), whose outputs nobody reads
  const bool write_outputs = !c.has("no_outputs") || c.integer("no_outputs") == 0;
  for (const auto& [name, value] : c.scalars)
    if (!c.scalars_read.count(name)) fatal("case scalar '" + name + "' is not read by op " + c.op);
  for (const char* n : write_outputs ? op->outputs : std::vector<const char*>{}) {
    if (c.opt(n) == nullptr) continue;  // an optional output (q_out: only with rotary)
    const Tensor& t = c.t(n);
    std::vector<char> host(t.bytes);
    if (t.bytes) ck(cudaMemcpy(host.data(), t.ptr, t.bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
    write_file(c.dir + "/" + n + ".out.bin", host.data(), host.size());
  }
  for (auto& [name, t] : c.tensors) ck(cudaFree(t.ptr), "cudaFree");
  for (void* p : g_scratch) ck(cudaFree(p), "cudaFree");
  return 0;
}
