// Number formats and arithmetic with PTX ISA semantics (see numeric.h for the contract).
//
// Design:
//  * Every narrowing conversion (f64/f32/int -> f32, f16, bf16, tf32, e4m3, e5m2) goes through one
//    exact integer rounding routine, round_pack(), that takes the value as sign * sig * 2^exp with
//    an exact 64-bit significand and rounds it with any of RN/RNA/RZ/RM/RP into a target format
//    described by (exponent bits, mantissa bits, has-infinity). No host rounding mode is involved.
//  * f32/f64 arithmetic with an explicit rounding mode runs the host IEEE operation under
//    std::fesetround (restored afterwards). Operands pass through volatile so that the compiler
//    cannot evaluate them before the mode is set, and this file asks GCC for -frounding-math.
//  * 16-bit arithmetic is computed in double: a sum of two f16 values and every f16/bf16 product
//    are exact in double; bf16 sums and f16/bf16 fma use "round to odd" in double (RZ plus the
//    inexact flag), which is exact-enough: double's 53 bits >= 2 * 11 + 2, so rounding the
//    round-to-odd result once more to f16/bf16 gives the correctly rounded result in every mode.
//  * NaN results: f32 arithmetic returns the canonical NaN 0x7FFFFFFF (NVIDIA GPUs do not
//    propagate NaN payloads for f32); f16/bf16 results use the canonical 0x7FFF (PTX ISA names
//    0x7FFF as the canonical NaN for .f16/.bf16 in min/max and cvt .relu/.satfinite). f64
//    arithmetic leaves the host's quiet NaN as is.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("-frounding-math")
#endif
#include "numeric.h"

#include <algorithm>
#include <cfenv>
#include <cmath>
#include <cstring>
#include <limits>

namespace hsim::num {

namespace {

// ---------------------------------------------------------------------------------------------
// bit casts
inline uint32_t fbits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float bitsf(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline uint64_t dbits(double d) { uint64_t u; std::memcpy(&u, &d, 8); return u; }
inline double bitsd(uint64_t u) { double d; std::memcpy(&d, &u, 8); return d; }

constexpr uint32_t kCanonNaN32 = 0x7FFFFFFFu;
constexpr uint16_t kCanonNaN16 = 0x7FFF;  // both .f16 and .bf16

// The five float rounding behaviours; the integer forms (.rni etc.) map onto them.
enum class RM { kNearestEven, kNearestAway, kZero, kDown, kUp };

RM mode_of(Rnd r) {
  switch (r) {
    case Rnd::kRZ: case Rnd::kRZI: return RM::kZero;
    case Rnd::kRM: case Rnd::kRMI: return RM::kDown;
    case Rnd::kRP: case Rnd::kRPI: return RM::kUp;
    case Rnd::kRNA: return RM::kNearestAway;
    default: return RM::kNearestEven;  // kNone, kRN, kRNI, kRS (callers reject .rs)
  }
}

// A binary floating format. has_inf=false is the OCP e4m3 layout: no infinities, the only NaN
// encodings are S.1111.111, so the largest finite magnitude is 1111.110 (448).
struct Fmt { int ebits; int mbits; bool has_inf; };
constexpr Fmt kF16{5, 10, true};
constexpr Fmt kBF16{8, 7, true};
constexpr Fmt kE4M3{4, 3, false};
constexpr Fmt kE5M2{5, 2, true};
constexpr Fmt kTF32{8, 10, true};
constexpr Fmt kF32{8, 23, true};
constexpr Fmt kF64{11, 52, true};

inline int bias_of(Fmt f) { return (1 << (f.ebits - 1)) - 1; }
inline uint64_t mant_mask(Fmt f) { return (uint64_t(1) << f.mbits) - 1; }
inline uint64_t sign_bit(Fmt f) { return uint64_t(1) << (f.ebits + f.mbits); }
inline uint64_t exp_all_ones(Fmt f) { return uint64_t((1 << f.ebits) - 1) << f.mbits; }
inline uint64_t max_finite(Fmt f) {
  return f.has_inf ? ((exp_all_ones(f) - (uint64_t(1) << f.mbits)) | mant_mask(f))
                   : (exp_all_ones(f) | (mant_mask(f) - 1));
}
inline uint64_t inf_code(Fmt f) { return exp_all_ones(f); }  // only for has_inf formats
inline uint64_t nan_code(Fmt f) { return exp_all_ones(f) | mant_mask(f); }  // canonical, +
inline bool code_is_nan(uint64_t c, Fmt f) {
  uint64_t m = c & ~sign_bit(f);
  return f.has_inf ? ((m & exp_all_ones(f)) == exp_all_ones(f) && (m & mant_mask(f)) != 0)
                   : m == nan_code(f);
}

// Result when the rounded magnitude exceeds the largest finite value (IEEE 754 7.4): nearest
// modes go to infinity, directed modes to the largest finite value on the side they round
// toward-zero from. satfinite clamps to +-MAX_NORM (PTX cvt .satfinite). The e4m3 format has no
// infinity: where infinity would result, the result is NaN (header contract: non-satfinite e4m3
// overflow -> 0x7F with the sign kept).
uint64_t overflow_code(bool neg, Fmt f, RM m, bool satfinite) {
  const uint64_t s = neg ? sign_bit(f) : 0;
  bool to_inf = m == RM::kNearestEven || m == RM::kNearestAway || (m == RM::kUp && !neg) ||
                (m == RM::kDown && neg);
  if (satfinite || !to_inf) return s | max_finite(f);
  return s | (f.has_inf ? inf_code(f) : nan_code(f));
}

// Rounds (-1)^neg * sig * 2^exp (exact) into format f. Returns the full code with sign.
uint64_t round_pack(bool neg, uint64_t sig, int exp, Fmt f, RM m, bool satfinite) {
  const uint64_t s = neg ? sign_bit(f) : 0;
  if (sig == 0) return s;
  const int bias = bias_of(f), emin = 1 - bias;
  const int msb = 63 - __builtin_clzll(sig);
  const int e = msb + exp;                          // unbiased exponent of the value
  int q = std::max(e, emin) - f.mbits;              // exponent of the last kept bit (ulp)
  const int shift = q - exp;
  uint64_t n;
  bool up = false;
  if (shift <= 0) {
    n = sig << (-shift);  // exact; n < 2^(mbits+1)
  } else {
    unsigned __int128 v = sig, rem, half;
    if (shift >= 120) {   // everything is below half an ulp, and nonzero
      n = 0; rem = 1; half = (unsigned __int128)1 << 119;
    } else {
      n = (uint64_t)(v >> shift);
      rem = v & (((unsigned __int128)1 << shift) - 1);
      half = (unsigned __int128)1 << (shift - 1);
    }
    switch (m) {
      case RM::kNearestEven: up = rem > half || (rem == half && (n & 1)); break;
      case RM::kNearestAway: up = rem >= half; break;
      case RM::kZero: break;
      case RM::kUp: up = rem != 0 && !neg; break;
      case RM::kDown: up = rem != 0 && neg; break;
    }
  }
  n += up;
  if (n >> (f.mbits + 1)) { n >>= 1; ++q; }         // rounding carried into a new binade
  uint64_t mag;
  if (n >> f.mbits) mag = (uint64_t(q + f.mbits + bias) << f.mbits) | (n & mant_mask(f));
  else mag = n;                                      // subnormal (q == emin - mbits)
  if (mag > max_finite(f)) return overflow_code(neg, f, m, satfinite);
  return s | mag;
}

// Narrowing of a double (any finite/inf/NaN) into f. NaN -> canonical NaN (+). Infinity stays
// infinity unless satfinite (then +-MAX_NORM); e4m3 has no infinity: inf -> NaN unless satfinite.
// relu: a negative result becomes +0 (PTX: ".relu clamps the result to 0 if negative"); we also
// map -0 to +0 (max(x, +0) semantics); NaN -> canonical NaN.
uint64_t encode(double x, Fmt f, RM m, bool satfinite, bool relu) {
  if (std::isnan(x)) return nan_code(f);
  const bool neg = std::signbit(x);
  uint64_t c;
  if (std::isinf(x)) {
    c = (satfinite || !f.has_inf) ? overflow_code(neg, f, RM::kNearestEven, satfinite)
                                  : ((neg ? sign_bit(f) : 0) | inf_code(f));
  } else {
    const uint64_t b = dbits(x);
    const int be = int((b >> 52) & 0x7FF);
    const uint64_t bm = b & ((uint64_t(1) << 52) - 1);
    const uint64_t sig = be ? (bm | (uint64_t(1) << 52)) : bm;
    const int exp = be ? be - 1075 : -1074;
    c = round_pack(neg, sig, exp, f, m, satfinite);
  }
  if (relu) {
    if (code_is_nan(c, f)) return nan_code(f);
    if (c & sign_bit(f)) return 0;
  }
  return c;
}

// Exact decode of a code of format f into a double (all our formats fit in double exactly).
double decode(uint64_t c, Fmt f) {
  const bool neg = (c & sign_bit(f)) != 0;
  const uint64_t mag = c & ~sign_bit(f);
  const int be = int(mag >> f.mbits);
  const uint64_t man = mag & mant_mask(f);
  double v;
  if (f.has_inf && be == (1 << f.ebits) - 1) {
    v = man ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else if (!f.has_inf && mag == nan_code(f)) {
    v = std::numeric_limits<double>::quiet_NaN();
  } else if (be == 0) {
    v = std::ldexp(double(man), 1 - bias_of(f) - f.mbits);
  } else {
    v = std::ldexp(double(man | (uint64_t(1) << f.mbits)), be - bias_of(f) - f.mbits);
  }
  return neg ? -v : v;
}

inline float canon32(float x) { return std::isnan(x) ? bitsf(kCanonNaN32) : x; }
inline bool is_sub32(float x) { return std::fpclassify(x) == FP_SUBNORMAL; }
inline float ftz32(float x) { return is_sub32(x) ? std::copysign(0.0f, x) : x; }
inline bool is_sub64(double x) { return std::fpclassify(x) == FP_SUBNORMAL; }
inline double ftz64(double x) { return is_sub64(x) ? std::copysign(0.0, x) : x; }

// f32 RN of a double, independent of the host rounding mode.
inline float rn32(double x) {
  if (std::isnan(x)) return bitsf(kCanonNaN32);
  return bitsf(uint32_t(encode(x, kF32, RM::kNearestEven, false, false)));
}

int fe_mode(Rnd r) {
  switch (mode_of(r)) {
    case RM::kZero: return FE_TOWARDZERO;
    case RM::kDown: return FE_DOWNWARD;
    case RM::kUp: return FE_UPWARD;
    default: return FE_TONEAREST;  // .rna is not an arithmetic mode; treat as .rn
  }
}

// Sets the host rounding mode for the lifetime of the object.
// (Skips the mode switch when the host is already in that mode: the common .rn case.)
struct RoundScope {
  int old;
  bool changed;
  explicit RoundScope(int mode) : old(std::fegetround()), changed(old != mode) {
    if (changed) std::fesetround(mode);
  }
  ~RoundScope() { if (changed) std::fesetround(old); }
};

// Round-to-odd sum in double: RZ result with its last bit forced to 1 when inexact. Used as the
// intermediate for 16-bit arithmetic (see the file comment). An exact zero sum of opposite-signed
// operands is +0 except under round-down, where it is -0 (IEEE 754 6.3): that zero is recomputed
// under the caller's mode r.
double add_rto(double a, double b, Rnd r) {
  volatile double va = a, vb = b;
  double res;
  bool inexact;
  {
    RoundScope g(FE_TOWARDZERO);
    std::feclearexcept(FE_INEXACT);
    volatile double t = va + vb;
    inexact = std::fetestexcept(FE_INEXACT) != 0;
    res = t;
  }
  if (inexact && std::isfinite(res)) res = bitsd(dbits(res) | 1);
  if (res == 0.0 && !inexact) {
    RoundScope g(fe_mode(r));
    volatile double t = va + vb;
    res = t;
  }
  return res;
}

inline Fmt hfmt(bool bf16) { return bf16 ? kBF16 : kF16; }

inline bool h_is_sub(uint16_t h, bool bf16) {
  const Fmt f = hfmt(bf16);
  return (h & exp_all_ones(f)) == 0 && (h & mant_mask(f)) != 0;
}
inline uint16_t h_ftz(uint16_t h, bool bf16) { return h_is_sub(h, bf16) ? (h & 0x8000) : h; }

// Rounds an exact-or-round-to-odd double to f16/bf16 and applies ftz (results), sat, relu.
uint16_t h_finish(double v, bool bf16, Rnd r, bool ftz, bool sat, bool relu) {
  const Fmt f = hfmt(bf16);
  if (std::isnan(v)) return sat ? 0 : kCanonNaN16;   // .sat: NaN -> +0.0
  uint16_t c = uint16_t(encode(v, f, mode_of(r), false, relu));
  if (ftz) c = h_ftz(c, bf16);
  if (sat) {
    // .sat clamps to [0.0, 1.0]; -0 is clamped to +0.
    if (c & 0x8000) c = 0;
    else if (decode(c, f) > 1.0) c = uint16_t(encode(1.0, f, RM::kNearestEven, false, false));
  }
  return c;
}

uint16_t h_minmax(uint16_t a, uint16_t b, bool bf16, bool ftz, bool nan_prop, bool is_max) {
  if (ftz) { a = h_ftz(a, bf16); b = h_ftz(b, bf16); }
  const bool na = is_nan_f16(a, bf16), nb = is_nan_f16(b, bf16);
  // PTX min/max: NaN inputs are ignored unless both are NaN (then canonical NaN); with .NaN any
  // NaN input gives the canonical NaN. +0.0 is greater than -0.0.
  if (na || nb) {
    if (nan_prop || (na && nb)) return kCanonNaN16;
    return na ? b : a;
  }
  const double x = h_to_f32(a, bf16), y = h_to_f32(b, bf16);
  if (x == y) {  // only differs for +0/-0
    const bool pick_a = is_max ? !(a & 0x8000) : (a & 0x8000);
    return pick_a ? a : b;
  }
  return ((x < y) != is_max) ? a : b;
}

float f_minmax(float a, float b, bool ftz, bool nan_prop, bool is_max) {
  if (ftz) { a = ftz32(a); b = ftz32(b); }
  const bool na = std::isnan(a), nb = std::isnan(b);
  if (na || nb) {
    if (nan_prop || (na && nb)) return bitsf(kCanonNaN32);
    return na ? b : a;
  }
  if (a == b) {
    const bool pick_a = is_max ? !std::signbit(a) : std::signbit(a);
    return pick_a ? a : b;
  }
  return ((a < b) != is_max) ? a : b;
}

}  // namespace

// =============================================================================================
// 16-bit and 8-bit floats <-> f32

// Decoding keeps a NaN's sign and payload (shifted to the top of the f32 mantissa) and quiets it.
float f16_to_f32(uint16_t h) {
  if ((h & 0x7C00) == 0x7C00 && (h & 0x3FF))
    return bitsf((uint32_t(h & 0x8000) << 16) | 0x7FC00000u | (uint32_t(h & 0x3FF) << 13));
  return float(decode(h, kF16));
}
float bf16_to_f32(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;   // bf16 is the top half of an f32
  if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x7FFFFF)) u |= 0x00400000u;
  return bitsf(u);
}
float e4m3_to_f32(uint8_t x) {
  if ((x & 0x7F) == 0x7F) return bitsf((uint32_t(x & 0x80) << 24) | kCanonNaN32);
  return float(decode(x, kE4M3));
}
float e5m2_to_f32(uint8_t x) { return f16_to_f32(uint16_t(x) << 8); }  // e5m2 = top byte of f16

// Exact e4m3/e5m2 -> f16 (cvt.rn.f16x2.e4m3x2 / .e5m2x2): every e4m3 value (2^-9 .. 448) and
// every e5m2 value is an f16 value. NaN -> canonical f16 NaN.
uint16_t e4m3_to_f16(uint8_t x) {
  if ((x & 0x7F) == 0x7F) return kCanonNaN16;
  return uint16_t(encode(decode(x, kE4M3), kF16, RM::kNearestEven, false, false));
}
uint16_t e5m2_to_f16(uint8_t x) {
  if ((x & 0x7C) == 0x7C && (x & 3)) return kCanonNaN16;
  return uint16_t(uint16_t(x) << 8);
}

// cvt.frnd2{.relu}{.satfinite}.f16.f32 / .bf16.f32. PTX: .satfinite: NaN -> NaN, |x| > MAX_NORM
// -> sign-preserved MAX_NORM; .relu: negative -> 0, NaN -> canonical NaN. Without .satfinite an
// overflow follows IEEE (RN -> inf, RZ -> MAX_NORM, RM/RP -> toward their side). Any NaN gives the
// canonical NaN 0x7FFF.
uint16_t f32_to_f16(float x, Rnd r, bool relu, bool satfinite) {
  return uint16_t(encode(double(x), kF16, mode_of(r), satfinite, relu));
}
uint16_t f32_to_bf16(float x, Rnd r, bool relu, bool satfinite) {
  return uint16_t(encode(double(x), kBF16, mode_of(r), satfinite, relu));
}
uint16_t f64_to_f16(double x, Rnd r) { return uint16_t(encode(x, kF16, mode_of(r), false, false)); }
uint16_t f64_to_bf16(double x, Rnd r) { return uint16_t(encode(x, kBF16, mode_of(r), false, false)); }

// cvt.rn.satfinite{.relu}.e4m3x2.f32 / .e5m2x2.f32 (PTX 8.x requires .rn and .satfinite here;
// the non-satfinite path follows the header: e4m3 overflow -> NaN 0x7F|sign, e5m2 -> inf).
// NaN -> 0x7F for both formats (e4m3: S.1111.111; e5m2: S.11111.11).
uint8_t f32_to_e4m3(float x, bool satfinite, bool relu) {
  return uint8_t(encode(double(x), kE4M3, RM::kNearestEven, satfinite, relu));
}
uint8_t f32_to_e5m2(float x, bool satfinite, bool relu) {
  return uint8_t(encode(double(x), kE5M2, RM::kNearestEven, satfinite, relu));
}
uint8_t f16_to_e4m3(uint16_t h, bool satfinite, bool relu) {
  return f32_to_e4m3(f16_to_f32(h), satfinite, relu);   // f16 -> f32 is exact
}
uint8_t f16_to_e5m2(uint16_t h, bool satfinite, bool relu) {
  return f32_to_e5m2(f16_to_f32(h), satfinite, relu);
}

// cvt.{rna,rn,rz}{.satfinite}.tf32.f32. tf32 = 1 sign, 8 exponent, 10 mantissa bits, held in the
// top 19 bits of an f32 pattern. kNone means .rna (the original, and PTX 7.x's only, form).
// Overflow without .satfinite -> inf (nearest modes) / MAX (rz); .satfinite -> +-0x7F7FE000.
// NaN -> 0x7FFFE000 (canonical tf32 NaN: the all-ones mantissa in the kept bits; our choice).
uint32_t f32_to_tf32(float x, Rnd r, bool satfinite) {
  const RM m = r == Rnd::kNone ? RM::kNearestAway : mode_of(r);
  return uint32_t(encode(double(x), kTF32, m, satfinite, false)) << 13;
}

// =============================================================================================
// float <-> float / int

// cvt.frnd{.ftz}{.sat}.f32.f64. .ftz flushes a subnormal f32 result to signed zero; .sat clamps
// to [0, 1] and turns NaN into +0. NaN otherwise -> canonical NaN.
float f64_to_f32(double x, Rnd r, bool ftz, bool sat) {
  float f = std::isnan(x) ? bitsf(kCanonNaN32)
                          : bitsf(uint32_t(encode(x, kF32, mode_of(r), false, false)));
  if (ftz) f = ftz32(f);
  if (sat) f = sat_f32(f);
  return f;
}

// cvt.{rni,rzi,rmi,rpi}.{s,u}{8,16,32,64}.{f16,bf16,f32,f64}: PTX: "For float-to-integer
// conversions, the result is clamped to the destination range by default", NaN -> 0. A signed
// result is returned sign-extended to 64 bits (callers mask to the register width).
uint64_t float_to_int(double x, Rnd r, bool is_signed, int bits) {
  if (std::isnan(x)) return 0;
  double t;
  switch (mode_of(r == Rnd::kNone ? Rnd::kRZI : r)) {
    case RM::kDown: t = std::floor(x); break;
    case RM::kUp: t = std::ceil(x); break;
    case RM::kZero: t = std::trunc(x); break;
    case RM::kNearestAway: t = std::round(x); break;
    default: {  // nearest even, done without the host rounding mode
      t = std::floor(x);
      const double d = x - t;  // exact for every double
      if (d > 0.5 || (d == 0.5 && std::fmod(t, 2.0) != 0.0)) t += 1.0;
    }
  }
  if (is_signed) {
    const double lo = -std::ldexp(1.0, bits - 1), hi = std::ldexp(1.0, bits - 1);  // [lo, hi)
    int64_t v;
    if (t < lo) v = bits == 64 ? std::numeric_limits<int64_t>::min() : int64_t(lo);
    else if (t >= hi) v = bits == 64 ? std::numeric_limits<int64_t>::max() : int64_t(hi) - 1;
    else v = int64_t(t);
    return uint64_t(v);
  }
  const double hi = std::ldexp(1.0, bits);
  if (!(t > 0)) return 0;
  if (t >= hi) return bits == 64 ? ~uint64_t(0) : (uint64_t(1) << bits) - 1;
  return uint64_t(t);
}

namespace {
void int_parts(uint64_t v, bool is_signed, int bits, bool& neg, uint64_t& mag) {
  if (bits < 64) v &= (uint64_t(1) << bits) - 1;
  neg = false;
  if (is_signed && bits > 0 && ((v >> (bits - 1)) & 1)) {
    neg = true;
    mag = bits == 64 ? (~v + 1) : ((uint64_t(1) << bits) - v);  // two's complement magnitude
  } else {
    mag = v;
  }
}
}  // namespace

// cvt.frnd.f32.{s,u}N: exact integer rounding (u64 -> f32 with .rz etc. handled bit-exactly).
float int_to_f32(uint64_t v, bool is_signed, int bits, Rnd r) {
  bool neg; uint64_t mag;
  int_parts(v, is_signed, bits, neg, mag);
  return bitsf(uint32_t(round_pack(neg, mag, 0, kF32, mode_of(r), false)));
}
double int_to_f64(uint64_t v, bool is_signed, int bits, Rnd r) {
  bool neg; uint64_t mag;
  int_parts(v, is_signed, bits, neg, mag);
  return bitsd(round_pack(neg, mag, 0, kF64, mode_of(r), false));
}

// cvt.{rni,rzi,rmi,rpi}{.ftz}{.sat}.f32.f32: round to an integral f32 value; the sign of a zero
// result follows the input (IEEE roundToIntegral). .ftz flushes a subnormal input first (so
// cvt.rpi.ftz of +2^-149 is +0, not 1). NaN -> canonical NaN (+0 with .sat).
float round_f32(float x, Rnd r, bool ftz, bool sat) {
  if (ftz) x = ftz32(x);
  float y;
  if (std::isnan(x)) y = bitsf(kCanonNaN32);
  else if (std::isinf(x) || std::fabs(x) >= 8388608.0f) y = x;  // already integral
  else {
    const double d = x;
    double t;
    switch (mode_of(r)) {
      case RM::kDown: t = std::floor(d); break;
      case RM::kUp: t = std::ceil(d); break;
      case RM::kZero: t = std::trunc(d); break;
      case RM::kNearestAway: t = std::round(d); break;
      default: {
        t = std::floor(d);
        const double f = d - t;
        if (f > 0.5 || (f == 0.5 && std::fmod(t, 2.0) != 0.0)) t += 1.0;
      }
    }
    y = float(std::copysign(t, d));   // t is integral and |t| < 2^24: exact
  }
  if (ftz) y = ftz32(y);
  if (sat) y = sat_f32(y);
  return y;
}

// =============================================================================================
// f32 / f64 arithmetic under an explicit rounding mode (IEEE 754, single rounding)

#define HSIM_F32_OP(expr)                        \
  volatile float va = a, vb = b;                 \
  (void)va; (void)vb;                            \
  float res;                                     \
  {                                              \
    RoundScope g(fe_mode(r));                    \
    volatile float t = (expr);                   \
    res = t;                                     \
  }                                              \
  return canon32(res);

float add_f32(float a, float b, Rnd r) { HSIM_F32_OP(va + vb) }
float sub_f32(float a, float b, Rnd r) { HSIM_F32_OP(va - vb) }
float mul_f32(float a, float b, Rnd r) { HSIM_F32_OP(va * vb) }
float div_f32(float a, float b, Rnd r) { HSIM_F32_OP(va / vb) }
float fma_f32(float a, float b, float c, Rnd r) {
  volatile float vc = c;
  HSIM_F32_OP(std::fma(float(va), float(vb), float(vc)))
}
float sqrt_f32(float a, Rnd r) {
  const float b = 0.0f;
  HSIM_F32_OP(std::sqrt(float(va)))
}
float rcp_f32(float a, Rnd r) {
  const float b = 1.0f;
  HSIM_F32_OP(vb / va)
}
#undef HSIM_F32_OP

#define HSIM_F64_OP(expr)                        \
  volatile double va = a, vb = b;                \
  (void)va; (void)vb;                            \
  double res;                                    \
  {                                              \
    RoundScope g(fe_mode(r));                    \
    volatile double t = (expr);                  \
    res = t;                                     \
  }                                              \
  return res;

double add_f64(double a, double b, Rnd r) { HSIM_F64_OP(va + vb) }
double mul_f64(double a, double b, Rnd r) { HSIM_F64_OP(va * vb) }
double div_f64(double a, double b, Rnd r) { HSIM_F64_OP(va / vb) }
double fma_f64(double a, double b, double c, Rnd r) {
  volatile double vc = c;
  HSIM_F64_OP(std::fma(double(va), double(vb), double(vc)))
}
double sqrt_f64(double a, Rnd r) {
  const double b = 0.0;
  HSIM_F64_OP(std::sqrt(double(va)))
}
double rcp_f64(double a, Rnd r) {
  const double b = 1.0;
  HSIM_F64_OP(vb / va)
}
#undef HSIM_F64_OP

float ftz_f32(float x) { return ftz32(x); }

// .sat: clamp to [0.0, 1.0]; NaN -> +0.0. -0.0 -> +0.0 (our reading of the clamp).
float sat_f32(float x) {
  if (std::isnan(x) || x <= 0.0f) return 0.0f;
  return x > 1.0f ? 1.0f : x;
}

// =============================================================================================
// .approx functions. Choice: the value of the exact function computed in double (libm, < 1 ulp
// of double) and rounded once to f32 with RN. That is the correctly rounded f32 result except in
// astronomically rare double-rounding cases (then 1 ulp off), so it is within every bound the
// ISA documents (ex2 2 ulp, lg2 2^-22 abs/rel, rcp 1 ulp, rsqrt/sqrt 2^-22.9/2^-23 rel, sin/cos
// 2^-20.9 abs, tanh 2^-11 rel). It does not reproduce the hardware's exact MUFU bit patterns.
// Special values follow the ISA tables; .ftz flushes subnormal inputs and results to sign-
// preserving zero; without .ftz subnormals are kept.

namespace {
inline float approx_in(float x, bool ftz) { return ftz ? ftz32(x) : x; }
inline float approx_out(double v, bool ftz) {
  float f = rn32(v);
  return ftz ? ftz32(f) : f;
}
}  // namespace

// ex2: -Inf -> +0, +-0/subnormal -> 1, +Inf -> +Inf, NaN -> NaN.
float ex2_approx(float x, bool ftz) { return approx_out(std::exp2(double(approx_in(x, ftz))), ftz); }
// lg2: x < 0 -> NaN, +-0 -> -Inf, +Inf -> +Inf, NaN -> NaN (log2 in double gives exactly these).
float lg2_approx(float x, bool ftz) { return approx_out(std::log2(double(approx_in(x, ftz))), ftz); }
// rcp: +-0 -> +-Inf, +-Inf -> +-0.
float rcp_approx(float x, bool ftz) { return approx_out(1.0 / double(approx_in(x, ftz)), ftz); }
// rsqrt: x < 0 -> NaN, +0 -> +Inf, -0 -> -Inf, +Inf -> +0. 1/sqrt in double has two roundings
// (each < 1 ulp of double), still far inside f32's precision.
float rsqrt_approx(float x, bool ftz) {
  const double d = approx_in(x, ftz);
  if (d == 0.0) return std::copysign(std::numeric_limits<float>::infinity(), float(d));
  return approx_out(1.0 / std::sqrt(d), ftz);
}
// sqrt.approx: x < 0 -> NaN, -0 -> -0, +Inf -> +Inf. sqrt in double of an f32 is exact enough
// (correctly rounded double, then RN to f32 is correctly rounded since 53 >= 2*24+2).
float sqrt_approx(float x, bool ftz) { return approx_out(std::sqrt(double(approx_in(x, ftz))), ftz); }
// sin/cos: +-Inf -> NaN, sin(-0) = -0.
float sin_approx(float x, bool ftz) { return approx_out(std::sin(double(approx_in(x, ftz))), ftz); }
float cos_approx(float x, bool ftz) { return approx_out(std::cos(double(approx_in(x, ftz))), ftz); }
// tanh.approx.f32: +-Inf -> +-1, NaN -> NaN, -0 -> -0; no .ftz form (subnormals kept).
float tanh_approx(float x) { return approx_out(std::tanh(double(x)), false); }

// div.approx{.ftz}.f32: the ISA defines it as a * (1/b) with an approximate reciprocal: we round
// 1/b to f32 and then the product to f32 (two roundings, like the hardware's rcp+mul). ISA rule:
// for 2^126 < |b| < 2^128, the result is 0 (sign of a*b), or NaN when a is infinite.
float div_approx(float a, float b, bool ftz) {
  a = approx_in(a, ftz);
  b = approx_in(b, ftz);
  const float ab = std::fabs(b);
  if (std::isfinite(b) && ab > 8.5070592e37f /* 2^126 */) {
    if (std::isinf(a)) return bitsf(kCanonNaN32);
    if (std::isnan(a)) return bitsf(kCanonNaN32);
    return (std::signbit(a) != std::signbit(b)) ? -0.0f : 0.0f;
  }
  float rb = approx_out(1.0 / double(b), ftz);
  return approx_out(double(a) * double(rb), ftz);   // product of two f32 is exact in double
}

// div.full{.ftz}.f32: documented as max 2 ulp over the full range; we return the correctly
// rounded quotient (which satisfies that bound).
float div_full(float a, float b, bool ftz) {
  a = approx_in(a, ftz);
  b = approx_in(b, ftz);
  float q = div_f32(a, b, Rnd::kRN);
  return ftz ? ftz32(q) : q;
}

// rcp.approx.ftz.f64: correctly rounded 1/x (within the ISA's bound), subnormal in/out flushed.
double rcp_approx_ftz_f64(double x) {
  const double r = 1.0 / ftz64(x);
  return ftz64(r);
}
// rsqrt.approx.f64: 1/sqrt(x) evaluated in long double and rounded to double (< 1 ulp).
// x < 0 -> NaN, +0 -> +Inf, -0 -> -Inf, +Inf -> +0.
double rsqrt_approx_f64(double x) {
  if (x == 0.0) return std::copysign(std::numeric_limits<double>::infinity(), x);
  return double(1.0L / std::sqrt((long double)x));
}

// 16-bit approximations: evaluate in double, round once to the 16-bit type with RN.
// ex2.approx.f16 keeps subnormals; ex2.approx.ftz.bf16 flushes subnormal inputs and results.
uint16_t ex2_approx_f16(uint16_t h) {
  return h_finish(std::exp2(double(f16_to_f32(h))), false, Rnd::kRN, false, false, false);
}
uint16_t ex2_approx_bf16(uint16_t b) {
  b = h_ftz(b, true);
  return h_finish(std::exp2(double(bf16_to_f32(b))), true, Rnd::kRN, true, false, false);
}
uint16_t tanh_approx_f16(uint16_t h) {
  return h_finish(std::tanh(double(f16_to_f32(h))), false, Rnd::kRN, false, false, false);
}
uint16_t tanh_approx_bf16(uint16_t b) {
  return h_finish(std::tanh(double(bf16_to_f32(b))), true, Rnd::kRN, false, false, false);
}

// =============================================================================================
// half / bfloat16 arithmetic: one rounding from the exact (or round-to-odd) double result.
// .ftz flushes subnormal inputs and results to signed zero; .sat clamps to [0,1] (NaN -> +0);
// .relu clamps negatives to +0 (NaN -> canonical NaN). Any NaN result is canonical 0x7FFF.

uint16_t hadd(uint16_t a, uint16_t b, bool bf16, Rnd r, bool ftz, bool sat) {
  if (ftz) { a = h_ftz(a, bf16); b = h_ftz(b, bf16); }
  return h_finish(add_rto(h_to_f32(a, bf16), h_to_f32(b, bf16), r), bf16, r, ftz, sat, false);
}
uint16_t hsub(uint16_t a, uint16_t b, bool bf16, Rnd r, bool ftz, bool sat) {
  if (ftz) { a = h_ftz(a, bf16); b = h_ftz(b, bf16); }
  return h_finish(add_rto(h_to_f32(a, bf16), -double(h_to_f32(b, bf16)), r), bf16, r, ftz, sat, false);
}
uint16_t hmul(uint16_t a, uint16_t b, bool bf16, Rnd r, bool ftz, bool sat) {
  if (ftz) { a = h_ftz(a, bf16); b = h_ftz(b, bf16); }
  // 11-bit (or 8-bit) significands: the product has <= 22 bits and its exponent fits: exact.
  const double p = double(h_to_f32(a, bf16)) * double(h_to_f32(b, bf16));
  return h_finish(p, bf16, r, ftz, sat, false);
}
uint16_t hfma(uint16_t a, uint16_t b, uint16_t c, bool bf16, Rnd r, bool ftz, bool sat, bool relu) {
  if (ftz) { a = h_ftz(a, bf16); b = h_ftz(b, bf16); c = h_ftz(c, bf16); }
  const double p = double(h_to_f32(a, bf16)) * double(h_to_f32(b, bf16));  // exact
  return h_finish(add_rto(p, h_to_f32(c, bf16), r), bf16, r, ftz, sat, relu);
}
uint16_t hmin(uint16_t a, uint16_t b, bool bf16, bool ftz, bool nan_prop) {
  return h_minmax(a, b, bf16, ftz, nan_prop, false);
}
uint16_t hmax(uint16_t a, uint16_t b, bool bf16, bool ftz, bool nan_prop) {
  return h_minmax(a, b, bf16, ftz, nan_prop, true);
}
// min/max.f32: one NaN input -> the other input; both NaN (or .NaN with any) -> canonical NaN;
// PTX: "If values of both inputs are 0.0, then +0.0 > -0.0".
float fmin_f32(float a, float b, bool ftz, bool nan_prop) { return f_minmax(a, b, ftz, nan_prop, false); }
float fmax_f32(float a, float b, bool ftz, bool nan_prop) { return f_minmax(a, b, ftz, nan_prop, true); }

bool is_nan_f16(uint16_t h, bool bf16) { return code_is_nan(h, hfmt(bf16)); }
float h_to_f32(uint16_t h, bool bf16) { return bf16 ? bf16_to_f32(h) : f16_to_f32(h); }

}  // namespace hsim::num
