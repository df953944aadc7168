// Argument checks and device queries shared by the torch bindings of flash3._C (binding.cpp for
// the forward ops, bwd_binding.cpp for the backward). Light torch headers only.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <mutex>
#include <optional>
#include <vector>

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

// TMA needs 16-byte aligned base addresses and 16-byte multiple strides (8 elements of 16 bits).
// The stride of a dimension of size 1 is never used to address memory; give it a harmless value.
inline int64_t tma_stride(const Tensor& t, int dim) {
  if (t.size(dim) > 1) return t.stride(dim);
  int64_t s = 8;
  for (int d = dim + 1; d < t.dim(); ++d) s = std::max(s, t.stride(d) * t.size(d));
  return (s + 7) / 8 * 8;
}

inline void check_tma_layout(const Tensor& t, const char* name, const char* op = "flash3.fwd_sm90") {
  TORCH_CHECK(t.stride(-1) == 1 || t.size(-1) == 1, op, ": ", name,
              " must have a contiguous last dimension (stride ", t.stride(-1), ")");
  for (int d = 0; d + 1 < t.dim(); ++d) {
    // A broadcast (expanded) dimension: TMA would walk past a one-copy allocation.
    TORCH_CHECK(tma_stride(t, d) > 0, op, ": ", name, ".stride(", d, ") is ",
                t.stride(d), " on a dimension of size ", t.size(d),
                " (a broadcast/expanded tensor); pass a contiguous copy");
    TORCH_CHECK(tma_stride(t, d) % 8 == 0, op, ": ", name, ".stride(", d, ") = ",
                t.stride(d), " must be a multiple of 8 elements (16 bytes, for TMA)");
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

inline int to_int(int64_t v, const char* what) {
  TORCH_CHECK(v >= 0 && v <= INT32_MAX, "flash3: ", what, " = ", v, " does not fit in int32");
  return static_cast<int>(v);
}

}  // namespace flash3
