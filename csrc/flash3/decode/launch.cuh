// Host side of the decode (KV-cache) kernel: the forward's launch (fwd/launch.cuh) with the decode
// family's producer (decode/load.cuh), checks, schedule and KernelParams fields.
#pragma once

#include <cstdint>
#include <type_traits>

#include "flash3/fwd/traits.cuh"  // first, as in fwd/launch.cuh
#include "flash3/decode/api.h"
#include "flash3/decode/load.cuh"
#include "flash3/fwd/launch.cuh"

namespace flash3 {

// The schedule: (packed query blocks, kv heads * splits, batch), no head grouping (one wave, mostly).
inline TileOrder make_decode_tile_order(const FwdParams& p, int block_m) {
  const int g = p.num_heads / p.num_heads_k;
  const int num_m_blocks = ceil_div(p.seqlen_q * g, block_m);
  const int heads = p.num_heads_k * p.num_splits;
  const bool causal_or_local = p.is_causal || p.window_left >= 0 || p.window_right >= 0 || p.attention_chunk > 0;
  return TileOrder{num_m_blocks, heads, p.batch, heads, causal_or_local};
}

template <class Tr>
struct DecodeFamily {
  static_assert(Tr::kDecode, "decode traits");
  using Producer = DecodeProducer<Tr>;
  using Consumer = FwdConsumer<Tr>;
  using Epilogue = FwdEpilogue<Tr>;

  static void check(const FwdParams& p) {
    using detail::fwd_check;
    // q batched (b, s_q, h, d) or packed (varlen: cu_seqlens_q, total_q rows; seqlen_q is then
    // max_seqlen_q, which sizes the tile grid); keys always from the cache with seqused_k.
    fwd_check(p.cu_seqlens_k == nullptr && p.seqused_k != nullptr,
              "the decode kernel takes a KV cache with seqused_k (no cu_seqlens_k)");
    fwd_check(p.slab_rows >= 1 && p.num_slabs >= 1 && (p.page_table != nullptr || p.num_slabs == p.batch),
              "decode: slab_rows and num_slabs must be >= 1 (num_slabs = batch without a page table)");
    fwd_check(p.num_splits >= 1 && p.num_splits <= 128 && (p.num_splits == 1 || (p.o_partial && p.lse_partial)),
              "decode: num_splits must be in [1, 128], with o_partial and lse_partial when > 1");
    // 2^30: packed-row and key indices plus a tile stay inside int32.
    fwd_check(int64_t(p.seqlen_q) * (p.num_heads / p.num_heads_k) <= (int64_t(1) << 30) &&
                  p.seqlen_k <= (1 << 30),
              "decode: seqlen_q * (num_heads / num_heads_k) and the cache capacity must be <= 2^30");
    fwd_check(!Tr::kFp8Cache || (p.k_cache_descale.ptr && p.v_cache_descale.ptr),
              "decode: an FP8 cache needs k and v descales");
    if constexpr (Tr::kFp8Cache) {  // 16-byte cp.async chunks (launch_fwd's TMA checks do the rest)
      auto aligned = [](const void* ptr, int64_t s0, int64_t s1, int64_t s2) {
        return reinterpret_cast<uintptr_t>(ptr) % 16 == 0 && s0 % 16 == 0 && s1 % 16 == 0 && s2 % 16 == 0;
      };
      fwd_check(aligned(p.k, p.k_batch_stride, p.k_row_stride, p.k_head_stride) &&
                    aligned(p.v, p.v_batch_stride, p.v_row_stride, p.v_head_stride),
                "decode: an FP8 cache must be 16-byte aligned with 16-byte multiple strides");
    }
  }

  static TileOrder order(const FwdParams& p) { return make_decode_tile_order(p, Tr::kBlockM); }

  // A paged 16-bit cache whose pages are a multiple of the TMA piece (16 rows) but not of a key
  // block: each block comes from its pages by TMA pieces (Tr::kTmaPieces). A block starts at a
  // multiple of block_n (no left padding), so every piece lies inside one page.
  static bool tma_pieces(const FwdParams& p) {
    if constexpr (Tr::kTmaPieces)
      return p.page_table != nullptr && p.slab_rows % Tr::kBlockN != 0 && p.slab_rows % Tr::kPieceRows == 0 &&
             p.cache_leftpad == nullptr;
    else return false;
  }

  static void set_params(typename Tr::KernelParams& kp, const FwdParams& p) {
    // TMA per key block where every block lies in one slab, or per piece (tma_pieces); else rows
    // are gathered. A paged cache with left padding: blocks start at any position, so they
    // straddle pages.
    kp.gather_kv = Tr::kFp8Cache ||
                   (p.page_table != nullptr && (p.slab_rows % Tr::kBlockN != 0 || p.cache_leftpad != nullptr) &&
                    !tma_pieces(p));
    if constexpr (Tr::kTmaPieces) kp.tma_pieces = tma_pieces(p);
    kp.slab_shift = -1;
    for (int s = 0; s < 31; ++s)
      if ((1 << s) == p.slab_rows) kp.slab_shift = s;
  }
};

// q against a contiguous or paged KV cache (FwdParams' KV-cache block). kFp8Cache: the caches hold
// e4m3 (FwdParams' k/v_cache_descale), q and out are 16-bit.
template <bool kIsBf16, int kHeadDim, int kHeadDimV, bool kFp8Cache>
void run_decode(const FwdParams& p, void* cuda_stream) {
  detail::fwd_check(p.is_bf16 == kIsBf16, "dtype does not match the compiled kernel");
  using Element = std::conditional_t<kIsBf16, cutlass::bfloat16_t, cutlass::half_t>;
  using Cache = std::conditional_t<kFp8Cache, cutlass::float_e4m3_t, Element>;
  using Tr = FwdTraits<Element, kHeadDim, kHeadDimV, true, Cache>;
  if constexpr (!decode_takes_chunk(kHeadDim, kHeadDimV)) {  // a chunk runs on its own tile here
    using Chunk = FwdTraits<Element, kHeadDim, kHeadDimV, true, Cache, true>;
    if (p.attention_chunk > 0) return launch_fwd<Chunk, DecodeFamily<Chunk>>(p, cuda_stream);
  }
  launch_fwd<Tr, DecodeFamily<Tr>>(p, cuda_stream);
}

}  // namespace flash3
