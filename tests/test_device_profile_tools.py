"""tools/device/stall_sites.py (where Nsight Compute's warp stall samples fell, per SASS instruction) and
tools/device/head_to_head.py (FA3 and flash3 timed alike, in turns) without a GPU: a hand-written
source-page CSV, a fake FA3 driver and a stand-in for flash3's timing. Expected numbers are counted by
hand from the inputs below."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools" / "device"))
import head_to_head  # noqa: E402
import stall_sites  # noqa: E402

# Seven SASS lines: a prologue, the consumer loop (the HGMMA at 0x20 to the MUFU.EX2 at 0x50) and an
# epilogue; 100 samples in all, 80 of them in the loop.
SOURCE_CSV = '''"Kernel Name","fwd_kernel"
"# Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)","stall_long_sb","stall_wait","stall_math"
"0x00000000","S2R R0, SR_TID.X","5","5","5","0","0"
"0x00000010","SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R2","10","10","10","0","0"
"0x00000020","HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], RZ, !UPT","20","18","0","2","16"
"0x00000030","@!P0 BRA 0x10","30","30","30","0","0"
"0x00000040","FMNMX.FTZ R4, R24, R25, !PT","10","8","0","8","0"
"0x00000050","MUFU.EX2 R24, R24","20","15","0","5","10"
"0x00000060","EXIT","5","5","0","0","0"
'''


def test_stall_sites_top_instructions_and_loop_totals(tmp_path, capsys):
    f = tmp_path / "source_flash3.csv"
    f.write_text(SOURCE_CSV)
    assert stall_sites.main([str(f), "--name", "flash3", "--top", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "== flash3: 7 SASS lines, 100 warp samples (Warp Stall Sampling (All Samples))"
    # The two lines with the most samples: the BRA (30, all long scoreboard), then the HGMMA (20) or
    # the MUFU (20; the sort is stable: the HGMMA comes first).
    assert "0x00000030" in out[1] and "30.0%" in out[1] and "stall_long_sb 30" in out[1]
    assert "0x00000020" in out[2] and "stall_math 16, stall_wait 2" in out[2]
    # All lines: long_sb 5 + 10 + 30 = 45, math 16 + 10 = 26, wait 2 + 8 + 5 = 15.
    assert out[3] == "  samples by reason, all (100): stall_long_sb 45, stall_math 26, stall_wait 15"
    # The loop, 0x20..0x50: 20 + 30 + 10 + 20 = 80; long_sb 30, math 26, wait 15.
    assert out[4] == "  samples by reason, consumer loop (80): stall_long_sb 30, stall_math 26, stall_wait 15"


def test_stall_sites_without_a_source_table(tmp_path, capsys):
    f = tmp_path / "x.csv"
    f.write_text("==ERROR== unrecognized option '--print-source'\n")
    assert stall_sites.main([str(f)]) == 1
    assert "no source table" in capsys.readouterr().out


def test_head_to_head_times_both_in_turns(tmp_path, monkeypatch, capsys):
    fa3 = tmp_path / "fa3_fwd_hdim128-abc"
    # As fa3_fwd_driver.cu prints its timing line; 2 ms at s 2048, whatever the other arguments.
    fa3.write_text("#!/bin/bash\necho \"fa3_fwd_driver: time b=$1 s=$2 h=$3 d=$4 causal=$5 median_ms=2.0000 min_ms=1.9 tflops=1 iters=$8\"\n")
    fa3.chmod(0o755)
    calls = []

    def fake_flash3(b, s, h, d, causal, iters):
        calls.append((b, s, h, d, causal, iters))
        return 2.5 if len(calls) == 1 else 2.2  # the second run is the faster
    monkeypatch.setattr(head_to_head, "flash3_ms", fake_flash3)
    monkeypatch.setattr(head_to_head, "gpu_state", lambda: "1755,500,60")
    js = tmp_path / "h2h.json"
    monkeypatch.setattr(sys, "argv", ["head_to_head.py", "--fa3", str(fa3), "--shapes", "2048:1", "--iters", "7",
                                      "--json", str(js)])
    assert head_to_head.main() == 0
    # d 128 -> h 16, s 2048 -> b 8; flash3 timed twice, alternating with FA3.
    assert calls == [(8, 2048, 16, 128, True, 7)] * 2
    out = capsys.readouterr().out
    # FLOPs 4 * 8 * 16 * 2048^2 * 128 / 2 = 1.374e11: FA3 at 2.0 ms 68.7 TFLOP/s, flash3 at its
    # faster 2.2 ms 62.5; ratio 2.0 / 2.2 = 0.909.
    row = next(l for l in out.splitlines() if l.strip().startswith("2048"))
    assert "68.7" in row and "62.5" in row and "0.909" in row and "1755,500,60" in row
    import json
    (r,) = json.loads(js.read_text())
    assert r["fa3_ms"] == [2.0, 2.0] and r["flash3_ms"] == [2.5, 2.2] and round(r["ratio"], 3) == 0.909


def test_device_profile_script_is_valid_bash():
    assert subprocess.run(["bash", "-n", str(ROOT / "tools" / "device" / "device_profile.sh")]).returncode == 0
