// Warp collectives, atomics, loads/stores and mov pack/unpack. `warp FAMILY`.
// Per-lane results are written to global memory and compared on the host with formulas written from
// the PTX ISA text (sections cited); single-thread sequences use hand-worked literals.
#include "isa.h"

__device__ __forceinline__ uint32_t laneid() { uint32_t l; asm volatile("mov.u32 %0, %%laneid;" : "=r"(l)); return l; }

// ---- shfl.sync: PTX ISA 9.7.9.6 (shfl.sync). c = segmask << 8 | clamp;
//   mask = c[12:8]; maxLane = (lane & mask) | (c[4:0] & ~mask); minLane = lane & mask;
//   up: j = lane - b, p = j >= maxLane;  down: j = lane + b, p = j <= maxLane;
//   bfly: j = lane ^ b, p = j <= maxLane; idx: j = minLane | (b[4:0] & ~mask), p = j <= maxLane;
//   if (!p) j = lane;  d = a[j]. ----
struct ShflCase { int mode; uint32_t b, c; const char* name; };
static const ShflCase kShfl[] = {
    {0, 3, 0x0000, "up 3"},          {1, 5, 0x001f, "down 5"},       {2, 6, 0x001f, "bfly 6"},
    {3, 7, 0x001f, "idx 7"},         {0, 2, 0x1800, "up 2 seg8"},    {1, 3, 0x1807, "down 3 seg8"},
    {3, 2, 0x1807, "idx 2 seg8"},    {2, 16, 0x001f, "bfly 16"},     {3, 33, 0x001f, "idx 33 (b&31)"},
    {2, 4, 0x1c03, "bfly 4 seg4"},   {1, 1, 0x000f, "down 1 clamp15"}, {3, 20, 0x0010, "idx 20 clamp16"}};
constexpr int kNShfl = sizeof kShfl / sizeof kShfl[0];
__global__ void k_shfl(uint32_t* out) {
  uint32_t lane = laneid(), a = 100 + lane * 7;
  uint32_t d, p;
#define SHFL(mode, b, c) asm volatile("{.reg .pred q; shfl.sync." mode ".b32 %0|q, %2, %3, %4, 0xffffffff; selp.u32 %1, 1, 0, q;}" \
                                       : "=r"(d), "=r"(p) : "r"(a), "r"(b), "r"(c))
#define ONE(i, mode, b, c) { SHFL(mode, b, c); out[(i) * 64 + lane] = d; out[(i) * 64 + 32 + lane] = p; }
  ONE(0, "up", 3u, 0x0000u); ONE(1, "down", 5u, 0x001fu); ONE(2, "bfly", 6u, 0x001fu); ONE(3, "idx", 7u, 0x001fu);
  ONE(4, "up", 2u, 0x1800u); ONE(5, "down", 3u, 0x1807u); ONE(6, "idx", 2u, 0x1807u); ONE(7, "bfly", 16u, 0x001fu);
  ONE(8, "idx", 33u, 0x001fu); ONE(9, "bfly", 4u, 0x1c03u); ONE(10, "down", 1u, 0x000fu); ONE(11, "idx", 20u, 0x0010u);
}
static void shfl() {
  uint32_t* dv; CK(cudaMalloc(&dv, kNShfl * 64 * 4));
  k_shfl<<<1, 32>>>(dv);
  std::vector<uint32_t> h(kNShfl * 64);
  CK(cudaMemcpy(h.data(), dv, h.size() * 4, cudaMemcpyDeviceToHost));
  char nm[64];
  for (int i = 0; i < kNShfl; ++i) {
    const ShflCase& s = kShfl[i];
    for (uint32_t lane = 0; lane < 32; ++lane) {
      uint32_t mask = (s.c >> 8) & 0x1f, maxL = (lane & mask) | (s.c & 0x1f & ~mask), minL = lane & mask;
      int32_t j; bool p;
      switch (s.mode) {
        case 0: j = (int32_t)lane - (int32_t)s.b; p = j >= (int32_t)maxL; break;
        case 1: j = lane + s.b; p = j <= (int32_t)maxL; break;
        case 2: j = lane ^ s.b; p = j <= (int32_t)maxL; break;
        default: j = minL | (s.b & 0x1f & ~mask); p = j <= (int32_t)maxL; break;
      }
      if (!p) j = lane;
      snprintf(nm, sizeof nm, "%s lane%u d", s.name, lane);
      hchk(nm, h[i * 64 + lane], 100 + j * 7);
      snprintf(nm, sizeof nm, "%s lane%u p", s.name, lane);
      hchk(nm, h[i * 64 + 32 + lane], p);
    }
  }
}

// ---- vote.sync (PTX ISA 9.7.13.x vote.sync: .all/.any/.uni over the threads in membermask, .ballot
// returns bit i = predicate of lane i for lanes in membermask, 0 for others), match.sync (PTX ISA
// 9.7.13.x: .any -> mask of lanes in membermask holding the same value; .all -> membermask and p=1 if
// all hold the same value, else 0 and p=0), redux.sync (PTX ISA 9.7.13.x: reduction over membermask),
// elect.sync (exactly one leader in membermask; d = its laneid in every lane), activemask (mask of
// active lanes; exited lanes are not active). out layout per lane, 16 words each. ----
__global__ void k_warpcoll(uint32_t* out) {
  uint32_t lane = laneid();
  uint32_t* o = out + lane * 16;
  uint32_t q1 = (lane % 3) == 0, q_all = 1, r;
#define VOTE(mode, q, mask) ({ uint32_t v_; asm volatile("{.reg .pred a, b; setp.ne.u32 a, %1, 0; vote.sync." mode ".pred b, a, " #mask "; selp.u32 %0, 1, 0, b;}" : "=r"(v_) : "r"((uint32_t)(q))); v_; })
  o[0] = VOTE("all", q1, 0xffffffff);
  o[1] = VOTE("any", q1, 0xffffffff);
  o[2] = VOTE("uni", q1, 0xffffffff);
  o[3] = VOTE("all", q_all, 0xffffffff) | VOTE("uni", q_all, 0xffffffff) << 1 | VOTE("uni", !q_all, 0xffffffff) << 2;
  asm volatile("{.reg .pred a; setp.ne.u32 a, %1, 0; vote.sync.ballot.b32 %0, a, 0xffffffff;}" : "=r"(r) : "r"(q1));
  o[4] = r;
  o[5] = 0xdead; o[6] = 0xdead;   // partial-membermask votes: see k_partial
  asm volatile("match.any.sync.b32 %0, %1, 0xffffffff;" : "=r"(r) : "r"(lane % 4));
  o[7] = r;
  uint32_t pm;
  asm volatile("{.reg .pred p; match.all.sync.b32 %0|p, %2, 0xffffffff; selp.u32 %1, 1, 0, p;}" : "=r"(r), "=r"(pm) : "r"(lane % 4));
  o[8] = r | pm << 31;  // r must be 0 here, so bit 31 carries p
  asm volatile("{.reg .pred p; match.all.sync.b32 %0|p, %2, 0xffffffff; selp.u32 %1, 1, 0, p;}" : "=r"(r), "=r"(pm) : "r"(42u));
  o[9] = r; o[10] = pm;
  int32_t sv = (int32_t)lane * 3 - 40;
  asm volatile("redux.sync.add.u32 %0, %1, 0xffffffff;" : "=r"(r) : "r"(lane * lane)); o[11] = r;
  asm volatile("redux.sync.min.s32 %0, %1, 0xffffffff;" : "=r"(r) : "r"(sv)); o[12] = r;
  asm volatile("redux.sync.max.u32 %0, %1, 0xffffffff;" : "=r"(r) : "r"((uint32_t)sv)); o[13] = r;
  uint32_t x, y;
  asm volatile("redux.sync.and.b32 %0, %1, 0xffffffff;" : "=r"(x) : "r"(~(1u << lane)));
  asm volatile("redux.sync.xor.b32 %0, %1, 0xffffffff;" : "=r"(y) : "r"(lane));
  o[14] = x ^ (y << 8);
  uint32_t el = 0, ep = 0;
  if (lane >= 4) {
    asm volatile("{.reg .pred p; elect.sync %0|p, 0xfffffff0; selp.u32 %1, 1, 0, p;}" : "=r"(el), "=r"(ep));
  }
  o[15] = el | ep << 16 | (lane < 4 ? 0x8000u : 0);
}
// Partial membermask: only lanes 0..15 execute the votes (membermask 0x0000ffff), lanes 16..31 exit.
// With `concurrent`, lanes 16..31 instead run their own votes with membermask 0xffff0000 at the same
// time (legal on sm_70+: vote.sync waits only for the non-exited threads named in membermask).
__global__ void k_partial(uint32_t* out, int concurrent) {
  uint32_t lane = laneid(), r;
  if (lane < 16) {
    asm volatile("{.reg .pred a; setp.ne.u32 a, %1, 0; vote.sync.ballot.b32 %0, a, 0x0000ffff;}" : "=r"(r) : "r"(lane & 1));
    out[lane] = r;
    out[32 + lane] = VOTE("all", 1u, 0x0000ffff);
  } else if (concurrent) {
    asm volatile("{.reg .pred a; setp.ne.u32 a, %1, 0; vote.sync.ballot.b32 %0, a, 0xffff0000;}" : "=r"(r) : "r"(lane & 1));
    out[lane] = r;
    out[32 + lane] = VOTE("all", 1u, 0xffff0000);
  }
}
static void partial_common(int concurrent) {
  uint32_t* dv; CK(cudaMalloc(&dv, 64 * 4)); CK(cudaMemset(dv, 0, 64 * 4));
  k_partial<<<1, 32>>>(dv, concurrent);
  uint32_t h[64]; CK(cudaMemcpy(h, dv, sizeof h, cudaMemcpyDeviceToHost));
  char nm[64];
  for (int l = 0; l < (concurrent ? 32 : 16); ++l) {
    snprintf(nm, sizeof nm, "ballot lane%d", l); hchk(nm, h[l], l < 16 ? 0x0000aaaau : 0xaaaa0000u);
    snprintf(nm, sizeof nm, "all lane%d", l); hchk(nm, h[32 + l], 1);
  }
}
static void warp_partial() { partial_common(0); }
static void warp_partial_concurrent() { partial_common(1); }
__global__ void k_activemask(uint32_t* out) {
  uint32_t lane = laneid();
  if (lane >= 20) return;  // exited lanes are not active
  uint32_t m;
  asm volatile("activemask.b32 %0;" : "=r"(m));
  out[lane] = m;
}
static void warpcoll() {
  uint32_t* dv; CK(cudaMalloc(&dv, 32 * 16 * 4 + 32 * 4)); CK(cudaMemset(dv, 0, 32 * 16 * 4 + 32 * 4));
  k_warpcoll<<<1, 32>>>(dv);
  k_activemask<<<1, 32>>>(dv + 32 * 16);
  std::vector<uint32_t> h(32 * 16 + 32);
  CK(cudaMemcpy(h.data(), dv, h.size() * 4, cudaMemcpyDeviceToHost));
  uint32_t ballot = 0; for (int l = 0; l < 32; ++l) ballot |= (uint32_t)(l % 3 == 0) << l;
  uint32_t sumsq = 0; for (uint32_t l = 0; l < 32; ++l) sumsq += l * l;
  uint32_t xr = 0; for (uint32_t l = 0; l < 32; ++l) xr ^= l;
  char nm[64];
  uint32_t leader = h[4 * 16 + 15] & 0xff;  // lane 4's view
  int nleaders = 0;
  for (uint32_t l = 0; l < 32; ++l) {
    const uint32_t* o = &h[l * 16];
    auto C = [&](const char* what, uint32_t got, uint32_t want) { snprintf(nm, sizeof nm, "%s lane%u", what, l); hchk(nm, got, want); };
    C("vote.all", o[0], 0);
    C("vote.any", o[1], 1);
    C("vote.uni", o[2], 0);
    C("vote.all/uni const", o[3], 0x7);
    C("vote.ballot", o[4], ballot);
    C("match.any", o[7], 0x11111111u << (l % 4));
    C("match.all differ", o[8], 0);
    C("match.all same d", o[9], 0xffffffffu);
    C("match.all same p", o[10], 1);
    C("redux.add", o[11], sumsq);
    C("redux.min.s32", o[12], (uint32_t)-40);
    C("redux.max.u32", o[13], (uint32_t)-1);   // lanes 0..13 hold negative values, max unsigned is -1 (lane 13: -1)
    C("redux.and/xor", o[14], 0 ^ (xr << 8));
    if (l < 4) C("elect (not member)", o[15], 0x8000);
    else {
      C("elect d", o[15] & 0xff, leader);
      nleaders += (o[15] >> 16) & 1;
      if ((o[15] >> 16) & 1) C("elect leader is self", leader, l);
    }
    if (l < 20) C("activemask", h[32 * 16 + l], 0x000fffffu);
  }
  hchk("elect exactly one leader", nleaders, 1);
  hchk("elect leader in membermask", leader >= 4 && leader < 32, 1);
}

// ---- atom / red: PTX ISA 9.7.13.4 atom, 9.7.13.5 red. atom returns the old value.
//   inc: new = (old >= b) ? 0 : old + 1;  dec: new = (old == 0 || old > b) ? b : old - 1;
//   cas: new = (old == b) ? c : old;  min/max by type; and/or/xor bitwise; add.f32 IEEE add. ----
__device__ uint32_t g_word;
__device__ uint64_t g_dword;
__device__ uint32_t g_cnt[4];
template <bool SHARED> __device__ void atom_seq(uint32_t* p, uint64_t* p64, const char* tag) {
  // Each chk name gets a prefix via two records: we encode the space in the name by the tag argument.
  uint32_t o;
#define AT(op, v) ({ if (SHARED) asm volatile("atom.shared." op " %0, [%1], %2;" : "=r"(o) : "r"(su32(p)), "r"((uint32_t)(v)) : "memory"); \
                     else asm volatile("atom.global." op " %0, [%1], %2;" : "=r"(o) : "l"(p), "r"((uint32_t)(v)) : "memory"); o; })
#define RD(op, v) ({ if (SHARED) asm volatile("red.shared." op " [%0], %1;" :: "r"(su32(p)), "r"((uint32_t)(v)) : "memory"); \
                     else asm volatile("red.global." op " [%0], %1;" :: "l"(p), "r"((uint32_t)(v)) : "memory"); })
  *(volatile uint32_t*)p = 5;
  chk(tag[0] == 's' ? "s add.u32 old" : "g add.u32 old", AT("add.u32", 3), 5);
  chk(tag[0] == 's' ? "s min.s32 old" : "g min.s32 old", AT("min.s32", -1), 8);
  chk(tag[0] == 's' ? "s max.u32 old" : "g max.u32 old", AT("max.u32", 7), 0xffffffffu);
  chk(tag[0] == 's' ? "s max.s32 old" : "g max.s32 old", AT("max.s32", 7), 0xffffffffu);   // -1 vs 7 -> 7
  chk(tag[0] == 's' ? "s exch old" : "g exch old", AT("exch.b32", 9), 7);
  chk(tag[0] == 's' ? "s inc 9 b10" : "g inc 9 b10", AT("inc.u32", 10), 9);
  chk(tag[0] == 's' ? "s inc 10 b10 wraps" : "g inc 10 b10 wraps", AT("inc.u32", 10), 10);
  chk(tag[0] == 's' ? "s after inc" : "g after inc", *(volatile uint32_t*)p, 0);
  chk(tag[0] == 's' ? "s dec 0 b5" : "g dec 0 b5", AT("dec.u32", 5), 0);
  chk(tag[0] == 's' ? "s dec 5 b3 (>b)" : "g dec 5 b3 (>b)", AT("dec.u32", 3), 5);
  chk(tag[0] == 's' ? "s dec 3 b3" : "g dec 3 b3", AT("dec.u32", 3), 3);
  chk(tag[0] == 's' ? "s after dec" : "g after dec", *(volatile uint32_t*)p, 2);
  uint32_t c1, c2;
  if (SHARED) {
    asm volatile("atom.shared.cas.b32 %0, [%1], %2, %3;" : "=r"(c1) : "r"(su32(p)), "r"(2u), "r"(77u) : "memory");
    asm volatile("atom.shared.cas.b32 %0, [%1], %2, %3;" : "=r"(c2) : "r"(su32(p)), "r"(2u), "r"(88u) : "memory");
  } else {
    asm volatile("atom.global.cas.b32 %0, [%1], %2, %3;" : "=r"(c1) : "l"(p), "r"(2u), "r"(77u) : "memory");
    asm volatile("atom.global.cas.b32 %0, [%1], %2, %3;" : "=r"(c2) : "l"(p), "r"(2u), "r"(88u) : "memory");
  }
  chk(tag[0] == 's' ? "s cas hit old" : "g cas hit old", c1, 2);
  chk(tag[0] == 's' ? "s cas miss old" : "g cas miss old", c2, 77);
  chk(tag[0] == 's' ? "s and old" : "g and old", AT("and.b32", 0x0f), 77);
  chk(tag[0] == 's' ? "s or old" : "g or old", AT("or.b32", 0xf0), 0x0d);
  chk(tag[0] == 's' ? "s xor old" : "g xor old", AT("xor.b32", 0xff), 0xfd);
  chk(tag[0] == 's' ? "s after xor" : "g after xor", *(volatile uint32_t*)p, 0x02);
  RD("add.u32", 0x10);
  RD("max.s32", (uint32_t)-5);
  RD("min.u32", 0x100);
  RD("or.b32", 0x100);
  chk(tag[0] == 's' ? "s after red" : "g after red", *(volatile uint32_t*)p, 0x112);
  *(volatile uint32_t*)p = 0x3fc00000u;  // 1.5f
  chk(tag[0] == 's' ? "s add.f32 old" : "g add.f32 old", AT("add.f32", 0x40100000u), 0x3fc00000u);  // + 2.25
  chk(tag[0] == 's' ? "s add.f32 new" : "g add.f32 new", *(volatile uint32_t*)p, 0x40700000u);      // 3.75
  *(volatile uint64_t*)p64 = 0xffffffffull;
  uint64_t o64;
  if (SHARED) asm volatile("atom.shared.add.u64 %0, [%1], %2;" : "=l"(o64) : "r"(su32(p64)), "l"(1ull) : "memory");
  else asm volatile("atom.global.add.u64 %0, [%1], %2;" : "=l"(o64) : "l"(p64), "l"(1ull) : "memory");
  chk(tag[0] == 's' ? "s add.u64 old" : "g add.u64 old", o64, 0xffffffffull);
  chk(tag[0] == 's' ? "s add.u64 new" : "g add.u64 new", *(volatile uint64_t*)p64, 0x100000000ull);
  if (SHARED) asm volatile("atom.shared.exch.b64 %0, [%1], %2;" : "=l"(o64) : "r"(su32(p64)), "l"(~0ull) : "memory");
  else asm volatile("atom.global.exch.b64 %0, [%1], %2;" : "=l"(o64) : "l"(p64), "l"(~0ull) : "memory");
  if (SHARED) asm volatile("atom.shared.min.s64 %0, [%1], %2;" : "=l"(o64) : "r"(su32(p64)), "l"(5ull) : "memory");
  else asm volatile("atom.global.min.s64 %0, [%1], %2;" : "=l"(o64) : "l"(p64), "l"(5ull) : "memory");
  chk(tag[0] == 's' ? "s min.s64 keeps -1" : "g min.s64 keeps -1", *(volatile uint64_t*)p64, ~0ull);
}
__global__ void k_atom(uint32_t* hits) {
  __shared__ uint32_t sw;
  __shared__ alignas(8) uint64_t sd;
  __shared__ uint32_t scnt;
  if (threadIdx.x == 0) {
    atom_seq<false>(&g_word, &g_dword, "g");
    atom_seq<true>(&sw, &sd, "s");
    scnt = 0;
  }
  __syncthreads();
  // contention: 64 threads; shared atom.add returns each old value 0..63 exactly once
  uint32_t old;
  asm volatile("atom.shared.add.u32 %0, [%1], 1;" : "=r"(old) : "r"(su32(&scnt)) : "memory");
  atomicOr(&hits[old / 32], 1u << (old % 32));   // (atom.global.or) record which old values came back
  asm volatile("red.global.add.f32 [%0], %1;" :: "l"(&g_cnt[0]), "f"(1.0f) : "memory");
  asm volatile("{.reg .b32 t; atom.global.inc.u32 t, [%0], 15;}" :: "l"(&g_cnt[1]) : "memory");
  asm volatile("red.global.add.u32 [%0], %1;" :: "l"(&g_cnt[2]), "r"(threadIdx.x) : "memory");
  __syncthreads();
  if (threadIdx.x == 0) {
    chk("contention shared add final", scnt, 64);
    chk("contention red.add.f32", g_cnt[0], 0x42800000u);  // 64.0
    chk("contention inc b15 wraps", g_cnt[1], 0);            // 64 increments modulo 16
    chk("contention red.add.u32 sum", g_cnt[2], 2016);       // 0+..+63
  }
}
static void atom() {
  uint32_t* hits; CK(cudaMalloc(&hits, 8)); CK(cudaMemset(hits, 0, 8));
  uint32_t z[4] = {0, 0, 0, 0}; CK(cudaMemcpyToSymbol(g_cnt, z, sizeof z));
  k_atom<<<1, 64>>>(hits);
  uint32_t h[2]; CK(cudaMemcpy(h, hits, 8, cudaMemcpyDeviceToHost));
  hchk("contention old values 0..31 each once", h[0], 0xffffffffu);
  hchk("contention old values 32..63 each once", h[1], 0xffffffffu);
}

// ---- ld / st: PTX ISA 9.7.9.8 ld, 9.7.9.10 st, with 9.4.1 (a destination register wider than the
// instruction type is sign-extended for .sN and zero-extended for .uN/.bN; st of a narrow type stores the
// low bits of a wider source). Vector forms .v2/.v4 move consecutive elements (element 0 at the lowest
// address). mov pack/unpack: PTX ISA 9.7.9.1 mov: mov.b64 d, {a, b} puts a in the low half. ----
__global__ void k_ldst(uint8_t* buf) {
  // buf: [0]=0x80, [2..3]=0x8000 (little endian), [16..31] = words 0x11111111 * (i+1)
  uint32_t r; uint64_t r64; uint16_t h;
  asm volatile("ld.global.s8 %0, [%1];" : "=r"(r) : "l"(buf)); chk("ld.s8 -> b32 sext", r, 0xffffff80u);
  asm volatile("ld.global.u8 %0, [%1];" : "=r"(r) : "l"(buf)); chk("ld.u8 -> b32 zext", r, 0x80u);
  asm volatile("ld.global.s8 %0, [%1];" : "=l"(r64) : "l"(buf)); chk("ld.s8 -> b64 sext", r64, 0xffffffffffffff80ull);
  asm volatile("ld.global.s16 %0, [%1];" : "=r"(r) : "l"(buf + 2)); chk("ld.s16 -> b32 sext", r, 0xffff8000u);
  asm volatile("ld.global.u16 %0, [%1];" : "=r"(r) : "l"(buf + 2)); chk("ld.u16 -> b32 zext", r, 0x8000u);
  asm volatile("ld.global.s8 %0, [%1];" : "=h"(h) : "l"(buf)); chk("ld.s8 -> b16 sext", h, 0xff80u);
  asm volatile("ld.global.s32 %0, [%1];" : "=l"(r64) : "l"(buf)); chk("ld.s32 -> b64 sext", r64, 0xffffffff80000080ull);
  uint32_t a, b, c, d;
  asm volatile("ld.global.v2.u32 {%0, %1}, [%2];" : "=r"(a), "=r"(b) : "l"(buf + 16));
  chk("ld.v2.u32 [0]", a, 0x11111111u); chk("ld.v2.u32 [1]", b, 0x22222222u);
  asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(a), "=r"(b), "=r"(c), "=r"(d) : "l"(buf + 16));
  chk("ld.v4.u32 [3]", d, 0x44444444u); chk("ld.v4.u32 [2]", c, 0x33333333u);
  uint64_t x, y;
  asm volatile("ld.global.v2.u64 {%0, %1}, [%2];" : "=l"(x), "=l"(y) : "l"(buf + 16));
  chk("ld.v2.u64 [1]", y, 0x4444444433333333ull);
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" :: "l"(buf + 32), "r"(1u), "r"(2u), "r"(3u), "r"(4u) : "memory");
  asm volatile("ld.global.u32 %0, [%1];" : "=r"(r) : "l"(buf + 44)); chk("st.v4 [3]", r, 4);
  asm volatile("st.global.u8 [%0], %1;" :: "l"(buf + 32), "r"(0x1ffu) : "memory");
  asm volatile("ld.global.u32 %0, [%1];" : "=r"(r) : "l"(buf + 32)); chk("st.u8 stores low byte only", r, 0xffu);
  asm volatile("st.global.b16 [%0], %1;" :: "l"(buf + 38), "r"(0xabcd1234u) : "memory");
  asm volatile("ld.global.u32 %0, [%1];" : "=r"(r) : "l"(buf + 36)); chk("st.b16 low half", r, 0x12340002u);
  __shared__ alignas(16) uint32_t sm[8];
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" :: "r"(su32(sm)), "r"(5u), "r"(6u), "r"(7u), "r"(0x80u) : "memory");
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(a), "=r"(b) : "r"(su32(sm) + 8));
  chk("shared v4 st / v2 ld", a | b << 16, 7u | 0x80u << 16);
  asm volatile("ld.shared.s8 %0, [%1];" : "=r"(r) : "r"(su32(sm) + 12)); chk("ld.shared.s8 sext", r, 0xffffff80u);
  // mov pack / unpack
  asm volatile("mov.b64 %0, {%1, %2};" : "=l"(r64) : "r"(0x11111111u), "r"(0x22222222u)); chk("mov.b64 {lo,hi}", r64, 0x2222222211111111ull);
  asm volatile("mov.b64 {%0, %1}, %2;" : "=r"(a), "=r"(b) : "l"(0xaaaaaaaabbbbbbbbull)); chk("mov.b64 unpack lo", a, 0xbbbbbbbbu); chk("mov.b64 unpack hi", b, 0xaaaaaaaau);
  asm volatile("mov.b32 %0, {%1, %2};" : "=r"(r) : "h"((uint16_t)0x1234), "h"((uint16_t)0xabcd)); chk("mov.b32 {lo,hi}", r, 0xabcd1234u);
  uint16_t h0, h1;
  asm volatile("mov.b32 {%0, %1}, %2;" : "=h"(h0), "=h"(h1) : "r"(0x87654321u)); chk("mov.b32 unpack", (uint32_t)h0 | (uint32_t)h1 << 16, 0x87654321u);
  chk("mov.b32 unpack lo", h0, 0x4321);
  asm volatile("mov.b64 %0, {%1, %2, %3, %4};" : "=l"(r64) : "h"((uint16_t)1), "h"((uint16_t)2), "h"((uint16_t)3), "h"((uint16_t)4));
  chk("mov.b64 {4 x b16}", r64, 0x0004000300020001ull);
}
static void ldst() {
  uint8_t h[64] = {0};
  h[0] = 0x80; h[2] = 0x00; h[3] = 0x80;
  for (int i = 0; i < 4; ++i) { uint32_t w = 0x11111111u * (i + 1); memcpy(h + 16 + 4 * i, &w, 4); }
  uint8_t* d; CK(cudaMalloc(&d, 64)); CK(cudaMemcpy(d, h, 64, cudaMemcpyHostToDevice));
  k_ldst<<<1, 1>>>(d);
}

FAMILIES({"shfl", shfl}, {"warpcoll", warpcoll}, {"warp_partial", warp_partial},
         {"warp_partial_concurrent", warp_partial_concurrent}, {"atom", atom}, {"ldst", ldst})
