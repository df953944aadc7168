"""flash3.distributed: ring attention (context parallelism) against single-process attention.

The multi-process tests start ONE gloo process group per world size (2 and 4, both at once,
torch.multiprocessing spawn, file:// rendezvous in tmp_path); each rank runs every case and writes
its errors to a JSON file; the tests below read them.  Every case builds the full q/k/v from one
seed on every rank, runs flash3.attention on the full sequence (the reference), shards it, runs
ring_attention on the shard and compares out, lse, dq, dk, dv with the reference's shard.
"""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path

import pytest
import torch

import flash3
from flash3 import _checks, masking
from flash3 import distributed as fd

ROOT = Path(__file__).resolve().parents[1]
WORLD_SIZES = (2, 4)
TIMEOUT_S = 120

# name -> options.  S is the full sequence length; `lengths(W)` gives arbitrary contiguous shard
# lengths (load_balance=False only).  Random data differ per position, so a shard or chunk
# mix-up changes every result.
CASES = {
    "full_plain_fp32": dict(S=64, load_balance=False),
    "full_balanced_uneven": dict(S=61, h=4, h_k=4, d=32, d_v=64),
    "causal_balanced_gqa": dict(S=96, causal=True, h=4, h_k=2, d=64, b=2),
    "causal_balanced_mqa_uneven": dict(S=83, causal=True, h=4, h_k=1),
    "causal_plain_mqa": dict(S=80, causal=True, h=4, h_k=1, load_balance=False),
    "causal_plain_any_lengths": dict(causal=True, load_balance=False, h_k=2,
                                     lengths=lambda W: [7, 30, 1, 19][:W] if W == 4 else [37, 11]),
    "window_softcap_balanced": dict(S=77, window=(13, 5), softcap=4.0, h_k=2),
    "sliding_causal_plain": dict(S=70, causal=True, window=(9, -1), load_balance=False),
    "causal_lse_grad": dict(S=64, causal=True, lse_grad=True, h_k=2, scale=0.3),
    "full_lse_grad_plain": dict(S=50, lse_grad=True, load_balance=False),
    "causal_balanced_bf16": dict(S=128, causal=True, h=4, h_k=2, d=64, dtype="bf16"),
}


def _opts(name):
    c = dict(b=1, h=4, h_k=4, d=32, d_v=None, causal=False, window=(-1, -1), softcap=0.0,
             load_balance=True, lse_grad=False, scale=None, dtype="fp32", lengths=None, S=None)
    c.update(CASES[name])
    c["d_v"] = c["d_v"] or c["d"]
    return c


# ------------------------------------------------------------------------- worker side
def _shard(x, c, rank, W, dim):
    if c["lengths"] is not None:
        lens = c["lengths"](W)
        return x.narrow(dim, sum(lens[:rank]), lens[rank]).contiguous()
    return fd.shard_sequence(x, rank, W, dim=dim, load_balance=c["load_balance"])


def _err(a, b):
    return (a.double() - b.double()).abs().max().item() if a.numel() else 0.0


def _run_case(name, rank, W, group, seed):
    """Returns {"ok": bool, "errors": {...}, "msg": str}."""
    import helpers  # tests/helpers.py (sys.path comes from the parent)

    c = _opts(name)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[c["dtype"]]
    S = sum(c["lengths"](W)) if c["lengths"] is not None else c["S"]
    g = torch.Generator().manual_seed(seed)
    b, h, h_k, d, d_v = c["b"], c["h"], c["h_k"], c["d"], c["d_v"]
    full = [torch.randn(b, S, hh, dd, generator=g).to(dtype)
            for hh, dd in ((h, d), (h_k, d), (h_k, d_v))]
    dout = torch.randn(b, S, h, d_v, generator=g).to(dtype)
    dlse = torch.randn(b, h, S, generator=g) if c["lse_grad"] else None
    kw = dict(causal=c["causal"], window_size=c["window"], softcap=c["softcap"],
              softmax_scale=c["scale"])

    def loss(out, lse, do, dl):
        val = (out.float() * do.float()).sum()
        return val + (lse * dl).sum() if dl is not None else val

    ref = [x.clone().requires_grad_() for x in full]
    ref_out, ref_lse = flash3.attention(*ref, return_lse=True, **kw)
    loss(ref_out, ref_lse, dout, dlse).backward()

    loc = [_shard(x, c, rank, W, 1).requires_grad_() for x in full]
    out, lse = fd.ring_attention(*loc, group=group, load_balance=c["load_balance"],
                                 return_lse=True, **kw)
    loss(out, lse, _shard(dout, c, rank, W, 1),
         None if dlse is None else _shard(dlse, c, rank, W, 2)).backward()

    got = {"out": out, "lse": lse, "dq": loc[0].grad, "dk": loc[1].grad, "dv": loc[2].grad}
    want = {"out": _shard(ref_out, c, rank, W, 1), "lse": _shard(ref_lse, c, rank, W, 2),
            "dq": _shard(ref[0].grad, c, rank, W, 1), "dk": _shard(ref[1].grad, c, rank, W, 1),
            "dv": _shard(ref[2].grad, c, rank, W, 1)}
    errors, msgs = {}, []
    for key in got:
        a, r = got[key], want[key]
        if a.shape != r.shape or a.dtype != r.dtype:
            msgs.append(f"{key}: {tuple(a.shape)} {a.dtype} != {tuple(r.shape)} {r.dtype}")
            continue
        errors[key] = _err(a, r)
    if msgs:
        return {"ok": False, "errors": errors, "msg": "; ".join(msgs)}

    if dtype == torch.float32:
        # Both sides are exact fp32 algorithms; they differ only in summation order.
        gmax = max(want[x].abs().max().item() for x in ("dq", "dk", "dv"))
        tols = {"out": 2e-5, "lse": 2e-5 * (1 + want["lse"].abs().max().item())}
        tols.update({x: 2e-5 * max(1.0, gmax) for x in ("dq", "dk", "dv")})
    else:
        # The FlashAttention rule against the fp64 oracle on the full sequence.
        r64 = [x.double().requires_grad_() for x in full]
        o64, l64 = helpers.attention_ref64(*r64, **kw)
        nv = [x.clone().requires_grad_() for x in full]
        onv, _ = helpers.attention_naive(*nv, **kw)
        (o64 * dout.double()).sum().backward()
        (onv.float() * dout.float()).sum().backward()
        gmax = max(x.grad.abs().max().item() for x in r64)
        tols, errors = {}, {}
        for key, a, n, r in (("out", out, onv, o64), ("dq", loc[0].grad, nv[0].grad, r64[0].grad),
                             ("dk", loc[1].grad, nv[1].grad, r64[1].grad),
                             ("dv", loc[2].grad, nv[2].grad, r64[2].grad)):
            n_s, r_s = _shard(n, c, rank, W, 1), _shard(r.detach(), c, rank, W, 1)
            tols[key] = helpers.fa_tolerance(n_s, r_s, dtype, 1.0 if key == "out" else gmax)
            errors[key] = _err(a, r_s)
        l64_s = _shard(l64.detach(), c, rank, W, 2)
        errors["lse"] = _err(lse, l64_s)
        tols["lse"] = 1e-4 * (1 + l64_s.abs().max().item())
    bad = [f"{k}: {errors[k]:.3e} > {tols[k]:.3e}" for k in errors if not errors[k] <= tols[k]]

    # unshard_sequence (gathering) gives the full output back on every rank.
    if name == "causal_balanced_gqa":
        full_out = fd.unshard_sequence(out.detach(), group=group)
        if not torch.allclose(full_out, ref_out.detach(), atol=2e-5, rtol=0):
            bad.append("unshard_sequence(out) != full out")
    return {"ok": not bad, "errors": errors, "tols": tols, "msg": "; ".join(bad)}


def _check_overlap(rank, W, group):
    """Each ring step posts its transfer before computing on the shard at hand, and waits after."""
    events, dsts = [], []
    orig = (fd._exchange, fd._wait, fd._chunk_fwd, fd._chunk_bwd)
    fd._exchange = lambda *a: (events.append("exchange"), dsts.append(a[1]), orig[0](*a))[2]
    fd._wait = lambda w: (orig[1](w), events.append("wait"))[0]
    fd._chunk_fwd = lambda *a: (events.append("fwd"), orig[2](*a))[1]
    fd._chunk_bwd = lambda *a: (events.append("bwd"), orig[3](*a))[1]
    try:
        x = [torch.randn(1, 16, 2, 16, requires_grad=True) for _ in range(3)]
        out = fd.ring_attention(*x, group=group, load_balance=False)
        fwd_events, fwd_dsts = list(events), list(dsts)
        events.clear()
        dsts.clear()
        out.sum().backward()
        bwd_events, bwd_dsts = list(events), list(dsts)
    finally:
        fd._exchange, fd._wait, fd._chunk_fwd, fd._chunk_bwd = orig
    # Forward: step t < W-1 is exchange, fwd, wait; the last step computes only.
    want_fwd = ["exchange", "fwd", "wait"] * (W - 1) + ["fwd"]
    # Backward: step 0: K/V exchange, compute, dK/dV exchange, K/V wait; steps 1..W-2 also wait
    # for (and add) the incoming dK/dV after computing; the last step has no K/V transfer; a
    # final wait brings this rank's own dK/dV home.
    want_bwd = (["exchange", "bwd", "exchange", "wait"]
                + ["exchange", "bwd", "wait", "exchange", "wait"] * (W - 2)
                + ["bwd", "wait", "exchange", "wait"])
    # The forward sends to the next rank, the backward (K/V and dK/dV) to the previous one.
    me = fd.dist.get_rank(group)
    nxt, prv = ((fd.dist.get_global_rank(group or fd.dist.group.WORLD, (me + s) % W))
                for s in (1, -1))
    ok = (fwd_events == want_fwd and bwd_events == want_bwd and set(fwd_dsts) == {nxt}
          and set(bwd_dsts) == {prv})
    return {"ok": ok, "errors": {},
            "msg": "" if ok else f"fwd {fwd_events} to {fwd_dsts}, bwd {bwd_events} to {bwd_dsts}"}


def _check_mismatch(rank, W, group):
    """Inconsistent calls across ranks raise the same clear error on every rank."""
    msgs = []
    h = 4 if rank == 0 else 2
    try:
        fd.ring_attention(torch.randn(1, 8, h, 16), torch.randn(1, 8, 1, 16),
                          torch.randn(1, 8, 1, 16), group=group)
        msgs.append("heads mismatch not detected")
    except ValueError as e:
        if "heads of q" not in str(e):
            msgs.append(f"heads mismatch: {e}")
    n = 10 + rank  # 10 + 11 + ... does not follow the balanced layout
    try:
        fd.ring_attention(*(torch.randn(1, n, 2, 16) for _ in range(3)), group=group)
        msgs.append("unbalanced lengths not detected")
    except ValueError as e:
        if "load-balanced layout" not in str(e):
            msgs.append(f"unbalanced lengths: {e}")
    return {"ok": not msgs, "errors": {}, "msg": "; ".join(msgs)}


def _check_subgroups(rank, W, group):
    """A ring over a subgroup (ranks {0, 2} and {1, 3}): peers are the group's global ranks."""
    groups = [fd.dist.new_group([0, 2]), fd.dist.new_group([1, 3])]
    mine = groups[rank % 2]
    res = _run_case("causal_balanced_gqa", fd.dist.get_rank(mine), 2, mine, seed=5)
    res["msg"] = ("subgroup: " + res["msg"]) if res["msg"] else ""
    return res


def _worker(rank, W, init_file, result_dir):
    torch.set_num_threads(1)
    results = {}
    try:
        fd.dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                                   world_size=W, timeout=timedelta(seconds=TIMEOUT_S))
        group = None
        for i, name in enumerate(CASES):
            t0 = time.perf_counter()
            try:
                results[name] = _run_case(name, rank, W, group, seed=1000 + i)
            except Exception:
                results[name] = {"ok": False, "errors": {}, "msg": traceback.format_exc()}
            results[name]["seconds"] = time.perf_counter() - t0
        for name, fn in (("overlap_order", _check_overlap), ("rank_mismatch", _check_mismatch),
                         ("subgroup", _check_subgroups)):
            if name == "subgroup" and W != 4:
                continue
            try:
                results[name] = fn(rank, W, group)
            except Exception:
                results[name] = {"ok": False, "errors": {}, "msg": traceback.format_exc()}
        fd.dist.barrier()
        fd.dist.destroy_process_group()
    except Exception:
        results["_setup"] = {"ok": False, "errors": {}, "msg": traceback.format_exc()}
    Path(result_dir, f"rank{rank}.json").write_text(json.dumps(results))


# ------------------------------------------------------------------------- parent side
@pytest.fixture(scope="module")
def ring_results(tmp_path_factory):
    """Run every case in one process group per world size (both world sizes at once)."""
    import torch.multiprocessing as mp

    base = tmp_path_factory.mktemp("ring")
    runs = {}
    t0 = time.perf_counter()
    for W in WORLD_SIZES:
        d = base / f"w{W}"
        d.mkdir()
        ctx = mp.spawn(_worker, args=(W, str(d / "init"), str(d)), nprocs=W, join=False)
        runs[W] = (ctx, d)
    deadline = time.monotonic() + TIMEOUT_S
    failures = {}
    for W, (ctx, _) in runs.items():
        try:
            while not ctx.join(timeout=max(0.1, deadline - time.monotonic())):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"world size {W}: workers did not finish in {TIMEOUT_S} s")
        except Exception as e:  # a worker crashed or hung: stop the ones this test started
            failures[W] = str(e)
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
    out = {"_wall": time.perf_counter() - t0}
    for W, (_, d) in runs.items():
        out[W] = []
        for r in range(W):
            f = d / f"rank{r}.json"
            out[W].append(json.loads(f.read_text()) if f.exists()
                          else {"_setup": {"ok": False, "msg": failures.get(W, "no result")}})
    return out


def _assert_all_ranks(results, W, name):
    for r, res in enumerate(results[W]):
        if "_setup" in res:
            pytest.fail(f"W={W} rank {r}: setup failed: {res['_setup']['msg']}")
        assert name in res, f"W={W} rank {r}: no result for {name}"
        assert res[name]["ok"], f"W={W} rank {r} {name}: {res[name]['msg']} {res[name]['errors']}"


@pytest.mark.parametrize("W", WORLD_SIZES)
@pytest.mark.parametrize("name", list(CASES))
def test_ring_matches_attention(ring_results, W, name):
    _assert_all_ranks(ring_results, W, name)


@pytest.mark.parametrize("W", WORLD_SIZES)
def test_transfer_posted_before_compute(ring_results, W):
    _assert_all_ranks(ring_results, W, "overlap_order")


@pytest.mark.parametrize("W", WORLD_SIZES)
def test_inconsistent_ranks_raise(ring_results, W):
    _assert_all_ranks(ring_results, W, "rank_mismatch")


def test_ring_over_subgroup(ring_results):
    _assert_all_ranks(ring_results, 4, "subgroup")


# ------------------------------------------------------------------------- in-process
def _simulate(W, S, load_balance, causal, window, softcap, lengths=None):
    """Every rank's plan run in one process (no communication): max error against attention."""
    h, h_k, d = 2, 1, 16
    q, k, v = (torch.randn(1, S, hh, d) for hh in (h, h_k, h_k))
    ref, ref_lse = flash3.attention(q, k, v, causal=causal, window_size=window, softcap=softcap,
                                    return_lse=True)
    scale, left, right, cap = _checks.options(q, causal, None, window, softcap)
    left, right = masking.normalize_window(causal, (left, right))
    ranges = (fd.shard_ranges(S, W, load_balance=load_balance) if lengths is None
              else [[(sum(lengths[:r]), lengths[r])] for r in range(W)])
    segs = [fd._segments(r) for r in ranges]

    def local(x, r, dim=1):
        return torch.cat([x.narrow(dim, s, n) for s, n in ranges[r]], dim)

    worst = 0.0
    for r in range(W):
        L = sum(n for _, n in ranges[r])
        out, lse = torch.zeros(1, L, h, d), torch.full((1, h, L), -math.inf)
        for src in range(W):
            ks, vs = local(k, src), local(v, src)
            for qa, qb, ka, kb, wl, wr in fd._plan(segs[r], segs[src], left, right, src == r):
                o, l = flash3.ops.attention_fwd(local(q, r)[:, qa:qb], ks[:, ka:kb],
                                                vs[:, ka:kb], scale, wl, wr, cap)
                fd._merge(out, lse, qa, qb, o, l)
        want, want_lse = local(ref, r), local(ref_lse, r, 2)
        assert torch.equal(torch.isinf(lse), torch.isinf(want_lse))
        fin = torch.isfinite(want_lse)
        worst = max(worst, _err(out, want), _err(lse[fin], want_lse[fin]))
    return worst


def test_plan_covers_every_mask():
    """Chunk-pair planning (trimmed blocks, shifted windows, merged calls) over random layouts,
    windows, softcaps and uneven lengths reproduces single-process attention."""
    rnd = random.Random(0)
    for _ in range(120):
        W, S = rnd.choice([1, 2, 3, 4, 5]), rnd.randint(0, 48)
        lb, causal = rnd.random() < 0.5, rnd.random() < 0.5
        window = (rnd.choice([-1, 0, 1, 3, 7, 20]), rnd.choice([-1, 0, 1, 4, 9, 30]))
        lengths = None
        if not lb and rnd.random() < 0.4:
            cuts = sorted(rnd.randint(0, S) for _ in range(W - 1))
            lengths = [b - a for a, b in zip([0] + cuts, cuts + [S])]
        err = _simulate(W, S, lb, causal, window, rnd.choice([0.0, 5.0]), lengths)
        assert err < 1e-5, (W, S, lb, causal, window, lengths, err)


def test_balanced_causal_is_one_call_per_step():
    """Load-balanced causal: every ring step is one kernel call of the same size on every rank."""
    for W in (2, 4):
        segs = [fd._segments(r) for r in fd.shard_ranges(64, W)]
        for r in range(W):
            sizes = []
            for src in range(W):
                calls = fd._plan(segs[r], segs[src], -1, 0, src == r)
                assert len(calls) == 1
                qa, qb, ka, kb, _, _ = calls[0]
                sizes.append((qb - qa) * (kb - ka))
            n = (64 // W) ** 2  # local block: causal on itself, half of it against any other
            assert sizes[r] == n and {x for i, x in enumerate(sizes) if i != r} == {n // 2}


def test_shard_ranges_and_roundtrip():
    assert fd.shard_ranges(16, 2) == [[(0, 4), (12, 4)], [(4, 4), (8, 4)]]
    assert fd.shard_ranges(10, 2, load_balance=False) == [[(0, 5)], [(5, 5)]]
    assert fd.shard_ranges(9, 2) == [[(0, 3), (7, 2)], [(3, 2), (5, 2)]]
    pos = torch.arange(9)
    assert fd.shard_sequence(pos, 0, 2, dim=0).tolist() == [0, 1, 2, 7, 8]
    x = torch.randn(2, 3, 23, 5, requires_grad=True)
    for W in (1, 2, 3, 4):
        for lb in (True, False):
            shards = [fd.shard_sequence(x, r, W, dim=2, load_balance=lb) for r in range(W)]
            assert sum(s.shape[2] for s in shards) == 23
            assert torch.equal(fd.unshard_sequence(shards, dim=-2, load_balance=lb), x)
    # Differentiable: dim 1 has 3 positions, cut into 4 chunks [1, 1, 1, 0]; rank 1 of 2 holds
    # chunks 1 and 2, i.e. positions 1 and 2.
    fd.shard_sequence(x, 1, 2).sum().backward()
    assert x.grad[:, 1:].eq(1).all() and x.grad[:, 0].eq(0).all()


def test_bad_arguments():
    q = torch.randn(1, 8, 2, 16)
    with pytest.raises(ValueError, match="q must be 4-D"):
        fd.ring_attention(q[0], q, q)
    with pytest.raises(ValueError, match="k has seqlen 4 but q has 8"):
        fd.ring_attention(q, q[:, :4], q[:, :4])
    with pytest.raises(ValueError, match="divisible"):
        fd.ring_attention(q, torch.randn(1, 8, 3, 16), torch.randn(1, 8, 3, 16))
    with pytest.raises(TypeError, match="load_balance must be a bool"):
        fd.ring_attention(q, q, q, load_balance=1)
    with pytest.raises(TypeError, match="causal must be a bool"):
        fd.ring_attention(q, q, q, causal="yes")
    with pytest.raises(TypeError, match="group must be a torch.distributed.ProcessGroup"):
        fd.ring_attention(q, q, q, group=3)
    if not fd.dist.is_initialized():
        with pytest.raises(RuntimeError, match="init_process_group"):
            fd.ring_attention(q, q, q)
        with pytest.raises(RuntimeError, match="init_process_group"):
            fd.unshard_sequence(q)
    with pytest.raises(ValueError, match="rank must be < world_size"):
        fd.shard_sequence(q, 2, 2)
    with pytest.raises(ValueError, match="world_size must be >= 1"):
        fd.shard_sequence(q, 0, 0)
    with pytest.raises(ValueError, match="dim must be in"):
        fd.shard_sequence(q, 0, 2, dim=4)
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        fd.shard_sequence([1, 2], 0, 2)
    with pytest.raises(ValueError, match="load-balanced layout"):
        fd.unshard_sequence([torch.zeros(1, 4), torch.zeros(1, 2)])
    with pytest.raises(ValueError, match=r"shards\[1\] has shape"):
        fd.unshard_sequence([torch.zeros(1, 4, 2), torch.zeros(1, 4, 3)], load_balance=False)


def test_world_size_one_is_plain_attention(tmp_path):
    """A ring of one (gloo, in this process) is exactly flash3.attention."""
    assert not fd.dist.is_initialized()
    fd.dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0,
                               world_size=1)
    try:
        x = [torch.randn(2, 37, hh, 32, requires_grad=True) for hh in (4, 2, 2)]
        y = [t.detach().clone().requires_grad_() for t in x]
        for kw in (dict(causal=True), dict(window_size=(5, 3), softcap=3.0), {}):
            out, lse = fd.ring_attention(*x, return_lse=True, **kw)
            ref, ref_lse = flash3.attention(*y, return_lse=True, **kw)
            assert torch.equal(out, ref) and torch.equal(lse, ref_lse)
            (out.sum() + lse.sum()).backward()
            (ref.sum() + ref_lse.sum()).backward()
            for a, b in zip(x, y):
                assert torch.allclose(a.grad, b.grad, atol=1e-6, rtol=0)
                a.grad = b.grad = None
        assert torch.equal(fd.unshard_sequence(x[0]), x[0].detach())
    finally:
        fd.dist.destroy_process_group()


def test_ring_sanity_script_on_cpu():
    """tools/device/ring_sanity.py (the device check's sanity call) runs its full path on gloo/CPU."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "device" / "ring_sanity.py"), "--cpu"],
                       capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().splitlines()[-1].startswith("PASS"), r.stdout


def test_import_initializes_nothing():
    code = ("import torch.distributed as dist, flash3.distributed as fd; "
            "assert not dist.is_initialized(); print('ok')")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env=env)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
