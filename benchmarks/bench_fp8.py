"""FP8 forward benchmark (issue 8): TFLOP/s, quantize-kernel GB/s and accuracy on a Hopper GPU.

Throughput, in the FA3 paper's setup (bench_fwd.py): 16k tokens per batch, hidden 2048 (heads =
2048 / hdim), seqlen 512..16k, FLOPs = 4·b·h·s·s·d (half for causal), CUDA-event medians over
rotating input sets. Rows: the FP8 kernel alone on pre-quantized inputs (q, k e4m3, v packed once,
q descales per 64 rows, k/v per 128 keys), attention_fp8 end to end from bf16 (quantize kernels +
FP8 kernel), flash3 bf16, SDPA cuDNN and flash (bf16), and torch's FP8 SDPA when the installed
torch has one; cuBLAS bf16 and FP8 (torch._scaled_mm) 8192^3 GEMMs as ceilings.
Quantize GB/s: bench_quantize.py's table. Accuracy: the outlier inputs of fp8_accuracy.py at
--acc-shape, every method run through the kernel (RMSE and cosine vs float64 on the same inputs,
rounded to bf16), next to the emulation of the same method (fp8_accuracy.py's definitions, run on
the same device tensors). Prints markdown tables and the issue's targets; writes bench_fp8.json and
bench_fp8.png under --out. A case that raises records its error text instead of a number.
"""
import argparse
import contextlib
import io
import json
import math
import os
import sys

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(_HERE), _HERE]
import flash3  # noqa: E402
from flash3 import _backend, _quantize, fp8  # noqa: E402
import bench_fwd  # noqa: E402
import bench_quantize  # noqa: E402
import fp8_accuracy  # noqa: E402

Q_BLOCK, KV_BLOCK = 64, 128  # the kernel's descale blocks in the throughput rows
TARGET_SPEEDUP, TARGET_TFLOPS, TARGET_RMSE_RATIO = 1.6, 1100.0, fp8_accuracy.TARGET_RATIO
COLUMNS = (("fp8_kernel", "fp8 kernel"), ("fp8_e2e", "fp8 e2e"), ("bf16_flash3", "bf16 flash3"),
           ("sdpa_cudnn", "cuDNN"), ("sdpa_flash", "SDPA flash"), ("sdpa_fp8", "SDPA fp8"))
# kernel method -> the same method in fp8_accuracy.fp8_methods (the emulation)
EMULATION = {"per-tensor": "per-tensor", "per-head (FA3)": "per-head (FA3)", "block": "block",
             "block+H": "block+H", "block+H+Ks": "block+H+Ks", "attention_fp8 defaults": "q64+H+Ks+Vch"}
DEFAULT_METHOD = "attention_fp8 defaults"


# ------------------------------------------------------------------ pure parts (tested on the CPU)
def parse_ints(text):
    return [int(x) for x in str(text).split(",") if x.strip()]


def attn_flops(b, h, s, d, causal):
    return 4 * b * h * s * s * d / (2 if causal else 1)


def bench_cases(hdims, seqlens, tokens, hidden):
    """The throughput rows in table order: hdim, then causal False/True, then seqlen."""
    return [{"hdim": d, "causal": c, "seqlen": s, "batch": max(1, tokens // s), "heads": hidden // d}
            for d in hdims for c in (False, True) for s in seqlens]


def is_num(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def ratio(a, b):
    return a / b if is_num(a) and is_num(b) and b > 0 else float("nan")


def err_text(e, n=160):
    """'Type: first line of the message', at most n characters."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:n]


def fmt(x, spec=".0f"):
    if is_num(x):
        return format(x, spec)
    if isinstance(x, str):  # an error or a skip reason
        return x.replace("|", "/")[:40]
    return "-"


def markdown_table(headers, rows):
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows])


def parse_markdown_table(text):
    """The first markdown table in text as a list of {header: cell} dicts (bench_quantize's output)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("|")]
    if not lines:
        return []
    split = (lambda ln: [c.strip() for c in ln.strip("|").split("|")])
    head = split(lines[0])
    return [dict(zip(head, split(ln))) for ln in lines[1:] if not set(ln) <= set("|-: ")]


def throughput_table(rows):
    headers = ["hdim", "causal", "seqlen", "b x h"] + [t for _, t in COLUMNS] + ["fp8/bf16", "fp8/cuDNN"]
    body = [[r["hdim"], int(r["causal"]), r["seqlen"], f"{r['batch']}x{r['heads']}"]
            + [fmt(r.get(k)) for k, _ in COLUMNS]
            + [fmt(ratio(r.get("fp8_kernel"), r.get("bf16_flash3")), ".2f"),
               fmt(ratio(r.get("fp8_kernel"), r.get("sdpa_cudnn")), ".2f")] for r in rows]
    return markdown_table(headers, body)


def add_ratios(methods, base="per-tensor"):
    """ratio_vs_per_tensor (base RMSE / RMSE) for the kernel and the emulation columns, in place."""
    for key, out in (("rmse", "ratio"), ("emulation_rmse", "emulation_ratio")):
        b = methods.get(base, {}).get(key)
        for m in methods.values():
            m[out] = ratio(b, m.get(key))
    return methods


def accuracy_table(methods):
    headers = ["method", "RMSE (kernel)", "cosine", "x lower than per-tensor", "RMSE (emulation)",
               "x (emulation)", "RMSE (CPU json)"]
    body = [[n, fmt(m.get("rmse"), ".3e"), fmt(m.get("cosine"), ".6f"), fmt(m.get("ratio"), ".2f"),
             fmt(m.get("emulation_rmse"), ".3e"), fmt(m.get("emulation_ratio"), ".2f"),
             fmt(m.get("cpu_json_rmse"), ".3e")] for n, m in methods.items()]
    return markdown_table(headers, body)


def cpu_json_rmse(data, shape):
    """{emulation method: RMSE} of fp8_accuracy.json's outlier case when it ran at this shape."""
    case = (data or {}).get("cases", {}).get("outliers", {})
    return dict(case.get("rmse", {})) if list(case.get("shape", [])) == list(shape) else {}


def evaluate_targets(results):
    """[(PASS|MISS|n/a, text)] for the issue's targets from the results dict."""
    out = []
    r256 = [r for r in results.get("rows", []) if r["hdim"] == 256 and is_num(r.get("fp8_kernel"))]
    if r256:
        best = max(r256, key=lambda r: r["fp8_kernel"])
        where = f"(d=256 causal={int(best['causal'])} s={best['seqlen']})"
        sp = ratio(best["fp8_kernel"], best.get("bf16_flash3"))
        out.append(("n/a" if math.isnan(sp) else "PASS" if sp >= TARGET_SPEEDUP else "MISS",
                    f"FP8 hdim 256 = {sp:.2f}x our bf16 at the same shape {where} (>= {TARGET_SPEEDUP})"))
        out.append(("PASS" if best["fp8_kernel"] >= TARGET_TFLOPS else "MISS",
                    f"FP8 hdim 256 best {best['fp8_kernel']:.0f} TFLOP/s {where} (>= {TARGET_TFLOPS:.0f}, "
                    f"H100; device: {results.get('device', '?')})"))
    else:
        out.append(("n/a", "FP8 hdim 256 vs bf16 and TFLOP/s: no hdim-256 FP8 measurement"))
    m = results.get("accuracy", {}).get("methods", {}).get(DEFAULT_METHOD, {})
    rr = m.get("ratio", float("nan"))
    out.append(("n/a" if not is_num(rr) else "PASS" if rr >= TARGET_RMSE_RATIO else "MISS",
                f"{DEFAULT_METHOD} RMSE {fmt(rr, '.2f')}x lower than per-tensor through the kernel, "
                f"outliers {tuple(results.get('accuracy', {}).get('shape', ()))} (>= {TARGET_RMSE_RATIO})"))
    return out


def gpu_reason():
    """Why this machine cannot run the benchmark; None if it can."""
    if not torch.cuda.is_available():
        return "no CUDA device visible"
    if torch.cuda.get_device_capability() != (9, 0):
        return f"{torch.cuda.get_device_name()} is sm_{''.join(map(str, torch.cuda.get_device_capability()))}"
    if not flash3.has_extension():
        return "flash3._C is not built (pip install --no-build-isolation .)"
    return None


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hdims", default=None, help="default 64,128,256 (--quick: 128,256)")
    ap.add_argument("--seqlens", default=None, help="default 512,...,16384 (--quick: 2048,8192)")
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--acc-shape", default="1,4096,8,128", help="b,s,h,d of the accuracy case")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="small subset (the device check)")
    ap.add_argument("--no-accuracy", action="store_true")
    ap.add_argument("--out", default=os.path.join(_HERE, "out"))
    args = ap.parse_args(argv)
    args.hdims = parse_ints(args.hdims or ("128,256" if args.quick else "64,128,256"))
    args.seqlens = parse_ints(args.seqlens or ("2048,8192" if args.quick else "512,1024,2048,4096,8192,16384"))
    args.acc_shape = tuple(parse_ints(args.acc_shape))
    if len(args.acc_shape) != 4:
        ap.error("--acc-shape must be b,s,h,d")
    return args


# ------------------------------------------------------------------ GPU parts
def timed(flops, fn, sets):
    """TFLOP/s of fn over the rotating input sets, or the error text."""
    try:
        return flops / bench_fwd.median_ms(fn, sets) / 1e9
    except Exception as e:  # noqa: BLE001 (any failure is a table cell)
        return err_text(e)


def fp8_gemm_tflops(n=8192):
    if not hasattr(torch, "_scaled_mm"):
        return "torch has no _scaled_mm"
    a = [torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn) for _ in range(2)]
    one = torch.ones((), device="cuda")

    # _scaled_mm wants a row-major first and a column-major second operand
    def mm(x, y):
        return torch._scaled_mm(x, y.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    return timed(2 * n ** 3, mm, [(a[0], a[1]), (a[1], a[0])])


@contextlib.contextmanager
def fa3_impl():
    """torch's FA3 flash-attention impl (the one with FP8 SDPA) active only inside the block."""
    from torch.nn.attention import activate_flash_attention_impl, restore_flash_attention_impl
    activate_flash_attention_impl("FA3")
    try:
        yield
    finally:
        restore_flash_attention_impl()


def sdpa_fp8_fn():
    """torch's FP8 SDPA ((b, h, s, d) e4m3 + per-head descales) or the reason it is not usable."""
    try:
        from torch.nn.attention.experimental._scaled_dot_product_attention_quantized import \
            _scaled_dot_product_attention_quantized as sdpa_q

        def run(q, k, v, qd, kd, vd, causal):
            return sdpa_q(q, k, v, is_causal=causal, q_descale=qd, k_descale=kd, v_descale=vd)
        x = torch.randn(1, 2, 128, 128, device="cuda").to(torch.float8_e4m3fn)
        d = torch.ones(1, 2, device="cuda")
        with fa3_impl():
            run(x, x, x, d, d, d, False)
        return run, None
    except Exception as e:  # noqa: BLE001 (absent API, FA3 impl not installed, ...)
        return None, f"torch {torch.__version__} FP8 SDPA unavailable: {err_text(e)}"


def fp8_kernel_set(b, s, h, d, device="cuda"):
    """Pre-quantized inputs of the kernel-only row: q8, k8, vt (packed once), descales, and v8."""
    e4m3 = torch.float8_e4m3fn
    q8, k8, v8 = (torch.randn(b, s, h, d, device=device).to(e4m3) for _ in range(3))
    qd = torch.full((b, h, -(-s // Q_BLOCK)), 0.05, device=device)
    kd, vd = (torch.full((b, h, -(-s // KV_BLOCK)), 0.05, device=device) for _ in range(2))
    return q8, k8, fp8.pack_v_fp8(v8), qd, kd, vd, v8


def kernel_kwargs(st, scale, causal):
    """run_kernel_fwd_fp8's arguments for one fp8_kernel_set (v=None: vt is packed already)."""
    q8, k8, vt, qd, kd, vd, _ = st
    return dict(q=q8, k=k8, v=None, q_descale=qd, k_descale=kd, v_descale=vd, softmax_scale=scale,
                left=-1, right=0 if causal else -1, softcap=0.0, block_m=Q_BLOCK, block_n=KV_BLOCK, vt=vt)


def throughput_row(case, sdpa, sdpa_fp8):
    b, h, s, d, causal = case["batch"], case["heads"], case["seqlen"], case["hdim"], case["causal"]
    row, flops, scale = dict(case), attn_flops(b, h, s, d, case["causal"]), d ** -0.5
    bf = [tuple(torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3)) for _ in range(3)]
    f8 = [fp8_kernel_set(b, s, h, d) for _ in range(3)]
    reason = _backend.fp8_kernel_reason(f8[0][0], f8[0][1], f8[0][1], scale, Q_BLOCK, KV_BLOCK)
    kw = [(kernel_kwargs(st, scale, causal),) for st in f8]
    row["fp8_kernel"] = f"n/a: {reason}" if reason else timed(flops, lambda a: _backend.run_kernel_fwd_fp8(**a), kw)
    # flash3 falls back to the (slow) emulation/reference where a kernel cannot run: not timed then
    e2e_reason = reason or (None if _quantize.available() else "no quantize kernel in flash3._C")
    row["fp8_e2e"] = f"n/a: {e2e_reason}" if e2e_reason else timed(
        flops, lambda q, k, v: fp8.attention_fp8(q, k, v, causal=causal), bf)
    bf_reason = _backend.kernel_fwd_reason(*bf[0], scale)
    row["bf16_flash3"] = f"n/a: {bf_reason}" if bf_reason else timed(
        flops, lambda q, k, v: flash3.attention(q, k, v, causal=causal), bf)
    bf_t = [tuple(x.transpose(1, 2).contiguous() for x in st) for st in bf]
    for name, fn in sdpa.items():
        row["sdpa_" + name] = timed(flops, lambda q, k, v: fn(q, k, v, causal), bf_t)
    if sdpa_fp8[0] is None:
        row["sdpa_fp8"] = "skipped"
    else:
        ph = torch.full((b, h), 0.05, device="cuda")
        f8_t = [tuple(x.transpose(1, 2).contiguous() for x in (st[0], st[1], st[6])) + (ph, ph, ph) for st in f8]
        try:
            with fa3_impl():
                row["sdpa_fp8"] = timed(flops, lambda *a: sdpa_fp8[0](*a, causal), f8_t)
        except Exception as e:  # noqa: BLE001
            row["sdpa_fp8"] = err_text(e)
    del bf, bf_t, f8, kw
    torch.cuda.empty_cache()
    return row


def quantize_section(quick):
    """bench_quantize.py's table (its main, stdout captured) as rows."""
    argv = ["--dims", "128,256", "--iters", "20"] if quick else []
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            bench_quantize.main(argv)
    except Exception as e:  # noqa: BLE001
        return {"rows": [], "text": buf.getvalue() + err_text(e)}
    return {"rows": parse_markdown_table(buf.getvalue()), "text": buf.getvalue()}


def kernel_methods(seed):
    """Each accuracy method quantized with flash3.fp8 on the device tensors, then run through
    flash3.attention (q and k rotated with the same seed; v never rotated), or attention_fp8."""
    from flash3.fp8 import attention_fp8, quantize_fp8, quantize_fp8_per_tensor, quantize_v_fp8

    def per_tensor(q, k, v):
        (q8, qd), (k8, kd), (v8, vd) = (quantize_fp8_per_tensor(t) for t in (q, k, v))
        return flash3.attention(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd)

    def per_head(q, k, v):
        (q8, qd), (k8, kd), (v8, vd) = (quantize_fp8(t, block_size=None) for t in (q, k, v))
        return flash3.attention(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd)

    def block(had, smooth):  # as fp8_accuracy's: blocks of 128, v per block and per channel
        def run(q, k, v):
            q8, qd = quantize_fp8(q, block_size=128, hadamard=had, seed=seed)
            k8, kd = quantize_fp8(k, block_size=128, hadamard=had, seed=seed, smooth=smooth)[:2]
            v8, vd, vcd = quantize_v_fp8(v, block_size=128)
            return flash3.attention(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd,
                                    fp8_block_size=(128, 128), v_channel_descale=vcd)
        return run
    return {"per-tensor": per_tensor, "per-head (FA3)": per_head, "block": block(False, False),
            "block+H": block(True, False), "block+H+Ks": block(True, True),
            DEFAULT_METHOD: lambda q, k, v: attention_fp8(q, k, v, seed=seed)}


def accuracy_section(shape, seed, device="cuda"):
    q, k, v = (t.to(device, torch.bfloat16) for t in fp8_accuracy.make_inputs("outliers", shape, seed))
    ref = fp8.attention_fp64_reference(q, k, v)[0]
    reason = _backend.fp8_kernel_reason(q, k, v, shape[-1] ** -0.5, 64, 128)
    if reason is None and not _quantize.available():
        reason = "no quantize kernel: attention_fp8 emulates"
    emu = fp8_accuracy.fp8_methods(False, seed)
    cpu = {}
    path = os.path.join(_HERE, "out", "fp8_accuracy.json")
    if os.path.exists(path):
        with open(path) as f:
            cpu = cpu_json_rmse(json.load(f), shape)
    methods = {}
    for name, fn in kernel_methods(seed).items():
        m = methods[name] = {}
        try:
            out = fn(q, k, v)
            m["rmse"], m["cosine"] = fp8_accuracy.rmse(out, ref), fp8_accuracy.cosine(out, ref)
        except Exception as e:  # noqa: BLE001
            m["rmse"] = err_text(e)
        try:  # the emulation on the same (bf16-valued) inputs, as fp32 so attention_fp8 emulates
            m["emulation_rmse"] = fp8_accuracy.rmse(emu[EMULATION[name]](q.float(), k.float(), v.float()), ref)
        except Exception as e:  # noqa: BLE001
            m["emulation_rmse"] = err_text(e)
        m["cpu_json_rmse"] = cpu.get(EMULATION[name])
    return {"shape": list(shape), "seed": seed, "kernel_reason": reason, "methods": add_ratios(methods)}


def plot(res, path):
    plt = pyplot()
    if plt is None:
        return
    hdims = sorted({r["hdim"] for r in res["rows"]})
    fig, axes = plt.subplots(2, len(hdims), figsize=(5 * len(hdims), 8), squeeze=False)
    names = ("fp8_kernel", "fp8_e2e", "bf16_flash3", "sdpa_cudnn")
    for j, d in enumerate(hdims):
        for i, causal in enumerate((False, True)):
            ax, sub = axes[i][j], [r for r in res["rows"] if r["hdim"] == d and r["causal"] == causal]
            for k, name in enumerate(names):
                ax.bar([x + (k - 1.5) * 0.2 for x in range(len(sub))],
                       [r[name] if is_num(r.get(name)) else 0 for r in sub], 0.2, label=name)
            for key, style in (("gemm_bf16", "--"), ("gemm_fp8", ":")):
                if is_num(res["ceilings"].get(key)):
                    ax.axhline(res["ceilings"][key], color="gray", linestyle=style, label=key)
            ax.set_xticks(range(len(sub)), [str(r["seqlen"]) for r in sub])
            ax.set_title(f"hdim {d}, {'causal' if causal else 'non-causal'}")
            ax.set_xlabel("seqlen")
            ax.set_ylabel("TFLOP/s")
    axes[0][0].legend(fontsize=7)
    save_figure(plt, fig, path)


def pyplot():
    """matplotlib.pyplot on the Agg backend, or None (said once here) when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib missing: no plot)")
        return None
    return plt


def save_figure(plt, fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def kernel_list(configs):
    """Compiled (dtype, d, d_v) configs as sorted JSON-able ["bfloat16", d, d_v] rows."""
    return sorted([str(dt).split(".")[-1], d, dv] for dt, d, dv in configs)


def start_report(name, args):
    """The results dict (device, torch, args) with args.out created, or None after saying why this
    machine cannot run benchmark `name`."""
    reason = gpu_reason()
    if reason:
        print(f"{name}: needs an sm_90 GPU with flash3._C ({reason}); nothing measured")
        return None
    os.makedirs(args.out, exist_ok=True)
    return {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "args": vars(args)}


def measure_rows(cases, measure, columns):
    """measure(case) -> row for every case, printed as it comes; a case that raises (e.g. out of
    memory making the inputs) gets the error's text in every column."""
    rows = []
    for case in cases:
        try:
            row = measure(case)
        except Exception as e:  # noqa: BLE001
            row = dict(case, **{k: err_text(e) for k, _ in columns})
            torch.cuda.empty_cache()
        rows.append(row)
        print(f"d={row['hdim']:3d} causal={int(row['causal'])} s={row['seqlen']:5d}  "
              + "  ".join(f"{t} {fmt(row.get(k))}" for k, t in columns[:4]), flush=True)
    return rows


def save_report(res, targets_title, out, name, plot_fn):
    """Prints res["targets"] (PASS/MISS lines), writes <name>.json and <name>.png under out."""
    print(f"\n## targets ({targets_title})\n")
    for status, text in res["targets"]:
        print(f"[{status}] {text}")
    with open(os.path.join(out, f"{name}.json"), "w") as f:
        json.dump(res, f, indent=1)
    plot_fn(res, os.path.join(out, f"{name}.png"))
    print(f"\nwrote {os.path.join(out, name + '.json')}")


def main(argv=None):
    args = parse_args(argv)
    res = start_report("bench_fp8", args)
    if res is None:
        return 0
    print(f"device: {res['device']}  torch {res['torch']}  fp8 kernels {sorted(_backend.kernel_fp8_configs())}")
    try:
        gemm = bench_fwd.gemm_tflops()
    except Exception as e:  # noqa: BLE001
        gemm = err_text(e)
    res["ceilings"] = {"gemm_bf16": gemm, "gemm_fp8": fp8_gemm_tflops()}
    print(f"cuBLAS 8192^3 GEMM: bf16 {fmt(res['ceilings']['gemm_bf16'])}, "
          f"fp8 {fmt(res['ceilings']['gemm_fp8'])} TFLOP/s")
    sdpa = {name: bench_fwd.sdpa_backend(name) for name in ("cudnn", "flash")}
    sdpa_fp8 = sdpa_fp8_fn()
    if sdpa_fp8[1]:
        print(f"SDPA fp8 skipped: {sdpa_fp8[1]}")
    res["sdpa_fp8"] = sdpa_fp8[1] or "measured"
    res["rows"] = measure_rows(bench_cases(args.hdims, args.seqlens, args.tokens, args.hidden),
                               lambda case: throughput_row(case, sdpa, sdpa_fp8), COLUMNS)
    print(f"\n## FP8 forward TFLOP/s ({args.tokens} tokens per batch, hidden {args.hidden})\n\n"
          + throughput_table(res["rows"]))

    res["quantize"] = quantize_section(args.quick)
    print("\n## quantize kernel (bench_quantize.py)\n\n" + res["quantize"]["text"].strip())
    if not args.no_accuracy:
        try:
            res["accuracy"] = accuracy_section(args.acc_shape, args.seed)
            kr = res["accuracy"]["kernel_reason"]
            print(f"\n## accuracy, outliers {args.acc_shape}, vs float64 on the same bf16 inputs"
                  f"{'' if kr is None else f' (NOT the kernel: {kr})'}\n\n"
                  + accuracy_table(res["accuracy"]["methods"]))
        except Exception as e:  # noqa: BLE001
            res["accuracy"] = {"shape": list(args.acc_shape), "error": err_text(e)}
            print(f"\n## accuracy: {err_text(e)}")
    res["targets"] = evaluate_targets(res)
    save_report(res, "issue 8; a benchmark, not a test", args.out, "bench_fp8", plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
