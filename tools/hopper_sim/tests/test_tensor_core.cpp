// Unit tests for tensor_core.cpp. Operands are written into a byte array by a *forward* placer
// (walks the memory slots of each core matrix / swizzle atom as the PTX ISA figures draw them and
// asks "which logical chunk lives here"), the opposite direction to the implementation's
// element -> address function. Results are compared with a plain triple-loop GEMM on values that
// make every product and sum exact, and with hand-worked entries from the ISA fragment figures.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "check.h"
#include "tensor_core.h"

using namespace hsim::tc;

namespace {

constexpr uint32_t kSmem = 228 * 1024;

// ---- test-side encoders (only for values the tests use: small integers / dyadics) ----
uint32_t f32bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
float bitsf32(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
uint16_t bf16_of(double v) { return static_cast<uint16_t>(f32bits(static_cast<float>(v)) >> 16); }  // exact for our values
uint16_t f16_of(double v) {  // normal, exactly representable values and zero only
  if (v == 0) return std::signbit(v) ? 0x8000 : 0;
  uint16_t s = v < 0 ? 0x8000 : 0;
  int e;
  double f = std::frexp(std::fabs(v), &e);  // |v| = f*2^e, f in [0.5,1) -> 1.m * 2^(e-1)
  return s | static_cast<uint16_t>((e - 1 + 15) << 10) | (static_cast<uint16_t>(std::ldexp(f, 11)) & 0x3FF);
}
double f16_val(uint16_t h) {  // normals/zero/inf (what our checks produce)
  int e = (h >> 10) & 31, m = h & 0x3FF;
  double v = e == 31 ? INFINITY : e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
  return (h & 0x8000) ? -v : v;
}

// ---- descriptor per the ISA's "Matrix Descriptor Format" table ----
uint64_t make_desc(uint32_t start, uint32_t lbo, uint32_t sbo, uint32_t base_off, int swz_bytes) {
  uint64_t mode = swz_bytes == 128 ? 1 : swz_bytes == 64 ? 2 : swz_bytes == 32 ? 3 : 0;
  return (uint64_t)((start & 0x3FFFF) >> 4) | ((uint64_t)((lbo & 0x3FFFF) >> 4) << 16) |
         ((uint64_t)((sbo & 0x3FFFF) >> 4) << 32) | ((uint64_t)(base_off & 7) << 49) | (mode << 62);
}

// A logical operand: rows = MN index (A: m, B: n), cols = K, raw element bits + exact value.
struct Mat {
  int mn = 0, k = 0, eb = 2;
  std::vector<uint32_t> raw;
  std::vector<double> val;
  uint32_t r(int i, int j) const { return raw[i * k + j]; }
  double v(int i, int j) const { return val[i * k + j]; }
};

void put_bytes(std::vector<uint8_t>& mem, uint32_t addr, uint32_t bits, int eb) {
  for (int b = 0; b < eb; ++b) mem.at(addr + b) = (bits >> (8 * b)) & 0xFF;
}

// Which logical 16-byte chunk of a swizzle-atom row sits in physical slot p, for row r counted from
// the start of the repeating pattern (ISA swizzle figures: 128B -> rows of 128 B, XOR pattern
// changes every row; 64B -> rows of 64 B, changes every 2 rows; 32B -> rows of 32 B, every 4 rows).
int logical_chunk(int swz, int r, int p) {
  int rows_per_step = 128 / swz;            // 1, 2, 4
  int period = swz / 16;                    // 8, 4, 2 distinct patterns
  return p ^ ((r / rows_per_step) % period);
}

// Forward placement of M (all of M.k along K) per the canonical layouts.
void place(std::vector<uint8_t>& mem, const Mat& M, int swz, bool kmaj, uint32_t start, uint32_t lbo,
           uint32_t sbo) {
  const int per16 = 16 / M.eb;  // elements per 16-byte chunk
  if (kmaj && swz == 0) {
    // Core matrices of 8 rows x 16 B: (group G of 8 MN rows, K chunk kc) at start + G*SBO + kc*LBO.
    for (int G = 0; G < M.mn / 8; ++G)
      for (int kc = 0; kc < M.k / per16; ++kc)
        for (int r = 0; r < 8; ++r)
          for (int e = 0; e < per16; ++e)
            put_bytes(mem, start + G * sbo + kc * lbo + r * 16 + e * M.eb, M.r(8 * G + r, kc * per16 + e), M.eb);
  } else if (kmaj) {
    // Atoms of 8 rows x swz bytes (row = one MN index, K along the row), atom G at start + G*SBO.
    for (int G = 0; G < M.mn / 8; ++G)
      for (int r = 0; r < 8; ++r)
        for (int p = 0; p < swz / 16; ++p) {
          int L = logical_chunk(swz, r, p);
          for (int e = 0; e < per16; ++e) {
            int kk = L * per16 + e;
            if (kk >= M.k) continue;
            put_bytes(mem, start + G * sbo + r * swz + p * 16 + e * M.eb, M.r(8 * G + r, kk), M.eb);
          }
        }
  } else if (swz == 0) {
    // MN-major core matrices: 8 K rows x 16 B of MN; MN chunk mc at +mc*SBO, K group kg at +kg*LBO.
    for (int mc = 0; mc < M.mn / per16; ++mc)
      for (int kg = 0; kg < M.k / 8; ++kg)
        for (int r = 0; r < 8; ++r)
          for (int e = 0; e < per16; ++e)
            put_bytes(mem, start + mc * sbo + kg * lbo + r * 16 + e * M.eb, M.r(mc * per16 + e, 8 * kg + r), M.eb);
  } else {
    // MN-major atoms: 8 K rows x swz bytes of MN; MN atom ai at +ai*LBO, K group kg at +kg*SBO.
    const int mn_per_atom = swz / M.eb;
    for (int ai = 0; ai < M.mn / mn_per_atom; ++ai)
      for (int kg = 0; kg < M.k / 8; ++kg)
        for (int r = 0; r < 8; ++r)
          for (int p = 0; p < swz / 16; ++p) {
            int L = logical_chunk(swz, r, p);
            for (int e = 0; e < per16; ++e)
              put_bytes(mem, start + ai * lbo + kg * sbo + r * swz + p * 16 + e * M.eb,
                        M.r(ai * mn_per_atom + L * per16 + e, 8 * kg + r), M.eb);
          }
  }
}

std::mt19937 rng(12345);
// Small integers in [-4, 4]: every product and K-sum is exact in f16/bf16/tf32/f32.
Mat rand_mat(EType t, int mn, int k) {
  Mat M;
  M.mn = mn; M.k = k; M.eb = ebits(t) / 8;
  M.raw.resize(mn * k); M.val.resize(mn * k);
  std::uniform_int_distribution<int> u(-4, 4);
  // fp8 tables worked from the formats: e4m3 = s.eeee.mmm bias 7, e5m2 = s.eeeee.mm bias 15.
  static const uint8_t e4[] = {0x38, 0x40, 0x3C, 0xB8, 0x30, 0x00, 0x44, 0xC0};
  static const double e4v[] = {1.0, 2.0, 1.5, -1.0, 0.5, 0.0, 3.0, -2.0};
  static const uint8_t e5[] = {0x3C, 0x40, 0x3E, 0xBC, 0x38, 0x00, 0x42, 0xC0};
  static const double e5v[] = {1.0, 2.0, 1.5, -1.0, 0.5, 0.0, 3.0, -2.0};
  std::uniform_int_distribution<int> ui(0, 7);
  for (int i = 0; i < mn * k; ++i) {
    int x = u(rng);
    switch (t) {
      case EType::kBF16: M.raw[i] = bf16_of(x); M.val[i] = x; break;
      case EType::kF16: M.raw[i] = f16_of(x); M.val[i] = x; break;
      case EType::kTF32: M.raw[i] = f32bits((float)x); M.val[i] = x; break;
      case EType::kE4M3: { int j = ui(rng); M.raw[i] = e4[j]; M.val[i] = e4v[j]; break; }
      case EType::kE5M2: { int j = ui(rng); M.raw[i] = e5[j]; M.val[i] = e5v[j]; break; }
      case EType::kS8: { int y = x * 30; M.raw[i] = (uint8_t)(int8_t)y; M.val[i] = y; break; }
      case EType::kU8: { int y = (x + 4) * 30; M.raw[i] = (uint8_t)y; M.val[i] = y; break; }
      default: break;
    }
  }
  return M;
}

// ISA accumulator figure (m64nNk*): thread t, value index i -> (row, col).
void d_pos(int t, int i, int* row, int* col) {
  int warp = t >> 5, lane = t & 31;
  *row = warp * 16 + (lane >> 2) + ((i & 2) ? 8 : 0);
  *col = (i >> 2) * 8 + (lane & 3) * 2 + (i & 1);
}
double d_get(const Wgmma& w, const std::vector<uint32_t>& d, int t, int i) {
  int nd = d_regs_per_thread(w);
  if (w.d == EType::kF16) return f16_val((d[t * nd + i / 2] >> (16 * (i & 1))) & 0xFFFF);
  if (w.d == EType::kS32) return (int32_t)d[t * nd + i];
  return bitsf32(d[t * nd + i]);
}

// Compares D with ref (64 x N, row-major) through the fragment map. Returns mismatch count.
int compare(const Wgmma& w, const std::vector<uint32_t>& d, const std::vector<double>& ref, bool quiet = false) {
  int bad = 0;
  for (int t = 0; t < 128; ++t)
    for (int i = 0; i < w.n / 2; ++i) {
      int r, c;
      d_pos(t, i, &r, &c);
      double got = d_get(w, d, t, i), want = ref[r * w.n + c];
      if (got != want) {
        if (bad < 3 && !quiet) std::printf("  mismatch t=%d i=%d (r=%d,c=%d): got %g want %g\n", t, i, r, c, got, want);
        ++bad;
      }
    }
  return bad;
}

void gemm_ref(const Mat& A, const Mat& B, int k0, int kn, double sa, double sb, std::vector<double>& ref) {
  for (int m = 0; m < 64; ++m)
    for (int n = 0; n < B.mn; ++n) {
      double s = 0;
      for (int k = k0; k < k0 + kn; ++k) s += A.v(m, k) * sa * B.v(n, k) * sb;
      ref[m * B.mn + n] += s;
    }
}

// Builds the RS-form A registers from the ISA register-fragment figures (written from the figure
// descriptions: tf32 a0..a3 = (g,c),(g+8,c),(g,c+4),(g+8,c+4); 16-bit pairs per register with
// rows g,g+8,g,g+8 and k 2c..2c+1 then +8; 8-bit quads with k 4c..4c+3 then +16).
std::vector<uint32_t> a_regs(const Mat& A, EType t, int k0) {
  std::vector<uint32_t> f(128 * 4, 0);
  for (int th = 0; th < 128; ++th) {
    int warp = th / 32, lane = th % 32, g = lane / 4, c = lane % 4, rb = warp * 16 + g;
    for (int reg = 0; reg < 4; ++reg) {
      int row = rb + ((reg & 1) ? 8 : 0);
      uint32_t v = 0;
      if (ebits(t) == 32) {
        v = A.r(row, k0 + c + ((reg & 2) ? 4 : 0));
      } else if (ebits(t) == 16) {
        int kb = k0 + 2 * c + ((reg & 2) ? 8 : 0);
        v = A.r(row, kb) | (A.r(row, kb + 1) << 16);
      } else {
        int kb = k0 + 4 * c + ((reg & 2) ? 16 : 0);
        for (int b = 0; b < 4; ++b) v |= A.r(row, kb + b) << (8 * b);
      }
      f[th * 4 + reg] = v;
    }
  }
  return f;
}

struct Env {
  std::vector<uint8_t> mem = std::vector<uint8_t>(kSmem, 0);
  std::vector<uint8_t> shadow = std::vector<uint8_t>(kSmem, 0);
  bool use_shadow = false;
  Smem smem() const { return Smem{mem.data(), kSmem, use_shadow ? shadow.data() : nullptr}; }
};

// One full GEMM case: A (64 x Ktile) and B (N x Ktile) placed with the given layout, then
// Ktile/k wgmmas advancing the descriptor start along K as CUTLASS does, accumulating in D.
struct Case {
  const char* name;
  EType ta, tb, td;
  int n, ktile;
  int swz_a, swz_b;
  bool akm, bkm;
  bool a_regs = false;
};

bool run_case(const Case& cs) {
  Env env;
  Wgmma w;
  w.n = cs.n; w.a = cs.ta; w.b = cs.tb; w.d = cs.td;
  w.k = ebits(cs.ta) == 32 ? 8 : ebits(cs.ta) == 16 ? 16 : 32;
  w.a_k_major = cs.akm; w.b_k_major = cs.bkm; w.a_regs = cs.a_regs;
  Mat A = rand_mat(cs.ta, 64, cs.ktile), B = rand_mat(cs.tb, cs.n, cs.ktile);
  const int eb = ebits(cs.ta) / 8;
  // Layout parameters chosen like a real kernel (A at 0, B at 64 KiB).
  auto params = [&](int swz, bool km, int mn, uint32_t& lbo, uint32_t& sbo) {
    int kbytes = cs.ktile * eb;
    if (km && swz == 0) { lbo = 8 * 16; sbo = (kbytes / 16) * 128; }        // K chunks adjacent, then next 8 rows
    else if (km) { lbo = 16; sbo = 8 * swz; }                                 // 8-row atoms back to back
    else if (swz == 0) { sbo = 128; lbo = (mn * eb / 16) * 128; }             // MN chunks adjacent, then next 8 k
    else { sbo = (mn * eb / swz) * 8 * swz; lbo = 8 * swz; }                  // MN atoms adjacent, then next 8 k
  };
  uint32_t alb = 0, asb = 0, blb = 0, bsb = 0;
  const uint32_t abase = 0, bbase = 64 * 1024;
  params(cs.swz_a, cs.akm, 64, alb, asb);
  params(cs.swz_b, cs.bkm, cs.n, blb, bsb);
  if (!cs.a_regs) place(env.mem, A, cs.swz_a, cs.akm, abase, alb, asb);
  place(env.mem, B, cs.swz_b, cs.bkm, bbase, blb, bsb);
  std::vector<uint32_t> d(128 * d_regs_per_thread(w), 0);
  std::vector<double> ref(64 * cs.n, 0.0);
  bool ok = true;
  for (int k0 = 0; k0 < cs.ktile; k0 += w.k) {
    // K advance: K-major -> +k bytes inside the row (no swizzle: whole core matrices, i.e. +2*LBO);
    // MN-major -> whole 8-k groups (no swizzle: +2*LBO, swizzled: +2*SBO).
    auto adv = [&](int swz, bool km, uint32_t lbo, uint32_t sbo) -> uint32_t {
      int steps = k0 / w.k;
      if (km) return swz == 0 ? steps * 2 * lbo : steps * 32;
      return swz == 0 ? steps * 2 * lbo : steps * 2 * sbo;
    };
    uint64_t da = make_desc(abase + adv(cs.swz_a, cs.akm, alb, asb), alb, asb, 0, cs.swz_a);
    uint64_t db = make_desc(bbase + adv(cs.swz_b, cs.bkm, blb, bsb), blb, bsb, 0, cs.swz_b);
    std::vector<uint32_t> af;
    if (cs.a_regs) af = a_regs(A, cs.ta, k0);
    std::string err;
    if (!wgmma(w, da, db, cs.a_regs ? af.data() : nullptr, d.data(), k0 > 0, env.smem(), &err)) {
      std::printf("  %s: wgmma failed: %s\n", cs.name, err.c_str());
      return false;
    }
    gemm_ref(A, B, k0, w.k, 1, 1, ref);
  }
  int bad = compare(w, d, ref);
  if (bad) { std::printf("  %s: %d mismatches\n", cs.name, bad); ok = false; }
  return ok;
}

void test_desc() {
  // Hand-built: start 0x1230 (field 0x123), LBO 0x40 (field 4), SBO 0x400 (field 0x40), base 5,
  // mode 1 (128B): bits = 0x123 | 4<<16 | 0x40<<32 | 5<<49 | 1<<62.
  uint64_t v = 0x123ull | (4ull << 16) | (0x40ull << 32) | (5ull << 49) | (1ull << 62);
  Desc d = decode_desc(v);
  CHECK_EQ(d.start_addr, 0x1230u);
  CHECK_EQ(d.lbo, 0x40u);
  CHECK_EQ(d.sbo, 0x400u);
  CHECK_EQ(d.base_offset, 5u);
  CHECK_EQ(d.swizzle, 128u);
  CHECK_EQ(decode_desc(2ull << 62).swizzle, 64u);
  CHECK_EQ(decode_desc(3ull << 62).swizzle, 32u);
  CHECK_EQ(decode_desc(0).swizzle, 0u);
  // Bits outside the fields (14,15,30,31,46..48,52..61) are ignored.
  Desc z = decode_desc((3ull << 14) | (3ull << 30) | (7ull << 46) | (0x3FFull << 52));
  CHECK_EQ(z.start_addr + z.lbo + z.sbo + z.base_offset + z.swizzle, 0u);

  // element_addr hand cases (bf16):
  // K-major no swizzle, LBO 128, SBO 256: (mn=9,k=10): group 1 -> +256, row 1 -> +16, k byte 20 ->
  // chunk 1 -> +128, +4 => 404.
  Desc n0{0, 128, 256, 0, 0};
  CHECK_EQ(element_addr(n0, 9, 10, 16, true), 404u);
  // K-major 128B at 1024: (mn=3,k=5): row 3 -> +384, k byte 10 in chunk 0 -> phys chunk 0^3=3 ->
  // 1024+384+48+10 = 1466.
  Desc s128{1024, 16, 1024, 0, 128};
  CHECK_EQ(element_addr(s128, 3, 5, 16, true), 1466u);
  // Same with start advanced by 32 (k block 1): k byte 32+10=42, logical chunk 2 -> phys 2^3=1 ->
  // 1024+384+16+10 = 1434.
  Desc s128b{1056, 16, 1024, 0, 128};
  CHECK_EQ(element_addr(s128b, 3, 5, 16, true), 1434u);
  // K-major 64B at 0: (mn=2,k=9): row 2 -> +128, k byte 18 -> chunk 1; phase (128>>7)&3 = 1 ->
  // phys chunk 0 -> 128 + 0 + 2 = 130.
  Desc s64{0, 16, 512, 0, 64};
  CHECK_EQ(element_addr(s64, 2, 9, 16, true), 130u);
  // K-major 32B at 0: (mn=5,k=3): row 5 -> +160; phase bit7 = 1 -> chunk 0 -> 1: 160+16+6 = 182.
  Desc s32{0, 16, 256, 0, 32};
  CHECK_EQ(element_addr(s32, 5, 3, 16, true), 182u);
  // MN-major 128B, LBO 2048 (next 64 MN), SBO 1024 (next 8 k): (mn=70,k=11): atom 1 -> +2048,
  // k group 1 -> +1024, k row 3 -> +384, mn byte 12 -> chunk 0 -> phys 3 -> +48, +12 => 3516.
  Desc m128{0, 2048, 1024, 0, 128};
  CHECK_EQ(element_addr(m128, 70, 11, 16, false), 3516u);
  // MN-major none, SBO 128 (next 8 MN), LBO 1024 (next 8 k): (mn=17,k=9): chunk 2 -> +256, kg 1 ->
  // +1024, k row 1 -> +16, +2 => 1298.
  Desc m0{0, 1024, 128, 0, 0};
  CHECK_EQ(element_addr(m0, 17, 9, 16, false), 1298u);
  // base_offset: 128B pattern starting at 1024+256 (base offset (1280>>7)&7 = 2). Row 0 of the
  // pattern is unswizzled: (mn=0,k=8): byte 16 -> chunk 1 stays 1 -> 1280+16 = 1296.
  Desc bo{1280, 16, 1024, 2, 128};
  CHECK_EQ(element_addr(bo, 0, 8, 16, true), 1296u);
  // Row 1 of that pattern: chunk 1 ^ 1 = 0 -> 1280+128+0 = 1408.
  CHECK_EQ(element_addr(bo, 1, 8, 16, true), 1408u);
}

void test_layouts() {
  // Every swizzle mode x both majors (16-bit), K-major also with several K steps inside the atom.
  const Case cases[] = {
      {"bf16 K/K none n8", EType::kBF16, EType::kBF16, EType::kF32, 8, 16, 0, 0, true, true},
      {"bf16 K/K none n64 K32", EType::kBF16, EType::kBF16, EType::kF32, 64, 32, 0, 0, true, true},
      {"bf16 K/K sw32 n64", EType::kBF16, EType::kBF16, EType::kF32, 64, 16, 32, 32, true, true},
      {"bf16 K/K sw64 n64 K32", EType::kBF16, EType::kBF16, EType::kF32, 64, 32, 64, 64, true, true},
      {"bf16 K/K sw128 n128 K64", EType::kBF16, EType::kBF16, EType::kF32, 128, 64, 128, 128, true, true},
      {"f16 MN/MN none n32 K32", EType::kF16, EType::kF16, EType::kF32, 32, 32, 0, 0, false, false},
      {"f16 MN/MN sw32 n64", EType::kF16, EType::kF16, EType::kF32, 64, 16, 32, 32, false, false},
      {"f16 MN/MN sw64 n64 K32", EType::kF16, EType::kF16, EType::kF32, 64, 32, 64, 64, false, false},
      {"f16 MN/MN sw128 n128 K32", EType::kF16, EType::kF16, EType::kF32, 128, 32, 128, 128, false, false},
      {"bf16 K/MN sw128/sw64 n64", EType::kBF16, EType::kBF16, EType::kF32, 64, 16, 128, 64, true, false},
      {"bf16 MN/K none/sw32 n16", EType::kBF16, EType::kBF16, EType::kF32, 16, 16, 0, 32, false, true},
      {"bf16 K/K sw128 n256 K64", EType::kBF16, EType::kBF16, EType::kF32, 256, 64, 128, 128, true, true},
      {"f16 acc f16 K/MN sw128 n64", EType::kF16, EType::kF16, EType::kF16, 64, 16, 128, 128, true, false},
      {"e4m3 x e5m2 sw128 n64 K64", EType::kE4M3, EType::kE5M2, EType::kF32, 64, 64, 128, 128, true, true},
      {"e5m2 x e4m3 f16 acc none n24", EType::kE5M2, EType::kE4M3, EType::kF16, 24, 32, 0, 0, true, true},
      {"tf32 sw128 n32 K32", EType::kTF32, EType::kTF32, EType::kF32, 32, 32, 128, 128, true, true},
      {"tf32 none n8", EType::kTF32, EType::kTF32, EType::kF32, 8, 8, 0, 0, true, true},
      {"tf32 sw32 n8", EType::kTF32, EType::kTF32, EType::kF32, 8, 8, 32, 32, true, true},
      {"s8 x u8 sw64 n48", EType::kS8, EType::kU8, EType::kS32, 48, 64, 64, 64, true, true},
      {"RS bf16 sw128 n64 K64", EType::kBF16, EType::kBF16, EType::kF32, 64, 64, 0, 128, true, true, true},
      {"RS f16->f16 MN-B n32", EType::kF16, EType::kF16, EType::kF16, 32, 16, 0, 64, true, false, true},
      {"RS e4m3 n16 K64", EType::kE4M3, EType::kE4M3, EType::kF32, 16, 64, 0, 128, true, true, true},
      {"RS tf32 n24 K16", EType::kTF32, EType::kTF32, EType::kF32, 24, 16, 0, 64, true, true, true},
      {"RS u8 x s8 n32", EType::kU8, EType::kS8, EType::kS32, 32, 32, 0, 32, true, true, true},
  };
  for (const Case& c : cases) {
    bool ok = run_case(c);
    if (!ok) std::printf("FAIL case %s\n", c.name);
    CHECK(ok);
  }
}

// Hand-worked fragment positions: A[m][0] = m, A[m][1] = 1, B[n][0] = 256, B[n][1] = n, rest 0,
// so D[m][n] = 256*m + n. From the ISA accumulator figure: thread 37 (warp 1, lane 5: group 1,
// thread-in-group 1) holds d0 = (17,2), d1 = (17,3), d2 = (25,2), d3 = (25,3), d4 = (17,10).
void test_fragment_hand() {
  Env env;
  Wgmma w;
  w.n = 16;
  Mat A, B;
  A.mn = 64; A.k = 16; A.eb = 2; A.raw.assign(64 * 16, 0); A.val.assign(64 * 16, 0);
  B.mn = 16; B.k = 16; B.eb = 2; B.raw.assign(16 * 16, 0); B.val.assign(16 * 16, 0);
  for (int m = 0; m < 64; ++m) { A.raw[m * 16] = bf16_of(m); A.raw[m * 16 + 1] = bf16_of(1); }
  for (int n = 0; n < 16; ++n) { B.raw[n * 16] = bf16_of(256); B.raw[n * 16 + 1] = bf16_of(n); }
  place(env.mem, A, 0, true, 0, 128, 256);
  place(env.mem, B, 0, true, 8192, 128, 256);
  std::vector<uint32_t> d(128 * 8, 0xFFFFFFFF);
  std::string err;
  bool ok = wgmma(w, make_desc(0, 128, 256, 0, 0), make_desc(8192, 128, 256, 0, 0), nullptr, d.data(),
                  false, env.smem(), &err);
  CHECK(ok);
  CHECK_EQ(bitsf32(d[37 * 8 + 0]), 256.0f * 17 + 2);
  CHECK_EQ(bitsf32(d[37 * 8 + 1]), 256.0f * 17 + 3);
  CHECK_EQ(bitsf32(d[37 * 8 + 2]), 256.0f * 25 + 2);
  CHECK_EQ(bitsf32(d[37 * 8 + 3]), 256.0f * 25 + 3);
  CHECK_EQ(bitsf32(d[37 * 8 + 4]), 256.0f * 17 + 10);
  // Thread 127 (warp 3, lane 31: group 7, tig 3): d7 = (63 + 8? no: 48+7+8 = 63, col 8+6+1 = 15).
  CHECK_EQ(bitsf32(d[127 * 8 + 7]), 256.0f * 63 + 15);
  // Thread 0 d0 = (0,0) = 0.
  CHECK_EQ(bitsf32(d[0]), 0.0f);

  // Same with f16 accumulators: 4 regs/thread, d_i packed in reg i/2 (low half = even i).
  // Values up to 256*63+15 = 16143 exceed f16's exact-integer range (2048), so use A[m][0] = m/8
  // style small values instead: A[m][0] = 1, B[n][0] = n -> D = n, and A[m][1] = m (B[n][1] = 32).
  Wgmma wh = w;
  wh.a = wh.b = EType::kF16; wh.d = EType::kF16;
  for (int m = 0; m < 64; ++m) { A.raw[m * 16] = f16_of(1); A.raw[m * 16 + 1] = f16_of(m); }
  for (int n = 0; n < 16; ++n) { B.raw[n * 16] = f16_of(n); B.raw[n * 16 + 1] = f16_of(32); }
  place(env.mem, A, 0, true, 0, 128, 256);
  place(env.mem, B, 0, true, 8192, 128, 256);
  std::vector<uint32_t> dh(128 * 4, 0);
  ok = wgmma(wh, make_desc(0, 128, 256, 0, 0), make_desc(8192, 128, 256, 0, 0), nullptr, dh.data(), false,
             env.smem(), &err);
  CHECK(ok);
  // Thread 37: reg0 = {d0=(17,2), d1=(17,3)} = {32*17+2, 32*17+3} = {546, 547}; reg2 = {d4=(17,10), d5=(17,11)}.
  CHECK_EQ(dh[37 * 4 + 0], (uint32_t)f16_of(546) | ((uint32_t)f16_of(547) << 16));
  CHECK_EQ(dh[37 * 4 + 1], (uint32_t)f16_of(32 * 25 + 2) | ((uint32_t)f16_of(32 * 25 + 3) << 16));
  CHECK_EQ(dh[37 * 4 + 2], (uint32_t)f16_of(32 * 17 + 10) | ((uint32_t)f16_of(32 * 17 + 11) << 16));
}

// Numerics: scale-a/-b = -1, scale-d 0/1, f16 accumulator rounding, f32 single rounding.
void test_numerics() {
  Env env;
  Wgmma w;
  w.n = 8;
  Mat A = rand_mat(EType::kBF16, 64, 16), B = rand_mat(EType::kBF16, 8, 16);
  place(env.mem, A, 128, true, 0, 16, 1024);
  place(env.mem, B, 128, true, 16384, 16, 1024);
  uint64_t da = make_desc(0, 16, 1024, 0, 128), db = make_desc(16384, 16, 1024, 0, 128);
  std::string err;
  for (int sa : {1, -1})
    for (int sb : {1, -1}) {
      w.scale_a = sa; w.scale_b = sb;
      // scale_d = 0: D starts as garbage (NaN bits) and must be ignored.
      std::vector<uint32_t> d(128 * 4, 0x7FC00001u);
      CHECK(wgmma(w, da, db, nullptr, d.data(), false, env.smem(), &err));
      std::vector<double> ref(64 * 8, 0.0);
      gemm_ref(A, B, 0, 16, sa, sb, ref);
      CHECK_EQ(compare(w, d, ref), 0);
      // scale_d = 1: adds onto the previous D.
      CHECK(wgmma(w, da, db, nullptr, d.data(), true, env.smem(), &err));
      gemm_ref(A, B, 0, 16, sa, sb, ref);
      CHECK_EQ(compare(w, d, ref), 0);
    }

  // f32: sum in double then one rounding. A[m][k] = 1 (k < 2), B[n][0] = 2^24, B[n][1] = 1, D = 0:
  // exact sum 2^24+1 rounds (ties to even) to 2^24. With D = 1 added: 2^24+2 exactly.
  {
    Mat a1, b1;
    a1.mn = 64; a1.k = 16; a1.eb = 2; a1.raw.assign(64 * 16, 0); a1.val.assign(64 * 16, 0);
    b1.mn = 8; b1.k = 16; b1.eb = 2; b1.raw.assign(8 * 16, 0); b1.val.assign(8 * 16, 0);
    for (int m = 0; m < 64; ++m) a1.raw[m * 16] = a1.raw[m * 16 + 1] = bf16_of(1);
    for (int n = 0; n < 8; ++n) { b1.raw[n * 16] = bf16_of(16777216.0); b1.raw[n * 16 + 1] = bf16_of(1); }
    place(env.mem, a1, 0, true, 32768, 128, 256);
    place(env.mem, b1, 0, true, 49152, 128, 256);
    Wgmma w1;
    w1.n = 8;
    std::vector<uint32_t> d(128 * 4, f32bits(0.0f));
    CHECK(wgmma(w1, make_desc(32768, 128, 256, 0, 0), make_desc(49152, 128, 256, 0, 0), nullptr, d.data(), true,
                env.smem(), &err));
    CHECK_EQ(bitsf32(d[5]), 16777216.0f);
    std::fill(d.begin(), d.end(), f32bits(1.0f));
    CHECK(wgmma(w1, make_desc(32768, 128, 256, 0, 0), make_desc(49152, 128, 256, 0, 0), nullptr, d.data(), true,
                env.smem(), &err));
    CHECK_EQ(bitsf32(d[5]), 16777218.0f);  // 2^24+1+1: one rounding of the exact value

    // f16 accumulator (f16 inputs): D = 1, products 2^-11 and 2^-12 from k=0,1 (A = 1,
    // B[n][0] = 2^-11, B[n][1] = 2^-12): 1 + 3*2^-12 lies between 1 and 1+2^-10 (f16 ulp at 1),
    // above the midpoint 1+2^-11 -> rounds up to 1+2^-10 = 0x3C01. With only 2^-11 (tie) ->
    // ties-to-even -> 1.0 = 0x3C00.
    Wgmma wh;
    wh.n = 8; wh.a = wh.b = EType::kF16; wh.d = EType::kF16;
    for (int m = 0; m < 64; ++m) a1.raw[m * 16] = a1.raw[m * 16 + 1] = f16_of(1);
    for (int n = 0; n < 8; ++n) { b1.raw[n * 16] = f16_of(std::ldexp(1.0, -11)); b1.raw[n * 16 + 1] = f16_of(std::ldexp(1.0, -12)); }
    place(env.mem, a1, 0, true, 32768, 128, 256);
    place(env.mem, b1, 0, true, 49152, 128, 256);
    std::vector<uint32_t> dh(128 * 2, 0x3C003C00u);
    CHECK(wgmma(wh, make_desc(32768, 128, 256, 0, 0), make_desc(49152, 128, 256, 0, 0), nullptr, dh.data(), true,
                env.smem(), &err));
    CHECK_EQ(dh[0], 0x3C013C01u);
    for (int n = 0; n < 8; ++n) b1.raw[n * 16 + 1] = 0;
    place(env.mem, b1, 0, true, 49152, 128, 256);
    std::fill(dh.begin(), dh.end(), 0x3C003C00u);
    CHECK(wgmma(wh, make_desc(32768, 128, 256, 0, 0), make_desc(49152, 128, 256, 0, 0), nullptr, dh.data(), true,
                env.smem(), &err));
    CHECK_EQ(dh[0], 0x3C003C00u);
    // f16 overflow: 65504 + 32 = 65536 exactly, above the largest finite f16 -> +inf (0x7C00).
    for (int n = 0; n < 8; ++n) b1.raw[n * 16] = f16_of(32);
    place(env.mem, b1, 0, true, 49152, 128, 256);
    std::fill(dh.begin(), dh.end(), (uint32_t)f16_of(65504) * 0x10001u);
    CHECK(wgmma(wh, make_desc(32768, 128, 256, 0, 0), make_desc(49152, 128, 256, 0, 0), nullptr, dh.data(), true,
                env.smem(), &err));
    CHECK_EQ(dh[0], 0x7C007C00u);

    // tf32: the low 13 mantissa bits of the operand are ignored: 1 + 2^-20 (bit 3) reads as 1.
    Wgmma wt;
    wt.n = 8; wt.k = 8; wt.a = wt.b = EType::kTF32;
    Mat at, bt;
    at.mn = 64; at.k = 8; at.eb = 4; at.raw.assign(64 * 8, 0); at.val.assign(64 * 8, 0);
    bt.mn = 8; bt.k = 8; bt.eb = 4; bt.raw.assign(8 * 8, 0); bt.val.assign(8 * 8, 0);
    for (int m = 0; m < 64; ++m) at.raw[m * 8] = f32bits(1.0f + std::ldexp(1.0f, -20));
    for (int n = 0; n < 8; ++n) bt.raw[n * 8] = f32bits(3.0f);
    place(env.mem, at, 0, true, 32768, 128, 256);
    place(env.mem, bt, 0, true, 49152, 128, 256);
    std::fill(d.begin(), d.end(), 0u);
    CHECK(wgmma(wt, make_desc(32768, 128, 256, 0, 0), make_desc(49152, 128, 256, 0, 0), nullptr, d.data(), false,
                env.smem(), &err));
    CHECK_EQ(bitsf32(d[0]), 3.0f);

    // s32 accumulators wrap (no .satfinite): D = INT32_MAX, A = 1, B[n][0] = 1 -> INT32_MIN.
    Wgmma wi;
    wi.n = 8; wi.k = 32; wi.a = wi.b = EType::kS8; wi.d = EType::kS32;
    Mat ai, bi;
    ai.mn = 64; ai.k = 32; ai.eb = 1; ai.raw.assign(64 * 32, 0); ai.val.assign(64 * 32, 0);
    bi.mn = 8; bi.k = 32; bi.eb = 1; bi.raw.assign(8 * 32, 0); bi.val.assign(8 * 32, 0);
    for (int m = 0; m < 64; ++m) ai.raw[m * 32 + 31] = 1;
    for (int n = 0; n < 8; ++n) bi.raw[n * 32 + 31] = 1;
    place(env.mem, ai, 0, true, 32768, 128, 256);
    place(env.mem, bi, 0, true, 49152, 128, 256);
    std::fill(d.begin(), d.end(), 0x7FFFFFFFu);
    CHECK(wgmma(wi, make_desc(32768, 128, 256, 0, 0), make_desc(49152, 128, 256, 0, 0), nullptr, d.data(), true,
                env.smem(), &err));
    CHECK_EQ(d[3], 0x80000000u);
  }
}

// base_offset != 0: A laid out 128B-swizzled with its pattern starting at 1024*4 + 128*3 (not on
// a 1024-byte boundary); per the ISA the descriptor then carries base offset (start >> 7) & 7 = 3.
void test_base_offset() {
  Env env;
  Wgmma w;
  w.n = 16;
  Mat A = rand_mat(EType::kBF16, 64, 64), B = rand_mat(EType::kBF16, 16, 64);
  const uint32_t pa = 4096 + 384;
  place(env.mem, A, 128, true, pa, 16, 1024);
  std::vector<uint32_t> d(128 * 8, 0);
  std::vector<double> ref(64 * 16, 0.0);
  std::string err;
  bool ok = true;
  // B with K=64 bf16 (128 bytes) in a 64B-swizzled layout needs two K-atoms; place the two K
  // halves as separate operands at +0 and +8192.
  Mat B0 = B, B1 = B;
  B0.k = B1.k = 32;
  B0.raw.resize(16 * 32); B1.raw.resize(16 * 32); B0.val.resize(16 * 32); B1.val.resize(16 * 32);
  for (int n = 0; n < 16; ++n)
    for (int k = 0; k < 32; ++k) {
      B0.raw[n * 32 + k] = B.r(n, k); B0.val[n * 32 + k] = B.v(n, k);
      B1.raw[n * 32 + k] = B.r(n, k + 32); B1.val[n * 32 + k] = B.v(n, k + 32);
    }
  const uint32_t pb0 = 40960 + 256, pb1 = 40960 + 8192 + 256;
  place(env.mem, B0, 64, true, pb0, 16, 512);
  place(env.mem, B1, 64, true, pb1, 16, 512);
  for (int ks = 0; ks < 4; ++ks) {
    uint64_t da = make_desc(pa + 32 * ks, 16, 1024, 3, 128);
    uint64_t db = make_desc((ks < 2 ? pb0 : pb1) + 32 * (ks % 2), 16, 512, 2, 64);
    ok &= wgmma(w, da, db, nullptr, d.data(), ks > 0, env.smem(), &err);
    gemm_ref(A, B, 16 * ks, 16, 1, 1, ref);
  }
  CHECK(ok);
  CHECK_EQ(compare(w, d, ref), 0);
  // With base offset 0 the same bytes decode differently (pattern mis-phased): result must differ.
  std::fill(d.begin(), d.end(), 0u);
  CHECK(wgmma(w, make_desc(pa, 16, 1024, 0, 128), make_desc(pb0, 16, 512, 0, 64), nullptr, d.data(), false,
              env.smem(), &err));
  std::vector<double> ref0(64 * 16, 0.0);
  gemm_ref(A, B, 0, 16, 1, 1, ref0);
  CHECK(compare(w, d, ref0, true) > 0);
}

void test_errors() {
  Env env;
  Wgmma w;
  w.n = 8;
  std::string err;
  std::vector<uint32_t> d(128 * 4, 0);
  // B starting 64 bytes before the end of shared memory: its second core matrix row is outside.
  uint64_t da = make_desc(0, 128, 256, 0, 0);
  uint64_t db = make_desc(kSmem - 64, 128, 256, 0, 0);
  CHECK(!wgmma(w, da, db, nullptr, d.data(), false, env.smem(), &err));
  CHECK(err.find("operand B") != std::string::npos);
  CHECK(err.find("outside") != std::string::npos);
  // Shadowed byte inside A: element (row 9, k 10) of the no-swizzle layout at 404 (see test_desc).
  env.use_shadow = true;
  env.shadow[405] = 2;
  err.clear();
  CHECK(!wgmma(w, da, make_desc(8192, 128, 256, 0, 0), nullptr, d.data(), false, env.smem(), &err));
  CHECK(err.find("operand A") != std::string::npos);
  CHECK(err.find("row=9,k=10") != std::string::npos);
  CHECK(err.find("0x195") != std::string::npos);
  CHECK(err.find("shadow is 2") != std::string::npos);
  env.shadow[405] = 0;
  CHECK(wgmma(w, da, make_desc(8192, 128, 256, 0, 0), nullptr, d.data(), false, env.smem(), &err));
  // Shape / type checks.
  Wgmma bad = w;
  bad.n = 12;
  CHECK(!wgmma(bad, da, da, nullptr, d.data(), false, env.smem(), &err));
  bad = w; bad.k = 8;
  CHECK(!wgmma(bad, da, da, nullptr, d.data(), false, env.smem(), &err));
  bad = w; bad.a = EType::kE4M3; bad.b = EType::kE4M3; bad.k = 32; bad.b_k_major = false;  // no trans for fp8
  CHECK(!wgmma(bad, da, da, nullptr, d.data(), false, env.smem(), &err));
  bad = w; bad.d = EType::kF16;  // bf16 has only f32 accumulators
  CHECK(!wgmma(bad, da, da, nullptr, d.data(), false, env.smem(), &err));
  bad = w; bad.a = bad.b = EType::kS8; bad.d = EType::kS32; bad.k = 32; bad.n = 40;  // int n: 8..32 then x16
  CHECK(!wgmma(bad, da, da, nullptr, d.data(), false, env.smem(), &err));
  bad.n = 48;
  CHECK(wgmma(bad, da, da, nullptr, std::vector<uint32_t>(128 * 24).data(), false, env.smem(), &err));
}

void test_perf() {
  Env env;
  Wgmma w;
  w.n = 256;
  Mat A = rand_mat(EType::kBF16, 64, 16), B = rand_mat(EType::kBF16, 256, 16);
  place(env.mem, A, 128, true, 0, 16, 1024);
  place(env.mem, B, 128, true, 65536, 16, 1024);
  std::vector<uint32_t> d(128 * 128, 0);
  std::string err;
  const int iters = 200;
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i)
    wgmma(w, make_desc(0, 16, 1024, 0, 128), make_desc(65536, 16, 1024, 0, 128), nullptr, d.data(), true,
          env.smem(), &err);
  double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters;
  std::printf("m64n256k16 bf16: %.1f us per wgmma\n", us);
  CHECK(us < 200);  // generous bound for slow/loaded CI hosts; target is < ~50 us
}

// ---- ldmatrix / stmatrix ----
// ISA m8n8 fragment figure: lane l holds row l/4, columns 2*(l%4), 2*(l%4)+1 of each matrix;
// with .trans it holds column... i.e. elements (2*(l%4), l/4) and (2*(l%4)+1, l/4).
void test_ldst_matrix() {
  Env env;
  // Four 8x8 b16 matrices, each row placed at a scattered 16-byte-aligned address.
  // Element (j, r, c) = 0x1000*j + 0x100*r + c (hand-readable).
  uint32_t rows[32];
  for (int i = 0; i < 32; ++i) rows[i] = 4096 + ((i * 7) % 32) * 48;  // distinct, 16-aligned
  for (int j = 0; j < 4; ++j)
    for (int r = 0; r < 8; ++r)
      for (int c = 0; c < 8; ++c) put_bytes(env.mem, rows[8 * j + r] + 2 * c, 0x1000 * j + 0x100 * r + c, 2);
  for (int num : {1, 2, 4})
    for (bool tr : {false, true}) {
      uint32_t out[128];
      std::memset(out, 0, sizeof out);
      std::string err;
      CHECK(ldmatrix(num, tr, rows, out, env.smem(), &err));
      int bad = 0;
      for (int l = 0; l < 32; ++l)
        for (int j = 0; j < num; ++j) {
          uint32_t lo, hi;
          if (!tr) { lo = 0x1000 * j + 0x100 * (l / 4) + 2 * (l % 4); hi = lo + 1; }
          else { lo = 0x1000 * j + 0x100 * (2 * (l % 4)) + l / 4; hi = lo + 0x100; }
          if (out[l * 4 + j] != (lo | (hi << 16))) ++bad;
        }
      CHECK_EQ(bad, 0);
      // Round trip: stmatrix with the same mode into a fresh buffer reproduces the rows.
      std::vector<uint8_t> mem2(kSmem, 0);
      CHECK(stmatrix(num, tr, rows, out, mem2.data(), kSmem, &err));
      int diff = 0;
      for (int i = 0; i < 8 * num; ++i)
        diff += std::memcmp(&mem2[rows[i]], &env.mem[rows[i]], 16) != 0;
      CHECK_EQ(diff, 0);
    }
  // Hand cases: lane 13 (row 3, cols 2,3), non-trans x1: 0x0302 | 0x0303 << 16.
  uint32_t out[128];
  std::string err;
  CHECK(ldmatrix(1, false, rows, out, env.smem(), &err));
  CHECK_EQ(out[13 * 4], 0x03030302u);
  // .trans x2, lane 13, matrix 1: elements (row 2, col 3), (row 3, col 3) of matrix 1.
  CHECK(ldmatrix(2, true, rows, out, env.smem(), &err));
  CHECK_EQ(out[13 * 4 + 1], 0x13031203u);
  // stmatrix .trans: lane l's register low half goes to (2*(l%4), l/4).
  uint32_t in[128] = {};
  in[5 * 4] = 0xBBBBAAAAu;  // lane 5: row 1, c 1 -> (2,1) = AAAA, (3,1) = BBBB
  std::vector<uint8_t> mem3(kSmem, 0);
  CHECK(stmatrix(1, true, rows, in, mem3.data(), kSmem, &err));
  CHECK_EQ(mem3[rows[2] + 2] | (mem3[rows[2] + 3] << 8), 0xAAAA);
  CHECK_EQ(mem3[rows[3] + 2] | (mem3[rows[3] + 3] << 8), 0xBBBB);
  // Errors: misaligned row, out of bounds, shadowed byte; only lanes < 8*num are checked.
  uint32_t r2[32];
  std::memcpy(r2, rows, sizeof r2);
  r2[20] = 8;  // misaligned, but lane 20 unused by .x2
  CHECK(ldmatrix(2, false, r2, out, env.smem(), &err));
  CHECK(!ldmatrix(4, false, r2, out, env.smem(), &err));
  CHECK(err.find("aligned") != std::string::npos);
  r2[20] = kSmem - 16;
  CHECK(ldmatrix(4, false, r2, out, env.smem(), &err));
  r2[20] = kSmem;
  CHECK(!ldmatrix(4, false, r2, out, env.smem(), &err));
  CHECK(!stmatrix(4, false, r2, in, mem3.data(), kSmem, &err));
  env.use_shadow = true;
  env.shadow[rows[3] + 5] = 1;
  CHECK(!ldmatrix(1, false, rows, out, env.smem(), &err));
  CHECK(err.find("shadow") != std::string::npos);
  CHECK(!ldmatrix(3, false, rows, out, env.smem(), &err));
}

// FP8 (k32) into f32: the H200-measured accumulation (tensor_core.cpp, fp8_chunk_sum): per
// instruction, the 32 products and the old accumulator are aligned to the largest exponent and
// truncated toward zero to 13 fractional bits of it. Expected values worked by hand from that rule.
void test_fp8_accumulation() {
  Env env;
  Wgmma w;
  w.n = 8; w.a = EType::kE4M3; w.b = EType::kE4M3; w.d = EType::kF32; w.k = 32;
  w.a_k_major = true; w.b_k_major = true;
  // e4m3 codes: 1 = 0x38, 2^-5 = 0x10, 2^-6 = 0x08, 2^-7 = 0x04 (subnormal 4/8 * 2^-6),
  // 2^-9 = 0x01, 3*2^-9 = 0x03, -3*2^-9 = 0x83.
  Mat A, B;
  A.mn = 64; B.mn = 8; A.k = B.k = 64; A.eb = B.eb = 1;
  A.raw.assign(64 * 64, 0); A.val.assign(64 * 64, 0);
  B.raw.assign(8 * 64, 0); B.val.assign(8 * 64, 0);
  for (int n = 0; n < 8; ++n)  // every column: B[k] = 1 at k 0 and 32, 2^-5 at k 1, else 2^-7
    for (int k = 0; k < 64; ++k) B.raw[n * 64 + k] = (k % 32 == 0) ? 0x38 : k == 1 ? 0x10 : 0x04;
  auto a = [&](int m, int k, uint32_t code) { A.raw[m * 64 + k] = code; };
  // row 0: 1 + 31 products 2^-14 in chunk 1 (1 * 2^-5 is 2^-5: use 2^-9 there for 2^-14), then
  //        31 more 2^-14 against an accumulator of 1 in chunk 2.
  a(0, 0, 0x38); a(0, 1, 0x01);
  for (int k = 2; k < 32; ++k) a(0, k, 0x04);
  for (int k = 33; k < 64; ++k) a(0, k, 0x04);
  // row 1: 1 + 3*2^-14 (one product) -> 1 + 2^-13.
  a(1, 0, 0x38); a(1, 1, 0x03);
  // row 2: 1 + 30 products 2^-13 (exactly representable at 13 bits): kept.
  a(2, 0, 0x38);
  for (int k = 2; k < 32; ++k) a(2, k, 0x08);
  // row 3: 31 * 2^-14 alone (kept: aligned to 2^-14), then 1 in chunk 2: 15.5 * 2^-13 -> 15.
  a(3, 1, 0x01);
  for (int k = 2; k < 32; ++k) a(3, k, 0x04);
  a(3, 32, 0x38);
  // row 4: 1 - 3*2^-14 -> 1 - 2^-13 (toward zero, not 1 - 2^-12).
  a(4, 0, 0x38); a(4, 1, 0x83);
  const double e13 = std::ldexp(1.0, -13), e14 = std::ldexp(1.0, -14);
  const double after1[5] = {1.0, 1.0 + e13, 1.0 + 30 * e13, 31 * e14, 1.0 - e13};
  const double after2[5] = {1.0, 1.0 + e13, 1.0 + 30 * e13, 1.0 + 15 * e13, 1.0 - e13};
  // K-major, no swizzle: K chunks of 16 B at +LBO 128, 8-row groups at +SBO 512 (4 chunks of K).
  place(env.mem, A, 0, true, 0, 128, 512);
  place(env.mem, B, 0, true, 64 * 1024, 128, 512);
  std::vector<uint32_t> d(128 * d_regs_per_thread(w), 0);
  for (int chunk = 0; chunk < 2; ++chunk) {
    std::string err;
    CHECK(wgmma(w, make_desc(chunk * 256, 128, 512, 0, 0), make_desc(64 * 1024 + chunk * 256, 128, 512, 0, 0),
                nullptr, d.data(), chunk > 0, env.smem(), &err));
    const double* want = chunk ? after2 : after1;
    for (int t = 0; t < 128; ++t)
      for (int i = 0; i < w.n / 2; ++i) {
        int r, c;
        d_pos(t, i, &r, &c);
        const double got = d_get(w, d, t, i), expect = r < 5 ? want[r] : 0.0;
        if (got != expect) std::printf("  fp8 chunk %d row %d col %d: got %.17g want %.17g\n", chunk, r, c, got, expect);
        CHECK(got == expect);
      }
  }
}

}  // namespace

int main() {
  test_desc();
  test_layouts();
  test_fragment_hand();
  test_numerics();
  test_fp8_accumulation();
  test_base_offset();
  test_errors();
  test_ldst_matrix();
  test_perf();
  return hsim_test::finish();
}
