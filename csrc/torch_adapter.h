// The torch side of flash3's host layer (csrc/flash3/host/): an at::Tensor as a host::TensorView,
// the Backend on ATen (the current CUDA stream, the caching allocator, the few tensor operations
// outside the kernels), and host::Error raised as TORCH_CHECK raises. Each binding (*_binding.cpp)
// is this adapter around one op of the host layer. Light torch headers only.
#pragma once

#include <ATen/MemoryOverlap.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <c10/core/ScalarType.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include <deque>
#include <limits>
#include <optional>

#include "flash3/host/backend.h"
#include "flash3/host/check.h"

namespace flash3 {

using at::Tensor;

inline host::TensorView view(const Tensor& t) {
  host::TensorView v;
  v.data = t.data_ptr();
  switch (t.scalar_type()) {
    case at::kBFloat16: v.dtype = host::DType::bf16; break;
    case at::kHalf: v.dtype = host::DType::fp16; break;
    case at::kFloat: v.dtype = host::DType::f32; break;
    case at::kInt: v.dtype = host::DType::i32; break;
    case at::kFloat8_e4m3fn: v.dtype = host::DType::e4m3; break;
    default: v.dtype = host::DType::other;
  }
  v.dtype_name = c10::toString(t.scalar_type());
  v.elem_size = static_cast<int>(t.element_size());
  v.ndim = static_cast<int>(t.dim());
  v.size_ = t.sizes().data();
  v.stride_ = t.strides().data();
  const c10::Device d = t.device();
  v.device.kind = d.is_cuda() ? host::DeviceKind::cuda : d.is_cpu() ? host::DeviceKind::cpu : host::DeviceKind::other;
  v.device.index = d.index();
  v.handle = &t;
  return v;
}

inline std::optional<host::TensorView> view(const std::optional<Tensor>& t) {
  return t.has_value() ? std::optional<host::TensorView>(view(*t)) : std::nullopt;
}

inline const host::TensorView* ptr(const std::optional<host::TensorView>& v) { return v ? &*v : nullptr; }

// The backend of one call; `ref` (q, or x) gives the device and the current stream.
class TorchBackend final : public host::Backend {
 public:
  explicit TorchBackend(const Tensor& ref) : ref_(ref) {}

  void* stream() override { return c10::cuda::getCurrentCUDAStream(ref_.get_device()).stream(); }

  void* alloc(int64_t count, host::DType dtype, host::Init init) override {
    const auto opts = ref_.options().dtype(dtype == host::DType::i32 ? at::kInt : at::kFloat);
    switch (init) {
      case host::Init::zero: keep_.push_back(at::zeros({count}, opts)); break;
      case host::Init::neg_inf: keep_.push_back(at::full({count}, -std::numeric_limits<float>::infinity(), opts)); break;
      default: keep_.push_back(at::empty({count}, opts));
    }
    return keep_.back().data_ptr();
  }

  void fill(const host::TensorView& t, float value) override {
    if (value == 0.f) {
      tensor(t).zero_();
    } else {
      tensor(t).fill_(value);
    }
  }

  void fill_empty_lse(const host::TensorView& lse_view, const host::TensorView* sinks, int head_dim) override {
    const Tensor& lse = tensor(lse_view);
    if (sinks == nullptr) {
      lse.fill_(-std::numeric_limits<float>::infinity());
      return;
    }
    std::vector<int64_t> shape(lse.dim(), 1);
    shape[head_dim] = lse.size(head_dim);
    lse.copy_(tensor(*sinks).view(shape).expand_as(lse));
  }

  void neg_inf_rows_past_end(const host::TensorView& lse, const host::TensorView& cu_seqlens_q, int64_t batch) override {
    const Tensor& cu = tensor(cu_seqlens_q);
    const Tensor past = at::arange(lse.size(1), cu.options()).ge(cu.select(0, batch));  // on the device, no sync
    tensor(lse).masked_fill_(past.unsqueeze(0), -std::numeric_limits<float>::infinity());
  }

  host::TensorView repeat_last(const host::TensorView& t, int64_t repeat, int64_t count) override {
    keep_.push_back(tensor(t).repeat_interleave(repeat, 2).narrow(2, 0, count));
    return view(keep_.back());
  }

  void assert_no_overlap(const host::TensorView& a, const host::TensorView& b) override {
    at::assert_no_overlap(tensor(a), tensor(b));
  }
  void assert_no_internal_overlap(const host::TensorView& t) override { at::assert_no_internal_overlap(tensor(t)); }

  const char* build_name() const override { return "flash3._C; see torch.ops.flash3.kernel_info()"; }

 private:
  // Views the host layer hands back were made by view() above, from the caller's tensors or keep_.
  static const Tensor& tensor(const host::TensorView& v) { return *static_cast<const Tensor*>(v.handle); }

  const Tensor& ref_;
  std::deque<Tensor> keep_;  // scratch and repeated descales: alive until the op returns (stream-ordered reuse)
};

// Runs one op of the host layer on `ref`'s device: its refusals raise as TORCH_CHECK does (the same
// RuntimeError and message the bindings always raised).
template <class F>
void run_host_op(const Tensor& ref, F&& op) {
  const c10::cuda::OptionalCUDAGuard guard(ref.is_cuda() ? std::optional<c10::Device>(ref.device()) : std::nullopt);
  TorchBackend be(ref);
  try {
    op(be);
  } catch (const host::Error& e) {
    TORCH_CHECK(false, e.what());
  }
}

}  // namespace flash3
