"""The torch-free host layer (csrc/flash3/host/): the ops' checks, kernel pick, parameters and launch,
proven on the CPU without torch, CUDA or a GPU (tests/cpp/host_layer_driver.cpp: stand-in kernels
record their parameters), and shown to be the code both callers run: the torch bindings (thin
adapters, csrc/torch_adapter.h) and the simulator driver (tools/hopper_sim/flash3/), so that a check
added to the host layer is seen by the simulator's smoke as by the bindings.
"""
import os
import re
import shutil
import sys
from pathlib import Path

import pytest
from helpers import cpp_driver, host_layer_sources

ROOT = Path(__file__).resolve().parents[1]
CSRC = ROOT / "csrc"
HOST = CSRC / "flash3" / "host"
SOURCES = host_layer_sources()
PROBE = 'check(false, "host-layer probe: ", kOp);'


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    return cpp_driver("host_layer_driver.cpp", tmp_path_factory.mktemp("host_layer"), SOURCES)


def fields(answer):
    """'ok k=v k=v ...' -> {k: v}."""
    assert answer.startswith("ok"), answer
    return dict(kv.split("=", 1) for kv in answer[2:].split())


def test_forward_kernel_pick_and_parameters(driver):
    full, causal, window, small, nextdim = driver(["fwd", "fwd wr=0", "fwd wl=8 wr=4", "fwd d=64",
                                                   "fwd d=120 dv=96"])
    f = fields(full)
    assert f["kernel"] == "bf16:128:128" and f["dynamic"] == "0"  # full attention: static schedule
    assert f["q_strides"] == "51200,512,128" and f["lse_strides"] == "400,100"
    assert f["total_q"] == "200" and f["total_k"] == "600" and f["window"] == "-1,-1"
    c = fields(causal)
    assert c["kernel"] == "bf16:128:128" and c["window"] == "-1,0" and c["causal"] == "1"
    assert c["dynamic"] == "1" and c["alloc"] == "1i32/zero"  # a zeroed tile counter per call
    assert fields(window)["window"] == "8,4" and fields(window)["kernel"] == "bf16:128:128"
    assert fields(small)["kernel"] == "bf16:64:64"
    assert fields(nextdim)["kernel"] == "bf16:128:128"  # the next compiled head dims up


def test_forward_refusals_keep_the_bindings_messages(driver):
    answers = driver([
        "fwd d=12",
        "fwd dtype=fp16 kdtype=bf16",
        "fwd h=3 hk=2",
        "fwd softcap=-1",
        "fwd scale=0",
        "fwd wl=-2",
        "fwd sinks=1 sinks_len=3",
        "fwd sinks=1 sinks_dtype=bf16",
        "fwd d=256",
        "arch major=8 minor=0", "fwd", "arch major=9 minor=0",
    ])
    assert answers == [
        "error: flash3.fwd_sm90: head dims must be multiples of 8 in [8, 256], got d=12 d_v=12",
        "error: flash3.fwd_sm90: q, k and v must have the same dtype, got Half, BFloat16, Half",
        "error: flash3.fwd_sm90: the number of query heads (3) must be a multiple of the number of kv heads (2)",
        "error: flash3.fwd_sm90: softcap must be >= 0 (0 = off), got -1",
        "error: flash3.fwd_sm90: softmax_scale must be finite and > 0, got 0",
        "error: flash3.fwd_sm90: window sizes must be >= -1 (-1 = unbounded), got (-2, -1)",
        "error: flash3.fwd_sm90: sinks must have shape (4,) (one logit per query head), got [3]",
        "error: flash3.fwd_sm90: sinks must be float32, got BFloat16",
        "error: flash3.fwd_sm90: no bf16 kernel for head dim (256, 256) or larger in this build of "
        "host_layer_driver and rebuild with FLASH3_HDIMS/FLASH3_DTYPES unset to compile every kernel",
        "ok ", "error: flash3.fwd_sm90 needs an sm_90 (Hopper) GPU; cuda:0 is sm_80", "ok ",
    ]


@pytest.mark.parametrize("call,argument", [
    ("fwd softcap=-1", "softcap"), ("fwd wl=-2", "window sizes"), ("fwd scale=0", "softmax_scale"),
    ("fwd scale=nan", "softmax_scale"), ("fwd d=12", "head dims"), ("fwd h=3 hk=2", "query heads"),
    ("fwd dtype=f32 kdtype=f32", "q must be bfloat16 or float16"), ("bwd wr=-3", "window sizes"),
    ("kvcache d=12", "head dims"), ("fwd_fp8 d=24", "head dims must be multiples of 16"),
])
def test_a_refused_call_names_the_argument_and_writes_nothing(driver, call, argument):
    """One check per argument, in the host layer for every direct op caller: the refusal names the
    argument, and nothing was launched, filled or allocated first (the driver would show it)."""
    answer = driver([call])[0]
    assert answer.startswith("error: flash3.") and argument in answer, answer
    assert "[wrote" not in answer


def test_the_ops_refuse_by_the_pick_python_asks(driver):
    """flash3::pick_kernel (kernel_pick_json) answers Python with the rule the ops refuse by: the
    same reason, the same kernel."""
    for args, reason in (("d=12", "head dims must be multiples of 8 in [8, 256], got d=12 d_v=12"),
                         ("scale=0", "softmax_scale must be finite and > 0, got 0")):
        pick, op = driver([f"pick {args}", f"fwd {args}"])
        assert pick == 'ok {"reason": "%s"}' % reason
        assert op == f"error: flash3.fwd_sm90: {reason}"
    assert driver(["pick d=136"])[0] == (
        'ok {"reason": "no bf16 kernel for head dim (136, 136) or larger in this build"}')
    assert driver(["pick", "pick d=80 dv=64", "pick family=bwd d=64"]) == [
        'ok {"kernel": [128, 128]}', 'ok {"kernel": [128, 128]}', 'ok {"kernel": [128, 128]}']
    assert fields(driver(["fwd d=80 dv=64"])[0])["kernel"] == "bf16:128:128"
    assert driver(["pick dtype=float32"])[0] == (
        'ok {"reason": "q must be bfloat16 or float16, got float32 (no kernel for it: bf16/fp16 only)"}')


def test_no_keys_and_varlen_fill_what_no_kernel_writes(driver):
    empty, sinks, varlen = driver(["fwd sk=0", "fwd sk=0 sinks=1", "fwd varlen=1"])
    assert empty == "ok  fill=4d:0 empty_lse=1"  # out 0, lse -inf, no launch
    assert sinks == "ok  fill=4d:0 empty_lse=1:sinks"
    v = fields(varlen)
    assert v["q_strides"] == "0,512,128" and v["lse_strides"] == "0,200" and v["dynamic"] == "1"


def test_seqused_q_checks(driver):
    """seqused_q reaches the kernel's parameters with packed queries; a bad one is refused by name."""
    ok, batched, dtype, shape, sinks, bwd = driver([
        "fwd varlen=1 usedq=1 wr=0", "fwd usedq=1", "fwd varlen=1 usedq=1 usedq_dtype=f32",
        "fwd varlen=1 usedq=1 usedq_len=3", "fwd varlen=1 usedq=1 sinks=1", "bwd usedq=1"])
    assert fields(ok)["seqused_q"] == "1" and fields(ok)["kernel"] == "bf16:128:128"
    assert batched == "error: flash3.fwd_sm90: seqused_q needs packed queries (cu_seqlens_q)"
    assert dtype == "error: flash3: seqused_q must be int32, got Float"
    assert shape == "error: flash3: seqused_q must have shape (2), got [3]"
    assert sinks == "error: flash3.fwd_sm90: seqused_q is not supported with sinks"
    assert bwd == "error: flash3.bwd_sm90: seqused_q needs packed queries (cu_seqlens_q)"


def test_fp8_forward_repeats_coarser_descales(driver):
    f = fields(driver(["fwd_fp8 q_block=256"])[0])
    assert f["kernel"] == "e4m3:128:128" and f["q_descale_count"] == "2"
    assert driver(["fwd_fp8 q_block=100"])[0] == (
        "error: flash3.fwd_fp8_sm90: the block of q_descale (100 rows) must be a multiple of the kernel's 64")
    # d 128 runs 128-key tiles: k/v descale blocks of 64 keys are finer than the kernel reads.
    assert driver(["fwd_fp8 kv_block=64"])[0] == (
        "error: flash3.fwd_fp8_sm90: the block of k_descale (64 rows) must be a multiple of the kernel's 128")
    # The kernel reads k/v descale rows at 32-bit offsets: a view whose strides reach element 2^31 is
    # refused. k_descale (b 2, h_k 2, 3 blocks of the kernel's 128 keys over 300; strides X, 3, 1)
    # reaches element X + 3 + 2: X = 2^31 - 5 reaches 2^31; one less passes.
    assert driver(["fwd_fp8 kv_block=128 kd_stride0=2147483643"])[0] == (
        "error: flash3.fwd_fp8_sm90: k_descale reaches element 2147483648 through its strides; the kernel's "
        "offsets take below 2^31 (pass a contiguous tensor)")
    assert driver(["fwd_fp8 kv_block=128 kd_stride0=2147483642"])[0].startswith("ok")
    # v_channel_descale is checked with the others: a wrong one is refused before q's coarser
    # descale is repeated on the device (nothing launched).
    bad, good = driver(["fwd_fp8 q_block=256 vchan=64", "fwd_fp8 q_block=256 vchan=128"])
    assert bad == "error: flash3: v_channel_descale has shape [2, 2, 64], expected [2, 2, 128]", bad
    assert good.startswith("ok"), good


def test_fp8_forward_chunk_tile_and_seqused(driver):
    """An attention chunk reaches the FP8 kernel; at d 256 it runs on the 32-key chunk tile
    (attn_logic.h fwd_fp8_chunk_tile_shape), so k/v descales are sized per 32 keys (300 keys: 10
    entries against 5); d 128 keeps its 128-key tile (3). seqused_q/k need packed sequences."""
    plain, chunk, d128 = (fields(driver([c])[0]) for c in (
        "fwd_fp8 d=256 kv_block=128", "fwd_fp8 d=256 kv_block=128 chunk=48", "fwd_fp8 d=128 kv_block=128 chunk=48"))
    assert plain["kernel"] == chunk["kernel"] == "e4m3:256:256" and d128["kernel"] == "e4m3:128:128"
    assert (plain["chunk"], chunk["chunk"], d128["chunk"]) == ("0", "48", "48")
    assert (plain["k_descale_count"], chunk["k_descale_count"], d128["k_descale_count"]) == ("5", "10", "3")
    for arg in ("usedq=1", "usedk=1"):
        assert driver([f"fwd_fp8 {arg}"])[0] == (
            "error: flash3.fwd_fp8_sm90: seqused_q/seqused_k need packed sequences (cu_seqlens_q/k)")
    assert driver(["fwd_fp8 chunk=-1"])[0].startswith("error: flash3.fwd_fp8_sm90: attention_chunk")


def test_fp8_forward_fast_accum(driver):
    """fast_accum reaches the kernel with v's one descale per (batch, kv head) (b, h_k, 1): count 1;
    at d 256 the fast tile's 128 keys size k's descales (300 keys: 3 entries, the plain tile's 5).
    A per-block v descale or an attention chunk is refused by name."""
    f = fields(driver(["fwd_fp8 d=256 kv_block=128 fast=1 vd_blocks=1"])[0])
    assert f["kernel"] == "e4m3:256:256" and f["fast_accum"] == "1"
    assert (f["k_descale_count"], f["v_descale_count"]) == ("3", "1")
    assert fields(driver(["fwd_fp8 d=256 kv_block=128"])[0])["fast_accum"] == "0"
    assert driver(["fwd_fp8 fast=1"])[0] == (
        "error: flash3: v_descale (one per (batch, kv head) with fast_accum) has shape [2, 2, 3], expected [2, 2, 1]")
    assert driver(["fwd_fp8 fast=1 vd_blocks=1 chunk=48"])[0] == (
        "error: flash3.fwd_fp8_sm90: fast_accum takes no attention_chunk (no such kernel)")


def test_decode_split_kv_and_its_combine(driver):
    split, one, varlen = driver(["kvcache splits=3", "kvcache splits=1",
                                 "kvcache varlen=1 sq=7 page=16 total_q=9"])
    s = fields(split)
    assert s["kernel"] == "decode:128:128" and s["num_splits"] == "3" and s["combine"] == "3"
    assert " alloc=6144f32 alloc=48f32" in split  # partial O and lse, uninitialized (at::empty)
    assert "combine" not in fields(one)
    assert fields(varlen)["paged"] == "1" and "fill=3d:0 fill=2d:-inf" in varlen  # rows of no sequence
    assert driver(["kvcache d=80 fp8=1"])[0].startswith(
        "ok kernel=decode_e4m3:128:128")  # the FP8-cache list, the next head dim up


def test_decode_cache_leftpad(driver):
    """cache_leftpad reaches the decode kernel's parameters (contiguous and paged); a wrong dtype
    or shape is refused, naming it, before anything is launched or filled."""
    plain, lp, paged, dtype, shape = driver(["kvcache", "kvcache leftpad=1", "kvcache leftpad=1 page=16",
                                             "kvcache leftpad=2", "kvcache leftpad=3"])
    assert fields(plain)["leftpad"] == "0" and fields(lp)["leftpad"] == "1"
    assert fields(paged)["leftpad"] == "1" and fields(paged)["paged"] == "1"
    assert dtype == "error: flash3: cache_leftpad must be int32, got Float"
    assert shape == "error: flash3: cache_leftpad must have shape (2), got [3]"


def test_decode_mla_kernel_and_qv(driver):
    """d_v in (256, 512] with d <= 64 takes the MLA decode kernel (with or without qv, batched or
    packed q; qv's strides reach its parameters); a smaller d_v keeps the plain decode kernels;
    qv without the MLA kernel, a qv of the wrong width, a larger d and d_v past 512 are refused,
    each with its reason, before anything is launched."""
    mla, plain_mla, packed, small, uncovered, no_mla, width, big_d, big_dv = driver([
        "kvcache d=64 dv=512 h=16 hk=1 qv=1", "kvcache d=64 dv=512 h=16 hk=1",
        "kvcache d=64 dv=512 varlen=1 sq=7 page=64 total_q=9 qv=1 splits=3", "kvcache d=64 dv=128",
        "kvcache d=64 dv=200",
        "kvcache d=128 qv=1", "kvcache d=64 dv=512 qv=2", "kvcache d=128 dv=512", "kvcache d=64 dv=520"])
    f = fields(mla)
    assert f["kernel"] == "decode:64:512" and f["qv"] == "1" and f["qv_strides"] == f"{16 * 512},{16 * 512},512"
    assert fields(plain_mla)["kernel"] == "decode:64:512" and fields(plain_mla)["qv"] == "0"
    p = fields(packed)
    assert p["kernel"] == "decode:64:512" and p["qv_strides"] == f"0,{8 * 512},512" and p["combine"] == "3"
    assert fields(small)["kernel"] == "decode:128:128"  # not the MLA kernel: d_v <= 256
    # The stand-in build's plain decode kernels stop at d_v 128: the MLA kernel does not cover the rest.
    assert uncovered.startswith("error: flash3.fwd_kvcache_sm90: no bf16 decode kernel for head dim (64, 200)")
    assert no_mla.startswith("error: flash3.fwd_kvcache_sm90: qv runs on the MLA decode kernel only")
    assert width == "error: flash3: qv has shape [2, 1, 8, 520], expected [2, 1, 8, 512]"
    assert big_d.startswith("error: flash3.fwd_kvcache_sm90: d_v above 256 runs on the MLA decode kernel, "
                            "which takes d <= 64")
    assert big_dv.startswith("error: flash3.fwd_kvcache_sm90: head dims must be multiples of 8 in [8, 256]")
    assert "(d_v up to 512 with d <= 64: the MLA decode kernel, 16-bit caches)" in big_dv


def test_decode_attention_chunk(driver):
    """attention_chunk reaches the decode kernels' parameters (16-bit and FP8 caches, with splits
    and packed queries; the decode schedule stays static), the MLA kernel's too (with qv, packed
    queries and cache_leftpad); a negative chunk is refused by name, and no head dim is refused
    for the chunk (above attn_logic.h kDecodeChunkMaxHeadDim the decode kernels run a chunk tile:
    this driver's registry has no d 256 decode kernel, so the pick says that, chunk or not)."""
    plain, split, fp8, varlen, neg, big, mla = driver([
        "kvcache chunk=48", "kvcache chunk=48 splits=3", "kvcache chunk=48 fp8=1",
        "kvcache chunk=48 varlen=1 sq=7 page=16 total_q=9", "kvcache chunk=-1", "kvcache chunk=48 d=256",
        "kvcache chunk=48 d=64 dv=512 h=16 hk=1 qv=1 varlen=1 sq=7 page=64 total_q=9 leftpad=1 splits=3"])
    m = fields(mla)
    assert m["kernel"] == "decode:64:512" and m["chunk"] == "48" and m["leftpad"] == "1" and m["qv"] == "1"
    assert fields(plain)["chunk"] == "48" and fields(plain)["dynamic"] == "0"
    assert fields(split)["num_splits"] == "3" and fields(split)["chunk"] == "48"
    assert fields(fp8)["kernel"] == "decode_e4m3:128:128" and fields(fp8)["chunk"] == "48"
    assert fields(varlen)["chunk"] == "48" and fields(varlen)["paged"] == "1"
    assert fields(driver(["kvcache"])[0])["chunk"] == "0"
    assert neg.startswith("error: flash3.fwd_kvcache_sm90: attention_chunk must be >= 0"), neg
    assert "attention_chunk" not in big and "head dim (256, 256)" in big, big
    assert big == driver(["kvcache d=256"])[0], big


def test_backward_workspace_and_checks(driver):
    det, plain, bad = driver(["bwd deterministic=1", "bwd", "bwd dv_sk=7"])
    assert fields(det)["semaphore"] == "1" and det.endswith("alloc=133120f32 alloc=16i32")
    assert fields(plain)["semaphore"] == "0" and plain.endswith("alloc=133120f32")
    assert bad == "error: flash3: dv has shape [2, 7, 2, 128], expected [2, 300, 2, 128]"


def test_append_and_quantize(driver):
    rot, bad_k, layout = driver(["append rotary=1 page=16", "append kd=64", "quantize layout=3"])
    assert rot.startswith("ok append page_size=16 max_pages=8 rotary_dim=64")
    assert rot.count("overlap") == 6  # the caches against k/v and themselves; q_out with rotary
    assert bad_k == "error: flash3.append_kv_sm90: k has shape [2, 1, 2, 64], expected (2, *, 2, 128)"
    assert layout == "error: flash3.quantize_fp8_sm90: layout must be 0 (rows) or 1 (v_packed), got 3"


def test_append_packed_layouts(driver):
    """FA3's packed layouts: the kernel gets the packed row counts and the cu_seqlens pointers,
    batch strides 0; sizes that disagree are refused naming the tensor."""
    both, q_only, k_only, bad_cu, bad_k = driver([
        "append packed_q=1 packed_k=1 rotary=1 page=16", "append packed_q=1 rotary=1", "append packed_k=1",
        "append packed_k=1 cu=4", "append packed_k=1 kd=64"])

    def fields(answer):  # the recorded k=v fields (the answer also names the overlap checks)
        assert answer.startswith("ok append"), answer
        return dict(kv.split("=", 1) for kv in answer.split() if "=" in kv)
    f = fields(both)
    assert (f["batch"], f["s_q"], f["s_new"], f["cu_q"], f["cu_k"]) == ("2", "5", "7", "1", "1")
    assert f["k_batch_stride"] == f["q_batch_stride"] == "0" and f["k_row_stride"] == str(2 * 128)
    f = fields(q_only)
    assert (f["s_q"], f["s_new"], f["cu_q"], f["cu_k"], f["q_batch_stride"]) == ("5", "1", "1", "0", "0")
    f = fields(k_only)
    assert (f["s_q"], f["s_new"], f["cu_q"], f["cu_k"], f["k_batch_stride"]) == ("1", "7", "0", "1", "0")
    assert bad_cu == ("error: flash3.append_kv_sm90: cu_seqlens_k_new must be a contiguous int32 (3,) tensor on "
                      "cuda:0, got Int [4]")
    assert bad_k == "error: flash3.append_kv_sm90: k has shape [7, 2, 64], expected (*, 2, 128) (packed rows)"


def test_append_fa3_fp8_copies_e4m3_keys(driver):
    """descale_per_batch (FA3's FP8 cache): e4m3 k/v copied (kv_e4m3, no descales), or rotated with
    an e4m3 q (FA3's); bf16 keys, descales, rotary with a bf16 q, or an e4m3 q without
    descale_per_batch refused before anything is launched."""
    paged, contig, bf16, ds, rot = driver(["append fa3=1 page=16", "append fa3=1", "append fa3=1 knew_bf16=1",
                                           "append fa3=1 ds=1", "append fa3=1 rotary=1"])
    rot8, rot8_packed, q8_16bit = driver(["append fa3=1 rotary=1 q8=1 page=16",
                                          "append fa3=1 rotary=1 q8=1 packed_q=1 packed_k=1", "append q8=1"])
    assert rot8.startswith("ok append page_size=16 max_pages=8 rotary_dim=64 kv_e4m3=1 descales=0")
    f = dict(kv.split("=", 1) for kv in rot8_packed.split() if "=" in kv)
    assert (f["rotary_dim"], f["kv_e4m3"], f["cu_q"], f["cu_k"], f["s_q"]) == ("64", "1", "1", "1", "5")
    assert q8_16bit == ("error: flash3.append_kv_sm90: q must be bfloat16 or float16 (float8_e4m3fn with "
                        "descale_per_batch), got Float8_e4m3fn")
    assert paged.startswith("ok append page_size=16 max_pages=8 rotary_dim=0 kv_e4m3=1 descales=0")
    assert contig.startswith("ok append page_size=512 max_pages=0 rotary_dim=0 kv_e4m3=1 descales=0")
    assert bf16 == ("error: flash3.append_kv_sm90: with descale_per_batch the new k and v must be "
                    "float8_e4m3fn (copied unchanged), got BFloat16 and BFloat16")
    assert ds.startswith("error: flash3.append_kv_sm90: with descale_per_batch the append takes no k_descale")
    assert rot == ("error: flash3.append_kv_sm90: rotary with descale_per_batch (e4m3 new keys) takes "
                   "float8_e4m3fn q (FA3's), got BFloat16")
    assert " kv_e4m3=0 descales=0" in driver(["append"])[0]
    # FA3's packed new keys under descales per batch entry: the same copy, rows found by cu_seqlens_k_new
    f = dict(kv.split("=", 1) for kv in driver(["append fa3=1 packed_k=1 page=16"])[0].split() if "=" in kv)
    assert (f["kv_e4m3"], f["cu_k"], f["s_new"], f["k_batch_stride"]) == ("1", "1", "7", "0")


def test_kernel_lists(driver):
    assert driver(["kernel_info"])[0] == (
        'ok "fwd": [["bf16", 64, 64], ["bf16", 128, 128], ["fp16", 128, 128]], "fwd_fp8": [[128, 128], [256, 256]], '
        '"bwd": [["bf16", 128, 128]], "decode": [["bf16", 64, 512], ["bf16", 128, 128]], '  # + the MLA stand-in
        '"decode_fp8_cache": [["bf16", 128, 128]]')


# ---- one host layer for both callers -----------------------------------------------------------


def test_each_binding_is_named_after_its_op():
    """csrc/<op>_binding.cpp defines torch.ops.flash3.<op>_sm90 (fwd_binding.cpp also fwd_fp8_sm90
    and kernel_info), and every torch source of csrc/ is such a binding."""
    files = sorted(p.name for p in CSRC.glob("*.cpp"))
    assert files and all(f.endswith("_binding.cpp") for f in files), files
    for name in files:
        op = name[: -len("_binding.cpp")] + "_sm90"
        assert re.search(rf'm\.def\(\s*"{op}\(', (CSRC / name).read_text()), (name, op)


def test_bindings_and_simulator_driver_call_the_host_layer():
    """Every op of the torch bindings and of the simulator driver is a call into flash3::host, and
    the simulator's build links every source of the host layer (as setup.py does)."""
    calls = {"fwd_sm90", "fwd_fp8_sm90", "fwd_kvcache_sm90", "append_kv_sm90", "bwd_sm90", "quantize_fp8_sm90"}
    sim = "".join(p.read_text() for p in (ROOT / "tools/hopper_sim/flash3").glob("sim_*"))
    bindings = "".join(p.read_text() for p in CSRC.glob("*_binding.cpp"))
    for op in calls:
        assert f"host::{op}(" in sim, op
        assert f"host::{op}(" in bindings, op
    for text in (sim, bindings):  # the checks live in the host layer only
        assert "TORCH_CHECK(" not in text.replace("TORCH_CHECK(false, e.what())", "")
        assert not re.search(r"\bcheck\(", text)
    sys.path.insert(0, str(ROOT / "tools" / "smoke"))
    import smoke_sim
    assert {p.name for p in smoke_sim.host_layer_sources(CSRC)} == {p.name for p in HOST.glob("*.cpp")}
    setup = (ROOT / "setup.py").read_text()
    assert "csrc/flash3/host" in setup


def probe_copy(tmp_path):
    """A copy of csrc/ whose host layer refuses every forward call with a probe message."""
    copy = tmp_path / "csrc"
    shutil.copytree(CSRC, copy)
    fwd = copy / "flash3" / "host" / "fwd.cpp"
    anchor = '  constexpr const char* kOp = "flash3.fwd_sm90";\n'
    text = fwd.read_text()
    assert text.count(anchor) == 1, "host/fwd.cpp changed: move the probe"
    fwd.write_text(text.replace(anchor, anchor + "  " + PROBE + "\n"))
    return copy


def test_a_check_added_to_the_host_layer_is_seen_by_both(tmp_path, monkeypatch):
    """The host-logic driver (g++) and, where the simulator and nvcc are here, the simulator's
    driver built from the same copy of csrc/ both refuse a forward call with a check added only to
    csrc/flash3/host/fwd.cpp (tools/hopper_sim/flash3/mutant_check.sh's host_probe does the latter in
    `make sim-check`, through tools/smoke/smoke.py). FLASH3_TEST_NO_SIM=1 keeps to the g++ half."""
    copy = probe_copy(tmp_path)
    ask = cpp_driver("host_layer_driver.cpp", tmp_path, SOURCES, csrc=copy)
    assert ask(["fwd", "bwd"])[0] == "error: host-layer probe: flash3.fwd_sm90"
    sys.path.insert(0, str(ROOT / "tools" / "smoke"))
    import smoke_sim
    if not smoke_sim.SIMRUN.exists() or not (smoke_sim.SIM_DIR / "build" / "lib").exists() \
            or shutil.which("nvcc") is None or os.environ.get("FLASH3_TEST_NO_SIM"):
        pytest.skip("the simulator is not built here (make sim) or no nvcc: the g++ half ran")
    import torch
    monkeypatch.setenv("FLASH3_SIM_CSRC", str(copy))
    drv = smoke_sim.build_driver(kinds=())  # no kernel TU: the probe refuses before any launch
    q = torch.zeros(1, 8, 1, 64, dtype=torch.bfloat16)
    tensors = dict(q=q, k=q, v=q, out=q.clone(), lse=torch.zeros(1, 1, 8))
    scalars = dict(max_seqlen_q=8, max_seqlen_k=8, softmax_scale=0.125, window_left=-1,
                   window_right=-1, softcap=0.0)
    with pytest.raises(smoke_sim.SimFailure) as e:
        smoke_sim.run_case("fwd", tensors, scalars, {"out": q}, drv)
    assert e.value.status == "error" and e.value.detail == "sim_driver: error: host-layer probe: flash3.fwd_sm90"


def test_attention_chunk_reaches_the_kernels_and_is_checked(driver):
    """FA3's attention_chunk: the forward's and the backward's params carry it, a chunked call takes
    the dynamic scheduler, and a
    negative chunk is refused naming it, before anything is launched."""
    fwd, fwd_causal, bwd, pick, bad, bad_bwd = driver([
        "fwd chunk=48", "fwd wr=0 chunk=160", "bwd chunk=48", "pick chunk=8192", "fwd chunk=-1",
        "bwd chunk=-5"])
    f = fields(fwd)
    assert f["kernel"] == "bf16:128:128" and f["chunk"] == "48" and f["window"] == "-1,-1"
    assert f["dynamic"] == "1"
    assert fields(fwd_causal)["chunk"] == "160" and fields(fwd_causal)["window"] == "-1,0"
    assert fields(bwd)["chunk"] == "48"
    assert pick == 'ok {"kernel": [128, 128]}'
    for answer, op in ((bad, "fwd_sm90"), (bad_bwd, "bwd_sm90")):
        assert answer.startswith(f"error: flash3.{op}: attention_chunk must be >= 0"), answer
        assert "[wrote" not in answer
    assert fields(driver(["fwd"])[0])["chunk"] == "0"
    # Every 16-bit forward kernel takes the chunk (d 256 on its chunk tile, fwd/launch.cuh run_fwd),
    # so the pick refuses none for it (this driver's registry has no d 256 kernel: the pick says
    # that, chunk or not).
    big, big_v, plain = driver(["pick d=256 chunk=64", "pick d=64 dv=256 chunk=64", "pick d=256"])
    for answer in (big, big_v, plain):
        assert "attention_chunk" not in answer and "no bf16 kernel for head dim" in answer, answer
