"""Backward benchmark: backward and forward+backward TFLOP/s of flash3 vs torch SDPA (flash and
cuDNN backends) on a Hopper GPU, all in one run, plus flash3's deterministic mode and its cost.

The FA3 paper's setup (bench_fwd.py): 16k tokens per batch, hidden 2048 (heads = 2048 / hdim),
seqlen 512..16k. FLOPs: forward 4·b·h·s·s·d (half for causal), backward 2.5 x that, forward +
backward 3.5 x. The backward is timed as torch.autograd.grad over a kept graph (the same for every
method), CUDA-event medians over rotating input sets. Prints a markdown table and the targets
(PASS/MISS, never asserted); writes bench_bwd.json and bench_bwd.png under --out. A case that
raises records its error text instead of a number; flash3 cells where a kernel cannot run say why
(the reference fallback is not timed).
"""
import argparse
import os
import sys

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(_HERE), _HERE]
import flash3  # noqa: E402
from flash3 import _backend  # noqa: E402
import bench_fwd  # noqa: E402
from bench_fp8 import (attn_flops, bench_cases, err_text, fmt, is_num, kernel_list,  # noqa: E402
                       markdown_table, measure_rows, parse_ints, pyplot, ratio, save_figure, save_report, start_report)

BWD_FACTOR, FWD_BWD_FACTOR = 2.5, 3.5
TARGET_CUDNN, TARGET_FLASH, TARGET_DET_COST = 1.0, 1.5, 10.0  # bwd d128 8k; deterministic cost in %
METHODS = ("flash3", "flash3_det", "sdpa_flash", "sdpa_cudnn")
COLUMNS = (("bwd_flash3", "bwd flash3"), ("bwd_flash3_det", "bwd det"), ("bwd_sdpa_flash", "bwd SDPA flash"),
           ("bwd_sdpa_cudnn", "bwd cuDNN"), ("fb_flash3", "f+b flash3"), ("fb_sdpa_flash", "f+b SDPA flash"),
           ("fb_sdpa_cudnn", "f+b cuDNN"))


# ------------------------------------------------------------------ pure parts (tested on the CPU)
def bwd_flops(b, h, s, d, causal):
    return BWD_FACTOR * attn_flops(b, h, s, d, causal)


def fwd_bwd_flops(b, h, s, d, causal):
    return FWD_BWD_FACTOR * attn_flops(b, h, s, d, causal)


def det_cost(row):
    """Deterministic mode's cost in % of the default backward's time (TFLOP/s ratio - 1)."""
    r = ratio(row.get("bwd_flash3"), row.get("bwd_flash3_det"))
    return 100.0 * (r - 1.0) if is_num(r) else float("nan")


def table(rows):
    headers = (["hdim", "causal", "seqlen", "b x h"] + [t for _, t in COLUMNS[:4]]
               + ["det cost %", "bwd/flash", "bwd/cuDNN"] + [t for _, t in COLUMNS[4:]])
    body = [[r["hdim"], int(r["causal"]), r["seqlen"], f"{r['batch']}x{r['heads']}"]
            + [fmt(r.get(k)) for k, _ in COLUMNS[:4]]
            + [fmt(det_cost(r), ".1f"), fmt(ratio(r.get("bwd_flash3"), r.get("bwd_sdpa_flash")), ".2f"),
               fmt(ratio(r.get("bwd_flash3"), r.get("bwd_sdpa_cudnn")), ".2f")]
            + [fmt(r.get(k)) for k, _ in COLUMNS[4:]] for r in rows]
    return markdown_table(headers, body)


def _status(x, ok):
    return "n/a" if not is_num(x) else "PASS" if ok(x) else "MISS"


def evaluate_targets(results):
    """[(PASS|MISS|n/a, text)]: backward hdim 128 at 8k (non-causal) vs cuDNN and SDPA-flash, and
    the deterministic cost at hdim 128 8k (the worse of causal / non-causal)."""
    rows = results.get("rows", [])
    pick = {(r["hdim"], r["causal"], r["seqlen"]): r for r in rows}
    r = pick.get((128, False, 8192), {})
    out = []
    for key, name, target in (("bwd_sdpa_cudnn", "SDPA-cuDNN", TARGET_CUDNN),
                              ("bwd_sdpa_flash", "SDPA-flash", TARGET_FLASH)):
        x = ratio(r.get("bwd_flash3"), r.get(key))
        out.append((_status(x, lambda v, t=target: v >= t),
                    f"bwd hdim 128 bf16 8k: {fmt(x, '.2f')}x {name} (>= {target})"))
    costs = [det_cost(pick[(128, c, 8192)]) for c in (False, True) if (128, c, 8192) in pick]
    costs = [c for c in costs if is_num(c)]
    worst = max(costs) if costs else float("nan")
    out.append((_status(worst, lambda v: v <= TARGET_DET_COST),
                f"deterministic cost, hdim 128 8k: {fmt(worst, '.1f')}% (<= {TARGET_DET_COST:.0f}%)"))
    return out


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hdims", default=None, help="default 64,128,256 (--quick: 128)")
    ap.add_argument("--seqlens", default=None, help="default 512,...,16384 (--quick: 2048,8192)")
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--reps", type=int, default=None, help="timed calls per cell (default 20, --quick 5)")
    ap.add_argument("--quick", action="store_true", help="hdim 128, 2k and 8k, few reps (the device check)")
    ap.add_argument("--out", default=os.path.join(_HERE, "out"))
    args = ap.parse_args(argv)
    args.hdims = parse_ints(args.hdims or ("128" if args.quick else "64,128,256"))
    args.seqlens = parse_ints(args.seqlens or ("2048,8192" if args.quick else "512,1024,2048,4096,8192,16384"))
    args.reps = args.reps or (5 if args.quick else 20)
    return args


# ------------------------------------------------------------------ GPU parts
def attention_fns():
    """name -> f(q, k, v, causal) -> out; flash3 on (b, s, h, d), SDPA on (b, h, s, d)."""
    sdpa = {name: bench_fwd.sdpa_backend(name) for name in ("flash", "cudnn")}
    return {"flash3": lambda q, k, v, causal: flash3.attention(q, k, v, causal=causal),
            "flash3_det": lambda q, k, v, causal: flash3.attention(q, k, v, causal=causal, deterministic=True),
            "sdpa_flash": sdpa["flash"], "sdpa_cudnn": sdpa["cudnn"]}


def timed(flops, fn, sets, reps):
    """TFLOP/s of fn over the rotating input sets, or the error text."""
    try:
        return flops / bench_fwd.median_ms(fn, sets, warmup=2, reps=reps) / 1e9
    except Exception as e:  # noqa: BLE001 (any failure is a table cell)
        return err_text(e)


def measure_row(case, fns, dtype, reps):
    b, h, s, d, causal = case["batch"], case["heads"], case["seqlen"], case["hdim"], case["causal"]
    row = dict(case)
    f_bwd, f_fb = bwd_flops(b, h, s, d, causal), fwd_bwd_flops(b, h, s, d, causal)
    base = [[torch.randn(b, s, h, d, device="cuda", dtype=dtype) for _ in range(4)] for _ in range(2)]
    scale = d ** -0.5
    why = {"flash3": _backend.kernel_bwd_reason(*base[0][:3], scale)
           or _backend.kernel_fwd_reason(*base[0][:3], scale)}
    why["flash3_det"] = why["flash3"]
    for name in METHODS:
        fn = fns[name]
        if why.get(name):
            row["bwd_" + name] = f"n/a: {why[name]}"
            if name == "flash3":
                row["fb_" + name] = row["bwd_" + name]
            continue
        sdpa = name.startswith("sdpa")
        sets = []
        for st in base:
            q, k, v, dout = (x.transpose(1, 2).contiguous() if sdpa else x for x in st)
            sets.append([x.detach().requires_grad_() for x in (q, k, v)] + [dout])
        try:  # backward only: autograd.grad over a kept graph of one forward per set
            graphs = [(q, k, v, fn(q, k, v, causal), dout) for q, k, v, dout in sets]
            row["bwd_" + name] = timed(f_bwd, lambda q, k, v, o, g: torch.autograd.grad(
                o, (q, k, v), g, retain_graph=True), graphs, reps)
        except Exception as e:  # noqa: BLE001 (the forward itself failed)
            row["bwd_" + name] = err_text(e)
        graphs = None
        if name != "flash3_det":
            row["fb_" + name] = timed(f_fb, lambda q, k, v, g: torch.autograd.grad(
                fn(q, k, v, causal), (q, k, v), g), sets, reps)
        del sets
        torch.cuda.empty_cache()
    return row


def plot(res, path):
    plt = pyplot()
    if plt is None:
        return
    hdims = sorted({r["hdim"] for r in res["rows"]})
    panels = [(p, c) for p in ("bwd", "fb") for c in (False, True)]
    fig, axes = plt.subplots(len(panels), len(hdims), figsize=(5 * len(hdims), 3.5 * len(panels)), squeeze=False)
    for j, d in enumerate(hdims):
        for i, (part, causal) in enumerate(panels):
            ax, sub = axes[i][j], [r for r in res["rows"] if r["hdim"] == d and r["causal"] == causal]
            names = [k for k, _ in COLUMNS if k.startswith(part + "_")]
            w = 0.8 / len(names)
            for n, name in enumerate(names):
                ax.bar([x + (n - (len(names) - 1) / 2) * w for x in range(len(sub))],
                       [r[name] if is_num(r.get(name)) else 0 for r in sub], w, label=name)
            ax.set_xticks(range(len(sub)), [str(r["seqlen"]) for r in sub])
            ax.set_title(f"{'backward' if part == 'bwd' else 'fwd+bwd'}, hdim {d}, "
                         f"{'causal' if causal else 'non-causal'}")
            ax.set_xlabel("seqlen")
            ax.set_ylabel("TFLOP/s")
            if j == 0:
                ax.legend(fontsize=7)
    save_figure(plt, fig, path)


def main(argv=None):
    args = parse_args(argv)
    res = start_report("bench_bwd", args)
    if res is None:
        return 0
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    res["bwd_kernels"] = kernel_list(_backend.kernel_bwd_configs())
    print(f"device: {res['device']}  torch {res['torch']}  bwd kernels {res['bwd_kernels']}")
    fns = attention_fns()
    res["rows"] = measure_rows(bench_cases(args.hdims, args.seqlens, args.tokens, args.hidden),
                               lambda case: measure_row(case, fns, dtype, args.reps), COLUMNS)
    print(f"\n## backward / fwd+bwd TFLOP/s ({args.dtype}, {args.tokens} tokens per batch, hidden "
          f"{args.hidden}; bwd FLOPs = {BWD_FACTOR} x fwd)\n\n" + table(res["rows"]))
    res["targets"] = evaluate_targets(res)
    save_report(res, "a benchmark, not a test", args.out, "bench_bwd", plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
