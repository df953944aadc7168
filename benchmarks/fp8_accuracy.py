#!/usr/bin/env python
"""FP8 attention accuracy (FlashAttention-3 paper, Table 3, and beyond).

RMSE and cosine similarity of the attention output against a float64
reference computed on the same (fp32) inputs, for three input sets:

  outliers   q, k, v ~ N(0, 1) + N(0, 100) * Bernoulli(0.001) (the paper's
             Table 3), non-causal, default shape (1, 4096, 8, 128)
  kmean      the same plus a per-(head, channel) mean on k, mu ~ N(0, 5^2)
             (real LLM keys share large channel means), and a per-channel
             mean mu ~ N(0, 1) on v
  causal     outliers, causal, (1, 1024, 8, 128) (the small case)

FP8 methods (all run flash3.fp8.fp8_attention_reference, the tile-level
emulation of the Hopper FP8 kernel: key tiles walked last to first, P in
e4m3 with max offset 8, fp32 row sums):

  per-tensor        one e4m3 scale per tensor, no Hadamard (the baseline of
                    the issue/paper; P rounded to e4m3 after scaling by 256)
  per-head (FA3)    one scale per (batch, head), FA3's descale convention
  block             q per 128 rows, k/v per 128 keys
  block+H           ... after the randomized Hadamard rotation of q and k
  block+H+Ks        ... plus K smoothing (mean of k over tokens removed)
  block+H+Ks+Vch    ... plus a per-channel v scale (v = v8 * v_blk * v_chan)
  q64+H+Ks          q per 64 rows (the kernel's native slab), k/v per 128
  q64+H+Ks+Vch      attention_fp8 with v_scale="block+channel"
  q64+H+Ks [+Vs]    experiment, not in the kernel: V mean smoothing as in
                    SageAttention (O = P(V - mean_v)/l + mean_v)

Error budget (outliers, block+H): the error of each input's e4m3 rounding
alone (the others exact, fp64 attention on the dequantized tensor) and of P's
rounding alone (fp32 tile loop, only P in e4m3).

Non-FP8 rows on the outliers set: fp16/bf16 exact (flash3.reference.forward on
rounded inputs), FA numerics (P rounded to fp16/bf16), naive (every op in
fp16/bf16).

Usage:  python benchmarks/fp8_accuracy.py [--shape 1,4096,8,128] [--seed 0] [--check]
        [--quick] [--threads 2]
Writes benchmarks/out/fp8_accuracy.{json,png} (--quick: fp8_accuracy_quick.json, no png).
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
    FP8_DTYPE,
    _tiled_core,
    attention_fp64_reference,
    attention_fp8,
    attention_tiled_lowp,
    dequantize_fp8,
    fp8_attention_reference,
    quantize_fp8,
    quantize_fp8_per_tensor,
)
from flash3.hadamard import hadamard_transform  # noqa: E402

PAPER = {"per-tensor": 2.4e-2, "block+H": 9.1e-3}
BASELINE = "per-tensor"
TARGET_RATIO = 2.5


def outlier_inputs(shape, gen):
    x = torch.randn(shape, generator=gen)
    return x + torch.randn(shape, generator=gen) * 10.0 * (torch.rand(shape, generator=gen) < 1e-3)


def make_inputs(kind, shape, seed):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (outlier_inputs(shape, gen) for _ in range(3))
    if kind == "kmean":
        b, s, h, d = shape
        k = k + 5.0 * torch.randn(b, 1, h, d, generator=gen)
        v = v + torch.randn(b, 1, h, d, generator=gen)
    return q, k, v


def rmse(out, ref):
    return (out.double() - ref).pow(2).mean().sqrt().item()


def cosine(out, ref):
    a, b = out.double().flatten(), ref.flatten()
    return (a @ b / (a.norm() * b.norm())).item()


def fp8_per_tensor(q, k, v, causal):
    (q8, qd), (k8, kd), (v8, vd) = (quantize_fp8_per_tensor(t) for t in (q, k, v))
    return fp8_attention_reference(q8, k8, v8, qd, kd, vd, causal=causal)[0]


def fp8_per_head(q, k, v, causal):
    (q8, qd), (k8, kd), (v8, vd) = (quantize_fp8(t, block_size=None) for t in (q, k, v))
    return fp8_attention_reference(q8, k8, v8, qd, kd, vd, causal=causal)[0]


def fp8_v_smoothed(q, k, v, causal, seed):
    """Experiment: SageAttention's V smoothing on top of q64+H+Ks.

    O = P8 (V - mean_v) / l + mean_v.  With l from the unrounded P the weights
    P8 / l sum to 1 + delta, so this is not the same rounded function as
    without smoothing: its P-rounding error is sum_j delta_j (v_j - mean_v)
    instead of sum_j delta_j v_j (smaller when v has a common mean), and v's
    own rounding error shrinks with |v - mean_v|.  Rows without keys would need
    to stay 0 (not mean_v); every row sees a key here.
    """
    mean_v = v.float().mean(dim=1, keepdim=True)
    out = attention_fp8(q, k, (v - mean_v), causal=causal, block_size=(64, 128), seed=seed)
    g = q.shape[2] // k.shape[2]
    return out.float() + mean_v.repeat_interleave(g, dim=2)


def fp8_methods(causal, seed):
    af = attention_fp8
    return {
        "per-tensor": lambda q, k, v: fp8_per_tensor(q, k, v, causal),
        "per-head (FA3)": lambda q, k, v: fp8_per_head(q, k, v, causal),
        "block": lambda q, k, v: af(q, k, v, causal=causal, hadamard=False, smooth_k=False,
                                    block_size=(128, 128)),
        "block+H": lambda q, k, v: af(q, k, v, causal=causal, smooth_k=False, block_size=(128, 128),
                                      seed=seed),
        "block+H+Ks": lambda q, k, v: af(q, k, v, causal=causal, smooth_k=True, block_size=(128, 128),
                                         seed=seed),
        "block+H+Ks+Vch": lambda q, k, v: af(q, k, v, causal=causal, smooth_k=True,
                                             block_size=(128, 128), v_scale="block+channel", seed=seed),
        "q64+H+Ks": lambda q, k, v: af(q, k, v, causal=causal, smooth_k=True, block_size=(64, 128),
                                       seed=seed),
        "q64+H+Ks+Vch": lambda q, k, v: af(q, k, v, causal=causal, smooth_k=True, block_size=(64, 128),
                                           v_scale="block+channel", seed=seed),
        "q64+H+Ks+Vs (exp.)": lambda q, k, v: fp8_v_smoothed(q, k, v, causal, seed),
        "q64+H+Ks+Vch fast": lambda q, k, v: af(q, k, v, causal=causal, smooth_k=True, block_size=(64, 128),
                                                v_scale="block+channel", seed=seed, fast_accum=True),
    }


def exact_lowp(q, k, v, dtype):
    """Exact attention on inputs rounded to ``dtype``: flash3's reference backend."""
    ql, kl, vl = q.to(dtype), k.to(dtype), v.to(dtype)
    out, _ = reference.forward(ql, kl, vl, 1.0 / math.sqrt(q.shape[-1]), -1, -1, 0.0)
    return out


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


def lowp_methods():
    rows = {}
    for dt, nm in ((torch.float16, "fp16"), (torch.bfloat16, "bf16")):
        rows[f"{nm} exact"] = lambda q, k, v, dt=dt: exact_lowp(q, k, v, dt)
        rows[f"{nm} FA (P lowp)"] = lambda q, k, v, dt=dt: attention_tiled_lowp(q.to(dt), k.to(dt), v.to(dt))
        rows[f"{nm} naive"] = lambda q, k, v, dt=dt: naive_lowp(q, k, v, dt)
    return rows


def error_budget(q, k, v, ref, seed):
    """RMSE of block+H with only one of q, k, v, P rounded (the rest exact)."""
    def deq(x, rotate):
        xf = hadamard_transform(x, seed=seed) if rotate else x.float()
        x8, d = quantize_fp8(xf, block_size=128)
        return dequantize_fp8(x8, d, block_size=128)

    qh, kh = hadamard_transform(q, seed=seed), hadamard_transform(k, seed=seed)
    res = {
        "q only": rmse(attention_fp64_reference(deq(q, True), kh, v)[0], ref),
        "k only": rmse(attention_fp64_reference(qh, deq(k, True), v)[0], ref),
        "v only": rmse(attention_fp64_reference(qh, kh, deq(v, False))[0], ref),
    }
    b, s, h, d = q.shape
    hk = k.shape[2]
    perm = (lambda t: t.permute(0, 2, 1, 3))
    o, _ = _tiled_core(perm(q).reshape(b, hk, h // hk, s, d), perm(k).unsqueeze(2), perm(v).unsqueeze(2),
                       None, None, None, scale=d ** -0.5, softcap=0.0, left=-1, right=-1, br=128, bn=128,
                       kblk=128, p_dtype=FP8_DTYPE, p_offset_log2=8)
    res["P only"] = rmse(perm(o.reshape(b, h, s, -1)), ref)
    res["quadrature sum"] = math.sqrt(sum(x * x for x in res.values()))
    return res


def run_case(kind, shape, seed, causal, with_lowp, with_budget):
    q, k, v = make_inputs(kind, shape, seed)
    t0 = time.time()
    ref, _ = attention_fp64_reference(q, k, v, causal=causal)
    out = {"shape": list(shape), "causal": causal, "rmse": {}, "cosine": {}, "seconds": {}}
    out["seconds"]["fp64 reference"] = time.time() - t0
    methods = dict(fp8_methods(causal, seed))
    if with_lowp:
        methods.update(lowp_methods())
    for name, fn in methods.items():
        t = time.time()
        o = fn(q, k, v)
        out["rmse"][name] = rmse(o, ref)
        out["cosine"][name] = cosine(o, ref)
        out["seconds"][name] = time.time() - t
    base = out["rmse"][BASELINE]
    out["ratio_vs_per_tensor"] = {n: base / e for n, e in out["rmse"].items() if n in fp8_methods(causal, seed)}
    if with_budget:
        out["error_budget_block+H"] = error_budget(q, k, v, ref, seed)
    return out


def run(shape, seed, quick=False):
    b, s, h, d = shape
    cases = {"outliers": run_case("outliers", shape, seed, False, not quick, True),
             "kmean": run_case("kmean", shape, seed, False, False, False),
             "causal": run_case("outliers", (b, min(s, 1024), h, d), seed, True, False, False)}
    main = cases["outliers"]["ratio_vs_per_tensor"]
    targets = {
        f"default (q64+H+Ks) >= {TARGET_RATIO}x lower RMSE than per-tensor (outliers)":
            main["q64+H+Ks"] >= TARGET_RATIO,
        "block+H >= 1.5x lower RMSE than per-tensor (outliers)": main["block+H"] >= 1.5,
        "Hadamard helps over block alone (outliers)": main["block+H"] > main["block"],
        "K smoothing helps on kmean": (cases["kmean"]["rmse"]["block+H+Ks"]
                                       < cases["kmean"]["rmse"]["block+H"]),
    }
    return {"seed": seed, "cases": cases, "targets": targets, "paper_rmse": PAPER}


def print_table(res):
    for kind, c in res["cases"].items():
        print(f"\n== {kind}: shape (b, s, h, d) = {tuple(c['shape'])}, causal={c['causal']}, "
              f"seed {res['seed']}; error vs float64")
        print(f"{'method':<22} {'RMSE':>10} {'cos sim':>12} {'x better':>9} {'paper':>9} {'time [s]':>9}")
        for name, val in c["rmse"].items():
            paper = res["paper_rmse"].get(name) if kind == "outliers" else None
            ptxt = f"{paper:.1e}" if paper is not None else ""
            ratio = c["ratio_vs_per_tensor"].get(name)
            rtxt = f"{ratio:.2f}x" if ratio is not None else ""
            print(f"{name:<22} {val:>10.3e} {c['cosine'][name]:>12.8f} {rtxt:>9} {ptxt:>9} "
                  f"{c['seconds'][name]:>9.2f}")
        if "error_budget_block+H" in c:
            print("error budget of block+H (only that operand rounded to e4m3):")
            for name, val in c["error_budget_block+H"].items():
                print(f"  {name:<20} {val:.3e}")
    print()
    for name, ok in res["targets"].items():
        print(f"[{'PASS' if ok else 'FAIL'}] {name}")


def plot(res, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    c = res["cases"]["outliers"]
    names = list(c["rmse"].keys())
    vals = [c["rmse"][n] for n in names]
    colors = ["tab:blue" if "fp16" in n else ("tab:green" if "bf16" in n else "tab:red") for n in names]
    fig, ax = plt.subplots(figsize=(8, 5.5))
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
    ax.set_title(f"FP8 attention accuracy, outlier inputs, shape {tuple(c['shape'])}")
    ax.set_xlim(right=max(vals) * 8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default=None, help="b,s,h,d (default 1,4096,8,128; --quick: 1,256,2,64)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="small shape, no fp16/bf16 rows, no plot")
    ap.add_argument("--out", default=os.path.join(_ROOT, "benchmarks", "out"), help="output directory")
    ap.add_argument("--check", action="store_true", help="exit 1 if a target inequality fails")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    args = ap.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    shape = args.shape or ("1,256,2,64" if args.quick else "1,4096,8,128")
    shape = tuple(int(x) for x in shape.split(","))
    if len(shape) != 4 or min(shape) <= 0:
        ap.error("--shape must be four positive ints b,s,h,d")
    t0 = time.time()
    res = run(shape, args.seed, quick=args.quick)
    res["total_seconds"] = time.time() - t0
    print_table(res)
    os.makedirs(args.out, exist_ok=True)
    name = "fp8_accuracy_quick" if args.quick else "fp8_accuracy"
    with open(os.path.join(args.out, name + ".json"), "w") as f:
        json.dump(res, f, indent=2)
    if not args.quick:
        plot(res, os.path.join(args.out, name + ".png"))
    print(f"\nwrote {os.path.join(args.out, name + '.json')} ({res['total_seconds']:.1f} s)")
    if args.check and not all(res["targets"].values()):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
