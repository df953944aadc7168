#!/usr/bin/env python3
"""CUTLASS's own Hopper GEMM examples (48 tf32, 49 fp16 collective-builder configurations, 54 fp8),
the kernels the timing model is validated on (tools/hopper_sim/perf_model.py gemm_rows), timed on a
lent Hopper GPU at the model's shapes, so the validation table's CUTLASS rows get a measured
number beside the model's. The same sources as the simulator runs (the nvidia-cutlass wheel's
examples, unmodified), built for the real GPU.

  here:    python tools/hopper_sim/cutlass_device_build.py      # -> .carry/cutlass/{48,49,54}
  device:  python3 tools/device/cutlass_gemms.py [--dir .carry/cutlass] [--out FILE.json]
                                                 [--budget SECONDS]

How each is timed:
  48  its own timing loop (`--iterations`, CUDA events around back-to-back launches) after its
      device-side verification; "GFLOPS:" from its output.
  49  (no timing loop of its own) and 54 (its verification is a single-threaded host GEMM: minutes
      at 4096^3): Nsight Compute's gpu__time_duration of each GemmUniversal launch (49: one per
      configuration, 7; 54: the first), `--kill yes` once they are profiled, so the host
      verification never runs. Needs ncu with hardware counters (a Firecracker machine; on gVisor
      ncu cannot profile: those rows are reported as not measured, with ncu's message). One cold
      launch per configuration (`--cache-control none`, clocks left alone).
Writes one JSON record per measured kernel launch: example, n (m = n = k), launch (1-based, 49's
configurations in the example's order, as the model's rows), tflops, how; and the failures.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
# Run in this order (48 is cheapest; 49's seven ncu-timed launches last, where the budget may end).
EXAMPLES = ("48_hopper_warp_specialized_gemm", "54_hopper_fp8_warp_specialized_gemm",
            "49_hopper_gemm_with_collective_builder")
SIZES = (4096, 8192)  # the model's GEMM rows (perf_model.py: `make perf-model` runs 4096 and 8192)
LAUNCHES_49 = 7       # GemmUniversal launches of example 49 per run (its configurations)


def example_args(name: str, n: int) -> list[str]:
    """The program arguments at m = n = k = `n` (as perf_model.gemm_rows passes them to the model)."""
    args = [f"--m={n}", f"--n={n}", f"--k={n}"]
    if name.startswith(("49", "54")):
        args.append("--l=1")
    if name.startswith("48"):
        args.append("--iterations=100")
    return args


def gflops_lines(text: str) -> list[float]:
    """The "GFLOPS: <x>" lines of an example's output (48 and 54 print one per timed run)."""
    return [float(m.group(1)) for m in re.finditer(r"^\s*GFLOPS:\s*([0-9.eE+-]+)\s*$", text, re.M)]


def ncu_durations_ns(csv_text: str) -> list[float]:
    """gpu__time_duration.sum of each profiled kernel, in launch order, in ns, from
    `ncu --csv --metrics gpu__time_duration.sum` output (its unit column: ns, us (usecond) or ms)."""
    import csv
    lines = csv_text.splitlines()
    head = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if head is None:
        return []
    scale = {"ns": 1.0, "nsecond": 1.0, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6, "s": 1e9, "second": 1e9}
    out = []
    for r in csv.DictReader(lines[head:]):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = (r.get("Metric Unit") or "ns").strip()
        value = float((r.get("Metric Value") or "0").replace(",", ""))
        out.append(value * scale.get(unit, 1.0))
    return out


def tflops_of(n: int, ns: float) -> float:
    return 2.0 * n ** 3 / (ns * 1e-9) / 1e12


def run(bin_dir: str, out: str, budget: float) -> int:
    t_end = time.time() + budget
    # where device_profile.sh looks for it
    ncu = shutil.which("ncu") or next(
        (p for p in ["/usr/local/cuda/bin/ncu", *sorted(glob.glob("/opt/nvidia/nsight-compute/*/ncu"))]
         if os.path.exists(p)), None)
    rows, notes = [], []

    def left():
        return max(1.0, t_end - time.time())

    for name in EXAMPLES:
        ex = name.split("_")[0]
        binary = os.path.join(bin_dir, ex)
        if not os.path.isfile(binary):
            notes.append(f"{ex}: no binary under {bin_dir} (tools/hopper_sim/cutlass_device_build.py builds them)")
            continue
        for n in SIZES:
            if left() < 10:
                notes.append(f"{ex} {n}^3: not run (out of time)")
                continue
            args = example_args(name, n)
            try:
                if ex == "48":
                    p = subprocess.run([binary] + args, capture_output=True, text=True, timeout=min(120, left()))
                    g = gflops_lines(p.stdout)
                    if p.returncode != 0 or "Disposition: Passed" not in p.stdout or not g:
                        notes.append(f"{ex} {n}^3: rc {p.returncode}: {(p.stdout + p.stderr)[-300:]!r}")
                        continue
                    rows.append(dict(example=ex, n=n, launch=1, tflops=g[-1] / 1e3, how="own timer, 100 launches"))
                else:
                    if ncu is None:
                        notes.append(f"{ex} {n}^3: no ncu")
                        continue
                    count = LAUNCHES_49 if ex == "49" else 1
                    cmd = [ncu, "--clock-control", "none", "--cache-control", "none", "-k", "regex:GemmUniversal",
                           "-c", str(count), "--kill", "yes", "--metrics", "gpu__time_duration.sum", "--csv",
                           binary] + args
                    p = subprocess.run(cmd, capture_output=True, text=True, timeout=min(240, left()))
                    ds = ncu_durations_ns(p.stdout)
                    if not ds:
                        notes.append(f"{ex} {n}^3: ncu gave no duration (rc {p.returncode}): {(p.stdout + p.stderr)[-300:]!r}")
                        continue
                    for i, d in enumerate(ds):
                        rows.append(dict(example=ex, n=n, launch=i + 1, tflops=tflops_of(n, d),
                                         how="ncu gpu__time_duration, one launch"))
            except subprocess.TimeoutExpired:
                notes.append(f"{ex} {n}^3: timed out")
    clock = ""
    try:
        clock = subprocess.run(["nvidia-smi", "--query-gpu=name,clocks.sm,clocks.max.sm", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    rec = dict(rows=rows, notes=notes, gpu=clock, date=time.strftime("%Y-%m-%d"))
    if out:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        with open(out, "w") as f:
            json.dump(rec, f, indent=1)
    for r in rows:
        print(f"CUTLASS {r['example']} {r['n']}^3 launch {r['launch']}: {r['tflops']:.1f} TFLOP/s ({r['how']})")
    for s in notes:
        print(f"CUTLASS {s}")
    return 0 if rows else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default=os.path.join(ROOT, ".carry", "cutlass"), help="the carried binaries")
    ap.add_argument("--out", default="", help="JSON results file")
    ap.add_argument("--budget", type=float, default=90.0, help="seconds for all of it")
    a = ap.parse_args(argv)
    return run(a.dir, a.out, a.budget)


if __name__ == "__main__":
    sys.exit(main())
