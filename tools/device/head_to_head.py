#!/usr/bin/env python3
"""FA3 and flash3 forward timed the same way, in turns, on one lent Hopper GPU.

The 2026-11-30 lease compared FA3's driver (one launch between two events, the same inputs every
time, a synchronize after each: tools/fa3_peer/fa3_fwd_driver.cu) with bench_fwd.py's `op` column
(4 calls back to back, three rotating input sets, late in a long benchmark run): two methods at two
moments. Nsight Compute, one kernel each, said 0.93 where the columns said 0.83. Here flash3's op
(torch.ops.flash3.fwd_sm90 into preallocated outputs) is timed exactly as FA3's driver times FA3 —
3 warm-up launches, then `iters` launches each alone between two CUDA events, median — and the two
alternate per shape (FA3, flash3, FA3, flash3), with the SM clock, power and temperature read
before each, so clock drift shows instead of hiding in the ratio. flash3's dynamic scheduler
(causal) zeroes its tile counter with a memset inside the timed window; FA3's driver zeroes its
own before the window (a ~2 us difference, flash3's side). Full-attention shapes also time flash3
with FLASH3_FWD_CLUSTER=1 (its d 128 kernel without 2-CTA clusters and K/V multicast, as before
2026-12-02): the column `no-cl ms` and `cluster gain` = that time / the clustered one.

Usage (on the device, flash3._C built in place):
  PYTHONPATH=. python tools/device/head_to_head.py [--fa3 .carry/fa3/fa3_fwd_hdim128-*] [--iters 30]
      [--shapes 2048:0,8192:0,16384:0,2048:1,8192:1,16384:1] [--json FILE]
Shapes are SEQLEN:CAUSAL on the FA3 paper's setup (16k tokens, hidden 2048, h = 2048 / d); d is
read from the FA3 binary's name. Prints one row per shape; exits 0 when every row ran.
"""
from __future__ import annotations

import argparse
import glob
import json
import re
import statistics
import subprocess
import sys


def gpu_state() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10)
        return out.stdout.strip().replace(" ", "")
    except (OSError, subprocess.SubprocessError):
        return "?"


def fa3_ms(binary: str, b: int, s: int, h: int, d: int, causal: bool, iters: int) -> float | None:
    try:
        out = subprocess.run([binary, str(b), str(s), str(h), str(d), str(int(causal)), "0", "132", str(iters)],
                             capture_output=True, text=True, timeout=60).stdout
    except subprocess.SubprocessError:
        return None
    m = re.search(r"median_ms=([0-9.]+)", out)
    return float(m.group(1)) if m else None


def flash3_ms(b: int, s: int, h: int, d: int, causal: bool, iters: int, clusters: bool = True) -> float:
    import os
    import torch
    if clusters:
        os.environ.pop("FLASH3_FWD_CLUSTER", None)
    else:  # read by the launcher at every launch (fwd/launch.cuh fwd_clusters_enabled)
        os.environ["FLASH3_FWD_CLUSTER"] = "1"
    import flash3  # noqa: F401  (registers torch.ops.flash3)
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    o = torch.empty_like(q)
    lse = torch.empty(b, h, s, device="cuda")

    def call():
        torch.ops.flash3.fwd_sm90(q, k, v, o, lse, None, None, None, s, s, d ** -0.5, -1, 0 if causal else -1, 0.0)

    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ms = []
    for it in range(-3, iters):  # as fa3_fwd_driver.cu: 3 untimed, then one launch per event pair
        e0.record()
        call()
        e1.record()
        e1.synchronize()
        if it >= 0:
            ms.append(e0.elapsed_time(e1))
    del q, k, v, o, lse
    return statistics.median(ms)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fa3", default=None, help="FA3 forward driver (default .carry/fa3/fa3_fwd_hdim128-*)")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--shapes", default="2048:0,8192:0,16384:0,2048:1,8192:1,16384:1")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    fa3 = args.fa3 or next(iter(sorted(p for p in glob.glob(".carry/fa3/fa3_fwd_hdim128-*") if not p.endswith(".o"))), None)
    if fa3 is None:
        print("head_to_head: no FA3 forward driver (.carry/fa3/fa3_fwd_hdim128-*)")
        return 1
    d = int(re.search(r"hdim(\d+)", fa3).group(1))
    h = 2048 // d
    rows, ok = [], True
    print(f"head_to_head: FA3 {fa3} vs flash3 op, d={d} h={h}, {args.iters} single launches each, median; "
          "gpu = sm clock MHz, power W, temperature C before each run")
    print(f"{'s':>6} {'causal':>6} | {'FA3 ms':>8} {'flash3 ms':>9} {'FA3 ms':>8} {'flash3 ms':>9} | "
          f"{'FA3 TF':>7} {'flash3 TF':>9} {'ratio':>6} | gpu before each")
    for shape in args.shapes.split(","):
        s, causal = (int(x) for x in shape.split(":"))
        b = max(1, 16384 // s)
        flops = 4 * b * h * s * s * d / (2 if causal else 1)
        times, states = [], []
        for _ in range(2):
            states.append(gpu_state())
            times.append(fa3_ms(fa3, b, s, h, d, bool(causal), args.iters))
            states.append(gpu_state())
            times.append(flash3_ms(b, s, h, d, bool(causal), args.iters))
        fa3_t = [t for t in times[0::2] if t is not None]
        f3_t = times[1::2]
        if not fa3_t:
            ok = False
            print(f"{s:>6} {causal:>6} | FA3 did not run")
            continue
        fa3_best, f3_best = min(fa3_t), min(f3_t)
        nocl = None if causal else min(flash3_ms(b, s, h, d, False, args.iters, clusters=False) for _ in range(2))
        row = {"seqlen": s, "causal": bool(causal), "batch": b, "heads": h, "hdim": d, "fa3_ms": times[0::2],
               "flash3_ms": f3_t, "fa3_tflops": flops / fa3_best / 1e9, "flash3_tflops": flops / f3_best / 1e9,
               "ratio": fa3_best / f3_best, "gpu": states, "flash3_no_cluster_ms": nocl,
               "cluster_gain": None if nocl is None else nocl / f3_best}
        rows.append(row)
        cells = " ".join(f"{t:8.4f}" if t is not None else "       -" for t in times[:1]) + " " + f"{times[1]:9.4f} " + \
            (f"{times[2]:8.4f}" if times[2] is not None else "       -") + f" {times[3]:9.4f}"
        extra = "" if nocl is None else f" | no-cl ms {nocl:.4f} cluster gain {row['cluster_gain']:.3f}"
        print(f"{s:>6} {causal:>6} | {cells} | {row['fa3_tflops']:7.1f} {row['flash3_tflops']:9.1f} "
              f"{row['ratio']:6.3f} | {' '.join(states)}{extra}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    print("ratio = FA3 time / flash3 time of each side's faster run (above 1: flash3 faster)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
