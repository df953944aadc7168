// The shared part of flash3's simulator driver (sim_driver.cu and its op files): the case files,
// a minimal tensor type for their tensors, and the host layer's Backend on the CUDA runtime (which
// the simulator implements). The ops themselves are flash3's host layer (csrc/flash3/host/), the
// very code the torch bindings run: the driver only turns case tensors into host::TensorViews.
#pragma once
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "flash3/host/backend.h"
#include "flash3/host/check.h"
#include "flash3/host/device.h"

namespace simdrv {

[[noreturn]] inline void fatal(const std::string& msg) {
  std::fprintf(stderr, "sim_driver: %s\n", msg.c_str());
  std::exit(2);
}

inline void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fatal(std::string("CUDA error in ") + what + ": " + cudaGetErrorString(e));
}

enum class DType { bf16, fp16, e4m3, f32, i32 };

inline int elem_size(DType t) {
  switch (t) {
    case DType::e4m3: return 1;
    case DType::bf16: case DType::fp16: return 2;
    default: return 4;
  }
}

inline DType parse_dtype(const std::string& s) {
  static const std::map<std::string, DType> m{{"bf16", DType::bf16}, {"fp16", DType::fp16},
                                              {"e4m3", DType::e4m3}, {"f32", DType::f32},
                                              {"i32", DType::i32}};
  auto it = m.find(s);
  if (it == m.end()) fatal("unknown dtype '" + s + "'");
  return it->second;
}

// A case tensor: sizes, element strides, dtype, its device buffer (view() below hands it to the host layer).
struct Tensor {
  std::string name;
  DType dtype = DType::f32;
  std::vector<int64_t> sizes, strides;
  void* ptr = nullptr;
  size_t bytes = 0;  // the buffer: elements 0 .. the largest offset addressed
  int dim() const { return int(sizes.size()); }
  int64_t size(int d) const { return sizes[d < 0 ? d + dim() : d]; }
  int64_t stride(int d) const { return strides[d < 0 ? d + dim() : d]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t s : sizes) n *= s;
    return n;
  }
  int element_size() const { return elem_size(dtype); }
  void* data_ptr() const { return ptr; }
};

inline std::vector<void*> g_scratch;  // device buffers the binding would allocate (tile counter, descales, ...)

// ---- the case --------------------------------------------------------------------------------

struct Case {
  std::string dir, op;
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> scalars;
  const Tensor* opt(const char* n) const {
    auto it = tensors.find(n);
    return it == tensors.end() ? nullptr : &it->second;
  }
  const Tensor& t(const char* n) const {
    const Tensor* x = opt(n);
    if (!x) fatal(std::string("case has no tensor '") + n + "'");
    return *x;
  }
  // Scalars the op looked at (has or num): a case scalar no op reads is a stale name (e.g. the
  // `causal` the ops no longer take: the mask is the window), refused after the launch.
  mutable std::set<std::string> scalars_read;
  bool has(const char* n) const {
    scalars_read.insert(n);
    return scalars.count(n) != 0;
  }
  double num(const char* n) const {
    scalars_read.insert(n);
    auto it = scalars.find(n);
    if (it == scalars.end()) fatal(std::string("case has no scalar '") + n + "'");
    char* end = nullptr;
    const double v = std::strtod(it->second.c_str(), &end);
    if (end == it->second.c_str() || *end) fatal("bad number for " + std::string(n) + ": " + it->second);
    return v;
  }
  int64_t integer(const char* n) const { return static_cast<int64_t>(num(n)); }
};

inline std::vector<char> read_file(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) fatal("cannot open " + path);
  std::vector<char> buf;
  char tmp[1 << 16];
  size_t n;
  while ((n = std::fread(tmp, 1, sizeof tmp, f)) > 0) buf.insert(buf.end(), tmp, tmp + n);
  std::fclose(f);
  return buf;
}

inline void write_file(const std::string& path, const void* data, size_t n) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || std::fwrite(data, 1, n, f) != n || std::fclose(f) != 0) fatal("cannot write " + path);
}

// Tensor contents made here instead of read from NAME.bin (large timing cases): `random` gives
// N(0,1) values (a fixed generator per tensor index; e4m3: rounded, saturated), `ones` 1
// (descales), `nan` the NaN poison of outputs (16- and 32-bit: no output is e4m3).
inline std::vector<char> generated(const Tensor& t, const std::string& kind, size_t index) {
  if (kind != "random" && kind != "nan" && kind != "ones") fatal("tensor " + t.name + ": unknown fill '" + kind + "'");
  std::vector<char> out(t.bytes);
  const size_t n = t.bytes / t.element_size();
  uint64_t state = 0x9E3779B97F4A7C15ull * (index + 1);
  for (size_t i = 0; i < n; ++i) {
    float v = kind == "ones" ? 1.0f : std::numeric_limits<float>::quiet_NaN();
    if (kind == "random") {   // sum of four uniforms, centred and scaled to unit variance
      float u = 0;
      for (int r = 0; r < 4; ++r) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        u += float(state >> 40) * (1.0f / 16777216.0f);
      }
      v = (u - 2.0f) * 1.7320508f;
    }
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    switch (t.element_size()) {
      case 4: std::memcpy(&out[i * 4], &v, 4); break;
      case 2: {   // bf16 or fp16, round to nearest even
        uint16_t h;
        if (t.dtype == DType::bf16) {
          h = std::isnan(v) ? uint16_t(0x7FC0) : uint16_t((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
        } else {
          h = std::isnan(v) ? uint16_t(0x7E00) : __half_as_ushort(__float2half_rn(v));
        }
        std::memcpy(&out[i * 2], &h, 2);
        break;
      }
      case 1:   // e4m3, round to nearest, saturated to +-448
        if (t.dtype != DType::e4m3 || kind == "nan") fatal("tensor " + t.name + ": fill '" + kind + "' needs e4m3 here");
        out[i] = char(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
        break;
      default: fatal("tensor " + t.name + ": fill '" + kind + "' needs a 16- or 32-bit dtype");
    }
  }
  return out;
}

inline Case load_case(const std::string& dir) {
  Case c;
  c.dir = dir;
  std::istringstream in(std::string([&] { auto v = read_file(dir + "/case.txt"); return std::string(v.begin(), v.end()); }()));
  std::string line;
  bool magic = false;
  while (std::getline(in, line)) {
    const size_t hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    std::istringstream ls(line);
    std::string key;
    if (!(ls >> key)) continue;
    if (key == "flash3-sim-case") {
      int ver = 0;
      ls >> ver;
      if (ver != 1) fatal("case.txt version " + std::to_string(ver) + " (want 1)");
      magic = true;
    } else if (key == "op") {
      ls >> c.op;
    } else if (key == "tensor") {
      Tensor t;
      std::string dt;
      int nd = -1;
      ls >> t.name >> dt >> nd;
      if (!ls || nd < 0 || nd > 8) fatal("bad tensor line: " + line);
      t.dtype = parse_dtype(dt);
      t.sizes.resize(nd);
      t.strides.resize(nd);
      for (auto& s : t.sizes) ls >> s;
      for (auto& s : t.strides) ls >> s;
      if (!ls) fatal("bad tensor line: " + line);
      std::string fill_kind;   // optional: `random` (N(0,1)) or `nan` instead of NAME.bin
      ls >> fill_kind;
      int64_t span = t.numel() ? 1 : 0;  // elements 0 .. largest offset
      for (int d = 0; d < nd && t.numel(); ++d) span += (t.sizes[d] - 1) * t.strides[d];
      t.bytes = size_t(span) * t.element_size();
      const std::vector<char> data = fill_kind.empty() ? read_file(dir + "/" + t.name + ".bin")
                                                       : generated(t, fill_kind, c.tensors.size());
      if (data.size() != t.bytes)
        fatal(t.name + ".bin has " + std::to_string(data.size()) + " bytes, want " + std::to_string(t.bytes));
      ck(cudaMalloc(&t.ptr, std::max<size_t>(t.bytes, 16)), "cudaMalloc");
      if (t.bytes) ck(cudaMemcpy(t.ptr, data.data(), t.bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
      c.tensors[t.name] = t;
    } else {
      std::string v;
      ls >> v;
      c.scalars[key] = v;
    }
  }
  if (!magic) fatal(dir + "/case.txt: no 'flash3-sim-case 1' line");
  return c;
}

inline Tensor device_copy(const std::vector<float>& host, std::vector<int64_t> sizes) {
  Tensor t;
  t.dtype = DType::f32;
  t.sizes = sizes;
  t.strides.assign(sizes.size(), 1);
  for (int d = int(sizes.size()) - 2; d >= 0; --d) t.strides[d] = t.strides[d + 1] * sizes[d + 1];
  t.bytes = host.size() * 4;
  ck(cudaMalloc(&t.ptr, std::max<size_t>(t.bytes, 16)), "cudaMalloc");
  if (t.bytes) ck(cudaMemcpy(t.ptr, host.data(), t.bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
  g_scratch.push_back(t.ptr);
  return t;
}

// out.zero_() / lse.fill_(-inf) of the binding's no-keys path (every element the views address).
inline void fill(const Tensor& t, float value) {
  std::vector<char> host(t.bytes);
  ck(cudaMemcpy(host.data(), t.ptr, t.bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
  std::vector<int64_t> idx(t.dim(), 0);
  for (int64_t n = 0; n < t.numel(); ++n) {
    int64_t off = 0;
    for (int d = 0; d < t.dim(); ++d) off += idx[d] * t.strides[d];
    if (t.dtype == DType::f32) {
      std::memcpy(&host[off * 4], &value, 4);
    } else {  // 16-bit zero
      std::memset(&host[off * t.element_size()], 0, t.element_size());
    }
    for (int d = t.dim() - 1; d >= 0 && ++idx[d] == t.sizes[d]; --d) idx[d] = 0;
  }
  ck(cudaMemcpy(t.ptr, host.data(), t.bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
}

// TorchBackend::fill_empty_lse (csrc/torch_adapter.h): lse.fill_(-inf), or with sinks lse[..., head (dim head_dim), ...]
// = sinks[head].
inline void fill_empty_lse(const Tensor& lse, const Tensor* sinks, int head_dim) {
  if (sinks == nullptr) return fill(lse, -std::numeric_limits<float>::infinity());
  std::vector<float> s(size_t(sinks->numel()));
  if (!s.empty()) ck(cudaMemcpy(s.data(), sinks->ptr, s.size() * 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
  std::vector<char> host(lse.bytes);
  ck(cudaMemcpy(host.data(), lse.ptr, lse.bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
  std::vector<int64_t> idx(lse.dim(), 0);
  for (int64_t n = 0; n < lse.numel(); ++n) {
    int64_t off = 0;
    for (int d = 0; d < lse.dim(); ++d) off += idx[d] * lse.strides[d];
    std::memcpy(&host[off * 4], &s[idx[head_dim]], 4);
    for (int d = lse.dim() - 1; d >= 0 && ++idx[d] == lse.sizes[d]; --d) idx[d] = 0;
  }
  ck(cudaMemcpy(lse.ptr, host.data(), lse.bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
}

// ---- the host layer's view of a case tensor, and its backend ----------------------------------

inline flash3::host::TensorView view(const Tensor& t) {
  namespace h = flash3::host;
  h::TensorView v;
  v.data = t.ptr;
  switch (t.dtype) {
    case DType::bf16: v.dtype = h::DType::bf16; break;
    case DType::fp16: v.dtype = h::DType::fp16; break;
    case DType::e4m3: v.dtype = h::DType::e4m3; break;
    case DType::f32: v.dtype = h::DType::f32; break;
    default: v.dtype = h::DType::i32;
  }
  v.dtype_name = h::dtype_torch_name(v.dtype);
  v.elem_size = t.element_size();
  v.ndim = t.dim();
  v.size_ = t.sizes.data();
  v.stride_ = t.strides.data();
  v.device = {h::DeviceKind::cuda, 0};  // the simulator's one GPU
  v.handle = &t;
  return v;
}

inline std::optional<flash3::host::TensorView> view(const Tensor* t) {
  return t ? std::optional<flash3::host::TensorView>(view(*t)) : std::nullopt;
}

inline const flash3::host::TensorView* ptr(const std::optional<flash3::host::TensorView>& v) {
  return v ? &*v : nullptr;
}

// The torch adapter's operations (csrc/torch_adapter.h TorchBackend) with the CUDA runtime: the
// default stream, cudaMalloc'd scratch freed at exit, host loops for the fills. Every case tensor is
// its own allocation, so the overlap checks have nothing to find.
class SimBackend final : public flash3::host::Backend {
 public:
  void* stream() override { return nullptr; }  // the default stream (the binding: torch's current one)

  void* alloc(int64_t count, flash3::host::DType, flash3::host::Init init) override {
    void* p = nullptr;
    const size_t bytes = size_t(std::max<int64_t>(count, 0)) * 4;  // f32 or i32
    ck(cudaMalloc(&p, std::max<size_t>(bytes, 16)), "cudaMalloc");
    g_scratch.push_back(p);
    if (init == flash3::host::Init::zero) ck(cudaMemset(p, 0, bytes), "cudaMemset");
    if (init == flash3::host::Init::neg_inf) {
      const std::vector<float> inf(size_t(count), -std::numeric_limits<float>::infinity());
      ck(cudaMemcpy(p, inf.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
    }
    // Init::none: at::empty is uninitialized (simrun --uninit fills it with 0xFF)
    return p;
  }

  void fill(const flash3::host::TensorView& t, float value) override { simdrv::fill(tensor(t), value); }

  void fill_empty_lse(const flash3::host::TensorView& lse, const flash3::host::TensorView* sinks,
                      int head_dim) override {
    simdrv::fill_empty_lse(tensor(lse), sinks ? &tensor(*sinks) : nullptr, head_dim);
  }

  void neg_inf_rows_past_end(const flash3::host::TensorView& lse_view, const flash3::host::TensorView& cu_seqlens_q,
                             int64_t batch) override {
    const Tensor& lse = tensor(lse_view);
    int end = 0;
    ck(cudaMemcpy(&end, static_cast<const int*>(cu_seqlens_q.data) + batch, 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
    const float ninf = -std::numeric_limits<float>::infinity();
    for (int64_t head = 0; head < lse.size(0); ++head)
      for (int64_t r = std::max<int64_t>(end, 0); r < lse.size(1); ++r)
        ck(cudaMemcpy(static_cast<float*>(lse.ptr) + head * lse.strides[0] + r * lse.strides[1], &ninf, 4,
                      cudaMemcpyHostToDevice), "cudaMemcpy");
  }

  // t.repeat_interleave(repeat, 2) is contiguous (b, h, n * repeat); the narrowed view keeps its strides.
  flash3::host::TensorView repeat_last(const flash3::host::TensorView& tv, int64_t r, int64_t count) override {
    const Tensor& t = tensor(tv);
    const int64_t b = t.size(0), heads = t.size(1), nb = t.size(2);
    std::vector<float> src(t.bytes / 4), rep(size_t(b * heads * nb * r));
    if (t.bytes) ck(cudaMemcpy(src.data(), t.ptr, t.bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
    for (int64_t i = 0; i < b; ++i)
      for (int64_t j = 0; j < heads; ++j)
        for (int64_t x = 0; x < nb * r; ++x)
          rep[(i * heads + j) * nb * r + x] = src[i * t.stride(0) + j * t.stride(1) + (x / r) * t.stride(2)];
    Tensor keep = device_copy(rep, {b, heads, nb * r});
    keep.sizes[2] = count;
    keep_.push_back(keep);
    return view(keep_.back());
  }

  void assert_no_overlap(const flash3::host::TensorView&, const flash3::host::TensorView&) override {}
  void assert_no_internal_overlap(const flash3::host::TensorView&) override {}

  const char* build_name() const override { return "sim_driver; see sim_driver --info"; }
  bool tracing() const override { return true; }
  void trace(const std::string& line) override { std::fprintf(stderr, "sim_driver: %s\n", line.c_str()); }

 private:
  static const Tensor& tensor(const flash3::host::TensorView& v) { return *static_cast<const Tensor*>(v.handle); }
  std::deque<Tensor> keep_;
};

// ---- ops ---------------------------------------------------------------------------------------

// One op of the driver ("op NAME" in case.txt): run() makes the call through the host layer (which
// throws host::Error for what the binding would refuse); after it the driver writes
// CASE_DIR/NAME.out.bin for each of `outputs` the case has. info(): its --info entries, or nullptr.
struct Op {
  const char* name;
  void (*run)(const Case& c, flash3::host::Backend& be);
  std::vector<const char*> outputs;
  std::string (*info)() = nullptr;
};

inline std::vector<Op>& ops() {
  static std::vector<Op> all;
  return all;
}

// `static const RegisterOp r{{...}};` in an op's file adds it to the driver.
struct RegisterOp {
  explicit RegisterOp(Op op) { ops().push_back(std::move(op)); }
};

}  // namespace simdrv
