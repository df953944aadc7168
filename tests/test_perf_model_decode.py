"""The timing model report's decode pieces (tools/hopper_sim/perf_model.py), without a simulator run:
the bytes a decode step must move for a 16-bit and an e4m3 cache, and the section's rows for each
cache kind (a row dict as flash3_decode_row returns it)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "hopper_sim"))
import perf_model as pm  # noqa: E402


def test_decode_bytes_by_cache_element():
    b, h, h_k, d, keys = 8, 32, 8, 128, 8192
    q_out_lse = 2 * b * h * d * 2 + b * h * 4
    assert pm.decode_bytes(b, h, h_k, d, keys) == 2 * b * keys * h_k * d * 2 + q_out_lse
    assert pm.decode_bytes(b, h, h_k, d, keys, 1) == 2 * b * keys * h_k * d + q_out_lse


def row(us, sm, hbm):
    rec = {"sm_cycles": sm, "hbm_cycles": hbm, "stall_cycles": {"dependency": 3, "mbarrier": 1}}
    nbytes = 1e6
    return dict(us=us, bytes=nbytes, tbps=nbytes / (us * 1e-6) / 1e12, rec=rec, launches=2, grid=[128, 1, 1],
                hbm_frac=nbytes / (us * 1e-6) / 3.35e12, launch_us=[round(us - 1.4, 1), 1.4])


def test_decode_section_names_each_cache():
    dec = {(0, 0, False): row(81.8, 82569, 134374), (16, 0, True): row(112.3, 185418, 69263)}
    text = "\n".join(pm.decode_section(dec))
    lines = [x for x in text.splitlines() if x.startswith("| ") and "CTAs" in x]
    assert len(lines) == 2
    assert lines[0].startswith("| contiguous | plan: 2 (128 CTAs) | 81.8 (80.4 + 1.4) |") and "| HBM |" in lines[0]
    assert lines[1].startswith("| e4m3, pages of 16 rows | plan: 2 (128 CTAs) |") and "| SM | dependency 75% |" in lines[1]
    assert "cp.async" in text
