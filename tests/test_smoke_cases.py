"""The smoke matrix's cases (tools/smoke/smoke_cases.py) for every kernel of a full build and every
feature smoke.applies gives it, on the CPU: each is built (make_cases, make_dec_case,
smoke_quant.make_case), and each of its launches is put through flash3's host layer as the
simulator's driver takes it (tests/cpp/smoke_case_driver.cpp: the op's checks with stand-in
kernels), so that a case the GPU's op would refuse (an argument no build takes, like rotary tables
wider than the head dim) fails here, without a GPU or the simulator. ALiBi, which the forward and
decode kernels compile only up to flash3._backend.ALIBI_MAX_HEAD_DIM (a refusal of the kernel
itself, which no stand-in makes), is checked against the API's own rule (kernel_alibi_reason)."""
import sys
from pathlib import Path

import pytest
import torch
from helpers import cpp_driver, host_layer_sources

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools" / "smoke"))
sys.path.insert(0, str(ROOT / "tools" / "build"))
import flash3_build  # noqa: E402
import smoke  # noqa: E402
import smoke_quant  # noqa: E402
import smoke_sim  # noqa: E402

from flash3 import _backend  # noqa: E402

GEN = flash3_build.generate_kernels()


def full_build_info() -> dict:
    """kernel_info()'s lists of a build of every kernel csrc/generate_kernels.py knows (and the
    quantize kernel's entry, smoke_quant.gpu_info's)."""
    info = {"fwd": [], "fwd_fp8": [], "bwd": [], "decode": [], "decode_fp8_cache": [],
            smoke_quant.INFO_KEY: list(smoke_quant.DTYPES)}
    for k in GEN.all_kernels():
        if k.kind == "fwd" and k.is_fp8:
            info["fwd_fp8"].append([k.head_dim, k.head_dim_v])
        else:
            key = {"fwd": "fwd", "bwd": "bwd", "decode": "decode_fp8_cache" if k.cache else "decode"}[k.kind]
            info[key].append([k.dtype, k.head_dim, k.head_dim_v])
    return info


KERNELS = smoke.kernel_ids(full_build_info())
CASES = [(k, f) for k in KERNELS for f in smoke.kernel_features(k)]


def register_lines() -> list[str]:
    """The driver's stand-in kernels: one per kernel of the full build."""
    lines = []
    for k in GEN.all_kernels():
        kind = {"fwd": "fwd_fp8" if k.is_fp8 else "fwd", "bwd": "bwd",
                "decode": "decode_fp8" if k.cache else "decode"}[k.kind]
        lines.append(f"register {kind} {k.dtype} {k.head_dim} {k.head_dim_v}")
    return lines


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    ask = cpp_driver("smoke_case_driver.cpp", tmp_path_factory.mktemp("smoke_cases"), host_layer_sources())
    regs = register_lines()
    assert ask(regs) == ["ok"] * len(regs)  # one process per ask: registrations go with each batch
    return lambda lines: ask(regs + list(lines))[len(regs):]


def build(kid: str, feature: str) -> list[dict]:
    """Every part (launch) of the case, built on the CPU."""
    fam = smoke.family(kid)
    if fam == "dec":
        return smoke.make_dec_case(feature, kid, device="cpu")
    if fam == "quant":
        return smoke_quant.make_case(feature, kid, device="cpu")
    return smoke.make_cases(feature, *smoke.parse_kernel(kid), device="cpu", bwd=fam == "bwd")


def calls(kid: str, p: dict) -> list[tuple[str, dict, dict]]:
    """The op calls (op, tensors, scalars) the smoke worker makes for part p, as smoke_sim writes them
    for the simulator's driver: a backward part's forward (unless smoke.fwd_by_reference: the
    reference's out/lse) and backward."""
    fam = smoke.family(kid)
    if fam == "dec":
        out, lse, q_out = smoke.dec_poisoned_outputs(p)
        return [smoke_sim.dec_op_call(p, out, lse, q_out)]
    if fam == "quant":
        return [smoke_quant.op_call(p, *smoke_quant.poisoned_outputs(p))]
    out, lse = smoke_sim.poisoned_outputs(p)
    fwd = [] if smoke.fwd_by_reference(p) else [smoke_sim.op_call(p, out, lse)]
    if fam != "bwd":
        return fwd
    grads = [torch.full_like(p[n], float("nan")) for n in ("q", "k", "v")]
    dsinks = None if p.get("sinks") is None else torch.full_like(p["sinks"], float("nan"))
    return fwd + [smoke_sim.bwd_op_call(p, out, lse, *grads, dsinks)]


def test_the_driver_has_a_full_builds_kernels(driver):
    """The stand-ins registered are the kernels whose ids the matrix is built from."""
    import json
    (answer,) = driver(["kernel_info"])
    assert answer.startswith("ok ")
    info = json.loads("{" + answer[3:] + "}")
    want = full_build_info()
    for key in ("fwd", "fwd_fp8", "bwd", "decode", "decode_fp8_cache"):
        got = [[x for x in e if x != -1] for e in info[key]]  # fwd_fp8 entries: (-1, d, d_v)
        assert sorted(map(tuple, got)) == sorted(map(tuple, want[key])), key
    # every family and head dim is in the matrix (the failures the GPU found were at d 64, 96, 192, 256)
    assert {smoke.family(k) for k in KERNELS} == {"bf16", "fp16", "e4m3", "bwd", "dec", "quant"}
    assert {smoke.parse_kernel(k)[1:] for k in KERNELS if smoke.dec_fp8_cache(k)} == set(GEN.HEAD_DIMS)


def test_every_case_builds_and_passes_the_host_layers_checks(driver):
    """Each (kernel, feature) of the matrix builds on the CPU (fa3rot at d 64 raised IndexError: its
    rotary_dim 128 was wider than q), and each of its calls passes the op's host-layer checks (fa3rot
    at d 96: "rotary tables ... with rotary_dim <= 96"), with every case scalar read by the op."""
    labels, lines, broken = [], [], []
    for kid, f in CASES:
        try:
            parts = build(kid, f)
        except Exception as e:  # noqa: BLE001
            broken.append(f"{kid}/{f}: building the case: {type(e).__name__}: {e}")
            continue
        for i, p in enumerate(parts):
            for op, tensors, scalars in calls(kid, p):
                labels.append(f"{kid}/{f} part {i} ({op})")
                lines.append("case " + " | ".join(smoke_sim.case_lines(op, tensors, scalars)))
    answers = driver(lines)
    broken += [f"{label}: {a}" for label, a in zip(labels, answers) if a != "ok"]
    assert not broken, f"{len(broken)} smoke calls refused:\n" + "\n".join(broken[:30])
    assert len(lines) > 1400  # every family's parts went through


class _FakeCudaQ:
    """What kernel_alibi_reason reads of q: is_cuda and the head dim."""

    is_cuda = True

    def __init__(self, d):
        self.shape = (1, 1, 1, d)


def test_alibi_launches_are_ones_the_kernels_take(monkeypatch):
    """A smoke launch with ALiBi slopes goes to a kernel only where flash3's API would run it on one
    (_backend.kernel_alibi_reason: the forward and decode kernels up to ALIBI_MAX_HEAD_DIM, the
    backward at every head dim); the backward "alibi" case above it takes the reference's forward
    (fwd_by_reference), as flash3.attention does, and still launches the backward kernel. On the H200
    the backward case at d 192x128, 192 and 256 launched fwd_sm90 with slopes, which refused them."""
    monkeypatch.setattr(_backend, "has_alibi_kernel", lambda kind: True)
    assert smoke.ALIBI_MAX_HEAD_DIM == _backend.ALIBI_MAX_HEAD_DIM
    seen = set()
    for kid, f in CASES:
        if f != "alibi":
            continue
        fam = smoke.family(kid)
        _, d, dv = smoke.parse_kernel(kid)
        for p in build(kid, f):
            assert p["alibi"] is not None
            dims = (p["q"].shape[-1], p["v" if fam != "dec" else "vc"].shape[-1])
            if fam == "dec":
                assert _backend.kernel_alibi_reason(_FakeCudaQ(dims[0]), "decode", dims[1]) is None, kid
                continue
            fwd_ok = _backend.kernel_alibi_reason(_FakeCudaQ(dims[0]), "fwd", dims[1]) is None
            if fam == "bwd":
                assert _backend.kernel_alibi_reason(_FakeCudaQ(dims[0]), "bwd", dims[1]) is None
                assert smoke.fwd_by_reference(p) == (not fwd_ok), kid
                ops = [op for op, _, _ in calls(kid, p)]
                assert ops == (["fwd", "bwd"] if fwd_ok else ["bwd"]), (kid, ops)
                assert all("alibi_slopes" in t for _, t, _ in calls(kid, p))
            else:
                assert fwd_ok, kid
            seen.add((fam, max(d, dv) > smoke.ALIBI_MAX_HEAD_DIM))
    assert ("bwd", True) in seen and ("bwd", False) in seen  # backward cases both sides of the limit


@pytest.mark.parametrize("kid", ["bwd:bf16:192:128", "bwd:fp16:256:256", "bwd:bf16:128:128"])
def test_launch_bwd_takes_the_reference_forward_above_the_alibi_limit(monkeypatch, kid):
    """launch_bwd (the GPU worker's): fwd_by_reference cases never call the forward kernel; their
    out/lse are reference_fwd's, which the forward rule (check) accepts, and bwd_sm90 gets them with
    the slopes."""
    dt, d, dv = smoke.parse_kernel(kid)
    c = smoke.make_case("alibi", dt, d, dv, device="cpu", bwd=True)
    got = {}

    def fake_bwd(dout, q, k, v, out, lse, dlse, dq, dk, dv_, *rest, **kw):
        got.update(out=out, lse=lse, kw=kw)
        for x in (dq, dk, dv_):
            x.zero_()

    monkeypatch.setattr(torch.ops.flash3, "bwd_sm90", fake_bwd, raising=False)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    by_ref = max(d, dv) > smoke.ALIBI_MAX_HEAD_DIM
    launched = []

    def fake_launch(case):
        launched.append(case)
        return smoke.reference_fwd(case)
    monkeypatch.setattr(smoke, "launch", fake_launch)
    import smoke_cases
    monkeypatch.setattr(smoke_cases, "launch", fake_launch)
    out, lse, grads, again = smoke.launch_bwd(c)
    assert (launched == []) == by_ref and again is None
    assert got["out"] is out and got["lse"] is lse and got["kw"]["alibi_slopes"] is c["alibi"]
    assert smoke.check(c, out, lse)["status"] == "ok"


def test_sim_bwd_launch_takes_the_reference_forward_above_the_alibi_limit(monkeypatch):
    """smoke_sim.bwd_launch: no forward run for a fwd_by_reference case (the driver would refuse its
    slopes), the backward run on reference_fwd's out/lse."""
    runs = []

    def fake_run_case(op, tensors, scalars, outputs, driver, seed=1, sms=None, timeout=1800, keep=None):
        runs.append((op, tensors))
        return {n: torch.zeros_like(t) for n, t in outputs.items()}
    monkeypatch.setattr(smoke_sim, "run_case", fake_run_case)
    for kid, want in (("bwd:bf16:256:256", ["bwd"]), ("bwd:bf16:128:128", ["fwd", "bwd"])):
        runs.clear()
        dt, d, dv = smoke.parse_kernel(kid)
        c = smoke.make_case("alibi", dt, d, dv, device="cpu", bwd=True)
        if want == ["bwd"]:
            out, lse, _, _ = smoke_sim.bwd_launch(c, Path("driver"))
            ref_out, ref_lse = smoke.reference_fwd(c)
            assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)
        else:  # the forward's zeros stand in for the kernel's out/lse
            smoke_sim.bwd_launch(c, Path("driver"))
        assert [op for op, _ in runs] == want, kid
        assert runs[-1][1]["alibi_slopes"] is c["alibi"]


@pytest.mark.parametrize("kid", [k for k in KERNELS if smoke.dec_fp8_cache(k)])
def test_fa3rot_rotary_dim_fits_the_head_dim(kid):
    """fa3rot's rotary_dim is at most the head dim (append_kv_sm90's rule), part 0 rotating all of d
    64's and 96's channels, and the saturating pairs sit on channel 0's rotary mate."""
    d = smoke.parse_kernel(kid)[1]
    parts = smoke.make_dec_case("fa3rot", kid, device="cpu")
    dims = [2 * p["append"]["cos"].shape[1] for p in parts]
    assert dims == [min(rd, d) for *_, (rd, _, _) in smoke.FA3ROT_PARTS]
    for p, rd in zip(parts, dims):
        a = p["append"]
        mate = 1 if a["interleaved"] else rd // 2
        k = a["k"].view(-1, a["k"].shape[-2], d).float()
        assert (k[::2, :, 0] == 448).all() and (k[::2, :, mate] == 448).all()


def test_fa3rot_append_reference_does_not_depend_on_torchs_fp8_cast(monkeypatch):
    """check_dec compares the fused append's e4m3 bytes with flash3.reference.kvcache_append_packed,
    bit for bit. fa3rot's new keys put pairs of 448s on rotated channels, which rotate past 464; the
    kernel stores +-448 (cvt.rn.satfinite), and so must the reference, whatever torch's own cast does
    out of range: on the H200 (torch 2.11, NaN past 464) the reference stored NaN bytes, 8 of them in
    part 0 ("k_cache differs ... in 8 bytes" at d 128, 192x128, 192, 256), while the simulator's
    run, with this machine's saturating torch, passed. No tolerance: the bytes stay exact."""
    from helpers import e4m3_cast_nan_on_overflow
    from flash3 import reference, rotary

    def append(p):
        a = p["append"]
        kc, vc = p["kc"].clone(), p["vc"].clone()
        q = reference.kvcache_append_packed(p["q"], kc, vc, a["k"], a["v"], a["cache_seqlens"], p["pt"],
                                            p["cu_q"], a.get("cu_k"), a["cos"], a["sin"], a["interleaved"],
                                            a["per_token"], a.get("rotary_seqlens"))
        return [x.view(torch.uint8).clone() for x in (q, kc, vc)]

    kids = [k for k in KERNELS if smoke.dec_fp8_cache(k)]
    parts = {k: smoke.make_dec_case("fa3rot", k, device="cpu") for k in kids}
    want = {k: [append(p) for p in ps] for k, ps in parts.items()}
    # part 0 (batched keys, NeoX): its rotated 448 pairs do pass 464 in fp32
    p = parts["dec:kve4m3:bf16:128:128"][0]
    a = p["append"]
    pos = rotary.kvcache_positions(a["cache_seqlens"], a["k"].shape[1], True)
    rot = rotary.apply_rotary(a["k"].float(), a["cos"], a["sin"], pos, a["interleaved"])
    assert int((rot.abs() > 464).sum()) >= 4
    assert torch.isnan(e4m3_cast_nan_on_overflow(monkeypatch).float()).all()
    for k, ps in parts.items():
        for i, p in enumerate(ps):
            got = append(p)
            for name, x, y in zip(("q_out", "k_cache", "v_cache"), got, want[k][i]):
                assert torch.equal(x, y), (k, i, name, int((x != y).sum()))
