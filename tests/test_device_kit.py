"""The GPU bring-up kit without a GPU: tools/smoke/smoke.py's driver (kill, restart, budget) against a
fake worker, its case checks on CPU tensors, the matrix and summary rendering, the plan handed to
tools/device/device_check.sh, the hang-build knobs, and bash -n on the script."""
import json
import math
import re
import os
import signal
import subprocess
import tarfile
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tools" / d) for d in ("build", "device", "smoke")]
import compile_check  # noqa: E402
import device_summary  # noqa: E402
import flash3_build  # noqa: E402
import smoke  # noqa: E402

# A stand-in for `smoke.py --worker`: FAKE="kernel/feature=mode;..." picks what each case does.
FAKE_WORKER = textwrap.dedent("""
    import json, os, signal, sys, time
    a = sys.argv
    kernel, feats = a[a.index("--kernel") + 1], a[a.index("--features") + 1].split(",")
    if os.environ.get("FAKE_ARGV"):
        open(os.environ["FAKE_ARGV"], "a").write(json.dumps(a) + "\\n")
    feats = [f.removesuffix("@1") for f in feats]  # smoke.ONE_SEED tokens: the feature is the name
    modes = dict(x.split("=") for x in os.environ.get("FAKE", "").split(";") if x)
    if os.environ.get("FAKE_PIDFILE"):
        open(os.environ["FAKE_PIDFILE"], "a").write(f"{os.getpid()}\\n")
    if modes.get(kernel) == "nostart":
        print("ImportError: no flash3._C", file=sys.stderr)
        sys.exit(1)
    print(json.dumps({"ready": True, "flash3": "/fake"}), flush=True)
    for f in feats:
        m = modes.get(f"{kernel}/{f}", modes.get("*", "ok"))
        print(json.dumps({"begin": f}), flush=True)
        if m == "hang":
            time.sleep(1000)
        if m == "slow":  # 2 s, then ok
            time.sleep(2)
            m = "ok"
        if m == "segv":
            os.kill(os.getpid(), signal.SIGSEGV)
        if m == "exit":
            print("RuntimeError: boom", file=sys.stderr)
            sys.exit(7)
        if m == "trap":  # what the FLASH3_DEBUG_HANG build does: printf lines, then a CUDA error
            print("flash3 hang: block 3 warpgroup 1 thread 128 waits on KFull phase 0 tile 2", flush=True)
            print(json.dumps({"kernel": kernel, "feature": f, "status": "crash",
                              "detail": "CUDA error: unspecified launch failure"}), flush=True)
            print("flash3 hang: block 5 warpgroup 0 thread 0 waits on KEmpty phase 1 tile 2", flush=True)
            sys.exit(3)
        print(json.dumps({"kernel": kernel, "feature": f, "status": m, "detail": m + " detail"}), flush=True)
""")


@pytest.fixture
def fake(tmp_path, monkeypatch):
    path = tmp_path / "fake_worker.py"
    path.write_text(FAKE_WORKER)

    def setup(modes: str):
        monkeypatch.setenv("FAKE", modes)
        return [sys.executable, str(path)]
    return setup


def run_smoke_cli(cmd, kernels, out):
    """tools/smoke/smoke.py on `kernels` with the fake worker `cmd`, 1 s per case, json to `out`:
    (the finished process, the saved json)."""
    p = subprocess.run([sys.executable, str(ROOT / "tools" / "smoke" / "smoke.py"), "--kernels", kernels,
                        "--worker-cmd", " ".join(cmd), "--case-timeout", "1", "--json", str(out)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return p, json.loads(out.read_text())


def deselected(k, *files):
    """A real pytest collection of `files`: (every test id, the ids `-k k` leaves out)."""
    collect = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *files]
    run = lambda *a: subprocess.run(collect + list(a), capture_output=True, text=True, cwd=ROOT,  # noqa: E731
                                    env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=120)
    every, kept = run(), run("-k", k)
    assert kept.returncode == 0, kept.stdout + kept.stderr
    ids = lambda r: {l for l in r.stdout.splitlines() if "::" in l}  # noqa: E731
    return ids(every), ids(every) - ids(kept)


FWD_FEATURES = [f for f in smoke.FEATURES if smoke.applies("bf16:64:64", f)]


def by_case(res):
    return {(c["kernel"], c["feature"]): c for c in res["cases"]}


def test_fp8_cases_get_a_longer_silence_and_gpu_workers_a_share_of_the_cores(fake, tmp_path):
    """An e4m3 case may stay silent smoke.case_weight (4) times --case-timeout (its reference is the
    FP8 emulation): a 2 s case passes at 1 s per case, where a 16-bit one is a hang. The driver
    gives each GPU worker OMP_NUM_THREADS = cores / --parallel (the worker inherits it)."""
    assert smoke.case_weight("e4m3:128:128") == 4 and smoke.case_weight("bf16:128:128") == 1
    cmd = fake("e4m3:128:128/full=slow;bf16:128:128/full=slow")
    res = smoke.run_matrix([("e4m3:128:128", ["full"]), ("bf16:128:128", ["full"])], cmd, parallel=2,
                           case_timeout=1.0, start_timeout=20, budget=60)
    c = by_case(res)
    assert c[("e4m3:128:128", "full")]["status"] == "ok"
    assert c[("bf16:128:128", "full")]["status"] == "hang"
    probe = tmp_path / "omp.py"
    probe.write_text("import os, sys; print('OMP=%s' % os.environ.get('OMP_NUM_THREADS'), file=sys.stderr); sys.exit(1)")
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    p = subprocess.run([sys.executable, str(ROOT / "tools" / "smoke" / "smoke.py"), "--kernels", "bf16:128:128",
                        "--features", "full", "--parallel", "2", "--case-timeout", "1",
                        "--worker-cmd", f"{sys.executable} {probe}"],
                       capture_output=True, text=True, timeout=60, env=env)
    assert f"OMP={max(1, (os.cpu_count() or 1) // 2)}" in p.stdout + p.stderr, p.stdout + p.stderr


def test_silent_worker_reports_where_its_python_was(fake, monkeypatch):
    """A case silent past its timeout: with PYTHONFAULTHANDLER (smoke.py sets it for GPU workers) the
    driver asks the worker for its stack (SIGABRT) before killing it, and the hang's detail says where
    it was: a sleep in the fake worker here, a CUDA synchronize or the FP8 emulation on a GPU."""
    monkeypatch.setenv("PYTHONFAULTHANDLER", "1")
    cmd = fake("bf16:64:64/causal=hang")
    res = smoke.run_matrix([("bf16:64:64", ["causal", "full"])], cmd, parallel=1, case_timeout=1.0,
                           start_timeout=20, budget=60)
    c = by_case(res)
    d = c[("bf16:64:64", "causal")]["detail"]
    assert c[("bf16:64:64", "causal")]["status"] == "hang" and d.startswith("silent for 1 s; Python at "), d
    assert "fake_worker.py:" in d, d
    assert c[("bf16:64:64", "full")]["status"] == "ok"  # the rest on a fresh worker


def test_driver_classifies_kills_and_restarts(fake):
    cmd = fake("bf16:64:64/causal=hang;bf16:64:64/gqa=segv;fp16:128:128/full=exit;"
               "fp16:128:128/varlen=trap;bf16:96:96/window=wrong;bf16:96:96/softcap=nan")
    jobs = [(k, FWD_FEATURES) for k in ("bf16:64:64", "bf16:96:96", "fp16:128:128")]
    t0 = time.monotonic()
    seen = []
    res = smoke.run_matrix(jobs, cmd, parallel=2, case_timeout=1.0, start_timeout=20, budget=60,
                           on_record=seen.append)
    assert time.monotonic() - t0 < 30
    assert len(FWD_FEATURES) == 14  # sequsedq and chunk (attention_chunk): the 13th and 14th
    assert [len(x) for x in seen] == list(range(1, 43))  # progress after every case (3 kernels x 14)
    c = by_case(res)
    assert len(res["cases"]) == 42
    assert c[("bf16:64:64", "causal")]["status"] == "hang"
    assert "silent for 1 s" in c[("bf16:64:64", "causal")]["detail"]
    assert c[("bf16:64:64", "gqa")]["status"] == "crash"
    assert "SIGSEGV" in c[("bf16:64:64", "gqa")]["detail"]
    assert c[("fp16:128:128", "full")]["status"] == "crash"
    assert c[("fp16:128:128", "full")]["detail"] == "exit 7: RuntimeError: boom"
    trap = c[("fp16:128:128", "varlen")]
    assert trap["status"] == "crash" and "unspecified launch failure" in trap["detail"]
    assert len(trap["device_lines"]) == 2  # printf before and after the worker's JSON line
    assert c[("bf16:96:96", "window")]["status"] == "wrong"
    assert c[("bf16:96:96", "softcap")]["status"] == "nan"
    # Everything after a hang or crash ran in a restarted worker.
    for k, f in [("bf16:64:64", "window"), ("bf16:64:64", "kvcache"), ("bf16:64:64", "sq_gt_sk"),
                 ("bf16:64:64", "nextdim"), ("fp16:128:128", "causal"), ("fp16:128:128", "kvcache"),
                 ("fp16:128:128", "sq_gt_sk"), ("fp16:128:128", "nextdim")]:
        assert c[(k, f)]["status"] == "ok", (k, f)
        assert c[(k, f)]["flash3"] == "/fake"
    assert smoke.counts(res["cases"]) == {"ok": 36, "hang": 1, "crash": 3, "wrong": 1, "nan": 1}


def test_driver_feature_tokens(fake, tmp_path, monkeypatch):
    """A worker's feature tokens (smoke.ONE_SEED: first seed only) are recorded under the feature's
    name, and the token itself is what a restarted worker gets."""
    monkeypatch.setenv("FAKE_ARGV", str(tmp_path / "argv"))
    cmd = fake("bf16:64:64/causal=segv")
    res = smoke.run_matrix([("bf16:64:64", ["full", "causal@1", "window@1"])], cmd, parallel=1,
                           case_timeout=5.0, start_timeout=20, budget=60)
    assert [(c["feature"], c["status"]) for c in res["cases"]] == [("full", "ok"), ("causal", "crash"),
                                                                      ("window", "ok")]
    argvs = [json.loads(l) for l in (tmp_path / "argv").read_text().splitlines()]
    assert [a[a.index("--features") + 1] for a in argvs] == ["full,causal@1,window@1", "window@1"]


def test_driver_budget_leaves_not_run(fake):
    cmd = fake("*=hang")
    jobs = [("bf16:128:128", FWD_FEATURES), ("fp16:128:128", FWD_FEATURES)]
    t0 = time.monotonic()
    res = smoke.run_matrix(jobs, cmd, parallel=2, case_timeout=1.0, start_timeout=20, budget=2.5)
    assert time.monotonic() - t0 < 12
    n = smoke.counts(res["cases"])
    assert n.get("hang", 0) >= 2 and n.get("not run", 0) >= 10
    assert sum(n.values()) == 28  # 2 kernels x 14 features
    c = by_case(res)
    # Retries go to the back of the queue: both kernels got their first case before any second.
    assert c[("bf16:128:128", "full")]["status"] == c[("fp16:128:128", "full")]["status"] == "hang"


def test_driver_worker_that_cannot_start(fake):
    res = smoke.run_matrix([("bf16:64:64", ["full", "causal"])], fake("bf16:64:64=nostart"),
                           parallel=1, case_timeout=1, start_timeout=20, budget=30)
    for c in res["cases"]:
        assert c["status"] == "crash"
        assert c["detail"] == "worker failed to start: exit 1: ImportError: no flash3._C"


def test_driver_sigterm_kills_its_workers(fake, tmp_path, monkeypatch):
    pidfile = tmp_path / "pids"
    monkeypatch.setenv("FAKE_PIDFILE", str(pidfile))
    cmd = fake("*=hang")
    drv = subprocess.Popen([sys.executable, str(ROOT / "tools" / "smoke" / "smoke.py"), "--kernels", "bf16:64:64",
                            "--worker-cmd", " ".join(cmd), "--case-timeout", "100"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        if pidfile.exists() and pidfile.read_text().strip():
            break
        time.sleep(0.05)
    time.sleep(0.3)
    drv.send_signal(signal.SIGTERM)
    assert drv.wait(timeout=20) == 128 + signal.SIGTERM
    pid = int(pidfile.read_text().split()[0])
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the hung worker outlived its driver")


def test_cli_json_and_plan_for_bash(fake, tmp_path):
    cmd = fake("bf16:128:128/causal=hang;fp16:192:128/full=wrong;bf16:64:64/varlen=segv")
    out = tmp_path / "smoke.json"
    kernels = "bf16:64:64,bf16:128:128,fp16:192:128,bf16:256:256"
    p, saved = run_smoke_cli(cmd, kernels, out)
    assert "smoke matrix" in p.stdout and "HANG" in p.stdout
    # 4 kernels x 14 features, but alibi on the two above d 128 (forward ALiBi stops at 128)
    assert len(saved["cases"]) == 54 and "partial" not in saved
    meta = saved["meta"]  # how the run was made, for tools/smoke/sim_report.py
    assert meta["backend"] == "gpu" and "seeds" not in meta and len(meta["date"]) == 10
    assert "tools/smoke/smoke.py --kernels " + kernels in meta["command"]
    sh = (f'eval "$({sys.executable} {ROOT}/tools/smoke/smoke.py --plan {out})"; '
          'printf "%s|" "$HANG_CASES" "$FAIL_CASES" "$BENCH_HDIMS" "$PYTEST_K"')
    got = subprocess.run(["bash", "-c", sh], capture_output=True, text=True, check=True).stdout.split("|")
    assert got[:4] == ["bf16:128:128/causal", "bf16:64:64/varlen fp16:192:128/full",
                       "64,256", "not (bf16 and d128_128)"]  # bench: full and causal ok


def test_render_matrix_and_hang_lines():
    cases = [{"kernel": "bf16:192:128", "feature": f, "status": "ok"} for f in FWD_FEATURES]
    cases[1] = {"kernel": "bf16:192:128", "feature": "causal", "status": "wrong",
                "detail": "max err 3.1e-01 > tol 4.0e-03"}
    cases.append({"kernel": "fp16:64:64", "feature": "full", "status": "crash", "detail": "exit 3",
                  "device_lines": [
                      "flash3 hang: block 0 warpgroup 1 thread 128 waits on KFull phase 0 tile 0",
                      "flash3 hang: block 1 warpgroup 1 thread 160 waits on KFull phase 0 tile 0",
                      "flash3 hang: block 0 warpgroup 0 thread 0 waits on KEmpty phase 1 tile 0"]})
    cases.append({"kernel": "fp16:64:64", "feature": "causal", "status": "not run"})
    text = smoke.render_matrix(cases)
    lines = text.splitlines()
    assert lines[0].split() == ["kernel"] + FWD_FEATURES
    assert lines[1].split() == ["bf16", "192x128", "ok", "WRONG"] + ["ok"] * 12
    assert lines[2].split() == ["fp16", "64", "CRASH", "-"]
    assert "16 cases: 13 ok, 1 wrong, 1 crash, 1 not run" in text
    assert "bf16 192x128 causal: wrong: max err 3.1e-01 > tol 4.0e-03" in text
    assert smoke.hang_lines(cases) == [
        "fp16 64 full: warpgroup 1 waits on KFull phase 0 tile 0  (2 warps in 2 blocks)",
        "fp16 64 full: warpgroup 0 waits on KEmpty phase 1 tile 0  (1 warps in 1 blocks)"]


@pytest.mark.parametrize("feature", FWD_FEATURES)
def test_case_check_classifies_on_cpu(feature):
    """check() with the fp64 reference rounded to bf16 as the 'kernel' output: ok; one element
    off: wrong; a NaN (an unwritten element): nan. Covers each feature's per-sequence slicing."""
    sys.path.insert(0, str(ROOT / "tests"))
    from helpers import attention_ref64
    c = smoke.make_case(feature, "bf16", 64, 64, device="cpu")
    varlen = c["cu_q"] is not None
    q = c["q"]
    out = torch.zeros(*q.shape[:-1], c["v"].shape[-1], dtype=q.dtype)
    lse = torch.zeros((q.shape[1], q.shape[0]) if varlen else (q.shape[0], q.shape[2], q.shape[1]))
    kw = dict(causal=c["causal"], window_size=c["window"], softcap=c["softcap"])
    if c["sinks"] is not None:  # the oracle's sink column, as check() computes it
        kw["sinks"] = c["sinks"].double()
    if c["chunk"]:
        kw["attention_chunk"] = c["chunk"]
    for i, (o, l, qq, k, v) in enumerate(smoke._pieces(c, out, lse)):
        if c["alibi"] is not None:  # each sequence's slopes (varlen), as check() takes them
            kw["alibi_slopes"] = c["alibi"][i].double()
        ref, ref_lse = attention_ref64(qq, k, v, **kw)
        o.copy_(ref.to(o.dtype))
        l.copy_(ref_lse.float())
    used = smoke.used_rows(c, "out")
    if feature == "sequsedq":  # rows past seqused_q: exactly out 0, lse -inf; the NaN poison left there is wrong
        pad = smoke.past_seqused_q(c)
        lse[:, pad] = float("-inf")
        for name, t in (("out", out), ("lse", lse)):
            left = t.clone()
            if name == "out":
                left[pad.nonzero()[0, 0]] = float("nan")
            else:
                left[:, pad.nonzero()[-1, 0]] = float("nan")
            r = smoke.check(c, *((left, lse) if name == "out" else (out, left)))
            assert r["status"] == "wrong" and r["detail"] == "rows past seqused_q: out/lse not 0/-inf", r
        used = slice(0, smoke.used_q_counts(c)[0])  # the errors below go to the first sequence's queries
    if feature == "nantail":  # rows past cu_seqlens_q[-1]: the op leaves them (NaN poison)
        out[used.stop:], lse[:, used.stop:] = float("nan"), float("nan")
        for name, t in (("out", out), ("lse", lse)):
            written = t.clone()
            written[(used.stop + 1, 0) if name == "out" else (0, used.stop + 1)] = 0.0
            r = smoke.check(c, *((written, lse) if name == "out" else (out, written)))
            assert r["status"] == "wrong" and r["detail"] == f"wrote {name} past cu_seqlens[-1]", r
    r = smoke.check(c, out, lse)
    assert r["status"] == "ok" and r["sharp"] < 1, r
    # The sharp bound (issue 32): an error 0.63x the FlashAttention rule's tolerance, half of one
    # that crosses the rule by 1.27x, passes the rule but not the sharp bound.
    bad = out.clone()
    bad[used].view(-1)[0] += 0.63 * r["tol"]
    r = smoke.check(c, bad, lse)
    assert r["status"] == "wrong" and r["detail"].startswith("sharp bound: max err") and r["err"] < r["tol"], r
    bad = out.clone()
    bad[used].view(-1)[-5] += 1.0
    r = smoke.check(c, bad, lse)
    assert r["status"] == "wrong" and r["detail"].startswith("max err")
    i = int(torch.isfinite(lse).view(-1).nonzero()[0])  # sq_gt_sk: the rows without keys are -inf
    bad_lse = lse.clone()
    bad_lse.view(-1)[i] += 0.5
    r = smoke.check(c, out, bad_lse)
    assert r["status"] == "wrong" and r["detail"].startswith("lse err"), r
    if torch.isinf(lse).any() and feature != "sequsedq":  # a row without keys must stay -inf
        # varlen: a sequence of queries and 0 keys; sinks: rows without keys under a -inf sink;
        # chunk: also rows whose diagonal is negative (no chunk of keys)
        assert feature in ("sq_gt_sk", "varlen", "nantail", "sinks", "chunk")
        bad_lse = lse.clone()
        bad_lse.view(-1)[int(torch.isinf(lse).view(-1).nonzero()[0])] = 0.0
        r = smoke.check(c, out, bad_lse)
        assert r["status"] == "wrong" and r["detail"].startswith("lse: -inf pattern"), r
    bad = out.clone()
    bad.view(-1)[7] = float("nan")
    assert smoke.check(c, bad, lse)["status"] == "nan"


@pytest.mark.parametrize("dtype,bwd", [("bf16", False), ("fp16", False), ("e4m3", False), ("bf16", True)])
def test_sq_gt_sk_has_rows_without_keys(dtype, bwd):
    """sq_gt_sk: causal, SK queries over SQ keys (bottom-right aligned), so the first SK - SQ = 128
    rows of each (batch, head) see no key: the fp64 reference gives them out 0 and lse -inf, every
    later row a finite lse (the FP8 emulation, which the e4m3 check uses, agrees)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from helpers import attention_ref64
    c = smoke.make_case("sq_gt_sk", dtype, 64, 64, device="cpu", bwd=bwd)
    assert c["causal"] and c["window"] == (-1, -1) and c["cu_q"] is None and c["seqused_k"] is None
    assert (c["max_q"], c["max_k"]) == (smoke.SK, smoke.SQ) == (331, 203)
    assert c["q"].shape[1] == 331 and c["k"].shape[1] == c["v"].shape[1] == 203
    empty = smoke.SK - smoke.SQ
    assert empty == 128
    if dtype == "e4m3":  # q and k dequantized (lse depends on them only); v as stored
        from flash3 import fp8
        (qd, kd, _, _), blk = c["descales"], c["fp8_block"]
        q, k = fp8.dequantize_fp8(c["q"], qd, block_size=blk[0]), fp8.dequantize_fp8(c["k"], kd, block_size=blk[1])
        v = c["v"].float()
    else:
        q, k, v = c["q"], c["k"], c["v"]
    ref, ref_lse = attention_ref64(q.double(), k.double(), v.double(), causal=True)
    assert ref_lse.shape == (2, 2, 331)
    assert torch.isneginf(ref_lse[:, :, :empty]).all() and torch.isfinite(ref_lse[:, :, empty:]).all()
    assert (ref[:, :empty] == 0).all() and (ref[:, empty:].abs().amax(-1) > 0).all()
    if dtype == "e4m3":
        emu, emu_lse = smoke.fp8_reference(c)
        assert torch.equal(torch.isinf(emu_lse), torch.isinf(ref_lse)) and (emu[:, :empty] == 0).all()
        assert (emu_lse[:, :, empty:].double() - ref_lse[:, :, empty:]).abs().max() < 1e-2
    if bwd:  # dout and the lse gradient's shape follow q
        assert c["dout"].shape == (2, 331, 2, 64) and c["dlse"] is None


FP8_FEATURES = [f for f in smoke.FEATURES if smoke.applies("e4m3:64:64", f)]


def test_fp8_features_and_kernel_ids(monkeypatch):
    assert FP8_FEATURES == ["full", "causal", "window", "softcap", "gqa", "varlen", "sq_gt_sk", "perhead", "nantail",
                            "sequsedq", "chunk", "fastacc"]
    info = {"fwd": [["bf16", 64, 64, "v0"], ["bf16", 64, 64, "v1"], ["fp16", 192, 128]],
            "fwd_fp8": [[64, 64], [128, 128], [256, 256]], "arch": "sm_90a"}
    ids = ["bf16:64:64", "fp16:192:128", "e4m3:64:64", "e4m3:128:128", "e4m3:256:256"]
    assert smoke.kernel_ids(info) == ids
    assert smoke.kernel_ids({"fwd": [["bf16", 128, 128]]}) == ["bf16:128:128"]  # a build without FP8
    monkeypatch.setattr(torch.ops.flash3, "kernel_info", lambda: json.dumps(info), raising=False)
    monkeypatch.setattr(smoke.smoke_quant, "gpu_info", lambda: {})  # a build without the quantize op
    assert smoke.built_kernel_ids() == ids
    assert smoke.kernel_label("e4m3:128:128") == "e4m3 128"
    with pytest.raises(ValueError, match="kvcache does not apply to e4m3"):
        smoke.make_case("kvcache", "e4m3", 64, 64, device="cpu")
    for dt in ("bf16", "fp16"):  # one descale per head, fast accumulation: FP8 features
        for f in ("perhead", "fastacc"):
            with pytest.raises(ValueError, match=f"{f} does not apply to {dt}"):
                smoke.make_case(f, dt, 64, 64, device="cpu")


@pytest.mark.parametrize("feature", FP8_FEATURES)
def test_fp8_case_shapes(feature):
    """The bf16 case's shapes in e4m3, with fp32 descales in the FP8 op's block layout (FP8 only:
    perhead, the full case's shapes, one descale per (batch, head); fastacc, the gqa case's shapes,
    causal, with fast_accum and one v descale per (batch, kv head))."""
    c = smoke.make_case(feature, "e4m3", 128, 128, device="cpu")
    base = {"perhead": "full", "fastacc": "gqa"}.get(feature, feature)
    ref = smoke.make_case(base, "bf16", 128, 128, device="cpu")
    assert c["dtype"] == "e4m3" and bool(c.get("fast_accum")) == (feature == "fastacc")
    for n in ("q", "k", "v"):
        assert c[n].dtype == torch.float8_e4m3fn and c[n].shape == ref[n].shape, n
    for n in ("causal", "window", "softcap", "max_q", "max_k", "lens_q", "lens_k"):
        assert c[n] == (True if feature == "fastacc" and n == "causal" else ref[n]), n
    h, hk = c["q"].shape[-2], c["k"].shape[-2]
    packed = feature in ("varlen", "nantail", "sequsedq", "chunk")
    # packed: one descale block row per sequence
    b = len(c["lens_q"]) if packed else 2
    if feature == "perhead":  # the sequence rounded up to the kernel's 64 rows / 128 keys
        assert c["fp8_block"] == (256, 384) == (-(-smoke.SQ // 64) * 64, -(-smoke.SK // 128) * 128)
        nq = nk = 1
    else:
        assert c["fp8_block"] == smoke.FP8_BLOCK
        nq, nk = -(-c["max_q"] // 64), -(-c["max_k"] // 128)
    v_shape = (b, hk) if feature == "fastacc" else (b, hk, nk)
    assert [tuple(x.shape) for x in c["descales"]] == [(b, h, nq), (b, hk, nk), v_shape, (b, hk, 128)]
    assert all(x.dtype == torch.float32 and (x > 0).all() for x in c["descales"])
    assert (c["cu_q"] is not None) == packed and (c["seqused_k"] is not None) == (feature == "sequsedq")
    if feature == "varlen":
        assert c["cu_q"].tolist() == [0, smoke.SQ, smoke.SQ, smoke.SQ + 77, smoke.SQ + 78] and c["q"].dim() == 3
        assert c["cu_k"].tolist() == [0, smoke.SK, smoke.SK + 40, smoke.SK + 190, smoke.SK + 190]
        assert c["q"].shape[0] == smoke.SQ + 78 and c["k"].shape[0] == c["v"].shape[0] == smoke.SK + 190
        assert all(((x >= 0.5) & (x < 1.5)).all() for x in c["descales"])
    elif feature == "nantail":  # packed, rows past cu_seqlens[-1] NaN (e4m3's NaN code; +-Inf clamped to +-448)
        (lq, lk), (pq, pk) = smoke.NANTAIL_LENS, smoke.NANTAIL_PAD
        assert c["q"].shape[0] == sum(lq) + pq and c["k"].shape[0] == c["v"].shape[0] == sum(lk) + pk
        assert torch.isnan(c["q"][sum(lq):].float()).any() and torch.isnan(c["k"][sum(lk):].float()).any()
        assert not torch.isnan(c["q"][:sum(lq)].float()).any() and not torch.isnan(c["k"][:sum(lk)].float()).any()
    elif feature in ("sequsedq", "chunk"):  # packed, FA3's seqused_q/k, attention_chunk
        assert c["q"].shape[0] == sum(c["lens_q"]) and c["k"].shape[0] == sum(c["lens_k"])
        assert (c.get("seqused_q") is not None) == (feature == "sequsedq") and bool(c.get("chunk")) == (feature == "chunk")
    elif feature == "sq_gt_sk":  # more queries than keys
        assert c["q"].shape[:2] == (b, smoke.SK) and c["k"].shape[1] == smoke.SQ and c["causal"]
        assert (c["max_q"], c["max_k"]) == (smoke.SK, smoke.SQ)
    else:
        assert c["q"].shape[:2] == (b, smoke.SQ) and c["k"].shape[1] == smoke.SK
    assert (h, hk) == ((6, 2) if feature in ("gqa", "fastacc") else (4, 2) if feature == "chunk" else (2, 2))


@pytest.mark.parametrize("feature", FP8_FEATURES)
def test_fp8_case_check_classifies_on_cpu(feature):
    """check() on an e4m3 case with the emulation's own (out, lse), out rounded to bf16 as the
    kernel writes it: ok; out off: wrong; lse off: wrong; a NaN: nan."""
    c = smoke.make_case(feature, "e4m3", 64, 64, device="cpu")
    ref, ref_lse = smoke.fp8_reference(c)
    out, lse = ref.to(torch.bfloat16), ref_lse.clone()
    nq = c["q"].shape[0] if c["cu_q"] is not None else c["q"].shape[0] * c["q"].shape[1]
    assert out.shape == (*c["q"].shape[:-1], 64) and lse.numel() == nq * c["q"].shape[-2]
    used = smoke.used_rows(c, "out")
    if feature == "nantail":  # rows past cu_seqlens_q[-1]: the op leaves them (NaN poison)
        assert smoke.check(c, out, lse)["detail"] == "wrote out, lse past cu_seqlens[-1]"
        out[used.stop:], lse[:, used.stop:] = float("nan"), float("nan")
    r = smoke.check(c, out, lse)
    assert r["status"] == "ok" and r["err"] < r["tol"], r
    bad = out.clone()
    # one value off by twice the RMS tolerance's worth, in a row that is a query (not past seqused_q)
    bump = max(1.0, 2 * r["tol"] * out[used].numel() ** 0.5)
    if c["cu_q"] is not None:
        bad[int(torch.isfinite(lse[0, used]).nonzero()[-1]), 0, -1] += bump
    else:
        bad[used].view(-1)[-5] += bump
    r = smoke.check(c, bad, lse)
    assert r["status"] == "wrong" and r["detail"].startswith("rms err"), r
    i = int(torch.isfinite(lse).view(-1).nonzero()[0])  # sq_gt_sk: the rows without keys are -inf
    assert (i == 0) == (feature != "sq_gt_sk")
    bad_lse = lse.clone()
    bad_lse.view(-1)[i] += 0.5
    r = smoke.check(c, out, bad_lse)
    assert r["status"] == "wrong" and r["detail"].startswith("lse err"), r
    bad_lse.view(-1)[i] = float("-inf")
    assert smoke.check(c, out, bad_lse)["detail"].startswith("lse: -inf pattern")
    if feature in ("sq_gt_sk", "varlen", "nantail", "sequsedq", "chunk"):  # a row without keys given a finite lse
        assert torch.isinf(lse).any()  # varlen, chunk: a sequence of queries and 0 keys
        bad_lse = lse.clone()
        no_keys = torch.isinf(lse)  # rows of queries that see no key (rows past seqused_q are no queries)
        if c.get("seqused_q") is not None:
            no_keys &= ~smoke.past_seqused_q(c)[None]
        bad_lse.view(-1)[int(no_keys.view(-1).nonzero()[0])] = 0.0
        assert smoke.check(c, out, bad_lse)["detail"].startswith("lse: -inf pattern")
    else:
        assert torch.isfinite(lse).all()
    bad = out.clone()
    bad.view(-1)[7] = float("nan")
    assert smoke.check(c, bad, lse)["status"] == "nan"


def test_fp8_rows_in_matrix_plan_and_pytest_k(fake, tmp_path):
    """e4m3 kernels run every feature but kvcache (no case: "n/a"); a hung one is rerun like any
    other, and its head dim's tests in tests/test_fp8_gpu.py are deselected (checked against a
    real collection); the benchmark head dims come from bf16 only."""
    cmd = fake("e4m3:128:128/window=hang;e4m3:64:64/gqa=wrong")
    out = tmp_path / "smoke.json"
    p, saved = run_smoke_cli(cmd, "bf16:128:128,e4m3:64:64,e4m3:128:128", out)
    cases = saved["cases"]
    assert len(cases) == 14 + 12 + 12  # e4m3 has no kvcache, sinks, alibi ("n/a", with the rest)
    assert not any(c["kernel"].startswith("e4m3") and c["feature"] in ("kvcache", "nextdim") for c in cases)
    assert not any(c["kernel"].startswith("bf16") and c["feature"] == "perhead" for c in cases)
    lines = smoke.render_matrix(cases).splitlines()
    assert lines[0].split() == ["kernel"] + [f for f in smoke.FEATURES if f not in ("determ", "dlse", "onekey")]
    # perhead, fastacc: FP8 only
    assert lines[1].split() == ["bf16", "128"] + ["ok"] * 8 + ["n/a"] + ["ok"] * 6 + ["n/a"]
    assert lines[2].split() == ["e4m3", "64", "ok", "ok", "ok", "ok", "WRONG", "ok", "n/a", "ok", "ok", "n/a", "ok",
                                "n/a", "n/a", "ok", "ok", "ok"]  # sinks, alibi: not with FP8
    assert lines[3].split() == ["e4m3", "128", "ok", "ok", "HANG", "ok", "ok", "ok", "n/a", "ok", "ok", "n/a", "ok",
                                "n/a", "n/a", "ok", "ok", "ok"]
    assert "38 cases: 36 ok, 1 wrong, 1 hang" in lines[4]
    assert "e4m3 128 window: hang" in p.stdout
    plan = smoke.plan(cases)
    assert plan["HANG_CASES"] == "e4m3:128:128/window" and plan["FAIL_CASES"] == "e4m3:64:64/gqa"
    assert plan["BENCH_HDIMS"] == "128"
    k = plan["PYTEST_K"]
    assert k == "not (test_fp8_gpu and (-128] or [128] or no_host_sync_graph))"
    both = smoke.plan(cases + [{"kernel": "fp16:64:64", "feature": "full", "status": "hang"}])["PYTEST_K"]
    assert both == f"not (fp16 and d64_64) and {k}"
    every, gone = deselected(k, "tests/test_fp8_gpu.py", "tests/test_kernel_gpu.py")
    assert gone and all(t.startswith("tests/test_fp8_gpu.py::") for t in gone)
    assert all(t.endswith(("-128]", "[128]", "no_host_sync_graph")) for t in gone)
    assert len(gone) == len([t for t in every if t.startswith("tests/test_fp8_gpu.py::") and
                             t.endswith(("-128]", "[128]", "no_host_sync_graph"))])


BWD_FEATURES = [f for f in smoke.FEATURES if smoke.applies("bwd:bf16:64:64", f)]


def test_bwd_features_and_kernel_ids():
    """A bwd: row per "bwd" triple whose forward is built (its out/lse come from it); every forward
    feature but kvcache, plus determ and dlse (backward only)."""
    assert BWD_FEATURES == ["full", "causal", "window", "softcap", "gqa", "varlen", "determ", "dlse", "sq_gt_sk",
                            "nextdim", "onekey", "nantail", "sinks", "alibi", "sequsedq", "chunk"]
    assert FWD_FEATURES == ["full", "causal", "window", "softcap", "gqa", "varlen", "kvcache", "sq_gt_sk", "nextdim",
                            "nantail", "sinks", "alibi", "sequsedq", "chunk"]
    assert "nextdim" not in FP8_FEATURES
    assert not {"determ", "dlse"} & set(FWD_FEATURES + FP8_FEATURES) and "kvcache" in FWD_FEATURES
    info = {"fwd": [["bf16", 128, 128], ["fp16", 192, 128]], "fwd_fp8": [[128, 128]],
            "bwd": [["bf16", 128, 128], ["fp16", 192, 128], ["bf16", 64, 64]]}  # no bf16 64 forward
    assert smoke.kernel_ids(info) == ["bf16:128:128", "fp16:192:128", "e4m3:128:128",
                                      "bwd:bf16:128:128", "bwd:fp16:192:128"]
    assert smoke.parse_kernel("bwd:fp16:192:128") == ("fp16", 192, 128)
    assert smoke.family("bwd:fp16:192:128") == "bwd" and smoke.family("fp16:192:128") == "fp16"
    assert smoke.kernel_label("bwd:fp16:192:128") == "bwd fp16 192x128"
    with pytest.raises(ValueError, match="kvcache does not apply to bwd"):
        smoke.make_case("kvcache", "bf16", 64, 64, device="cpu", bwd=True)
    with pytest.raises(ValueError, match="perhead does not apply to bwd"):
        smoke.make_case("perhead", "bf16", 64, 64, device="cpu", bwd=True)
    with pytest.raises(ValueError, match="determ does not apply to bf16"):
        smoke.make_case("determ", "bf16", 64, 64, device="cpu")
    with pytest.raises(ValueError, match="dlse does not apply to e4m3"):
        smoke.make_case("dlse", "e4m3", 64, 64, device="cpu")
    with pytest.raises(ValueError, match="nextdim does not apply to e4m3"):
        smoke.make_case("nextdim", "e4m3", 64, 64, device="cpu")


def smoke_past(lengths, used):
    """Bool mask over packed rows: those of each sequence past its used count."""
    mask = torch.zeros(sum(lengths), dtype=torch.bool)
    start = 0
    for n, u in zip(lengths, used):
        mask[start + u:start + n] = True
        start += n
    return mask


@pytest.mark.parametrize("feature", BWD_FEATURES)
def test_bwd_case_check_classifies_on_cpu(feature):
    """The forward case plus dout (and dlse); check_bwd() with the reference's own bf16 gradients as
    the 'kernel' output: ok; one element off: wrong; a NaN: nan; determ: a differing repeat: wrong."""
    from flash3 import reference
    c = smoke.make_case(feature, "bf16", 64, 64, device="cpu", bwd=True)
    base = {"determ": "gqa", "dlse": "causal"}.get(feature, feature)  # backward-only: whose shapes
    if feature not in ("onekey", "sinks"):  # backward cases with shapes of their own
        fwd = smoke.make_case(base, "bf16", 64, 64, device="cpu")
        for n in ("q", "k", "v", "causal", "window", "softcap", "lens_q", "max_q", "max_k"):
            if n in "qkv":  # determ, dlse: another case's shapes (their own seed)
                x, y = c[n], fwd[n]
                if feature == "sequsedq" and n in "kv":  # the forward's keys past seqused_k: poisoned
                    keep = ~smoke_past(fwd["lens_k"], smoke.used_k_counts(fwd))
                    x, y = x[keep], y[keep]
                same = torch.equal(x.view(torch.uint8), y.view(torch.uint8))  # nantail: NaN rows
                assert c[n].shape == fwd[n].shape and (feature != base or same), n
            elif feature == "determ" and n == "causal":  # gqa's shapes, causal (smoke_cases.make_case)
                assert c[n] and not fwd[n], n
            else:
                assert c[n] == fwd[n], n
    # nextdim: the case's own head dims (smaller ones, routed to this kernel), the op's default
    # scale for them (what launch_bwd and check_bwd use)
    d, dv = smoke.next_dims(64, 64) if feature == "nextdim" else (64, 64)
    assert (c["q"].shape[-1], c["k"].shape[-1], c["v"].shape[-1]) == (d, d, dv) and (d, dv) == (
        (40, 40) if feature == "nextdim" else (64, 64))
    assert c["dout"].shape == (*c["q"].shape[:-1], dv) and c["deterministic"] == (feature == "determ")
    assert (c["dlse"] is not None) == (feature in ("dlse", "sinks"))
    sc, (l, r) = d ** -0.5, (-1, 0) if c["causal"] else c["window"]
    if c["cu_q"] is None:
        out, lse = reference.forward(c["q"], c["k"], c["v"], sc, l, r, c["softcap"])
        grads = reference.backward(c["dout"], c["q"], c["k"], c["v"], out, lse, sc, l, r, c["softcap"],
                                   dlse=c["dlse"])
    else:
        out, lse = reference.varlen_forward(c["q"], c["k"], c["v"], c["cu_q"], c["cu_k"], sc, l, r,
                                            c["softcap"], sinks=c["sinks"], alibi_slopes=c["alibi"],
                                            seqused_q=c["seqused_q"], chunk=c["chunk"])
        grads = reference.varlen_backward(c["dout"], c["q"], c["k"], c["v"], out, lse, c["cu_q"],
                                          c["cu_k"], sc, l, r, c["softcap"], dlse=c["dlse"], sinks=c["sinks"],
                                          alibi_slopes=c["alibi"], seqused_q=c["seqused_q"], chunk=c["chunk"])
    if feature == "sinks":  # varlen with dlse; d_sink is checked too: its sign flipped is wrong
        assert c["dlse"].shape == lse.shape and len(grads) == 4
        flipped = list(grads[:3]) + [-grads[3]]
        assert smoke.check_bwd(c, out, lse, flipped)["status"] == "wrong"
    elif c["dlse"] is not None:  # lse's shape; gradients that ignore it are wrong
        assert c["dlse"].dtype == torch.float32 and c["dlse"].shape == lse.shape == (2, 2, smoke.SQ)
        plain = reference.backward(c["dout"], c["q"], c["k"], c["v"], out, lse, sc, l, r, c["softcap"])
        assert smoke.check_bwd(c, out, lse, list(plain))["status"] == "wrong"
    grads = list(grads)
    again = [g.clone() for g in grads] if c["deterministic"] else None
    r = smoke.check_bwd(c, out, lse, grads, again)
    assert r["status"] == "ok" and r["err"] < r["tol"] / 2 and r["sharp"] < 1, r
    # The sharp bound: an error 0.63x the 4-eps tolerance passes that, not the sharp 2 eps.
    off = [g.clone() for g in grads]
    off[1].view(-1)[-5] += 0.63 * 4 * torch.finfo(torch.bfloat16).eps * grads[1].abs().max().item()
    r = smoke.check_bwd(c, out, lse, off)
    assert r["status"] == "wrong" and r["detail"].startswith("dk: sharp bound") and r["err"] < r["tol"], r
    if feature == "onekey":  # dq of a row that sees one key: exactly 0, however small the error
        assert torch.equal(grads[0][70:72], torch.zeros_like(grads[0][70:72]))
        off = [g.clone() for g in grads]
        off[0][71, 1, 5] = 2 ** -20
        r = smoke.check_bwd(c, out, lse, off)
        assert r["status"] == "wrong" and r["detail"] == "dq: 1 nonzero values in rows that see one key", r
    bad = [g.clone() for g in grads]
    bad[1].view(-1)[-5] += 1.0
    r = smoke.check_bwd(c, out, lse, bad)
    assert r["status"] == "wrong" and r["detail"].startswith("dk: max err"), r
    bad[2].view(-1)[7] = float("nan")
    assert smoke.check_bwd(c, out, lse, bad) == {"status": "nan", "detail": "1 NaN in dv (unwritten?)"}
    if again is not None:
        again[0].view(-1)[3] += 2 ** -6
        r = smoke.check_bwd(c, out, lse, grads, again)
        assert r["status"] == "wrong" and r["detail"].startswith("deterministic"), r


GEN = flash3_build.generate_kernels()  # csrc/generate_kernels.py: the compiled head dims


def registry_pick(compiled, d, dv):
    """The kernel the op runs (d, dv) on, as csrc/flash3/fwd/api.h pick_fwd_kernel and
    csrc/flash3/bwd/registry.cpp find_bwd_kernel choose it: among the compiled (head_dim, head_dim_v)
    with head_dim >= d and head_dim_v >= dv, the smallest head_dim, then the smallest head_dim_v; None
    when none covers them."""
    fits = [(kd, kdv) for kd, kdv in compiled if kd >= d and kdv >= dv]
    return min(fits) if fits else None


def test_registry_pick_emulation():
    """The rule is joint (both dims covered), then lexicographic: not "the smallest d first"."""
    dims = ((64, 64), (96, 96), (128, 128), (192, 192), (192, 128), (256, 256))
    assert all(registry_pick(dims, d, dv) == (d, dv) for d, dv in dims)
    assert registry_pick(dims, 64, 128) == (128, 128)  # (64, 64) has the smaller d but not the d_v
    assert registry_pick(dims, 136, 104) == (192, 128)  # not (192, 192): the smaller d_v of d 192
    assert registry_pick(dims, 136, 136) == (192, 192)
    assert registry_pick(dims, 8, 8) == (64, 64) and registry_pick(dims, 264, 8) is None


@pytest.mark.parametrize("d,dv", GEN.HEAD_DIMS)
def test_next_dims_route_to_the_same_kernel(d, dv):
    """"nextdim" of every compiled (d, d_v): multiples of 8 the ops accept (fwd_binding.cpp,
    bwd_binding.cpp: [8, 256]), strictly smaller in d or d_v, never larger, and the registry (forward
    and backward lists of a full build, hence of any build holding this kernel) gives them this kernel
    (flash3/_backend.py asks the extension that pick). make_case builds the full
    case at those dims for the 16-bit forward and the backward families."""
    nd, ndv = smoke.next_dims(d, dv)
    assert nd % 8 == 0 and ndv % 8 == 0 and 8 <= nd <= 256 and 8 <= ndv <= 256
    assert nd <= d and ndv <= dv and (nd < d or ndv < dv)
    assert (d, dv) in GEN.BWD_HEAD_DIMS  # every forward pair has a backward kernel (bwd: rows)
    for compiled in (GEN.HEAD_DIMS, GEN.BWD_HEAD_DIMS):
        assert registry_pick(compiled, nd, ndv) == (d, dv), (compiled, nd, ndv)
    for dtype, bwd in (("bf16", False), ("fp16", False), ("bf16", True)):
        kid = ("bwd:" if bwd else "") + f"{dtype}:{d}:{dv}"
        assert smoke.applies(kid, "nextdim") and not smoke.applies(f"e4m3:{d}:{dv}", "nextdim")
        c = smoke.make_case("nextdim", dtype, d, dv, device="cpu", bwd=bwd)
        full = smoke.make_case("full", dtype, d, dv, device="cpu", bwd=bwd)
        assert (c["q"].shape[-1], c["k"].shape[-1], c["v"].shape[-1]) == (nd, nd, ndv), kid
        assert c["q"].shape[:-1] == full["q"].shape[:-1] and c["k"].shape[:-1] == full["k"].shape[:-1]
        for n in ("causal", "window", "softcap", "cu_q", "seqused_k", "max_q", "max_k"):
            assert c[n] == full[n], (kid, n)
        if bwd:
            assert c["dout"].shape == (*c["q"].shape[:-1], ndv) and c["dlse"] is None and not c["deterministic"]


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_varlen_case_has_empty_sequences(dtype):
    """varlen: four sequences, one of 0 queries (40 keys) and one of 1 query and 0 keys. check()
    accepts the fp64 reference's out/lse, whose 0-key row is out 0, lse -inf; a finite lse, a
    nonzero out or a NaN on that row is rejected."""
    sys.path.insert(0, str(ROOT / "tests"))
    from helpers import attention_ref64
    c = smoke.make_case("varlen", dtype, 64, 64, device="cpu")
    SQ, SK = smoke.SQ, smoke.SK
    assert c["lens_q"] == [SQ, 0, 77, 1] and c["lens_k"] == [SK, 40, 150, 0]
    assert any(lq == 0 < lk for lq, lk in zip(c["lens_q"], c["lens_k"]))  # an empty-query sequence
    assert any(lk == 0 < lq for lq, lk in zip(c["lens_q"], c["lens_k"]))  # an empty-key sequence
    assert c["cu_q"].tolist() == [0, SQ, SQ, SQ + 77, SQ + 78] and c["cu_q"].dtype == torch.int32
    assert c["cu_k"].tolist() == [0, SK, SK + 40, SK + 190, SK + 190] and c["cu_k"].dtype == torch.int32
    assert c["q"].shape == (SQ + 78, 2, 64) and c["k"].shape == c["v"].shape == (SK + 190, 2, 64)
    assert (c["max_q"], c["max_k"]) == (SQ, SK)
    b = smoke.make_case("varlen", dtype, 64, 64, device="cpu", bwd=True)  # the backward's case: the same
    assert (b["lens_q"], b["lens_k"]) == (c["lens_q"], c["lens_k"]) and torch.equal(b["cu_k"], c["cu_k"])
    out = torch.full((SQ + 78, 2, 64), float("nan"), dtype=c["q"].dtype)
    lse = torch.full((2, SQ + 78), float("nan"))
    pieces = list(smoke._pieces(c, out, lse))
    assert [(q.shape[1], k.shape[1]) for _, _, q, k, _ in pieces] == list(zip(c["lens_q"], c["lens_k"]))
    kw = dict(causal=c["causal"], window_size=c["window"], softcap=c["softcap"])
    for o, l, q, k, v in pieces:
        ref, ref_lse = attention_ref64(q.double(), k.double(), v.double(), **kw)
        o.copy_(ref.to(o.dtype))
        l.copy_(ref_lse.float())
    row = SQ + 77  # the 1-query sequence's query: no key
    assert (out[row] == 0).all() and torch.isneginf(lse[:, row]).all()
    assert not torch.isnan(out).any() and torch.isfinite(torch.cat([lse[:, :row], lse[:, row + 1:]], 1)).all()
    r = smoke.check(c, out, lse)
    assert r["status"] == "ok" and r["err"] <= r["tol"], r
    for value in (0.0, -1e30):  # a finite lse on the 0-key row, whatever its size
        bad_lse = lse.clone()
        bad_lse[1, row] = value
        r = smoke.check(c, out, bad_lse)
        assert r["status"] == "wrong" and r["detail"] == "lse: -inf pattern differs from the reference", r
    bad = out.clone()
    bad[row, 0, 5] = 0.25  # the 0-key row's out must be 0
    r = smoke.check(c, bad, lse)
    assert r["status"] == "wrong" and r["detail"].startswith("max err"), r
    bad[row, 0, 5] = float("nan")  # unwritten
    assert smoke.check(c, bad, lse)["status"] == "nan"


def test_bwd_rows_in_matrix_plan_and_pytest_k(fake, tmp_path):
    """bwd: kernels run every feature but kvcache ("n/a"), forward ones get "n/a" for determ and
    dlse; a hung one is rerun, and its head dim's tests in tests/test_bwd_gpu.py only are deselected
    (checked against a real collection); failing bwd: cases go to the sanitizers like any other
    (tools/device/sanitize_small.py launches every smoke feature)."""
    cmd = fake("bwd:bf16:128:128/window=hang;bwd:bf16:128:128/gqa=wrong;bwd:bf16:128:128/causal=nan")
    out = tmp_path / "smoke.json"
    p, saved = run_smoke_cli(cmd, "bf16:128:128,bwd:bf16:128:128", out)
    cases = saved["cases"]
    assert len(cases) == 14 + 16
    assert {(c["kernel"], c["feature"]) for c in cases if c["feature"] in ("kvcache", "determ", "dlse", "perhead")} == {
        ("bf16:128:128", "kvcache"), ("bwd:bf16:128:128", "determ"), ("bwd:bf16:128:128", "dlse")}
    lines = smoke.render_matrix(cases).splitlines()
    assert lines[0].split() == ["kernel"] + [f for f in smoke.FEATURES if f not in ("perhead", "fastacc")]  # no FP8 kernel here
    assert lines[1].split() == ["bf16", "128"] + ["ok"] * 7 + ["n/a"] * 2 + ["ok", "ok", "n/a", "ok", "ok", "ok", "ok", "ok"]
    assert lines[2].split() == ["bwd", "bf16", "128", "ok", "NAN", "HANG", "ok", "WRONG", "ok", "n/a", "ok", "ok",
                                "ok", "ok", "ok", "ok", "ok", "ok", "ok", "ok"]
    assert "30 cases: 27 ok, 1 wrong, 1 nan, 1 hang" in lines[3]
    assert "bwd bf16 128 window: hang" in p.stdout
    plan = smoke.plan(cases)
    assert plan["HANG_CASES"] == "bwd:bf16:128:128/window"
    assert plan["FAIL_CASES"] == "bwd:bf16:128:128/causal bwd:bf16:128:128/gqa"
    assert plan["BENCH_HDIMS"] == "128"
    k = plan["PYTEST_K"]
    assert k == "not (test_bwd_gpu and bf16 and d128_128)"
    both = smoke.plan(cases + [{"kernel": "bf16:128:128", "feature": "full", "status": "hang"}])
    assert both["PYTEST_K"] == "not (bf16 and d128_128)"  # the forward's deselection covers it
    every, gone = deselected(k, "tests/test_bwd_gpu.py", "tests/test_kernel_gpu.py")
    assert gone == {t for t in every if t.startswith("tests/test_bwd_gpu.py::")
                    and "bf16" in t and "d128_128" in t}


PYTEST_DONE = """\
tests/test_kernel_gpu.py::test_a[x] PASSED                                   [ 50%]
tests/test_kernel_gpu.py::test_b[y] FAILED                                   [100%]
=========================== short test summary info ============================
FAILED tests/test_kernel_gpu.py::test_b[y] - AssertionError: out: max err 1.0e+00 > tolerance
=================== 1 failed, 1 passed, 3 skipped in 12.34s ===================
"""
PYTEST_KILLED = """\
[gw0] [  1%] PASSED tests/test_kernel_gpu.py::test_feature_matrix[1x1-full-d64_64-bf16]
[gw1] [  2%] PASSED tests/test_kernel_gpu.py::test_feature_matrix[1x1-full-d64_64-fp16]
[gw2] [  3%] FAILED tests/test_kernel_gpu.py::test_feature_matrix[1x1-causal-d64_64-bf16]
[gw3] [  4%] SKIPPED tests/test_kernel_gpu.py::test_feature_matrix[1x1-full-d96_96-bf16]
+++++++++++++++++++++++++++++++++++ Timeout ++++++++++++++++++++++++++++++++++++
"""


def test_pytest_counts():
    r = device_summary.pytest_counts(PYTEST_DONE)
    assert (r["passed"], r["failed"], r["skipped"], r["complete"]) == (1, 1, 3, True)
    assert r["failures"] == [
        "tests/test_kernel_gpu.py::test_b[y] - AssertionError: out: max err 1.0e+00 > tolerance"]
    r = device_summary.pytest_counts(PYTEST_KILLED)
    assert (r["passed"], r["failed"], r["skipped"], r["complete"]) == (2, 1, 1, False)
    assert r["timeout"]
    assert r["failures"] == ["tests/test_kernel_gpu.py::test_feature_matrix[1x1-causal-d64_64-bf16]"]


MEMCHECK = """\
========= COMPUTE-SANITIZER
========= Invalid __global__ read of size 16 bytes
=========     at void flash3::fwd_kernel<...>+0x1a30
=========     by thread (128,0,0) in block (3,0,0)
sanitize_small: 13 launch(es) done
========= ERROR SUMMARY: 4 errors
"""
RACECHECK = """\
========= COMPUTE-SANITIZER
========= RACECHECK SUMMARY: 2 hazards displayed (0 errors, 2 warnings)
"""


def test_sanitizer_result():
    r = device_summary.sanitizer_result(MEMCHECK)
    assert r["errors"] == 4 and r["first"] == "Invalid __global__ read of size 16 bytes"
    r = device_summary.sanitizer_result(RACECHECK)
    assert r["errors"] == 0 and r["note"] == "2 hazards (0 errors, 2 warnings)"
    r = device_summary.sanitizer_result("Traceback...\nAssertionError: bf16:64:64/full: unwritten lse\n")
    assert r["errors"] is None and "unwritten lse" in r["first"]


def bench_json():
    rows = []
    for d in (128, 256):
        for causal in (False, True):
            for s in (2048, 8192):
                rows.append({"hdim": d, "causal": causal, "seqlen": s, "flash3": 600.0 - 50 * causal + d / 4,
                             "sdpa_flash": 350.0, "sdpa_cudnn": 600.0})
    return {"device": "NVIDIA H100 80GB HBM3", "gemm_tflops": 790.0, "rows": rows}


def test_bench_lines():
    text = "\n".join(device_summary.bench_lines(bench_json()))
    assert "d128 non-causal 8k: 632 TFLOP/s = 1.05x cuDNN (target >= 1.0), 1.81x SDPA-flash (>= 1.6)" in text
    assert "d256 best: 664 TFLOP/s (target >= 650)" in text
    assert "causal/non-causal (target >= 0.9): d128 8k 0.92, d256 8k 0.92" in text


def test_bench_bwd_lines_and_summary(tmp_path):
    assert device_summary.bench_target_lines(None) == ["  no backward benchmark results"]
    data = {"rows": [{"hdim": 128}], "targets": [["PASS", "bwd hdim 128 bf16 8k: 1.10x SDPA-cuDNN (>= 1.0)"],
                                                 ["MISS", "deterministic cost, hdim 128 8k: 12.0% (<= 10%)"]]}
    assert device_summary.bench_target_lines(data) == [
        "  [PASS] bwd hdim 128 bf16 8k: 1.10x SDPA-cuDNN (>= 1.0)",
        "  [MISS] deterministic cost, hdim 128 8k: 12.0% (<= 10%)"]
    assert device_summary.bench_target_lines({}, "decode") == ["  no decode benchmark results"]
    ok_cases = [{"kernel": "bf16:128:128", "feature": f, "status": "ok"} for f in FWD_FEATURES]
    write_run(tmp_path / "w", tmp_path / "o", ok_cases, PYTEST_DONE.replace("1 failed, ", ""),
              [("bench_bwd", "ok", 40, tmp_path / "o" / "device_check.log")])
    (tmp_path / "o" / "bench_bwd.json").write_text(json.dumps(data))
    text, res, ok = device_summary.summarize(tmp_path / "w", tmp_path / "o", 570, 400)
    assert ok  # a benchmark target is reported, never a failure
    assert "backward benchmark (bench_bwd --quick, hdim 128):\n  [PASS] bwd hdim 128" in text
    assert res["bench_bwd"] == data


def test_sanitize_small_default_set_has_one_backward_case(capsys):
    """Every default case names a smoke kernel and feature (decode: cases their cache layout); the
    one bwd: case is skipped, not failed, by a build without flash3::bwd_sm90."""
    import sanitize_small
    bwd = [c for c in sanitize_small.DEFAULT if c.startswith("bwd:")]
    assert bwd == ["bwd:bf16:128:128/causal"] and len(sanitize_small.DEFAULT) == 19
    for case in sanitize_small.DEFAULT:
        if case.startswith("decode:"):  # run_decode's own cases: contiguous or paged, FP8 or not
            assert case.split("/")[1] in ("contig", "page16", "page16-fp8", "page256-fp8")
            continue
        kernel, feature = case.removeprefix("bwd:").split("/")
        smoke.parse_kernel(kernel)
        assert feature in smoke.FEATURES
    if not sanitize_small._backend.has_bwd_kernel():
        assert sanitize_small.run_bwd(bwd[0]) is False
        assert "bwd:bf16:128:128/causal: no flash3::bwd_sm90 in this build, skipped" in capsys.readouterr().out


def test_sanitize_small_runs_any_smoke_case(monkeypatch, capsys):
    """device_check.sh hands sanitize_small.py the failing smoke cases, of any family: decode kernels'
    (dec:, dec:kve4m3:; "fa3rot" made it fail with "'fa3rot' is not in list": it built every case
    with the forward's make_case), the quantize kernel's (quant:), backward ones, forward ones. Each
    part is launched as smoke.py's worker launches it (faked here) and its outputs checked written;
    a feature the kernel has not is refused naming its features."""
    import sanitize_small
    import smoke_cases
    import smoke_quant
    built = ["bf16:128:128", "dec:kve4m3:bf16:128:128", "dec:bf16:64:64", "quant:bf16"]
    monkeypatch.setattr(smoke, "built_kernel_ids", lambda: built)
    real_dec, real_quant, real_cases = smoke.make_dec_case, smoke_quant.make_case, smoke.make_cases
    monkeypatch.setattr(smoke, "make_dec_case", lambda f, k: real_dec(f, k, device="cpu"))
    monkeypatch.setattr(smoke_quant, "make_case", lambda f, k: real_quant(f, k, device="cpu"))
    monkeypatch.setattr(smoke, "make_cases", lambda f, *a, **kw: real_cases(f, *a, device="cpu", **kw))
    launched = []

    def launch_dec(p):
        launched.append(("dec", p["feature"]))
        out, lse, q_out = smoke.dec_poisoned_outputs(p)
        if q_out is not None:  # the rotated q: written (e4m3: its own bytes, no NaN poison)
            q_out = p["q"].clone()
        return {"out": torch.zeros_like(out), "lse": torch.full_like(lse, -math.inf), "kc": p["kc"],
                "vc": p["vc"], "q_out": q_out}

    def launch_quant(p):
        launched.append(("quant", p["feature"]))
        out, descale = smoke_quant.poisoned_outputs(p)
        return {"out": torch.zeros_like(out.view(torch.uint8)).view(out.dtype), "descale": torch.ones_like(descale)}

    def launch_fwd(c):
        launched.append(("fwd", c["feature"]))
        out, lse = smoke_cases.reference_fwd(c)
        if c.get("tail") is not None:  # nantail: the packed rows of no sequence keep their poison
            out = torch.cat([out[:c["tail"][0]], torch.full_like(out[c["tail"][0]:], math.nan)])
        return out, lse
    monkeypatch.setattr(smoke, "launch_dec", launch_dec)
    monkeypatch.setattr(smoke_quant, "launch", launch_quant)
    monkeypatch.setattr(smoke, "launch", launch_fwd)
    cases = ["dec:kve4m3:bf16:128:128/fa3rot", "dec:bf16:64:64/vappend", "quant:bf16/rows",
             "bf16:128:128/nantail", "bf16:128:128/window", "bf16:256:256/causal"]
    assert sanitize_small.main(cases) == 0
    assert launched == [("dec", "fa3rot")] * 3 + [("dec", "vappend")] * 3 + [("quant", "rows")] \
        + [("fwd", "nantail")] + [("fwd", "window")] * 2  # every part; bf16:256:256 is not built
    out = capsys.readouterr().out
    assert "bf16:256:256/causal: kernel not built, skipped" in out and "5 launch(es) done" in out
    with pytest.raises(ValueError, match="'fa3rot' is not a smoke feature of dec:bf16:64:64 .*vappend"):
        sanitize_small.main(["dec:bf16:64:64/fa3rot"])
    # an output left poisoned is caught
    monkeypatch.setattr(smoke, "launch_dec", lambda p: dict(launch_dec(p), lse=smoke.dec_poisoned_outputs(p)[1]))
    with pytest.raises(AssertionError, match="unwritten lse"):
        sanitize_small.main(["dec:bf16:64:64/contig"])


def write_run(work, out, smoke_cases, pytest_text, extra_steps=()):
    work.mkdir()
    out.mkdir()
    steps = [("build", "ok", 140, work / "build.log"), ("smoke", "ok", 35, work / "smoke.log"),
             ("pytest", "ok", 120, out / "pytest.log"), ("bench", "ok", 30, out / "device_check.log")]
    steps += list(extra_steps)
    (work / "steps.tsv").write_text("".join(f"{n}\t{s}\t{t}\t{l}\n" for n, s, t, l in steps))
    (work / "env.txt").write_text("NVIDIA H100 80GB HBM3, 81559 MiB, 1980 MHz, 580.159.04\ntorch 2.11.0\n")
    (out / "smoke.json").write_text(json.dumps({"cases": smoke_cases, "elapsed": 30, "parallel": 4,
                                                "case_timeout": 15}))
    (out / "pytest.log").write_text(pytest_text)
    (out / "bench_fwd.json").write_text(json.dumps(bench_json()))


def test_summary_pass_and_fail(tmp_path):
    ok_cases = [{"kernel": "bf16:128:128", "feature": f, "status": "ok"} for f in FWD_FEATURES]
    san = tmp_path / "san1.log"
    san.write_text("========= ERROR SUMMARY: 0 errors\n")
    write_run(tmp_path / "w", tmp_path / "o", ok_cases, PYTEST_DONE.replace("1 failed, ", ""),
              [("memcheck default", "ok", 30, san)])
    text, res, ok = device_summary.summarize(tmp_path / "w", tmp_path / "o", 570, 400)
    assert ok and text.splitlines()[0] == "======== flash3 device check: PASS ========"
    assert "memcheck default" in text and "clean: 0 errors" in text
    assert "d256 best: 664 TFLOP/s" in text and "bf16 128" in text

    bad_cases = ok_cases[:-1] + [{"kernel": "bf16:128:128", "feature": "kvcache", "status": "hang",
                                  "detail": "silent for 15 s"}]
    hang = {"cases": [{"kernel": "bf16:128:128", "feature": "kvcache", "status": "crash",
                       "device_lines": [
                           "flash3 hang: block 2 warpgroup 0 thread 0 waits on VTail phase 1 tile 4"]}]}
    (tmp_path / "w2").mkdir()
    write_run(tmp_path / "w2" / "w", tmp_path / "w2" / "o", bad_cases, PYTEST_KILLED,
              [("hang_build bf16 128", "ok", 80, tmp_path / "x.log")])
    (tmp_path / "w2" / "w" / "hang.json").write_text(json.dumps(hang))
    text, res, ok = device_summary.summarize(tmp_path / "w2" / "w", tmp_path / "w2" / "o", 570, 560)
    assert not ok and "FAIL (smoke 1 of 14 not ok; pytest)" in text.splitlines()[0]
    assert "bf16 128 kvcache: warpgroup 0 waits on VTail phase 1 tile 4  (1 warps in 1 blocks)" in text
    assert "2 passed, 1 failed, 0 errors, 1 skipped (incomplete: ok)" in text
    assert len(text) < 8000  # the device call returns 12,000 characters of output tail


def test_summary_after_a_failed_build(tmp_path):
    work, out = tmp_path / "w", tmp_path / "o"
    work.mkdir()
    out.mkdir()
    (work / "steps.tsv").write_text(f"build\texit 1\t95\t{work / 'build.log'}\n")
    (work / "build.log").write_text('ninja: building\ncsrc/x.cu(12): error: identifier "foo" is undefined\n')
    text, res, ok = device_summary.summarize(work, out, 570, 100)
    assert not ok and "build exit 1" in text.splitlines()[0]
    assert 'csrc/x.cu(12): error: identifier "foo" is undefined' in text


def test_hang_build_knob(monkeypatch):
    monkeypatch.delenv("FLASH3_DEBUG_HANG", raising=False)
    monkeypatch.setenv("FLASH3_NVCC_FLAGS", "-lineinfo")
    assert flash3_build.extra_nvcc_flags() == ["-lineinfo"]
    monkeypatch.setenv("FLASH3_DEBUG_HANG", "1")
    assert flash3_build.extra_nvcc_flags() == ["-lineinfo", "-DFLASH3_DEBUG_HANG=1"]
    assert flash3_build.is_debug_hang(["-DFLASH3_DEBUG_HANG"])
    assert flash3_build.is_debug_hang(["-DFLASH3_DEBUG_HANG=1"])
    assert not flash3_build.is_debug_hang(["-DFLASH3_DEBUG_HANG=0"])
    assert not flash3_build.is_debug_hang(["-DFLASH3_DEBUG_HANG=1", "-DFLASH3_DEBUG_HANG=0"])


SASS = """\
\t\tFunction : _ZN6flash310fwd_kernel
        /*0070*/                   USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xf0 ;
        /*0080*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT ;
        /*0090*/                   UTMALDG.2D [UR8], [UR4] ;
        /*00a0*/                   SYNCS.ARRIVE.TRANS64.A1T0 RZ, [UR4], RZ ;
        /*00b0*/                   STL [R1], R2 ;
        /*00c0*/                   BPT.TRAP 0x1 ;
"""


def test_compile_check_relaxes_only_for_the_debug_build():
    r = compile_check.Result("t")
    compile_check.scan_sass(SASS, r, debug_hang=False)
    assert any("BPT.TRAP" in p for p in r.problems) and any("local-memory" in p for p in r.problems)
    r = compile_check.Result("t")
    compile_check.scan_sass(SASS, r, debug_hang=True)
    assert not any("BPT.TRAP" in p or "local-memory" in p for p in r.problems), r.problems
    r = compile_check.Result("t")
    compile_check.scan_sass(SASS.replace("BPT.TRAP 0x1", "NOP"), r, debug_hang=True)
    assert any("no BPT.TRAP" in p for p in r.problems)
    r = compile_check.Result("t")
    compile_check.scan_sass(SASS.replace("USETMAXREG", "NOP"), r, debug_hang=True)
    assert any("no USETMAXREG" in p for p in r.problems)


def test_device_check_script_parses():
    subprocess.run(["bash", "-n", str(ROOT / "tools" / "device" / "device_check.sh")], check=True)


# ---------------------------------------------------------------------------------------------
# Prebuilt kernel objects (tools/build/prebuilt.py) and the staged device check, dry-run with fakes.

import prebuilt  # noqa: E402


def fake_csrc(tmp_path):
    csrc = tmp_path / "csrc"
    (csrc / "flash3" / "fwd").mkdir(parents=True)
    (csrc / "generated").mkdir()
    (csrc / "flash3" / "fwd" / "kernel.cuh").write_text("// kernel\n")
    (csrc / "generated" / "fwd_a.cu").write_text('#include "flash3/fwd/kernel.cuh"\n')
    (csrc / "flash3" / "plain.cu").write_text("// plain\n")
    return csrc, [csrc / "generated" / "fwd_a.cu", csrc / "flash3" / "plain.cu"]


def write_manifest(pdir, csrc, tus, flags, variant="release"):
    pdir.mkdir(parents=True, exist_ok=True)
    objects = {}
    for tu in tus:
        (pdir / f"{tu.stem}.o").write_bytes(b"\x7fELF")
        objects[tu.relative_to(csrc).as_posix()] = {"object": f"{tu.stem}.o", "bytes": 4,
                                                     "hash": prebuilt.source_hash(csrc, tu, flags)}
    (pdir / "manifest.json").write_text(json.dumps({"variant": variant, "objects": objects}))


def test_prebuilt_hash_fresh_then_stale(tmp_path, monkeypatch):
    """Fresh objects are linked; an edited header or TU, other flags, a missing object or the
    other variant is a StaleError naming it (a time-capped build may leave generated kernels out,
    never the plain ones). Include paths are not in the hash (the device has other paths)."""
    monkeypatch.delenv("FLASH3_EXTRA_INCLUDE_DIRS", raising=False)
    csrc, tus = fake_csrc(tmp_path)
    flags = ["-O3", "-DFLASH3_CUTLASS_MAJOR=4", "-I/here/csrc", "-I/here/cutlass"]
    pdir = tmp_path / "pre" / "release"
    write_manifest(pdir, csrc, tus, flags)
    objs, missing = prebuilt.resolve(pdir, tus, ["-O3", "-DFLASH3_CUTLASS_MAJOR=4", "-I/device/x"], csrc)
    assert [o.name for o in objs] == ["fwd_a.o", "plain.o"] and missing == []
    with pytest.raises(prebuilt.StaleError, match="stale.*generated/fwd_a.cu, flash3/plain.cu"):
        prebuilt.resolve(pdir, tus, flags + ["-lineinfo"], csrc)
    man = json.loads((pdir / "manifest.json").read_text())
    (pdir / "manifest.json").write_text(json.dumps(dict(man, nvcc="12.8")))
    with pytest.raises(prebuilt.StaleError, match="compiled by nvcc 12.8, torch has CUDA 13.0"):
        prebuilt.resolve(pdir, tus, flags, csrc, cuda="13.0")
    assert len(prebuilt.resolve(pdir, tus, flags, csrc, cuda="12.4")[0]) == 2
    with pytest.raises(prebuilt.StaleError, match="hang variant"):
        prebuilt.resolve(pdir, tus, flags + ["-DFLASH3_DEBUG_HANG=1"], csrc)
    (csrc / "flash3" / "fwd" / "kernel.cuh").write_text("// kernel, edited\n")
    with pytest.raises(prebuilt.StaleError, match=r"are stale .*generated/fwd_a.cu"):
        prebuilt.resolve(pdir, tus, flags, csrc)
    write_manifest(pdir, csrc, tus, flags)  # `make device-prep` again: fresh
    assert len(prebuilt.resolve(pdir, tus, flags, csrc)[0]) == 2
    (csrc / "generated" / "fwd_a.cu").write_text("// the TU itself edited\n")
    with pytest.raises(prebuilt.StaleError, match="stale .*generated/fwd_a.cu$"):
        prebuilt.resolve(pdir, tus, flags, csrc)
    write_manifest(pdir, csrc, tus[1:], flags)  # fwd_a not built in time
    with pytest.raises(prebuilt.StaleError, match="missing .*generated/fwd_a.cu"):
        prebuilt.resolve(pdir, tus, flags, csrc)
    objs, missing = prebuilt.resolve(pdir, tus, flags, csrc, allow_missing=True)
    assert [o.name for o in objs] == ["plain.o"] and missing == ["generated/fwd_a.cu"]
    write_manifest(pdir, csrc, tus[:1], flags)  # a plain kernel missing: never allowed
    with pytest.raises(prebuilt.StaleError, match="missing .*flash3/plain.cu"):
        prebuilt.resolve(pdir, tus, flags, csrc, allow_missing=True)


def test_prebuilt_flags_are_the_simulators_plus_fpic(monkeypatch):
    """One compile serves the simulator and the extension: smoke_sim.kernel_flags has -fPIC and
    the PTX; the hang variant's flags are exactly what setup.py computes under FLASH3_DEBUG_HANG=1."""
    import smoke_sim
    for k in ("FLASH3_DEBUG_HANG", "FLASH3_NVCC_FLAGS", "FLASH3_EXTRA_INCLUDE_DIRS"):
        monkeypatch.delenv(k, raising=False)
    rel = prebuilt.flags("release", "/nowhere/include")
    assert rel == smoke_sim.kernel_flags("/nowhere/include", prebuilt.CSRC)
    assert "-Xcompiler=-fPIC" in rel and smoke_sim.SIM_GENCODE in rel and "-no-compress" in rel
    hang = prebuilt.flags("hang", "/nowhere/include")
    monkeypatch.setenv("FLASH3_DEBUG_HANG", "1")
    assert hang == smoke_sim.kernel_flags("/nowhere/include", prebuilt.CSRC) != rel
    with pytest.raises(ValueError, match="release variant"):
        prebuilt.flags("release", "/nowhere/include")
    names = [t.relative_to(prebuilt.CSRC).as_posix() for t in prebuilt.tus()]
    assert names[-3:] == list(prebuilt.PLAIN_SOURCES) and names[0].startswith("generated/bwd_")


def fake_torch_tree(tmp_path):
    """A fake torch (CUDA 13.0; CUDAExtension records its arguments), nvcc and CUTLASS for
    running setup.py's logic without a GPU toolkit."""
    site = tmp_path / "site" / "torch"
    (site / "utils").mkdir(parents=True)
    (site / "__init__.py").write_text("__version__ = '2.11.0+cu130'\nfrom . import version, utils\n")
    (site / "version.py").write_text("cuda = '13.0'\nhip = None\n")
    (site / "utils" / "__init__.py").write_text("")
    (site / "utils" / "cpp_extension.py").write_text(
        "def CUDAExtension(name, sources, **kw):\n    return dict(kw, name=name, sources=sources)\n"
        "class BuildExtension:\n    pass\n")
    cuda = tmp_path / "cuda"
    (cuda / "bin").mkdir(parents=True)
    (cuda / "bin" / "nvcc").write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.88'\n")
    (cuda / "bin" / "nvcc").chmod(0o755)
    inc = tmp_path / "cutlass" / "include"
    for f in ("cute/tensor.hpp", "cutlass/cutlass.h"):
        (inc / f).parent.mkdir(parents=True, exist_ok=True)
        (inc / f).write_text("")
    (inc / "cutlass" / "version.h").write_text(
        "#define CUTLASS_MAJOR 4\n#define CUTLASS_MINOR 2\n#define CUTLASS_PATCH 0\n")
    return tmp_path / "site", cuda, inc


def run_setup(env):
    code = ("import json, runpy, sys, setuptools\n"
            "setuptools.setup = lambda **kw: print('EXT=' + json.dumps(kw['ext_modules']))\n"
            "sys.argv = ['setup.py', 'build_ext']\nrunpy.run_path('setup.py', run_name='__main__')\n")
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)


def test_setup_links_prebuilt_objects_and_refuses_stale_ones(tmp_path):
    """setup.py with FLASH3_PREBUILT: the kernel TUs leave the sources and their checked objects
    join the link (extra_objects, also depends: a changed object relinks); a stale object (here:
    other nvcc flags than the objects were made with) stops the build with a clear error."""
    site, cuda, inc = fake_torch_tree(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(site), CUDA_HOME=str(cuda), CUTLASS_DIR=str(inc),
               FLASH3_HDIMS="64", FLASH3_DTYPES="bf16", FLASH3_FORCE_CUDA="1", MAX_JOBS="2")
    for k in ("FLASH3_DEBUG_HANG", "FLASH3_NVCC_FLAGS", "FLASH3_EXTRA_INCLUDE_DIRS", "FLASH3_SKIP_CUDA"):
        env.pop(k, None)
    p = run_setup(env)  # no prebuilt objects: every TU compiles
    assert p.returncode == 0, p.stderr
    ext = json.loads(p.stdout.split("EXT=")[1])[0]
    assert "csrc/generated/fwd_bf16_hdim64_sm90.cu" in ext["sources"] and ext["extra_objects"] == []
    fl = prebuilt.flags("release", str(inc))
    pdir = tmp_path / "pre" / "release"
    old = os.environ.get("FLASH3_HDIMS"), os.environ.get("FLASH3_DTYPES")
    os.environ.update(FLASH3_HDIMS="64", FLASH3_DTYPES="bf16")
    try:
        tus = prebuilt.tus()
    finally:
        for k, v in zip(("FLASH3_HDIMS", "FLASH3_DTYPES"), old):
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    write_manifest(pdir, prebuilt.CSRC, tus, fl)
    p = run_setup(dict(env, FLASH3_PREBUILT=str(pdir)))
    assert p.returncode == 0, p.stderr
    ext = json.loads(p.stdout.split("EXT=")[1])[0]
    assert not [s for s in ext["sources"] if s.endswith(".cu")]  # only the torch-facing .cpp compile
    assert sorted(Path(o).name for o in ext["extra_objects"]) == sorted(t.stem + ".o" for t in tus)
    # d 64 bf16: fwd, bwd, decode (16-bit and FP8 cache), the MLA decode kernel (64x512), and the
    # append, combine and quantize kernels
    assert ext["depends"] == ext["extra_objects"] and len(tus) == 8
    assert f"linking 8 prebuilt kernel objects from {pdir}" in p.stderr
    p = run_setup(dict(env, FLASH3_PREBUILT=str(pdir), FLASH3_NVCC_FLAGS="-lineinfo"))
    assert p.returncode != 0 and "StaleError" in p.stderr and "are stale" in p.stderr
    assert "generated/fwd_bf16_hdim64_sm90.cu" in p.stderr


def test_prebuilt_pack_unpack_and_size(tmp_path, monkeypatch, capsys):
    """device-prep's carry: one tar.xz per variant with its manifest beside it; `size` prints the
    raw and packed sizes and the total a device call carries against its 64 MiB."""
    csrc, tus = fake_csrc(tmp_path)
    write_manifest(tmp_path / "pre" / "release", csrc, tus, [])
    carry = tmp_path / "carry"
    t = prebuilt.pack(tmp_path / "pre", "release", carry)
    assert t.name == "release.tar.xz" and (carry / "release.json").exists()
    got = prebuilt.unpack(tmp_path / "device", "release", carry)
    assert sorted(p.name for p in got.iterdir()) == ["fwd_a.o", "manifest.json", "plain.o"]
    assert prebuilt.main(["size", "--carry", str(carry)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("prebuilt: carried: tree ") and ".carry release (0.0 MiB raw)" in out
    assert "of 64.0 MiB (fits)" in out


FAKE_PY = r'''#!{real}
import json, os, shutil, sys, time
REAL = {real!r}
a = sys.argv[1:]
arg = lambda n: a[a.index(n) + 1] if n in a else None
def record(*x):
    with open(os.environ["FAKE_CALLS"], "a") as f:
        f.write(" ".join(map(str, x)) + "\n")
if a[:2] == ["setup.py", "build_ext"]:
    hang = bool(os.environ.get("FLASH3_DEBUG_HANG"))
    record("build", "hang" if hang else "release", os.environ.get("FLASH3_PREBUILT"), os.environ.get("FLASH3_HDIMS"),
           os.environ.get("FLASH3_FORCE_CUDA"), os.environ.get("FLASH3_PREBUILT_ALLOW_MISSING"))
    if not hang and os.environ.get("FAKE_BUILD") == "slow":
        time.sleep(100)
    sys.exit(0)
if a and a[0] == "tools/smoke/smoke.py" and "--plan" not in a:
    record("smoke", " ".join(a[1:]))
    shutil.copyfile(os.environ["FAKE_HANG_JSON" if "--cases" in a else "FAKE_SMOKE_JSON"], arg("--json"))
    sys.exit(0)
if a[:2] == ["tools/build/prebuilt.py", "build"]:
    record("prebuilt", arg("--variant"), os.environ.get("FLASH3_HDIMS"), os.environ.get("FLASH3_DTYPES"), arg("--budget"))
    d = os.path.join(arg("--dir"), arg("--variant"))
    os.makedirs(d, exist_ok=True)
    man = dict(json.load(open(os.environ["FAKE_KERNELS_JSON"])), variant=arg("--variant"))
    json.dump(man, open(os.path.join(d, "manifest.json"), "w"))
    sys.exit(1 if any("out of time" not in w for w in man["not_built"].values()) else 0)
if a[:2] == ["-m", "pytest"]:
    record("pytest", " ".join(a[2:]))
    print(os.environ["FAKE_PYTEST"])
    sys.exit(0)
if a[:2] == ["-m", "pip"] or a[:1] == ["tools/device/ring_sanity.py"]:
    sys.exit(0)
if a[:2] == ["tools/build/flash3_build.py", "--cutlass"]:
    print("/fake/cutlass")
    sys.exit(0)
if a and a[0].startswith("benchmarks/bench_"):
    name = os.path.basename(a[0])[:-3]
    record("bench", name, " ".join(a[1:]))
    os.makedirs(arg("--out"), exist_ok=True)
    shutil.copyfile(os.path.join(os.environ["FAKE_BENCH_DIR"], name + ".json"), os.path.join(arg("--out"), name + ".json"))
    sys.exit(0)
os.execv(REAL, [REAL] + a)
'''
FAKE_TOOLS = {
    "nvidia-smi": "echo 'NVIDIA H100 80GB HBM3, 81559 MiB, 1980 MHz, 580.159.04'",
    "ninja": "exit 0",
    "nvcc": ('[ "$1" = --version ] && { echo "Cuda compilation tools, release 13.0, V13.0.88"; exit 0; }\n'
             'while [ $# -gt 0 ]; do [ "$1" = -o ] && printf "#!/bin/sh\\nexit 0\\n" > "$2" && chmod +x "$2"; shift; done'),
    "compute-sanitizer": ('echo "compute-sanitizer $*" >> "$FAKE_CALLS"\n'
                          'case "$*" in *racecheck*) echo "========= RACECHECK SUMMARY: 0 hazards displayed '
                          '(0 errors, 0 warnings)";; *) echo "========= ERROR SUMMARY: 0 errors";; esac'),
}


@pytest.fixture
def device(tmp_path):
    """Runs tools/device/device_check.sh against fakes: python (setup.py, smoke, prebuilt build, pytest and
    the benchmarks faked; the summary, --plan and prebuilt check real), nvcc, nvidia-smi, ninja
    and compute-sanitizer (left out with sanitizer=False). Returns run(stage, **env) -> (proc,
    OUT dir, calls)."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    py = bin_ / "fakepython"
    py.write_text(FAKE_PY.format(real=sys.executable))
    py.chmod(0o755)
    ok = [{"kernel": k, "feature": f, "status": "ok"} for k in ("bf16:128:128", "bwd:bf16:128:128")
          for f in ("full", "causal")] + [{"kernel": "dec:bf16:128:128", "feature": "page16", "status": "ok"}]
    (tmp_path / "smoke.json").write_text(json.dumps({"cases": ok, "elapsed": 20, "parallel": 8, "case_timeout": 15}))
    (tmp_path / "kernels.json").write_text(json.dumps({
        "variant": "release", "nvcc": "13.0", "knobs": {"FLASH3_HDIMS": "64,128", "FLASH3_DTYPES": "bf16"},
        "planned": ["generated/bwd_bf16_hdim128_sm90.cu", "generated/fwd_bf16_hdim128_sm90.cu"],
        "objects": {t: {"object": "x.o", "hash": "h", "bytes": 1} for t in
                    ("generated/bwd_bf16_hdim128_sm90.cu", "generated/fwd_bf16_hdim128_sm90.cu")},
        "not_built": {}}))
    bench = tmp_path / "bench"
    bench.mkdir()
    (bench / "bench_fwd.json").write_text(json.dumps(bench_json()))
    for name, line in (("bench_fp8", "fp8 d128 8k: 1.40x bf16"), ("bench_bwd", "bwd hdim 128 bf16 8k: 1.10x SDPA-cuDNN"),
                       ("bench_decode", "decode b64 32k: 80% of copy bandwidth")):
        (bench / f"{name}.json").write_text(json.dumps({"rows": [{}], "copy_gbps": 3000.0, "targets": [["PASS", line]]}))

    def run(stage, sanitizer=True, script="device_check.sh", **env):
        for name, body in FAKE_TOOLS.items():
            f = bin_ / name
            if name == "compute-sanitizer" and not sanitizer:
                f.unlink(missing_ok=True)
                continue
            f.write_text("#!/bin/bash\n" + body + "\n")
            f.chmod(0o755)
        calls = tmp_path / "calls.txt"
        calls.write_text("")
        out = tmp_path / f"out{stage}"
        full = dict(os.environ, PATH=f"{bin_}:/usr/bin:/bin", PYTHON=str(py), OUT=str(out), STAGE=str(stage),
                    DEVICE_CHECK_BUILD=str(tmp_path / "build"), DEVICE_CHECK_CARRY=str(tmp_path / "carry"),
                    DEVICE_CHECK_BUDGET="300", DEVICE_CHECK_MIN_STEP="1", FAKE_CALLS=str(calls),
                    FAKE_SMOKE_JSON=str(tmp_path / "smoke.json"), FAKE_HANG_JSON=str(tmp_path / "hang.json"),
                    FAKE_KERNELS_JSON=str(tmp_path / "kernels.json"), FAKE_BENCH_DIR=str(bench),
                    FAKE_PYTEST=PYTEST_DONE.replace("1 failed, ", ""), CUTLASS_DIR="/fake/cutlass")
        for k in ("FLASH3_HDIMS", "FLASH3_DTYPES", "FLASH3_FORCE_CUDA", "FLASH3_PREBUILT"):
            full.pop(k, None)
        full.update(env)
        p = subprocess.run(["bash", str(ROOT / "tools" / "device" / script)], env=full, capture_output=True,
                           text=True, timeout=240)
        return p, out, calls.read_text()
    return run, tmp_path


def summary_table(p):
    """The summary is the last thing printed."""
    head = p.stdout.rindex("======== flash3 device check")
    return p.stdout[head:]


def test_device_stage1_without_carried_objects_a_hang_and_a_late_kernel(device):
    """No .carry: stage 1 compiles bf16 64/128 itself (heaviest first; one TU not compiled in time
    is left out, "skipped (out of time)"), links with FLASH3_FORCE_CUDA=1, runs the smoke matrix;
    the hung case is rerun on the hang-diagnosis build, which names the barrier, phase and tile."""
    run, tmp = device
    late = json.loads((tmp / "kernels.json").read_text())
    late["not_built"] = {"generated/bwd_bf16_hdim128_sm90.cu": "not started (out of time)"}
    del late["objects"]["generated/bwd_bf16_hdim128_sm90.cu"]
    (tmp / "kernels.json").write_text(json.dumps(late))
    cases = json.loads((tmp / "smoke.json").read_text())["cases"]
    cases[1] = {"kernel": "bf16:128:128", "feature": "causal", "status": "hang", "detail": "silent for 15 s"}
    (tmp / "smoke.json").write_text(json.dumps({"cases": cases, "elapsed": 40, "parallel": 8, "case_timeout": 15}))
    (tmp / "hang.json").write_text(json.dumps({"cases": [{"kernel": "bf16:128:128", "feature": "causal",
        "status": "crash", "device_lines": ["flash3 hang: block 2 warpgroup 1 thread 128 waits on KFull phase 0 tile 3"]}]}))
    p, out, calls = run(1)
    table = summary_table(p)
    assert p.returncode == 1, p.stdout + p.stderr
    assert table.splitlines()[0] == "======== flash3 device check stage 1: FAIL (smoke 1 of 5 not ok) ========"
    assert "prebuilt release 64,128 bf16" in calls  # the subset, compiled on the device
    assert "prebuilt hang 64,128 bf16" in calls  # the hang variant, in the background
    assert f"build release {tmp}/build/prebuilt/release 64,128 1 1" in calls  # FORCE_CUDA, allow missing
    assert f"build hang {tmp}/build/prebuilt/hang 64,128 1 1" in calls
    assert "smoke --cases bf16:128:128/causal" in calls  # the rerun on the hang build
    assert "kernels: 1 release objects compiled here, FLASH3_HDIMS=64,128 FLASH3_DTYPES=bf16" in table
    assert "skipped (out of time), left out of the build: generated/bwd_bf16_hdim128_sm90.cu" in table
    assert "bf16 128 causal: warpgroup 1 waits on KFull phase 0 tile 3  (1 warps in 1 blocks)" in table
    # No failure: the sanitizers take three small ok cases; the hung one is not among them.
    assert "memcheck bwd:bf16:128:128/causal +1" in table and "clean: 0 errors" in table
    assert sorted(x.name for x in out.iterdir()) == ["device_check.log", "results.json", "sanitizer.log",
                                                     "smoke.json", "summary.txt"]


def test_device_stage1_build_timeout(device):
    """A build that outlives its time is "timeout", the run stops there with the summary."""
    run, tmp = device
    p, out, calls = run(1, FAKE_BUILD="slow", DEVICE_CHECK_BUDGET="14", DEVICE_CHECK_RESERVE="0")
    table = summary_table(p)
    assert table.splitlines()[0] == "======== flash3 device check stage 1: FAIL (build timeout) ========"
    assert re.search(r"\n  build +timeout +\d+ s", table), table
    assert "smoke" not in calls and "smoke matrix" not in table
    res = json.loads((out / "results.json").read_text())
    assert res["verdict"] == "FAIL" and res["problems"] == ["build timeout"]


def test_device_stage1_clean_without_compute_sanitizer(device):
    """Everything ok, but no compute-sanitizer: the preflight names it, the three sanitizer steps
    are "skipped (no compute-sanitizer)" (not "not clean"), the verdict INCOMPLETE (exit 2). With
    the tool they run on the three small ok cases (forward, backward, decode) and PASS."""
    run, tmp = device
    p, out, calls = run(1, sanitizer=False)
    table = summary_table(p)
    assert "NOT FOUND: compute-sanitizer" in p.stdout
    assert p.returncode == 2 and table.splitlines()[0] == (
        "======== flash3 device check stage 1: INCOMPLETE (missing: compute-sanitizer) ========")
    assert "not clean" not in table and "PROBLEM" not in table
    for tool in ("memcheck", "racecheck", "synccheck"):
        assert f"  {tool} bf16:128:128/causal +2" in table and "skipped (no compute-sanitizer)" in table
    p, out, calls = run(1)
    table = summary_table(p)
    assert p.returncode == 0 and table.splitlines()[0] == "======== flash3 device check stage 1: PASS ========", table
    assert "compute-sanitizer --tool synccheck" in calls
    assert "tools/device/sanitize_small.py bf16:128:128/causal bwd:bf16:128:128/causal decode:bf16:128:128/page16" in calls


def test_device_stage2_pytest_with_stage1s_deselection(device):
    """Stage 2 alone: build, then the GPU test files; after a stage 1 on the same machine that saw
    a hang, that kernel's tests are deselected."""
    run, tmp = device
    cases = json.loads((tmp / "smoke.json").read_text())["cases"]
    cases[0]["status"] = "hang"
    state = tmp / "build" / "device-check-state"
    state.mkdir(parents=True)
    (state / "smoke.json").write_text(json.dumps({"cases": cases}))
    p, out, calls = run(2)
    table = summary_table(p)
    assert p.returncode == 0, table
    # every GPU test file (tests/*_gpu.py, in name order) and the quantize kernel's
    assert "-k not (bf16 and d128_128) tests/test_bwd_gpu.py" in calls and "smoke" not in calls
    assert all(f"tests/{f}" in calls for f in ("test_kernel_gpu.py", "test_mla_gpu.py", "test_seqused_q_gpu.py",
                                               "test_quantize_kernel.py"))
    assert "pytest (GPU tests): 1 passed, 0 failed, 0 errors, 3 skipped" in table
    assert sorted(x.name for x in out.iterdir()) == ["device_check.log", "pytest.log", "results.json", "summary.txt"]


def test_device_stage3_benchmarks_in_one_results_json(device):
    """Stage 3: the four benchmarks on the head dims stage 1 passed; every row in results.json,
    no separate files under $OUT; the ratios against cuDNN, SDPA-flash and cuBLAS in the table."""
    run, tmp = device
    state = tmp / "build" / "device-check-state"
    state.mkdir(parents=True)
    (state / "smoke.json").write_text((tmp / "smoke.json").read_text())
    p, out, calls = run(3)
    table = summary_table(p)
    assert p.returncode == 0, table
    assert [l.split()[1] for l in calls.splitlines() if l.startswith("bench ")] == [
        "bench_fwd", "bench_fp8", "bench_bwd", "bench_decode"]
    assert "bench bench_fwd --hdims 128 " in calls
    assert "0.80x cuBLAS GEMM" in table and "[PASS] fp8 d128 8k: 1.40x bf16" in table
    assert "[PASS] decode b64 32k" in table
    res = json.loads((out / "results.json").read_text())
    assert res["bench"]["rows"] and res["bench_fp8"]["targets"] and res["bench_decode"]["copy_gbps"] == 3000.0
    assert sorted(x.name for x in out.iterdir()) == ["device_check.log", "results.json", "summary.txt"]


def test_device_session_runs_stage1_then_stage3_in_one_call(device):
    """tools/device/device_session.sh (a 15-minute lease): stage 1 with memcheck only and no hang-diagnosis
    build, then stage 3 on stage 1's build; both summaries printed, and under $OUT the two summaries,
    FA3's table (SESSION_FA3=0: it says so) and one tarball of everything. (SESSION_CUTLASS=0: a
    .carry/cutlass/ built in this checkout would otherwise be run; tests/test_cutlass_gemms.py covers it.)"""
    run, tmp = device
    p, out, calls = run(1, script="device_session.sh", SESSION_S1="200", SESSION_S3="150", SESSION_FA3="0",
                        SESSION_CUTLASS="0")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    assert sorted(x.name for x in out.iterdir()) == ["fa3.txt", "s1_summary.txt", "s3_summary.txt", "session.tgz"]
    assert "flash3 device check stage 1" in p.stdout and "flash3 device check stage 3" in p.stdout
    assert "FA3 not timed" in (out / "fa3.txt").read_text()
    assert "bench bench_fwd" in calls  # stage 3 ran
    assert "--tool racecheck" not in calls and "--variant hang" not in calls
    with tarfile.open(out / "session.tgz") as t:
        names = t.getnames()
    assert any(n.endswith("s1/summary.txt") for n in names) and any(n.endswith("s3/results.json") for n in names)


def test_device_session_stage2_between_and_deadline(device):
    """SESSION_S2 runs stage 2 (the GPU pytest files) between stages 1 and 3, its summary under $OUT;
    SESSION_DEADLINE cuts the later stages' budgets to what is left of it (here nothing: stage 3's
    steps are skipped out of time, never run)."""
    run, tmp = device
    p, out, calls = run(1, script="device_session.sh", SESSION_S1="200", SESSION_S2="100", SESSION_S3="150",
                        SESSION_FA3="0")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    assert "s2_summary.txt" in {x.name for x in out.iterdir()}
    text = p.stdout
    assert text.index("flash3 device check stage 1") < text.index("flash3 device check stage 2") < \
        text.index("flash3 device check stage 3")
    assert "pytest" in calls and "bench bench_fwd" in calls
    p, out, calls = run(1, script="device_session.sh", SESSION_S1="200", SESSION_S2="100", SESSION_S3="150",
                        SESSION_FA3="0", SESSION_DEADLINE="0")
    assert "bench bench_fwd" not in calls and "pytest" not in calls, calls


def test_device_session_profile_step(device):
    """SESSION_PROFILE=1: tools/device/device_profile.sh after the stages, its ncu CSVs in the tarball and
    its headline metrics in profile.txt (a fake ncu writes a one-metric details page)."""
    run, tmp = device
    fake = tmp / "bin" / "ncu"
    # -o REPORT: writes REPORT.ncu-rep; -i REPORT --page source: a one-line SASS source page;
    # otherwise a one-metric details page.
    fake.write_text("#!/bin/bash\nargs=\"$*\"\n"
                    "if [[ $args == *' -o '* ]]; then o=${args#* -o }; touch \"${o%% *}.ncu-rep\"; exit 0; fi\n"
                    "if [[ $args == *'--page source'* ]]; then echo '\"# Address\",\"Source\",\"Warp Stall Sampling (All Samples)\"'; "
                    "echo '\"0x10\",\"MUFU.EX2 R24, R24\",\"7\"'; exit 0; fi\n"
                    "echo '\"ID\",\"Kernel Name\",\"Section Name\",\"Metric Name\",\"Metric Unit\",\"Metric Value\"'\n"
                    "echo '\"0\",\"k\",\"s\",\"Issue Slots Busy\",\"%\",\"35.00\"'\n")
    fake.chmod(0o755)
    p, out, calls = run(1, script="device_session.sh", SESSION_S1="200", SESSION_S3="150", SESSION_FA3="0",
                        SESSION_PROFILE="1")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    prof = (out / "profile.txt").read_text()
    assert "== flash3" in prof and "Issue Slots Busy: 35.00 %" in prof, prof
    # The stall sampling pass: flash3's report read back as its SASS source page and summarized.
    assert "ncu source page flash3: exit 0" in prof and "== flash3: 1 SASS lines, 7 warp samples" in prof, prof
    with tarfile.open(out / "session.tgz") as t:
        assert any(n.endswith("profile/ncu_flash3.csv") for n in t.getnames())


def test_summary_skipped_steps_are_neither_ok_nor_failures(tmp_path):
    """A sanitizer step skipped out of time is listed as such: INCOMPLETE, never "not clean"."""
    ok_cases = [{"kernel": "bf16:128:128", "feature": f, "status": "ok"} for f in FWD_FEATURES]
    write_run(tmp_path / "w", tmp_path / "o", ok_cases, PYTEST_DONE.replace("1 failed, ", ""),
              [("memcheck bf16:128:128/causal", "skipped (out of time)", 0, tmp_path / "none.log")])
    text, res, ok = device_summary.summarize(tmp_path / "w", tmp_path / "o", 570, 565, 1)
    assert not ok and text.splitlines()[0] == (
        "======== flash3 device check stage 1: INCOMPLETE (skipped (out of time): "
        "memcheck bf16:128:128/causal) ========")
    assert "not clean" not in text and re.search(r"\n  memcheck bf16:128:128/causal +skipped \(out of time\)\n", text)
    assert res["verdict"] == "INCOMPLETE" and res["problems"] == []


def test_device_prep_build_prints_sizes_and_respects_its_budget(tmp_path, monkeypatch, capsys):
    """`prebuilt.py build --pack` (make device-prep) with a fake nvcc: every selected TU once into
    the cache, copied with its manifest, packed; it prints the raw and the xz size. Past its
    budget no compile starts: those TUs are "not started (out of time)" (exit 0: not an error)."""
    site, cuda, inc = fake_torch_tree(tmp_path)
    (cuda / "bin" / "nvcc").write_text(
        '#!/bin/sh\n[ "$1" = --version ] && { echo "Cuda compilation tools, release 13.0, V13.0.88"; exit 0; }\n'
        'while [ $# -gt 0 ]; do [ "$1" = -o ] && head -c 200000 /dev/urandom > "$2"; shift; done\n')
    for k, v in dict(CUDA_HOME=str(cuda), CUTLASS_DIR=str(inc), FLASH3_HDIMS="64", FLASH3_DTYPES="bf16").items():
        monkeypatch.setenv(k, v)
    for k in ("FLASH3_DEBUG_HANG", "FLASH3_NVCC_FLAGS", "FLASH3_EXTRA_INCLUDE_DIRS"):
        monkeypatch.delenv(k, raising=False)
    args = ["--dir", str(tmp_path / "pre"), "--cache", str(tmp_path / "cache"), "--carry", str(tmp_path / "carry")]
    assert prebuilt.main(["build", "--variant", "hang", "--budget", "-1"] + args) == 0
    man = json.loads((tmp_path / "pre" / "hang" / "manifest.json").read_text())
    assert man["objects"] == {} and set(man["not_built"].values()) == {"not started (out of time)"}
    # heaviest first by head dims: the MLA decode kernel (64 + 512), then the backward (3 x 128)
    assert man["planned"][:2] == ["generated/decode_bf16_hdim64x512_sm90.cu", "generated/bwd_bf16_hdim64_sm90.cu"]
    assert len(man["planned"]) == 8
    capsys.readouterr()
    assert prebuilt.main(["build", "--variant", "release", "--pack"] + args) == 0
    out = capsys.readouterr().out
    assert re.search(r"prebuilt: release: 8 objects, 1\.5 MiB raw, in .*pre/release", out), out
    assert re.search(r"carry/release.tar.xz: 1\.5 MiB \(xz; 10\d% of raw\)", out), out  # random bytes: no gain
    man = json.loads((tmp_path / "carry" / "release.json").read_text())
    assert man["knobs"] == {"FLASH3_HDIMS": "64", "FLASH3_DTYPES": "bf16"} and man["nvcc"] == "13.0"
    assert "-Xcompiler=-fPIC" in man["flags"] and not any(f.startswith("-I") for f in man["flags"])
    assert len(list((tmp_path / "cache").glob("*.o"))) == 8  # the simulator's cache: one compile for both
    objs, _ = prebuilt.resolve(prebuilt.unpack(tmp_path / "dev", "release", tmp_path / "carry"),
                               prebuilt.tus(), prebuilt.flags("release", str(inc)))
    assert len(objs) == 8
