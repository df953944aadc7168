// Argument checks, device queries and the forward launch shared by the torch bindings of
// flash3._C (binding.cpp for the forward ops, bwd_binding.cpp for the backward, kvcache_binding.cpp
// for the decode kernels). Light torch headers only.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <exception>
#include <limits>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "flash3/common/total_rows.h"
#include "flash3/fwd/api.h"
#include "flash3/fwd/params.h"

namespace flash3 {

using at::Tensor;

constexpr int kMaxDevices = 64;

struct DeviceInfo {
  int major = 0, minor = 0, num_sms = 0, l2_bytes = 0;
};

// Attributes of a device, queried once (cudaDeviceGetAttribute; no cuBLAS-pulling ATen headers).
inline const DeviceInfo& device_info(int device) {
  static std::array<DeviceInfo, kMaxDevices> infos;
  static std::array<std::once_flag, kMaxDevices> flags;
  TORCH_CHECK(device >= 0 && device < kMaxDevices, "flash3: device index ", device, " out of range");
  std::call_once(flags[device], [device] {
    DeviceInfo& d = infos[device];
    auto get = [device](cudaDeviceAttr attr) {
      int v = 0;
      cudaError_t err = cudaDeviceGetAttribute(&v, attr, device);
      TORCH_CHECK(err == cudaSuccess, "flash3: cudaDeviceGetAttribute failed: ",
                  cudaGetErrorString(err));
      return v;
    };
    d.major = get(cudaDevAttrComputeCapabilityMajor);
    d.minor = get(cudaDevAttrComputeCapabilityMinor);
    d.num_sms = get(cudaDevAttrMultiProcessorCount);
    d.l2_bytes = get(cudaDevAttrL2CacheSize);
  });
  return infos[device];
}

inline const char* dtype_name(bool is_bf16) { return is_bf16 ? "bf16" : "fp16"; }

// TMA (and 16-byte cp.async) needs 16-byte aligned base addresses and 16-byte multiple strides
// (8 elements of 16 bits, 16 of 8). The stride of a dimension of size 1 is never used to address
// memory; give it a harmless value.
inline int64_t tma_stride(const Tensor& t, int dim) {
  if (t.size(dim) > 1) return t.stride(dim);
  const int64_t unit = 16 / t.element_size();
  int64_t s = unit;
  for (int d = dim + 1; d < t.dim(); ++d) s = std::max(s, t.stride(d) * t.size(d));
  return (s + unit - 1) / unit * unit;
}

inline void check_tma_layout(const Tensor& t, const char* name, const char* op = "flash3.fwd_sm90") {
  TORCH_CHECK(t.stride(-1) == 1 || t.size(-1) == 1, op, ": ", name,
              " must have a contiguous last dimension (stride ", t.stride(-1), ")");
  for (int d = 0; d + 1 < t.dim(); ++d) {
    // A broadcast (expanded) dimension: TMA would walk past a one-copy allocation.
    TORCH_CHECK(tma_stride(t, d) > 0, op, ": ", name, ".stride(", d, ") is ",
                t.stride(d), " on a dimension of size ", t.size(d),
                " (a broadcast/expanded tensor); pass a contiguous copy");
    TORCH_CHECK(tma_stride(t, d) * t.element_size() % 16 == 0, op, ": ", name, ".stride(", d, ") = ",
                t.stride(d), " must be a multiple of ", 16 / t.element_size(), " elements (16 bytes, for TMA)");
  }
  TORCH_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, op, ": ", name,
              " must be 16-byte aligned (for TMA)");
}

inline void check_shape(const Tensor& t, const char* name, std::vector<int64_t> expected) {
  TORCH_CHECK(t.sizes().vec() == expected, "flash3: ", name, " has shape ", t.sizes(),
              ", expected ", c10::IntArrayRef(expected));
}

inline void check_seqlens(const std::optional<Tensor>& t, const char* name, int64_t numel,
                   const Tensor& q) {
  if (!t.has_value()) return;
  TORCH_CHECK(t->scalar_type() == at::kInt, "flash3: ", name, " must be int32, got ",
              t->scalar_type());
  TORCH_CHECK(t->device() == q.device(), "flash3: ", name, " must be on ", q.device(), ", got ",
              t->device());
  TORCH_CHECK(t->dim() == 1 && t->numel() == numel, "flash3: ", name, " must have shape (",
              numel, "), got ", t->sizes());
  TORCH_CHECK(t->is_contiguous(), "flash3: ", name, " must be contiguous");
}

// Attention sinks (FwdParams::sinks): nullptr without, else the data of a contiguous float32
// (num_heads,) tensor on q's device, one logit per query head.
inline const float* check_sinks(const std::optional<Tensor>& sinks, int64_t num_heads, const Tensor& q,
                                const char* op) {
  if (!sinks.has_value()) return nullptr;
  const Tensor& s = *sinks;
  TORCH_CHECK(s.scalar_type() == at::kFloat, op, ": sinks must be float32, got ", s.scalar_type());
  TORCH_CHECK(s.device() == q.device(), op, ": sinks must be on ", q.device(), ", got ", s.device());
  TORCH_CHECK(s.dim() == 1 && s.size(0) == num_heads, op, ": sinks must have shape (", num_heads,
              ",) (one logit per query head), got ", s.sizes());
  TORCH_CHECK(s.is_contiguous(), op, ": sinks must be contiguous");
  return s.data_ptr<float>();
}

// ALiBi slopes (FwdParams/BwdParams alibi_slopes): nullptr without, else the data of a contiguous
// float32 (num_heads,) or (batch, num_heads) tensor on q's device; *batch_stride gets 0 or num_heads.
inline const float* check_alibi(const std::optional<Tensor>& slopes, int64_t batch, int64_t num_heads,
                                const Tensor& q, const char* op, int64_t* batch_stride) {
  *batch_stride = 0;
  if (!slopes.has_value()) return nullptr;
  const Tensor& s = *slopes;
  TORCH_CHECK(s.scalar_type() == at::kFloat, op, ": alibi_slopes must be float32, got ", s.scalar_type());
  TORCH_CHECK(s.device() == q.device(), op, ": alibi_slopes must be on ", q.device(), ", got ", s.device());
  TORCH_CHECK((s.dim() == 1 && s.size(0) == num_heads) || (s.dim() == 2 && s.size(0) == batch && s.size(1) == num_heads),
              op, ": alibi_slopes must have shape (", num_heads, ",) or (", batch, ", ", num_heads, "), got ",
              s.sizes());
  TORCH_CHECK(s.is_contiguous(), op, ": alibi_slopes must be contiguous");
  *batch_stride = s.dim() == 2 ? num_heads : 0;
  return s.data_ptr<float>();
}

// The lse of a call whose rows all see no key: -inf, or with sinks each row's sink (lse's head
// dimension: head_dim; every other dimension broadcasts).
inline void fill_empty_lse(const Tensor& lse, const std::optional<Tensor>& sinks, int head_dim) {
  if (!sinks.has_value()) {
    lse.fill_(-std::numeric_limits<float>::infinity());
    return;
  }
  std::vector<int64_t> shape(lse.dim(), 1);
  shape[head_dim] = lse.size(head_dim);
  lse.copy_(sinks->view(shape).expand_as(lse));
}

inline int to_int(int64_t v, const char* what) {
  TORCH_CHECK(v >= 0 && v <= INT32_MAX, "flash3: ", what, " = ", v, " does not fit in int32");
  return static_cast<int>(v);
}

// total_q / total_k for the kernels (kernel_total_rows): varlen must fit int32, batched is clamped.
inline int total_rows(int64_t total, bool varlen, const char* what) {
  const long long v = kernel_total_rows(total, varlen);
  TORCH_CHECK(v >= 0, "flash3: ", what, " = ", total,
              " packed rows do not fit in int32 (varlen calls index them in 32 bits)");
  return static_cast<int>(v);
}

// The mask and softmax fields of `p`, its launch resources, then the launch on the current stream,
// shared by both forward ops. Errors name the call: "<op> (<dtype>, d=.., d_v=..)", the dtype left
// out when null; the text is only built on an error.
inline void set_mask_and_launch(FwdParams& p, FwdLauncher launch, const Tensor& q, const DeviceInfo& dev,
                         double softmax_scale, double softcap, bool causal, int64_t window_left,
                         int64_t window_right, const char* op, const char* dtype) {
  auto tag = [&] {
    std::ostringstream os;
    os << op << " (";
    if (dtype != nullptr) os << dtype << ", ";
    os << "d=" << p.head_dim << ", d_v=" << p.head_dim_v << ")";
    return os.str();
  };
  p.softmax_scale = static_cast<float>(softmax_scale);
  p.softcap = static_cast<float>(softcap);
  p.is_causal = causal;
  p.window_left = static_cast<int>(std::max<int64_t>(window_left, -1));
  p.window_right = causal ? 0 : static_cast<int>(std::max<int64_t>(window_right, -1));

  p.num_sms = dev.num_sms;
  p.l2_bytes = dev.l2_bytes;
  // Causal, local and varlen tiles differ in cost: the kernel's dynamic scheduler takes them from
  // an atomic counter (fwd/scheduler.cuh). A fresh zeroed int32 per call: a memset on the current
  // stream, so calls on different streams never share it and CUDA graphs capture it.
  Tensor tile_counter;
  if (fwd_uses_dynamic_scheduler(p)) {
    tile_counter = at::zeros({1}, q.options().dtype(at::kInt));
    p.tile_counter = tile_counter.data_ptr<int>();
  }

  cudaStream_t stream = c10::cuda::getCurrentCUDAStream(q.get_device()).stream();
  try {
    launch(p, static_cast<void*>(stream));
  } catch (const c10::Error&) {
    throw;
  } catch (const std::exception& e) {
    TORCH_CHECK(false, tag(), ": kernel launch failed: ", e.what());
  }
  const cudaError_t err = cudaGetLastError();
  TORCH_CHECK(err == cudaSuccess, tag(), ": CUDA error after launch: ", cudaGetErrorString(err));
}

// The fields both forward ops fill alike: q, k, out and lse (pointers, element strides) and the
// sizes. Batched tensors are (b, s, h, d); packed (varlen, cu_seqlens given) ones (total, h, d),
// with no batch stride and s_q/s_k the max lengths. Each op sets its own v.
inline void set_q_k_out(FwdParams& p, const Tensor& q, const Tensor& k, const Tensor& out, const Tensor& lse,
                 const std::optional<Tensor>& cu_seqlens_q, const std::optional<Tensor>& cu_seqlens_k,
                 int64_t batch, int64_t s_q, int64_t s_k) {
  const bool varlen = cu_seqlens_q.has_value();
  const int dim = varlen ? 3 : 4;
  auto strides = [&](const Tensor& t, int64_t& bs, int64_t& rs, int64_t& hs) {
    bs = varlen ? 0 : tma_stride(t, 0);
    rs = tma_stride(t, dim - 3);
    hs = tma_stride(t, dim - 2);
  };
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.o = out.data_ptr();
  p.lse = lse.data_ptr<float>();
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
  p.cu_seqlens_q = varlen ? cu_seqlens_q->data_ptr<int>() : nullptr;
  p.cu_seqlens_k = varlen ? cu_seqlens_k->data_ptr<int>() : nullptr;
}

}  // namespace flash3
