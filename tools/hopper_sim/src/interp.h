// The interpreter's internal model: decoded instructions, threads, warps, CTAs, clusters, the
// memory windows and the asynchronous operations in flight. See README.md for the model.
#pragma once
#include <cstdint>
#include <deque>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "ptx_ir.h"
#include "sim.h"

namespace hsim {

// ---- generic address windows (never valid host addresses: above the 47-bit user space) ----
constexpr uint64_t kSharedWindow = 0x0001000000000000ull;  // + shared::cluster address
constexpr uint64_t kLocalWindow = 0x0002000000000000ull;   // + local address of the thread
constexpr uint64_t kParamWindow = 0x0003000000000000ull;   // + kernel param offset
constexpr uint64_t kWindowMask = 0xFFFF000000000000ull;
// shared::cluster addresses: below 2^24 the executing CTA's own shared memory (= shared::cta
// address); (rank + 1) << 24 | offset: the shared memory of cluster CTA `rank`.
constexpr uint32_t kClusterRankShift = 24;
// param-space addresses at or above this are a thread's call-argument frame
constexpr uint64_t kCallParamBase = 0x10000000ull;

enum class T : uint8_t {
  None, B8, B16, B32, B64, B128, U8, U16, U32, U64, S8, S16, S32, S64, S16x2, U16x2,
  F16, F16x2, BF16, BF16x2, F32, F64, TF32, E4M3, E5M2, E4M3x2, E5M2x2, Pred,
};
inline int tbits(T t) {
  switch (t) {
    case T::B8: case T::U8: case T::S8: case T::E4M3: case T::E5M2: return 8;
    case T::B16: case T::U16: case T::S16: case T::F16: case T::BF16: case T::E4M3x2: case T::E5M2x2: return 16;
    case T::B32: case T::U32: case T::S32: case T::F32: case T::F16x2: case T::BF16x2: case T::TF32:
    case T::S16x2: case T::U16x2: return 32;
    case T::B64: case T::U64: case T::S64: case T::F64: return 64;
    case T::B128: return 128;
    case T::Pred: return 1;
    default: return 0;
  }
}
inline bool tsigned(T t) { return t == T::S8 || t == T::S16 || t == T::S32 || t == T::S64; }
inline bool tfloat(T t) {
  return t == T::F16 || t == T::F16x2 || t == T::BF16 || t == T::BF16x2 || t == T::F32 || t == T::F64 ||
         t == T::TF32 || t == T::E4M3 || t == T::E5M2 || t == T::E4M3x2 || t == T::E5M2x2;
}

enum class Sp : uint8_t { None, Generic, Global, Shared, SharedCluster, Local, Param, Const };

enum class Op : uint16_t {
  Invalid,
  // integer / bit
  Add, Sub, Mul, Mad, Mul24, Mad24, Sad, Div, Rem, Abs, Neg, Min, Max, Popc, Clz, Bfind, Brev, Bfe,
  Bfi, Bmsk, And, Or, Xor, Not, Cnot, Lop3, Shf, Shl, Shr, Prmt, Dp4a, Dp2a, Fns, Szext,
  // float-only
  Fma, Rcp, Sqrt, Rsqrt, Sin, Cos, Lg2, Ex2, Tanh, Copysign, Testp,
  // data movement / compare
  Mov, Selp, Slct, Set, Setp, Cvt, Cvta, CvtaTo, Isspacep, Mapa, Getctarank,
  Ld, Ldu, St, Prefetch, Atom, Red, StAsync, RedAsync,
  // control
  Bra, Call, Ret, Exit, Trap, Brkpt, Nanosleep, Pmevent,
  // sync / warp
  BarSync, BarArrive, BarRed, BarWarpSync, ClusterArrive, ClusterWait, Membar, Fence, FenceProxyAsync,
  Shfl, Vote, Match, Redux, Elect, Activemask, Griddep, Setmaxnreg,
  MbarInit, MbarArrive, MbarExpectTx, MbarCompleteTx, MbarTestWait, MbarTryWait, MbarInval,
  MbarPendingCount,
  // async copies
  CpAsync, CpAsyncCommit, CpAsyncWait, CpAsyncWaitAll, CpAsyncMbarArrive,
  BulkTensor, BulkCopy, BulkCommit, BulkWait, BulkPrefetch, BulkPrefetchTensor,
  // tensor cores
  WgmmaFence, WgmmaCommit, WgmmaWait, Wgmma, Ldmatrix, Stmatrix,
  // tensor maps
  TensormapReplace, TensormapCpFenceproxy,
  Nop,
};

// Flag bits of DInstr::flags.
enum : uint32_t {
  F_FTZ = 1u << 0, F_SAT = 1u << 1, F_APPROX = 1u << 2, F_FULL = 1u << 3, F_HI = 1u << 4,
  F_LO = 1u << 5, F_WIDE = 1u << 6, F_CC = 1u << 7, F_CARRYIN = 1u << 8, F_RELU = 1u << 9,
  F_SATFINITE = 1u << 10, F_NAN = 1u << 11, F_UNI = 1u << 12, F_ALIGNED = 1u << 13,
  F_TRANS = 1u << 14, F_PARITY = 1u << 15, F_EXPECT_TX = 1u << 16, F_NOCOMPLETE = 1u << 17,
  F_DROP = 1u << 18, F_MULTICAST = 1u << 19, F_CACHEHINT = 1u << 20, F_NOINC = 1u << 21,
  F_READ = 1u << 22, F_VOLATILE = 1u << 23, F_CLAMP = 1u << 24, F_WRAP = 1u << 25, F_SHIFTAMT = 1u << 26,
  F_XORSIGN = 1u << 27, F_ABS = 1u << 28, F_INC = 1u << 29, F_CLUSTER = 1u << 30, F_MBAR = 1u << 31,
};

// Memory ordering of ld/st/atom/red/fence/membar (scopes are not distinguished): weak (plain ld/st),
// relaxed (also .volatile, and atom/red without a .sem), acquire, release, acq_rel (also .sc and
// membar). Proxy fences and fence.mbarrier_init are kSemWeak: they order no thread's accesses.
enum : uint8_t { kSemWeak = 0, kSemRelaxed = 1, kSemAcquire = 2, kSemRelease = 3, kSemAcqRel = 4 };

enum class Cmp : uint8_t { None, Eq, Ne, Lt, Le, Gt, Ge, Lo, Ls, Hi, Hs, Equ, Neu, Ltu, Leu, Gtu, Geu, Num, Nan };
enum class BoolOp : uint8_t { None, And, Or, Xor };
enum class AtomOp : uint8_t { None, Add, Min, Max, Inc, Dec, And, Or, Xor, Exch, Cas };

struct DInstr {
  Op op = Op::Invalid;
  T t = T::None, t2 = T::None, t3 = T::None;   // main type; second (cvt source / wgmma A/B)
  Sp sp = Sp::None, sp2 = Sp::None;            // memory spaces (destination, source)
  uint8_t vec = 1;
  uint8_t rnd = 0;                             // num::Rnd
  Cmp cmp = Cmp::None;
  BoolOp bop = BoolOp::None;
  AtomOp aop = AtomOp::None;
  uint8_t mode = 0;                            // op-specific sub-mode (shfl/vote/prmt/shf/...)
  uint8_t sem = 0;                             // ld/st/atom/red/fence/membar: a MemSem
  uint32_t flags = 0;
  int32_t a = 0, b = 0, c = 0;                 // op-specific integers (wgmma n/k, tensor dims, bar ids)
  int32_t guard = -1;
  bool guard_neg = false;
  const Operand* ops = nullptr;                // the source instruction's operands
  uint32_t nops = 0;
  const Instr* src = nullptr;
  bool plain_mem = false;                      // ld/st/ldmatrix/stmatrix, no memory order, not volatile (race-checked)
};

struct LoadedFunction {
  const Function* fn = nullptr;
  std::vector<DInstr> code;
  std::vector<uint64_t> regmask;     // per register slot: the bits a write keeps (1 for predicates)
  uint32_t local_bytes = 0;          // its .local variables (frame size)
  std::vector<uint32_t> local_offsets;   // per Function::locals
  uint32_t call_param_bytes = 0;     // its body .param variables (per-thread frame)
  std::unordered_map<int32_t, uint32_t> param_offset;   // param symbol -> offset (formal / body)
  // Kernels only: the shared memory layout of the .shared variables the kernel (and the functions
  // it calls) names, at offsets from 0; dynamic shared memory starts at dyn_base.
  std::unordered_map<int32_t, uint32_t> shared_offset;
  uint32_t static_shared_bytes = 0, dyn_base = 0;
};

struct LoadedModule {
  std::unique_ptr<Module> mod;
  std::vector<LoadedFunction> funcs;
  std::vector<uint8_t*> sym_addr;     // global/const variables: host memory; else nullptr
};

// What a thread knows has completed: per mbarrier id (Engine-wide), the number of its phases the
// thread has observed, directly (a successful wait) or through synchronization with a thread that
// had (named/cluster barriers, warp collectives, mbarrier arrive -> wait).
using Knowledge = std::vector<uint32_t>;
void merge_knowledge(Knowledge& into, const Knowledge& from);

// The shared-race check's clocks, per CTA (engine.cpp "shared-race"): w[i] counts the releases of
// warp i of the CTA this thread is ordered after, l[j] those of lane j of its own warp. A thread's
// own entries grow by one at each release (barrier/mbarrier arrive, warp collective). Fixed-size:
// a synchronization costs O(warps + lanes), not O(threads).
struct RaceClock {
  uint32_t w[32] = {};
  uint32_t l[32] = {};
};
// What one barrier round / mbarrier phase / cluster barrier releases: the warp entries, and the
// lane entries per warp (lanes only order threads of their own warp).
struct RaceCarry {
  uint32_t w[32] = {};
  uint32_t l[32][32] = {};
};
// Per shared byte: the last plain writer and the last plain reader (thread linear + 1, 0: none),
// each with its warp and lane epochs at the access and the PTX line.
struct RaceCell {
  uint16_t w = 0, r = 0;
  uint32_t we = 0, wle = 0, wline = 0, re = 0, rle = 0, rline = 0;
};

struct Cta;
struct Warp;

enum class TS : uint8_t { Runnable, Coll, Bar, Mbar, ClusterBar, CpAsyncWait, BulkWait, Exited };

struct Frame {
  const LoadedFunction* lf = nullptr;
  std::vector<uint64_t> regs;
  int pc = 0;
  uint32_t local_base = 0;                 // in the thread's local memory
  std::vector<uint8_t> call_params;        // this frame's body .param storage
  const DInstr* call_site = nullptr;       // the caller's call instruction (to copy returns)
  std::vector<uint8_t> in_params;          // formal parameters of a .func
};

struct CpAsyncOp { uint32_t dst; uint64_t src; uint32_t bytes, src_bytes; Sp src_sp; };

struct Thread {
  uint32_t tid[3] = {0, 0, 0};
  uint32_t linear = 0, lane = 0;
  Warp* warp = nullptr;
  Cta* cta = nullptr;
  std::vector<Frame> frames;
  TS state = TS::Runnable;
  const DInstr* wait_instr = nullptr;      // blocking instruction (for messages)
  uint64_t wait_addr = 0;                  // mbarrier / barrier id
  uint32_t wait_value = 0;
  bool try_timeout = false;                // the next mbarrier.try_wait returns false (time limit)
  std::vector<uint8_t> local;              // local memory
  // wgmma bookkeeping (per thread, as each thread's registers are involved)
  std::vector<uint16_t> wg_pending;        // per register slot of frame 0: in-flight wgmma count
  std::vector<uint8_t> wg_written;         // written by a non-wgmma instruction since wgmma.fence
  std::vector<std::vector<int32_t>> wg_groups;   // committed groups: their register slots
  std::vector<int32_t> wg_uncommitted;
  uint32_t wg_pending_total = 0;
  // cp.async (non-bulk) groups
  std::vector<std::vector<CpAsyncOp>> cp_groups;   // committed, oldest first
  std::vector<CpAsyncOp> cp_uncommitted;
  std::vector<uint64_t> cp_mbar_arrives;           // mbarriers to arrive on when all prior complete (cluster addr)
  // bulk async groups: counts of ops per group not yet completed
  uint64_t bulk_group = 0;                         // the bulk async-group new operations join
  // barrier.cluster: arrived (and not yet waited) in generation cluster_gen
  bool cluster_arrived = false;
  uint64_t cluster_gen = 0;
  // proxy-fence tracking: shared ranges this thread wrote through the generic proxy since its last
  // fence.proxy.async
  std::vector<std::pair<uint32_t, uint32_t>> dirty;
  Knowledge know;
  RaceClock rc;
  // Global memory ordering (strict, engine.cpp "global-async-order"): a thread that issues async-proxy
  // global writes (bulk/TMA stores and reductions) gets three knowledge ids: gid - 1 counts the writes
  // it issued (I), gid the same count as observed through an unreleased flag (S), gid + 1 its bulk
  // groups completed by a cp.async.bulk.wait_group without .read (D). 0: none yet.
  uint32_t gid = 0, gissued = 0;
  bool has_fence_know = false;
  Knowledge fence_know;                    // know at its last release fence (fence.acq_rel/sc, membar)
  Knowledge gpending;                      // read from flags by relaxed/weak loads: acquired at the next fence
  uint64_t instructions = 0;
};

struct Warp {
  uint32_t id = 0;              // in the CTA
  Cta* cta = nullptr;
  Thread* lanes[32] = {};
  uint32_t live_mask = 0;       // lanes that exist and have not exited
  // Collective rendezvous in progress: one slot per disjoint membermask (lanes of a warp may run
  // separate collectives at once on sm_70+); an .aligned collective needs all live lanes.
  struct CollSlot { const DInstr* coll = nullptr; uint32_t mask = 0, arrived = 0; };
  std::vector<CollSlot> slots;
  uint32_t arrived = 0;         // union of the slots' waiting lanes
  uint32_t regs_budget = 0;     // setmaxnreg: registers per thread
  uint64_t wg_commits = 0;      // wgmma.commit_group count (numbers the wgmma groups)
};

struct NamedBarrier {
  uint32_t arrived = 0, expected = 0;
  bool counted = false;         // expected came from an explicit count
  std::vector<Thread*> waiters;
  Knowledge carry;              // merged knowledge of this round's arrivals
  std::unique_ptr<RaceCarry> rcarry;   // this round's arrivals' race clocks (strict only)
  uint32_t red_value = 0;       // bar.red accumulator
  int red_kind = -1;
};

struct MBar {
  bool valid = false;
  uint32_t phase = 0;           // completed phases
  uint32_t expected = 0, pending = 0;
  int64_t tx = 0;
  std::vector<Thread*> waiters;
  uint32_t id = 0;              // Engine-wide id (knowledge index), new at each init
  Knowledge carry;              // knowledge released by this phase's arrivals
  Knowledge completed_carry;    // released by every completed phase (what a waiter acquires)
  std::shared_ptr<RaceCarry> rcarry, rcompleted;   // the same for the race clocks (strict only)
};

struct Cluster;

// A wgmma reads its shared-memory operands from issue until a wgmma.wait_group covers it: the
// group it joins is, per warp of the warpgroup, that warp's commit count at issue.
struct WgmmaRead {
  struct Run { uint32_t off, len; char operand; };
  std::vector<Run> runs;
  uint64_t group[4] = {0, 0, 0, 0};
  uint32_t wg = 0;
  const DInstr* instr = nullptr;
};

struct Cta {
  uint32_t id[3] = {0, 0, 0};
  uint32_t linear = 0;
  uint32_t rank = 0;            // in its cluster
  Cluster* cluster = nullptr;
  std::vector<uint8_t> smem;
  std::vector<uint8_t> shadow;  // per byte: kShadow* flags
  std::vector<uint8_t> inflight_n;     // per byte: asynchronous copies in flight into it (kShadowInflight <=> > 0)
  std::vector<uint16_t> dirty_owner;   // per byte: thread linear + 1 that wrote without proxy fence
  // per byte: the mbarrier (id + 1, 0: none) and phase whose completion made an asynchronous copy's
  // data visible; a generic access needs the accessing thread to have observed that phase
  std::vector<uint32_t> deliv_id, deliv_phase;
  std::vector<std::unique_ptr<Thread>> threads;
  std::vector<std::unique_ptr<Warp>> warps;
  NamedBarrier bars[16];
  std::unordered_map<uint32_t, MBar> mbars;
  uint32_t live = 0;            // non-exited threads
  uint32_t dyn_smem = 0;
  uint32_t warpgroup_arrived[32] = {};   // wgmma.mma_async rendezvous per warpgroup (lane bits per warp folded)
  const DInstr* warpgroup_coll[32] = {};
  uint32_t regs_in_use = 0;
  uint64_t clock = 0;            // thread-instructions this CTA executed: its %clock
  uint32_t regs_pool = 0;        // registers the CTA got at launch: setmaxnreg moves them between warps
  std::vector<Warp*> regs_waiters;   // warps blocked in setmaxnreg.inc until the pool has room (slot 0)
  // wgmma operands being read: per byte the in-flight wgmmas reading it, and those wgmmas
  std::vector<uint16_t> wgmma_readers;
  std::vector<WgmmaRead> wgmma_reads;
  std::vector<RaceCell> race;   // shared-race check, per byte (strict only)
};

// kShadowWgmmaRead: some in-flight wgmma reads the byte (wgmma_readers > 0)
// kShadowRacy: two asynchronous copies wrote the byte while both were in flight, nothing ordering
// one after the other (a write-write race: PTX's coherence order does not order them, so a later
// read may see either copy's byte). Not an error by itself (CUTLASS 63's L2 prefetcher keeps
// several TMA loads in flight into one scratch stage it never reads); reading the byte is. A
// later write (a thread's store, or a copy issued while none is in flight there) ends it.
enum : uint8_t { kShadowInflight = 1, kShadowAsyncRead = 2, kShadowRacy = 4, kShadowWgmmaRead = 16 };

// An asynchronous copy into shared byte `off` of `c` is issued / lands.
inline void async_write_begin(Cta* c, uint32_t off) {
  uint8_t& n = c->inflight_n[off];
  if (n) c->shadow[off] |= kShadowRacy;
  else c->shadow[off] = (uint8_t)((c->shadow[off] & ~kShadowRacy) | kShadowInflight);
  if (n < 255) ++n;   // (255 copies in flight into one byte: the count saturates and the bit stays)
}
inline void async_write_end(Cta* c, uint32_t off) {
  uint8_t& n = c->inflight_n[off];
  if (n == 255 || (n && --n)) return;   // another copy into it is still in flight
  c->shadow[off] &= ~kShadowInflight;
}

struct Cluster {
  uint32_t id[3] = {0, 0, 0};
  std::vector<Cta*> ctas;       // by rank
  uint32_t live = 0;
  uint64_t arrive_gen = 0;      // barrier.cluster
  uint32_t arrived = 0;
  Knowledge carry;
  std::vector<RaceCarry> rcarry;   // per rank: the race clocks its threads released (strict only)
  std::vector<Thread*> waiters;
};

}  // namespace hsim
