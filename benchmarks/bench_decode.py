"""Decode benchmark: flash3.attention_with_kvcache step latency and the K/V bytes it reads per
second, against the device-to-device copy bandwidth measured in the same run (the figure of merit
of a memory-bound decode step), with torch SDPA on the contiguous cache for comparison.

Cases: batch x cache length x (h, h_k) x page size (None = contiguous) x cache dtype, hdim 128,
one query token per row, every row holding the whole cache. K/V bytes = batch * cache * h_k *
(d + d_v) * element size. Timing: CUDA-event medians. Prints a markdown table and the targets
(PASS/MISS, never asserted); writes bench_decode.json and bench_decode.png under --out. Cases
whose caches would not fit in a third of the free memory are listed as skipped.
"""
import argparse
import os
import sys

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(_HERE), _HERE]
import flash3  # noqa: E402
from flash3 import _backend  # noqa: E402
from bench_fp8 import (err_text, fmt, is_num, kernel_list, markdown_table, parse_ints, pyplot,  # noqa: E402
                       save_figure, save_report, start_report)

TARGET_COPY_FRACTION = 0.80  # batch >= 8, cache >= 8k, page >= 16 (or contiguous)
TARGET_FP8_SPEEDUP = 1.7     # FP8 cache step vs the bf16 cache step, same shape
HEADS = ((32, 8), (32, 32))
D = 128


# ------------------------------------------------------------------ pure parts (tested on the CPU)
def kv_bytes(batch, cache, h_k, d, d_v, elem_bytes):
    return batch * cache * h_k * (d + d_v) * elem_bytes


def decode_cases(batches, caches, pages, dtypes, heads=HEADS):
    return [dict(batch=b, cache=c, h=h, h_k=hk, page=p, cache_dtype=dt)
            for dt in dtypes for (h, hk) in heads for p in pages for b in batches for c in caches]


def parse_pages(text):
    return [None if x.strip().lower() in ("none", "0", "contiguous") else int(x) for x in text.split(",")]


def _key(r):
    return (r["batch"], r["cache"], r["h"], r["h_k"], r["page"])


def evaluate_targets(results):
    """[(PASS|MISS|n/a, text)]: the worst copy fraction over batch >= 8, cache >= 8k, page >= 16
    (bf16 cache), and the worst FP8/bf16 step speedup over shapes measured with both."""
    rows = results.get("rows", [])
    copy = results.get("copy_gbps")
    fr = [r["gbps"] / copy for r in rows if r["cache_dtype"] == "bf16" and is_num(r.get("gbps"))
          and is_num(copy) and r["batch"] >= 8 and r["cache"] >= 8192 and (r["page"] is None or r["page"] >= 16)]
    worst = min(fr) if fr else float("nan")
    out = [("n/a" if not fr else "PASS" if worst >= TARGET_COPY_FRACTION else "MISS",
            f"K/V read >= {TARGET_COPY_FRACTION:.0%} of copy bandwidth (batch >= 8, cache >= 8k, page >= 16): "
            f"worst {fmt(100 * worst, '.0f')}%")]
    bf16 = {_key(r): r for r in rows if r["cache_dtype"] == "bf16"}
    sp = [bf16[_key(r)]["us"] / r["us"] for r in rows if r["cache_dtype"] == "fp8" and _key(r) in bf16
          and is_num(r.get("us")) and is_num(bf16[_key(r)].get("us"))]
    w = min(sp) if sp else float("nan")
    out.append(("n/a" if not sp else "PASS" if w >= TARGET_FP8_SPEEDUP else "MISS",
                f"FP8 cache step >= {TARGET_FP8_SPEEDUP}x the bf16 cache's: worst {fmt(w, '.2f')}x"))
    return out


def table(rows, copy_gbps):
    headers = ["batch", "cache", "h/h_k", "page", "cache dtype", "step us", "K/V GB/s", "% copy", "SDPA us"]
    body = [[r["batch"], r["cache"], f"{r['h']}/{r['h_k']}", r["page"] or "contig", r["cache_dtype"],
             fmt(r.get("us"), ".1f"), fmt(r.get("gbps")),
             fmt(100 * r["gbps"] / copy_gbps, ".0f") if is_num(r.get("gbps")) and is_num(copy_gbps) else "-",
             fmt(r.get("sdpa_us"), ".1f")] for r in rows]
    return markdown_table(headers, body)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default=None, help="default 1,8,64,256 (--quick: 8,64)")
    ap.add_argument("--caches", default=None, help="default 1024,8192,32768,131072 (--quick: 8192,32768)")
    ap.add_argument("--pages", default=None, help="default none,1,16,64 (--quick: none,16,64)")
    ap.add_argument("--dtypes", default="bf16,fp8", help="cache dtypes (fp8: float8_e4m3fn)")
    ap.add_argument("--reps", type=int, default=None, help="timed calls per cell (default 50, --quick 20)")
    ap.add_argument("--quick", action="store_true", help="the device check's subset")
    ap.add_argument("--out", default=os.path.join(_HERE, "out"))
    args = ap.parse_args(argv)
    args.batches = parse_ints(args.batches or ("8,64" if args.quick else "1,8,64,256"))
    args.caches = parse_ints(args.caches or ("8192,32768" if args.quick else "1024,8192,32768,131072"))
    args.pages = parse_pages(args.pages or ("none,16,64" if args.quick else "none,1,16,64"))
    args.dtypes = [x.strip() for x in args.dtypes.split(",") if x.strip()]
    args.reps = args.reps or (20 if args.quick else 50)
    return args


# ------------------------------------------------------------------ GPU parts
def median_us(fn, reps, warmup=3):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return sorted(times)[len(times) // 2]


def copy_gbps(nbytes=2 << 30, reps=10):
    """Device-to-device copy bandwidth (bytes read + written per second), GB/s."""
    src = torch.empty(nbytes // 2, dtype=torch.int16, device="cuda")
    dst = torch.empty_like(src)
    return 2 * nbytes / median_us(lambda: dst.copy_(src), reps) / 1e3


def measure_row(case, reps):
    b, cache, h, h_k, page = case["batch"], case["cache"], case["h"], case["h_k"], case["page"]
    row = dict(case)
    fp8 = case["cache_dtype"] == "fp8"
    cdt = torch.float8_e4m3fn if fp8 else torch.bfloat16
    nbytes = kv_bytes(b, cache, h_k, D, D, 1 if fp8 else 2)
    free = torch.cuda.mem_get_info()[0]
    if nbytes > free / 3:
        row["us"] = row["gbps"] = f"skipped: {nbytes / 2**30:.0f} GiB of cache"
        return row
    q = torch.randn(b, 1, h, D, device="cuda", dtype=torch.bfloat16)
    lens = torch.full((b,), cache, device="cuda", dtype=torch.int32)
    if page is None:
        kc = torch.randn(b, cache, h_k, D, device="cuda").to(cdt)
        pt = None
    else:
        pages = b * (cache // page)
        kc = torch.randn(pages, page, h_k, D, device="cuda").to(cdt)
        pt = torch.randperm(pages, device="cuda", dtype=torch.int32).view(b, cache // page)
    vc = torch.randn_like(kc, dtype=torch.float32).to(cdt)
    kw = dict(cache_seqlens=lens, page_table=pt)
    if fp8:
        kw.update(k_descale=torch.ones(kc.shape[0], h_k, device="cuda"),
                  v_descale=torch.ones(kc.shape[0], h_k, device="cuda"))
        why = _backend.kernel_kvcache_reason(q, kc, vc, D ** -0.5)
        if why:  # the reference fallback reads the cache on the host: not a decode step to time
            row["us"] = row["gbps"] = f"n/a: {why}"
            return row
    try:
        row["us"] = median_us(lambda: flash3.attention_with_kvcache(q, kc, vc, **kw), reps)
        row["gbps"] = nbytes / row["us"] / 1e3
    except Exception as e:  # noqa: BLE001 (any failure is a table cell)
        row["us"] = row["gbps"] = err_text(e)
    if page is None and not fp8:
        try:
            qs, ks, vs = q.transpose(1, 2), kc.transpose(1, 2), vc.transpose(1, 2)
            sdpa = torch.nn.functional.scaled_dot_product_attention
            row["sdpa_us"] = median_us(lambda: sdpa(qs, ks, vs, enable_gqa=h != h_k), reps)
        except Exception as e:  # noqa: BLE001
            row["sdpa_us"] = err_text(e)
    del q, kc, vc, pt
    torch.cuda.empty_cache()
    return row


def plot(res, path):
    plt = pyplot()
    if plt is None:
        return
    rows = [r for r in res["rows"] if is_num(r.get("gbps"))]
    fig, ax = plt.subplots(figsize=(9, 4))
    for key in sorted({(r["h"], r["h_k"], r["page"] or 0, r["cache_dtype"]) for r in rows}):
        sub = [r for r in rows if (r["h"], r["h_k"], r["page"] or 0, r["cache_dtype"]) == key]
        ax.plot(range(len(sub)), [r["gbps"] for r in sub], "o-",
                label=f"h {key[0]}/{key[1]} page {key[2] or 'contig'} {key[3]}")
    if is_num(res.get("copy_gbps")):
        ax.axhline(res["copy_gbps"], color="k", ls="--", label="copy")
    ax.set_ylabel("K/V GB/s")
    ax.set_xlabel("case (batch x cache, in table order)")
    ax.legend(fontsize=6)
    save_figure(plt, fig, path)


def main(argv=None):
    args = parse_args(argv)
    res = start_report("bench_decode", args)
    if res is None:
        return 0
    res["decode_kernels"] = kernel_list(_backend.kernel_decode_configs())
    res["decode_fp8_cache_kernels"] = kernel_list(_backend.kernel_decode_configs(True))
    res["copy_gbps"] = copy_gbps()
    print(f"device: {res['device']}  torch {res['torch']}  copy {fmt(res['copy_gbps'])} GB/s")
    res["rows"] = []
    for case in decode_cases(args.batches, args.caches, args.pages, args.dtypes):
        try:
            row = measure_row(case, args.reps)
        except Exception as e:  # noqa: BLE001 (e.g. out of memory making the inputs)
            row = dict(case, us=err_text(e), gbps=err_text(e))
            torch.cuda.empty_cache()
        res["rows"].append(row)
        print(f"b={row['batch']:3d} cache={row['cache']:6d} h={row['h']}/{row['h_k']} page={row['page']} "
              f"{row['cache_dtype']}: {fmt(row.get('us'), '.1f')} us {fmt(row.get('gbps'))} GB/s", flush=True)
    print(f"\n## decode step (hdim {D}, one query token, bf16 q; copy {fmt(res['copy_gbps'])} GB/s)\n\n"
          + table(res["rows"], res["copy_gbps"]))
    res["targets"] = evaluate_targets(res)
    save_report(res, "issue 9; a benchmark, not a test", args.out, "bench_decode", plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
