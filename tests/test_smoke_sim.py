"""tools/smoke.py's simulator backend (tools/smoke_sim.py) without the simulator: the case-file
format, the case -> op-argument mapping, exit-status classification, the kernel selection and the
build cache key. The launches themselves run under `python tools/smoke.py --backend sim`."""
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import smoke  # noqa: E402
import smoke_sim  # noqa: E402


def test_case_files_round_trip(tmp_path):
    g = torch.Generator().manual_seed(0)
    tensors = {
        "q": torch.randn(2, 5, 3, 8, generator=g).to(torch.bfloat16),
        "k": torch.randn(7, 2, 16, generator=g).to(torch.float16),
        "v": torch.randn(2, 2, 16, 32, generator=g).clamp(-448, 448).to(torch.float8_e4m3fn),
        "lse": torch.full((2, 3, 5), float("nan")),
        "cu_seqlens_q": torch.tensor([0, 3, 7], dtype=torch.int32),
        "seqused_k": None,  # left out
        "out": torch.randn(2, 3, 8, generator=g).to(torch.bfloat16).transpose(0, 1),  # written contiguous
        "empty": torch.empty(0, 3, dtype=torch.float32),
    }
    scalars = {"softmax_scale": 128 ** -0.5, "causal": True, "window_left": -1, "softcap": 5.0,
               "max_seqlen_q": 203}
    smoke_sim.write_case(tmp_path, "fwd", tensors, scalars)
    text = (tmp_path / "case.txt").read_text().splitlines()
    assert text[0] == "flash3-sim-case 1" and text[1] == "op fwd"
    assert "tensor q bf16 4 2 5 3 8 120 24 8 1" in text
    assert "tensor out bf16 3 3 2 8 16 8 1" in text  # the contiguous copy's strides
    assert (tmp_path / "q.bin").stat().st_size == 2 * 5 * 3 * 8 * 2
    assert not (tmp_path / "seqused_k.bin").exists()
    op, got, sc = smoke_sim.read_case(tmp_path)
    assert op == "fwd" and set(got) == {n for n, t in tensors.items() if t is not None}
    for n, t in got.items():
        want = tensors[n]
        assert t.dtype == want.dtype and t.shape == want.shape
        assert torch.equal(t.view(torch.uint8), want.contiguous().view(torch.uint8)), n  # bitwise (NaN too)
    assert sc == {"softmax_scale": 128 ** -0.5, "causal": 1, "window_left": -1, "softcap": 5.0,
                  "max_seqlen_q": 203}


@pytest.mark.parametrize("feature", [f for f in smoke.FEATURES if smoke.applies("bf16:64:64", f)])
def test_op_call_fwd(feature):
    """The arguments of smoke._launch_fwd, by name."""
    c = smoke.make_case(feature, "fp16", 64, 64, device="cpu")
    out, lse = smoke_sim.poisoned_outputs(c)
    assert out.dtype == torch.float16 and torch.isnan(out).all() and torch.isnan(lse).all()
    op, t, s = smoke_sim.op_call(c, out, lse)
    assert op == "fwd"
    assert t["q"] is c["q"] and t["k"] is c["k"] and t["v"] is c["v"] and t["out"] is out and t["lse"] is lse
    assert t["cu_seqlens_q"] is c["cu_q"] and t["cu_seqlens_k"] is c["cu_k"] and t["seqused_k"] is c["seqused_k"]
    assert s["softmax_scale"] == 64 ** -0.5 and s["causal"] == (feature == "causal")
    assert (s["window_left"], s["window_right"]) == ((97, 13) if feature == "window" else (-1, -1))
    assert s["softcap"] == (5.0 if feature == "softcap" else 0.0)
    assert (s["max_seqlen_q"], s["max_seqlen_k"]) == (c["max_q"], c["max_k"])
    if feature == "varlen":
        assert lse.shape == (2, smoke.SQ + 77) and t["cu_seqlens_q"].dtype == torch.int32
    elif feature == "kvcache":
        assert t["seqused_k"].tolist() == [smoke.SK, 150] and lse.shape == (2, 2, 77)
    else:
        assert lse.shape == (2, c["q"].shape[2], smoke.SQ)


@pytest.mark.parametrize("feature", [f for f in smoke.FEATURES if smoke.applies("e4m3:64:64", f)])
def test_op_call_fp8(feature):
    """The arguments of smoke._launch_fp8: packed vt, the descales, the blocks; max_seqlen only
    with cu_seqlens (the op's defaults are 0)."""
    from flash3 import fp8
    c = smoke.make_case(feature, "e4m3", 64, 64, device="cpu")
    out, lse = smoke_sim.poisoned_outputs(c)
    assert out.dtype == torch.bfloat16
    op, t, s = smoke_sim.op_call(c, out, lse)
    assert op == "fwd_fp8" and "seqused_k" not in t
    assert (s["q_block"], s["kv_block"]) == smoke.FP8_BLOCK
    assert [t[n] for n in ("q_descale", "k_descale", "v_descale", "v_channel_descale")] == list(c["descales"])
    if feature == "varlen":
        assert torch.equal(t["v"].view(torch.uint8), fp8.pack_v_fp8_varlen(c["v"], c["cu_k"]).view(torch.uint8))
        assert (s["max_seqlen_q"], s["max_seqlen_k"]) == (smoke.SQ, smoke.SK)
    else:
        vt = t["v"]
        assert vt.shape[:3] == (2, c["k"].shape[2], 64) and vt.shape[3] % 16 == 0 and vt.shape[3] >= smoke.SK
        assert torch.equal(vt.view(torch.uint8), fp8.pack_v_fp8(c["v"]).view(torch.uint8))
        assert (s["max_seqlen_q"], s["max_seqlen_k"]) == (0, 0)


def test_classify():
    assert smoke_sim.classify(86, "x\nhopper_sim: deadlock: every live thread is blocked\n")[0] == "hang"
    assert smoke_sim.classify(86, "hopper_sim: livelock: 400M instructions")[0] == "hang"
    st, det = smoke_sim.classify(86, "hopper_sim: async-inflight: CTA 0 reads ...\nmore")
    assert st == "crash" and det.startswith("hopper_sim: async-inflight")
    st, det = smoke_sim.classify(87, "hopper_sim: unsupported: mma.sync")
    assert st == "error" and "unsupported" in det
    st, det = smoke_sim.classify(3, "sim_driver: kernel bf16\nsim_driver: error: flash3.fwd_sm90: no bf16 kernel")
    assert st == "error" and det == "sim_driver: error: flash3.fwd_sm90: no bf16 kernel"
    assert smoke_sim.classify(-11, "")[0] == "crash"


def test_selected_tus_follow_the_knobs(monkeypatch):
    monkeypatch.setenv("FLASH3_HDIMS", "128")
    monkeypatch.setenv("FLASH3_DTYPES", "bf16,e4m3")
    names = [p.name for p in smoke_sim.selected_fwd_tus(ROOT / "csrc")]
    assert names == sorted(names, key=names.index)  # stable
    assert set(names) == {"fwd_bf16_hdim128_sm90.cu", "fwd_bf16_hdim128_wide_sm90.cu",
                          "fwd_fp8_e4m3_hdim128_sm90.cu"}
    assert all((ROOT / "csrc" / "generated" / n).exists() for n in names)
    monkeypatch.setenv("FLASH3_SIM_CSRC", "/tmp/elsewhere/csrc")
    assert smoke_sim.csrc_root() == Path("/tmp/elsewhere/csrc")
    assert smoke_sim.selected_fwd_tus()[0].parent == Path("/tmp/elsewhere/csrc/generated")


def test_build_key_tracks_sources_and_flags(tmp_path):
    (tmp_path / "flash3" / "common").mkdir(parents=True)
    hdr = tmp_path / "flash3" / "common" / "attn_logic.h"
    hdr.write_text("int a;\n")
    tu = tmp_path / "generated" / "fwd_x.cu"
    tu.parent.mkdir()
    tu.write_text('#include "x"\n')
    key = lambda flags=("-O3",): smoke_sim._source_hash(tmp_path, tu, list(flags), "nvcc")  # noqa: E731
    k0 = key()
    assert key() == k0
    assert key(("-O2",)) != k0
    hdr.write_text("int b;\n")
    assert key() != k0


def test_kernel_flags_are_the_real_ones(monkeypatch):
    """setup.py's kernel flags, with the simulator's -gencode in place of sm_90a-only SASS."""
    import flash3_build as fb
    monkeypatch.delenv("FLASH3_NVCC_FLAGS", raising=False)
    monkeypatch.delenv("FLASH3_DEBUG_HANG", raising=False)
    flags = smoke_sim.kernel_flags("/nonexistent/include", ROOT / "csrc")
    assert flags[0] == smoke_sim.SIM_GENCODE and "-no-compress" in flags
    assert not any(f in flags for f in fb.NVCC_ARCH_FLAGS)
    for f in fb.NVCC_KERNEL_FLAGS[1:]:
        assert f in flags
    assert f"-I{ROOT / 'csrc'}" in flags and "-I/nonexistent/include" in flags


def test_render_times():
    cases = [{"kernel": "bf16:64:64", "feature": "full", "status": "ok", "seconds": 3.25, "seeds": [1, 2]},
             {"kernel": "bf16:64:64", "feature": "causal", "status": "wrong", "seconds": 1.0, "seeds": [1]}]
    lines = smoke.render_times(cases).splitlines()
    assert lines[0].split() == ["seconds", "full", "causal"]
    assert lines[1].split() == ["bf16", "64", "3.2*", "1.0"]  # * = once per seed
