#!/usr/bin/env python
"""FP8 attention accuracy on outlier inputs (FlashAttention-3 paper, Table 3).

q, k, v ~ N(0, 1) + N(0, 100) * Bernoulli(0.001) (sparse outliers with
std 10), RMSE of the attention output against a float64 reference computed on
the same (fp32) inputs.  Methods:

  fp8 per-tensor          one scale per tensor, no Hadamard (the paper's baseline)
  fp8 block               one scale per 128-row block per head (B_r = B_c = 128)
  fp8 block + Hadamard    the same after the randomized Hadamard rotation of q, k
  fp16 / bf16 exact       inputs rounded to fp16/bf16, exact fp32 attention
                          (flash3.reference.forward)
  fp16 / bf16 FA (P lowp) FlashAttention numerics: P rounded to fp16/bf16 for P@V
  fp16 / bf16 naive       softmax(q k^T * scale) v with every op in fp16/bf16

All FP8 rows run flash3.fp8.fp8_attention_reference, the tile-level emulation
of the Hopper FP8 kernel (P in e4m3 with max offset 8, fp32 row sums).

Usage:  python benchmarks/fp8_accuracy.py [--shape 1,2048,8,128] [--seed 0] [--check] [--threads 1]
Writes benchmarks/out/fp8_accuracy.{json,png}.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from flash3 import reference  # noqa: E402
from flash3.fp8 import (  # noqa: E402
    attention_fp64_reference,
    attention_fp8,
    attention_tiled_lowp,
    fp8_attention_reference,
    quantize_fp8_per_tensor,
)

PAPER = {"fp8 per-tensor": 2.4e-2, "fp8 block + Hadamard": 9.1e-3}


def outlier_inputs(shape, gen):
    x = torch.randn(shape, generator=gen)
    return x + torch.randn(shape, generator=gen) * 10.0 * (torch.rand(shape, generator=gen) < 1e-3)


def rmse(out, ref):
    return (out.double() - ref).pow(2).mean().sqrt().item()


def fp8_per_tensor(q, k, v):
    (q8, qd), (k8, kd), (v8, vd) = (quantize_fp8_per_tensor(t) for t in (q, k, v))
    return fp8_attention_reference(q8, k8, v8, qd, kd, vd)[0]


def exact_lowp(q, k, v, dtype):
    """Exact attention on inputs rounded to ``dtype``: flash3's reference backend."""
    ql, kl, vl = q.to(dtype), k.to(dtype), v.to(dtype)
    out, _ = reference.forward(ql, kl, vl, 1.0 / math.sqrt(q.shape[-1]), -1, -1, 0.0)
    return out, "flash3.reference.forward"


def _mm_lowp(a, b, dtype):
    """A GEMM on ``dtype`` operands with fp32 accumulation and a ``dtype`` output
    (what tensor cores and PyTorch's CPU fp16/bf16 GEMMs do), run in fp32
    because CPU fp16 GEMMs are very slow."""
    return torch.matmul(a.float(), b.float()).to(dtype)


def naive_lowp(q, k, v, dtype):
    """softmax(q k^T * scale) v with every op's output (both GEMMs, the scaling,
    the softmax) rounded to ``dtype``: the standard non-fused attention."""
    b, s, h, d = q.shape
    scale = torch.tensor(1.0 / math.sqrt(d), dtype=dtype)
    out = torch.empty(b, s, h, v.shape[-1], dtype=dtype)
    ql, kl, vl = q.to(dtype), k.to(dtype), v.to(dtype)
    for hh in range(h):
        hk = hh // (h // k.shape[2])
        sc = _mm_lowp(ql[:, :, hh], kl[:, :, hk].transpose(-1, -2), dtype) * scale
        p = torch.softmax(sc, dim=-1)
        out[:, :, hh] = _mm_lowp(p, vl[:, :, hk], dtype)
    return out


def run(shape, seed):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (outlier_inputs(shape, gen) for _ in range(3))
    t0 = time.time()
    ref, _ = attention_fp64_reference(q, k, v)
    rows, notes = {}, {}
    timings = {"fp64 reference": time.time() - t0}

    def add(name, fn):
        t = time.time()
        rows[name] = rmse(fn(), ref)
        timings[name] = time.time() - t

    add("fp8 per-tensor", lambda: fp8_per_tensor(q, k, v))
    add("fp8 block", lambda: attention_fp8(q, k, v, hadamard=False, block_size=(128, 128)))
    add("fp8 block + Hadamard", lambda: attention_fp8(q, k, v, hadamard=True, block_size=(128, 128), seed=seed))
    for dt, nm in ((torch.float16, "fp16"), (torch.bfloat16, "bf16")):
        def exact(dt=dt, nm=nm):
            out, src = exact_lowp(q, k, v, dt)
            notes[f"{nm} exact"] = src
            return out
        add(f"{nm} exact", exact)
        add(f"{nm} FA (P lowp)", lambda dt=dt: attention_tiled_lowp(q.to(dt), k.to(dt), v.to(dt)))
        add(f"{nm} naive", lambda dt=dt: naive_lowp(q, k, v, dt))
    ratios = {
        "per-tensor / block": rows["fp8 per-tensor"] / rows["fp8 block"],
        "per-tensor / block+Hadamard": rows["fp8 per-tensor"] / rows["fp8 block + Hadamard"],
        "block / block+Hadamard": rows["fp8 block"] / rows["fp8 block + Hadamard"],
        "fp16 naive / fp16 exact": rows["fp16 naive"] / rows["fp16 exact"],
        "bf16 naive / bf16 exact": rows["bf16 naive"] / rows["bf16 exact"],
    }
    targets = {
        "block+Hadamard >= 1.5x lower RMSE than per-tensor": ratios["per-tensor / block+Hadamard"] >= 1.5,
        "Hadamard helps over block alone": ratios["block / block+Hadamard"] > 1.0,
    }
    return {"shape": list(shape), "seed": seed, "rmse": rows, "ratios": ratios, "targets": targets,
            "paper_rmse": PAPER, "sources": notes, "seconds": timings}


def print_table(res):
    print(f"FP8 attention accuracy, shape (b, s, h, d) = {tuple(res['shape'])}, seed {res['seed']}")
    print("inputs: N(0,1) + N(0,100)*Bernoulli(0.001); RMSE vs float64 reference")
    print(f"{'method':<24} {'RMSE':>10} {'paper':>10} {'time [s]':>9}")
    for name, val in res["rmse"].items():
        paper = res["paper_rmse"].get(name)
        ptxt = f"{paper:.1e}" if paper is not None else ""
        print(f"{name:<24} {val:>10.3e} {ptxt:>10} {res['seconds'][name]:>9.2f}")
    print()
    for name, val in res["ratios"].items():
        print(f"{name:<30} {val:6.2f}x")
    for name, src in res["sources"].items():
        print(f"({name}: {src})")
    print()
    for name, ok in res["targets"].items():
        print(f"[{'PASS' if ok else 'FAIL'}] {name}")


def plot(res, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(res["rmse"].keys())
    vals = [res["rmse"][n] for n in names]
    colors = ["tab:red" if n.startswith("fp8") else ("tab:blue" if "fp16" in n else "tab:green") for n in names]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.barh(names[::-1], vals[::-1], color=colors[::-1])
    ax.set_xscale("log")
    for i, val in enumerate(vals[::-1]):
        ax.text(val, i, f" {val:.2e}", va="center", fontsize=8)
    rev = names[::-1]
    px = [pv for n, pv in res["paper_rmse"].items() if n in rev]
    py = [rev.index(n) for n in res["paper_rmse"] if n in rev]
    ax.scatter(px, py, marker="x", color="black", zorder=3, label="FA3 paper, Table 3")
    ax.legend(loc="lower right", fontsize=8)
    ax.set_xlabel("RMSE vs float64 reference (log scale)")
    ax.set_title(f"FP8 attention accuracy, outlier inputs, shape {tuple(res['shape'])}")
    ax.set_xlim(right=max(vals) * 8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="1,2048,8,128", help="b,s,h,d (default 1,2048,8,128)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=os.path.join(_ROOT, "benchmarks", "out"), help="output directory")
    ap.add_argument("--check", action="store_true", help="exit 1 if a target inequality fails")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch CPU threads (default 1: the tile loop is many small ops, and OpenMP "
                         "barriers on a busy 2-core machine cost far more than they gain; 0 = torch's default)")
    args = ap.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    shape = tuple(int(x) for x in args.shape.split(","))
    if len(shape) != 4 or min(shape) <= 0:
        ap.error("--shape must be four positive ints b,s,h,d")
    t0 = time.time()
    res = run(shape, args.seed)
    res["total_seconds"] = time.time() - t0
    print_table(res)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "fp8_accuracy.json"), "w") as f:
        json.dump(res, f, indent=2)
    plot(res, os.path.join(args.out, "fp8_accuracy.png"))
    print(f"\nwrote {os.path.join(args.out, 'fp8_accuracy.json')} and fp8_accuracy.png "
          f"({res['total_seconds']:.1f} s)")
    if args.check and not all(res["targets"].values()):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
