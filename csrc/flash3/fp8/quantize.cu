// The fused rotate-and-quantize kernel of the FP8 path (semantics: quantize.h).
//
// One CTA per (token block, head, batch). A thread owns "units": the 8-channel chunks
// {j * p + 8 u .. + 7 : j < m} of one token (hadamard) or the chunk 8 u .. 8 u + 7 (no
// hadamard), loaded with 16-byte loads. The Walsh-Hadamard stages h = 1, 2, 4 run inside the
// thread, the stages h = 8 .. p / 2 with xor shuffles among the p / 8 threads of the token (always
// inside one warp), the Hartley mix of the m blocks inside the thread. A thread keeps up to
// quant_cache_iters units (64 floats) in registers; the CTA is sized so that a whole block usually
// fits, so x is read once; units beyond the cache (blocks larger than 512 threads x cache) are
// recomputed from x (an L2 hit) after the amax. amax: warp shuffles, then shared memory.
// Stores: rows layout 8 bytes per unit straight to global; the V-packed layout goes through a
// shared tile [token][d + 4 bytes], then 4 channels x 16 tokens per thread are transposed with
// byte permutes and written as 16-byte stores along the token axis.
//
// All fp32 arithmetic is explicit .rn PTX without .ftz: the build uses --use_fast_math (which
// would flush subnormals and approximate the division), and the reference (torch) does neither.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "flash3/common/fp32_rn.cuh"
#include "flash3/fp8/quantize.h"

namespace flash3 {
namespace {

__device__ __forceinline__ float max_nf(float a, float b) {  // NaN-ignoring, no ftz
  float r;
  asm("max.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
__device__ __forceinline__ float abs_nf(float a) {
  return __uint_as_float(__float_as_uint(a) & 0x7fffffffu);
}

// Two fp32 -> two e4m3 (round to nearest even, saturating to +-448): lo in byte 0, hi in byte 1.
__device__ __forceinline__ uint32_t e4m3x2(float lo, float hi) {
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
}

template <class T>
__device__ __forceinline__ void load8(const T* src, bool vec, float (&v)[8]) {
  if (vec) {
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(src));
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (std::is_same_v<T, __nv_bfloat16>) {
        v[2 * i] = __uint_as_float(w[i] << 16);
        v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
      } else {
        __half2 h2;
        *reinterpret_cast<uint32_t*>(&h2) = w[i];
        const float2 f = __half22float2(h2);
        v[2 * i] = f.x;
        v[2 * i + 1] = f.y;
      }
    }
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if constexpr (std::is_same_v<T, __nv_bfloat16>) v[i] = __bfloat162float(src[i]);
      else v[i] = __half2float(src[i]);
    }
  }
}

template <int M>
struct Unit {
  float v[M][8];
};

// Everything a thread needs to compute one unit.
struct Ctx {
  const QuantizeParams* p;
  const QuantizePlan* pl;
  const unsigned char* x;  // x at (b, t0, h), as bytes
  const float* mean;       // at (b, h) or nullptr
  const float* cdesc;      // at (b, h) or nullptr
  int U;                   // units per token
  uint64_t sign_bits;      // hadamard: bit 8 j + e set = flip channel j p + 8 u + e
};

// Load, rotate, smooth and scale the unit at `pos` of the block.
// valid == false: computes on zeros (the shuffles need the whole warp), touches no memory.
template <class T, int M, bool HAD>
__device__ __forceinline__ void compute_unit(const Ctx& c, const QuantUnitPos& pos, bool valid,
                                             Unit<M>& u) {
  const int chunk = pos.chunk;
  const int pstride = c.pl->p;
  const T* row = reinterpret_cast<const T*>(c.x) + pos.tok * c.p->x_row_stride;
#pragma unroll
  for (int j = 0; j < M; ++j) {
    if (valid) {
      load8<T>(row + j * pstride + kQuantVec * chunk, c.pl->vec_loads, u.v[j]);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) u.v[j][e] = 0.0f;
    }
  }
  if constexpr (HAD) {
#pragma unroll
    for (int j = 0; j < M; ++j) {
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const uint32_t flip = uint32_t(c.sign_bits >> (8 * j + e)) << 31;
        u.v[j][e] = __uint_as_float(__float_as_uint(u.v[j][e]) ^ flip);
      }
      // In-thread butterfly stages h = 1, 2, 4 (reference order: a + b at i, a - b at i + h).
#pragma unroll
      for (int h = 1; h < 8; h *= 2) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          if (i & h) continue;
          const float a = u.v[j][i], b = u.v[j][i + h];
          u.v[j][i] = add_rn(a, b);
          u.v[j][i + h] = sub_rn(a, b);
        }
      }
    }
    // Stages h = 8 .. p / 2: the partner chunk is chunk ^ (h / 8), lane ^ (h / 8) of this warp.
    for (int s = 1; s < c.U; s *= 2) {
      const bool upper = chunk & s;
#pragma unroll
      for (int j = 0; j < M; ++j) {
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const float o = __shfl_xor_sync(0xffffffffu, u.v[j][e], s);
          u.v[j][e] = upper ? sub_rn(o, u.v[j][e]) : add_rn(u.v[j][e], o);
        }
      }
    }
    const float hs = c.pl->hadamard_scale;
#pragma unroll
    for (int j = 0; j < M; ++j)
#pragma unroll
      for (int e = 0; e < 8; ++e) u.v[j][e] = mul_rn(u.v[j][e], hs);
    if constexpr (M > 1) {
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        float y[M];
#pragma unroll
        for (int j = 0; j < M; ++j) y[j] = u.v[j][e];
#pragma unroll
        for (int a = 0; a < M; ++a) {
          float acc = mul_rn(c.pl->hartley[a * M], y[0]);
#pragma unroll
          for (int b = 1; b < M; ++b) acc = fma_rn(c.pl->hartley[a * M + b], y[b], acc);
          u.v[a][e] = acc;
        }
      }
    }
  }
  if (c.mean != nullptr && valid) {
#pragma unroll
    for (int j = 0; j < M; ++j)
#pragma unroll
      for (int e = 0; e < 8; ++e)
        u.v[j][e] = sub_rn(u.v[j][e], __ldg(c.mean + j * pstride + kQuantVec * chunk + e));
  }
  if (c.cdesc != nullptr && valid) {
#pragma unroll
    for (int j = 0; j < M; ++j)
#pragma unroll
      for (int e = 0; e < 8; ++e)
        u.v[j][e] = div_rn(u.v[j][e], __ldg(c.cdesc + j * pstride + kQuantVec * chunk + e));
  }
}

template <int M>
__device__ __forceinline__ float unit_amax(const Unit<M>& u, float m) {
#pragma unroll
  for (int j = 0; j < M; ++j)
#pragma unroll
    for (int e = 0; e < 8; ++e) m = max_nf(m, abs_nf(u.v[j][e]));
  return m;
}

// Quantize the unit at `pos` and store it: rows layout straight to global, V-packed into the
// smem tile (whose blocks are small: pos.tok < 102400 / (d + 4) there).
template <int M, int LAYOUT>
__device__ __forceinline__ void store_unit(const Ctx& c, const QuantUnitPos& pos, const Unit<M>& u,
                                           float descale, unsigned char* out_rows,
                                           unsigned char* tile) {
  const int64_t tok = pos.tok;
  const int chunk = pos.chunk;
#pragma unroll
  for (int j = 0; j < M; ++j) {
    uint32_t w[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const float* v = &u.v[j][4 * k];
      w[k] = e4m3x2(div_rn(v[0], descale), div_rn(v[1], descale)) |
             (e4m3x2(div_rn(v[2], descale), div_rn(v[3], descale)) << 16);
    }
    const int ch = j * c.pl->p + kQuantVec * chunk;
    if constexpr (LAYOUT == kQuantLayoutRows) {
      const int64_t off = tok * c.p->heads * c.p->d + ch;
      *reinterpret_cast<uint2*>(out_rows + off) = make_uint2(w[0], w[1]);
    } else {
      uint32_t* dst = reinterpret_cast<uint32_t*>(tile + int(tok) * c.pl->smem_row_bytes + ch);
      dst[0] = w[0];
      dst[1] = w[1];
    }
  }
}

template <class T, int M, bool HAD, int LAYOUT>
__global__ void __launch_bounds__(quant_max_threads(M))
    quantize_fp8_kernel(const __grid_constant__ QuantizeParams p,
                        const __grid_constant__ QuantizePlan pl) {
  constexpr int CI = quant_cache_iters(M);
  extern __shared__ __align__(16) unsigned char tile[];
  __shared__ float warp_max[kQuantMaxThreads / 32];

  const int blk = blockIdx.x, hi = blockIdx.y, bi = blockIdx.z;
  const int t0 = blk * p.block_size;
  const int ntok = min(p.block_size, p.seqlen - t0);
  const int U = pl.units_per_row;
  const int NT = blockDim.x;
  const int tid = threadIdx.x;
  const int n_iter = quant_iters(ntok, U, NT);
  const int step_tok = NT / U, step_chunk = NT % U;  // iteration stride in (token, chunk)
  const QuantUnitPos first = quant_unit_first(tid, U);

  Ctx c;
  c.p = &p;
  c.pl = &pl;
  c.U = U;
  c.x = reinterpret_cast<const unsigned char*>(p.x) +
        (int64_t(bi) * p.x_batch_stride + int64_t(t0) * p.x_row_stride +
         int64_t(hi) * p.x_head_stride) * int64_t(sizeof(T));
  c.mean = p.mean != nullptr ? p.mean + bi * p.mean_batch_stride + hi * p.mean_head_stride : nullptr;
  c.cdesc = p.channel_descale != nullptr
                ? p.channel_descale + bi * p.cd_batch_stride + hi * p.cd_head_stride
                : nullptr;
  c.sign_bits = 0;
  if constexpr (HAD) {
    const int chunk = tid % U;  // the same chunk in every iteration (NT % U == 0)
#pragma unroll
    for (int j = 0; j < M; ++j)
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const uint32_t bits = __float_as_uint(__ldg(p.signs + j * pl.p + kQuantVec * chunk + e));
        c.sign_bits |= uint64_t(bits >> 31) << (8 * j + e);
      }
  }

  // Pass 1: compute every unit (the first CI iterations stay in registers), block amax.
  Unit<M> cache[CI];
  float amax = 0.0f;
  QuantUnitPos pos = first;
#pragma unroll
  for (int it = 0; it < CI; ++it) {
    if (it < n_iter) {
      const bool valid = pos.tok < ntok;
      compute_unit<T, M, HAD>(c, pos, valid, cache[it]);
      if (valid) amax = unit_amax(cache[it], amax);
      quant_unit_next(pos, step_tok, step_chunk, U);
    }
  }
  for (int it = CI; it < n_iter; ++it) {
    const bool valid = pos.tok < ntok;
    Unit<M> u;
    compute_unit<T, M, HAD>(c, pos, valid, u);
    if (valid) amax = unit_amax(u, amax);
    quant_unit_next(pos, step_tok, step_chunk, U);
  }
#pragma unroll
  for (int s = 16; s > 0; s /= 2) amax = max_nf(amax, __shfl_xor_sync(0xffffffffu, amax, s));
  if (tid % 32 == 0) warp_max[tid / 32] = amax;
  __syncthreads();
  amax = warp_max[0];
  for (int w = 1; w < NT / 32; ++w) amax = max_nf(amax, warp_max[w]);
  // flash3.fp8._descale_from_amax: amax / 448, at least FLT_MIN, 1 for an all-zero block.
  float descale = max_nf(div_rn(amax, kFp8Max), 1.17549435082228750797e-38f);
  if (amax == 0.0f) descale = 1.0f;
  if (tid == 0) p.descale[(int64_t(bi) * p.heads + hi) * pl.num_blocks + blk] = descale;

  // Pass 2: quantize and store.
  unsigned char* out_rows = nullptr;
  if constexpr (LAYOUT == kQuantLayoutRows)
    out_rows = reinterpret_cast<unsigned char*>(p.out) +
               (int64_t(bi) * p.seqlen + t0) * p.heads * p.d + int64_t(hi) * p.d;
  pos = first;
#pragma unroll
  for (int it = 0; it < CI; ++it) {
    if (it < n_iter) {
      if (pos.tok < ntok) store_unit<M, LAYOUT>(c, pos, cache[it], descale, out_rows, tile);
      quant_unit_next(pos, step_tok, step_chunk, U);
    }
  }
  for (int it = CI; it < n_iter; ++it) {
    const bool valid = pos.tok < ntok;
    Unit<M> u;
    compute_unit<T, M, HAD>(c, pos, valid, u);
    if (valid) store_unit<M, LAYOUT>(c, pos, u, descale, out_rows, tile);
    quant_unit_next(pos, step_tok, step_chunk, U);
  }

  if constexpr (LAYOUT == kQuantLayoutVPacked) {
    // Tokens [ntok, ntile) of the tile are padding (only in the last block): zeros.
    const int ntile = int(min(int64_t(p.block_size), pl.s_pad - t0));
    const int row_words = pl.smem_row_bytes / 4;
    const int dw = p.d / 4;
    uint32_t* tile32 = reinterpret_cast<uint32_t*>(tile);
    for (int i = tid; i < (ntile - ntok) * dw; i += NT) {
      const int r = ntok + i / dw;
      tile32[r * row_words + i % dw] = 0u;
    }
    __syncthreads();
    // Item = (4 channels, 16 tokens); channel groups vary fastest (conflict-free smem reads).
    const int items = dw * (ntile / kVPackGroup);
    unsigned char* out_bh = reinterpret_cast<unsigned char*>(p.out) +
                            (int64_t(bi) * p.heads + hi) * p.d * pl.s_pad + t0;
    for (int item = tid; item < items; item += NT) {
      const int g = item / dw;
      const int cg = item - g * dw;
      uint32_t a[16];
#pragma unroll
      for (int i = 0; i < 16; ++i)
        a[i] = tile32[(kVPackGroup * g + vpack_token(i)) * row_words + cg];
      uint32_t o[4][4];  // o[channel][word]
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const uint32_t lo01 = __byte_perm(a[4 * q], a[4 * q + 1], 0x5140);
        const uint32_t hi01 = __byte_perm(a[4 * q], a[4 * q + 1], 0x7362);
        const uint32_t lo23 = __byte_perm(a[4 * q + 2], a[4 * q + 3], 0x5140);
        const uint32_t hi23 = __byte_perm(a[4 * q + 2], a[4 * q + 3], 0x7362);
        o[0][q] = __byte_perm(lo01, lo23, 0x5410);
        o[1][q] = __byte_perm(lo01, lo23, 0x7632);
        o[2][q] = __byte_perm(hi01, hi23, 0x5410);
        o[3][q] = __byte_perm(hi01, hi23, 0x7632);
      }
#pragma unroll
      for (int cc = 0; cc < 4; ++cc) {
        unsigned char* dst = out_bh + int64_t(4 * cg + cc) * pl.s_pad + kVPackGroup * g;
        *reinterpret_cast<uint4*>(dst) = make_uint4(o[cc][0], o[cc][1], o[cc][2], o[cc][3]);
      }
    }
  }
}

template <class T, int M, bool HAD, int LAYOUT>
int launch(const QuantizeParams& p, const QuantizePlan& pl, cudaStream_t stream) {
  auto kernel = quantize_fp8_kernel<T, M, HAD, LAYOUT>;
  if (pl.smem_bytes > 48 * 1024) {
    const cudaError_t e =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, pl.smem_bytes);
    if (e != cudaSuccess) return int(e);
  }
  const dim3 grid(unsigned(pl.num_blocks), unsigned(p.heads), unsigned(p.batch));
  kernel<<<grid, pl.threads, pl.smem_bytes, stream>>>(p, pl);
  return int(cudaGetLastError());
}

template <class T, int M, bool HAD>
int launch_layout(const QuantizeParams& p, const QuantizePlan& pl, cudaStream_t stream) {
  return p.layout == kQuantLayoutVPacked ? launch<T, M, HAD, kQuantLayoutVPacked>(p, pl, stream)
                                         : launch<T, M, HAD, kQuantLayoutRows>(p, pl, stream);
}

template <class T>
int launch_dtype(const QuantizeParams& p, const QuantizePlan& pl, cudaStream_t stream) {
  if (p.signs == nullptr) return launch_layout<T, 1, false>(p, pl, stream);
  switch (pl.m) {
    case 1: return launch_layout<T, 1, true>(p, pl, stream);
    case 3: return launch_layout<T, 3, true>(p, pl, stream);
    case 5: return launch_layout<T, 5, true>(p, pl, stream);
    default: return int(cudaErrorInvalidValue);
  }
}

}  // namespace

int run_quantize_fp8(const QuantizeParams& params, void* stream) {
  const QuantizePlan pl = plan_quantize(params);
  if (pl.error != nullptr) return int(cudaErrorInvalidValue);
  if (params.batch == 0 || params.heads == 0 || pl.num_blocks == 0) return 0;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  return params.is_bf16 ? launch_dtype<__nv_bfloat16>(params, pl, s)
                        : launch_dtype<__half>(params, pl, s);
}

}  // namespace flash3
