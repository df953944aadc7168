#!/usr/bin/env python3
"""Smoke matrix for a lent Hopper GPU: one small launch per (compiled kernel, feature), each
isolated so that a crash or a hang costs one cell, not the run.

Driver (default): runs one worker process per kernel (--parallel at a time). A worker prints one
JSON line per finished case. The driver kills a worker that stays silent past --case-timeout (the
case in flight: hang) and records a worker that dies as a crash of its case (signal or exit code,
last stderr line); the kernel's remaining features go to a fresh worker at the back of the queue,
so every kernel gets its first cases before anyone's retries. At --budget seconds the driver
stops: cases in flight or not started are "not run". Prints the matrix; --json writes the cases.

Worker (--worker --kernel bf16:128:128 --features full,causal): one launch per feature through
torch.ops.flash3.fwd_sm90 on NaN-poisoned out/lse, checked against the fp64 reference with the
FlashAttention rule of smoke_checks.py (which tests/helpers.py shares). FP8 kernels (e4m3:128:128, from kernel_info()["fwd_fp8"]):
the same cases quantized to e4m3 with block descales, through torch.ops.flash3.fwd_fp8_sm90, checked
against the CPU emulation flash3.fp8.fp8_attention_reference (the rule of tests/test_fp8_gpu.py's
varlen test). Backward kernels (bwd:bf16:128:128, from kernel_info()["bwd"], listed when the
forward kernel of the same triple is built): out/lse from fwd_sm90 (their "alibi" above d 128, where
the forward kernels have no ALiBi: from flash3.reference's forward, as the API), then one
flash3::bwd_sm90 launch into NaN-poisoned dq/dk/dv, checked against flash3.reference.backward (varlen_backward) in fp32 on
the same inputs (check_bwd); their "determ" feature is the gqa case with deterministic=True, launched
twice (bitwise equal), "dlse" the causal case with a random gradient flowing into lse (bwd_sm90's
dlse, given to the reference too), "onekey" a varlen batch whose rows see one key (their dq exactly 0,
and out/lse by the forward's rule), "sinks" attention sinks (bwd_sm90's sinks/dsinks: d_sink too),
"sequsedq" FA3's seqused_q (fwd_sm90's and bwd_sm90's seqused_q: out 0, lse -inf, dq 0 past it;
the forward with FA3's seqused_k too).
A feature with several launches (make_cases: "chunk", FA3's attention_chunk, one launch per
CHUNK_PARTS entry, and "window", one per WINDOW_PARTS entry, forward and backward) reports its worst part. Decode kernels (dec:bf16:128:128 from kernel_info()["decode"],
dec:kve4m3:bf16:128:128 from ["decode_fp8_cache"]) have their own features (DEC_FEATURES,
make_dec_case): each launch one decode step as flash3/ops.py attention_kvcache runs it
(append_kv_sm90 when it appends, then fwd_kvcache_sm90 and its combine), checked by check_dec with
tests/test_kvcache_gpu.py's rules (per row against the fp64 oracle; FP8 caches: out on the exact
x8*descale, lse on those values rounded to q's dtype, which the kernel computes with) and the
append bit for bit against flash3.reference (tests/test_decode_gpu.py). The fused FP8
rotate-and-quantize kernel (quant:bf16 and quant:fp16, x's dtype; kernel_info() does not list it:
on a GPU its ids come from flash3._quantize.available(), the sim backend always links it) has its
own features too (tools/smoke/smoke_quant.py, QUANT_FEATURES): launches of quantize_fp8_sm90 into poisoned
out/descale, checked bit for bit against flash3's CPU definition of the quantization (the rotation
of flash3.hadamard, fp8.quantize_fp8, fp8.pack_v_fp8), by tests/test_quantize_kernel.py's rule where
the Hartley mix (d = 3 or 5 times a power of two) may sum in another order. Lines it cannot parse
(device printf of the FLASH3_DEBUG_HANG build) are kept with the case they interrupted.

Statuses: ok, wrong (error over the FA tolerance, or lse off), nan (NaN in out/lse: unwritten or
non-finite), error (the call was refused, CUDA still usable), crash, hang, not run. A feature a
kernel family has no path for (kvcache for e4m3 and bwd, determ and dlse for forward kernels) is
not a case: never run, "n/a" in the matrix.

--plan FILE prints shell assignments for tools/device/device_check.sh (which cases to diagnose next).

--backend sim: no GPU. The forward, decode and backward kernels the knobs select (FLASH3_HDIMS,
FLASH3_DTYPES) are built into tools/hopper_sim/flash3/sim_driver.cu (tools/smoke/smoke_sim.py; cached,
rebuilt when sources or flags change) and every case's launch runs under tools/hopper_sim/simrun
(strict checks, --uninit) instead of torch.ops.flash3.*: the same make_case on the CPU,
NaN-poisoned out/lse, the same check(). Every case runs once per --seeds seed (schedules; the
outputs must also be bitwise equal; --first-seed-only: only each kernel's first case, the others
with the first seed). With --cases / --kernels only the TU kinds those need are built. --ci: the
CI subset (ci_cases). A strict-check failure is a crash (deadlock/livelock: hang), an
unsupported feature or a refused call an error. A backward case's run is the forward, then the
backward (smoke_sim.bwd_launch: "determ" launches it twice, the second time with the next seed,
another schedule); across seeds its dq may differ outside deterministic mode (dQ tiles are summed
in schedule order). Exits 1 unless every case is ok.
"""
from __future__ import annotations

import argparse
import collections
import ctypes
import json
import os
import queue
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "build"))  # flash3_build, kernel_objects
import smoke_quant  # noqa: E402  (beside this file: the quantize kernel's family)
from smoke_cases import *  # noqa: E402,F401,F403  (the cases; tests and tools reach them as smoke.X too)
from smoke_cases import _launch_fp8, _launch_fwd, _pieces  # noqa: E402,F401


def _emit(obj) -> None:
    print(json.dumps(obj), flush=True)


def _cuda_broken() -> bool:
    import torch
    try:
        torch.cuda.synchronize()
        torch.zeros(1, device="cuda").add_(1).item()
        return False
    except Exception:  # noqa: BLE001 (a sticky CUDA error surfaces as any exception type)
        return True


def worker(kernel: str, features: list[str]) -> int:
    import torch
    import flash3  # noqa: F401  (loads flash3._C)
    built = set(built_kernel_ids())
    torch.zeros(1, device="cuda")
    _emit({"ready": True, "flash3": os.path.dirname(flash3.__file__)})
    for f in features:
        _emit({"begin": f})
        t0 = time.monotonic()
        if kernel not in built:
            res = {"status": "error", "detail": "kernel not in this build"}
        else:
            try:
                bwd = family(kernel) == "bwd"
                if family(kernel) == "dec":
                    res = worst([check_dec(p, launch_dec(p)) for p in make_dec_case(f, kernel)])
                elif family(kernel) == "quant":
                    res = worst([smoke_quant.check(p, smoke_quant.launch(p))
                                 for p in smoke_quant.make_case(f, kernel)])
                else:
                    res = worst([check_bwd(c, *launch_bwd(c)) if bwd else check(c, *launch(c))
                                 for c in make_cases(f, *parse_kernel(kernel), bwd=bwd)])
            except Exception as e:  # noqa: BLE001
                msg = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
                if _cuda_broken():  # sticky error: this process is done; the driver restarts one
                    try:
                        ctypes.CDLL(None).fflush(None)  # device printf sits in C's stdout buffer
                    except OSError:
                        pass
                    _emit({"kernel": kernel, "feature": f, "status": "crash", "detail": msg,
                           "seconds": round(time.monotonic() - t0, 2)})
                    return 3
                res = {"status": "error", "detail": msg}
        res.update(kernel=kernel, feature=f, seconds=round(time.monotonic() - t0, 2))
        _emit(res)
    return 0


def sim_worker(kernel: str, features: list[str], driver: str, seeds: list[int], seeds_all: bool,
               sms: int | None = None) -> int:
    """The worker of --backend sim: like worker(), each launch through smoke_sim.sim_launch
    (dec_launch, bwd_launch)."""
    import torch
    import smoke_sim
    _emit({"ready": True, "flash3": "hopper_sim:" + driver})
    first = features[0] if features else None  # its every-seed case when not seeds_all
    for token in features:
        f = feature_name(token)
        _emit({"begin": f})
        t0 = time.monotonic()
        runs = seeds[:1] if token.endswith(ONE_SEED) else seeds if (seeds_all or token == first) else seeds[:1]
        try:
            if family(kernel) == "dec":  # each part (launch) of the feature, each with every seed
                todo = [(p, lambda p, seed: smoke_sim.dec_launch(p, Path(driver), seed=seed, sms=sms), check_dec)
                        for p in make_dec_case(f, kernel, device="cpu")]
            elif family(kernel) == "quant":
                todo = [(p, lambda p, seed: smoke_sim.quant_launch(p, Path(driver), seed=seed, sms=sms),
                         smoke_quant.check) for p in smoke_quant.make_case(f, kernel, device="cpu")]
            elif family(kernel) == "bwd":  # each part, each seed: the forward, then the backward
                def run_bwd(c, seed):
                    out, lse, grads, again = smoke_sim.bwd_launch(c, Path(driver), seed=seed, sms=sms)
                    return dict(out=out, lse=lse, again=again, **dict(zip(("dq", "dk", "dv", "dsinks"), grads)))
                todo = [(c, run_bwd, lambda c, r: check_bwd(c, r["out"], r["lse"],
                                                            [r[n] for n in ("dq", "dk", "dv", "dsinks") if n in r],
                                                            r["again"]))
                        for c in make_cases(f, *parse_kernel(kernel), device="cpu", bwd=True)]
            else:
                todo = [(c, lambda c, seed: dict(zip(("out", "lse"), smoke_sim.sim_launch(c, Path(driver), seed=seed,
                                                                                          sms=sms))),
                         lambda c, r: check(c, r["out"], r["lse"]))
                        for c in make_cases(f, *parse_kernel(kernel), device="cpu")]
            results = []
            for c, run, chk in todo:
                res, prev = None, None
                for seed in runs:
                    got = run(c, seed)
                    r = chk(c, got)
                    # Outside deterministic mode the backward adds dQ tiles in schedule order.
                    varies = {"dq"} if c.get("bwd") and not c["deterministic"] else set()
                    raw = {n: t.reshape(-1).view(torch.uint8) for n, t in got.items()
                           if torch.is_tensor(t) and n not in varies}
                    if prev is not None and not all(torch.equal(raw[n], prev[n]) for n in raw):
                        r.update(status="wrong" if r["status"] == "ok" else r["status"],
                                 detail=f"seed {seed}'s outputs differ bitwise from seed {runs[0]}'s"
                                 + (f"; {r['detail']}" if r.get("detail") else ""))
                    prev = raw
                    if res is None or res["status"] == "ok":
                        res = dict(r, seed=seed) if r["status"] != "ok" else r
                results.append(res)
            res = dict(worst(results), seeds=runs)
        except smoke_sim.SimFailure as e:
            res = {"status": e.status, "detail": e.detail, "seeds": runs}
        except Exception as e:  # noqa: BLE001
            res = {"status": "error", "detail": (str(e).strip().splitlines() or [type(e).__name__])[0][:300]}
        res.update(kernel=kernel, feature=f, seconds=round(time.monotonic() - t0, 2))
        _emit(res)
    return 0


# ---------------------------------------------------------------------------------------------
# Driver


def _exit_detail(rc: int, errf) -> str:
    try:
        what = f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exit {rc}"
    except ValueError:
        what = f"killed by signal {-rc}"
    try:
        errf.seek(0)
        last = [l.strip() for l in errf.read().splitlines() if l.strip()]
    except (OSError, ValueError):
        last = []
    return what + (f": {last[-1][:300]}" if last else "")


def _stack_of_silent(proc, errf) -> str:
    """Where a silent worker's Python is: SIGABRT makes its faulthandler (PYTHONFAULTHANDLER, set for
    the workers) print every thread's stack, even one blocked inside a CUDA call, so a hung kernel
    (stuck in a synchronize) and a slow reference (in the emulation) read apart. Returns the main
    thread's innermost frames, innermost first, or "" (no stack within 5 s)."""
    if proc.poll() is not None:
        return ""
    try:
        os.kill(proc.pid, signal.SIGABRT)
        proc.wait(timeout=5)
    except (ProcessLookupError, PermissionError, subprocess.TimeoutExpired):
        return ""
    try:
        errf.seek(0)
        text = errf.read()
    except (OSError, ValueError):
        return ""
    block = text[text.rfind("Current thread"):] if "Current thread" in text else ""
    frames = [l.strip() for l in block.splitlines()[1:] if l.strip().startswith("File ")]
    short = [re.sub(r'File "(?:.*/)?([^/"]+)", line (\d+) in (\S+)', r"\3 (\1:\2)", f) for f in frames[:4]]
    return " <- ".join(short)


LIVE: set = set()  # running workers, killed if the driver itself is terminated


def _on_term(signum, frame):
    for p in list(LIVE):
        _kill(p)
    sys.exit(128 + signum)


def _kill(proc) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: the worker and what it started
        except (ProcessLookupError, PermissionError):
            pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def _pump(stream, q) -> None:
    for line in stream:
        q.put(line)
    q.put(None)


def case_weight(kernel: str) -> int:
    """How many --case-timeouts a case of this kernel may stay silent: FP8 cases check against the
    CPU emulation of the FP8 tensor cores' truncating accumulation (flash3.fp8's fp8_mma), several
    times a 16-bit case's fp64 reference."""
    return 4 if kernel.split(":")[0] == "e4m3" else 1


def run_worker(kernel, feats, cmd, record, case_timeout, start_timeout, deadline, env=None) -> list:
    """Runs one worker over feats, recording results; returns the features left for a new worker."""
    errf = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(cmd + ["--kernel", kernel, "--features", ",".join(feats)],
                            stdout=subprocess.PIPE, stderr=errf, text=True, errors="replace",
                            start_new_session=True, env=env)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
    LIVE.add(proc)
    left, extra, ready, where = list(feats), [], False, None
    last = time.monotonic()
    try:
        while left:
            limit = case_timeout * case_weight(kernel) if ready else start_timeout
            try:
                line = lines.get(timeout=max(0.0, min(last + limit, deadline) - time.monotonic()))
            except queue.Empty:
                timed_out = time.monotonic() >= last + limit
                stack = _stack_of_silent(proc, errf) if timed_out and ready and os.environ.get("PYTHONFAULTHANDLER") else ""
                _kill(proc)
                if not timed_out:  # the budget ran out, not the case
                    return []
                what = f"silent for {limit:.0f} s" + ("" if ready else " (worker start-up)")
                if stack:
                    what += f"; Python at {stack}"
                record(kernel, feature_name(left[0]), "hang", what, extra)
                return left[1:]
            if line is None:  # the worker ended before finishing its features
                rc = proc.wait()
                detail = _exit_detail(rc, errf) if rc else "exited early (exit 0)"
                if not ready:  # it never got going: the same would happen again
                    for f in left:
                        record(kernel, feature_name(f), "crash", "worker failed to start: " + detail, extra)
                    return []
                record(kernel, feature_name(left[0]), "crash", detail, extra)
                return left[1:]
            try:
                msg = json.loads(line)
            except ValueError:
                msg = None
            if not isinstance(msg, dict):  # device printf (or other noise): kept with the case
                if len(extra) < 200:
                    extra.append(line.rstrip()[:300])
                continue
            last = time.monotonic()
            if msg.get("ready"):
                ready, where = True, msg.get("flash3")
            elif msg.get("feature") in (names := [feature_name(t) for t in left]):
                f = msg["feature"]
                del left[names.index(f)]  # its token (a feature, maybe with ONE_SEED)
                if msg.get("status") == "crash":  # it exits now; keep its last printf lines
                    end = time.monotonic() + 5
                    while (line := _get(lines, end - time.monotonic())) is not None:
                        if not line.lstrip().startswith("{") and len(extra) < 200:
                            extra.append(line.rstrip()[:300])
                    record(kernel, f, "crash", msg.get("detail", ""), extra, dict(msg, flash3=where))
                    return left
                record(kernel, f, msg.get("status", "error"), msg.get("detail", ""), extra,
                       dict(msg, flash3=where))
                extra = []
        return []
    finally:
        _kill(proc)
        LIVE.discard(proc)
        errf.close()


def _get(q, timeout):
    try:
        return q.get(timeout=max(0.0, timeout))
    except queue.Empty:
        return None


def run_matrix(jobs, worker_cmd, parallel=4, case_timeout=15.0, start_timeout=60.0, budget=150.0,
               env=None, log=None, on_record=None) -> dict:
    """jobs: [(kernel, [features])]. Returns {"cases": [...], "elapsed": s, ...}; every (kernel,
    feature) of jobs gets exactly one case record. on_record(cases so far) follows progress."""
    t0 = time.monotonic()
    deadline = t0 + budget
    todo = collections.deque((k, list(fs)) for k, fs in jobs if fs)
    results: dict = {}
    lock = threading.Condition()
    active = [0]

    def record(kernel, feature, status, detail, extra=(), msg=None):
        rec = dict(msg or {})
        rec.update(kernel=kernel, feature=feature, status=status)
        if detail:
            rec["detail"] = detail
        if extra:
            rec["device_lines"] = list(extra)
        with lock:
            results[(kernel, feature)] = rec
            if on_record:
                on_record(list(results.values()))
        if log:
            log(f"  {kernel_label(kernel):13s} {feature:8s} {status}" + (f": {detail}" if detail else ""))

    def slot():
        while True:
            with lock:
                while not todo and active[0] and time.monotonic() < deadline:
                    lock.wait(0.2)
                if not todo or time.monotonic() >= deadline:
                    return
                kernel, feats = todo.popleft()
                active[0] += 1
            rest = []
            try:
                rest = run_worker(kernel, feats, worker_cmd, record, case_timeout, start_timeout,
                                  deadline, env)
            finally:
                with lock:
                    active[0] -= 1
                    if rest:
                        todo.append((kernel, rest))  # retries after everyone else's first turn
                    lock.notify_all()

    threads = [threading.Thread(target=slot, daemon=True) for _ in range(max(1, parallel))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    cases = []
    for kernel, feats in jobs:
        for f in map(feature_name, feats):
            cases.append(results.get((kernel, f)) or
                         {"kernel": kernel, "feature": f, "status": "not run", "detail": "out of time"})
    return {"cases": cases, "elapsed": round(time.monotonic() - t0, 1), "budget": budget,
            "case_timeout": case_timeout, "parallel": parallel}


# ---------------------------------------------------------------------------------------------
# Rendering and planning

CELL = {"ok": "ok", "wrong": "WRONG", "nan": "NAN", "error": "ERROR", "crash": "CRASH",
        "hang": "HANG", "not run": "-"}
NA = "n/a"  # the cell of a feature that does not apply to the kernel (no case)


def counts(cases) -> dict:
    return dict(collections.Counter(c["status"] for c in cases))


def _groups(cases):
    """The cases' kernels split by feature set (family_features: forward/FP8/backward, decode,
    quantize): (kernels, features) per group, features in matrix order (the family's list, then any
    other)."""
    kernels = list(dict.fromkeys(c["kernel"] for c in cases))
    groups = []
    for order in (FEATURES, DEC_FEATURES, smoke_quant.QUANT_FEATURES):
        ks = [k for k in kernels if family_features(k) is order]
        if not ks:
            continue
        names = [c["feature"] for c in cases if c["kernel"] in ks]
        feats = [f for f in order if f in names] + [f for f in dict.fromkeys(names) if f not in order]
        groups.append((ks, feats))
    return groups


def render_matrix(cases, max_details=16) -> str:
    """The kernel x feature grid (one per feature set: forward kinds, then decode, then quantize),
    then one line per case that is not ok."""
    by = {(c["kernel"], c["feature"]): c for c in cases}
    lines = []
    for kernels, feats in _groups(cases):
        w = max([7] + [len(f) for f in feats])
        lw = max([13] + [len(kernel_label(k)) for k in kernels])
        lines.append("kernel".ljust(lw + 1) + " ".join(f.ljust(w) for f in feats))
        for k in kernels:
            cells = [CELL.get(by[(k, f)]["status"], "?") if (k, f) in by else "" if applies(k, f) else NA
                     for f in feats]
            lines.append(f"{kernel_label(k):{lw}s} " + " ".join(x.ljust(w) for x in cells).rstrip())
    n = counts(cases)
    lines.append(f"{len(cases)} cases: " + ", ".join(f"{n[s]} {s}" for s in CELL if s in n))
    bad = [c for c in cases if c["status"] in BAD]
    for c in bad[:max_details]:
        lines.append(f"  {kernel_label(c['kernel'])} {c['feature']}: {c['status']}"
                     + (f": {c['detail']}" if c.get("detail") else ""))
    if len(bad) > max_details:
        lines.append(f"  ... {len(bad) - max_details} more in smoke.json")
    return "\n".join(lines)


def render_times(cases) -> str:
    """The matrix's grids with each case's wall time in seconds (sim backend)."""
    by = {(c["kernel"], c["feature"]): c for c in cases}
    lines = []
    for kernels, feats in _groups(cases):
        w = max([7] + [len(f) for f in feats])
        lw = max([13] + [len(kernel_label(k)) for k in kernels])
        lines.append("seconds".ljust(lw + 1) + " ".join(f.ljust(w) for f in feats))
        for k in kernels:
            cells = []
            for f in feats:
                c = by.get((k, f))
                cells.append(NA if c is None and not applies(k, f) else "" if c is None or "seconds" not in c
                             else f"{c['seconds']:.1f}" + ("*" if len(c.get("seeds", [])) > 1 else ""))
            lines.append(f"{kernel_label(k):{lw}s} " + " ".join(x.ljust(w) for x in cells).rstrip())
    lines.append("(* = run once per schedule seed)")
    return "\n".join(lines)


def hang_lines(cases) -> list[str]:
    """The debug build's 'flash3 hang:' lines, grouped by warpgroup and barrier (block and thread
    dropped): 'warpgroup 1 waits on KFull phase 0 tile 3  x8 (2 blocks)'."""
    import re
    groups: dict = {}  # (case, what) -> [warps, blocks]
    for c in cases:
        for l in c.get("device_lines", []):
            m = re.search(r"flash3 hang: block (\d+) (warpgroup \d+) thread \d+ (waits on .*)", l)
            if m:
                g = groups.setdefault((f"{kernel_label(c['kernel'])} {c['feature']}",
                                       f"{m.group(2)} {m.group(3).strip()}"), [0, set()])
                g[0] += 1
                g[1].add(m.group(1))
    return [f"{case}: {what}  ({n} warps in {len(blocks)} blocks)"
            for (case, what), (n, blocks) in groups.items()]


def plan(cases) -> dict:
    """What tools/device/device_check.sh does next, from the smoke cases (FAIL_CASES go to
    tools/device/sanitize_small.py, which runs any of them)."""
    hangs = [c for c in cases if c["status"] == "hang"]
    fails = [c for c in cases if c["status"] in ("wrong", "nan", "crash")]
    case_id = lambda c: f"{c['kernel']}/{c['feature']}"  # noqa: E731
    # Rerun two hangs; two of different kernels say more than two of one.
    first_per_kernel = [case_id(c) for i, c in enumerate(hangs)
                        if all(h["kernel"] != c["kernel"] for h in hangs[:i])]
    hang_cases = list(dict.fromkeys(first_per_kernel + [case_id(c) for c in hangs]))[:2]
    by = {(c["kernel"], c["feature"]): c["status"] for c in cases}
    bench = [d for d in (64, 128, 256)
             if all(by.get((f"bf16:{d}:{d}", f)) == "ok" for f in ("full", "causal"))]
    hung = sorted({parse_kernel(c["kernel"]) for c in hangs if family(c["kernel"]) not in ("bwd", "quant")})
    deselect = [f"not ({dt} and d{d}_{dv})" for dt, d, dv in hung if dt != "e4m3"]
    # A hung backward: its head dim's tests in tests/test_bwd_gpu.py (a hung forward's go above).
    deselect += [f"not (test_bwd_gpu and {dt} and d{d}_{dv})" for dt, d, dv in
                 sorted({parse_kernel(c["kernel"]) for c in hangs if family(c["kernel"]) == "bwd"})
                 if (dt, d, dv) not in hung]
    fp8_ids = []  # tests/test_fp8_gpu.py's tests of each hung FP8 head dim (FP8_TEST_WITHOUT_D)
    for d in sorted({d for dt, d, _ in hung if dt == "e4m3"}):
        fp8_ids += [f"-{d}]", f"[{d}]"] + ([FP8_TEST_WITHOUT_D[d]] if d in FP8_TEST_WITHOUT_D else [])
    if fp8_ids:
        deselect.append(f"not (test_fp8_gpu and ({' or '.join(fp8_ids)}))")
    if any(family(c["kernel"]) == "quant" for c in hangs):  # the quantize kernel's own GPU tests
        deselect.append("not test_quantize_kernel")
    # Three small cases for the sanitizers when nothing failed: a forward, a backward and a decode
    # launch (tools/device/sanitize_small.py's names; its decode cases are its own), of those that passed.
    san = []
    for d in (128, 64):
        for kid, feat, name in ((f"bf16:{d}:{d}", "causal", f"bf16:{d}:{d}/causal"),
                                (f"bwd:bf16:{d}:{d}", "causal", f"bwd:bf16:{d}:{d}/causal"),
                                (f"dec:bf16:{d}:{d}", "page16", f"decode:bf16:{d}:{d}/page16")):
            if by.get((kid, feat)) == "ok" and not any(x.startswith(name.split(":")[0] + ":") for x in san):
                san.append(name)
    return {"HANG_CASES": " ".join(hang_cases),
            "FAIL_CASES": " ".join(case_id(c) for c in fails[:2]),
            "SAN_CASES": " ".join(san),
            "BENCH_HDIMS": ",".join(map(str, bench)), "PYTEST_K": " and ".join(deselect)}


# ---------------------------------------------------------------------------------------------


def ci_cases(kernels: list[str]) -> list[tuple[str, list[str]]]:
    """The CI subset of the matrix (`--ci`): every kernel at least once and every feature of each
    family at least once. Within a family (family(); FP8-cache decode kernels apart from 16-bit
    ones) the j-th case is (kernel j mod m, feature j mod n), j < max(m, n); where that kernel does
    not take that feature, the next kernel that does runs it and that kernel its next feature. The
    16-bit forward kernels of OVERLAP_HEAD_DIMS also run "full" and "causal" (their two schedules)."""
    groups: dict = collections.OrderedDict()
    for k in kernels:
        groups.setdefault((family(k), dec_fp8_cache(k)), []).append(k)
    jobs: dict = collections.OrderedDict((k, []) for k in kernels)
    once: set = set()  # (feature list, feature) of CI_ONCE features an earlier group runs
    for ks in groups.values():
        order = (family(ks[0]) == "bwd", id(family_features(ks[0])))  # the backward: its own group
        feats = [f for f in family_features(ks[0]) if any(applies(k, f) for k in ks) and (order, f) not in once]
        once |= {(order, f) for f in feats if f in CI_ONCE}
        m, n = len(ks), len(feats)
        for j in range(max(m, n)):
            k, f = ks[j % m], feats[j % n]
            if applies(k, f):
                jobs[k].append(f)
                continue
            # a feature only some of the group's kernels take (alibi stops at d 128): the next kernel
            # that takes it runs it, and this kernel the next feature it takes
            alt = next((x for x in ks[j % m:] + ks[:j % m] if applies(x, f)), None)
            if alt is not None:
                jobs[alt].append(f)
            g = next((x for x in feats[j % n:] + feats[:j % n] if applies(k, x)), None)
            if g is not None:
                jobs[k].append(g)
    for k in kernels:
        if family(k) in ("bf16", "fp16") and parse_kernel(k)[1:] in OVERLAP_HEAD_DIMS:
            jobs[k] += [f for f in ("full", "causal") if f not in jobs[k]]
    return [(k, [f for f in kernel_features(k) if f in fs]) for k, fs in jobs.items()]


# The 16-bit forward head dims whose kernel has O in its own buffer (fwd/traits.cuh kOwnOBuffer:
# the tile's epilogue under the next tile's first Q.K^T, each consumer warpgroup taking the next
# tile on its own): full calls run it on the static schedule (d 128: in 2-CTA clusters with K/V
# multicast, fwd/launch.cuh, the "full" case having 2 query blocks), masked ones on the dynamic one.
OVERLAP_HEAD_DIMS = {(64, 64), (96, 96), (128, 128)}

# The CI subset's second part (--ci-extra, run with one seed after --ci's two): every kernel TU gets
# at least CI_MIN_FEATURES of the features that reach it, its family's riskiest (CI_RISKIEST) among
# them.
CI_MIN_FEATURES = 3
CI_RISKIEST = {"bf16": "nantail", "fp16": "nantail", "e4m3": "nantail", "bwd": "nantail",
               "dec": "vpaged"}  # nantail: packed tails with NaN; vpaged: the decode paths at once


def ci_extra_cases(kernels: list[str]) -> list[tuple[str, list[str]]]:
    """The features --ci-extra adds to ci_cases(kernels), per kernel: for each of its TUs the
    riskiest feature, then the features its family group has run least, up to CI_MIN_FEATURES."""
    base = dict(ci_cases(kernels))
    group = lambda k: (family(k), dec_fp8_cache(k))  # noqa: E731
    runs = collections.Counter((group(k), f) for k, fs in base.items() for f in fs)
    jobs = []
    for k in kernels:
        feats = [f for f in kernel_features(k) if f not in CI_ONCE]
        tus = [(feats, CI_RISKIEST.get(family(k)))]
        add: list = []
        for tu_feats, risky in tus:
            got = [f for f in tu_feats if f in base[k] or f in add]
            order = ([risky] if risky in tu_feats else []) + sorted(
                tu_feats, key=lambda f: (runs[(group(k), f)], tu_feats.index(f)))
            for f in order:
                if f not in got and (len(got) < CI_MIN_FEATURES or f == risky):
                    add.append(f)
                    got.append(f)
                    runs[(group(k), f)] += 1
        jobs.append((k, [f for f in kernel_features(k) if f in add]))
    return jobs


ONE_SEED = "@1"  # a feature token's suffix: run it with the first of --seeds only


def feature_name(token: str) -> str:
    """The feature of a worker's feature token ("window" or "window@1")."""
    return token.removesuffix(ONE_SEED)


def ci_all_cases(kernels: list[str]) -> list[tuple[str, list[str]]]:
    """--ci --ci-extra in one run: ci_cases with every seed, ci_extra_cases' additions with the
    first seed only (token suffix ONE_SEED), one worker per kernel for both (a worker's start-up,
    torch's import, costs ~3.5 s of CPU); backward kernels first, the longest cases, so that the
    run does not end on one of them."""
    extra = dict(ci_extra_cases(kernels))
    jobs = [(k, fs + [f + ONE_SEED for f in extra.get(k, []) if f not in fs]) for k, fs in ci_cases(kernels)]
    return sorted(jobs, key=lambda j: family(j[0]) != "bwd")


def built_kernel_ids() -> list[str]:
    """kernel_ids of kernel_info() plus the quantize op's entry (smoke_quant.gpu_info), which
    fwd_binding.cpp's kernel_info() does not list."""
    import torch
    import flash3  # noqa: F401
    return kernel_ids(dict(json.loads(torch.ops.flash3.kernel_info()), **smoke_quant.gpu_info()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", action="store_true", help="run cases in this process (internal)")
    ap.add_argument("--kernel", help="worker: the kernel, e.g. bf16:128:128")
    ap.add_argument("--kernels", help="driver: comma-separated kernels (default: every built one)")
    ap.add_argument("--features", help="comma-separated (default: every feature of each kernel's family)")
    ap.add_argument("--cases", help="driver: explicit kernel/feature list, e.g. bf16:128:128/causal")
    ap.add_argument("--ci", action="store_true", help="driver: the CI subset (ci_cases) of the kernels' cases")
    ap.add_argument("--ci-extra", action="store_true",
                    help="driver: the CI subset's second part (ci_extra_cases: three features per TU); "
                         "with --ci, both in one run (ci_all_cases: the second part's cases with the first seed only)")
    ap.add_argument("--parallel", type=int, help="workers at once (4; sim: 2)")
    ap.add_argument("--case-timeout", type=float, help="seconds (15; sim: 1800)")
    ap.add_argument("--start-timeout", type=float, help="seconds (60; sim: 120)")
    ap.add_argument("--budget", type=float, help="seconds; no work starts after it (150; sim: 14400)")
    ap.add_argument("--json", help="write the cases here")
    ap.add_argument("--worker-cmd", help="driver: the worker command (tests use a fake one)")
    ap.add_argument("--plan", metavar="SMOKE_JSON", help="print shell assignments for device_check.sh")
    ap.add_argument("--backend", choices=("gpu", "sim"), default="gpu",
                    help="gpu (torch.ops.flash3) or sim (the Hopper simulator, no GPU)")
    ap.add_argument("--seeds", default="1,2", help="sim: schedule seeds of every case")
    ap.add_argument("--first-seed-only", action="store_true",
                    help="sim: every seed only on each kernel's first case, the first seed elsewhere (quicker)")
    ap.add_argument("--seeds-all", action="store_true", help=argparse.SUPPRESS)  # worker: every case, every seed
    ap.add_argument("--sms", type=int, help="sim: simulated SM count (simrun's default otherwise)")
    ap.add_argument("--sim-driver", help="sim worker: the driver binary (internal)")
    args = ap.parse_args(argv)
    features = [f for f in (args.features or "").split(",") if f]
    sim = args.backend == "sim"
    for name, gpu_default, sim_default in (("parallel", 4, 2), ("case_timeout", 15.0, 1800.0),
                                           ("start_timeout", 60.0, 120.0), ("budget", 150.0, 14400.0)):
        if getattr(args, name) is None:
            setattr(args, name, sim_default if sim else gpu_default)
    seeds = [int(x) for x in args.seeds.split(",") if x]
    if sim and args.parallel > 1:
        # --parallel workers share the cores with their simulator runs: torch's OpenMP pool in each
        # worker only spins between the reference's small ops (~15% of a sim smoke run's CPU).
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    if not sim:
        os.environ.setdefault("PYTHONFAULTHANDLER", "1")  # a silent worker's stack (_stack_of_silent)
    if not sim and args.parallel > 1:
        # GPU workers compute their references on the CPU: each its share of the cores, not an
        # OpenMP pool of all of them each. On the H200 (2026-11-30) e4m3 cases went silent past 15 s
        # with 8 workers (16 threads each on 16 cores) while one alone took 3-4 s; oversubscribed
        # spinning pools slowing the FP8 emulation's many small ops is the likely cause, not proven.
        os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // args.parallel)))

    if args.worker:
        features = features or kernel_features(args.kernel)
        if sim:
            return sim_worker(args.kernel, features, args.sim_driver, seeds, args.seeds_all, args.sms)
        return worker(args.kernel, [feature_name(f) for f in features])
    if args.plan:
        with open(args.plan) as f:
            p = plan(json.load(f)["cases"])
        print("\n".join(f"{k}={shlex.quote(v)}" for k, v in p.items()))
        return 0

    if args.cases:
        jobs = collections.OrderedDict()
        for item in args.cases.replace(",", " ").split():
            k, f = item.split("/")
            jobs.setdefault(k, []).append(f)
        jobs = list(jobs.items())
    driver = None
    if sim and not args.worker_cmd:
        import smoke_sim
        wanted = [k for k, _ in jobs] if args.cases else args.kernels.split(",") if args.kernels else None
        driver = smoke_sim.build_driver(kinds=smoke_sim.kinds_for(wanted) if wanted else smoke_sim.ALL_KINDS)
        print(f"smoke: sim backend, driver {driver}", flush=True)
    if not args.cases:
        kernels = (args.kernels.split(",") if args.kernels
                   else kernel_ids(smoke_sim.driver_info(driver)) if driver else built_kernel_ids())
        jobs = (ci_all_cases(kernels) if args.ci and args.ci_extra else ci_cases(kernels) if args.ci
                else ci_extra_cases(kernels) if args.ci_extra
                else [(k, features or kernel_features(k)) for k in kernels])
    jobs = [(k, [f for f in fs if applies(k, feature_name(f))]) for k, fs in jobs]
    cmd = (shlex.split(args.worker_cmd) if args.worker_cmd
           else [sys.executable, os.path.abspath(__file__), "--worker"])
    if sim:
        cmd += ["--backend", "sim", "--seeds", args.seeds] + ([] if args.first_seed_only else ["--seeds-all"])
        cmd += (["--sms", str(args.sms)] if args.sms else []) + (["--sim-driver", str(driver)] if driver else [])
    n = sum(len(fs) for _, fs in jobs)
    signal.signal(signal.SIGTERM, _on_term)  # timeout(1) must not leave hung GPU workers behind
    print(f"smoke: {n} cases over {len(jobs)} kernels, {args.parallel} workers, "
          f"{args.case_timeout:.0f} s per case, {args.budget:.0f} s budget", flush=True)
    # Without --json the sim backend keeps its last run (tools/smoke/sim_report.py makes README's table of it).
    json_paths = ([args.json] if args.json else
                  [str(ROOT / "tools/hopper_sim/build/smoke-sim-last.json")] if sim and not args.worker_cmd else [])
    knobs = [f"{k}={os.environ[k]}" for k in ("FLASH3_HDIMS", "FLASH3_DTYPES") if os.environ.get(k)]
    meta = {"command": " ".join(knobs + ["tools/smoke/smoke.py"] + list(sys.argv[1:] if argv is None else argv)),
            "date": time.strftime("%Y-%m-%d"), "backend": args.backend}
    if sim:
        meta["seeds"] = args.seeds

    def save(res):  # after every case too, so that a killed driver leaves what it learned
        for path in json_paths:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            with open(path + ".tmp", "w") as f:
                json.dump(dict(res, meta=meta), f, indent=1)
            os.replace(path + ".tmp", path)

    res = run_matrix(jobs, cmd, args.parallel, args.case_timeout, args.start_timeout, args.budget,
                     log=lambda s: print(s, flush=True),
                     on_record=lambda cases: save({"cases": cases, "partial": True}))
    save(res)
    print(f"\nsmoke matrix ({res['elapsed']:.0f} s):\n" + render_matrix(res["cases"]))
    for l in hang_lines(res["cases"]):
        print("  hang: " + l)
    if sim:
        print("\n" + render_times(res["cases"]))
        return 0 if all(c["status"] == "ok" for c in res["cases"]) else 1
    return 0  # the matrix ran; its verdict is in the cases


if __name__ == "__main__":
    sys.exit(main())
