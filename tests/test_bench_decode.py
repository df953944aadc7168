"""benchmarks/bench_decode.py's pure parts on the CPU: bytes, cases, table, targets, argument
defaults, and main() without a GPU."""
import math
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import bench_decode as bd  # noqa: E402
from bench_fp8 import gpu_reason  # noqa: E402


def test_kv_bytes_and_cases():
    assert bd.kv_bytes(8, 8192, 8, 128, 128, 2) == 8 * 8192 * 8 * 256 * 2
    cases = bd.decode_cases([1, 8], [1024], [None, 16], ["bf16", "fp8"])
    assert len(cases) == 2 * 2 * 2 * 2 * len(bd.HEADS) // 2
    assert {c["page"] for c in cases} == {None, 16}
    assert bd.parse_pages("none,1,16") == [None, 1, 16]


def test_defaults_cover_the_issue_matrix():
    a = bd.parse_args([])
    assert a.batches == [1, 8, 64, 256] and a.caches == [1024, 8192, 32768, 131072]
    assert a.pages == [None, 1, 16, 64] and a.dtypes == ["bf16", "fp8"]
    q = bd.parse_args(["--quick"])
    assert q.batches == [8, 64] and q.reps == 20


def row(batch, cache, page, dtype, us, gbps):
    return dict(batch=batch, cache=cache, h=32, h_k=8, page=page, cache_dtype=dtype, us=us, gbps=gbps)


def test_targets_and_table():
    rows = [row(8, 8192, 16, "bf16", 10.0, 2800.0), row(64, 32768, None, "bf16", 100.0, 3000.0),
            row(1, 8192, 16, "bf16", 5.0, 100.0),  # batch 1: outside the target's range
            row(8, 8192, 1, "bf16", 50.0, 500.0),  # page 1: outside too
            row(8, 8192, 16, "fp8", 5.5, 2600.0)]
    res = {"rows": rows, "copy_gbps": 3200.0}
    text = bd.table(rows, 3200.0)
    assert "| 8 | 8192 | 32/8 | 16 | bf16 | 10.0 | 2800 | 88 | - |" in text and "contig" in text
    (s1, t1), (s2, t2) = bd.evaluate_targets(res)
    assert s1 == "PASS" and "worst 88%" in t1
    assert s2 == "PASS" and "worst 1.82x" in t2  # 10.0 us / 5.5 us
    rows[0]["gbps"] = 2000.0
    assert bd.evaluate_targets(res)[0][0] == "MISS"
    assert bd.evaluate_targets({"rows": [row(8, 8192, 16, "fp8", "n/a: x", "n/a: x")],
                                "copy_gbps": 1.0}) == [
        ("n/a", f"K/V read >= 80% of copy bandwidth (batch >= 8, cache >= 8k, page >= 16): worst {bd.fmt(math.nan, '.0f')}%"),
        ("n/a", f"FP8 cache step >= 1.7x the bf16 cache's: worst {bd.fmt(math.nan, '.2f')}x")]


def test_main_without_a_gpu(capsys, tmp_path):
    if gpu_reason() is None:
        return  # a real GPU: the device check runs it
    assert bd.main(["--quick", "--out", str(tmp_path)]) == 0
    assert "nothing measured" in capsys.readouterr().out
