#!/usr/bin/env python3
"""README's "where each kernel stands" table, generated from smoke matrix results (tools/smoke/smoke.py
--json): one row per kernel kind (forward 16-bit per dtype, FP8 forward, backward, decode per cache
kind, quantize), with the head dims and features that ran, and per backend how many cases passed.

  python tools/smoke/sim_report.py [--sim SMOKE_JSON] [--gpu SMOKE_JSON] [--update-readme]

--sim defaults to the last simulator run (tools/smoke/smoke.py --backend sim writes
tools/hopper_sim/build/smoke-sim-last.json); --gpu is a lent GPU's smoke.json (device check), else
the GPU column says "not yet". --update-readme rewrites README.md between the markers
<!-- kernel-status:begin --> and <!-- kernel-status:end -->; otherwise the table is printed.
A kind is "✓" only where every one of its cases ran and passed in a run that finished; failures
are named.
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import smoke  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
LAST_SIM = ROOT / "tools" / "hopper_sim" / "build" / "smoke-sim-last.json"
BEGIN, END = "<!-- kernel-status:begin -->", "<!-- kernel-status:end -->"


def kind(kid: str) -> str:
    """The table row of a kernel id."""
    fam = smoke.family(kid)
    dt = smoke.parse_kernel(kid)[0] if fam not in ("quant",) else kid.split(":")[1]
    if fam == "dec":
        return f"decode {dt}, " + ("e4m3 cache" if smoke.dec_fp8_cache(kid) else f"{dt} cache")
    if fam == "bwd":
        return f"backward {dt}"
    if fam == "e4m3":
        return "FP8 forward e4m3"
    if fam == "quant":
        return "FP8 rotate-and-quantize"
    return f"forward {dt}"


def _dims(kids) -> str:
    out = []
    for k in kids:
        if smoke.family(k) == "quant":
            out.append("any (one TU)")
            continue
        _, d, dv = smoke.parse_kernel(k)
        out.append(str(d) if d == dv else f"{d}×{dv}")
    return ", ".join(dict.fromkeys(out))


def rows(cases: list[dict]) -> dict:
    """kind -> {"dims": str, "features": [..], "cases": [...]} in first-seen order."""
    by = collections.OrderedDict()
    for c in cases:
        by.setdefault(kind(c["kernel"]), []).append(c)
    out = collections.OrderedDict()
    for name, cs in by.items():
        feats = list(dict.fromkeys(c["feature"] for c in cs))
        out[name] = {"dims": _dims(dict.fromkeys(c["kernel"] for c in cs)), "features": feats, "cases": cs}
    return out


def verdict(cs: list[dict], partial: bool = False) -> str:
    n = len(cs)
    ok = sum(c["status"] == "ok" for c in cs)
    if ok == n:
        return f"{'(interrupted run) ' if partial else '✓ '}{ok}/{n}"
    bad = [f"{smoke.kernel_label(c['kernel'])} {c['feature']}: {c['status']}" for c in cs if c["status"] != "ok"]
    return f"✗ {ok}/{n} ok; " + "; ".join(bad[:4]) + (f"; {len(bad) - 4} more" if len(bad) > 4 else "")


def table(sim: dict | None, gpu: dict | None) -> str:
    sim_rows = rows(sim["cases"]) if sim else {}
    gpu_rows = rows(gpu["cases"]) if gpu else {}
    lines = []
    for what, res in (("simulator", sim), ("GPU", gpu)):
        if res is None:
            continue
        meta = res.get("meta", {})
        lines.append(f"- {what}: `{meta.get('command', 'tools/smoke/smoke.py')}` on {meta.get('date', '?')}"
                     + (f", schedule seeds {meta['seeds']}" if meta.get("seeds") else "")
                     + f", {len(res['cases'])} cases"
                     + (f" ({one} of them with the first seed only)"
                        if (one := sum(len(c.get("seeds", [0, 0])) == 1 for c in res["cases"])) else "")
                     + (" — **interrupted: only the cases that finished**" if res.get("partial") else ""))
    lines += ["", "| kernels | head dims | features | simulator | GPU |", "|---|---|---|---|---|"]
    for name in list(sim_rows) + [n for n in gpu_rows if n not in sim_rows]:
        r = sim_rows.get(name) or gpu_rows[name]
        feats = list(dict.fromkeys(r["features"] + gpu_rows.get(name, {}).get("features", [])))
        s = verdict(sim_rows[name]["cases"], sim.get("partial", False)) if name in sim_rows else "not yet"
        g = verdict(gpu_rows[name]["cases"], gpu.get("partial", False)) if name in gpu_rows else "not yet"
        lines.append(f"| {name} | {r['dims']} | {', '.join(feats)} | {s} | {g} |")
    return "\n".join(lines)


def update_readme(text: str, path: Path = ROOT / "README.md") -> None:
    readme = path.read_text()
    i, j = readme.find(BEGIN), readme.find(END)
    if i < 0 or j < i:
        raise SystemExit(f"{path}: no {BEGIN} ... {END} section")
    path.write_text(readme[:i + len(BEGIN)] + "\n" + text + "\n" + readme[j:])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sim", default=str(LAST_SIM), help="the simulator run's smoke JSON")
    ap.add_argument("--gpu", help="a GPU run's smoke JSON")
    ap.add_argument("--update-readme", action="store_true")
    args = ap.parse_args(argv)
    load = lambda p: json.loads(Path(p).read_text()) if p and Path(p).exists() else None  # noqa: E731
    sim, gpu = load(args.sim), load(args.gpu)
    if sim is None and gpu is None:
        raise SystemExit(f"no results: {args.sim} does not exist (run tools/smoke/smoke.py --backend sim)")
    text = table(sim, gpu)
    if args.update_readme:
        update_readme(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
