// The shared part of flash3's simulator driver (sim_driver.cu and its op files): the case files,
// a minimal tensor type standing in for at::Tensor, and csrc/binding_common.h's checks and
// FwdParams setup on it, line for line (keep the two in step).
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "flash3/fwd/api.h"
#include "flash3/fwd/params.h"

namespace simdrv {

// A refused call (TORCH_CHECK in the binding, std::runtime_error from the launcher): exit 3.
struct Refused : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <class... A>
inline void check(bool ok, const A&... parts) {
  if (ok) return;
  std::ostringstream os;
  (os << ... << parts);
  throw Refused(os.str());
}

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

inline const char* dtype_str(DType t) {
  switch (t) {
    case DType::bf16: return "BFloat16";
    case DType::fp16: return "Half";
    case DType::e4m3: return "Float8_e4m3fn";
    case DType::f32: return "Float";
    default: return "Int";
  }
}

// The part of at::Tensor the binding uses: sizes, element strides, dtype, a device pointer.
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

inline std::string shape_str(const std::vector<int64_t>& v) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << "]";
  return os.str();
}

// ---- csrc/binding_common.h, on Tensor ----------------------------------------------------------

inline int64_t tma_stride(const Tensor& t, int dim) {
  if (t.size(dim) > 1) return t.stride(dim);
  const int64_t unit = 16 / t.element_size();
  int64_t s = unit;
  for (int d = dim + 1; d < t.dim(); ++d) s = std::max(s, t.stride(d) * t.size(d));
  return (s + unit - 1) / unit * unit;
}

inline void check_tma_layout(const Tensor& t, const char* name, const char* op = "flash3.fwd_sm90") {
  check(t.stride(-1) == 1 || t.size(-1) == 1, op, ": ", name, " must have a contiguous last dimension (stride ",
        t.stride(-1), ")");
  for (int d = 0; d + 1 < t.dim(); ++d) {
    check(tma_stride(t, d) > 0, op, ": ", name, ".stride(", d, ") is ", t.stride(d), " on a dimension of size ",
          t.size(d), " (a broadcast/expanded tensor); pass a contiguous copy");
    check(tma_stride(t, d) * t.element_size() % 16 == 0, op, ": ", name, ".stride(", d, ") = ", t.stride(d),
          " must be a multiple of ", 16 / t.element_size(), " elements (16 bytes, for TMA)");
  }
  check(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, op, ": ", name, " must be 16-byte aligned (for TMA)");
}

inline void check_shape(const Tensor& t, const char* name, std::vector<int64_t> expected) {
  check(t.sizes == expected, "flash3: ", name, " has shape ", shape_str(t.sizes), ", expected ", shape_str(expected));
}

inline void check_seqlens(const Tensor* t, const char* name, int64_t numel) {
  if (t == nullptr) return;
  check(t->dtype == DType::i32, "flash3: ", name, " must be int32, got ", dtype_str(t->dtype));
  check(t->dim() == 1 && t->numel() == numel, "flash3: ", name, " must have shape (", numel, "), got ",
        shape_str(t->sizes));
  check(t->stride(0) == 1 || t->numel() <= 1, "flash3: ", name, " must be contiguous");
}

// binding_common.h check_alibi: ALiBi slopes float32 (num_heads,) or (batch, num_heads), contiguous.
inline const float* check_alibi(const Tensor* slopes, int64_t batch, int64_t num_heads, const char* op,
                                int64_t* batch_stride) {
  *batch_stride = 0;
  if (slopes == nullptr) return nullptr;
  check(slopes->dtype == DType::f32, op, ": alibi_slopes must be float32, got ", dtype_str(slopes->dtype));
  check((slopes->dim() == 1 && slopes->size(0) == num_heads) ||
            (slopes->dim() == 2 && slopes->size(0) == batch && slopes->size(1) == num_heads),
        op, ": alibi_slopes must have shape (", num_heads, ",) or (", batch, ", ", num_heads, "), got ",
        shape_str(slopes->sizes));
  check(slopes->stride(slopes->dim() - 1) == 1 || slopes->numel() <= 1, op, ": alibi_slopes must be contiguous");
  *batch_stride = slopes->dim() == 2 ? num_heads : 0;
  return static_cast<const float*>(slopes->data_ptr());
}

inline const float* check_sinks(const Tensor* sinks, int64_t num_heads, const char* op) {
  if (sinks == nullptr) return nullptr;
  check(sinks->dtype == DType::f32, op, ": sinks must be float32, got ", dtype_str(sinks->dtype));
  check(sinks->dim() == 1 && sinks->size(0) == num_heads, op, ": sinks must have shape (", num_heads,
        ",) (one logit per query head), got ", shape_str(sinks->sizes));
  check(sinks->stride(0) == 1 || sinks->numel() <= 1, op, ": sinks must be contiguous");
  return static_cast<const float*>(sinks->data_ptr());
}

inline int to_int(int64_t v, const char* what) {
  check(v >= 0 && v <= INT32_MAX, "flash3: ", what, " = ", v, " does not fit in int32");
  return static_cast<int>(v);
}

struct DeviceInfo {
  int major = 0, minor = 0, num_sms = 0, l2_bytes = 0;
};

inline DeviceInfo device_info() {
  DeviceInfo d;
  int dev = 0;
  ck(cudaGetDevice(&dev), "cudaGetDevice");
  ck(cudaDeviceGetAttribute(&d.major, cudaDevAttrComputeCapabilityMajor, dev), "cudaDeviceGetAttribute");
  ck(cudaDeviceGetAttribute(&d.minor, cudaDevAttrComputeCapabilityMinor, dev), "cudaDeviceGetAttribute");
  ck(cudaDeviceGetAttribute(&d.num_sms, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute");
  ck(cudaDeviceGetAttribute(&d.l2_bytes, cudaDevAttrL2CacheSize, dev), "cudaDeviceGetAttribute");
  return d;
}

inline const char* dtype_name(bool is_bf16) { return is_bf16 ? "bf16" : "fp16"; }

inline std::vector<void*> g_scratch;  // device buffers the binding would allocate (tile counter, descales)

inline void set_mask_and_launch(flash3::FwdParams& p, flash3::FwdLauncher launch, const DeviceInfo& dev,
                         double softmax_scale, double softcap, bool causal, int64_t window_left,
                         int64_t window_right, const char* op, const char* dtype) {
  p.softmax_scale = static_cast<float>(softmax_scale);
  p.softcap = static_cast<float>(softcap);
  p.is_causal = causal;
  p.window_left = static_cast<int>(std::max<int64_t>(window_left, -1));
  p.window_right = causal ? 0 : static_cast<int>(std::max<int64_t>(window_right, -1));
  p.num_sms = dev.num_sms;
  p.l2_bytes = dev.l2_bytes;
  if (flash3::fwd_uses_dynamic_scheduler(p)) {  // at::zeros({1}, int32)
    void* c = nullptr;
    ck(cudaMalloc(&c, 4), "cudaMalloc");
    ck(cudaMemset(c, 0, 4), "cudaMemset");
    g_scratch.push_back(c);
    p.tile_counter = static_cast<int*>(c);
  }
  std::fprintf(stderr, "sim_driver: %s%s%s d=%d d_v=%d b=%d s_q=%d s_k=%d h=%d h_k=%d causal=%d window=(%d,%d) "
               "softcap=%g varlen=%d seqused_k=%d dynamic=%d num_sms=%d\n",
               op, dtype ? " " : "", dtype ? dtype : "", p.head_dim, p.head_dim_v, p.batch, p.seqlen_q, p.seqlen_k,
               p.num_heads, p.num_heads_k, int(p.is_causal), p.window_left, p.window_right, p.softcap,
               int(p.cu_seqlens_q != nullptr), int(p.seqused_k != nullptr), int(p.tile_counter != nullptr),
               p.num_sms);
  try {
    launch(p, nullptr);  // the default stream (the binding: torch's current stream)
  } catch (const std::exception& e) {
    std::ostringstream os;
    os << op << " (" << (dtype ? dtype : "") << (dtype ? ", " : "") << "d=" << p.head_dim << ", d_v=" << p.head_dim_v
       << "): kernel launch failed: " << e.what();
    throw Refused(os.str());
  }
  const cudaError_t err = cudaGetLastError();
  check(err == cudaSuccess, op, ": CUDA error after launch: ", cudaGetErrorString(err));
}

inline void set_q_k_out(flash3::FwdParams& p, const Tensor& q, const Tensor& k, const Tensor& out, const Tensor& lse,
                 const Tensor* cu_seqlens_q, const Tensor* cu_seqlens_k, int64_t batch, int64_t s_q, int64_t s_k) {
  const bool varlen = cu_seqlens_q != nullptr;
  const int dim = varlen ? 3 : 4;
  auto strides = [&](const Tensor& t, int64_t& bs, int64_t& rs, int64_t& hs) {
    bs = varlen ? 0 : tma_stride(t, 0);
    rs = tma_stride(t, dim - 3);
    hs = tma_stride(t, dim - 2);
  };
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.o = out.data_ptr();
  p.lse = static_cast<float*>(lse.data_ptr());
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
  p.total_q = to_int(varlen ? q.size(0) : batch * s_q, "total_q");
  p.total_k = varlen ? to_int(k.size(0), "total_k") : static_cast<int>(std::min<int64_t>(batch * s_k, INT32_MAX));
  p.cu_seqlens_q = varlen ? static_cast<const int*>(cu_seqlens_q->data_ptr()) : nullptr;
  p.cu_seqlens_k = varlen ? static_cast<const int*>(cu_seqlens_k->data_ptr()) : nullptr;
}

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
  bool has(const char* n) const { return scalars.count(n) != 0; }
  double num(const char* n) const {
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
// N(0,1) values (a fixed generator per tensor index), `nan` the NaN poison of outputs.
inline std::vector<char> generated(const Tensor& t, const std::string& kind, size_t index) {
  if (kind != "random" && kind != "nan") fatal("tensor " + t.name + ": unknown fill '" + kind + "'");
  std::vector<char> out(t.bytes);
  const size_t n = t.bytes / t.element_size();
  uint64_t state = 0x9E3779B97F4A7C15ull * (index + 1);
  for (size_t i = 0; i < n; ++i) {
    float v = std::numeric_limits<float>::quiet_NaN();
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

// binding_common.h fill_empty_lse: lse.fill_(-inf), or with sinks lse[..., head (dim head_dim), ...]
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

// ---- ops ---------------------------------------------------------------------------------------

// One op of the driver ("op NAME" in case.txt): run() makes the call (throws Refused for what the
// binding would refuse); after it the driver writes CASE_DIR/NAME.out.bin for each of `outputs`
// the case has. info(): its kernel_info() entries ("\"bwd\": [...]"), or nullptr.
struct Op {
  const char* name;
  void (*run)(const Case& c, const DeviceInfo& dev);
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
