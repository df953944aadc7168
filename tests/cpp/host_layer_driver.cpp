// The host layer (csrc/flash3/host/) under the host C++ compiler, without torch, CUDA or a GPU:
// stand-in kernels record the parameters they would launch with, a stand-in backend records what
// the op asks of its caller, and csrc/flash3/host/device.cpp is replaced by a fake Hopper.
// tests/test_host_layer.py drives it: one call per stdin line, one answer per stdout line:
//   OP key=value ...   ->  "ok key=value ..." (what the kernel got) or "error: <the op's message>"
// OP: fwd | fwd_fp8 | kvcache | append | bwd | quantize | kernel_info | arch (MAJOR MINOR: the fake
// GPU's compute capability). Every tensor is contiguous host memory standing in for device memory.
#include <cmath>
#include <cstdint>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "flash3/bwd/api.h"
#include "flash3/decode/api.h"
#include "flash3/decode/append_kv.h"
#include "flash3/decode/combine.h"
#include "flash3/fp8/quantize.h"
#include "flash3/fwd/api.h"
#include "flash3/host/append_kv.h"
#include "flash3/host/bwd.h"
#include "flash3/host/device.h"
#include "flash3/host/fwd.h"
#include "flash3/host/kernel_info.h"
#include "flash3/host/kernel_pick.h"
#include "flash3/host/kvcache.h"
#include "flash3/host/quantize.h"


#include "fake_host.h"  // the fake GPU (device.cpp's functions), FakeTensor and make()

// ---- stand-in kernels: they record what they were given --------------------------------------

static std::ostringstream g_rec;  // the answer's "key=value" part

static void rec_fwd(const char* kind, int hd, int hdv, const flash3::FwdParams& p) {
  g_rec << "kernel=" << kind << ":" << hd << ":" << hdv << " batch=" << p.batch
        << " seqlen_q=" << p.seqlen_q << " seqlen_k=" << p.seqlen_k << " total_q=" << p.total_q
        << " total_k=" << p.total_k << " q_strides=" << p.q_batch_stride << "," << p.q_row_stride << ","
        << p.q_head_stride << " v_strides=" << p.v_batch_stride << "," << p.v_row_stride << "," << p.v_head_stride
        << " lse_strides=" << p.lse_batch_stride << "," << p.lse_head_stride << " causal=" << int(p.is_causal)
        << " window=" << p.window_left << "," << p.window_right << " chunk=" << p.attention_chunk << " scale=" << p.softmax_scale
        << " softcap=" << p.softcap << " dynamic=" << int(p.tile_counter != nullptr)
        << " sinks=" << int(p.sinks != nullptr) << " num_splits=" << p.num_splits
        << " paged=" << int(p.page_table != nullptr) << " seqused_q=" << int(p.seqused_q != nullptr)
        << " num_sms=" << p.num_sms << " leftpad=" << int(p.cache_leftpad != nullptr);
}

template <bool kBf16, int kD, int kDv>
void fake_fwd(const flash3::FwdParams& p, void*) { rec_fwd(kBf16 ? "bf16" : "fp16", kD, kDv, p); }
template <int kD>
void fake_fp8(const flash3::FwdParams& p, void*) {
  rec_fwd("e4m3", kD, kD, p);
  g_rec << " q_descale_count=" << p.fp8.q.count << " k_descale_count=" << p.fp8.k.count
        << " v_descale_count=" << p.fp8.v.count << " fast_accum=" << int(p.fp8.fast_accum);
}
template <bool kFp8Cache>
void fake_decode(const flash3::FwdParams& p, void*) { rec_fwd(kFp8Cache ? "decode_e4m3" : "decode", 128, 128, p); }
void fake_decode_mla(const flash3::FwdParams& p, void*) {
  rec_fwd("decode", 64, 512, p);
  g_rec << " qv=" << int(p.qv != nullptr) << " qv_strides=" << p.qv_batch_stride << "," << p.qv_row_stride << ","
        << p.qv_head_stride;
}
void fake_bwd(const flash3::BwdParams& p, void*) {
  g_rec << "kernel=bwd:128:128 total_q=" << p.total_q << " total_k=" << p.total_k << " window=" << p.window_left << ","
        << p.window_right << " chunk=" << p.attention_chunk << " deterministic=" << int(p.deterministic) << " semaphore=" << int(p.dq_semaphore != nullptr)
        << " dlse=" << int(p.dlse != nullptr) << " seqused_q=" << int(p.seqused_q != nullptr) << " q_strides=" << p.q_batch_stride << "," << p.q_row_stride << ","
        << p.q_head_stride;
}

static const flash3::FwdKernelRegistration r1(true, 128, 128, fake_fwd<true, 128, 128>);
static const flash3::FwdKernelRegistration r3(true, 64, 64, fake_fwd<true, 64, 64>);
static const flash3::FwdKernelRegistration r4(false, 128, 128, fake_fwd<false, 128, 128>);
static const flash3::Fp8KernelRegistration r5(128, 128, fake_fp8<128>);
static const flash3::Fp8KernelRegistration r5b(256, 256, fake_fp8<256>);
static const flash3::DecodeKernelRegistration r6(true, 128, 128, false, fake_decode<false>);
static const flash3::DecodeKernelRegistration r7(true, 128, 128, true, fake_decode<true>);
static const flash3::BwdKernelRegistration r8(true, 128, 128, fake_bwd);
static const flash3::DecodeKernelRegistration r9(true, 64, 512, false, fake_decode_mla);  // MLA

namespace flash3 {
int run_combine(const CombineParams& c, void*) {
  g_rec << " combine=" << c.num_splits << " combine_batch=" << c.batch;
  return 0;
}
int run_append_kv(const AppendKvParams& p, void*) {
  g_rec << "append page_size=" << p.page_size << " max_pages=" << p.max_pages << " rotary_dim=" << p.rotary_dim
        << " kv_e4m3=" << int(p.kv_e4m3) << " descales=" << int(p.k_descale != nullptr)
        << " batch=" << p.batch << " s_new=" << p.s_new << " s_q=" << p.s_q << " cu_q=" << (p.cu_seqlens_q != nullptr)
        << " cu_k=" << (p.cu_seqlens_k_new != nullptr) << " k_batch_stride=" << p.k_batch_stride
        << " q_batch_stride=" << p.q_batch_stride << " k_row_stride=" << p.k_row_stride;
  return 0;
}
int run_quantize_fp8(const QuantizeParams& p, void*) {
  g_rec << "quantize blocks=" << p.block_size << " layout=" << p.layout;
  return 0;
}
}  // namespace flash3

// ---- stand-in tensors and backend -------------------------------------------------------------

// A contiguous stand-in tensor (fake_host.h's make with row-major strides).
static const h::TensorView& make(std::vector<int64_t> sizes, h::DType dtype) {
  std::vector<int64_t> strides(sizes.size(), 1);
  for (int d = int(sizes.size()) - 2; d >= 0; --d) strides[d] = strides[d + 1] * std::max<int64_t>(sizes[d + 1], 1);
  return make(std::move(sizes), std::move(strides), dtype);
}

struct FakeBackend final : h::Backend {
  std::ostringstream asked;
  void* stream() override { return reinterpret_cast<void*>(0x5); }
  void* alloc(int64_t count, h::DType dtype, h::Init init) override {
    asked << " alloc=" << count << (dtype == h::DType::i32 ? "i32" : "f32")
          << (init == h::Init::zero ? "/zero" : init == h::Init::neg_inf ? "/-inf" : "");
    return const_cast<void*>(make({count}, dtype).data);
  }
  void fill(const h::TensorView& t, float value) override { asked << " fill=" << t.dim() << "d:" << value; }
  void fill_empty_lse(const h::TensorView&, const h::TensorView* sinks, int head_dim) override {
    asked << " empty_lse=" << head_dim << (sinks ? ":sinks" : "");
  }
  void neg_inf_rows_past_end(const h::TensorView&, const h::TensorView&, int64_t batch) override {
    asked << " rows_past_end=" << batch;
  }
  h::TensorView repeat_last(const h::TensorView& t, int64_t repeat, int64_t count) override {
    asked << " repeat=" << repeat;
    h::TensorView v = make({t.size(0), t.size(1), t.size(2) * repeat}, h::DType::f32);
    auto* owner = const_cast<FakeTensor*>(static_cast<const FakeTensor*>(v.handle));
    owner->sizes[2] = count;
    return owner->v;
  }
  void assert_no_overlap(const h::TensorView&, const h::TensorView&) override { asked << " overlap"; }
  void assert_no_internal_overlap(const h::TensorView&) override { asked << " internal_overlap"; }
  const char* build_name() const override { return "host_layer_driver"; }
};

// ---- the calls ---------------------------------------------------------------------------------

using Args = std::map<std::string, std::string>;

static int64_t num(const Args& a, const char* k, int64_t dflt) {
  auto it = a.find(k);
  return it == a.end() ? dflt : std::stoll(it->second);
}
static double real(const Args& a, const char* k, double dflt) {
  auto it = a.find(k);
  return it == a.end() ? dflt : std::stod(it->second);
}
static h::DType dtype(const Args& a, const char* k, h::DType dflt) {
  auto it = a.find(k);
  if (it == a.end()) return dflt;
  const std::map<std::string, h::DType> names{{"bf16", h::DType::bf16}, {"fp16", h::DType::fp16},
                                               {"f32", h::DType::f32}, {"i32", h::DType::i32},
                                               {"e4m3", h::DType::e4m3}};
  return names.at(it->second);
}

static void fwd(FakeBackend& be, const Args& a) {
  const h::DType dt = dtype(a, "dtype", h::DType::bf16);
  const int64_t b = num(a, "b", 2), sq = num(a, "sq", 100), sk = num(a, "sk", 300), hq = num(a, "h", 4),
                hk = num(a, "hk", 2), d = num(a, "d", 128), dv = num(a, "dv", d);
  const bool varlen = num(a, "varlen", 0) != 0;
  const h::TensorView *cu_q = nullptr, *cu_k = nullptr, *sinks = nullptr;
  if (varlen) cu_q = &make({b + 1}, h::DType::i32), cu_k = &make({b + 1}, h::DType::i32);
  if (num(a, "sinks", 0)) sinks = &make({num(a, "sinks_len", hq)}, dtype(a, "sinks_dtype", h::DType::f32));
  const h::TensorView* used_q =  // seqused_q (b,) int32 unless said
      num(a, "usedq", 0) ? &make({num(a, "usedq_len", b)}, dtype(a, "usedq_dtype", h::DType::i32)) : nullptr;
  auto rows = [&](int64_t s, int64_t heads, int64_t dim, h::DType t) {
    return varlen ? make({b * s, heads, dim}, t) : make({b, s, heads, dim}, t);
  };
  const h::TensorView &q = rows(sq, hq, d, dt), &k = rows(sk, hk, d, dtype(a, "kdtype", dt)),
                      &v = rows(sk, hk, dv, dt), &out = rows(sq, hq, dv, dt);
  const h::TensorView& lse = varlen ? make({hq, b * sq}, h::DType::f32) : make({b, hq, sq}, h::DType::f32);
  h::fwd_sm90(be, q, k, v, out, lse, cu_q, cu_k, nullptr, sq, sk, real(a, "scale", 0.125), num(a, "wl", -1),
              num(a, "wr", -1), real(a, "softcap", 0.0), sinks, nullptr, used_q, num(a, "chunk", 0));
}

static void fwd_fp8(FakeBackend& be, const Args& a) {
  const int64_t b = 2, sq = num(a, "sq", 100), sk = num(a, "sk", 300), hq = 4, hk = 2, d = num(a, "d", 128);
  const int64_t q_block = num(a, "q_block", 128), kv_block = num(a, "kv_block", 128);
  const h::TensorView &q = make({b, sq, hq, d}, h::DType::e4m3), &k = make({b, sk, hk, d}, h::DType::e4m3),
                      &vt = make({b, hk, d, (sk + 15) / 16 * 16}, h::DType::e4m3),
                      &out = make({b, sq, hq, d}, h::DType::bf16), &lse = make({b, hq, sq}, h::DType::f32);
  const h::TensorView &qd = make({b, hq, (sq + q_block - 1) / q_block}, h::DType::f32),
                      &kd = make({b, hk, (sk + kv_block - 1) / kv_block}, h::DType::f32),
                      &vd = make({b, hk, num(a, "vd_blocks", (sk + kv_block - 1) / kv_block)}, h::DType::f32);
  // kd_stride0: k_descale's batch stride (a strided view; the fake tensor's memory is never read)
  if (num(a, "kd_stride0", 0)) const_cast<int64_t*>(kd.stride_)[0] = num(a, "kd_stride0", 0);
  // vchan=N: a v_channel_descale of (b, h_k, N) (d_v = d is the right N)
  const h::TensorView* vc = num(a, "vchan", 0) ? &make({b, hk, num(a, "vchan", 0)}, h::DType::f32) : nullptr;
  // usedq=1 / usedk=1: a seqused_q / seqused_k (b,) int32 (batched here: refused); chunk=N;
  // fast=1: fast_accum (vd_blocks=1: its (b, h_k, 1) v descale)
  const h::TensorView* used_q = num(a, "usedq", 0) ? &make({b}, h::DType::i32) : nullptr;
  const h::TensorView* used_k = num(a, "usedk", 0) ? &make({b}, h::DType::i32) : nullptr;
  h::fwd_fp8_sm90(be, q, k, vt, out, lse, qd, kd, vd, vc, q_block, kv_block, 0.1, -1, num(a, "wr", -1), 0.0, nullptr,
                  nullptr, 0, 0, used_q, used_k, num(a, "chunk", 0), num(a, "fast", 0) != 0);
}

static void kvcache(FakeBackend& be, const Args& a) {
  const int64_t b = num(a, "b", 2), sq = num(a, "sq", 1), hq = num(a, "h", 8), hk = num(a, "hk", 2),
                d = num(a, "d", 128), dv = num(a, "dv", d), page = num(a, "page", 0), cap = num(a, "cap", 1000);
  const bool fp8 = num(a, "fp8", 0) != 0, varlen = num(a, "varlen", 0) != 0;
  const h::DType ct = fp8 ? h::DType::e4m3 : h::DType::bf16;
  const int64_t slabs = page ? num(a, "pages", 64) : b, rows = page ? page : cap;
  const h::TensorView &kc = make({slabs, rows, hk, d}, ct), &vc = make({slabs, rows, hk, dv}, ct);
  const h::TensorView* pt = page ? &make({b, num(a, "max_pages", 8)}, h::DType::i32) : nullptr;
  const h::TensorView *kd = nullptr, *vd = nullptr;
  if (fp8) kd = &make({slabs, hk}, h::DType::f32), vd = &make({slabs, hk}, h::DType::f32);
  const h::TensorView* cu = varlen ? &make({b + 1}, h::DType::i32) : nullptr;
  const h::TensorView& q = varlen ? make({num(a, "total_q", 9), hq, d}, h::DType::bf16) : make({b, sq, hq, d}, h::DType::bf16);
  const h::TensorView& out = varlen ? make({q.size(0), hq, dv}, h::DType::bf16) : make({b, sq, hq, dv}, h::DType::bf16);
  // qv (MLA): 0 none, 1 q's rows with d_v columns, 2 the wrong width
  const int64_t qv_kind = num(a, "qv", 0), qv_cols = qv_kind == 2 ? dv + 8 : dv;
  const h::TensorView* qv = qv_kind == 0 ? nullptr
                            : varlen     ? &make({q.size(0), hq, qv_cols}, h::DType::bf16)
                                         : &make({b, sq, hq, qv_cols}, h::DType::bf16);
  const h::TensorView& lse = varlen ? make({hq, q.size(0)}, h::DType::f32) : make({b, hq, sq}, h::DType::f32);
  const h::TensorView& used = make({b}, h::DType::i32);
  // leftpad: 0 none, 1 int32 (b,), 2 float32 (b,), 3 int32 (b + 1,)
  const int64_t lp = num(a, "leftpad", 0);
  const h::TensorView* leftpad =
      lp == 0 ? nullptr : &make({lp == 3 ? b + 1 : b}, lp == 2 ? h::DType::f32 : h::DType::i32);
  h::fwd_kvcache_sm90(be, q, kc, vc, out, lse, used, pt, 0.1, -1, num(a, "wr", 0), 0.0,
                      num(a, "splits", 0), kd, vd, nullptr, cu, varlen ? sq : 0, nullptr, leftpad, false, qv,
                      num(a, "chunk", 0));
}

// packed_q=1 / packed_k=1: FA3's packed layouts, q (5, hq, d) / k, v (7, hk, d) with cu_seqlens of
// `cu` entries (default b + 1). fa3=1: FA3's FP8 append (descale_per_batch: e4m3 caches and k/v;
// knew_bf16=1 makes k/v bf16, ds=1 passes descales; q8=1 makes q and q_out e4m3, FA3's FP8 q).
static void append(FakeBackend& be, const Args& a) {
  const int64_t b = 2, hq = 8, hk = 2, d = 128, page = num(a, "page", 0), n_cu = num(a, "cu", b + 1);
  const bool pq = num(a, "packed_q", 0) != 0, pk = num(a, "packed_k", 0) != 0, fa3 = num(a, "fa3", 0) != 0;
  const h::DType ct = fa3 ? h::DType::e4m3 : h::DType::bf16;
  const h::DType nt = fa3 && num(a, "knew_bf16", 0) == 0 ? h::DType::e4m3 : h::DType::bf16;
  const auto q_shape = pq ? std::vector<int64_t>{5, hq, d} : std::vector<int64_t>{b, 1, hq, d};
  const h::DType qt = num(a, "q8", 0) ? h::DType::e4m3 : h::DType::bf16;
  const h::TensorView& q = make(q_shape, qt);
  const h::TensorView &kc = make({page ? 16 : b, page ? page : 512, hk, d}, ct),
                      &vc = make({page ? 16 : b, page ? page : 512, hk, d}, ct);
  const h::TensorView &k = pk ? make({7, hk, num(a, "kd", d)}, nt) : make({b, 1, hk, num(a, "kd", d)}, nt),
                      &v = pk ? make({7, hk, d}, nt) : make({b, 1, hk, d}, nt);
  const h::TensorView& lens = make({b}, h::DType::i32);
  const h::TensorView* pt = page ? &make({b, 8}, h::DType::i32) : nullptr;
  const h::TensorView *cos = nullptr, *sin = nullptr;
  if (num(a, "rotary", 0)) cos = &make({64, 32}, h::DType::f32), sin = &make({64, 32}, h::DType::f32);
  const h::TensorView* cu_q = pq ? &make({n_cu}, h::DType::i32) : nullptr;
  const h::TensorView* cu_k = pk ? &make({n_cu}, h::DType::i32) : nullptr;
  const h::TensorView *kd = nullptr, *vd = nullptr;
  if (num(a, "ds", 0)) kd = &make({b, hk}, h::DType::f32), vd = &make({b, hk}, h::DType::f32);
  h::append_kv_sm90(be, q, kc, vc, k, v, lens, pt, cos, sin, false, true, cos ? make(q_shape, qt) : q,
                    kd, vd, nullptr, fa3, cu_q, cu_k);
}

static void bwd(FakeBackend& be, const Args& a) {
  const int64_t b = 2, sq = 100, sk = 300, hq = 4, hk = 2, d = num(a, "d", 128);
  const h::TensorView &q = make({b, sq, hq, d}, h::DType::bf16), &k = make({b, sk, hk, d}, h::DType::bf16),
                      &v = make({b, sk, hk, d}, h::DType::bf16), &out = make({b, sq, hq, d}, h::DType::bf16),
                      &dout = make({b, sq, hq, d}, h::DType::bf16), &lse = make({b, hq, sq}, h::DType::f32),
                      &dq = make({b, sq, hq, d}, h::DType::bf16), &dk = make({b, sk, hk, d}, h::DType::bf16),
                      &dv = make({b, num(a, "dv_sk", sk), hk, d}, h::DType::bf16);
  h::bwd_sm90(be, dout, q, k, v, out, lse, nullptr, dq, dk, dv, nullptr, nullptr, sq, sk, 0.1, num(a, "wl", -1),
              num(a, "wr", -1), 0.0, num(a, "deterministic", 0) != 0, nullptr, nullptr,
              nullptr, num(a, "usedq", 0) ? &make({b}, h::DType::i32) : nullptr, num(a, "chunk", 0));
}

static void quantize(FakeBackend& be, const Args& a) {
  const int64_t b = 1, s = 32, hq = 2, d = 96;
  const h::TensorView& x = make({b, s, hq, d}, h::DType::bf16);
  const h::TensorView& out = make({b, s, hq, d}, h::DType::e4m3);
  const h::TensorView& desc = make({b, hq, 1}, h::DType::f32);
  h::quantize_fp8_sm90(be, x, nullptr, nullptr, nullptr, 32, num(a, "layout", 0), out, desc);
}

int main() {
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string op, kv;
    in >> op;
    Args args;
    while (in >> kv) {
      const size_t eq = kv.find('=');
      args[kv.substr(0, eq)] = eq == std::string::npos ? "" : kv.substr(eq + 1);
    }
    g_rec.str("");
    FakeBackend be;
    try {
      if (op == "arch") {
        g_dev.major = int(num(args, "major", 9)), g_dev.minor = int(num(args, "minor", 0));
      } else if (op == "kernel_info") {
        g_rec << h::kernel_lists_json();
      } else if (op == "pick") {  // family= dtype= d= dv= scale= chunk=: torch.ops.flash3.pick_kernel's answer
        const int64_t d = num(args, "d", 128);
        g_rec << h::kernel_pick_json(args.count("family") ? args["family"] : "fwd",
                                     args.count("dtype") ? args["dtype"] : "bfloat16", d, num(args, "dv", d),
                                     real(args, "scale", 0.125), num(args, "chunk", 0));
      } else if (op == "fwd") {
        fwd(be, args);
      } else if (op == "fwd_fp8") {
        fwd_fp8(be, args);
      } else if (op == "kvcache") {
        kvcache(be, args);
      } else if (op == "append") {
        append(be, args);
      } else if (op == "bwd") {
        bwd(be, args);
      } else if (op == "quantize") {
        quantize(be, args);
      } else {
        std::cout << "error: unknown op " << op << std::endl;
        continue;
      }
      std::cout << "ok " << g_rec.str() << be.asked.str() << std::endl;
    } catch (const h::Error& e) {  // a refused call: anything it launched, filled or allocated shows
      const std::string wrote = g_rec.str() + be.asked.str();
      std::cout << "error: " << e.what() << (wrote.empty() ? "" : " [wrote: " + wrote + "]") << std::endl;
    }
    g_tensors.clear();
  }
  return 0;
}
