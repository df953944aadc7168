// The FP8 (e4m3) consumer's own steps, out of FwdConsumer (mainloop.cuh) so that it reads as the
// 16-bit algorithm with FP8 hooks: the descales (q per slab, k/v per key block, v per channel), P as
// e4m3 in the A-operand layout, and the two-level P.V accumulation (each block's P.V into a fresh
// fp32 accumulator, added to O here: the FP8 WGMMA keeps fewer mantissa bits while accumulating).
// C is FwdConsumer<Tr>, whose waits, pingpong, softmax and P store these steps share. Every step is
// __forceinline__, as in mainloop.cuh (an outlined call serializes every wgmma).
#pragma once

#include <cute/tensor.hpp>

#include "flash3/common/barriers.cuh"
#include "flash3/common/softmax.cuh"
#include "flash3/common/wgmma.cuh"
#include "flash3/fwd/scheduler.cuh"
#include "flash3/fwd/traits.cuh"

namespace flash3 {

template <class Tr, class C>
struct FwdFp8Steps {
  using Element = typename Tr::Element;
  using PipelineKV = typename Tr::PipelineKV;
  using PipelineV = typename Tr::PipelineV;
  using PipelineState = typename Tr::PipelineState;
  using PipelineStateV = typename Tr::PipelineStateV;
  using SharedStorage = typename Tr::SharedStorage;
  static constexpr int kRows = Tr::kRowsPerThread;

  // Entry i of the descale row (batch, head) that starts at element `row`, clamped to the row
  // (32-bit offsets: a descale tensor has b * h * blocks entries; 64-bit row pointers spilled at d 256).
  static __device__ __forceinline__ int row_of(const Descale& d, int batch, int head) {
    return batch * int(d.batch_stride) + head * int(d.head_stride);
  }
  static __device__ __forceinline__ float entry(const Descale& d, int row, int i) {
    return d.ptr[row + imax(imin(i, d.count - 1), 0) * int(d.index_stride)];
  }

  // k and v descales of block i, read a step before they are used: the load is not waited out
  // (in the timing model it was the top stall line, 259 cycles per block and warp, right after
  // S's wait at d 256).
  template <class F>
  static __device__ __forceinline__ void prefetch(typename Tr::KernelParams const& params, F& fr, int i) {
    fr.k_next = entry(params.p.fp8.k, fr.k_row, i);
    fr.v_next = entry(params.p.fp8.v, fr.v_row, i);
  }

  // Once per tile: this slab's q descale, the k and v descales of the first block (end - 1), and
  // the read of the next block's (launch_fwd requires the three descale tensors).
  template <class F>
  static __device__ __forceinline__ void init(typename Tr::KernelParams const& params, const WorkTile& w,
                                              int consumer, F& fr) {
    const Fp8Descales& d = params.p.fp8;
    // The last tile's second slab may lie wholly past seqlen_q (its rows are never stored): clamp.
    const int slab = imin(w.coord.m_block * Tr::kNumConsumers + consumer, (w.seq.seqlen_q - 1) / 64);
    fr.q_descale = d.q.at(w.coord.batch, w.coord.head, slab);
    fr.k_row = row_of(d.k, w.coord.batch, w.head_k);
    fr.v_row = row_of(d.v, w.coord.batch, w.head_k);
    fr.v_descale_p = entry(d.v, fr.v_row, w.blocks.end - 1);
    fr.o_unit = 1.f;  // O is 0: any unit
    fr.vd_max = 0.f;
    fr.s_descale = fr.q_descale * entry(d.k, fr.k_row, w.blocks.end - 1);
    prefetch(params, fr, w.blocks.end - 2);
  }

  // Fast accumulation (Tr::kFastAccum; FwdConsumer::step runs block n): the descale of S_n's scores,
  // and the read of the next block's k descale. v's one descale (per (batch, kv head): launch_fwd
  // checks) stays in fr.v_descale_p (init) until fast_finish.
  template <class F>
  static __device__ __forceinline__ void next_scores(typename Tr::KernelParams const& params, F& fr, int n) {
    fr.s_descale = fr.q_descale * fr.k_next;
    fr.k_next = entry(params.p.fp8.k, fr.k_row, n - 1);
  }
  // A row that saw no key keeps O = 0 (inv_sum 0), whatever the descale (0 * inf or NaN is NaN).
  template <class F>
  static __device__ __forceinline__ void fast_finish(F const& fr, float (&inv_sum)[kRows]) {
    CUTE_UNROLL
    for (int mi = 0; mi < kRows; ++mi) inv_sum[mi] = inv_sum[mi] == 0.f ? 0.f : inv_sum[mi] * fr.v_descale_p;
  }

  // The raw scores of block n carry q_descale * k_descale[n] (fr.s_descale). Before a score mod
  // (softcap: tanh of the descaled score), or for a descale that is not > 0 (a positive factor keeps
  // the row max), they are multiplied here and 1 is returned; otherwise the descale is returned, for
  // the softmax to fold into its max and its exponentials' scale (a multiply per score less).
  template <class TensorS, class F>
  static __device__ __forceinline__ float descale_or_fold(TensorS& tSrS, F const& fr, bool score_mod) {
    if (!score_mod && fr.s_descale > 0.f) return fr.s_descale;
    CUTE_UNROLL
    for (int i = 0; i < cute::size(tSrS); ++i) tSrS(i) *= fr.s_descale;
    return 1.f;
  }

  // P as e4m3 in the A-operand layout: each 32-bit register of tOrP (compact: bytes in logical
  // order) takes its 4 values from S's registers (acc_as_a_operand_fp8) in two packed conversions
  // and one byte merge, the same e4m3 bytes as converting S's fragment and moving bytes (which
  // took ~90 integer instructions per 64 keys at d 128 and 256).
  static __device__ __forceinline__ uint32_t pack4_e4m3(float v0, float v1, float v2, float v3) {
    uint32_t r;
    asm("{\n.reg .b16 lo, hi;\n"
        "cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n"  // lo = v1 << 8 | v0
        "cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n"
        "mov.b32 %0, {lo, hi};\n}"
        : "=r"(r)
        : "f"(v0), "f"(v1), "f"(v2), "f"(v3));
    return r;
  }
  template <class TensorS, class TensorP>
  static __device__ __forceinline__ void store_p_to(TensorS const& tSrS, TensorP& tOrP) {
    using namespace cute;
    static_assert(is_same_v<typename TensorP::layout_type, typename Tr::LayoutP>, "P's compact fragment");
    static_assert(decltype(cosize(tOrP.layout()))::value == decltype(size(tOrP))::value, "compact");
    Tensor a = make_tensor(tSrS.data(), acc_as_a_operand_fp8(tSrS.layout()));  // logical A order
    static_assert(decltype(size(a))::value == decltype(size(tOrP))::value && decltype(size(a))::value % 4 == 0);
    uint32_t* d = reinterpret_cast<uint32_t*>(raw_pointer_cast(tOrP.data()));
    CUTE_UNROLL
    for (int w = 0; w < decltype(size(a))::value / 4; ++w)
      d[w] = pack4_e4m3(a(4 * w), a(4 * w + 1), a(4 * w + 2), a(4 * w + 3));
  }

  // O's registers hold O / fr.o_unit, where o_unit is the v descale of a block already added, so
  // that a block's fresh P.V is added with one FFMA per value: O = O * (scale * old_unit / unit) +
  // fresh (FMUL + FFMA before). The unit becomes the block's descale when that is > 0 and at least
  // 2^-64 of the largest descale so far (fr.vd_max): O's registers then stay below ~2^64 times the
  // largest fresh sum per block, whatever the descales (0, tiny, huge). Otherwise (0, negative, NaN,
  // or tiny) the unit stays and fresh is scaled too: a warp-uniform branch (every thread reads the
  // same descale), which real quantizers' descales (> 0, within 2^64 of each other) never take.
  struct Fold {
    float factor[kRows];  // O's per-row factor: the pending rescale times old_unit / unit
    float fresh_scale;    // v_descale / unit (1: the common case)
    bool exact;           // fresh_scale == 1
  };
  template <class F>
  static __device__ __forceinline__ Fold fold(F& fr, const float (&scale)[kRows]) {
    const float vd = fr.v_descale_p;
    const float unit = vd > 0.f && vd >= fr.vd_max * 0x1p-64f ? vd : fr.o_unit;
    fr.vd_max = fmaxf(fr.vd_max, vd);
    // 1 when the unit stays (x / x is 1 for every finite x != 0): a warp-uniform branch that skips
    // the IEEE division's ~12 instructions on blocks that share a descale (at d 256 two 64-key
    // blocks per 128-key descale; every block with a per-tensor one).
    const float r = unit == fr.o_unit ? 1.f : __fdiv_rn(fr.o_unit, unit);
    Fold f;
    CUTE_UNROLL
    for (int mi = 0; mi < kRows; ++mi) f.factor[mi] = scale[mi] * r;
    f.exact = vd == unit;
    f.fresh_scale = f.exact ? 1.f : __fdiv_rn(vd, unit);  // NaN descale: NaN, as fresh * NaN was
    fr.o_unit = unit;
    return f;
  }

  // Two-level accumulation of one chunk of O, where fresh is the block's P.V from a
  // zero-initialized accumulator: O = O * factor + fresh (in O's unit; see Fold).
  template <class TensorOc, class TensorF>
  static __device__ __forceinline__ void add_fresh(TensorOc& o, TensorF const& fresh, Fold const& fd) {
    using namespace cute;
    Tensor o_rc = make_tensor(o.data(), acc_rowcol(fresh.layout()));
    Tensor f_rc = make_tensor(fresh.data(), acc_rowcol(fresh.layout()));
    if (fd.exact) {
      CUTE_UNROLL
      for (int mi = 0; mi < kRows; ++mi) {
        CUTE_UNROLL
        for (int ni = 0; ni < size<1>(o_rc); ++ni) o_rc(mi, ni) = fmaf(o_rc(mi, ni), fd.factor[mi], f_rc(mi, ni));
      }
    } else {
      CUTE_UNROLL
      for (int mi = 0; mi < kRows; ++mi) {
        CUTE_UNROLL
        for (int ni = 0; ni < size<1>(o_rc); ++ni)
          o_rc(mi, ni) = fmaf(f_rc(mi, ni), fd.fresh_scale, o_rc(mi, ni) * fd.factor[mi]);
      }
    }
  }

  // Chunk c of O's fragment (kOChunks n-tiles of the P.V WGMMA), as a tensor shaped like `fresh`.
  template <class TensorO>
  static __device__ __forceinline__ auto o_chunk(TensorO& tOrO, int c) {
    using namespace cute;
    Tensor chunk = tOrO(_, _, c);
    return make_tensor(chunk.data(), make_layout(append(shape(chunk), _1{})));
  }

  // O's columns times the per-channel v descale (one load per column the thread holds).
  template <class TensorO>
  static __device__ __forceinline__ void scale_columns(const FwdParams& p, const WorkTile& w, TensorO& tOrO) {
    using namespace cute;
    const Descale& vc = p.fp8.v_channel;
    if (vc.ptr == nullptr) return;
    typename Tr::TiledMmaO mma_o;
    Tensor cO = make_identity_tensor(Shape<typename Tr::BlkM, typename Tr::HDV>{});
    Tensor tOcO = mma_o.get_thread_slice(consumer_thread_idx()).partition_C(cO);
    Tensor tOcO_rc = make_tensor(tOcO.data(), acc_rowcol(tOcO.layout()));
    Tensor o_rc = make_tensor(tOrO.data(), acc_rowcol(tOrO.layout()));
    // Every load first, then the products: one load latency, not one per column.
    float f[size<1>(o_rc)];
    CUTE_UNROLL
    for (int ni = 0; ni < size<1>(o_rc); ++ni) {
      const int col = get<1>(tOcO_rc(0, ni));
      f[ni] = col < p.head_dim_v ? vc.at(w.coord.batch, w.head_k, col) : 0.f;
    }
    CUTE_UNROLL
    for (int ni = 0; ni < size<1>(o_rc); ++ni) {
      CUTE_UNROLL
      for (int mi = 0; mi < size<0>(o_rc); ++mi) o_rc(mi, ni) *= f[ni];
    }
  }

  // The P.V B operand of O chunk c in stage s, with its (here single) n-tile mode kept.
  template <class TV>
  static __device__ __forceinline__ auto v_chunk(TV const& tOrV, int c, int stage) {
    using namespace cute;
    Tensor b = tOrV(_, c, _, stage);  // (MMA, MMA_K)
    return make_tensor(b.data(), make_layout(layout<0>(b), Layout<_1>{}, layout<1>(b)));
  }

  // Several O chunks: P.V chunk by chunk into two fresh accumulators in turn, each chunk added
  // (O = O * scale + fresh, in O's unit) while the next chunk's WGMMA runs; only the last add
  // waits out its WGMMA. `fd` carries the rescale still pending on O.
  template <class TV, class TensorO, class F>
  static __device__ __forceinline__ void pv_chunks(TV const& tOrV, int stage, TensorO& tOrO, F& fr, Fold const& fd) {
    using namespace cute;
    static_assert(Tr::kOChunks >= 2, "one chunk: FwdFp8Steps::step issues it beside S");
    Tensor fresh0 = partition_fragment_C(fr.mma_o, Shape<typename Tr::BlkM, Int<Tr::kOChunkCols>>{});
    Tensor fresh1 = partition_fragment_C(fr.mma_o, Shape<typename Tr::BlkM, Int<Tr::kOChunkCols>>{});
    gemm_async<true>(fr.mma_o, fr.tOrP, v_chunk(tOrV, 0, stage), fresh0);
    for_each(make_int_sequence<Tr::kOChunks>{}, [&](auto c) {
      constexpr int kC = decltype(c)::value;
      auto& done = [&]() -> auto& { if constexpr (kC % 2 == 0) return fresh0; else return fresh1; }();
      auto& next = [&]() -> auto& { if constexpr (kC % 2 == 0) return fresh1; else return fresh0; }();
      if constexpr (kC + 1 < Tr::kOChunks) {
        gemm_async<true>(fr.mma_o, fr.tOrP, v_chunk(tOrV, kC + 1, stage), next);
        warpgroup_wait<1>();  // chunk kC is in; kC + 1 still running
      } else {
        warpgroup_wait<0>();
      }
      warpgroup_fence_operand(done);
      Tensor oc = o_chunk(tOrO, kC);
      add_fresh(oc, done, fd);
    });
  }

  // Step for block n: S_n = Q K_n^T and the fresh accumulator of P_{n+1} V_{n+1}.
  //  One O chunk (d_v <= 64): issued together, the softmax of S_n runs under the P.V WGMMA, as in
  //  C::step; then O = O * rescale(n+1) + fresh (in O's unit, Fold), rescale(n) left pending.
  //  Several chunks (Tr::kOChunks > 1: d_v > 128, or 128 on 128-key blocks, where O and the fresh
  //  accumulator leave no room for S): P_{n+1} V_{n+1} first, chunk by chunk (pv_chunks, applying
  //  the rescale left pending by the previous softmax), then S_n and its softmax, whose rescale
  //  stays pending. No softmax/P.V overlap inside the warpgroup; the other warpgroup's softmax
  //  still runs under these GEMMs through pingpong.
  template <Masking kMask, class TensorO, class TQ, class TK, class TV, class TensorCS, class F>
  static __device__ __forceinline__ void step(typename Tr::KernelParams const& params, SharedStorage& smem,
                                              PipelineKV& pipe_k, PipelineV& pipe_v, PipelineState& state_k,
                                              PipelineStateV& state_v, const WorkTile& w, int n, int consumer,
                                              TQ const& tSrQ, TK const& tSrK, TV const& tOrV,
                                              TensorCS const& tScS_rc, TensorO& tOrO, F& fr) {
    using namespace cute;
    Tensor tSrS = partition_fragment_C(fr.mma_s, Shape<typename Tr::BlkM, typename Tr::BlkN>{});
    const float v_descale_n = fr.v_next;
    fr.s_descale = fr.q_descale * fr.k_next;
    prefetch(params, fr, n - 1);
    // The rescale pending on O (before this softmax's), folded before the waits: off the
    // pingpong's critical path (its division was a top dependency stall there).
    const Fold fd = fold(fr, fr.scale_o);
    if constexpr (Tr::kOChunks > 1) {
      C::wait_full(smem.pipe_v, state_v, Wait::VFull, w.index);
      C::pingpong_wait(consumer, w.index);
      pv_chunks(tOrV, state_v.index(), tOrO, fr, fd);
      pipe_v.consumer_release(state_v);
      ++state_v;
      C::wait_full(smem.pipe_k, state_k, Wait::KFull, w.index);
    } else {
      C::wait_full(smem.pipe_k, state_k, Wait::KFull, w.index);
      C::pingpong_wait(consumer, w.index);
    }
    gemm_async<true>(fr.mma_s, tSrQ, tSrK(_, _, _, state_k.index()), tSrS);
    if constexpr (Tr::kOChunks == 1) {
      Tensor fresh = partition_fragment_C(fr.mma_o, Shape<typename Tr::BlkM, Int<Tr::kOChunkCols>>{});
      C::wait_full(smem.pipe_v, state_v, Wait::VFull, w.index);
      gemm_async<true>(fr.mma_o, fr.tOrP, tOrV(_, _, _, state_v.index()), fresh);
      C::pingpong_pass(consumer);
      warpgroup_wait<1>();  // S_n is ready; P.V still running
      pipe_k.consumer_release(state_k);
      ++state_k;
      C::template softmax_block<kMask, false>(params, tSrS, tScS_rc, w, n, fr);
      C::pin_before_wait(smem, fr);
      warpgroup_wait<0>();
      pipe_v.consumer_release(state_v);
      ++state_v;
      add_fresh(tOrO, fresh, fd);
    } else {
      // (P_{n+1} V_{n+1} was issued above, before S_n: see the comment of this function.)
      C::pingpong_pass(consumer);
      warpgroup_wait<0>();
      pipe_k.consumer_release(state_k);
      ++state_k;
      C::template softmax_block<kMask, false>(params, tSrS, tScS_rc, w, n, fr);
    }
    C::store_p(tSrS, fr);
    fr.v_descale_p = v_descale_n;
  }

  // The tile's last P.V (block `begin`), added with the last pending rescale.
  template <class TensorO, class TV, class F>
  static __device__ __forceinline__ void last_pv(SharedStorage& smem, PipelineV& pipe_v, PipelineStateV& state_v,
                                                 const WorkTile& w, int consumer, TV const& tOrV, TensorO& tOrO,
                                                 F& fr, float (&inv_sum)[kRows], float (&lse)[kRows]) {
    using namespace cute;
    Tensor fresh = partition_fragment_C(fr.mma_o, Shape<typename Tr::BlkM, Int<Tr::kOChunkCols>>{});
    const Fold fd = fold(fr, fr.scale_o);
    C::wait_full(smem.pipe_v, state_v, Wait::VFull, w.index);
    C::pingpong_wait(consumer, w.index);
    if constexpr (Tr::kOChunks == 1) {
      gemm_async<true>(fr.mma_o, fr.tOrP, v_chunk(tOrV, 0, state_v.index()), fresh);
      C::pingpong_pass(consumer);
      fr.softmax.finalize(inv_sum, lse);  // under the WGMMA
      warpgroup_wait<0>();
      add_fresh(tOrO, fresh, fd);
    } else {
      pv_chunks(tOrV, state_v.index(), tOrO, fr, fd);
      C::pingpong_pass(consumer);
      fr.softmax.finalize(inv_sum, lse);
    }
    pipe_v.consumer_release(state_v);
    ++state_v;
  }

  // The tile's end: the last P.V, the row sums, the per-channel v descale.
  template <class TensorO, class TV, class F>
  static __device__ __forceinline__ void finish(typename Tr::KernelParams const& params, SharedStorage& smem,
                                                PipelineV& pipe_v, PipelineStateV& state_v, const WorkTile& w,
                                                int consumer, TV const& tOrV, TensorO& tOrO, F& fr,
                                                float (&lse)[kRows]) {
    float inv_sum[kRows];
    last_pv(smem, pipe_v, state_v, w, consumer, tOrV, tOrO, fr, inv_sum, lse);
    CUTE_UNROLL
    for (int mi = 0; mi < kRows; ++mi) inv_sum[mi] *= fr.o_unit;  // O's unit (Fold)
    C::rescale_o(tOrO, inv_sum);
    scale_columns(params.p, w, tOrO);
  }
};

}  // namespace flash3
