// Integer / bit-manipulation / comparison instruction semantics. `int FAMILY`.
// Expected values are worked by hand from the PTX ISA (chapter 9.7 "Instructions"; section names are
// cited per family), or, for setp/set, from a host formula written from the ISA's comparison table.
#include "isa.h"

// Statement-expression helpers: exactly one PTX instruction each.
#define R1(op, a) ({ uint32_t d_; asm volatile(op " %0, %1;" : "=r"(d_) : "r"((uint32_t)(a))); d_; })
#define R2(op, a, b) ({ uint32_t d_; asm volatile(op " %0, %1, %2;" : "=r"(d_) : "r"((uint32_t)(a)), "r"((uint32_t)(b))); d_; })
#define R3(op, a, b, c) ({ uint32_t d_; asm volatile(op " %0, %1, %2, %3;" : "=r"(d_) : "r"((uint32_t)(a)), "r"((uint32_t)(b)), "r"((uint32_t)(c))); d_; })
#define L1(op, a) ({ uint64_t d_; asm volatile(op " %0, %1;" : "=l"(d_) : "l"((uint64_t)(a))); d_; })
#define L2(op, a, b) ({ uint64_t d_; asm volatile(op " %0, %1, %2;" : "=l"(d_) : "l"((uint64_t)(a)), "l"((uint64_t)(b))); d_; })
#define L3(op, a, b, c) ({ uint64_t d_; asm volatile(op " %0, %1, %2, %3;" : "=l"(d_) : "l"((uint64_t)(a)), "l"((uint64_t)(b)), "l"((uint64_t)(c))); d_; })
#define H1(op, a) ({ uint16_t d_; asm volatile(op " %0, %1;" : "=h"(d_) : "h"((uint16_t)(a))); d_; })
#define H2(op, a, b) ({ uint16_t d_; asm volatile(op " %0, %1, %2;" : "=h"(d_) : "h"((uint16_t)(a)), "h"((uint16_t)(b))); d_; })
#define H3(op, a, b, c) ({ uint16_t d_; asm volatile(op " %0, %1, %2, %3;" : "=h"(d_) : "h"((uint16_t)(a)), "h"((uint16_t)(b)), "h"((uint16_t)(c))); d_; })
// 64-bit destination, 32-bit sources (.wide forms); 32-bit destination from 64-bit source (popc/clz/bfind .b64)
#define W2(op, a, b) ({ uint64_t d_; asm volatile(op " %0, %1, %2;" : "=l"(d_) : "r"((uint32_t)(a)), "r"((uint32_t)(b))); d_; })
#define W3(op, a, b, c) ({ uint64_t d_; asm volatile(op " %0, %1, %2, %3;" : "=l"(d_) : "r"((uint32_t)(a)), "r"((uint32_t)(b)), "l"((uint64_t)(c))); d_; })
#define RL1(op, a) ({ uint32_t d_; asm volatile(op " %0, %1;" : "=r"(d_) : "l"((uint64_t)(a))); d_; })
// 32-bit destination from 16-bit sources (mul.wide.s16)
#define RH2(op, a, b) ({ uint32_t d_; asm volatile(op " %0, %1, %2;" : "=r"(d_) : "h"((uint16_t)(a)), "h"((uint16_t)(b))); d_; })

// ---- add / sub / mul: PTX ISA 9.7.1.1 add, 9.7.1.2 sub, 9.7.1.3 mul ----
// mul.hi: upper half of the 2n-bit product; mul.wide: full 2n-bit product; .sat (s32 only) clamps.
SCALAR_FAMILY(arith) {
  chk("add.s32 wrap", R2("add.s32", 0x7fffffffu, 1), 0x80000000u);
  chk("add.u32 wrap", R2("add.u32", 0xffffffffu, 2), 1);
  chk("add.sat.s32 +ovf", R2("add.sat.s32", 0x7fffffffu, 1), 0x7fffffffu);
  chk("add.sat.s32 -ovf", R2("add.sat.s32", 0x80000000u, 0xffffffffu), 0x80000000u);
  chk("add.sat.s32 no ovf", R2("add.sat.s32", 0xfffffffbu, 3), 0xfffffffeu);
  chk("sub.sat.s32 -ovf", R2("sub.sat.s32", 0x80000000u, 1), 0x80000000u);
  chk("sub.sat.s32 +ovf", R2("sub.sat.s32", 0x7fffffffu, 0xffffffffu), 0x7fffffffu);
  chk("sub.s32 0-1", R2("sub.s32", 0, 1), 0xffffffffu);
  chk("add.s16 wrap", H2("add.s16", 0x7fff, 1), 0x8000);
  chk("add.u16 wrap", H2("add.u16", 0xffff, 1), 0);
  chk("sub.u16 0-1", H2("sub.u16", 0, 1), 0xffff);
  chk("add.s64 wrap", L2("add.s64", 0x7fffffffffffffffull, 1), 0x8000000000000000ull);
  chk("sub.u64 0-1", L2("sub.u64", 0, 1), 0xffffffffffffffffull);
  chk("add.u64 carry32", L2("add.u64", 0xffffffffull, 1), 0x100000000ull);
  chk("mul.lo.u32", R2("mul.lo.u32", 0x10000u, 0x10001u), 0x00010000u);
  chk("mul.lo.s32 neg", R2("mul.lo.s32", 0xfffffffdu, 7), 0xffffffebu);  // -3*7=-21
  chk("mul.hi.u32 max", R2("mul.hi.u32", 0xffffffffu, 0xffffffffu), 0xfffffffeu);
  chk("mul.hi.s32 -1*-1", R2("mul.hi.s32", 0xffffffffu, 0xffffffffu), 0);
  chk("mul.hi.s32 min*min", R2("mul.hi.s32", 0x80000000u, 0x80000000u), 0x40000000u);
  chk("mul.hi.s32 -2*3", R2("mul.hi.s32", 0xfffffffeu, 3), 0xffffffffu);
  chk("mul.hi.s32 max*-1", R2("mul.hi.s32", 0x7fffffffu, 0xffffffffu), 0xffffffffu);
  chk("mul.wide.s32 -2*3", W2("mul.wide.s32", 0xfffffffeu, 3), 0xfffffffffffffffaull);
  chk("mul.wide.u32", W2("mul.wide.u32", 0xffffffffu, 2), 0x1fffffffeull);
  chk("mul.wide.s32 min*min", W2("mul.wide.s32", 0x80000000u, 0x80000000u), 0x4000000000000000ull);
  chk("mul.wide.s16 -1*2", RH2("mul.wide.s16", 0xffff, 2), 0xfffffffeu);
  chk("mul.wide.u16 max", RH2("mul.wide.u16", 0xffff, 0xffff), 0xfffe0001u);
  chk("mul.lo.s16", H2("mul.lo.s16", 0x100, 0x100), 0);
  chk("mul.hi.u16 max", H2("mul.hi.u16", 0xffff, 0xffff), 0xfffe);
  chk("mul.hi.s16 min*min", H2("mul.hi.s16", 0x8000, 0x8000), 0x4000);
  chk("mul.hi.s16 -1*1", H2("mul.hi.s16", 0xffff, 1), 0xffff);
  chk("mul.hi.u64 max", L2("mul.hi.u64", ~0ull, ~0ull), 0xfffffffffffffffeull);
  chk("mul.hi.s64 -1*min", L2("mul.hi.s64", ~0ull, 0x8000000000000000ull), 0);
  chk("mul.lo.s64 -1*min", L2("mul.lo.s64", ~0ull, 0x8000000000000000ull), 0x8000000000000000ull);
  chk("mul.hi.s64 -3*5", L2("mul.hi.s64", (uint64_t)-3ll, 5), ~0ull);
  chk("mul.lo.u64", L2("mul.lo.u64", 0x100000001ull, 0x100000001ull), 0x200000001ull);
  chk("mul.hi.u64 2^32*2^32", L2("mul.hi.u64", 0x100000000ull, 0x100000000ull), 1);
}

// ---- mad: PTX ISA 9.7.1.4 mad. t = a*b (2n bits); .lo: d = t<n-1..0> + c; .hi: d = t<2n-1..n> + c;
// .wide: d = t + c (c and d are 2n bits); mad.hi.sat.s32 saturates the final sum. ----
SCALAR_FAMILY(mad) {
  chk("mad.lo.s32", R3("mad.lo.s32", 3, 4, 5), 17);
  chk("mad.lo.s32 neg", R3("mad.lo.s32", 0xfffffffdu, 4, 5), 0xfffffff9u);  // -12+5=-7
  chk("mad.lo.u32 wrap", R3("mad.lo.u32", 0x10000u, 0x10000u, 7), 7);
  chk("mad.hi.u32", R3("mad.hi.u32", 0xffffffffu, 0xffffffffu, 1), 0xffffffffu);
  chk("mad.hi.u32 wrap", R3("mad.hi.u32", 0xffffffffu, 0xffffffffu, 2), 0);
  chk("mad.hi.s32", R3("mad.hi.s32", 0xfffffffeu, 3, 5), 4);  // hi(-6) = -1, -1+5
  chk("mad.hi.sat.s32 ovf", R3("mad.hi.sat.s32", 0x40000000u, 4, 0x7fffffffu), 0x7fffffffu);
  chk("mad.hi.sat.s32 -ovf", R3("mad.hi.sat.s32", 0xfffffffeu, 3, 0x80000000u), 0x80000000u);
  chk("mad.wide.s32", W3("mad.wide.s32", 0xfffffffeu, 3, 10), 4);
  chk("mad.wide.u32", W3("mad.wide.u32", 0xffffffffu, 0xffffffffu, 1), 0xfffffffe00000002ull);
  chk("mad.wide.s32 neg c", W3("mad.wide.s32", 2, 3, (uint64_t)-10ll), (uint64_t)-4ll);
  chk("mad.lo.u16", H3("mad.lo.u16", 0x100, 0x100, 3), 3);
  chk("mad.hi.u16", H3("mad.hi.u16", 0xffff, 0xffff, 2), 0x0000);  // 0xfffe + 2 wraps
  chk("mad.lo.s64", L3("mad.lo.s64", ~0ull, ~0ull, ~0ull), 0);
  chk("mad.hi.u64", L3("mad.hi.u64", 0x100000000ull, 0x100000000ull, 5), 6);
}

// ---- mul24 / mad24: PTX ISA 9.7.1.9 mul24, 9.7.1.10 mad24. Operands are the low 24 bits (sign-
// extended from bit 23 for .s32); the product is 48 bits; .lo = bits 31..0, .hi = bits 47..16. ----
SCALAR_FAMILY(mul24) {
  chk("mul24.lo.u32 ignores top", R2("mul24.lo.u32", 0xff000002u, 3), 6);
  chk("mul24.lo.u32 max", R2("mul24.lo.u32", 0x00ffffffu, 0x00ffffffu), 0xfe000001u);
  chk("mul24.hi.u32 max", R2("mul24.hi.u32", 0x00ffffffu, 0x00ffffffu), 0xfffffe00u);
  chk("mul24.lo.s32 -1*2", R2("mul24.lo.s32", 0x00ffffffu, 2), 0xfffffffeu);
  chk("mul24.hi.s32 -1*2", R2("mul24.hi.s32", 0x00ffffffu, 2), 0xffffffffu);
  chk("mul24.lo.s32 3*-2^23", R2("mul24.lo.s32", 0xff000003u, 0x00800000u), 0xfe800000u);
  chk("mad24.lo.u32", R3("mad24.lo.u32", 0x01000002u, 5, 7), 17);
  chk("mad24.hi.u32", R3("mad24.hi.u32", 0x00ffffffu, 0x00ffffffu, 1), 0xfffffe01u);
  chk("mad24.lo.s32", R3("mad24.lo.s32", 0x00fffffeu, 3, 10), 4);  // -2*3+10
}

// ---- div / rem: PTX ISA 9.7.1.7 div, 9.7.1.8 rem. Integer division truncates toward zero;
// rem's result has the sign of the dividend (C semantics). ----
SCALAR_FAMILY(divrem) {
  chk("div.s32 -7/2", R2("div.s32", (uint32_t)-7, 2), (uint32_t)-3);
  chk("div.s32 7/-2", R2("div.s32", 7, (uint32_t)-2), (uint32_t)-3);
  chk("div.s32 -7/-2", R2("div.s32", (uint32_t)-7, (uint32_t)-2), 3);
  chk("rem.s32 -7%2", R2("rem.s32", (uint32_t)-7, 2), (uint32_t)-1);
  chk("rem.s32 7%-2", R2("rem.s32", 7, (uint32_t)-2), 1);
  chk("rem.s32 -7%-2", R2("rem.s32", (uint32_t)-7, (uint32_t)-2), (uint32_t)-1);
  chk("div.u32 big", R2("div.u32", 0xfffffff9u, 2), 0x7ffffffcu);
  chk("rem.u32 big", R2("rem.u32", 0xfffffff9u, 2), 1);
  chk("div.s64 -9/4", L2("div.s64", (uint64_t)-9ll, 4), (uint64_t)-2ll);
  chk("rem.s64 -9%4", L2("rem.s64", (uint64_t)-9ll, 4), (uint64_t)-1ll);
  chk("div.u64", L2("div.u64", ~0ull, 0x100000000ull), 0xffffffffull);
  chk("rem.u64", L2("rem.u64", ~0ull, 10), 5);  // 18446744073709551615 % 10
  chk("div.s16 -7/2", H2("div.s16", 0xfff9, 2), 0xfffd);
  chk("rem.u16", H2("rem.u16", 0xffff, 10), 5);
  chk("rem.s16 -32768%7", H2("rem.s16", 0x8000, 7), 0xffff);  // -32768 = -4681*7 - 1
}

// ---- min / max: PTX ISA 9.7.1.11 min, 9.7.1.12 max (integer forms). ----
SCALAR_FAMILY(minmax) {
  chk("min.s32", R2("min.s32", 0xffffffffu, 1), 0xffffffffu);
  chk("min.u32", R2("min.u32", 0xffffffffu, 1), 1);
  chk("max.s32", R2("max.s32", 0x80000000u, 0x7fffffffu), 0x7fffffffu);
  chk("max.u32", R2("max.u32", 0x80000000u, 0x7fffffffu), 0x80000000u);
  chk("min.s16", H2("min.s16", 0x8000, 1), 0x8000);
  chk("max.u16", H2("max.u16", 0x8000, 1), 0x8000);
  chk("max.s16", H2("max.s16", 0x8000, 1), 1);
  chk("min.s64", L2("min.s64", ~0ull, 0), ~0ull);
  chk("min.u64", L2("min.u64", ~0ull, 0), 0);
  chk("max.u64", L2("max.u64", ~0ull, 0), ~0ull);
  chk("max.s64", L2("max.s64", 0x8000000000000000ull, 5), 5);
}
// min/max .relu and packed 16x2 forms (PTX ISA 9.7.1.11/12, sm_80+): .relu clamps negative results to 0.
SCALAR_FAMILY(minmax_x2) {
  chk("max.relu.s32 both neg", R2("max.relu.s32", (uint32_t)-5, (uint32_t)-3), 0);
  chk("min.relu.s32", R2("min.relu.s32", (uint32_t)-5, 3), 0);
  chk("max.relu.s32 pos", R2("max.relu.s32", (uint32_t)-5, 3), 3);
  chk("min.s16x2", R2("min.s16x2", 0x80000001u, 0x0001ffffu), 0x8000ffffu);
  chk("max.s16x2", R2("max.s16x2", 0x80000001u, 0x0001ffffu), 0x00010001u);
  chk("min.u16x2", R2("min.u16x2", 0x80000001u, 0x0001ffffu), 0x00010001u);
  chk("max.u16x2", R2("max.u16x2", 0x80000001u, 0x0001ffffu), 0x8000ffffu);
  chk("max.relu.s16x2", R2("max.relu.s16x2", 0xfff00005u, 0xffe00003u), 0x00000005u);
}

// ---- abs / neg: PTX ISA 9.7.1.5 abs, 9.7.1.6 neg (two's complement: abs/neg of the minimum value is
// itself); 9.7.3.x abs/neg .f32 only touch the sign bit (.ftz flushes a subnormal input first). ----
SCALAR_FAMILY(absneg) {
  chk("abs.s32 -5", R1("abs.s32", (uint32_t)-5), 5);
  chk("abs.s32 min", R1("abs.s32", 0x80000000u), 0x80000000u);
  chk("neg.s32 min", R1("neg.s32", 0x80000000u), 0x80000000u);
  chk("neg.s32 5", R1("neg.s32", 5), 0xfffffffbu);
  chk("abs.s16 -1", H1("abs.s16", 0xffff), 1);
  chk("neg.s16 1", H1("neg.s16", 1), 0xffff);
  chk("neg.s64 1", L1("neg.s64", 1), ~0ull);
  chk("abs.s64 min", L1("abs.s64", 0x8000000000000000ull), 0x8000000000000000ull);
  chk("abs.s64 -2", L1("abs.s64", (uint64_t)-2ll), 2);
  chk("abs.f32 -0", R1("abs.f32", 0x80000000u), 0);
  chk("abs.f32 -1.5", R1("abs.f32", 0xbfc00000u), 0x3fc00000u);
  chk("neg.f32 +0", R1("neg.f32", 0), 0x80000000u);
  chk("neg.f32 2", R1("neg.f32", 0x40000000u), 0xc0000000u);
  chk("abs.ftz.f32 -denorm", R1("abs.ftz.f32", 0x80000001u), 0);
  chk("abs.f32 -denorm", R1("abs.f32", 0x80000001u), 1);
  chk("neg.ftz.f32 denorm", R1("neg.ftz.f32", 0x00000001u), 0x80000000u);
}

// ---- popc / clz / bfind / brev: PTX ISA 9.7.1.15 popc, 9.7.1.16 clz, 9.7.1.17 bfind, 9.7.1.19 brev.
// bfind: position of the most significant non-sign bit, 0xffffffff if none; .shiftamt returns
// (width-1 - position) instead (still 0xffffffff if none). The result of the .b64 forms is 32-bit. ----
SCALAR_FAMILY(bits) {
  chk("popc.b32", R1("popc.b32", 0xf0f0f0f1u), 17);
  chk("popc.b32 0", R1("popc.b32", 0), 0);
  chk("popc.b64", RL1("popc.b64", ~0ull), 64);
  chk("popc.b64 hi", RL1("popc.b64", 0x8000000100000000ull), 2);
  chk("clz.b32 0", R1("clz.b32", 0), 32);
  chk("clz.b32 1", R1("clz.b32", 1), 31);
  chk("clz.b32 msb", R1("clz.b32", 0x80000000u), 0);
  chk("clz.b64 1", RL1("clz.b64", 1), 63);
  chk("clz.b64 0", RL1("clz.b64", 0), 64);
  chk("clz.b64 2^32", RL1("clz.b64", 0x100000000ull), 31);
  chk("bfind.u32 0", R1("bfind.u32", 0), 0xffffffffu);
  chk("bfind.u32 2^16", R1("bfind.u32", 0x00010000u), 16);
  chk("bfind.u32 max", R1("bfind.u32", 0xffffffffu), 31);
  chk("bfind.s32 -1", R1("bfind.s32", 0xffffffffu), 0xffffffffu);
  chk("bfind.s32 0", R1("bfind.s32", 0), 0xffffffffu);
  chk("bfind.s32 min", R1("bfind.s32", 0x80000000u), 30);
  chk("bfind.s32 -16", R1("bfind.s32", 0xfffffff0u), 3);
  chk("bfind.s32 5", R1("bfind.s32", 5), 2);
  chk("bfind.shiftamt.u32 2^16", R1("bfind.shiftamt.u32", 0x00010000u), 15);
  chk("bfind.shiftamt.u32 0", R1("bfind.shiftamt.u32", 0), 0xffffffffu);
  chk("bfind.shiftamt.s32 -16", R1("bfind.shiftamt.s32", 0xfffffff0u), 28);
  chk("bfind.u64 msb", RL1("bfind.u64", 0x8000000000000000ull), 63);
  chk("bfind.s64 1", RL1("bfind.s64", 1), 0);
  chk("bfind.s64 -2^40", RL1("bfind.s64", (uint64_t)-(1ll << 40)), 39);
  chk("bfind.shiftamt.u64 1", RL1("bfind.shiftamt.u64", 1), 63);
  chk("brev.b32 1", R1("brev.b32", 1), 0x80000000u);
  chk("brev.b32", R1("brev.b32", 0x12345678u), 0x1e6a2c48u);
  chk("brev.b64 1", L1("brev.b64", 1), 0x8000000000000000ull);
  chk("brev.b64", L1("brev.b64", 0xf0ull), 0x0f00000000000000ull);
}

// ---- bfe: PTX ISA 9.7.1.20 bfe.  msb = 31|63; pos = b & 0xff; len = c & 0xff;
//   sbit = (unsigned || len == 0) ? 0 : a[min(pos+len-1, msb)];
//   d[i] = (i < len && pos+i <= msb) ? a[pos+i] : sbit.
// bfi: PTX ISA 9.7.1.21 bfi.  f = b; for (i = 0; i < len && pos+i <= msb; ++i) f[pos+i] = a[i]. ----
SCALAR_FAMILY(bfe) {
  chk("bfe.u32 mid", R3("bfe.u32", 0x12345678u, 8, 8), 0x56);
  chk("bfe.s32 mid pos", R3("bfe.s32", 0x12345678u, 4, 8), 0x67);
  chk("bfe.s32 mid neg", R3("bfe.s32", 0x0000f000u, 12, 4), 0xffffffffu);
  chk("bfe.s32 neg 8", R3("bfe.s32", 0x00008500u, 8, 8), 0xffffff85u);
  chk("bfe.u32 past msb", R3("bfe.u32", 0xf0000000u, 28, 8), 0xf);
  chk("bfe.s32 past msb neg", R3("bfe.s32", 0xf0000000u, 28, 8), 0xffffffffu);
  chk("bfe.s32 past msb pos", R3("bfe.s32", 0x7fffffffu, 28, 8), 0x7);
  chk("bfe.s32 len 0", R3("bfe.s32", 0xffffffffu, 4, 0), 0);
  chk("bfe.u32 len 0", R3("bfe.u32", 0xffffffffu, 4, 0), 0);
  chk("bfe.u32 pos > msb", R3("bfe.u32", 0xffffffffu, 40, 4), 0);
  chk("bfe.s32 pos > msb", R3("bfe.s32", 0xffffffffu, 40, 4), 0xffffffffu);
  chk("bfe.u32 pos&0xff", R3("bfe.u32", 0x000000f0u, 0x104, 4), 0xf);
  chk("bfe.u32 len&0xff", R3("bfe.u32", 0x0000ff00u, 8, 0x108), 0xff);
  chk("bfe.u32 len 32", R3("bfe.u32", 0x87654321u, 0, 32), 0x87654321u);
  chk("bfe.u32 len 255", R3("bfe.u32", 0x87654321u, 4, 255), 0x08765432u);
  chk("bfe.s32 len 255", R3("bfe.s32", 0x87654321u, 4, 255), 0xf8765432u);
  auto bfe64u = [](uint64_t a, uint32_t b, uint32_t c) { uint64_t d; asm volatile("bfe.u64 %0, %1, %2, %3;" : "=l"(d) : "l"(a), "r"(b), "r"(c)); return d; };
  auto bfe64s = [](uint64_t a, uint32_t b, uint32_t c) { uint64_t d; asm volatile("bfe.s64 %0, %1, %2, %3;" : "=l"(d) : "l"(a), "r"(b), "r"(c)); return d; };
  chk("bfe.u64", bfe64u( 0xff00000000000000ull, 56, 16), 0xff);
  chk("bfe.s64 neg", bfe64s(0x8000000000000000ull, 60, 4), 0xfffffffffffffff8ull);
  chk("bfe.s64 lo", bfe64s(0x80ull, 4, 4), 0xfffffffffffffff8ull);
}
// ---- bmsk: PTX ISA "bmsk".  a1 = a & 0x1f; mask0 = ~0 << a1; b1 = b & 0x1f; sum = a1 + b1;
//   mask1 = ~0 << sum; .clamp: a >= 32 -> mask0 = 0 and overflow; b >= 32 -> overflow;
//   mask1 = 0 on overflow or sum >= 32, else ~0 when b1 == 0; d = mask0 & ~mask1. ----
SCALAR_FAMILY(bmsk) {
  chk("bmsk.clamp 0,5", R2("bmsk.clamp.b32", 0, 5), 0x1fu);
  chk("bmsk.wrap 1,2 (the ISA's example)", R2("bmsk.wrap.b32", 1, 2), 0x6u);
  chk("bmsk.clamp 0,32", R2("bmsk.clamp.b32", 0, 32), 0xffffffffu);
  chk("bmsk.clamp 0,-1", R2("bmsk.clamp.b32", 0, 0xffffffffu), 0xffffffffu);
  chk("bmsk.clamp 4,36", R2("bmsk.clamp.b32", 4, 36), 0xfffffff0u);
  chk("bmsk.clamp 0,0", R2("bmsk.clamp.b32", 0, 0), 0u);
  chk("bmsk.wrap 0,32", R2("bmsk.wrap.b32", 0, 32), 0u);
  chk("bmsk.clamp 28,8 (sum past 32)", R2("bmsk.clamp.b32", 28, 8), 0xf0000000u);
  chk("bmsk.clamp 32,4", R2("bmsk.clamp.b32", 32, 4), 0u);
  chk("bmsk.wrap 33,4", R2("bmsk.wrap.b32", 33, 4), 0x1eu);
}
SCALAR_FAMILY(bfi) {
  auto bfi32 = [](uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
    uint32_t f; asm volatile("bfi.b32 %0, %1, %2, %3, %4;" : "=r"(f) : "r"(a), "r"(b), "r"(c), "r"(d)); return f; };
  auto bfi64 = [](uint64_t a, uint64_t b, uint32_t c, uint32_t d) {
    uint64_t f; asm volatile("bfi.b64 %0, %1, %2, %3, %4;" : "=l"(f) : "l"(a), "l"(b), "r"(c), "r"(d)); return f; };
  chk("bfi.b32 mid", bfi32(0xff, 0x12345678u, 8, 8), 0x1234ff78u);
  chk("bfi.b32 past msb", bfi32(0xffffffffu, 0, 28, 8), 0xf0000000u);
  chk("bfi.b32 len 0", bfi32(0xff, 0x12345678u, 0, 0), 0x12345678u);
  chk("bfi.b32 pos > msb", bfi32(0xff, 0x12345678u, 40, 8), 0x12345678u);
  chk("bfi.b32 only low a bits", bfi32(0xabcdu, 0, 4, 8), 0x00000cd0u);
  chk("bfi.b32 len 32", bfi32(0x87654321u, 0xffffffffu, 0, 32), 0x87654321u);
  chk("bfi.b32 pos&0xff", bfi32(0x3, 0, 0x101, 2), 0x6);
  chk("bfi.b64 past msb", bfi64(0xab, 0, 60, 8), 0xb000000000000000ull);
  chk("bfi.b64 hi", bfi64(0xffff, 0x1111111111111111ull, 32, 16), 0x1111ffff11111111ull);
}

// ---- shl / shr: PTX ISA 9.7.8.7 shl, 9.7.8.8 shr. Shift amounts greater than the register width are
// clamped to the width; signed shr fills with the sign bit, unsigned and untyped (.bN) shr with 0. ----
SCALAR_FAMILY(shift) {
  chk("shl.b32 31", R2("shl.b32", 1, 31), 0x80000000u);
  chk("shl.b32 32", R2("shl.b32", 1, 32), 0);
  chk("shl.b32 huge", R2("shl.b32", 1, 0xffffffffu), 0);
  chk("shl.b32 33", R2("shl.b32", 1, 33), 0);
  chk("shr.u32 31", R2("shr.u32", 0x80000000u, 31), 1);
  chk("shr.u32 40", R2("shr.u32", 0xffffffffu, 40), 0);
  chk("shr.s32 31", R2("shr.s32", 0x80000000u, 31), 0xffffffffu);
  chk("shr.s32 100 neg", R2("shr.s32", 0x80000000u, 100), 0xffffffffu);
  chk("shr.s32 100 pos", R2("shr.s32", 0x40000000u, 100), 0);
  chk("shr.s32 4", R2("shr.s32", 0x80000000u, 4), 0xf8000000u);
  chk("shr.b32 4", R2("shr.b32", 0x80000000u, 4), 0x08000000u);
  chk("shr.s32 33 (not mod 32)", R2("shr.s32", 0x80000000u, 33), 0xffffffffu);
  auto shl16 = [](uint16_t a, uint32_t b) { uint16_t d; asm volatile("shl.b16 %0, %1, %2;" : "=h"(d) : "h"(a), "r"(b)); return d; };
  auto shr16s = [](uint16_t a, uint32_t b) { uint16_t d; asm volatile("shr.s16 %0, %1, %2;" : "=h"(d) : "h"(a), "r"(b)); return d; };
  auto shl64 = [](uint64_t a, uint32_t b) { uint64_t d; asm volatile("shl.b64 %0, %1, %2;" : "=l"(d) : "l"(a), "r"(b)); return d; };
  auto shr64s = [](uint64_t a, uint32_t b) { uint64_t d; asm volatile("shr.s64 %0, %1, %2;" : "=l"(d) : "l"(a), "r"(b)); return d; };
  auto shr64u = [](uint64_t a, uint32_t b) { uint64_t d; asm volatile("shr.u64 %0, %1, %2;" : "=l"(d) : "l"(a), "r"(b)); return d; };
  chk("shl.b16 16", shl16(1, 16), 0);
  chk("shl.b16 15", shl16(1, 15), 0x8000);
  chk("shr.s16 20", shr16s(0x8000, 20), 0xffff);
  chk("shr.s16 3", shr16s(0x8000, 3), 0xf000);
  chk("shl.b64 63", shl64(1, 63), 0x8000000000000000ull);
  chk("shl.b64 64", shl64(1, 64), 0);
  chk("shl.b64 32", shl64(1, 32), 0x100000000ull);
  chk("shr.s64 64", shr64s(0x8000000000000000ull, 64), ~0ull);
  chk("shr.u64 64", shr64u(~0ull, 64), 0);
  chk("shr.u64 36", shr64u(0x8000000000000000ull, 36), 0x8000000ull);
}

// ---- shf: PTX ISA 9.7.8.9 shf.  n = .clamp ? min(c, 32) : c & 0x1f;
//   shf.l: d = upper 32 bits of ({b,a} << n) = (b << n) | (a >> (32-n));
//   shf.r: d = lower 32 bits of ({b,a} >> n) = (b << (32-n)) | (a >> n).   (n = 32 gives a / b.) ----
SCALAR_FAMILY(shf) {
  chk("shf.l.wrap 1", R3("shf.l.wrap.b32", 0x80000000u, 1, 1), 3);
  chk("shf.l.wrap 33", R3("shf.l.wrap.b32", 0x80000000u, 1, 33), 3);
  chk("shf.l.clamp 33", R3("shf.l.clamp.b32", 0x80000000u, 1, 33), 0x80000000u);
  chk("shf.l.wrap 32", R3("shf.l.wrap.b32", 0x80000000u, 1, 32), 1);
  chk("shf.l.clamp 32", R3("shf.l.clamp.b32", 0x12345678u, 0x9abcdef0u, 32), 0x12345678u);
  chk("shf.l.clamp 8", R3("shf.l.clamp.b32", 0x12345678u, 0x9abcdef0u, 8), 0xbcdef012u);
  chk("shf.l.wrap 0", R3("shf.l.wrap.b32", 0x12345678u, 0x9abcdef0u, 0), 0x9abcdef0u);
  chk("shf.r.wrap 1", R3("shf.r.wrap.b32", 1, 3, 1), 0x80000000u);
  chk("shf.r.clamp 40", R3("shf.r.clamp.b32", 1, 3, 40), 3);
  chk("shf.r.wrap 32", R3("shf.r.wrap.b32", 1, 3, 32), 1);
  chk("shf.r.wrap 40", R3("shf.r.wrap.b32", 0x12345678u, 0x9abcdef0u, 40), 0xf0123456u);
  chk("shf.r.clamp 8", R3("shf.r.clamp.b32", 0x12345678u, 0x9abcdef0u, 8), 0xf0123456u);
  chk("shf.r.clamp 0", R3("shf.r.clamp.b32", 0x12345678u, 0x9abcdef0u, 0), 0x12345678u);
}

// ---- prmt: PTX ISA 9.7.8.6 prmt. Default mode: source bytes {b,a} = b7..b4 (b), b3..b0 (a);
// selector nibble i (c >> 4i) picks byte (nibble & 7) for d.byte[i]; nibble bit 3 set replicates
// that byte's msb over all 8 bits. Bits 31..16 of c are ignored. ----
SCALAR_FAMILY(prmt) {
  const uint32_t A = 0x80402010u, B = 0xf0e0d0c0u;  // b0=10 b1=20 b2=40 b3=80 b4=c0 b5=d0 b6=e0 b7=f0
  chk("prmt 3210", R3("prmt.b32", A, B, 0x3210), A);
  chk("prmt 7654", R3("prmt.b32", A, B, 0x7654), B);
  chk("prmt 0123", R3("prmt.b32", A, B, 0x0123), 0x10204080u);
  chk("prmt 5140", R3("prmt.b32", A, B, 0x5140), 0xd020c010u);
  chk("prmt sign b3", R3("prmt.b32", A, B, 0x000b), 0x101010ffu);
  chk("prmt sign b0 (+)", R3("prmt.b32", A, B, 0x8888), 0);
  chk("prmt sign b4 (-)", R3("prmt.b32", A, B, 0xcccc), 0xffffffffu);
  chk("prmt mixed", R3("prmt.b32", A, B, 0x9a4c), 0x0000c0ffu);
  chk("prmt upper c ignored", R3("prmt.b32", A, B, 0xffff3210u), A);
  chk("prmt sign b7", R3("prmt.b32", A, B, 0x7f70), 0xf0fff010u);
}
// prmt modes (PTX ISA 9.7.8.6 table): f4e[1] = bytes {4,3,2,1}; b4e[1] = {6,7,0,1}; rc8[2] = {2,2,2,2};
// ecl[1] = {3,2,1,1}; ecr[2] = {2,2,1,0}; rc16[1] = {3,2,3,2} (listed d.b3 d.b2 d.b1 d.b0). Only c[1:0] is used.
SCALAR_FAMILY(prmt_modes) {
  const uint32_t A = 0x80402010u, B = 0xf0e0d0c0u;
  chk("prmt.f4e 1", R3("prmt.b32.f4e", A, B, 1), 0xc0804020u);
  chk("prmt.f4e 0", R3("prmt.b32.f4e", A, B, 0), A);
  chk("prmt.b4e 1", R3("prmt.b32.b4e", A, B, 1), 0xe0f01020u);
  chk("prmt.rc8 2", R3("prmt.b32.rc8", A, B, 2), 0x40404040u);
  chk("prmt.ecl 1", R3("prmt.b32.ecl", A, B, 1), 0x80402020u);
  chk("prmt.ecr 2", R3("prmt.b32.ecr", A, B, 2), 0x40402010u);
  chk("prmt.rc16 1", R3("prmt.b32.rc16", A, B, 1), 0x80408040u);
  chk("prmt.rc8 c=6 (c&3=2)", R3("prmt.b32.rc8", A, B, 6), 0x40404040u);
}

// ---- lop3: PTX ISA 9.7.8.5 lop3. Result bit = immLut bit number (a<<2 | b<<1 | c), i.e.
// immLut = F(0xF0, 0xCC, 0xAA). ----
#define LOP3(lut, a, b, c) ({ uint32_t d_; asm volatile("lop3.b32 %0, %1, %2, %3, " #lut ";" : "=r"(d_) : "r"(a), "r"(b), "r"(c)); d_; })
SCALAR_FAMILY(lop3) {
  const uint32_t a = 0x12345678u, b = 0x9abcdef0u, c = 0x0f0f0f0fu;
  chk("lop3 0xF0 (a)", LOP3(0xF0, a, b, c), a);
  chk("lop3 0xCC (b)", LOP3(0xCC, a, b, c), b);
  chk("lop3 0xAA (c)", LOP3(0xAA, a, b, c), c);
  chk("lop3 0x96 xor3", LOP3(0x96, a, b, c), 0x87878787u);
  chk("lop3 0xE8 maj", LOP3(0xE8, a, b, c), 0x1a3c5e78u);
  chk("lop3 0x80 and3", LOP3(0x80, a, b, c), 0x02040600u);
  chk("lop3 0x00", LOP3(0x00, a, b, c), 0);
  chk("lop3 0xFF", LOP3(0xFF, a, b, c), 0xffffffffu);
  chk("lop3 0x0F (~a)", LOP3(0x0F, a, b, c), 0xedcba987u);
  chk("lop3 0xCA (a?b:c)", LOP3(0xCA, a, b, c), 0x1f3f5f77u);
  chk("lop3 0x01 nor3", LOP3(0x01, 0u, 0u, 0xffff0000u), 0x0000ffffu);
  chk("lop3 0x40 a&b&~c", LOP3(0x40, 0xffu, 0x0fu, 0x03u), 0x0cu);
}

// ---- selp / slct: PTX ISA 9.7.8.1 selp (d = c ? a : b), 9.7.8.2 slct (d = (c >= 0) ? a : b; for the
// .f32 comparand -0 >= 0 holds, NaN selects b, .ftz flushes a subnormal c to sign-preserving zero). ----
SCALAR_FAMILY(selp) {
  auto selp = [](uint32_t a, uint32_t b, uint32_t c) { uint32_t d; asm volatile("{.reg .pred p; setp.ne.u32 p, %3, 0; selp.b32 %0, %1, %2, p;}" : "=r"(d) : "r"(a), "r"(b), "r"(c)); return d; };
  auto selp64 = [](uint64_t a, uint64_t b, uint32_t c) { uint64_t d; asm volatile("{.reg .pred p; setp.ne.u32 p, %3, 0; selp.b64 %0, %1, %2, p;}" : "=l"(d) : "l"(a), "l"(b), "r"(c)); return d; };
  chk("selp true", selp(11, 22, 1), 11);
  chk("selp false", selp(11, 22, 0), 22);
  chk("selp.b64 true", selp64(0x100000000ull, 2, 5), 0x100000000ull);
  chk("selp.b64 false", selp64(0x100000000ull, 2, 0), 2);
  chk("slct.s32 c=0", R3("slct.b32.s32", 11, 22, 0), 11);
  chk("slct.s32 c=-1", R3("slct.b32.s32", 11, 22, 0xffffffffu), 22);
  chk("slct.s32 c=max", R3("slct.u32.s32", 11, 22, 0x7fffffffu), 11);
  chk("slct.f32 c=-0", R3("slct.b32.f32", 11, 22, 0x80000000u), 11);
  chk("slct.f32 c=-1", R3("slct.b32.f32", 11, 22, 0xbf800000u), 22);
  chk("slct.f32 c=NaN", R3("slct.b32.f32", 11, 22, 0x7fc00000u), 22);
  chk("slct.f32 c=-denorm", R3("slct.b32.f32", 11, 22, 0x80000001u), 22);
  chk("slct.ftz.f32 c=-denorm", R3("slct.ftz.b32.f32", 11, 22, 0x80000001u), 11);
}

// ---- setp / set: PTX ISA 9.7.8.3 set, 9.7.8.4 setp, with the comparison operators of 9.7.x
// "Comparison and Selection" (Table: integer eq ne lt le gt ge, unsigned lo ls hi hs;
// floating eq ne lt le gt ge are false when either input is NaN (ordered), equ neu ltu leu gtu geu are
// true when either is NaN (unordered), num = both non-NaN, nan = either NaN; +0 == -0).
// setp.CmpOp.BoolOp p|q, a, b, c: t = a CmpOp b; p = t BoolOp c; q = !t BoolOp c.
// The expected values come from the host formula `host_cmp` below. ----
static const uint32_t kI[] = {0, 1, 0xffffffffu, 0x80000000u, 0x7fffffffu, 5};
constexpr int kNI = sizeof kI / sizeof kI[0];
static const uint32_t kF[] = {0x00000000u /*+0*/, 0x80000000u /*-0*/, 0x3f800000u /*1*/, 0xbf800000u /*-1*/,
                              0x7f800000u /*inf*/, 0xff800000u /*-inf*/, 0x7fc00000u /*nan*/, 0x00000001u /*denorm*/};
constexpr int kNF = sizeof kF / sizeof kF[0];
__constant__ uint32_t c_I[kNI];
__constant__ uint32_t c_F[kNF];

#define SETP_BIT(cmp, ty, a, b) ({ uint32_t d_; asm volatile("{.reg .pred p; setp." cmp "." ty " p, %1, %2; selp.u32 %0, 1, 0, p;}" : "=r"(d_) : "r"(a), "r"(b)); d_; })
// integer comparisons, in this order: s32 eq ne lt le gt ge; u32 eq ne lo ls hi hs lt gt
__global__ void k_setp_int(uint32_t* out) {
  for (int i = 0; i < kNI; ++i)
    for (int j = 0; j < kNI; ++j) {
      uint32_t a = c_I[i], b = c_I[j], m = 0;
      m |= SETP_BIT("eq", "s32", a, b) << 0;
      m |= SETP_BIT("ne", "s32", a, b) << 1;
      m |= SETP_BIT("lt", "s32", a, b) << 2;
      m |= SETP_BIT("le", "s32", a, b) << 3;
      m |= SETP_BIT("gt", "s32", a, b) << 4;
      m |= SETP_BIT("ge", "s32", a, b) << 5;
      m |= SETP_BIT("eq", "u32", a, b) << 6;
      m |= SETP_BIT("ne", "u32", a, b) << 7;
      m |= SETP_BIT("lo", "u32", a, b) << 8;
      m |= SETP_BIT("ls", "u32", a, b) << 9;
      m |= SETP_BIT("hi", "u32", a, b) << 10;
      m |= SETP_BIT("hs", "u32", a, b) << 11;
      m |= SETP_BIT("lt", "u32", a, b) << 12;
      m |= SETP_BIT("gt", "u32", a, b) << 13;
      out[i * kNI + j] = m;
    }
}
// f32 comparisons: eq ne lt le gt ge equ neu ltu leu gtu geu num nan, then eq.ftz (denormal == 0)
__global__ void k_setp_f32(uint32_t* out) {
  for (int i = 0; i < kNF; ++i)
    for (int j = 0; j < kNF; ++j) {
      uint32_t a = c_F[i], b = c_F[j], m = 0;
      m |= SETP_BIT("eq", "f32", a, b) << 0;
      m |= SETP_BIT("ne", "f32", a, b) << 1;
      m |= SETP_BIT("lt", "f32", a, b) << 2;
      m |= SETP_BIT("le", "f32", a, b) << 3;
      m |= SETP_BIT("gt", "f32", a, b) << 4;
      m |= SETP_BIT("ge", "f32", a, b) << 5;
      m |= SETP_BIT("equ", "f32", a, b) << 6;
      m |= SETP_BIT("neu", "f32", a, b) << 7;
      m |= SETP_BIT("ltu", "f32", a, b) << 8;
      m |= SETP_BIT("leu", "f32", a, b) << 9;
      m |= SETP_BIT("gtu", "f32", a, b) << 10;
      m |= SETP_BIT("geu", "f32", a, b) << 11;
      m |= SETP_BIT("num", "f32", a, b) << 12;
      m |= SETP_BIT("nan", "f32", a, b) << 13;
      m |= SETP_BIT("eq.ftz", "f32", a, b) << 14;
      out[i * kNF + j] = m;
    }
}
static float h_f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint32_t host_int_mask(uint32_t a, uint32_t b) {
  int32_t sa = (int32_t)a, sb = (int32_t)b;
  bool r[14] = {sa == sb, sa != sb, sa < sb, sa <= sb, sa > sb, sa >= sb,
                a == b, a != b, a < b, a <= b, a > b, a >= b, a < b, a > b};
  uint32_t m = 0;
  for (int k = 0; k < 14; ++k) m |= (uint32_t)r[k] << k;
  return m;
}
static uint32_t host_f32_mask(uint32_t ua, uint32_t ub) {
  float a = h_f(ua), b = h_f(ub);
  bool n = a != a || b != b;
  // ftz: subnormal inputs become (signed) zero before comparing
  auto ftz = [](uint32_t u) { return ((u & 0x7f800000u) == 0) ? 0.0f : h_f(u); };
  float fa = ftz(ua), fb = ftz(ub);
  bool r[15] = {!n && a == b, !n && a != b, !n && a < b, !n && a <= b, !n && a > b, !n && a >= b,
                n || a == b, n || a != b, n || a < b, n || a <= b, n || a > b, n || a >= b,
                !n, n, !n && fa == fb};
  uint32_t m = 0;
  for (int k = 0; k < 15; ++k) m |= (uint32_t)r[k] << k;
  return m;
}
static void setp() {
  CK(cudaMemcpyToSymbol(c_I, kI, sizeof kI));
  CK(cudaMemcpyToSymbol(c_F, kF, sizeof kF));
  uint32_t *di, *df;
  CK(cudaMalloc(&di, kNI * kNI * 4));
  CK(cudaMalloc(&df, kNF * kNF * 4));
  k_setp_int<<<1, 1>>>(di);
  k_setp_f32<<<1, 1>>>(df);
  uint32_t hi[kNI * kNI], hf[kNF * kNF];
  CK(cudaMemcpy(hi, di, sizeof hi, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hf, df, sizeof hf, cudaMemcpyDeviceToHost));
  char nm[64];
  for (int i = 0; i < kNI; ++i)
    for (int j = 0; j < kNI; ++j) {
      snprintf(nm, sizeof nm, "int(%x,%x)", kI[i], kI[j]);
      hchk(nm, hi[i * kNI + j], host_int_mask(kI[i], kI[j]));
    }
  for (int i = 0; i < kNF; ++i)
    for (int j = 0; j < kNF; ++j) {
      snprintf(nm, sizeof nm, "f32(%x,%x)", kF[i], kF[j]);
      hchk(nm, hf[i * kNF + j], host_f32_mask(kF[i], kF[j]));
    }
  CK(cudaFree(di));
  CK(cudaFree(df));
}

// setp with .and/.or/.xor and both destinations (p|q), c and !c; set with integer and float results.
#define SETP_BOOL(spec, a, b, c) ({ uint32_t d_; asm volatile("{.reg .pred p, q, c; setp.ne.u32 c, %3, 0; setp." spec " p|q, %1, %2, c; " \
  "selp.u32 %0, 1, 0, p; @q add.u32 %0, %0, 2;}" : "=r"(d_) : "r"(a), "r"(b), "r"(c)); d_; })
#define SETP_BOOLN(spec, a, b, c) ({ uint32_t d_; asm volatile("{.reg .pred p, q, c; setp.ne.u32 c, %3, 0; setp." spec " p|q, %1, %2, !c; " \
  "selp.u32 %0, 1, 0, p; @q add.u32 %0, %0, 2;}" : "=r"(d_) : "r"(a), "r"(b), "r"(c)); d_; })
SCALAR_FAMILY(setp_bool) {
  // result = p + 2*q;  t = (a < b)
  chk("lt.and t,c", SETP_BOOL("lt.and.s32", 1, 2, 1), 1);      // p = 1&1, q = 0&1
  chk("lt.and t,!c", SETP_BOOL("lt.and.s32", 1, 2, 0), 0);     // p = 1&0, q = 0&0
  chk("lt.and f,c", SETP_BOOL("lt.and.s32", 2, 1, 1), 2);      // p = 0, q = 1&1
  chk("lt.or f,c=0", SETP_BOOL("lt.or.s32", 2, 1, 0), 2);      // p = 0|0, q = 1|0
  chk("lt.or f,c=1", SETP_BOOL("lt.or.s32", 2, 1, 1), 3);      // p = 0|1, q = 1|1
  chk("lt.xor t,c=1", SETP_BOOL("lt.xor.s32", 1, 2, 1), 2);    // p = 1^1, q = 0^1
  chk("lt.xor t,c=0", SETP_BOOL("lt.xor.s32", 1, 2, 0), 1);
  chk("lt.and !c (c=0)", SETP_BOOLN("lt.and.s32", 1, 2, 0), 1); // !c = 1
  chk("lt.or !c (c=1)", SETP_BOOLN("lt.or.s32", 2, 1, 1), 2);   // !c = 0: p = 0, q = 1
  chk("gtu.and nan", SETP_BOOL("gtu.and.f32", 0x7fc00000u, 0x3f800000u, 1), 1);  // t = 1 (unordered)
  chk("gt.and nan", SETP_BOOL("gt.and.f32", 0x7fc00000u, 0x3f800000u, 1), 2);    // t = 0, q = !t = 1
  chk("hi.xor u32", SETP_BOOL("hi.xor.u32", 0xffffffffu, 1, 1), 2);              // t = 1
  chk("set.lt.u32.s32 t", R2("set.lt.u32.s32", (uint32_t)-1, 0), 0xffffffffu);
  chk("set.lt.u32.u32 f", R2("set.lt.u32.u32", (uint32_t)-1, 0), 0);
  chk("set.lt.f32.s32 t", R2("set.lt.f32.s32", (uint32_t)-1, 0), 0x3f800000u);
  chk("set.ge.f32.s32 f", R2("set.ge.f32.s32", (uint32_t)-1, 0), 0);
  chk("set.nan.u32.f32", R2("set.nan.u32.f32", 0x7fc00000u, 0), 0xffffffffu);
  chk("set.eq.s32.f32 +0 -0", R2("set.eq.s32.f32", 0, 0x80000000u), 0xffffffffu);
  auto set_and = [](uint32_t a, uint32_t b, uint32_t c) { uint32_t d; asm volatile("{.reg .pred c; setp.ne.u32 c, %3, 0; set.eq.and.u32.s32 %0, %1, %2, c;}" : "=r"(d) : "r"(a), "r"(b), "r"(c)); return d; };
  auto set_or_n = [](uint32_t a, uint32_t b, uint32_t c) { uint32_t d; asm volatile("{.reg .pred c; setp.ne.u32 c, %3, 0; set.eq.or.f32.s32 %0, %1, %2, !c;}" : "=r"(d) : "r"(a), "r"(b), "r"(c)); return d; };
  chk("set.eq.and t,c=0", set_and(3, 3, 0), 0);
  chk("set.eq.and t,c=1", set_and(3, 3, 1), 0xffffffffu);
  chk("set.eq.or.f32 f,!c c=0", set_or_n(3, 4, 0), 0x3f800000u);
  chk("set.eq.or.f32 f,!c c=1", set_or_n(3, 4, 1), 0);
}

// ---- cvt int <-> int: PTX ISA 9.7.9.21 cvt (integer rounding n/a; .sat clamps to the destination
// range; without .sat a narrowing conversion truncates). A destination narrower than its register is
// sign-extended (signed types) / zero-extended (unsigned) to the register width (PTX ISA 6.4.x
// "Operand Size Exceeding Instruction-Type Size"). Sources narrower than the register use their low bits. ----
#define CVT_RR(op, a) R1(op, a)
SCALAR_FAMILY(cvt_int) {
  chk("cvt.s32.s8 0x80", CVT_RR("cvt.s32.s8", 0x80u), 0xffffff80u);
  chk("cvt.s32.s8 0x17f", CVT_RR("cvt.s32.s8", 0x17fu), 0x7f);
  chk("cvt.u32.u8 0x1ff", CVT_RR("cvt.u32.u8", 0x1ffu), 0xff);
  chk("cvt.s32.s16 0x8000", CVT_RR("cvt.s32.s16", 0x8000u), 0xffff8000u);
  chk("cvt.u32.s16 0x8000", CVT_RR("cvt.u32.s16", 0x8000u), 0xffff8000u);  // value -32768 -> u32 bits
  chk("cvt.s32.u16 0x8000", CVT_RR("cvt.s32.u16", 0x18000u), 0x8000u);
  chk("cvt.s8.s32 0x17f", CVT_RR("cvt.s8.s32", 0x17fu), 0x7f);
  chk("cvt.s8.s32 0x180", CVT_RR("cvt.s8.s32", 0x180u), 0xffffff80u);
  chk("cvt.u8.s32 0x1ff", CVT_RR("cvt.u8.s32", 0x1ffu), 0xff);
  chk("cvt.sat.s8.s32 300", CVT_RR("cvt.sat.s8.s32", 300u), 0x7f);
  chk("cvt.sat.s8.s32 -300", CVT_RR("cvt.sat.s8.s32", (uint32_t)-300), 0xffffff80u);
  chk("cvt.sat.u8.s32 -5", CVT_RR("cvt.sat.u8.s32", (uint32_t)-5), 0);
  chk("cvt.sat.u8.s32 256", CVT_RR("cvt.sat.u8.s32", 256u), 0xff);
  chk("cvt.sat.u16.s32 70000", CVT_RR("cvt.sat.u16.s32", 70000u), 0xffff);
  chk("cvt.sat.s16.s32 -70000", CVT_RR("cvt.sat.s16.s32", (uint32_t)-70000), 0xffff8000u);
  chk("cvt.sat.s32.u32 2^31", CVT_RR("cvt.sat.s32.u32", 0x80000000u), 0x7fffffffu);
  chk("cvt.sat.u32.s32 -1", CVT_RR("cvt.sat.u32.s32", 0xffffffffu), 0);
  chk("cvt.u32.s32 -1 (no sat)", CVT_RR("cvt.u32.s32", 0xffffffffu), 0xffffffffu);
  chk("cvt.s16.s32 0x12345", CVT_RR("cvt.s16.s32", 0x12345u), 0x2345u);
  auto w = [](uint32_t a) { uint64_t d; asm volatile("cvt.s64.s32 %0, %1;" : "=l"(d) : "r"(a)); return d; };
  auto wu = [](uint32_t a) { uint64_t d; asm volatile("cvt.u64.u32 %0, %1;" : "=l"(d) : "r"(a)); return d; };
  auto wsu = [](uint32_t a) { uint64_t d; asm volatile("cvt.s64.u32 %0, %1;" : "=l"(d) : "r"(a)); return d; };
  auto n = [](uint64_t a) { uint32_t d; asm volatile("cvt.u32.u64 %0, %1;" : "=r"(d) : "l"(a)); return d; };
  auto ns = [](uint64_t a) { uint32_t d; asm volatile("cvt.sat.s32.s64 %0, %1;" : "=r"(d) : "l"(a)); return d; };
  auto nu = [](uint64_t a) { uint32_t d; asm volatile("cvt.sat.u32.s64 %0, %1;" : "=r"(d) : "l"(a)); return d; };
  auto nuu = [](uint64_t a) { uint32_t d; asm volatile("cvt.sat.u32.u64 %0, %1;" : "=r"(d) : "l"(a)); return d; };
  chk("cvt.s64.s32 -1", w(0xffffffffu), ~0ull);
  chk("cvt.u64.u32 max", wu(0xffffffffu), 0xffffffffull);
  chk("cvt.s64.u32 max", wsu(0xffffffffu), 0xffffffffull);
  chk("cvt.u32.u64 trunc", n(0x100000005ull), 5);
  chk("cvt.sat.s32.s64 2^32", ns(0x100000000ull), 0x7fffffffu);
  chk("cvt.sat.s32.s64 -2^40", ns((uint64_t)-(1ll << 40)), 0x80000000u);
  chk("cvt.sat.u32.s64 -1", nu(~0ull), 0);
  chk("cvt.sat.u32.u64 2^63", nuu(0x8000000000000000ull), 0xffffffffu);
  auto h8 = [](uint16_t a) { uint32_t d; asm volatile("cvt.s32.s8 %0, %1;" : "=r"(d) : "h"(a)); return d; };
  chk("cvt.s32.s8 from b16 reg", h8(0x01fe), 0xfffffffeu);
}

FAMILIES({"arith", arith}, {"mad", mad}, {"mul24", mul24}, {"divrem", divrem}, {"minmax", minmax},
         {"minmax_x2", minmax_x2}, {"absneg", absneg}, {"bits", bits}, {"bfe", bfe}, {"bmsk", bmsk}, {"bfi", bfi},
         {"shift", shift}, {"shf", shf}, {"prmt", prmt}, {"prmt_modes", prmt_modes}, {"lop3", lop3},
         {"selp", selp}, {"setp", setp}, {"setp_bool", setp_bool}, {"cvt_int", cvt_int})
