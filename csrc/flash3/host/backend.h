// What an op of the host layer asks of its caller besides the arguments: the stream, scratch
// memory, and the few tensor operations outside the kernels (filling outputs no kernel writes,
// repeating descales, overlap checks). The torch bindings implement it with ATen (torch_adapter.h),
// the simulator driver with cudaMalloc/cudaMemcpy (tools/hopper_sim/flash3/sim_case.h).
#pragma once
#include <cstdint>
#include <string>

#include "flash3/host/tensor_view.h"

namespace flash3::host {

enum class Init { none, zero, neg_inf };  // at::empty, at::zeros, at::full(-inf)

struct Backend {
  virtual ~Backend() = default;
  // The stream every launch goes to (cudaStream_t).
  virtual void* stream() = 0;
  // `count` elements of `dtype` (f32 or i32) on the call's device, valid until the op returns
  // (stream-ordered: what a launch enqueued may still read it afterwards).
  virtual void* alloc(int64_t count, DType dtype, Init init) = 0;
  // t.zero_() when value is 0, else t.fill_(value) (float32 t).
  virtual void fill(const TensorView& t, float value) = 0;
  // lse of rows that see no key: -inf, or with sinks each row's sink (`head_dim`: lse's head
  // dimension; every other dimension broadcasts).
  virtual void fill_empty_lse(const TensorView& lse, const TensorView* sinks, int head_dim) = 0;
  // lse (h, total_q): -inf in the packed rows from cu_seqlens_q[batch] on (rows of no sequence),
  // compared on the device (no host read).
  virtual void neg_inf_rows_past_end(const TensorView& lse, const TensorView& cu_seqlens_q, int64_t batch) = 0;
  // t (b, h, n) repeated `repeat` times along its last dimension, then its first `count` entries
  // (t.repeat_interleave(repeat, 2).narrow(2, 0, count)); valid until the op returns.
  virtual TensorView repeat_last(const TensorView& t, int64_t repeat, int64_t count) = 0;
  // at::assert_no_overlap / at::assert_no_internal_overlap on the caller's tensors.
  virtual void assert_no_overlap(const TensorView& a, const TensorView& b) = 0;
  virtual void assert_no_internal_overlap(const TensorView& t) = 0;
  // Where "no kernel for ..." messages send the reader: "flash3._C; see torch.ops.flash3.kernel_info()".
  virtual const char* build_name() const = 0;
  // A line about each launch (kernel picked, parameters), built only when tracing() is true.
  virtual bool tracing() const { return false; }
  virtual void trace(const std::string&) {}
};

}  // namespace flash3::host
