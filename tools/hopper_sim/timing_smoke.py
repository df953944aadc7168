#!/usr/bin/env python3
"""The timing model's CI smoke (`make sim-check`): one small flash3 forward case (the smoke
matrix's `causal` case on the first built bf16 forward kernel) run in the simulator twice with the
same schedule seed, without and with --timing. It checks that

  - timing a launch changes no output bit (out and lse identical);
  - the timed run printed `hopper_sim timing: kernel=... grid=... cycles=N us=T` for the launch;
  - its JSON record has the report's structure: cycles/us > 0, busy fractions of every pipe in
    [0, 1], issue-slot use in [0, 1], stall cycles by reason, the grid, the sampling fields.

No timing number is asserted (the model's numbers live in benchmarks/results/perf_model.md).
Exit 0 when all hold. Uses the kernel objects compile-check left (smoke_sim.build_driver).
"""
from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "smoke"))

PIPES = ("tensor", "mufu", "fma", "alu", "lsu", "tma")
REQUIRED = ("kernel", "grid", "cycles", "us", "busy", "issue_slot_use", "stall_cycles", "sampled",
            "ctas_simulated", "ctas_total")


def fail(msg: str) -> int:
    print(f"timing_smoke: FAILED: {msg}")
    return 1


def main() -> int:
    os.environ.setdefault("FLASH3_DTYPES", "bf16")
    os.environ.setdefault("FLASH3_HDIMS", "64")
    import smoke
    import smoke_sim
    import torch

    driver = smoke_sim.build_driver(kinds=("fwd",))
    info = smoke_sim.driver_info(driver)
    kid = next(k for k in smoke.kernel_ids(info) if smoke.family(k) == "bf16")
    _, d, dv = smoke.parse_kernel(kid)
    c = smoke.make_case("causal", "bf16", d, dv, device="cpu", seed=0)
    runs = {}
    with tempfile.TemporaryDirectory(prefix="timing-smoke-") as tmp:
        js = Path(tmp) / "timing.jsonl"
        for mode in ("plain", "timed"):
            env = {"HSIM_TIMING": "1", "HSIM_TIMING_JSON": str(js)} if mode == "timed" else {"HSIM_TIMING": "0"}
            saved = {k: os.environ.get(k) for k in env}
            os.environ.update(env)
            keep = Path(tmp) / mode
            try:
                runs[mode] = smoke_sim.sim_launch(c, driver, seed=1, keep=keep)
            except smoke_sim.SimFailure as e:
                return fail(f"{mode} run of {kid} causal: {e}")
            finally:
                for k, v in saved.items():
                    os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
            runs[mode + "_log"] = (keep / "run.log").read_text()
        recs = [json.loads(x) for x in js.read_text().splitlines()] if js.exists() else []
    (o0, l0), (o1, l1) = runs["plain"], runs["timed"]
    same = lambda a, b: torch.equal(a.view(torch.int16 if a.element_size() == 2 else torch.int32),  # noqa: E731
                                    b.view(torch.int16 if b.element_size() == 2 else torch.int32))
    if not (same(o0, o1) and same(l0, l1)):
        return fail("out/lse differ bitwise between the plain and the timed run")
    lines = re.findall(r"hopper_sim timing: kernel=(\S+) grid=(\d+),(\d+),(\d+) cycles=(\d+) us=([0-9.]+)",
                       runs["timed_log"])
    if not lines:
        return fail("the timed run printed no 'hopper_sim timing:' line")
    if "hopper_sim timing" in runs["plain_log"]:
        return fail("the plain run printed a timing line")
    if len(recs) != len(lines):
        return fail(f"{len(lines)} timing lines but {len(recs)} JSON records")
    for rec, line in zip(recs, lines):
        missing = [k for k in REQUIRED if k not in rec]
        if missing:
            return fail(f"record of {rec.get('kernel')} lacks {missing}")
        if not (rec["cycles"] > 0 and rec["us"] > 0 and int(line[4]) == rec["cycles"]):
            return fail(f"cycles/us of {rec['kernel']}: {rec['cycles']} / {rec['us']} (line says {line[4]})")
        for p in PIPES:
            v = rec["busy"].get(p)
            if v is None or not 0.0 <= v <= 1.0:
                return fail(f"busy[{p}] = {v} not in [0, 1]")
        if not 0.0 <= rec["issue_slot_use"] <= 1.0:
            return fail(f"issue_slot_use = {rec['issue_slot_use']}")
        if not rec["stall_cycles"] or any(v < 0 for v in rec["stall_cycles"].values()):
            return fail(f"stall_cycles = {rec['stall_cycles']}")
        if [int(x) for x in line[1:4]] != rec["grid"]:
            return fail(f"grid {line[1:4]} vs {rec['grid']}")
    r = recs[-1]
    print(f"timing_smoke: {kid} causal: outputs bit-identical with --timing; {len(recs)} launch(es) timed, "
          f"last {r['kernel'][:60]}... grid {r['grid']} cycles {r['cycles']} "
          f"(tensor busy {r['busy']['tensor']:.2f}, issue slots {r['issue_slot_use']:.2f}): ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
