// The device (modules, memory registry, launches) and the engine that runs one launch: residency,
// the seeded scheduler, memory windows and their checks, barriers, mbarriers, asynchronous copies.
#include "engine.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <unistd.h>

#include "numeric.h"
#include "timing_params.h"
#include "tma.h"

namespace hsim {

void exec_warpgroup_wgmma(Engine* e, Cta* cta, uint32_t wg, const std::vector<Thread*>& th);

[[noreturn]] void fail_check(const std::string& check, const std::string& details) {
  fflush(stdout);
  fprintf(stderr, "hopper_sim: %s: %s\n", check.c_str(), details.c_str());
  fflush(stderr);
  _exit(kStrictExit);
}

[[noreturn]] void fail_unsupported(const std::string& what) {
  fflush(stdout);
  fprintf(stderr, "hopper_sim: %s\n", what.c_str());
  fflush(stderr);
  _exit(87);
}

// =============================================================================================
// Device

static uint64_t env_u64(const char* name, uint64_t def) {
  const char* v = getenv(name);
  return v && *v ? strtoull(v, nullptr, 0) : def;
}

Device::Device() : impl_(new Impl) {
  Options& o = impl_->opt;
  o.seed = env_u64("HSIM_SEED", 1);
  o.sms = (int)env_u64("HSIM_SMS", 4);
  o.strict = env_u64("HSIM_STRICT", 1) != 0;
  o.check_uninit = env_u64("HSIM_UNINIT", 0) != 0;
  o.verbose = (int)env_u64("HSIM_VERBOSE", 0);
  o.timing = env_u64("HSIM_TIMING", 0) != 0;
  if (const char* j = getenv("HSIM_TIMING_JSON")) o.timing_json = j;
  o.timing_sample = (int)env_u64("HSIM_TIMING_SAMPLE", 0);
  if (const char* j = getenv("HSIM_TIMING_ONLY")) o.timing_only = j;
  o.timing_sample_atomics = env_u64("HSIM_TIMING_SAMPLE_ATOMICS", 0) != 0;
  if (!o.timing_json.empty() || o.timing_sample) o.timing = true;
  if (o.sms < 1) o.sms = 1;
}

Device& Device::instance() {
  static Device* d = new Device;   // never destroyed: programs call the runtime from atexit handlers
  return *d;
}

Options& Device::options() { return impl_->opt; }
uint64_t Device::instructions() const { return impl_->instructions; }
double Device::launch_seconds() const { return impl_->seconds; }

bool Device::Impl::check_global(uint64_t p, uint64_t n) const {
  auto it = allocs.upper_bound(p);
  if (it == allocs.begin()) return false;
  --it;
  return p >= it->first && p + n <= it->first + it->second.first;
}

const char* Device::Impl::alloc_name(uint64_t p) const {
  auto it = allocs.upper_bound(p);
  if (it == allocs.begin()) return nullptr;
  --it;
  return p < it->first + it->second.first ? it->second.second.c_str() : nullptr;
}

void Device::add_allocation(const void* p, size_t n, const char* what) {
  impl_->allocs[(uint64_t)p] = {n, what ? what : "allocation"};
}
bool Device::remove_allocation(const void* p) { return impl_->allocs.erase((uint64_t)p) > 0; }
bool Device::is_allocation(const void* p, size_t n) const { return impl_->check_global((uint64_t)p, n); }

static uint32_t align_up(uint32_t v, uint32_t a) { return a ? (v + a - 1) / a * a : v; }

// The shared variables a kernel names (directly or in the functions it calls), laid out from
// offset 0 in declaration order; dynamic shared memory (`.extern .shared x[]`) starts after them at
// the largest alignment any extern declaration asks for (at least 16).
static void layout_shared(const Module& m, int entry, LoadedFunction* lf) {
  std::vector<char> used(m.symbols.size(), 0), seen(m.functions.size(), 0);
  std::vector<int> todo{entry};
  auto mark = [&](const Operand& o) {
    if (o.sym < 0) return;
    const Symbol& s = m.symbols[o.sym];
    if (s.space == Symbol::kShared) used[o.sym] = 1;
    if (s.space == Symbol::kFunc && s.func >= 0 && !seen[s.func]) { seen[s.func] = 1; todo.push_back(s.func); }
  };
  seen[entry] = 1;
  while (!todo.empty()) {
    const Function& f = m.functions[todo.back()];
    todo.pop_back();
    for (const Instr& in : f.code) for (const Operand& o : in.ops) mark(o);
    for (const Operand& o : f.vec_elems) mark(o);
  }
  // initializers holding shared addresses count too (rare)
  uint32_t off = 0, dyn_align = 16;
  for (size_t i = 0; i < m.symbols.size(); ++i) {
    const Symbol& s = m.symbols[i];
    if (s.space != Symbol::kShared) continue;
    if (s.is_extern) { if (used[i]) dyn_align = std::max(dyn_align, s.align); continue; }
    if (!used[i]) continue;
    off = align_up(off, std::max<uint32_t>(s.align, 1));
    lf->shared_offset[(int32_t)i] = off;
    off += (uint32_t)s.size;
  }
  lf->static_shared_bytes = off;
  lf->dyn_base = align_up(off, dyn_align);
  for (size_t i = 0; i < m.symbols.size(); ++i)
    if (m.symbols[i].space == Symbol::kShared && m.symbols[i].is_extern) lf->shared_offset[(int32_t)i] = lf->dyn_base;
}

int Device::add_module(const std::string& ptx, const std::string& name) {
  auto lm = std::make_unique<LoadedModule>();
  lm->mod = std::make_unique<Module>(parse_ptx(ptx, name));
  Module& m = *lm->mod;
  int mi = (int)impl_->modules.size();
  lm->sym_addr.assign(m.symbols.size(), nullptr);
  // module-scope .global/.const variables get host memory (registered as allocations); shared
  // variables are laid out per kernel below
  for (size_t i = 0; i < m.symbols.size(); ++i) {
    Symbol& s = m.symbols[i];
    if (s.space == Symbol::kGlobal || s.space == Symbol::kConst) {
      if (s.is_extern && s.size == 0) continue;
      size_t n = std::max<uint64_t>(s.size, 1);
      void* p = nullptr;
      if (posix_memalign(&p, std::max<uint32_t>(s.align, 256), n)) throw std::runtime_error("out of memory");
      memset(p, 0, n);
      if (!s.init.empty()) memcpy(p, s.init.data(), std::min<size_t>(n, s.init.size()));
      lm->sym_addr[i] = (uint8_t*)p;
      add_allocation(p, n, s.name.c_str());
    }
  }
  // relocations (symbol addresses in initializers)
  for (size_t i = 0; i < m.symbols.size(); ++i)
    for (auto& r : m.symbols[i].relocs) {
      if (!lm->sym_addr[i]) continue;
      uint64_t v = 0;
      const Symbol& t = m.symbols[r.sym];
      if (t.space == Symbol::kGlobal || t.space == Symbol::kConst) v = (uint64_t)lm->sym_addr[r.sym];
      else if (t.space == Symbol::kFunc) v = (uint64_t)r.sym;
      v += r.addend;
      memcpy(lm->sym_addr[i] + r.offset, &v, 8);
    }
  // functions
  lm->funcs.resize(m.functions.size());
  for (size_t fi = 0; fi < m.functions.size(); ++fi) {
    const Function& f = m.functions[fi];
    LoadedFunction& lf = lm->funcs[fi];
    if (!f.has_body) { lf.fn = &f; continue; }
    decode_function(m, f, &lf);
    uint32_t off = 0;
    for (int32_t p : f.params) {
      const Symbol& s = m.symbols[p];
      off = align_up(off, std::max<uint32_t>(s.align, 1));
      lf.param_offset[p] = off;
      off += (uint32_t)s.size;
    }
    for (int32_t p : f.rets) {
      const Symbol& s = m.symbols[p];
      off = align_up(off, std::max<uint32_t>(s.align, 1));
      lf.param_offset[p] = off;
      off += (uint32_t)s.size;
    }
    uint32_t boff = 0;
    for (int32_t p : f.body_params) {
      const Symbol& s = m.symbols[p];
      boff = align_up(boff, std::max<uint32_t>(s.align, 8));
      lf.param_offset[p] = boff;
      boff += (uint32_t)s.size;
    }
    lf.call_param_bytes = boff + 8;
    uint32_t loff = 0;
    for (int32_t l : f.locals) {
      const Symbol& s = m.symbols[l];
      loff = align_up(loff, std::max<uint32_t>(s.align, 8));
      lf.local_offsets.push_back(loff);
      loff += (uint32_t)s.size;
    }
    lf.local_bytes = align_up(loff, 16);
    if (f.is_entry) {
      layout_shared(m, (int)fi, &lf);
      auto k = std::make_unique<KernelInfo>();
      k->name = f.name;
      k->module = mi;
      k->function = (int)fi;
      for (int32_t p : f.params) {
        k->param_offsets.push_back(lf.param_offset[p]);
        k->param_sizes.push_back((uint32_t)m.symbols[p].size);
      }
      k->param_bytes = off;
      k->static_smem = lf.static_shared_bytes;
      uint32_t mt = f.maxntid[0] ? f.maxntid[0] * std::max(1u, f.maxntid[1]) * std::max(1u, f.maxntid[2]) : 0;
      uint32_t rt = f.reqntid[0] ? f.reqntid[0] * std::max(1u, f.reqntid[1]) * std::max(1u, f.reqntid[2]) : 0;
      k->max_threads = rt ? rt : mt ? mt : 1024;
      // registers per thread at launch: ptxas spreads the register file over the declared
      // threads x CTAs per SM (multiple of 8, at most 255); without directives assume 64
      uint32_t regs = 64;
      if (f.maxnreg) regs = f.maxnreg;
      else if (mt || rt) {
        uint32_t blocks = f.minnctapersm ? f.minnctapersm : 1;
        regs = std::min<uint32_t>(255, 65536 / (k->max_threads * blocks)) / 8 * 8;
        regs = std::min<uint32_t>(regs, 255 / 8 * 8);
      }
      k->num_regs = regs;
      for (int i = 0; i < 3; ++i) k->req_cluster[i] = f.reqnctapercluster[i];
      impl_->kernels[f.name] = std::move(k);
    }
  }
  impl_->modules.push_back(std::move(lm));
  return mi;
}

KernelInfo* Device::kernel(const std::string& name) {
  auto it = impl_->kernels.find(name);
  return it == impl_->kernels.end() ? nullptr : it->second.get();
}

void* Device::symbol_address(const std::string& name, size_t* size) {
  for (auto& lm : impl_->modules) {
    auto it = lm->mod->global_names.find(name);
    if (it == lm->mod->global_names.end()) continue;
    if (lm->sym_addr[it->second]) {
      if (size) *size = lm->mod->symbols[it->second].size;
      return lm->sym_addr[it->second];
    }
  }
  return nullptr;
}

int Device::occupancy(const KernelInfo* k, uint32_t threads, size_t dyn_smem) const {
  if (!threads) return 0;
  uint32_t warps = (threads + 31) / 32;
  int by_threads = 2048 / (warps * 32);
  size_t smem = k->static_smem + dyn_smem + kReservedSmemPerBlock;
  int by_smem = (int)(kSmemPerSM / smem);
  uint32_t regs_per_cta = warps * 32 * std::max<uint32_t>(k->num_regs, 1);
  int by_regs = (int)(65536 / regs_per_cta);
  return std::max(0, std::min({by_threads, by_smem, by_regs, 32}));
}

int Device::launch(KernelInfo* k, const LaunchParams& lp0, void** args) {
  LaunchParams lp = lp0;
  Impl& I = *impl_;
  // the kernel's declared cluster shape applies when the launch gives none
  if (lp.cluster.x * lp.cluster.y * lp.cluster.z == 1 && k->req_cluster[0])
    lp.cluster = Dim3{k->req_cluster[0], std::max(1u, k->req_cluster[1]), std::max(1u, k->req_cluster[2])};
  uint64_t threads = (uint64_t)lp.block.x * lp.block.y * lp.block.z;
  if (threads == 0 || threads > 1024 || lp.block.z > 64 || threads > k->max_threads) return 9;   // cudaErrorInvalidConfiguration
  if (lp.grid.x == 0 || lp.grid.y == 0 || lp.grid.z == 0 || lp.grid.y > 65535 || lp.grid.z > 65535) return 9;
  if (lp.dyn_smem > (size_t)k->max_dynamic_smem && lp.dyn_smem > 48 * 1024) return 1;    // cudaErrorInvalidValue
  if (k->static_smem + lp.dyn_smem > kMaxSmemPerBlockOptin) return 1;
  uint32_t csize = lp.cluster.x * lp.cluster.y * lp.cluster.z;
  if (lp.grid.x % lp.cluster.x || lp.grid.y % lp.cluster.y || lp.grid.z % lp.cluster.z) return 1;
  if (csize > 16 || (csize > 8 && !k->non_portable_cluster_ok)) return 1;
  if (occupancy(k, (uint32_t)threads, lp.dyn_smem) == 0) return 701;                   // cudaErrorLaunchOutOfResources
  if (I.opt.timing && !I.opt.timing_only.empty() && k->name.find(I.opt.timing_only) == std::string::npos) {
    if (I.opt.verbose) fprintf(stderr, "hopper_sim timing: skipped %s (--timing-only)\n", k->name.c_str());
    return 0;
  }
  const LoadedModule* lm = I.modules[k->module].get();
  const LoadedFunction* lf = &lm->funcs[k->function];
  std::vector<uint8_t> params(k->param_bytes + 16, 0);
  for (size_t i = 0; i < k->param_sizes.size(); ++i)
    if (k->param_sizes[i]) memcpy(params.data() + k->param_offsets[i], args[i], k->param_sizes[i]);
  auto t0 = std::chrono::steady_clock::now();
  Engine e(&I, lm, lf, k, lp, params, I.opt);
  std::unique_ptr<Recorder> rec;
  if (I.opt.timing) { rec.reset(new Recorder); e.rec_ = rec.get(); }
  e.run();
  if (rec) {
    uint32_t csize = lp.cluster.x * lp.cluster.y * lp.cluster.z;
    rec->report(lf->fn, k->name, lp, e.total_clusters(), csize, occupancy(k, (uint32_t)threads, lp.dyn_smem),
                I.opt.timing_sample, I.opt.timing_json);
  }
  I.instructions += e.instructions();
  I.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (I.opt.verbose)
    fprintf(stderr, "hopper_sim: %s grid (%u,%u,%u) block (%u,%u,%u) cluster (%u,%u,%u) smem %zu: %llu instructions\n",
            k->name.c_str(), lp.grid.x, lp.grid.y, lp.grid.z, lp.block.x, lp.block.y, lp.block.z, lp.cluster.x,
            lp.cluster.y, lp.cluster.z, lp.dyn_smem, (unsigned long long)e.instructions());
  return 0;
}

// =============================================================================================
// Engine

Engine::Engine(Device::Impl* dev, const LoadedModule* lm, const LoadedFunction* lf, KernelInfo* k,
               const LaunchParams& lp, const std::vector<uint8_t>& params, const Options& opt)
    : dev_(dev), lm_(lm), lf_(lf), k_(k), lp_(lp), params_(params), opt_(opt), rng_(opt.seed * 0x9E3779B97F4A7C15ull + 1) {
  ncl_[0] = lp.grid.x / lp.cluster.x;
  ncl_[1] = lp.grid.y / lp.cluster.y;
  ncl_[2] = lp.grid.z / lp.cluster.z;
  total_clusters_ = (uint64_t)ncl_[0] * ncl_[1] * ncl_[2];
  uint32_t csize = lp.cluster.x * lp.cluster.y * lp.cluster.z;
  uint32_t threads = lp.block.x * lp.block.y * lp.block.z;
  Device& D = Device::instance();
  uint64_t slots = (uint64_t)opt.sms * std::max(1, D.occupancy(k, threads, lp.dyn_smem));
  max_resident_clusters_ = (uint32_t)std::max<uint64_t>(1, slots / csize);
}

std::string Engine::where(const Thread* t, const DInstr* d) const {
  char buf[512];
  std::string s = "kernel " + k_->name;
  if (s.size() > 120) s = s.substr(0, 117) + "...";
  if (t) {
    snprintf(buf, sizeof buf, ", CTA (%u,%u,%u), warp %u, lane %u (thread %u)", t->cta->id[0], t->cta->id[1],
             t->cta->id[2], t->linear / 32, t->lane, t->linear);
    s += buf;
  }
  if (d && d->src) {
    std::string txt = d->src->opcode;
    for (auto& m : d->src->mods) txt += "." + m;
    s += ", PTX line " + std::to_string(d->src->line) + " (" + txt + ")";
  }
  return s;
}

void Engine::fail(const std::string& check, const Thread* t, const DInstr* d, const std::string& details) {
  if (check == "unsupported") fail_unsupported("unsupported: " + details + " at " + where(t, d));
  fail_check(check, details + " at " + where(t, d));
}

void Engine::dispatch_clusters() {
  uint32_t csize = lp_.cluster.x * lp_.cluster.y * lp_.cluster.z;
  uint32_t bx = lp_.block.x, by = lp_.block.y, bz = lp_.block.z;
  uint32_t nthreads = bx * by * bz;
  while (clusters_.size() < max_resident_clusters_ && next_cluster_ < total_clusters_) {
    uint64_t ci = next_cluster_++;
    if (rec_ && opt_.timing_sample > 0 && !sampled(ci)) continue;   // not on a sampled SM: skipped
    auto cl = std::make_unique<Cluster>();
    if (opt_.strict) cl->rcarry.resize(csize);
    cl->id[0] = (uint32_t)(ci % ncl_[0]);
    cl->id[1] = (uint32_t)((ci / ncl_[0]) % ncl_[1]);
    cl->id[2] = (uint32_t)(ci / ((uint64_t)ncl_[0] * ncl_[1]));
    for (uint32_t r = 0; r < csize; ++r) {
      auto c = std::make_unique<Cta>();
      uint32_t rx = r % lp_.cluster.x, ry = (r / lp_.cluster.x) % lp_.cluster.y, rz = r / (lp_.cluster.x * lp_.cluster.y);
      c->id[0] = cl->id[0] * lp_.cluster.x + rx;
      c->id[1] = cl->id[1] * lp_.cluster.y + ry;
      c->id[2] = cl->id[2] * lp_.cluster.z + rz;
      c->linear = c->id[0] + lp_.grid.x * (c->id[1] + lp_.grid.y * c->id[2]);
      c->rank = r;
      c->cluster = cl.get();
      c->dyn_smem = (uint32_t)lp_.dyn_smem;
      size_t total = lf_->dyn_base + lp_.dyn_smem;
      // Unused shared memory holds a recognisable garbage pattern, never zeros.
      c->smem.assign(total, 0xA5);
      c->shadow.assign(total, 0);
      c->inflight_n.assign(total, 0);
      c->dirty_owner.assign(total, 0);
      c->deliv_id.assign(total, 0);
      c->deliv_phase.assign(total, 0);
      c->wgmma_readers.assign(total, 0);
      if (opt_.strict) c->race.assign(total, RaceCell());
      uint32_t nwarps = (nthreads + 31) / 32;
      for (uint32_t w = 0; w < nwarps; ++w) {
        auto wp = std::make_unique<Warp>();
        wp->id = w;
        wp->cta = c.get();
        wp->regs_budget = k_->num_regs;
        c->warps.push_back(std::move(wp));
      }
      c->regs_in_use = nwarps * 32 * k_->num_regs;
      c->regs_pool = c->regs_in_use;
      const Function& fn = *lf_->fn;
      for (uint32_t i = 0; i < nthreads; ++i) {
        auto t = std::make_unique<Thread>();
        t->linear = i;
        t->tid[0] = i % bx;
        t->tid[1] = (i / bx) % by;
        t->tid[2] = i / (bx * by);
        t->lane = i % 32;
        t->cta = c.get();
        t->warp = c->warps[i / 32].get();
        t->warp->lanes[t->lane] = t.get();
        t->warp->live_mask |= 1u << t->lane;
        t->rc.w[i / 32] = t->rc.l[t->lane] = 1;   // its first epoch (others know 0 of it)
        Frame f;
        f.lf = lf_;
        f.regs.assign(fn.regs.size(), 0);
        f.call_params.assign(lf_->call_param_bytes, 0);
        t->frames.push_back(std::move(f));
        t->local.assign(lf_->local_bytes + 256, 0);
        t->wg_pending.assign(fn.regs.size(), 0);
        t->wg_written.assign(fn.regs.size(), 0);
        runnable_.push_back(t.get());
        c->threads.push_back(std::move(t));
      }
      c->live = nthreads;
      cl->live += nthreads;
      cl->ctas.push_back(c.get());
      if (rec_) rec_->cta_started(c.get(), ci);
      ctas_.push_back(std::move(c));
    }
    clusters_.push_back(std::move(cl));
  }
}

// Round-robin dispatch over 132 SMs in groups of a cluster's size: cluster ci lands on group
// ci % groups; sampling K SMs keeps the clusters of the first ceil(K / cluster size) groups.
bool Engine::sampled(uint64_t ci) const {
  uint32_t csize = lp_.cluster.x * lp_.cluster.y * lp_.cluster.z;
  uint32_t groups = std::max<uint32_t>(1, tp::kSMs / csize);
  uint32_t keep = (uint32_t)((opt_.timing_sample + csize - 1) / csize);
  return ci % groups < keep;
}

// A dynamic tile scheduler (tile = atomicAdd(counter, 1) + gridDim) run on sampled SMs alone would
// hand them every tile. With --timing-sample-atomics each global integer atom.add adds its value
// times groups / sampled groups, as if the skipped SMs took tiles at the sampled SMs' rate: a
// sampled CTA then gets every (groups / kept)-th tile, the round-robin share of a balanced run.
uint64_t Engine::atomic_scale() const {
  if (!rec_ || opt_.timing_sample <= 0 || !opt_.timing_sample_atomics) return 1;
  uint32_t csize = lp_.cluster.x * lp_.cluster.y * lp_.cluster.z;
  uint32_t groups = std::max<uint32_t>(1, tp::kSMs / csize);
  uint32_t keep = std::min(groups, (uint32_t)((opt_.timing_sample + csize - 1) / csize));
  return std::max<uint32_t>(1, groups / keep);
}

void Engine::run() {
  dispatch_clusters();
  for (;;) {
    if (runnable_.empty()) {
      if (!async_.empty()) { complete_one_async(true); continue; }
      // mbarrier.try_wait may return false at a time limit: grant that once to every thread blocked
      // in one (the program then decides); if they block again with nothing else moving, deadlock
      if (timeouts_ < 2) {
        bool any = false;
        for (auto& c : ctas_)
          for (auto& th : c->threads)
            if (th->state == TS::Mbar && th->wait_instr && th->wait_instr->op == Op::MbarTryWait) {
              for (auto& kv : c->mbars) {
                auto& wv = kv.second.waiters;
                wv.erase(std::remove(wv.begin(), wv.end(), th.get()), wv.end());
              }
              for (auto& cl : clusters_)
                for (Cta* oc : cl->ctas)
                  for (auto& kv : oc->mbars) {
                    auto& wv = kv.second.waiters;
                    wv.erase(std::remove(wv.begin(), wv.end(), th.get()), wv.end());
                  }
              th->try_timeout = true;
              wake(th.get());
              any = true;
            }
        if (any) { ++timeouts_; continue; }
      }
      // retire finished clusters, dispatch more
      bool any_live = false;
      for (auto& cl : clusters_) if (cl->live) any_live = true;
      if (any_live) deadlock();
      for (auto& cl : clusters_) for (Cta* c : cl->ctas) retire_cta(c);
      clusters_.clear();
      ctas_.clear();
      if (next_cluster_ >= total_clusters_) break;
      dispatch_clusters();
      continue;
    }
    size_t i = (size_t)(rng_() % runnable_.size());
    Thread* t = runnable_[i];
    int budget = 1 + (int)(rng_() % 64);
    step(t, budget);
    if (t->state != TS::Runnable) {
      // t may have been moved by wakes pushed during its step: find it again
      if (i < runnable_.size() && runnable_[i] == t) {
        runnable_[i] = runnable_.back();
        runnable_.pop_back();
      } else {
        auto it = std::find(runnable_.begin(), runnable_.end(), t);
        if (it != runnable_.end()) { *it = runnable_.back(); runnable_.pop_back(); }
      }
    }
    if (!async_.empty()) {
      if (copy_mode() != 2) { if ((rng_() & 7) == 0) complete_one_async(true); }
      else if (instr_total_ - async_.front().issued_at > kLateCopyLimit) complete_one_async(false);
    }
    // finished clusters free their slots for the next ones
    if (next_cluster_ < total_clusters_) {
      bool freed = false;
      for (size_t ci = 0; ci < clusters_.size();) {
        Cluster* cl = clusters_[ci].get();
        bool busy = cl->live != 0;
        if (!busy)
          for (auto& op : async_) {
            for (Cta* c : op.dst_ctas) if (c->cluster == cl) busy = true;
            if (op.src_cta && op.src_cta->cluster == cl) busy = true;
          }
        if (!busy) {
          for (Cta* c : cl->ctas) {
            retire_cta(c);
            for (size_t k = 0; k < ctas_.size(); ++k)
              if (ctas_[k].get() == c) { ctas_.erase(ctas_.begin() + k); break; }
          }
          clusters_.erase(clusters_.begin() + ci);
          freed = true;
        } else ++ci;
      }
      if (freed) dispatch_clusters();
    }
    if (instr_total_ - last_progress_ > 400000000ull) {
      std::string s = "no store, arrive or barrier for 400M instructions (a spin loop that never ends?):";
      int shown = 0;
      for (Thread* r : runnable_) {
        if (shown++ > 8) break;
        const Frame& f = r->frames.back();
        s += "\n  " + where(r, &f.lf->code[f.pc]);
      }
      fail_check("livelock", s);
    }
  }
}

void Engine::retire_cta(Cta* c) {
  // global writes whose source was read (wait_group.read) may land after their CTA is gone
  for (auto& op : async_)
    if (op.issuer && op.issuer->cta == c) {
      if (!op.src_done) fail("async-at-exit", op.issuer, op.instr, "the CTA exited while a store still read its shared memory");
      op.issuer = nullptr;
    }
  for (auto& t : c->threads) {
    if (!t->cp_uncommitted.empty() || !t->cp_groups.empty()) complete_thread_cp_async(t.get(), 0);
  }
  // TMA loads still writing an exited CTA's shared memory mean the kernel never waited for them
  for (auto& op : async_)
    for (Cta* d : op.dst_ctas)
      if (d == c)
        fail("async-at-exit", op.issuer, op.instr, "the CTA exited while a copy into its shared memory was in flight");
}

void Engine::deadlock() {
  std::string s = "every live thread is blocked:";
  for (auto& cl : clusters_)
    for (Cta* c : cl->ctas)
      for (auto& w : c->warps) {
        // one line per warp, lanes with the same wait grouped
        std::map<std::string, uint32_t> waits;
        for (int l = 0; l < 32; ++l) {
          Thread* t = w->lanes[l];
          if (!t || t->state == TS::Exited) continue;
          std::string what;
          const DInstr* d = t->wait_instr;
          std::string line = d && d->src ? "PTX line " + std::to_string(d->src->line) : "?";
          char buf[256];
          switch (t->state) {
            case TS::Mbar: {
              uint32_t off = (uint32_t)t->wait_addr;
              auto it = t->cta->mbars.find(off);
              if (it != t->cta->mbars.end())
                snprintf(buf, sizeof buf, "mbarrier at shared 0x%x waiting for %s %u (barrier: phase %u, parity %u, "
                         "pending %u of %u, tx %lld)", off, (t->wait_instr->flags & F_PARITY) ? "parity" : "phase",
                         t->wait_value, it->second.phase, it->second.phase & 1, it->second.pending, it->second.expected,
                         (long long)it->second.tx);
              else snprintf(buf, sizeof buf, "mbarrier at shared 0x%x", off);
              what = buf;
              break;
            }
            case TS::Bar: {
              NamedBarrier& b = c->bars[t->wait_addr];
              snprintf(buf, sizeof buf, "named barrier %llu (%u of %u arrived)", (unsigned long long)t->wait_addr,
                       b.arrived, b.counted ? b.expected : c->live);
              what = buf;
              break;
            }
            case TS::Coll: what = "warp collective (waiting for the other lanes)"; break;
            case TS::ClusterBar: what = "barrier.cluster.wait"; break;
            default: what = "blocked"; break;
          }
          waits[what + " at " + line] |= 1u << l;
        }
        for (auto& kv : waits) {
          char buf[160];
          snprintf(buf, sizeof buf, "\n  CTA (%u,%u,%u) warp %u lanes 0x%08x: ", c->id[0], c->id[1], c->id[2], w->id, kv.second);
          s += buf + kv.first;
        }
      }
  fail_check("deadlock", s + "\n  in kernel " + k_->name);
}

void Engine::block(Thread* t, TS state, const DInstr* d) {
  t->state = state;
  if (d) t->wait_instr = d;
}

void Engine::wake(Thread* t) {
  if (t->state == TS::Runnable || t->state == TS::Exited) return;
  t->state = TS::Runnable;
  runnable_.push_back(t);
}

void Engine::thread_exited(Thread* t) {
  t->state = TS::Exited;
  Warp* w = t->warp;
  Cta* c = t->cta;
  w->live_mask &= ~(1u << t->lane);
  --c->live;
  --c->cluster->live;
  progress();
  // barriers and collectives that counted on this thread
  for (uint32_t id = 0; id < 16; ++id)
    if (c->bars[id].arrived && !c->bars[id].counted) check_bar_complete(c, id);
  if (w->arrived) recheck_warp_collective(w);
  // (a wgmma rendezvous needs all 128 threads: one that exits first leaves the others in deadlock)
  // a thread that arrived and exits no longer holds the cluster barrier up, nor counts for it
  if (t->cluster_arrived && t->cluster_gen == c->cluster->arrive_gen) --c->cluster->arrived;
  t->cluster_arrived = false;
  check_cluster_bar(c->cluster);
  // a CTA must not exit while a copy still writes its shared memory (the mbarrier was never waited)
  if (c->live == 0)
    for (auto& op : async_)
      for (Cta* dc : op.dst_ctas)
        if (dc == c)
          fail("async-at-exit", op.issuer, op.instr, "the CTA exited while a copy into its shared memory was in flight");
}

// ---------------------------------------------------------------------------------------------
// Memory

Cta* Engine::cluster_cta(Thread* t, const DInstr* d, uint32_t a, uint32_t* off) {
  uint32_t hi = a >> kClusterRankShift;
  Cta* c = t->cta;
  if (hi) {
    uint32_t r = hi - 1;
    if (r >= c->cluster->ctas.size())
      fail("shared-bounds", t, d, "shared::cluster address 0x" + std::to_string(a) + " names rank " + std::to_string(r) +
           " outside the cluster");
    c = c->cluster->ctas[r];
  }
  *off = a & ((1u << kClusterRankShift) - 1);
  return c;
}

uint8_t* Engine::mem(Thread* t, const DInstr* d, Sp sp, uint64_t a, uint32_t n, bool write, Cta** cta_out,
                     uint32_t* smem_off) {
  if (sp == Sp::Generic) {
    uint64_t w = a & kWindowMask;
    if (w == 0) sp = Sp::Global;
    else if (w == kSharedWindow) { sp = Sp::SharedCluster; a -= kSharedWindow; }
    else if (w == kLocalWindow) { sp = Sp::Local; a -= kLocalWindow; }
    else if (w == kParamWindow) { sp = Sp::Param; a -= kParamWindow; }
    else fail("global-bounds", t, d, "generic address 0x" + std::to_string(a) + " is in no window");
  }
  char buf[200];
  if (n > 1 && (a % std::min<uint32_t>(n, 16)) != 0 && sp != Sp::Param) {
    snprintf(buf, sizeof buf, "misaligned %u-byte access at 0x%llx", n, (unsigned long long)a);
    fail(sp == Sp::Global ? "global-misaligned" : "shared-misaligned", t, d, buf);
  }
  switch (sp) {
    case Sp::Global: case Sp::Const: {
      if (!dev_->check_global(a, n)) {
        const char* nm = dev_->alloc_name(a);
        snprintf(buf, sizeof buf, "%s of %u bytes at 0x%llx is outside every allocation%s%s", write ? "write" : "read", n,
                 (unsigned long long)a, nm ? " (it starts inside " : "", nm ? nm : "");
        fail("global-bounds", t, d, std::string(buf) + (nm ? ")" : ""));
      }
      if (write && sp == Sp::Const) fail("global-bounds", t, d, "write to constant memory");
      return (uint8_t*)a;
    }
    case Sp::Shared: case Sp::SharedCluster: {
      uint32_t off;
      Cta* c;
      if (sp == Sp::Shared) {
        if (a >= (1ull << kClusterRankShift)) {
          snprintf(buf, sizeof buf, "shared::cta address 0x%llx is not in this CTA's window", (unsigned long long)a);
          fail("shared-bounds", t, d, buf);
        }
        c = t->cta;
        off = (uint32_t)a;
      } else {
        if (a >> 32) fail("shared-bounds", t, d, "shared::cluster address above 32 bits");
        c = cluster_cta(t, d, (uint32_t)a, &off);
      }
      if ((uint64_t)off + n > c->smem.size()) {
        snprintf(buf, sizeof buf, "%s of %u bytes at shared offset 0x%x past the launch's %zu bytes of shared memory",
                 write ? "write" : "read", n, off, c->smem.size());
        fail("shared-bounds", t, d, buf);
      }
      if (c->live == 0 && c != t->cta) fail("shared-bounds", t, d, "access to an exited CTA's shared memory");
      if (opt_.strict) {
        for (uint32_t b = 0; b < n; ++b) {
          uint8_t s = c->shadow[off + b];
          if (!s) continue;
          if (s & kShadowInflight) {
            snprintf(buf, sizeof buf, "%s of shared offset 0x%x while an asynchronous copy is still writing it",
                     write ? "write" : "read", off + b);
            fail("async-inflight", t, d, buf);
          }
          if (s & kShadowRacy) {
            if (write) {
              c->shadow[off + b] &= ~kShadowRacy;   // this store defines the byte again
            } else {
              snprintf(buf, sizeof buf, "read of shared offset 0x%x, which two asynchronous copies wrote while both "
                       "were in flight (a write-write race: either copy's byte may be there)", off + b);
              fail("async-inflight", t, d, buf);
            }
          }
          if (write && (s & kShadowAsyncRead)) {
            snprintf(buf, sizeof buf, "write to shared offset 0x%x while a bulk/TMA store is still reading it "
                     "(missing cp.async.bulk.wait_group.read)", off + b);
            fail("async-inflight", t, d, buf);
          }
          if (write && (s & kShadowWgmmaRead)) check_wgmma_overwrite(t, d, c, off + b, 1, "an ordinary store");
          if (write && (s & 8)) {
            snprintf(buf, sizeof buf, "ordinary store to shared offset 0x%x overwrites a live mbarrier", off + b);
            fail("mbarrier", t, d, buf);
          }
        }
      }
      if (opt_.strict) check_delivered(t, d, c, off, n, write);
      if (opt_.strict && d && c == t->cta) race_access(t, d, c, off, n, write);
      if (write) note_generic_smem_write(t, c, off, n);
      if (cta_out) *cta_out = c;
      if (smem_off) *smem_off = off;
      return c->smem.data() + off;
    }
    case Sp::Local: {
      if (a + n > t->local.size()) {
        snprintf(buf, sizeof buf, "local access at 0x%llx past the thread's %zu bytes", (unsigned long long)a, t->local.size());
        fail("local-bounds", t, d, buf);
      }
      return t->local.data() + a;
    }
    case Sp::Param: {
      if (a >= 2 * kCallParamBase) {
        Frame& f = t->frames.back();
        uint64_t o = a - 2 * kCallParamBase;
        if (o + n > f.in_params.size()) fail("param-bounds", t, d, "function parameter access out of range");
        return f.in_params.data() + o;
      }
      if (a >= kCallParamBase) {
        Frame& f = t->frames.back();
        uint64_t o = a - kCallParamBase;
        if (o + n > f.call_params.size()) fail("param-bounds", t, d, "call parameter access out of range");
        return f.call_params.data() + o;
      }
      if (write) fail("param-bounds", t, d, "write to kernel parameters");
      if (a + n > params_.size()) fail("param-bounds", t, d, "kernel parameter access past the parameters");
      return const_cast<uint8_t*>(params_.data()) + a;
    }
    default: break;
  }
  fail("unsupported", t, d, "memory space");
}

void Engine::note_generic_smem_write(Thread* t, Cta* c, uint32_t off, uint32_t n) {
  if (!opt_.strict) return;
  uint16_t id = (uint16_t)(t->linear + 1);
  // only a thread of the owning CTA can fence its writes; remote (DSMEM) writes are tagged too
  for (uint32_t b = 0; b < n; ++b) c->dirty_owner[off + b] = id;
  if (c != t->cta) return;
  if (!t->dirty.empty() && t->dirty.back().first + t->dirty.back().second == off) t->dirty.back().second += n;
  else t->dirty.push_back({off, n});
}

void Engine::fence_proxy_async(Thread* t) {
  Cta* c = t->cta;
  uint16_t id = (uint16_t)(t->linear + 1);
  for (auto& r : t->dirty)
    for (uint32_t b = 0; b < r.second; ++b)
      if (c->dirty_owner[r.first + b] == id) c->dirty_owner[r.first + b] = 0;
  t->dirty.clear();
}

void Engine::check_smem_read(Thread* t, const DInstr* d, Cta* c, uint32_t off, uint32_t n) {
  if (!opt_.strict) return;
  if (c == t->cta) race_async_read(t, d, t->rc, -1, c, off, n, "a bulk/TMA copy's read");
  for (uint32_t b = 0; b < n; ++b) {
    if (c->shadow[off + b] & kShadowInflight) {
      char buf[160];
      snprintf(buf, sizeof buf, "async-proxy read of shared offset 0x%x while a copy is still writing it", off + b);
      fail("async-inflight", t, d, buf);
    }
    if (c->shadow[off + b] & kShadowRacy) {
      char buf[200];
      snprintf(buf, sizeof buf, "async-proxy read of shared offset 0x%x, which two asynchronous copies wrote while both "
               "were in flight (a write-write race)", off + b);
      fail("async-inflight", t, d, buf);
    }
    if (c->dirty_owner[off + b]) {
      char buf[200];
      snprintf(buf, sizeof buf, "shared offset 0x%x was written through the generic proxy by thread %u and read by the "
               "async proxy (TMA/bulk store, wgmma) with no fence.proxy.async in between", off + b, c->dirty_owner[off + b] - 1);
      fail("proxy-fence", t, d, buf);
    }
  }
}

void Engine::wgmma_read_begin(Cta* c, WgmmaRead r) {
  for (auto& run : r.runs)
    for (uint32_t b = 0; b < run.len; ++b)
      if (c->wgmma_readers[run.off + b]++ == 0) c->shadow[run.off + b] |= kShadowWgmmaRead;
  c->wgmma_reads.push_back(std::move(r));
}

// Warp w's wgmma.wait_group `keep`: its groups older than the newest `keep` are complete. One
// warp's wait ends the reads of the whole wgmma (it is one operation; CUTLASS releases a stage
// from one thread of the warpgroup after that thread's own warp waited).
void Engine::wgmma_read_end(Warp* w, uint64_t keep) {
  Cta* c = w->cta;
  uint32_t wg = w->id / 4, j = w->id % 4;
  uint64_t done = w->wg_commits > keep ? w->wg_commits - keep : 0;
  for (size_t i = 0; i < c->wgmma_reads.size();) {
    WgmmaRead& r = c->wgmma_reads[i];
    if (r.wg != wg || r.group[j] >= done) { ++i; continue; }
    for (auto& run : r.runs)
      for (uint32_t b = 0; b < run.len; ++b)
        if (--c->wgmma_readers[run.off + b] == 0) c->shadow[run.off + b] &= ~kShadowWgmmaRead;
    c->wgmma_reads.erase(c->wgmma_reads.begin() + i);
  }
}

// A write (`writer` says what kind) to bytes an in-flight wgmma still reads as an operand.
void Engine::check_wgmma_overwrite(Thread* t, const DInstr* d, Cta* c, uint32_t off, uint32_t n, const char* writer) {
  if (!opt_.strict) return;
  for (uint32_t b = 0; b < n; ++b) {
    if (!c->wgmma_readers[off + b]) continue;
    for (const WgmmaRead& r : c->wgmma_reads)
      for (auto& run : r.runs)
        if (off + b >= run.off && off + b < run.off + run.len) {
          char buf[400];
          snprintf(buf, sizeof buf, "%s writes shared offset 0x%x of CTA (%u,%u,%u), which the wgmma at PTX line %d "
                   "(warpgroup %u) still reads as operand %c: no wgmma.wait_group covering that wgmma came first",
                   writer, off + b, c->id[0], c->id[1], c->id[2], r.instr && r.instr->src ? r.instr->src->line : 0, r.wg,
                   run.operand);
          fail("wgmma-operand-overwrite", t, d, buf);
        }
  }
}

// ---------------------------------------------------------------------------------------------
// Shared-memory races (racecheck's job, strict "shared-race"): a plain access (ld/st/ldmatrix/
// stmatrix with no memory order, not volatile) to bytes another thread last wrote with a plain
// store, or a plain store to bytes another thread last read, where no synchronization orders the
// two: the accessing thread's race clock does not cover the other's epoch at its access (same warp:
// the lane entry; other warps: the warp entry). Clocks travel with the barriers, mbarrier
// arrive -> wait and warp collectives as Knowledge does. Limits: one writer and one reader are kept
// per byte (an unordered reader followed by an ordered one hides the first); atomics, volatile and
// ordered accesses synchronize through memory and clear the byte's history; accesses to another
// CTA's shared memory (DSMEM) are not checked; copies that land are the async checks' business.

void Engine::race_put(RaceCarry& into, const Thread* t) {
  uint32_t* row = into.l[t->warp->id];
  for (int i = 0; i < 32; ++i) {
    into.w[i] = std::max(into.w[i], t->rc.w[i]);
    row[i] = std::max(row[i], t->rc.l[i]);
  }
}

void Engine::race_take(Thread* t, const RaceCarry& from) {
  const uint32_t* row = from.l[t->warp->id];
  for (int i = 0; i < 32; ++i) {
    t->rc.w[i] = std::max(t->rc.w[i], from.w[i]);
    t->rc.l[i] = std::max(t->rc.l[i], row[i]);
  }
}

static void race_merge(RaceCarry& into, const RaceCarry& from) {
  for (int i = 0; i < 32; ++i) into.w[i] = std::max(into.w[i], from.w[i]);
  for (int w = 0; w < 32; ++w)
    for (int i = 0; i < 32; ++i) into.l[w][i] = std::max(into.l[w][i], from.l[w][i]);
}

// Is the access by t (clock rc) ordered after thread `who1 - 1`'s access at epochs (we, le)?
static bool race_ordered(const Thread* t, const RaceClock& rc, uint16_t who1, uint32_t we, uint32_t le) {
  const uint32_t who = who1 - 1u, ww = who / 32, wl = who % 32;
  if (ww == t->warp->id) return wl == t->lane || rc.l[wl] >= le;
  return rc.w[ww] >= we;
}

static std::string race_who(uint16_t who1) {
  char buf[80];
  snprintf(buf, sizeof buf, "thread %u (warp %u, lane %u)", who1 - 1u, (who1 - 1u) / 32, (who1 - 1u) % 32);
  return buf;
}

void Engine::race_access(Thread* t, const DInstr* d, Cta* c, uint32_t off, uint32_t n, bool write) {
  if (c->race.empty()) return;
  if (!d->plain_mem) {
    if (write) race_clear(c, off, n);
    return;
  }
  // ldmatrix/stmatrix run inside their warp collective, after its release: they count as of the
  // rendezvous, so every lane that took part is ordered after them.
  const uint32_t back = (d->op == Op::Ldmatrix || d->op == Op::Stmatrix) ? 1 : 0;
  const uint32_t we = t->rc.w[t->warp->id] - back, le = t->rc.l[t->lane] - back;
  const uint16_t me = (uint16_t)(t->linear + 1);
  const uint32_t line = d->src ? d->src->line : 0;
  for (uint32_t b = 0; b < n; ++b) {
    RaceCell& x = c->race[off + b];
    if (x.w && x.w != me && !race_ordered(t, t->rc, x.w, x.we, x.wle)) {
      char buf[400];
      snprintf(buf, sizeof buf, "%s of shared offset 0x%x, which %s wrote at PTX line %u, with no synchronization "
               "ordering that write before this access (no barrier, mbarrier arrive->wait or warp collective "
               "between them)", write ? "write" : "read", off + b, race_who(x.w).c_str(), x.wline);
      fail("shared-race", t, d, buf);
    }
    if (write && x.r && x.r != me && !race_ordered(t, t->rc, x.r, x.re, x.rle)) {
      char buf[400];
      snprintf(buf, sizeof buf, "write of shared offset 0x%x, which %s read at PTX line %u, with no synchronization "
               "ordering that read before this write (no barrier, mbarrier arrive->wait or warp collective between "
               "them)", off + b, race_who(x.r).c_str(), x.rline);
      fail("shared-race", t, d, buf);
    }
    if (write) {
      x.w = me; x.we = we; x.wle = le; x.wline = line;
      x.r = 0;
    } else {
      x.r = me; x.re = we; x.rle = le; x.rline = line;
    }
  }
}

void Engine::race_clear(Cta* c, uint32_t off, uint32_t n) {
  if (c->race.empty()) return;
  for (uint32_t b = 0; b < n && off + b < c->race.size(); ++b) c->race[off + b] = RaceCell();
}

void Engine::race_async_read(Thread* t, const DInstr* d, const RaceClock& rc, int wg, Cta* c, uint32_t off,
                             uint32_t n, const char* what) {
  if (c->race.empty()) return;
  for (uint32_t b = 0; b < n; ++b) {
    const RaceCell& x = c->race[off + b];
    if (!x.w) continue;
    const uint32_t ww = (x.w - 1u) / 32;
    if (wg >= 0 ? (ww >= (uint32_t)wg && ww < (uint32_t)wg + 4) : x.w == t->linear + 1) continue;
    if (rc.w[ww] >= x.we) continue;
    char buf[400];
    snprintf(buf, sizeof buf, "%s of shared offset 0x%x, which %s wrote at PTX line %u, with no synchronization "
             "ordering that write before it", what, off + b, race_who(x.w).c_str(), x.wline);
    fail("shared-race", t, d, buf);
  }
}

// ---------------------------------------------------------------------------------------------
// mbarriers

MBar& Engine::mbar(Thread* t, const DInstr* d, Cta* c, uint32_t off, bool must_be_valid) {
  MBar& m = c->mbars[off];
  if (must_be_valid && !m.valid) {
    char buf[120];
    snprintf(buf, sizeof buf, "mbarrier at shared offset 0x%x used before mbarrier.init (or after inval)", off);
    fail("mbarrier", t, d, buf);
  }
  return m;
}

void merge_knowledge(Knowledge& into, const Knowledge& from) {
  if (into.size() < from.size()) into.resize(from.size(), 0);
  for (size_t i = 0; i < from.size(); ++i)
    if (from[i] > into[i]) into[i] = from[i];
}

void Engine::observe(Thread* t, MBar& m) {
  merge_knowledge(t->know, m.completed_carry);
  if (m.rcompleted) race_take(t, *m.rcompleted);
  if (t->know.size() <= m.id) t->know.resize(m.id + 1, 0);
  if (t->know[m.id] < m.phase) t->know[m.id] = m.phase;
}

void Engine::check_delivered(Thread* t, const DInstr* d, Cta* c, uint32_t off, uint32_t n, bool write) {
  for (uint32_t b = 0; b < n; ++b) {
    uint32_t id1 = c->deliv_id[off + b];
    if (!id1) continue;
    uint32_t ph = c->deliv_phase[off + b];
    if (t->know.size() < id1 || t->know[id1 - 1] < ph + 1) {
      char buf[400];
      snprintf(buf, sizeof buf, "%s of shared offset 0x%x, which an asynchronous copy filled in phase %u of mbarrier "
               "#%u, but this thread has not observed that phase (no wait on the mbarrier, and no barrier with a "
               "thread that waited): the access races with the copy", write ? "write" : "read", off + b, ph, id1 - 1);
      fail("async-unobserved", t, d, buf);
    }
    if (write) c->deliv_id[off + b] = 0;   // now ordinary data
  }
}

static void mbar_maybe_complete(Engine* e, MBar& m) {
  if (m.pending == 0 && m.tx == 0) {
    merge_knowledge(m.completed_carry, m.carry);
    m.carry.clear();
    if (m.rcarry) {
      if (!m.rcompleted) m.rcompleted = std::make_shared<RaceCarry>();
      race_merge(*m.rcompleted, *m.rcarry);
      m.rcarry.reset();
    }
    ++m.phase;
    m.pending = m.expected;
    std::vector<Thread*> w;
    w.swap(m.waiters);
    for (Thread* t : w) e->wake(t);
    e->progress();
  }
}

void Engine::mbar_arrive(Thread* t, const DInstr* d, Cta* c, uint32_t off, uint32_t count, bool no_complete) {
  MBar& m = mbar(t, d, c, off);
  if (count == 0 || count > m.pending) {
    char buf[200];
    snprintf(buf, sizeof buf, "arrive with count %u on the mbarrier at shared offset 0x%x with %u arrivals pending "
             "(phase %u, expected %u)", count, off, m.pending, m.phase, m.expected);
    fail("mbarrier-overarrive", t, d, buf);
  }
  merge_knowledge(m.carry, t->know);
  if (race_on() && c == t->cta) {   // (a remote arrive's clock counts another CTA's warps)
    if (!m.rcarry) m.rcarry = std::make_shared<RaceCarry>();
    race_put(*m.rcarry, t);
    race_release(t);
  }
  m.pending -= count;
  if (no_complete && m.pending == 0 && m.tx == 0) fail("mbarrier", t, d, "arrive.noComplete completed the phase");
  mbar_maybe_complete(this, m);
}

void Engine::mbar_tx(Thread* t, const DInstr* d, Cta* c, uint32_t off, int64_t delta) {
  MBar& m = mbar(t, d, c, off);
  m.tx += delta;
  const int64_t lim = (1 << 20) - 1;
  if (m.tx > lim || m.tx < -lim) {
    char buf[200];
    snprintf(buf, sizeof buf, "transaction count %lld of the mbarrier at shared offset 0x%x is outside +-(2^20-1)",
             (long long)m.tx, off);
    fail("mbarrier-tx", t, d, buf);
  }
  if (m.pending == 0) {
    // tx reached zero with no arrivals pending: the phase completes
    mbar_maybe_complete(this, m);
  }
}

// ---------------------------------------------------------------------------------------------
// Barriers and rendezvous

void Engine::bar_arrive(Thread* t, const DInstr* d, uint32_t id, uint32_t count, bool has_count, bool wait) {
  Cta* c = t->cta;
  NamedBarrier& b = c->bars[id];
  if (has_count && (count == 0 || count % 32))
    fail("named-barrier", t, d, "thread count " + std::to_string(count) + " is not a positive multiple of 32");
  if (b.arrived == 0) {
    b.counted = has_count;
    b.expected = has_count ? count : 0;
  } else if (b.counted != has_count || (has_count && b.expected != count)) {
    fail("named-barrier", t, d, "barrier " + std::to_string(id) + " used with " +
         (has_count ? std::to_string(count) : std::string("all")) + " threads while " + std::to_string(b.arrived) +
         " threads already arrived expecting " + (b.counted ? std::to_string(b.expected) : std::string("all")));
  }
  ++b.arrived;
  merge_knowledge(b.carry, t->know);
  if (race_on()) {
    if (!b.rcarry) b.rcarry = std::make_unique<RaceCarry>();
    race_put(*b.rcarry, t);
    race_release(t);
  }
  if (wait) {
    b.waiters.push_back(t);
    t->wait_addr = id;
    block(t, TS::Bar, d);
  }
  check_bar_complete(c, id);
}

void Engine::check_bar_complete(Cta* c, uint32_t id) {
  NamedBarrier& b = c->bars[id];
  uint32_t need = b.counted ? b.expected : c->live;
  if (b.arrived == 0 || b.arrived < need) return;
  if (b.arrived > need)
    fail("named-barrier", b.waiters.empty() ? nullptr : b.waiters[0], nullptr,
         "barrier " + std::to_string(id) + " got " + std::to_string(b.arrived) + " arrivals for " + std::to_string(need));
  std::vector<Thread*> w;
  w.swap(b.waiters);
  b.arrived = 0;
  if (rec_) rec_->bar_completed(c, id);
  for (Thread* t : w) {
    merge_knowledge(t->know, b.carry);
    if (b.rcarry) race_take(t, *b.rcarry);
    if (t->wait_instr && t->wait_instr->op == Op::BarRed) {   // bar.red: every waiter gets the reduction
      extern void bar_red_result(Engine*, Thread*, uint32_t);
      bar_red_result(this, t, b.red_kind == 0 ? b.red_value : (b.red_value ? 1 : 0));
    }
    wake(t);
  }
  b.carry.clear();
  b.rcarry.reset();
  b.red_kind = -1;
  b.red_value = 0;
}

void Engine::cluster_arrive(Thread* t, bool release) {
  Cluster* cl = t->cta->cluster;
  t->cluster_gen = cl->arrive_gen;   // the generation this arrival belongs to
  t->cluster_arrived = true;
  ++cl->arrived;
  if (release) {
    merge_knowledge(cl->carry, t->know);
    if (!cl->rcarry.empty()) {
      race_put(cl->rcarry[t->cta->rank], t);
      race_release(t);
    }
  }
  check_cluster_bar(cl);
}

void Engine::cluster_wait(Thread* t, const DInstr* d) {
  Cluster* cl = t->cta->cluster;
  if (!t->cluster_arrived) fail("cluster-barrier", t, d, "barrier.cluster.wait without a preceding barrier.cluster.arrive");
  t->cluster_arrived = false;
  if (cl->arrive_gen != t->cluster_gen) {   // already completed
    merge_knowledge(t->know, cl->carry);
    if (!cl->rcarry.empty()) race_take(t, cl->rcarry[t->cta->rank]);
    return;
  }
  cl->waiters.push_back(t);
  block(t, TS::ClusterBar, d);
}

void Engine::check_cluster_bar(Cluster* cl) {
  if (!cl->arrived || cl->arrived < cl->live) return;
  ++cl->arrive_gen;
  cl->arrived = 0;
  std::vector<Thread*> w;
  w.swap(cl->waiters);
  for (Thread* t : w) {
    merge_knowledge(t->know, cl->carry);
    if (!cl->rcarry.empty()) race_take(t, cl->rcarry[t->cta->rank]);
    wake(t);
  }
}

bool Engine::warp_rendezvous(Thread* t, const DInstr* d, uint32_t need) {
  Warp* w = t->warp;
  bool aligned = d->flags & F_ALIGNED;
  if (need & ~w->live_mask) fail("warp-sync", t, d, "membermask names lanes that have exited");
  size_t si = w->slots.size();
  for (size_t i = 0; i < w->slots.size(); ++i) {
    Warp::CollSlot& s = w->slots[i];
    if (s.coll == d || (!aligned && !(s.coll->flags & F_ALIGNED) && s.coll->op == d->op && s.mask == need)) {
      si = i;
      break;
    }
    if ((s.mask & need) || aligned || (s.coll->flags & F_ALIGNED))
      fail("warp-divergence", t, d, "lanes of the warp wait at different collective instructions with overlapping "
           "lanes (other: PTX line " + std::to_string(s.coll->src ? s.coll->src->line : 0) + ")");
  }
  if (si == w->slots.size()) w->slots.push_back(Warp::CollSlot{d, need, 0});
  Warp::CollSlot& s = w->slots[si];
  s.arrived |= 1u << t->lane;
  w->arrived |= 1u << t->lane;
  if ((s.arrived & s.mask) != s.mask) {
    block(t, TS::Coll, d);
    return false;
  }
  // setmaxnreg.inc waits until the CTA's pool (its launch allocation) has the registers
  if (s.coll->op == Op::Setmaxnreg && (s.coll->flags & F_INC)) {
    uint32_t n = (uint32_t)s.coll->ops[0].imm;
    Cta* c = w->cta;
    if (n > w->regs_budget && c->regs_in_use - w->regs_budget * 32 + n * 32 > c->regs_pool) {
      block(t, TS::Coll, d);
      c->regs_waiters.push_back(w);
      return false;
    }
  }
  finish_warp_collective(w, si, t);
  if (d->op == Op::Setmaxnreg && !(d->flags & F_INC)) retry_setmaxnreg(t->cta);
  return true;
}

// Executes the collective of slot `si`, then releases its lanes (but `except`, the caller).
void Engine::finish_warp_collective(Warp* w, size_t si, Thread* except) {
  Warp::CollSlot s = w->slots[si];
  w->slots.erase(w->slots.begin() + si);
  uint32_t lanes = s.arrived;
  w->arrived &= ~lanes;
  // lanes that synchronize share what they know (bar.warp.sync orders memory; the other warp
  // collectives are treated the same way, the lenient choice)
  {
    Knowledge k;
    for (int l = 0; l < 32; ++l) if (lanes >> l & 1) merge_knowledge(k, w->lanes[l]->know);
    if (!k.empty()) for (int l = 0; l < 32; ++l) if (lanes >> l & 1) w->lanes[l]->know = k;
    if (race_on()) {
      RaceClock rc;
      for (int l = 0; l < 32; ++l)
        if (lanes >> l & 1)
          for (int i = 0; i < 32; ++i) {
            rc.w[i] = std::max(rc.w[i], w->lanes[l]->rc.w[i]);
            rc.l[i] = std::max(rc.l[i], w->lanes[l]->rc.l[i]);
          }
      for (int l = 0; l < 32; ++l)
        if (lanes >> l & 1) {
          w->lanes[l]->rc = rc;
          race_release(w->lanes[l]);
        }
    }
  }
  extern void exec_warp_collective_entry(Engine*, Warp*, uint32_t, const DInstr*);
  exec_warp_collective_entry(this, w, lanes, s.coll);
  for (int l = 0; l < 32; ++l)
    if ((lanes >> l & 1) && w->lanes[l] != except) {
      Thread* o = w->lanes[l];
      o->frames.back().pc++;
      wake(o);
    }
}

void Engine::retry_setmaxnreg(Cta* c) {
  for (size_t i = 0; i < c->regs_waiters.size();) {
    Warp* w = c->regs_waiters[i];
    size_t si = 0;
    while (si < w->slots.size() && w->slots[si].coll->op != Op::Setmaxnreg) ++si;
    uint32_t n = (uint32_t)w->slots[si].coll->ops[0].imm;
    if (c->regs_in_use - w->regs_budget * 32 + n * 32 <= c->regs_pool) {
      c->regs_waiters.erase(c->regs_waiters.begin() + i);
      finish_warp_collective(w, si, nullptr);
      i = 0;
    } else ++i;
  }
}

void Engine::recheck_warp_collective(Warp* w) {
  // an exited lane no longer counts for .aligned collectives (and activemask), which need the live lanes
  for (size_t i = 0; i < w->slots.size();) {
    Warp::CollSlot& s = w->slots[i];
    if ((s.coll->flags & F_ALIGNED) || s.coll->op == Op::Activemask) s.mask &= w->live_mask;
    if (s.mask & ~w->live_mask)
      fail("warp-sync", w->lanes[__builtin_ctz(s.arrived)], s.coll, "a lane named in membermask exited");
    if (s.arrived && (s.arrived & s.mask) == s.mask) finish_warp_collective(w, i, nullptr);
    else ++i;
  }
}

bool Engine::warpgroup_rendezvous(Thread* t, const DInstr* d) {
  Cta* c = t->cta;
  uint32_t wg = t->linear / 128;
  if (c->warpgroup_arrived[wg] == 0) c->warpgroup_coll[wg] = d;
  else if (c->warpgroup_coll[wg] != d)
    fail("warp-divergence", t, d, "threads of the warpgroup wait at different wgmma.mma_async instructions (other: PTX line " +
         std::to_string(c->warpgroup_coll[wg]->src->line) + ")");
  ++c->warpgroup_arrived[wg];
  uint32_t members = 0;
  for (uint32_t w = wg * 4; w < wg * 4 + 4 && w < c->warps.size(); ++w) members += __builtin_popcount(c->warps[w]->live_mask);
  if (members != 128 && c->warpgroup_arrived[wg] == 1) {
    if (c->threads.size() < (wg + 1) * 128) fail("wgmma", t, d, "wgmma in a CTA whose last warpgroup is incomplete");
  }
  if (c->warpgroup_arrived[wg] < 128) {
    block(t, TS::Coll, d);
    return false;
  }
  std::vector<Thread*> th;
  for (uint32_t i = wg * 128; i < wg * 128 + 128; ++i) th.push_back(c->threads[i].get());
  for (Thread* x : th)
    if (x->state == TS::Exited) fail("wgmma", t, d, "a thread of the warpgroup exited before wgmma.mma_async");
  exec_warpgroup_wgmma(this, c, wg, th);
  c->warpgroup_arrived[wg] = 0;
  c->warpgroup_coll[wg] = nullptr;
  for (Thread* x : th)
    if (x != t) {
      x->frames.back().pc++;
      wake(x);
    }
  return true;
}

// ---------------------------------------------------------------------------------------------
// Asynchronous copies

void Engine::enqueue(AsyncOp op) {
  op.issued_at = instr_total_;
  async_.push_back(std::move(op));
}

bool Engine::complete_one_async(bool random_pick) {
  if (async_.empty()) return false;
  size_t i = random_pick ? (size_t)(rng_() % async_.size()) : 0;
  AsyncOp op = std::move(async_[i]);
  async_.erase(async_.begin() + i);
  complete(op);
  return true;
}

static void reduce_bytes(uint8_t* dst, const uint8_t* src, uint32_t n, T ty, AtomOp aop) {
  if (aop == AtomOp::Inc || aop == AtomOp::Dec) fail_unsupported("unsupported: bulk reduction .inc/.dec");
  auto red32f = [&](float a, float b) {
    switch (aop) {
      case AtomOp::Add: return a + b;
      case AtomOp::Min: return std::min(a, b);
      case AtomOp::Max: return std::max(a, b);
      default: fail_unsupported("unsupported: bulk reduction of f32 with a bitwise operation");
    }
  };
  if (ty == T::F32) {
    for (uint32_t i = 0; i + 4 <= n; i += 4) {
      float a, b;
      memcpy(&a, dst + i, 4); memcpy(&b, src + i, 4);
      float r = red32f(a, b);
      memcpy(dst + i, &r, 4);
    }
  } else if (ty == T::S32 || ty == T::U32 || ty == T::B32) {
    for (uint32_t i = 0; i + 4 <= n; i += 4) {
      uint32_t a, b;
      memcpy(&a, dst + i, 4); memcpy(&b, src + i, 4);
      uint32_t r = aop == AtomOp::Add ? a + b : aop == AtomOp::And ? (a & b) : aop == AtomOp::Or ? (a | b) : aop == AtomOp::Xor ? (a ^ b)
                   : aop == AtomOp::Min ? (ty == T::S32 ? (uint32_t)std::min((int32_t)a, (int32_t)b) : std::min(a, b))
                   : (ty == T::S32 ? (uint32_t)std::max((int32_t)a, (int32_t)b) : std::max(a, b));
      memcpy(dst + i, &r, 4);
    }
  } else if ((ty == T::F16 || ty == T::BF16 || ty == T::F16x2 || ty == T::BF16x2) && aop == AtomOp::Add) {
    bool bf = ty == T::BF16 || ty == T::BF16x2;
    for (uint32_t i = 0; i + 2 <= n; i += 2) {
      uint16_t a, b;
      memcpy(&a, dst + i, 2); memcpy(&b, src + i, 2);
      uint16_t r = num::hadd(a, b, bf, num::Rnd::kRN, false, false);
      memcpy(dst + i, &r, 2);
    }
  } else {
    fail_unsupported("unsupported: bulk reduction element type or operation");
  }
}

void Engine::complete(AsyncOp& op) {
  progress();
  switch (op.kind) {
    case AsyncOp::kTmaLoad: {
      tma::TensorMap m;
      std::string err;
      tma::decode(op.tmap, &m, &err);
      std::vector<uint8_t> box(op.bytes + 1024, 0);
      uint8_t fill[16];
      tma::oob_value(m, fill);
      // gather the box once (global reads at completion time), then write every destination
      std::vector<std::tuple<uint32_t, uint64_t, uint32_t, bool>> runs;
      tma::walk_box(m, op.coords, op.smem, [&](uint32_t so, uint64_t ga, uint32_t nb, bool in) {
        runs.emplace_back(so, ga, nb, in);
      });
      for (Cta* c : op.dst_ctas) {
        for (auto& r : runs) {
          uint32_t so = std::get<0>(r), nb = std::get<2>(r);
          uint8_t* dst = c->smem.data() + op.smem + so;
          if (op.smem + so + nb > c->smem.size()) fail("tma", op.issuer, op.instr, "box write past shared memory");
          check_wgmma_overwrite(op.issuer, op.instr, c, op.smem + so, nb, "a TMA load landing");
          if (std::get<3>(r)) {
            if (!dev_->check_global(std::get<1>(r), nb)) {
              char buf[160];
              snprintf(buf, sizeof buf, "TMA load reads 0x%llx (%u bytes), outside every allocation: the tensor map's "
                       "extent is larger than its buffer", (unsigned long long)std::get<1>(r), nb);
              fail("global-bounds", op.issuer, op.instr, buf);
            }
            memcpy(dst, (const void*)std::get<1>(r), nb);
          } else {
            for (uint32_t b = 0; b < nb; ++b) dst[b] = fill[b % m.elem_bytes];
          }
        }
        MBar& mb = mbar(op.issuer, op.instr, c, op.mbar);
        for (uint32_t b = 0; b < op.bytes; ++b) {
          async_write_end(c, op.smem + b);
          c->dirty_owner[op.smem + b] = 0;
          c->deliv_id[op.smem + b] = mb.id + 1;
          c->deliv_phase[op.smem + b] = mb.phase;
        }
        race_clear(c, op.smem, op.bytes);
        for (auto& r : runs) race_clear(c, op.smem + std::get<0>(r), std::get<2>(r));
        // swizzled boxes may touch bytes past op.bytes only within the footprint: clear those too
        // (bytes past op.bytes were not counted in flight at issue)
        for (auto& r : runs)
          for (uint32_t b = 0; b < std::get<2>(r); ++b) {
            uint32_t x = op.smem + std::get<0>(r) + b;
            if (x >= op.smem + op.bytes && c->inflight_n[x] == 0) c->shadow[x] &= ~kShadowInflight;
            c->dirty_owner[x] = 0;
          }
        mbar_tx(op.issuer, op.instr, c, op.mbar, -(int64_t)op.bytes);
      }
      break;
    }
    case AsyncOp::kTmaStore: case AsyncOp::kTmaReduce: case AsyncOp::kBulkS2G: case AsyncOp::kBulkReduceS2G: {
      // the source was read at the issuer's wait_group.read, or is read now; the global bytes change now
      if (!op.src_done) gather_store(op);
      T ty = (T)op.red_type;
      if (op.kind == AsyncOp::kTmaReduce) {
        tma::TensorMap m;
        std::string err;
        tma::decode(op.tmap, &m, &err);
        // CUtensorMapDataType: 2 UINT32, 3 INT32, 6 FLOAT16, 7 FLOAT32, 9 BFLOAT16, 10 FLOAT32_FTZ
        ty = m.dtype == 7 || m.dtype == 10 ? T::F32 : m.dtype == 3 ? T::S32 : m.dtype == 2 ? T::U32
             : m.dtype == 6 ? T::F16 : m.dtype == 9 ? T::BF16 : T::None;
      }
      bool store = op.kind == AsyncOp::kTmaStore || op.kind == AsyncOp::kBulkS2G;
      size_t pos = 0;
      for (const AsyncOp::GRun& r : op.gruns) {
        if (store) memcpy((void*)r.ga, op.gdata.data() + pos, r.nb);
        else reduce_bytes((uint8_t*)r.ga, op.gdata.data() + pos, r.nb, ty, (AtomOp)op.red_op);
        pos += r.nb;
      }
      break;
    }
    case AsyncOp::kBulkG2S: case AsyncOp::kBulkS2S: {
      const uint8_t* src = op.kind == AsyncOp::kBulkG2S ? (const uint8_t*)op.gaddr : op.src_cta->smem.data() + op.src_smem;
      if (op.kind == AsyncOp::kBulkS2S) {
        for (uint32_t b = 0; b < op.bytes; ++b) op.src_cta->shadow[op.src_smem + b] &= ~kShadowAsyncRead;
      }
      for (Cta* c : op.dst_ctas) {   // (several with .multicast::cluster)
        check_wgmma_overwrite(op.issuer, op.instr, c, op.smem, op.bytes, "a bulk copy landing");
        if ((AtomOp)op.red_op != AtomOp::None)   // cp.reduce.async.bulk into shared memory
          reduce_bytes(c->smem.data() + op.smem, src, op.bytes, (T)op.red_type, (AtomOp)op.red_op);
        else
          memcpy(c->smem.data() + op.smem, src, op.bytes);
        MBar& mb = mbar(op.issuer, op.instr, c, op.mbar);
        for (uint32_t b = 0; b < op.bytes; ++b) {
          async_write_end(c, op.smem + b);
          c->dirty_owner[op.smem + b] = 0;
          c->deliv_id[op.smem + b] = mb.id + 1;
          c->deliv_phase[op.smem + b] = mb.phase;
        }
        race_clear(c, op.smem, op.bytes);
        mbar_tx(op.issuer, op.instr, c, op.mbar, -(int64_t)op.bytes);
      }
      break;
    }
    default: break;
  }
}

// ---------------------------------------------------------------------------------------------
// Global memory ordering (strict check "global-async-order")
//
// PTX: a bulk/TMA store or reduction to global memory is performed by the async proxy; its writes
// are complete, and visible to the issuing thread, only when a cp.async.bulk.wait_group *without*
// .read covers its bulk group (.read only says the shared-memory source may be reused). Another
// thread may rely on them only through a release by the issuer after that completion (a release
// operation, or a fence.acq_rel/sc/membar before a strong write) that it acquires (an acquire
// operation, or a strong read followed by a fence), or a barrier with a thread that did.
//
// Model: the issuer's knowledge ids I (writes issued), S (the same, observed without release) and D
// (groups completed) ride in Thread::know and cross barriers, mbarriers and collectives like the
// mbarrier phases do; a global word written by a strong write carries the writer's release
// knowledge (rel) and its own S entry (raw); an acquire of that word merges them into the reader's
// knowledge, a relaxed or weak read into gpending (acquired at the reader's next fence). An access
// (ld/st/atom/red or an async copy's global side, at issue) to bytes a recorded async write covers is
// fine when the accessor knows D >= the write's group + 1; it is reported when the accessor is
// ordered after the write's issue but not its completion (knows I: released or waited too early),
// knows it only through S (the flag was written without a release), or only through gpending (the
// flag was read without an acquire). An access with no knowledge of the write at all is not reported
// (nothing claims an order: e.g. unordered reductions of other CTAs onto the same dQ rows), nor is a
// reduction onto a reduction of the same thread. Knowledge through gpending does not report a
// reduction onto a reduction (a relaxed tile counter is no claim of order). Scopes are not
// distinguished; plain (weak) stores carry nothing.

static inline uint32_t kget(const Knowledge& k, uint32_t id) { return id < k.size() ? k[id] : 0; }
static inline void kset_max(Knowledge& k, uint32_t id, uint32_t v) {
  if (k.size() <= id) k.resize(id + 1, 0);
  if (k[id] < v) k[id] = v;
}

void Engine::gather_store(AsyncOp& op) {
  Cta* c = op.src_cta;
  size_t total = 0;
  for (const AsyncOp::GRun& r : op.gruns) total += r.nb;
  op.gdata.resize(total);
  size_t pos = 0;
  for (const AsyncOp::GRun& r : op.gruns) {
    memcpy(op.gdata.data() + pos, c->smem.data() + r.so, r.nb);
    pos += r.nb;
  }
  for (uint32_t b = 0; b < op.bytes; ++b) c->shadow[op.src_smem + b] &= ~kShadowAsyncRead;
  op.src_done = true;
  op.src_cta = nullptr;   // the CTA may now exit (the write lands later)
}

void Engine::gmem_issue(Thread* t, AsyncOp& op) {
  if (!opt_.strict) return;
  if (!t->gid) {
    t->gid = next_mbar_id() + 1;
    next_mbar_id();
    next_mbar_id();
  }
  gasync_used_ = true;
  uint32_t iid = t->gid - 1;
  ++t->gissued;
  kset_max(t->know, iid, t->gissued);
  kset_max(t->know, iid + 1, t->gissued);
  bool reduce = op.kind == AsyncOp::kTmaReduce || op.kind == AsyncOp::kBulkReduceS2G;
  for (const AsyncOp::GRun& r : op.gruns) gmem_check(t, op.instr, r.ga, r.nb, reduce ? GAcc::kReduce : GAcc::kWrite);
  GWrite w;
  w.iid = iid;
  w.seq = t->gissued;
  w.done_need = (uint32_t)op.group + 1;
  w.reduce = reduce;
  w.instr = op.instr;
  for (int i = 0; i < 3; ++i) w.cta[i] = t->cta->id[i];
  w.thread = t->linear;
  w.ga = op.gruns.empty() ? 0 : op.gruns[0].ga;
  w.bytes = op.bytes;
  uint32_t idx = (uint32_t)gwrites_.size();
  gwrites_.push_back(w);
  for (const AsyncOp::GRun& r : op.gruns)
    for (uint64_t g = r.ga >> 2; g <= (r.ga + r.nb - 1) >> 2; ++g) gshadow_[g] = idx;
}

void Engine::gmem_check(Thread* t, const DInstr* d, uint64_t a, uint64_t n, GAcc acc) {
  if (!opt_.strict || gshadow_.empty() || n == 0) return;
  uint32_t last = UINT32_MAX;
  for (uint64_t g = a >> 2; g <= (a + n - 1) >> 2; ++g) {
    auto it = gshadow_.find(g);
    if (it == gshadow_.end() || it->second == last) continue;
    last = it->second;
    const GWrite& w = gwrites_[it->second];
    uint32_t I = w.iid, S = I + 1, D = I + 2;
    if (kget(t->know, D) >= w.done_need) continue;
    bool same = t->gid && t->gid - 1 == I;
    bool rr = w.reduce && acc == GAcc::kReduce;
    if (same && rr) continue;
    const char* why = nullptr;
    if (kget(t->know, I) >= w.seq)
      why = same ? "this thread issued that write itself and has not completed it: only cp.async.bulk.wait_group "
                   "without .read completes a bulk/TMA write (.read only frees the shared-memory source)"
                 : "this thread is ordered after that write's issue (through a release/acquire hand-off or a barrier) "
                   "but not after its completion: the writer released before a cp.async.bulk.wait_group without "
                   ".read completed it (.read only frees the shared-memory source)";
    else if (kget(t->know, S) >= w.seq)
      why = "this thread acquired a flag the writer wrote after issuing it, but that flag write released nothing: "
            "the writer needs cp.async.bulk.wait_group (without .read) and then a release (fence.acq_rel/fence.sc/"
            "membar before the flag's strong write, or st/red/atom.release)";
    else if (!rr && (kget(t->gpending, I) >= w.seq || kget(t->gpending, S) >= w.seq))
      why = "this thread read a flag the writer wrote after issuing it with a relaxed or plain load and no fence "
            "since: an acquire (ld.acquire, or a fence after the load) is missing";
    if (!why) continue;
    char buf[900];
    snprintf(buf, sizeof buf, "%s global 0x%llx, which the asynchronous global %s at PTX line %d of CTA (%u,%u,%u) "
             "thread %u writes (%u bytes at 0x%llx) through the async proxy: %s",
             acc == GAcc::kRead ? "read of" : acc == GAcc::kWrite ? "write to" : "reduction onto",
             (unsigned long long)std::max<uint64_t>(a, g << 2), w.reduce ? "reduction" : "store",
             w.instr && w.instr->src ? w.instr->src->line : 0, w.cta[0], w.cta[1], w.cta[2], w.thread, w.bytes,
             (unsigned long long)w.ga, why);
    fail("global-async-order", t, d, buf);
  }
}

void Engine::gmem_sync_write(Thread* t, uint64_t a, uint8_t sem) {
  if (!gmem_active() || sem == kSemWeak) return;
  const Knowledge* rel = (sem == kSemRelease || sem == kSemAcqRel) ? &t->know : t->has_fence_know ? &t->fence_know : nullptr;
  if (!rel && !t->gid) return;
  GSync& g = gsync_[a >> 2];
  if (rel) merge_knowledge(g.rel, *rel);
  if (t->gid) {
    uint32_t S = t->gid, v = t->gissued;
    bool found = false;
    for (auto& p : g.raw)
      if (p.first == S) { p.second = std::max(p.second, v); found = true; }
    if (!found) g.raw.push_back({S, v});
  }
}

void Engine::gmem_sync_read(Thread* t, uint64_t a, uint8_t sem) {
  if (!gmem_active() || gsync_.empty()) return;
  auto it = gsync_.find(a >> 2);
  if (it == gsync_.end()) return;
  Knowledge& into = (sem == kSemAcquire || sem == kSemAcqRel) ? t->know : t->gpending;
  merge_knowledge(into, it->second.rel);
  for (auto& p : it->second.raw) kset_max(into, p.first, p.second);
}

void Engine::gmem_fence(Thread* t) {
  if (!gmem_active()) return;
  if (!t->gpending.empty()) {
    merge_knowledge(t->know, t->gpending);
    t->gpending.clear();
  }
  t->fence_know = t->know;
  t->has_fence_know = true;
}

void Engine::gmem_wait_done(Thread* t, uint64_t groups_done) {
  if (!opt_.strict || !t->gid) return;
  kset_max(t->know, t->gid + 1, (uint32_t)groups_done);
}

void Engine::complete_thread_cp_async(Thread* t, size_t keep) {
  while (t->cp_groups.size() > keep) {
    for (CpAsyncOp& op : t->cp_groups.front()) {
      Cta* c = t->cta;
      uint8_t* dst = c->smem.data() + op.dst;
      check_wgmma_overwrite(t, nullptr, c, op.dst, op.bytes, "a cp.async landing");
      if (op.src_bytes) memcpy(dst, (const void*)op.src, op.src_bytes);
      if (op.bytes > op.src_bytes) memset(dst + op.src_bytes, 0, op.bytes - op.src_bytes);
      for (uint32_t b = 0; b < op.bytes; ++b) {
        async_write_end(c, op.dst + b);
        c->dirty_owner[op.dst + b] = 0;
        c->deliv_id[op.dst + b] = 0;
      }
      race_clear(c, op.dst, op.bytes);
    }
    t->cp_groups.erase(t->cp_groups.begin());
    progress();
  }
}

}  // namespace hsim
