// The tensors of flash3's host layer (csrc/flash3/host/): what an op needs to know of an argument
// (data pointer, dtype, sizes, element strides, device) without torch. The torch bindings build one
// per at::Tensor (csrc/torch_adapter.h), the simulator driver one per case tensor. Names print as
// torch prints them, so the host layer's error messages read as the bindings' always have.
#pragma once
#include <cstdint>
#include <ostream>
#include <vector>

namespace flash3::host {

// The dtypes the ops take; anything else is `other` (refused by every op, printed by name).
enum class DType : int8_t { bf16, fp16, f32, i32, e4m3, other };

// torch's name of a dtype (c10::toString), for views that do not carry their own.
inline const char* dtype_torch_name(DType t) {
  switch (t) {
    case DType::bf16: return "BFloat16";
    case DType::fp16: return "Half";
    case DType::f32: return "Float";
    case DType::i32: return "Int";
    case DType::e4m3: return "Float8_e4m3fn";
    default: return "Undefined";
  }
}

enum class DeviceKind : int8_t { cpu, cuda, other };

struct Device {
  DeviceKind kind = DeviceKind::cuda;
  int index = 0;  // -1: none (a CPU tensor)
  bool operator==(const Device& o) const { return kind == o.kind && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
};

// As c10::Device prints: "cuda:0", "cpu".
inline std::ostream& operator<<(std::ostream& os, const Device& d) {
  os << (d.kind == DeviceKind::cuda ? "cuda" : d.kind == DeviceKind::cpu ? "cpu" : "other");
  if (d.index >= 0) os << ":" << d.index;
  return os;
}

// Sizes, printed as torch prints IntArrayRef: [2, 3, 4].
struct Sizes : std::vector<int64_t> {
  using std::vector<int64_t>::vector;
  Sizes(std::vector<int64_t> v) : std::vector<int64_t>(std::move(v)) {}
};

inline std::ostream& operator<<(std::ostream& os, const Sizes& s) {
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  return os << "]";
}

// Sizes and strides point into the caller's tensor object (at::Tensor's TensorImpl, the driver's
// vectors): a view lives no longer than the tensor it describes.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::other;
  const char* dtype_name = "Undefined";  // torch's name (BFloat16, Half, Float, Int, Long, ...)
  int elem_size = 0;                     // bytes per element
  int ndim = 0;
  const int64_t* size_ = nullptr;
  const int64_t* stride_ = nullptr;  // in elements
  Device device;
  const void* handle = nullptr;  // the caller's own tensor object, for its backend's tensor ops

  int dim() const { return ndim; }
  int64_t size(int d) const { return size_[d < 0 ? d + ndim : d]; }
  int64_t stride(int d) const { return stride_[d < 0 ? d + ndim : d]; }
  Sizes sizes() const { return Sizes(size_, size_ + ndim); }
  int64_t numel() const {
    int64_t n = 1;
    for (int d = 0; d < ndim; ++d) n *= size_[d];
    return n;
  }
  int element_size() const { return elem_size; }
  void* data_ptr() const { return data; }
  template <class T>
  T* ptr() const { return static_cast<T*>(data); }
  // at::Tensor::is_contiguous(): row-major strides on every dimension of size > 1 (empty: yes).
  bool is_contiguous() const {
    if (numel() == 0) return true;
    int64_t expected = 1;
    for (int d = ndim - 1; d >= 0; --d) {
      if (size_[d] == 1) continue;
      if (stride_[d] != expected) return false;
      expected *= size_[d];
    }
    return true;
  }
};

}  // namespace flash3::host
