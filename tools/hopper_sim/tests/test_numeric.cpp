// Unit tests for numeric.cpp. Every expected bit pattern is worked out by hand from the IEEE 754
// / PTX ISA definitions (the arithmetic is in the comment next to it), not taken from this code.
#include <cmath>
#include <cstring>
#include <limits>

#include "check.h"
#include "numeric.h"

using namespace hsim::num;

static uint32_t fb(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
static float bf(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
static uint64_t db(double d) { uint64_t u; std::memcpy(&u, &d, 8); return u; }
static double bd(uint64_t u) { double d; std::memcpy(&d, &u, 8); return d; }
static const float kInf = std::numeric_limits<float>::infinity();
static const float kNaN = std::numeric_limits<float>::quiet_NaN();

static void test_decode() {
  // f16: 1.0 = 0.01111.0000000000 = 0x3C00; 2^-24 (min subnormal, f32 exp 127-24=103=0x67 ->
  // 0x33800000); 65504 = 1.1111111111b * 2^15 -> f32 0x47 7F E0 00; -inf; -0.
  CHECK_EQ(fb(f16_to_f32(0x3C00)), 0x3F800000u);
  CHECK_EQ(fb(f16_to_f32(0x0001)), 0x33800000u);
  CHECK_EQ(fb(f16_to_f32(0x7BFF)), 0x477FE000u);
  CHECK_EQ(fb(f16_to_f32(0xFC00)), 0xFF800000u);
  CHECK_EQ(fb(f16_to_f32(0x8000)), 0x80000000u);
  CHECK(std::isnan(f16_to_f32(0x7C01)));
  // f16 0x03FF = 1023 * 2^-24 (largest subnormal) -> f32 1.1111111110b*2^-15: exp 112=0x70,
  // mantissa 0x7FC000 -> 0x387FC000.
  CHECK_EQ(fb(f16_to_f32(0x03FF)), 0x387FC000u);
  // bf16 is the top half of f32.
  CHECK_EQ(fb(bf16_to_f32(0x3F80)), 0x3F800000u);
  CHECK_EQ(fb(bf16_to_f32(0x0001)), 0x00010000u);
  CHECK_EQ(fb(h_to_f32(0x4040, true)), 0x40400000u);   // 3.0
  CHECK_EQ(fb(h_to_f32(0x4200, false)), 0x40400000u);  // f16 3.0 = 0.10000.1000000000
  // e4m3 (bias 7): 0x38 = 0.0111.000 = 2^0 = 1; 0x7E = 0.1111.110 = 1.75*2^8 = 448;
  // 0x01 = 1/8 * 2^(1-7) = 2^-9 -> f32 exp 118=0x76 -> 0x3B000000; 0x08 = 2^-6 -> 0x3C800000;
  // 0xFE = -448; 0x7F / 0xFF NaN.
  CHECK_EQ(fb(e4m3_to_f32(0x38)), 0x3F800000u);
  CHECK(e4m3_to_f32(0x7E) == 448.0f);
  CHECK(e4m3_to_f32(0xFE) == -448.0f);
  CHECK_EQ(fb(e4m3_to_f32(0x01)), 0x3B000000u);
  CHECK_EQ(fb(e4m3_to_f32(0x08)), 0x3C800000u);
  CHECK(e4m3_to_f32(0x07) == 7.0f / 512.0f);
  CHECK(std::isnan(e4m3_to_f32(0x7F)));
  CHECK(std::isnan(e4m3_to_f32(0xFF)));
  CHECK(e4m3_to_f32(0x78) == 256.0f);  // 0.1111.000: 2^(15-7)
  // e5m2 (bias 15): 0x3C = 0.01111.00 = 1; 0x7B = 0.11110.11 = 1.75*2^15 = 57344;
  // 0x01 = 1/4 * 2^-14 = 2^-16; 0x7C = inf; 0x7D..0x7F NaN.
  CHECK(e5m2_to_f32(0x3C) == 1.0f);
  CHECK(e5m2_to_f32(0x7B) == 57344.0f);
  CHECK(e5m2_to_f32(0x01) == std::ldexp(1.0f, -16));
  CHECK(e5m2_to_f32(0x7C) == kInf);
  CHECK(e5m2_to_f32(0xFC) == -kInf);
  CHECK(std::isnan(e5m2_to_f32(0x7D)));
  CHECK(std::isnan(e5m2_to_f32(0xFF)));
  // e4m3 -> f16 exact: 448 = 1.11b * 2^8 -> f16 exp 23=10111 -> 0.10111.1100000000 = 0x5F00;
  // 2^-9 -> f16 exp 6 -> 0x1800; 1.0 -> 0x3C00; NaN -> 0x7FFF. e5m2 -> f16 is a shift by 8.
  CHECK_EQ(e4m3_to_f16(0x7E), 0x5F00);
  CHECK_EQ(e4m3_to_f16(0x01), 0x1800);
  CHECK_EQ(e4m3_to_f16(0xB8), 0xBC00);
  CHECK_EQ(e4m3_to_f16(0x7F), 0x7FFF);
  CHECK_EQ(e5m2_to_f16(0x7B), 0x7B00);
  CHECK_EQ(e5m2_to_f16(0x01), 0x0100);
  CHECK_EQ(e5m2_to_f16(0xFC), 0xFC00);
  CHECK_EQ(e5m2_to_f16(0x7E), 0x7FFF);
  // e4m3 -> f16 agrees with e4m3 -> f32 -> f16 for every non-NaN code (both exact).
  int bad = 0;
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;
    if (f16_to_f32(e4m3_to_f16(uint8_t(c))) != e4m3_to_f32(uint8_t(c))) ++bad;
    if (std::signbit(f16_to_f32(e4m3_to_f16(uint8_t(c)))) != ((c & 0x80) != 0)) ++bad;
  }
  CHECK_EQ(bad, 0);
  CHECK(is_nan_f16(0x7C01, false));
  CHECK(!is_nan_f16(0x7C00, false));
  CHECK(is_nan_f16(0xFF81, true));
  CHECK(!is_nan_f16(0x7F80, true));
}

static void test_f16_cvt() {
  // 1 + 2^-11 (f32 0x3F801000) is halfway between f16 0x3C00 and 0x3C01 (ulp 2^-10).
  CHECK_EQ(f32_to_f16(bf(0x3F801000), Rnd::kRN), 0x3C00);  // tie -> even
  CHECK_EQ(f32_to_f16(bf(0x3F801000), Rnd::kRZ), 0x3C00);
  CHECK_EQ(f32_to_f16(bf(0x3F801000), Rnd::kRM), 0x3C00);
  CHECK_EQ(f32_to_f16(bf(0x3F801000), Rnd::kRP), 0x3C01);
  CHECK_EQ(f32_to_f16(bf(0x3F801000), Rnd::kNone), 0x3C00);
  // 1 + 3*2^-11 (0x3F803000): halfway between 0x3C01 (odd) and 0x3C02 (even).
  CHECK_EQ(f32_to_f16(bf(0x3F803000), Rnd::kRN), 0x3C02);
  CHECK_EQ(f32_to_f16(bf(0x3F803000), Rnd::kRZ), 0x3C01);
  CHECK_EQ(f32_to_f16(bf(0x3F803000), Rnd::kRM), 0x3C01);
  CHECK_EQ(f32_to_f16(bf(0x3F803000), Rnd::kRP), 0x3C02);
  // Non-tie 1 + 2^-11 + 2^-23 (0x3F801001): just above half -> RN up.
  CHECK_EQ(f32_to_f16(bf(0x3F801001), Rnd::kRN), 0x3C01);
  CHECK_EQ(f32_to_f16(bf(0x3F800FFF), Rnd::kRN), 0x3C00);  // just below half
  // Negative: -(1 + 2^-11): RM goes away from zero, RP toward zero.
  CHECK_EQ(f32_to_f16(bf(0xBF801000), Rnd::kRN), 0xBC00);
  CHECK_EQ(f32_to_f16(bf(0xBF801000), Rnd::kRM), 0xBC01);
  CHECK_EQ(f32_to_f16(bf(0xBF801000), Rnd::kRP), 0xBC00);
  CHECK_EQ(f32_to_f16(bf(0xBF801000), Rnd::kRZ), 0xBC00);
  // Overflow. MAX 65504 = 0x7BFF; 65520 is halfway to 65536 (odd 0x7BFF vs "even" 2^16) -> inf.
  CHECK_EQ(f32_to_f16(65504.0f, Rnd::kRN), 0x7BFF);
  CHECK_EQ(f32_to_f16(65519.0f, Rnd::kRN), 0x7BFF);
  CHECK_EQ(f32_to_f16(65520.0f, Rnd::kRN), 0x7C00);
  CHECK_EQ(f32_to_f16(65520.0f, Rnd::kRZ), 0x7BFF);
  CHECK_EQ(f32_to_f16(1e6f, Rnd::kRZ), 0x7BFF);
  CHECK_EQ(f32_to_f16(1e6f, Rnd::kRP), 0x7C00);
  CHECK_EQ(f32_to_f16(1e6f, Rnd::kRM), 0x7BFF);
  CHECK_EQ(f32_to_f16(-1e6f, Rnd::kRM), 0xFC00);
  CHECK_EQ(f32_to_f16(-1e6f, Rnd::kRP), 0xFBFF);
  CHECK_EQ(f32_to_f16(-1e6f, Rnd::kRZ), 0xFBFF);
  CHECK_EQ(f32_to_f16(kInf, Rnd::kRN), 0x7C00);
  CHECK_EQ(f32_to_f16(-kInf, Rnd::kRZ), 0xFC00);   // infinity is exact, not an overflow
  // .satfinite: |x| > MAX_NORM -> +-MAX_NORM (inf included), NaN -> NaN.
  CHECK_EQ(f32_to_f16(1e6f, Rnd::kRN, false, true), 0x7BFF);
  CHECK_EQ(f32_to_f16(kInf, Rnd::kRN, false, true), 0x7BFF);
  CHECK_EQ(f32_to_f16(-kInf, Rnd::kRN, false, true), 0xFBFF);
  CHECK_EQ(f32_to_f16(kNaN, Rnd::kRN, false, true), 0x7FFF);
  CHECK_EQ(f32_to_f16(kNaN, Rnd::kRN), 0x7FFF);
  // Subnormals (unit 2^-24). 2^-25 halfway 0..1 -> 0 (even); RP -> 1.
  CHECK_EQ(f32_to_f16(std::ldexp(1.0f, -25), Rnd::kRN), 0x0000);
  CHECK_EQ(f32_to_f16(std::ldexp(1.0f, -25), Rnd::kRP), 0x0001);
  CHECK_EQ(f32_to_f16(std::ldexp(1.5f, -25), Rnd::kRN), 0x0001);  // 0.75 unit -> 1
  CHECK_EQ(f32_to_f16(std::ldexp(3.0f, -25), Rnd::kRN), 0x0002);  // 1.5 units: tie -> 2
  CHECK_EQ(f32_to_f16(std::ldexp(1.0f, -26), Rnd::kRN), 0x0000);
  CHECK_EQ(f32_to_f16(std::ldexp(1.0f, -26), Rnd::kRP), 0x0001);
  CHECK_EQ(f32_to_f16(-std::ldexp(1.0f, -26), Rnd::kRN), 0x8000);
  CHECK_EQ(f32_to_f16(-std::ldexp(1.0f, -26), Rnd::kRM), 0x8001);
  CHECK_EQ(f32_to_f16(std::ldexp(3.0f, -24), Rnd::kRN), 0x0003);
  CHECK_EQ(f32_to_f16(std::ldexp(1.0f, -14), Rnd::kRN), 0x0400);   // min normal
  // 2^-14 - 2^-25 = 1023.5 units: tie between 0x03FF (odd) and 0x0400 -> 0x0400.
  CHECK_EQ(f32_to_f16(std::ldexp(2047.0f, -25), Rnd::kRN), 0x0400);
  CHECK_EQ(f32_to_f16(std::ldexp(2047.0f, -25), Rnd::kRZ), 0x03FF);
  CHECK_EQ(f32_to_f16(bf(0x00000001), Rnd::kRN), 0x0000);  // f32 subnormal -> 0
  CHECK_EQ(f32_to_f16(-0.0f, Rnd::kRN), 0x8000);
  // .relu: negatives -> +0, NaN -> canonical NaN, positives unchanged.
  CHECK_EQ(f32_to_f16(-1.0f, Rnd::kRN, true), 0x0000);
  CHECK_EQ(f32_to_f16(2.0f, Rnd::kRN, true), 0x4000);
  CHECK_EQ(f32_to_f16(kNaN, Rnd::kRN, true), 0x7FFF);
  CHECK_EQ(f32_to_f16(-kInf, Rnd::kRN, true, true), 0x0000);
  CHECK_EQ(f32_to_f16(-0.0f, Rnd::kRN, true), 0x0000);  // our choice: max(x, +0)

  // bf16: ulp at 1 is 2^-7. 0x3F808000 = 1 + 2^-8 is a tie -> 0x3F80; 0x3F818000 tie -> 0x3F82.
  CHECK_EQ(f32_to_bf16(bf(0x3F808000), Rnd::kRN), 0x3F80);
  CHECK_EQ(f32_to_bf16(bf(0x3F818000), Rnd::kRN), 0x3F82);
  CHECK_EQ(f32_to_bf16(bf(0x3F808001), Rnd::kRN), 0x3F81);
  CHECK_EQ(f32_to_bf16(bf(0x3F80FFFF), Rnd::kRZ), 0x3F80);
  CHECK_EQ(f32_to_bf16(bf(0x3F800001), Rnd::kRP), 0x3F81);
  CHECK_EQ(f32_to_bf16(bf(0xBF800001), Rnd::kRM), 0xBF81);
  CHECK_EQ(f32_to_bf16(bf(0xBF800001), Rnd::kRP), 0xBF80);
  // f32 MAX 0x7F7FFFFF: remainder 0xFFFF > half -> RN carries into exponent 255 -> inf.
  CHECK_EQ(f32_to_bf16(bf(0x7F7FFFFF), Rnd::kRN), 0x7F80);
  CHECK_EQ(f32_to_bf16(bf(0x7F7FFFFF), Rnd::kRZ), 0x7F7F);
  CHECK_EQ(f32_to_bf16(bf(0x7F7FFFFF), Rnd::kRN, false, true), 0x7F7F);
  CHECK_EQ(f32_to_bf16(bf(0x7F7F8000), Rnd::kRN), 0x7F80);  // tie, 0x7F7F odd -> up -> inf
  CHECK_EQ(f32_to_bf16(bf(0x7F7F7FFF), Rnd::kRN), 0x7F7F);
  CHECK_EQ(f32_to_bf16(-kInf, Rnd::kRN, false, true), 0xFF7F);
  CHECK_EQ(f32_to_bf16(kNaN, Rnd::kRN), 0x7FFF);
  CHECK_EQ(f32_to_bf16(-3.0f, Rnd::kRN, true), 0x0000);
  // bf16 subnormal: f32 0x00018000 is 1.5 bf16 units (unit 2^-133) -> tie -> 2.
  CHECK_EQ(f32_to_bf16(bf(0x00018000), Rnd::kRN), 0x0002);
  CHECK_EQ(f32_to_bf16(bf(0x00008000), Rnd::kRN), 0x0000);
  CHECK_EQ(f32_to_bf16(bf(0x00008000), Rnd::kRP), 0x0001);

  // f64 -> f16/bf16 direct (single rounding). 1 + 2^-11 + 2^-40: just above the f16 tie -> up.
  CHECK_EQ(f64_to_f16(1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40), Rnd::kRN), 0x3C01);
  CHECK_EQ(f64_to_f16(1.0 + std::ldexp(1.0, -11), Rnd::kRN), 0x3C00);
  CHECK_EQ(f64_to_f16(1e300, Rnd::kRZ), 0x7BFF);
  CHECK_EQ(f64_to_f16(1e-300, Rnd::kRP), 0x0001);
  // 1 + 2^-8 + 2^-40: just above the bf16 tie (2^-40 is still inside double's 53 bits) -> up.
  CHECK_EQ(f64_to_bf16(1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40), Rnd::kRN), 0x3F81);
  CHECK_EQ(f64_to_bf16(1e300, Rnd::kRN), 0x7F80);
  CHECK_EQ(f64_to_bf16(-1e-300, Rnd::kRM), 0x8001);
}

static void test_fp8() {
  // e4m3 encode.
  CHECK_EQ(f32_to_e4m3(1.0f, true), 0x38);
  CHECK_EQ(f32_to_e4m3(-1.0f, true), 0xB8);
  CHECK_EQ(f32_to_e4m3(448.0f, true), 0x7E);
  CHECK_EQ(f32_to_e4m3(460.0f, true), 0x7E);   // ulp 32 in [256,512): 12 < 16 -> 448
  CHECK_EQ(f32_to_e4m3(464.0f, false), 0x7E);  // tie 448 (110) / 480 (111) -> even 448
  CHECK_EQ(f32_to_e4m3(465.0f, false), 0x7F);  // rounds to 480 = beyond MAX -> NaN (no sat)
  CHECK_EQ(f32_to_e4m3(465.0f, true), 0x7E);
  CHECK_EQ(f32_to_e4m3(500.0f, true), 0x7E);
  CHECK_EQ(f32_to_e4m3(-500.0f, true), 0xFE);
  CHECK_EQ(f32_to_e4m3(-500.0f, false), 0xFF);
  CHECK_EQ(f32_to_e4m3(kInf, true), 0x7E);
  CHECK_EQ(f32_to_e4m3(-kInf, true), 0xFE);
  CHECK_EQ(f32_to_e4m3(kInf, false), 0x7F);
  CHECK_EQ(f32_to_e4m3(kNaN, true), 0x7F);
  CHECK_EQ(f32_to_e4m3(-1.0f, true, true), 0x00);   // relu
  CHECK_EQ(f32_to_e4m3(kNaN, true, true), 0x7F);
  CHECK_EQ(f32_to_e4m3(2.0f, true, true), 0x40);    // 0.1000.000
  // Normal ties: 1 + 1/16 between 1.0 (000) and 1.125 (001) -> 1.0; 1 + 3/16 -> 1.25 (010).
  CHECK_EQ(f32_to_e4m3(1.0625f, true), 0x38);
  CHECK_EQ(f32_to_e4m3(1.1875f, true), 0x3A);
  CHECK_EQ(f32_to_e4m3(1.07f, true), 0x39);
  // Subnormal range, unit 2^-9: 2^-10 = 0.5 unit tie -> 0; 0.75 unit -> 1; 1.5 units tie -> 2;
  // 7.5 units (2^-6 - 2^-10) tie between 7 (odd) and 8 (= min normal 0x08) -> 0x08.
  CHECK_EQ(f32_to_e4m3(std::ldexp(1.0f, -10), true), 0x00);
  CHECK_EQ(f32_to_e4m3(std::ldexp(3.0f, -11), true), 0x01);
  CHECK_EQ(f32_to_e4m3(std::ldexp(3.0f, -10), true), 0x02);
  CHECK_EQ(f32_to_e4m3(std::ldexp(15.0f, -10), true), 0x08);
  CHECK_EQ(f32_to_e4m3(std::ldexp(13.0f, -10), true), 0x06);  // 6.5 units tie -> 6
  CHECK_EQ(f32_to_e4m3(-std::ldexp(1.0f, -11), true), 0x80);  // underflow keeps the sign
  CHECK_EQ(f32_to_e4m3(std::ldexp(1.0f, -40), true), 0x00);
  // e5m2 encode: 61440 is halfway 57344 (11) / 65536 (00, even) -> overflow.
  CHECK_EQ(f32_to_e5m2(57344.0f, true), 0x7B);
  CHECK_EQ(f32_to_e5m2(61439.0f, false), 0x7B);
  CHECK_EQ(f32_to_e5m2(61440.0f, false), 0x7C);
  CHECK_EQ(f32_to_e5m2(61440.0f, true), 0x7B);
  CHECK_EQ(f32_to_e5m2(-1e9f, false), 0xFC);
  CHECK_EQ(f32_to_e5m2(-1e9f, true), 0xFB);
  CHECK_EQ(f32_to_e5m2(kInf, true), 0x7B);
  CHECK_EQ(f32_to_e5m2(kInf, false), 0x7C);
  CHECK_EQ(f32_to_e5m2(kNaN, true), 0x7F);
  CHECK_EQ(f32_to_e5m2(1.125f, true), 0x3C);   // tie 1.0 (00) / 1.25 (01) -> 1.0
  CHECK_EQ(f32_to_e5m2(1.375f, true), 0x3E);   // tie 1.25 (01) / 1.5 (10) -> 1.5
  CHECK_EQ(f32_to_e5m2(std::ldexp(1.0f, -17), true), 0x00);  // 0.5 unit (2^-16) tie -> 0
  CHECK_EQ(f32_to_e5m2(std::ldexp(3.0f, -17), true), 0x02);  // 1.5 units tie -> 2
  CHECK_EQ(f32_to_e5m2(-0.5f, true, true), 0x00);
  // f16 sources: f16 0x5F80 = 1.111b*2^8 = 480 -> beyond 448: sat 0x7E; 0x3C00 -> 0x38 / 0x3C.
  CHECK_EQ(f16_to_e4m3(0x5F80, true), 0x7E);
  CHECK_EQ(f16_to_e4m3(0x3C00, true), 0x38);
  CHECK_EQ(f16_to_e4m3(0xBC00, true, true), 0x00);
  CHECK_EQ(f16_to_e5m2(0x3C00, true), 0x3C);
  CHECK_EQ(f16_to_e5m2(0x7BFF, true), 0x7B);   // 65504 > 57344 -> MAX
  CHECK_EQ(f16_to_e5m2(0x7C00, false), 0x7C);
  CHECK_EQ(f16_to_e5m2(0x3C80, true), 0x3C);   // f16 1.125: tie -> 1.0
  CHECK_EQ(f16_to_e5m2(0x7E00, true), 0x7F);   // NaN
  // Round trip of all 256 codes: decode then encode gives the code back (except NaN; e5m2 inf
  // needs the non-satfinite path; with satfinite it clamps to MAX).
  int bad4 = 0, bad5 = 0;
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) != 0x7F) {
      if (f32_to_e4m3(e4m3_to_f32(uint8_t(c)), true) != c) ++bad4;
      if (f32_to_e4m3(e4m3_to_f32(uint8_t(c)), false) != c) ++bad4;
      if (f16_to_e4m3(e4m3_to_f16(uint8_t(c)), true) != c) ++bad4;
    }
    const bool nan5 = (c & 0x7C) == 0x7C && (c & 3);
    const bool inf5 = (c & 0x7F) == 0x7C;
    if (!nan5) {
      if (f32_to_e5m2(e5m2_to_f32(uint8_t(c)), false) != c) ++bad5;
      if (!inf5 && f32_to_e5m2(e5m2_to_f32(uint8_t(c)), true) != c) ++bad5;
      if (inf5 && f32_to_e5m2(e5m2_to_f32(uint8_t(c)), true) != ((c & 0x80) | 0x7B)) ++bad5;
    } else if (f32_to_e5m2(e5m2_to_f32(uint8_t(c)), true) != 0x7F) {
      ++bad5;
    }
  }
  CHECK_EQ(bad4, 0);
  CHECK_EQ(bad5, 0);
}

static void test_tf32() {
  // tf32 keeps the top 10 mantissa bits; 0x3F801000 has exactly half an ulp (bit 12) below.
  CHECK_EQ(f32_to_tf32(bf(0x3F801000), Rnd::kRNA), 0x3F802000u);  // ties away
  CHECK_EQ(f32_to_tf32(bf(0x3F801000), Rnd::kNone), 0x3F802000u);  // default = .rna
  CHECK_EQ(f32_to_tf32(bf(0x3F801000), Rnd::kRN), 0x3F800000u);   // ties to even
  CHECK_EQ(f32_to_tf32(bf(0x3F801000), Rnd::kRZ), 0x3F800000u);
  CHECK_EQ(f32_to_tf32(bf(0x3F803000), Rnd::kRN), 0x3F804000u);   // odd kept bit -> up
  CHECK_EQ(f32_to_tf32(bf(0x3F803000), Rnd::kRNA), 0x3F804000u);
  CHECK_EQ(f32_to_tf32(bf(0x3F803000), Rnd::kRZ), 0x3F802000u);
  CHECK_EQ(f32_to_tf32(bf(0xBF801000), Rnd::kRNA), 0xBF802000u);
  CHECK_EQ(f32_to_tf32(bf(0x3F800FFF), Rnd::kRNA), 0x3F800000u);
  CHECK_EQ(f32_to_tf32(bf(0x3F801FFF), Rnd::kRZ), 0x3F800000u);
  // Overflow: 0x7F7FF000 is a tie at the top -> rna rounds up into inf; satfinite -> MAX.
  CHECK_EQ(f32_to_tf32(bf(0x7F7FF000), Rnd::kRNA), 0x7F800000u);
  CHECK_EQ(f32_to_tf32(bf(0x7F7FF000), Rnd::kRNA, true), 0x7F7FE000u);
  CHECK_EQ(f32_to_tf32(bf(0x7F7FF000), Rnd::kRZ), 0x7F7FE000u);
  CHECK_EQ(f32_to_tf32(kInf, Rnd::kRNA), 0x7F800000u);
  CHECK_EQ(f32_to_tf32(-kInf, Rnd::kRNA, true), 0xFF7FE000u);
  CHECK_EQ(f32_to_tf32(kNaN, Rnd::kRNA), 0x7FFFE000u);
  // Subnormal f32 keeps the tf32 subnormal grid (unit 2^-136 = f32 bit 13).
  CHECK_EQ(f32_to_tf32(bf(0x00001000), Rnd::kRNA), 0x00002000u);
  CHECK_EQ(f32_to_tf32(bf(0x00001000), Rnd::kRN), 0x00000000u);
  CHECK_EQ(f32_to_tf32(1.0f, Rnd::kRNA), 0x3F800000u);
}

static void test_f64_f32_int() {
  const double one_plus_2m24 = 1.0 + std::ldexp(1.0, -24);   // halfway 1 and 1+2^-23
  CHECK_EQ(fb(f64_to_f32(one_plus_2m24, Rnd::kRN)), 0x3F800000u);
  CHECK_EQ(fb(f64_to_f32(one_plus_2m24, Rnd::kRP)), 0x3F800001u);
  CHECK_EQ(fb(f64_to_f32(one_plus_2m24, Rnd::kRZ)), 0x3F800000u);
  CHECK_EQ(fb(f64_to_f32(one_plus_2m24 + std::ldexp(1.0, -50), Rnd::kRN)), 0x3F800001u);
  CHECK_EQ(fb(f64_to_f32(-one_plus_2m24, Rnd::kRM)), 0xBF800001u);
  CHECK_EQ(fb(f64_to_f32(1.0 + 3 * std::ldexp(1.0, -24), Rnd::kRN)), 0x3F800002u);  // tie, odd
  CHECK_EQ(fb(f64_to_f32(1e39, Rnd::kRN)), 0x7F800000u);
  CHECK_EQ(fb(f64_to_f32(1e39, Rnd::kRZ)), 0x7F7FFFFFu);
  CHECK_EQ(fb(f64_to_f32(-1e39, Rnd::kRP)), 0xFF7FFFFFu);
  CHECK_EQ(fb(f64_to_f32(std::ldexp(1.0, -150), Rnd::kRN)), 0x00000000u);   // tie -> 0
  CHECK_EQ(fb(f64_to_f32(std::ldexp(1.0, -150), Rnd::kRP)), 0x00000001u);
  CHECK_EQ(fb(f64_to_f32(std::ldexp(3.0, -150), Rnd::kRN)), 0x00000002u);   // 1.5 -> 2
  CHECK_EQ(fb(f64_to_f32(std::ldexp(1.0, -140), Rnd::kRN)), 0x00000200u);   // 2^9 units
  CHECK_EQ(fb(f64_to_f32(std::ldexp(1.0, -140), Rnd::kRN, true)), 0x00000000u);
  CHECK_EQ(fb(f64_to_f32(-std::ldexp(1.0, -140), Rnd::kRN, true)), 0x80000000u);
  CHECK_EQ(fb(f64_to_f32(std::ldexp(1.0, -126), Rnd::kRN, true)), 0x00800000u);
  CHECK_EQ(fb(f64_to_f32(1.5, Rnd::kRN, false, true)), 0x3F800000u);
  CHECK_EQ(fb(f64_to_f32(-2.0, Rnd::kRN, false, true)), 0x00000000u);
  CHECK_EQ(fb(f64_to_f32(std::nan(""), Rnd::kRN, false, true)), 0x00000000u);
  CHECK_EQ(fb(f64_to_f32(std::nan(""), Rnd::kRN)), 0x7FFFFFFFu);
  CHECK_EQ(fb(f64_to_f32(0.25, Rnd::kRN)), 0x3E800000u);

  // float -> int.
  CHECK_EQ(float_to_int(2.5, Rnd::kRNI, true, 32), 2u);
  CHECK_EQ(float_to_int(3.5, Rnd::kRNI, true, 32), 4u);
  CHECK_EQ(float_to_int(-2.5, Rnd::kRNI, true, 32), uint64_t(-2));
  CHECK_EQ(float_to_int(2.7, Rnd::kRZI, true, 32), 2u);
  CHECK_EQ(float_to_int(-2.7, Rnd::kRZI, true, 32), uint64_t(-2));
  CHECK_EQ(float_to_int(-2.7, Rnd::kNone, true, 32), uint64_t(-2));
  CHECK_EQ(float_to_int(-2.1, Rnd::kRMI, true, 32), uint64_t(-3));
  CHECK_EQ(float_to_int(2.1, Rnd::kRPI, true, 32), 3u);
  CHECK_EQ(float_to_int(1e10, Rnd::kRZI, true, 32), 0x7FFFFFFFu);
  CHECK_EQ(float_to_int(-1e10, Rnd::kRZI, true, 32), uint64_t(int64_t(INT32_MIN)));
  CHECK_EQ(float_to_int(std::nan(""), Rnd::kRNI, true, 32), 0u);
  CHECK_EQ(float_to_int(std::nan(""), Rnd::kRNI, false, 64), 0u);
  CHECK_EQ(float_to_int(-1.0, Rnd::kRZI, false, 32), 0u);
  CHECK_EQ(float_to_int(-0.7, Rnd::kRZI, false, 32), 0u);
  CHECK_EQ(float_to_int(300.0, Rnd::kRZI, false, 8), 255u);
  CHECK_EQ(float_to_int(-200.0, Rnd::kRZI, true, 8), uint64_t(-128));
  CHECK_EQ(float_to_int(127.6, Rnd::kRNI, true, 8), 127u);
  CHECK_EQ(float_to_int(65535.4, Rnd::kRNI, false, 16), 65535u);
  CHECK_EQ(float_to_int(65535.5, Rnd::kRNI, false, 16), 65535u);   // 65536 saturates
  CHECK_EQ(float_to_int(std::ldexp(1.0, 64), Rnd::kRZI, false, 64), ~0ull);
  CHECK_EQ(float_to_int(std::ldexp(1.0, 63), Rnd::kRZI, false, 64), 0x8000000000000000ull);
  CHECK_EQ(float_to_int(std::ldexp(1.0, 63), Rnd::kRZI, true, 64), 0x7FFFFFFFFFFFFFFFull);
  CHECK_EQ(float_to_int(-std::ldexp(1.0, 63), Rnd::kRZI, true, 64), 0x8000000000000000ull);
  CHECK_EQ(float_to_int(-1e30, Rnd::kRZI, true, 64), 0x8000000000000000ull);
  CHECK_EQ(float_to_int(double(kInf), Rnd::kRZI, false, 32), 0xFFFFFFFFu);
  CHECK_EQ(float_to_int(-double(kInf), Rnd::kRZI, false, 32), 0u);
  CHECK_EQ(float_to_int(4294967295.0, Rnd::kRZI, false, 32), 0xFFFFFFFFu);
  CHECK_EQ(float_to_int(-0.5, Rnd::kRNI, true, 32), 0u);

  // int -> f32: 2^24 + 1 is halfway 2^24 (0x4B800000) and 2^24 + 2 (0x4B800001).
  CHECK_EQ(fb(int_to_f32(16777217, false, 32, Rnd::kRN)), 0x4B800000u);
  CHECK_EQ(fb(int_to_f32(16777217, false, 32, Rnd::kRP)), 0x4B800001u);
  CHECK_EQ(fb(int_to_f32(16777217, false, 32, Rnd::kRZ)), 0x4B800000u);
  CHECK_EQ(fb(int_to_f32(16777219, false, 32, Rnd::kRN)), 0x4B800002u);  // tie, odd -> up
  CHECK_EQ(fb(int_to_f32(uint64_t(-16777217), true, 32, Rnd::kRN)), 0xCB800000u);
  CHECK_EQ(fb(int_to_f32(uint64_t(-16777217), true, 32, Rnd::kRM)), 0xCB800001u);
  CHECK_EQ(fb(int_to_f32(uint64_t(-16777217), true, 32, Rnd::kRP)), 0xCB800000u);
  // u64 max = 2^64 - 1: RN/RP -> 2^64 (0x5F800000); RZ/RM -> (2^24-1)*2^40 (0x5F7FFFFF).
  CHECK_EQ(fb(int_to_f32(~0ull, false, 64, Rnd::kRN)), 0x5F800000u);
  CHECK_EQ(fb(int_to_f32(~0ull, false, 64, Rnd::kRZ)), 0x5F7FFFFFu);
  CHECK_EQ(fb(int_to_f32(~0ull, false, 64, Rnd::kRM)), 0x5F7FFFFFu);
  CHECK_EQ(fb(int_to_f32(~0ull, false, 64, Rnd::kRP)), 0x5F800000u);
  CHECK_EQ(fb(int_to_f32(0x8000000000000001ull, false, 64, Rnd::kRZ)), 0x5F000000u);
  CHECK_EQ(fb(int_to_f32(0x8000000000000001ull, false, 64, Rnd::kRP)), 0x5F000001u);
  CHECK_EQ(fb(int_to_f32(0x8000000000000000ull, true, 64, Rnd::kRN)), 0xDF000000u);  // -2^63
  CHECK_EQ(fb(int_to_f32(0xFF, true, 8, Rnd::kRN)), 0xBF800000u);      // s8 -1
  CHECK_EQ(fb(int_to_f32(0xFF, false, 8, Rnd::kRN)), 0x437F0000u);     // u8 255
  CHECK_EQ(fb(int_to_f32(0xFFFFFF80, true, 8, Rnd::kRN)), 0xC3000000u);  // low byte 0x80 = -128
  CHECK_EQ(fb(int_to_f32(0, true, 32, Rnd::kRM)), 0x00000000u);
  // int -> f64: 2^53 + 1 halfway.
  CHECK_EQ(db(int_to_f64((1ull << 53) + 1, false, 64, Rnd::kRN)), 0x4340000000000000ull);
  CHECK_EQ(db(int_to_f64((1ull << 53) + 1, false, 64, Rnd::kRP)), 0x4340000000000001ull);
  CHECK_EQ(db(int_to_f64(uint64_t(-3), true, 64, Rnd::kRN)), 0xC008000000000000ull);
  CHECK_EQ(db(int_to_f64(~0ull, false, 64, Rnd::kRZ)), 0x43EFFFFFFFFFFFFFull);

  // cvt.rXi.f32.f32
  CHECK(round_f32(2.5f, Rnd::kRNI, false, false) == 2.0f);
  CHECK(round_f32(3.5f, Rnd::kRNI, false, false) == 4.0f);
  CHECK_EQ(fb(round_f32(-0.5f, Rnd::kRNI, false, false)), 0x80000000u);
  CHECK_EQ(fb(round_f32(-0.9f, Rnd::kRZI, false, false)), 0x80000000u);
  CHECK(round_f32(0.1f, Rnd::kRPI, false, false) == 1.0f);
  CHECK(round_f32(-0.1f, Rnd::kRMI, false, false) == -1.0f);
  CHECK(round_f32(bf(0x00000001), Rnd::kRPI, false, false) == 1.0f);
  CHECK_EQ(fb(round_f32(bf(0x00000001), Rnd::kRPI, true, false)), 0x00000000u);
  CHECK(round_f32(1.7f, Rnd::kRNI, false, true) == 1.0f);
  CHECK(round_f32(-1.7f, Rnd::kRNI, false, true) == 0.0f);
  CHECK(round_f32(kNaN, Rnd::kRNI, false, true) == 0.0f);
  CHECK(std::isnan(round_f32(kNaN, Rnd::kRNI, false, false)));
  CHECK(round_f32(16777215.0f, Rnd::kRNI, false, false) == 16777215.0f);
  CHECK(round_f32(8388607.5f, Rnd::kRNI, false, false) == 8388608.0f);   // tie, odd -> up
  CHECK(round_f32(-kInf, Rnd::kRZI, false, false) == -kInf);
}

static void test_arith() {
  // add: 1 + 2^-30 lies strictly between 1 and 1+2^-23.
  const float tiny = std::ldexp(1.0f, -30);
  CHECK_EQ(fb(add_f32(1.0f, tiny, Rnd::kRN)), 0x3F800000u);
  CHECK_EQ(fb(add_f32(1.0f, tiny, Rnd::kRZ)), 0x3F800000u);
  CHECK_EQ(fb(add_f32(1.0f, tiny, Rnd::kRM)), 0x3F800000u);
  CHECK_EQ(fb(add_f32(1.0f, tiny, Rnd::kRP)), 0x3F800001u);
  CHECK_EQ(fb(add_f32(-1.0f, -tiny, Rnd::kRM)), 0xBF800001u);
  CHECK_EQ(fb(add_f32(-1.0f, -tiny, Rnd::kRP)), 0xBF800000u);
  CHECK_EQ(fb(sub_f32(1.0f, tiny, Rnd::kRZ)), 0x3F7FFFFFu);   // 1 - 2^-30 -> below 1
  CHECK_EQ(fb(sub_f32(1.0f, tiny, Rnd::kRN)), 0x3F800000u);
  // Ties: 1 + 2^-24 -> 1 (even); (1+2^-23) + 2^-24 -> 1+2^-22 (0x3F800002, even).
  CHECK_EQ(fb(add_f32(1.0f, std::ldexp(1.0f, -24), Rnd::kRN)), 0x3F800000u);
  CHECK_EQ(fb(add_f32(bf(0x3F800001), std::ldexp(1.0f, -24), Rnd::kRN)), 0x3F800002u);
  CHECK_EQ(fb(add_f32(bf(0x7F7FFFFF), bf(0x7F7FFFFF), Rnd::kRN)), 0x7F800000u);
  CHECK_EQ(fb(add_f32(bf(0x7F7FFFFF), bf(0x7F7FFFFF), Rnd::kRZ)), 0x7F7FFFFFu);
  CHECK_EQ(fb(sub_f32(1.0f, 1.0f, Rnd::kRM)), 0x80000000u);   // x - x = -0 under RM
  CHECK_EQ(fb(sub_f32(1.0f, 1.0f, Rnd::kRN)), 0x00000000u);
  CHECK_EQ(fb(add_f32(kInf, -kInf, Rnd::kRN)), 0x7FFFFFFFu);  // canonical NaN
  // mul: 3 * (1+2^-23) = 3 + 1.5 ulp (ulp 2^-22 in [2,4)) -> tie between +1 (odd) and +2.
  CHECK_EQ(fb(mul_f32(3.0f, bf(0x3F800001), Rnd::kRN)), 0x40400002u);
  CHECK_EQ(fb(mul_f32(3.0f, bf(0x3F800001), Rnd::kRZ)), 0x40400001u);
  CHECK_EQ(fb(mul_f32(3.0f, bf(0x3F800001), Rnd::kRP)), 0x40400002u);
  CHECK_EQ(fb(mul_f32(-3.0f, bf(0x3F800001), Rnd::kRP)), 0xC0400001u);
  // Subnormal result: 2^-100 * 2^-40 = 2^-140 = 0x00000200.
  CHECK_EQ(fb(mul_f32(std::ldexp(1.0f, -100), std::ldexp(1.0f, -40), Rnd::kRN)), 0x00000200u);
  CHECK_EQ(fb(mul_f32(std::ldexp(1.0f, -100), std::ldexp(1.0f, -50), Rnd::kRP)), 0x00000001u);
  CHECK_EQ(fb(mul_f32(std::ldexp(1.0f, -100), std::ldexp(1.0f, -50), Rnd::kRN)), 0x00000000u);
  // fma: (1+2^-12)^2 - 1 = 2^-11 + 2^-24 exactly = 0x3A000000 | bit (23-13) -> 0x3A000400.
  // (Two roundings would give 2^-11 = 0x3A000000: the product's 2^-24 is a tie to even.)
  const float a12 = 1.0f + std::ldexp(1.0f, -12);
  CHECK_EQ(fb(fma_f32(a12, a12, -1.0f, Rnd::kRN)), 0x3A000400u);
  // fma with directed rounding: 1*1 + 2^-30 under RP -> 0x3F800001, RM -> 1.
  CHECK_EQ(fb(fma_f32(1.0f, 1.0f, tiny, Rnd::kRP)), 0x3F800001u);
  CHECK_EQ(fb(fma_f32(1.0f, 1.0f, tiny, Rnd::kRM)), 0x3F800000u);
  CHECK_EQ(fb(fma_f32(1.0f, 1.0f, -tiny, Rnd::kRZ)), 0x3F7FFFFFu);
  // div: 1/3 = 1.0101...b * 2^-2; mantissa 0x2AAAAA, next bits 1010... > half.
  CHECK_EQ(fb(div_f32(1.0f, 3.0f, Rnd::kRN)), 0x3EAAAAABu);
  CHECK_EQ(fb(div_f32(1.0f, 3.0f, Rnd::kRZ)), 0x3EAAAAAAu);
  CHECK_EQ(fb(div_f32(1.0f, 3.0f, Rnd::kRM)), 0x3EAAAAAAu);
  CHECK_EQ(fb(div_f32(1.0f, 3.0f, Rnd::kRP)), 0x3EAAAAABu);
  CHECK_EQ(fb(div_f32(-1.0f, 3.0f, Rnd::kRM)), 0xBEAAAAABu);
  CHECK_EQ(fb(div_f32(1.0f, 0.0f, Rnd::kRN)), 0x7F800000u);
  CHECK_EQ(fb(div_f32(0.0f, 0.0f, Rnd::kRN)), 0x7FFFFFFFu);
  // sqrt(2) = 1.41421356...; 0x3FB504F3 = 1.4142135381, 0x3FB504F4 = 1.4142136574.
  CHECK_EQ(fb(sqrt_f32(2.0f, Rnd::kRN)), 0x3FB504F3u);
  CHECK_EQ(fb(sqrt_f32(2.0f, Rnd::kRZ)), 0x3FB504F3u);
  CHECK_EQ(fb(sqrt_f32(2.0f, Rnd::kRP)), 0x3FB504F4u);
  CHECK_EQ(fb(sqrt_f32(-0.0f, Rnd::kRN)), 0x80000000u);
  CHECK_EQ(fb(sqrt_f32(-1.0f, Rnd::kRN)), 0x7FFFFFFFu);
  CHECK_EQ(fb(rcp_f32(3.0f, Rnd::kRZ)), 0x3EAAAAAAu);
  CHECK_EQ(fb(rcp_f32(3.0f, Rnd::kRN)), 0x3EAAAAABu);
  CHECK_EQ(fb(rcp_f32(-0.0f, Rnd::kRN)), 0xFF800000u);
  // The host mode is restored: a plain division after a RZ op still rounds to nearest.
  volatile float one = 1.0f, three = 3.0f;
  CHECK_EQ(fb(one / three), 0x3EAAAAABu);
  // f64: 1 + 2^-60 lies between 1 and 1+2^-52.
  const double t60 = std::ldexp(1.0, -60);
  CHECK_EQ(db(add_f64(1.0, t60, Rnd::kRN)), 0x3FF0000000000000ull);
  CHECK_EQ(db(add_f64(1.0, t60, Rnd::kRP)), 0x3FF0000000000001ull);
  CHECK_EQ(db(mul_f64(bd(0x3FF0000000000001ull), bd(0x3FF0000000000001ull), Rnd::kRP)),
           0x3FF0000000000003ull);   // 1 + 2^-51 + 2^-104 -> up
  CHECK_EQ(db(mul_f64(bd(0x3FF0000000000001ull), bd(0x3FF0000000000001ull), Rnd::kRN)),
           0x3FF0000000000002ull);
  // fma: (1+2^-27)^2 - 1 = 2^-26 + 2^-54 exactly: 2^-26 with mantissa bit 52-28=24 set.
  const double a27 = 1.0 + std::ldexp(1.0, -27);
  CHECK_EQ(db(fma_f64(a27, a27, -1.0, Rnd::kRN)), 0x3E50000001000000ull);
  CHECK_EQ(db(div_f64(1.0, 3.0, Rnd::kRN)), 0x3FD5555555555555ull);   // 0101... below half
  CHECK_EQ(db(div_f64(1.0, 3.0, Rnd::kRP)), 0x3FD5555555555556ull);
  CHECK_EQ(db(rcp_f64(3.0, Rnd::kRP)), 0x3FD5555555555556ull);
  CHECK(sqrt_f64(16.0, Rnd::kRZ) == 4.0);
  CHECK_EQ(db(sqrt_f64(2.0, Rnd::kRN)), 0x3FF6A09E667F3BCDull);   // sqrt(2) well known
  CHECK_EQ(db(sqrt_f64(2.0, Rnd::kRZ)), 0x3FF6A09E667F3BCCull);   // RN rounded up
  // ftz / sat helpers.
  CHECK_EQ(fb(ftz_f32(bf(0x00000001))), 0x00000000u);
  CHECK_EQ(fb(ftz_f32(bf(0x807FFFFF))), 0x80000000u);
  CHECK_EQ(fb(ftz_f32(bf(0x00800000))), 0x00800000u);
  CHECK(sat_f32(1.5f) == 1.0f);
  CHECK_EQ(fb(sat_f32(-0.5f)), 0x00000000u);
  CHECK_EQ(fb(sat_f32(kNaN)), 0x00000000u);
  CHECK(sat_f32(0.25f) == 0.25f);
}

static void test_minmax() {
  CHECK(fmin_f32(1.0f, kNaN, false, false) == 1.0f);
  CHECK(fmin_f32(kNaN, 2.0f, false, false) == 2.0f);
  CHECK_EQ(fb(fmin_f32(kNaN, kNaN, false, false)), 0x7FFFFFFFu);
  CHECK_EQ(fb(fmin_f32(1.0f, kNaN, false, true)), 0x7FFFFFFFu);
  CHECK_EQ(fb(fmax_f32(kNaN, 1.0f, false, true)), 0x7FFFFFFFu);
  CHECK_EQ(fb(fmin_f32(0.0f, -0.0f, false, false)), 0x80000000u);   // +0.0 > -0.0
  CHECK_EQ(fb(fmin_f32(-0.0f, 0.0f, false, false)), 0x80000000u);
  CHECK_EQ(fb(fmax_f32(-0.0f, 0.0f, false, false)), 0x00000000u);
  CHECK_EQ(fb(fmax_f32(0.0f, -0.0f, false, false)), 0x00000000u);
  CHECK(fmax_f32(-3.0f, 2.0f, false, false) == 2.0f);
  CHECK(fmin_f32(-3.0f, 2.0f, false, false) == -3.0f);
  // ftz: both subnormal inputs become +0 -> +0.
  CHECK_EQ(fb(fmin_f32(bf(0x00000001), bf(0x00000002), true, false)), 0x00000000u);
  CHECK_EQ(fb(fmin_f32(bf(0x00000001), bf(0x00000002), false, false)), 0x00000001u);
  CHECK_EQ(fb(fmin_f32(bf(0x80000001), 0.0f, true, false)), 0x80000000u);
  // f16 / bf16.
  CHECK_EQ(hmin(0x3C00, 0x7E00, false, false, false), 0x3C00);
  CHECK_EQ(hmin(0x7E00, 0x7E00, false, false, false), 0x7FFF);
  CHECK_EQ(hmin(0x3C00, 0x7E00, false, false, true), 0x7FFF);
  CHECK_EQ(hmax(0x7C01, 0xC000, false, false, false), 0xC000);
  CHECK_EQ(hmin(0x0000, 0x8000, false, false, false), 0x8000);
  CHECK_EQ(hmax(0x8000, 0x0000, false, false, false), 0x0000);
  CHECK_EQ(hmin(0x3C00, 0x4000, false, false, false), 0x3C00);
  CHECK_EQ(hmax(0x3C00, 0x4000, false, false, false), 0x4000);
  CHECK_EQ(hmin(0xBC00, 0x3C00, false, false, false), 0xBC00);
  CHECK_EQ(hmin(0x0001, 0x0002, false, true, false), 0x0000);
  CHECK_EQ(hmin(0x0001, 0x0002, false, false, false), 0x0001);
  CHECK_EQ(hmax(0x3F80, 0x4000, true, false, false), 0x4000);
  CHECK_EQ(hmax(0x7FC0, 0x4000, true, false, false), 0x4000);
  CHECK_EQ(hmax(0x7FC0, 0x4000, true, false, true), 0x7FFF);
}

static void test_half_arith() {
  CHECK_EQ(hadd(0x3C00, 0x3C00, false, Rnd::kRN, false, false), 0x4000);   // 1 + 1 = 2
  // 1 + 2^-11 (f16 2^-11: exp 4 -> 0x1000): tie -> 1 (even); RP -> 0x3C01.
  CHECK_EQ(hadd(0x3C00, 0x1000, false, Rnd::kRN, false, false), 0x3C00);
  CHECK_EQ(hadd(0x3C00, 0x1000, false, Rnd::kRP, false, false), 0x3C01);
  CHECK_EQ(hadd(0x3C01, 0x1000, false, Rnd::kRN, false, false), 0x3C02);   // tie, odd -> up
  CHECK_EQ(hadd(0x3C00, 0x0001, false, Rnd::kRP, false, false), 0x3C01);   // 1 + 2^-24
  CHECK_EQ(hadd(0x3C00, 0x0001, false, Rnd::kRN, false, false), 0x3C00);
  CHECK_EQ(hsub(0x3C00, 0x0001, false, Rnd::kRZ, false, false), 0x3BFF);   // 1 - 2^-24
  CHECK_EQ(hsub(0x3C00, 0x0001, false, Rnd::kRN, false, false), 0x3C00);
  CHECK_EQ(hadd(0x7BFF, 0x7BFF, false, Rnd::kRN, false, false), 0x7C00);
  CHECK_EQ(hadd(0x7BFF, 0x7BFF, false, Rnd::kRZ, false, false), 0x7BFF);
  CHECK_EQ(hadd(0x7C00, 0xFC00, false, Rnd::kRN, false, false), 0x7FFF);
  CHECK_EQ(hadd(0x7E00, 0x3C00, false, Rnd::kRN, false, false), 0x7FFF);
  CHECK_EQ(hadd(0x7E00, 0x3C00, false, Rnd::kRN, false, true), 0x0000);    // sat: NaN -> +0
  CHECK_EQ(hadd(0x3A00, 0x3A00, false, Rnd::kRN, false, true), 0x3C00);    // .75+.75 -> 1
  CHECK_EQ(hadd(0xBC00, 0x3800, false, Rnd::kRN, false, true), 0x0000);    // -0.5 -> 0
  CHECK_EQ(hadd(0x3400, 0x3400, false, Rnd::kRN, false, true), 0x3800);    // .25+.25 = .5
  // ftz: inputs and results. 0x0001 + 0x0001 = 0x0002 normally, 0 with ftz.
  CHECK_EQ(hadd(0x0001, 0x0001, false, Rnd::kRN, false, false), 0x0002);
  CHECK_EQ(hadd(0x0001, 0x0001, false, Rnd::kRN, true, false), 0x0000);
  CHECK_EQ(hsub(0x0400, 0x03FF, false, Rnd::kRN, true, false), 0x0400);    // 0x03FF -> 0
  CHECK_EQ(hsub(0x0401, 0x0400, false, Rnd::kRN, false, false), 0x0001);
  CHECK_EQ(hsub(0x0401, 0x0400, false, Rnd::kRN, true, false), 0x0000);    // result flushed
  CHECK_EQ(hsub(0x3C00, 0x3C00, false, Rnd::kRM, false, false), 0x8000);   // x - x = -0 (RM)
  CHECK_EQ(hsub(0x3C00, 0x3C00, false, Rnd::kRN, false, false), 0x0000);
  // bf16 add over a wide exponent gap (not exact in double: uses round-to-odd).
  // 1 + 2^-133: RP -> 0x3F81, RN/RM -> 0x3F80; 1 - 2^-133: RZ -> 0x3F7F (0.99609375).
  CHECK_EQ(hadd(0x3F80, 0x0001, true, Rnd::kRP, false, false), 0x3F81);
  CHECK_EQ(hadd(0x3F80, 0x0001, true, Rnd::kRN, false, false), 0x3F80);
  CHECK_EQ(hadd(0x3F80, 0x0001, true, Rnd::kRM, false, false), 0x3F80);
  CHECK_EQ(hsub(0x3F80, 0x0001, true, Rnd::kRZ, false, false), 0x3F7F);
  CHECK_EQ(hsub(0x3F80, 0x0001, true, Rnd::kRN, false, false), 0x3F80);
  // bf16: 1 + 2^-8 (0x3B80) tie -> 1; 1 + 2^-8 + 2^-133 just above the tie -> 0x3F81.
  CHECK_EQ(hadd(0x3F80, 0x3B80, true, Rnd::kRN, false, false), 0x3F80);
  CHECK_EQ(hfma(0x3F80, 0x3B80, 0x3F80, true, Rnd::kRN, false, false, false), 0x3F80);
  CHECK_EQ(hadd(0x7F7F, 0x7F7F, true, Rnd::kRN, false, false), 0x7F80);
  // mul: (1+2^-10)^2 = 1 + 2^-9 + 2^-20: RN -> 1+2^-9 (0x3C02), RP -> 0x3C03.
  CHECK_EQ(hmul(0x3C01, 0x3C01, false, Rnd::kRN, false, false), 0x3C02);
  CHECK_EQ(hmul(0x3C01, 0x3C01, false, Rnd::kRP, false, false), 0x3C03);
  CHECK_EQ(hmul(0x3C01, 0x3C01, false, Rnd::kRZ, false, false), 0x3C02);
  CHECK_EQ(hmul(0x4000, 0xC200, false, Rnd::kRN, false, false), 0xC600);   // 2 * -3 = -6
  CHECK_EQ(hmul(0x0200, 0x0200, false, Rnd::kRP, false, false), 0x0001);   // 2^-30 -> RP 2^-24
  CHECK_EQ(hmul(0x0200, 0x0200, false, Rnd::kRN, false, false), 0x0000);
  CHECK_EQ(hmul(0x3F81, 0x3F81, true, Rnd::kRN, false, false), 0x3F82);    // 1+2^-6+2^-14
  // fma single rounding: (1+2^-10)(1+3*2^-10) - 1 = 2^-8 + 3*2^-20; f16 ulp at 2^-8 is 2^-18
  // -> 0.75 ulp -> RN 2^-8 + 2^-18 = 0x1C01. (Rounding the product first would give 0x1C00.)
  CHECK_EQ(hfma(0x3C01, 0x3C03, 0xBC00, false, Rnd::kRN, false, false, false), 0x1C01);
  CHECK_EQ(hfma(0x3C01, 0x3C03, 0xBC00, false, Rnd::kRZ, false, false, false), 0x1C00);
  // (1+2^-10)^2 - 1 = 2^-9 + 2^-20: exactly half an ulp (2^-19) above 2^-9 -> RN even 0x1800.
  CHECK_EQ(hfma(0x3C01, 0x3C01, 0xBC00, false, Rnd::kRN, false, false, false), 0x1800);
  CHECK_EQ(hfma(0x3C01, 0x3C01, 0xBC00, false, Rnd::kRP, false, false, false), 0x1801);
  CHECK_EQ(hfma(0x3C00, 0xBC00, 0x0000, false, Rnd::kRN, false, false, true), 0x0000);  // relu
  CHECK_EQ(hfma(0x3C00, 0x4000, 0x3C00, false, Rnd::kRN, false, false, true), 0x4200);  // 3
  CHECK_EQ(hfma(0x7C00, 0x0000, 0x3C00, false, Rnd::kRN, false, false, true), 0x7FFF);  // NaN
  CHECK_EQ(hfma(0x3C00, 0x4000, 0x3C00, false, Rnd::kRN, false, true, false), 0x3C00);  // sat
  CHECK_EQ(hfma(0x0200, 0x4000, 0x0000, false, Rnd::kRN, true, false, false), 0x0000);  // ftz in
  CHECK_EQ(hfma(0x0200, 0x4000, 0x0000, false, Rnd::kRN, false, false, false), 0x0400);
}

static void test_approx() {
  CHECK(ex2_approx(3.0f, false) == 8.0f);
  CHECK(ex2_approx(-1.0f, false) == 0.5f);
  CHECK(ex2_approx(0.5f, false) == 1.41421356f);   // sqrt(2) rounded: 0x3FB504F3
  CHECK_EQ(fb(ex2_approx(-kInf, false)), 0x00000000u);
  CHECK(ex2_approx(kInf, false) == kInf);
  CHECK(std::isnan(ex2_approx(kNaN, false)));
  CHECK(ex2_approx(-0.0f, false) == 1.0f);
  CHECK(ex2_approx(bf(0x80000001), true) == 1.0f);
  CHECK(ex2_approx(200.0f, false) == kInf);
  CHECK_EQ(fb(ex2_approx(-140.0f, false)), 0x00000200u);   // 2^-140 subnormal
  CHECK_EQ(fb(ex2_approx(-140.0f, true)), 0x00000000u);    // flushed
  CHECK(lg2_approx(8.0f, false) == 3.0f);
  CHECK(lg2_approx(0.25f, false) == -2.0f);
  CHECK(lg2_approx(0.0f, false) == -kInf);
  CHECK(lg2_approx(-0.0f, false) == -kInf);
  CHECK(std::isnan(lg2_approx(-1.0f, false)));
  CHECK(lg2_approx(kInf, false) == kInf);
  CHECK(lg2_approx(bf(0x00000001), false) == -149.0f);
  CHECK(lg2_approx(bf(0x00000001), true) == -kInf);
  CHECK(rcp_approx(4.0f, false) == 0.25f);
  CHECK(rcp_approx(-0.0f, false) == -kInf);
  CHECK(rcp_approx(0.0f, false) == kInf);
  CHECK_EQ(fb(rcp_approx(-kInf, false)), 0x80000000u);
  CHECK_EQ(fb(rcp_approx(std::ldexp(1.0f, 127), false)), 0x00400000u);  // 2^-127 = 2^22 * 2^-149
  CHECK_EQ(fb(rcp_approx(std::ldexp(1.0f, 127), true)), 0x00000000u);
  CHECK(rcp_approx(bf(0x00000001), true) == kInf);
  CHECK_EQ(fb(rcp_approx(3.0f, false)), 0x3EAAAAABu);
  CHECK(rsqrt_approx(4.0f, false) == 0.5f);
  CHECK(rsqrt_approx(0.0f, false) == kInf);
  CHECK(rsqrt_approx(-0.0f, false) == -kInf);
  CHECK(std::isnan(rsqrt_approx(-1.0f, false)));
  CHECK_EQ(fb(rsqrt_approx(kInf, false)), 0x00000000u);
  CHECK(sqrt_approx(16.0f, false) == 4.0f);
  CHECK_EQ(fb(sqrt_approx(-0.0f, false)), 0x80000000u);
  CHECK(std::isnan(sqrt_approx(-4.0f, false)));
  CHECK_EQ(fb(sqrt_approx(2.0f, false)), 0x3FB504F3u);
  CHECK(sin_approx(0.0f, false) == 0.0f);
  CHECK_EQ(fb(sin_approx(-0.0f, false)), 0x80000000u);
  CHECK(cos_approx(0.0f, false) == 1.0f);
  CHECK(std::isnan(sin_approx(kInf, false)));
  CHECK(std::isnan(cos_approx(-kInf, false)));
  CHECK(std::fabs(sin_approx(1.5707964f, false) - 1.0f) < 1e-6f);
  CHECK(tanh_approx(0.0f) == 0.0f);
  CHECK_EQ(fb(tanh_approx(-0.0f)), 0x80000000u);
  CHECK(tanh_approx(kInf) == 1.0f);
  CHECK(tanh_approx(-kInf) == -1.0f);
  CHECK(tanh_approx(20.0f) == 1.0f);     // 1 - 8e-18 rounds to 1
  CHECK(std::isnan(tanh_approx(kNaN)));
  CHECK(std::fabs(tanh_approx(0.5f) - 0.46211716f) < 1e-7f);
  CHECK(div_approx(6.0f, 3.0f, false) == 2.0f);
  CHECK(div_approx(1.0f, 4.0f, false) == 0.25f);
  CHECK_EQ(fb(div_approx(1.0f, std::ldexp(1.0f, 127), false)), 0x00000000u);  // |b| > 2^126
  CHECK_EQ(fb(div_approx(-1.0f, std::ldexp(1.0f, 127), false)), 0x80000000u);
  CHECK(std::isnan(div_approx(kInf, std::ldexp(1.0f, 127), false)));
  CHECK_EQ(fb(div_full(1.0f, 3.0f, false)), 0x3EAAAAABu);
  CHECK(div_full(1.0f, std::ldexp(1.0f, 127), false) == std::ldexp(1.0f, -127));
  CHECK_EQ(fb(div_full(1.0f, std::ldexp(1.0f, 127), true)), 0x00000000u);
  CHECK(rcp_approx_ftz_f64(4.0) == 0.25);
  CHECK(rcp_approx_ftz_f64(bd(1)) == std::numeric_limits<double>::infinity());
  CHECK_EQ(db(rcp_approx_ftz_f64(std::ldexp(1.0, 1023))), 0x0000000000000000ull);  // 2^-1023 flushed
  CHECK(rsqrt_approx_f64(16.0) == 0.25);
  CHECK(rsqrt_approx_f64(-0.0) == -std::numeric_limits<double>::infinity());
  CHECK(std::isnan(rsqrt_approx_f64(-1.0)));
  // 16-bit forms: f16 2.0 (0x4000) -> 4.0 (0x4400); 2^-1 via ex2(-1): 0xBC00 -> 0x3800.
  CHECK_EQ(ex2_approx_f16(0x4000), 0x4400);
  CHECK_EQ(ex2_approx_f16(0xBC00), 0x3800);
  CHECK_EQ(ex2_approx_f16(0xFC00), 0x0000);
  CHECK_EQ(ex2_approx_f16(0x7C00), 0x7C00);
  CHECK_EQ(ex2_approx_f16(0x4C00), 0x7C00);   // 2^16 overflows f16
  CHECK_EQ(ex2_approx_f16(0xCE00), 0x0001);   // 2^-24 (f16 -24 = 0xCE00) -> min subnormal
  CHECK_EQ(ex2_approx_f16(0x7E00), 0x7FFF);
  CHECK_EQ(ex2_approx_bf16(0x3F80), 0x4000);  // 2^1 = 2
  CHECK_EQ(ex2_approx_bf16(0xC300), 0x0000);  // 2^-128 is bf16-subnormal -> flushed
  CHECK_EQ(ex2_approx_bf16(0x0001), 0x3F80);  // subnormal input -> 0 -> 1
  CHECK_EQ(tanh_approx_f16(0x0000), 0x0000);
  CHECK_EQ(tanh_approx_f16(0x7C00), 0x3C00);
  CHECK_EQ(tanh_approx_f16(0xFC00), 0xBC00);
  CHECK_EQ(tanh_approx_f16(0x4900), 0x3C00);  // tanh(10) = 1 - 4e-9 -> 1.0
  CHECK_EQ(tanh_approx_bf16(0xC120), 0xBF80); // tanh(-10) -> -1.0
  CHECK_EQ(tanh_approx_bf16(0x7FC0), 0x7FFF);
}

int main() {
  test_decode();
  test_f16_cvt();
  test_fp8();
  test_tf32();
  test_f64_f32_int();
  test_arith();
  test_minmax();
  test_half_arith();
  test_approx();
  return hsim_test::finish();
}
