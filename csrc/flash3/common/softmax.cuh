// Register-level pieces of the consumer: viewing WGMMA accumulators as (row, col), the mask,
// the score mod (softcap, ALiBi: common/score_mod.h), and the online softmax in the exp2 domain.
//
// A 64 x N WGMMA accumulator gives each thread the values ((2 cols, 2 rows, N/8 col groups),
// MMA_M, MMA_N): the thread owns rows r and r + 8 of its warp's 16 rows, and the four threads of a
// quad (lanes 4k..4k+3) share those rows, so row reductions are two xor-shuffles.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/numeric_conversion.h>

#include "flash3/common/attn_logic.h"
#include "flash3/common/score_mod.h"

namespace flash3 {

// ((2,2,V),M,N) -> ((2,M),(2,V,N)): rows first, columns second.
template <class L>
CUTE_HOST_DEVICE constexpr auto acc_rowcol(L l) {
  using namespace cute;
  static_assert(rank_v<decltype(get<0>(l))> == 3, "expects a 64xN WGMMA accumulator");
  return make_layout(make_layout(get<0, 1>(l), get<1>(l)),
                     make_layout(get<0, 0>(l), get<0, 2>(l), get<2>(l)));
}

// The S accumulator ((2,2,N/8),M,1) re-read as the A operand of the RS WGMMA P.V:
// ((2,2,2),M,N/16): each k16 block takes two consecutive n8 column groups. This is the same
// register order, so no data moves (see the PTX ISA fragment figures for m64nNk16).
template <class L>
CUTE_HOST_DEVICE constexpr auto acc_as_a_operand(L l) {
  using namespace cute;
  static_assert(size<2>(l) == 1, "S must be one WGMMA atom wide");
  auto groups = logical_divide(layout<0, 2>(l), Layout<_2>{});  // (2, N/16)
  return make_layout(make_layout(layout<0, 0>(l), layout<0, 1>(l), layout<0>(groups)), layout<1>(l),
                     layout<1>(groups));
}

// The same for an FP8 P.V, whose A operand is ((4,2,2),M,N/32) per k32 block: values 0-3 are
// columns 4t..4t+3 of row r (t = lane % 4), 4-7 the same of row r + 8, 8-15 the same 16 columns
// further. The accumulator gives thread t columns 2t, 2t+1 of each n8 group, so this view takes
// (2 cols of group 2k, 2 cols of group 2k+1) as the 4 values: the k index the hardware sees is a
// fixed permutation of the real column within every 16 (flash3/fp8_quant.py V_PERM16), undone by storing
// V's tokens in that order. Result: ((((2,2),2,2)),M,N/32) over S's registers.
template <class L>
CUTE_HOST_DEVICE constexpr auto acc_as_a_operand_fp8(L l) {
  using namespace cute;
  static_assert(size<2>(l) == 1, "S must be one WGMMA atom wide");
  auto groups = logical_divide(layout<0, 2>(l), Layout<Shape<_2, _2>>{});  // ((2, 2), N/32)
  return make_layout(make_layout(make_layout(layout<0, 0>(l), layout<0, 0>(groups)), layout<0, 1>(l),
                                 layout<0, 1>(groups)),
                     layout<1>(l), layout<1>(groups));
}

// fp32 fragment -> 16-bit fragment with the same register order (packed conversions).
template <class To, class Engine, class LayoutT>
__device__ __forceinline__ auto convert_fragment(cute::Tensor<Engine, LayoutT> const& src) {
  using namespace cute;
  using From = typename Engine::value_type;
  constexpr int N = decltype(size(src))::value;
  Tensor dst = make_tensor<To>(src.layout());
  using Converter = cutlass::NumericArrayConverter<To, From, N>;
  *reinterpret_cast<cutlass::Array<To, N>*>(dst.data()) =
      Converter{}(*reinterpret_cast<cutlass::Array<From, N> const*>(src.data()));
  return dst;
}

// Two fp32 values -> one register of two 16-bit values (lo in bits 0-15), rounded to nearest even
// like NumericArrayConverter: one F2FP each.
template <class To>
__device__ __forceinline__ uint32_t pack_pair(float lo, float hi) {
  static_assert(sizeof(To) == 2, "16-bit targets only");
  uint32_t r;
  if constexpr (std::is_same_v<To, cutlass::bfloat16_t>)
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  else
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// fp32 registers -> 16-bit registers of `dst`, whose layout maps every coordinate to the same
// offset as `src`'s (acc_as_a_operand: the A operand of P.V over S's registers). Pairs of adjacent
// offsets go straight into dst's 32-bit registers: no intermediate fragment to copy and repack.
template <class To, class TensorS, class TensorD>
__device__ __forceinline__ void convert_pairs_into(TensorS const& src, TensorD& dst) {
  using namespace cute;
  constexpr int N = decltype(cosize(src.layout()))::value;
  static_assert(N % 2 == 0 && decltype(cosize(dst.layout()))::value == N, "same register offsets");
  uint32_t* d = reinterpret_cast<uint32_t*>(raw_pointer_cast(dst.data()));
  CUTE_UNROLL
  for (int i = 0; i < N / 2; ++i) d[i] = pack_pair<To>(src.data()[2 * i], src.data()[2 * i + 1]);
}

template <class T>
__device__ __forceinline__ T quad_allreduce_max(T x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffff, x, 2));
}
template <class T>
__device__ __forceinline__ T quad_allreduce_sum(T x) {
  x += __shfl_xor_sync(0xffffffff, x, 1);
  return x + __shfl_xor_sync(0xffffffff, x, 2);
}

// ALiBi terms of this thread's rows of a tile (common/score_mod.h): each row's slope in raw units and
// diag = token + seqlen_k - seqlen_q - (this thread's first column), the distance to key 0 of that
// column. Tile row r is query token row0 + r of head `head`, or with kPackedRows (the decode kernel's
// packed GQA) token (row0 + r) / g of head `head` * g + (row0 + r) % g, g = mod.group (`head` is then
// the kv head); offset = seqlen_k - seqlen_q of the row's sequence. Nothing without ALiBi.
template <bool kPackedRows, int kRows, class TensorC>
__device__ __forceinline__ void alibi_rows(float (&slope)[kRows], int (&diag)[kRows], TensorC const& coord_rc,
                                           const ScoreMod& mod, int row0, int offset, int batch, int head) {
  using namespace cute;
  if (!mod.has_alibi()) return;
  const int tcol = get<1>(coord_rc(0, 0));
  CUTE_UNROLL
  for (int mi = 0; mi < kRows; ++mi) {
    const int row = row0 + get<0>(coord_rc(mi, 0));
    if constexpr (kPackedRows) {
      const int token = row / mod.group;
      slope[mi] = mod.alibi_raw_slope(batch, head * mod.group + (row - token * mod.group));
      diag[mi] = token + offset - tcol;
    } else {
      slope[mi] = mi == 0 ? mod.alibi_raw_slope(batch, head) : slope[0];
      diag[mi] = row + offset - tcol;
    }
  }
}

// The score mod (common/score_mod.h) on a (row, col) view of raw scores whose keys start at col0:
// the transform (softcap's tanh, with cap * log2(e) folded into the softmax's exp2 scale), then the
// ALiBi position term from the rows' alibi_rows. The caller tests mod.active() first (the default
// path's only cost).
// kWithAlibi = false: the transform only (kernels without the ALiBi term).
template <bool kWithAlibi = true, int kRows, class TensorS, class TensorC>
__device__ __forceinline__ void apply_score_mod(TensorS& s_rc, TensorC const& coord_rc, const ScoreMod& mod, int col0,
                                                const float (&slope)[kRows], const int (&diag)[kRows]) {
  using namespace cute;
  if (mod.has_softcap()) {
    CUTE_UNROLL
    for (int i = 0; i < size(s_rc); ++i) s_rc(i) = mod.transform(s_rc(i));
  }
  if constexpr (!kWithAlibi) return;
  if (!mod.has_alibi()) return;
  const int tcol = get<1>(coord_rc(0, 0));
  CUTE_UNROLL
  for (int mi = 0; mi < kRows; ++mi) {
    const float dist0 = float(diag[mi] - col0);  // i + seqlen_k - seqlen_q - j at this thread's first column
    CUTE_UNROLL
    for (int ni = 0; ni < size<1>(s_rc); ++ni)
      s_rc(mi, ni) += ScoreMod::position(slope[mi], dist0 - float(get<1>(coord_rc(mi, ni)) - tcol));
  }
}

// This thread's columns of an accumulator row, in register order, lie at offsets
// 8 * (k / 2) + k % 2 from its first column (two adjacent columns per n8 group; one WGMMA atom wide).
// How many of them lie before offset `b`, extended to any b: 2 * floor(b / 8) + min(b mod 8, 2),
// which is the count for b >= 0, at most 0 below, and grows by exactly 2 when b grows by 8.
__device__ __forceinline__ int thread_cols_before(int b) { return 2 * (b >> 3) + min(b & 7, 2); }

// Bits 0 .. n-1 set (n clamped to [0, 32]).
__device__ __forceinline__ uint32_t low_bits(int n) {
  n = n > 0 ? n : 0;
  uint32_t r;
  asm("bmsk.clamp.b32 %0, 0, %1;" : "=r"(r) : "r"(n));  // width clamped to 32
  return r;
}

// The layout every mask below relies on, for a (row, col) view of a 64xN WGMMA accumulator's
// identity: column k of a row at 8 * (k / 2) + k % 2, rows 8 apart (then 64: one atom per 64 rows).
template <class CL>  // the identity view's layout: static, only the thread's origin is a register
__device__ __forceinline__ constexpr void check_rowcol_layout() {
  using namespace cute;
  static_assert(decltype(get<1>(CL{}(_0{}, _1{})))::value == 1 && decltype(get<1>(CL{}(_0{}, _2{})))::value == 8,
                "column k of a row lies at 8 * (k / 2) + k % 2");
  static_assert(decltype(get<0>(CL{}(_1{}, _0{})))::value == 8 &&
                    (decltype(size<0>(CL{}))::value == 2 || decltype(get<0>(CL{}(_2{}, _0{})))::value == 64),
                "a thread's rows lie 8 apart (then 64)");
}

// Sets the entries of row mi outside this thread's visible run to `fill`. lo / hi: how many of
// the row's columns (thread_cols_before) lie before the first visible one and before the end of
// the run. The thread builds a bit mask of its visible columns and each entry tests one constant
// bit: ptxas turns the tests into R2P (seven predicates per instruction) and one FSEL per entry,
// instead of a compare and a select per entry.
template <bool kCutLeft = true, class TensorS>
__device__ __forceinline__ void fill_outside_run(TensorS& s_rc, int mi, int lo, int hi, float fill) {
  using namespace cute;
  constexpr int kCols = decltype(size<1>(s_rc))::value;
  CUTE_UNROLL
  for (int w = 0; w < (kCols + 31) / 32; ++w) {
    const uint32_t visible = low_bits(hi - 32 * w) & (kCutLeft ? ~low_bits(lo - 32 * w) : ~0u);
    CUTE_UNROLL
    for (int k = 0; k < 32 && 32 * w + k < kCols; ++k)
      if (!((visible >> k) & 1u)) s_rc(mi, 32 * w + k) = fill;
  }
}

// Which bounds a key block's mask may cut it by: none (every pair visible), the right one only
// (no left bound: causal diagonal, seqlen_k tail), both window bounds (linear in the row: the
// caller knows there is no attention chunk), the per-row bounds of an attention chunk, or `both`:
// either of the last two, by a runtime test of mask.chunk (the first block, out of the key loop;
// the loops are chosen per tile so that theirs carry no such branch).
enum class Masking { none, right, window, chunk, both };

// Sets scores of invisible (query, key) pairs to -inf. s_rc / coord_rc: (row, col) views of the
// accumulator and of its identity (tile coordinates). row0/col0: tile origin in the sequence
// (col0 a multiple of 8).
// A key j is visible to row i iff first_key(i) <= j < last_key(i + 1) (this is Mask::visible): one
// run per row (fill_outside_run). A thread's rows lie 8 apart, so with one row per token both
// bounds of a later row follow from the first row's: last_key grows by 8, up to seqlen_k (+2 of the
// thread's columns, then the clamp); the left bound is key_floor, first_key before its clamp at 0,
// which grows by 8 with no clamp (a count <= 0 cuts nothing either way). Packed GQA rows
// (rows_per_token > 1) take both per row. kMask (not none) says which bounds may cut: right (no
// left bound, nor a chunk), window (no chunk), chunk, or both (a runtime test of mask.chunk). With
// an attention chunk the bounds are not linear in the row: each row takes its own (key_floor,
// last_key), a floored division per row; packed rows with kRowRuns (the decode kernels with a
// chunk, FwdTraits::kChunk) their token's Mask::row_keys, one unsigned division, whatever kMask.
template <bool kPackedRows = false, Masking kMask = Masking::both, bool kRowRuns = false, class TensorS,
          class TensorC>
__device__ __forceinline__ void apply_mask(TensorS& s_rc, TensorC const& coord_rc, const Mask& mask,
                                           int row0, int col0, int rows_per_token = 1) {
  using namespace cute;
  static_assert(kMask != Masking::none, "an unmasked block takes no mask");
  constexpr bool kCutLeft = kMask != Masking::right;
  check_rowcol_layout<decltype(coord_rc.layout())>();
  const int tcol = get<1>(coord_rc(0, 0));  // this thread's first column in the tile
  const int first_row = row0 + get<0>(coord_rc(0, 0));
  if constexpr (!kPackedRows && (kMask == Masking::chunk || kMask == Masking::both)) {
    if (kMask == Masking::chunk || mask.chunk > 0) {
      const int tc = col0 + tcol;
      CUTE_UNROLL
      for (int mi = 0; mi < size<0>(s_rc); ++mi) {
        const int row = row0 + get<0>(coord_rc(mi, 0));
        fill_outside_run(s_rc, mi, thread_cols_before(mask.key_floor(row) - tc),
                         thread_cols_before(mask.last_key(row + 1) - tc), -INFINITY);
      }
      return;
    }
  }
  // col0 is a multiple of 8 (a key block's origin), so thread_cols_before(b - col0) =
  // thread_cols_before(b) - col0 / 4: each count is a term that is the same for every key block
  // (the compiler hoists it out of the key loop) minus one shift.
  const int shift = col0 / 4;
  const int cnt_end = thread_cols_before(mask.seqlen_k - tcol) - shift;
  const int cnt_hi = thread_cols_before(mask.window_last_key(first_row + 1) - tcol) - shift;
  const int cnt_lo = thread_cols_before(mask.window_floor(first_row) - tcol) - shift;
  CUTE_UNROLL
  for (int mi = 0; mi < size<0>(s_rc); ++mi) {
    const int row = row0 + get<0>(coord_rc(mi, 0));
    if constexpr (kPackedRows) {  // packed GQA: the mask acts on the row's token
      const int token = row / rows_per_token;
      const int tc = col0 + tcol;  // per block: a hoisted per-row term costs registers the decode lacks
      if constexpr (kRowRuns) {  // the token's run, chunk-aware
        const KeyRun run = mask.row_keys(token);
        fill_outside_run<kCutLeft>(s_rc, mi, thread_cols_before(run.lo - tc), thread_cols_before(run.hi - tc),
                                   -INFINITY);
      } else {  // kernels without a chunk build their Mask with chunk 0
        fill_outside_run<kCutLeft>(s_rc, mi, thread_cols_before(mask.first_key(token) - tc),
                                   thread_cols_before(mask.last_key(token + 1) - tc), -INFINITY);
      }
    } else {
      const int dr = row - first_row;  // a constant multiple of 8
      fill_outside_run<kCutLeft>(s_rc, mi, kCutLeft ? cnt_lo + dr / 4 : 0, min(cnt_end, cnt_hi + dr / 4), -INFINITY);
    }
  }
}

// The run mask in a layout ptxas tests with R2P alone, for rows of 6, 12, 18 or 24 of the
// thread's columns (key blocks of 24, 48, 72 or 96 keys: bf16 d 96): column k at bit
// k + 2 * (k / 6) + 1, six columns (three n8 groups, 24 tile columns) to a byte in its bits 1-6,
// each byte's tests one R2P (it writes seven predicates, but ptxas tests a word's bit 0 by itself,
// with two instructions). In the dense layout of fill_outside_run every byte's bit 7, and bit 0,
// take tests of their own: at 24 columns 9 instructions per row instead of 4.
template <int kCols>
constexpr bool spread_mask_fits() { return kCols % 6 == 0 && kCols <= 24; }
__device__ __forceinline__ constexpr int spread_bit(int k) { return k + 2 * (k / 6) + 1; }

// spread_cols_before(b): the bit below which lie the thread's columns before tile offset b (the
// count thread_cols_before(b) = 2g + min(b mod 8, 2), g = floor(b / 8), plus 2 * floor(g / 3) + 1);
// at most 1 for b <= 0 (bit 0 holds no column), at least 32 past 96 columns. b - 24t gives exactly
// 8t less.
__device__ __forceinline__ int spread_cols_before(int b) {
  const int g = b >> 3;
  return 2 * g + min(b & 7, 2) + 2 * floor_div(g, 3) + 1;
}

// Each row's run bounds in the spread layout, relative to the key block at col0 (a multiple of
// 24: positions move by col0 / 3). They are not a constant step apart from row to row in this
// layout and take a division each, so they are made once per tile and carried from block to block
// (advance: one add per bound; recomputed from the block index, ptxas copied that index out of its
// uniform register and multiplied it for every bound). No attention chunk (its bounds are not linear
// in the row: apply_mask's chunk path) and one row per token (no packed GQA).
template <int kRows>
struct SpreadRuns {
  int lo[kRows], hi[kRows];
  // The same runs relative to the block `blocks` blocks of block_n keys to the left.
  template <int kBlockN>
  __device__ __forceinline__ void advance(int blocks) {
    static_assert(kBlockN % 24 == 0, "a block moves the positions by block_n / 3");
    CUTE_UNROLL
    for (int mi = 0; mi < kRows; ++mi) {
      lo[mi] += blocks * (kBlockN / 3);
      hi[mi] += blocks * (kBlockN / 3);
    }
  }
};
template <int kRows, class TensorC>
__device__ __forceinline__ SpreadRuns<kRows> spread_runs(TensorC const& coord_rc, const Mask& mask, int row0,
                                                         int col0) {
  using namespace cute;
  static_assert(decltype(size<0>(coord_rc))::value == kRows, "one bound pair per row");
  check_rowcol_layout<decltype(coord_rc.layout())>();
  const int tcol = get<1>(coord_rc(0, 0));
  SpreadRuns<kRows> r;
  CUTE_UNROLL
  for (int mi = 0; mi < kRows; ++mi) {
    const int row = row0 + get<0>(coord_rc(mi, 0));
    r.lo[mi] = spread_cols_before(mask.window_floor(row) - tcol) - col0 / 3;
    r.hi[mi] = spread_cols_before(imin(mask.seqlen_k, mask.window_last_key(row + 1)) - tcol) - col0 / 3;
  }
  return r;
}

// apply_mask's window / right paths from spread_runs relative to this block.
template <Masking kMask, class TensorS, int kRows>
__device__ __forceinline__ void apply_mask_spread(TensorS& s_rc, const SpreadRuns<kRows>& runs) {
  using namespace cute;
  static_assert(kMask == Masking::right || kMask == Masking::window, "no chunk: apply_mask");
  constexpr bool kCutLeft = kMask != Masking::right;
  constexpr int kCols = decltype(size<1>(s_rc))::value;
  static_assert(spread_mask_fits<kCols>() && decltype(size<0>(s_rc))::value == kRows, "spread layout");
  CUTE_UNROLL
  for (int mi = 0; mi < kRows; ++mi) {
    const uint32_t visible = low_bits(runs.hi[mi]) & (kCutLeft ? ~low_bits(runs.lo[mi]) : ~0u);
    CUTE_UNROLL
    for (int k = 0; k < kCols; ++k)
      if (!((visible >> spread_bit(k)) & 1u)) s_rc(mi, k) = -INFINITY;
  }
}

// Online softmax state for the kRows rows a thread owns. row_sum is the thread's partial sum over
// its own columns (all quad members apply the same rescaling); it is quad-reduced once at the end.
// kMaxOffsetLog2: P = exp2(s*scale - max*scale + offset), so P spans [0, 2^offset] (FP8 uses 8:
// e4m3's range instead of [0, 1], where small P would be subnormal). Row sums and O carry the same
// factor, which cancels in O / sum; the LSE subtracts it.
template <int kRows, int kMaxOffsetLog2 = 0>
struct OnlineSoftmax {
  float row_max[kRows];
  float row_sum[kRows];
  float scale_log2;

  __device__ __forceinline__ void init(float scale_log2_) {
    scale_log2 = scale_log2_;
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      row_max[r] = -INFINITY;
      row_sum[r] = 0.f;
    }
  }

  // Pass 1 over a block of raw (masked) scores: new row maxes, and in `scale` the factor the running
  // O must be multiplied by (1 for the first block). row_sum is rescaled here too. A row with no
  // visible key so far keeps max = -inf; its offset is taken as 0 so exp2(-inf - 0) = 0, no NaN.
  // Maxes come first for all rows, then the exponentials (exp_and_sum): that order lets ptxas keep
  // the exponentials under the in-flight P.V WGMMA.
  // kCheckInf = false (a block every row sees in full: its max is finite) drops the -inf tests.
  // kLazy (unmasked blocks of 16-bit kernels): while no row of the warp has a max more than
  // kLazyGrowLog2 above its running max, the running max stays, nothing is rescaled and this
  // returns false (the caller skips O's rescale, a multiply per O register). P is then up to
  // 2^kLazyGrowLog2 instead of 1; row sums and O carry the same factor, which O / sum cancels and
  // the LSE (from the kept max and the sum) accounts for. Warp-uniform, so the skip is a branch.
  // Returns whether O must be multiplied by `scale`.
  static constexpr int kLazyGrowLog2 = 8;
  // FP8 (kMaxOffsetLog2 != 0): `fold` > 0 is a factor the scores still carry (their descale): the
  // block max is taken over the raw scores and multiplied by it (exact: a positive factor keeps the
  // order), and exp_and_sum applies it with the scale, so no multiply per score.
  template <bool kFirst, bool kCheckInf = true, bool kLazy = false, class TensorS>
  __device__ __forceinline__ bool rescale_max(TensorS const& s_rc, float (&scale)[kRows], float fold = 1.f) {
    using namespace cute;
    static_assert(!kLazy || kMaxOffsetLog2 == 0, "FP8 P is already scaled up to e4m3's range");
    float m[kRows];
    CUTE_UNROLL
    for (int mi = 0; mi < kRows; ++mi) m[mi] = kFirst || kMaxOffsetLog2 != 0 ? -INFINITY : row_max[mi];
    CUTE_UNROLL
    for (int ni = 0; ni < size<1>(s_rc); ++ni) {
      CUTE_UNROLL
      for (int mi = 0; mi < kRows; ++mi) m[mi] = fmaxf(m[mi], s_rc(mi, ni));
    }
    CUTE_UNROLL
    for (int mi = 0; mi < kRows; ++mi) m[mi] = quad_allreduce_max(m[mi]);
    if constexpr (kMaxOffsetLog2 != 0) {
      CUTE_UNROLL
      for (int mi = 0; mi < kRows; ++mi) m[mi] = kFirst ? m[mi] * fold : fmaxf(row_max[mi], m[mi] * fold);
    }
    if constexpr (kLazy && !kFirst && !kCheckInf) {
      bool grow = false;
      CUTE_UNROLL
      for (int mi = 0; mi < kRows; ++mi) grow |= (m[mi] - row_max[mi]) * scale_log2 > float(kLazyGrowLog2);
      if (!__any_sync(0xffffffffu, grow)) return false;
    }
    CUTE_UNROLL
    for (int mi = 0; mi < kRows; ++mi) {
      if constexpr (kFirst) {
        scale[mi] = 1.f;
      } else if constexpr (kCheckInf) {
        // No key seen yet: -inf - -inf is NaN, and max() takes the other operand, so the factor is
        // exp2(-FLT_MAX) = 0 (row_sum and O are 0 anyway); one FMNMX instead of a test and a select.
        scale[mi] = exp2f(fmaxf((row_max[mi] - m[mi]) * scale_log2, -FLT_MAX));
        row_sum[mi] *= scale[mi];
      } else {
        scale[mi] = exp2f((row_max[mi] - m[mi]) * scale_log2);
        row_sum[mi] *= scale[mi];
      }
      row_max[mi] = m[mi];
    }
    return true;
  }

  // Pass 2: P = exp2(s*scale - max*scale) in place, added to the thread's partial row sums.
  // FP8: `fold` as in rescale_max, s * (scale * fold) - max per score (ptxas makes it one FFMA; an
  // explicit fmaf ran 20% slower at d 128 in the timing model, which replays the PTX).
  template <bool kCheckInf = true, class TensorS>
  __device__ __forceinline__ void exp_and_sum(TensorS& s_rc, float fold = 1.f) {
    exp_and_sum_cols<0, decltype(cute::size<1>(s_rc))::value, kCheckInf>(s_rc, fold);
  }
  // The same over the columns [kBegin, kEnd) of each row, in two calls [0, k) and [k, end) when a
  // wait must go between them (FwdTraits::kPinCols): the running sum of the first part is carried
  // in `part` to the second, so the row sums come out bit for bit as from one call.
  template <int kBegin, int kEnd, bool kCheckInf = true, class TensorS>
  __device__ __forceinline__ void exp_and_sum_cols(TensorS& s_rc, float fold = 1.f) {
    using namespace cute;
    constexpr int kCols = decltype(size<1>(s_rc))::value;
    static_assert(0 <= kBegin && kBegin < kEnd && kEnd <= kCols, "a column range of the block");
    [[maybe_unused]] const float s_scale = scale_log2 * fold;
    CUTE_UNROLL
    for (int mi = 0; mi < kRows; ++mi) {
      // No key seen yet (max -inf): -FLT_MAX keeps s - max at -inf, so P = 0, not NaN.
      const float max_scaled =
          (kCheckInf ? fmaxf(row_max[mi] * scale_log2, -FLT_MAX) : row_max[mi] * scale_log2) - float(kMaxOffsetLog2);
      float sum = kBegin == 0 ? 0.f : part[mi];  // from the first P, not 0 + P: an FADD less per row (the same bits: P is never -0)
      CUTE_UNROLL
      for (int ni = kBegin; ni < kEnd; ++ni) {
        const float p = kMaxOffsetLog2 != 0 ? exp2f(s_rc(mi, ni) * s_scale - max_scaled)
                                            : exp2f(s_rc(mi, ni) * scale_log2 - max_scaled);
        s_rc(mi, ni) = p;
        sum = ni == 0 ? p : sum + p;
      }
      if constexpr (kEnd == kCols) row_sum[mi] += sum;
      else part[mi] = sum;
    }
  }
  float part[kRows];  // exp_and_sum_cols: the block's running row sums between its two calls

  // Full row sums; returns in inv_sum the factor for O (0 for a row that saw no key, so O = 0) and
  // in lse the natural-log log-sum-exp (-inf for such a row).
  __device__ __forceinline__ void finalize(float (&inv_sum)[kRows], float (&lse)[kRows]) {
    CUTE_UNROLL
    for (int mi = 0; mi < kRows; ++mi) {
      const float sum = quad_allreduce_sum(row_sum[mi]);
      const bool empty = !(sum > 0.f);  // also catches NaN
      inv_sum[mi] = empty ? 0.f : 1.f / sum;
      lse[mi] = empty ? -INFINITY
                      : (row_max[mi] * scale_log2 + log2f(sum) - float(kMaxOffsetLog2)) * float(M_LN2);
    }
  }
};

}  // namespace flash3
