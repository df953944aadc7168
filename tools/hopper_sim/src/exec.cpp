// Instruction semantics (PTX ISA): one thread steps through its decoded instructions; warp- and
// warpgroup-collective instructions rendezvous and then execute once for all participants.
#include <cmath>
#include <cstring>
#include <string>

#include "engine.h"
#include "numeric.h"
#include "tensor_core.h"
#include "tma.h"

namespace hsim {

using num::Rnd;

namespace {

inline uint64_t maskb(uint64_t v, int bits) { return bits >= 64 ? v : (v & ((1ull << bits) - 1)); }
inline int64_t sext(uint64_t v, int bits) {
  if (bits >= 64) return (int64_t)v;
  uint64_t m = 1ull << (bits - 1);
  v &= (1ull << bits) - 1;
  return (int64_t)((v ^ m) - m);
}
inline float f32(uint64_t v) { float f; uint32_t u = (uint32_t)v; memcpy(&f, &u, 4); return f; }
inline double f64(uint64_t v) { double f; memcpy(&f, &v, 8); return f; }
inline uint64_t bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
inline uint64_t bits(double f) { uint64_t u; memcpy(&u, &f, 8); return u; }
inline Rnd rnd(const DInstr& d, Rnd def = Rnd::kRN) { return d.rnd ? (Rnd)d.rnd : def; }

struct Ctx {
  Engine* e;
  Thread* t;
  Frame* f;
  uint64_t* R;
  const DInstr* d;
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Operand access
static uint64_t sreg(Ctx& c, int64_t code) {
  Thread* t = c.t;
  Cta* cta = t->cta;
  const LaunchParams& lp = c.e->launch();
  const uint32_t cl[3] = {lp.cluster.x, lp.cluster.y, lp.cluster.z};
  const uint32_t grid[3] = {lp.grid.x, lp.grid.y, lp.grid.z};
  const uint32_t blk[3] = {lp.block.x, lp.block.y, lp.block.z};
  if (code >= kSregTid && code < kSregTid + 3) return t->tid[code - kSregTid];
  if (code >= kSregNtid && code < kSregNtid + 3) return blk[code - kSregNtid];
  if (code >= kSregCtaid && code < kSregCtaid + 3) return cta->id[code - kSregCtaid];
  if (code >= kSregNctaid && code < kSregNctaid + 3) return grid[code - kSregNctaid];
  if (code >= kSregClusterid && code < kSregClusterid + 3) return cta->id[code - kSregClusterid] / cl[code - kSregClusterid];
  if (code >= kSregNclusterid && code < kSregNclusterid + 3) return grid[code - kSregNclusterid] / cl[code - kSregNclusterid];
  if (code >= kSregClusterCtaid && code < kSregClusterCtaid + 3) return cta->id[code - kSregClusterCtaid] % cl[code - kSregClusterCtaid];
  if (code >= kSregClusterNctaid && code < kSregClusterNctaid + 3) return cl[code - kSregClusterNctaid];
  switch (code) {
    case kSregLaneid: return t->lane;
    case kSregWarpid: return t->linear / 32;
    case kSregNwarpid: return 64;
    case kSregSmid: return cta->linear % c.e->opt().sms;
    case kSregNsmid: return c.e->opt().sms;
    case kSregGridid: return 1;
    case kSregClusterCtarank: return cta->rank;
    case kSregClusterNctarank: return cl[0] * cl[1] * cl[2];
    case kSregIsExplicitCluster: return (cl[0] * cl[1] * cl[2]) > 1 ? 1 : 0;
    case kSregLanemaskEq: return 1u << t->lane;
    case kSregLanemaskLe: return (uint32_t)((2ull << t->lane) - 1);
    case kSregLanemaskLt: return (1u << t->lane) - 1;
    case kSregLanemaskGe: return ~((1u << t->lane) - 1) & 0xffffffffu;
    case kSregLanemaskGt: return ~(uint32_t)((2ull << t->lane) - 1) & 0xffffffffu;
    case kSregClock: case kSregClockHi: case kSregClock64:
    case kSregGlobaltimer: case kSregGlobaltimerLo: case kSregGlobaltimerHi: {
      // %clock*: the CTA's executed thread-instructions (monotonic, per SM as on hardware);
      // %globaltimer*: the whole launch's
      uint64_t v = (code == kSregClock || code == kSregClockHi || code == kSregClock64) ? cta->clock : c.e->clock();
      if (code == kSregClock || code == kSregGlobaltimerLo) return (uint32_t)v;
      if (code == kSregClockHi || code == kSregGlobaltimerHi) return (uint32_t)(v >> 32);
      return v;
    }
    case kSregDynamicSmemSize: return cta->dyn_smem;
    case kSregTotalSmemSize: case kSregAggrSmemSize: return cta->smem.size();
    default:
      if (code >= kSregEnvreg0 && code < kSregEnvreg0 + 32) return 0;
  }
  c.e->fail("unsupported", t, c.d, "special register code " + std::to_string(code));
}

static uint64_t sym_addr(Ctx& c, int32_t sym) {
  const LoadedModule* lm = c.e->module();
  const Symbol& s = lm->mod->symbols[sym];
  switch (s.space) {
    case Symbol::kGlobal: case Symbol::kConst: return (uint64_t)lm->sym_addr[sym];
    case Symbol::kShared: {
      const auto& so = c.e->kernel_function()->shared_offset;
      auto it = so.find(sym);
      if (it == so.end()) c.e->fail("unsupported", c.t, c.d, "shared symbol without offset " + s.name);
      return it->second;
    }
    case Symbol::kParam: {
      // entry formal: its offset in the kernel parameter buffer; a body .param (call argument):
      // kCallParamBase + offset in the frame; a .func formal/return: 2*kCallParamBase + offset
      const LoadedFunction* lf = c.f->lf;
      auto it = lf->param_offset.find(sym);
      if (it == lf->param_offset.end()) c.e->fail("unsupported", c.t, c.d, "param symbol " + s.name);
      if (lf->fn->is_entry) {
        for (int32_t p : lf->fn->params)
          if (p == sym) return it->second;
      }
      for (int32_t p : lf->fn->body_params)
        if (p == sym) return kCallParamBase + it->second;
      return 2 * kCallParamBase + it->second;
    }
    case Symbol::kLocal: {
      const LoadedFunction* lf = c.f->lf;
      for (size_t i = 0; i < lf->fn->locals.size(); ++i)
        if (lf->fn->locals[i] == sym) return c.f->local_base + lf->local_offsets[i];
      c.e->fail("unsupported", c.t, c.d, "local symbol " + s.name);
    }
    case Symbol::kFunc: return (uint64_t)sym;
    default: break;
  }
  c.e->fail("unsupported", c.t, c.d, "symbol " + s.name);
}

static inline void check_reg_read(Ctx& c, int32_t r) {
  Thread* t = c.t;
  if (t->wg_pending_total && c.f == &t->frames[0] && t->wg_pending[r])
    c.e->fail("wgmma-register-race", t, c.d,
              "register " + c.f->lf->fn->regs[r].name + " is an operand of an in-flight wgmma.mma_async: read before "
              "the wgmma.wait_group that covers it");
}

static uint64_t val_slow(Ctx& c, const Operand& o);
static inline __attribute__((always_inline)) uint64_t val(Ctx& c, const Operand& o) {
  if (__builtin_expect(o.kind == Operand::kReg && !c.t->wg_pending_total, 1)) return o.neg ? (c.R[o.reg] ^ 1) : c.R[o.reg];
  if (o.kind == Operand::kImm || o.kind == Operand::kF32 || o.kind == Operand::kF64) return (uint64_t)o.imm;
  return val_slow(c, o);
}

static uint64_t val_slow(Ctx& c, const Operand& o) {
  switch (o.kind) {
    case Operand::kReg: check_reg_read(c, o.reg); return o.neg ? (c.R[o.reg] ^ 1) : c.R[o.reg];
    case Operand::kImm: case Operand::kF32: case Operand::kF64: return (uint64_t)o.imm;
    case Operand::kSreg: return sreg(c, o.imm);
    case Operand::kSym: return sym_addr(c, o.sym);
    default: break;
  }
  c.e->fail("unsupported", c.t, c.d, "operand kind " + std::to_string((int)o.kind));
}

// A float operand as f32: 0d literals given to an f32 instruction are rounded.
static inline float valf(Ctx& c, const Operand& o) {
  if (o.kind == Operand::kF64) return (float)f64((uint64_t)o.imm);
  return f32(val(c, o));
}
static inline double vald(Ctx& c, const Operand& o) {
  if (o.kind == Operand::kF32) return (double)f32((uint64_t)o.imm);
  return f64(val(c, o));
}

static void setreg_race(Ctx& c, int32_t r) {
  c.e->fail("wgmma-register-race", c.t, c.d,
            "register " + c.f->lf->fn->regs[r].name + " written while an in-flight wgmma.mma_async uses it");
}

static inline __attribute__((always_inline)) void setreg(Ctx& c, int32_t r, uint64_t v) {
  Thread* t = c.t;
  if (c.f == &t->frames[0]) {
    if (__builtin_expect(t->wg_pending_total != 0, 0) && t->wg_pending[r]) setreg_race(c, r);
    t->wg_written[r] = 1;
  }
  c.R[r] = v & c.f->lf->regmask[r];
}

static inline __attribute__((always_inline)) void dst(Ctx& c, const Operand& o, uint64_t v) {
  if (o.kind == Operand::kReg) setreg(c, o.reg, v);
  else if (o.kind == Operand::kSink) {}
  else c.e->fail("unsupported", c.t, c.d, "destination operand kind");
}

static inline const Operand& vel(Ctx& c, const Operand& v, uint32_t i) {
  return c.f->lf->fn->vec_elems[v.vec_begin + i];
}

// Address of a memory operand [reg+imm] / [sym+imm] / [imm].
static inline uint64_t addr(Ctx& c, const Operand& o) {
  if (o.kind != Operand::kMem) {
    if (o.kind == Operand::kReg || o.kind == Operand::kSym || o.kind == Operand::kImm) return val(c, o);
    c.e->fail("unsupported", c.t, c.d, "address operand");
  }
  uint64_t a = (uint64_t)o.imm;
  if (o.reg >= 0) { check_reg_read(c, o.reg); a += c.R[o.reg]; }
  if (o.sym >= 0) a += sym_addr(c, o.sym);
  return a;
}

// ---------------------------------------------------------------------------------------------
// Integer and float ALU

static uint64_t int_binop(Ctx& c, Op op, T t, uint64_t a, uint64_t b) {
  int n = tbits(t);
  bool s = tsigned(t);
  const DInstr& d = *c.d;
  switch (op) {
    case Op::Add: case Op::Sub:
      if (t == T::U16x2 || t == T::S16x2) {
        uint64_t r = 0;
        for (int i = 0; i < 2; ++i) {
          int64_t x = (a >> (16 * i)) & 0xffff, y = (b >> (16 * i)) & 0xffff;
          if (t == T::S16x2) { x = sext(x, 16); y = sext(y, 16); }
          int64_t v = op == Op::Add ? x + y : x - y;
          if (d.flags & F_SAT) {
            int64_t lo = t == T::S16x2 ? -32768 : 0, hi = t == T::S16x2 ? 32767 : 65535;
            v = v < lo ? lo : v > hi ? hi : v;
          }
          r |= (uint64_t)(v & 0xffff) << (16 * i);
        }
        return r;
      }
      if (op == Op::Sub) goto sub;
      if (d.flags & F_SAT) {   // add.sat.s32
        int64_t r = sext(a, 32) + sext(b, 32);
        if (r > INT32_MAX) r = INT32_MAX;
        if (r < INT32_MIN) r = INT32_MIN;
        return maskb((uint64_t)r, 32);
      }
      return maskb(a + b, n);
    sub: {
      if (d.flags & F_SAT) {
        int64_t r = sext(a, 32) - sext(b, 32);
        if (r > INT32_MAX) r = INT32_MAX;
        if (r < INT32_MIN) r = INT32_MIN;
        return maskb((uint64_t)r, 32);
      }
      return maskb(a - b, n);
    }
    case Op::Mul: {
      if (d.flags & F_WIDE) {
        if (s) return maskb((uint64_t)(sext(a, n) * sext(b, n)), 2 * n);
        return maskb(maskb(a, n) * maskb(b, n), 2 * n);
      }
      if (d.flags & F_HI) {
        if (n == 64) {
          if (s) return (uint64_t)(((__int128)(int64_t)a * (__int128)(int64_t)b) >> 64);
          return (uint64_t)(((unsigned __int128)a * (unsigned __int128)b) >> 64);
        }
        if (s) return maskb((uint64_t)((sext(a, n) * sext(b, n)) >> n), n);
        return maskb((maskb(a, n) * maskb(b, n)) >> n, n);
      }
      return maskb(a * b, n);
    }
    case Op::Div: {
      if (maskb(b, n) == 0) return maskb(~0ull, n);   // PTX: division by zero gives an unspecified value
      if (s) {
        int64_t x = sext(a, n), y = sext(b, n);
        if (y == -1 && n == 64 && x == INT64_MIN) return (uint64_t)x;
        return maskb((uint64_t)(x / y), n);
      }
      return maskb(maskb(a, n) / maskb(b, n), n);
    }
    case Op::Rem: {
      if (maskb(b, n) == 0) return maskb(a, n);
      if (s) {
        int64_t x = sext(a, n), y = sext(b, n);
        if (y == -1) return 0;
        return maskb((uint64_t)(x % y), n);
      }
      return maskb(maskb(a, n) % maskb(b, n), n);
    }
    case Op::Min: case Op::Max:
      if (t == T::S16x2 || t == T::U16x2) {   // per 16-bit lane
        uint64_t r = 0;
        for (int i = 0; i < 2; ++i) {
          uint64_t x = (a >> (16 * i)) & 0xffff, y = (b >> (16 * i)) & 0xffff;
          bool sg = t == T::S16x2;
          bool lt = sg ? sext(x, 16) < sext(y, 16) : x < y;
          uint64_t v = (op == Op::Min) == lt ? x : y;
          if ((d.flags & F_RELU) && sg && sext(v, 16) < 0) v = 0;
          r |= v << (16 * i);
        }
        return r;
      }
      if (d.flags & F_RELU) {   // max.relu / min.relu (.s32): clamp the result at 0
        int64_t x = sext(a, n), y = sext(b, n);
        int64_t v = op == Op::Min ? std::min(x, y) : std::max(x, y);
        return maskb((uint64_t)std::max<int64_t>(v, 0), n);
      }
      if (op == Op::Max) {
        if (s) return sext(a, n) > sext(b, n) ? maskb(a, n) : maskb(b, n);
        return maskb(a, n) > maskb(b, n) ? maskb(a, n) : maskb(b, n);
      }
      if (s) return sext(a, n) < sext(b, n) ? maskb(a, n) : maskb(b, n);
      return maskb(a, n) < maskb(b, n) ? maskb(a, n) : maskb(b, n);
    case Op::And: return a & b;
    case Op::Or: return a | b;
    case Op::Xor: return a ^ b;
    case Op::Shl: { uint64_t sh = maskb(b, 32); return sh >= (uint64_t)n ? 0 : maskb(a << sh, n); }
    case Op::Shr: {
      uint64_t sh = maskb(b, 32);
      if (s) {
        int64_t x = sext(a, n);
        return maskb((uint64_t)(sh >= (uint64_t)n ? (x < 0 ? -1 : 0) : (x >> sh)), n);
      }
      return sh >= (uint64_t)n ? 0 : (maskb(a, n) >> sh);
    }
    default: break;
  }
  c.e->fail("unsupported", c.t, c.d, "integer op");
}

// Half-precision element-wise helpers over 16-bit lanes.
static uint64_t half_op(Ctx& c, Op op, T t, uint64_t a, uint64_t b, uint64_t cc) {
  const DInstr& d = *c.d;
  bool bf = (t == T::BF16 || t == T::BF16x2);
  int lanes = (t == T::F16x2 || t == T::BF16x2) ? 2 : 1;
  bool ftz = d.flags & F_FTZ, sat = d.flags & F_SAT;
  Rnd r = rnd(d);
  uint64_t out = 0;
  for (int i = 0; i < lanes; ++i) {
    uint16_t x = (uint16_t)(a >> (16 * i)), y = (uint16_t)(b >> (16 * i)), z = (uint16_t)(cc >> (16 * i)), v = 0;
    switch (op) {
      case Op::Add: v = num::hadd(x, y, bf, r, ftz, sat); break;
      case Op::Sub: v = num::hsub(x, y, bf, r, ftz, sat); break;
      case Op::Mul: v = num::hmul(x, y, bf, r, ftz, sat); break;
      case Op::Fma: case Op::Mad: v = num::hfma(x, y, z, bf, r, ftz, sat, d.flags & F_RELU); break;
      case Op::Min: case Op::Max: {
        bool xs = d.flags & F_XORSIGN;   // .xorsign.abs: min/max of |a|, |b| with sign(a) ^ sign(b)
        uint16_t xa = xs ? (x & 0x7fff) : x, ya = xs ? (y & 0x7fff) : y;
        v = op == Op::Min ? num::hmin(xa, ya, bf, ftz, d.flags & F_NAN) : num::hmax(xa, ya, bf, ftz, d.flags & F_NAN);
        if (xs && !num::is_nan_f16(v, bf)) v = (v & 0x7fff) | ((x ^ y) & 0x8000);
        break;
      }
      case Op::Neg: v = x ^ 0x8000; break;
      case Op::Abs: v = x & 0x7fff; break;
      case Op::Ex2: v = bf ? num::ex2_approx_bf16(x) : num::ex2_approx_f16(x); break;
      case Op::Tanh: v = bf ? num::tanh_approx_bf16(x) : num::tanh_approx_f16(x); break;
      default: c.e->fail("unsupported", c.t, c.d, "half-precision op");
    }
    out |= (uint64_t)v << (16 * i);
  }
  return out;
}

static bool compare(Cmp cmp, T t, uint64_t a, uint64_t b, bool ftz) {
  if (tfloat(t)) {
    double x, y;
    if (t == T::F32) {
      float fa = f32(a), fb = f32(b);
      if (ftz) { fa = num::ftz_f32(fa); fb = num::ftz_f32(fb); }
      x = fa; y = fb;
    } else if (t == T::F64) { x = f64(a); y = f64(b); }
    else { bool bf = t == T::BF16; x = num::h_to_f32((uint16_t)a, bf); y = num::h_to_f32((uint16_t)b, bf); }
    bool un = std::isnan(x) || std::isnan(y);
    switch (cmp) {
      case Cmp::Eq: return !un && x == y;
      case Cmp::Ne: return !un && x != y;
      case Cmp::Lt: return !un && x < y;
      case Cmp::Le: return !un && x <= y;
      case Cmp::Gt: return !un && x > y;
      case Cmp::Ge: return !un && x >= y;
      case Cmp::Equ: return un || x == y;
      case Cmp::Neu: return un || x != y;
      case Cmp::Ltu: return un || x < y;
      case Cmp::Leu: return un || x <= y;
      case Cmp::Gtu: return un || x > y;
      case Cmp::Geu: return un || x >= y;
      case Cmp::Num: return !un;
      case Cmp::Nan: return un;
      default: return false;
    }
  }
  int n = tbits(t);
  if (tsigned(t)) {
    int64_t x = sext(a, n), y = sext(b, n);
    switch (cmp) {
      case Cmp::Eq: return x == y; case Cmp::Ne: return x != y; case Cmp::Lt: return x < y;
      case Cmp::Le: return x <= y; case Cmp::Gt: return x > y; case Cmp::Ge: return x >= y;
      default: break;
    }
  }
  uint64_t x = maskb(a, n), y = maskb(b, n);
  switch (cmp) {
    case Cmp::Eq: return x == y; case Cmp::Ne: return x != y;
    case Cmp::Lt: case Cmp::Lo: return x < y; case Cmp::Le: case Cmp::Ls: return x <= y;
    case Cmp::Gt: case Cmp::Hi: return x > y; case Cmp::Ge: case Cmp::Hs: return x >= y;
    default: return false;
  }
}

// cvt: all directions PTX defines between integer and float types.
static uint64_t convert(Ctx& c, T dt, T st, uint64_t v) {
  const DInstr& d = *c.d;
  bool ftz = d.flags & F_FTZ, sat = d.flags & F_SAT;
  bool dfl = tfloat(dt), sfl = tfloat(st);
  int dn = tbits(dt), sn = tbits(st);
  if (!dfl && !sfl) {   // integer <-> integer: sign/zero extend from the source, then saturate
    int64_t sv = tsigned(st) ? sext(v, sn) : (int64_t)maskb(v, sn);
    if (sat) {
      if (tsigned(dt)) {
        int64_t lo = -(1ll << (dn - 1)), hi = (1ll << (dn - 1)) - 1;
        if (!tsigned(st) && sn == 64 && (uint64_t)sv > (uint64_t)hi) sv = hi;
        else { if (sv < lo) sv = lo; if (sv > hi) sv = hi; }
      } else {
        uint64_t hi = dn == 64 ? ~0ull : (1ull << dn) - 1;
        if (tsigned(st) && sv < 0) sv = 0;
        else if ((uint64_t)sv > hi) sv = (int64_t)hi;
      }
    }
    // a signed result is sign-extended into a wider register (PTX ISA: operand size rules)
    return tsigned(dt) ? (uint64_t)sext((uint64_t)sv, dn) : maskb((uint64_t)sv, dn);
  }
  if (dfl && !sfl) {   // integer -> float
    Rnd r = rnd(d);
    uint64_t iv = maskb(v, sn);
    if (dt == T::F32) return bits(num::int_to_f32(iv, tsigned(st), sn, r));
    if (dt == T::F64) return bits(num::int_to_f64(iv, tsigned(st), sn, r));
    if (dt == T::F16 || dt == T::BF16) {
      double x = num::int_to_f64(iv, tsigned(st), sn, Rnd::kRN);
      return dt == T::F16 ? num::f64_to_f16(x, r) : num::f64_to_bf16(x, r);
    }
  }
  // source as double (exact for every float source)
  double x = 0;
  switch (st) {
    case T::F32: { float f = f32(v); if (ftz) f = num::ftz_f32(f); x = f; break; }
    case T::F64: x = f64(v); break;
    case T::F16: x = num::f16_to_f32((uint16_t)v); break;
    case T::BF16: x = num::bf16_to_f32((uint16_t)v); break;
    case T::E4M3: x = num::e4m3_to_f32((uint8_t)v); break;
    case T::E5M2: x = num::e5m2_to_f32((uint8_t)v); break;
    default: break;
  }
  if (!dfl) {   // float -> integer
    Rnd r = rnd(d, Rnd::kRZI);
    return num::float_to_int(x, r, tsigned(dt), dn);
  }
  switch (dt) {
    case T::F32: {
      if (st == T::F32) {   // cvt.rni.f32.f32 etc. or cvt.ftz/sat.f32.f32
        float f = f32(v);
        if (d.rnd) return bits(num::round_f32(f, (Rnd)d.rnd, ftz, sat));
        if (ftz) f = num::ftz_f32(f);
        if (sat) f = num::sat_f32(f);
        return bits(f);
      }
      if (st == T::F64) return bits(num::f64_to_f32(x, rnd(d), ftz, sat));
      float f = (float)x;
      if (ftz) f = num::ftz_f32(f);
      if (sat) f = num::sat_f32(f);
      return bits(f);
    }
    case T::F64: {
      if (st == T::F64 && d.rnd) {
        double r = x;
        switch ((Rnd)d.rnd) {
          case Rnd::kRNI: r = std::nearbyint(x); break;
          case Rnd::kRZI: r = std::trunc(x); break;
          case Rnd::kRMI: r = std::floor(x); break;
          case Rnd::kRPI: r = std::ceil(x); break;
          default: break;
        }
        return bits(r);
      }
      if (sat) x = std::isnan(x) ? 0.0 : std::fmin(1.0, std::fmax(0.0, x));
      return bits(x);
    }
    case T::F16:
      if (st == T::F32) return num::f32_to_f16(f32(v), rnd(d), d.flags & F_RELU, d.flags & F_SATFINITE);
      if (st == T::F64) return num::f64_to_f16(x, rnd(d));
      return num::f32_to_f16((float)x, rnd(d));
    case T::BF16:
      if (st == T::F32) return num::f32_to_bf16(f32(v), rnd(d), d.flags & F_RELU, d.flags & F_SATFINITE);
      if (st == T::F64) return num::f64_to_bf16(x, rnd(d));
      return num::f32_to_bf16((float)x, rnd(d));
    case T::TF32: return num::f32_to_tf32(f32(v), rnd(d, Rnd::kRNA), d.flags & F_SATFINITE);
    default: break;
  }
  c.e->fail("unsupported", c.t, c.d, "cvt combination");
}

// ---------------------------------------------------------------------------------------------
// Memory helpers

static Sp space_of(const DInstr& d) { return d.sp == Sp::None ? Sp::Generic : d.sp; }

static uint64_t load(Ctx& c, Sp sp, uint64_t a, int n) {
  uint8_t* p = c.e->mem(c.t, c.d, sp, a, n / 8, false);
  uint64_t v = 0;
  memcpy(&v, p, n / 8);
  return v;
}

static void store(Ctx& c, Sp sp, uint64_t a, int n, uint64_t v) {
  uint8_t* p = c.e->mem(c.t, c.d, sp, a, n / 8, true);
  memcpy(p, &v, n / 8);
}

static uint64_t atomic_apply(Ctx& c, AtomOp op, T t, uint64_t old, uint64_t b, uint64_t cc) {
  int n = tbits(t);
  switch (op) {
    case AtomOp::Add:
      if (t == T::F32) return bits(f32(old) + f32(b));   // atom.add.f32 is .rn (ftz per ISA on global)
      if (t == T::F64) return bits(f64(old) + f64(b));
      if (t == T::F16 || t == T::F16x2 || t == T::BF16 || t == T::BF16x2) return half_op(c, Op::Add, t, old, b, 0);
      return maskb(old + b, n);
    case AtomOp::Min: case AtomOp::Max: {
      bool mn = op == AtomOp::Min;
      if (t == T::F16 || t == T::BF16 || t == T::F16x2 || t == T::BF16x2)
        return half_op(c, mn ? Op::Min : Op::Max, t, old, b, 0);
      if (t == T::F32) { float x = f32(old), y = f32(b); return bits(mn ? std::fmin(x, y) : std::fmax(x, y)); }
      if (tsigned(t)) { int64_t x = sext(old, n), y = sext(b, n); return maskb((uint64_t)(mn ? std::min(x, y) : std::max(x, y)), n); }
      uint64_t x = maskb(old, n), y = maskb(b, n);
      return mn ? std::min(x, y) : std::max(x, y);
    }
    case AtomOp::Inc: { uint64_t x = maskb(old, n), y = maskb(b, n); return x >= y ? 0 : x + 1; }
    case AtomOp::Dec: { uint64_t x = maskb(old, n), y = maskb(b, n); return (x == 0 || x > y) ? y : x - 1; }
    case AtomOp::And: return old & b;
    case AtomOp::Or: return old | b;
    case AtomOp::Xor: return old ^ b;
    case AtomOp::Exch: return b;
    case AtomOp::Cas: return maskb(old, n) == maskb(b, n) ? cc : old;
    default: break;
  }
  c.e->fail("unsupported", c.t, c.d, "atomic op");
}

// printf: vprintf(format, args) with C promotion rules (the argument buffer is 8-byte aligned
// for 8-byte values).
static void do_vprintf(Ctx& c, uint64_t fmt, uint64_t args) {
  std::string out;
  auto rdb = [&](uint64_t a) -> char { return (char)*c.e->mem(c.t, c.d, Sp::Generic, a, 1, false); };
  size_t off = 0;
  auto arg = [&](int n) -> uint64_t {
    off = (off + n - 1) / n * n;
    uint64_t v = 0;
    memcpy(&v, c.e->mem(c.t, c.d, Sp::Generic, args + off, n, false), n);
    off += n;
    return v;
  };
  for (uint64_t p = fmt;; ++p) {
    char ch = rdb(p);
    if (!ch) break;
    if (ch != '%') { out += ch; continue; }
    std::string spec = "%";
    char conv = 0;
    int longs = 0;
    for (++p;; ++p) {
      char x = rdb(p);
      if (!x) break;
      if (x == 'l') { ++longs; continue; }
      if (x == 'h' || x == 'z' || x == 'j' || x == 't') { if (x != 'h') longs = 2; continue; }
      spec += x;
      if (strchr("diouxXeEfFgGaAcspn%", x)) { conv = x; break; }
    }
    char buf[512];
    if (conv == '%') out += '%';
    else if (conv == 's') {
      uint64_t s = arg(8);
      std::string str;
      for (uint64_t q = s; q && rdb(q); ++q) str += rdb(q);
      snprintf(buf, sizeof buf, spec.c_str(), str.c_str()); out += buf;
    } else if (strchr("eEfFgGaA", conv)) {
      snprintf(buf, sizeof buf, spec.c_str(), f64(arg(8))); out += buf;
    } else if (conv == 'p') {
      snprintf(buf, sizeof buf, spec.c_str(), (void*)arg(8)); out += buf;
    } else if (conv) {
      std::string s2 = spec.substr(0, spec.size() - 1) + "ll" + conv;
      uint64_t v = longs ? arg(8) : arg(4);
      if (!longs && strchr("di", conv)) v = (uint64_t)(int64_t)(int32_t)v;
      snprintf(buf, sizeof buf, s2.c_str(), (long long)v); out += buf;
    }
  }
  fputs(out.c_str(), stdout);
  fflush(stdout);
}

// ---------------------------------------------------------------------------------------------
// Collectives executed once all participants arrived (t is the last to arrive; each lane uses the
// operands of the instruction it waits at).

static Ctx lane_ctx(Engine* e, Thread* t) {
  Frame* f = &t->frames.back();
  return Ctx{e, t, f, f->regs.data(), t->wait_instr};
}

static void exec_warp_collective(Engine* e, Warp* w, uint32_t lanes, const DInstr* coll) {
  const DInstr& d0 = *coll;
  switch (d0.op) {
    case Op::Activemask:
      // the lanes that executed it together: every live lane (lanes that exit first drop out)
      for (int l = 0; l < 32; ++l)
        if (lanes >> l & 1) { Ctx c = lane_ctx(e, w->lanes[l]); dst(c, c.d->ops[0], lanes); }
      break;
    case Op::Shfl: {
      uint64_t a[32] = {};
      uint32_t mask = lanes;
      for (int l = 0; l < 32; ++l)
        if (lanes >> l & 1) { Ctx c = lane_ctx(e, w->lanes[l]); a[l] = val(c, c.d->ops[1]); }
      for (int l = 0; l < 32; ++l) {
        if (!(lanes >> l & 1)) continue;
        Thread* t = w->lanes[l];
        Ctx c = lane_ctx(e, t);
        const DInstr& d = *c.d;
        uint32_t b = (uint32_t)val(c, d.ops[2]) & 31, cv = (uint32_t)val(c, d.ops[3]);
        uint32_t seg = (cv >> 8) & 31, clampv = cv & 31;
        uint32_t maxl = (l & seg) | (clampv & ~seg), minl = l & seg;
        int j = l;
        bool p = false;
        switch (d.mode) {
          case 0: j = l - (int)b; p = j >= (int)maxl; break;
          case 1: j = l + (int)b; p = j <= (int)maxl; break;
          case 2: j = l ^ (int)b; p = j <= (int)maxl; break;
          case 3: j = (int)(minl | (b & ~seg)); p = j <= (int)maxl; break;
        }
        if (!p) j = l;
        if (!(mask >> j & 1))
          e->fail("shfl-source", t, c.d, "shfl.sync reads lane " + std::to_string(j) + " which is not in membermask");
        const Operand& dst0 = d.ops[0];
        if (dst0.kind == Operand::kVec) {
          dst(c, vel(c, dst0, 0), a[j]);
          dst(c, vel(c, dst0, 1), p ? 1 : 0);
        } else dst(c, dst0, a[j]);
      }
      break;
    }
    case Op::Vote: {
      uint32_t ballot = 0;
      for (int l = 0; l < 32; ++l)
        if (lanes >> l & 1) {
          Ctx c = lane_ctx(e, w->lanes[l]);
          if (val(c, c.d->ops[1]) & 1) ballot |= 1u << l;
        }
      for (int l = 0; l < 32; ++l)
        if (lanes >> l & 1) {
          Ctx c = lane_ctx(e, w->lanes[l]);
          uint64_t r = 0;
          switch (c.d->mode) {
            case 0: r = (ballot & lanes) == lanes; break;
            case 1: r = ballot != 0; break;
            case 2: r = ballot == 0 || (ballot & lanes) == lanes; break;
            case 3: r = ballot; break;
          }
          dst(c, c.d->ops[0], r);
        }
      break;
    }
    case Op::Elect: {
      // The leader is the lowest lane of membermask (a deterministic choice the ISA allows).
      int leader = __builtin_ctz(lanes);
      for (int l = 0; l < 32; ++l)
        if (lanes >> l & 1) {
          Ctx c = lane_ctx(e, w->lanes[l]);
          const Operand& o = c.d->ops[0];
          if (o.kind == Operand::kVec) {
            dst(c, vel(c, o, 0), (uint64_t)leader);
            dst(c, vel(c, o, 1), l == leader);
          } else dst(c, o, l == leader);
        }
      break;
    }
    case Op::Redux: case Op::Match: {
      uint64_t v[32] = {};
      for (int l = 0; l < 32; ++l)
        if (lanes >> l & 1) { Ctx c = lane_ctx(e, w->lanes[l]); v[l] = val(c, c.d->ops[1]); }
      for (int l = 0; l < 32; ++l)
        if (lanes >> l & 1) {
          Ctx c = lane_ctx(e, w->lanes[l]);
          if (d0.op == Op::Redux) {
            uint64_t acc = 0;
            bool first = true;
            for (int k = 0; k < 32; ++k)
              if (lanes >> k & 1) {
                if (first) { acc = v[k]; first = false; continue; }
                acc = atomic_apply(c, c.d->aop, c.d->t == T::None ? T::U32 : c.d->t, acc, v[k], 0);
              }
            dst(c, c.d->ops[0], acc);
          } else {
            uint32_t m = 0;
            for (int k = 0; k < 32; ++k)
              if ((lanes >> k & 1) && v[k] == v[l]) m |= 1u << k;
            if (c.d->mode == 0) dst(c, c.d->ops[0], m);
            else {
              bool all = m == lanes;
              const Operand& o = c.d->ops[0];
              if (o.kind == Operand::kVec) {
                dst(c, vel(c, o, 0), all ? m : 0);
                dst(c, vel(c, o, 1), all);
              } else dst(c, o, all ? m : 0);
            }
          }
        }
      break;
    }
    case Op::BarWarpSync: case Op::WgmmaFence: case Op::WgmmaCommit: case Op::WgmmaWait: case Op::Setmaxnreg:
      for (int l = 0; l < 32; ++l)
        if (lanes >> l & 1) {
          Thread* t = w->lanes[l];
          if (d0.op == Op::WgmmaFence) {
            std::fill(t->wg_written.begin(), t->wg_written.end(), 0);
          } else if (d0.op == Op::WgmmaCommit) {
            t->wg_groups.push_back(std::move(t->wg_uncommitted));
            t->wg_uncommitted.clear();
          } else if (d0.op == Op::WgmmaWait) {
            Ctx c = lane_ctx(e, t);
            uint64_t keep = val(c, c.d->ops[0]);
            while (t->wg_groups.size() > keep) {
              for (int32_t r : t->wg_groups.front()) { --t->wg_pending[r]; --t->wg_pending_total; }
              t->wg_groups.erase(t->wg_groups.begin());
            }
          }
        }
      if (d0.op == Op::WgmmaCommit) ++w->wg_commits;
      if (d0.op == Op::WgmmaWait) {
        Ctx c = lane_ctx(e, w->lanes[__builtin_ctz(lanes)]);
        e->wgmma_read_end(w, val(c, c.d->ops[0]));
      }
      if (d0.op == Op::Setmaxnreg) {
        Thread* t0 = w->lanes[__builtin_ctz(lanes)];
        Ctx c = lane_ctx(e, t0);
        uint32_t n = (uint32_t)val(c, d0.ops[0]);
        if (n < 24 || n > 256 || n % 8)
          e->fail("setmaxnreg", t0, &d0, "register count " + std::to_string(n) + " not in [24, 256] or not a multiple of 8");
        bool inc = d0.flags & F_INC;
        if (inc ? n < w->regs_budget : n > w->regs_budget)
          e->fail("setmaxnreg", t0, &d0, std::string(inc ? ".inc to " : ".dec to ") + std::to_string(n) +
                  " from a budget of " + std::to_string(w->regs_budget));
        Cta* cta = w->cta;
        cta->regs_in_use = cta->regs_in_use - w->regs_budget * 32 + n * 32;
        w->regs_budget = n;
        if (cta->regs_in_use > cta->regs_pool)
          e->fail("setmaxnreg", t0, &d0, "the CTA's warps now hold " + std::to_string(cta->regs_in_use) +
                  " registers, more than the " + std::to_string(cta->regs_pool) + " it was launched with");
      }
      break;
    case Op::Ldmatrix: case Op::Stmatrix: {
      uint32_t rows[32] = {};
      uint32_t regs[32 * 4] = {};
      bool ld = d0.op == Op::Ldmatrix;
      int num = d0.a;
      Cta* cta = w->cta;
      for (int l = 0; l < 32; ++l) {
        if (!(lanes >> l & 1)) continue;
        Ctx c = lane_ctx(e, w->lanes[l]);
        if (l < 8 * num) {
          uint64_t a = addr(c, c.d->ops[1 - (ld ? 0 : 1)]);
          uint32_t off;
          Cta* owner;
          e->mem(c.t, c.d, c.d->sp == Sp::None ? Sp::Generic : c.d->sp, a, 16, !ld, &owner, &off);
          if (owner != cta) e->fail("ldmatrix", c.t, c.d, "row address in another CTA's shared memory");
          rows[l] = off;
        }
        if (!ld) {
          const Operand& v = c.d->ops[1];
          for (int i = 0; i < num; ++i) regs[l * 4 + i] = (uint32_t)val(c, vel(c, v, i));
        }
      }
      std::string err;
      if (ld) {
        // mem() checked each row for in-flight copies; bytes a bulk store is reading may be read
        tc::Smem sm{cta->smem.data(), (uint32_t)cta->smem.size(), nullptr};
        if (!tc::ldmatrix(num, d0.flags & F_TRANS, rows, regs, sm, &err)) e->fail("ldmatrix", w->lanes[0], &d0, err);
        for (int l = 0; l < 32; ++l) {
          if (!(lanes >> l & 1)) continue;
          Ctx c = lane_ctx(e, w->lanes[l]);
          const Operand& v = c.d->ops[0];
          if (v.kind == Operand::kVec)
            for (int i = 0; i < num; ++i) dst(c, vel(c, v, i), regs[l * 4 + i]);
          else dst(c, v, regs[l * 4]);
        }
      } else {
        if (!tc::stmatrix(num, d0.flags & F_TRANS, rows, regs, cta->smem.data(), (uint32_t)cta->smem.size(), &err))
          e->fail("stmatrix", w->lanes[0], &d0, err);
        for (int l = 0; l < 8 * num; ++l)
          if (lanes >> l & 1) e->note_generic_smem_write(w->lanes[l], cta, rows[l], 16);
      }
      break;
    }
    default:
      e->fail("unsupported", w->lanes[__builtin_ctz(lanes)], &d0, "warp collective");
  }
}

static tc::EType etype(T t) {
  switch (t) {
    case T::F16: return tc::EType::kF16;
    case T::BF16: return tc::EType::kBF16;
    case T::TF32: return tc::EType::kTF32;
    case T::E4M3: return tc::EType::kE4M3;
    case T::E5M2: return tc::EType::kE5M2;
    case T::F32: return tc::EType::kF32;
    case T::S8: return tc::EType::kS8;
    case T::U8: return tc::EType::kU8;
    case T::S32: return tc::EType::kS32;
    default: return tc::EType::kF32;
  }
}

// wgmma.mma_async.sync.aligned.shape.dtype.atype.btype d, a-desc|{a regs}, b-desc, scale-d,
//   imm-scale-a, imm-scale-b{, imm-trans-a, imm-trans-b}: executed once the warpgroup's 128
// threads arrived; th are those threads in warpgroup order.
void exec_warpgroup_wgmma(Engine* e, Cta* cta, uint32_t wg, const std::vector<Thread*>& th) {
  Thread* lead = th[0];
  Ctx c0 = lane_ctx(e, lead);
  const DInstr& d = *c0.d;
  tc::Wgmma w;
  w.n = d.a; w.k = d.b; w.m = d.c;
  w.d = etype(d.t); w.a = etype(d.t2); w.b = etype(d.t3 == T::None ? d.t2 : d.t3);
  const Operand& aop = d.ops[1];
  w.a_regs = aop.kind == Operand::kVec;
  // operand positions after d, a, b: scale-d, imm-scale-a, imm-scale-b, [imm-trans-a,] [imm-trans-b]
  uint32_t i = 3;
  int nd = tc::d_regs_per_thread(w);
  std::vector<uint32_t> afrag(128 * 4, 0), dfrag((size_t)128 * nd, 0);
  const Operand& dop = d.ops[0];
  if (dop.kind != Operand::kVec || (int)dop.vec_count != nd)
    e->fail("wgmma", lead, &d, "accumulator count " + std::to_string(dop.vec_count) + ", expected " + std::to_string(nd));
  uint64_t da = 0, db = 0;
  bool scale_d = true;
  for (size_t k = 0; k < th.size(); ++k) {
    Thread* t = th[k];
    Ctx c = lane_ctx(e, t);
    uint32_t tw = t->linear % 128;
    const DInstr& dd = *c.d;
    // accumulators: read (the in-flight check does not apply: chaining into the same registers is
    // ordered by the hardware) and check the wgmma.fence rule
    for (int r = 0; r < nd; ++r) {
      const Operand& o = vel(c, dd.ops[0], r);
      if (t->wg_written[o.reg])
        e->fail("wgmma-fence", t, c.d, "accumulator " + c.f->lf->fn->regs[o.reg].name +
                " was written by another instruction after the last wgmma.fence");
      dfrag[(size_t)tw * nd + r] = (uint32_t)c.R[o.reg];
    }
    if (w.a_regs) {
      for (uint32_t r = 0; r < dd.ops[1].vec_count && r < 4; ++r) {
        const Operand& o = vel(c, dd.ops[1], r);
        if (t->wg_written[o.reg])
          e->fail("wgmma-fence", t, c.d, "A register " + c.f->lf->fn->regs[o.reg].name +
                  " was written by another instruction after the last wgmma.fence");
        afrag[tw * 4 + r] = (uint32_t)c.R[o.reg];
      }
    }
    uint64_t ta = w.a_regs ? 0 : c.R[dd.ops[1].reg];
    uint64_t tb = dd.ops[2].kind == Operand::kReg ? c.R[dd.ops[2].reg] : (uint64_t)dd.ops[2].imm;
    if (!w.a_regs && dd.ops[1].kind != Operand::kReg) ta = (uint64_t)dd.ops[1].imm;
    bool sd = dd.ops[i].kind == Operand::kImm ? dd.ops[i].imm != 0 : (val(c, dd.ops[i]) & 1);
    if (k == 0) { da = ta; db = tb; scale_d = sd; }
    else if (da != ta || db != tb || sd != scale_d)
      e->fail("wgmma", t, c.d, "threads of the warpgroup give different descriptors or scale-d");
  }
  w.scale_a = d.nops > i + 1 && d.ops[i + 1].imm == -1 ? -1 : 1;
  w.scale_b = d.nops > i + 2 && d.ops[i + 2].imm == -1 ? -1 : 1;
  if (!w.a_regs && d.nops > i + 3) w.a_k_major = d.ops[i + 3].imm == 0;
  if (d.nops > i + (w.a_regs ? 3 : 4)) w.b_k_major = d.ops[i + (w.a_regs ? 3 : 4)].imm == 0;
  // The async proxy reads the operands: unfenced generic writes and in-flight copies are errors.
  // Check exactly the bytes the descriptors name (a whole-memory shadow per wgmma would be slow).
  // The operand bytes are recorded as read until the wgmma.wait_group that covers this wgmma, and
  // bytes a copy delivered must come from an mbarrier phase the warpgroup observed (a thread of it
  // waited, or synchronized with one that did: the union of the 128 threads' knowledge).
  WgmmaRead reads;
  reads.wg = wg;
  reads.instr = &d;
  for (uint32_t j = 0; j < 4; ++j) reads.group[j] = cta->warps[wg * 4 + j]->wg_commits;
  Knowledge seen;
  RaceClock seen_rc;   // the warpgroup's race clocks, merged (the shared-race check)
  if (e->opt().strict)
    for (Thread* t : th) {
      merge_knowledge(seen, t->know);
      for (int i = 0; i < 32; ++i) seen_rc.w[i] = std::max(seen_rc.w[i], t->rc.w[i]);
    }
  if (e->opt().strict) {
    auto check = [&](uint64_t desc, int rows, tc::EType et, bool k_major, const char* which) {
      tc::Desc dsc = tc::decode_desc(desc);
      int eb = tc::ebits(et), nb = eb / 8;
      for (int r = 0; r < rows; ++r)
        for (int k = 0; k < w.k; ++k) {
          uint32_t a = tc::element_addr(dsc, r, k, eb, k_major);
          if (a + nb <= cta->smem.size()) {
            e->race_async_read(lead, &d, seen_rc, (int)(wg * 4), cta, a, (uint32_t)nb, "a wgmma operand read");
            auto& rs = reads.runs;
            if (!rs.empty() && rs.back().operand == which[0] && rs.back().off + rs.back().len == a) rs.back().len += nb;
            else rs.push_back(WgmmaRead::Run{a, (uint32_t)nb, which[0]});
          }
          for (int b = 0; b < nb; ++b) {
            if (a + b >= cta->smem.size()) continue;   // tc::wgmma reports the bounds error
            if (uint32_t id1 = cta->deliv_id[a + b]) {
              uint32_t ph = cta->deliv_phase[a + b];
              if (seen.size() < id1 || seen[id1 - 1] < ph + 1) {
                char buf[400];
                snprintf(buf, sizeof buf, "wgmma operand %s element (%d, %d) at shared 0x%x was filled by an "
                         "asynchronous copy in phase %u of mbarrier #%u, but no thread of the warpgroup has observed "
                         "that phase (no wait on the mbarrier, and no barrier with a thread that waited)",
                         which, r, k, a + b, ph, id1 - 1);
                e->fail("async-unobserved", lead, &d, buf);
              }
            }
            if (cta->shadow[a + b] & kShadowRacy) {
              char buf[300];
              snprintf(buf, sizeof buf, "wgmma operand %s element (%d, %d) at shared 0x%x was written by two "
                       "asynchronous copies while both were in flight (a write-write race: either copy's byte may "
                       "be there)", which, r, k, a + b);
              e->fail("async-inflight", lead, &d, buf);
            }
            if ((cta->shadow[a + b] & kShadowInflight) || cta->dirty_owner[a + b]) {
              char buf[300];
              snprintf(buf, sizeof buf, "wgmma operand %s element (%d, %d) at shared 0x%x %s", which, r, k, a + b,
                       (cta->shadow[a + b] & kShadowInflight)
                           ? "is still being written by an asynchronous copy"
                           : "was written through the generic proxy with no fence.proxy.async before this wgmma");
              e->fail("async-proxy-read", lead, &d, buf);
            }
          }
        }
    };
    if (!w.a_regs) check(da, w.m, w.a, w.a_k_major, "A");
    check(db, w.n, w.b, w.b_k_major, "B");
  }
  tc::Smem sm{cta->smem.data(), (uint32_t)cta->smem.size(), nullptr};
  std::string err;
  if (!tc::wgmma(w, da, db, w.a_regs ? afrag.data() : nullptr, dfrag.data(), scale_d, sm, &err))
    e->fail("wgmma", lead, &d, err);
  if (e->opt().strict) e->wgmma_read_begin(cta, std::move(reads));
  for (Thread* t : th) {
    Ctx c = lane_ctx(e, t);
    uint32_t tw = t->linear % 128;
    const DInstr& dd = *c.d;
    for (int r = 0; r < nd; ++r) {
      const Operand& o = vel(c, dd.ops[0], r);
      c.R[o.reg] = dfrag[(size_t)tw * nd + r];
      ++t->wg_pending[o.reg];
      ++t->wg_pending_total;
      t->wg_uncommitted.push_back(o.reg);
    }
    if (w.a_regs)
      for (uint32_t r = 0; r < dd.ops[1].vec_count; ++r) {
        const Operand& o = vel(c, dd.ops[1], r);
        ++t->wg_pending[o.reg];
        ++t->wg_pending_total;
        t->wg_uncommitted.push_back(o.reg);
      }
  }
  (void)wg;
}

// ---------------------------------------------------------------------------------------------
// The interpreter loop

void Engine::step(Thread* t, int budget) {
  while (budget-- > 0 && t->state == TS::Runnable) {
    Frame* f = &t->frames.back();
    const DInstr& d = f->lf->code[f->pc];
    Ctx c{this, t, f, f->regs.data(), &d};
    ++t->instructions;
    ++t->cta->clock;
    ++instr_total_;
    if (rec_) rec_->instr(t, &d);
    if (d.guard >= 0) {
      check_reg_read(c, d.guard);
      bool g = c.R[d.guard] & 1;
      if (g == d.guard_neg) { ++f->pc; continue; }
    }
    const Operand* o = d.ops;
    int pcnext = f->pc + 1;
    switch (d.op) {
      // ---------------- integer / float arithmetic ----------------
      case Op::Add: case Op::Sub: case Op::Mul: case Op::Min: case Op::Max: case Op::Div: case Op::Rem:
      case Op::And: case Op::Or: case Op::Xor: case Op::Shl: case Op::Shr: {
        T ty = d.t;
        if (ty == T::Pred) {
          uint64_t a = val(c, o[1]) & 1, b = val(c, o[2]) & 1;
          dst(c, o[0], d.op == Op::And ? (a & b) : d.op == Op::Or ? (a | b) : (a ^ b));
          break;
        }
        if (ty == T::F32) {
          float a = valf(c, o[1]), b = valf(c, o[2]), r = 0;
          bool ftz = d.flags & F_FTZ;
          if (ftz) { a = num::ftz_f32(a); b = num::ftz_f32(b); }
          Rnd rr = rnd(d);
          switch (d.op) {
            case Op::Add: r = num::add_f32(a, b, rr); break;
            case Op::Sub: r = num::sub_f32(a, b, rr); break;
            case Op::Mul: r = num::mul_f32(a, b, rr); break;
            case Op::Min: case Op::Max: {
              bool xs = d.flags & F_XORSIGN;
              float xa = xs ? std::fabs(a) : a, ya = xs ? std::fabs(b) : b;
              r = d.op == Op::Min ? num::fmin_f32(xa, ya, ftz, d.flags & F_NAN) : num::fmax_f32(xa, ya, ftz, d.flags & F_NAN);
              if (xs && !std::isnan(r)) r = std::copysign(r, (std::signbit(a) != std::signbit(b)) ? -1.0f : 1.0f);
              break;
            }
            case Op::Div:
              if (d.flags & F_APPROX) r = num::div_approx(a, b, ftz);
              else if (d.flags & F_FULL) r = num::div_full(a, b, ftz);
              else r = num::div_f32(a, b, rr);
              break;
            default: fail("unsupported", t, &d, "f32 op");
          }
          if (ftz) r = num::ftz_f32(r);
          if (d.flags & F_SAT) r = num::sat_f32(r);
          dst(c, o[0], bits(r));
          break;
        }
        if (ty == T::F64) {
          double a = vald(c, o[1]), b = vald(c, o[2]), r = 0;
          Rnd rr = rnd(d);
          switch (d.op) {
            case Op::Add: r = num::add_f64(a, b, rr); break;
            case Op::Sub: r = num::add_f64(a, -b, rr); break;
            case Op::Mul: r = num::mul_f64(a, b, rr); break;
            case Op::Min: r = std::isnan(a) ? b : std::isnan(b) ? a : std::fmin(a, b); break;
            case Op::Max: r = std::isnan(a) ? b : std::isnan(b) ? a : std::fmax(a, b); break;
            case Op::Div: r = num::div_f64(a, b, rr); break;
            default: fail("unsupported", t, &d, "f64 op");
          }
          dst(c, o[0], bits(r));
          break;
        }
        if (ty == T::F16 || ty == T::F16x2 || ty == T::BF16 || ty == T::BF16x2) {
          dst(c, o[0], half_op(c, d.op, ty, val(c, o[1]), val(c, o[2]), 0));
          break;
        }
        dst(c, o[0], int_binop(c, d.op, ty, val(c, o[1]), val(c, o[2])));
        break;
      }
      case Op::Mad: case Op::Fma: {
        T ty = d.t;
        if (ty == T::F32) {
          float a = valf(c, o[1]), b = valf(c, o[2]), cc = valf(c, o[3]);
          bool ftz = d.flags & F_FTZ;
          if (ftz) { a = num::ftz_f32(a); b = num::ftz_f32(b); cc = num::ftz_f32(cc); }
          float r = num::fma_f32(a, b, cc, rnd(d));
          if (ftz) r = num::ftz_f32(r);
          if (d.flags & F_SAT) r = num::sat_f32(r);
          dst(c, o[0], bits(r));
        } else if (ty == T::F64) {
          dst(c, o[0], bits(num::fma_f64(vald(c, o[1]), vald(c, o[2]), vald(c, o[3]), rnd(d))));
        } else if (tfloat(ty)) {
          dst(c, o[0], half_op(c, Op::Fma, ty, val(c, o[1]), val(c, o[2]), val(c, o[3])));
        } else {
          int n = tbits(ty);
          uint64_t a = val(c, o[1]), b = val(c, o[2]), cc = val(c, o[3]);
          uint64_t p;
          if (d.flags & F_WIDE) {
            p = tsigned(ty) ? (uint64_t)(sext(a, n) * sext(b, n)) : maskb(a, n) * maskb(b, n);
            dst(c, o[0], maskb(p + cc, 2 * n));
          } else if (d.flags & F_HI) {
            p = int_binop(c, Op::Mul, ty, a, b);
            if ((d.flags & F_SAT) && ty == T::S32) {   // mad.hi.sat.s32: the sum saturates
              int64_t r = sext(p, 32) + sext(cc, 32);
              r = r > INT32_MAX ? INT32_MAX : r < INT32_MIN ? INT32_MIN : r;
              dst(c, o[0], maskb((uint64_t)r, 32));
            } else dst(c, o[0], maskb(p + cc, n));
          } else {
            dst(c, o[0], maskb(a * b + cc, n));
          }
        }
        break;
      }
      case Op::Mul24: case Op::Mad24: {
        int64_t a = sext(val(c, o[1]), 24), b = sext(val(c, o[2]), 24);
        if (!tsigned(d.t)) { a = (int64_t)maskb(val(c, o[1]), 24); b = (int64_t)maskb(val(c, o[2]), 24); }
        uint64_t p = (uint64_t)(a * b);
        uint64_t r = (d.flags & F_HI) ? (p >> 16) : p;
        if (d.op == Op::Mad24) r += val(c, o[3]);
        dst(c, o[0], maskb(r, 32));
        break;
      }
      case Op::Sad: {
        int n = tbits(d.t);
        uint64_t a = val(c, o[1]), b = val(c, o[2]);
        uint64_t diff = tsigned(d.t) ? (uint64_t)std::llabs(sext(a, n) - sext(b, n))
                                     : (maskb(a, n) > maskb(b, n) ? maskb(a, n) - maskb(b, n) : maskb(b, n) - maskb(a, n));
        dst(c, o[0], maskb(diff + val(c, o[3]), n));
        break;
      }
      case Op::Abs: case Op::Neg: {
        T ty = d.t;
        uint64_t a = val(c, o[1]);
        if (ty == T::F32) {
          float x = valf(c, o[1]);
          if (d.flags & F_FTZ) x = num::ftz_f32(x);
          dst(c, o[0], d.op == Op::Abs ? (bits(x) & 0x7fffffffu) : (bits(x) ^ 0x80000000u));
        } else if (ty == T::F64) dst(c, o[0], d.op == Op::Abs ? (a & ~(1ull << 63)) : (a ^ (1ull << 63)));
        else if (tfloat(ty)) dst(c, o[0], half_op(c, d.op, ty, a, 0, 0));
        else {
          int n = tbits(ty);
          int64_t x = sext(a, n);
          dst(c, o[0], maskb((uint64_t)(d.op == Op::Abs ? (x < 0 ? -x : x) : -x), n));
        }
        break;
      }
      case Op::Not: dst(c, o[0], d.t == T::Pred ? (val(c, o[1]) & 1) ^ 1 : ~val(c, o[1])); break;
      case Op::Cnot: dst(c, o[0], maskb(val(c, o[1]), tbits(d.t)) == 0 ? 1 : 0); break;
      case Op::Popc: dst(c, o[0], __builtin_popcountll(maskb(val(c, o[1]), tbits(d.t)))); break;
      case Op::Clz: {
        int n = tbits(d.t);
        uint64_t a = maskb(val(c, o[1]), n);
        dst(c, o[0], a == 0 ? n : __builtin_clzll(a) - (64 - n));
        break;
      }
      case Op::Bfind: {
        int n = tbits(d.t);
        uint64_t a = maskb(val(c, o[1]), n);
        if (tsigned(d.t) && (a >> (n - 1) & 1)) a = maskb(~a, n);
        uint32_t r = a == 0 ? 0xffffffffu : (uint32_t)(63 - __builtin_clzll(a));
        if (a != 0 && (d.flags & F_SHIFTAMT)) r = n - 1 - r;
        dst(c, o[0], r);
        break;
      }
      case Op::Brev: {
        int n = tbits(d.t);
        uint64_t a = val(c, o[1]), r = 0;
        for (int i = 0; i < n; ++i) r |= ((a >> i) & 1) << (n - 1 - i);
        dst(c, o[0], r);
        break;
      }
      case Op::Bfe: {
        int n = tbits(d.t);
        uint64_t a = val(c, o[1]);
        uint32_t pos = val(c, o[2]) & 0xff, len = val(c, o[3]) & 0xff;
        uint64_t r = 0;
        bool sbit = false;
        if (tsigned(d.t)) sbit = len == 0 ? false : ((a >> std::min<uint32_t>(pos + len - 1, n - 1)) & 1);
        for (int i = 0; i < n; ++i) {
          uint64_t b = (uint32_t)i < len && pos + i < (uint32_t)n ? (a >> (pos + i)) & 1 : (tsigned(d.t) ? sbit : 0);
          r |= b << i;
        }
        dst(c, o[0], r);
        break;
      }
      case Op::Bfi: {
        int n = tbits(d.t);
        uint64_t a = val(c, o[1]), b = val(c, o[2]);
        uint32_t pos = val(c, o[3]) & 0xff, len = val(c, o[4]) & 0xff;
        uint64_t r = b;
        for (uint32_t i = 0; i < len && pos + i < (uint32_t)n; ++i)
          r = (r & ~(1ull << (pos + i))) | (((a >> i) & 1) << (pos + i));
        dst(c, o[0], maskb(r, n));
        break;
      }
      case Op::Bmsk: {  // PTX ISA "bmsk": b bits set from bit a (the ISA's pseudo-code, step by step)
        const uint32_t a = val(c, o[1]), b = val(c, o[2]);
        const uint32_t a1 = a & 31, b1 = b & 31, sum = a1 + b1;
        uint32_t mask0 = ~0u << a1, mask1 = sum >= 32 ? 0u : ~0u << sum;
        bool overflow = sum >= 32;
        if (d.flags & F_CLAMP) {
          if (a >= 32) overflow = true, mask0 = 0;
          if (b >= 32) overflow = true;
        }
        if (overflow) mask1 = 0;
        else if (b1 == 0) mask1 = ~0u;
        dst(c, o[0], mask0 & ~mask1);
        break;
      }
      case Op::Lop3: {
        uint32_t a = val(c, o[1]), b = val(c, o[2]), cc = val(c, o[3]);
        uint32_t lut = (uint32_t)val(c, o[4]), r = 0;
        for (int i = 0; i < 32; ++i) {
          int idx = ((a >> i & 1) << 2) | ((b >> i & 1) << 1) | (cc >> i & 1);
          r |= ((lut >> idx) & 1) << i;
        }
        dst(c, o[0], r);
        break;
      }
      case Op::Shf: {
        uint32_t lo = val(c, o[1]), hi = val(c, o[2]), n = val(c, o[3]);
        n = (d.flags & F_CLAMP) ? std::min<uint32_t>(n, 32) : (n & 31);
        uint64_t x = ((uint64_t)hi << 32) | lo;
        uint32_t r = d.mode == 0 ? (uint32_t)((x << n) >> 32) : (uint32_t)(x >> n);
        dst(c, o[0], r);
        break;
      }
      case Op::Prmt: {
        uint32_t a = val(c, o[1]), b = val(c, o[2]), sel = val(c, o[3]);
        uint64_t x = ((uint64_t)b << 32) | a;
        uint32_t r = 0;
        if (d.mode != 0) {
          // prmt.b32.{f4e,b4e,rc8,ecl,ecr,rc16}: c[1:0] picks a row of the ISA's table; each row
          // lists the source bytes of d.b0..d.b3
          static const uint8_t tab[6][4][4] = {
              {{0, 1, 2, 3}, {1, 2, 3, 4}, {2, 3, 4, 5}, {3, 4, 5, 6}},   // f4e
              {{0, 7, 6, 5}, {1, 0, 7, 6}, {2, 1, 0, 7}, {3, 2, 1, 0}},   // b4e
              {{0, 0, 0, 0}, {1, 1, 1, 1}, {2, 2, 2, 2}, {3, 3, 3, 3}},   // rc8
              {{0, 1, 2, 3}, {1, 1, 2, 3}, {2, 2, 2, 3}, {3, 3, 3, 3}},   // ecl
              {{0, 0, 0, 0}, {0, 1, 1, 1}, {0, 1, 2, 2}, {0, 1, 2, 3}},   // ecr
              {{0, 1, 0, 1}, {2, 3, 2, 3}, {0, 1, 0, 1}, {2, 3, 2, 3}}};  // rc16
          const uint8_t* row = tab[d.mode - 1][sel & 3];
          for (int i = 0; i < 4; ++i) r |= (uint32_t)((x >> (8 * row[i])) & 0xff) << (8 * i);
          dst(c, o[0], r);
          break;
        }
        for (int i = 0; i < 4; ++i) {
          uint32_t s = (sel >> (4 * i)) & 0xf;
          uint32_t byte = (x >> (8 * (s & 7))) & 0xff;
          if (s & 8) byte = (byte & 0x80) ? 0xff : 0;
          r |= byte << (8 * i);
        }
        dst(c, o[0], r);
        break;
      }
      case Op::Dp4a: case Op::Dp2a: {
        uint32_t a = val(c, o[1]), b = val(c, o[2]);
        int64_t acc = (int32_t)val(c, o[3]);
        bool sa = tsigned(d.t), sb = tsigned(d.t2);
        if (d.op == Op::Dp4a) {
          for (int i = 0; i < 4; ++i) {
            int64_t x = sa ? (int8_t)(a >> (8 * i)) : (uint8_t)(a >> (8 * i));
            int64_t y = sb ? (int8_t)(b >> (8 * i)) : (uint8_t)(b >> (8 * i));
            acc += x * y;
          }
        } else {
          int off = (d.flags & F_HI) ? 2 : 0;
          for (int i = 0; i < 2; ++i) {
            int64_t x = sa ? (int16_t)(a >> (16 * i)) : (uint16_t)(a >> (16 * i));
            int64_t y = sb ? (int8_t)(b >> (8 * (i + off))) : (uint8_t)(b >> (8 * (i + off)));
            acc += x * y;
          }
        }
        dst(c, o[0], maskb((uint64_t)acc, 32));
        break;
      }
      case Op::Rcp: case Op::Sqrt: case Op::Rsqrt: case Op::Sin: case Op::Cos: case Op::Lg2: case Op::Ex2: case Op::Tanh: {
        if (d.t == T::F32) {
          float x = valf(c, o[1]), r = 0;
          bool ftz = d.flags & F_FTZ;
          bool approx = d.flags & F_APPROX;
          switch (d.op) {
            case Op::Rcp: r = approx ? num::rcp_approx(x, ftz) : num::rcp_f32(ftz ? num::ftz_f32(x) : x, rnd(d)); break;
            case Op::Sqrt: r = approx ? num::sqrt_approx(x, ftz) : num::sqrt_f32(ftz ? num::ftz_f32(x) : x, rnd(d)); break;
            case Op::Rsqrt: r = num::rsqrt_approx(x, ftz); break;
            case Op::Sin: r = num::sin_approx(x, ftz); break;
            case Op::Cos: r = num::cos_approx(x, ftz); break;
            case Op::Lg2: r = num::lg2_approx(x, ftz); break;
            case Op::Ex2: r = num::ex2_approx(x, ftz); break;
            case Op::Tanh: r = num::tanh_approx(x); break;
            default: break;
          }
          if (ftz) r = num::ftz_f32(r);
          dst(c, o[0], bits(r));
        } else if (d.t == T::F64) {
          double x = vald(c, o[1]), r = 0;
          switch (d.op) {
            case Op::Rcp: r = (d.flags & F_APPROX) ? num::rcp_approx_ftz_f64(x) : num::rcp_f64(x, rnd(d)); break;
            case Op::Sqrt: r = num::sqrt_f64(x, rnd(d)); break;
            case Op::Rsqrt: r = num::rsqrt_approx_f64(x); break;
            default: fail("unsupported", t, &d, "f64 transcendental");
          }
          dst(c, o[0], bits(r));
        } else {
          dst(c, o[0], half_op(c, d.op, d.t, val(c, o[1]), 0, 0));
        }
        break;
      }
      case Op::Copysign: {
        if (d.t == T::F32) dst(c, o[0], (val(c, o[2]) & 0x7fffffffu) | (val(c, o[1]) & 0x80000000u));
        else dst(c, o[0], (val(c, o[2]) & ~(1ull << 63)) | (val(c, o[1]) & (1ull << 63)));
        break;
      }
      case Op::Testp: {
        double x = d.t == T::F32 ? (double)valf(c, o[1]) : vald(c, o[1]);
        bool r = false;
        switch (d.mode) {
          case 0: r = std::isfinite(x); break;
          case 1: r = std::isinf(x); break;
          case 2: r = !std::isnan(x); break;
          case 3: r = std::isnan(x); break;
          case 4: r = d.t == T::F32 ? std::isnormal((float)x) : std::isnormal(x); break;
          default: r = d.t == T::F32 ? (std::fpclassify((float)x) == FP_SUBNORMAL) : (std::fpclassify(x) == FP_SUBNORMAL);
        }
        dst(c, o[0], r);
        break;
      }
      // ---------------- moves, compares, conversions ----------------
      case Op::Mov: {
        const Operand& s = o[1];
        if (o[0].kind == Operand::kVec) {   // unpack: mov.b64 {a,b}, x
          uint64_t v = val(c, s);
          uint32_t nel = o[0].vec_count;
          int w = tbits(d.t) / (int)nel;
          for (uint32_t i = 0; i < nel; ++i) dst(c, vel(c, o[0], i), maskb(v >> (w * i), w));
        } else if (s.kind == Operand::kVec) {   // pack: mov.b64 x, {a,b}
          uint32_t nel = s.vec_count;
          int w = tbits(d.t) / (int)nel;
          uint64_t v = 0;
          for (uint32_t i = 0; i < nel; ++i) v |= maskb(val(c, vel(c, s, i)), w) << (w * i);
          dst(c, o[0], v);
        } else if (d.t == T::F64 && s.kind == Operand::kF32) {
          dst(c, o[0], bits((double)f32((uint64_t)s.imm)));
        } else if (d.t == T::F32 && s.kind == Operand::kF64) {
          dst(c, o[0], bits((float)f64((uint64_t)s.imm)));
        } else dst(c, o[0], val(c, s));
        break;
      }
      case Op::Selp: dst(c, o[0], (val(c, o[3]) & 1) ? val(c, o[1]) : val(c, o[2])); break;
      case Op::Slct: {
        uint64_t cv = val(c, o[3]);
        bool ge;
        if (d.t2 == T::F32) {   // NaN compares ordered and selects b; .ftz flushes a subnormal c
          float x = f32(cv);
          if (d.flags & F_FTZ) x = num::ftz_f32(x);
          ge = x >= 0.0f;
        } else ge = sext(cv, 32) >= 0;
        dst(c, o[0], ge ? val(c, o[1]) : val(c, o[2]));
        break;
      }
      case Op::Setp: case Op::Set: {
        T ty = d.op == Op::Setp ? d.t : d.t2;
        if (d.op == Op::Setp && (ty == T::F16x2 || ty == T::BF16x2)) {
          T h = ty == T::F16x2 ? T::F16 : T::BF16;
          uint64_t a = val(c, o[1]), b = val(c, o[2]);
          bool lo = compare(d.cmp, h, a & 0xffff, b & 0xffff, d.flags & F_FTZ);
          bool hi = compare(d.cmp, h, (a >> 16) & 0xffff, (b >> 16) & 0xffff, d.flags & F_FTZ);
          if (d.bop != BoolOp::None) {
            bool q = val(c, o[3]) & 1;
            auto comb = [&](bool x) { return d.bop == BoolOp::And ? (x && q) : d.bop == BoolOp::Or ? (x || q) : (x != q); };
            lo = comb(lo);
            hi = comb(hi);
          }
          if (o[0].kind == Operand::kVec) { dst(c, vel(c, o[0], 0), lo); dst(c, vel(c, o[0], 1), hi); }
          else dst(c, o[0], lo);
          break;
        }
        bool r = compare(d.cmp, ty, val(c, o[1]), val(c, o[2]), d.flags & F_FTZ);
        bool r2 = !r;
        if (d.bop != BoolOp::None) {
          bool q = val(c, o[3]) & 1;
          auto comb = [&](bool x) { return d.bop == BoolOp::And ? (x && q) : d.bop == BoolOp::Or ? (x || q) : (x != q); };
          r = comb(r); r2 = comb(!compare(d.cmp, ty, val(c, o[1]), val(c, o[2]), d.flags & F_FTZ));
        }
        if (d.op == Op::Setp) {
          if (o[0].kind == Operand::kVec) {
            dst(c, vel(c, o[0], 0), r);
            dst(c, vel(c, o[0], 1), r2);
          } else dst(c, o[0], r);
        } else {
          uint64_t v = d.t == T::F32 ? (r ? 0x3f800000u : 0) : (r ? maskb(~0ull, tbits(d.t)) : 0);
          dst(c, o[0], v);
        }
        break;
      }
      case Op::Cvt: {
        T dt = d.t, st = d.t2;
        const Operand& dd = o[0];
        if (dt == T::E4M3x2 || dt == T::E5M2x2) {   // cvt.rn.satfinite.e4m3x2.f32 d, a, b  /  .f16x2 d, a
          bool e4 = dt == T::E4M3x2, sf = d.flags & F_SATFINITE, relu = d.flags & F_RELU;
          uint32_t r;
          if (st == T::F32) {
            float hi = valf(c, o[1]), lo = valf(c, o[2]);
            uint8_t h = e4 ? num::f32_to_e4m3(hi, sf, relu) : num::f32_to_e5m2(hi, sf, relu);
            uint8_t l = e4 ? num::f32_to_e4m3(lo, sf, relu) : num::f32_to_e5m2(lo, sf, relu);
            r = ((uint32_t)h << 8) | l;
          } else {
            uint32_t v = val(c, o[1]);
            uint16_t hi = v >> 16, lo = v & 0xffff;
            uint8_t h = e4 ? num::f16_to_e4m3(hi, sf, relu) : num::f16_to_e5m2(hi, sf, relu);
            uint8_t l = e4 ? num::f16_to_e4m3(lo, sf, relu) : num::f16_to_e5m2(lo, sf, relu);
            r = ((uint32_t)h << 8) | l;
          }
          dst(c, dd, r);
        } else if (st == T::E4M3x2 || st == T::E5M2x2) {   // cvt.rn.f16x2.e4m3x2 d, a
          uint32_t v = val(c, o[1]);
          uint32_t r = 0;
          for (int i = 0; i < 2; ++i) {
            uint8_t x = v >> (8 * i);
            float f = st == T::E4M3x2 ? num::e4m3_to_f32(x) : num::e5m2_to_f32(x);
            uint16_t h = num::f32_to_f16(f, Rnd::kRN, d.flags & F_RELU);
            r |= (uint32_t)h << (16 * i);
          }
          dst(c, dd, r);
        } else if (dt == T::F16x2 || dt == T::BF16x2) {   // cvt.rn.f16x2.f32 d, a(hi), b(lo)
          float hi = valf(c, o[1]), lo = valf(c, o[2]);
          bool bf = dt == T::BF16x2;
          uint16_t h = bf ? num::f32_to_bf16(hi, rnd(d), d.flags & F_RELU, d.flags & F_SATFINITE)
                          : num::f32_to_f16(hi, rnd(d), d.flags & F_RELU, d.flags & F_SATFINITE);
          uint16_t l = bf ? num::f32_to_bf16(lo, rnd(d), d.flags & F_RELU, d.flags & F_SATFINITE)
                          : num::f32_to_f16(lo, rnd(d), d.flags & F_RELU, d.flags & F_SATFINITE);
          dst(c, dd, ((uint32_t)h << 16) | l);
        } else {
          uint64_t v = val(c, o[1]);
          if (o[1].kind == Operand::kF64 && st == T::F32) v = bits((float)f64(v));
          dst(c, dd, convert(c, dt, st, v));
        }
        break;
      }
      case Op::Cvta: {   // space address -> generic
        uint64_t a = val(c, o[1]);
        switch (d.sp) {
          case Sp::Global: case Sp::Const: dst(c, o[0], a); break;
          case Sp::Shared: case Sp::SharedCluster: dst(c, o[0], kSharedWindow + (uint32_t)a); break;
          case Sp::Local: dst(c, o[0], kLocalWindow + a); break;
          case Sp::Param: dst(c, o[0], kParamWindow + a); break;
          default: fail("unsupported", t, &d, "cvta space");
        }
        break;
      }
      case Op::CvtaTo: {   // generic -> space address
        uint64_t a = val(c, o[1]);
        uint64_t w = a & kWindowMask;
        switch (d.sp) {
          case Sp::Global: case Sp::Const:
            if (w) fail("address-space", t, &d, "cvta.to.global of a non-global generic address");
            dst(c, o[0], a);
            break;
          case Sp::Shared: case Sp::SharedCluster:
            if (w != kSharedWindow) fail("address-space", t, &d, "cvta.to.shared of a non-shared generic address");
            dst(c, o[0], a - kSharedWindow);
            break;
          case Sp::Local:
            if (w != kLocalWindow) fail("address-space", t, &d, "cvta.to.local of a non-local generic address");
            dst(c, o[0], a - kLocalWindow);
            break;
          case Sp::Param:
            if (w != kParamWindow) fail("address-space", t, &d, "cvta.to.param of a non-param generic address");
            dst(c, o[0], a - kParamWindow);
            break;
          default: fail("unsupported", t, &d, "cvta.to space");
        }
        break;
      }
      case Op::Isspacep: {
        uint64_t a = val(c, o[1]), w = a & kWindowMask;
        bool r = false;
        switch (d.sp) {
          case Sp::Global: r = w == 0; break;
          case Sp::Shared: r = w == kSharedWindow && (uint32_t)(a - kSharedWindow) < (1u << kClusterRankShift); break;
          case Sp::SharedCluster: r = w == kSharedWindow; break;
          case Sp::Local: r = w == kLocalWindow; break;
          case Sp::Param: r = w == kParamWindow; break;
          case Sp::Const: r = w == 0; break;
          default: break;
        }
        dst(c, o[0], r);
        break;
      }
      case Op::Mapa: {   // mapa{.space}.type d, a, rank
        uint64_t a = val(c, o[1]);
        uint32_t rank = val(c, o[2]);
        uint32_t ncta = launch().cluster.x * launch().cluster.y * launch().cluster.z;
        if (rank >= ncta) fail("mapa", t, &d, "rank " + std::to_string(rank) + " outside the cluster of " + std::to_string(ncta));
        bool generic = d.sp == Sp::None;
        uint32_t sa = generic ? (uint32_t)(a - kSharedWindow) : (uint32_t)a;
        if (generic && (a & kWindowMask) != kSharedWindow) fail("mapa", t, &d, "generic address not in shared memory");
        uint32_t off = sa & ((1u << kClusterRankShift) - 1);
        uint32_t r = ((rank + 1) << kClusterRankShift) | off;
        dst(c, o[0], generic ? kSharedWindow + r : r);
        break;
      }
      case Op::Getctarank: {
        uint64_t a = val(c, o[1]);
        uint32_t sa = d.sp == Sp::None ? (uint32_t)(a - kSharedWindow) : (uint32_t)a;
        uint32_t hi = sa >> kClusterRankShift;
        dst(c, o[0], hi ? hi - 1 : t->cta->rank);
        break;
      }
      // ---------------- memory ----------------
      case Op::Ld: case Op::Ldu: {
        uint64_t a = addr(c, o[1]);
        int n = tbits(d.t);
        if (n == 128) fail("unsupported", t, &d, ".b128 loads");
        Sp sp = space_of(d);
        if (gmem_active() && (sp == Sp::Global || (sp == Sp::Generic && (a & kWindowMask) == 0))) {
          uint32_t nb = (o[0].kind == Operand::kVec ? o[0].vec_count : 1) * n / 8;
          gmem_check(t, &d, a, nb, GAcc::kRead);
          gmem_sync_read(t, a, d.sem);
        }
        if (o[0].kind == Operand::kVec) {
          uint32_t nel = o[0].vec_count;
          uint8_t* p = mem(t, &d, sp, a, nel * n / 8, false);
          for (uint32_t i = 0; i < nel; ++i) {
            uint64_t v = 0;
            memcpy(&v, p + i * n / 8, n / 8);
            if (tsigned(d.t)) v = (uint64_t)sext(v, n);
            dst(c, vel(c, o[0], i), v);
          }
        } else {
          uint64_t v = load(c, sp, a, n);
          if (tsigned(d.t)) v = (uint64_t)sext(v, n);
          dst(c, o[0], v);
        }
        break;
      }
      case Op::St: {
        uint64_t a = addr(c, o[0]);
        int n = tbits(d.t);
        if (n == 128) fail("unsupported", t, &d, ".b128 stores");
        Sp sp = space_of(d);
        if (gmem_active() && (sp == Sp::Global || (sp == Sp::Generic && (a & kWindowMask) == 0))) {
          gmem_check(t, &d, a, (o[1].kind == Operand::kVec ? o[1].vec_count : 1) * n / 8, GAcc::kWrite);
          gmem_sync_write(t, a, d.sem);
        }
        if (o[1].kind == Operand::kVec) {
          uint32_t nel = o[1].vec_count;
          uint8_t tmp[64];
          for (uint32_t i = 0; i < nel; ++i) {
            uint64_t v = val(c, vel(c, o[1], i));
            memcpy(tmp + i * n / 8, &v, n / 8);
          }
          uint8_t* p = mem(t, &d, sp, a, nel * n / 8, true);
          memcpy(p, tmp, nel * n / 8);
        } else {
          uint64_t v;
          if (d.t == T::F32 && o[1].kind == Operand::kF64) v = bits((float)f64((uint64_t)o[1].imm));
          else v = val(c, o[1]);
          store(c, sp, a, n, v);
        }
        progress();
        break;
      }
      case Op::Prefetch: case Op::BulkPrefetch: break;
      case Op::BulkPrefetchTensor: {
        tma::TensorMap m;
        std::string err;
        uint64_t ma = addr(c, o[0]);
        if (!tma::decode(mem(t, &d, Sp::Generic, ma, 128, false), &m, &err)) fail("tensormap", t, &d, err);
        break;
      }
      case Op::TensormapReplace: {
        // [map], value  or  [map], ord, value (ord an immediate): edits the map in place
        uint64_t a = addr(c, o[0]);
        if (a % 64) fail("tensormap", t, &d, "tensor map address not 64-byte aligned");
        uint8_t* p = mem(t, &d, space_of(d), a, 128, true);
        bool has_ord = d.nops > 2;
        uint32_t ord = has_ord ? (uint32_t)val(c, o[1]) : 0;
        std::string err;
        if (!tma::replace_field(p, d.mode, ord, val(c, o[has_ord ? 2 : 1]), &err))
          fail(err.find("not simulated") != std::string::npos ? "unsupported" : "tensormap", t, &d, err);
        break;
      }
      case Op::TensormapCpFenceproxy: {
        // copies the 128-byte map from shared to global memory and orders it for the tensormap proxy
        // (every access is immediately visible here: the copy is the whole effect)
        if (val(c, o[2]) != 128) fail("tensormap", t, &d, "tensormap.cp_fenceproxy size must be 128");
        uint64_t ga = addr(c, o[0]), sa = addr(c, o[1]);
        if (ga % 64 || sa % 64) fail("tensormap", t, &d, "tensor map address not 64-byte aligned");
        const uint8_t* s = mem(t, &d, Sp::Shared, sa, 128, false);
        uint8_t* g = mem(t, &d, Sp::Global, ga, 128, true);
        memmove(g, s, 128);
        break;
      }
      case Op::Atom: case Op::Red: {
        bool is_red = d.op == Op::Red;
        const Operand& ao = is_red ? o[0] : o[1];
        uint64_t a = addr(c, ao);
        T ty = d.t;
        int n = tbits(ty);
        if (n > 64) fail("unsupported", t, &d, "128-bit atomics");
        Sp sp = space_of(d);
        if (gmem_active() && (sp == Sp::Global || (sp == Sp::Generic && (a & kWindowMask) == 0))) {
          // an RMW reads (acquire side), then writes (release side); red only writes
          gmem_check(t, &d, a, d.vec * n / 8, is_red ? GAcc::kReduce : GAcc::kWrite);
          if (!is_red) gmem_sync_read(t, a, d.sem == kSemRelease ? kSemRelaxed : d.sem);
          gmem_sync_write(t, a, d.sem == kSemAcquire ? kSemRelaxed : d.sem);
        }
        if (d.vec > 1) {   // red/atom .v2/.v4 .f32/.f16x2 ... (sm_90)
          const Operand& vo = is_red ? o[1] : o[2];
          uint8_t* p = mem(t, &d, sp, a, d.vec * n / 8, true);
          for (uint32_t i = 0; i < d.vec; ++i) {
            uint64_t old = 0;
            memcpy(&old, p + i * n / 8, n / 8);
            uint64_t nv = atomic_apply(c, d.aop, ty, old, val(c, vel(c, vo, i)), 0);
            memcpy(p + i * n / 8, &nv, n / 8);
            if (!is_red) dst(c, vel(c, o[0], i), old);
          }
        } else {
          uint8_t* p = mem(t, &d, sp, a, n / 8, true);
          uint64_t old = 0;
          memcpy(&old, p, n / 8);
          uint64_t b = val(c, is_red ? o[1] : o[2]);
          if (d.aop == AtomOp::Add && sp == Sp::Global && !tfloat(ty)) b *= atomic_scale();   // sampling
          uint64_t cc = (!is_red && d.aop == AtomOp::Cas) ? val(c, o[3]) : 0;
          uint64_t nv = atomic_apply(c, d.aop, ty, old, b, cc);
          memcpy(p, &nv, n / 8);
          if (!is_red) dst(c, o[0], tsigned(ty) ? (uint64_t)sext(old, n) : old);
        }
        progress();
        break;
      }
      // ---------------- control ----------------
      case Op::Bra: {
        pcnext = (int)o[0].imm;
        if (o[0].kind != Operand::kLabel) fail("unsupported", t, &d, "indirect branch");
        break;
      }
      case Op::Call: {
        // call{.uni} (rets), func, (args)  |  call func, (args)
        const Operand* rets = nullptr;
        const Operand* fo = nullptr;
        const Operand* args = nullptr;
        for (uint32_t i = 0; i < d.nops; ++i) {
          if (o[i].kind == Operand::kSym && !fo) fo = &o[i];
          else if (o[i].kind == Operand::kVec) (fo ? args : rets) = &o[i];
        }
        if (!fo) fail("unsupported", t, &d, "indirect call");
        const Symbol& fs = lm_->mod->symbols[fo->sym];
        auto arg_bytes = [&](uint32_t i, uint32_t n) -> uint8_t* {
          const Operand& ao = vel(c, *args, i);
          if (ao.kind != Operand::kSym) fail("unsupported", t, &d, "call argument that is not a .param");
          uint64_t pa = sym_addr(c, ao.sym);
          return mem(t, &d, Sp::Param, pa, n, false);
        };
        if (fs.func < 0 || !lm_->mod->functions[fs.func].has_body) {
          if (fs.name == "vprintf") {
            uint64_t fmt = 0, ap = 0;
            memcpy(&fmt, arg_bytes(0, 8), 8);
            memcpy(&ap, arg_bytes(1, 8), 8);
            do_vprintf(c, fmt, ap);
            if (rets && rets->vec_count) {
              const Operand& ro = vel(c, *rets, 0);
              uint32_t z = 0;
              memcpy(mem(t, &d, Sp::Param, sym_addr(c, ro.sym), 4, true), &z, 4);
            }
            break;
          }
          if (fs.name == "__assertfail") {
            uint64_t msg = 0, file = 0;
            uint32_t line = 0;
            memcpy(&msg, arg_bytes(0, 8), 8);
            memcpy(&file, arg_bytes(1, 8), 8);
            memcpy(&line, arg_bytes(2, 4), 4);
            auto str = [&](uint64_t p) {
              std::string s;
              for (; p; ++p) { char ch = (char)*mem(t, &d, Sp::Generic, p, 1, false); if (!ch) break; s += ch; }
              return s;
            };
            fail("device-assert", t, &d, str(file) + ":" + std::to_string(line) + ": " + str(msg));
          }
          fail("unsupported", t, &d, "call of the undefined function " + fs.name);
        }
        const LoadedFunction* callee = &lm_->funcs[fs.func];
        Frame nf;
        nf.lf = callee;
        nf.regs.assign(callee->fn->regs.size(), 0);
        nf.call_params.assign(callee->call_param_bytes, 0);
        nf.local_base = f->local_base + f->lf->local_bytes;
        if (t->local.size() < nf.local_base + callee->local_bytes + 64)
          t->local.resize(nf.local_base + callee->local_bytes + 4096, 0);
        uint32_t in_bytes = 0;
        for (int32_t p : callee->fn->params) in_bytes = std::max<uint32_t>(in_bytes, callee->param_offset.at(p) + lm_->mod->symbols[p].size);
        for (int32_t p : callee->fn->rets) in_bytes = std::max<uint32_t>(in_bytes, callee->param_offset.at(p) + lm_->mod->symbols[p].size);
        nf.in_params.assign(in_bytes + 8, 0);
        if (args)
          for (uint32_t i = 0; i < args->vec_count && i < callee->fn->params.size(); ++i) {
            int32_t p = callee->fn->params[i];
            uint32_t sz = (uint32_t)lm_->mod->symbols[p].size;
            memcpy(nf.in_params.data() + callee->param_offset.at(p), arg_bytes(i, sz), sz);
          }
        nf.call_site = &d;
        f->pc = pcnext;
        t->frames.push_back(std::move(nf));
        continue;   // do not touch f (reallocated)
      }
      case Op::Ret: case Op::Exit: {
        if (d.op == Op::Ret && t->frames.size() > 1) {
          Frame done = std::move(t->frames.back());
          t->frames.pop_back();
          Frame& caller = t->frames.back();
          const DInstr& cs = *done.call_site;
          const Operand* rets = nullptr;
          bool seen_f = false;
          for (uint32_t i = 0; i < cs.nops; ++i) {
            if (cs.ops[i].kind == Operand::kSym) seen_f = true;
            else if (cs.ops[i].kind == Operand::kVec && !seen_f) rets = &cs.ops[i];
          }
          if (rets) {
            Ctx cc{this, t, &caller, caller.regs.data(), &cs};
            for (uint32_t i = 0; i < rets->vec_count && i < done.lf->fn->rets.size(); ++i) {
              int32_t p = done.lf->fn->rets[i];
              uint32_t sz = (uint32_t)lm_->mod->symbols[p].size;
              const Operand& ro = vel(cc, *rets, i);
              memcpy(mem(t, &cs, Sp::Param, sym_addr(cc, ro.sym), sz, true),
                     done.in_params.data() + done.lf->param_offset.at(p), sz);
            }
          }
          continue;
        }
        thread_exited(t);
        return;
      }
      case Op::Trap: fail("trap", t, &d, "the kernel executed trap");
      case Op::Brkpt: fail("trap", t, &d, "the kernel executed brkpt");
      case Op::Membar: case Op::Fence:
        if (d.sem) gmem_fence(t);
        break;
      case Op::Nanosleep: case Op::Pmevent: case Op::Griddep: case Op::Nop:
        break;
      case Op::FenceProxyAsync: fence_proxy_async(t); break;
      case Op::Activemask: {
        t->wait_instr = &d;
        if (!warp_rendezvous(t, &d, t->warp->live_mask)) return;
        break;
      }
      // ---------------- warp collectives ----------------
      case Op::Shfl: case Op::Vote: case Op::Match: case Op::Redux: case Op::Elect: case Op::BarWarpSync: {
        uint32_t mask;
        const Operand& mo = o[d.nops - 1];
        if (d.op == Op::Elect) mask = (uint32_t)val(c, o[1]);
        else if (d.op == Op::BarWarpSync) mask = (uint32_t)val(c, o[0]);
        else mask = (uint32_t)val(c, mo);
        if (!(mask >> t->lane & 1))
          {
          char mb[64];
          snprintf(mb, sizeof mb, "the executing lane is not in membermask 0x%08x", mask);
          fail("warp-sync", t, &d, mb);
        }
        t->wait_instr = &d;
        if (!warp_rendezvous(t, &d, mask)) return;
        f = &t->frames.back();
        break;
      }
      case Op::Ldmatrix: case Op::Stmatrix: case Op::WgmmaFence: case Op::WgmmaCommit: case Op::WgmmaWait:
      case Op::Setmaxnreg: {
        t->wait_instr = &d;
        if (!warp_rendezvous(t, &d, t->warp->live_mask)) return;
        break;
      }
      case Op::Wgmma: {
        t->wait_instr = &d;
        if (!warpgroup_rendezvous(t, &d)) return;
        break;
      }
      // ---------------- CTA and cluster barriers ----------------
      case Op::BarSync: case Op::BarArrive: case Op::BarRed: {
        uint32_t id = d.nops > 0 && o[0].kind != Operand::kNone ? (uint32_t)val(c, o[0]) : 0;
        bool has_count = false;
        uint32_t count = 0;
        if (d.op == Op::BarRed) {   // bar.red.popc.u32 d, a{, b}, {!}c  /  bar.red.and|or.pred p, a{, b}, {!}c
          id = (uint32_t)val(c, o[1]);
          if (d.nops == 4) { has_count = true; count = (uint32_t)val(c, o[2]); }
          if (id > 15) fail("named-barrier", t, &d, "barrier id " + std::to_string(id) + " > 15");
          bool pv = val(c, o[d.nops - 1]) & 1;
          NamedBarrier& nb = t->cta->bars[id];
          int kind = d.aop == AtomOp::Add ? 0 : d.aop == AtomOp::And ? 1 : 2;
          if (nb.arrived == 0) { nb.red_kind = kind; nb.red_value = kind == 1 ? 1 : 0; }
          else if (nb.red_kind != kind) fail("named-barrier", t, &d, "bar.red with a different operation in the same round");
          if (kind == 0) nb.red_value += pv;
          else if (kind == 1) nb.red_value &= pv;
          else nb.red_value |= pv;
        } else if (d.nops > 1) { has_count = true; count = (uint32_t)val(c, o[1]); }
        if (id > 15) fail("named-barrier", t, &d, "barrier id " + std::to_string(id) + " > 15");
        t->wait_instr = &d;
        f->pc = pcnext;
        if (rec_) rec_->bar(t, &d, id, d.op != Op::BarArrive);
        bar_arrive(t, &d, id, count, has_count, d.op != Op::BarArrive);
        progress();
        if (t->state != TS::Runnable) return;
        continue;
      }
      case Op::ClusterArrive:
        if (rec_) rec_->cluster_arrive(t, &d, t->cta->cluster->arrive_gen);
        cluster_arrive(t, d.mode != 1); progress(); break;   // .relaxed: no release
      case Op::ClusterWait: {
        if (rec_) rec_->cluster_wait(t, &d, t->cluster_gen);
        f->pc = pcnext;
        cluster_wait(t, &d);
        if (t->state != TS::Runnable) return;
        continue;
      }
      // ---------------- mbarriers ----------------
      case Op::MbarInit: case Op::MbarInval: case Op::MbarArrive: case Op::MbarExpectTx: case Op::MbarCompleteTx:
      case Op::MbarTestWait: case Op::MbarTryWait: case Op::MbarPendingCount: {
        // operand layout: init [a], count | inval [a] | arrive state, [a]{, count} | expect_tx [a], tx |
        // test/try_wait p, [a], state|parity{, hint}
        if (d.op == Op::MbarPendingCount) fail("unsupported", t, &d, "mbarrier.pending_count");
        int ai = (d.op == Op::MbarInit || d.op == Op::MbarInval || d.op == Op::MbarExpectTx || d.op == Op::MbarCompleteTx) ? 0 : 1;
        uint64_t a = addr(c, o[ai]);
        Sp sp = d.sp == Sp::None ? Sp::Generic : d.sp;
        uint32_t off;
        Cta* owner;
        mem(t, &d, sp, a, 8, false, &owner, &off);
        if (off % 8) fail("mbarrier", t, &d, "mbarrier address not 8-byte aligned");
        if (d.op == Op::MbarInit) {
          uint32_t cnt = (uint32_t)val(c, o[1]);
          if (cnt == 0 || cnt >= (1u << 20)) fail("mbarrier", t, &d, "init count " + std::to_string(cnt) + " outside [1, 2^20)");
          MBar& m = mbar(t, &d, owner, off, false);
          m = MBar();
          m.valid = true; m.expected = m.pending = cnt;
          m.id = next_mbar_id();
          for (int b = 0; b < 8; ++b) owner->shadow[off + b] |= 8;
        } else if (d.op == Op::MbarInval) {
          MBar& m = mbar(t, &d, owner, off);
          m.valid = false;
          for (int b = 0; b < 8; ++b) owner->shadow[off + b] &= ~8;
        } else if (d.op == Op::MbarExpectTx) {
          mbar_tx(t, &d, owner, off, (int64_t)val(c, o[1]));
        } else if (d.op == Op::MbarCompleteTx) {
          mbar_tx(t, &d, owner, off, -(int64_t)val(c, o[1]));
        } else if (d.op == Op::MbarArrive) {
          MBar& m = mbar(t, &d, owner, off);
          uint64_t state = m.phase;
          uint32_t cnt = 1;
          int ci = 2;
          if (d.flags & F_EXPECT_TX) { mbar_tx(t, &d, owner, off, (int64_t)val(c, o[2])); ci = 3; }
          if ((int)d.nops > ci) cnt = (uint32_t)val(c, o[ci]);
          if (d.flags & F_DROP) {   // the expected count of later phases drops by the arrival count
            MBar& mm = mbar(t, &d, owner, off);
            if (mm.expected < cnt) fail("mbarrier", t, &d, "arrive_drop below zero");
            mm.expected -= cnt;
          }
          if (rec_) rec_->arrive(t, &d, m.id, (uint32_t)state, off);
          mbar_arrive(t, &d, owner, off, cnt, d.flags & F_NOCOMPLETE);
          if (owner != t->cta && o[0].kind != Operand::kSink)
            fail("mbarrier", t, &d, "remote arrive must use the sink `_` as its state");
          dst(c, o[0], state);
          progress();
        } else if (d.op == Op::MbarPendingCount) {
          fail("unsupported", t, &d, "mbarrier.pending_count");
        } else {   // test_wait / try_wait
          MBar& m = mbar(t, &d, owner, off);
          uint64_t s = val(c, o[2]);
          bool done;
          if (d.flags & F_PARITY) done = (m.phase & 1) != (s & 1);
          else done = m.phase != (uint32_t)s;
          // the phase a successful wait observed: parity -> the last completed one; token -> its phase
          if (rec_) rec_->wait_result(t, &d, done, m.id, (d.flags & F_PARITY) ? m.phase - 1 : (uint32_t)s, off);
          if (!done && d.op == Op::MbarTestWait) {   // non-blocking: report, and let others run
            dst(c, o[0], 0);
            budget = 0;
            break;
          }
          if (!done && t->try_timeout) {   // try_wait's time limit expired (granted by the scheduler)
            t->try_timeout = false;
            dst(c, o[0], 0);
            break;
          }
          t->try_timeout = false;
          if (!done) {
            // try_wait blocks until the phase completes (a legal choice of its time limit); the
            // scheduler grants the time limit when every thread is blocked.
            t->wait_addr = off;
            t->wait_value = (uint32_t)s;
            t->wait_instr = &d;
            m.waiters.push_back(t);
            block(t, TS::Mbar, &d);
            return;
          }
          observe(t, m);
          dst(c, o[0], 1);
        }
        break;
      }
      // ---------------- async copies ----------------
      case Op::CpAsync: {   // cp.async.ca/cg.shared{::cta}.global [dst], [src], cp-size{, src-size}{, policy}
        uint64_t da = addr(c, o[0]), sa = addr(c, o[1]);
        uint32_t n = (uint32_t)val(c, o[2]);
        uint32_t srcn = n;
        uint32_t extra = d.nops - ((d.flags & F_CACHEHINT) ? 4 : 3);   // src-size or ignore-src present?
        if (extra && o[3].kind != Operand::kNone) {
          bool is_pred = o[3].kind == Operand::kReg && c.f->lf->fn->regs[o[3].reg].is_pred;
          if (is_pred) srcn = (val(c, o[3]) & 1) ? 0 : n;   // ignore-src: true means zero-fill
          else srcn = (uint32_t)val(c, o[3]);
        }
        if (n != 4 && n != 8 && n != 16) fail("cp.async", t, &d, "cp-size must be 4, 8 or 16");
        if (srcn > n) fail("cp.async", t, &d, "src-size larger than cp-size");
        uint32_t off;
        Cta* owner;
        mem(t, &d, Sp::Shared, da, n, true, &owner, &off);
        if (srcn) mem(t, &d, Sp::Global, sa, srcn, false);
        for (uint32_t b = 0; b < n; ++b) async_write_begin(owner, off + b);
        t->cp_uncommitted.push_back(CpAsyncOp{off, sa, n, srcn, Sp::Global});
        break;
      }
      case Op::CpAsyncCommit:
        t->cp_groups.push_back(std::move(t->cp_uncommitted));
        t->cp_uncommitted.clear();
        break;
      case Op::CpAsyncWait: case Op::CpAsyncWaitAll: {
        size_t keep = d.op == Op::CpAsyncWait ? (size_t)val(c, o[0]) : 0;
        if (d.op == Op::CpAsyncWaitAll) {
          t->cp_groups.push_back(std::move(t->cp_uncommitted));
          t->cp_uncommitted.clear();
        }
        complete_thread_cp_async(t, keep);
        break;
      }
      case Op::CpAsyncMbarArrive: {
        uint64_t a = addr(c, o[0]);
        uint32_t off;
        Cta* owner;
        mem(t, &d, d.sp == Sp::None ? Sp::Generic : d.sp, a, 8, false, &owner, &off);
        MBar& m = mbar(t, &d, owner, off);
        if (!(d.flags & F_NOINC)) { ++m.pending; }
        // All of this thread's cp.async so far complete before the arrive: complete them now
        // (a legal completion time), then arrive.
        t->cp_groups.push_back(std::move(t->cp_uncommitted));
        t->cp_uncommitted.clear();
        complete_thread_cp_async(t, 0);
        if (rec_) rec_->arrive(t, &d, m.id, m.phase, off);
        mbar_arrive(t, &d, owner, off, 1);
        break;
      }
      case Op::BulkTensor: case Op::BulkCopy: {
        uint64_t tfoot_key = 0, tfoot_bytes = 0;
        AsyncOp op{};
        op.issuer = t;
        op.instr = &d;
        bool tensor = d.op == Op::BulkTensor;
        bool to_shared = d.sp == Sp::SharedCluster || (d.sp == Sp::Shared && d.sp2 != Sp::SharedCluster && d.sp2 != Sp::Shared) ;
        // destination space comes first in the modifiers: .shared::cluster.global (load) or
        // .global.shared::cta (store/reduce) or .shared::cluster.shared::cta (s2s)
        bool s2s = (d.sp == Sp::SharedCluster && d.sp2 == Sp::Shared);
        bool reduce = d.aop != AtomOp::None;
        if (d.sp == Sp::Global) to_shared = false;
        if (tensor) {
          // load: [dst], [map, {coords}], [mbar]{, ctamask}{, policy};  store: [map, {coords}], [src]
          // [map, {c0, ...}] is a kMem (the map's address) whose vec_begin/vec_count list the coordinates
          const Operand& mo = to_shared ? o[1] : o[0];
          if (mo.kind != Operand::kMem || mo.vec_count == 0) fail("unsupported", t, &d, "tensor operand form");
          uint64_t ma;
          {
            Operand base = mo;
            base.vec_count = 0;
            ma = addr(c, base);
          }
          std::vector<int32_t> coords;
          Operand cvo = mo;
          cvo.kind = Operand::kVec;
          const Operand* cv = &cvo;
          for (uint32_t i = 0; i < cv->vec_count; ++i) coords.push_back((int32_t)val(c, vel(c, *cv, i)));
          memcpy(op.tmap, mem(t, &d, Sp::Generic, ma, 128, false), 128);
          tma::TensorMap m;
          std::string err;
          if (!tma::decode(op.tmap, &m, &err)) fail("tensormap", t, &d, err);
          if ((int)m.rank != d.a || (int)coords.size() != d.a)
            fail("tensormap", t, &d, "instruction is " + std::to_string(d.a) + "d, map rank " + std::to_string(m.rank));
          for (size_t i = 0; i < coords.size(); ++i) op.coords[i] = coords[i];
          op.bytes = tma::box_bytes(m);
          if (rec_) {   // the tensor's whole extent: what it costs from HBM once (timing model)
            tfoot_key = m.global_address;
            tfoot_bytes = m.rank ? m.strides[m.rank - 1] * m.dims[m.rank - 1] : 0;
            if (m.rank == 1) tfoot_bytes = m.dims[0] * m.elem_bytes;
          }
          int next = to_shared ? 3 : 2;
          if (to_shared) {
            op.kind = AsyncOp::kTmaLoad;
            uint64_t da = addr(c, o[0]);
            uint32_t off;
            Cta* owner = cluster_cta(t, &d, (uint32_t)da, &off);
            uint64_t mba = addr(c, o[2]);
            uint32_t moff;
            Cta* mowner = cluster_cta(t, &d, (uint32_t)mba, &moff);
            op.smem = off;
            op.mbar = moff;
            op.has_mbar = true;
            if (d.flags & F_MULTICAST) {
              uint16_t mask = (uint16_t)val(c, o[next]);
              ++next;
              Cluster* cl = t->cta->cluster;
              for (uint32_t r = 0; r < cl->ctas.size(); ++r)
                if (mask >> r & 1) op.dst_ctas.push_back(cl->ctas[r]);
              if (op.dst_ctas.empty()) fail("tma", t, &d, "multicast with an empty CTA mask");
            } else {
              if (owner != mowner) fail("tma", t, &d, "destination and mbarrier in different CTAs");
              op.dst_ctas.push_back(owner);
            }
            if (off % 128) fail("tma", t, &d, "shared memory destination not 128-byte aligned (address " + std::to_string(off) + ")");
            for (Cta* dc : op.dst_ctas) {
              if (off + op.bytes > dc->smem.size()) fail("tma", t, &d, "destination box past the end of shared memory");
              mbar(t, &d, dc, moff);
              // Onto bytes another copy is still writing: a write-write race, not an error until
              // something reads them (kShadowRacy).
              for (uint32_t b = 0; b < op.bytes; ++b) {
                if (opt_.strict && (dc->shadow[off + b] & kShadowAsyncRead))
                  fail("async-inflight", t, &d, "TMA destination overlaps a bulk/TMA store still reading shared address " +
                       std::to_string(off + b) + " (missing cp.async.bulk.wait_group.read)");
                async_write_begin(dc, off + b);
              }
              check_wgmma_overwrite(t, &d, dc, off, op.bytes, "a TMA load (issued)");
            }
          } else {
            op.kind = reduce ? AsyncOp::kTmaReduce : AsyncOp::kTmaStore;
            op.red_op = (uint8_t)d.aop;
            uint64_t sa = addr(c, o[1]);
            uint32_t off;
            Cta* owner;
            mem(t, &d, Sp::Shared, sa, op.bytes, false, &owner, &off);
            check_smem_read(t, &d, owner, off, op.bytes);
            for (uint32_t b = 0; b < op.bytes; ++b) owner->shadow[off + b] |= kShadowAsyncRead;
            op.src_cta = owner;
            op.src_smem = off;
            op.counts_bulk_group = true;
            op.group = t->bulk_group;
            tma::walk_box(m, op.coords, op.src_smem, [&](uint32_t so, uint64_t ga, uint32_t nb, bool in) {
              if (!in) return;
              if (!dev_->check_global(ga, nb)) fail("global-bounds", t, &d, "TMA store outside every allocation");
              op.gruns.push_back({ga, op.src_smem + so, nb});
            });
            gmem_issue(t, op);
          }
          if (to_shared && gmem_tracking()) {   // the load's global reads (at issue: the issuer's order)
            tma::walk_box(m, op.coords, op.smem, [&](uint32_t, uint64_t ga, uint32_t nb, bool in) {
              if (in) gmem_check(t, &d, ga, nb, GAcc::kRead);
            });
          }
        } else {
          // cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [dst], [src], size, [mbar]
          // cp.async.bulk.global.shared::cta.bulk_group [dst], [src], size
          // cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [dst], [src], size, [mbar]
          // cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [dst], [src], size
          uint32_t n = (uint32_t)val(c, o[2]);
          if (n % 16) fail("bulk-copy", t, &d, "size " + std::to_string(n) + " is not a multiple of 16");
          op.bytes = n;
          uint64_t da = addr(c, o[0]), sa = addr(c, o[1]);
          if (da % 16 || sa % 16) fail("bulk-copy", t, &d, "address not 16-byte aligned");
          if (d.sp == Sp::Global) {
            op.kind = reduce ? AsyncOp::kBulkReduceS2G : AsyncOp::kBulkS2G;
            op.red_op = (uint8_t)d.aop;
            op.red_type = (uint8_t)d.t;
            mem(t, &d, Sp::Global, da, n, true);
            op.gaddr = da;
            uint32_t off;
            Cta* owner;
            mem(t, &d, Sp::Shared, sa, n, false, &owner, &off);
            check_smem_read(t, &d, owner, off, n);
            for (uint32_t b = 0; b < n; ++b) owner->shadow[off + b] |= kShadowAsyncRead;
            op.src_cta = owner;
            op.src_smem = off;
            op.counts_bulk_group = true;
            op.group = t->bulk_group;
            op.gruns.push_back({da, off, n});
            gmem_issue(t, op);
          } else {
            uint32_t off, moff;
            Cta* owner = cluster_cta(t, &d, (uint32_t)da, &off);
            uint64_t mba = addr(c, o[3]);
            Cta* mowner = cluster_cta(t, &d, (uint32_t)mba, &moff);
            if (owner != mowner) fail("bulk-copy", t, &d, "destination and mbarrier in different CTAs");
            if (off + n > owner->smem.size()) fail("bulk-copy", t, &d, "destination past the end of shared memory");
            mbar(t, &d, owner, moff);
            op.dst_ctas.push_back(owner);
            if (d.flags & F_MULTICAST) {   // [dst], [src], size, [mbar], ctaMask: every CTA in the mask
              if (s2s) fail("bulk-copy", t, &d, "multicast needs a global source");
              uint16_t mask = (uint16_t)val(c, o[4]);
              Cluster* cl = t->cta->cluster;
              op.dst_ctas.clear();
              for (uint32_t r = 0; r < cl->ctas.size(); ++r)
                if (mask >> r & 1) {
                  op.dst_ctas.push_back(cl->ctas[r]);
                  mbar(t, &d, cl->ctas[r], moff);
                }
              if (op.dst_ctas.empty()) fail("bulk-copy", t, &d, "multicast with an empty CTA mask");
            }
            op.smem = off;
            op.mbar = moff;
            op.has_mbar = true;
            op.red_op = (uint8_t)d.aop;
            op.red_type = (uint8_t)d.t;
            if (s2s) {
              op.kind = AsyncOp::kBulkS2S;
              uint32_t soff;
              Cta* sowner;
              mem(t, &d, Sp::Shared, sa, n, false, &sowner, &soff);
              check_smem_read(t, &d, sowner, soff, n);
              op.src_cta = sowner;
              op.src_smem = soff;
            } else {
              op.kind = AsyncOp::kBulkG2S;
              mem(t, &d, Sp::Global, sa, n, false);
              gmem_check(t, &d, sa, n, GAcc::kRead);
              op.gaddr = sa;
              tfoot_key = sa;
              tfoot_bytes = n;
            }
            for (Cta* dc : op.dst_ctas)
              for (uint32_t b = 0; b < n; ++b) {
                if (opt_.strict && (dc->shadow[off + b] & kShadowAsyncRead))
                  fail("async-inflight", t, &d, "bulk copy destination overlaps a store still reading shared address " +
                       std::to_string(off + b) + " (missing cp.async.bulk.wait_group.read)");
                async_write_begin(dc, off + b);   // (onto an in-flight copy: kShadowRacy)
              }
            for (Cta* dc : op.dst_ctas) check_wgmma_overwrite(t, &d, dc, off, n, "a bulk copy (issued)");
          }
        }
        if (rec_) {
          TmaRec r;
          r.bytes = op.bytes;
          r.store = op.dst_ctas.empty();
          r.ndst = (uint32_t)op.dst_ctas.size();
          for (Cta* dc : op.dst_ctas) {
            MBar& mb = mbar(t, &d, dc, op.mbar);
            r.keys.push_back(phase_key(kKeyMbar, mb.id, mb.phase));
          }
          rec_->tma(t, &d, std::move(r), tfoot_key, tfoot_bytes);
        }
        enqueue(std::move(op));
        progress();
        break;
      }
      case Op::BulkCommit: ++t->bulk_group; break;   // (an empty group is complete at once)
      case Op::BulkWait: {
        // all but the `keep` most recent committed groups must be complete (for .read, their source
        // reads; a completed operation has done both): complete this thread's older operations
        // .read: a global write's source is read now, its global bytes change only at completion
        // (the scheduler's pick or a later wait without .read); without .read the writes are complete
        // and visible to this thread (the global-async-order check's D knowledge)
        uint64_t keep = val(c, o[0]);
        bool read_only = d.flags & F_READ;
        if (rec_) rec_->bulk_wait(t, &d);
        for (size_t i = 0; i < async_.size();) {
          AsyncOp& q = async_[i];
          if (q.issuer == t && q.counts_bulk_group && q.group + keep < t->bulk_group) {
            if (read_only && q.global_write()) {
              if (!q.src_done) gather_store(q);
              ++i;
              continue;
            }
            AsyncOp op = std::move(q);
            async_.erase(async_.begin() + i);
            complete(op);
            i = 0;
          } else ++i;
        }
        if (!read_only) gmem_wait_done(t, t->bulk_group > keep ? t->bulk_group - keep : 0);
        break;
      }
      case Op::StAsync: case Op::RedAsync:
        fail("unsupported", t, &d, "st.async / red.async");
      default:
        fail("unsupported", t, &d, "instruction not implemented in the interpreter");
    }
    if (t->state != TS::Runnable) return;
    t->frames.back().pc = pcnext;
  }
}

void exec_warp_collective_entry(Engine* e, Warp* w, uint32_t lanes, const DInstr* coll) {
  exec_warp_collective(e, w, lanes, coll);
}

// bar.red: the reduction goes to each participant's destination when the barrier completes.
void bar_red_result(Engine* e, Thread* t, uint32_t v) {
  Frame& f = t->frames.back();
  const Operand& o = t->wait_instr->ops[0];
  if (o.kind == Operand::kReg) f.regs[o.reg] = v & f.lf->regmask[o.reg];
  (void)e;
}

}  // namespace hsim
