// Warpgroup MMA (wgmma.mma_async) and ldmatrix/stmatrix, following the PTX ISA:
//  - 9.7.15.5.1.2.2 "Matrix Descriptor Format" (descriptor bits, base offset),
//  - 9.7.15.5.1.2   "Shared Memory Matrix Layout" (swizzle atoms per mode and major-ness, Table 38
//    and the example figures) with the LBO/SBO definitions of the "strides" subsection,
//  - 9.7.15.5.1.1   "Register Fragments" (A in registers, accumulator D),
//  - 9.7.14.5.15/16 ldmatrix / stmatrix (m8n8 fragment layout).
// Layout summary, in 16-byte chunks ("core matrix rows"), elem = element bytes:
//  K-major,  no swizzle : core matrix = 8 MN rows x 16 B, contiguous (row stride 16 B);
//                         next 16 B of K at +LBO, next 8 MN rows at +SBO.
//  K-major,  swizzle S  : atom = 8 MN rows x S bytes of K (row stride S), the instruction's 32 B of
//                         K lie inside one row; next 8 MN rows at +SBO; LBO unused.
//  MN-major, no swizzle : core matrix = 8 K rows x 16 B of MN (row stride 16 B); next 16 B of MN at
//                         +SBO, next 8 K at +LBO.
//  MN-major, swizzle S  : atom = 8 K rows x S bytes of MN (row stride S); next S bytes of MN at +LBO,
//                         next 8 K at +SBO.
//  Swizzle S (32/64/128): on the final shared address, bits [4,4+b) ^= phase where
//                         phase = ((addr >> 7) - base_offset) mod 2^b, b = 1/2/3. With base_offset
//                         0 this is the plain absolute-address XOR; base_offset re-phases a pattern
//                         whose repeat does not start at a 256/512/1024-byte boundary (the ISA gives
//                         base_offset = (pattern_start >> 7) & 7, so subtracting it makes the phase
//                         count rows from the pattern start). Ignored when not swizzled (ISA).
#include "tensor_core.h"

#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>

namespace hsim::tc {

namespace {

// ---- private exact decoders (kept local so this file builds on its own) ----
float dec_f16(uint16_t h) {
  // Bit-level widening (exact): normals/inf/NaN re-bias the exponent, subnormals are m * 2^-24.
  const uint32_t sgn = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t e = (h >> 10) & 0x1F, m = h & 0x3FF;
  if (e == 0) {
    float v = static_cast<float>(m) * 5.9604644775390625e-8f;  // 2^-24
    return sgn ? -v : v;
  }
  uint32_t u = sgn | (e == 31 ? 0xFFu << 23 : (e + 112) << 23) | (m << 13);
  float v;
  std::memcpy(&v, &u, 4);
  return v;
}
float dec_bf16(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
float dec_e4m3(uint8_t x) {  // bias 7, no infinities, S.1111.111 is NaN
  int s = x >> 7, e = (x >> 3) & 0xF, m = x & 7;
  float v;
  if (e == 15 && m == 7) return NAN;
  if (e == 0) v = std::ldexp(static_cast<float>(m), -9);
  else v = std::ldexp(static_cast<float>(m | 8), e - 10);
  return s ? -v : v;
}
float dec_e5m2(uint8_t x) {  // bias 15, IEEE-like
  int s = x >> 7, e = (x >> 2) & 0x1F, m = x & 3;
  float v;
  if (e == 31) v = m ? NAN : INFINITY;
  else if (e == 0) v = std::ldexp(static_cast<float>(m), -16);
  else v = std::ldexp(static_cast<float>(m | 4), e - 17);
  return s ? -v : v;
}
// 256-entry tables for the 8-bit float formats (built once, thread-safe static init).
struct Fp8Tables {
  float e4m3[256], e5m2[256];
  Fp8Tables() {
    for (int i = 0; i < 256; ++i) { e4m3[i] = dec_e4m3(i); e5m2[i] = dec_e5m2(i); }
  }
};
const Fp8Tables& fp8() {
  static const Fp8Tables t;
  return t;
}
float dec_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// double -> f16 bits, round to nearest even (one rounding straight from the double sum).
uint16_t f64_to_f16_rn(double x) {
  if (std::isnan(x)) return 0x7FFF;  // canonical NaN
  uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  double a = std::fabs(x);
  if (a == 0) return sign;
  if (std::isinf(a)) return sign | 0x7C00;
  int e;
  std::frexp(a, &e);  // a = f * 2^e, f in [0.5, 1)
  // Quantum of the f16 grid at this magnitude: 2^(e-11) for normals, 2^-24 for subnormals.
  int q = e - 11;
  if (q < -24) q = -24;
  double scaled = std::ldexp(a, -q);  // exact (power-of-two scaling, no under/overflow here)
  double r = std::nearbyint(scaled);  // default rounding mode: nearest even
  double v = std::ldexp(r, q);
  if (v > 65504.0) return sign | 0x7C00;
  // Re-encode v (exactly representable in f16 now).
  if (v < std::ldexp(1.0, -14)) return sign | static_cast<uint16_t>(std::ldexp(v, 24));
  int ev;
  double fv = std::frexp(v, &ev);  // v = fv * 2^ev
  int exp_field = ev - 1 + 15;
  uint16_t mant = static_cast<uint16_t>(std::ldexp(fv, 11)) & 0x3FF;
  return sign | static_cast<uint16_t>(exp_field << 10) | mant;
}

uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

bool is_16bit(EType t) { return t == EType::kF16 || t == EType::kBF16; }
bool is_fp8(EType t) { return t == EType::kE4M3 || t == EType::kE5M2; }
bool is_int8(EType t) { return t == EType::kS8 || t == EType::kU8; }

// Decodes one element of type t from its raw little-endian bits. tf32: the low 13 bits are not
// part of the format and are ignored (our choice; the ISA only defines the 19 upper bits).
double decode(EType t, uint32_t raw) {
  switch (t) {
    case EType::kF16: return dec_f16(static_cast<uint16_t>(raw));
    case EType::kBF16: return dec_bf16(static_cast<uint16_t>(raw));
    case EType::kTF32: return dec_f32(raw & 0xFFFFE000u);
    case EType::kE4M3: return dec_e4m3(static_cast<uint8_t>(raw));
    case EType::kE5M2: return dec_e5m2(static_cast<uint8_t>(raw));
    case EType::kF32: return dec_f32(raw);
    case EType::kS8: return static_cast<int8_t>(raw);
    case EType::kU8: return static_cast<uint8_t>(raw);
    case EType::kS32: return static_cast<int32_t>(raw);
  }
  return 0;
}

const char* tname(EType t) {
  switch (t) {
    case EType::kF16: return "f16";
    case EType::kBF16: return "bf16";
    case EType::kTF32: return "tf32";
    case EType::kE4M3: return "e4m3";
    case EType::kE5M2: return "e5m2";
    case EType::kF32: return "f32";
    case EType::kS8: return "s8";
    case EType::kU8: return "u8";
    case EType::kS32: return "s32";
  }
  return "?";
}

void set_err(std::string* err, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
void set_err(std::string* err, const char* fmt, ...) {
  if (!err) return;
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  *err = buf;
}

// Checks the shape/type combination against the ISA's wgmma.mma_async syntax tables.
bool check_shape(const Wgmma& w, std::string* err) {
  if (w.m != 64) { set_err(err, "wgmma: m must be 64 (got %d)", w.m); return false; }
  if (w.n < 8 || w.n > 256 || w.n % 8) { set_err(err, "wgmma: bad n %d", w.n); return false; }
  bool ok = false;
  int want_k = 0;
  if (is_16bit(w.a)) {
    want_k = 16;
    ok = w.b == w.a && (w.d == EType::kF32 || (w.a == EType::kF16 && w.d == EType::kF16));
  } else if (w.a == EType::kTF32) {
    want_k = 8;
    ok = w.b == EType::kTF32 && w.d == EType::kF32;
  } else if (is_fp8(w.a)) {
    want_k = 32;
    ok = is_fp8(w.b) && (w.d == EType::kF32 || w.d == EType::kF16);
  } else if (is_int8(w.a)) {
    want_k = 32;
    ok = is_int8(w.b) && w.d == EType::kS32;
    // Integer shapes: n = 8, 16, 24, 32, then multiples of 16 up to 256.
    if (ok && w.n > 32 && w.n % 16) {
      set_err(err, "wgmma: n %d not a valid integer wgmma shape", w.n);
      return false;
    }
  }
  if (!ok) {
    set_err(err, "wgmma: unsupported type combination d=%s a=%s b=%s", tname(w.d), tname(w.a),
            tname(w.b));
    return false;
  }
  if (w.k != want_k) { set_err(err, "wgmma: k must be %d for .%s (got %d)", want_k, tname(w.a), w.k); return false; }
  // Transposed (MN-major) shared operands exist only for the 16-bit types (imm-trans-a/-b).
  if (!is_16bit(w.a) && ((!w.a_regs && !w.a_k_major) || !w.b_k_major)) {
    set_err(err, "wgmma: imm-trans must be 0 for .%s", tname(w.a));
    return false;
  }
  if ((w.scale_a != 1 && w.scale_a != -1) || (w.scale_b != 1 && w.scale_b != -1)) {
    set_err(err, "wgmma: imm-scale must be 1 or -1");
    return false;
  }
  return true;
}

// Largest operands: A 64 x 32 (8-bit), B 256 x 32 (8-bit). Per-thread scratch so the interpreter
// may run CTAs on several host threads; no allocation per call.
struct Scratch {
  double a[64 * 32];        // a[m * K + k]
  double bt[32 * 256];      // bt[k * N + n]: row k contiguous over n for the inner loop
  double out[64 * 256];     // out[m * N + n]: the K-sums
};
thread_local Scratch g_scratch;

// Decodes n consecutive little-endian elements of type t starting at p into dst[i * stride].
void decode_run(EType t, const uint8_t* p, int n, double* dst, int stride, double scale) {
  switch (t) {
    case EType::kF16:
      for (int i = 0; i < n; ++i) dst[i * stride] = scale * dec_f16(static_cast<uint16_t>(p[2 * i] | (p[2 * i + 1] << 8)));
      break;
    case EType::kBF16:
      for (int i = 0; i < n; ++i) dst[i * stride] = scale * dec_bf16(static_cast<uint16_t>(p[2 * i] | (p[2 * i + 1] << 8)));
      break;
    case EType::kTF32:
      for (int i = 0; i < n; ++i) {
        uint32_t u;
        std::memcpy(&u, p + 4 * i, 4);
        dst[i * stride] = scale * decode(t, u);
      }
      break;
    case EType::kE4M3:
      for (int i = 0; i < n; ++i) dst[i * stride] = scale * fp8().e4m3[p[i]];
      break;
    case EType::kE5M2:
      for (int i = 0; i < n; ++i) dst[i * stride] = scale * fp8().e5m2[p[i]];
      break;
    case EType::kS8:
      for (int i = 0; i < n; ++i) dst[i * stride] = scale * static_cast<int8_t>(p[i]);
      break;
    case EType::kU8:
      for (int i = 0; i < n; ++i) dst[i * stride] = scale * p[i];
      break;
    default:
      break;
  }
}

// Reads one shared-memory operand (A: mn_count = 64, B: mn_count = N) into dst[mn*stride_mn +
// k*stride_k], checking every byte. Works in 16-byte chunks: a chunk is contiguous in every
// canonical layout (swizzling permutes whole 16-byte chunks), along K for K-major operands and
// along MN for MN-major ones.
bool load_operand(const char* which, uint64_t desc_bits, int mn_count, int K, EType t, bool k_major,
                  const Smem& smem, double* dst, int stride_mn, int stride_k, double scale,
                  std::string* err) {
  const Desc d = decode_desc(desc_bits);
  const int bits = ebits(t), eb = bits / 8, per = 16 / eb;
  const bool is_a = which[0] == 'A';
  const int outer = k_major ? mn_count : K, inner = k_major ? K / per : mn_count / per;
  for (int o = 0; o < outer; ++o) {
    for (int c = 0; c < inner; ++c) {
      const int mn0 = k_major ? o : c * per, k0 = k_major ? c * per : o;
      const uint32_t a = element_addr(d, mn0, k0, bits, k_major);
      // Reports element e of this chunk (the first offending byte's element).
      auto elem = [&](int e, int* mn, int* k) {
        *mn = k_major ? mn0 : mn0 + e;
        *k = k_major ? k0 + e : k0;
      };
      if (static_cast<uint64_t>(a) + 16 > smem.size) {
        int e = smem.size > a ? static_cast<int>((smem.size - a) / eb) : 0, mn, k;
        elem(e, &mn, &k);
        set_err(err, "wgmma: operand %s element (%s=%d,k=%d) at shared address 0x%x (+%d bytes) is "
                "outside shared memory of %u bytes", which, is_a ? "row" : "n", mn, k,
                a + static_cast<uint32_t>(e * eb), eb, smem.size);
        return false;
      }
      if (smem.shadow) {
        uint64_t s0, s1;
        std::memcpy(&s0, smem.shadow + a, 8);
        std::memcpy(&s1, smem.shadow + a + 8, 8);
        if (s0 | s1) {
          int i = 0;
          while (!smem.shadow[a + i]) ++i;
          int mn, k;
          elem(i / eb, &mn, &k);
          set_err(err, "wgmma: operand %s element (%s=%d,k=%d) reads shared address 0x%x whose shadow "
                  "is %u (not visible to the async proxy: missing fence / copy still in flight)",
                  which, is_a ? "row" : "n", mn, k, a + i, smem.shadow[a + i]);
          return false;
        }
      }
      decode_run(t, smem.bytes + a, per, dst + mn0 * stride_mn + k0 * stride_k,
                 k_major ? stride_k : stride_mn, scale);
    }
  }
  return true;
}

// A from registers (RS form): thread t = 32*w + lane holds 4 registers. Row/col per the ISA's
// register-fragment figures for m64nNk8 (tf32), m64nNk16 (16-bit) and m64nNk32 (8-bit):
// g = lane/4, c = lane%4, rows 16*w + g (+8), K split in halves/quarters as below.
void load_a_regs(const Wgmma& w, const uint32_t* frag, double* a, int K, double scale) {
  for (int t = 0; t < 128; ++t) {
    const int wr = t / 32, lane = t % 32, g = lane / 4, c = lane % 4;
    const uint32_t* r = frag + 4 * t;
    const int row0 = 16 * wr + g;
    if (w.a == EType::kTF32) {
      // a0:(g,c) a1:(g+8,c) a2:(g,c+4) a3:(g+8,c+4)
      for (int i = 0; i < 4; ++i)
        a[(row0 + 8 * (i % 2)) * K + c + 4 * (i / 2)] = decode(w.a, r[i]) * scale;
    } else if (is_16bit(w.a)) {
      // a_i, i in [0,8): reg i/2, half i%2; row g + 8*((i/2)%2); k = 2c + i%2 + 8*(i/4)
      for (int i = 0; i < 8; ++i) {
        uint32_t h = (r[i / 2] >> (16 * (i % 2))) & 0xFFFF;
        a[(row0 + 8 * ((i / 2) % 2)) * K + 2 * c + (i % 2) + 8 * (i / 4)] = decode(w.a, h) * scale;
      }
    } else {
      // a_i, i in [0,16): reg i/4, byte i%4; row g + 8*((i/4)%2); k = 4c + i%4 + 16*(i/8)
      for (int i = 0; i < 16; ++i) {
        uint32_t b = (r[i / 4] >> (8 * (i % 4))) & 0xFF;
        a[(row0 + 8 * ((i / 4) % 2)) * K + 4 * c + (i % 4) + 16 * (i / 8)] = decode(w.a, b) * scale;
      }
    }
  }
}

// 2-wide double vector (GCC vector extension = one SSE2 register on x86-64). Elementwise mul then
// add (no contraction: -ffp-contract is off in ISO mode, and products are exact anyway).
typedef double v2d __attribute__((vector_size(16)));

// out[m][n] = sum_k a[m][k] * b[k][n], k ascending from 0.0. Products of the decoded inputs are
// exact in double and every element is summed in the same order, so the vector forms below give
// bit-identical results to the scalar definition (mul and add are separate IEEE operations; with
// the products exact even a contracted fma would round identically). N is a multiple of 8.
void gemm_rows_sse2(const double* a, const double* bt, double* out, int M, int N, int K) {
  for (int m = 0; m < M; ++m) {
    const double* am = a + m * K;
    for (int n0 = 0; n0 < N; n0 += 8) {  // 8 columns live in 4 SSE2 registers across the K loop
      v2d c0 = {0, 0}, c1 = c0, c2 = c0, c3 = c0;
      const double* bp = bt + n0;
      for (int k = 0; k < K; ++k, bp += N) {
        const v2d a2 = {am[k], am[k]};
        v2d b0, b1, b2, b3;
        std::memcpy(&b0, bp, 16);
        std::memcpy(&b1, bp + 2, 16);
        std::memcpy(&b2, bp + 4, 16);
        std::memcpy(&b3, bp + 6, 16);
        c0 += a2 * b0;
        c1 += a2 * b1;
        c2 += a2 * b2;
        c3 += a2 * b3;
      }
      double* o = out + m * N + n0;
      std::memcpy(o, &c0, 16);
      std::memcpy(o + 2, &c1, 16);
      std::memcpy(o + 4, &c2, 16);
      std::memcpy(o + 6, &c3, 16);
    }
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
typedef double v4d __attribute__((vector_size(32)));
__attribute__((target("avx2"))) void gemm_rows_avx2(const double* a, const double* bt, double* out, int M,
                                                    int N, int K) {
  for (int m = 0; m < M; ++m) {
    const double* am = a + m * K;
    for (int n0 = 0; n0 < N; n0 += 8) {
      v4d c0 = {0, 0, 0, 0}, c1 = c0;
      const double* bp = bt + n0;
      for (int k = 0; k < K; ++k, bp += N) {
        const v4d a4 = {am[k], am[k], am[k], am[k]};
        v4d b0, b1;
        std::memcpy(&b0, bp, 32);
        std::memcpy(&b1, bp + 4, 32);
        c0 += a4 * b0;
        c1 += a4 * b1;
      }
      std::memcpy(out + m * N + n0, &c0, 32);
      std::memcpy(out + m * N + n0 + 4, &c1, 32);
    }
  }
}
#endif

void gemm_rows(const double* a, const double* bt, double* out, int M, int N, int K) {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) return gemm_rows_avx2(a, bt, out, M, N, K);
#endif
  gemm_rows_sse2(a, bt, out, M, N, K);
}

// FP8 products (k32) into f32 accumulators, as measured on an H200 (2026-11-28,
// tools/fp8_accum_probe.py through cuBLAS; benchmarks/results/h200_2026-11-28/fp8_accum_probe.txt):
// the 32 products and the running accumulator are aligned to the largest exponent among them and
// each is truncated toward zero to 13 fractional bits of it (1 + 3*2^-14 -> 1 + 2^-13; 1 + 31 terms
// of 2^-14 -> 1; 96*2^-14 accumulated before a 1 survive, after it they are lost). The truncated
// terms are multiples of 2^(e-13) below 33 * 2^(e+1), so their sum is exact in double and in f32.
// Inf/NaN operands keep the plain sum (they propagate the same either way).
constexpr int kFp8KeptBits = 13;
double fp8_chunk_sum(const double* am, const double* bcol, int N, int K, double acc, bool has_acc) {
  double p[32];
  double mx = has_acc ? std::fabs(acc) : 0.0, plain = has_acc ? acc : 0.0;
  for (int k = 0; k < K; ++k) {
    p[k] = am[k] * bcol[static_cast<size_t>(k) * N];
    mx = std::fmax(mx, std::fabs(p[k]));
    plain += p[k];
  }
  if (mx == 0.0 || !std::isfinite(plain) || !std::isfinite(mx)) return plain;
  const double ulp = std::ldexp(1.0, std::ilogb(mx) - kFp8KeptBits);
  double s = has_acc ? std::trunc(acc / ulp) * ulp : 0.0;
  for (int k = 0; k < K; ++k) s += std::trunc(p[k] / ulp) * ulp;
  return s;
}

}  // namespace

int ebits(EType t) {
  switch (t) {
    case EType::kF16: case EType::kBF16: return 16;
    case EType::kTF32: case EType::kF32: case EType::kS32: return 32;
    case EType::kE4M3: case EType::kE5M2: case EType::kS8: case EType::kU8: return 8;
  }
  return 0;
}

Desc decode_desc(uint64_t v) {
  Desc d;
  d.start_addr = static_cast<uint32_t>(v & 0x3FFF) << 4;          // bits [0,14)
  d.lbo = static_cast<uint32_t>((v >> 16) & 0x3FFF) << 4;         // bits [16,30)
  d.sbo = static_cast<uint32_t>((v >> 32) & 0x3FFF) << 4;         // bits [32,46)
  d.base_offset = static_cast<uint32_t>((v >> 49) & 0x7);         // bits [49,52)
  static const uint32_t kSw[4] = {0, 128, 64, 32};                // bits [62,64)
  d.swizzle = kSw[(v >> 62) & 3];
  return d;
}

uint32_t element_addr(const Desc& d, int mn, int k, int elem_bits, bool k_major) {
  const uint32_t eb = static_cast<uint32_t>(elem_bits) / 8;
  const uint32_t S = d.swizzle;
  uint32_t off;
  if (k_major) {
    const uint32_t kb = static_cast<uint32_t>(k) * eb;  // byte along K, < 32 per instruction
    if (S == 0)
      off = (mn / 8) * d.sbo + (mn % 8) * 16 + (kb / 16) * d.lbo + kb % 16;
    else
      off = (mn / 8) * d.sbo + (mn % 8) * S + kb;
  } else {
    const uint32_t mb = static_cast<uint32_t>(mn) * eb;  // byte along MN
    if (S == 0)
      off = (mb / 16) * d.sbo + (k / 8) * d.lbo + (k % 8) * 16 + mb % 16;
    else
      off = (mb / S) * d.lbo + (k / 8) * d.sbo + (k % 8) * S + mb % S;
  }
  uint32_t a = d.start_addr + off;
  if (S != 0) {
    const uint32_t mask = S / 16 - 1;  // 1, 3, 7 for 32/64/128 B
    const uint32_t phase = ((a >> 7) - d.base_offset) & mask;
    a ^= phase << 4;
  }
  return a;
}

int d_regs_per_thread(const Wgmma& w) { return w.d == EType::kF16 ? w.n / 4 : w.n / 2; }

bool wgmma(const Wgmma& w, uint64_t desc_a, uint64_t desc_b, const uint32_t* a_frag, uint32_t* d,
           bool scale_d, const Smem& smem, std::string* err) {
  if (!check_shape(w, err)) return false;
  if (w.a_regs && !a_frag) { set_err(err, "wgmma: RS form without A registers"); return false; }
  const int M = 64, N = w.n, K = w.k;
  Scratch& s = g_scratch;
  const double sa = w.scale_a, sb = w.scale_b;

  if (w.a_regs) load_a_regs(w, a_frag, s.a, K, sa);
  else if (!load_operand("A", desc_a, M, K, w.a, w.a_k_major, smem, s.a, K, 1, sa, err)) return false;
  if (!load_operand("B", desc_b, N, K, w.b, w.b_k_major, smem, s.bt, 1, N, sb, err)) return false;

  const bool fp8_trunc = is_fp8(w.a) && is_fp8(w.b) && w.d == EType::kF32;
  if (!fp8_trunc) gemm_rows(s.a, s.bt, s.out, M, N, K);

  // Scatter into the accumulator fragment (ISA figure for wgmma D): thread t = 32*w + lane,
  // g = lane/4, c = lane%4; value i -> row 16w + g + 8*((i/2)%2), col 8*(i/4) + 2c + i%2.
  // Type dispatch per 4 values keeps the inner work branch-light.
  const int nd = d_regs_per_thread(w);
  for (int t = 0; t < 128; ++t) {
    const int lane = t % 32, row0 = 16 * (t / 32) + lane / 4, col0 = 2 * (lane % 4);
    const double* r0 = s.out + row0 * N + col0;  // values i with (i/2)%2 == 0
    const double* r1 = r0 + 8 * N;               // values i with (i/2)%2 == 1 (row + 8)
    uint32_t* dt = d + static_cast<size_t>(t) * nd;
    for (int j = 0; j < N / 8; ++j) {
      // i = 4j + {0,1,2,3} -> (row0, col0+8j), (row0, +1), (row0+8, col0+8j), (row0+8, +1)
      const double v[4] = {r0[8 * j], r0[8 * j + 1], r1[8 * j], r1[8 * j + 1]};
      if (w.d == EType::kF32 && fp8_trunc) {
        for (int q = 0; q < 4; ++q) {
          const int row = row0 + 8 * (q / 2), col = col0 + 8 * j + q % 2;
          const double x = fp8_chunk_sum(s.a + row * K, s.bt + col, N, K,
                                         scale_d ? static_cast<double>(dec_f32(dt[4 * j + q])) : 0.0, scale_d);
          dt[4 * j + q] = x != x ? 0x7FFFFFFFu : f32_bits(static_cast<float>(x));
        }
      } else if (w.d == EType::kF32) {
        // One rounding of (exact-product K-sum in double + old D) to f32; NaN -> canonical NaN.
        for (int q = 0; q < 4; ++q) {
          const double x = scale_d ? v[q] + static_cast<double>(dec_f32(dt[4 * j + q])) : v[q];
          dt[4 * j + q] = x != x ? 0x7FFFFFFFu : f32_bits(static_cast<float>(x));
        }
      } else if (w.d == EType::kF16) {
        // f16 accumulators: d_i is half i%2 (low = even i) of register i/2; one rn rounding.
        for (int q = 0; q < 2; ++q) {
          uint32_t& reg = dt[2 * j + q];
          const double lo = scale_d ? v[2 * q] + dec_f16(static_cast<uint16_t>(reg)) : v[2 * q];
          const double hi = scale_d ? v[2 * q + 1] + dec_f16(static_cast<uint16_t>(reg >> 16)) : v[2 * q + 1];
          reg = f64_to_f16_rn(lo) | (static_cast<uint32_t>(f64_to_f16_rn(hi)) << 16);
        }
      } else {
        // s32: the integer K-sum is exact in double (|sum| <= 32*255*255); D + sum wraps mod 2^32
        // (no .satfinite operand in this interface).
        for (int q = 0; q < 4; ++q) {
          const int64_t old = scale_d ? static_cast<int32_t>(dt[4 * j + q]) : 0;
          dt[4 * j + q] = static_cast<uint32_t>(static_cast<uint64_t>(old + static_cast<int64_t>(v[q])));
        }
      }
    }
  }
  return true;
}

// ---- ldmatrix / stmatrix (m8n8, b16) ----
// Matrix j's row r starts at row_addr[8j + r]. Thread lane l, c = l%4, r = l/4:
//  non-trans: register j = { M_j[r][2c] (low), M_j[r][2c+1] (high) }
//  .trans   : register j = { M_j[2c][r] (low), M_j[2c+1][r] (high) }
namespace {
bool check_rows(const char* op, int num, const uint32_t row_addr[32], uint32_t size,
                const uint8_t* shadow, std::string* err) {
  if (num != 1 && num != 2 && num != 4) { set_err(err, "%s: .x%d is not .x1/.x2/.x4", op, num); return false; }
  for (int i = 0; i < 8 * num; ++i) {
    uint32_t a = row_addr[i];
    if (a % 16) {
      set_err(err, "%s: lane %d row address 0x%x (matrix %d row %d) is not 16-byte aligned", op, i, a,
              i / 8, i % 8);
      return false;
    }
    if (static_cast<uint64_t>(a) + 16 > size) {
      set_err(err, "%s: lane %d row address 0x%x (matrix %d row %d) + 16 bytes is outside shared "
              "memory of %u bytes", op, i, a, i / 8, i % 8, size);
      return false;
    }
    if (shadow)
      for (int b = 0; b < 16; ++b)
        if (shadow[a + b]) {
          set_err(err, "%s: matrix %d row %d reads shared address 0x%x whose shadow is %u", op, i / 8,
                  i % 8, a + b, shadow[a + b]);
          return false;
        }
  }
  return true;
}
uint16_t rd16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
void wr16(uint8_t* p, uint16_t v) { p[0] = v & 0xFF; p[1] = v >> 8; }
}  // namespace

bool ldmatrix(int num, bool trans, const uint32_t row_addr[32], uint32_t out[32 * 4], const Smem& smem,
              std::string* err) {
  if (!check_rows("ldmatrix", num, row_addr, smem.size, smem.shadow, err)) return false;
  for (int l = 0; l < 32; ++l) {
    const int r = l / 4, c = l % 4;
    for (int j = 0; j < num; ++j) {
      uint16_t lo, hi;
      if (!trans) {
        const uint8_t* p = smem.bytes + row_addr[8 * j + r] + 4 * c;
        lo = rd16(p);
        hi = rd16(p + 2);
      } else {
        lo = rd16(smem.bytes + row_addr[8 * j + 2 * c] + 2 * r);
        hi = rd16(smem.bytes + row_addr[8 * j + 2 * c + 1] + 2 * r);
      }
      out[l * 4 + j] = lo | (static_cast<uint32_t>(hi) << 16);
    }
  }
  return true;
}

bool stmatrix(int num, bool trans, const uint32_t row_addr[32], const uint32_t in[32 * 4], uint8_t* smem,
              uint32_t smem_size, std::string* err) {
  // All addresses are validated before the first byte is written.
  if (!check_rows("stmatrix", num, row_addr, smem_size, nullptr, err)) return false;
  for (int l = 0; l < 32; ++l) {
    const int r = l / 4, c = l % 4;
    for (int j = 0; j < num; ++j) {
      const uint32_t v = in[l * 4 + j];
      if (!trans) {
        uint8_t* p = smem + row_addr[8 * j + r] + 4 * c;
        wr16(p, v & 0xFFFF);
        wr16(p + 2, v >> 16);
      } else {
        wr16(smem + row_addr[8 * j + 2 * c] + 2 * r, v & 0xFFFF);
        wr16(smem + row_addr[8 * j + 2 * c + 1] + 2 * r, v >> 16);
      }
    }
  }
  return true;
}

}  // namespace hsim::tc
