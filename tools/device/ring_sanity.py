"""Sanity call of flash3.distributed.ring_attention for the device check.

    python tools/device/ring_sanity.py            # CUDA + NCCL (prints SKIP and exits 0 without CUDA)
    python tools/device/ring_sanity.py --cpu      # the same path on gloo / CPU (fp32)
    torchrun --nproc-per-node N tools/device/ring_sanity.py   # N GPUs: a real ring

Without torchrun's environment it creates a one-rank group (an in-memory HashStore), so
the ring is a plain call; under torchrun every rank holds its load-balanced shard.  Runs a causal
GQA forward + backward and compares out, lse, dq, dk, dv with flash3.attention on the full
sequence (sharded the same way), then replays, in one process, the chunk-pair calls of a 4-rank
ring (balanced causal, balanced sliding window, uneven contiguous band + softcap) on the kernel
and checks their merged forward.  Prints one PASS/FAIL line (rank 0); exit status 1 on FAIL.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the in-tree flash3

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def simulated_ring(full, world, load_balance, lengths=None, **kw):
    """Run every rank's chunk-pair calls of a ``world``-rank ring in this process (forward, no
    communication): the exact calls (trimmed blocks, shifted windows) the ring makes on the
    kernel.  Returns the max errors of out and lse against flash3.attention on the full
    sequence in fp32, and those of the full call in the input dtype (the yardstick)."""
    import math

    import flash3
    from flash3 import _checks, masking
    from flash3 import distributed as fd

    q, k, v = full
    S = q.shape[1]
    ref, ref_lse = flash3.attention(*(x.float() for x in full), return_lse=True, **kw)
    same, same_lse = flash3.attention(q, k, v, return_lse=True, **kw)
    scale, left, right, cap = _checks.options(q, kw.get("causal", False), None,
                                              kw.get("window_size", (-1, -1)),
                                              kw.get("softcap", 0.0))
    left, right = masking.normalize_window(kw.get("causal", False), (left, right))
    ranges = (fd.shard_ranges(S, world, load_balance=load_balance) if lengths is None
              else [[(sum(lengths[:r]), lengths[r])] for r in range(world)])
    segs = [fd._segments(r) for r in ranges]

    def local(x, r, dim=1):
        return torch.cat([x.narrow(dim, a, n) for a, n in ranges[r]], dim)

    e_out = e_lse = 0.0
    for r in range(world):
        L = sum(n for _, n in ranges[r])
        out = torch.zeros(q.shape[0], L, q.shape[2], v.shape[3], device=q.device)
        lse = torch.full((q.shape[0], q.shape[2], L), -math.inf, device=q.device)
        q_r = local(q, r)
        for src in range(world):
            k_s, v_s = local(k, src), local(v, src)
            for qa, qb, ka, kb, wl, wr in fd._plan(segs[r], segs[src], left, right, src == r):
                o, l = flash3.ops.attention_fwd(q_r[:, qa:qb], k_s[:, ka:kb], v_s[:, ka:kb],
                                                scale, wl, wr, cap)
                fd._merge(out, lse, qa, qb, o, l)
        e_out = max(e_out, (out.to(q.dtype).float() - local(ref, r)).abs().max().item())
        e_lse = max(e_lse, (lse - local(ref_lse, r, 2)).abs().max().item())
    return (e_out, e_lse, (same.float() - ref).abs().max().item(),
            (same_lse - ref_lse).abs().max().item(), ref.abs().max().item())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", action="store_true", help="gloo on the CPU, fp32")
    ap.add_argument("--seqlen", type=int, default=None)
    args = ap.parse_args()
    if not args.cpu and not torch.cuda.is_available():
        print("SKIP ring_sanity: no CUDA device")
        return 0

    import flash3
    from flash3.distributed import ring_attention, shard_sequence

    torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    backend = "gloo" if args.cpu else "nccl"
    if torchrun:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        init = dict(init_method="env://")
    else:  # one rank: an in-memory store, no port to race for
        rank, world = 0, 1
        init = dict(store=dist.HashStore())
    if args.cpu:
        dev, dtype = torch.device("cpu"), torch.float32
    else:
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(dev)
        dtype = torch.bfloat16
    dist.init_process_group(backend, rank=rank, world_size=world, **init)
    try:
        S = args.seqlen or (256 if args.cpu else 4096)
        b, h, h_k, d = (1, 4, 2, 64) if args.cpu else (2, 16, 4, 128)
        g = torch.Generator(device="cpu").manual_seed(0)
        full = [torch.randn(b, S, hh, d, generator=g).to(dev, dtype) for hh in (h, h_k, h_k)]
        dout = torch.randn(b, S, h, d, generator=g).to(dev, dtype)

        ref = [x.clone().requires_grad_() for x in full]
        ref_out, ref_lse = flash3.attention(*ref, causal=True, return_lse=True)
        ref_out.backward(dout)

        def shard(x, dim=1):
            return shard_sequence(x, rank, world, dim=dim)

        loc = [shard(x).requires_grad_() for x in full]
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out, lse = ring_attention(*loc, causal=True, return_lse=True)
        out.backward(shard(dout))
        if dev.type == "cuda":
            torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1e3

        errs = {"out": (out, shard(ref_out)), "lse": (lse, shard(ref_lse, 2)),
                "dq": (loc[0].grad, shard(ref[0].grad)), "dk": (loc[1].grad, shard(ref[1].grad)),
                "dv": (loc[2].grad, shard(ref[2].grad))}
        gmax = max(shard(r.grad).abs().max().item() for r in ref)
        # bf16: one rounding of each result apart at most (the merge and the dK/dV sums run in
        # fp32); with one rank the ring is the very same call.
        rel = 1e-5 if dtype == torch.float32 else 2e-2
        bad, parts = [], []
        for name, (a, r) in errs.items():
            e = (a.double() - r.double()).abs().max().item()
            scale = {"out": 1.0, "lse": 1 + r.abs().max().item()}.get(name, max(1.0, gmax))
            parts.append(f"{name} {e:.2e}")
            if not (a.shape == r.shape and e <= rel * scale):
                bad.append(name)
        # The calls a 4-rank ring makes, in this process (on the kernel when it applies).
        sim = []
        for name, lb, lengths, kw in (
                ("causal", True, None, dict(causal=True)),
                ("window", True, None, dict(window_size=(S // 6, 0))),
                ("band+softcap", False, [S // 4 - 7, 7, S // 2, S // 4],
                 dict(window_size=(S // 13, S // 19), softcap=30.0))):
            eo, el, yo, yl, top = simulated_ring(full, 4, lb, lengths, **kw)
            # Partials are rounded to the input dtype before the fp32 merge: allow twice the
            # error of the single full call plus one ulp (bf16) or 1e-5 (fp32) at the outputs' size.
            floor = max(torch.finfo(dtype).eps, 1e-5) * max(1.0, top)
            if not (eo <= 2 * yo + floor and el <= 2 * yl + 1e-4):
                bad.append(f"4-rank {name}")
            sim.append(f"{name} {eo:.2e}")
        parts.append("simulated 4-rank out " + ", ".join(sim))
        t = torch.tensor([len(bad)], device=dev)
        dist.all_reduce(t)
        ok = int(t.item()) == 0
        if rank == 0:
            print(f"{'PASS' if ok else 'FAIL'} ring_sanity: {backend} world={world} {dtype} "
                  f"b={b} S={S} h={h} h_k={h_k} d={d} causal fwd+bwd {ms:.1f} ms; max err "
                  + ", ".join(parts) + (f"; failed: {', '.join(bad)}" if bad else ""))
        return 0 if ok else 1
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
