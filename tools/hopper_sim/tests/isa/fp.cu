// Floating-point instruction semantics: conversions, f32 arithmetic with rounding modes, approximate
// functions on exact points, packed half arithmetic, copysign, testp. `fp FAMILY`.
// Expected bit patterns are worked by hand from the PTX ISA (sections cited per family) and IEEE 754
// round-to-nearest-even / directed rounding. Values are passed as raw bits through .b32/.b64/.b16
// registers (PTX ISA 9.4.1: bit-size registers may be used with floating-point instruction types).
#include "isa.h"

#define R1(op, a) ({ uint32_t d_; asm volatile(op " %0, %1;" : "=r"(d_) : "r"((uint32_t)(a))); d_; })
#define R2(op, a, b) ({ uint32_t d_; asm volatile(op " %0, %1, %2;" : "=r"(d_) : "r"((uint32_t)(a)), "r"((uint32_t)(b))); d_; })
#define R3(op, a, b, c) ({ uint32_t d_; asm volatile(op " %0, %1, %2, %3;" : "=r"(d_) : "r"((uint32_t)(a)), "r"((uint32_t)(b)), "r"((uint32_t)(c))); d_; })
#define L1(op, a) ({ uint64_t d_; asm volatile(op " %0, %1;" : "=l"(d_) : "l"((uint64_t)(a))); d_; })
#define L2(op, a, b) ({ uint64_t d_; asm volatile(op " %0, %1, %2;" : "=l"(d_) : "l"((uint64_t)(a)), "l"((uint64_t)(b))); d_; })
#define HR(op, a) ({ uint16_t d_; asm volatile(op " %0, %1;" : "=h"(d_) : "r"((uint32_t)(a))); d_; })   // 16-bit d from 32-bit a
#define RH(op, a) ({ uint32_t d_; asm volatile(op " %0, %1;" : "=r"(d_) : "h"((uint16_t)(a))); d_; })   // 32-bit d from 16-bit a
#define HRR(op, a, b) ({ uint16_t d_; asm volatile(op " %0, %1, %2;" : "=h"(d_) : "r"((uint32_t)(a)), "r"((uint32_t)(b))); d_; })
#define RL(op, a) ({ uint32_t d_; asm volatile(op " %0, %1;" : "=r"(d_) : "l"((uint64_t)(a))); d_; })
#define LR(op, a) ({ uint64_t d_; asm volatile(op " %0, %1;" : "=l"(d_) : "r"((uint32_t)(a))); d_; })
#define HH(op, a) ({ uint16_t d_; asm volatile(op " %0, %1;" : "=h"(d_) : "h"((uint16_t)(a))); d_; })

// f32 bit patterns used below
constexpr uint32_t ONE = 0x3f800000u, TWO = 0x40000000u, HALF = 0x3f000000u, MONE = 0xbf800000u;
constexpr uint32_t QNAN = 0x7fc00000u, INF = 0x7f800000u, NINF = 0xff800000u, FMAX = 0x7f7fffffu;

// ---- cvt float <-> int: PTX ISA 9.7.9.21 cvt. Float-to-integer needs an integer rounding modifier
// (.rni nearest-even, .rzi toward zero, .rmi toward -inf, .rpi toward +inf); the result saturates to
// the destination range and NaN converts to 0 ("Integer rounding ... saturation" notes). Integer-to-float
// and float-to-float narrowing use .rn/.rz/.rm/.rp; .rXi on float-to-float rounds to an integral value. ----
SCALAR_FAMILY(cvt_fi) {
  chk("rni.s32 2.5", R1("cvt.rni.s32.f32", 0x40200000u), 2);
  chk("rni.s32 3.5", R1("cvt.rni.s32.f32", 0x40600000u), 4);
  chk("rni.s32 -2.5", R1("cvt.rni.s32.f32", 0xc0200000u), (uint32_t)-2);
  chk("rzi.s32 -2.75", R1("cvt.rzi.s32.f32", 0xc0300000u), (uint32_t)-2);
  chk("rmi.s32 -2.25", R1("cvt.rmi.s32.f32", 0xc0100000u), (uint32_t)-3);
  chk("rpi.s32 -2.75", R1("cvt.rpi.s32.f32", 0xc0300000u), (uint32_t)-2);
  chk("rpi.s32 2.25", R1("cvt.rpi.s32.f32", 0x40100000u), 3);
  chk("rmi.s32 2.75", R1("cvt.rmi.s32.f32", 0x40300000u), 2);
  chk("rzi.s32 3e9 sat", R1("cvt.rzi.s32.f32", 0x4f32d05eu), 0x7fffffffu);
  chk("rzi.s32 -3e9 sat", R1("cvt.rzi.s32.f32", 0xcf32d05eu), 0x80000000u);
  chk("rzi.s32 NaN", R1("cvt.rzi.s32.f32", QNAN), 0);
  chk("rzi.s32 -inf", R1("cvt.rzi.s32.f32", NINF), 0x80000000u);
  chk("rzi.u32 -1", R1("cvt.rzi.u32.f32", MONE), 0);
  chk("rzi.u32 5e9", R1("cvt.rzi.u32.f32", 0x4f9502f9u), 0xffffffffu);
  chk("rzi.u32 inf", R1("cvt.rzi.u32.f32", INF), 0xffffffffu);
  chk("rni.u32 NaN", R1("cvt.rni.u32.f32", QNAN), 0);
  chk("rni.s64 -1e19", ({ uint64_t d_; asm volatile("cvt.rni.s64.f32 %0, %1;" : "=l"(d_) : "r"(0xdf0ac723u)); d_; }), 0x8000000000000000ull);
  chk("rzi.u64 2^63", ({ uint64_t d_; asm volatile("cvt.rzi.u64.f32 %0, %1;" : "=l"(d_) : "r"(0x5f000000u)); d_; }), 0x8000000000000000ull);
  chk("rzi.s16 40000 sat", ({ uint16_t d_; asm volatile("cvt.rzi.s16.f32 %0, %1;" : "=h"(d_) : "r"(0x471c4000u)); d_; }), 0x7fff);
  chk("rzi.s64.f64 -2.5", ({ uint64_t d_; asm volatile("cvt.rzi.s64.f64 %0, %1;" : "=l"(d_) : "l"(0xc004000000000000ull)); d_; }), (uint64_t)-2ll);
  chk("rn.f32.s32 max", R1("cvt.rn.f32.s32", 0x7fffffffu), 0x4f000000u);
  chk("rz.f32.s32 max", R1("cvt.rz.f32.s32", 0x7fffffffu), 0x4effffffu);
  chk("rn.f32.u32 max", R1("cvt.rn.f32.u32", 0xffffffffu), 0x4f800000u);
  chk("rm.f32.s32 -(2^31-1)", R1("cvt.rm.f32.s32", 0x80000001u), 0xcf000000u);
  chk("rp.f32.s32 -(2^31-1)", R1("cvt.rp.f32.s32", 0x80000001u), 0xceffffffu);
  chk("rn.f32.s32 2^24+1 tie", R1("cvt.rn.f32.s32", 16777217u), 0x4b800000u);
  chk("rn.f32.s32 2^24+3 tie", R1("cvt.rn.f32.s32", 16777219u), 0x4b800002u);
  chk("rp.f32.s32 2^24+1", R1("cvt.rp.f32.s32", 16777217u), 0x4b800001u);
  chk("rn.f32.s64 -1", ({ uint32_t d_; asm volatile("cvt.rn.f32.s64 %0, %1;" : "=r"(d_) : "l"(~0ull)); d_; }), MONE);
  chk("rn.f32.u64 max", ({ uint32_t d_; asm volatile("cvt.rn.f32.u64 %0, %1;" : "=r"(d_) : "l"(~0ull)); d_; }), 0x5f800000u);
  chk("rni.f32.f32 2.5", R1("cvt.rni.f32.f32", 0x40200000u), TWO);
  chk("rmi.f32.f32 -0.5", R1("cvt.rmi.f32.f32", 0xbf000000u), MONE);
  chk("rpi.f32.f32 -0.5", R1("cvt.rpi.f32.f32", 0xbf000000u), 0x80000000u);
  chk("rzi.f32.f32 -1.5", R1("cvt.rzi.f32.f32", 0xbfc00000u), MONE);
  chk("rn.f32.f64 tie", RL("cvt.rn.f32.f64", 0x3ff0000010000000ull), ONE);            // 1 + 2^-24
  chk("rp.f32.f64", RL("cvt.rp.f32.f64", 0x3ff0000010000000ull), 0x3f800001u);
  chk("rn.f32.f64 3*2^-24 tie", RL("cvt.rn.f32.f64", 0x3ff0000030000000ull), 0x3f800002u);  // 1+3*2^-24 -> even
  chk("rn.f32.f64 1e39 ovf", RL("cvt.rn.f32.f64", 0x48078287f49c4a1dull), INF);
  chk("rz.f32.f64 1e39 ovf", RL("cvt.rz.f32.f64", 0x48078287f49c4a1dull), FMAX);
  chk("rm.f32.f64 -1e39", RL("cvt.rm.f32.f64", 0xc8078287f49c4a1dull), NINF);
  chk("rp.f32.f64 -1e39", RL("cvt.rp.f32.f64", 0xc8078287f49c4a1dull), 0xff7fffffu);
  chk("f64.f32 exact", LR("cvt.f64.f32", 0x3f800001u), 0x3ff0000020000000ull);
  chk("sat.f32.f32 -0.5", R1("cvt.sat.f32.f32", 0xbf000000u), 0);
  chk("sat.f32.f32 1.5", R1("cvt.sat.f32.f32", 0x3fc00000u), ONE);
  chk("sat.f32.f32 NaN", R1("cvt.sat.f32.f32", QNAN), 0);
}

// ---- cvt f32 <-> f16 / bf16: PTX ISA 9.7.9.21 cvt. f16: 1 sign, 5 exponent (bias 15), 10 mantissa bits;
// bf16: 1, 8 (bias 127), 7. .relu clamps negative results to +0; .satfinite clamps +-inf/overflow to
// +-MAX_NORM (f16 0x7bff, bf16 0x7f7f). ----
SCALAR_FAMILY(cvt_half) {
  chk("rn.f16 1+2^-11 tie", HR("cvt.rn.f16.f32", 0x3f801000u), 0x3c00);
  chk("rp.f16 1+2^-11", HR("cvt.rp.f16.f32", 0x3f801000u), 0x3c01);
  chk("rn.f16 1+3*2^-11 tie", HR("cvt.rn.f16.f32", 0x3f803000u), 0x3c02);
  chk("rn.f16 -(1+2^-11+2^-20)", HR("cvt.rn.f16.f32", 0xbf801008u), 0xbc01);
  chk("rz.f16 -(1+2^-11+2^-20)", HR("cvt.rz.f16.f32", 0xbf801008u), 0xbc00);
  chk("rm.f16 -(1+2^-11+2^-20)", HR("cvt.rm.f16.f32", 0xbf801008u), 0xbc01);
  chk("rp.f16 -(1+2^-11+2^-20)", HR("cvt.rp.f16.f32", 0xbf801008u), 0xbc00);
  chk("rn.f16 70000 ovf", HR("cvt.rn.f16.f32", 0x4788b800u), 0x7c00);
  chk("rz.f16 70000", HR("cvt.rz.f16.f32", 0x4788b800u), 0x7bff);
  chk("rn.satfinite.f16 70000", HR("cvt.rn.satfinite.f16.f32", 0x4788b800u), 0x7bff);
  chk("rn.satfinite.f16 -inf", HR("cvt.rn.satfinite.f16.f32", NINF), 0xfbff);
  chk("rn.relu.f16 -3", HR("cvt.rn.relu.f16.f32", 0xc0400000u), 0x0000);
  chk("rn.relu.f16 3", HR("cvt.rn.relu.f16.f32", 0x40400000u), 0x4200);
  chk("rn.f16 2^-24 subnormal", HR("cvt.rn.f16.f32", 0x33800000u), 0x0001);
  chk("rn.f16 2^-25 tie->0", HR("cvt.rn.f16.f32", 0x33000000u), 0x0000);
  chk("rp.f16 2^-25", HR("cvt.rp.f16.f32", 0x33000000u), 0x0001);
  chk("rn.f16 65520 tie->inf", HR("cvt.rn.f16.f32", 0x477ff000u), 0x7c00);
  chk("f32.f16 max", RH("cvt.f32.f16", 0x7bff), 0x477fe000u);
  chk("f32.f16 min subnormal", RH("cvt.f32.f16", 0x0001), 0x33800000u);
  chk("f32.f16 -inf", RH("cvt.f32.f16", 0xfc00), NINF);
  chk("rn.bf16 1+2^-8 tie", HR("cvt.rn.bf16.f32", 0x3f808000u), 0x3f80);
  chk("rn.bf16 1+3*2^-8 tie", HR("cvt.rn.bf16.f32", 0x3f818000u), 0x3f82);
  chk("rn.bf16 above half", HR("cvt.rn.bf16.f32", 0x3f808001u), 0x3f81);
  chk("rz.bf16", HR("cvt.rz.bf16.f32", 0x3f80ffffu), 0x3f80);
  chk("rn.bf16 FLT_MAX -> inf", HR("cvt.rn.bf16.f32", FMAX), 0x7f80);
  chk("rn.satfinite.bf16 FLT_MAX", HR("cvt.rn.satfinite.bf16.f32", FMAX), 0x7f7f);
  chk("rz.bf16 FLT_MAX", HR("cvt.rz.bf16.f32", FMAX), 0x7f7f);
  chk("rn.relu.bf16 -1", HR("cvt.rn.relu.bf16.f32", MONE), 0x0000);
  chk("f32.bf16", RH("cvt.f32.bf16", 0x3f81), 0x3f810000u);
  chk("f32.bf16 neg", RH("cvt.f32.bf16", 0xc0c0), 0xc0c00000u);
}
SCALAR_FAMILY(cvt_half_rmrp) {  // directed rounding to bf16 (cvt .rm/.rp .bf16.f32: sm_90 / PTX 7.8)
  chk("rm.bf16 -(1+2^-8+2^-20)", HR("cvt.rm.bf16.f32", 0xbf808008u), 0xbf81);
  chk("rp.bf16 -(1+2^-8+2^-20)", HR("cvt.rp.bf16.f32", 0xbf808008u), 0xbf80);
  chk("rp.bf16 1+2^-20", HR("cvt.rp.bf16.f32", 0x3f800008u), 0x3f81);
}

// ---- packed conversions. PTX ISA 9.7.9.21 cvt: "the value converted from input a is stored in the
// upper half of d and the value converted from input b is stored in the lower half of d" (f16x2/bf16x2),
// and likewise a -> upper 8 bits, b -> lower 8 bits for .e4m3x2/.e5m2x2 (d is .b16). For
// cvt.f16x2.e4m3x2 d, a: the upper byte of a converts into the upper half of d.
// e4m3: bias 7, 3 mantissa bits, max 448 (0x7e), no inf; e5m2: bias 15, 2 mantissa bits, max 57344 (0x7b).
// cvt.rna.tf32.f32: round to 10 mantissa bits, ties away from zero (PTX ISA 9.7.9.21; 5.2.x tf32). ----
SCALAR_FAMILY(cvt_packed) {
  chk("rn.f16x2 a->hi", R2("cvt.rn.f16x2.f32", ONE, TWO), 0x3c004000u);
  chk("rn.bf16x2 a->hi", R2("cvt.rn.bf16x2.f32", ONE, 0xc0000000u), 0x3f80c000u);
  chk("rn.relu.f16x2", R2("cvt.rn.relu.f16x2.f32", MONE, 0x40400000u), 0x00004200u);
  chk("rz.f16x2", R2("cvt.rz.f16x2.f32", 0x3f801fffu, 0xbf801fffu), 0x3c00bc00u);
  chk("rn.satfinite.bf16x2", R2("cvt.rn.satfinite.bf16x2.f32", NINF, FMAX), 0xff7f7f7fu);
  chk("e4m3x2 a->hi", HRR("cvt.rn.satfinite.e4m3x2.f32", ONE, TWO), 0x3840);
  chk("e4m3x2 satfinite", HRR("cvt.rn.satfinite.e4m3x2.f32", 0x447a0000u, 0xc47a0000u), 0x7efe);  // +-1000
  chk("e4m3x2 ties even", HRR("cvt.rn.satfinite.e4m3x2.f32", 0x3f880000u, 0x3f980000u), 0x383a);  // 1.0625, 1.1875
  chk("e4m3x2 subnormal", HRR("cvt.rn.satfinite.e4m3x2.f32", 0x3b000000u, 0x3a800000u), 0x0100);  // 2^-9, 2^-10 (tie->0)
  chk("e4m3x2 relu", HRR("cvt.rn.satfinite.relu.e4m3x2.f32", MONE, ONE), 0x0038);
  chk("e5m2x2 a->hi", HRR("cvt.rn.satfinite.e5m2x2.f32", ONE, TWO), 0x3c40);
  chk("e5m2x2 satfinite", HRR("cvt.rn.satfinite.e5m2x2.f32", 0x49742400u, 0xc9742400u), 0x7bfb);  // +-1e6
  chk("e5m2x2 ties even", HRR("cvt.rn.satfinite.e5m2x2.f32", 0x3f900000u, 0x3fb00000u), 0x3c3e);  // 1.125, 1.375
  chk("f16x2.e4m3x2", RH("cvt.rn.f16x2.e4m3x2", 0x3840), 0x3c004000u);
  chk("f16x2.e4m3x2 max/min", RH("cvt.rn.f16x2.e4m3x2", 0x7e01), 0x5f001800u);
  chk("f16x2.e4m3x2 neg", RH("cvt.rn.f16x2.e4m3x2", 0xb8c0), 0xbc00c000u);
  chk("f16x2.e5m2x2", RH("cvt.rn.f16x2.e5m2x2", 0x3cfb), 0x3c00fb00u);
  chk("e4m3x2.f16x2 hi->hi", ({ uint16_t d_; asm volatile("cvt.rn.satfinite.e4m3x2.f16x2 %0, %1;" : "=h"(d_) : "r"(0x3c004000u)); d_; }), 0x3840);
  // tf32: only the upper 19 bits are defined; compare those.
  chk("rna.tf32 tie away", R1("cvt.rna.tf32.f32", 0x3f801000u) & 0xffffe000u, 0x3f802000u);
  chk("rna.tf32 below half", R1("cvt.rna.tf32.f32", 0x3f800fffu) & 0xffffe000u, 0x3f800000u);
  chk("rna.tf32 neg tie away", R1("cvt.rna.tf32.f32", 0xbf801000u) & 0xffffe000u, 0xbf802000u);
  chk("rna.tf32 3*2^-11 tie away", R1("cvt.rna.tf32.f32", 0x3f803000u) & 0xffffe000u, 0x3f804000u);
}

// ---- f32 add / sub / mul / fma: PTX ISA 9.7.3.1 add, 9.7.3.2 sub, 9.7.3.3 mul, 9.7.3.4 fma
// (fma computes a*b+c with a single rounding). .sat clamps to [0.0, 1.0] and NaN results become +0.0;
// .ftz flushes subnormal inputs and results to sign-preserving zero (subnormals are kept otherwise). ----
SCALAR_FAMILY(f32arith) {
  const uint32_t E24 = 0x33800000u;  // 2^-24
  chk("add.rn 1+2^-24 tie", R2("add.rn.f32", ONE, E24), ONE);
  chk("add.rp 1+2^-24", R2("add.rp.f32", ONE, E24), 0x3f800001u);
  chk("add.rz 1+2^-24", R2("add.rz.f32", ONE, E24), ONE);
  chk("add.rm -1-2^-24", R2("add.rm.f32", MONE, 0xb3800000u), 0xbf800001u);
  chk("add.rz -1-2^-24", R2("add.rz.f32", MONE, 0xb3800000u), MONE);
  chk("add.rn 1+3*2^-24 tie even", R2("add.rn.f32", ONE, 0x34400000u), 0x3f800002u);
  chk("sub.rm 1-1 = -0", R2("sub.rm.f32", ONE, ONE), 0x80000000u);
  chk("sub.rn 1-1 = +0", R2("sub.rn.f32", ONE, ONE), 0);
  chk("mul.rn (1+u)^2", R2("mul.rn.f32", 0x3f800001u, 0x3f800001u), 0x3f800002u);
  chk("mul.rp (1+u)^2", R2("mul.rp.f32", 0x3f800001u, 0x3f800001u), 0x3f800003u);
  chk("mul.rz (1+u)^2", R2("mul.rz.f32", 0x3f800001u, 0x3f800001u), 0x3f800002u);
  chk("mul.rz max*2", R2("mul.rz.f32", FMAX, TWO), FMAX);
  chk("mul.rn max*2", R2("mul.rn.f32", FMAX, TWO), INF);
  chk("mul.rm -max*2", R2("mul.rm.f32", 0xff7fffffu, TWO), NINF);
  chk("mul.rp -max*2", R2("mul.rp.f32", 0xff7fffffu, TWO), 0xff7fffffu);
  chk("fma.rn single rounding", R3("fma.rn.f32", 0x3f800001u, 0x3f800001u, 0xbf800002u), 0x28800000u);  // 2^-46
  chk("fma.rn.sat", R3("fma.rn.sat.f32", TWO, 0x3f400000u, 0xbe800000u), ONE);  // 1.5-0.25
  chk("fma.rz", R3("fma.rz.f32", 0x3f800001u, 0x3f800001u, 0), 0x3f800002u);
  chk("add.sat 0.75+0.5", R2("add.sat.f32", 0x3f400000u, HALF), ONE);
  chk("add.sat -1+0.5", R2("add.sat.f32", MONE, HALF), 0);
  chk("add.sat NaN", R2("add.sat.f32", QNAN, ONE), 0);
  chk("mul.sat -0.5*1 -> +0", R2("mul.sat.f32", 0xbf000000u, ONE), 0);
  chk("mul subnormal kept", R2("mul.rn.f32", 0x0d800000u, 0x30800000u), 0x00080000u);  // 2^-100*2^-30
  chk("mul.ftz subnormal", R2("mul.rn.ftz.f32", 0x0d800000u, 0x30800000u), 0);
  chk("mul.ftz -subnormal", R2("mul.rn.ftz.f32", 0x8d800000u, 0x30800000u), 0x80000000u);
  chk("add.ftz subnormal in", R2("add.ftz.f32", 0x00000001u, 0x00000001u), 0);
  chk("add subnormal in", R2("add.f32", 0x00000001u, 0x00000001u), 0x00000002u);
  chk("fma.rn.ftz subnormal c", R3("fma.rn.ftz.f32", ONE, ONE, 0x00400000u), ONE);
}

// ---- div / rcp / sqrt / rsqrt / ex2 / lg2 / tanh: PTX ISA 9.7.3.8 div, 9.7.3.11 rcp, 9.7.3.13 sqrt,
// 9.7.3.14 rsqrt, 9.7.3.17 lg2, 9.7.3.18 ex2, 9.7.3.19 tanh. .rn/.rz/.rm/.rp are IEEE-rounded;
// approximate forms are checked only on points whose result is exactly representable and special
// inputs whose results the ISA lists (rcp(+-0) = +-inf, rcp(+-inf) = +-0, sqrt(-0) = -0, lg2(0) = -inf,
// ex2(-inf) = +0, tanh(+-inf) = +-1). div.approx.f32 returns 0 for |b| in [2^126, 2^128] and finite a. ----
SCALAR_FAMILY(fdiv) {
  const uint32_t THREE = 0x40400000u;
  chk("div.rn 1/3", R2("div.rn.f32", ONE, THREE), 0x3eaaaaabu);
  chk("div.rz 1/3", R2("div.rz.f32", ONE, THREE), 0x3eaaaaaau);
  chk("div.rm 1/3", R2("div.rm.f32", ONE, THREE), 0x3eaaaaaau);
  chk("div.rp 1/3", R2("div.rp.f32", ONE, THREE), 0x3eaaaaabu);
  chk("div.rm -1/3", R2("div.rm.f32", MONE, THREE), 0xbeaaaaabu);
  chk("div.rn 2/0", R2("div.rn.f32", TWO, 0), INF);
  chk("div.rn 2/-0", R2("div.rn.f32", TWO, 0x80000000u), NINF);
  chk("div.rn.f64 1/3", L2("div.rn.f64", 0x3ff0000000000000ull, 0x4008000000000000ull), 0x3fd5555555555555ull);
  chk("div.rz.f64 1/3", L2("div.rz.f64", 0x3ff0000000000000ull, 0x4008000000000000ull), 0x3fd5555555555555ull);
  chk("div.rp.f64 1/3", L2("div.rp.f64", 0x3ff0000000000000ull, 0x4008000000000000ull), 0x3fd5555555555556ull);
  chk("div.approx 3/4", R2("div.approx.f32", THREE, 0x40800000u), 0x3f400000u);
  chk("div.approx 1/2^127 -> 0", R2("div.approx.f32", ONE, 0x7f000000u), 0);
  chk("div.full 1/4", R2("div.full.f32", ONE, 0x40800000u), 0x3e800000u);
  chk("div.full 6/2", R2("div.full.f32", 0x40c00000u, TWO), THREE);
  chk("rcp.rn 3", R1("rcp.rn.f32", THREE), 0x3eaaaaabu);
  chk("rcp.rz 3", R1("rcp.rz.f32", THREE), 0x3eaaaaaau);
  chk("rcp.approx 2", R1("rcp.approx.f32", TWO), HALF);
  chk("rcp.approx +0", R1("rcp.approx.f32", 0), INF);
  chk("rcp.approx -0", R1("rcp.approx.f32", 0x80000000u), NINF);
  chk("rcp.approx -inf", R1("rcp.approx.f32", NINF), 0x80000000u);
  chk("sqrt.rn 2", R1("sqrt.rn.f32", TWO), 0x3fb504f3u);
  chk("sqrt.rz 2", R1("sqrt.rz.f32", TWO), 0x3fb504f3u);
  chk("sqrt.rp 2", R1("sqrt.rp.f32", TWO), 0x3fb504f4u);
  chk("sqrt.approx 4", R1("sqrt.approx.f32", 0x40800000u), TWO);
  chk("sqrt.rn -0", R1("sqrt.rn.f32", 0x80000000u), 0x80000000u);
  chk("sqrt.rn inf", R1("sqrt.rn.f32", INF), INF);
  chk("rsqrt.approx 4", R1("rsqrt.approx.f32", 0x40800000u), HALF);
  chk("rsqrt.approx 0.25", R1("rsqrt.approx.f32", 0x3e800000u), TWO);
  chk("rsqrt.approx inf", R1("rsqrt.approx.f32", INF), 0);
  chk("rsqrt.approx +0", R1("rsqrt.approx.f32", 0), INF);
  chk("ex2.approx 3", R1("ex2.approx.f32", 0x40400000u), 0x41000000u);
  chk("ex2.approx -1", R1("ex2.approx.ftz.f32", MONE), HALF);
  chk("ex2.approx -inf", R1("ex2.approx.f32", NINF), 0);
  chk("ex2.approx inf", R1("ex2.approx.f32", INF), INF);
  chk("ex2.approx 0", R1("ex2.approx.f32", 0), ONE);
  chk("lg2.approx 8", R1("lg2.approx.f32", 0x41000000u), 0x40400000u);
  chk("lg2.approx 1", R1("lg2.approx.f32", ONE), 0);
  chk("lg2.approx 0", R1("lg2.approx.f32", 0), NINF);
  chk("lg2.approx inf", R1("lg2.approx.f32", INF), INF);
  chk("lg2.approx 0.25", R1("lg2.approx.ftz.f32", 0x3e800000u), 0xc0000000u);
  chk("tanh.approx 0", R1("tanh.approx.f32", 0), 0);
  chk("tanh.approx -0", R1("tanh.approx.f32", 0x80000000u), 0x80000000u);
  chk("tanh.approx inf", R1("tanh.approx.f32", INF), ONE);
  chk("tanh.approx -inf", R1("tanh.approx.f32", NINF), MONE);
}

// ---- packed half arithmetic: PTX ISA 9.7.4.1 add, 9.7.4.3 mul, 9.7.4.4 fma, 9.7.4.7 min, 9.7.4.8 max
// (half precision, element-wise on the two 16-bit halves). min/max return the non-NaN operand when one
// is NaN; the .NaN variants return the canonical NaN (f16 0x7fff, bf16 0x7fff). ----
SCALAR_FAMILY(half2) {
  chk("add.rn.f16x2", R2("add.rn.f16x2", 0x3c004000u, 0x3800c000u), 0x3e000000u);  // {1,2}+{0.5,-2}
  chk("add.f16x2 tie", R2("add.rn.f16x2", 0x3c000000u, 0x10000000u), 0x3c000000u);  // 1+2^-11
  chk("add.sat.f16x2", R2("add.sat.f16x2", 0x3a00bc00u, 0x38003800u), 0x3c000000u);  // {0.75,-1}+{0.5,0.5}
  chk("mul.rn.f16x2", R2("mul.rn.f16x2", 0x40004200u, 0x4200b800u), 0x4600be00u);  // {2,3}*{3,-0.5}
  chk("fma.rn.f16x2", R3("fma.rn.f16x2", 0x3c004000u, 0x40004000u, 0x3800c400u), 0x41000000u);  // {1,2}*{2,2}+{0.5,-4}
  chk("fma.rn.relu.f16x2", R3("fma.rn.relu.f16x2", 0x3c004000u, 0xc0004000u, 0x3800c400u), 0x00000000u);
  chk("min.f16x2 NaN", R2("min.f16x2", 0x3c007e00u, 0xbc004000u), 0xbc004000u);
  chk("max.f16x2 NaN", R2("max.f16x2", 0x3c007e00u, 0xbc004000u), 0x3c004000u);
  chk("min.NaN.f16x2", R2("min.NaN.f16x2", 0x3c007e00u, 0xbc004000u), 0xbc007fffu);
  chk("add.rn.bf16x2", R2("add.rn.bf16x2", 0x3f804000u, 0x3f80c040u), 0x4000bf80u);  // {1,2}+{1,-3}
  chk("mul.rn.bf16x2", R2("mul.rn.bf16x2", 0x3fc0c000u, 0x40004000u), 0x4040c080u);  // {1.5,-2}*{2,2}
  chk("fma.rn.bf16x2", R3("fma.rn.bf16x2", 0x3f803f80u, 0x3f803f80u, 0x3f80bf80u), 0x40000000u);
  chk("max.bf16x2", R2("max.bf16x2", 0x3f80bf80u, 0x3f00bf00u), 0x3f80bf00u);
  chk("min.bf16x2", R2("min.bf16x2", 0x3f80bf80u, 0x3f00bf00u), 0x3f00bf80u);
  chk("add.rn.f16 scalar", ({ uint16_t d_; asm volatile("add.rn.f16 %0, %1, %2;" : "=h"(d_) : "h"((uint16_t)0x3c00), "h"((uint16_t)0x3c00)); d_; }), 0x4000);
  chk("neg.f16x2", R1("neg.f16x2", 0x3c00bc00u), 0xbc003c00u);
  chk("abs.bf16x2", R1("abs.bf16x2", 0xbf80bf00u), 0x3f803f00u);
}

// ---- copysign: PTX ISA 9.7.3.x copysign: "Copy sign bit of a into value of b, and return the result
// as d" (copysign.type d, a, b). testp: PTX ISA 9.7.3.x testp (.finite .infinite .number .notanumber
// .normal .subnormal; zero is neither normal nor subnormal). ----
#define TESTP(op, a) ({ uint32_t d_; asm volatile("{.reg .pred p; testp." op ".f32 p, %1; selp.u32 %0, 1, 0, p;}" : "=r"(d_) : "r"(a)); d_; })
__device__ uint32_t testp_mask(uint32_t a) {
  return TESTP("finite", a) | TESTP("infinite", a) << 1 | TESTP("number", a) << 2 | TESTP("notanumber", a) << 3 |
         TESTP("normal", a) << 4 | TESTP("subnormal", a) << 5;
}
SCALAR_FAMILY(copysign_testp) {
  chk("copysign a=-1 b=2", R2("copysign.f32", MONE, TWO), 0xc0000000u);
  chk("copysign a=1 b=-3", R2("copysign.f32", ONE, 0xc0400000u), 0x40400000u);
  chk("copysign a=-0 b=NaN", R2("copysign.f32", 0x80000000u, QNAN), 0xffc00000u);
  chk("copysign.f64 a=-0 b=1.5", L2("copysign.f64", 0x8000000000000000ull, 0x3ff8000000000000ull), 0xbff8000000000000ull);
  chk("testp 1.0", testp_mask(ONE), 0x15);
  chk("testp +0", testp_mask(0), 0x05);
  chk("testp -0", testp_mask(0x80000000u), 0x05);
  chk("testp inf", testp_mask(INF), 0x06);
  chk("testp -inf", testp_mask(NINF), 0x06);
  chk("testp NaN", testp_mask(QNAN), 0x08);
  chk("testp subnormal", testp_mask(0x00000001u), 0x25);
  chk("testp -max", testp_mask(0xff7fffffu), 0x15);
  chk("testp min normal", testp_mask(0x00800000u), 0x15);
}

FAMILIES({"cvt_fi", cvt_fi}, {"cvt_half", cvt_half}, {"cvt_half_rmrp", cvt_half_rmrp}, {"cvt_packed", cvt_packed},
         {"f32arith", f32arith}, {"fdiv", fdiv}, {"half2", half2}, {"copysign_testp", copysign_testp})
