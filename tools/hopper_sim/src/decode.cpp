// Decoding: PTX opcode + modifiers (as parsed) -> DInstr, once per function at module load.
// Anything not understood is an error naming the instruction, never a silent no-op.
#include <stdexcept>
#include <string>

#include "engine.h"
#include "numeric.h"
#include "tma.h"

namespace hsim {

static T parse_type(const std::string& s) {
  static const std::pair<const char*, T> kTypes[] = {
      {"b8", T::B8}, {"b16", T::B16}, {"b32", T::B32}, {"b64", T::B64}, {"b128", T::B128},
      {"u8", T::U8}, {"u16", T::U16}, {"u32", T::U32}, {"u64", T::U64},
      {"s8", T::S8}, {"s16", T::S16}, {"s32", T::S32}, {"s64", T::S64}, {"s16x2", T::S16x2}, {"u16x2", T::U16x2},
      {"f16", T::F16}, {"f16x2", T::F16x2}, {"bf16", T::BF16}, {"bf16x2", T::BF16x2},
      {"f32", T::F32}, {"f64", T::F64}, {"tf32", T::TF32}, {"e4m3", T::E4M3}, {"e5m2", T::E5M2},
      {"e4m3x2", T::E4M3x2}, {"e5m2x2", T::E5M2x2}, {"pred", T::Pred}};
  for (auto& p : kTypes)
    if (s == p.first) return p.second;
  return T::None;
}

static Sp parse_space(const std::string& s) {
  if (s == "global") return Sp::Global;
  if (s == "shared" || s == "shared::cta") return Sp::Shared;
  if (s == "shared::cluster") return Sp::SharedCluster;
  if (s == "local") return Sp::Local;
  if (s == "param" || s == "param::entry" || s == "param::func") return Sp::Param;
  if (s == "const") return Sp::Const;
  return Sp::None;
}

static Cmp parse_cmp(const std::string& s) {
  static const std::pair<const char*, Cmp> k[] = {
      {"eq", Cmp::Eq}, {"ne", Cmp::Ne}, {"lt", Cmp::Lt}, {"le", Cmp::Le}, {"gt", Cmp::Gt}, {"ge", Cmp::Ge},
      {"lo", Cmp::Lo}, {"ls", Cmp::Ls}, {"hi", Cmp::Hi}, {"hs", Cmp::Hs}, {"equ", Cmp::Equ}, {"neu", Cmp::Neu},
      {"ltu", Cmp::Ltu}, {"leu", Cmp::Leu}, {"gtu", Cmp::Gtu}, {"geu", Cmp::Geu}, {"num", Cmp::Num}, {"nan", Cmp::Nan}};
  for (auto& p : k)
    if (s == p.first) return p.second;
  return Cmp::None;
}

static uint8_t parse_rnd(const std::string& s) {
  using num::Rnd;
  if (s == "rn") return (uint8_t)Rnd::kRN;
  if (s == "rz") return (uint8_t)Rnd::kRZ;
  if (s == "rm") return (uint8_t)Rnd::kRM;
  if (s == "rp") return (uint8_t)Rnd::kRP;
  if (s == "rna") return (uint8_t)Rnd::kRNA;
  if (s == "rni") return (uint8_t)Rnd::kRNI;
  if (s == "rzi") return (uint8_t)Rnd::kRZI;
  if (s == "rmi") return (uint8_t)Rnd::kRMI;
  if (s == "rpi") return (uint8_t)Rnd::kRPI;
  return 0;
}

// Modifiers that carry no semantics for a functional, sequentially consistent simulator: memory
// orderings and scopes (every access is immediately visible; the checks model the async proxy
// separately), cache hints and eviction priorities.
static bool ignorable(const std::string& s) {
  static const char* k[] = {"relaxed", "acquire", "release", "acq_rel", "sc", "weak", "mmio", "cta", "gpu", "sys",
                            "cluster", "ca", "cg", "cs", "lu", "cv", "wb", "wt", "nc", "L1::evict_normal",
                            "L1::evict_unchanged", "L1::evict_first", "L1::evict_last", "L1::no_allocate",
                            "L2::evict_first", "L2::evict_last", "L2::evict_normal", "L2::64B", "L2::128B",
                            "L2::256B", "L2::cache_hint", "sync", "to", "L2", "L1", "level::eviction_priority",
                            "level::cache_hint", "level::prefetch_size", "shared::cta"};
  for (auto* x : k)
    if (s == x) return true;
  return false;
}

[[noreturn]] static void bad(const Module& m, const Instr& in, const std::string& why) {
  std::string s = in.opcode;
  for (auto& x : in.mods) s += "." + x;
  throw std::runtime_error(m.source + ":" + std::to_string(in.line) + ": " + why + ": " + s);
}

static void decode_one(const Module& m, const Instr& in, DInstr& d) {
  const std::string& op = in.opcode;
  const auto& mods = in.mods;
  auto has = [&](const char* s) {
    for (auto& x : mods)
      if (x == s) return true;
    return false;
  };
  // generic modifier scan: types, spaces, rounding, vectors, flags
  std::vector<T> types;
  for (auto& x : mods) {
    T t = parse_type(x);
    if (t != T::None) { types.push_back(t); continue; }
    Sp s = parse_space(x);
    if (s != Sp::None) { (d.sp == Sp::None ? d.sp : d.sp2) = s; continue; }
    uint8_t r = parse_rnd(x);
    if (r) { d.rnd = r; continue; }
    if (x == "v2") d.vec = 2;
    else if (x == "v4") d.vec = 4;
    else if (x == "v8") d.vec = 8;
    else if (x == "ftz") d.flags |= F_FTZ;
    else if (x == "sat") d.flags |= F_SAT;
    else if (x == "satfinite") d.flags |= F_SATFINITE;
    else if (x == "approx") d.flags |= F_APPROX;
    else if (x == "full") d.flags |= F_FULL;
    else if (x == "hi") d.flags |= F_HI;
    else if (x == "lo") d.flags |= F_LO;
    else if (x == "wide") d.flags |= F_WIDE;
    else if (x == "cc") d.flags |= F_CC;
    else if (x == "relu") d.flags |= F_RELU;
    else if (x == "NaN") d.flags |= F_NAN;
    else if (x == "xorsign") d.flags |= F_XORSIGN;
    else if (x == "abs") d.flags |= F_ABS;
    else if (x == "uni") d.flags |= F_UNI;
    else if (x == "aligned") d.flags |= F_ALIGNED;
    else if (x == "trans") d.flags |= F_TRANS;
    else if (x == "volatile") d.flags |= F_VOLATILE;
    else if (x == "clamp") d.flags |= F_CLAMP;
    else if (x == "wrap") d.flags |= F_WRAP;
    else if (x == "shiftamt") d.flags |= F_SHIFTAMT;
  }
  if (types.size() > 0) d.t = types[0];
  if (types.size() > 1) d.t2 = types[1];
  if (types.size() > 2) d.t3 = types[2];
  auto cmp_of = [&]() {
    for (auto& x : mods) {
      Cmp c = parse_cmp(x);
      if (c != Cmp::None) return c;
    }
    return Cmp::None;
  };
  auto bop_of = [&]() {
    for (auto& x : mods) {
      if (x == "and") return BoolOp::And;
      if (x == "or") return BoolOp::Or;
      if (x == "xor") return BoolOp::Xor;
    }
    return BoolOp::None;
  };

  static const std::pair<const char*, Op> simple[] = {
      {"add", Op::Add}, {"sub", Op::Sub}, {"mul", Op::Mul}, {"mad", Op::Mad}, {"mul24", Op::Mul24},
      {"mad24", Op::Mad24}, {"sad", Op::Sad}, {"div", Op::Div}, {"rem", Op::Rem}, {"abs", Op::Abs},
      {"neg", Op::Neg}, {"min", Op::Min}, {"max", Op::Max}, {"popc", Op::Popc}, {"clz", Op::Clz},
      {"bfind", Op::Bfind}, {"brev", Op::Brev}, {"bfe", Op::Bfe}, {"bfi", Op::Bfi}, {"bmsk", Op::Bmsk}, {"and", Op::And},
      {"or", Op::Or}, {"xor", Op::Xor}, {"not", Op::Not}, {"cnot", Op::Cnot}, {"lop3", Op::Lop3},
      {"shl", Op::Shl}, {"shr", Op::Shr}, {"dp4a", Op::Dp4a}, {"dp2a", Op::Dp2a}, {"fns", Op::Fns},
      {"szext", Op::Szext}, {"fma", Op::Fma}, {"rcp", Op::Rcp}, {"sqrt", Op::Sqrt}, {"rsqrt", Op::Rsqrt},
      {"sin", Op::Sin}, {"cos", Op::Cos}, {"lg2", Op::Lg2}, {"ex2", Op::Ex2}, {"tanh", Op::Tanh},
      {"copysign", Op::Copysign}, {"mov", Op::Mov}, {"selp", Op::Selp}, {"slct", Op::Slct},
      {"cvt", Op::Cvt}, {"isspacep", Op::Isspacep}, {"mapa", Op::Mapa}, {"getctarank", Op::Getctarank},
      {"ld", Op::Ld}, {"ldu", Op::Ldu}, {"st", Op::St}, {"prefetch", Op::Prefetch}, {"prefetchu", Op::Prefetch},
      {"atom", Op::Atom}, {"red", Op::Red}, {"bra", Op::Bra}, {"call", Op::Call}, {"ret", Op::Ret},
      {"exit", Op::Exit}, {"trap", Op::Trap}, {"brkpt", Op::Brkpt}, {"nanosleep", Op::Nanosleep},
      {"pmevent", Op::Pmevent}, {"membar", Op::Membar}, {"shfl", Op::Shfl}, {"vote", Op::Vote},
      {"match", Op::Match}, {"redux", Op::Redux}, {"elect", Op::Elect}, {"activemask", Op::Activemask},
      {"griddepcontrol", Op::Griddep}, {"setmaxnreg", Op::Setmaxnreg}, {"ldmatrix", Op::Ldmatrix},
      {"stmatrix", Op::Stmatrix}, {"testp", Op::Testp}, {"prmt", Op::Prmt}, {"shf", Op::Shf},
  };
  for (auto& p : simple)
    if (op == p.first) { d.op = p.second; break; }

  if (op == "set" || op == "setp") {
    d.op = op == "set" ? Op::Set : Op::Setp;
    d.cmp = cmp_of();
    d.bop = bop_of();
    if (d.cmp == Cmp::None) bad(m, in, "comparison missing");
  } else if (op == "cvta") {
    d.op = has("to") ? Op::CvtaTo : Op::Cvta;
  } else if (op == "shfl") {
    d.mode = has("up") ? 0 : has("down") ? 1 : has("bfly") ? 2 : has("idx") ? 3 : 9;
    if (d.mode == 9) bad(m, in, "shfl mode");
  } else if (op == "vote") {
    d.mode = has("all") ? 0 : has("any") ? 1 : has("uni") ? 2 : has("ballot") ? 3 : 9;
    if (d.mode == 9) bad(m, in, "vote mode");
  } else if (op == "match") {
    d.mode = has("any") ? 0 : 1;
  } else if (op == "redux") {
    d.aop = has("add") ? AtomOp::Add : has("min") ? AtomOp::Min : has("max") ? AtomOp::Max : has("and") ? AtomOp::And
            : has("or") ? AtomOp::Or : has("xor") ? AtomOp::Xor : AtomOp::None;
  } else if (op == "prmt") {
    d.mode = has("f4e") ? 1 : has("b4e") ? 2 : has("rc8") ? 3 : has("ecl") ? 4 : has("ecr") ? 5 : has("rc16") ? 6 : 0;
  } else if (op == "shf") {
    d.mode = has("l") ? 0 : 1;
  } else if (op == "shr" || op == "shl") {
  } else if (op == "atom" || op == "red") {
    d.aop = has("add") ? AtomOp::Add : has("min") ? AtomOp::Min : has("max") ? AtomOp::Max : has("inc") ? AtomOp::Inc
            : has("dec") ? AtomOp::Dec : has("and") ? AtomOp::And : has("or") ? AtomOp::Or : has("xor") ? AtomOp::Xor
            : has("exch") ? AtomOp::Exch : has("cas") ? AtomOp::Cas : AtomOp::None;
    if (d.aop == AtomOp::None) bad(m, in, "atomic operation");
    if (has("async")) d.op = Op::RedAsync;
  } else if (op == "testp") {
    d.mode = has("finite") ? 0 : has("infinite") ? 1 : has("number") ? 2 : has("notanumber") ? 3 : has("normal") ? 4 : 5;
  } else if (op == "bar" || op == "barrier") {
    if (has("warp")) d.op = Op::BarWarpSync;
    else if (has("cluster")) {
      d.op = has("arrive") ? Op::ClusterArrive : Op::ClusterWait;
      if (has("relaxed")) d.mode = 1;
    }
    else if (has("arrive")) d.op = Op::BarArrive;
    else if (has("red")) {
      d.op = Op::BarRed;
      d.aop = has("popc") ? AtomOp::Add : has("and") ? AtomOp::And : AtomOp::Or;
    } else d.op = Op::BarSync;   // bar.sync, barrier.sync, bar.cta.sync, barrier (alone)
  } else if (op == "tensormap") {
    // tensormap.replace.tile.<field>{.global,.shared::cta}.b1024.<b32|b64> [map], {ord,} value;
    // tensormap.cp_fenceproxy.global.shared::cta.tensormap::generic.release.gpu.sync.aligned [g], [s], 128;
    if (has("cp_fenceproxy")) d.op = Op::TensormapCpFenceproxy;
    else if (has("replace") && has("tile")) {
      d.op = Op::TensormapReplace;
      d.mode = 0xFF;
      for (auto& x : mods) {
        int f = tma::replace_field_id(x.c_str());
        if (f >= 0) d.mode = (uint8_t)f;
      }
      if (d.mode == 0xFF) bad(m, in, "tensormap.replace field");
      d.sp = has("shared::cta") ? Sp::Shared : has("global") ? Sp::Global : Sp::Generic;
    } else bad(m, in, "tensormap form");
  } else if (op == "fence") {
    if (has("proxy")) {
      // fence.proxy.async{.shared::cta,.global,...}: generic <-> async proxy ordering.
      // fence.proxy.tensormap::generic.* orders tensormap writes: no effect here.
      bool async = false, global_only = has("global");
      for (auto& x : mods) if (x.rfind("async", 0) == 0) async = true;
      d.op = async && !global_only ? Op::FenceProxyAsync : Op::Fence;
    } else d.op = Op::Fence;   // fence.sc/acq_rel, fence.mbarrier_init
  } else if (op == "mbarrier") {
    if (has("init")) d.op = Op::MbarInit;
    else if (has("inval")) d.op = Op::MbarInval;
    else if (has("expect_tx")) d.op = has("arrive") ? Op::MbarArrive : Op::MbarExpectTx;
    else if (has("complete_tx")) d.op = Op::MbarCompleteTx;
    else if (has("arrive") || has("arrive_drop")) d.op = Op::MbarArrive;
    else if (has("test_wait")) d.op = Op::MbarTestWait;
    else if (has("try_wait")) d.op = Op::MbarTryWait;
    else if (has("pending_count")) d.op = Op::MbarPendingCount;
    else bad(m, in, "mbarrier form");
    if (has("expect_tx")) d.flags |= F_EXPECT_TX;
    if (has("noComplete")) d.flags |= F_NOCOMPLETE;
    if (has("arrive_drop")) d.flags |= F_DROP;
    if (has("parity")) d.flags |= F_PARITY;
    if (has("shared::cluster")) d.flags |= F_CLUSTER;
  } else if (op == "cp") {
    bool bulk = has("bulk");
    bool tensor = has("tensor");
    if (has("async") && !bulk) {
      if (has("commit_group")) d.op = Op::CpAsyncCommit;
      else if (has("wait_group")) d.op = Op::CpAsyncWait;
      else if (has("wait_all")) d.op = Op::CpAsyncWaitAll;
      else if (has("mbarrier")) {
        d.op = Op::CpAsyncMbarArrive;
        if (has("noinc")) d.flags |= F_NOINC;
      } else d.op = Op::CpAsync;
    } else if (bulk) {
      if (has("commit_group")) d.op = Op::BulkCommit;
      else if (has("wait_group")) {
        d.op = Op::BulkWait;
        if (has("read")) d.flags |= F_READ;
      } else if (has("prefetch")) d.op = tensor ? Op::BulkPrefetchTensor : Op::BulkPrefetch;
      else d.op = tensor ? Op::BulkTensor : Op::BulkCopy;
      for (auto& x : mods) {
        if (x.size() == 2 && x[1] == 'd' && x[0] >= '1' && x[0] <= '5') d.a = x[0] - '0';
        if (x == "multicast::cluster") d.flags |= F_MULTICAST;
        if (x == "L2::cache_hint") d.flags |= F_CACHEHINT;
        if (x.rfind("mbarrier::complete_tx", 0) == 0) d.flags |= F_MBAR;
        if (x == "im2col" || x == "im2col_no_offs" || x == "tile::gather4" || x == "tile::scatter4")
          bad(m, in, "only tile mode tensor copies are simulated");
      }
    } else bad(m, in, "cp form");
  }
  if (op == "wgmma") {
    if (has("fence")) d.op = Op::WgmmaFence;
    else if (has("commit_group")) d.op = Op::WgmmaCommit;
    else if (has("wait_group")) d.op = Op::WgmmaWait;
    else if (has("mma_async")) {
      d.op = Op::Wgmma;
      for (auto& x : mods)
        if (x[0] == 'm' && x.find('n') != std::string::npos && x.find('k') != std::string::npos && x.size() > 6) {
          int mm = 0, nn = 0, kk = 0;
          if (sscanf(x.c_str(), "m%dn%dk%d", &mm, &nn, &kk) == 3) { d.a = nn; d.b = kk; d.c = mm; }
        }
      if (d.a == 0) bad(m, in, "wgmma shape");
      if (has("sp")) bad(m, in, "sparse wgmma is not simulated");
      // types: d.t = D, d.t2 = A, d.t3 = B
    } else bad(m, in, "wgmma form");
  }
  if (op == "ldmatrix" || op == "stmatrix") {
    d.a = has("x4") ? 4 : has("x2") ? 2 : 1;
    if (!has("m8n8")) bad(m, in, "only m8n8 ldmatrix/stmatrix shapes are simulated");
  }
  if (op == "st" && has("async")) d.op = Op::StAsync;
  if (op == "cp" && has("L2::cache_hint")) d.flags |= F_CACHEHINT;
  if (op == "setmaxnreg") d.flags |= has("inc") ? F_INC : 0;
  // cp.reduce.async.bulk(.tensor): the parser splits "cp" + {"reduce","async","bulk",...}
  if (op == "cp" && has("reduce")) {
    d.aop = has("add") ? AtomOp::Add : has("min") ? AtomOp::Min : has("max") ? AtomOp::Max : has("inc") ? AtomOp::Inc
            : has("dec") ? AtomOp::Dec : has("and") ? AtomOp::And : has("or") ? AtomOp::Or : has("xor") ? AtomOp::Xor
            : AtomOp::None;
    if (d.aop == AtomOp::None) bad(m, in, "bulk reduction op");
  }
  // memory ordering (the global-async-order check's release/acquire and fence patterns)
  if (d.op == Op::Ld || d.op == Op::Ldu || d.op == Op::St || d.op == Op::Atom || d.op == Op::Red) {
    if (has("acq_rel") || has("sc")) d.sem = kSemAcqRel;
    else if (has("acquire")) d.sem = kSemAcquire;
    else if (has("release")) d.sem = kSemRelease;
    else if (has("relaxed") || (d.flags & F_VOLATILE) || d.op == Op::Atom || d.op == Op::Red) d.sem = kSemRelaxed;
  } else if (d.op == Op::Membar) {
    d.sem = has("proxy") ? kSemWeak : kSemAcqRel;
  } else if (d.op == Op::Fence) {
    // fence.sc / fence.acq_rel (the default .sem); not proxy fences, fence.mbarrier_init or the
    // .sync_restrict forms (those order shared memory only)
    bool restricted = false;
    for (auto& x : mods) if (x.rfind("sync_restrict", 0) == 0) restricted = true;
    if (!has("proxy") && !has("mbarrier_init") && !restricted) d.sem = kSemAcqRel;
  }
  // the shared-race check's plain accesses: no memory order, not volatile (those synchronize)
  if (d.op == Op::Ld || d.op == Op::Ldu || d.op == Op::St || d.op == Op::Ldmatrix || d.op == Op::Stmatrix)
    d.plain_mem = d.sem == kSemWeak;
  if (d.op == Op::Invalid) bad(m, in, "instruction not simulated");
}

void decode_function(const Module& m, const Function& f, LoadedFunction* out) {
  out->fn = &f;
  out->code.resize(f.code.size());
  out->regmask.resize(f.regs.size());
  for (size_t r = 0; r < f.regs.size(); ++r)
    out->regmask[r] = f.regs[r].is_pred ? 1 : f.regs[r].bits >= 64 ? ~0ull : ((1ull << f.regs[r].bits) - 1);
  for (size_t i = 0; i < f.code.size(); ++i) {
    const Instr& in = f.code[i];
    DInstr& d = out->code[i];
    try {
      decode_one(m, in, d);
    } catch (const std::runtime_error&) {
      d = DInstr();   // not simulated: an error only if a thread executes it (exec.cpp default case)
      d.op = Op::Invalid;
    }
    d.guard = in.guard;
    d.guard_neg = in.guard_neg;
    d.ops = in.ops.data();
    d.nops = (uint32_t)in.ops.size();
    d.src = &in;
  }
}

}  // namespace hsim
