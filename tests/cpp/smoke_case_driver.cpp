// The smoke matrix's op calls (tools/smoke: every kernel x feature, the calls tools/smoke/smoke_sim.py
// writes as case files for the simulator's driver) through flash3's host layer (csrc/flash3/host/) on
// the CPU, without torch, CUDA, a GPU or the simulator: the host layer's checks (what TORCH_CHECK
// refuses on a GPU) see each call's tensors (sizes, strides, dtypes; no data) and scalars exactly as
// tools/hopper_sim/flash3/sim_driver.cu hands them over, and stand-in kernels accept whatever they are
// given. tests/test_smoke_cases.py drives it, one stdin line -> one stdout line:
//   register KIND DTYPE D DV      a stand-in kernel (KIND fwd | fwd_fp8 | bwd | decode | decode_fp8)
//   kernel_info                   "ok " + kernel_info()'s JSON lists of the registered kernels
//   case LINE | LINE | ...        a case.txt (smoke_sim.case_lines) with its lines joined by " | "
//                                 -> "ok" or "error: <the op's message>"
// The ops as sim_driver.cu / sim_op_*.cu call them: fwd, fwd_fp8, kvcache (append_kv_sm90 when the
// case has new keys, then fwd_kvcache_sm90 on q_out or q; an e4m3 q_out as bf16), bwd, quantize_fp8.
// A case scalar no op reads is an error, as in sim_driver.cu.
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <stdexcept>
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
#include "flash3/host/kvcache.h"
#include "flash3/host/quantize.h"


#include "fake_host.h"  // the fake Hopper, FakeTensor and make()

// ---- stand-in kernels ---------------------------------------------------------------------------

static void fake_fwd(const flash3::FwdParams&, void*) {}
static void fake_bwd(const flash3::BwdParams&, void*) {}
namespace flash3 {
int run_combine(const CombineParams&, void*) { return 0; }
int run_append_kv(const AppendKvParams&, void*) { return 0; }
int run_quantize_fp8(const QuantizeParams&, void*) { return 0; }
}  // namespace flash3

// Registrations made at run time (register lines): the registries keep what the constructors push.
static std::vector<std::unique_ptr<flash3::FwdKernelRegistration>> g_fwd;
static std::vector<std::unique_ptr<flash3::Fp8KernelRegistration>> g_fp8;
static std::vector<std::unique_ptr<flash3::BwdKernelRegistration>> g_bwd;
static std::vector<std::unique_ptr<flash3::DecodeKernelRegistration>> g_dec;

static void register_kernel(const std::string& kind, const std::string& dt, int d, int dv) {
  const bool bf16 = dt == "bf16";
  if (kind == "fwd") g_fwd.push_back(std::make_unique<flash3::FwdKernelRegistration>(bf16, d, dv, fake_fwd));
  else if (kind == "fwd_fp8") g_fp8.push_back(std::make_unique<flash3::Fp8KernelRegistration>(d, dv, fake_fwd));
  else if (kind == "bwd") g_bwd.push_back(std::make_unique<flash3::BwdKernelRegistration>(bf16, d, dv, fake_bwd));
  else if (kind == "decode" || kind == "decode_fp8")
    g_dec.push_back(std::make_unique<flash3::DecodeKernelRegistration>(bf16, d, dv, kind == "decode_fp8", fake_fwd));
  else throw std::runtime_error("unknown kernel kind " + kind);
}

// ---- case tensors (fake_host.h's make: shape, strides and dtype only) ---------------------------

static h::DType parse_dtype(const std::string& s) {
  static const std::map<std::string, h::DType> m{{"bf16", h::DType::bf16}, {"fp16", h::DType::fp16},
                                                 {"e4m3", h::DType::e4m3}, {"f32", h::DType::f32},
                                                 {"i32", h::DType::i32}};
  auto it = m.find(s);
  if (it == m.end()) throw std::runtime_error("unknown dtype " + s);
  return it->second;
}

struct FakeBackend final : h::Backend {
  void* stream() override { return reinterpret_cast<void*>(0x5); }
  void* alloc(int64_t count, h::DType dtype, h::Init) override {
    return const_cast<void*>(make({count}, {1}, dtype).data);
  }
  void fill(const h::TensorView&, float) override {}
  void fill_empty_lse(const h::TensorView&, const h::TensorView*, int) override {}
  void neg_inf_rows_past_end(const h::TensorView&, const h::TensorView&, int64_t) override {}
  h::TensorView repeat_last(const h::TensorView& t, int64_t, int64_t count) override {
    return make({t.size(0), t.size(1), count}, {t.size(1) * count, count, 1}, h::DType::f32);
  }
  void assert_no_overlap(const h::TensorView&, const h::TensorView&) override {}
  void assert_no_internal_overlap(const h::TensorView&) override {}
  const char* build_name() const override { return "smoke_case_driver"; }
};

// ---- the case (sim_driver.cu's Case, without data) ---------------------------------------------

struct Case {
  std::string op;
  std::map<std::string, const h::TensorView*> tensors;
  std::map<std::string, double> scalars;
  mutable std::set<std::string> read;
  const h::TensorView* opt(const char* n) const {
    auto it = tensors.find(n);
    return it == tensors.end() ? nullptr : it->second;
  }
  const h::TensorView& t(const char* n) const {
    const h::TensorView* x = opt(n);
    if (x == nullptr) throw std::runtime_error(std::string("case has no tensor ") + n);
    return *x;
  }
  bool has(const char* n) const {
    read.insert(n);
    return scalars.count(n) != 0;
  }
  double num(const char* n) const {
    read.insert(n);
    auto it = scalars.find(n);
    if (it == scalars.end()) throw std::runtime_error(std::string("case has no scalar ") + n);
    return it->second;
  }
  int64_t integer(const char* n) const { return static_cast<int64_t>(num(n)); }
  int64_t integer_or(const char* n, int64_t dflt) const { return has(n) ? integer(n) : dflt; }
};

static std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

static Case parse_case(const std::string& text) {
  Case c;
  std::istringstream lines(text);
  std::string line;
  bool first = true;
  while (std::getline(lines, line, '|')) {
    line = trim(line.substr(0, line.find('#')));
    if (line.empty()) continue;
    if (first) {
      if (line != "flash3-sim-case 1") throw std::runtime_error("not a flash3-sim-case 1 case: " + line);
      first = false;
      continue;
    }
    std::istringstream in(line);
    std::string key;
    in >> key;
    if (key == "op") {
      in >> c.op;
    } else if (key == "tensor") {
      std::string name, dt;
      int nd = -1;
      in >> name >> dt >> nd;
      if (nd < 0) throw std::runtime_error("bad tensor line: " + line);
      std::vector<int64_t> sizes(nd), strides(nd);
      for (auto& x : sizes) in >> x;
      for (auto& x : strides) in >> x;
      if (!in) throw std::runtime_error("bad tensor line: " + line);
      c.tensors[name] = &make(sizes, strides, parse_dtype(dt));
    } else {
      std::string v;
      in >> v;
      char* end = nullptr;
      c.scalars[key] = std::strtod(v.c_str(), &end);
      if (v.empty() || *end) throw std::runtime_error("bad scalar line: " + line);
    }
  }
  if (c.op.empty()) throw std::runtime_error("case without op");
  return c;
}

// ---- the ops, as sim_driver.cu and sim_op_*.cu call the host layer -----------------------------

static void fwd(const Case& c, h::Backend& be) {
  h::fwd_sm90(be, c.t("q"), c.t("k"), c.t("v"), c.t("out"), c.t("lse"), c.opt("cu_seqlens_q"),
              c.opt("cu_seqlens_k"), c.opt("seqused_k"), c.integer("max_seqlen_q"), c.integer("max_seqlen_k"),
              c.num("softmax_scale"), c.integer("window_left"), c.integer("window_right"), c.num("softcap"),
              c.opt("sinks"), c.opt("alibi_slopes"), c.opt("seqused_q"), c.integer_or("attention_chunk", 0));
}

static void fwd_fp8(const Case& c, h::Backend& be) {
  h::fwd_fp8_sm90(be, c.t("q"), c.t("k"), c.t("v"), c.t("out"), c.t("lse"), c.t("q_descale"), c.t("k_descale"),
                  c.t("v_descale"), c.opt("v_channel_descale"), c.integer("q_block"), c.integer("kv_block"),
                  c.num("softmax_scale"), c.integer("window_left"), c.integer("window_right"), c.num("softcap"),
                  c.opt("cu_seqlens_q"), c.opt("cu_seqlens_k"), c.integer_or("max_seqlen_q", 0),
                  c.integer_or("max_seqlen_k", 0), c.opt("seqused_q"), c.opt("seqused_k"),
                  c.integer_or("attention_chunk", 0), c.integer_or("fast_accum", 0) != 0);
}

static void kvcache(const Case& c, h::Backend& be) {
  const h::TensorView& q = c.t("q");
  const h::TensorView* q_att = &q;
  const bool per_batch = c.integer_or("descale_per_batch", 0) != 0;
  if (c.opt("k") != nullptr) {
    const h::TensorView* q_out = c.opt("q_out");
    h::append_kv_sm90(be, q, c.t("k_cache"), c.t("v_cache"), c.t("k"), c.t("v"), c.t("cache_seqlens"),
                      c.opt("page_table"), c.opt("rotary_cos"), c.opt("rotary_sin"),
                      c.integer("rotary_interleaved") != 0, c.integer("q_per_token") != 0, q_out ? *q_out : q,
                      per_batch ? nullptr : c.opt("k_descale"), per_batch ? nullptr : c.opt("v_descale"),
                      c.opt("rotary_seqlens"), per_batch, c.opt("cu_seqlens_q"), c.opt("cu_seqlens_k_new"));
    if (q_out != nullptr) q_att = q_out;
  }
  if (q_att->dtype == h::DType::e4m3)  // the rotated e4m3 q_out, read as bf16 (q_out.to(torch.bfloat16))
    q_att = &make(std::vector<int64_t>(q_att->size_, q_att->size_ + q_att->ndim),
                  std::vector<int64_t>(q_att->stride_, q_att->stride_ + q_att->ndim), h::DType::bf16);
  h::fwd_kvcache_sm90(be, *q_att, c.t("k_cache"), c.t("v_cache"), c.t("out"), c.t("lse"), c.t("seqused_k"),
                      c.opt("page_table"), c.num("softmax_scale"), c.integer("window_left"), c.integer("window_right"),
                      c.num("softcap"), c.integer("num_splits"), c.opt("k_descale"), c.opt("v_descale"),
                      c.opt("sinks"), c.opt("cu_seqlens_q"), c.integer_or("max_seqlen_q", 0), c.opt("alibi_slopes"),
                      c.opt("cache_leftpad"), per_batch, c.opt("qv"), c.integer_or("attention_chunk", 0));
}

static void bwd(const Case& c, h::Backend& be) {
  h::bwd_sm90(be, c.t("dout"), c.t("q"), c.t("k"), c.t("v"), c.t("out"), c.t("lse"), c.opt("dlse"), c.t("dq"),
              c.t("dk"), c.t("dv"), c.opt("cu_seqlens_q"), c.opt("cu_seqlens_k"), c.integer("max_seqlen_q"),
              c.integer("max_seqlen_k"), c.num("softmax_scale"), c.integer("window_left"), c.integer("window_right"),
              c.num("softcap"), c.integer("deterministic") != 0, c.opt("sinks"), c.opt("dsinks"),
              c.opt("alibi_slopes"), c.opt("seqused_q"), c.integer_or("attention_chunk", 0));
}

static void quantize_fp8(const Case& c, h::Backend& be) {
  h::quantize_fp8_sm90(be, c.t("x"), c.opt("signs"), c.opt("mean"), c.opt("channel_descale"),
                       c.integer("block_size"), c.integer("layout"), c.t("out"), c.t("descale"));
}

int main() {
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string cmd;
    in >> cmd;
    try {
      if (cmd == "register") {
        std::string kind, dt;
        int d = 0, dv = 0;
        in >> kind >> dt >> d >> dv;
        register_kernel(kind, dt, d, dv);
        std::cout << "ok" << std::endl;
      } else if (cmd == "kernel_info") {
        std::cout << "ok " << h::kernel_lists_json() << std::endl;
      } else if (cmd == "case") {
        std::string rest;
        std::getline(in, rest);
        const Case c = parse_case(rest);
        FakeBackend be;
        if (c.op == "fwd") fwd(c, be);
        else if (c.op == "fwd_fp8") fwd_fp8(c, be);
        else if (c.op == "kvcache") kvcache(c, be);
        else if (c.op == "bwd") bwd(c, be);
        else if (c.op == "quantize_fp8") quantize_fp8(c, be);
        else throw std::runtime_error("unknown op " + c.op);
        std::string unread;
        for (const auto& [name, value] : c.scalars)
          if (!c.read.count(name)) unread += " " + name;
        if (!unread.empty()) throw std::runtime_error("case scalars no op reads:" + unread);
        std::cout << "ok" << std::endl;
      } else {
        std::cout << "error: unknown command " << cmd << std::endl;
      }
    } catch (const h::Error& e) {
      std::cout << "error: " << e.what() << std::endl;
    } catch (const std::exception& e) {
      std::cout << "error: driver: " << e.what() << std::endl;
    }
    g_tensors.clear();
  }
  return 0;
}
