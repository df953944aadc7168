// Host side of the backward: checks the call, builds the TMA descriptors and launches preprocess,
// (with sinks) the sink-gradient kernel, main kernel and postprocess on the caller's stream (no
// synchronization). Errors are thrown as std::runtime_error (the binding turns them into Python
// exceptions).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include <cuda_runtime.h>

#include "flash3/bwd/traits.cuh"  // first: it enables CuTe's extended WGMMA shapes
#include "flash3/bwd/api.h"
#include "flash3/bwd/kernel.cuh"
#include "flash3/bwd/params.h"
#include "flash3/bwd/prepost.cuh"
#include "flash3/common/attn_logic.h"
#include "flash3/common/tma_check.h"

namespace flash3 {

namespace detail {

inline void bwd_check(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error("flash3 backward: " + what);
}

inline void bwd_check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("flash3 backward: ") + what + ": " + cudaGetErrorString(e));
}

}  // namespace detail

template <class Tr>
void launch_bwd(const BwdParams& p, void* cuda_stream) {
  using namespace cute;
  using Element = typename Tr::Element;
  using detail::bwd_check;
  constexpr int kHeadDim = Tr::kHeadDim, kHeadDimV = Tr::kHeadDimV;
  bwd_check(p.head_dim > 0 && p.head_dim <= kHeadDim && p.head_dim % 8 == 0 && p.head_dim_v > 0 &&
                p.head_dim_v <= kHeadDimV && p.head_dim_v % 8 == 0,
            "head dims must be multiples of 8 no larger than the compiled kernel's");
  bwd_check(p.softmax_scale > 0.f, "softmax_scale must be > 0");
  const bool varlen_q = p.cu_seqlens_q != nullptr, varlen_k = p.cu_seqlens_k != nullptr;
  bwd_check(varlen_q == varlen_k, "q and k must both be packed (varlen) or both batched");
  // No key anywhere, with sinks (the binding has zeroed dq/dk/dv): P = 0 and only the sink has a
  // gradient; k/v may be empty (no TMA descriptor for them): preprocess and sink gradient only.
  const bool sinks_only = p.sinks != nullptr && (varlen_k ? p.total_k : p.seqlen_k) == 0;
  bwd_check(p.q && (sinks_only || (p.k && p.v && p.dk && p.dv)) && p.o && p.dout && p.lse && p.dq,
            "null tensor pointer");
  bwd_check((p.sinks == nullptr) == (p.dsinks == nullptr), "sinks and dsinks go together");
  bwd_check(p.seqused_q == nullptr || (varlen_q && p.sinks == nullptr), "seqused_q needs varlen q, without sinks");
  bwd_check(p.lse_log2 && p.dpsum && p.dq_accum && (!p.deterministic || p.dq_semaphore), "workspace not allocated");
  bwd_check(p.batch >= 1 && p.batch <= 65535 && p.num_heads_k >= 1 && p.num_heads_k <= 65535 &&
                p.num_heads % p.num_heads_k == 0 && p.num_heads <= 65535,
            "batch and heads must be in [1, 65535], num_heads a multiple of num_heads_k");
  bwd_check(p.seqlen_q >= 1 && p.seqlen_k >= 0, "seqlen_q must be >= 1");
  cudaStream_t stream = static_cast<cudaStream_t>(cuda_stream);
  const dim3 rows_grid(ceil_div(p.seqlen_q, kBwdBlockM), p.num_heads, p.batch);
  if (sinks_only) {
    bwd_preprocess_kernel<Tr><<<rows_grid, kBwdPrePostThreads, 0, stream>>>(p);
    detail::bwd_check_cuda(cudaGetLastError(), "preprocess launch");
    bwd_sink_grad_kernel<<<p.num_heads, kBwdPrePostThreads, 0, stream>>>(p);
    detail::bwd_check_cuda(cudaGetLastError(), "sink grad launch");
    return;
  }
  const int rows_q = varlen_q ? p.total_q : p.seqlen_q;
  const int rows_k = varlen_k ? p.total_k : (p.seqlen_k > 0 ? p.seqlen_k : 1);
  const int batch_q = varlen_q ? 1 : p.batch, batch_k = varlen_k ? 1 : p.batch;
  auto bstride = [](bool varlen, int64_t batch_stride, int64_t row_stride, int rows) {
    return varlen ? row_stride * rows : batch_stride;
  };
  const int eb = int(sizeof(Element));
  const int64_t bs_q = bstride(varlen_q, p.q_batch_stride, p.q_row_stride, rows_q);
  const int64_t bs_do = bstride(varlen_q, p.do_batch_stride, p.do_row_stride, rows_q);
  const int64_t bs_k = bstride(varlen_k, p.k_batch_stride, p.k_row_stride, rows_k);
  const int64_t bs_v = bstride(varlen_k, p.v_batch_stride, p.v_row_stride, rows_k);
  auto check_tma = [&](const char* what, const void* base, int64_t d, int64_t rows, int64_t heads, int64_t batch,
                       int64_t rs, int64_t hs, int64_t bs, int box_d, int box_rows) {
    const std::string problem = tma_rows_problem(what, base, eb, d, rows, heads, batch, rs, hs, bs, box_d, box_rows);
    bwd_check(problem.empty(), "cannot build a TMA descriptor for " + problem);
  };
  check_tma("q", p.q, p.head_dim, rows_q, p.num_heads, batch_q, p.q_row_stride, p.q_head_stride, bs_q, kHeadDim,
            Tr::kBlockM);
  check_tma("dout", p.dout, p.head_dim_v, rows_q, p.num_heads, batch_q, p.do_row_stride, p.do_head_stride, bs_do,
            kHeadDimV, Tr::kBlockM);
  check_tma("k", p.k, p.head_dim, rows_k, p.num_heads_k, batch_k, p.k_row_stride, p.k_head_stride, bs_k, kHeadDim,
            Tr::kBlockN);
  check_tma("v", p.v, p.head_dim_v, rows_k, p.num_heads_k, batch_k, p.v_row_stride, p.v_head_stride, bs_v,
            kHeadDimV, Tr::kBlockN);

  auto rows_tensor = [](const void* ptr, int rows, int d, int heads, int batch, int64_t rs, int64_t hs, int64_t bs) {
    return make_tensor(make_gmem_ptr(static_cast<Element const*>(ptr)), make_shape(rows, d, heads, batch),
                       make_stride(rs, _1{}, hs, bs));
  };
  Tensor mQ = rows_tensor(p.q, rows_q, p.head_dim, p.num_heads, batch_q, p.q_row_stride, p.q_head_stride, bs_q);
  Tensor mDo = rows_tensor(p.dout, rows_q, p.head_dim_v, p.num_heads, batch_q, p.do_row_stride, p.do_head_stride, bs_do);
  Tensor mK = rows_tensor(p.k, rows_k, p.head_dim, p.num_heads_k, batch_k, p.k_row_stride, p.k_head_stride, bs_k);
  Tensor mV = rows_tensor(p.v, rows_k, p.head_dim_v, p.num_heads_k, batch_k, p.v_row_stride, p.v_head_stride, bs_v);

  typename Tr::KernelParams kp{
      make_tma_copy(SM90_TMA_LOAD{}, mQ, take<0, 2>(typename Tr::SmemLayoutQ{}),
                    Shape<typename Tr::BlkM, typename Tr::HD>{}, _1{}),
      make_tma_copy(SM90_TMA_LOAD{}, mDo, take<0, 2>(typename Tr::SmemLayoutDo{}),
                    Shape<typename Tr::BlkM, typename Tr::HDV>{}, _1{}),
      make_tma_copy(SM90_TMA_LOAD{}, mK, typename Tr::SmemLayoutK{}, Shape<typename Tr::BlkN, typename Tr::HD>{}, _1{}),
      make_tma_copy(SM90_TMA_LOAD{}, mV, typename Tr::SmemLayoutV{}, Shape<typename Tr::BlkN, typename Tr::HDV>{},
                    _1{}),
      mQ.shape(),
      mDo.shape(),
      mK.shape(),
      mV.shape(),
      p,
      ScoreMod::make(p.softmax_scale, p.softcap, p.alibi_slopes, p.alibi_batch_stride)};

  bwd_preprocess_kernel<Tr><<<rows_grid, kBwdPrePostThreads, 0, stream>>>(p);
  detail::bwd_check_cuda(cudaGetLastError(), "preprocess launch");
  if (p.sinks != nullptr) {  // reads the preprocess's dpsum; independent of the main kernel
    bwd_sink_grad_kernel<<<p.num_heads, kBwdPrePostThreads, 0, stream>>>(p);
    detail::bwd_check_cuda(cudaGetLastError(), "sink grad launch");
  }
  const int n_blocks = ceil_div(p.seqlen_k, Tr::kBlockN);
  if (n_blocks > 0) {
    auto kernel = &bwd_kernel<Tr>;
    detail::bwd_check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes),
                           "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
    kernel<<<dim3(n_blocks, p.num_heads_k, p.batch), Tr::kNumThreads, Tr::kSmemBytes, stream>>>(kp);
    detail::bwd_check_cuda(cudaGetLastError(), "kernel launch");
  }
  bwd_postprocess_kernel<Tr><<<rows_grid, kBwdPrePostThreads, 0, stream>>>(p);
  detail::bwd_check_cuda(cudaGetLastError(), "postprocess launch");
}

template <bool kIsBf16, int kHeadDim, int kHeadDimV>
void run_bwd(const BwdParams& p, void* cuda_stream) {
  detail::bwd_check(p.is_bf16 == kIsBf16, "dtype does not match the compiled kernel");
  using Element = std::conditional_t<kIsBf16, cutlass::bfloat16_t, cutlass::half_t>;
  launch_bwd<BwdTraits<Element, kHeadDim, kHeadDimV>>(p, cuda_stream);
}

}  // namespace flash3
