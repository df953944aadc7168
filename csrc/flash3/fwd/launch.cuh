// Host side of the forward kernel: checks the call, builds the TMA descriptors from FwdParams'
// strides, picks the persistent grid and launches on the caller's stream. No torch here; errors
// are thrown as std::runtime_error (the binding turns them into Python exceptions).
// Limits: batch * heads * ceil(seqlen_q / block_m) must stay below 2^31 (tile indices are int).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include <cuda_runtime.h>

#include "flash3/fwd/traits.cuh"  // first: it enables CuTe's extended WGMMA shapes
#include "flash3/common/attn_logic.h"
#include "flash3/common/tma_check.h"
#include "flash3/fwd/api.h"
#include "flash3/fwd/kernel.cuh"
#include "flash3/fwd/params.h"
#include "flash3/fwd/scheduler.cuh"

namespace flash3 {

namespace detail {

inline void fwd_check(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error("flash3 forward: " + what);
}

inline void fwd_check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("flash3 forward: ") + what + ": " + cudaGetErrorString(e));
}

// Throws unless the driver will encode this (d, rows, heads, batch) tensor map (tma_check.h).
inline void check_tma(const char* what, const void* base, int elem_bytes, int64_t d, int64_t rows, int64_t heads,
                      int64_t batch, int64_t row_stride, int64_t head_stride, int64_t batch_stride, int box_d,
                      int box_rows) {
  const std::string problem = tma_rows_problem(what, base, elem_bytes, d, rows, heads, batch, row_stride,
                                                head_stride, batch_stride, box_d, box_rows);
  fwd_check(problem.empty(), "cannot build a TMA descriptor for " + problem);
}

// 2-CTA clusters for kernels with K/V multicast (FwdTraits::kMulticastKV), unless the environment
// says FLASH3_FWD_CLUSTER=1 (read at every launch, so one process can time both:
// tools/device/head_to_head.py).
inline bool fwd_clusters_enabled() {
  const char* e = std::getenv("FLASH3_FWD_CLUSTER");
  return !(e != nullptr && e[0] == '1' && e[1] == '\0');
}

// A launch configuration in clusters of 2 CTAs along x (the attribute lives beside the config that
// points at it, so neither is copied).
struct PairLaunch {
  cudaLaunchAttribute attr[1] = {};
  cudaLaunchConfig_t cfg = {};
  PairLaunch(int grid, int threads, int smem_bytes, cudaStream_t stream) {
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = 2;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.gridDim = dim3(unsigned(grid));
    cfg.blockDim = dim3(unsigned(threads));
    cfg.dynamicSmemBytes = size_t(smem_bytes);
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
  }
  PairLaunch(const PairLaunch&) = delete;
  PairLaunch& operator=(const PairLaunch&) = delete;
};

// How many 2-CTA clusters of `kernel` fit on the device at once, asked once per kernel and device;
// 0 where the runtime cannot say (the call then runs on single CTAs; the error is cleared, so the
// launch check after it does not see it).
template <class Kernel>
int max_active_pairs(Kernel kernel, int threads, int smem_bytes) {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cached[kMaxDevices] = {};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  if (device < 0 || device >= kMaxDevices) return 0;
  int n = cached[device].load(std::memory_order_relaxed);
  if (n > 0) return n;
  const PairLaunch one_pair(2, threads, smem_bytes, nullptr);
  if (cudaOccupancyMaxActiveClusters(&n, reinterpret_cast<const void*>(kernel), &one_pair.cfg) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  if (n > 0) cached[device].store(n, std::memory_order_relaxed);
  return n;
}

}  // namespace detail

// A kernel family's part of launch_fwd: its producer, consumer and epilogue, its own checks of the call, its schedule and
// its fields of KernelParams. The plain and FP8 forward's here; the decode kernel's in decode/launch.cuh.
template <class Tr>
struct FwdFamily {
  using Producer = FwdProducer<Tr>;
  using Consumer = FwdConsumer<Tr>;
  using Epilogue = FwdEpilogue<Tr>;
  static void check(const FwdParams& p) { detail::fwd_check(p.slab_rows == 0, "a KV-cache call needs the decode kernel"); }
  static TileOrder order(const FwdParams& p) { return make_tile_order(p, Tr::kBlockM); }
  static void set_params(typename Tr::KernelParams&, const FwdParams&) {}
};

// What one TMA store of O covers (FwdTraits: a warp's 16-row slab where O has its own buffer);
// traits without SmemLayoutOBox (MLA) store the whole tile.
template <class Tr, class = void>
struct OStoreBox {
  using Layout = typename Tr::SmemLayoutO;
  using Rows = typename Tr::BlkM;
};
template <class Tr>
struct OStoreBox<Tr, std::void_t<typename Tr::SmemLayoutOBox>> {
  using Layout = typename Tr::SmemLayoutOBox;
  using Rows = typename Tr::BlkMO;
};

template <class Tr, class Family = FwdFamily<Tr>>
void launch_fwd(const FwdParams& p, void* cuda_stream) {
  using namespace cute;
  using Element = typename Tr::Element;
  using ElementOut = typename Tr::ElementOut;
  constexpr int kHeadDim = Tr::kHeadDim, kHeadDimV = Tr::kHeadDimV;
  using detail::fwd_check;

  fwd_check(p.qv == nullptr || Tr::kQv, "qv: only the MLA decode kernel (d_v > 256) takes it");
  fwd_check(p.alibi_slopes == nullptr || Tr::kAlibi,
            "ALiBi slopes on a kernel compiled without them (head dims above 128, or FP8)");
  // Head dims below the compiled ones run here too: TMA zero-fills Q/K/V's missing columns (the
  // tensor maps have the real extents) and never stores O's.
  fwd_check(p.head_dim > 0 && p.head_dim <= kHeadDim && p.head_dim % 8 == 0 && p.head_dim_v > 0 &&
                p.head_dim_v <= kHeadDimV && p.head_dim_v % 8 == 0,
            "head dims must be multiples of 8 no larger than the compiled kernel's");
  fwd_check(p.softmax_scale > 0.f, "softmax_scale must be > 0 (the online softmax takes row maxes of raw scores)");
  fwd_check(fwd_uses_dynamic_scheduler(p) == (p.tile_counter != nullptr),
            "tile_counter must be a zeroed int32 exactly when fwd_uses_dynamic_scheduler()");
  fwd_check(p.q && p.k && p.v && p.o, "null q/k/v/o pointer");
  fwd_check(p.batch >= 1 && p.num_heads >= 1 && p.num_heads_k >= 1 && p.num_heads % p.num_heads_k == 0,
            "num_heads must be a positive multiple of num_heads_k");
  fwd_check(p.seqlen_q >= 1 && p.seqlen_k >= 0, "seqlen_q must be >= 1");
  const bool varlen_q = p.cu_seqlens_q != nullptr, varlen_k = p.cu_seqlens_k != nullptr;
  Family::check(p);
  fwd_check(!varlen_q || p.total_q >= 1, "varlen: total_q must be >= 1");
  fwd_check(!varlen_k || p.total_k >= 1, "varlen: total_k must be >= 1");
  const int rows_q = varlen_q ? p.total_q : p.seqlen_q;
  // Decode: K/V are (slab_rows, d, h_k, num_slabs) (contiguous cache: slab = batch row).
  const int rows_k = Tr::kDecode ? p.slab_rows : varlen_k ? p.total_k : (p.seqlen_k > 0 ? p.seqlen_k : 1);
  const int batch_q = varlen_q ? 1 : p.batch, batch_k = Tr::kDecode ? p.num_slabs : varlen_k ? 1 : p.batch;
  // A packed tensor is one "batch" of total rows; its batch stride is never used, but TMA wants a
  // valid (non-zero, 16-byte multiple) one. Real batch strides are passed as they are: a zero one
  // (a broadcast batch) is rejected by the tensor-map checks below, never replaced.
  auto bstride = [](bool varlen, int64_t batch_stride, int64_t row_stride, int rows) {
    return varlen ? row_stride * rows : batch_stride;
  };

  // A kernel compiled without the chunked mask (FwdTraits::kChunk) would ignore the chunk.
  fwd_check(Tr::kChunk || p.attention_chunk == 0, "attention_chunk: this kernel takes none");
  // seqused_q: the forward (16-bit or FP8) over packed queries only; rows past it get LSE -inf, not
  // a sink.
  fwd_check(p.seqused_q == nullptr || (varlen_q && !Tr::kDecode && p.sinks == nullptr),
            "seqused_q needs packed queries (cu_seqlens_q) and the forward kernel, without sinks");
  if constexpr (Tr::kFp8) {
    // seqused_k over packed keys only: the packed vt holds zeros past it (fp8.pack_v_fp8_varlen),
    // which the mainloop's last key block reads (times P = 0).
    fwd_check(varlen_q == varlen_k && (p.seqused_k == nullptr || varlen_k),
              "the FP8 kernel takes q and k both packed (varlen) or both batched, and seqused_k with packed keys only");
    fwd_check(p.fp8.q.ptr && p.fp8.k.ptr && p.fp8.v.ptr, "FP8: q, k and v descales are required");
    fwd_check(!Tr::kFastAccum || p.fp8.v.count == 1, "FP8 fast accumulation: one v descale per (batch, kv head)");
  }
  const int eb = int(sizeof(Element)), eb_out = int(sizeof(ElementOut));
  // d_v past TMA's 256-element box (MLA's 512): CuTe issues one box per 128-byte swizzle atom
  // (64 16-bit columns), the tile's d_v / 64 slices (mla_traits.cuh's Vt and O layouts).
  constexpr int kBoxV = kHeadDimV <= 256 ? kHeadDimV : 64;
  const int64_t bs_q = bstride(varlen_q, p.q_batch_stride, p.q_row_stride, rows_q);
  const int64_t bs_k = bstride(varlen_k, p.k_batch_stride, p.k_row_stride, rows_k);
  // FP8 Vt is (b, h_k, d_v, tokens): its packed (varlen) form is one batch of all heads.
  const int64_t bs_v = Tr::kFp8 && varlen_k ? p.v_head_stride * p.num_heads_k
                                            : bstride(varlen_k, p.v_batch_stride, p.v_row_stride, rows_k);
  const int64_t bs_o = bstride(varlen_q, p.o_batch_stride, p.o_row_stride, rows_q);
  detail::check_tma("q", p.q, eb, p.head_dim, rows_q, p.num_heads, batch_q, p.q_row_stride, p.q_head_stride, bs_q,
                    kHeadDim, Tr::kBlockM);
  // An FP8 cache is gathered with 16-byte cp.async (the binding checks its alignment): no tensor
  // maps for K and V, whose slots in KernelParams stay default (never read).
  constexpr bool kKvMaps = !Tr::kFp8Cache;
  if (kKvMaps)
    detail::check_tma("k", p.k, eb, p.head_dim, rows_k, p.num_heads_k, batch_k, p.k_row_stride, p.k_head_stride,
                      bs_k, kHeadDim, Tr::kBlockN);
  // FP8 Vt: tokens contiguous (v_row_stride steps over d_v) and permuted within every 16, so the
  // tensor map spans the whole last group of 16 (the binding checks the allocation holds it; the
  // padding is finite): cut at seqlen_k, TMA would zero real tokens stored past it. Varlen: every
  // sequence starts at a multiple of 16 (fp8_varlen_vt_offset), the map spans all of them.
  const int rows_vt = !Tr::kFp8 ? rows_k
                      : varlen_k ? int(fp8_varlen_vt_offset(p.total_k, p.batch))
                                 : (rows_k + 15) / 16 * 16;
  if constexpr (Tr::kFp8)
    detail::check_tma("v", p.v, eb, rows_vt, p.head_dim_v, p.num_heads_k, batch_k, p.v_row_stride, p.v_head_stride,
                      bs_v, Tr::kBlockN, kHeadDimV);
  else if (kKvMaps)
    detail::check_tma("v", p.v, eb, p.head_dim_v, rows_k, p.num_heads_k, batch_k, p.v_row_stride, p.v_head_stride,
                      bs_v, kBoxV, Tr::kBlockN);
  detail::check_tma("out", p.o, eb_out, p.head_dim_v, rows_q, p.num_heads, batch_q, p.o_row_stride, p.o_head_stride,
                    bs_o, kBoxV, OStoreBox<Tr>::Rows::value);

  Tensor mQ = make_tensor(make_gmem_ptr(static_cast<Element const*>(p.q)),
                          make_shape(rows_q, p.head_dim, p.num_heads, batch_q),
                          make_stride(p.q_row_stride, _1{}, p.q_head_stride, bs_q));
  Tensor mK = make_tensor(make_gmem_ptr(static_cast<Element const*>(p.k)),
                          make_shape(rows_k, p.head_dim, p.num_heads_k, batch_k),
                          make_stride(p.k_row_stride, _1{}, p.k_head_stride, bs_k));
  auto vt_stride = [&] {
    if constexpr (Tr::kFp8) return make_stride(p.v_row_stride, _1{}, p.v_head_stride, bs_v);
    else return make_stride(_1{}, p.v_row_stride, p.v_head_stride, bs_v);
  };
  Tensor mVt = make_tensor(make_gmem_ptr(static_cast<Element const*>(p.v)),
                           make_shape(p.head_dim_v, rows_vt, p.num_heads_k, batch_k), vt_stride());
  Tensor mO = make_tensor(make_gmem_ptr(static_cast<ElementOut*>(p.o)),
                          make_shape(rows_q, p.head_dim_v, p.num_heads, batch_q),
                          make_stride(p.o_row_stride, _1{}, p.o_head_stride, bs_o));

  auto tma_k = [&] {
    if constexpr (kKvMaps)
      return make_tma_copy(SM90_TMA_LOAD{}, mK, take<0, 2>(typename Tr::SmemLayoutK{}),
                           Shape<typename Tr::BlkN, typename Tr::HD>{}, _1{});
    else return typename Tr::TmaK{};
  };
  auto tma_v = [&] {
    if constexpr (kKvMaps)
      return make_tma_copy(SM90_TMA_LOAD{}, mVt, take<0, 2>(typename Tr::SmemLayoutVt{}),
                           Shape<typename Tr::HDV, typename Tr::BlkN>{}, _1{});
    else return typename Tr::TmaV{};
  };
  typename Tr::KernelParams kp{
      make_tma_copy(SM90_TMA_LOAD{}, mQ, typename Tr::SmemLayoutQ{}, Shape<typename Tr::BlkM, typename Tr::HD>{}, _1{}),
      tma_k(),
      tma_v(),
      make_tma_copy(SM90_TMA_STORE{}, mO, typename OStoreBox<Tr>::Layout{}, Shape<typename OStoreBox<Tr>::Rows, typename Tr::HDV>{},
                    _1{}),
      mQ.shape(),
      mK.shape(),
      mVt.shape(),
      mO.shape(),
      p,
      Family::order(p),
      ScoreMod::make(p.softmax_scale, p.softcap, p.alibi_slopes, p.alibi_batch_stride,
                     p.num_heads_k > 0 ? p.num_heads / p.num_heads_k : 1)};
  Family::set_params(kp, p);
  if constexpr (Tr::kTmaPieces) {  // decode: the paged cache's K/V by 16-row pieces (decode/launch.cuh)
    if (kp.tma_pieces) {
      detail::check_tma("k", p.k, eb, p.head_dim, rows_k, p.num_heads_k, batch_k, p.k_row_stride, p.k_head_stride,
                        bs_k, kHeadDim, Tr::kPieceRows);
      detail::check_tma("v", p.v, eb, p.head_dim_v, rows_k, p.num_heads_k, batch_k, p.v_row_stride, p.v_head_stride,
                        bs_v, kBoxV, Tr::kPieceRows);
      kp.tma_k_piece = make_tma_copy(SM90_TMA_LOAD{}, mK, typename Tr::SmemLayoutKPiece{},
                                     Shape<typename Tr::PieceRows, typename Tr::HD>{}, _1{});
      kp.tma_v_piece = make_tma_copy(SM90_TMA_LOAD{}, mVt, typename Tr::SmemLayoutVtPiece{},
                                     Shape<typename Tr::HDV, typename Tr::PieceRows>{}, _1{});
    }
  }

  const int64_t num_tiles = int64_t(kp.order.num_m_blocks) * kp.order.num_heads * kp.order.batch;
  fwd_check(num_tiles < (int64_t(1) << 31), "batch * heads * query blocks must be < 2^31");
  if (num_tiles == 0) return;
  int grid = int(num_tiles < p.num_sms ? num_tiles : (p.num_sms > 0 ? p.num_sms : 1));

  auto kernel = &fwd_kernel<Tr, typename Family::Producer, typename Family::Consumer, typename Family::Epilogue>;
  detail::fwd_check_cuda(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes),
      "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
  // 2-CTA clusters with K/V multicast (FwdTraits::kMulticastKV): where the two query blocks of a
  // pair see the same key blocks (full attention, batched keys: the static schedule) and the query
  // blocks pair up (an even count, as FA3's ClusterM 2). The grid is even and no larger than the
  // clusters that fit at once (a persistent CTA that waited for a slot would run its whole share
  // after the others).
  if constexpr (Tr::kMulticastKV) {
    if (detail::fwd_clusters_enabled() && !fwd_uses_dynamic_scheduler(p) && !varlen_k && p.seqused_k == nullptr &&
        kp.order.num_m_blocks % 2 == 0 && !kp.order.heaviest_first) {
      auto kernel2 = &fwd_kernel<Tr, typename Family::Producer, typename Family::Consumer, typename Family::Epilogue, 2>;
      detail::fwd_check_cuda(
          cudaFuncSetAttribute(kernel2, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes),
          "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
      const int pairs = std::min(grid / 2, detail::max_active_pairs(kernel2, Tr::kNumThreads, Tr::kSmemBytes));
      if (pairs >= 1) {
        kp.tma_k_mc = make_tma_copy(SM90_TMA_LOAD_MULTICAST{}, mK, take<0, 2>(typename Tr::SmemLayoutK{}),
                                    Shape<typename Tr::BlkN, typename Tr::HD>{}, _2{});
        kp.tma_v_mc = make_tma_copy(SM90_TMA_LOAD_MULTICAST{}, mVt, take<0, 2>(typename Tr::SmemLayoutVt{}),
                                    Shape<typename Tr::HDV, typename Tr::BlkN>{}, _2{});
        grid = 2 * pairs;
        const detail::PairLaunch pairs_launch(grid, Tr::kNumThreads, Tr::kSmemBytes,
                                              static_cast<cudaStream_t>(cuda_stream));
        detail::fwd_check_cuda(cudaLaunchKernelEx(&pairs_launch.cfg, kernel2, kp), "kernel launch (2-CTA clusters)");
        return;
      }
    }
  }
  kernel<<<grid, Tr::kNumThreads, Tr::kSmemBytes, static_cast<cudaStream_t>(cuda_stream)>>>(kp);
  detail::fwd_check_cuda(cudaGetLastError(), "kernel launch");
}

template <bool kIsBf16, int kHeadDim, int kHeadDimV>
void run_fwd(const FwdParams& p, void* cuda_stream) {
  detail::fwd_check(p.is_bf16 == kIsBf16, "dtype does not match the compiled kernel");
  using Element = std::conditional_t<kIsBf16, cutlass::bfloat16_t, cutlass::half_t>;
  if constexpr (!fwd_tile_takes_chunk(kHeadDim, kHeadDimV)) {  // a chunk runs on its own tile here
    if (p.attention_chunk > 0)
      return launch_fwd<FwdTraits<Element, kHeadDim, kHeadDimV, false, Element, true>>(p, cuda_stream);
  }
  launch_fwd<FwdTraits<Element, kHeadDim, kHeadDimV>>(p, cuda_stream);
}

// The FP8 kernel: e4m3 q, k and Vt (FwdParams' comments), per-block descales, bf16 output.
template <int kHeadDim, int kHeadDimV>
void run_fwd_fp8(const FwdParams& p, void* cuda_stream) {
  using E4m3 = cutlass::float_e4m3_t;
  if (p.fp8.fast_accum)  // no chunk here: launch_fwd refuses one (kChunk false)
    return launch_fwd<FwdTraits<E4m3, kHeadDim, kHeadDimV, false, E4m3, false, true>>(p, cuda_stream);
  if constexpr (!fwd_fp8_tile_takes_chunk(kHeadDim, kHeadDimV)) {  // a chunk runs on its own tile here
    if (p.attention_chunk > 0)
      return launch_fwd<FwdTraits<E4m3, kHeadDim, kHeadDimV, false, E4m3, true>>(p, cuda_stream);
  }
  launch_fwd<FwdTraits<E4m3, kHeadDim, kHeadDimV>>(p, cuda_stream);
}

}  // namespace flash3
