"""benchmarks/bench_bwd.py without a GPU: FLOP counts, shape list, the deterministic cost, table
formatting, target evaluation, main's assembly (with stand-in measurements) and the CLI's no-GPU
exit."""
import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("bench_bwd", ROOT / "benchmarks" / "bench_bwd.py")
bench_bwd = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_bwd)


def test_flops():
    fwd = 4 * 2 * 16 * 8192 * 8192 * 128
    assert bench_bwd.bwd_flops(2, 16, 8192, 128, False) == 2.5 * fwd
    assert bench_bwd.bwd_flops(2, 16, 8192, 128, True) == 2.5 * fwd / 2
    assert bench_bwd.fwd_bwd_flops(2, 16, 8192, 128, False) == 3.5 * fwd
    assert bench_bwd.fwd_bwd_flops(1, 8, 16384, 256, True) == 3.5 * 2 * 8 * 16384 ** 2 * 256


def test_parse_args_quick_and_defaults():
    a = bench_bwd.parse_args([])
    assert a.hdims == [64, 128, 256] and a.seqlens == [512, 1024, 2048, 4096, 8192, 16384]
    assert (a.tokens, a.hidden, a.reps, a.dtype) == (16384, 2048, 20, "bf16")
    q = bench_bwd.parse_args(["--quick"])
    assert q.hdims == [128] and q.seqlens == [2048, 8192] and q.reps == 5
    cases = bench_bwd.bench_cases(q.hdims, q.seqlens, q.tokens, q.hidden)
    assert [(c["hdim"], c["causal"], c["seqlen"], c["batch"], c["heads"]) for c in cases] == [
        (128, False, 2048, 8, 16), (128, False, 8192, 2, 16), (128, True, 2048, 8, 16), (128, True, 8192, 2, 16)]
    full = bench_bwd.bench_cases(a.hdims, a.seqlens, a.tokens, a.hidden)
    assert len(full) == 3 * 2 * 6 and all(c["batch"] * c["seqlen"] == 16384 for c in full)
    assert {(c["hdim"], c["heads"]) for c in full} == {(64, 32), (128, 16), (256, 8)}


def row(causal=False, s=8192, d=128, **kw):
    r = dict(hdim=d, causal=causal, seqlen=s, batch=16384 // s, heads=2048 // d, bwd_flash3=500.0,
             bwd_flash3_det=460.0, bwd_sdpa_flash=300.0, bwd_sdpa_cudnn=450.0, fb_flash3=550.0,
             fb_sdpa_flash=330.0, fb_sdpa_cudnn=480.0)
    r.update(kw)
    return r


def test_det_cost():
    assert bench_bwd.det_cost(row()) == pytest.approx(100 * (500 / 460 - 1))
    assert bench_bwd.det_cost(row(bwd_flash3_det=500.0)) == 0.0
    assert math.isnan(bench_bwd.det_cost(row(bwd_flash3_det="n/a: no kernel")))
    assert math.isnan(bench_bwd.det_cost({}))


def test_table_with_errors():
    rows = [row(), row(causal=True, bwd_flash3="n/a: flash3._C has no backward kernel (flash3::bwd_sm90)",
                       bwd_flash3_det="n/a: x", fb_flash3="n/a: x", bwd_sdpa_cudnn="RuntimeError: boom")]
    lines = bench_bwd.table(rows).splitlines()
    assert lines[0] == ("| hdim | causal | seqlen | b x h | bwd flash3 | bwd det | bwd SDPA flash | bwd cuDNN | "
                        "det cost % | bwd/flash | bwd/cuDNN | f+b flash3 | f+b SDPA flash | f+b cuDNN |")
    assert lines[1] == "|" + "---|" * 14
    assert lines[2] == "| 128 | 0 | 8192 | 2x16 | 500 | 460 | 300 | 450 | 8.7 | 1.67 | 1.11 | 550 | 330 | 480 |"
    assert "n/a: flash3._C has no backward kernel" in lines[3] and "RuntimeError: boom" in lines[3]
    assert "| - | - | - |" in lines[3]
    assert all(ln.count("|") == 15 for ln in lines)


def test_evaluate_targets():
    res = {"rows": [row(), row(causal=True), row(s=2048, bwd_flash3=1.0),  # other shapes do not count
                    row(d=64, bwd_flash3=1.0)]}
    t = bench_bwd.evaluate_targets(res)
    assert [s for s, _ in t] == ["PASS", "PASS", "PASS"]
    assert "1.11x SDPA-cuDNN (>= 1.0)" in t[0][1] and "1.67x SDPA-flash (>= 1.5)" in t[1][1]
    assert t[2][1] == "deterministic cost, hdim 128 8k: 8.7% (<= 10%)"
    res["rows"][1]["bwd_flash3_det"] = 430.0  # causal cost 16.3%: the worse one counts
    t = bench_bwd.evaluate_targets(res)
    assert t[2] == ("MISS", "deterministic cost, hdim 128 8k: 16.3% (<= 10%)")
    res["rows"][0].update(bwd_sdpa_cudnn=520.0, bwd_sdpa_flash=400.0)
    assert [s for s, _ in bench_bwd.evaluate_targets(res)][:2] == ["MISS", "MISS"]
    res["rows"][0]["bwd_flash3"] = "n/a: no kernel"
    assert [s for s, _ in bench_bwd.evaluate_targets(res)][:2] == ["n/a", "n/a"]
    assert [s for s, _ in bench_bwd.evaluate_targets({"rows": []})] == ["n/a", "n/a", "n/a"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU path")
def test_cli_without_gpu(tmp_path):
    for argv in ([], ["--quick"]):
        p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_bwd.py"), *argv,
                            "--out", str(tmp_path)], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        assert p.stdout.startswith("bench_bwd: needs an sm_90 GPU") and p.stdout.count("\n") == 1
    assert not list(tmp_path.iterdir())
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_bwd.py"), "--help"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "--quick" in p.stdout and "--reps" in p.stdout


def test_main_assembles_table_json_and_plot(tmp_path, monkeypatch, capsys):
    def fake_row(case, fns, dtype, reps):
        assert set(fns) == set(bench_bwd.METHODS) and dtype == torch.bfloat16 and reps == 5
        if case["causal"] and case["seqlen"] == 2048:
            raise RuntimeError("CUDA out of memory\ndetails")
        return row(case["causal"], case["seqlen"])
    # The GPU check lives in bench_fp8.start_report, which bench_bwd calls.
    monkeypatch.setattr(sys.modules["bench_fp8"], "gpu_reason", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "fake H100")
    monkeypatch.setattr(bench_bwd, "measure_row", fake_row)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    assert bench_bwd.main(["--quick", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| 128 | 0 | 8192 | 2x16 | 500 | 460 | 300 | 450 | 8.7 | 1.67 | 1.11 | 550 | 330 | 480 |" in out
    assert "RuntimeError: CUDA out of memory" in out
    assert "[PASS] bwd hdim 128 bf16 8k: 1.11x SDPA-cuDNN" in out and "[PASS] deterministic cost" in out
    res = json.loads((tmp_path / "bench_bwd.json").read_text())
    assert res["device"] == "fake H100" and len(res["rows"]) == 4
    assert [t[0] for t in res["targets"]] == ["PASS", "PASS", "PASS"]
    pytest.importorskip("matplotlib")
    assert (tmp_path / "bench_bwd.png").stat().st_size > 0


def test_attention_fns_run_on_cpu():
    """The timed callables (flash3 on (b, s, h, d), SDPA on (b, h, s, d)) agree and differentiate."""
    fns = bench_bwd.attention_fns()
    q, k, v = (torch.randn(1, 64, 2, 16, requires_grad=True) for _ in range(3))
    ref = fns["flash3"](q, k, v, True)
    assert torch.equal(fns["flash3_det"](q, k, v, True), ref)
    torch.autograd.grad(ref, (q, k, v), torch.ones_like(ref))
    got = torch.nn.functional.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v)), is_causal=True)
    torch.testing.assert_close(got.transpose(1, 2), ref, rtol=1e-4, atol=1e-4)
