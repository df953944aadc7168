// The timing model (--timing): the functional engine records, per warp, the instruction stream of
// its leader lane (lowest live lane) with the synchronization events a timing replay needs; after
// the launch, timing.cpp replays the streams on a discrete-event model of the H100's SMs
// (timing_params.h) and prints/appends the result. Recording never changes what the functional
// engine does (no random numbers drawn, no state of the program touched).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "interp.h"

namespace hsim {

// Synchronization objects are "phase keys": (kind, object id, phase). A key completes when every
// event recorded for it has happened in the replay; waiters resume after that.
enum : uint8_t { kKeyMbar = 0, kKeyNamedBar = 1, kKeyCluster = 2 };
inline uint64_t phase_key(uint8_t kind, uint32_t id, uint32_t phase) {
  return (uint64_t)kind << 62 | (uint64_t)(id & 0x3FFFFFFF) << 32 | phase;
}

struct TEvent {
  enum Kind : uint8_t { kPlain, kArrive, kWait, kBarSync, kBarArrive, kTma, kBulkWait };
  const DInstr* d = nullptr;
  Kind kind = kPlain;
  bool synthetic = false;     // an event of a non-leader lane, placed at the leader's position
  uint32_t aux = 0;           // kWait/kArrive: mbarrier shared offset (for the report); kTma: index
  uint64_t key = 0;
  uint32_t lanes = 32;        // active lanes (for memory byte counts)
};

struct TmaRec {
  uint32_t bytes = 0;
  bool store = false;
  std::vector<uint64_t> keys;  // the mbarrier phases it completes (one per destination CTA)
  uint32_t ndst = 1;
};

struct WarpTrace {
  uint32_t cta_index = 0;      // into Recorder::ctas
  uint32_t warp = 0;           // in the CTA
  std::vector<TEvent> ev;
  int rec_lane = -1;           // the lane whose stream is recorded (see Recorder::leader)
  const Thread* rec_owner = nullptr;
  uint64_t rec_pos = 0;        // instructions the recorded lane(s) had executed at the last entry
  int64_t spin_pos = -1;       // trace length at the leader's first failed wait (spin collapse)
  std::unordered_set<uint64_t> seen;   // event keys this warp already recorded (one event per warp)
};

struct CtaRec {
  uint64_t cluster = 0;        // linear cluster index (dispatch order)
  uint32_t rank = 0, linear = 0;
};

class Recorder {
 public:
  // engine hooks
  void instr(Thread* t, const DInstr* d);                  // top of each executed instruction
  void wait_result(Thread* t, const DInstr* d, bool ok, uint32_t mbar_id, uint32_t phase, uint32_t off);
  void arrive(Thread* t, const DInstr* d, uint32_t mbar_id, uint32_t phase, uint32_t off);
  void bar(Thread* t, const DInstr* d, uint32_t id, bool wait);
  void bar_completed(Cta* c, uint32_t id) { ++bar_round(c)[id]; }
  void cluster_arrive(Thread* t, const DInstr* d, uint64_t gen);
  void cluster_wait(Thread* t, const DInstr* d, uint64_t gen);
  void tma(Thread* t, const DInstr* d, TmaRec r, uint64_t footprint_key, uint64_t footprint_bytes);
  void bulk_wait(Thread* t, const DInstr* d);
  void cta_started(Cta* c, uint64_t cluster_index);

  // replay and report (after the launch)
  void report(const Function* fn, const std::string& kernel, const LaunchParams& lp, uint64_t total_clusters, uint32_t csize,
              int ctas_per_sm, int sample_sms, const std::string& json_path);

  std::vector<std::unique_ptr<WarpTrace>> warps;
  std::vector<CtaRec> ctas;
  std::vector<TmaRec> tmas;
  std::unordered_map<uint64_t, uint64_t> footprints;   // tensor/bulk source region -> bytes (HBM)
  uint64_t global_ld_bytes = 0, global_st_bytes = 0;

 private:
  WarpTrace* trace(Thread* t);
  bool leader(Thread* t);
  void event(Thread* t, const DInstr* d, TEvent::Kind k, uint64_t key, uint32_t aux);
  uint32_t* bar_round(Cta* c);
  std::unordered_map<const Warp*, WarpTrace*> by_warp_;
  std::unordered_map<const Cta*, uint32_t> cta_index_;
  std::unordered_map<const Cta*, std::vector<uint32_t>> rounds_;
  std::unordered_map<const Cluster*, uint32_t> cluster_id_;
};

}  // namespace hsim
