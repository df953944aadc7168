// The fakes tests/cpp's host-layer drivers share (host_layer_driver.cpp, smoke_case_driver.cpp):
// a Hopper for csrc/flash3/host/device.cpp's functions, and tensors that are sizes, strides and a
// dtype over 16 bytes nobody reads. Included by one TU per driver executable.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "flash3/host/device.h"
#include "flash3/host/tensor_view.h"

namespace h = flash3::host;

static h::DeviceInfo g_dev{9, 0, 132, 50 << 20};  // drivers may change the capability
namespace flash3::host {
const DeviceInfo& device_info(int) { return g_dev; }
const char* last_launch_error() { return nullptr; }
const char* cuda_error_string(int) { return "fake error"; }
}  // namespace flash3::host

struct FakeTensor {
  std::vector<int64_t> sizes, strides;
  h::DType dtype;
  alignas(16) char mem[16];  // stand-in for device memory (never read)
  h::TensorView v;
};

static std::vector<std::unique_ptr<FakeTensor>> g_tensors;

static const h::TensorView& make(std::vector<int64_t> sizes, std::vector<int64_t> strides, h::DType dtype) {
  auto t = std::make_unique<FakeTensor>();
  t->sizes = std::move(sizes), t->strides = std::move(strides);
  t->dtype = dtype;
  t->v.data = t->mem;
  t->v.dtype = dtype;
  t->v.dtype_name = h::dtype_torch_name(dtype);
  t->v.elem_size = dtype == h::DType::e4m3 ? 1 : dtype == h::DType::bf16 || dtype == h::DType::fp16 ? 2 : 4;
  t->v.ndim = int(t->sizes.size());
  t->v.size_ = t->sizes.data();
  t->v.stride_ = t->strides.data();
  t->v.handle = t.get();
  g_tensors.push_back(std::move(t));
  return g_tensors.back()->v;
}
