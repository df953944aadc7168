#!/usr/bin/env python3
"""Smoke matrix for a lent Hopper GPU: one small launch per (compiled kernel, feature), each
isolated so that a crash or a hang costs one cell, not the run.

Driver (default): runs one worker process per kernel (--parallel at a time). A worker prints one
JSON line per finished case. The driver kills a worker that stays silent past --case-timeout (the
case in flight: hang) and records a worker that dies as a crash of its case (signal or exit code,
last stderr line); the kernel's remaining features go to a fresh worker at the back of the queue,
so every kernel gets its first cases before anyone's retries. At --budget seconds the driver
stops: cases in flight or not started are "not run". Prints the matrix; --json writes the cases.

Worker (--worker --kernel bf16:128:128 --features full,causal): one launch per feature through
torch.ops.flash3.fwd_sm90 on NaN-poisoned out/lse, checked against the fp64 reference with the
FlashAttention rule of tests/helpers.py. FP8 kernels (e4m3:128:128, from kernel_info()["fwd_fp8"]):
the same cases quantized to e4m3 with block descales, through torch.ops.flash3.fwd_fp8_sm90, checked
against the CPU emulation flash3.fp8.fp8_attention_reference (the rule of tests/test_fp8_gpu.py's
varlen test). Backward kernels (bwd:bf16:128:128, from kernel_info()["bwd"], listed when the
forward kernel of the same triple is built): out/lse from fwd_sm90, then one flash3::bwd_sm90 launch
into NaN-poisoned dq/dk/dv, checked against flash3.reference.backward (varlen_backward) in fp32 on
the same inputs (check_bwd); their "determ" feature is the gqa case with deterministic=True, launched
twice (bitwise equal), "dlse" the causal case with a random gradient flowing into lse (bwd_sm90's
dlse, given to the reference too), "onekey" a varlen batch whose rows see one key (their dq exactly 0,
and out/lse by the forward's rule), "sinks" attention sinks (bwd_sm90's sinks/dsinks: d_sink too). Decode kernels (dec:bf16:128:128 from kernel_info()["decode"],
dec:kve4m3:bf16:128:128 from ["decode_fp8_cache"]) have their own features (DEC_FEATURES,
make_dec_case): each launch one decode step as flash3/ops.py attention_kvcache runs it
(append_kv_sm90 when it appends, then fwd_kvcache_sm90 and its combine), checked by check_dec with
tests/test_kvcache_gpu.py's rules (per row against the fp64 oracle; FP8 caches: out on the exact
x8*descale, lse on those values rounded to q's dtype, which the kernel computes with) and the
append bit for bit against flash3.reference (tests/test_decode_gpu.py). The fused FP8
rotate-and-quantize kernel (quant:bf16 and quant:fp16, x's dtype; kernel_info() does not list it:
on a GPU its ids come from flash3._quantize.available(), the sim backend always links it) has its
own features too (tools/smoke_quant.py, QUANT_FEATURES): launches of quantize_fp8_sm90 into poisoned
out/descale, checked bit for bit against flash3's CPU definition of the quantization (the rotation
of flash3.hadamard, fp8.quantize_fp8, fp8.pack_v_fp8), by tests/test_quantize_kernel.py's rule where
the Hartley mix (d = 3 or 5 times a power of two) may sum in another order. Lines it cannot parse
(device printf of the FLASH3_DEBUG_HANG build) are kept with the case they interrupted.

Statuses: ok, wrong (error over the FA tolerance, or lse off), nan (NaN in out/lse: unwritten or
non-finite), error (the call was refused, CUDA still usable), crash, hang, not run. A feature a
kernel family has no path for (kvcache for e4m3 and bwd, determ and dlse for forward kernels) is
not a case: never run, "n/a" in the matrix.

--plan FILE prints shell assignments for tools/device_check.sh (which cases to diagnose next).

--backend sim: no GPU. The forward, decode and backward kernels the knobs select (FLASH3_HDIMS,
FLASH3_DTYPES) are built into tools/hopper_sim/flash3/sim_driver.cu (tools/smoke_sim.py; cached,
rebuilt when sources or flags change) and every case's launch runs under tools/hopper_sim/simrun
(strict checks, --uninit) instead of torch.ops.flash3.*: the same make_case on the CPU,
NaN-poisoned out/lse, the same check(). Every case runs once per --seeds seed (schedules; the
outputs must also be bitwise equal; --first-seed-only: only each kernel's first case, the others
with the first seed). With --cases / --kernels only the TU kinds those need are built. --ci: the
CI subset (ci_cases). A strict-check failure is a crash (deadlock/livelock: hang), an
unsupported feature or a refused call an error. A backward case's run is the forward, then the
backward (smoke_sim.bwd_launch: "determ" launches it twice, the second time with the next seed,
another schedule); across seeds its dq may differ outside deterministic mode (dQ tiles are summed
in schedule order). Exits 1 unless every case is ok.
"""
from __future__ import annotations

import argparse
import collections
import ctypes
import json
import math
import os
import queue
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import smoke_quant  # tools/, beside this file: the quantize kernel's family

ROOT = Path(__file__).resolve().parent.parent
# "sq_gt_sk": causal with more queries than keys (the first s_q - s_k rows see no key: out 0, lse
# -inf); "perhead": FP8 with one descale per head (blocks spanning the sequences); "nextdim": head
# dims the op runs on this kernel, the next one up (next_dims); "varlen" has a sequence of 0
# queries and one of 0 keys; "onekey" (backward only): a varlen batch (s_q, s_k) = (70, 1), (2, 1),
# (1, 3), (5, 1), rows that see a single key: softmax 1, so dq is exactly 0 there (check_bwd asserts
# it, and checks the forward's out/lse too); "nantail": varlen with packed tensors longer than
# cu_seqlens[-1] and NaN/+-Inf in the unused tail (q, k, v, dout; out/lse there stay the forward's
# NaN poison), which the last sequence's partial blocks cover; "sinks": attention sinks (one fp32 logit
# per query head). Forward: sink_logits with causal GQA and more queries than keys (SK queries over
# SINKS_SK keys: the first tile's rows see no key, lse = the sink, and the next tile mixes such rows
# with others). Backward: a causal GQA varlen batch with dlse (SINKS_LENS: a sequence of 0 queries,
# one of 0 keys, one with more queries than keys), one head's sink -inf (no sink: its rows that see
# one key are one-hot); the forward kernel runs with the sinks too, and check_bwd checks d_sink
# against the fp64 sink_grad. "alibi": ALiBi (alibi_slopes (b, h), FlashAttention-2's bias
# -slope * |i + s_k - s_q - j|) on a GQA varlen batch (ALIBI_LENS: bottom-right offsets of both signs
# and 0, unmasked and masked blocks), per-sequence slopes; forward and backward (the oracle's bias).
FEATURES = ["full", "causal", "window", "softcap", "gqa", "varlen", "kvcache", "determ", "dlse", "sq_gt_sk",
            "perhead", "nextdim", "onekey", "nantail", "sinks", "alibi"]
ONEKEY_LENS = ([70, 2, 1, 5], [1, 1, 3, 1])
# The decode (KV-cache) kernels' own features (family "dec": ids dec:bf16:128:128 for a cache of
# q's dtype, dec:kve4m3:bf16:128:128 for an FP8 cache), make_dec_case: a contiguous cache; paged
# caches of 1, 16, 64, 256 keys per page and 48 (divides no key block); forced split-KV (the
# combine); packed GQA (s_q 5, 1 and 4 splits); causal / window / softcap each at s_q 1 and 70;
# bad page ids and seqused past the capacity; the fused append (FP8: quantizing, with descales)
# without and with rotary; attention sinks on packed GQA with a row of 0 keys, without splits (the
# kernel's epilogue) and with 3 (the combine); packed (varlen) queries on a paged cache (vpaged:
# VPAGED_LENS, causal, GQA g = 4, pages of 256 keys (TMA per block), 16 keys with 3 splits and 1 key
# (gathered), the last two with sinks, 3 packed rows of no sequence at the end: out 0, lse -inf);
# ALiBi (alibi: per-row slopes (b, h) on packed GQA, s_q 5, a row of 0 keys, no split and 3).
DEC_FEATURES = ["contig", "page1", "page16", "page64", "page256", "page48", "split", "gqa",
                "causal", "window", "softcap", "badidx", "append", "rotary", "sinks", "vpaged", "alibi"]
# vpaged's (queries, keys) per sequence: a sequence without queries, one without keys, one of more
# packed rows (70 * g = 280) than a 128-row tile; causal is bottom-right per sequence.
VPAGED_LENS = ([1, 7, 0, 5, 70], [30, 0, 77, 16, 200])
VPAGED_TAIL = 3  # packed q rows after cu_seqlens_q[-1]: out 0, lse -inf
BAD = ("wrong", "nan", "error", "crash", "hang")
SQ, SK = 203, 331  # partial tiles for every block size
NANTAIL_LENS = ([SQ, 0, 77, 45], [SK, 40, 0, 93])  # (q, k) lengths: the last ends mid-block
NANTAIL_PAD = (37, 61)  # unused rows after cu_seqlens[-1] in q (and dout), in k and v
SINKS_SK = 190  # forward "sinks": keys for SK queries, causal: rows 0 .. SK - SINKS_SK - 1 see none
SINKS_LENS = ([SQ, 0, 77, 90], [SK, 40, 0, 61])  # (q, k) lengths of the backward "sinks" case
ALIBI_LENS = ([SQ, 150, 64], [SK, 97, 64])  # (q, k) lengths of "alibi": s_k - s_q > 0, < 0, = 0
# Features a kernel family has no path for: never run, "n/a" in the matrix (the FP8 op has no
# seqused_k, so no kv cache; nor bwd_sm90; "determ" is the backward's deterministic mode, "dlse" its
# gradient flowing into lse; the FP8 op takes no sinks). Keyed by family(): the dtype, or "bwd".
NOT_APPLICABLE = {"e4m3": {"kvcache", "determ", "dlse", "nextdim", "onekey", "sinks", "alibi"},
                  "bf16": {"determ", "dlse", "perhead", "onekey"}, "fp16": {"determ", "dlse", "perhead", "onekey"},
                  "bwd": {"kvcache", "perhead"}}
# Features the CI subset (ci_cases) runs in the first group of their feature list only (bf16 before
# fp16; 16-bit decode before FP8-cache decode; the backward is its own group): "sinks" is fp32
# epilogue/combine code that neither q's dtype nor the cache's changes; "alibi" is fp32 score-mod
# code on the accumulator (common/score_mod.h), the same for every dtype.
CI_ONCE = {"sinks", "alibi"}
FP8_BLOCK = (64, 128)  # rows per q descale, keys per k/v descale (the FP8 kernel's granularity)
# tests/test_fp8_gpu.py: parametrized tests end their ids in the head dim ("[...-128]", "[128]");
# this one runs d=128 without it.
FP8_TEST_WITHOUT_D = {128: "no_host_sync_graph"}


# ---------------------------------------------------------------------------------------------
# Cases (worker side; also used by tools/sanitize_small.py)


def parse_kernel(kid: str) -> tuple[str, int, int]:
    """'bf16:192:128' (or 'bwd:bf16:192:128', 'dec:bf16:192:128', 'dec:kve4m3:bf16:192:128') ->
    ('bf16', 192, 128): q's dtype for a decode kernel (dec_fp8_cache says which cache)."""
    dt, d, dv = kid.removeprefix("bwd:").removeprefix("dec:").removeprefix("kve4m3:").split(":")
    return dt, int(d), int(dv)


def dec_fp8_cache(kid: str) -> bool:
    """A decode kernel for an FP8 (e4m3) cache."""
    return kid.startswith("dec:kve4m3:")


def family(kid: str) -> str:
    """NOT_APPLICABLE's key: 'bwd' for a backward kernel, 'dec' for a decode one, 'quant' for the
    quantize kernel (smoke_quant), else the dtype."""
    for fam in ("bwd", "dec", "quant"):
        if kid.startswith(fam + ":"):
            return fam
    return parse_kernel(kid)[0]


def kernel_label(kid: str) -> str:
    fam = family(kid)
    if fam == "quant":
        return smoke_quant.label(kid)
    dt, d, dv = parse_kernel(kid)
    prefix = {"bwd": "bwd ", "dec": "dec kve4m3 " if dec_fp8_cache(kid) else "dec "}.get(fam, "")
    return prefix + (f"{dt} {d}" if d == dv else f"{dt} {d}x{dv}")


def family_features(kid: str) -> list[str]:
    """The feature list of the kernel's family (its matrix's columns): DEC_FEATURES,
    smoke_quant.QUANT_FEATURES, else FEATURES."""
    return {"dec": DEC_FEATURES, "quant": smoke_quant.QUANT_FEATURES}.get(family(kid), FEATURES)


# The forward and decode kernels take ALiBi up to this head dim (flash3/_backend.py
# ALIBI_MAX_HEAD_DIM: above it the term spilled registers; those calls run the reference), the
# backward at every head dim.
ALIBI_MAX_HEAD_DIM = 128


def applies(kid: str, feature: str) -> bool:
    if feature not in family_features(kid) or feature in NOT_APPLICABLE.get(family(kid), ()):
        return False
    if feature == "alibi" and family(kid) != "bwd":
        return max(parse_kernel(kid)[1:]) <= ALIBI_MAX_HEAD_DIM
    return True


def kernel_features(kid: str) -> list[str]:
    """Every feature of the kernel's family, in matrix order."""
    return [f for f in family_features(kid) if applies(kid, f)]


def kernel_ids(info: dict) -> list[str]:
    """Kernel ids from kernel_info()'s JSON: 'bf16:128:128' per "fwd" (dtype, d, d_v) triple
    (variants of one triple share a row: the op picks one), then 'e4m3:128:128' per "fwd_fp8"
    (d, d_v) pair, then 'bwd:bf16:128:128' per "bwd" triple whose forward is built (its cases
    take out/lse from that forward), then 'dec:bf16:128:128' per "decode" triple,
    'dec:kve4m3:bf16:128:128' per "decode_fp8_cache" triple and 'quant:bf16' per "quantize_fp8"
    dtype (smoke_quant.kernel_ids)."""
    ids = [f"{x[0]}:{x[1]}:{x[2]}" for x in info.get("fwd", [])]
    ids += [f"e4m3:{x[0]}:{x[1]}" for x in info.get("fwd_fp8", [])]
    ids += [f"bwd:{x[0]}:{x[1]}:{x[2]}" for x in info.get("bwd", []) if f"{x[0]}:{x[1]}:{x[2]}" in ids]
    ids += [f"dec:{x[0]}:{x[1]}:{x[2]}" for x in info.get("decode", [])]
    ids += [f"dec:kve4m3:{x[0]}:{x[1]}:{x[2]}" for x in info.get("decode_fp8_cache", [])]
    ids += smoke_quant.kernel_ids(info)
    return list(dict.fromkeys(ids))


def next_dims(d: int, dv: int) -> tuple[int, int]:
    """(d, d_v) of the "nextdim" case of kernel (d, dv): smaller head dims that the kernel registry
    (pick_fwd_kernel / find_bwd_kernel: the smallest compiled d, then d_v, covering them) gives
    this kernel in a full build. For (128, 128): (64, 128), whose q/k rows fill at most half of the
    kernel's TMA boxes (a box wholly outside the tensor must still complete its bytes)."""
    return (64, 128) if (d, dv) == (128, 128) else (d - 24, dv - 24)


def sink_logits(h: int, g, device="cpu"):
    """The "sinks" features' fp32 (h,) logits: N(0, 2^2), about the rows' lse (scores ~ N(0, 1) over
    a few hundred keys), with head 1 at 5 and head 3 at 8 (the sink then carries most of the
    softmax: O scaled by ~0.07) and head 4 at -inf (no sink)."""
    import torch
    s = torch.randn(h, generator=g) * 2
    s[1], s[3], s[4] = 5.0, 8.0, float("-inf")
    return s.to(torch.float32).to(device)


def alibi_slopes(b: int, h: int, g, device="cpu"):
    """The "alibi" features' fp32 (b, h) slopes: 0.002 * 50^u, u uniform in [0, 1) (log-uniform
    over 0.002-0.1, as ALiBi's geometric slopes spread), one per (batch row or sequence, head)."""
    import torch
    return (0.002 * 50.0 ** torch.rand(b, h, generator=g)).to(torch.float32).to(device)


def make_case(feature: str, dtype_name: str, d: int, dv: int, device="cuda", seed=0,
              bwd=False) -> dict:
    """Inputs and options of one smoke case (the op's arguments but out/lse). e4m3: the bf16
    case's shapes and values, quantized (_quantize_case). bwd: the forward case plus dout,
    deterministic (True for "determ": the gqa case's shapes) and dlse (the gradient flowing into
    lse, shaped as lse; "dlse" only: the causal case's shapes, random N(0, 1), None otherwise)."""
    import torch
    fam = "bwd" if bwd else dtype_name
    if feature in NOT_APPLICABLE.get(fam, ()):
        raise ValueError(f"{feature} does not apply to {fam} kernels")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "e4m3": torch.bfloat16}[dtype_name]
    g = torch.Generator(device="cpu").manual_seed(seed + d + 7 * dv + FEATURES.index(feature))
    rnd = lambda *shape: torch.randn(*shape, generator=g).to(device=device, dtype=dtype)  # noqa: E731
    c = dict(dtype=dtype_name, feature=feature, causal=False, window=(-1, -1), softcap=0.0,
             cu_q=None, cu_k=None, seqused_k=None, lens_q=None, lens_k=None, sinks=None, alibi=None)
    b, h, hk, sq, sk = 2, 2, 2, SQ, SK
    if feature == "nextdim":
        d, dv = next_dims(d, dv)
    if feature in ("causal", "dlse", "sq_gt_sk") or (feature == "sinks" and not bwd):
        c["causal"] = True
        if feature == "sq_gt_sk":
            sq, sk = SK, SQ
        elif feature == "sinks":
            sq, sk, h, hk = SK, SINKS_SK, 6, 2
    elif feature == "window":
        c["window"] = (97, 13)
    elif feature == "softcap":
        c["softcap"] = 5.0  # small enough that the tanh visibly changes scores of ~3
    elif feature in ("gqa", "determ"):
        h, hk = 6, 2
    elif feature == "sinks":
        c["causal"], h, hk = True, 6, 2
    elif feature == "alibi":
        h, hk = 6, 2
    if feature in ("varlen", "onekey", "nantail", "alibi") or (feature == "sinks" and bwd):
        c["lens_q"], c["lens_k"] = {"varlen": ([SQ, 0, 77, 1], [SK, 40, 150, 0]), "onekey": ONEKEY_LENS,
                                    "nantail": NANTAIL_LENS, "sinks": SINKS_LENS,
                                    "alibi": ALIBI_LENS}[feature]
        pq, pk = NANTAIL_PAD if feature == "nantail" else (0, 0)
        tq, tk = sum(c["lens_q"]), sum(c["lens_k"])
        c["q"], c["k"], c["v"] = rnd(tq + pq, h, d), rnd(tk + pk, hk, d), rnd(tk + pk, hk, dv)
        c["tail"] = (tq, tk)  # rows used of the packed q and k/v
        cum = lambda ls: torch.tensor([0] + ls, device=device).cumsum(0).to(torch.int32)  # noqa: E731
        c["cu_q"], c["cu_k"] = cum(c["lens_q"]), cum(c["lens_k"])
        c["max_q"], c["max_k"] = max(c["lens_q"]), max(c["lens_k"])
    else:
        if feature == "kvcache":  # a batched cache, used up to seqused_k (its tail is finite, as required)
            sq, sk = 77, 512
            c["lens_k"] = [SK, 150]
            c["seqused_k"] = torch.tensor(c["lens_k"], device=device, dtype=torch.int32)
        c["q"], c["k"], c["v"] = rnd(b, sq, h, d), rnd(b, sk, hk, d), rnd(b, sk, hk, dv)
        c["max_q"], c["max_k"] = sq, sk
    if feature == "sinks" and not bwd:
        c["sinks"] = sink_logits(h, g, device)
    if feature == "alibi":  # per (sequence, head), spanning 0.002-0.1: biases up to ~30 over SK keys
        c["alibi"] = alibi_slopes(len(c["lens_q"]), h, g, device)
    if bwd:
        c.update(bwd=True, deterministic=feature == "determ", dout=rnd(*c["q"].shape[:-1], dv),
                 dlse=torch.randn(b, h, sq, generator=g).to(device) if feature == "dlse" else None)
    if feature == "sinks" and bwd:  # logits near the rows' lse (~log of the keys seen); head 1: no sink
        c["sinks"] = (torch.randn(h, generator=g) + 4.0).index_fill_(0, torch.tensor([1]), -math.inf).to(device)
        c["dlse"] = torch.randn(h, c["q"].shape[0], generator=g).to(device)  # varlen lse: (h, total_q)
    if feature == "nantail":
        for n in ("q", "k", "v", "dout"):
            if n in c:
                _poison_tail(c[n][used_rows(c, n).stop:])
    return _quantize_case(c, g) if dtype_name == "e4m3" else c


def _poison_tail(x) -> None:
    """NaN, +Inf and -Inf in turn over the rows of x (in place): what unused buffer space may hold."""
    flat = x.view(-1)
    for i, val in enumerate((float("nan"), float("inf"), float("-inf"))):
        flat[i::3] = val


def used_rows(c: dict, name: str) -> slice:
    """The rows of a case tensor that belong to some sequence: all but a nantail case's unused tail
    (q, dout, out: the first cu_seqlens_q[-1]; k, v: cu_seqlens_k[-1]; lse: its columns, q's rows)."""
    if c.get("tail") is None:
        return slice(None)
    return slice(c["tail"][name.removeprefix("d") in ("k", "v")])


def _quantize_case(c: dict, g) -> dict:
    """The e4m3 form of a bf16 case, c["descales"] = (q, k, v, v channel), c["fp8_block"] = (q rows,
    k/v keys) per descale: batched inputs through flash3.fp8's block quantizers (FP8_BLOCK; "perhead":
    one block per sequence, rounded up to the kernel's 64 / 128 as flash3's per-head descales are);
    packed (varlen) ones, which those cannot quantize per sequence, cast to e4m3 as they are, with
    random per-sequence block descales in [0.5, 1.5). K and V block descales are random in every case."""
    import torch
    from flash3 import fp8
    c["fp8_block"] = FP8_BLOCK
    if c["feature"] == "perhead":
        c["fp8_block"] = (-(-c["max_q"] // 64) * 64, -(-c["max_k"] // 128) * 128)
    if c["cu_q"] is None:
        c["q"], qd = fp8.quantize_fp8(c["q"], block_size=c["fp8_block"][0])
        c["k"], kd = fp8.quantize_fp8(c["k"], block_size=c["fp8_block"][1])
        c["v"], vd, vcd = fp8.quantize_v_fp8(c["v"], block_size=c["fp8_block"][1])
        # quantize_v_fp8's block descales are all 1 (its channel descales absorb the scale), and K's
        # follow the data: random factors in [0.5, 1.5) make a block descale applied to the wrong
        # block, or not at all, change the output (the reference takes the same descales).
        kd = kd * (torch.rand(kd.shape, generator=g) + 0.5).to(kd.device)
        vd = vd * (torch.rand(vd.shape, generator=g) + 0.5).to(vd.device)
    else:
        b, h, hk, dv = len(c["lens_q"]), c["q"].shape[1], c["k"].shape[1], c["v"].shape[2]
        dev = c["q"].device
        c["q"], c["k"], c["v"] = (x.float().clamp(-448, 448).to(torch.float8_e4m3fn)
                                  for x in (c["q"], c["k"], c["v"]))
        rand = lambda *shape: (torch.rand(*shape, generator=g) + 0.5).to(dev)  # noqa: E731
        nq, nk = -(-c["max_q"] // FP8_BLOCK[0]), -(-c["max_k"] // FP8_BLOCK[1])
        qd, kd, vd, vcd = rand(b, h, nq), rand(b, hk, nk), rand(b, hk, nk), rand(b, hk, dv)
    c["descales"] = (qd, kd, vd, vcd)
    return c


# ---------------------------------------------------------------------------------------------
# Decode (KV-cache) cases: the checks of tests/test_kvcache_gpu.py (check_rows) and
# tests/test_decode_gpu.py (the append bit for bit against flash3.reference.kvcache_write and
# flash3.rotary.kvcache_rotary).


def _dec_cache(b, cap, h_k, d, dv, page, dtype, g, device):
    """test_kvcache_gpu.make_cache: contiguous (page None) or pages of `page` rows in shuffled
    order, 3 spare pages nobody uses; (kc, vc, page_table int32 (b, max_pages) or None)."""
    import torch
    rnd = lambda *shape: torch.randn(*shape, generator=g).to(dtype).to(device)  # noqa: E731
    if page is None:
        return rnd(b, cap, h_k, d), rnd(b, cap, h_k, dv), None
    max_pages = -(-cap // page)
    num_pages = b * max_pages + 3
    kc, vc = rnd(num_pages, page, h_k, d), rnd(num_pages, page, h_k, dv)
    perm = torch.randperm(num_pages, generator=g)[:b * max_pages]
    return kc, vc, perm.view(b, max_pages).to(torch.int32).to(device)


def make_dec_case(feature: str, kid: str, device="cuda", seed=0) -> list[dict]:
    """The launches ("parts") of one decode feature: each the arguments of fwd_kvcache_sm90 (q, kc,
    vc, pt, seqused, num_splits, mask, descales) and, for the fused append, of append_kv_sm90
    (part["append"]: k, v, cache_seqlens, rotary tables); "unchecked": rows whose result the
    bad-index contract leaves undefined (only finite). FP8 cache (dec:kve4m3:...): float32 caches
    quantized per (slab, head) with descales in [0.01, 0.11) (test_kvcache_gpu.make_fp8_cache)."""
    import torch
    from flash3 import reference
    if not applies(kid, feature):
        raise ValueError(f"{feature} does not apply to {kid}")
    dtype_name, d, dv = parse_kernel(kid)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name]
    fp8 = dec_fp8_cache(kid)
    g = torch.Generator(device="cpu").manual_seed(seed + d + 7 * dv + 100 * DEC_FEATURES.index(feature))
    rnd = lambda *shape: torch.randn(*shape, generator=g).to(dtype).to(device)  # noqa: E731
    i32 = lambda xs: torch.tensor(xs, dtype=torch.int32, device=device)  # noqa: E731

    def cache(b, cap, h_k, page):
        kc, vc, pt = _dec_cache(b, cap, h_k, d, dv, page, torch.float32 if fp8 else dtype, g, device)
        if not fp8:
            return kc, vc, pt, None
        kd, vd = ((torch.rand(kc.shape[0], h_k, generator=g) * 0.1 + 0.01).to(device) for _ in range(2))
        return (reference.quantize_fp8_cache(kc, kd[:, None, :]), reference.quantize_fp8_cache(vc, vd[:, None, :]),
                pt, (kd, vd))

    def part(q, kc, vc, pt, descales, seqused, num_splits=1, causal=False, window=(-1, -1), softcap=0.0,
             append=None, unchecked=(), sinks=None, cu_q=None, max_q=0, alibi=None):
        return dict(feature=feature, q=q, kc=kc, vc=vc, pt=pt, descales=descales, seqused=seqused,
                    num_splits=num_splits, causal=causal, window=window, softcap=softcap, append=append,
                    unchecked=set(unchecked), sinks=sinks, cu_q=cu_q, max_q=max_q, alibi=alibi)

    h, h_k = 4, 2
    if feature == "vpaged":  # packed queries (cu_seqlens_q) against paged caches, GQA g = 4
        lens_q, lens_k = VPAGED_LENS
        cu = [0]
        for n in lens_q:
            cu.append(cu[-1] + n)
        parts = []
        for page, splits, with_sinks in ((256, 1, False), (16, 3, True), (1, 1, True)):
            kc, vc, pt, ds = cache(len(lens_q), 256, h_k, page)
            q = rnd(cu[-1] + VPAGED_TAIL, 4 * h_k, d)
            sinks = sink_logits(4 * h_k, g, device) if with_sinks else None  # the combine's / epilogue's
            parts.append(part(q, kc, vc, pt, ds, i32(lens_k), num_splits=splits, causal=True, cu_q=i32(cu),
                              max_q=max(lens_q), sinks=sinks))
        return parts
    if feature == "contig" or feature.startswith("page"):
        page = None if feature == "contig" else int(feature[4:])
        kc, vc, pt, ds = cache(3, 300, h_k, page)
        return [part(rnd(3, 1, h, d), kc, vc, pt, ds, i32([1, 129, 300]), causal=True)]
    if feature == "split":  # test_splits: a row of 0 keys (every split empty), s_q 2
        kc, vc, pt, ds = cache(3, 600, h_k, 16)
        return [part(rnd(3, 2, h, d), kc, vc, pt, ds, i32([0, 200, 600]), num_splits=3, causal=True)]
    if feature == "gqa":  # test_packed_gqa: g = 4, s_q 5, 1 and 4 splits
        kc, vc, pt, ds = cache(2, 500, h_k, 64)
        q = rnd(2, 5, 4 * h_k, d)
        return [part(q, kc, vc, pt, ds, i32([333, 500]), num_splits=n, causal=True) for n in (1, 4)]
    if feature in ("causal", "window", "softcap"):  # test_head_dims_masks_and_chunked_prefill
        mask = {"causal": dict(causal=True), "window": dict(window=(100, 7)),
                "softcap": dict(causal=True, softcap=20.0)}[feature]
        kc, vc, pt, ds = cache(2, 400, h_k, 16)
        return [part(rnd(2, s_q, h, d), kc, vc, pt, ds, i32([s_q + 17, 400]), num_splits=0, **mask)
                for s_q in (1, 70)]
    if feature == "sinks":  # packed GQA (g = 4, s_q 5), a row of 0 keys; no split (epilogue), 3 (combine)
        kc, vc, pt, ds = cache(3, 500, h_k, 64)
        q = rnd(3, 5, 4 * h_k, d)
        sinks = sink_logits(4 * h_k, g, device)
        return [part(q, kc, vc, pt, ds, i32([0, 333, 500]), num_splits=n, causal=True, sinks=sinks)
                for n in (1, 3)]
    if feature == "alibi":  # packed GQA (g = 4, s_q 5), per-row slopes, a row of 0 keys; 1 and 3 splits
        kc, vc, pt, ds = cache(3, 500, h_k, 64)
        q = rnd(3, 5, 4 * h_k, d)
        slopes = alibi_slopes(3, 4 * h_k, g, device)
        return [part(q, kc, vc, pt, ds, i32([0, 333, 500]), num_splits=n, causal=True, alibi=slopes)
                for n in (1, 3)]
    if feature == "badidx":  # test_bad_index_values_stay_in_bounds
        kc, vc, pt, ds = cache(3, 256, h_k, 16)
        bad = pt.clone()
        bad[1, 2], bad[1, 3] = 10**6, -5
        q = rnd(3, 1, h, d)
        return [part(q, kc, vc, bad, ds, i32([10**8, 100, -40]), num_splits=n, unchecked=[1]) for n in (1, 3)]
    # append / rotary: test_append_then_attend_matches_reference (FP8: ..._fp8_cache_...)
    b, s_new, h = 3, 2, 8
    kc, vc, pt, ds = cache(b, 512, h_k, 16 if feature == "append" else None)
    q, k, v = rnd(b, s_new, h, d), rnd(b, s_new, h_k, d), rnd(b, s_new, h_k, dv)
    if fp8:  # saturation both ways, an e4m3 subnormal, zero
        k[0, 0, 0, :4] = torch.tensor([1e3, -1e3, 1e-4, 0.0])
        v[1, 1, 1, :2] = 1e4
    lens = i32([0, 77, 500])
    cos = sin = None
    if feature == "rotary":
        ang = torch.arange(600, dtype=torch.float32)[:, None] * 10000.0 ** (
            -torch.arange(0, 64, 2, dtype=torch.float32) / 64)
        cos, sin = ang.cos().to(device), ang.sin().to(device)
    app = dict(k=k, v=v, cache_seqlens=lens, cos=cos, sin=sin, interleaved=False, per_token=True)
    seqused = (lens.to(torch.int64) + s_new).clamp(0, 2**31 - 1).to(torch.int32)  # flash3/ops.py
    return [part(q, kc, vc, pt, ds, seqused, num_splits=0, causal=True, append=app)]


def dec_poisoned_outputs(p: dict):
    """NaN out (b, s_q, h, d_v) / lse (b, h, s_q) (packed q: (total_q, h, d_v) / (h, total_q)), and
    q_out (NaN, q's shape) when rotary."""
    import torch
    q = p["q"]
    if p.get("cu_q") is not None:
        return (torch.full((q.shape[0], q.shape[1], p["vc"].shape[-1]), float("nan"), dtype=q.dtype, device=q.device),
                torch.full((q.shape[1], q.shape[0]), float("nan"), device=q.device), None)
    b, s_q, h, _ = q.shape
    out = torch.full((b, s_q, h, p["vc"].shape[-1]), float("nan"), dtype=q.dtype, device=q.device)
    lse = torch.full((b, h, s_q), float("nan"), device=q.device)
    rot = p["append"] is not None and p["append"]["cos"] is not None
    return out, lse, torch.full_like(q, float("nan")) if rot else None


def launch_dec(p: dict) -> dict:
    """One synchronized decode step on copies of the part's caches: append_kv_sm90 (when the part
    appends) then fwd_kvcache_sm90, as flash3/ops.py attention_kvcache runs them. Returns out, lse,
    the caches after the step (kc, vc) and q_out (rotary) or None."""
    import torch
    out, lse, q_out = dec_poisoned_outputs(p)
    kc, vc = p["kc"].clone(), p["vc"].clone()
    kd, vd = p["descales"] or (None, None)
    q = p["q"]
    a = p["append"]
    if a is not None:
        torch.ops.flash3.append_kv_sm90(q, kc, vc, a["k"], a["v"], a["cache_seqlens"], p["pt"], a["cos"],
                                        a["sin"], a["interleaved"], a["per_token"],
                                        q_out if q_out is not None else q, kd, vd)
        q = q_out if q_out is not None else q
    extra = {} if p.get("sinks") is None else {"sinks": p["sinks"]}  # builds without sinks: no argument
    if p.get("alibi") is not None:
        extra["alibi_slopes"] = p["alibi"]
    torch.ops.flash3.fwd_kvcache_sm90(q, kc, vc, out, lse, p["seqused"], p["pt"], q.shape[-1] ** -0.5,
                                      *op_window(p), p["softcap"],
                                      p["num_splits"], kd, vd, **extra, cu_seqlens_q=p.get("cu_q"),
                                      max_seqlen_q=int(p.get("max_q") or 0))
    torch.cuda.synchronize()
    return {"out": out, "lse": lse, "kc": kc, "vc": vc, "q_out": q_out}


def check_dec(p: dict, r: dict) -> dict:
    """One decode launch: the append bit for bit (caches against reference.kvcache_write of the
    reference-rotated k, q_out against kvcache_rotary); NaN anywhere in out/lse is nan; each batch
    row on its first clamp(seqused, 0, capacity) keys against the fp64 oracle with the FA rule and
    the lse rule of test_kvcache_gpu.check_rows (FP8: out's oracle on the exact x8 * descale, the
    naive baseline and lse's oracle on those values in q's dtype, which the kernel computes with);
    a row of no keys: out 0, lse -inf (with sinks: the head's sink); rows the
    bad-index contract leaves undefined: finite. Sinks: the oracles' sink column (helpers)."""
    import torch
    from flash3 import reference
    if str(ROOT / "tests") not in sys.path:
        sys.path.insert(0, str(ROOT / "tests"))
    from helpers import attention_naive, attention_ref64, fa_tolerance, max_err
    kd, vd = p["descales"] or (None, None)
    q, kc, vc, pt = p["q"], r["kc"], r["vc"], p["pt"]
    a = p["append"]
    if a is not None:
        q_ref, k_ref = q, a["k"]
        if a["cos"] is not None:
            from flash3.rotary import kvcache_rotary
            q_ref, k_ref = kvcache_rotary(q, a["k"], a["cache_seqlens"], a["cos"], a["sin"], a["interleaved"],
                                          a["per_token"])
        kc_ref, vc_ref = p["kc"].clone(), p["vc"].clone()
        reference.kvcache_write(kc_ref, vc_ref, k_ref, a["v"], a["cache_seqlens"], pt, kd, vd)
        for name, got, want in (("k_cache", kc, kc_ref), ("v_cache", vc, vc_ref)):
            if not torch.equal(got.view(torch.uint8), want.view(torch.uint8)):
                n = int((got.view(torch.uint8) != want.view(torch.uint8)).sum())
                return {"status": "wrong", "detail": f"append: {name} differs from reference.kvcache_write "
                                                     f"in {n} bytes"}
        if a["cos"] is not None:
            if not torch.equal(r["q_out"].view(torch.uint8), q_ref.view(torch.uint8)):
                return {"status": "wrong", "detail": "append: q_out differs from kvcache_rotary's q"}
            q = r["q_out"]
    out, lse = r["out"], r["lse"]
    if torch.isnan(out).any() or torch.isnan(lse).any():
        return {"status": "nan", "detail": f"{int(torch.isnan(out).sum())} NaN in out, "
                                           f"{int(torch.isnan(lse).sum())} in lse (unwritten?)"}
    cap = kc.shape[1] * (pt.shape[1] if pt is not None else 1)
    kw = dict(causal=p["causal"], window_size=p["window"], softcap=p["softcap"], softmax_scale=q.shape[-1] ** -0.5)
    sinks = p.get("sinks")
    if sinks is not None:
        kw["sinks"] = sinks.double()
    res = {"status": "ok", "err": 0.0, "tol": 1.0, "lse_err": 0.0}
    lse_bad = None  # reported after every row's out passed (out first: it says more)
    # Each batch row's (q (1, s, h, d), out (s, h, d_v), lse (h, s)): batched rows, or packed
    # sequences cu_q[i]..cu_q[i+1] (varlen q, whose rows after cu_q[-1] must be out 0, lse -inf).
    if p.get("cu_q") is not None:
        cu = p["cu_q"].tolist()
        rows = [(q[None, a:e], out[a:e], lse[:, a:e]) for a, e in zip(cu, cu[1:])]
        if not ((out[cu[-1]:] == 0).all() and torch.isinf(lse[:, cu[-1]:]).all() and (lse[:, cu[-1]:] < 0).all()):
            return dict(res, status="wrong", detail=f"packed rows {cu[-1]}.. of no sequence: want out 0, lse -inf")
    else:
        rows = [(q[i:i + 1], out[i], lse[i]) for i in range(q.shape[0])]
    for i, n in enumerate(p["seqused"].tolist()):
        n = max(0, min(n, cap))
        q_i, out_i, lse_i = rows[i]
        if q_i.shape[1] == 0:
            continue
        if i in p["unchecked"]:
            if not torch.isfinite(out_i).all():
                return dict(res, status="wrong", detail=f"row {i} (bad page ids): non-finite out")
            continue
        if n == 0:
            if sinks is not None:  # lse = the head's sink (-inf: no sink)
                want = sinks.double().view(-1, 1).expand(lse_i.shape)
                fin = torch.isfinite(want)
                lerr = (lse_i[fin].double() - want[fin]).abs().max().item() if fin.any() else 0.0
                ok = (torch.equal(torch.isinf(lse_i), ~fin) and bool((lse_i[~fin] < 0).all())
                      and lerr <= 1e-5 * (1 + want[fin].abs().max().item() if fin.any() else 1))
                if not ((out_i == 0).all() and ok):
                    return dict(res, status="wrong", detail=f"row {i} has no keys: want out 0, lse = the sink")
            elif not ((out_i == 0).all() and torch.isinf(lse_i).all() and (lse_i < 0).all()):
                return dict(res, status="wrong", detail=f"row {i} has no keys: want out 0, lse -inf")
            continue
        k_i = reference.kvcache_gather(kc, i, n, pt, kd)[None]
        v_i = reference.kvcache_gather(vc, i, n, pt, vd)[None]
        if p.get("alibi") is not None:  # row i's slopes, distances over its n keys
            kw["alibi_slopes"] = p["alibi"][i].double() if p["alibi"].dim() == 2 else p["alibi"].double()
        ref, ref_lse = attention_ref64(*(x.double() for x in (q_i, k_i, v_i)), **kw)
        naive, _ = attention_naive(q_i, k_i.to(q.dtype), v_i.to(q.dtype), **kw)
        err, tol = max_err(out_i[None], ref), fa_tolerance(naive, ref, out.dtype)
        if err / tol > res["err"] / res["tol"]:
            res.update(err=err, tol=tol)
        if err > tol:
            return dict(res, status="wrong", detail=f"out[{i}] (n={n}): max err {err:.3e} > tolerance {tol:.3e}")
        _sharp_update(res, out_i[None], naive, ref, out.dtype, f"out[{i}] (n={n}): ")
        if res["status"] != "ok":
            return res
        if not torch.equal(torch.isinf(lse_i), torch.isinf(ref_lse[0])):
            return dict(res, status="wrong", detail=f"lse[{i}]: -inf pattern differs from the reference")
        if kd is not None:
            # An FP8 cache's kernel computes with x8 * descale rounded once to q's dtype (its
            # documented algorithm, the 16-bit cache's precision): lse, checked tightly, is checked
            # against the fp64 oracle of exactly those values; out above keeps the exact oracle.
            _, ref_lse = attention_ref64(q_i.double(), k_i.to(q.dtype).double(),
                                         v_i.to(q.dtype).double(), **kw)
        fin = torch.isfinite(ref_lse[0])
        if fin.any():
            lerr = (lse_i[fin].double() - ref_lse[0][fin]).abs().max().item()
            res["lse_err"] = max(res["lse_err"], lerr)
            ltol = 1e-4 * (1 + ref_lse[0][fin].abs().max().item())
            if lerr > ltol and lse_bad is None:
                lse_bad = f"lse[{i}] (n={n}) err {lerr:.3e} > {ltol:.3e}"
    return dict(res, status="wrong", detail=lse_bad) if lse_bad else res


def worst(results: list[dict]) -> dict:
    """The first result that is not ok, else the one closest to its tolerance."""
    bad = [r for r in results if r["status"] != "ok"]
    if bad:
        return bad[0]
    return max(results, key=lambda r: r.get("err", 0.0) / r.get("tol", 1.0))


def launch(c: dict):
    """One synchronized launch (fwd_sm90; fwd_fp8_sm90 for e4m3) into NaN-poisoned out/lse."""
    import torch
    q, v = c["q"], c["v"]
    nan = float("nan")
    out_dtype = torch.bfloat16 if c["dtype"] == "e4m3" else q.dtype
    out = torch.full((*q.shape[:-1], v.shape[-1]), nan, device=q.device, dtype=out_dtype)
    lse_shape = (q.shape[1], q.shape[0]) if c["cu_q"] is not None else (q.shape[0], q.shape[2], q.shape[1])
    lse = torch.full(lse_shape, nan, device=q.device)
    (_launch_fp8 if c["dtype"] == "e4m3" else _launch_fwd)(c, out, lse)
    torch.cuda.synchronize()
    return out, lse


def op_window(c) -> tuple[int, int]:
    """A case's mask as every op takes it: (left, right), -1 unbounded, causal folded into right = 0
    (flash3.masking.normalize_window, as the API does)."""
    from flash3.masking import normalize_window
    return normalize_window(c["causal"], c["window"])


def _launch_fwd(c, out, lse):
    import torch
    extra = {} if c.get("sinks") is None else {"sinks": c["sinks"]}  # builds without sinks: no argument
    if c.get("alibi") is not None:
        extra["alibi_slopes"] = c["alibi"]
    torch.ops.flash3.fwd_sm90(c["q"], c["k"], c["v"], out, lse, c["cu_q"], c["cu_k"], c["seqused_k"],
                              c["max_q"], c["max_k"], c["q"].shape[-1] ** -0.5, *op_window(c),
                              c["softcap"], **extra)


def _launch_fp8(c, out, lse):
    import torch
    from flash3 import fp8
    if c["cu_q"] is not None:
        vt, tail = fp8.pack_v_fp8_varlen(c["v"], c["cu_k"]), (c["cu_q"], c["cu_k"], c["max_q"], c["max_k"])
    else:
        vt, tail = fp8.pack_v_fp8(c["v"]), ()
    torch.ops.flash3.fwd_fp8_sm90(c["q"], c["k"], vt, out, lse, *c["descales"], *c["fp8_block"],
                                  c["q"].shape[-1] ** -0.5, *op_window(c), c["softcap"], *tail)


def _pieces(c, out, lse):
    """(out, lse, q, k, v) per sequence, batched 4-D, for the reference."""
    q, k, v = c["q"], c["k"], c["v"]
    if c["cu_q"] is not None:
        oq = ok = 0
        for lq, lk in zip(c["lens_q"], c["lens_k"]):
            yield (out[oq:oq + lq][None], lse[:, oq:oq + lq][None], q[oq:oq + lq][None],
                   k[ok:ok + lk][None], v[ok:ok + lk][None])
            oq, ok = oq + lq, ok + lk
    elif c["seqused_k"] is not None:
        for i, n in enumerate(c["lens_k"]):
            yield out[i:i + 1], lse[i:i + 1], q[i:i + 1], k[i:i + 1, :n], v[i:i + 1, :n]
    else:
        yield out, lse, q, k, v


def unused_written(c: dict, tensors: dict) -> str | None:
    """nantail: what the op wrote in the rows past cu_seqlens[-1] (still all NaN poison if nothing),
    else None. tensors: {name: tensor as the op got it} (lse: its columns)."""
    import torch
    bad = [n for n, t in tensors.items()
           if not torch.isnan(t[:, used_rows(c, "q").stop:] if n == "lse" else t[used_rows(c, n).stop:]).all()]
    return f"wrote {', '.join(bad)} past cu_seqlens[-1]" if bad else None


def check(c: dict, out, lse) -> dict:
    """Classify one launch: nan, wrong or ok, with the worst error against its tolerance (nantail:
    on the used rows, and wrong if the op wrote past them)."""
    import torch
    if c.get("tail") is not None:
        if (msg := unused_written(c, {"out": out, "lse": lse})) is not None:
            return {"status": "wrong", "detail": msg}
        out, lse = out[used_rows(c, "out")], lse[:, used_rows(c, "q")]
    if torch.isnan(out).any() or torch.isnan(lse).any():
        return {"status": "nan", "detail": f"{int(torch.isnan(out).sum())} NaN in out, "
                                           f"{int(torch.isnan(lse).sum())} in lse (unwritten?)"}
    return (_check_fp8 if c["dtype"] == "e4m3" else _check_fa)(c, out, lse)


def sharp_bound(o, naive, ref, dtype) -> tuple[float, str]:
    """The oracle's second, sharper bound beside the FlashAttention rule (issue 32): the rule with a
    2-ulp floor in place of its 8 (the floor dominates 16-bit tolerances, so this is 0.25-0.4x the
    rule: a bug half the size of one that crosses the rule by 1.3x still fails), and an RMS bound
    (rms(o - ref) <= 2 rms(naive - ref) + eps rms(ref)) for small errors spread over many outputs.
    Returns (worst error / bound, what crossed it or "")."""
    import torch
    from helpers import max_err, noop_rounding
    eps = torch.finfo(dtype).eps
    rms = lambda x: x.double().pow(2).mean().sqrt().item() if x.numel() else 0.0  # noqa: E731
    m_err, m_tol = max_err(o, ref), 2 * max_err(naive, ref) + 2 * noop_rounding(ref, dtype) + 2 * eps
    r_err = rms(o.double() - ref.double())
    r_tol = 2 * rms(naive.double() - ref.double()) + eps * rms(ref)
    worst, what = 0.0, ""
    for err, tol, name in ((m_err, m_tol, "max"), (r_err, r_tol, "rms")):
        if tol > 0 and err / tol > worst:
            worst = err / tol
            if worst > 1:
                what = f"sharp bound: {name} err {err:.2e} > {tol:.2e}"
    return worst, what


def _sharp_update(res: dict, o, naive, ref, dtype, where: str = "") -> None:
    """Records sharp_bound's ratio in res["sharp"] (the worst so far); wrong when it is crossed."""
    ratio, what = sharp_bound(o, naive, ref, dtype)
    res["sharp"] = max(res.get("sharp", 0.0), ratio)
    if what and res["status"] == "ok":
        res.update(status="wrong", detail=f"{where}{what}")


def _check_fa(c, out, lse) -> dict:
    """Per sequence against the fp64 reference: the FlashAttention rule of tests/helpers.py (sinks:
    its sink column)."""
    import torch
    if str(ROOT / "tests") not in sys.path:
        sys.path.insert(0, str(ROOT / "tests"))
    from helpers import attention_naive, attention_ref64, fa_tolerance, max_err
    kw = dict(causal=c["causal"], window_size=c["window"], softcap=c["softcap"])
    if c.get("sinks") is not None:
        kw["sinks"] = c["sinks"].double()
    worst = {"status": "ok", "err": 0.0, "tol": 1.0, "lse_err": 0.0}
    for i, (o, l, q, k, v) in enumerate(_pieces(c, out, lse)):
        if c.get("alibi") is not None:  # the sequence's (or batch row's) slopes
            kw["alibi_slopes"] = c["alibi"][i].double() if c["cu_q"] is not None else c["alibi"].double()
        ref, ref_lse = attention_ref64(q, k, v, **kw)
        naive, _ = attention_naive(q, k, v, **kw)
        err, tol = max_err(o, ref), fa_tolerance(naive, ref, o.dtype)
        if err / tol > worst["err"] / worst["tol"]:
            worst.update(err=err, tol=tol)
        _sharp_update(worst, o, naive, ref, o.dtype)
        if not torch.equal(torch.isinf(l), torch.isinf(ref_lse)):
            worst.update(status="wrong", detail="lse: -inf pattern differs from the reference")
            continue
        fin = torch.isfinite(ref_lse)
        if fin.any():
            lerr = max_err(l[fin], ref_lse[fin])
            worst["lse_err"] = max(worst["lse_err"], lerr)
            if lerr > 1e-3 * (1 + ref_lse[fin].abs().max().item()):
                worst.update(status="wrong", detail=f"lse err {lerr:.2e}")
    if worst["err"] > worst["tol"]:
        worst.update(status="wrong", detail=f"max err {worst['err']:.2e} > tol {worst['tol']:.2e}")
    return worst


def fp8_reference(c: dict):
    """(out, lse) of the CPU emulation of the FP8 kernel for an e4m3 case, shaped as the op's."""
    from flash3 import fp8
    cpu = lambda x: None if x is None else x.cpu()  # noqa: E731
    q, k, v = (cpu(c[n]) for n in ("q", "k", "v"))
    qd, kd, vd, vcd = map(cpu, c["descales"])
    kw = dict(softmax_scale=q.shape[-1] ** -0.5, causal=c["causal"], window_left=c["window"][0],
              window_right=c["window"][1], softcap=c["softcap"], block_size=c["fp8_block"],
              v_channel_descale=vcd)
    if c["cu_q"] is not None:
        return fp8.fp8_attention_varlen_reference(q, k, v, cpu(c["cu_q"]), cpu(c["cu_k"]), qd, kd, vd,
                                                  max_seqlen_q=c["max_q"], max_seqlen_k=c["max_k"], **kw)
    return fp8.fp8_attention_reference(q, k, v, qd, kd, vd, **kw)


def _check_fp8(c, out, lse) -> dict:
    """Against the emulation (the same algorithm): RMS error within 2^-7 of the reference's RMS,
    the same -inf rows in lse, finite lse within 1e-3 (tests/test_fp8_gpu.py's varlen rule)."""
    import torch
    ref, ref_lse = fp8_reference(c)
    ref, ref_lse = ref[used_rows(c, "out")], ref_lse[:, used_rows(c, "q")]  # out/lse: already cut
    rms = lambda x: x.double().pow(2).mean().sqrt().item()  # noqa: E731
    out, lse = out.cpu(), lse.cpu()
    err, tol = rms(out.double() - ref.double()), 2 ** -7 * rms(ref) + 1e-6
    res = {"status": "ok", "err": err, "tol": tol, "lse_err": 0.0}
    fin = torch.isfinite(ref_lse)
    if not torch.equal(torch.isinf(lse), torch.isinf(ref_lse)):
        res.update(status="wrong", detail="lse: -inf pattern differs from the reference")
    elif fin.any():
        res["lse_err"] = (lse[fin] - ref_lse[fin]).abs().max().item()
        if res["lse_err"] > 1e-3:
            res.update(status="wrong", detail=f"lse err {res['lse_err']:.2e}")
    if err > tol:
        res.update(status="wrong", detail=f"rms err {err:.2e} > tol {tol:.2e}")
    # The sharp bound (sharp_bound's role for FP8): half of it, 2^-8 of the reference's RMS.
    sharp = 2 ** -8 * rms(ref) + 1e-6
    res["sharp"] = err / sharp
    if err > sharp and res["status"] == "ok":
        res.update(status="wrong", detail=f"sharp bound: rms err {err:.2e} > {sharp:.2e}")
    return res


def launch_bwd(c: dict):
    """out/lse from the forward kernel (launch; with the case's sinks), then one synchronized
    bwd_sm90 launch (with the case's dlse, sinks) into NaN-poisoned dq/dk/dv (and dsinks); "determ" a
    second one. Returns (out, lse, grads, second grads or None): grads [dq, dk, dv] (+ [dsinks])."""
    import torch
    out, lse = launch(c)
    if torch.isnan(out[used_rows(c, "out")]).any() or torch.isnan(lse[:, used_rows(c, "q")]).any():
        raise RuntimeError("the forward kernel left NaN in out/lse (see its row)")

    def once():
        grads = [torch.full_like(c[n], float("nan")) for n in ("q", "k", "v")]
        sinks = c.get("sinks")
        if sinks is not None:  # d_sink last, NaN-poisoned too
            grads.append(torch.full_like(sinks, float("nan")))
        torch.ops.flash3.bwd_sm90(c["dout"], c["q"], c["k"], c["v"], out, lse, c["dlse"], *grads[:3],
                                  c["cu_q"], c["cu_k"], c["max_q"], c["max_k"], c["q"].shape[-1] ** -0.5,
                                  *op_window(c), c["softcap"],
                                  c["deterministic"], *((sinks, grads[3]) if sinks is not None else ()),
                                  **({} if c.get("alibi") is None else {"alibi_slopes": c["alibi"]}))
        torch.cuda.synchronize()
        return grads
    grads = once()
    return out, lse, grads, once() if c["deterministic"] else None


def check_bwd(c: dict, out, lse, grads, again=None) -> dict:
    """Against flash3.reference.backward (varlen_backward) in fp32 on the same inputs (dlse too) and
    the kernel's out/lse: each gradient's max error within 4 eps(dtype) x its largest reference element
    (+1e-5); nan for NaN in dq/dk/dv; "determ": the second launch bitwise equal to the first.
    Packed tensors' rows past cu_seqlens[-1] are compared too: the op zeroes them, as the reference.
    With sinks grads[3] is d_sink, checked by check_dsinks (and the reference gets the sinks)."""
    import torch
    from flash3 import reference
    nans = [f"{int(torch.isnan(x).sum())} NaN in {n}" for n, x in zip(("dq", "dk", "dv", "dsinks"), grads)
            if torch.isnan(x).any()]
    if nans:
        return {"status": "nan", "detail": ", ".join(nans) + " (unwritten?)"}
    args = [c[n].float() for n in ("dout", "q", "k", "v")] + [out.float(), lse.float()]
    kw = (c["q"].shape[-1] ** -0.5, *((-1, 0) if c["causal"] else c["window"]), c["softcap"])
    sk = {"sinks": c["sinks"]} if c.get("sinks") is not None else {}
    al = {} if c.get("alibi") is None else {"alibi_slopes": c["alibi"]}
    ref = (reference.backward(*args, *kw, dlse=c["dlse"], **sk, **al) if c["cu_q"] is None
           else reference.varlen_backward(*args, c["cu_q"], c["cu_k"], *kw, dlse=c["dlse"], **sk, **al))
    eps = torch.finfo(c["q"].dtype).eps
    res = {"status": "ok", "err": 0.0, "tol": 1.0}
    for n, x, r in zip("qkv", grads, ref):
        err = (x.double() - r.double()).abs().max().item()
        tol = 4 * eps * r.abs().max().item() + 1e-5
        if err / tol > res["err"] / res["tol"]:
            res.update(err=err, tol=tol)
        if err > tol:
            res.update(status="wrong", detail=f"d{n}: max err {err:.2e} > tol {tol:.2e}")
        # The sharp bound (sharp_bound's role for gradients): half of it, 2 eps of the largest element.
        sharp = 2 * eps * r.abs().max().item() + 1e-5
        res["sharp"] = max(res.get("sharp", 0.0), err / sharp)
        if err > sharp and res["status"] == "ok":
            res.update(status="wrong", detail=f"d{n}: sharp bound: max err {err:.2e} > {sharp:.2e}")
    if sk:
        if len(grads) < 4:
            return {"status": "error", "detail": "sinks case without d_sink"}
        bad = check_dsinks(c, out, lse, grads[3])
        if bad is not None:
            res.update(status="wrong", detail=bad)
    if c["feature"] == "onekey":  # single-key sequences: softmax 1, so dq is exactly 0
        oq, rows = 0, []
        for lq, lk in zip(c["lens_q"], c["lens_k"]):
            rows += list(range(oq, oq + lq)) if lk == 1 else []
            oq += lq
        nz = int((grads[0][rows] != 0).sum())
        if nz:
            res.update(status="wrong", detail=f"dq: {nz} nonzero values in rows that see one key")
        fwd = check(c, out, lse)  # the forward of these rows, by the forward's rule
        if fwd["status"] != "ok":
            res.update(status=fwd["status"], detail="forward: " + fwd.get("detail", ""))
    if again is not None and not all(torch.equal(a, b) for a, b in zip(grads, again)):
        res.update(status="wrong", detail="deterministic: a second launch gave other gradients")
    return res


def dsinks_expected(c: dict, out, lse):
    """(d_sink, bound) in fp64 from flash3.reference.sink_grad on the backward's own inputs (only
    the rows of some sequence when packed): d_sink = -sum P_sink (rowsum(dO O) - dlse), and bound =
    sum P_sink (sum |dO O| + |dlse|), the sum of the magnitudes d_sink is summed from."""
    import torch
    from flash3 import reference
    sinks = c["sinks"].double()
    pieces = []
    if c["cu_q"] is None:
        pieces.append((c["dout"], out, lse, c["dlse"]))
    else:
        oq = 0
        for lq in c["lens_q"]:
            dl = None if c["dlse"] is None else c["dlse"][None, :, oq:oq + lq]
            pieces.append((c["dout"][oq:oq + lq][None], out[oq:oq + lq][None], lse[:, oq:oq + lq][None], dl))
            oq += lq
    ds = torch.zeros_like(sinks)
    bound = torch.zeros_like(sinks)
    for d_o, o, l, dl in pieces:
        d_o, o, l = d_o.double(), o.double(), l.double()
        dl = None if dl is None else dl.double()
        ds += reference.sink_grad(sinks, d_o, o, l, dl)
        # the magnitudes: sink_grad of |dO O| (as dout = |dO|, out = |O|) and |dlse|, negated back
        bound -= reference.sink_grad(sinks, d_o.abs(), o.abs(), l, None if dl is None else -dl.abs())
    return ds, bound


# d_sink's rule: fp32 sums of fp32 terms in another order than the fp64 reference: within 2^-16
# (256 fp32 ulps) of the sum of the magnitudes it is summed from (per head). The kernel's path of
# one term: rowsum(dO O) over d_v <= 256 products in 4 quads of sequential fmas, - dlse, the
# fast-math exp (<= 2 + 1.2 |sink - lse| ulps), one product, then a per-thread sum over the
# batch's rows (256 threads) and an 8-level tree: ~100 roundings for these cases' sizes. A wrong
# sign (error 2 |d_sink|) or a dropped dlse term (error |sum P_sink dlse|) is far above it.
DSINK_REL = 2.0 ** -16


def check_dsinks(c: dict, out, lse, dsinks) -> str | None:
    """None when d_sink (the kernel's, fp32 (h,)) is within DSINK_REL x bound of dsinks_expected, else
    why not."""
    ref, bound = dsinks_expected(c, out, lse)
    err = (dsinks.double() - ref).abs().nan_to_num(nan=math.inf)
    tol = DSINK_REL * bound
    if bool((err <= tol).all()):
        return None
    i = int((err - tol).argmax())
    return (f"dsinks[{i}]: {float(dsinks[i]):.6e} vs reference {float(ref[i]):.6e}, "
            f"err {float(err[i]):.2e} > tol {float(tol[i]):.2e}")


def _emit(obj) -> None:
    print(json.dumps(obj), flush=True)


def _cuda_broken() -> bool:
    import torch
    try:
        torch.cuda.synchronize()
        torch.zeros(1, device="cuda").add_(1).item()
        return False
    except Exception:  # noqa: BLE001 (a sticky CUDA error surfaces as any exception type)
        return True


def worker(kernel: str, features: list[str]) -> int:
    import torch
    import flash3  # noqa: F401  (loads flash3._C)
    built = set(built_kernel_ids())
    torch.zeros(1, device="cuda")
    _emit({"ready": True, "flash3": os.path.dirname(flash3.__file__)})
    for f in features:
        _emit({"begin": f})
        t0 = time.monotonic()
        if kernel not in built:
            res = {"status": "error", "detail": "kernel not in this build"}
        else:
            try:
                bwd = family(kernel) == "bwd"
                if family(kernel) == "dec":
                    res = worst([check_dec(p, launch_dec(p)) for p in make_dec_case(f, kernel)])
                elif family(kernel) == "quant":
                    res = worst([smoke_quant.check(p, smoke_quant.launch(p))
                                 for p in smoke_quant.make_case(f, kernel)])
                else:
                    c = make_case(f, *parse_kernel(kernel), bwd=bwd)
                    res = check_bwd(c, *launch_bwd(c)) if bwd else check(c, *launch(c))
            except Exception as e:  # noqa: BLE001
                msg = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
                if _cuda_broken():  # sticky error: this process is done; the driver restarts one
                    try:
                        ctypes.CDLL(None).fflush(None)  # device printf sits in C's stdout buffer
                    except OSError:
                        pass
                    _emit({"kernel": kernel, "feature": f, "status": "crash", "detail": msg,
                           "seconds": round(time.monotonic() - t0, 2)})
                    return 3
                res = {"status": "error", "detail": msg}
        res.update(kernel=kernel, feature=f, seconds=round(time.monotonic() - t0, 2))
        _emit(res)
    return 0


def sim_worker(kernel: str, features: list[str], driver: str, seeds: list[int], seeds_all: bool,
               sms: int | None = None) -> int:
    """The worker of --backend sim: like worker(), each launch through smoke_sim.sim_launch
    (dec_launch, bwd_launch)."""
    import torch
    import smoke_sim
    _emit({"ready": True, "flash3": "hopper_sim:" + driver})
    first = features[0] if features else None  # its every-seed case when not seeds_all
    for token in features:
        f = feature_name(token)
        _emit({"begin": f})
        t0 = time.monotonic()
        runs = seeds[:1] if token.endswith(ONE_SEED) else seeds if (seeds_all or token == first) else seeds[:1]
        try:
            if family(kernel) == "dec":  # each part (launch) of the feature, each with every seed
                todo = [(p, lambda p, seed: smoke_sim.dec_launch(p, Path(driver), seed=seed, sms=sms), check_dec)
                        for p in make_dec_case(f, kernel, device="cpu")]
            elif family(kernel) == "quant":
                todo = [(p, lambda p, seed: smoke_quant.sim_launch(p, Path(driver), seed=seed, sms=sms),
                         smoke_quant.check) for p in smoke_quant.make_case(f, kernel, device="cpu")]
            elif family(kernel) == "bwd":  # each seed: the forward, then the backward
                c = make_case(f, *parse_kernel(kernel), device="cpu", bwd=True)

                def run_bwd(c, seed):
                    out, lse, grads, again = smoke_sim.bwd_launch(c, Path(driver), seed=seed, sms=sms)
                    return dict(out=out, lse=lse, again=again, **dict(zip(("dq", "dk", "dv", "dsinks"), grads)))
                todo = [(c, run_bwd, lambda c, r: check_bwd(c, r["out"], r["lse"],
                                                            [r[n] for n in ("dq", "dk", "dv", "dsinks") if n in r],
                                                            r["again"]))]
            else:
                c = make_case(f, *parse_kernel(kernel), device="cpu")
                todo = [(c, lambda c, seed: dict(zip(("out", "lse"), smoke_sim.sim_launch(c, Path(driver), seed=seed,
                                                                                          sms=sms))),
                         lambda c, r: check(c, r["out"], r["lse"]))]
            results = []
            for c, run, chk in todo:
                res, prev = None, None
                for seed in runs:
                    got = run(c, seed)
                    r = chk(c, got)
                    # Outside deterministic mode the backward adds dQ tiles in schedule order.
                    varies = {"dq"} if c.get("bwd") and not c["deterministic"] else set()
                    raw = {n: t.reshape(-1).view(torch.uint8) for n, t in got.items()
                           if torch.is_tensor(t) and n not in varies}
                    if prev is not None and not all(torch.equal(raw[n], prev[n]) for n in raw):
                        r.update(status="wrong" if r["status"] == "ok" else r["status"],
                                 detail=f"seed {seed}'s outputs differ bitwise from seed {runs[0]}'s"
                                 + (f"; {r['detail']}" if r.get("detail") else ""))
                    prev = raw
                    if res is None or res["status"] == "ok":
                        res = dict(r, seed=seed) if r["status"] != "ok" else r
                results.append(res)
            res = dict(worst(results), seeds=runs)
        except smoke_sim.SimFailure as e:
            res = {"status": e.status, "detail": e.detail, "seeds": runs}
        except Exception as e:  # noqa: BLE001
            res = {"status": "error", "detail": (str(e).strip().splitlines() or [type(e).__name__])[0][:300]}
        res.update(kernel=kernel, feature=f, seconds=round(time.monotonic() - t0, 2))
        _emit(res)
    return 0


# ---------------------------------------------------------------------------------------------
# Driver


def _exit_detail(rc: int, errf) -> str:
    try:
        what = f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exit {rc}"
    except ValueError:
        what = f"killed by signal {-rc}"
    try:
        errf.seek(0)
        last = [l.strip() for l in errf.read().splitlines() if l.strip()]
    except (OSError, ValueError):
        last = []
    return what + (f": {last[-1][:300]}" if last else "")


LIVE: set = set()  # running workers, killed if the driver itself is terminated


def _on_term(signum, frame):
    for p in list(LIVE):
        _kill(p)
    sys.exit(128 + signum)


def _kill(proc) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: the worker and what it started
        except (ProcessLookupError, PermissionError):
            pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def _pump(stream, q) -> None:
    for line in stream:
        q.put(line)
    q.put(None)


def run_worker(kernel, feats, cmd, record, case_timeout, start_timeout, deadline, env=None) -> list:
    """Runs one worker over feats, recording results; returns the features left for a new worker."""
    errf = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(cmd + ["--kernel", kernel, "--features", ",".join(feats)],
                            stdout=subprocess.PIPE, stderr=errf, text=True, errors="replace",
                            start_new_session=True, env=env)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
    LIVE.add(proc)
    left, extra, ready, where = list(feats), [], False, None
    last = time.monotonic()
    try:
        while left:
            limit = case_timeout if ready else start_timeout
            try:
                line = lines.get(timeout=max(0.0, min(last + limit, deadline) - time.monotonic()))
            except queue.Empty:
                _kill(proc)
                if time.monotonic() < last + limit:  # the budget ran out, not the case
                    return []
                what = f"silent for {limit:.0f} s" + ("" if ready else " (worker start-up)")
                record(kernel, feature_name(left[0]), "hang", what, extra)
                return left[1:]
            if line is None:  # the worker ended before finishing its features
                rc = proc.wait()
                detail = _exit_detail(rc, errf) if rc else "exited early (exit 0)"
                if not ready:  # it never got going: the same would happen again
                    for f in left:
                        record(kernel, feature_name(f), "crash", "worker failed to start: " + detail, extra)
                    return []
                record(kernel, feature_name(left[0]), "crash", detail, extra)
                return left[1:]
            try:
                msg = json.loads(line)
            except ValueError:
                msg = None
            if not isinstance(msg, dict):  # device printf (or other noise): kept with the case
                if len(extra) < 200:
                    extra.append(line.rstrip()[:300])
                continue
            last = time.monotonic()
            if msg.get("ready"):
                ready, where = True, msg.get("flash3")
            elif msg.get("feature") in (names := [feature_name(t) for t in left]):
                f = msg["feature"]
                del left[names.index(f)]  # its token (a feature, maybe with ONE_SEED)
                if msg.get("status") == "crash":  # it exits now; keep its last printf lines
                    end = time.monotonic() + 5
                    while (line := _get(lines, end - time.monotonic())) is not None:
                        if not line.lstrip().startswith("{") and len(extra) < 200:
                            extra.append(line.rstrip()[:300])
                    record(kernel, f, "crash", msg.get("detail", ""), extra, dict(msg, flash3=where))
                    return left
                record(kernel, f, msg.get("status", "error"), msg.get("detail", ""), extra,
                       dict(msg, flash3=where))
                extra = []
        return []
    finally:
        _kill(proc)
        LIVE.discard(proc)
        errf.close()


def _get(q, timeout):
    try:
        return q.get(timeout=max(0.0, timeout))
    except queue.Empty:
        return None


def run_matrix(jobs, worker_cmd, parallel=4, case_timeout=15.0, start_timeout=60.0, budget=150.0,
               env=None, log=None, on_record=None) -> dict:
    """jobs: [(kernel, [features])]. Returns {"cases": [...], "elapsed": s, ...}; every (kernel,
    feature) of jobs gets exactly one case record. on_record(cases so far) follows progress."""
    t0 = time.monotonic()
    deadline = t0 + budget
    todo = collections.deque((k, list(fs)) for k, fs in jobs if fs)
    results: dict = {}
    lock = threading.Condition()
    active = [0]

    def record(kernel, feature, status, detail, extra=(), msg=None):
        rec = dict(msg or {})
        rec.update(kernel=kernel, feature=feature, status=status)
        if detail:
            rec["detail"] = detail
        if extra:
            rec["device_lines"] = list(extra)
        with lock:
            results[(kernel, feature)] = rec
            if on_record:
                on_record(list(results.values()))
        if log:
            log(f"  {kernel_label(kernel):13s} {feature:8s} {status}" + (f": {detail}" if detail else ""))

    def slot():
        while True:
            with lock:
                while not todo and active[0] and time.monotonic() < deadline:
                    lock.wait(0.2)
                if not todo or time.monotonic() >= deadline:
                    return
                kernel, feats = todo.popleft()
                active[0] += 1
            rest = []
            try:
                rest = run_worker(kernel, feats, worker_cmd, record, case_timeout, start_timeout,
                                  deadline, env)
            finally:
                with lock:
                    active[0] -= 1
                    if rest:
                        todo.append((kernel, rest))  # retries after everyone else's first turn
                    lock.notify_all()

    threads = [threading.Thread(target=slot, daemon=True) for _ in range(max(1, parallel))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    cases = []
    for kernel, feats in jobs:
        for f in map(feature_name, feats):
            cases.append(results.get((kernel, f)) or
                         {"kernel": kernel, "feature": f, "status": "not run", "detail": "out of time"})
    return {"cases": cases, "elapsed": round(time.monotonic() - t0, 1), "budget": budget,
            "case_timeout": case_timeout, "parallel": parallel}


# ---------------------------------------------------------------------------------------------
# Rendering and planning

CELL = {"ok": "ok", "wrong": "WRONG", "nan": "NAN", "error": "ERROR", "crash": "CRASH",
        "hang": "HANG", "not run": "-"}
NA = "n/a"  # the cell of a feature that does not apply to the kernel (no case)


def counts(cases) -> dict:
    return dict(collections.Counter(c["status"] for c in cases))


def _groups(cases):
    """The cases' kernels split by feature set (family_features: forward/FP8/backward, decode,
    quantize): (kernels, features) per group, features in matrix order (the family's list, then any
    other)."""
    kernels = list(dict.fromkeys(c["kernel"] for c in cases))
    groups = []
    for order in (FEATURES, DEC_FEATURES, smoke_quant.QUANT_FEATURES):
        ks = [k for k in kernels if family_features(k) is order]
        if not ks:
            continue
        names = [c["feature"] for c in cases if c["kernel"] in ks]
        feats = [f for f in order if f in names] + [f for f in dict.fromkeys(names) if f not in order]
        groups.append((ks, feats))
    return groups


def render_matrix(cases, max_details=16) -> str:
    """The kernel x feature grid (one per feature set: forward kinds, then decode, then quantize),
    then one line per case that is not ok."""
    by = {(c["kernel"], c["feature"]): c for c in cases}
    lines = []
    for kernels, feats in _groups(cases):
        w = max([7] + [len(f) for f in feats])
        lw = max([13] + [len(kernel_label(k)) for k in kernels])
        lines.append("kernel".ljust(lw + 1) + " ".join(f.ljust(w) for f in feats))
        for k in kernels:
            cells = [CELL.get(by[(k, f)]["status"], "?") if (k, f) in by else "" if applies(k, f) else NA
                     for f in feats]
            lines.append(f"{kernel_label(k):{lw}s} " + " ".join(x.ljust(w) for x in cells).rstrip())
    n = counts(cases)
    lines.append(f"{len(cases)} cases: " + ", ".join(f"{n[s]} {s}" for s in CELL if s in n))
    bad = [c for c in cases if c["status"] in BAD]
    for c in bad[:max_details]:
        lines.append(f"  {kernel_label(c['kernel'])} {c['feature']}: {c['status']}"
                     + (f": {c['detail']}" if c.get("detail") else ""))
    if len(bad) > max_details:
        lines.append(f"  ... {len(bad) - max_details} more in smoke.json")
    return "\n".join(lines)


def render_times(cases) -> str:
    """The matrix's grids with each case's wall time in seconds (sim backend)."""
    by = {(c["kernel"], c["feature"]): c for c in cases}
    lines = []
    for kernels, feats in _groups(cases):
        w = max([7] + [len(f) for f in feats])
        lw = max([13] + [len(kernel_label(k)) for k in kernels])
        lines.append("seconds".ljust(lw + 1) + " ".join(f.ljust(w) for f in feats))
        for k in kernels:
            cells = []
            for f in feats:
                c = by.get((k, f))
                cells.append(NA if c is None and not applies(k, f) else "" if c is None or "seconds" not in c
                             else f"{c['seconds']:.1f}" + ("*" if len(c.get("seeds", [])) > 1 else ""))
            lines.append(f"{kernel_label(k):{lw}s} " + " ".join(x.ljust(w) for x in cells).rstrip())
    lines.append("(* = run once per schedule seed)")
    return "\n".join(lines)


def hang_lines(cases) -> list[str]:
    """The debug build's 'flash3 hang:' lines, grouped by warpgroup and barrier (block and thread
    dropped): 'warpgroup 1 waits on KFull phase 0 tile 3  x8 (2 blocks)'."""
    import re
    groups: dict = {}  # (case, what) -> [warps, blocks]
    for c in cases:
        for l in c.get("device_lines", []):
            m = re.search(r"flash3 hang: block (\d+) (warpgroup \d+) thread \d+ (waits on .*)", l)
            if m:
                g = groups.setdefault((f"{kernel_label(c['kernel'])} {c['feature']}",
                                       f"{m.group(2)} {m.group(3).strip()}"), [0, set()])
                g[0] += 1
                g[1].add(m.group(1))
    return [f"{case}: {what}  ({n} warps in {len(blocks)} blocks)"
            for (case, what), (n, blocks) in groups.items()]


def plan(cases) -> dict:
    """What tools/device_check.sh does next, from the smoke cases (FAIL_CASES go to
    tools/sanitize_small.py, which runs any of them)."""
    hangs = [c for c in cases if c["status"] == "hang"]
    fails = [c for c in cases if c["status"] in ("wrong", "nan", "crash")]
    case_id = lambda c: f"{c['kernel']}/{c['feature']}"  # noqa: E731
    # Rerun two hangs; two of different kernels say more than two of one.
    first_per_kernel = [case_id(c) for i, c in enumerate(hangs)
                        if all(h["kernel"] != c["kernel"] for h in hangs[:i])]
    hang_cases = list(dict.fromkeys(first_per_kernel + [case_id(c) for c in hangs]))[:2]
    by = {(c["kernel"], c["feature"]): c["status"] for c in cases}
    bench = [d for d in (64, 128, 256)
             if all(by.get((f"bf16:{d}:{d}", f)) == "ok" for f in ("full", "causal"))]
    hung = sorted({parse_kernel(c["kernel"]) for c in hangs if family(c["kernel"]) not in ("bwd", "quant")})
    deselect = [f"not ({dt} and d{d}_{dv})" for dt, d, dv in hung if dt != "e4m3"]
    # A hung backward: its head dim's tests in tests/test_bwd_gpu.py (a hung forward's go above).
    deselect += [f"not (test_bwd_gpu and {dt} and d{d}_{dv})" for dt, d, dv in
                 sorted({parse_kernel(c["kernel"]) for c in hangs if family(c["kernel"]) == "bwd"})
                 if (dt, d, dv) not in hung]
    fp8_ids = []  # tests/test_fp8_gpu.py's tests of each hung FP8 head dim (FP8_TEST_WITHOUT_D)
    for d in sorted({d for dt, d, _ in hung if dt == "e4m3"}):
        fp8_ids += [f"-{d}]", f"[{d}]"] + ([FP8_TEST_WITHOUT_D[d]] if d in FP8_TEST_WITHOUT_D else [])
    if fp8_ids:
        deselect.append(f"not (test_fp8_gpu and ({' or '.join(fp8_ids)}))")
    if any(family(c["kernel"]) == "quant" for c in hangs):  # the quantize kernel's own GPU tests
        deselect.append("not test_quantize_kernel")
    # Three small cases for the sanitizers when nothing failed: a forward, a backward and a decode
    # launch (tools/sanitize_small.py's names; its decode cases are its own), of those that passed.
    san = []
    for d in (128, 64):
        for kid, feat, name in ((f"bf16:{d}:{d}", "causal", f"bf16:{d}:{d}/causal"),
                                (f"bwd:bf16:{d}:{d}", "causal", f"bwd:bf16:{d}:{d}/causal"),
                                (f"dec:bf16:{d}:{d}", "page16", f"decode:bf16:{d}:{d}/page16")):
            if by.get((kid, feat)) == "ok" and not any(x.startswith(name.split(":")[0] + ":") for x in san):
                san.append(name)
    return {"HANG_CASES": " ".join(hang_cases),
            "FAIL_CASES": " ".join(case_id(c) for c in fails[:2]),
            "SAN_CASES": " ".join(san),
            "BENCH_HDIMS": ",".join(map(str, bench)), "PYTEST_K": " and ".join(deselect)}


# ---------------------------------------------------------------------------------------------


def ci_cases(kernels: list[str]) -> list[tuple[str, list[str]]]:
    """The CI subset of the matrix (`--ci`): every kernel at least once and every feature of each
    family at least once. Within a family (family(); FP8-cache decode kernels apart from 16-bit
    ones) the j-th case is (kernel j mod m, feature j mod n), j < max(m, n); where that kernel does
    not take that feature, the next kernel that does runs it and that kernel its next feature. A 16-bit forward
    kernel with a wide-tile variant also runs "full" and "causal": the wide tile serves calls
    without a causal/local mask, the plain one the rest (attn_logic.h fwd_has_wide_tile)."""
    groups: dict = collections.OrderedDict()
    for k in kernels:
        groups.setdefault((family(k), dec_fp8_cache(k)), []).append(k)
    jobs: dict = collections.OrderedDict((k, []) for k in kernels)
    once: set = set()  # (feature list, feature) of CI_ONCE features an earlier group runs
    for ks in groups.values():
        order = (family(ks[0]) == "bwd", id(family_features(ks[0])))  # the backward: its own group
        feats = [f for f in family_features(ks[0]) if any(applies(k, f) for k in ks) and (order, f) not in once]
        once |= {(order, f) for f in feats if f in CI_ONCE}
        m, n = len(ks), len(feats)
        for j in range(max(m, n)):
            k, f = ks[j % m], feats[j % n]
            if applies(k, f):
                jobs[k].append(f)
                continue
            # a feature only some of the group's kernels take (alibi stops at d 128): the next kernel
            # that takes it runs it, and this kernel the next feature it takes
            alt = next((x for x in ks[j % m:] + ks[:j % m] if applies(x, f)), None)
            if alt is not None:
                jobs[alt].append(f)
            g = next((x for x in feats[j % n:] + feats[:j % n] if applies(k, x)), None)
            if g is not None:
                jobs[k].append(g)
    import flash3_build  # tools/, beside this file
    wide = set(flash3_build.generate_kernels().WIDE_HEAD_DIMS)
    for k in kernels:
        if family(k) in ("bf16", "fp16") and parse_kernel(k)[1:] in wide:
            jobs[k] += ["full", "causal"]
    return [(k, [f for f in kernel_features(k) if f in fs]) for k, fs in jobs.items()]


# The CI subset's second part (--ci-extra, run with one seed after --ci's two): every kernel TU gets
# at least CI_MIN_FEATURES of the features that reach it, its family's riskiest (CI_RISKIEST) among
# them. A 16-bit kernel with a wide-tile variant is two TUs: the masked calls (MASKED_FEATURES) take
# the plain tile, the rest the wide one (attn_logic.h fwd_has_wide_tile).
CI_MIN_FEATURES = 3
CI_RISKIEST = {"bf16": "nantail", "fp16": "nantail", "e4m3": "nantail", "bwd": "nantail", "dec": "vpaged",
               "masked": "window"}  # nantail: packed tails with NaN; vpaged: the decode paths at once
MASKED_FEATURES = {"causal", "window", "sq_gt_sk", "sinks", "dlse"}


def ci_extra_cases(kernels: list[str]) -> list[tuple[str, list[str]]]:
    """The features --ci-extra adds to ci_cases(kernels), per kernel: for each of its TUs the
    riskiest feature, then the features its family group has run least, up to CI_MIN_FEATURES."""
    import flash3_build  # tools/, beside this file
    wide = set(flash3_build.generate_kernels().WIDE_HEAD_DIMS)
    base = dict(ci_cases(kernels))
    group = lambda k: (family(k), dec_fp8_cache(k))  # noqa: E731
    runs = collections.Counter((group(k), f) for k, fs in base.items() for f in fs)
    jobs = []
    for k in kernels:
        feats = [f for f in kernel_features(k) if f not in CI_ONCE]
        fam = family(k)
        if fam in ("bf16", "fp16") and parse_kernel(k)[1:] in wide:
            tus = [([f for f in feats if f in MASKED_FEATURES], CI_RISKIEST["masked"]),
                   ([f for f in feats if f not in MASKED_FEATURES], CI_RISKIEST[fam])]
        else:
            tus = [(feats, CI_RISKIEST.get(fam))]
        add: list = []
        for tu_feats, risky in tus:
            got = [f for f in tu_feats if f in base[k] or f in add]
            order = ([risky] if risky in tu_feats else []) + sorted(
                tu_feats, key=lambda f: (runs[(group(k), f)], tu_feats.index(f)))
            for f in order:
                if f not in got and (len(got) < CI_MIN_FEATURES or f == risky):
                    add.append(f)
                    got.append(f)
                    runs[(group(k), f)] += 1
        jobs.append((k, [f for f in kernel_features(k) if f in add]))
    return jobs


ONE_SEED = "@1"  # a feature token's suffix: run it with the first of --seeds only


def feature_name(token: str) -> str:
    """The feature of a worker's feature token ("window" or "window@1")."""
    return token.removesuffix(ONE_SEED)


def ci_all_cases(kernels: list[str]) -> list[tuple[str, list[str]]]:
    """--ci --ci-extra in one run: ci_cases with every seed, ci_extra_cases' additions with the
    first seed only (token suffix ONE_SEED), one worker per kernel for both (a worker's start-up,
    torch's import, costs ~3.5 s of CPU); backward kernels first, the longest cases, so that the
    run does not end on one of them."""
    extra = dict(ci_extra_cases(kernels))
    jobs = [(k, fs + [f + ONE_SEED for f in extra.get(k, []) if f not in fs]) for k, fs in ci_cases(kernels)]
    return sorted(jobs, key=lambda j: family(j[0]) != "bwd")


def built_kernel_ids() -> list[str]:
    """kernel_ids of kernel_info() plus the quantize op's entry (smoke_quant.gpu_info), which
    binding.cpp's kernel_info() does not list."""
    import torch
    import flash3  # noqa: F401
    return kernel_ids(dict(json.loads(torch.ops.flash3.kernel_info()), **smoke_quant.gpu_info()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", action="store_true", help="run cases in this process (internal)")
    ap.add_argument("--kernel", help="worker: the kernel, e.g. bf16:128:128")
    ap.add_argument("--kernels", help="driver: comma-separated kernels (default: every built one)")
    ap.add_argument("--features", help="comma-separated (default: every feature of each kernel's family)")
    ap.add_argument("--cases", help="driver: explicit kernel/feature list, e.g. bf16:128:128/causal")
    ap.add_argument("--ci", action="store_true", help="driver: the CI subset (ci_cases) of the kernels' cases")
    ap.add_argument("--ci-extra", action="store_true",
                    help="driver: the CI subset's second part (ci_extra_cases: three features per TU); "
                         "with --ci, both in one run (ci_all_cases: the second part's cases with the first seed only)")
    ap.add_argument("--parallel", type=int, help="workers at once (4; sim: 2)")
    ap.add_argument("--case-timeout", type=float, help="seconds (15; sim: 1800)")
    ap.add_argument("--start-timeout", type=float, help="seconds (60; sim: 120)")
    ap.add_argument("--budget", type=float, help="seconds; no work starts after it (150; sim: 14400)")
    ap.add_argument("--json", help="write the cases here")
    ap.add_argument("--worker-cmd", help="driver: the worker command (tests use a fake one)")
    ap.add_argument("--plan", metavar="SMOKE_JSON", help="print shell assignments for device_check.sh")
    ap.add_argument("--backend", choices=("gpu", "sim"), default="gpu",
                    help="gpu (torch.ops.flash3) or sim (the Hopper simulator, no GPU)")
    ap.add_argument("--seeds", default="1,2", help="sim: schedule seeds of every case")
    ap.add_argument("--first-seed-only", action="store_true",
                    help="sim: every seed only on each kernel's first case, the first seed elsewhere (quicker)")
    ap.add_argument("--seeds-all", action="store_true", help=argparse.SUPPRESS)  # worker: every case, every seed
    ap.add_argument("--sms", type=int, help="sim: simulated SM count (simrun's default otherwise)")
    ap.add_argument("--sim-driver", help="sim worker: the driver binary (internal)")
    args = ap.parse_args(argv)
    features = [f for f in (args.features or "").split(",") if f]
    sim = args.backend == "sim"
    for name, gpu_default, sim_default in (("parallel", 4, 2), ("case_timeout", 15.0, 1800.0),
                                           ("start_timeout", 60.0, 120.0), ("budget", 150.0, 14400.0)):
        if getattr(args, name) is None:
            setattr(args, name, sim_default if sim else gpu_default)
    seeds = [int(x) for x in args.seeds.split(",") if x]
    if sim and args.parallel > 1:
        # --parallel workers share the cores with their simulator runs: torch's OpenMP pool in each
        # worker only spins between the reference's small ops (~15% of a sim smoke run's CPU).
        os.environ.setdefault("OMP_NUM_THREADS", "1")

    if args.worker:
        features = features or kernel_features(args.kernel)
        if sim:
            return sim_worker(args.kernel, features, args.sim_driver, seeds, args.seeds_all, args.sms)
        return worker(args.kernel, [feature_name(f) for f in features])
    if args.plan:
        with open(args.plan) as f:
            p = plan(json.load(f)["cases"])
        print("\n".join(f"{k}={shlex.quote(v)}" for k, v in p.items()))
        return 0

    if args.cases:
        jobs = collections.OrderedDict()
        for item in args.cases.replace(",", " ").split():
            k, f = item.split("/")
            jobs.setdefault(k, []).append(f)
        jobs = list(jobs.items())
    driver = None
    if sim and not args.worker_cmd:
        import smoke_sim
        wanted = [k for k, _ in jobs] if args.cases else args.kernels.split(",") if args.kernels else None
        driver = smoke_sim.build_driver(kinds=smoke_sim.kinds_for(wanted) if wanted else smoke_sim.ALL_KINDS)
        print(f"smoke: sim backend, driver {driver}", flush=True)
    if not args.cases:
        kernels = (args.kernels.split(",") if args.kernels
                   else kernel_ids(smoke_sim.driver_info(driver)) if driver else built_kernel_ids())
        jobs = (ci_all_cases(kernels) if args.ci and args.ci_extra else ci_cases(kernels) if args.ci
                else ci_extra_cases(kernels) if args.ci_extra
                else [(k, features or kernel_features(k)) for k in kernels])
    jobs = [(k, [f for f in fs if applies(k, feature_name(f))]) for k, fs in jobs]
    cmd = (shlex.split(args.worker_cmd) if args.worker_cmd
           else [sys.executable, os.path.abspath(__file__), "--worker"])
    if sim:
        cmd += ["--backend", "sim", "--seeds", args.seeds] + ([] if args.first_seed_only else ["--seeds-all"])
        cmd += (["--sms", str(args.sms)] if args.sms else []) + (["--sim-driver", str(driver)] if driver else [])
    n = sum(len(fs) for _, fs in jobs)
    signal.signal(signal.SIGTERM, _on_term)  # timeout(1) must not leave hung GPU workers behind
    print(f"smoke: {n} cases over {len(jobs)} kernels, {args.parallel} workers, "
          f"{args.case_timeout:.0f} s per case, {args.budget:.0f} s budget", flush=True)
    # Without --json the sim backend keeps its last run (tools/sim_report.py makes README's table of it).
    json_paths = ([args.json] if args.json else
                  [str(ROOT / "tools/hopper_sim/build/smoke-sim-last.json")] if sim and not args.worker_cmd else [])
    knobs = [f"{k}={os.environ[k]}" for k in ("FLASH3_HDIMS", "FLASH3_DTYPES") if os.environ.get(k)]
    meta = {"command": " ".join(knobs + ["tools/smoke.py"] + list(sys.argv[1:] if argv is None else argv)),
            "date": time.strftime("%Y-%m-%d"), "backend": args.backend}
    if sim:
        meta["seeds"] = args.seeds

    def save(res):  # after every case too, so that a killed driver leaves what it learned
        for path in json_paths:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            with open(path + ".tmp", "w") as f:
                json.dump(dict(res, meta=meta), f, indent=1)
            os.replace(path + ".tmp", path)

    res = run_matrix(jobs, cmd, args.parallel, args.case_timeout, args.start_timeout, args.budget,
                     log=lambda s: print(s, flush=True),
                     on_record=lambda cases: save({"cases": cases, "partial": True}))
    save(res)
    print(f"\nsmoke matrix ({res['elapsed']:.0f} s):\n" + render_matrix(res["cases"]))
    for l in hang_lines(res["cases"]):
        print("  hang: " + l)
    if sim:
        print("\n" + render_times(res["cases"]))
        return 0 if all(c["status"] == "ok" for c in res["cases"]) else 1
    return 0  # the matrix ran; its verdict is in the cases


if __name__ == "__main__":
    sys.exit(main())
