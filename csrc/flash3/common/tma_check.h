// What cuTensorMapEncodeTiled demands of a tiled tensor map, checked on the host before encoding.
// CuTe reports a failed encode with assert(), which -DNDEBUG compiles out: the kernel would then
// run with a garbage descriptor. Plain C++17 (no CUDA, no torch): unit-tested with g++.
#pragma once

#include <cstdint>
#include <string>

namespace flash3 {

// "" when the driver accepts a tiled map of `rank` dims (innermost first) with element strides
// `strides_elems` and box `box`, else what is wrong, naming `what`. Every outer stride must be
// positive, size-1 dims included (the binding gives those a harmless one): a zero stride is a
// broadcast tensor, which TMA would read past its one-copy allocation.
inline std::string tma_tensor_problem(const char* what, const void* base, int elem_bytes, int rank,
                                      const int64_t* dims, const int64_t* strides_elems,
                                      const int* box) {
  auto bad = [what](const std::string& why) { return std::string(what) + ": " + why; };
  if (rank < 1 || rank > 5) return bad("rank " + std::to_string(rank) + " is outside 1..5");
  if (elem_bytes != 1 && elem_bytes != 2 && elem_bytes != 4 && elem_bytes != 8)
    return bad("element size " + std::to_string(elem_bytes) + " bytes is not 1, 2, 4 or 8");
  if (reinterpret_cast<uintptr_t>(base) % 16 != 0) return bad("base address is not 16-byte aligned");
  if (strides_elems[0] != 1) return bad("the innermost dimension is not contiguous");
  for (int i = 0; i < rank; ++i) {
    const std::string dim = "dim " + std::to_string(i);
    if (dims[i] < 1 || dims[i] > (int64_t(1) << 32))
      return bad(dim + " has size " + std::to_string(dims[i]) + ", outside [1, 2^32]");
    if (box[i] < 1 || box[i] > 256)
      return bad(dim + " has box " + std::to_string(box[i]) + ", outside [1, 256]");
    if (i == 0) continue;
    if (strides_elems[i] <= 0)
      return bad(dim + " has stride " + std::to_string(strides_elems[i]) +
                 (strides_elems[i] == 0 ? " (a broadcast dimension: pass a contiguous copy)" : ""));
    // Checked in elements first so that the byte count below cannot overflow.
    if (strides_elems[i] >= (int64_t(1) << 40)) return bad(dim + " stride is 2^40 bytes or more");
    const int64_t bytes = strides_elems[i] * elem_bytes;
    if (bytes % 16 != 0) return bad(dim + " stride is " + std::to_string(bytes) + " bytes, not a multiple of 16");
    if (bytes >= (int64_t(1) << 40)) return bad(dim + " stride is 2^40 bytes or more");
  }
  if ((int64_t(box[0]) * elem_bytes) % 16 != 0) return bad("the innermost box is not a multiple of 16 bytes");
  return "";
}

// The (d, rows, heads, batch) tensors of the attention kernels (d contiguous), loaded in boxes of
// (box_d, box_rows): "" or what is wrong.
inline std::string tma_rows_problem(const char* what, const void* base, int elem_bytes, int64_t d, int64_t rows,
                                    int64_t heads, int64_t batch, int64_t row_stride, int64_t head_stride,
                                    int64_t batch_stride, int box_d, int box_rows) {
  const int64_t dims[4] = {d, rows, heads, batch};
  const int64_t strides[4] = {1, row_stride, head_stride, batch_stride};
  const int box[4] = {box_d, box_rows, 1, 1};
  return tma_tensor_problem(what, base, elem_bytes, 4, dims, strides, box);
}

}  // namespace flash3
