"""benchmarks/bench_fp8.py without a GPU: FLOP count, shape list, table formatting, the markdown
parser for bench_quantize's output, the accuracy ratios, target evaluation, and the CLI's
no-GPU exit."""
import importlib.util
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("bench_fp8", ROOT / "benchmarks" / "bench_fp8.py")
bench_fp8 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_fp8)


def test_flops_and_cases():
    assert bench_fp8.attn_flops(2, 16, 8192, 128, False) == 4 * 2 * 16 * 8192 * 8192 * 128
    assert bench_fp8.attn_flops(2, 16, 8192, 128, True) == 2 * 2 * 16 * 8192 * 8192 * 128
    cases = bench_fp8.bench_cases([64, 256], [512, 16384, 32768], 16384, 2048)
    assert len(cases) == 2 * 2 * 3
    assert [(c["hdim"], c["causal"], c["seqlen"]) for c in cases[:4]] == [
        (64, False, 512), (64, False, 16384), (64, False, 32768), (64, True, 512)]
    c = cases[0]
    assert (c["batch"], c["heads"]) == (32, 32)  # 16k tokens / 512, 2048 / 64
    assert cases[-1]["batch"] == 1 and cases[-1]["heads"] == 8  # never batch 0
    assert all(c["batch"] * c["seqlen"] == 16384 for c in cases if c["seqlen"] <= 16384)


def test_parse_args_quick_and_defaults():
    a = bench_fp8.parse_args([])
    assert a.hdims == [64, 128, 256] and a.seqlens == [512, 1024, 2048, 4096, 8192, 16384]
    assert a.acc_shape == (1, 4096, 8, 128) and a.tokens == 16384 and a.hidden == 2048
    q = bench_fp8.parse_args(["--quick", "--seqlens", "1024"])
    assert q.hdims == [128, 256] and q.seqlens == [1024]
    with pytest.raises(SystemExit):
        bench_fp8.parse_args(["--acc-shape", "1,2,3"])


def test_ratio_fmt_err_text():
    assert bench_fp8.ratio(3.0, 2.0) == 1.5
    for a, b in ((1.0, 0.0), ("RuntimeError: x", 2.0), (1.0, None), (float("nan"), 1.0), (1.0, True)):
        assert math.isnan(bench_fp8.ratio(a, b))
    assert bench_fp8.fmt(1234.56) == "1235" and bench_fp8.fmt(0.5, ".2f") == "0.50"
    assert bench_fp8.fmt(None) == "-" and bench_fp8.fmt(float("nan")) == "-"
    assert bench_fp8.fmt("a|b" * 30) == ("a/b" * 30)[:40]  # no column breaks, bounded width
    e = bench_fp8.err_text(RuntimeError("CUDA error: out of memory\nmore lines\n"))
    assert e == "RuntimeError: CUDA error: out of memory"
    assert len(bench_fp8.err_text(ValueError("x" * 500))) == 160


def test_throughput_table_with_errors():
    rows = [dict(hdim=256, causal=False, seqlen=8192, batch=2, heads=8, fp8_kernel=1200.0, fp8_e2e=900.0,
                 bf16_flash3=700.0, sdpa_cudnn=600.0, sdpa_flash=400.0, sdpa_fp8="skipped"),
            dict(hdim=256, causal=True, seqlen=8192, batch=2, heads=8, fp8_kernel="RuntimeError: boom",
                 bf16_flash3=650.0)]
    lines = bench_fp8.throughput_table(rows).splitlines()
    assert lines[0].startswith("| hdim | causal | seqlen | b x h | fp8 kernel |")
    assert lines[1] == "|" + "---|" * 12
    assert lines[2] == "| 256 | 0 | 8192 | 2x8 | 1200 | 900 | 700 | 600 | 400 | skipped | 1.71 | 2.00 |"
    assert "RuntimeError: boom" in lines[3] and lines[3].endswith("| - | - |")
    assert all(ln.count("|") == 13 for ln in lines)


def test_parse_markdown_table_of_bench_quantize_output():
    text = ("device: H100; b=1 s=4096 h=16 block_size=128, bf16 input\n\n"
            "| d | hadamard | layout | kernel ms | kernel GB/s | copy GB/s | kernel / copy |\n"
            "|---|---|---|---|---|---|---|\n"
            "| 128 | False | rows | 0.0100 | 2750 | 3000 | 92% |\n"
            "| 128 | True | v_packed | 0.0120 | 2500 | 3000 | 83% |\n")
    rows = bench_fp8.parse_markdown_table(text)
    assert len(rows) == 2
    assert rows[0] == {"d": "128", "hadamard": "False", "layout": "rows", "kernel ms": "0.0100",
                       "kernel GB/s": "2750", "copy GB/s": "3000", "kernel / copy": "92%"}
    assert rows[1]["layout"] == "v_packed"
    assert bench_fp8.parse_markdown_table("bench_quantize: needs a CUDA GPU; nothing measured") == []


def test_accuracy_ratios_table_and_cpu_json():
    methods = {"per-tensor": {"rmse": 0.02, "cosine": 0.9990, "emulation_rmse": 0.0205},
               "block": {"rmse": 0.01, "cosine": 0.9998, "emulation_rmse": 0.0082},
               bench_fp8.DEFAULT_METHOD: {"rmse": "RuntimeError: no kernel", "emulation_rmse": 0.0091}}
    bench_fp8.add_ratios(methods)
    assert methods["per-tensor"]["ratio"] == 1.0 and methods["block"]["ratio"] == pytest.approx(2.0)
    assert methods["block"]["emulation_ratio"] == pytest.approx(2.5)
    assert math.isnan(methods[bench_fp8.DEFAULT_METHOD]["ratio"])
    lines = bench_fp8.accuracy_table(methods).splitlines()
    assert lines[3].startswith("| block | 1.000e-02 | 0.999800 | 2.00 | 8.200e-03 | 2.50 | - |")
    assert "RuntimeError: no kernel" in lines[4]
    data = {"cases": {"outliers": {"shape": [1, 4096, 8, 128], "rmse": {"per-tensor": 0.0205}}}}
    assert bench_fp8.cpu_json_rmse(data, (1, 4096, 8, 128)) == {"per-tensor": 0.0205}
    assert bench_fp8.cpu_json_rmse(data, (1, 256, 2, 64)) == {}
    assert bench_fp8.cpu_json_rmse(None, (1, 4096, 8, 128)) == {}
    # every kernel method has an emulation counterpart in fp8_accuracy.py
    assert set(bench_fp8.EMULATION.values()) <= set(bench_fp8.fp8_accuracy.fp8_methods(False, 0))


def test_evaluate_targets():
    def row(causal, s, f8, bf):
        return dict(hdim=256, causal=causal, seqlen=s, batch=1, heads=8, fp8_kernel=f8, bf16_flash3=bf)
    res = {"device": "NVIDIA H100 80GB HBM3",
           "rows": [row(False, 8192, 1150.0, 700.0), row(True, 8192, 1000.0, 500.0),
                    row(False, 2048, "RuntimeError: x", 600.0),
                    dict(row(False, 8192, 5000.0, 100.0), hdim=128)],  # other hdims do not count
           "accuracy": {"shape": [1, 4096, 8, 128],
                        "methods": {bench_fp8.DEFAULT_METHOD: {"ratio": 2.2}}}}
    t = bench_fp8.evaluate_targets(res)
    assert [s for s, _ in t] == ["PASS", "PASS", "MISS"]  # best row: 1150 / 700 = 1.64x
    assert "1.64x" in t[0][1] and "causal=0 s=8192" in t[0][1] and "1150 TFLOP/s" in t[1][1]
    assert "2.20x" in t[2][1] and "(1, 4096, 8, 128)" in t[2][1]
    res["rows"][0]["fp8_kernel"] = 1050.0  # best is now 1050 / 700 = 1.50x
    assert [s for s, _ in bench_fp8.evaluate_targets(res)][:2] == ["MISS", "MISS"]
    res["rows"][0]["bf16_flash3"] = "RuntimeError: y"
    assert bench_fp8.evaluate_targets(res)[0][0] == "n/a"
    t = bench_fp8.evaluate_targets({"rows": [], "accuracy": {}})
    assert [s for s, _ in t] == ["n/a", "n/a"]
    acc = {"methods": {bench_fp8.DEFAULT_METHOD: {"ratio": 2.6}}}
    t = bench_fp8.evaluate_targets({"rows": [], "accuracy": acc})
    assert t[-1][0] == "PASS"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU path")
def test_cli_without_gpu(tmp_path):
    for argv in ([], ["--quick"]):
        p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_fp8.py"), *argv,
                            "--out", str(tmp_path)], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        assert p.stdout.startswith("bench_fp8: needs an sm_90 GPU") and p.stdout.count("\n") == 1
    assert not list(tmp_path.iterdir())  # nothing written
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_fp8.py"), "--help"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "--no-accuracy" in p.stdout and "--acc-shape" in p.stdout


def test_kernel_row_inputs_match_the_kernel_convention():
    """The kernel-only row's pre-quantized set: descales per 64 q rows / 128 keys, v packed once, and
    keyword arguments that bind to flash3._backend.run_kernel_fwd_fp8 (run here on the reference)."""
    import inspect

    import flash3
    from flash3 import _backend
    b, s, h, d = 1, 200, 2, 64
    st = bench_fp8.fp8_kernel_set(b, s, h, d, device="cpu")
    q8, k8, vt, qd, kd, vd, v8 = st
    assert q8.dtype == k8.dtype == v8.dtype == vt.dtype == torch.float8_e4m3fn
    assert qd.shape == (b, h, 4) and kd.shape == vd.shape == (b, h, 2)
    assert torch.equal(vt.view(torch.uint8), bench_fp8.fp8.pack_v_fp8(v8).view(torch.uint8))
    kw = bench_fp8.kernel_kwargs(st, d ** -0.5, causal=True)
    inspect.signature(_backend.run_kernel_fwd_fp8).bind(**kw)
    assert (kw["left"], kw["right"], kw["softcap"], kw["block_m"], kw["block_n"]) == (-1, 0, 0.0, 64, 128)
    assert bench_fp8.kernel_kwargs(st, 1.0, causal=False)["right"] == -1
    out = flash3.attention(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd, causal=True,
                           fp8_block_size=(kw["block_m"], kw["block_n"]))
    assert out.shape == (b, s, h, d) and torch.isfinite(out.float()).all()


def test_accuracy_section_on_cpu():
    """Every method's plumbing (per-tensor/per-head/block descales, q and k rotated with the same
    seed, K smoothing, v channel descales) on the CPU, where flash3.attention's FP8 path is the
    emulation: each method's RMSE must match fp8_accuracy's emulation of the same method."""
    acc = bench_fp8.accuracy_section((1, 256, 2, 64), seed=3, device="cpu")
    assert acc["kernel_reason"] == "inputs are not CUDA tensors"
    m = acc["methods"]
    assert list(m) == list(bench_fp8.EMULATION)
    for name, r in m.items():
        assert isinstance(r["rmse"], float) and isinstance(r["emulation_rmse"], float), (name, r)
        assert r["rmse"] == pytest.approx(r["emulation_rmse"], rel=0.05), name
        assert 0.99 < r["cosine"] <= 1.0
    assert m["per-tensor"]["ratio"] == 1.0
    assert m["block+H"]["rmse"] < m["block"]["rmse"]  # the rotation helps on outliers (seeds agree)


def test_main_assembles_tables_json_and_plot(tmp_path, monkeypatch, capsys):
    """main() end to end with the GPU measurements replaced by stand-ins (the accuracy section runs
    for real on the CPU at a small shape): tables, targets, bench_fp8.json, bench_fp8.png."""
    import json

    def fake_row(case, sdpa, sdpa_fp8):
        if case["causal"]:
            raise RuntimeError("CUDA out of memory\ndetails")
        return dict(case, fp8_kernel=1200.0, fp8_e2e=1000.0, bf16_flash3=700.0, sdpa_cudnn=650.0,
                    sdpa_flash=500.0, sdpa_fp8="skipped")
    real_acc = bench_fp8.accuracy_section
    monkeypatch.setattr(bench_fp8, "gpu_reason", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "fake H100")
    monkeypatch.setattr(bench_fp8.bench_fwd, "gemm_tflops", lambda: 750.0)
    monkeypatch.setattr(bench_fp8, "fp8_gemm_tflops", lambda: 1400.0)
    monkeypatch.setattr(bench_fp8, "sdpa_fp8_fn", lambda: (None, "no FP8 SDPA here"))
    monkeypatch.setattr(bench_fp8, "throughput_row", fake_row)
    monkeypatch.setattr(bench_fp8, "quantize_section", lambda quick: {"rows": [], "text": "no quantize"})
    monkeypatch.setattr(bench_fp8, "accuracy_section", lambda shape, seed: real_acc(shape, seed, device="cpu"))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    assert bench_fp8.main(["--quick", "--acc-shape", "1,128,2,64", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| 256 | 0 | 8192 | 2x8 | 1200 | 1000 | 700 | 650 | 500 | skipped | 1.71 | 1.85 |" in out
    assert "RuntimeError: CUDA out of memory" in out and "SDPA fp8 skipped: no FP8 SDPA here" in out
    assert "(NOT the kernel: inputs are not CUDA tensors)" in out
    assert "[PASS] FP8 hdim 256 = 1.71x our bf16" in out and "[PASS] FP8 hdim 256 best 1200 TFLOP/s" in out
    res = json.loads((tmp_path / "bench_fp8.json").read_text())
    assert len(res["rows"]) == 8 and res["ceilings"] == {"gemm_bf16": 750.0, "gemm_fp8": 1400.0}
    assert set(res["accuracy"]["methods"]) == set(bench_fp8.EMULATION)
    assert [t[0] for t in res["targets"]][:2] == ["PASS", "PASS"]
    pytest.importorskip("matplotlib")
    assert (tmp_path / "bench_fp8.png").stat().st_size > 0
