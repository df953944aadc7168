// The engine: one launch's CTAs, the scheduler that interleaves their threads (seeded), global
// memory checks, the asynchronous operations in flight (TMA, bulk copies, cp.async) and the strict
// checks. exec.cpp executes instructions; engine.cpp owns everything else.
#pragma once
#include <map>
#include <unordered_map>
#include <string>
#include <vector>

#include "interp.h"
#include "timing.h"

namespace hsim {

struct AsyncOp {
  enum Kind : uint8_t { kTmaLoad, kTmaStore, kTmaReduce, kBulkG2S, kBulkS2G, kBulkReduceS2G, kBulkS2S, kCpAsync };
  Kind kind;
  Thread* issuer = nullptr;
  std::vector<Cta*> dst_ctas;        // loads: destination CTAs (multicast)
  uint32_t smem = 0;                 // shared::cta offset in each destination (or the source)
  uint32_t mbar = 0;                 // shared::cta offset of the mbarrier in each destination
  bool has_mbar = false;
  uint64_t gaddr = 0;                // bulk: global address
  uint32_t bytes = 0;
  uint8_t tmap[128];                 // tensor ops: the map (copied at issue)
  int32_t coords[5] = {0, 0, 0, 0, 0};
  uint8_t red_type = 0, red_op = 0;  // reductions: T and AtomOp
  Cta* src_cta = nullptr;            // stores/s2s: source CTA
  uint32_t src_smem = 0;
  const DInstr* instr = nullptr;
  bool counts_bulk_group = false;    // belongs to the issuer's bulk async-group `group`
  uint64_t group = 0;
  uint64_t issued_at = 0;            // Engine instruction count at issue (late completion mode)
  // Global writes (bulk/TMA stores and reductions): the runs of global memory written, from the
  // absolute shared offset `so` of the source; the source bytes are read (into gdata, in run order)
  // at the issuer's cp.async.bulk.wait_group.read or at completion, whichever comes first; the global
  // bytes change only at completion (the scheduler's pick, or a wait_group without .read).
  struct GRun { uint64_t ga; uint32_t so, nb; };
  std::vector<GRun> gruns;
  std::vector<uint8_t> gdata;
  bool src_done = false;
  bool global_write() const { return kind == kTmaStore || kind == kTmaReduce || kind == kBulkS2G || kind == kBulkReduceS2G; }
};

// An asynchronous global write as the global-async-order check remembers it (per launch): the
// issuing thread's knowledge ids (Thread::gid - 1 = I; S = I + 1; D = I + 2), its issue number and
// bulk group; an access is ordered after its completion when the accessor knows D >= group + 1.
struct GWrite {
  uint32_t iid = 0, seq = 0, done_need = 0;
  bool reduce = false;
  const DInstr* instr = nullptr;
  uint32_t cta[3] = {0, 0, 0}, thread = 0;
  uint64_t ga = 0;
  uint32_t bytes = 0;
};
// A global word used as a flag: the knowledge its release writes carry (rel) and the writers' own S
// entries from every strong write (raw: evidence that the writer got this far, without ordering).
struct GSync {
  Knowledge rel;
  std::vector<std::pair<uint32_t, uint32_t>> raw;
};
enum class GAcc : uint8_t { kRead, kWrite, kReduce };

// Late completion mode: a copy lands when every thread is blocked, or after this many instructions
// (a thread spinning on a flag in memory never blocks; the copies it needs still land)
constexpr uint64_t kLateCopyLimit = 2000000;

class Engine {
 public:
  Engine(Device::Impl* dev, const LoadedModule* lm, const LoadedFunction* lf, KernelInfo* k,
         const LaunchParams& lp, const std::vector<uint8_t>& params, const Options& opt);
  void run();

  // ---- used by exec.cpp ----
  void step(Thread* t, int budget);   // runs up to `budget` instructions of t
  [[noreturn]] void fail(const std::string& check, const Thread* t, const DInstr* d, const std::string& details);
  std::string where(const Thread* t, const DInstr* d) const;
  // Memory: host pointer for `bytes` at `addr` in space `sp` (Generic resolved), checked.
  uint8_t* mem(Thread* t, const DInstr* d, Sp sp, uint64_t addr, uint32_t bytes, bool write, Cta** cta_out = nullptr,
               uint32_t* smem_off = nullptr);
  void note_generic_smem_write(Thread* t, Cta* c, uint32_t off, uint32_t bytes);
  void check_smem_read(Thread* t, const DInstr* d, Cta* c, uint32_t off, uint32_t bytes);
  Cta* cluster_cta(Thread* t, const DInstr* d, uint32_t cluster_addr, uint32_t* off);
  MBar& mbar(Thread* t, const DInstr* d, Cta* c, uint32_t off, bool must_be_valid = true);
  void mbar_arrive(Thread* t, const DInstr* d, Cta* c, uint32_t off, uint32_t count, bool no_complete = false);
  void mbar_tx(Thread* t, const DInstr* d, Cta* c, uint32_t off, int64_t delta);
  void block(Thread* t, TS state, const DInstr* d);
  void wake(Thread* t);
  void thread_exited(Thread* t);
  void enqueue(AsyncOp op);
  void complete_thread_cp_async(Thread* t, size_t keep_groups);   // wait_group
  void fence_proxy_async(Thread* t);
  uint64_t clock() const { return instr_total_; }
  uint64_t param_window_base() const { return kParamWindow; }
  const std::vector<uint8_t>& params() const { return params_; }
  const LoadedModule* module() const { return lm_; }
  const LoadedFunction* kernel_function() const { return lf_; }
  Device::Impl* device() const { return dev_; }
  const KernelInfo* kernel() const { return k_; }
  const LaunchParams& launch() const { return lp_; }
  const Options& opt() const { return opt_; }
  uint32_t nclusters(int i) const { return ncl_[i]; }
  void progress() { last_progress_ = instr_total_; timeouts_ = 0; }
  void observe(Thread* t, MBar& m);   // t saw m's completed phases (a successful wait)
  void check_delivered(Thread* t, const DInstr* d, Cta* c, uint32_t off, uint32_t n, bool write);
  // wgmma operand reads in flight (strict): begin at issue, end at the covering wgmma.wait_group
  void wgmma_read_begin(Cta* c, WgmmaRead r);
  void wgmma_read_end(Warp* w, uint64_t keep);
  void check_wgmma_overwrite(Thread* t, const DInstr* d, Cta* c, uint32_t off, uint32_t n, const char* writer);
  uint32_t next_mbar_id() { return mbar_ids_++; }
  // Shared-memory races (strict, "shared-race"): plain accesses by different threads, one a write,
  // that no barrier, mbarrier hand-off or warp collective orders (the race clocks of RaceClock).
  void race_access(Thread* t, const DInstr* d, Cta* c, uint32_t off, uint32_t n, bool write);
  void race_clear(Cta* c, uint32_t off, uint32_t n);   // a copy landed: no plain writer/reader left
  // an async-proxy read (wgmma operand, bulk/TMA store source) ordered by clock `rc` of warp `warp`
  // (the issuing thread's; for a wgmma, the warpgroup's merged, `wg` its first warp: writers in the
  // warpgroup are ordered by the wgmma's own rendezvous)
  void race_async_read(Thread* t, const DInstr* d, const RaceClock& rc, int wg, Cta* c, uint32_t off, uint32_t n,
                       const char* what);
  bool race_on() const { return opt_.strict; }
  void race_release(Thread* t) { ++t->rc.w[t->warp->id]; ++t->rc.l[t->lane]; }
  static void race_put(RaceCarry& into, const Thread* t);       // t's clock into a carry
  static void race_take(Thread* t, const RaceCarry& from);      // a carry into t's clock
  // Global memory ordering (strict): async global writes and the flags that hand them over.
  void gmem_issue(Thread* t, AsyncOp& op);                          // records op's runs (checks them first)
  void gmem_check(Thread* t, const DInstr* d, uint64_t a, uint64_t n, GAcc acc);
  void gmem_sync_write(Thread* t, uint64_t a, uint8_t sem);          // a strong write to a global word
  void gmem_sync_read(Thread* t, uint64_t a, uint8_t sem);           // a read of a global word
  void gmem_fence(Thread* t);                                        // fence.acq_rel/sc, membar
  void gmem_wait_done(Thread* t, uint64_t groups_done);              // cp.async.bulk.wait_group (not .read)
  void gather_store(AsyncOp& op);                                    // reads a global write's source bytes
  bool gmem_active() const { return opt_.strict && gasync_used_; }
  bool gmem_tracking() const { return opt_.strict && !gshadow_.empty(); }   // any async global write recorded
  uint64_t instructions() const { return instr_total_; }
  Recorder* rec_ = nullptr;           // the timing recorder (--timing), else null: hooks test only this
  bool sampled(uint64_t cluster_index) const;   // --timing-sample: does this cluster run?
  uint64_t atomic_scale() const;                  // --timing-sample-atomics: factor for atom.add (else 1)
  uint64_t total_clusters() const { return total_clusters_; }

  // Collective rendezvous: returns true when this thread's arrival completed the collective (the
  // caller then executes it for all participants); false when the thread must wait.
  bool warp_rendezvous(Thread* t, const DInstr* d, uint32_t need_mask);
  bool warpgroup_rendezvous(Thread* t, const DInstr* d);
  void release_warp(Warp* w);
  void release_warpgroup(Cta* c, uint32_t wg);
  void bar_arrive(Thread* t, const DInstr* d, uint32_t id, uint32_t count, bool has_count, bool wait);
  void cluster_arrive(Thread* t, bool release);
  void cluster_wait(Thread* t, const DInstr* d);

 private:
  void dispatch_clusters();
  void retire_cta(Cta* c);
  bool complete_one_async(bool random_pick);
  // the seed's copy-completion mode: 0 random (1/8 per step), 2 late (only when every thread is
  // blocked, or a copy has waited kLateCopyLimit instructions)
  int copy_mode() const { return opt_.seed % 3 == 2 ? 2 : 0; }
  void complete(AsyncOp& op);
  void deadlock();
  void check_bar_complete(Cta* c, uint32_t id);
  void check_cluster_bar(Cluster* cl);
  void recheck_warp_collective(Warp* w);
  void finish_warp_collective(Warp* w, size_t slot, Thread* except);
  void retry_setmaxnreg(Cta* c);

  Device::Impl* dev_;
  const LoadedModule* lm_;
  const LoadedFunction* lf_;
  KernelInfo* k_;
  LaunchParams lp_;
  std::vector<uint8_t> params_;
  Options opt_;
  // splitmix64: cheap, and the whole interleaving is a function of the seed
  struct Rng {
    uint64_t s;
    explicit Rng(uint64_t seed) : s(seed) {}
    uint64_t operator()() {
      uint64_t z = (s += 0x9E3779B97F4A7C15ull);
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      return z ^ (z >> 31);
    }
  } rng_;
  uint32_t ncl_[3] = {1, 1, 1};        // clusters per grid dim
  uint64_t next_cluster_ = 0, total_clusters_ = 0;
  uint32_t max_resident_clusters_ = 1;
  std::vector<std::unique_ptr<Cluster>> clusters_;   // resident
  std::vector<std::unique_ptr<Cta>> ctas_;            // resident
  std::vector<Thread*> runnable_;
  std::vector<AsyncOp> async_;
  uint64_t instr_total_ = 0, last_progress_ = 0;
  uint32_t mbar_ids_ = 0;
  bool gasync_used_ = false;                           // an async global write was issued (strict)
  std::vector<GWrite> gwrites_;
  std::unordered_map<uint64_t, uint32_t> gshadow_;     // 4-byte global word -> gwrites_ index
  std::unordered_map<uint64_t, GSync> gsync_;          // 4-byte global word -> its flag knowledge
  uint32_t timeouts_ = 0;        // try_wait time limits granted since the last progress
};

// Device internals shared by engine.cpp and device.cpp.
struct Device::Impl {
  Options opt;
  std::vector<std::unique_ptr<LoadedModule>> modules;
  std::map<std::string, std::unique_ptr<KernelInfo>> kernels;
  std::map<uint64_t, std::pair<uint64_t, std::string>> allocs;   // base -> (size, what)
  uint64_t instructions = 0;
  double seconds = 0;
  // Finds the allocation holding [p, p+n); nullptr if none.
  bool check_global(uint64_t p, uint64_t n) const;
  const char* alloc_name(uint64_t p) const;
};

// Decoding (exec.cpp).
void decode_function(const Module& m, const Function& f, LoadedFunction* out);

}  // namespace hsim
