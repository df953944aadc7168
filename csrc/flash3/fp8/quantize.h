// The fused rotate-and-quantize of the FP8 path: bf16/fp16 x (b, s, h, d) -> float8_e4m3fn plus
// one fp32 descale per block of `block_size` tokens of one (batch, head), in one pass.
// Plain C++ (no torch, no CUDA headers): the binding fills QuantizeParams, plan_quantize derives
// the launch, and tests/cpp/quantize_driver.cpp checks this logic on the CPU.
//
// Per element, in fp32, every step rounded to nearest with subnormals kept (as torch computes it):
//   1. optional incoherent processing y = (x * signs) T, flash3/hadamard.py's transform:
//      d = m * p (p the largest power of two dividing d, m odd), T = C_m (x) H_p: the normalized
//      Walsh-Hadamard butterfly (stages h = 1, 2, 4, ... in that order, a + b / a - b) on each
//      block of p channels, times (float)(1 / sqrt(p)), then the m-point normalized Hartley mix of
//      the m blocks (fma chain over the blocks in order; the reference's matmul may sum in another
//      order, so m > 1 can differ from it by an fp32 ulp before quantization);
//   2. optional y -= mean[b, h, c]              (K smoothing; mean is taken after the rotation);
//   3. optional y /= channel_descale[b, h, c]   (V per-channel scaling);
//   4. descale = amax(|y| over the block) / 448, clamped to >= FLT_MIN, 1 for an all-zero block
//      (flash3.fp8._descale_from_amax); q = e4m3_rn_satfinite(y / descale).
// Output layouts: kQuantLayoutRows: (b, s, h, d) contiguous; kQuantLayoutVPacked: (b, h, d, s_pad)
// contiguous, s_pad = ceil(s / 16) * 16, vt[b, h, c, 16 g + i] = v[b, 16 g + kVPerm16[i], h, c],
// padding tokens 0 (the operand order of the FP8 attention kernel's P.V WGMMA).
// descale: (b, h, ceil(s / block_size)) fp32 contiguous.
// Non-finite input: no crash, no trap; the outputs are then unspecified (the Python wrapper's
// contract is finite input; nothing is checked on the host, so the op is graph-capturable).
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define FLASH3_QUANT_HD __host__ __device__
#else
#define FLASH3_QUANT_HD
#endif

namespace flash3 {

constexpr int kQuantLayoutRows = 0;
constexpr int kQuantLayoutVPacked = 1;
constexpr int kQuantMaxHeadDim = 256;
constexpr int kQuantVec = 8;             // channels per 16-byte load of bf16/fp16
constexpr int kQuantMaxThreads = 512;    // CTA size cap (the kernel's __launch_bounds__)
constexpr int kQuantMaxHartley = 5;      // largest odd factor m of d supported with hadamard
constexpr int kVPackGroup = 16;
constexpr int kVPackMaxSmemBytes = 100 * 1024;  // the V-packed transpose tile of one block
constexpr float kFp8Max = 448.0f;

// Position i of every aligned group of 16 tokens holds token kVPerm16[i] (flash3.fp8.V_PERM16).
constexpr int kVPerm16[16] = {0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15};

// kVPerm16[i] as a function (usable in device code).
FLASH3_QUANT_HD constexpr int vpack_token(int i) {
  return ((i >> 1) & 1) * 8 + (i >> 2) * 2 + (i & 1);
}

// The inverse: token j of a group is stored at position vpack_position(j).
FLASH3_QUANT_HD constexpr int vpack_position(int j) {
  return ((j & 7) >> 1) * 4 + (j >> 3) * 2 + (j & 1);
}

// Element offset of (batch bi, head hi, channel c, token t) in the V-packed output.
FLASH3_QUANT_HD inline int64_t vpack_offset(int64_t bi, int64_t hi, int64_t c, int64_t t,
                                            int64_t heads, int64_t d, int64_t s_pad) {
  const int64_t pos = (t / kVPackGroup) * kVPackGroup + vpack_position(int(t % kVPackGroup));
  return ((bi * heads + hi) * d + c) * s_pad + pos;
}

FLASH3_QUANT_HD constexpr int64_t vpack_seqlen(int64_t s) {
  return (s + kVPackGroup - 1) / kVPackGroup * kVPackGroup;
}

// Register-cached iterations of one thread for a unit of `chunks` x 8 channels (<= 64 floats).
FLASH3_QUANT_HD constexpr int quant_cache_iters(int chunks) {
  return chunks == 1 ? 8 : 1;
}

// CTA size cap (the kernel's __launch_bounds__): m = 5 units need more than 128 registers.
FLASH3_QUANT_HD constexpr int quant_max_threads(int chunks) {
  return chunks >= 5 ? 256 : kQuantMaxThreads;
}

// A thread's units of one block: idx = it * threads + tid, token idx / U, chunk idx % U. With one
// block per head, ntok * U = s * d / 8 may pass 2^31, so idx is never formed: the position is kept
// as (64-bit token, chunk) and stepped by `threads` (no division in the loop).
struct QuantUnitPos {
  int64_t tok;
  int chunk;
};

FLASH3_QUANT_HD inline QuantUnitPos quant_unit_first(int tid, int units_per_row) {
  return {tid / units_per_row, tid % units_per_row};
}

// Advances by threads = step_tok * units_per_row + step_chunk units.
FLASH3_QUANT_HD inline void quant_unit_next(QuantUnitPos& u, int step_tok, int step_chunk,
                                            int units_per_row) {
  u.tok += step_tok;
  u.chunk += step_chunk;
  if (u.chunk >= units_per_row) {
    u.chunk -= units_per_row;
    ++u.tok;
  }
}

// Iterations covering ntok * units_per_row units; < 2^31 since units_per_row <= 32 <= threads.
FLASH3_QUANT_HD inline int quant_iters(int ntok, int units_per_row, int threads) {
  return int((int64_t(ntok) * units_per_row + threads - 1) / threads);
}

struct QuantizeParams {
  // x (b, s, h, d) bf16/fp16, element strides; the channel stride is 1.
  const void* x;
  int64_t x_batch_stride, x_row_stride, x_head_stride;
  // (d,) fp32 +-1 (only the sign bit is used), nullptr = no rotation.
  const float* signs;
  // (b, h, d) fp32 with contiguous channels, element strides; nullptr = not applied.
  const float* mean;
  int64_t mean_batch_stride, mean_head_stride;
  const float* channel_descale;
  int64_t cd_batch_stride, cd_head_stride;
  // Outputs (contiguous): e4m3 bytes in `layout`, descale (b, h, num_blocks).
  void* out;
  float* descale;
  int batch, seqlen, heads, d;
  int block_size;
  int layout;
  bool is_bf16;
};

// What the kernel needs beyond the params; plan_quantize fills it (error == nullptr) or says why
// the arguments are not supported (error != nullptr, the rest unspecified).
struct QuantizePlan {
  const char* error;
  int m, p;                 // d = m * p (hadamard) ; m = 1, p = d without
  int units_per_row;        // threads that share one token: p / 8 (hadamard) or d / 8
  int unit_chunks;          // 8-channel chunks per thread and token: m (hadamard) or 1
  int cache_iters;          // quant_cache_iters(unit_chunks)
  int threads;              // CTA size: a multiple of 32 (and of units_per_row), <= 512 (256 for m = 5)
  int num_blocks;           // ceil(s / block_size): grid.x; grid.y = heads, grid.z = batch
  int64_t s_pad;            // V-packed token count (layout 1), else s
  int smem_row_bytes;       // V-packed transpose tile: d + 4 bytes per token
  int smem_bytes;           // dynamic shared memory (layout 1 only)
  bool vec_loads;           // x 16-byte aligned with strides multiple of 8 elements
  float hadamard_scale;     // (float)(1 / sqrt(p))
  float hartley[kQuantMaxHartley * kQuantMaxHartley];  // C_m row-major, (float) of the fp64 value
};

// d = m * p with p = 2^k the largest power of two dividing d (flash3.hadamard.block_structure).
inline void quant_block_structure(int d, int* m, int* p) {
  const int pp = d & (-d);
  *p = pp;
  *m = d / pp;
}

// C[a][b] = (cos(2 pi ab / m) + sin(2 pi ab / m)) / sqrt(m), computed in double with a*b reduced
// mod m first (flash3.hadamard._hartley_cpu), then rounded to float.
inline void quant_hartley(int m, float* out) {
  const double two_pi = 6.283185307179586476925286766559;
  for (int a = 0; a < m; ++a)
    for (int b = 0; b < m; ++b) {
      const double ang = (two_pi / m) * double((a * b) % m);
      out[a * m + b] = float((std::cos(ang) + std::sin(ang)) / std::sqrt(double(m)));
    }
}

inline int quant_round_up(int v, int mult) { return (v + mult - 1) / mult * mult; }

inline QuantizePlan plan_quantize(const QuantizeParams& p) {
  const uintptr_t x_address = reinterpret_cast<uintptr_t>(p.x);
  QuantizePlan pl{};
  pl.error = nullptr;
  const bool had = p.signs != nullptr;
  if (p.d < kQuantVec || p.d > kQuantMaxHeadDim || p.d % kQuantVec != 0) {
    pl.error = "head dim must be a multiple of 8 in [8, 256]";
    return pl;
  }
  if (p.block_size <= 0) {
    pl.error = "block_size must be positive";
    return pl;
  }
  if (p.batch < 0 || p.seqlen < 0 || p.heads < 0 || p.batch > 65535 || p.heads > 65535) {
    pl.error = "batch and heads must be in [0, 65535], seqlen >= 0";
    return pl;
  }
  if (p.layout != kQuantLayoutRows && p.layout != kQuantLayoutVPacked) {
    pl.error = "layout must be 0 (rows) or 1 (v_packed)";
    return pl;
  }
  if (had) {
    quant_block_structure(p.d, &pl.m, &pl.p);
    if (pl.m != 1 && pl.m != 3 && pl.m != 5) {
      pl.error = "hadamard needs head dim = m * 2^k with m in {1, 3, 5} and 2^k >= 8 "
                 "(e.g. 64, 80, 96, 128, 160, 192, 256)";
      return pl;
    }
    if (pl.p < kQuantVec) {
      pl.error = "hadamard needs head dim = m * 2^k with 2^k >= 8";
      return pl;
    }
    pl.units_per_row = pl.p / kQuantVec;  // a power of two <= 32: a row never spans warps
    pl.unit_chunks = pl.m;
    pl.hadamard_scale = float(1.0 / std::sqrt(double(pl.p)));
    quant_hartley(pl.m, pl.hartley);
  } else {
    pl.m = 1;
    pl.p = p.d;
    pl.units_per_row = p.d / kQuantVec;
    pl.unit_chunks = 1;
    pl.hadamard_scale = 1.0f;
    pl.hartley[0] = 1.0f;
  }
  pl.cache_iters = quant_cache_iters(pl.unit_chunks);
  const int64_t s = p.seqlen;
  const int64_t nb = (s + p.block_size - 1) / p.block_size;
  if (nb > 2147483647LL) {
    pl.error = "too many blocks";
    return pl;
  }
  pl.num_blocks = int(nb);
  // Enough threads to keep a whole block in registers (cache_iters units each), up to 512.
  const int64_t tok = s < p.block_size ? s : p.block_size;
  const int64_t units = tok * pl.units_per_row;
  int64_t want = (units + pl.cache_iters - 1) / pl.cache_iters;
  const int max_threads = quant_max_threads(pl.unit_chunks);
  if (want > max_threads) want = max_threads;
  pl.threads = quant_round_up(int(want < 32 ? 32 : want), 32);
  pl.s_pad = p.layout == kQuantLayoutVPacked ? vpack_seqlen(s) : s;
  pl.smem_row_bytes = 0;
  pl.smem_bytes = 0;
  if (p.layout == kQuantLayoutVPacked) {
    if (p.block_size % kVPackGroup != 0) {
      pl.error = "layout v_packed needs block_size to be a multiple of 16";
      return pl;
    }
    pl.smem_row_bytes = p.d + 4;
    const int64_t rows = vpack_seqlen(tok);
    const int64_t bytes = rows * pl.smem_row_bytes;
    if (bytes > kVPackMaxSmemBytes) {
      pl.error = "layout v_packed needs block_size * (head dim + 4) <= 102400 bytes";
      return pl;
    }
    pl.smem_bytes = int(bytes);
  }
  pl.vec_loads = (x_address % 16 == 0) && p.x_batch_stride % kQuantVec == 0 &&
                 p.x_row_stride % kQuantVec == 0 && p.x_head_stride % kQuantVec == 0;
  return pl;
}

// Launches the kernel on `stream` (a cudaStream_t); nothing when s, b or h is 0. Returns 0 or a
// cudaError_t value (an unsupported shape: cudaErrorInvalidValue; the binding checks
// plan_quantize first and reports its message).
int run_quantize_fp8(const QuantizeParams& params, void* stream);

}  // namespace flash3
