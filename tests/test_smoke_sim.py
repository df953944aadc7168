"""tools/smoke/smoke.py's simulator backend (tools/smoke/smoke_sim.py) without the simulator: the case-file
format, the case -> op-argument mapping, exit-status classification, the kernel selection and the
build cache key. The launches themselves run under `python tools/smoke/smoke.py --backend sim`."""
import itertools
import json
import math
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools" / "smoke"))
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
    scalars = {"softmax_scale": 128 ** -0.5, "deterministic": True, "window_left": -1, "softcap": 5.0,
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
    assert sc == {"softmax_scale": 128 ** -0.5, "deterministic": 1, "window_left": -1, "softcap": 5.0,
                  "max_seqlen_q": 203}


@pytest.mark.parametrize("feature", [f for f in smoke.FEATURES if smoke.applies("bf16:64:64", f)])
def test_op_call_fwd(feature):
    """The arguments of smoke._launch_fwd, by name."""
    c = smoke.make_case(feature, "fp16", 64, 64, device="cpu")
    out, lse = smoke_sim.poisoned_outputs(c)
    assert out.dtype == torch.float16 and torch.isnan(out).all() and torch.isnan(lse).all()
    op, t, s = smoke_sim.op_call(c, out, lse)
    if feature == "chunk":  # FA3's attention_chunk: a scalar of the driver's fwd op
        chunk, causal, window, (lq, lk) = smoke.CHUNK_PARTS[0]
        assert op == "fwd" and s.pop("attention_chunk") == chunk == 48
        assert (s["window_left"], s["window_right"]) == (-1, 0) and causal
        assert t["cu_seqlens_q"].tolist()[-1] == sum(lq) and t["cu_seqlens_k"].tolist()[-1] == sum(lk)
        assert {k > q for q, k in zip(lq, lk) if q and k} == {True, False} and 0 in lk
        assert 0 in smoke.CHUNK_PARTS[1][3][0]  # the other part: a sequence of 0 queries
        c1 = smoke.make_cases(feature, "fp16", 64, 64, device="cpu")[1]
        op1, _, s1 = smoke_sim.op_call(c1, *smoke_sim.poisoned_outputs(c1))
        assert op1 == "fwd" and s1["attention_chunk"] == 160 and s1["window_left"] == 200
        return
    if feature == "window":  # a second launch: a left bound alone, unmasked blocks between masked ones
        c1 = smoke.make_cases(feature, "fp16", 64, 64, device="cpu")[1]
        _, _, s1 = smoke_sim.op_call(c1, *smoke_sim.poisoned_outputs(c1))
        assert (s1["window_left"], s1["window_right"]) == smoke.WINDOW_PARTS[1] == (200, -1)
    assert op == "fwd"
    assert (t.get("seqused_q") is c["seqused_q"]) and (c["seqused_q"] is None) == (feature != "sequsedq")
    assert t["q"] is c["q"] and t["k"] is c["k"] and t["v"] is c["v"] and t["out"] is out and t["lse"] is lse
    assert t["cu_seqlens_q"] is c["cu_q"] and t["cu_seqlens_k"] is c["cu_k"] and t["seqused_k"] is c["seqused_k"]
    # nextdim: the case's own (smaller) head dims, which the op routes to this kernel; the scale is
    # the op's default for them
    d, dv = (40, 40) if feature == "nextdim" else (64, 64)
    assert (t["q"].shape[-1], t["k"].shape[-1], t["v"].shape[-1], out.shape[-1]) == (d, d, dv, dv)
    assert s["softmax_scale"] == d ** -0.5 and "causal" not in s  # the mask is the window alone
    assert t["sinks"] is c["sinks"] and (c["sinks"] is None) == (feature != "sinks")
    assert t["alibi_slopes"] is c["alibi"] and (c["alibi"] is None) == (feature != "alibi")
    causal = feature in ("causal", "sq_gt_sk", "sinks", "sequsedq")
    assert (s["window_left"], s["window_right"]) == ((97, 13) if feature == "window" else (-1, 0) if causal
                                                     else (-1, -1))
    assert s["softcap"] == (5.0 if feature == "softcap" else 0.0)
    assert (s["max_seqlen_q"], s["max_seqlen_k"]) == (c["max_q"], c["max_k"])
    if feature == "varlen":  # four sequences, one of 0 queries, one of 1 query and 0 keys
        assert lse.shape == (2, smoke.SQ + 78) and t["cu_seqlens_q"].dtype == torch.int32
        assert t["cu_seqlens_q"].tolist() == [0, smoke.SQ, smoke.SQ, smoke.SQ + 77, smoke.SQ + 78]
        assert t["cu_seqlens_k"].tolist() == [0, smoke.SK, smoke.SK + 40, smoke.SK + 190, smoke.SK + 190]
        assert t["cu_seqlens_k"].dtype == torch.int32 and t["k"].shape[0] == t["v"].shape[0] == smoke.SK + 190
    elif feature == "nantail":  # varlen with NaN/+-Inf rows past cu_seqlens[-1]; the last sequence ends mid-block
        (lq, lk), (pq, pk) = smoke.NANTAIL_LENS, smoke.NANTAIL_PAD
        assert t["cu_seqlens_q"].tolist()[-1] == sum(lq) and t["cu_seqlens_k"].tolist()[-1] == sum(lk)
        assert t["q"].shape[0] == sum(lq) + pq and t["k"].shape[0] == t["v"].shape[0] == sum(lk) + pk
        assert lse.shape == (2, sum(lq) + pq) and out.shape[0] == sum(lq) + pq
        for x, n in ((t["q"], sum(lq)), (t["k"], sum(lk)), (t["v"], sum(lk))):
            assert torch.isfinite(x[:n]).all()
            tail = x[n:].reshape(-1)
            assert torch.isnan(tail[0::3]).all() and (tail[1::3] == float("inf")).all()
            assert (tail[2::3] == float("-inf")).all()
    elif feature == "kvcache":
        assert t["seqused_k"].tolist() == [smoke.SK, 150] and lse.shape == (2, 2, 77)
    elif feature == "sinks":  # causal GQA, SK queries over SINKS_SK keys: more than a tile of rows see none
        assert t["q"].shape[1:3] == (smoke.SK, 6) and t["k"].shape[1:3] == (smoke.SINKS_SK, 2)
        assert smoke.SK - smoke.SINKS_SK > 128 and (smoke.SK - smoke.SINKS_SK) % 64 != 0
        sk = t["sinks"]
        assert sk.dtype == torch.float32 and sk.shape == (6,) and sk[3] == 8 and sk[4] == float("-inf")
    elif feature == "alibi":  # GQA varlen, (sequence, head) slopes; s_k - s_q > 0, < 0 and 0
        lq, lk = smoke.ALIBI_LENS
        assert t["cu_seqlens_q"].tolist()[-1] == sum(lq) and t["cu_seqlens_k"].tolist()[-1] == sum(lk)
        assert {k > q for q, k in zip(lq, lk) if k != q} == {True, False} and any(q == k for q, k in zip(lq, lk))
        assert t["q"].shape[1:] == (6, 64) and t["k"].shape[1:] == (2, 64) and lse.shape == (6, sum(lq))
        a = t["alibi_slopes"]
        assert a.dtype == torch.float32 and a.shape == (len(lq), 6)
        assert (a > 0.0019).all() and (a < 0.1).all() and a.unique().numel() == a.numel()
    elif feature == "sequsedq":  # cut mid-tile (a tile wholly past the cut too), to 0, clamped, mid-tile
        lq, lk = smoke.SEQUSEDQ_LENS
        assert t["cu_seqlens_q"].tolist()[-1] == t["q"].shape[0] == sum(lq)
        assert t["cu_seqlens_k"].tolist()[-1] == sum(lk)
        u = t["seqused_q"]
        assert u.dtype == torch.int32 and u.tolist() == smoke.SEQUSEDQ_USED
        assert smoke.used_q_counts(c) == [100, 0, 77, 70] and lq[0] > 128 and lq[3] > 128
        pad = smoke.past_seqused_q(c)
        assert int(pad.sum()) == sum(lq) - 247 and torch.isfinite(t["q"][~pad]).all()
        assert not torch.isfinite(t["q"][pad]).any() and torch.isnan(t["q"][pad]).any()  # NaN/+-Inf past the cut
        # FA3's seqused_k with it: cut mid-block, clamped, 0 (queries that see nothing), below the
        # used queries (causal: rows without keys); the keys past the cut poisoned in k and v
        uk = t["seqused_k"]
        assert uk.dtype == torch.int32 and uk.tolist() == smoke.SEQUSEDQ_USED_K
        assert smoke.used_k_counts(c) == [200, 50, 0, 37] and 200 % 128 and 37 < 70
        keep = torch.zeros(sum(lk), dtype=torch.bool)
        for start, n in zip([0] + list(itertools.accumulate(lk))[:-1], smoke.used_k_counts(c)):
            keep[start:start + n] = True
        for x in (t["k"], t["v"]):
            assert torch.isfinite(x[keep]).all() and not torch.isfinite(x[~keep]).any()
    else:  # sq_gt_sk: more queries than keys (SK queries over SQ keys)
        s_q, s_k = (smoke.SK, smoke.SQ) if feature == "sq_gt_sk" else (smoke.SQ, smoke.SK)
        assert lse.shape == (2, c["q"].shape[2], s_q) and t["k"].shape[1] == s_k
        assert (s["max_seqlen_q"], s["max_seqlen_k"]) == (s_q, s_k)


@pytest.mark.parametrize("feature", [f for f in smoke.FEATURES if smoke.applies("e4m3:64:64", f)])
def test_op_call_fp8(feature):
    """The arguments of smoke._launch_fp8: packed vt, the descales, the blocks; max_seqlen only
    with cu_seqlens (the op's defaults are 0)."""
    from flash3 import fp8
    c = smoke.make_case(feature, "e4m3", 64, 64, device="cpu")
    out, lse = smoke_sim.poisoned_outputs(c)
    assert out.dtype == torch.bfloat16
    op, t, s = smoke_sim.op_call(c, out, lse)
    assert op == "fwd_fp8"
    for n in ("seqused_q", "seqused_k"):  # FA3's, on packed sequences ("sequsedq")
        assert (t[n] is not None) == (feature == "sequsedq") and t[n] is c.get(n), n
    assert s.get("attention_chunk", 0) == (c["chunk"] if feature == "chunk" else 0)
    # perhead: one descale per (batch, head), its block the sequence rounded up to 64 rows / 128 keys
    want_block = (256, 384) if feature == "perhead" else smoke.FP8_BLOCK
    assert c["fp8_block"] == want_block and (s["q_block"], s["kv_block"]) == want_block
    if feature == "perhead":
        assert [tuple(x.shape) for x in c["descales"][:3]] == [(2, 2, 1)] * 3
    got = [t[n] for n in ("q_descale", "k_descale", "v_descale", "v_channel_descale")]
    assert all(torch.equal(x, y) for x, y in zip(got, smoke.fp8_op_descales(c)))
    # fastacc: one v descale per (batch, kv head), the op's (b, h_k, 1), and the fast_accum flag
    assert s.get("fast_accum", 0) == (feature == "fastacc")
    if feature == "fastacc":
        assert tuple(t["v_descale"].shape) == (2, 2, 1) and torch.equal(t["v_descale"][:, :, 0], c["descales"][2])
    else:
        assert got == list(c["descales"])
    if c["cu_q"] is not None:  # nantail: v's rows past cu_seqlens_k[-1] are not packed (nor past seqused_k)
        want = fp8.pack_v_fp8_varlen(c["v"], c["cu_k"], c.get("seqused_k"))
        assert torch.equal(t["v"].view(torch.uint8), want.view(torch.uint8))
        assert (s["max_seqlen_q"], s["max_seqlen_k"]) == (c["max_q"], c["max_k"])
    else:
        vt = t["v"]
        s_k = smoke.SQ if feature == "sq_gt_sk" else smoke.SK
        assert c["k"].shape[1] == s_k and c["q"].shape[1] == (smoke.SK if feature == "sq_gt_sk" else smoke.SQ)
        assert vt.shape[:3] == (2, c["k"].shape[2], 64) and vt.shape[3] % 16 == 0 and vt.shape[3] >= s_k
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
    names = [p.name for p in smoke_sim.selected_tus(ROOT / "csrc")]
    assert names == sorted(names, key=names.index)  # stable
    assert set(names) == {"fwd_bf16_hdim128_sm90.cu", "fwd_fp8_e4m3_hdim128_sm90.cu"}
    assert all((ROOT / "csrc" / "generated" / n).exists() for n in names)
    monkeypatch.setenv("FLASH3_SIM_CSRC", "/tmp/elsewhere/csrc")
    assert smoke_sim.csrc_root() == Path("/tmp/elsewhere/csrc")
    assert smoke_sim.selected_tus()[0].parent == Path("/tmp/elsewhere/csrc/generated")


def test_build_key_tracks_sources_and_flags(tmp_path):
    """The key covers the TU, the project headers it includes transitively and the flags; not other
    headers, and not where the tree lives (a mutant's copy shares the objects its change misses)."""
    def tree(root):
        (root / "flash3" / "common").mkdir(parents=True)
        (root / "flash3" / "common" / "attn_logic.h").write_text('#include "flash3/common/inner.h"\nint a;\n')
        (root / "flash3" / "common" / "inner.h").write_text("int i;\n")
        (root / "flash3" / "common" / "other.h").write_text("int o;\n")
        (root / "generated").mkdir()
        (root / "generated" / "fwd_x.cu").write_text('#include "flash3/common/attn_logic.h"\n#include <cuda.h>\n')
        return root / "generated" / "fwd_x.cu"

    tu = tree(tmp_path / "a")
    key = lambda root=tmp_path / "a", flags=("-O3",): smoke_sim._source_hash(  # noqa: E731
        root, root / "generated" / "fwd_x.cu", list(flags) + [f"-I{root}"], "nvcc")
    k0 = key()
    assert key() == k0
    assert key(flags=("-O2",)) != k0
    (tmp_path / "a" / "flash3" / "common" / "other.h").write_text("int p;\n")   # not included
    assert key() == k0
    (tmp_path / "a" / "flash3" / "common" / "inner.h").write_text("int j;\n")   # included by a header
    k1 = key()
    assert k1 != k0
    tree(tmp_path / "b")
    (tmp_path / "b" / "flash3" / "common" / "inner.h").write_text("int j;\n")
    assert key(tmp_path / "b") == k1   # the same sources elsewhere
    tu.write_text(tu.read_text() + "// edited\n")
    assert key() != k1


def test_host_object_key_outside_csrc(tmp_path):
    """The driver's host sources (tools/hopper_sim/flash3/*.cu) are keyed the same way: a header
    beside the source and the csrc headers it includes count, csrc's location does not (a mutant's
    copy of csrc whose change misses the host side reuses its objects)."""
    drv = tmp_path / "driver"
    drv.mkdir()
    (drv / "sim_case.h").write_text("int c;\n")
    src = drv / "sim_driver.cu"
    src.write_text('#include "sim_case.h"\n#include "flash3/host/fwd.h"\n')

    def csrc(root, body="int f;\n"):
        (root / "flash3" / "host").mkdir(parents=True)
        (root / "flash3" / "host" / "fwd.h").write_text(body)
        (root / "flash3" / "fwd").mkdir(parents=True)
        (root / "flash3" / "fwd" / "mainloop.cuh").write_text("int m;\n")
        return root

    key = lambda root: smoke_sim._source_hash(root, src, ["-O2", f"-I{root}"], "nvcc")  # noqa: E731
    k0 = key(csrc(tmp_path / "a"))
    mutant = csrc(tmp_path / "b")
    (mutant / "flash3" / "fwd" / "mainloop.cuh").write_text("int mutated;\n")   # a kernel-side change
    assert key(mutant) == k0
    assert key(csrc(tmp_path / "c", "int g;\n")) != k0                         # a host header's
    (drv / "sim_case.h").write_text("int d;\n")                                 # the driver's own header
    assert key(tmp_path / "a") != k0


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


# ------------------------------------------------------------------ decode (KV-cache) family

def test_decode_kernel_ids_labels_and_features():
    info = {"fwd": [["bf16", 128, 128]], "decode": [["bf16", 128, 128], ["fp16", 192, 128]],
            "decode_fp8_cache": [["bf16", 128, 128]]}
    ids = smoke.kernel_ids(info)
    assert ids == ["bf16:128:128", "dec:bf16:128:128", "dec:fp16:192:128", "dec:kve4m3:bf16:128:128"]
    assert smoke.parse_kernel("dec:kve4m3:bf16:128:128") == ("bf16", 128, 128)
    assert smoke.parse_kernel("dec:fp16:192:128") == ("fp16", 192, 128)
    assert smoke.family("dec:kve4m3:bf16:128:128") == "dec" and smoke.dec_fp8_cache("dec:kve4m3:bf16:128:128")
    assert not smoke.dec_fp8_cache("dec:bf16:128:128")
    assert smoke.kernel_label("dec:kve4m3:bf16:128:128") == "dec kve4m3 bf16 128"
    assert smoke.kernel_label("dec:fp16:192:128") == "dec fp16 192x128"
    # "fa3desc", "fa3app", "fa3pk" and "fa3rot" (FA3's per-batch FP8-cache descales, without and
    # with new keys, in FA3's packed layouts, with rotary) apply to the FP8-cache decode kernels
    # only: a 16-bit cache has no descales; "vappend" (FA3's packed appends of 16-bit keys, rotary
    # included) to the 16-bit ones only: an FP8 cache takes packed appends of e4m3 keys only
    # (fa3pk; with rotary and e4m3 q, fa3rot).
    # "mla", "mlaapp" (with new keys) and "mlachunk" (attention_chunk, packed queries' leftpad) are
    # the MLA decode kernel's (d_v > 256) only, and the only features it runs: their case shapes
    # (one kv head, 8-40 query heads, qv) are its own.
    mla = ("mla", "mlaapp", "mlachunk")
    assert smoke.MLA_FEATURES == mla
    assert smoke.kernel_features("dec:bf16:128:128") == [f for f in smoke.DEC_FEATURES
                                                         if f not in ("fa3desc", "fa3app", "fa3pk", "fa3rot", *mla)]
    assert smoke.kernel_features("dec:kve4m3:bf16:128:128") == [f for f in smoke.DEC_FEATURES
                                                                if f not in ("vappend", *mla)]
    assert smoke.kernel_features("dec:bf16:64:512") == list(mla) and smoke.is_mla("dec:bf16:64:512")
    assert smoke.kernel_label("dec:bf16:64:512") == "dec bf16 64x512" and not smoke.is_mla("dec:bf16:256:256")
    assert not any(smoke.applies("dec:bf16:128:128", f) for f in smoke.FEATURES if f not in smoke.DEC_FEATURES)
    assert not any(smoke.applies("bf16:128:128", f) for f in smoke.DEC_FEATURES if f not in smoke.FEATURES)
    with pytest.raises(ValueError, match="does not apply"):
        smoke.make_dec_case("full", "dec:bf16:128:128", device="cpu")


@pytest.mark.parametrize("kid", ["dec:bf16:128:128", "dec:kve4m3:bf16:128:128", "dec:bf16:64:512"])
@pytest.mark.parametrize("feature", smoke.DEC_FEATURES)
def test_make_dec_case_and_op_call(kid, feature):
    """Each part is a valid fwd_kvcache_sm90 (+ append_kv_sm90) call, and dec_op_call names its
    arguments as sim_driver.cu's kvcache op reads them."""
    # fa3desc, fa3app, fa3pk, fa3rot: FP8-cache kernels only; vappend: 16-bit caches only; mla,
    # mlaapp: the MLA kernel's only
    if not smoke.applies(kid, feature):
        assert ((feature in ("fa3desc", "fa3app", "fa3pk", "fa3rot") and not smoke.dec_fp8_cache(kid))
                or (feature == "vappend" and smoke.dec_fp8_cache(kid))
                or (feature in smoke.MLA_FEATURES) != smoke.is_mla(kid))
        with pytest.raises(ValueError, match="does not apply"):
            smoke.make_dec_case(feature, kid, device="cpu")
        return
    parts = smoke.make_dec_case(feature, kid, device="cpu")
    assert parts
    fp8 = smoke.dec_fp8_cache(kid)
    for p in parts:
        q, kc, vc, pt = p["q"], p["kc"], p["vc"], p["pt"]
        if feature == "vappend":  # FA3's packed layouts: cu_seqlens_k_new and/or cu_seqlens_q to the append
            a = p["append"]
            assert p["cu_q"] is not None or a["cu_k"] is not None
            out, lse, q_out = smoke.dec_poisoned_outputs(p)
            assert (q_out is not None) == (a["cos"] is not None) and (q_out is None or q_out.shape == q.shape)
            op, t, sc = smoke_sim.dec_op_call(p, out, lse, q_out)
            assert t["cu_seqlens_k_new"] is a["cu_k"] and t.get("cu_seqlens_q") is p["cu_q"]
            assert t["cache_leftpad"] is p["leftpad"] and t["k"] is a["k"] and t["q_out"] is q_out
            b = len(p["seqused"])
            news = a["cu_k"].diff().tolist() if a["cu_k"] is not None else [a["k"].shape[1]] * b
            assert p["seqused"].tolist() == [n + m for n, m in zip(a["cache_seqlens"].tolist(), news)]
            continue
        if feature == "mlaapp":  # DeepSeek's new keys (rope 64, latent 512) appended, then the MLA kernel
            a = p["append"]
            out, lse, q_out = smoke.dec_poisoned_outputs(p)
            assert a["cos"] is not None and q_out is not None and q_out.shape == q.shape
            op, t, sc = smoke_sim.dec_op_call(p, out, lse, q_out)
            assert op == "kvcache" and t["qv"] is p["qv"] and t["q_out"] is q_out
            assert t["k"] is a["k"] and t["v"] is a["v"] and t["cache_leftpad"] is p["leftpad"]
            assert a["k"].shape[-2:] == (1, 64) and a["v"].shape[-2:] == (1, 512) and vc.shape[-2:] == (1, 512)
            assert p["qv"].shape == (*q.shape[:-1], 512) and sc["softmax_scale"] == (64 + 512) ** -0.5
            assert t["cu_seqlens_k_new"] is a["cu_k"] and t.get("cu_seqlens_q") is p["cu_q"]
            b = len(p["seqused"])
            news = a["cu_k"].diff().tolist() if a["cu_k"] is not None else [a["k"].shape[1]] * b
            assert p["seqused"].tolist() == [n + m for n, m in zip(a["cache_seqlens"].tolist(), news)]
            continue
        if feature == "fa3rot":  # fa3pk's with rotary: the append takes q8 and rotates it with the keys
            a, (kd, vd), f = p["append"], p["descales"], p["fa3"]
            b = len(p["seqused"])
            assert q is f["q8"] and q.dtype == kc.dtype == a["k"].dtype == a["v"].dtype == torch.float8_e4m3fn
            assert kd.shape == vd.shape == (b, kc.shape[2]) and torch.equal(kd, f["q_descale"] * f["k_descale"])
            out, lse, q_out = smoke.dec_poisoned_outputs(p)
            assert out.dtype == torch.bfloat16 and q_out.dtype == torch.float8_e4m3fn and q_out.shape == q.shape
            op, t, sc = smoke_sim.dec_op_call(p, out, lse, q_out)
            assert sc["descale_per_batch"] == 1 and t["q"] is q and t["q_out"] is q_out
            assert t["rotary_cos"] is a["cos"] and a["cos"].dtype == torch.float32
            assert t["cu_seqlens_k_new"] is a["cu_k"] and t.get("cu_seqlens_q") is p["cu_q"]
            assert sc["q_per_token"] == p["causal"] and t["rotary_seqlens"] is a["rotary_seqlens"]
            news = a["cu_k"].diff().tolist() if a["cu_k"] is not None else [a["k"].shape[1]] * b
            assert p["seqused"].tolist() == [n + m for n, m in zip(a["cache_seqlens"].tolist(), news)]
            # pairs of 448 bytes in the rotated channels: some rotate past 448 (saturating)
            assert (a["k"].float().abs() == 448).sum() >= 4
            continue
        if feature == "mlachunk":  # attention_chunk and packed queries' cache_leftpad on the MLA kernel
            out, lse, q_out = smoke.dec_poisoned_outputs(p)
            assert q_out is None and p["append"] is None
            op, t, sc = smoke_sim.dec_op_call(p, out, lse, q_out)
            assert op == "kvcache" and t["qv"] is p["qv"] and t["cache_leftpad"] is p["leftpad"] and "k" not in t
            assert p["qv"].shape == (*q.shape[:-1], 512) and vc.shape[-2:] == (1, 512)
            assert sc["softmax_scale"] == (64 + 512) ** -0.5 and sc.get("attention_chunk", 0) == p["chunk"]
            assert t.get("cu_seqlens_q") is p["cu_q"] and sc.get("max_seqlen_q", 0) == p["max_q"]
            assert (sc["window_left"], sc["window_right"]) == ((-1, 0) if p["causal"] else tuple(p["window"]))
            continue
        if feature == "fa3pk":  # FA3's FP8 cache in its packed layouts: e4m3 q8/k/v, descales per batch entry
            a, (kd, vd), f = p["append"], p["descales"], p["fa3"]
            b = len(p["seqused"])
            assert kc.dtype == vc.dtype == torch.float8_e4m3fn and torch.equal(q, f["q8"].to(torch.bfloat16))
            assert kd.shape == vd.shape == (b, kc.shape[2]) and torch.equal(kd, f["q_descale"] * f["k_descale"])
            out, lse, q_out = smoke.dec_poisoned_outputs(p)
            assert q_out is None
            op, t, sc = smoke_sim.dec_op_call(p, out, lse, q_out)
            assert sc["descale_per_batch"] == 1 and t["cache_leftpad"] is p["leftpad"]
            assert t.get("cu_seqlens_q") is p["cu_q"] and sc.get("max_seqlen_q", 0) == p["max_q"]
            if a is None:
                assert "k" not in t and p["cu_q"] is not None
                continue
            assert a["k"].dtype == a["v"].dtype == torch.float8_e4m3fn and a["cos"] is None
            assert t["cu_seqlens_k_new"] is a["cu_k"] and t["k"] is a["k"] and t["rotary_cos"] is None
            news = a["cu_k"].diff().tolist() if a["cu_k"] is not None else [a["k"].shape[1]] * b
            assert p["seqused"].tolist() == [n + m for n, m in zip(a["cache_seqlens"].tolist(), news)]
            continue
        if p["cu_q"] is not None:  # packed queries (vpaged, dchunk's last part): q (total_q, h, d)
            assert feature in ("vpaged", "dchunk") and q.dim() == 3 and p["cu_q"].dtype == torch.int32
            b, h = p["cu_q"].shape[0] - 1, q.shape[1]
            lens = p["cu_q"].diff().tolist()
            assert p["max_q"] == max(lens) and p["cu_q"][-1] < q.shape[0]  # rows of no sequence
            out, lse, q_out = smoke.dec_poisoned_outputs(p)
            assert out.shape == (q.shape[0], h, vc.shape[-1]) and lse.shape == (h, q.shape[0]) and q_out is None
            op, t, sc = smoke_sim.dec_op_call(p, out, lse, q_out)
            assert t["cu_seqlens_q"] is p["cu_q"] and sc["max_seqlen_q"] == p["max_q"]
            assert pt.shape[0] == b and p["seqused"].shape == (b,) and p["causal"]
            assert sc.get("attention_chunk", 0) == p.get("chunk", 0)
            continue
        assert p["cu_q"] is None and p["max_q"] == 0
        b, s_q, h, d = q.shape
        assert kc.dtype == (torch.float8_e4m3fn if fp8 else q.dtype) and vc.dtype == kc.dtype
        assert (p["descales"] is not None) == fp8
        if pt is None:
            assert kc.shape[0] == b
        else:
            assert pt.dtype == torch.int32 and pt.shape[0] == b
            if feature.startswith("page"):
                assert kc.shape[1] == int(feature[4:])
        assert p["seqused"].dtype == torch.int32 and p["seqused"].shape == (b,)
        out, lse, q_out = smoke.dec_poisoned_outputs(p)
        assert out.shape == (b, s_q, h, vc.shape[-1]) and lse.shape == (b, h, s_q)
        assert torch.isnan(out).all() and torch.isnan(lse).all()
        rotated = p["append"] is not None and p["append"]["cos"] is not None
        assert (q_out is not None) == rotated and rotated == (feature == "rotary" or (
            feature == "leftpad" and p is parts[0]))
        op, t, sc = smoke_sim.dec_op_call(p, out, lse, q_out)
        assert op == "kvcache" and t["cache_leftpad"] is p["leftpad"]
        if feature == "leftpad" or (feature == "mla" and p is parts[-1]) or (feature == "dchunk" and p is parts[2]):
            assert p["leftpad"].dtype == torch.int32 and p["leftpad"].shape == (b,)
        else:
            assert p["leftpad"] is None
        # the driver's optional attention_chunk scalar: dchunk's parts only
        assert sc.get("attention_chunk", 0) == p.get("chunk", 0) and (p.get("chunk", 0) > 0) == (feature == "dchunk")
        assert t["q"] is q and t["k_cache"] is kc and t["seqused_k"] is p["seqused"]
        assert t["page_table"] is pt and (t["k_descale"] is not None) == fp8
        assert sc["num_splits"] == p["num_splits"] and "causal" not in sc
        assert (sc["window_left"], sc["window_right"]) == ((-1, 0) if p["causal"] else tuple(p["window"]))
        assert ("k" in t) == (feature in ("append", "rotary", "fa3app")
                                  or (feature == "leftpad" and p is parts[0]))
        assert t["sinks"] is p["sinks"] and (p["sinks"] is None) == (feature != "sinks")
        assert t["qv"] is p["qv"] and (p["qv"] is None or feature == "mla")
        assert sc["softmax_scale"] == (d + vc.shape[-1] if feature == "mla" else d) ** -0.5
    if feature == "sinks":  # packed GQA, a row of 0 keys; the epilogue (no split) and the combine (3)
        assert [p["num_splits"] for p in parts] == [1, 3] and all(0 in p["seqused"].tolist() for p in parts)
        assert all(p["q"].shape[1:3] == (5, 4 * p["kc"].shape[2]) for p in parts)
    if feature == "split":
        assert parts[0]["num_splits"] > 1 and 0 in parts[0]["seqused"].tolist()
    if feature in ("causal", "window", "softcap"):
        assert sorted(p["q"].shape[1] for p in parts) == [1, 70]
    if feature == "vpaged":  # TMA per page (256 = 2 key blocks), TMA pieces (16), gathered (1), splits
        assert [p["kc"].shape[1] for p in parts] == [256, 16, 1] and max(p["num_splits"] for p in parts) > 1
        lens_q, lens_k = smoke.VPAGED_LENS
        assert 0 in lens_q and 0 in lens_k and max(lens_q) * 4 > 128  # a sequence of several tiles
    if feature == "leftpad":  # unaligned (37), 0 and all-padding rows; append+rotary, causal, splits, paged
        assert [p["num_splits"] for p in parts] == [0, 1, 3, 0] and parts[1]["q"].shape[1] == 70
        assert parts[3]["pt"] is not None and parts[3]["kc"].shape[1] % 128 == 0  # TMA-able, gathered
        for p in parts:
            used, pads = p["seqused"].tolist(), p["leftpad"].tolist()
            assert 37 in pads and any(min(max(a, 0), n) == n for a, n in zip(pads, used))
        assert min(parts[3]["leftpad"].tolist()) < 0  # clamped by the kernel
    if feature == "vappend":  # packed q and k, q only, k only; entries of 0 queries / new keys; tails of no entry
        layouts = [(p["cu_q"] is not None, p["append"]["cu_k"] is not None) for p in parts]
        assert layouts == [(True, True), (True, False), (False, True)]
        assert {p["pt"] is None for p in parts} == {True, False} and {p["causal"] for p in parts} == {True, False}
        assert 0 in parts[0]["cu_q"].diff().tolist() and 0 in parts[0]["append"]["cu_k"].diff().tolist()
        assert parts[0]["q"].shape[0] > parts[0]["cu_q"][-1] and parts[0]["append"]["k"].shape[0] > \
            parts[0]["append"]["cu_k"][-1]
        assert [p["append"]["cos"] is not None for p in parts] == [True, True, False]
        assert parts[1]["append"]["interleaved"] and parts[1]["append"]["rotary_seqlens"] is not None
    if feature == "mla":  # one kv head; no qv, qv on TMA pages of 64 (two tiles), gathered pages + splits
        assert all(p["kc"].shape[2] == 1 and p["vc"].shape[-1] == 512 for p in parts)
        assert [p["qv"] is not None for p in parts] == [False, True, True, True]
        assert [None if p["pt"] is None else p["kc"].shape[1] for p in parts] == [None, 64, 16, None]
        assert parts[3]["softcap"] > 0 and parts[3]["window"] == (100, 0) and 37 in parts[3]["leftpad"].tolist()
        assert parts[1]["q"].shape[1] * parts[1]["q"].shape[2] > 64 and parts[2]["num_splits"] == 3
        assert parts[1]["qv"].shape == (*parts[1]["q"].shape[:-1], 512)
    if feature == "mlaapp":  # TMA pages of 64, contiguous, gathered pages of 16; NeoX and GPT-J rotary
        assert [None if p["pt"] is None else p["kc"].shape[1] for p in parts] == [64, None, 16]
        assert [p["append"]["interleaved"] for p in parts] == [False, True, False]
        assert [p["num_splits"] for p in parts] == [1, 3, 2] and [p["causal"] for p in parts] == [True, False, True]
        a = parts[0]["append"]  # a row of no cached keys, one filled to its pages' capacity
        assert 0 in a["cache_seqlens"].tolist() and parts[0]["pt"].shape[1] * 64 in parts[0]["seqused"].tolist()
        a = parts[1]["append"]  # 32 of 64 channels rotated, at rotary_seqlens; s_new 3 > s_q 1; leftpad
        assert 2 * a["cos"].shape[1] == 32 and a["rotary_seqlens"] is not None and a["k"].shape[1] == 3
        assert parts[1]["q"].shape[1] == 1 and 37 in parts[1]["leftpad"].tolist()
        p, a = parts[2], parts[2]["append"]  # packed q and new keys: entries of none, tails of no entry
        assert 0 in p["cu_q"].diff().tolist() and 0 in a["cu_k"].diff().tolist()
        assert p["q"].shape[0] > p["cu_q"][-1] and a["k"].shape[0] > a["cu_k"][-1]
    if feature == "mlachunk":  # MLACHUNK_PARTS: chunked (batched and packed), packed with leftpad
        assert all(p["kc"].shape[2] == 1 and p["q"].shape[-2] == 16 for p in parts)
        assert [(p["chunk"], p["causal"], p["num_splits"]) for p in parts] == [
            (48, True, 1), (192, False, 2), (64, True, 3), (0, False, 1)]
        assert [None if p["pt"] is None else p["kc"].shape[1] for p in parts] == [64, None, 16, 64]
        assert [p["cu_q"] is not None for p in parts] == [False, False, True, True]
        assert parts[0]["q"].shape[1] * 16 > 64  # two tiles
        for p in parts[2:]:  # packed with leftpad: an entry of 0 queries or of no key left, tail rows
            used, pads = p["seqused"].tolist(), p["leftpad"].tolist()
            assert p["q"].shape[0] > p["cu_q"][-1] and 0 < max(pads) and parts[3]["window"] == (100, 3)
        assert 0 in parts[2]["cu_q"].diff().tolist() and parts[2]["leftpad"][-1] == parts[2]["seqused"][-1]
    if feature == "dchunk":  # packed GQA g 4; causal over two tiles, window + 3 splits paged, unmasked
        # blocks with leftpad and 2 splits, packed queries (DCHUNK_PARTS)
        assert [(p["chunk"], p["causal"], p["num_splits"]) for p in parts] == [
            (48, True, 1), (160, False, 3), (256, False, 2), (64, True, 2)]
        assert parts[0]["q"].shape[1] * 4 > 128 and parts[1]["window"] == (100, 7) and parts[1]["pt"] is not None
        assert all(p["q"].shape[-2] == 4 * p["kc"].shape[2] for p in parts)
    if feature == "fa3desc":  # FA3's (b, h_k) descales on paged caches: gathered (16) and 256 keys per page
        assert [(p["kc"].shape[1], p["num_splits"], p["causal"]) for p in parts] == [(16, 1, True), (256, 3, False)]
        for p in parts:
            f, (kd, vd) = p["fa3"], p["descales"]
            b, h_k = p["q"].shape[0], p["kc"].shape[2]
            assert f["q8"].dtype == torch.float8_e4m3fn and torch.equal(p["q"], f["q8"].to(torch.bfloat16))
            assert kd.shape == vd.shape == (b, h_k) and torch.equal(kd, f["q_descale"] * f["k_descale"])
            assert p["kc"].shape[0] > b  # per-slab indexing would read past the (b, h_k) descales
            for ds in (f["q_descale"], f["k_descale"], vd):
                assert ds.unique().numel() == b * h_k and 0.01 <= ds.min() and ds.max() < 0.11
            _, _, sc = smoke_sim.dec_op_call(p, *smoke.dec_poisoned_outputs(p)[:2])
            assert sc["descale_per_batch"] == 1
    if feature == "fa3pk":  # packed q and k, packed q without new keys, batched q with packed k
        layouts = [(p["cu_q"] is not None, p["append"] is not None and p["append"]["cu_k"] is not None)
                   for p in parts]
        assert layouts == [(True, True), (True, False), (False, True)] and parts[1]["append"] is None
        assert [None if p["pt"] is None else p["kc"].shape[1] for p in parts] == [16, None, 64]
        assert [p["num_splits"] for p in parts] == [1, 3, 2] and {p["causal"] for p in parts} == {True, False}
        assert 0 in parts[0]["cu_q"].diff().tolist() and 0 in parts[0]["append"]["cu_k"].diff().tolist()
        assert parts[0]["q"].shape[0] > parts[0]["cu_q"][-1]  # packed rows of no entry
        assert parts[0]["append"]["k"].shape[0] > parts[0]["append"]["cu_k"][-1]
        assert 256 in parts[0]["seqused"].tolist() and 256 in parts[1]["seqused"].tolist()  # full rows
        assert 37 in parts[0]["leftpad"].tolist()  # a leftpad mid-block
        for p in parts:
            f = p["fa3"]
            for ds in (f["q_descale"], f["k_descale"], p["descales"][1]):
                assert ds.unique().numel() == ds.numel() and 0.01 <= ds.min() and ds.max() < 0.11
    if feature == "fa3app":  # FA3's FP8 cache with e4m3 new keys: paged (16) and contiguous with 3 splits
        assert [(p["pt"] is not None, p["num_splits"], p["causal"]) for p in parts] == [(True, 1, True),
                                                                                       (False, 3, False)]
        for p in parts:
            a, (kd, vd), f = p["append"], p["descales"], p["fa3"]
            assert a["k"].dtype == a["v"].dtype == torch.float8_e4m3fn and a["cos"] is None
            assert kd.shape == (p["q"].shape[0], p["kc"].shape[2]) and torch.equal(kd, f["q_descale"] * f["k_descale"])
            lens, cap = a["cache_seqlens"].tolist(), p["kc"].shape[1] * (1 if p["pt"] is None else p["pt"].shape[1])
            assert lens[0] == 0 and torch.equal(p["seqused"], a["cache_seqlens"] + a["k"].shape[1])
            assert p["seqused"].tolist()[2] == 300 <= cap  # filled to the row's 300 keys
            assert 448.0 in a["k"].float().flatten().tolist()  # an extreme byte, copied as it is
            _, t, sc = smoke_sim.dec_op_call(p, *smoke.dec_poisoned_outputs(p)[:2])
            assert sc["descale_per_batch"] == 1 and t["k"] is a["k"] and t["rotary_cos"] is None
    elif feature not in ("fa3desc", "fa3pk", "fa3rot"):
        assert all(p.get("fa3") is None for p in parts)
    if feature == "fa3rot":  # batched on a contiguous cache, packed on pages of 16, batched q with packed k
        layouts = [(p["cu_q"] is not None, p["append"]["cu_k"] is not None) for p in parts]
        assert layouts == [(False, False), (True, True), (False, True)]
        assert [None if p["pt"] is None else p["kc"].shape[1] for p in parts] == [None, 16, 64]
        assert [(2 * p["append"]["cos"].shape[1], p["append"]["interleaved"]) for p in parts] == [
            (128, False), (64, True), (32, False)]
        assert [p["num_splits"] for p in parts] == [3, 1, 2] and [p["causal"] for p in parts] == [True, False, True]
        assert parts[1]["append"]["rotary_seqlens"] is not None and 37 in parts[1]["leftpad"].tolist()
        assert all(256 in p["seqused"].tolist() for p in (parts[0], parts[2]))  # rows filled to capacity
    if feature == "page48":
        assert 128 % 48 != 0  # the key block (decode_tile_shape's block_n for d 128) is not a multiple
    if feature == "badidx":  # pages of 16 (TMA pieces) without and with splits, of 8 (gathered)
        assert [(p["kc"].shape[1], p["num_splits"]) for p in parts] == [(16, 1), (16, 3), (8, 1)]
        for p in parts:
            assert p["seqused"].tolist()[0] > p["kc"].shape[1] * p["pt"].shape[1] and p["seqused"].tolist()[2] < 0
            assert (p["pt"] >= p["kc"].shape[0]).any() and (p["pt"] < 0).any() and p["unchecked"] == {1}


def _reference_result(p):
    """What a correct decode step returns: flash3.reference on copies of the caches."""
    from flash3 import reference
    kc, vc = p["kc"].clone(), p["vc"].clone()
    a = p["append"]
    kd, vd = p["descales"] or (None, None)
    q = p["q"]
    k = v = cos = sin = None
    lens = p["seqused"]
    if a is not None:
        k, v, cos, sin, lens = a["k"], a["v"], a["cos"], a["sin"], a["cache_seqlens"]
    left, right = (-1, 0) if p["causal"] else p["window"]
    pt = p["pt"]
    if pt is not None:  # the reference reads page ids as they are: only for in-range tables
        assert ((pt >= 0) & (pt < kc.shape[0])).all()
    out, lse = reference.kvcache_forward(q, kc, vc, k, v, lens.clamp(0, kc.shape[1] * (1 if pt is None else pt.shape[1]))
                                         if a is None else lens, pt, q.shape[-1] ** -0.5, left, right, p["softcap"],
                                         cos, sin, False, kd, vd, 1, p.get("sinks"),
                                         rotary_seqlens=None if a is None else a.get("rotary_seqlens"))
    q_out = None
    if a is not None and cos is not None:
        from flash3.rotary import kvcache_rotary
        ro = lens if a.get("rotary_seqlens") is None else a["rotary_seqlens"]
        q_out = kvcache_rotary(q, k, ro, cos, sin, False, True)[0]
    return {"out": out, "lse": lse, "kc": kc, "vc": vc, "q_out": q_out}


@pytest.mark.parametrize("feature", ["contig", "page48", "split", "gqa", "window", "append", "rotary", "sinks"])
def test_check_dec_accepts_the_reference_and_catches_errors(feature):
    for p in smoke.make_dec_case(feature, "dec:bf16:128:128", device="cpu"):
        r = _reference_result(p)
        res = smoke.check_dec(p, r)
        assert res["status"] == "ok", res
        i = max(range(len(p["seqused"])), key=lambda j: int(p["seqused"][j]))
        bad = dict(r, out=r["out"].clone())
        bad["out"][i, -1, 0, :8] += 0.25
        assert smoke.check_dec(p, bad)["status"] == "wrong"
        if p["append"] is not None and p["append"].get("rotary_seqlens") is not None:
            # an append that rotates at the key positions instead of rotary_seqlens
            at_keys = _reference_result(dict(p, append=dict(p["append"], rotary_seqlens=None)))
            assert smoke.check_dec(p, at_keys)["status"] == "wrong"
        nan = dict(r, lse=r["lse"].clone())
        nan["lse"][i, 0, 0] = float("nan")
        assert smoke.check_dec(p, nan)["status"] == "nan"
        if p["append"] is not None:  # one flipped cache byte is wrong
            kc = r["kc"].clone()
            kc.view(torch.uint8).view(-1)[5] ^= 1
            res = smoke.check_dec(p, dict(r, kc=kc))
            assert res["status"] == "wrong" and "k_cache" in res["detail"]


def test_sinks_checks_need_the_sink():
    """The "sinks" features accept flash3.reference's result with the sinks and reject its result
    without them (what a kernel ignoring FwdParams::sinks / CombineParams::sinks writes)."""
    from flash3 import reference
    c = smoke.make_case("sinks", "bf16", 64, 64, device="cpu")
    args = (c["q"], c["k"], c["v"], c["q"].shape[-1] ** -0.5, -1, 0, 0.0)
    assert smoke.check(c, *reference.forward(*args, sinks=c["sinks"]))["status"] == "ok"
    assert smoke.check(c, *reference.forward(*args))["status"] == "wrong"
    for p in smoke.make_dec_case("sinks", "dec:bf16:128:128", device="cpu"):
        assert smoke.check_dec(p, _reference_result(p))["status"] == "ok"
        assert smoke.check_dec(p, _reference_result(dict(p, sinks=None)))["status"] == "wrong"


def test_check_dec_fp8_append_is_bitwise():
    """The FP8 append is checked byte for byte against reference.quantize_fp8_cache."""
    p = smoke.make_dec_case("append", "dec:kve4m3:bf16:128:128", device="cpu")[0]
    r = _reference_result(p)
    vc = r["vc"].clone()
    idx = (vc.view(torch.uint8) != p["vc"].view(torch.uint8)).nonzero()[0]  # a written slot
    vc.view(torch.uint8)[tuple(idx)] ^= 1
    res = smoke.check_dec(p, dict(r, vc=vc))
    assert res["status"] == "wrong" and "v_cache" in res["detail"]


def _vappend_result(p, **change):
    """flash3.attention_with_kvcache (CPU: the reference) on copies of a "vappend" part's caches, as
    smoke_cases.launch_dec's result; `change`: arguments to alter (a wrong kernel's result)."""
    import flash3
    from flash3 import reference
    a = p["append"]
    kc, vc = p["kc"].clone(), p["vc"].clone()
    kw = dict(cache_seqlens=a["cache_seqlens"], page_table=p["pt"], causal=p["causal"],
              cache_leftpad=p["leftpad"], rotary_cos=a["cos"], rotary_sin=a["sin"],
              rotary_interleaved=a["interleaved"], rotary_seqlens=a["rotary_seqlens"],
              cu_seqlens_k_new=a["cu_k"], return_lse=True, num_splits=p["num_splits"])
    if p["cu_q"] is not None:
        kw.update(cu_seqlens_q=p["cu_q"], max_seqlen_q=p["max_q"])
    kw.update(change)
    out, lse = flash3.attention_with_kvcache(p["q"], kc, vc, a["k"], a["v"], **kw)
    q_out = None
    if a["cos"] is not None:
        q_out = reference.kvcache_append_packed(p["q"], p["kc"].clone(), p["vc"].clone(), a["k"], a["v"],
                                                a["cache_seqlens"], p["pt"], p["cu_q"], a["cu_k"], a["cos"],
                                                a["sin"], a["interleaved"], p["causal"], a["rotary_seqlens"])
    return {"out": out, "lse": lse, "kc": kc, "vc": vc, "q_out": q_out}


def test_check_dec_vappend():
    """vappend: flash3's packed append + attention (the public call on CPU) passes check_dec; an
    append reading packed new keys one row off, q rotated
    at the key positions instead of rotary_seqlens, or a wrong output row do not."""
    parts = smoke.make_dec_case("vappend", "dec:bf16:128:128", device="cpu")
    for p in parts:
        r = _vappend_result(p)
        assert smoke.check_dec(p, r)["status"] == "ok"
        bad = dict(r, out=r["out"].clone())
        bad["out"][2] += 0.25  # the third query row (a packed row of an entry, or entry 1's first batched one)
        assert smoke.check_dec(p, bad)["status"] == "wrong"
        a = p["append"]
        if a["cu_k"] is not None:  # packed new keys read one row off (each entry from its offset - 1)
            k1, v1 = (torch.roll(x, 1, 0) for x in (a["k"], a["v"]))
            wrong = _vappend_result(dict(p, append=dict(a, k=k1, v=v1)))
            res = smoke.check_dec(p, dict(r, kc=wrong["kc"], vc=wrong["vc"]))
            assert res["status"] == "wrong" and "k_cache" in res["detail"]
        if a["rotary_seqlens"] is not None:  # q at the key positions
            at_keys = _vappend_result(dict(p, append=dict(a, rotary_seqlens=None)))
            assert smoke.check_dec(p, dict(r, q_out=at_keys["q_out"]))["status"] == "wrong"


def test_check_dec_fa3pk():
    """fa3pk: flash3's FP8 packed path passes check_dec: the caches of the public call on CPU (the
    reference's append, descale_per_batch), out/lse of the kernel's documented algorithm (x8 *
    descale rounded once to bf16: the same call on a bf16 cache of those values); packed new keys
    read one row off, a wrong output row, or keys read with another entry's descales do not."""
    import flash3
    parts = smoke.make_dec_case("fa3pk", "dec:kve4m3:bf16:128:128", device="cpu")

    def call(p, kc, vc, k, v, **extra):
        a = p["append"] or {}
        kw = dict(cache_seqlens=a.get("cache_seqlens", p["seqused"]), page_table=p["pt"],
                  causal=p["causal"], cache_leftpad=p["leftpad"], cu_seqlens_k_new=a.get("cu_k"),
                  return_lse=True, num_splits=p["num_splits"], **extra)
        if p["cu_q"] is not None:
            kw.update(cu_seqlens_q=p["cu_q"], max_seqlen_q=p["max_q"])
        return flash3.attention_with_kvcache(p["q"], kc, vc, k, v, **kw)

    def result(p, descales=None):
        a = p["append"] or {}
        kd, vd = descales or p["descales"]
        kc, vc = p["kc"].clone(), p["vc"].clone()  # the FP8 call: the append's bytes
        call(p, kc, vc, a.get("k"), a.get("v"), k_descale=kd, v_descale=vd, descale_per_batch=True)
        # the kernel's values: each slab/new key times its batch entry's descale, rounded to bf16
        b = kd.shape[0]
        if p["pt"] is None:
            owner = torch.arange(b)
        else:
            owner = torch.zeros(p["kc"].shape[0], dtype=torch.long)
            owner[p["pt"].long().flatten()] = torch.arange(b).repeat_interleave(p["pt"].shape[1])
        bf = lambda x8, ds: (x8.float() * ds[..., None]).to(torch.bfloat16)  # noqa: E731
        kc16, vc16 = bf(p["kc"], kd[owner][:, None]), bf(p["vc"], vd[owner][:, None])
        k16 = v16 = None
        if a:
            if a["cu_k"] is None:
                ent = torch.arange(b)[:, None].expand(a["k"].shape[:2])
            else:
                rows = torch.arange(a["k"].shape[0])
                ent = torch.searchsorted(a["cu_k"][1:], rows, right=True).clamp(max=b - 1)
            k16, v16 = bf(a["k"], kd[ent]), bf(a["v"], vd[ent])
        out, lse = call(p, kc16, vc16, k16, v16)
        return {"out": out, "lse": lse, "kc": kc, "vc": vc, "q_out": None}

    for p in parts:
        r = result(p)
        assert smoke.check_dec(p, r)["status"] == "ok", smoke.check_dec(p, r)
        bad = dict(r, out=r["out"].clone())
        bad["out"][2] += 0.25  # a query row of an entry (packed) or entry 2 (batched)
        assert smoke.check_dec(p, bad)["status"] == "wrong"
        a = p["append"]
        if a is not None and a["cu_k"] is not None:  # packed new keys read one row off
            k1, v1 = (torch.roll(x, 1, 0) for x in (a["k"], a["v"]))
            wrong = result(dict(p, append=dict(a, k=k1, v=v1)))
            res = smoke.check_dec(p, dict(r, kc=wrong["kc"], vc=wrong["vc"]))
            assert res["status"] == "wrong" and "k_cache" in res["detail"]
        # descales per batch entry are read: the last entry's keys read with entry 0's are wrong
        kd, vd = p["descales"]
        swap = list(range(kd.shape[0] - 1)) + [0]
        assert smoke.check_dec(p, result(p, (kd[swap], vd[swap])))["status"] == "wrong"



def test_check_dec_fa3rot():
    """fa3rot: flash3's FP8 rotary path passes check_dec: the append (caches, and q8 rotated in
    e4m3) of the public FA3 call on CPU (flash_attn_interface -> the reference's
    kvcache_append_packed), out/lse of the kernel's documented algorithm on the rotated q8 as bf16
    (x8 * descale rounded once to bf16); q rotated in bf16 instead of e4m3, a key rotated at
    another position, or a wrong output row do not."""
    import flash3
    from flash3 import flash_attn_interface as fai
    from flash3 import reference
    parts = smoke.make_dec_case("fa3rot", "dec:kve4m3:bf16:128:128", device="cpu")

    def result(p):
        a, f = p["append"], p["fa3"]
        kc, vc = p["kc"].clone(), p["vc"].clone()
        kw = dict(cache_seqlens=a["cache_seqlens"], page_table=p["pt"], causal=p["causal"],
                  cache_leftpad=p["leftpad"], cu_seqlens_k_new=a["cu_k"])
        if p["cu_q"] is not None:
            kw.update(cu_seqlens_q=p["cu_q"], max_seqlen_q=p["max_q"])
        seen = {}
        real = fai._append_new_keys

        def spy(*x, **k):
            res = real(*x, **k)
            seen["q"] = res[0]  # the rotated q8
            return res
        fai._append_new_keys = spy
        try:
            fai.flash_attn_with_kvcache(p["q"], kc, vc, a["k"], a["v"], rotary_cos=a["cos"],
                                        rotary_sin=a["sin"], rotary_interleaved=a["interleaved"],
                                        rotary_seqlens=a["rotary_seqlens"], q_descale=f["q_descale"],
                                        k_descale=f["k_descale"], v_descale=f["v_descale"], **kw)
        finally:
            fai._append_new_keys = real
        # the kernel's values: each slab times its batch entry's descale, rounded to bf16
        kd, vd = p["descales"]
        b = kd.shape[0]
        if p["pt"] is None:
            owner = torch.arange(b)
        else:
            owner = torch.zeros(kc.shape[0], dtype=torch.long)
            owner[p["pt"].long().flatten()] = torch.arange(b).repeat_interleave(p["pt"].shape[1])
        bf = lambda x8, ds: (x8.float() * ds[..., None]).to(torch.bfloat16)  # noqa: E731
        kc16, vc16 = bf(kc, kd[owner][:, None]), bf(vc, vd[owner][:, None])
        att = dict(cache_seqlens=p["seqused"], page_table=p["pt"], causal=p["causal"],
                   cache_leftpad=p["leftpad"], return_lse=True, num_splits=p["num_splits"])
        if p["cu_q"] is not None:
            att.update(cu_seqlens_q=p["cu_q"], max_seqlen_q=p["max_q"])
        out, lse = flash3.attention_with_kvcache(seen["q"].to(torch.bfloat16), kc16, vc16, **att)
        return {"out": out, "lse": lse, "kc": kc, "vc": vc, "q_out": seen["q"]}

    for p in parts:
        r = result(p)
        assert smoke.check_dec(p, r)["status"] == "ok", smoke.check_dec(p, r)
        bad = dict(r, out=r["out"].clone())
        bad["out"][1] += 0.25
        assert smoke.check_dec(p, bad)["status"] == "wrong"
        a = p["append"]
        # q rotated in bf16, rounded to e4m3 only after: not FA3's bytes everywhere
        q16 = reference.kvcache_append_packed(p["q"].to(torch.bfloat16), *(x.clone() for x in (
            p["kc"].to(torch.bfloat16), p["vc"].to(torch.bfloat16))), a["k"].to(torch.bfloat16),
            a["v"].to(torch.bfloat16), a["cache_seqlens"], p["pt"], p["cu_q"], a["cu_k"], a["cos"], a["sin"],
            a["interleaved"], p["causal"], a["rotary_seqlens"])
        res = smoke.check_dec(p, dict(r, q_out=q16.to(torch.float8_e4m3fn)))
        assert res["status"] == "wrong" and "q_out" in res["detail"]
        # the keys rotated one position further: the cache bytes differ
        shifted = dict(a, rotary_seqlens=(a["rotary_seqlens"] if a["rotary_seqlens"] is not None
                                          else a["cache_seqlens"]) + 1)
        kc1 = p["kc"].clone()
        reference.kvcache_append_packed(p["q"], kc1, p["vc"].clone(), a["k"], a["v"], a["cache_seqlens"],
                                        p["pt"], p["cu_q"], a["cu_k"], a["cos"], a["sin"], a["interleaved"],
                                        p["causal"], shifted["rotary_seqlens"])
        res = smoke.check_dec(p, dict(r, kc=kc1))
        assert res["status"] == "wrong" and "k_cache" in res["detail"]

def test_check_dec_vpaged_per_sequence():
    """vpaged (packed queries): each sequence against the oracle, the rows of no sequence 0 / -inf;
    the reference passes, a wrong row, a NaN and a written tail row do not."""
    from flash3 import reference
    parts = smoke.make_dec_case("vpaged", "dec:bf16:128:128", device="cpu")
    assert [p["sinks"] is not None for p in parts] == [False, True, True]  # the epilogue's and combine's
    for p in parts:
        args = (p["q"], p["kc"], p["vc"], p["cu_q"], p["seqused"], p["pt"], None, p["q"].shape[-1] ** -0.5, -1, 0, 0.0)
        out, lse = reference.varlen_cache_forward(*args, sinks=p["sinks"])
        r = {"out": out, "lse": lse, "kc": p["kc"], "vc": p["vc"], "q_out": None}
        assert smoke.check_dec(p, r)["status"] == "ok"
        if p["sinks"] is not None:  # the sinks are checked: the result without them is wrong
            assert smoke.check_dec(p, dict(r, **dict(zip(("out", "lse"),
                                                         reference.varlen_cache_forward(*args)))))["status"] == "wrong"
        last = int(p["cu_q"][-1]) - 1  # the last row of the longest sequence
        bad = out.clone()
        bad[last, 0, :8] += 0.25
        assert smoke.check_dec(p, dict(r, out=bad))["status"] == "wrong"
        nan = lse.clone()
        nan[0, 0] = float("nan")
        assert smoke.check_dec(p, dict(r, lse=nan))["status"] == "nan"
        tail = out.clone()
        tail[-1] = 1
        res = smoke.check_dec(p, dict(r, out=tail))
        assert res["status"] == "wrong" and "no sequence" in res["detail"]


def test_check_dec_bad_index_contract():
    p = smoke.make_dec_case("badidx", "dec:bf16:128:128", device="cpu")[0]
    from flash3 import reference
    cap = p["kc"].shape[1] * p["pt"].shape[1]
    out, lse = reference.kvcache_forward(p["q"][:1], p["kc"].clone(), p["vc"].clone(), None, None,
                                         torch.tensor([cap], dtype=torch.int32), p["pt"][:1],
                                         p["q"].shape[-1] ** -0.5, -1, -1)
    full_out = torch.zeros(3, *out.shape[1:], dtype=out.dtype)
    full_lse = torch.full((3, *lse.shape[1:]), float("-inf"))
    full_out[0], full_lse[0] = out[0], lse[0]
    full_out[1], full_lse[1] = 1.0, 0.5  # row 1 (bad page ids): anything finite
    r = {"out": full_out, "lse": full_lse, "kc": p["kc"], "vc": p["vc"], "q_out": None}
    assert smoke.check_dec(p, r)["status"] == "ok"
    r1 = dict(r, out=full_out.clone())
    r1["out"][1, 0, 0, 0] = float("inf")
    assert smoke.check_dec(p, r1)["status"] == "wrong"
    r2 = dict(r, out=full_out.clone())
    r2["out"][2] = 1e-3  # a row of no keys must be exactly 0
    assert smoke.check_dec(p, r2)["status"] == "wrong"


def test_render_matrix_groups_decode_kernels():
    cases = [{"kernel": "bf16:128:128", "feature": f, "status": "ok", "seconds": 1.0} for f in ("full", "causal")]
    cases += [{"kernel": "dec:bf16:128:128", "feature": f, "status": "ok", "seconds": 2.0} for f in ("contig", "split")]
    cases += [{"kernel": "dec:kve4m3:bf16:128:128", "feature": "contig", "status": "wrong", "detail": "x"}]
    lines = smoke.render_matrix(cases).splitlines()
    assert lines[0].split() == ["kernel", "full", "causal"]
    assert lines[1].split() == ["bf16", "128", "ok", "ok"]
    assert lines[2].split() == ["kernel", "contig", "split"]
    assert lines[3].split() == ["dec", "bf16", "128", "ok", "ok"]
    assert lines[4].split() == ["dec", "kve4m3", "bf16", "128", "WRONG"]  # its split: not run here
    assert lines[5].startswith("5 cases: 4 ok, 1 wrong")
    t = smoke.render_times(cases).splitlines()
    assert t[2].split() == ["seconds", "contig", "split"] and t[3].split() == ["dec", "bf16", "128", "2.0", "2.0"]


# ------------------------------------------------------------------ quantize family

import smoke_quant  # noqa: E402

QUANT_IDS = ["quant:bf16", "quant:fp16"]


def test_quant_kernel_ids_labels_and_features(monkeypatch):
    info = {"fwd": [["bf16", 128, 128]], "decode": [["bf16", 128, 128]], "quantize_fp8": ["bf16", "fp16"]}
    assert smoke.kernel_ids(info) == ["bf16:128:128", "dec:bf16:128:128"] + QUANT_IDS
    for kid, dt in zip(QUANT_IDS, ("bf16", "fp16")):
        assert smoke.family(kid) == "quant" and smoke_quant.quant_dtype(kid) == dt
        assert smoke.kernel_label(kid) == f"quant {dt}"
        assert smoke.kernel_features(kid) == smoke_quant.QUANT_FEATURES
    # "perhead" names a feature of both FEATURES (FP8 forward) and QUANT_FEATURES: each family its own case.
    assert not any(smoke.applies("quant:bf16", f) for f in smoke.FEATURES + smoke.DEC_FEATURES
                   if f not in smoke_quant.QUANT_FEATURES)
    assert smoke.applies("quant:bf16", "perhead") and smoke.applies("e4m3:128:128", "perhead")
    assert not smoke.applies("bf16:128:128", "perhead") and not smoke.applies("dec:bf16:128:128", "perhead")
    assert not any(smoke.applies(k, f) for k in ("bf16:128:128", "dec:bf16:128:128")
                   for f in smoke_quant.QUANT_FEATURES)
    with pytest.raises(ValueError, match="not a quant kernel id"):
        smoke_quant.quant_dtype("quant:e4m3")
    with pytest.raises(ValueError, match="does not apply"):
        smoke_quant.make_case("full", "quant:bf16", device="cpu")
    # On a GPU: kernel_info() lists no quantize kernel; the op's presence adds both ids.
    monkeypatch.setattr(torch.ops.flash3, "kernel_info", lambda: json.dumps({"fwd": [["bf16", 64, 64]]}),
                        raising=False)
    monkeypatch.setattr(smoke_quant, "gpu_info", lambda: {"quantize_fp8": ["bf16", "fp16"]})
    assert smoke.built_kernel_ids() == ["bf16:64:64"] + QUANT_IDS
    monkeypatch.setattr(smoke_quant, "gpu_info", lambda: {})
    assert smoke.built_kernel_ids() == ["bf16:64:64"]


def test_quant_gpu_info_follows_the_extension(monkeypatch):
    from flash3 import _quantize
    monkeypatch.setattr(_quantize, "available", lambda: False)
    assert smoke_quant.gpu_info() == {}
    monkeypatch.setattr(_quantize, "available", lambda: True)
    assert smoke_quant.gpu_info() == {"quantize_fp8": ["bf16", "fp16"]}


@pytest.mark.parametrize("kid", QUANT_IDS)
@pytest.mark.parametrize("feature", smoke_quant.QUANT_FEATURES)
def test_make_quant_case_and_op_call(kid, feature):
    """Each part is a call quantize_fp8_sm90 takes (flash3/_quantize.py's rules), its poisoned
    outputs have the op's shapes, and op_call names the arguments as sim_op_quantize.cu reads them."""
    from flash3 import hadamard
    parts = smoke_quant.make_case(feature, kid, device="cpu")
    dtype = torch.bfloat16 if kid == "quant:bf16" else torch.float16
    assert parts and len(parts) == (2 if feature in ("tiny", "perhead") else 1)
    for p in parts:
        x = p["x"]
        b, s, h, d = x.shape
        bs = p["block_size"]
        assert x.dtype == dtype and x.is_contiguous() and d % 8 == 0 and bs > 0
        m = hadamard.block_structure(d)[0]
        if p["signs"] is not None:
            assert p["signs"].dtype == torch.float32 and torch.equal(p["signs"],
                                                                     hadamard.random_signs(d, p["seed"]))
            assert m in (1, 3, 5) and hadamard.block_structure(d)[1] >= 8
        assert p["exact"] == (p["signs"] is None or m == 1)
        for t in (p["mean"], p["cd"]):
            assert t is None or (t.dtype == torch.float32 and t.shape == (b, h, d))
        out, descale = smoke_quant.poisoned_outputs(p)
        assert out.dtype == torch.float8_e4m3fn and (out.view(torch.uint8) == 0x7F).all()
        assert descale.shape == (b, h, -(-s // bs)) and torch.isnan(descale).all()
        if p["layout"] == smoke_quant.LAYOUTS["v_packed"]:
            assert bs % 16 == 0 and out.shape == (b, h, d, -(-s // 16) * 16)
        else:
            assert out.shape == x.shape
        op, t, sc = smoke_quant.op_call(p, out, descale)
        assert op == "quantize_fp8" and sc == {"block_size": bs, "layout": p["layout"]}
        want = dict(x=x, signs=p["signs"], mean=p["mean"], channel_descale=p["cd"], out=out, descale=descale)
        assert t.keys() == want.keys() and all(t[n] is v for n, v in want.items())
        ref8, refd = smoke_quant.reference(p)
        assert ref8.shape == out.shape and refd.shape == descale.shape
    p = parts[0]
    b, s, h, d = p["x"].shape
    if feature in ("rows", "vpacked", "hadamard", "hartley3", "hartley5", "chdesc"):
        assert s % p["block_size"] and s // p["block_size"] >= 1  # several blocks and a partial one
    if feature == "perhead":  # more 8-channel units than 512 threads x 8 cached each
        assert p["block_size"] == s and p["ref_block"] is None and s * d // 8 > 512 * 8
    if feature.startswith("hartley"):
        assert hadamard.block_structure(d)[0] == int(feature[-1]) and not p["exact"]
    if feature == "extreme":
        fi = torch.finfo(p["x"].dtype)
        x = p["x"].float()
        assert x.abs().max() == fi.max and (x == fi.smallest_normal * fi.eps).any()
        assert (x.view(torch.int32) == -2 ** 31).any()  # -0
        assert refd[0, :, 1].eq(2.0 ** -4).all() and refd[0, :, 2].eq(1.0).all()
        assert (ref8.view(torch.uint8) == 0x80).any()
    if feature == "tiny":
        for q in parts:
            assert smoke_quant.reference(q)[1].eq(torch.finfo(torch.float32).tiny).all()


def test_quant_case_files(tmp_path):
    """The poisoned e4m3 out and the scalars in the case directory; absent optional tensors left out."""
    p = smoke_quant.make_case("vpacked", "quant:fp16", device="cpu")[0]
    out, descale = smoke_quant.poisoned_outputs(p)
    smoke_sim.write_case(tmp_path, *smoke_quant.op_call(p, out, descale))
    op, t, sc = smoke_sim.read_case(tmp_path)
    assert op == "quantize_fp8" and set(t) == {"x", "out", "descale"} and sc == {"block_size": 64, "layout": 1}
    assert torch.equal(t["x"], p["x"]) and (t["out"].view(torch.uint8) == 0x7F).all()
    assert t["out"].shape == (2, 2, 128, 208) and torch.isnan(t["descale"]).all()


@pytest.mark.parametrize("feature", ["rows", "vpacked", "hartley3", "extreme"])
def test_quant_check_accepts_the_reference_and_catches_errors(feature):
    p = smoke_quant.make_case(feature, "quant:bf16", device="cpu")[0]
    out, descale = smoke_quant.reference(p)
    ok = smoke_quant.check(p, {"out": out, "descale": descale})
    assert ok["status"] == "ok", ok
    nan = out.clone()
    nan.view(torch.uint8).view(-1)[7] = 0xFF  # one unwritten (NaN) byte
    assert smoke_quant.check(p, {"out": nan, "descale": descale})["status"] == "nan"
    d = descale.clone()
    d.view(torch.int32).view(-1)[-1] += 1  # one ulp (exact: wrong; within 2e-7 otherwise)
    assert smoke_quant.check(p, {"out": out, "descale": d})["status"] == ("wrong" if p["exact"] else "ok")
    d.view(-1)[-1] *= 1.001
    assert smoke_quant.check(p, {"out": out, "descale": d})["status"] == "wrong"
    u = out.view(torch.uint8).contiguous()
    mid = ((u & 0x7F) > 0x10) & ((u & 0x7F) < 0x70)  # a step or two either way stays finite
    i = tuple(mid.nonzero()[0])

    def got(bytes_):
        return {"out": bytes_.view(torch.float8_e4m3fn), "descale": descale}
    one = u.clone()
    one[i] += 1  # one e4m3 step
    res = smoke_quant.check(p, got(one))
    assert res["status"] == ("wrong" if p["exact"] else "ok"), res
    if p["exact"]:
        assert "differs bitwise" in res["detail"]
        if (u == 0x80).any():
            zero = u.clone()
            zero[u == 0x80] = 0  # -0 written as +0
            assert smoke_quant.check(p, got(zero))["status"] == "wrong"
    else:
        two = u.clone()
        two[i] += 2
        assert smoke_quant.check(p, got(two))["status"] == "wrong"
        many = u.clone()
        many[mid] += 1  # every one a step off: beyond 1e-3 of the values
        assert smoke_quant.check(p, got(many))["status"] == "wrong"


def test_sim_worker_quant(monkeypatch, capsys):
    """Every part of the feature launched with every seed, checked by smoke_quant.check; outputs
    bitwise equal across seeds."""
    calls = []

    def fake_launch(p, driver, seed=1, sms=None):
        calls.append((p["feature"], seed))
        out, descale = smoke_quant.reference(p)
        if seed == 2 and p["feature"] == "rows":
            descale = descale.clone()
            descale.view(-1)[0] = 3.0
        return {"out": out, "descale": descale}
    monkeypatch.setattr(smoke_sim, "quant_launch", fake_launch)
    assert smoke.sim_worker("quant:bf16", ["tiny", "rows"], "driver", [1, 2], seeds_all=True) == 0
    res = [r for r in map(json.loads, capsys.readouterr().out.splitlines()) if "status" in r]
    assert calls == [("tiny", 1), ("tiny", 2), ("tiny", 1), ("tiny", 2), ("rows", 1), ("rows", 2)]
    assert res[0]["status"] == "ok" and res[0]["kernel"] == "quant:bf16"
    assert res[1]["status"] == "wrong" and "descale" in res[1]["detail"] and res[1]["seed"] == 2


def test_render_matrix_and_plan_with_quant_kernels():
    cases = [{"kernel": "bf16:128:128", "feature": "full", "status": "ok"}]
    cases += [{"kernel": "quant:bf16", "feature": f, "status": "ok"} for f in ("rows", "tiny")]
    cases += [{"kernel": "quant:fp16", "feature": "rows", "status": "hang", "detail": "silent"}]
    lines = smoke.render_matrix(cases).splitlines()
    assert lines[0].split() == ["kernel", "full"] and lines[1].split() == ["bf16", "128", "ok"]
    assert lines[2].split() == ["kernel", "rows", "tiny"]
    assert lines[3].split() == ["quant", "bf16", "ok", "ok"] and lines[4].split() == ["quant", "fp16", "HANG"]
    p = smoke.plan(cases)
    assert p["HANG_CASES"] == "quant:fp16/rows" and p["PYTEST_K"] == "not test_quantize_kernel"


# ------------------------------------------------------------------ backward family

BWD_FEATURES = smoke.kernel_features("bwd:bf16:64:64")


def test_backward_tus_follow_the_knobs(monkeypatch):
    monkeypatch.setenv("FLASH3_HDIMS", "128")
    monkeypatch.setenv("FLASH3_DTYPES", "bf16")
    names = [p.name for p in smoke_sim.selected_tus(ROOT / "csrc", ("bwd",))]
    assert names == ["bwd_bf16_hdim128_sm90.cu"] and (ROOT / "csrc" / "generated" / names[0]).exists()


@pytest.mark.parametrize("feature", BWD_FEATURES)
def test_bwd_op_call(feature):
    """The arguments smoke.launch_bwd gives bwd_sm90, by the names sim_op_bwd.cu reads."""
    c = smoke.make_case(feature, "bf16", 64, 64, device="cpu", bwd=True)
    out, lse = smoke_sim.poisoned_outputs(c)
    dq, dk, dv = (torch.full_like(c[n], float("nan")) for n in "qkv")
    dsinks = torch.full_like(c["sinks"], float("nan")) if feature == "sinks" else None
    op, t, s = smoke_sim.bwd_op_call(c, out, lse, dq, dk, dv, dsinks)
    if feature == "chunk":  # attention_chunk: a scalar of the driver's bwd op, part 0's
        assert op == "bwd" and s.pop("attention_chunk") == 48
        assert (s["window_left"], s["window_right"]) == (-1, 0) and t["cu_seqlens_q"] is c["cu_q"]
        return
    assert op == "bwd"
    want = dict(dout=c["dout"], q=c["q"], k=c["k"], v=c["v"], out=out, lse=lse, dlse=c["dlse"], dq=dq, dk=dk, dv=dv,
                cu_seqlens_q=c["cu_q"], cu_seqlens_k=c["cu_k"], sinks=c.get("sinks"), dsinks=dsinks,
                alibi_slopes=c.get("alibi"), seqused_q=c.get("seqused_q"))
    if feature == "sequsedq":
        assert not torch.isfinite(t["dout"][smoke.past_seqused_q(c)]).any()
    assert t.keys() == want.keys() and all(t[n] is x for n, x in want.items())
    causal = feature in ("causal", "dlse", "sq_gt_sk", "sinks", "sequsedq", "determ")
    left, right = (97, 13) if feature == "window" else (-1, 0) if causal else (-1, -1)
    d, dv = (40, 40) if feature == "nextdim" else (64, 64)  # nextdim: the case's own head dims
    assert (t["q"].shape[-1], t["k"].shape[-1], t["v"].shape[-1], t["dout"].shape[-1]) == (d, d, dv, dv)
    assert s == dict(max_seqlen_q=c["max_q"], max_seqlen_k=c["max_k"], softmax_scale=d ** -0.5,
                     window_left=left, window_right=right,
                     softcap=5.0 if feature == "softcap" else 0.0, deterministic=feature == "determ")
    if feature == "dlse":  # lse's shape and dtype (batched: (b, h, s_q))
        assert t["dlse"].dtype == torch.float32 and t["dlse"].shape == lse.shape == (2, 2, smoke.SQ)
    elif feature == "sinks":  # varlen: (h, total_q); GQA 6/2; float32 (h,) sinks, head 1's -inf
        n = smoke.SQ + 77 + 90
        assert t["dlse"].dtype == torch.float32 and t["dlse"].shape == lse.shape == (6, n)
        assert t["sinks"].dtype == torch.float32 and t["sinks"].shape == (6,) and t["sinks"][1] == -math.inf
        assert torch.isfinite(t["sinks"][[0, 2, 3, 4, 5]]).all()
        assert t["cu_seqlens_q"].tolist() == [0, smoke.SQ, smoke.SQ, smoke.SQ + 77, n]
        assert t["cu_seqlens_k"].tolist() == [0, smoke.SK, smoke.SK + 40, smoke.SK + 40, smoke.SK + 101]
        assert (t["q"].shape[1], t["k"].shape[1]) == (6, 2)
    else:
        assert t["dlse"] is None and t["sinks"] is None
    if feature == "varlen":
        assert t["cu_seqlens_q"].tolist() == [0, smoke.SQ, smoke.SQ, smoke.SQ + 77, smoke.SQ + 78]
        assert t["cu_seqlens_k"].tolist() == [0, smoke.SK, smoke.SK + 40, smoke.SK + 190, smoke.SK + 190]
        assert lse.shape == (2, smoke.SQ + 78) and t["dout"].shape == (smoke.SQ + 78, 2, 64)
    if feature == "onekey":  # (70, 1), (2, 1), (1, 3), (5, 1): rows that see a single key
        assert t["cu_seqlens_q"].tolist() == [0, 70, 72, 73, 78] and t["cu_seqlens_k"].tolist() == [0, 1, 2, 5, 6]
        assert lse.shape == (2, 78) and t["dout"].shape == (78, 2, 64) and (s["max_seqlen_q"], s["max_seqlen_k"]) == (70, 3)
    if feature == "sq_gt_sk":  # more queries than keys; dout and lse follow q
        assert lse.shape == (2, 2, smoke.SK) and t["k"].shape[1] == smoke.SQ and t["dout"].shape[1] == smoke.SK
        assert (s["max_seqlen_q"], s["max_seqlen_k"]) == (smoke.SK, smoke.SQ)


def _fake_run_case(calls, fwd_value=0.0):
    """run_case's stand-in: records (op, seed, tensors, keep); the forward returns fwd_value, each
    backward launch its seed in every gradient (after checking they came NaN-poisoned)."""
    def run(op, tensors, scalars, outputs, driver, seed=1, sms=None, timeout=1800, keep=None):
        calls.append((op, seed, tensors, keep))
        if op == "fwd":
            return {n: torch.full_like(t, fwd_value) for n, t in outputs.items()}
        assert list(outputs) in (["dq", "dk", "dv"], ["dq", "dk", "dv", "dsinks"])
        assert all(torch.isnan(x).all() for x in outputs.values())
        return {n: torch.full_like(x, seed) for n, x in outputs.items()}
    return run


@pytest.mark.parametrize("feature", ["full", "determ", "sinks"])
def test_bwd_launch_mirrors_launch_bwd(monkeypatch, tmp_path, feature):
    """The forward, then one backward launch on its out/lse (deterministic: a second one with the
    next schedule seed), each in its own case directory under keep."""
    calls = []
    monkeypatch.setattr(smoke_sim, "run_case", _fake_run_case(calls))
    c = smoke.make_case(feature, "bf16", 64, 64, device="cpu", bwd=True)
    out, lse, grads, again = smoke_sim.bwd_launch(c, Path("driver"), seed=5, keep=tmp_path)
    det = feature == "determ"
    assert [(op, seed, keep.name) for op, seed, _, keep in calls] == [
        ("fwd", 5, "fwd"), ("bwd", 5, "bwd")] + ([("bwd", 6, "bwd_again")] if det else [])
    for _, _, t, _ in calls[1:]:
        assert t["out"] is out and t["lse"] is lse and t["dout"] is c["dout"]
    names = ["q", "k", "v"] + (["sinks"] if feature == "sinks" else [])
    assert [g.shape for g in grads] == [c[n].shape for n in names] and all((g == 5).all() for g in grads)
    if feature == "sinks":  # the forward kernel itself takes the sinks; its out/lse go on unchanged
        assert calls[0][2]["sinks"] is c["sinks"] and all(t["sinks"] is c["sinks"] for _, _, t, _ in calls[1:])
        assert torch.equal(lse, torch.zeros_like(lse)) and torch.equal(out, torch.zeros_like(out))
    assert (again is not None) == det and (not det or all((g == 6).all() for g in again))


def test_bwd_launch_refuses_a_nan_forward(monkeypatch):
    calls = []
    monkeypatch.setattr(smoke_sim, "run_case", _fake_run_case(calls, float("nan")))
    c = smoke.make_case("full", "bf16", 64, 64, device="cpu", bwd=True)
    with pytest.raises(RuntimeError, match="forward kernel left NaN"):
        smoke_sim.bwd_launch(c, Path("driver"))
    assert [op for op, *_ in calls] == ["fwd"]


@pytest.mark.parametrize("feature,differs,status", [
    ("full", None, "ok"), ("full", "dq", "ok"), ("full", "dk", "wrong"), ("full", "lse", "wrong"),
    ("determ", "dq", "wrong")])
def test_sim_worker_bwd_seeds(monkeypatch, capsys, feature, differs, status):
    """Each seed runs the forward and the backward; their outputs must be bitwise equal across
    seeds, but for dq outside deterministic mode (its tiles are summed in schedule order)."""
    def fake_launch(c, driver, seed=1, sms=None):
        out, lse = (torch.zeros(3) for _ in range(2))
        dq, dk, dv = (torch.zeros(2) for _ in range(3))
        got = dict(out=out, lse=lse, dq=dq, dk=dk, dv=dv)
        if differs:
            got[differs] += seed
        return got["out"], got["lse"], [got["dq"], got["dk"], got["dv"]], None
    monkeypatch.setattr(smoke_sim, "bwd_launch", fake_launch)
    monkeypatch.setattr(smoke, "check_bwd", lambda *a: {"status": "ok", "err": 0.0, "tol": 1.0})
    assert smoke.sim_worker("bwd:bf16:64:64", [feature], "driver", [1, 2], seeds_all=True) == 0
    res = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert res["status"] == status and res["seeds"] == [1, 2], res
    if status == "wrong":
        assert res["detail"].startswith("seed 2's outputs differ bitwise from seed 1's")


# ------------------------------------------------------------------ the CI subset, TU kinds, the driver's options

CI_INFO = {"fwd": [["bf16", 64, 64], ["bf16", 128, 128], ["fp16", 128, 128]], "fwd_fp8": [[128, 128]],
           "decode": [["bf16", 128, 128], ["fp16", 64, 64]], "decode_fp8_cache": [["bf16", 128, 128]],
           "bwd": [["bf16", 64, 64], ["bf16", 128, 128], ["fp16", 128, 128]], "quantize_fp8": ["bf16"]}


def test_ci_cases_cover_every_kernel_and_feature():
    """Every kernel at least once, every feature of each family (FP8-cache decode apart from 16-bit
    decode) at least once, only features that apply, each once, in matrix order; the 16-bit forward
    kernels of OVERLAP_HEAD_DIMS get both full (the static schedule) and causal (the dynamic one)."""
    ids = smoke.kernel_ids(CI_INFO)
    assert ids == ["bf16:64:64", "bf16:128:128", "fp16:128:128", "e4m3:128:128", "bwd:bf16:64:64",
                   "bwd:bf16:128:128", "bwd:fp16:128:128", "dec:bf16:128:128", "dec:fp16:64:64",
                   "dec:kve4m3:bf16:128:128", "quant:bf16"]
    jobs = smoke.ci_cases(ids)
    assert [k for k, _ in jobs] == ids and all(fs for _, fs in jobs)
    got = dict(jobs)
    for k, fs in jobs:
        assert all(smoke.applies(k, f) for f in fs), (k, fs)
        assert fs == [f for f in smoke.kernel_features(k) if f in fs], (k, fs)  # matrix order, no repeats
    groups = {}
    for k in ids:
        groups.setdefault((smoke.family(k), smoke.dec_fp8_cache(k)), []).append(k)
    assert len(groups) == 7  # bf16, fp16, e4m3, bwd, dec, dec FP8 cache, quant
    firsts = {("bf16", False), ("bwd", False), ("dec", False)}  # CI_ONCE features run in these groups only
    for key, ks in groups.items():
        want = set(smoke.kernel_features(ks[0])) - (set() if key in firsts else smoke.CI_ONCE)
        assert {f for k in ks for f in got[k]} == want, ks
    assert smoke.CI_ONCE == {"sinks", "alibi", "sequsedq"}
    # The j-th case of a family is (kernel j mod m, feature j mod n): bf16's two kernels alternate.
    # 14 bf16 features, alternating between its two kernels: the even-numbered ones here
    # (and causal on bf16 64: an OVERLAP_HEAD_DIMS kernel)
    assert got["bf16:64:64"] == ["full", "causal", "window", "gqa", "kvcache", "nextdim", "sinks", "sequsedq"]
    assert got["bf16:128:128"] == ["full", "causal", "softcap", "varlen", "sq_gt_sk", "nantail", "alibi", "chunk"]
    for f in smoke.CI_ONCE:
        assert f not in got["fp16:128:128"] and (f in got["dec:bf16:128:128"]) == (f in smoke.DEC_FEATURES)
    # alone in its group: every FP8-cache feature (vappend is the 16-bit caches' only, "mla",
    # "mlaapp" and "mlachunk" the MLA kernel's only)
    assert got["dec:kve4m3:bf16:128:128"] == [f for f in smoke.DEC_FEATURES
                                              if f not in smoke.CI_ONCE | {"vappend", *smoke.MLA_FEATURES}]
    assert set(got["dec:bf16:128:128"]).isdisjoint(got["dec:fp16:64:64"])
    assert got["e4m3:128:128"] == [f for f in smoke.kernel_features("e4m3:128:128") if f not in smoke.CI_ONCE]
    assert "perhead" in got["e4m3:128:128"] and "chunk" in got["e4m3:128:128"]
    assert got["quant:bf16"] == smoke_quant.QUANT_FEATURES
    bwd_cases = got["bwd:bf16:64:64"] + got["bwd:bf16:128:128"] + got["bwd:fp16:128:128"]
    assert set(bwd_cases) >= {"determ", "dlse", "sinks", "alibi"}
    assert bwd_cases.count("sinks") == 1 and bwd_cases.count("alibi") == 1 and bwd_cases.count("sequsedq") == 1
    # The overlapped epilogue: full and causal on each 16-bit forward kernel of d 64, 96 and 128
    # (not on the backward).
    assert smoke.OVERLAP_HEAD_DIMS == {(64, 64), (96, 96), (128, 128)}
    for k in ("bf16:64:64", "bf16:128:128", "fp16:128:128"):
        assert {"full", "causal"} <= set(got[k]), k
    assert "full" not in got["bwd:bf16:128:128"]
    assert smoke.ci_cases(["fp16:64:64"]) == [("fp16:64:64", smoke.kernel_features("fp16:64:64"))]


def test_ci_cases_run_the_mla_kernel_on_its_feature():
    """The MLA decode kernel (dec:bf16:64:512) joins the 16-bit decode group: it runs "mla",
    "mlaapp" and "mlachunk" (its only features) and nothing else, and no other kernel runs them;
    --ci-extra adds nothing to it."""
    info = dict(CI_INFO, decode=CI_INFO["decode"] + [["bf16", 64, 512]])
    ids = smoke.kernel_ids(info)
    assert "dec:bf16:64:512" in ids
    got = dict(smoke.ci_cases(ids))
    assert got["dec:bf16:64:512"] == ["mla", "mlaapp", "mlachunk"]
    for f in smoke.MLA_FEATURES:
        assert [k for k, fs in got.items() if f in fs] == ["dec:bf16:64:512"]
    assert set(got["dec:bf16:128:128"]) | set(got["dec:fp16:64:64"]) == set(smoke.kernel_features("dec:bf16:128:128"))
    assert dict(smoke.ci_extra_cases(ids))["dec:bf16:64:512"] == []


def test_ci_extra_cases_give_every_tu_three_features():
    """--ci-extra: beside ci_cases, every kernel TU gets three features that reach it, its family's
    riskiest among them; nothing ci_cases runs already, no CI_ONCE feature, matrix order."""
    ids = smoke.kernel_ids(CI_INFO)
    base, extra = dict(smoke.ci_cases(ids)), dict(smoke.ci_extra_cases(ids))
    assert list(extra) == ids
    for k in ids:
        fs = extra[k]
        assert not set(fs) & set(base[k]) and not set(fs) & smoke.CI_ONCE, (k, fs)
        assert fs == [f for f in smoke.kernel_features(k) if f in fs], (k, fs)
        run = set(base[k]) | set(fs)
        risky = smoke.CI_RISKIEST.get(smoke.family(k))
        assert len(run) >= 3 and (risky is None or risky in run), (k, run)
    assert extra["bf16:128:128"] == []  # base: full, causal, softcap, varlen, sq_gt_sk, nantail, ...
    assert "vpaged" in base["dec:bf16:128:128"] + extra["dec:bf16:128:128"]
    assert extra["quant:bf16"] == []  # five features already


def test_ci_all_cases_is_both_parts_in_one_worker_per_kernel():
    """--ci --ci-extra: per kernel, ci_cases' features (every seed) then ci_extra_cases' (tokens with
    ONE_SEED: first seed only); every kernel once, the backward ones first."""
    ids = smoke.kernel_ids(CI_INFO)
    base, extra = dict(smoke.ci_cases(ids)), dict(smoke.ci_extra_cases(ids))
    got = smoke.ci_all_cases(ids)
    assert sorted(k for k, _ in got) == sorted(ids)
    fams = [smoke.family(k) for k, _ in got]
    assert fams == sorted(fams, key=lambda f: f != "bwd") and fams[0] == "bwd"
    for k, toks in got:
        assert toks == base[k] + [f + smoke.ONE_SEED for f in extra[k]], k
        assert [smoke.feature_name(t) for t in toks if t.endswith(smoke.ONE_SEED)] == extra[k]


def run_quant_worker(monkeypatch, capsys, features, seeds_all):
    """smoke.sim_worker on quant:bf16 with seeds [1, 2] and the simulator launch replaced by the
    reference: ([(feature, seed) per launch], the worker's result records)."""
    calls = []

    def fake_launch(p, driver, seed=1, sms=None):
        calls.append((p["feature"], seed))
        out, descale = smoke_quant.reference(p)
        return {"out": out, "descale": descale}
    monkeypatch.setattr(smoke_sim, "quant_launch", fake_launch)
    assert smoke.sim_worker("quant:bf16", features, "driver", [1, 2], seeds_all=seeds_all) == 0
    return calls, [r for r in map(json.loads, capsys.readouterr().out.splitlines()) if "status" in r]


def test_sim_worker_one_seed_token(monkeypatch, capsys):
    """A ONE_SEED token runs with the first seed only even with seeds_all; its record names the
    feature."""
    first = smoke_quant.QUANT_FEATURES[0]
    calls, res = run_quant_worker(monkeypatch, capsys, [first, "tiny" + smoke.ONE_SEED], seeds_all=True)
    assert calls == [(first, 1), (first, 2), ("tiny", 1), ("tiny", 1)]  # tiny: two parts, one seed
    assert [(r["feature"], r["seeds"]) for r in res] == [(first, [1, 2]), ("tiny", [1])]


def test_kinds_for():
    """The TU kinds a set of kernel ids needs, in ALL_KINDS order (a backward case runs its forward
    first; the quantize, append and combine kernels are always linked)."""
    assert smoke_sim.ALL_KINDS == ("fwd", "decode", "bwd")
    assert smoke_sim.kinds_for(["bf16:128:128"]) == ("fwd",)
    assert smoke_sim.kinds_for(["e4m3:128:128", "fp16:64:64"]) == ("fwd",)
    assert smoke_sim.kinds_for(["bwd:bf16:128:128"]) == ("fwd", "bwd")
    assert smoke_sim.kinds_for(["dec:kve4m3:bf16:128:128"]) == ("decode",)
    assert smoke_sim.kinds_for(["quant:bf16", "quant:fp16"]) == ()
    assert smoke_sim.kinds_for(["dec:bf16:64:64", "quant:bf16", "bwd:fp16:64:64"]) == smoke_sim.ALL_KINDS
    assert smoke_sim.kinds_for(smoke.kernel_ids(CI_INFO)) == smoke_sim.ALL_KINDS
    assert smoke_sim.kinds_for([]) == ()


class _Built(Exception):
    pass


@pytest.mark.parametrize("args,kinds", [
    (["--cases", "dec:bf16:128:128/contig,quant:bf16/rows"], ("decode",)),
    (["--cases", "bwd:bf16:64:64/full bf16:64:64/causal"], ("fwd", "bwd")),
    (["--kernels", "e4m3:128:128,quant:fp16", "--ci"], ("fwd",)),
    (["--ci"], ("fwd", "decode", "bwd")),
    ([], ("fwd", "decode", "bwd"))])
def test_sim_main_builds_only_the_kinds_it_needs(monkeypatch, args, kinds):
    built = []

    def fake_build(jobs=None, kinds=smoke_sim.ALL_KINDS):
        built.append(kinds)
        raise _Built
    monkeypatch.setattr(smoke_sim, "build_driver", fake_build)
    with pytest.raises(_Built):
        smoke.main(["--backend", "sim"] + args)
    assert built == [kinds]


RECORDING_WORKER = """
import json, os, sys
a = sys.argv
open(os.environ["ARGV_LOG"], "a").write(json.dumps(a[1:]) + "\\n")
print(json.dumps({"ready": True, "flash3": "/fake"}), flush=True)
for f in a[a.index("--features") + 1].split(","):
    print(json.dumps({"begin": f}), flush=True)
    print(json.dumps({"kernel": a[a.index("--kernel") + 1], "feature": f, "status": "ok"}), flush=True)
"""


@pytest.mark.parametrize("first_only", [False, True])
def test_sim_driver_runs_every_seed_by_default(tmp_path, monkeypatch, first_only):
    """--backend sim hands its workers --seeds-all (every case with every seed) unless
    --first-seed-only; the JSON's meta names the backend and the seeds."""
    import subprocess
    worker = tmp_path / "worker.py"
    worker.write_text(RECORDING_WORKER)
    log, out = tmp_path / "argv.log", tmp_path / "smoke.json"
    monkeypatch.setenv("ARGV_LOG", str(log))
    cmd = [sys.executable, str(ROOT / "tools" / "smoke" / "smoke.py"), "--backend", "sim", "--kernels", "bf16:64:64",
           "--features", "full,causal", "--seeds", "3,4", "--worker-cmd", f"{sys.executable} {worker}",
           "--json", str(out)] + (["--first-seed-only"] if first_only else [])
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    argvs = [json.loads(l) for l in log.read_text().splitlines()]
    assert len(argvs) == 1
    a = argvs[0]
    assert a[a.index("--backend") + 1] == "sim" and a[a.index("--seeds") + 1] == "3,4"
    assert ("--seeds-all" in a) == (not first_only)
    saved = json.loads(out.read_text())
    assert [c["status"] for c in saved["cases"]] == ["ok", "ok"]
    assert saved["meta"]["backend"] == "sim" and saved["meta"]["seeds"] == "3,4"
    assert "--first-seed-only" in saved["meta"]["command"].split() or not first_only


def test_sim_worker_first_seed_only(monkeypatch, capsys):
    """seeds_all=False (--first-seed-only): only the family's first feature with every seed."""
    first = smoke_quant.QUANT_FEATURES[0]
    calls, res = run_quant_worker(monkeypatch, capsys, [first, "tiny"], seeds_all=False)
    assert calls == [(first, 1), (first, 2), ("tiny", 1), ("tiny", 1)]  # tiny: two parts, one seed
    assert [r["seeds"] for r in res] == [[1, 2], [1]]


# ------------------------------------------------------------------ tools/smoke/sim_report.py

import sim_report  # noqa: E402

REPORT_CASES = [
    {"kernel": "bf16:128:128", "feature": "full", "status": "ok"},
    {"kernel": "bf16:64:64", "feature": "causal", "status": "ok"},
    {"kernel": "e4m3:128:128", "feature": "perhead", "status": "ok"},
    {"kernel": "bwd:bf16:128:128", "feature": "dlse", "status": "ok"},
    {"kernel": "dec:kve4m3:bf16:128:128", "feature": "page48", "status": "ok"},
    {"kernel": "quant:bf16", "feature": "rows", "status": "ok"},
]


def test_sim_report_rows_and_verdicts():
    r = sim_report.rows(REPORT_CASES)
    assert list(r) == ["forward bf16", "FP8 forward e4m3", "backward bf16", "decode bf16, e4m3 cache",
                       "FP8 rotate-and-quantize"]
    assert r["forward bf16"]["dims"] == "128, 64" and r["forward bf16"]["features"] == ["full", "causal"]
    assert r["FP8 rotate-and-quantize"]["dims"] == "any (one TU)" and r["backward bf16"]["features"] == ["dlse"]
    assert sim_report.kind("dec:fp16:192:128") == "decode fp16, fp16 cache"
    assert sim_report.rows([{"kernel": "fp16:192:128", "feature": "full", "status": "ok"}])[
        "forward fp16"]["dims"] == "192×128"
    assert sim_report.verdict(r["forward bf16"]["cases"]) == "✓ 2/2"
    bad = [dict(REPORT_CASES[0]), {"kernel": "bf16:64:64", "feature": "sq_gt_sk", "status": "wrong", "detail": "x"},
           {"kernel": "bf16:64:64", "feature": "window", "status": "not run"}]
    v = sim_report.verdict(bad)
    assert v.startswith("✗ 1/3 ok") and "bf16 64 sq_gt_sk: wrong" in v and "bf16 64 window: not run" in v
    assert "✓" not in v
    many = [{"kernel": "bf16:64:64", "feature": f"f{i}", "status": "hang"} for i in range(6)]
    assert sim_report.verdict(many).endswith("; 2 more") and "f4" not in sim_report.verdict(many)


def test_sim_report_table():
    sim = {"cases": REPORT_CASES, "meta": {"command": "tools/smoke/smoke.py --backend sim --ci", "date": "2026-01-02",
                                           "backend": "sim", "seeds": "1,2"}}
    lines = sim_report.table(sim, None).splitlines()
    assert lines[0] == ("- simulator: `tools/smoke/smoke.py --backend sim --ci` on 2026-01-02, schedule seeds 1,2, "
                        "6 cases")
    assert lines[2] == "| kernels | head dims | features | simulator | GPU |"
    body = lines[4:]
    assert len(body) == 5 and all(l.endswith("| not yet |") for l in body)  # no GPU JSON
    assert body[0] == "| forward bf16 | 128, 64 | full, causal | ✓ 2/2 | not yet |"
    gpu = {"cases": [dict(REPORT_CASES[0], status="hang"), {"kernel": "fp16:64:64", "feature": "full",
                                                             "status": "ok"}]}
    t = sim_report.table(sim, gpu)
    assert "- GPU: `tools/smoke/smoke.py` on ?, 2 cases" in t
    row = [l for l in t.splitlines() if l.startswith("| forward bf16 |")][0]
    assert row.split(" | ")[3:] == ["✓ 2/2", "✗ 0/1 ok; bf16 128 full: hang |"]
    assert "| forward fp16 | 64 | full | not yet | ✓ 1/1 |" in t  # GPU only


def test_sim_report_update_readme(tmp_path):
    readme = tmp_path / "README.md"
    head, tail = "# x\n\nbefore\n", "\nafter\n"
    readme.write_text(head + sim_report.BEGIN + "\nold table\n" + sim_report.END + tail)
    sim_report.update_readme("| new |", readme)
    assert readme.read_text() == head + sim_report.BEGIN + "\n| new |\n" + sim_report.END + tail
    sim_report.update_readme("| newer |", readme)  # again: replaces, keeps the rest
    assert readme.read_text() == head + sim_report.BEGIN + "\n| newer |\n" + sim_report.END + tail
    for text in ("no markers\n", sim_report.END + "\n" + sim_report.BEGIN + "\n", sim_report.BEGIN + "\n"):
        readme.write_text(text)
        with pytest.raises(SystemExit):
            sim_report.update_readme("| t |", readme)
        assert readme.read_text() == text  # left alone
    assert sim_report.BEGIN in (ROOT / "README.md").read_text() and sim_report.END in (ROOT / "README.md").read_text()


def test_sim_report_main(tmp_path, capsys):
    sim = tmp_path / "sim.json"
    sim.write_text(json.dumps({"cases": REPORT_CASES}))
    assert sim_report.main(["--sim", str(sim)]) == 0
    assert "| forward bf16 | 128, 64 | full, causal | ✓ 2/2 | not yet |" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="no results"):
        sim_report.main(["--sim", str(tmp_path / "missing.json")])


def test_chunk_runs_on_every_forward_and_backward_kernel():
    """`chunk` on every forward kernel (16-bit and FP8; d 256 on its chunk tile) and backward kernel."""
    for kid in ("bf16:192:192", "fp16:192:128", "bf16:256:256", "fp16:256:256", "bwd:bf16:192:192",
                "bwd:bf16:256:256", "e4m3:64:64", "e4m3:128:128", "e4m3:256:256"):
        assert smoke.applies(kid, "chunk"), kid


def test_dchunk_runs_on_every_decode_kernel():
    """`dchunk` on every decode kernel (16-bit and FP8 caches; d 256 on its chunk tile), not on the
    forward or backward ones (their feature is `chunk`) nor the MLA kernel (`mlachunk`)."""
    for kid in ("dec:bf16:128:128", "dec:fp16:64:64", "dec:kve4m3:bf16:96:96", "dec:bf16:192:128",
                "dec:kve4m3:fp16:192:192", "dec:bf16:256:256", "dec:kve4m3:bf16:256:256"):
        assert smoke.applies(kid, "dchunk"), kid
    for kid in ("bf16:128:128", "bwd:bf16:128:128", "dec:bf16:64:512"):
        assert not smoke.applies(kid, "dchunk"), kid
