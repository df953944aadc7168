#!/usr/bin/env python3
"""Timing-model unit tests: builds timing_kernels.cu with the sim flags (cached), runs it under
`simrun --timing-json`, and checks each case's cycle difference between its two sizes against a
formula worked by hand from the parameter table (src/timing_params.h, parsed here, never the
model's output). The difference cancels the fixed prologue/epilogue cost of each kernel.

  python tools/hopper_sim/tests/timing/run_timing_tests.py
"""
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SIM = os.path.normpath(os.path.join(HERE, "..", ".."))
SRC = os.path.join(HERE, "timing_kernels.cu")
BIN = os.path.join(SIM, "build", "tests", "timing_kernels")
FLAGS = ["-gencode=arch=compute_90a,code=[sm_90a,compute_90a]", "-cudart", "shared", "-no-compress",
         "-O3", "-DNDEBUG", "-std=c++17"]


def params():
    text = open(os.path.join(SIM, "src", "timing_params.h")).read()
    p = {}
    for m in re.finditer(r"constexpr\s+(?:int|double)\s+(k\w+)\s*=\s*([0-9.e]+)\s*;", text):
        p[m.group(1)] = float(m.group(2))
    return p


def build():
    if os.path.exists(BIN) and os.path.getmtime(BIN) > os.path.getmtime(SRC):
        return
    os.makedirs(os.path.dirname(BIN), exist_ok=True)
    subprocess.run(["nice", "-n", "5", os.environ.get("NVCC", "nvcc")] + FLAGS + [SRC, "-o", BIN], check=True)


def run():
    with tempfile.TemporaryDirectory() as d:
        js = os.path.join(d, "t.jsonl")
        p = subprocess.run([os.path.join(SIM, "simrun"), "--timing-json", js, BIN], capture_output=True, text=True)
        sys.stderr.write(p.stderr)
        if p.returncode != 0:
            sys.exit(f"timing_kernels failed with status {p.returncode}: {p.stdout}")
        # the same program without timing must compute the same bytes
        q = subprocess.run([os.path.join(SIM, "simrun"), BIN], capture_output=True, text=True)
        if q.returncode != 0 or q.stdout != p.stdout:
            sys.exit(f"FAIL: output differs with --timing:\n  {p.stdout.strip()}\n  {q.stdout.strip()}")
        print(f"ok   same output with and without --timing ({p.stdout.strip()})")
        return [json.loads(line) for line in open(js)]


def main():
    build()
    P = params()
    recs = run()
    by = {}
    for r in recs:
        m = re.search(r"(fma_chain|mufu_bound|wgmma_chain|tma_stream|cp_async_stream|cp_async_chain|cvt_widen|cvt_unpack|mbar_pingpong|sched_window|tma_store_read|bar_after_split|arrive_in_branch|stall_once)ILi(\d+)E", r["kernel"])
        by[(m.group(1), int(m.group(2)))] = r["cycles"]
        by[(m.group(1), int(m.group(2)), "named_barrier")] = r["stall_cycles"]["named_barrier"]
        by[(m.group(1), int(m.group(2)), "hbm_bytes")] = r["hbm_bytes"]
    l2_per_sm = P["kL2BytesPerClkGPU"] / P["kSMs"]
    cases = [
        # dependent chain: each FMA issues one FMA latency after the previous one
        ("fma_chain", 256, 768, (768 - 256) * P["kFmaLatency"]),
        # 4 warps per sub-partition share its MUFU pipe: each ex2 occupies it kMufuInterval cycles
        ("mufu_bound", 64, 192, 4 * (192 - 64) * P["kMufuInterval"]),
        # each warp's share of m64n128k16 bf16 occupies its SMSP's tensor core 128/2 cycles; dependent
        # wgmma on the same accumulators pipeline (the latency shows once, at the wait)
        ("wgmma_chain", 4, 20, (20 - 4) * 128 / 2),
        # bulk copies serialize on the SM's share of L2 bandwidth: round(8192 B / (L2 B/clk / SMs)) each
        ("tma_stream", 2, 6, (6 - 2) * int(8192 / l2_per_sm + 0.5)),
        # cp.async: a warp's 16-byte chunks (512 B) through the SM's share of L2 bandwidth, serialized:
        # round(512 / (L2 B/clk / SMs)) each, more than its LSU time (512 / smem B/clk) and issue
        ("cp_async_stream", 8, 24, (24 - 8) * int(512 / l2_per_sm + 0.5)),
        # each round: the chunks' L2 time, then an L2-hit latency to land; the wait issues then, the
        # next round's cp.async one cycle later (the commit issued right after the copy, meanwhile)
        ("cp_async_chain", 8, 24, (24 - 8) * (int(512 / l2_per_sm + 0.5) + P["kGlobalLatency"] + 1)),
        # independent conversions, one warp: cvt.f32.f16 is HADD2.F32 in SASS (the FMA pipe, one a
        # cycle); cvt.rn.f16x2.e4m3x2 a conversion ([PG] 16 per clk per SM: kCvtInterval cycles each)
        ("cvt_widen", 16, 48, (48 - 16) * max(1, P["kFmaInterval"])),
        ("cvt_unpack", 16, 48, (48 - 16) * P["kCvtInterval"]),
        # per round, twice: phase completes at the arrive; the waiter's try_wait issues kMbarLatency
        # later, its predicate is ready kAluLatency after that, the @!p bra issues, the arrive one cycle later
        ("mbar_pingpong", 20, 60, (60 - 20) * 2 * (P["kMbarLatency"] + P["kAluLatency"] + 1)),
        # ptxas' scheduling: with a window that holds the ex2s in flight over one MUFU latency, each
        # element costs the MUFU pipe's interval; without one, an ex2's latency plus the add's issue
        ("sched_window", 64, 192, (192 - 64) * (P["kMufuInterval"]
                                                if P["kSchedWindow"] * P["kMufuInterval"] >= 2 * P["kMufuLatency"]
                                                else P["kMufuLatency"] + 1)),
        # wait_group.read: each store's wait ends when its 8 KB left shared memory (the TMA issue cost,
        # then 8192 B at the SM's shared-memory bandwidth); then the next store's address (an add.s64 on
        # the base: each store has its own 8 KB, as a second store onto incomplete bytes would race)
        # issues, and the store one ALU latency after it, one cycle more for the commit; the FMA tail
        # outlasts the L2 drain of either size
        ("tma_store_read", 4, 12, (12 - 4) * (P["kTmaIssueCycles"] + 8192 / P["kSmemBytesPerClk"] + 1
                                              + P["kAluLatency"])),
        # warp 0's bar.sync issues one cycle after the last of its N chained FMAs (4 cycles apart); warp 1,
        # already waiting there (64 FMAs before its arrive, warp 0's chain starts after the arrive),
        # resumes kNamedBarLatency later and runs its own N chained FMAs; its store of x ends the
        # kernel. Both chains grow with N: two FMA latencies per element
        ("bar_after_split", 64, 192, (192 - 64) * 2 * P["kFmaLatency"]),
        # lane 8's arrive goes where its branch is, before warp 0's chain: warp 1's wait ends a fixed
        # time after the kernel's start, and the two chains of N FMAs overlap: one FMA latency each
        ("arrive_in_branch", 64, 192, (192 - 64) * P["kFmaLatency"]),
    ]
    # slot-free movs after a wait: neither the time nor the wait's stall cycles grow with their count
    cases += [("stall_once", 8, 64, 0)]
    stalls = [("stall_once", 8, 64, "named_barrier", 0)]
    # the HBM bound counts a cp.async's source bytes once (the stream's copies read distinct bytes, the
    # chain's re-read the same 512)
    stalls += [("cp_async_stream", 8, 24, "hbm_bytes", (24 - 8) * 512), ("cp_async_chain", 8, 24, "hbm_bytes", 0)]
    bad = 0
    for name, a, b, reason, want in stalls:
        got = by[(name, b, reason)] - by[(name, a, reason)]
        ok = abs(got - want) <= 2
        bad += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {reason}({b}) - {reason}({a}) = {got:.0f}, expected {want}")
    for name, a, b, want in cases:
        got = by[(name, b)] - by[(name, a)]
        ok = abs(got - want) <= max(2, 0.01 * want)   # 1% (or 2 cycles) for rounding at the edges
        bad += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name}: cycles({b}) - cycles({a}) = {got}, expected {want:.0f}")
    print(f"timing tests: {len(cases) + len(stalls) - bad}/{len(cases) + len(stalls)} passed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
