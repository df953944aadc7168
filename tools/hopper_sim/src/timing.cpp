// Timing model: recording (engine hooks) and the replay on a discrete-event model of H100 SMs.
// See timing.h and README.md "Timing model". Parameters: timing_params.h.
//
// PTX is not SASS: each PTX instruction is mapped to an issue cost of the SASS it usually becomes
// (classify() below): register moves, ld.param (a constant-bank operand in SASS), cvta and the like
// cost no issue slot; 64-bit integer adds cost two; the rest one. ptxas also schedules, unrolls,
// and fuses differently from the PTX order: a known error source of this model.
#include "timing.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <unordered_map>
#include <unordered_set>

#include "engine.h"
#include "timing_params.h"

namespace hsim {

// =============================================================================================
// Recording

// ---------------------------------------------------------------------------------------------
// Lane-split events. The functional engine runs a warp's lanes as independent threads, so another
// lane may execute an event instruction (bar.sync, an arrive, a TMA copy, a bulk wait) before or
// after the recorded lane does: the recorded lane can still be in its mbarrier spin, or anywhere in
// the instructions before it, or already past it. On the machine the warp's lanes execute that
// instruction together, at its place in the recorded stream. So events are named by their dynamic
// instance: the instruction and how many times the lane had executed it ("counted" instructions:
// the event instructions and branches, counted per lane at the top of each execution, predicated
// off or not; the retry branch after a failed mbarrier wait is not counted, as lanes spin different
// numbers of times). Another lane's event
//   - of an instance the recorded lane already executed annotates the recorded lane's entry for it
//     (or follows it, when that entry has an event of its own);
//   - otherwise is held pending, and annotates the recorded lane's entry for that instance when it
//     executes it.
// A lane set the recorded lane does not join (if (lane == 8) arrive; as CUTLASS's consumer_release
// spreads its arrivals over lanes): the event's lane executed counted instance Y last before it (the
// branch where its path left the recorded one) and X first after it; when the recorded lane executes
// X (or had, when the lane reaches X) without having executed the event's instance, the paths went
// apart after Y and met again by X, and the event goes right after the recorded lane's entry for Y
// (on the machine the other path runs at the branch; else, right before X). Pending events the
// recorded lane has not placed by its next wait they might be a cause of go before that wait at the
// latest: a bar.sync (another lane did the event before arriving at that barrier round, as no lane
// passes a round without the recorded one), a cluster wait, or an mbarrier wait on a phase no lane
// had seen complete before the event happened (a completed phase cannot depend on it). A change of
// recorded lane (it exited) places what is pending at once, the launch's end the rest (as diverged).
// Kept out of timing.h, as g_load_sectors is.
namespace {
bool counted_op(Op o) {
  switch (o) {
    case Op::BarSync: case Op::BarArrive: case Op::BarRed: case Op::MbarArrive: case Op::CpAsyncMbarArrive:
    case Op::ClusterArrive: case Op::BulkTensor: case Op::BulkCopy: case Op::BulkWait: case Op::Bra:
      return true;
    default: return false;
  }
}
struct Lane {
  std::unordered_map<const DInstr*, uint32_t> occ;   // executions of each counted instruction
  bool spin = false;                                 // its last mbarrier wait failed: a retry follows
  bool unanchored = false;                           // it has pending events without an anchor yet
  const DInstr* last = nullptr;                      // its last two counted instances
  uint32_t last_k = 0;
  const DInstr* prev = nullptr;
  uint32_t prev_k = 0;
};
struct Pending {
  TEvent e;
  uint32_t k = 0;      // the instance: e.d's k-th execution by the lane
  uint64_t seq = 0;    // when it happened (Split::seq)
  const Thread* lane = nullptr;
  const DInstr* ax = nullptr;   // the anchor: the lane's next counted instance after the event
  uint32_t akx = 0;
  const DInstr* py = nullptr;   // the lane's last counted instance before it (a branch where paths split)
  uint32_t pky = 0;
};
struct At {
  uint32_t index = 0;  // trace entry
};
struct Split {
  std::unordered_map<const Thread*, Lane> lanes;
  std::unordered_map<const WarpTrace*, std::vector<Pending>> pending;
  // the recorded lane's trace entries of event instructions: (instruction, instance) -> index
  // (the last kAtKeep instances of each)
  std::unordered_map<const WarpTrace*, std::map<std::pair<const DInstr*, uint32_t>, At>> at;
  std::unordered_map<uint64_t, uint64_t> first_ok;   // mbarrier phase key -> first successful wait seen
  uint64_t seq = 0;                                  // events and successful waits, in engine order
};
}  // namespace
static std::unordered_map<const Recorder*, Split> g_split;
constexpr uint32_t kAtKeep = 64;

// Inserts n entries at trace index i, keeping the recorded indices and the spin start right.
static void insert_at(Split& sp, WarpTrace* tr, size_t i, const std::vector<TEvent>& put) {
  if (put.empty()) return;
  tr->ev.insert(tr->ev.begin() + i, put.begin(), put.end());
  for (auto& kv : sp.at[tr])
    if (kv.second.index >= i) kv.second.index += (uint32_t)put.size();
  if (tr->spin_pos >= (int64_t)i) tr->spin_pos += (int64_t)put.size();
}

// Places the pending events `take` selects, which the recorded lane went around (it did not execute
// their instances): right after its entry for the lane's last counted instance before the event (the
// branch where the lane's path left the recorded one, when it is a branch: on the machine the lanes
// that take the other path run it there), else before trace index `at`.
template <class F> static void place_diverged(Split& sp, WarpTrace* tr, std::vector<Pending>& P, size_t at, F take) {
  std::vector<Pending> sel;
  for (size_t i = 0; i < P.size();) {
    if (take(P[i])) { sel.push_back(P[i]); P.erase(P.begin() + i); }
    else ++i;
  }
  if (sel.empty()) return;
  auto& A = sp.at[tr];
  std::vector<TEvent> rest;
  std::vector<std::pair<const DInstr*, uint32_t>> after;
  std::vector<TEvent> after_e;
  for (auto& p : sel) {
    bool keyed = p.e.kind != TEvent::kTma && p.e.kind != TEvent::kBulkWait;
    if (keyed && !tr->seen.insert(p.e.key).second) continue;
    auto it = p.py ? A.find({p.py, p.pky}) : A.end();
    if (it != A.end() && it->second.index < at && tr->ev[it->second.index].d == p.py) {
      after.push_back({p.py, p.pky});
      after_e.push_back(p.e);
    } else {
      rest.push_back(p.e);
    }
  }
  insert_at(sp, tr, at, rest);
  for (size_t i = 0; i < after.size(); ++i) insert_at(sp, tr, A.at(after[i]).index + 1, {after_e[i]});
}
template <class F> static void place_before_last(Split& sp, WarpTrace* tr, std::vector<Pending>& P, F take) {
  place_diverged(sp, tr, P, tr->ev.empty() ? 0 : tr->ev.size() - 1, take);
}

// The recorded lane: the lowest live lane; lanes run independently in the functional engine, so
// when it exits the next lowest takes over only past the point the previous one reached (counted
// in executed instructions), which for converged code continues the same stream.
bool Recorder::leader(Thread* t) {
  WarpTrace* tr = trace(t);
  uint32_t m = t->warp->live_mask;
  if (tr->rec_lane < 0 || !(m >> tr->rec_lane & 1)) {
    if (!m) return false;
    tr->rec_lane = __builtin_ctz(m);
  }
  if ((int)t->lane != tr->rec_lane) return false;
  return t->instructions > tr->rec_pos || tr->rec_owner == t;
}

WarpTrace* Recorder::trace(Thread* t) { return by_warp_.at(t->warp); }

uint32_t* Recorder::bar_round(Cta* c) {
  auto& v = rounds_[c];
  if (v.size() < 16) v.assign(16, 0);
  return v.data();
}

void Recorder::cta_started(Cta* c, uint64_t cluster_index) {
  uint32_t ci = (uint32_t)ctas.size();
  ctas.push_back(CtaRec{cluster_index, c->rank, c->linear});
  cta_index_[c] = ci;
  rounds_[c].assign(16, 0);
  cluster_id_[c->cluster] = (uint32_t)cluster_index;
  auto& lanes = g_split[this].lanes;   // a new CTA's threads may reuse an exited one's address
  for (auto& th : c->threads) lanes.erase(th.get());
  for (auto& w : c->warps) {
    auto tr = std::make_unique<WarpTrace>();
    tr->cta_index = ci;
    tr->warp = w->id;
    by_warp_[w.get()] = tr.get();
    warps.push_back(std::move(tr));
  }
}

// Lane t executed counted instance (d, k) after events of its still pending without an anchor: that
// instance anchors them. If the recorded lane already executed it, and not the events' instances,
// it went another way around them: they go right before its entry for (d, k).
static void anchor(Split& sp, WarpTrace* tr, const Thread* t, const DInstr* d, uint32_t k) {
  sp.lanes[t].unanchored = false;
  auto pit = sp.pending.find(tr);
  if (pit == sp.pending.end()) return;
  auto& P = pit->second;
  auto& A = sp.at[tr];
  auto it = A.find({d, k});
  bool past = it != A.end() && it->second.index < tr->ev.size() && tr->ev[it->second.index].d == d;
  for (auto& p : P)
    if (p.lane == t && !p.ax) { p.ax = d; p.akx = k; }
  if (past)
    place_diverged(sp, tr, P, it->second.index, [&](const Pending& p) { return p.lane == t && p.ax == d && p.akx == k; });
}

// Plain global loads' HBM traffic: each 32-byte sector once per launch (a re-read hits L2), not once
// per access; every thread's address counts. The set lives here rather than in Recorder so that
// timing.h, which every run compiles (and the CUTLASS ground-truth key hashes), stays as it is.
static std::unordered_map<const Recorder*, std::unordered_set<uint64_t>> g_load_sectors;

// The 32-byte sectors of [a, a + bytes) that `seen` has not counted yet, 32 bytes each into `counted`.
static void count_new_sectors(std::unordered_set<uint64_t>& seen, uint64_t a, uint64_t bytes, uint64_t& counted) {
  for (uint64_t sct = a >> 5; bytes && sct <= (a + bytes - 1) >> 5; ++sct)
    if (seen.insert(sct).second) counted += 32;
}

void Recorder::instr(Thread* t, const DInstr* d) {
  Split& sp = g_split[this];
  uint32_t k = 0;
  if (counted_op(d->op)) {
    Lane& ln = sp.lanes[t];
    if (d->op == Op::Bra && ln.spin) {
      // the retry branch of a spin loop: lanes spin different numbers of times, so its executions
      // are not counted (the loop's exit is, once per wait on every lane)
      ln.spin = false;
    } else {
      k = ++ln.occ[d];
      if (ln.unanchored) anchor(sp, trace(t), t, d, k);
      ln.prev = ln.last; ln.prev_k = ln.last_k;
      ln.last = d; ln.last_k = k;
    }
  }
  if ((d->op == Op::Ld || d->op == Op::Ldu) && d->sp == Sp::Global && d->nops > 1 && d->ops[1].kind == Operand::kMem &&
      d->ops[1].sym < 0 && !t->frames.empty()) {
    const Operand& m = d->ops[1];
    const auto& regs = t->frames.back().regs;
    uint64_t a = (uint64_t)m.imm + (m.reg >= 0 && (size_t)m.reg < regs.size() ? regs[m.reg] : 0);
    uint64_t bytes = (uint64_t)std::max(1, tbits(d->t) / 8) * std::max<uint32_t>(1, d->vec);
    count_new_sectors(g_load_sectors[this], a, bytes, global_ld_bytes);
  }
  if (d->op == Op::CpAsync && d->nops > 2 && d->ops[1].kind == Operand::kMem && d->ops[1].sym < 0 &&
      !t->frames.empty()) {
    // cp.async's global source (its src-size bytes: none for a zero-filled chunk), counted as a
    // plain load's sectors
    const Frame& f = t->frames.back();
    auto reg = [&](int32_t r) { return r >= 0 && (size_t)r < f.regs.size() ? f.regs[r] : 0; };
    const Operand& m = d->ops[1];
    uint64_t a = (uint64_t)m.imm + reg(m.reg);
    uint64_t bytes = d->ops[2].kind == Operand::kImm ? (uint64_t)d->ops[2].imm : 16;
    uint32_t extra = d->nops - ((d->flags & F_CACHEHINT) ? 4 : 3);
    if (extra && d->ops[3].kind == Operand::kImm) bytes = std::min<uint64_t>(bytes, (uint64_t)d->ops[3].imm);
    else if (extra && d->ops[3].kind == Operand::kReg) {
      bool is_pred = f.lf && f.lf->fn && (size_t)d->ops[3].reg < f.lf->fn->regs.size() && f.lf->fn->regs[d->ops[3].reg].is_pred;
      uint64_t v = reg(d->ops[3].reg);
      bytes = is_pred ? ((v & 1) ? 0 : bytes) : std::min(bytes, v);
    }
    count_new_sectors(g_load_sectors[this], a, bytes, global_ld_bytes);
  }
  if (!leader(t)) return;
  WarpTrace* tr = trace(t);
  auto pit = sp.pending.find(tr);
  std::vector<Pending>* P = pit != sp.pending.end() && !pit->second.empty() ? &pit->second : nullptr;
  if (P && tr->rec_owner && tr->rec_owner != t) {   // a new recorded lane: what is pending, now
    place_diverged(sp, tr, *P, tr->ev.size(), [](const Pending&) { return true; });
    P = nullptr;
  }
  tr->rec_owner = t;
  tr->rec_pos = t->instructions;
  TEvent e;
  e.d = d;
  e.lanes = (uint32_t)__builtin_popcount(t->warp->live_mask);
  tr->ev.push_back(e);
  if (d->op == Op::St && d->sp == Sp::Global) global_st_bytes += (uint64_t)std::max(1, tbits(d->t) / 8) * d->vec * e.lanes;
  if (k) {
    auto& A = sp.at[tr];
    A[{d, k}] = At{(uint32_t)(tr->ev.size() - 1)};
    if (k > kAtKeep) A.erase({d, k - kAtKeep});
  }
  if (!P || !k) return;
  // events of lanes that reached this instance after theirs, which this lane skipped: they were on
  // a path this lane did not take, before the paths met again here
  place_before_last(sp, tr, *P, [&](const Pending& p) { return p.ax == d && p.akx == k; });
  // other lanes' events of this very instance: this entry is where they happen
  for (size_t i = 0; i < P->size();) {
    Pending& p = (*P)[i];
    if (p.e.d != d || p.k != k) { ++i; continue; }
    bool keyed = p.e.kind != TEvent::kTma && p.e.kind != TEvent::kBulkWait;
    if (!keyed || tr->seen.insert(p.e.key).second) {
      TEvent& b = tr->ev.back();
      if (b.d == d && b.kind == TEvent::kPlain) {
        b.kind = p.e.kind; b.key = p.e.key; b.aux = p.e.aux;
      } else {
        tr->ev.push_back(p.e);
      }
    }
    P->erase(P->begin() + i);
  }
}

// The leader's event annotates the instruction it is executing (the trace's last entry); another
// lane's event is held pending (see "Lane-split events" above), once per warp and key (TMA copies:
// tma() keeps one per copy; bulk waits: one per instance).
void Recorder::event(Thread* t, const DInstr* d, TEvent::Kind k, uint64_t key, uint32_t aux) {
  WarpTrace* tr = trace(t);
  Split& sp = g_split[this];
  uint64_t seq = ++sp.seq;
  bool keyed = k != TEvent::kTma && k != TEvent::kBulkWait;
  if (keyed && tr->seen.count(key)) return;
  TEvent e;   // the event as a trace entry of its own (when no plain entry of the instruction takes it)
  e.d = d;
  e.kind = k;
  e.key = key;
  e.aux = aux;
  e.synthetic = true;
  if (leader(t)) {
    auto pit = sp.pending.find(tr);
    if (keyed) {
      tr->seen.insert(key);
      if (pit != sp.pending.end()) {   // another lane's event for the same key: this one stands for it
        auto& P = pit->second;
        P.erase(std::remove_if(P.begin(), P.end(), [&](const Pending& p) {
                  return p.e.kind != TEvent::kTma && p.e.kind != TEvent::kBulkWait && p.e.key == key; }), P.end());
      }
    }
    if (!tr->ev.empty() && tr->ev.back().d == d) {
      TEvent& b = tr->ev.back();
      if (b.kind == TEvent::kPlain) { b.kind = k; b.key = key; b.aux = aux; return; }
      if (k == TEvent::kBulkWait && b.kind == TEvent::kBulkWait) return;   // another lane's, this instance
    }
    tr->ev.push_back(e);
    return;
  }
  Lane& me = sp.lanes[t];
  auto occ = me.occ.find(d);
  uint32_t inst = occ == me.occ.end() ? 0 : occ->second;
  // the recorded lane already executed this instance: the event belongs to its entry there
  const Thread* L = tr->rec_owner;
  Lane* lead = L ? &sp.lanes[L] : nullptr;
  auto count = [&](const DInstr* x) -> uint32_t {
    if (!lead) return 0;
    auto i = lead->occ.find(x);
    return i == lead->occ.end() ? 0 : i->second;
  };
  auto& A = sp.at[tr];
  if (count(d) >= inst) {
    auto it = A.find({d, inst});
    if (keyed) tr->seen.insert(key);
    if (it != A.end() && it->second.index < tr->ev.size() && tr->ev[it->second.index].d == d) {
      TEvent& x = tr->ev[it->second.index];
      if (x.kind == TEvent::kPlain) { x.kind = k; x.key = key; x.aux = aux; return; }
      if (k == TEvent::kBulkWait && x.kind == TEvent::kBulkWait) return;
      insert_at(sp, tr, it->second.index + 1, {e});
      return;
    }
    tr->ev.push_back(e);   // (an instance it executed before it was the recorded lane: here)
    return;
  }
  auto& P = sp.pending[tr];
  for (const Pending& p : P) {
    if (keyed && p.e.kind != TEvent::kTma && p.e.kind != TEvent::kBulkWait && p.e.key == key) return;
    if (k == TEvent::kBulkWait && p.e.kind == k && p.e.d == d && p.k == inst) return;
  }
  Pending p;
  p.e = e;
  p.k = inst;
  p.lane = t;
  p.py = me.last == d && me.last_k == inst ? me.prev : me.last;
  p.pky = me.last == d && me.last_k == inst ? me.prev_k : me.last_k;
  me.unanchored = true;
  p.seq = seq;
  P.push_back(p);
}

void Recorder::wait_result(Thread* t, const DInstr* d, bool ok, uint32_t mbar_id, uint32_t phase, uint32_t off) {
  Split& sp = g_split[this];
  uint64_t pkey = phase_key(kKeyMbar, mbar_id, phase);
  if (ok && phase != 0xFFFFFFFFu) sp.first_ok.emplace(pkey, ++sp.seq);
  sp.lanes[t].spin = !ok;
  if (!leader(t)) return;
  WarpTrace* tr = trace(t);
  if (!ok) {   // a spin: remember where it started
    if (tr->spin_pos < 0) tr->spin_pos = (int64_t)tr->ev.size() - 1;
    return;
  }
  if (tr->spin_pos >= 0) {
    // collapse the spin loop into one blocking wait, keeping other lanes' events recorded meanwhile
    std::vector<TEvent> keep;
    for (size_t i = (size_t)tr->spin_pos; i < tr->ev.size(); ++i)
      if (tr->ev[i].synthetic) keep.push_back(tr->ev[i]);
    tr->ev.resize((size_t)tr->spin_pos);
    for (auto& e : keep) tr->ev.push_back(e);
    TEvent e;
    e.d = d;
    e.lanes = (uint32_t)__builtin_popcount(t->warp->live_mask);
    tr->ev.push_back(e);
    tr->spin_pos = -1;
  }
  if (phase == 0xFFFFFFFFu) return;   // waits for the phase before the first: no dependency
  // other lanes' pending events that this phase might wait for (none had seen it complete before
  // they happened) go before the wait
  auto pit = sp.pending.find(tr);
  if (pit != sp.pending.end() && !pit->second.empty()) {
    uint64_t seen_at = sp.first_ok.at(pkey);
    place_before_last(sp, tr, pit->second, [&](const Pending& p) { return p.seq < seen_at; });
  }
  TEvent& e = tr->ev.back();
  e.kind = TEvent::kWait;
  e.key = pkey;
  e.aux = off;
}

void Recorder::arrive(Thread* t, const DInstr* d, uint32_t mbar_id, uint32_t phase, uint32_t off) {
  event(t, d, TEvent::kArrive, phase_key(kKeyMbar, mbar_id, phase), off);
}

void Recorder::bar(Thread* t, const DInstr* d, uint32_t id, bool wait) {
  uint32_t ci = cta_index_.at(t->cta);
  uint64_t key = phase_key(kKeyNamedBar, ci * 16 + id, bar_round(t->cta)[id]);
  if (wait && leader(t)) {   // other lanes' pending events of other instances happened before this round
    WarpTrace* tr = trace(t);
    auto& sp = g_split[this];
    auto pit = sp.pending.find(tr);
    if (pit != sp.pending.end() && !tr->ev.empty() && tr->ev.back().d == d)
      place_before_last(sp, tr, pit->second, [&](const Pending& p) { return p.e.key != key; });
  }
  event(t, d, wait ? TEvent::kBarSync : TEvent::kBarArrive, key, id);
}

void Recorder::cluster_arrive(Thread* t, const DInstr* d, uint64_t gen) {
  event(t, d, TEvent::kArrive, phase_key(kKeyCluster, cluster_id_.at(t->cta->cluster), (uint32_t)gen), 0);
}
void Recorder::cluster_wait(Thread* t, const DInstr* d, uint64_t gen) {
  if (!leader(t)) return;
  WarpTrace* tr = trace(t);
  if (tr->ev.empty() || tr->ev.back().d != d) return;
  auto& sp = g_split[this];
  auto pit = sp.pending.find(tr);
  if (pit != sp.pending.end()) place_before_last(sp, tr, pit->second, [](const Pending&) { return true; });
  tr->ev.back().kind = TEvent::kWait;
  tr->ev.back().key = phase_key(kKeyCluster, cluster_id_.at(t->cta->cluster), (uint32_t)gen);
}

// Lanes of one warp that execute the same cp.async.bulk(.tensor) with the same operands are ONE copy
// in the machine code: ptxas issues UTMALDG/UTMASTG/UBLKCP from the uniform datapath, once per warp
// when the operands are warp-uniform (CUTLASS's epilogue issues its TMA stores from all 32 lanes of
// warp 0: one UTMASTG under VOTEU.ALL in its SASS). The interpreter runs the copy once per lane (PTX
// semantics; idempotent for these), so the model keeps the first lane's and drops the others: the
// k-th execution of instruction d by each lane of a warp is one dynamic instance, and a lane whose
// record (bytes, direction, barriers, tensor) matches one already kept for that instance is the
// same copy. (Lane-varying coordinates with otherwise equal records would be merged: ptxas would
// loop over them; no kernel here does that.) Kept out of timing.h, as g_load_sectors is.
struct TmaDedup {
  std::unordered_map<const Thread*, std::unordered_map<const DInstr*, uint32_t>> runs;   // per lane
  std::unordered_map<const void*, std::unordered_set<uint64_t>> kept;                    // per warp
};
static std::unordered_map<const Recorder*, TmaDedup> g_tma_dedup;

void Recorder::tma(Thread* t, const DInstr* d, TmaRec r, uint64_t fkey, uint64_t fbytes) {
  TmaDedup& dd = g_tma_dedup[this];
  uint64_t sig = std::hash<const void*>()(d) * 0x9E3779B97F4A7C15ull ^ dd.runs[t][d]++;
  auto mix = [&](uint64_t v) { sig = (sig ^ v) * 0x100000001B3ull; };
  mix(r.bytes); mix(r.store); mix(r.ndst); mix(fkey);
  for (uint64_t k : r.keys) mix(k);
  if (!dd.kept[t->warp].insert(sig).second) return;
  if (fbytes && !r.store) footprints[fkey] = std::max(footprints[fkey], fbytes);
  tmas.push_back(std::move(r));
  event(t, d, TEvent::kTma, 0, (uint32_t)tmas.size() - 1);
}

void Recorder::bulk_wait(Thread* t, const DInstr* d) { event(t, d, TEvent::kBulkWait, 0, 0); }

// =============================================================================================
// Replay

namespace {

enum Pipe : uint8_t { kPNone, kPFma, kPAlu, kPMufu, kPCvt, kPShfl, kPLsu, kPTensor, kPTma, kPBranch, kNPipes };
const char* const kPipeNames[kNPipes] = {"none", "fma", "alu", "mufu", "cvt", "shfl", "lsu", "tensor", "tma", "branch"};

struct Cls {
  Pipe pipe = kPAlu;
  int slots = 1;        // issue slots (SASS instructions) this PTX instruction costs
  int interval = tp::kAluInterval;
  int latency = tp::kAluLatency;
  bool memory = false;  // its result comes from memory (stall reason "memory")
};

// Bytes one warp-instruction of cp.async moves: cp-size (4, 8 or 16) per active lane.
uint32_t cp_async_bytes(const DInstr& d, uint32_t lanes) {
  uint32_t n = d.nops > 2 && d.ops[2].kind == Operand::kImm ? (uint32_t)d.ops[2].imm : 16;
  return n * lanes;
}

bool is_mov_like(const DInstr& d) {
  if (d.op == Op::Mov && d.nops >= 2 && d.ops[1].kind == Operand::kReg) return true;   // reg-to-reg
  return false;
}

Cls classify(const DInstr& d) {
  Cls c;
  bool f32 = d.t == T::F32, f64 = d.t == T::F64;
  bool half2 = d.t == T::F16x2 || d.t == T::BF16x2 || d.t == T::F16 || d.t == T::BF16;
  switch (d.op) {
    case Op::Mov:
      if (is_mov_like(d) || (d.nops >= 2 && (d.ops[1].kind == Operand::kImm || d.ops[1].kind == Operand::kSym)))
        { c.slots = 0; c.pipe = kPNone; c.latency = 0; }   // a register rename / immediate operand in SASS
      break;
    case Op::Cvta: case Op::CvtaTo:   // address-window arithmetic folded into addressing in SASS
      c.slots = 0; c.pipe = kPNone; c.latency = 0; break;
    case Op::Ld: case Op::Ldu:
      if (d.sp == Sp::Param || d.sp == Sp::Const) { c.slots = 0; c.pipe = kPNone; c.latency = 0; break; }
      c.pipe = kPLsu; c.interval = 1; c.memory = true;
      c.latency = (d.sp == Sp::Shared || d.sp == Sp::SharedCluster) ? tp::kSmemLatency : tp::kGlobalLatency;
      break;
    case Op::CpAsync:   // LDGSTS: through the LSU into shared memory; completion tracked per warp (replay)
      c.pipe = kPLsu; c.interval = 1; c.latency = 0; break;
    case Op::St: case Op::Atom: case Op::Red: case Op::Ldmatrix: case Op::Stmatrix: case Op::Prefetch:
      c.pipe = kPLsu; c.interval = 1; c.memory = true;
      c.latency = (d.sp == Sp::Global || d.sp == Sp::Generic) ? tp::kGlobalLatency : tp::kSmemLatency;
      break;
    case Op::Fma: case Op::Add: case Op::Sub: case Op::Mul: case Op::Min: case Op::Max: case Op::Neg: case Op::Abs:
    case Op::Mad:
      if (f32) { c.pipe = kPFma; c.interval = tp::kFmaInterval; c.latency = tp::kFmaLatency; }
      else if (half2) { c.pipe = kPFma; c.interval = tp::kHalf2Interval; c.latency = tp::kFmaLatency; }
      else if (f64) { c.pipe = kPFma; c.interval = tp::kFp64Interval; c.latency = 8; }
      else if ((d.op == Op::Add || d.op == Op::Sub) && tbits(d.t) == 64) c.slots = 2;   // IADD3 + IADD3.X
      break;
    case Op::Ex2: case Op::Lg2: case Op::Rcp: case Op::Rsqrt: case Op::Sqrt: case Op::Sin: case Op::Cos: case Op::Tanh:
      c.pipe = kPMufu; c.interval = tp::kMufuInterval; c.latency = tp::kMufuLatency; break;
    case Op::Div:
      if (f32) { c.pipe = kPMufu; c.interval = tp::kMufuInterval; c.latency = tp::kMufuLatency + 2 * tp::kFmaLatency; c.slots = 3; }
      break;
    case Op::Cvt:
      if (!tfloat(d.t) && !tfloat(d.t2) && tbits(d.t) <= 32 && tbits(d.t2) <= 32) {
        // integer narrowing/widening of 8/16/32-bit types: [PG] 64 per clk per SM (SASS: LOP3/PRMT/SHF)
        c.pipe = kPAlu; c.interval = tp::kAluInterval; c.latency = tp::kAluLatency;
      } else if (d.t == T::F32 && d.t2 == T::F16) {
        // ptxas emits HADD2.F32 (an fp16 add with an fp32 result, the FMA pipe), not a conversion-unit op
        c.pipe = kPFma; c.interval = tp::kFmaInterval; c.latency = tp::kFmaLatency;
      } else if (d.t == T::F32 && d.t2 == T::BF16) {
        // bf16 -> f32 is a 16-bit shift (SASS: SHF/PRMT/IMAD.U32)
        c.pipe = kPAlu; c.interval = tp::kAluInterval; c.latency = tp::kAluLatency;
      } else {
        c.pipe = kPCvt; c.interval = tp::kCvtInterval; c.latency = tp::kCvtLatency;
      }
      break;
    case Op::Shfl: case Op::Vote: case Op::Match: case Op::Redux:
      c.pipe = kPShfl; c.interval = tp::kShflInterval; c.latency = tp::kShflLatency; break;
    case Op::Wgmma: c.pipe = kPTensor; c.interval = 1; c.latency = 0; break;
    case Op::BulkTensor: case Op::BulkCopy: c.pipe = kPTma; c.interval = 1; c.latency = 0; break;
    case Op::Bra: case Op::Call: case Op::Ret: case Op::Exit:
      c.pipe = kPBranch; c.interval = 1; c.latency = 0; break;
    case Op::WgmmaFence: case Op::WgmmaCommit: case Op::WgmmaWait: case Op::Fence: case Op::FenceProxyAsync:
    case Op::Membar: case Op::BarWarpSync: case Op::Setmaxnreg: case Op::BulkCommit: case Op::BulkWait:
    case Op::Nop: case Op::Griddep: case Op::CpAsyncCommit: case Op::CpAsyncWait: case Op::CpAsyncWaitAll:
      c.pipe = kPBranch; c.interval = 1; c.latency = 0; break;
    default: break;
  }
  return c;
}

bool writes_first_operand(Op op) {
  switch (op) {
    case Op::St: case Op::Red: case Op::Prefetch: case Op::Bra: case Op::Call: case Op::Ret: case Op::Exit:
    case Op::BarSync: case Op::BarArrive: case Op::MbarInit: case Op::MbarInval: case Op::MbarExpectTx:
    case Op::MbarCompleteTx: case Op::CpAsync: case Op::CpAsyncCommit: case Op::CpAsyncWait: case Op::CpAsyncWaitAll:
    case Op::CpAsyncMbarArrive: case Op::BulkTensor: case Op::BulkCopy: case Op::BulkCommit: case Op::BulkWait:
    case Op::BulkPrefetch: case Op::BulkPrefetchTensor: case Op::WgmmaFence: case Op::WgmmaCommit: case Op::WgmmaWait:
    case Op::Stmatrix: case Op::Membar: case Op::Fence: case Op::FenceProxyAsync: case Op::ClusterArrive:
    case Op::ClusterWait: case Op::Setmaxnreg: case Op::Nanosleep: case Op::Griddep: case Op::BarWarpSync:
    case Op::Trap: case Op::Brkpt: case Op::Nop: case Op::Pmevent: case Op::StAsync: case Op::RedAsync:
      return false;
    default: return true;
  }
}

// Register slots an operand names (kVec elements through the function's vec storage).
template <class F> void operand_regs(const Function& fn, const Operand& o, F f) {
  if (o.kind == Operand::kReg || (o.kind == Operand::kMem && o.reg >= 0)) f(o.reg);
  else if (o.kind == Operand::kVec)
    for (uint32_t i = 0; i < o.vec_count; ++i) {
      const Operand& e = fn.vec_elems[o.vec_begin + i];
      if (e.kind == Operand::kReg) f(e.reg);
    }
}

enum Reason : uint8_t { kRNone, kRDep, kRMem, kRPipe, kRMbar, kRNamedBar, kRCluster, kRWgmma, kRTmaMem, kRSetmaxnreg, kRNotSelected, kNReasons };
const char* const kReasonNames[kNReasons] = {"none", "dependency", "memory", "pipe_throttle", "mbarrier", "named_barrier",
                                             "cluster_barrier", "wgmma_wait", "tma_store_wait", "setmaxnreg", "not_selected"};
constexpr uint64_t kInf = std::numeric_limits<uint64_t>::max() / 4;

// Instructions the lookahead may move up (pure register arithmetic, no carry flag) and those it
// may not move anything across (control flow, synchronization, fences, the tensor pipe).
bool reorderable(const DInstr& d) {
  if (d.flags & (F_CC | F_CARRYIN)) return false;
  Op o = d.op;
  return (o >= Op::Add && o <= Op::Szext) || (o >= Op::Fma && o <= Op::Testp) || o == Op::Mov || o == Op::Selp ||
         o == Op::Slct || o == Op::Set || o == Op::Setp || o == Op::Cvt || o == Op::Shfl;
}
bool window_barrier(const TEvent& e) {
  if (e.kind != TEvent::kPlain) return true;
  switch (e.d->op) {
    case Op::Bra: case Op::Call: case Op::Ret: case Op::Exit: case Op::Trap: case Op::BarSync: case Op::BarArrive:
    case Op::BarRed: case Op::BarWarpSync: case Op::ClusterArrive: case Op::ClusterWait: case Op::Membar: case Op::Fence:
    case Op::FenceProxyAsync: case Op::Setmaxnreg: case Op::WgmmaFence: case Op::WgmmaCommit: case Op::WgmmaWait:
    case Op::Wgmma: case Op::MbarTryWait: case Op::MbarTestWait: case Op::CpAsyncWait: case Op::CpAsyncWaitAll:
    case Op::BulkWait: case Op::Griddep: case Op::Vote: case Op::Match: case Op::Redux: case Op::Elect:
      return true;
    default: return false;
  }
}

struct KeyState {
  int remaining = 0;
  uint64_t tmax = 0;
  bool done = false;
  uint64_t tdone = 0;
  std::vector<struct RWarp*> waiters;
};

struct RWarp {
  WarpTrace* tr = nullptr;
  const Function* fn = nullptr;
  int sm = 0, smsp = 0;
  size_t pc = 0;
  bool started = false, done = false, blocked = false, bar_pending = false;
  uint64_t bar_key = 0;
  uint64_t ready = 0, last_issue = 0;
  Reason reason = kRNone;
  uint32_t reason_aux = 0;
  std::vector<uint64_t> rdy;
  std::vector<uint8_t> rmem;
  std::vector<const DInstr*> rprod;   // the instruction that last wrote each register (profile)
  const DInstr* wait_on = nullptr;    // the producer a dependency stall waits for
  std::vector<size_t> ahead;          // trace positions past pc already issued by the lookahead
  std::vector<uint64_t> groups;   // committed wgmma groups' completion times, oldest first
  uint64_t uncommitted = 0;
  uint64_t bulk_done = 0;
  uint64_t bulk_read_done = 0;        // the bulk stores' shared-memory reads (wait_group.read)
  uint64_t cp_uncommitted = 0;        // cp.async since the last commit_group: latest landing
  std::vector<uint64_t> cp_groups;    // committed cp.async groups' landing times, oldest first
  uint32_t cta = 0;
};

struct RSM {
  uint64_t pipe_free[tp::kSubPartitions][kNPipes] = {};
  uint64_t lsu_free = 0, tma_free = 0, l2_free = 0;
  std::vector<uint32_t> queue;    // CTA indices in dispatch order
  size_t next = 0;
  int running = 0;
  uint64_t finish = 0;
  int rr[tp::kSubPartitions] = {};
};

struct Replay {
  Recorder& R;
  std::vector<RWarp> W;
  std::vector<RSM> S;
  std::vector<std::vector<uint32_t>> cta_warps;
  std::vector<int> cta_left;      // warps of the CTA not done
  std::vector<int> cta_sm;
  std::unordered_map<uint64_t, KeyState> keys;
  uint64_t busy[kNPipes] = {};
  uint64_t issued = 0, slots = 0;
  uint64_t stall[kNReasons] = {};
  std::map<uint32_t, uint64_t> mbar_stall;     // mbarrier shared offset -> cycles
  std::map<uint32_t, std::array<uint64_t, kNReasons>> role_stall;   // warp index in CTA -> reasons
  std::map<uint32_t, uint64_t> role_issued;
  // Where the stall cycles go: per stalled instruction and reason, and for dependency stalls per
  // (consumer, producer) pair; the report keeps the largest entries.
  std::map<std::pair<const DInstr*, int>, uint64_t> at_instr;
  std::map<std::pair<const DInstr*, const DInstr*>, uint64_t> dep_pair;
  std::map<const DInstr*, uint64_t> issued_at;
  int ctas_per_sm = 1;
  bool debug = getenv("HSIM_TIMING_DEBUG") != nullptr;   // prints every issue (small kernels only)
  explicit Replay(Recorder& r) : R(r) {}

  KeyState& key(uint64_t k) { return keys[k]; }

  void contribute(uint64_t k, uint64_t t) {
    KeyState& ks = keys[k];
    ks.tmax = std::max(ks.tmax, t);
    if (--ks.remaining > 0) return;
    ks.done = true;
    ks.tdone = ks.tmax;
    for (RWarp* w : ks.waiters) {
      w->blocked = false;
      w->ready = std::max(w->ready, ks.tdone + latency_of(k));
    }
    ks.waiters.clear();
  }
  static uint64_t latency_of(uint64_t k) {
    return (k >> 62) == kKeyNamedBar ? tp::kNamedBarLatency : tp::kMbarLatency;
  }
  static Reason reason_of(uint64_t k) {
    uint64_t kind = k >> 62;
    return kind == kKeyNamedBar ? kRNamedBar : kind == kKeyCluster ? kRCluster : kRMbar;
  }

  void start_cta(int sm, uint32_t ci, uint64_t t) {
    RSM& s = S[sm];
    ++s.running;
    cta_sm[ci] = sm;
    for (uint32_t wi : cta_warps[ci]) {
      RWarp& w = W[wi];
      w.started = true;
      w.sm = sm;
      w.ready = t;
      w.last_issue = t;
      if (w.tr->ev.empty()) { w.done = true; --cta_left[ci]; }
    }
    if (cta_left[ci] == 0) finish_cta(ci, t);
  }
  void finish_cta(uint32_t ci, uint64_t t) {
    RSM& s = S[cta_sm[ci]];
    --s.running;
    s.finish = std::max(s.finish, t);
    if (s.next < s.queue.size()) start_cta(cta_sm[ci], s.queue[s.next++], t + tp::kCtaLaunchCycles);
  }

  // The bookkeeping every issue shares: stall gap since the warp's last issue, pipe occupancy,
  // destination registers' ready times.
  void account_issue(RWarp& w, const DInstr& d, const Cls& c, uint32_t lanes, uint64_t now) {
    RSM& s = S[w.sm];
    uint64_t* pf = c.pipe == kPLsu ? &s.lsu_free : &s.pipe_free[w.smsp][c.pipe];
    uint64_t gap = now > w.last_issue + 1 ? now - w.last_issue - 1 : 0;
    if (gap) {
      Reason r = w.reason == kRNone ? kRNotSelected : w.reason;
      stall[r] += gap;
      role_stall[w.tr->warp][r] += gap;
      if (r == kRMbar) mbar_stall[w.reason_aux] += gap;
      at_instr[{&d, (int)r}] += gap;
      if ((r == kRDep || r == kRMem) && w.wait_on) dep_pair[{&d, w.wait_on}] += gap;
    }
    issued_at[&d] += c.slots;
    w.wait_on = nullptr;
    // The gap is charged once: a slot-free instruction (a rename) after a stall consumes it too, or
    // each of the slot-free instructions after a wait would count the wait again (bookkeeping only:
    // last_issue and reason feed no timing).
    w.reason = kRNone;
    if (now + c.slots > 0) w.last_issue = std::max(w.last_issue, now + c.slots - 1);
    issued += c.slots;
    role_issued[w.tr->warp] += c.slots;
    int occupy = c.interval;
    if (c.pipe == kPLsu) {   // shared-memory port: bytes / 128 per clock, at least one cycle
      uint32_t bytes = std::max(1, tbits(d.t) / 8) * d.vec * lanes;
      if (d.op == Op::Ldmatrix || d.op == Op::Stmatrix) bytes = 128u * (d.vec ? d.vec : 1);
      if (d.op == Op::CpAsync) bytes = cp_async_bytes(d, lanes);
      occupy = std::max<int>(1, (int)((bytes + tp::kSmemBytesPerClk - 1) / tp::kSmemBytesPerClk));
    }
    if (c.pipe != kPNone && c.pipe != kPTensor && c.pipe != kPTma) { *pf = now + occupy; busy[c.pipe] += occupy; }
    if (writes_first_operand(d.op) && d.op != Op::Wgmma && d.nops > 0) {
      uint64_t t = now + c.latency;
      operand_regs(*w.fn, d.ops[0], [&](int32_t r) {
        if (r < 0) return;
        if ((size_t)r >= w.rdy.size()) { w.rdy.resize(r + 1, 0); w.rmem.resize(r + 1, 0); w.rprod.resize(r + 1, nullptr); }
        w.rdy[r] = t; w.rmem[r] = c.memory; w.rprod[r] = &d;
      });
    }
  }

  // ptxas' scheduling (tp::kSchedWindow): w's instruction at pc cannot issue now; issue the first
  // later one in the window that reads nothing a skipped instruction writes, writes nothing a
  // skipped one reads or writes, has its operands ready and its pipe free. True when one issued;
  // otherwise w.ready is brought forward to when the earliest such candidate could issue.
  bool lookahead(RWarp& w, uint64_t now) {
    if (tp::kSchedWindow <= 0 || window_barrier(w.tr->ev[w.pc])) return false;
    const Function& fn = *w.fn;
    std::vector<int32_t> wr, rd;   // registers the skipped (not yet issued) instructions write / read
    auto has = [](const std::vector<int32_t>& v, int32_t r) { return std::find(v.begin(), v.end(), r) != v.end(); };
    auto srcs = [&](const DInstr& d, auto f) {
      uint32_t first = writes_first_operand(d.op) ? 1 : 0;
      for (uint32_t i = first; i < d.nops; ++i) operand_regs(fn, d.ops[i], f);
      if (d.guard >= 0) f(d.guard);
    };
    size_t end = std::min(w.tr->ev.size(), w.pc + 1 + (size_t)tp::kSchedWindow);
    uint64_t earliest = w.ready;
    for (size_t j = w.pc; j < end; ++j) {
      const TEvent& e = w.tr->ev[j];
      if (std::find(w.ahead.begin(), w.ahead.end(), j) != w.ahead.end()) continue;
      const DInstr& d = *e.d;
      if (j > w.pc && e.kind == TEvent::kPlain && !e.synthetic && reorderable(d)) {
        bool ok = true;
        uint64_t need = 0;
        srcs(d, [&](int32_t r) {
          if (r < 0) return;
          if (has(wr, r)) ok = false;
          if ((size_t)r < w.rdy.size()) need = std::max(need, w.rdy[r]);
        });
        operand_regs(fn, d.ops[0], [&](int32_t r) { if (r >= 0 && (has(wr, r) || has(rd, r))) ok = false; });
        Cls c = classify(d);
        RSM& s = S[w.sm];
        uint64_t at = std::max(need, c.pipe == kPNone ? 0 : s.pipe_free[w.smsp][c.pipe]);
        if (ok && at <= now) {
          account_issue(w, d, c, e.lanes, now);
          if (debug) fprintf(stderr, "  t=%llu sm%d smsp%d w%u pc=%zu line %d %s ahead\n", (unsigned long long)now, w.sm, w.smsp,
                             w.tr->warp, j, d.src ? d.src->line : 0, d.src ? d.src->opcode.c_str() : "?");
          w.ahead.push_back(j);
          w.ready = now + (c.slots > 0 ? c.slots : 0);
          return true;
        }
        if (ok) earliest = std::min(earliest, at);
      }
      if (j > w.pc && window_barrier(e)) break;
      srcs(d, [&](int32_t r) { if (r >= 0) rd.push_back(r); });
      if (writes_first_operand(d.op)) operand_regs(fn, d.ops[0], [&](int32_t r) { if (r >= 0) wr.push_back(r); });
    }
    w.ready = std::max(now + 1, earliest);
    return false;
  }
  // pc past the instructions the lookahead already issued
  void advance(RWarp& w) {
    ++w.pc;
    while (!w.ahead.empty()) {
      auto it = std::find(w.ahead.begin(), w.ahead.end(), w.pc);
      if (it == w.ahead.end()) break;
      w.ahead.erase(it);
      ++w.pc;
    }
  }

  // Tries to issue w's next instruction at `now`: 0 (and w.ready/reason set) when it cannot, 1 when
  // it issued, 2 when it issued an instruction that costs no issue slot (the warp may go on).
  int try_issue(RWarp& w, uint64_t now) {
    if (w.bar_pending) {   // bar.sync: arrived, waiting for the round
      KeyState& ks = key(w.bar_key);
      if (!ks.done) { w.blocked = true; ks.waiters.push_back(&w); w.reason = kRNamedBar; return 0; }
      uint64_t t = ks.tdone + tp::kNamedBarLatency;
      if (t > now) { w.ready = t; w.reason = kRNamedBar; return 0; }
      w.bar_pending = false;
      if (w.pc >= w.tr->ev.size()) { retire(w, now); return 0; }
    }
    const TEvent& e = w.tr->ev[w.pc];
    const DInstr& d = *e.d;
    if (e.kind == TEvent::kWait) {
      KeyState& ks = key(e.key);
      if (!ks.done) {
        w.blocked = true; ks.waiters.push_back(&w); w.reason = reason_of(e.key); w.reason_aux = e.aux; return 0;
      }
      uint64_t t = ks.tdone + latency_of(e.key);
      if (t > now) { w.ready = t; w.reason = reason_of(e.key); w.reason_aux = e.aux; return 0; }
    }
    Cls c = classify(d);
    const Function& fn = *w.fn;
    // source operands ready?
    uint64_t need = 0;
    bool mem = false;
    const DInstr* prod = nullptr;
    uint32_t first_src = (writes_first_operand(d.op) && d.op != Op::Wgmma) ? 1 : 0;
    if (d.op == Op::Wgmma) first_src = 1;
    auto chk = [&](int32_t r) {
      if (r >= 0 && (size_t)r < w.rdy.size() && w.rdy[r] > need) { need = w.rdy[r]; mem = w.rmem[r]; prod = w.rprod[r]; }
    };
    for (uint32_t i = first_src; i < d.nops; ++i) operand_regs(fn, d.ops[i], chk);
    if (!writes_first_operand(d.op) && d.nops > 0) operand_regs(fn, d.ops[0], chk);
    if (d.guard >= 0) chk(d.guard);
    if (need > now) {
      w.ready = need; w.reason = mem ? kRMem : kRDep; w.wait_on = prod;
      return lookahead(w, now) ? 1 : 0;
    }
    if (d.op == Op::WgmmaWait) {
      uint32_t keep = d.nops > 0 && d.ops[0].kind == Operand::kImm ? (uint32_t)d.ops[0].imm : 0;
      uint64_t t = 0;
      if (w.groups.size() > keep)
        for (size_t i = 0; i + keep < w.groups.size(); ++i) t = std::max(t, w.groups[i]);
      if (t > now) { w.ready = t; w.reason = kRWgmma; return 0; }
      if (w.groups.size() > keep) w.groups.erase(w.groups.begin(), w.groups.end() - keep);
    }
    if (e.kind == TEvent::kBulkWait) {
      uint64_t t = (d.flags & F_READ) ? w.bulk_read_done : w.bulk_done;
      if (t > now) { w.ready = t; w.reason = kRTmaMem; return 0; }
    }
    if (d.op == Op::CpAsyncWait || d.op == Op::CpAsyncWaitAll) {
      // wait_group N: every committed group but the newest N has landed; wait_all: every cp.async
      size_t keep = d.op == Op::CpAsyncWait && d.nops > 0 && d.ops[0].kind == Operand::kImm ? (size_t)d.ops[0].imm : 0;
      uint64_t t = d.op == Op::CpAsyncWaitAll ? w.cp_uncommitted : 0;
      for (size_t i = 0; i + keep < w.cp_groups.size(); ++i) t = std::max(t, w.cp_groups[i]);
      if (t > now) { w.ready = t; w.reason = kRMem; return 0; }
      if (w.cp_groups.size() > keep) w.cp_groups.erase(w.cp_groups.begin(), w.cp_groups.end() - keep);
      if (d.op == Op::CpAsyncWaitAll) w.cp_uncommitted = 0;
    }
    RSM& s = S[w.sm];
    uint64_t* pf = c.pipe == kPLsu ? &s.lsu_free : &s.pipe_free[w.smsp][c.pipe];
    if (c.pipe != kPNone && c.pipe != kPTensor && c.pipe != kPTma && *pf > now) {
      w.ready = *pf; w.reason = kRPipe;
      return lookahead(w, now) ? 1 : 0;
    }
    // ---- issue ----
    account_issue(w, d, c, e.lanes, now);
    switch (d.op) {
      case Op::Wgmma: {
        // per-warp share of an m64nNk wgmma on this SMSP's tensor core: N/2 cycles for 16-bit k16,
        // 8-bit k32, tf32 k8 alike (see timing_params.h)
        uint64_t dur = (uint64_t)std::max(1, d.a / 2);
        uint64_t st = std::max(now, s.pipe_free[w.smsp][kPTensor]);
        s.pipe_free[w.smsp][kPTensor] = st + dur;
        busy[kPTensor] += dur;
        w.uncommitted = std::max(w.uncommitted, st + dur + tp::kWgmmaLatency);
        break;
      }
      case Op::WgmmaCommit: w.groups.push_back(std::max(w.uncommitted, now)); w.uncommitted = 0; break;
      case Op::CpAsync: {
        // the warp's chunks through the SM's share of L2 bandwidth (serialized with its TMA
        // copies), landing an L2-hit latency later (an LDGSTS is a global load into shared memory)
        uint64_t l2 = std::max(now, s.l2_free);
        s.l2_free = l2 + (uint64_t)(cp_async_bytes(d, e.lanes) / (tp::kL2BytesPerClkGPU / tp::kSMs) + 0.5);
        w.cp_uncommitted = std::max(w.cp_uncommitted, s.l2_free + tp::kGlobalLatency);
        break;
      }
      case Op::CpAsyncCommit: w.cp_groups.push_back(std::max(w.cp_uncommitted, now)); w.cp_uncommitted = 0; break;
      default: break;
    }
    if (e.kind == TEvent::kTma) {
      const TmaRec& tr = R.tmas[e.aux];
      uint64_t st = std::max(now, s.tma_free);
      s.tma_free = st + tp::kTmaIssueCycles;
      busy[kPTma] += tp::kTmaIssueCycles;
      uint64_t l2 = std::max(st, s.l2_free);
      s.l2_free = l2 + (uint64_t)(tr.bytes / (tp::kL2BytesPerClkGPU / tp::kSMs) + 0.5);
      uint64_t done = s.l2_free + tp::kTmaLatency;
      if (tr.store) {
        w.bulk_done = std::max(w.bulk_done, done);
        // cp.async.bulk.wait_group.read waits only until the source has been read (PTX ISA): the
        // copy's bytes out of shared memory at the SM's shared-memory bandwidth after its issue
        w.bulk_read_done = std::max(w.bulk_read_done, st + tp::kTmaIssueCycles +
                                                          (tr.bytes + tp::kSmemBytesPerClk - 1) / tp::kSmemBytesPerClk);
      }
      for (uint64_t k : tr.keys) contribute(k, done);
    }
    if (e.kind == TEvent::kArrive && d.op == Op::CpAsyncMbarArrive) {
      // cp.async.mbarrier.arrive: the arrive happens once all of the warp's cp.async so far landed
      uint64_t t = std::max(now, w.cp_uncommitted);
      for (uint64_t g : w.cp_groups) t = std::max(t, g);
      contribute(e.key, t);
    } else if (e.kind == TEvent::kArrive || e.kind == TEvent::kBarArrive) {
      contribute(e.key, now);
    }
    if (debug) fprintf(stderr, "  t=%llu sm%d smsp%d w%u pc=%zu line %d %s\n", (unsigned long long)now, w.sm, w.smsp,
                       w.tr->warp, w.pc, d.src ? d.src->line : 0, d.src ? d.src->opcode.c_str() : "?");
    advance(w);
    w.ready = now + (c.slots > 0 ? c.slots : 0);
    if (e.kind == TEvent::kBarSync) {
      contribute(e.key, now);
      w.bar_pending = true;
      w.bar_key = e.key;
      return 1;
    }
    if (w.pc >= w.tr->ev.size()) retire(w, now + 1);
    return c.slots > 0 ? 1 : 2;
  }
  void retire(RWarp& w, uint64_t t) {
    if (w.done) return;
    w.done = true;
    // a warp's outstanding wgmma/stores finish before the CTA's slot frees
    t = std::max({t, w.bulk_done, w.uncommitted});
    if (--cta_left[w.cta] == 0) finish_cta(w.cta, t);
    else S[w.sm].finish = std::max(S[w.sm].finish, t);
  }
};

std::string jstr(const std::string& s) {
  std::string o = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') o += '\\';
    o += ch;
  }
  return o + "\"";
}

}  // namespace

void Recorder::report(const Function* fn, const std::string& kernel, const LaunchParams& lp, uint64_t total_clusters, uint32_t csize,
                      int ctas_per_sm, int sample_sms, const std::string& json_path) {
  // events still pending: the recorded lane never executed their instances (a path only other lanes
  // took, with no counted instance after it before they exited)
  for (auto& tr : warps) {
    auto& sp = g_split[this];
    auto pit = sp.pending.find(tr.get());
    if (pit == sp.pending.end()) continue;
    place_diverged(sp, tr.get(), pit->second, tr->ev.size(), [](const Pending&) { return true; });
  }
  g_split.erase(this);
  Replay rp(*this);
  rp.ctas_per_sm = std::max(1, ctas_per_sm);
  // placement: cluster ci -> group (ci % groups) of csize SMs; CTA rank r -> SM group*csize + r
  uint32_t groups = std::max<uint32_t>(1, tp::kSMs / csize);
  uint32_t used_groups = groups;
  if (sample_sms > 0) used_groups = std::min<uint32_t>(groups, (uint32_t)((sample_sms + csize - 1) / csize));
  rp.S.resize(used_groups * csize);
  rp.cta_warps.resize(ctas.size());
  rp.cta_left.assign(ctas.size(), 0);
  rp.cta_sm.assign(ctas.size(), 0);
  rp.W.resize(warps.size());
  for (size_t i = 0; i < warps.size(); ++i) {
    RWarp& w = rp.W[i];
    w.tr = warps[i].get();
    w.cta = w.tr->cta_index;
    w.smsp = (int)(w.tr->warp % tp::kSubPartitions);
    rp.cta_warps[w.cta].push_back((uint32_t)i);
    ++rp.cta_left[w.cta];
  }
  for (size_t i = 0; i < ctas.size(); ++i) {
    uint64_t g = ctas[i].cluster % groups;
    if (g >= used_groups) continue;   // not placed on a simulated SM (cannot happen when sampling)
    rp.S[g * csize + ctas[i].rank].queue.push_back((uint32_t)i);
  }
  // contributors per key
  for (auto& tr : warps)
    for (auto& e : tr->ev) {
      if (e.kind == TEvent::kArrive || e.kind == TEvent::kBarArrive || e.kind == TEvent::kBarSync) ++rp.keys[e.key].remaining;
      if (e.kind == TEvent::kTma)
        for (uint64_t k : tmas[e.aux].keys) ++rp.keys[k].remaining;
    }
  for (auto& kv : rp.keys) if (kv.second.remaining == 0) kv.second.done = true;
  // keys that are waited on but had no contributor in the sample: complete at time 0
  for (auto& tr : warps)
    for (auto& e : tr->ev)
      if (e.kind == TEvent::kWait && !rp.keys.count(e.key)) rp.keys[e.key].done = true;
  // register slots are the kernel function's (calls are rare in our kernels; a callee's slots alias)
  for (auto& w : rp.W) w.fn = fn;
  for (size_t s = 0; s < rp.S.size(); ++s)
    for (int k = 0; k < rp.ctas_per_sm && rp.S[s].next < rp.S[s].queue.size(); ++k)
      rp.start_cta((int)s, rp.S[s].queue[rp.S[s].next++], 0);

  // the issue loop: every cycle each SMSP issues at most one ready warp's instruction (loose
  // round-robin); time jumps to the next cycle at which some warp can be ready
  uint64_t now = 0;
  std::vector<std::vector<std::vector<RWarp*>>> per(rp.S.size(), std::vector<std::vector<RWarp*>>(tp::kSubPartitions));
  bool stuck = false;
  for (;;) {
    for (auto& v : per) for (auto& x : v) x.clear();
    uint64_t next = kInf;
    bool any = false;
    for (auto& w : rp.W) {
      if (!w.started || w.done) continue;
      any = true;
      if (w.blocked) continue;
      if (w.ready <= now) per[w.sm][w.smsp].push_back(&w);
    }
    if (!any) break;
    for (size_t s = 0; s < per.size(); ++s)
      for (int p = 0; p < tp::kSubPartitions; ++p) {
        auto& v = per[s][p];
        size_t n = v.size();
        if (!n) continue;
        int& rr = rp.S[s].rr[p];
        for (size_t k = 0; k < n; ++k) {
          RWarp* w = v[(rr + k) % n];
          int r;
          while ((r = rp.try_issue(*w, now)) == 2 && !w->done && !w->blocked) {}
          if (r == 1) { rr = (int)((rr + k + 1) % n); break; }
        }
      }
    for (auto& w : rp.W)
      if (w.started && !w.done && !w.blocked) next = std::min(next, std::max(w.ready, now + 1));
    if (next == kInf) {
      bool left = false;
      for (auto& w : rp.W) if (w.started && !w.done) left = true;
      if (left) { stuck = true; break; }
      break;
    }
    now = next;
  }
  uint64_t cycles = 0;
  for (auto& s : rp.S) cycles = std::max(cycles, s.finish);
  cycles = std::max(cycles, now);
  if (stuck) fprintf(stderr, "hopper_sim timing: replay stopped at cycle %llu with warps blocked on barriers no recorded event completes (model gap)\n",
                     (unsigned long long)now);
  // HBM bound: the source tensors' footprints once, plus stores and plain global loads scaled from
  // the sampled CTAs to the grid
  uint64_t sampled_ctas = ctas.size(), total_ctas = total_clusters * csize;
  double scale = sampled_ctas ? (double)total_ctas / sampled_ctas : 1.0;
  double hbm_bytes = 0;
  for (auto& kv : footprints) hbm_bytes += kv.second;
  double st_bytes = global_st_bytes, ld_bytes = global_ld_bytes;
  g_load_sectors.erase(this);
  g_tma_dedup.erase(this);
  for (auto& t : tmas) if (t.store) st_bytes += t.bytes;
  hbm_bytes += (st_bytes + ld_bytes) * scale;
  uint64_t hbm_cycles = (uint64_t)(hbm_bytes / tp::kHbmBytesPerSec * tp::kClockHz);
  uint64_t kernel_cycles = std::max(cycles, hbm_cycles);
  double us = kernel_cycles / tp::kClockHz * 1e6;
  fprintf(stderr, "hopper_sim timing: kernel=%s grid=%u,%u,%u cycles=%llu us=%.3f\n", kernel.c_str(), lp.grid.x, lp.grid.y,
          lp.grid.z, (unsigned long long)kernel_cycles, us);
  if (json_path.empty()) return;
  FILE* f = fopen(json_path.c_str(), "a");
  if (!f) { fprintf(stderr, "hopper_sim timing: cannot open %s\n", json_path.c_str()); return; }
  size_t busy_sms = 0;   // SMs that got a CTA: the busy fractions' denominator
  for (auto& sm : rp.S) busy_sms += !sm.queue.empty();
  double sm_cycles = (double)std::max<uint64_t>(1, cycles) * std::max<size_t>(1, busy_sms);
  double smsp_cycles = sm_cycles * tp::kSubPartitions;
  fprintf(f, "{\"kernel\":%s,\"grid\":[%u,%u,%u],\"block\":[%u,%u,%u],\"cluster\":[%u,%u,%u],", jstr(kernel).c_str(),
          lp.grid.x, lp.grid.y, lp.grid.z, lp.block.x, lp.block.y, lp.block.z, lp.cluster.x, lp.cluster.y, lp.cluster.z);
  fprintf(f, "\"cycles\":%llu,\"us\":%.4f,\"sm_cycles\":%llu,\"hbm_cycles\":%llu,\"hbm_bytes\":%.0f,",
          (unsigned long long)kernel_cycles, us, (unsigned long long)cycles, (unsigned long long)hbm_cycles, hbm_bytes);
  fprintf(f, "\"simulated_sms\":%zu,\"sms_with_ctas\":%zu,\"sampled\":%s,\"ctas_simulated\":%llu,\"ctas_total\":%llu,\"ctas_per_sm\":%d,",
          rp.S.size(), busy_sms, sample_sms > 0 ? "true" : "false", (unsigned long long)sampled_ctas, (unsigned long long)total_ctas,
          rp.ctas_per_sm);
  fprintf(f, "\"waves\":%.3f,", (double)total_ctas / ((double)tp::kSMs / csize * csize * rp.ctas_per_sm));
  fprintf(f, "\"busy\":{\"tensor\":%.4f,\"mufu\":%.4f,\"fma\":%.4f,\"alu\":%.4f,\"cvt\":%.4f,\"shfl\":%.4f,\"lsu\":%.4f,\"tma\":%.4f},",
          rp.busy[kPTensor] / smsp_cycles, rp.busy[kPMufu] / smsp_cycles, rp.busy[kPFma] / smsp_cycles,
          rp.busy[kPAlu] / smsp_cycles, rp.busy[kPCvt] / smsp_cycles, rp.busy[kPShfl] / smsp_cycles,
          rp.busy[kPLsu] / sm_cycles, rp.busy[kPTma] / sm_cycles);
  fprintf(f, "\"issue_slot_use\":%.4f,\"stall_cycles\":{", rp.issued / smsp_cycles);
  for (int r = 1; r < kNReasons; ++r) fprintf(f, "%s%s:%llu", r > 1 ? "," : "", jstr(kReasonNames[r]).c_str(), (unsigned long long)rp.stall[r]);
  fprintf(f, "},\"mbarrier_stall_by_offset\":{");
  bool first = true;
  for (auto& kv : rp.mbar_stall) {
    fprintf(f, "%s\"0x%x\":%llu", first ? "" : ",", kv.first, (unsigned long long)kv.second);
    first = false;
  }
  fprintf(f, "},\"per_warp_index\":{");
  first = true;
  for (auto& kv : rp.role_stall) {
    fprintf(f, "%s\"%u\":{\"issued\":%llu", first ? "" : ",", kv.first, (unsigned long long)rp.role_issued[kv.first]);
    for (int r = 1; r < kNReasons; ++r)
      if (kv.second[r]) fprintf(f, ",%s:%llu", jstr(kReasonNames[r]).c_str(), (unsigned long long)kv.second[r]);
    fprintf(f, "}");
    first = false;
  }
  // The stall profile: the instructions the most cycles were lost before (PTX line, opcode, reason)
  // and the dependency stalls' producer -> consumer pairs.
  auto where = [&](const DInstr* d) {
    std::string op = d->src ? d->src->opcode : "?";
    if (d->src) for (auto& m : d->src->mods) op += "." + m;
    return "{\"line\":" + std::to_string(d->src ? d->src->line : 0) + ",\"op\":" + jstr(op) + "}";
  };
  {
    std::vector<std::pair<uint64_t, std::pair<const DInstr*, int>>> v;
    for (auto& kv : rp.at_instr) v.push_back({kv.second, kv.first});
    std::sort(v.begin(), v.end(), [](auto& a, auto& b) { return a.first > b.first; });
    fprintf(f, "},\"stall_by_instruction\":[");
    for (size_t i = 0; i < v.size() && i < 40; ++i)
      fprintf(f, "%s{\"cycles\":%llu,\"reason\":%s,\"at\":%s,\"issued\":%llu}", i ? "," : "", (unsigned long long)v[i].first,
              jstr(kReasonNames[v[i].second.second]).c_str(), where(v[i].second.first).c_str(),
              (unsigned long long)rp.issued_at[v[i].second.first]);
  }
  {
    std::vector<std::pair<uint64_t, std::pair<const DInstr*, const DInstr*>>> v;
    for (auto& kv : rp.dep_pair) v.push_back({kv.second, kv.first});
    std::sort(v.begin(), v.end(), [](auto& a, auto& b) { return a.first > b.first; });
    fprintf(f, "],\"dependency_pairs\":[");
    for (size_t i = 0; i < v.size() && i < 40; ++i)
      fprintf(f, "%s{\"cycles\":%llu,\"at\":%s,\"waits_for\":%s}", i ? "," : "", (unsigned long long)v[i].first,
              where(v[i].second.first).c_str(), where(v[i].second.second).c_str());
  }
  fprintf(f, "],\"replay_stuck\":%s}\n", stuck ? "true" : "false");
  fclose(f);
  (void)kPipeNames;
}

}  // namespace hsim
