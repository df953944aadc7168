#!/usr/bin/env python3
"""The one summary table of tools/device/device_check.sh, printed last (a device call returns only the
tail of its output): device, step times against the budget, the kernels (carried or compiled in
time), the smoke matrix, hang diagnoses, sanitizer results, pytest counts and the benchmarks.
Writes summary.txt and results.json (every benchmark's json inside) under --out. Verdict: PASS,
FAIL (something checked is wrong or broke), or INCOMPLETE (nothing wrong, but a step was skipped
out of time or a kernel not compiled in time); exit code 0, 1, 2.

    python tools/device/device_summary.py --work build/device-check-work --out $OUT --budget 570 --stage 1
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "smoke"))
import smoke  # noqa: E402

SANITIZERS = ("memcheck", "racecheck", "synccheck")


def read(path) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except (OSError, TypeError):
        return ""


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError, TypeError):
        return None


def parse_steps(text: str) -> list[dict]:
    """steps.tsv rows: name, status, seconds, log file."""
    rows = []
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) >= 3 and parts[0]:
            rows.append({"name": parts[0], "status": parts[1], "seconds": int(parts[2] or 0),
                         "log": parts[3] if len(parts) > 3 else ""})
    return rows


def pytest_counts(text: str) -> dict:
    """Counts from pytest output: its final line if it got there, else the per-test -v lines."""
    res = {"passed": 0, "failed": 0, "skipped": 0, "error": 0, "complete": False, "failures": []}
    final = None
    for line in text.splitlines():
        if re.match(r"^=+ .*\b(passed|failed|skipped|errors?|deselected|no tests ran)\b.* in [\d.]+s", line):
            final = line
    if final:
        res["complete"] = True
        for n, what in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected|xfailed|xpassed)", final):
            key = "error" if what.startswith("error") else what
            res[key] = res.get(key, 0) + int(n)
        res["failures"] = [l[7:].strip()[:200] for l in text.splitlines()
                           if l.startswith(("FAILED ", "ERROR "))][:5]
    else:
        for line in text.splitlines():
            if "::" not in line or line.startswith(("FAILED ", "ERROR ")):
                continue
            m = re.search(r"\b(PASSED|FAILED|SKIPPED|ERROR)\b", line)
            if m:
                res[m.group(1).lower()] += 1
                if m.group(1) in ("FAILED", "ERROR") and len(res["failures"]) < 5:
                    res["failures"].append(re.sub(r"^.*?(tests/\S+).*$", r"\1", line)[:200])
    if "Timeout" in text and ("+++ Timeout" in text or "Timeout (" in text):
        res["timeout"] = True
    return res


def sanitizer_result(text: str) -> dict:
    """{'errors': n or None, 'first': first reported problem} from compute-sanitizer output."""
    m = re.findall(r"ERROR SUMMARY: (\d+) error", text)
    r = re.findall(r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)", text)
    res = {"errors": None, "first": ""}
    if r:
        res["errors"] = int(r[-1][1])  # racecheck warnings are often benign; shown, not failed
        res["note"] = f"{r[-1][0]} hazards ({r[-1][1]} errors, {r[-1][2]} warnings)"
    elif m:
        res["errors"] = int(m[-1])
        res["note"] = f"{m[-1]} errors"
    for line in text.splitlines():
        s = line.strip()
        detail = r"^=+\s+(at|by|in|Saved|Host|Device|Address|Thread|Referenced)\b"  # a report's context
        if s.startswith("=========") and not re.search(r"COMPUTE-SANITIZER|SUMMARY|^=+\s*$|" + detail, s):
            res["first"] = s.lstrip("= ").strip()[:160]
            break
    if res["errors"] is None:
        tail = [l.strip() for l in text.splitlines() if l.strip()]
        res["first"] = tail[-1][:160] if tail else "no output"
    return res


def bench_lines(bench: dict | None) -> list[str]:
    """The issue's targets from bench_fwd.json: d128 vs cuDNN/SDPA-flash at 8k, d256 TFLOP/s,
    causal/non-causal at 8k+, then flash3 (and cuDNN) TFLOP/s per (hdim, causal) and seqlen."""
    if not bench or not bench.get("rows"):
        return ["  no benchmark results"]
    rows = bench["rows"]
    def pick(d, c, s):
        return next((r for r in rows if (r["hdim"], r["causal"], r["seqlen"]) == (d, c, s)), None)
    gemm = bench.get("gemm_tflops", float("nan"))
    out = [f"  {bench.get('device', '?')}; cuBLAS bf16 GEMM {gemm:.0f} TFLOP/s"]
    r = pick(128, False, 8192)
    if r:
        out.append(f"  d128 non-causal 8k: {r['flash3']:.0f} TFLOP/s = {r['flash3'] / r['sdpa_cudnn']:.2f}x "
                   f"cuDNN (target >= 1.0), {r['flash3'] / r['sdpa_flash']:.2f}x SDPA-flash (>= 1.6), "
                   f"{r['flash3'] / gemm:.2f}x cuBLAS GEMM")
    d256 = [x["flash3"] for x in rows if x["hdim"] == 256]
    if d256:
        out.append(f"  d256 best: {max(d256):.0f} TFLOP/s (target >= 650)")
    ratios = []
    for d in sorted({x["hdim"] for x in rows}):
        for s in sorted({x["seqlen"] for x in rows if x["seqlen"] >= 8192}):
            rc, rn = pick(d, True, s), pick(d, False, s)
            if rc and rn:
                ratios.append(f"d{d} {s // 1024}k {rc['flash3'] / rn['flash3']:.2f}")
    if ratios:
        out.append("  causal/non-causal (target >= 0.9): " + ", ".join(ratios))
    seqs = sorted({x["seqlen"] for x in rows})
    out.append("  flash3/cuDNN TFLOP/s  " + " ".join(f"{s:>11}" for s in seqs))
    for d in sorted({x["hdim"] for x in rows}):
        for c in (False, True):
            cells = [pick(d, c, s) for s in seqs]
            if any(cells):
                out.append(f"  d{d:<3} {'causal' if c else 'full  '}          " + " ".join(
                    f"{x['flash3']:5.0f}/{x['sdpa_cudnn']:<5.0f}" if x else f"{'-':>11}" for x in cells))
    return out


def bench_target_lines(data: dict | None, what: str = "backward") -> list[str]:
    """A benchmark's targets (PASS/MISS/n/a lines) from its json (bench_bwd.json, bench_decode.json)."""
    if not data or not data.get("rows"):
        return [f"  no {what} benchmark results"]
    return [f"  [{status}] {text}" for status, text in data.get("targets", [])]


def kernel_lines(man: dict | None, status: str) -> tuple[list[str], list[str], list[str]]:
    """(lines, problems, out-of-time notes) for the kernel objects (tools/build/prebuilt.py's manifest):
    carried, or compiled on the device under a time cap (those not compiled in time are left out
    of the build: "skipped (out of time)", not a failure; an nvcc error is)."""
    if not man:
        return ["kernels: no manifest (see device_check.log)"], [], []
    knobs = " ".join(f"{k}={v}" for k, v in man.get("knobs", {}).items()) or "every kernel"
    objs, nb = man.get("objects", {}), man.get("not_built", {})
    gone = [t for t in man.get("planned", []) if t not in objs and t not in nb]  # in flight at the stop
    where = "carried (make device-prep)" if status.startswith("ok (carried") else "compiled here"
    L = [f"kernels: {len(objs)} {man.get('variant', '?')} objects {where}, {knobs}, nvcc {man.get('nvcc', '?')}"]
    late = sorted([t for t, why in nb.items() if "out of time" in why] + gone)
    failed = sorted(t for t, why in nb.items() if "out of time" not in why)
    if late:
        L.append(f"  skipped (out of time), left out of the build: {', '.join(late)}"[:400])
    for t in failed:
        L.append(f"  COMPILE FAILED {t}: {nb[t].strip().splitlines()[-1][:150] if nb[t].strip() else ''}")
    return L, [f"kernel {t} failed to compile" for t in failed], ([f"{len(late)} kernel TU(s)"] if late else [])


def hang_diagnosis(hang: dict | None) -> list[str]:
    if not hang:
        return []
    out = []
    for c in hang.get("cases", []):
        name = f"{smoke.kernel_label(c['kernel'])} {c['feature']}"
        lines = smoke.hang_lines([c])
        if lines:
            out += ["  " + l for l in lines]
        elif c["status"] == "ok":
            out.append(f"  {name}: passes in the debug build (timing-dependent: a race?)")
        elif c["status"] == "hang":
            out.append(f"  {name}: hangs in the debug build too: the stuck loop is not a wrapped wait")
        else:
            out.append(f"  {name}: {c['status']} without a hang report: {c.get('detail', '')[:150]}")
    return out


def bench_json(out: Path, work: Path, name: str):
    """A benchmark's json: the work folder's bench/ (stage 3), else --out (older runs)."""
    return load_json(work / "bench" / f"{name}.json") or load_json(out / f"{name}.json")


def summarize(work: Path, out: Path, budget: int, elapsed: int, stage: int | None = None
              ) -> tuple[str, dict, bool]:
    steps = parse_steps(read(work / "steps.tsv"))
    by = {s["name"]: s for s in steps}
    env = [l.strip() for l in read(work / "env.txt").splitlines() if l.strip() and not l.startswith("stage ")]
    sm = load_json(out / "smoke.json")
    hang = load_json(work / "hang.json")
    bench = bench_json(out, work, "bench_fwd")
    bench_fp8 = bench_json(out, work, "bench_fp8")
    bench_bwd = bench_json(out, work, "bench_bwd")
    bench_decode = bench_json(out, work, "bench_decode")
    kernels = load_json(work / "kernels.json")
    pt = pytest_counts(read(out / "pytest.log")) if "pytest" in by else None
    problems = []
    # What was not checked (never ok, never a failure): steps skipped out of time, missing tools.
    late = [s["name"] for s in steps if s["status"] == "skipped (out of time)"]
    L = []

    L.append("device: " + (" | ".join(env[:3]) if env else "?"))
    L.append(f"steps{f' (stage {stage})' if stage else ''} (budget {budget} s, used {elapsed} s):")
    for s in steps:
        last = ""
        if s["status"] not in ("ok",) and not s["status"].startswith(("skipped", "ok ")):  # why: its log's end
            tail = [l.strip() for l in read(s["log"]).splitlines() if l.strip() and not l.startswith("===")]
            last = "  " + tail[-1][:110] if tail else ""
        L.append(f"  {s['name']:<38} {s['status']:<8} {s['seconds']:>4} s{last}")
    pf = by.get("preflight")
    missing = pf["status"] if pf and pf["status"] != "ok" else ""
    if "kernels" in by:
        kl, kp, kn = kernel_lines(kernels, by["kernels"]["status"])
        L += kl
        problems += kp
        late += kn
    b = by.get("build")
    if b is None or b["status"] not in ("ok", "skipped (out of time)"):
        problems.append("build " + (b["status"] if b else "not run"))
        errs = [l.strip()[:200] for l in read(work / "build.log").splitlines()
                if re.search(r"\berror\b", l, re.I)][:12]
        L += ["build errors:"] + ["  " + e for e in errs] if errs else []

    if sm:
        L.append("smoke matrix (PARTIAL: the driver was stopped; cases it finished):" if sm.get("partial")
                 else f"smoke matrix ({sm.get('elapsed', 0):.0f} s, {sm.get('parallel')} workers, "
                      f"{sm.get('case_timeout', 0):.0f} s per case):")
        L += ["  " + l for l in smoke.render_matrix(sm["cases"]).splitlines()]
        n = smoke.counts(sm["cases"])
        if sm.get("partial"):
            problems.append("smoke stopped early")
        if n.get("ok", 0) != len(sm["cases"]):
            problems.append(f"smoke {len(sm['cases']) - n.get('ok', 0)} of {len(sm['cases'])} not ok")
    elif "smoke" in by:
        problems.append("smoke did not finish")
        L.append("smoke: no results (see device_check.log)")
    st = by.get("debug_hang_selftest")
    if st and st["status"] != "ok":
        problems.append("debug_hang self-test " + st["status"])
    hd = hang_diagnosis(hang)
    if hd or any(s["name"].startswith("hang") for s in steps):
        L.append("hang diagnosis (FLASH3_DEBUG_HANG=1 build, waits bounded ~1 s):")
        L += hd or ["  no rerun results (see the hang_build / hang_rerun steps)"]

    san = [s for s in steps if s["name"].split()[0] in SANITIZERS]
    sres = []
    if san:
        L.append("sanitizers:")
    for s in san:
        if s["status"].startswith("skipped"):  # did not run: says nothing about the kernels
            sres.append({"step": s["name"], "status": s["status"], "errors": None})
            L.append(f"  {s['name']:<38} {s['status']}")
            continue
        r = sanitizer_result(read(s["log"]))
        r.update(step=s["name"], status=s["status"])
        sres.append(r)
        clean = r["errors"] == 0 and s["status"] == "ok"
        if not clean:
            problems.append(s["name"].split()[0] + " not clean")
        what = r.get("note") or s["status"]
        L.append(f"  {s['name']:<38} {'clean' if clean else 'PROBLEM'}: {what}"
                 + ("" if clean else f"; {r['first']}"))

    if pt is not None:
        st = by["pytest"]["status"]
        L.append(f"pytest (GPU tests): {pt['passed']} passed, {pt['failed']} failed, "
                 f"{pt['error']} errors, {pt['skipped']} skipped"
                 + ("" if pt["complete"] else f" (incomplete: {st})")
                 + ("; a test hit the per-test timeout" if pt.get("timeout") else ""))
        L += ["  FAILED " + f for f in pt["failures"]]
        if pt["failed"] or pt["error"] or not pt["complete"] or pt["passed"] == 0:
            problems.append("pytest")
    r = by.get("ring_sanity")
    if r is not None:
        L.append(f"ring_sanity (flash3.distributed, 1-GPU NCCL): {r['status']}")
        if r["status"] != "ok":
            problems.append("ring_sanity " + r["status"])
    if "bench" in by:
        L.append("benchmark (bf16, 16k tokens, hidden 2048; TFLOP/s):")
        L += bench_lines(bench)
    if "bench_fp8" in by:
        L.append("FP8 benchmark (bench_fp8 --quick):")
        L += bench_target_lines(bench_fp8, "FP8")
    if "bench_bwd" in by:
        L.append("backward benchmark (bench_bwd --quick, hdim 128):")
        L += bench_target_lines(bench_bwd)
    if "bench_decode" in by:
        L.append(f"decode benchmark (bench_decode --quick, hdim 128; copy "
                 f"{(bench_decode or {}).get('copy_gbps', 0):.0f} GB/s):")
        L += bench_target_lines(bench_decode, "decode")
    problems = list(dict.fromkeys(problems))
    ok = not problems
    verdict = "FAIL" if problems else "INCOMPLETE" if late else "PASS"
    if missing:  # a missing tool alone leaves the run incomplete, not failed
        verdict = "INCOMPLETE" if verdict == "PASS" else verdict
    why = problems or [x for x in (f"skipped (out of time): {', '.join(late)}" if late else "", missing) if x]
    head = f"======== flash3 device check{f' stage {stage}' if stage else ''}: {verdict}" + (
        f" ({'; '.join(why)[:200]})" if why else "") + " ========"
    files = sorted(p.name for p in out.iterdir() if p.is_file()) if out.is_dir() else []
    L.append("under $OUT: " + ", ".join(sorted(set(files) | {"summary.txt", "results.json"})))
    text = "\n".join([head] + L)
    results = {"verdict": verdict, "pass": verdict == "PASS", "problems": problems, "out_of_time": late,
               "missing_tools": missing,
               "stage": stage, "env": env, "steps": steps, "budget": budget, "elapsed": elapsed,
               "kernels": kernels, "smoke": sm, "hang": hang, "sanitizers": sres, "pytest": pt,
               "bench": bench, "bench_fp8": bench_fp8, "bench_bwd": bench_bwd, "bench_decode": bench_decode}
    return text, results, verdict == "PASS"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget", type=int, default=0)
    ap.add_argument("--elapsed", type=int, default=0)
    ap.add_argument("--stage", type=int)
    args = ap.parse_args(argv)
    out = Path(args.out)
    text, results, ok = summarize(Path(args.work), out, args.budget, args.elapsed, args.stage)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.txt").write_text(text + "\n")
    with open(out / "results.json", "w") as f:
        json.dump(results, f, indent=1, default=str)
    print(text)
    return {"PASS": 0, "FAIL": 1}.get(results["verdict"], 2)


if __name__ == "__main__":
    sys.exit(main())
