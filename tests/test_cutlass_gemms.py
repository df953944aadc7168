"""CUTLASS's validation GEMMs timed on a lent GPU, without one: tools/device/cutlass_gemms.py's
parsing of the examples' own output and of Nsight Compute's CSV, its run against stand-in binaries,
and how tools/hopper_sim/perf_model.py's validation table takes a lease's measurements. Expected
numbers are worked by hand from the inputs below."""

import json
import os
import stat
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools" / "device"))
sys.path.insert(0, str(ROOT / "tools" / "hopper_sim"))
import cutlass_gemms as cg  # noqa: E402
import perf_model as pm  # noqa: E402

# What example 48 prints (48_hopper_warp_specialized_gemm.cu: "Disposition", then the timing lines).
OUT_48 = """  Disposition: Passed
  Problem Size: 4096x4096x4096x1
  Rasterization: Heuristic with a maximum CTA swizzle of 1
  Avg runtime: 0.3 ms
  GFLOPS: 458129
"""
# ncu --csv --metrics gpu__time_duration.sum, two kernels (units as ncu writes them).
NCU_CSV = '''==PROF== Connected to process 1234
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","1234","49","host","void cutlass::device_kernel<GemmUniversal<A>>(Params)","1","7","(384, 1, 1)","(132, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","usecond","200.00"
"1","1234","49","host","void cutlass::device_kernel<GemmUniversal<B>>(Params)","1","7","(384, 1, 1)","(132, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","msecond","1.60"
'''


def test_parsers():
    assert cg.gflops_lines(OUT_48) == [458129.0]
    assert cg.gflops_lines("GFLOPS: 1\nnoise GFLOPS: 2\n  GFLOPS: 3.5\n") == [1.0, 3.5]
    assert cg.ncu_durations_ns(NCU_CSV) == [200e3, 1.6e6]
    assert cg.ncu_durations_ns("==ERROR== LibraryNotLoaded\n") == []
    # 2 * 4096^3 = 137438953472 FLOP in 200 us: 687.19 TFLOP/s
    assert abs(cg.tflops_of(4096, 200e3) - 687.19476736) < 1e-6
    assert cg.example_args("48_x", 8192) == ["--m=8192", "--n=8192", "--k=8192", "--iterations=100"]
    assert cg.example_args("54_x", 4096) == ["--m=4096", "--n=4096", "--k=4096", "--l=1"]


def fake(path, text, rc=0):
    path.write_text(f"#!/bin/sh\ncat <<'EOF'\n{text}EOF\nexit {rc}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_run_with_stand_ins(tmp_path, monkeypatch):
    bins = tmp_path / "bins"
    bins.mkdir()
    fake(bins / "48", OUT_48)
    fake(bins / "54", "unused\n")
    fake(bins / "49", "unused\n")
    # ncu stand-in: prints the two-kernel CSV whatever it profiles.
    tools = tmp_path / "tools"
    tools.mkdir()
    fake(tools / "ncu", NCU_CSV)
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    out = tmp_path / "r.json"
    assert cg.run(str(bins), str(out), 60.0) == 0
    rec = json.loads(out.read_text())
    got = [(r["example"], r["n"], r["launch"], round(r["tflops"], 3)) for r in rec["rows"]]
    # 48 at both sizes from its GFLOPS line (458129 GFLOPS = 458.129 TFLOP/s); 54, then 49 from ncu's
    # two durations each: 2 n^3 / 200 us and 2 n^3 / 1.6 ms (n 4096: 687.195, 85.899; n 8192: 5497.558, 687.195).
    assert got == [("48", 4096, 1, 458.129), ("48", 8192, 1, 458.129),
                   ("54", 4096, 1, 687.195), ("54", 4096, 2, 85.899), ("54", 8192, 1, 5497.558), ("54", 8192, 2, 687.195),
                   ("49", 4096, 1, 687.195), ("49", 4096, 2, 85.899), ("49", 8192, 1, 5497.558), ("49", 8192, 2, 687.195)]
    assert rec["notes"] == []


def test_run_reports_a_failed_verification(tmp_path, monkeypatch):
    bins = tmp_path / "bins"
    bins.mkdir()
    fake(bins / "48", "  Disposition: Failed\n", rc=255)
    monkeypatch.setenv("PATH", str(tmp_path))  # no ncu
    assert cg.run(str(bins), str(tmp_path / "r.json"), 60.0) == 1
    notes = json.loads((tmp_path / "r.json").read_text())["notes"]
    assert notes[0].startswith("48 4096^3: rc 255") and notes[1].startswith("48 8192^3: rc 255")
    assert any("54: no binary" in n for n in notes) and any("49: no binary" in n for n in notes)


def test_validation_rows_take_the_measurement(tmp_path):
    f = tmp_path / "m.json"
    f.write_text(json.dumps({"rows": [{"example": "49", "n": 8192, "launch": 6, "tflops": 700.0},
                                      {"example": "48", "n": 4096, "launch": 1, "tflops": 400.0}],
                             "gpu": "NVIDIA H200", "date": "2026-12-02"}))
    measured, src = pm.cutlass_measured(f)
    assert measured == {("49", "8192^3", 6): 700.0, ("48", "4096^3", 1): 400.0}
    assert "NVIDIA H200" in src and "2026-12-02" in src
    g49 = dict(kernel="CUTLASS 49 fp16 Cooperative (launch 6 of 7)", size="8192^3", model=790.0, peak=989.4)
    g48 = dict(kernel="CUTLASS 48 tf32 Cooperative", size="4096^3", model=471.0, peak=494.7)
    g49b = dict(kernel="CUTLASS 49 fp16 Cooperative (launch 1 of 7)", size="8192^3", model=775.0, peak=989.4)
    assert pm.gemm_reference(g49, 790.0, measured, src) == (700.0, src)
    assert pm.gemm_reference(g48, 790.0, measured, src) == (400.0, src)
    assert pm.gemm_reference(g49b, 790.0, measured, src) == (None, "dense peak 989.4")
    # Without a measurement: cuBLAS beside the best fp16 row at 8192^3, as before.
    ref, why = pm.gemm_reference(g49, 790.0, {}, "")
    assert ref == 780.0 and why.startswith("cuBLAS")
    assert pm.cutlass_measured(tmp_path / "absent.json") == ({}, "")
