// Number formats and arithmetic with PTX ISA semantics: conversions with every rounding mode,
// saturation and ftz; the MUFU-style approximations. Pure functions, host-only, no global state
// visible to callers (rounding modes are set and restored inside).
#pragma once
#include <cstdint>

namespace hsim::num {

enum class Rnd : uint8_t {
  kNone,              // not given: the instruction's default
  kRN, kRZ, kRM, kRP, // float rounding: nearest-even, toward zero, toward -inf, toward +inf
  kRNA,               // nearest, ties away from zero (cvt.rna.tf32.f32, cvt.rna.satfinite...)
  kRS,                // stochastic rounding (not used by our kernels: callers reject it)
  kRNI, kRZI, kRMI, kRPI,  // integer rounding of a float (cvt to int / cvt.rni.f32.f32)
};

// ---- 16-bit and 8-bit floats <-> f32 ----
float f16_to_f32(uint16_t h);                    // exact
float bf16_to_f32(uint16_t b);                   // exact
float e4m3_to_f32(uint8_t x);                    // exact; 0x7F/0xFF are NaN (no infinities)
float e5m2_to_f32(uint8_t x);                    // exact
uint16_t e4m3_to_f16(uint8_t x);                 // exact (cvt.rn.f16x2.e4m3x2); NaN -> 0x7FFF
uint16_t e5m2_to_f16(uint8_t x);                 // exact (cvt.rn.f16x2.e5m2x2); NaN -> 0x7FFF
// f32 -> f16 / bf16 with rounding kRN (default), kRZ, kRM, kRP; relu clamps negatives (and NaN
// becomes canonical NaN per the ISA: cvt ... .relu: NaN -> canonical NaN); satfinite clamps to
// +-MAX_NORMAL and NaN -> NaN as the ISA says for that destination type.
uint16_t f32_to_f16(float x, Rnd r, bool relu = false, bool satfinite = false);
uint16_t f32_to_bf16(float x, Rnd r, bool relu = false, bool satfinite = false);
uint16_t f64_to_f16(double x, Rnd r);
uint16_t f64_to_bf16(double x, Rnd r);
// cvt.rn.satfinite{.relu}.e4m3x2.f32 / e5m2x2: round to nearest even; with satfinite, values
// beyond the largest finite (448 / 57344) clamp to it, NaN -> NaN (0x7F for e4m3, 0x7F/0x7E? see ISA).
// Without satfinite: e4m3 overflow -> NaN (0x7F, sign kept), e5m2 overflow -> inf.
uint8_t f32_to_e4m3(float x, bool satfinite, bool relu = false);
uint8_t f32_to_e5m2(float x, bool satfinite, bool relu = false);
uint8_t f16_to_e4m3(uint16_t h, bool satfinite, bool relu = false);   // e4m3x2.f16x2 forms
uint8_t f16_to_e5m2(uint16_t h, bool satfinite, bool relu = false);
// cvt.{rna,rn,rz}{.satfinite}.tf32.f32: the tf32 value as f32 bits with the low 13 bits zero.
uint32_t f32_to_tf32(float x, Rnd r, bool satfinite = false);

// ---- float <-> float / int ----
float f64_to_f32(double x, Rnd r, bool ftz = false, bool sat = false);
// Float -> integer of `bits` (8/16/32/64), signed or not, rounding kRNI/kRZI/kRMI/kRPI (cvt's
// default for float->int is .rzi); out-of-range values saturate, NaN -> 0 (PTX cvt semantics).
uint64_t float_to_int(double x, Rnd r, bool is_signed, int bits);
// Integer -> float with rounding kRN (default), kRZ, kRM, kRP.
float int_to_f32(uint64_t v, bool is_signed, int bits, Rnd r);
double int_to_f64(uint64_t v, bool is_signed, int bits, Rnd r);
// f32 -> f32 integer rounding (cvt.rni/rzi/rmi/rpi.f32.f32), ftz and sat ([0,1] clamp, NaN -> 0).
float round_f32(float x, Rnd r, bool ftz, bool sat);

// ---- f32 / f64 arithmetic with explicit rounding (kNone/kRN = nearest even) ----
float add_f32(float a, float b, Rnd r);
float sub_f32(float a, float b, Rnd r);
float mul_f32(float a, float b, Rnd r);
float fma_f32(float a, float b, float c, Rnd r);      // single rounding
float div_f32(float a, float b, Rnd r);               // IEEE (div.rn/rz/rm/rp)
float sqrt_f32(float a, Rnd r);                       // IEEE
float rcp_f32(float a, Rnd r);                        // IEEE rcp.rn etc.
double add_f64(double a, double b, Rnd r);
double mul_f64(double a, double b, Rnd r);
double fma_f64(double a, double b, double c, Rnd r);
double div_f64(double a, double b, Rnd r);
double sqrt_f64(double a, Rnd r);
double rcp_f64(double a, Rnd r);
float ftz_f32(float x);                               // subnormal -> sign-preserving zero
float sat_f32(float x);                               // clamp to [0, 1], NaN -> 0

// ---- approximations (.approx): each within the ISA's documented maximum error; the choice made
// here is written next to each definition (we return the correctly rounded value of the exact
// function, which is within every documented bound, unless stated otherwise). ftz applies to
// inputs and outputs when asked.
float ex2_approx(float x, bool ftz);
float lg2_approx(float x, bool ftz);
float rcp_approx(float x, bool ftz);
float rsqrt_approx(float x, bool ftz);
float sqrt_approx(float x, bool ftz);
float sin_approx(float x, bool ftz);
float cos_approx(float x, bool ftz);
float tanh_approx(float x);
float div_approx(float a, float b, bool ftz);         // div.approx.f32 (a * rcp(b))
float div_full(float a, float b, bool ftz);           // div.full.f32 (2 ulp)
double rcp_approx_ftz_f64(double x);                  // rcp.approx.ftz.f64
double rsqrt_approx_f64(double x);
uint16_t ex2_approx_f16(uint16_t h);                  // ex2.approx.f16
uint16_t ex2_approx_bf16(uint16_t b);                 // ex2.approx.ftz.bf16
uint16_t tanh_approx_f16(uint16_t h);
uint16_t tanh_approx_bf16(uint16_t b);

// ---- half / bfloat16 arithmetic (add/sub/mul/fma/min/max/neg/abs on .f16, .bf16 and the x2
// forms are done by the interpreter per lane with these) ----
uint16_t hadd(uint16_t a, uint16_t b, bool bf16, Rnd r, bool ftz, bool sat);
uint16_t hsub(uint16_t a, uint16_t b, bool bf16, Rnd r, bool ftz, bool sat);
uint16_t hmul(uint16_t a, uint16_t b, bool bf16, Rnd r, bool ftz, bool sat);
uint16_t hfma(uint16_t a, uint16_t b, uint16_t c, bool bf16, Rnd r, bool ftz, bool sat, bool relu);
// min/max with the ISA's NaN rules: if one input is NaN the result is the other; .NaN propagates.
uint16_t hmin(uint16_t a, uint16_t b, bool bf16, bool ftz, bool nan_prop);
uint16_t hmax(uint16_t a, uint16_t b, bool bf16, bool ftz, bool nan_prop);
float fmin_f32(float a, float b, bool ftz, bool nan_prop);
float fmax_f32(float a, float b, bool ftz, bool nan_prop);
bool is_nan_f16(uint16_t h, bool bf16);
float h_to_f32(uint16_t h, bool bf16);                // f16_to_f32 or bf16_to_f32

}  // namespace hsim::num
