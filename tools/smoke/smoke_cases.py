"""The smoke matrix's cases (tools/smoke/smoke.py runs them): per kernel id and feature, the
inputs (make_case, make_dec_case; the quantize kernel's in smoke_quant.py), the launch on a GPU
(launch, launch_bwd, launch_dec) and the checks against the fp64 oracle (smoke_checks.py) or
flash3's references (check, check_bwd, check_dec). smoke_sim.py launches the same cases in the
simulator. smoke.py's docstring describes every family and feature.
"""
from __future__ import annotations

import math
from pathlib import Path

import smoke_quant  # beside this file: the quantize kernel's family

ROOT = Path(__file__).resolve().parents[2]
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
# and 0, unmasked and masked blocks), per-sequence slopes; forward and backward (the oracle's bias;
# the backward's forward out/lse above ALIBI_MAX_HEAD_DIM from flash3.reference, as the API's).
# "sequsedq": FA3's seqused_q on a causal varlen batch (SEQUSEDQ_LENS, SEQUSEDQ_USED): a sequence cut
# mid-tile whose second tile lies wholly past its used queries, one cut to 0 queries, one not cut
# (a value past its length: clamped), one cut mid-tile with a second tile of 2 rows past it; the
# packed rows past seqused_q hold NaN/+-Inf in q (and dout), and must come out as out 0, lse -inf
# (the NaN poison overwritten), dq 0, nothing in dk/dv; masks align on the used count. The forward
# case takes FA3's seqused_k too (SEQUSEDQ_USED_K, the backward kernel has none): keys cut mid-block,
# past the length (clamped), to 0 (a sequence whose queries see nothing), and cut below the used
# queries (causal: its first rows see no key); the packed keys past seqused_k hold NaN/+-Inf in k
# and v, and masks align on both used counts.
# "chunk": FA3's attention_chunk (Llama 4's chunked local attention), two launches (CHUNK_PARTS) of
# GQA varlen batches with s_k - s_q of both signs, a sequence of 0 queries and one of 0 keys: chunk
# 48 (no block's multiple: chunk starts inside tiles) with causal, and chunk 160 (wider than a
# block) with a window (200, 150) wide enough to leave a tile within one chunk unmasked blocks.
# "fastacc" (FP8 only): the FP8 kernel's fast accumulation (fast_accum: P.V accumulated over every
# key block in the WGMMA accumulator) on a causal GQA batch, k descales per block and one random v
# descale per (batch, kv head), against the emulation's fast_accum.
FEATURES = ["full", "causal", "window", "softcap", "gqa", "varlen", "kvcache", "determ", "dlse", "sq_gt_sk",
            "perhead", "nextdim", "onekey", "nantail", "sinks", "alibi", "sequsedq", "chunk", "fastacc"]
ONEKEY_LENS = ([70, 2, 1, 5], [1, 1, 3, 1])
# The decode (KV-cache) kernels' own features (family "dec": ids dec:bf16:128:128 for a cache of
# q's dtype, dec:kve4m3:bf16:128:128 for an FP8 cache), make_dec_case: a contiguous cache; paged
# caches of 1, 16, 64, 256 keys per page and 48 (divides no key block; 16-bit caches: pages of a
# multiple of 16 keys by TMA pieces, of 1 gathered, of 256 a TMA box per block); forced split-KV (the
# combine); packed GQA (s_q 5, 1 and 4 splits); causal / window / softcap each at s_q 1 and 70;
# bad page ids and seqused past the capacity (pages of 16 and of 8: pieces and gathered); the
# fused append (FP8: quantizing, with descales) without and with rotary; attention sinks on packed
# GQA with a row of 0 keys, without splits (the kernel's epilogue) and with 3 (the combine); packed
# (varlen) queries on a paged cache (vpaged: VPAGED_LENS, causal, GQA g = 4, pages of 256 keys (TMA
# per block), 16 keys with 3 splits (16-bit caches: TMA pieces) and 1 key (gathered), the last two
# with sinks, 3 packed rows of no sequence at the end: out 0, lse -inf);
# ALiBi (alibi: per-row slopes (b, h) on packed GQA, s_q 5, a row of 0 keys, no split and 3);
# FA3's cache_leftpad (leftpad, LEFTPAD_PARTS: keys from an unaligned position, 0, and a row all
# padding (out 0, lse -inf): with the fused append and rotary, causal at s_q 70, 3 splits, and a
# paged cache, which left padding makes the gathered path, with leftpads outside the row);
# FA3's FP8 decode (fa3desc, FP8-cache kernels only): e4m3 q/k/v with FA3's per-(batch, kv head)
# descales on paged caches (the descales of the batch entry, not of the page: descale_per_batch),
# q taken exactly as bf16 and its descale folded into K's as flash_attn_interface does; pages of 16
# causal and of 256 with 3 splits, checked against the fp64 oracle of FA3's unfolded spec.
# FA3's packed appends (vappend, 16-bit caches only: VAPPEND_PARTS): new keys packed by
# cu_seqlens_k_new and/or queries packed by cu_seqlens_q (entries of 0 queries, of 0 new keys, one
# of 70 of both, packed tails of no entry: k/v rows never appended, q rows copied to q_out as they
# are), rotated with q (per token when causal, else at the entry's position, rotary_seqlens),
# causal bottom-right on the appended keys, leftpad, paged and contiguous caches, splits; the
# append checked bit for bit against flash3.reference.kvcache_append_packed.
# "mla" (the MLA decode kernel only, d_v > 256: dec:bf16:64:512): DeepSeek's decode as FA3 serves
# it, one kv head, scale 1/sqrt(d + d_v), MLA_PARTS: without qv on a contiguous cache, the rows'
# maxes jumping at the last block visited (_grow_max_late: O's factors, which the second consumer
# takes from the first, run); with qv on pages of 64 (TMA per block, FA3's page size), 40 heads at
# s_q 2 (80 packed rows: a second tile that starts mid-token), a row of 0 keys and one ending
# mid-block, 8 tiles (on simrun's 4 SMs some CTAs run two tiles with keys: the consumers' staging
# hand-off carries across tiles); with qv on pages of 16 (gathered) and 3 splits (the combine at
# d_v 512), s_q 1, 16 heads; with qv, softcap, a window and FA3's cache_leftpad (37: a TMA box
# mid-block) on a contiguous cache. The oracle takes qv as q's extra columns against v's:
# q.k + qv.v = [q, qv].[k, v].
# "mlaapp" (the MLA decode kernel only): DeepSeek's decode step with its new keys, as FA3 takes them
# (k (b, s_new, 1, 64) rope, v (b, s_new, 1, 512) latent): the fused append (d_v 512) writes them,
# rotated with q (qv never), then the MLA kernel runs over cache_seqlens + s_new (MLAAPP_PARTS): on TMA
# pages of 64, causal, s_q = s_new 2, GPT-NeoX rotary over all 64 channels, a row of no cached keys
# and one filled to the capacity; on a contiguous cache, without causal (every query at its entry's
# position), GPT-J pairs over 32 of the 64 channels (the rest copied) at FA3's rotary_seqlens, 3 new
# keys for 1 query, cache_leftpad 37 and 3 splits; packed queries and packed new keys (cu_seqlens_q,
# cu_seqlens_k_new: entries of 0 queries and of 0 new keys, packed tails of no entry) on gathered
# pages of 16 with 2 splits. The append is checked bit for bit as "append"/"vappend"'s, out/lse
# against the oracle on the caches after it, as "mla"'s.
# "mlachunk" (the MLA decode kernel only): FA3's attention_chunk and cache_leftpad with packed
# queries (cu_seqlens_q) on the MLA kernel (MLACHUNK_PARTS, qv, one kv head, 16 heads: a token's
# rows are 16 of a tile's 64, so chunk starts fall inside tiles): chunk 48 (divides no block of
# 64) causal on TMA pages of 64, s_q 5 (80 packed rows: two tiles), a row whose tokens straddle a
# chunk start (141..145 around 144) and one whose first tokens see one key; chunk 192 without other
# masks (unmasked blocks) with cache_leftpad (37: off the block grid; a row of one key for 2
# queries: the first sees none, its chunk ends at key 0) and 2 splits on a contiguous cache; packed
# queries with cache_leftpad and chunk 64 (the leftpad moves its starts off the grid), causal, on
# gathered pages of 16 with 3 splits (an entry of 0 queries, one whose leftpad leaves no key: out 0,
# lse -inf; packed tail rows of no entry); packed queries with cache_leftpad (63: mid-block) and a
# window, no chunk, on TMA pages of 64.
# FA3's FP8 cache with new keys (fa3app, FP8-cache kernels only): fa3desc's launch after the fused
# append of e4m3 new k/v (FA3APP_PARTS: s_new 2, a row of no cached keys, one filled to the
# capacity; paged, and contiguous with 3 splits), copied bit for bit (they share the entry's
# descales: descale_per_batch), then attended; the caches checked byte for byte.
# FA3's FP8 cache in FA3's packed layouts (fa3pk, FP8-cache kernels only: FA3PK_PARTS): fa3app's
# e4m3 q/k/v under descales per batch entry with queries packed by cu_seqlens_q and/or e4m3 new keys
# packed by cu_seqlens_k_new (entries of 0 queries, of 0 new keys, packed tails of no entry: k/v
# rows never appended, q rows out 0 / lse -inf), cache_leftpad (mid-block, and a row of one key),
# a row filled to its capacity, paged (gathered) and contiguous caches, splits; the append checked
# byte for byte against flash3.reference.kvcache_append_packed, out against FA3's unfolded spec.
# FA3's FP8 cache with rotary new keys (fa3rot, FP8-cache kernels only: FA3ROT_PARTS): fa3pk's layouts
# with rotary tables as FA3's tests make them (angles uniform in [0, 2 pi)): the fused append takes e4m3
# q8 and new keys, rotates both in fp32 and rounds them once to e4m3 (saturating: pairs of 448 bytes
# in the new keys rotate past 448, to +-448, never NaN; flash3.rotary.apply_rotary's rule), then the
# decode kernel reads the rotated q8 as bf16 (the driver's q_out.to(bf16), flash_attn_interface's);
# batched q and keys on a contiguous cache (NeoX over min(128, d) channels: all of them up to d 128,
# causal, 3 splits), packed q and keys on gathered pages of 16 (GPT-J over 64, rotary_seqlens,
# queries at their entry's position, leftpad), batched q with packed keys on TMA pages of 64 (NeoX
# over 32, causal, 2 splits). The append (caches and the rotated q8) checked byte for byte against
# flash3.reference.kvcache_append_packed, out against FA3's unfolded spec on the rotated q8.
# FA3's attention_chunk on the decode kernels (dchunk, DCHUNK_PARTS, packed GQA g = 4 in every part:
# the rows of a tile are tokens at different positions, so chunk starts fall inside tiles and
# blocks): causal with more packed rows than a tile and rows that see no key; a window with 3 splits
# on a paged cache; a chunk without other masks wide enough for unmasked blocks, with cache_leftpad
# (positions count from it) and 2 splits; packed (varlen) queries, causal, with vpaged's packed rows
# of no sequence at the end (out 0, lse -inf).
DEC_FEATURES = ["contig", "page1", "page16", "page64", "page256", "page48", "split", "gqa",
                "causal", "window", "softcap", "badidx", "append", "rotary", "sinks", "vpaged", "alibi",
                "leftpad", "fa3desc", "fa3app", "vappend", "dchunk", "mla", "mlaapp", "fa3pk", "fa3rot",
                "mlachunk"]
MLA_FEATURES = ("mla", "mlaapp", "mlachunk")  # the MLA kernel's own features (its case shapes), and only its
FA3APP_PARTS = [(16, 1, True), (None, 3, False)]  # (page size or contiguous, num_splits, causal)
# "fa3pk"'s launches (as VAPPEND_PARTS, 256 keys a row, GQA g = 2): queries per entry (a list:
# packed, an int: batched), new keys per entry (a list: packed, an int: batched, None: none),
# cache_seqlens, leftpads, page size (None: contiguous), splits, causal, tail rows of no entry (q, k).
FA3PK_PARTS = [([3, 0, 5, 1, 40], [2, 3, 0, 1, 40], [40, 0, 77, 255, 100], [0, 0, 37, 2, 5], 16, 1, True,
                (3, 2)),
               ([1, 4, 0, 7], None, [10, 256, 5, 130], [3, 0, 0, 129], None, 3, False, (2, 0)),
               (2, [0, 5, 1], [50, 120, 0], [49, 0, 0], 64, 2, True, (0, 3))]
# "fa3rot"'s launches: FA3PK_PARTS' fields, then rotary (rotary_dim, interleaved, rotary_seqlens or None);
# rotary_dim is capped at the case's head dim d (append_kv_sm90 takes rotary_dim <= d): part 0's 128
# is all of d 64's and d 96's channels.
FA3ROT_PARTS = [(2, 2, [0, 77, 254, 130], [0, 5, 0, 64], None, 3, True, (0, 0), (128, False, None)),
                ([3, 0, 5, 1], [2, 3, 0, 4], [40, 0, 77, 250], [0, 0, 37, 2], 16, 1, False, (3, 2),
                 (64, True, [7, 300, 0, 250])),
                (1, [0, 5, 1], [50, 120, 255], [49, 0, 0], 64, 2, True, (0, 3), (32, False, None))]
# "mla"'s launches: (qv, page size, heads, s_q, capacity, seqused, num_splits, causal, extras).
MLA_PARTS = [(False, None, 16, 1, 130, [1, 130], 1, True, {}),
             (True, 64, 40, 2, 200, [0, 70, 200, 130], 1, True, {}),
             (True, 16, 16, 1, 160, [160, 33], 3, False, {}),
             (True, None, 16, 2, 200, [200, 90], 1, False, dict(softcap=20.0, window=(100, 0), leftpad=[37, 0]))]
# "mlaapp"'s launches: (queries, new keys) per entry (an int: batched, that many per entry; a list:
# packed, with MLAAPP_TAIL rows of no entry after), cache_seqlens, capacity, page size (None:
# contiguous), heads, causal, rotary (rotary_dim, interleaved, rotary_seqlens) or None, leftpad, splits.
MLAAPP_PARTS = [(2, 2, [0, 62, 254], 256, 64, 16, True, (64, False, None), None, 1),
                (1, 3, [100, 157], 160, None, 16, False, (32, True, [7, 150]), [37, 0], 3),
                ([1, 0, 2], [2, 3, 0], [33, 0, 120], 128, 16, 8, True, (64, False, None), None, 2)]
MLAAPP_TAIL = 2
# "mlachunk"'s launches: (page size (None: contiguous), s_q (an int: batched; a list: packed, with
# MLAAPP_TAIL rows of no entry after), capacity, seqused, leftpads, attention_chunk, causal, window,
# num_splits); 16 heads, qv.
MLACHUNK_PARTS = [(64, 5, 256, [20, 146, 256], None, 48, True, (-1, -1), 1),
                  (None, 2, 700, [700, 600, 6], [37, 0, 5], 192, False, (-1, -1), 2),
                  (16, [3, 0, 4, 1], 300, [100, 50, 300, 40], [37, 10, 0, 40], 64, True, (-1, -1), 3),
                  (64, [2, 5, 1], 200, [200, 77, 130], [63, 1, 0], 0, False, (100, 3), 1)]
# "dchunk" parts: (attention_chunk, causal, window, page size, s_q (packed: per-sequence query
# counts), seqused, leftpads, num_splits). Chunk 48 divides no block (128, FP8 cache 112); s_q 37
# packs 148 rows (two tiles, the second of 20 rows); seqused 20 < s_q leaves the first 17 tokens of
# that row without keys (causal). 256 holds a whole block of either size, so its tiles have
# unmasked blocks; leftpad 37 moves the chunk starts off the cache's block grid; its last row has
# one key (6 - leftpad 5) for 3 queries: without causal, the two before it see none (their chunk
# ends at key 0).
DCHUNK_PARTS = [(48, True, (-1, -1), None, 37, [20, 100, 333], None, 1),
                (160, False, (100, 7), 16, 5, [150, 333, 400], None, 3),
                (256, False, (-1, -1), None, 3, [700, 600, 6], [37, 0, 5], 2),
                (64, True, (-1, -1), 16, [5, 0, 40], [30, 77, 200], None, 2)]
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
SEQUSEDQ_LENS = ([SQ, 40, 77, 130], [SK, 50, 64, 100])  # "sequsedq": packed (q, k) lengths
SEQUSEDQ_USED = [100, 0, 1000, 70]  # its seqused_q: used queries 100, 0, 77 (clamped), 70
SEQUSEDQ_USED_K = [200, 1000, 0, 37]  # its forward's seqused_k: used keys 200, 50 (clamped), 0, 37
# "window"'s launches: (left, right). A window both sides, narrower than any tile (every block
# masked); and a left bound alone, wide enough that a tile has unmasked blocks between its right
# (seqlen_k tail) and left masked blocks (fwd/mainloop.cuh carries the d 96 tiles' row runs across
# them: at 192 x 96 tiles block 3 masked, 2 unmasked, 1 and 0 masked).
WINDOW_PARTS = [(97, 13), (200, -1)]
# "chunk"'s launches: (attention_chunk, causal, window, (q lengths, k lengths)).
CHUNK_PARTS = [(48, True, (-1, -1), ([SQ, 77, 150, 1, 5], [SK, 40, 97, 64, 0])),
               (160, False, (200, 150), ([SQ, 150, 97, 0], [SK, 170, 40, 20]))]
# Features a kernel family has no path for: never run, "n/a" in the matrix (the FP8 op takes
# seqused_k over packed keys only, so no kv cache; nor bwd_sm90; "determ" is the backward's
# deterministic mode, "dlse" its gradient flowing into lse; the FP8 op takes no sinks). Keyed by
# family(): the dtype, or "bwd".
NOT_APPLICABLE = {"e4m3": {"kvcache", "determ", "dlse", "nextdim", "onekey", "sinks", "alibi"},
                  "bf16": {"determ", "dlse", "perhead", "onekey", "fastacc"},
                  "fp16": {"determ", "dlse", "perhead", "onekey", "fastacc"},
                  "bwd": {"kvcache", "perhead", "fastacc"}}
# Features the CI subset (ci_cases) runs in the first group of their feature list only (bf16 before
# fp16; 16-bit decode before FP8-cache decode; the backward is its own group): "sinks" is fp32
# epilogue/combine code that neither q's dtype nor the cache's changes; "alibi" is fp32 score-mod
# code on the accumulator (common/score_mod.h), the same for every dtype; "sequsedq" is integer
# sequence bookkeeping (scheduler.cuh seq_info, bwd_seq) and the fp32 epilogue's row clearing.
CI_ONCE = {"sinks", "alibi", "sequsedq"}
FP8_BLOCK = (64, 128)  # rows per q descale, keys per k/v descale (the FP8 kernel's granularity)
# tests/test_fp8_gpu.py: parametrized tests end their ids in the head dim ("[...-128]", "[128]");
# this one runs d=128 without it.
FP8_TEST_WITHOUT_D = {128: "no_host_sync_graph"}


# ---------------------------------------------------------------------------------------------
# Cases (worker side; also used by tools/device/sanitize_small.py)


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
# backward at every head dim. So the backward "alibi" case above it takes its out/lse from the
# reference's forward, as flash3's API does (fwd_by_reference): fwd_sm90 refuses the slopes there.
ALIBI_MAX_HEAD_DIM = 128


def fwd_by_reference(c: dict) -> bool:
    """A backward case whose forward no forward kernel runs: ALiBi at head dims above
    ALIBI_MAX_HEAD_DIM (flash3.attention runs flash3.reference's forward there, then the backward
    kernel). launch_bwd (smoke_sim.bwd_launch) takes its out/lse from reference_fwd."""
    return c.get("alibi") is not None and max(c["q"].shape[-1], c["v"].shape[-1]) > ALIBI_MAX_HEAD_DIM


def reference_fwd(c: dict):
    """(out, lse) of a 16-bit case by flash3.reference's forward (varlen_forward when packed), as
    flash3's ops run it when no kernel takes the call: out in q's dtype, lse fp32, shaped as the
    kernel's (packed rows of no sequence: out 0, lse -inf)."""
    from flash3 import reference
    args = (c["q"].shape[-1] ** -0.5, *op_window(c), c["softcap"])
    kw = dict(sinks=c.get("sinks"), alibi_slopes=c.get("alibi"), chunk=int(c.get("chunk") or 0))
    if c["cu_q"] is not None:
        return reference.varlen_forward(c["q"], c["k"], c["v"], c["cu_q"], c["cu_k"], *args,
                                        seqused_q=c.get("seqused_q"), seqused_k=c.get("seqused_k"), **kw)
    if c.get("seqused_k") is not None:
        raise ValueError("reference_fwd: a batched case with seqused_k")  # no case has one with ALiBi
    return reference.forward(c["q"], c["k"], c["v"], *args, **kw)
# attention_chunk: the 16-bit forward and backward kernels take it at every head dim (the forward's
# d 256 on its chunk tile, csrc/flash3/common/attn_logic.h fwd_chunk_tile_shape).
# So do the decode kernels (16-bit and FP8 caches; d 256 on its chunk tile, decode_chunk_tile_shape).


def is_mla(kid: str) -> bool:
    """The MLA decode kernel (d_v > 256; csrc/flash3/decode/mla_*.cuh)."""
    return family(kid) == "dec" and parse_kernel(kid)[2] > 256


def applies(kid: str, feature: str) -> bool:
    if feature not in family_features(kid) or feature in NOT_APPLICABLE.get(family(kid), ()):
        return False
    if feature in MLA_FEATURES or is_mla(kid):  # the MLA kernel has its own features (its case shapes)
        return feature in MLA_FEATURES and is_mla(kid)
    if feature in ("fa3desc", "fa3app", "fa3pk", "fa3rot"):  # FA3's FP8 descales: the FP8-cache decode kernels only
        return dec_fp8_cache(kid)
    if feature == "vappend":  # packed appends: 16-bit caches (an FP8 cache refuses them)
        return not dec_fp8_cache(kid)
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


def case_parts(feature: str) -> int:
    """How many launches (make_case parts) a forward/backward feature has."""
    return len(CHUNK_PARTS) if feature == "chunk" else len(WINDOW_PARTS) if feature == "window" else 1


def make_cases(feature: str, dtype_name: str, d: int, dv: int, device="cuda", seed=0, bwd=False) -> list:
    """Every part (launch) of a forward/backward feature: make_case per part."""
    return [make_case(feature, dtype_name, d, dv, device, seed, bwd, part) for part in range(case_parts(feature))]


def make_case(feature: str, dtype_name: str, d: int, dv: int, device="cuda", seed=0,
              bwd=False, part=0) -> dict:
    """Inputs and options of one smoke case (the op's arguments but out/lse). e4m3: the bf16
    case's shapes and values, quantized (_quantize_case). bwd: the forward case plus dout,
    deterministic (True for "determ": the gqa case's shapes, causal) and dlse (the gradient flowing
    into lse, shaped as lse; "dlse" only: the causal case's shapes, random N(0, 1), None otherwise).
    part: which launch of a feature with several (case_parts; "chunk": CHUNK_PARTS)."""
    import torch
    fam = "bwd" if bwd else dtype_name
    if feature in NOT_APPLICABLE.get(fam, ()):
        raise ValueError(f"{feature} does not apply to {fam} kernels")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "e4m3": torch.bfloat16}[dtype_name]
    g = torch.Generator(device="cpu").manual_seed(seed + d + 7 * dv + FEATURES.index(feature) + 1000 * part)
    rnd = lambda *shape: torch.randn(*shape, generator=g).to(device=device, dtype=dtype)  # noqa: E731
    c = dict(dtype=dtype_name, feature=feature, causal=False, window=(-1, -1), softcap=0.0,
             cu_q=None, cu_k=None, seqused_k=None, lens_q=None, lens_k=None, sinks=None, alibi=None,
             seqused_q=None, chunk=0, part=part)
    b, h, hk, sq, sk = 2, 2, 2, SQ, SK
    if feature == "nextdim":
        d, dv = next_dims(d, dv)
    if feature in ("causal", "dlse", "sq_gt_sk", "sequsedq") or (feature == "sinks" and not bwd):
        c["causal"] = True
        if feature == "sq_gt_sk":
            sq, sk = SK, SQ
        elif feature == "sinks":
            sq, sk, h, hk = SK, SINKS_SK, 6, 2
    elif feature == "window":
        c["window"] = WINDOW_PARTS[part]
    elif feature == "softcap":
        c["softcap"] = 5.0  # small enough that the tanh visibly changes scores of ~3
    elif feature in ("gqa", "determ"):
        h, hk = 6, 2
        # determ: causal, so the key blocks adding into a query block differ from block to block
        # (their order is each one's rank in that set: attn_logic.h bwd_dq_rank).
        c["causal"] = feature == "determ"
    elif feature == "sinks":
        c["causal"], h, hk = True, 6, 2
    elif feature == "alibi":
        h, hk = 6, 2
    elif feature == "fastacc":
        c["causal"], c["fast_accum"], h, hk = True, True, 6, 2
    elif feature == "chunk":
        c["chunk"], c["causal"], c["window"], _ = CHUNK_PARTS[part]
        h, hk = 4, 2
    if feature in ("varlen", "onekey", "nantail", "alibi", "sequsedq", "chunk") or (feature == "sinks" and bwd):
        c["lens_q"], c["lens_k"] = {"varlen": ([SQ, 0, 77, 1], [SK, 40, 150, 0]), "onekey": ONEKEY_LENS,
                                    "nantail": NANTAIL_LENS, "sinks": SINKS_LENS,
                                    "alibi": ALIBI_LENS, "sequsedq": SEQUSEDQ_LENS,
                                    "chunk": CHUNK_PARTS[part][3]}[feature]
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
        if feature == "full" and dtype_name != "e4m3":  # FP8 keeps its eager rescale
            _grow_max_late(c["q"], c["k"], d, row_dim=1)
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
    if feature == "sequsedq":
        c["seqused_q"] = torch.tensor(SEQUSEDQ_USED, device=device, dtype=torch.int32)
        start = 0
        for lq, used in zip(c["lens_q"], used_q_counts(c)):  # rows that are no queries: nothing may read them
            for n in ("q", "dout"):
                if n in c:
                    _poison_tail(c[n][start + used:start + lq])  # a view: poisoned in place
            start += lq
        if not bwd:  # and seqused_k (the forward kernel's): keys that are no keys, poisoned too
            c["seqused_k"] = torch.tensor(SEQUSEDQ_USED_K, device=device, dtype=torch.int32)
            start = 0
            for lk, used in zip(c["lens_k"], used_k_counts(c)):
                for n in ("k", "v"):
                    _poison_tail(c[n][start + used:start + lk])
                start += lk
    return _quantize_case(c, g) if dtype_name == "e4m3" else c


def _grow_max_late(q, k, d: int, row_dim: int, scale: float | None = None) -> None:
    """"full" (16-bit forward; the backward's case is the forward's) and "contig" (16-bit cache
    decode), in place: the rows' maxes jump when the kernel reaches the first key block, which it
    visits last (blocks run from the end): keys 0-63 (in block 0 for every tile) get a large
    channel 0, and even rows of q along row_dim (query rows; decode: heads) q[..., 0] = 2, so their
    scores there rise by ~12 in log2 units (> the online softmax's lazy-rescale threshold of 8,
    common/softmax.cuh: the rescale path runs) while odd rows (q[..., 0] = 1/4: +1.5) keep every key
    block's weight (a wrong P.V of any block still shows) and are rescaled with their warp's even
    rows. Every other block takes the lazy skip. scale: the call's softmax_scale (1/sqrt(d))."""
    delta = 12.0 / (math.log2(math.e) * 2.0 * (d ** -0.5 if scale is None else scale))
    for start, val in ((0, 2.0), (1, 0.25)):
        idx = [slice(None)] * q.dim()
        idx[row_dim], idx[-1] = slice(start, None, 2), 0
        q[tuple(idx)] = val
    k[:, :64, :, 0] += delta


def _poison_tail(x) -> None:
    """NaN, +Inf and -Inf in turn over the rows of x (in place): what unused buffer space may hold."""
    flat = x.view(-1)
    for i, val in enumerate((float("nan"), float("inf"), float("-inf"))):
        flat[i::3] = val


def used_q_counts(c: dict) -> list[int]:
    """Queries per sequence of a varlen case: its lengths, cut by seqused_q (clamped, as the kernels do)."""
    if c.get("seqused_q") is None:
        return list(c["lens_q"])
    return [min(max(int(n), 0), lq) for n, lq in zip(c["seqused_q"].tolist(), c["lens_q"])]


def used_k_counts(c: dict) -> list[int]:
    """Keys per sequence of a varlen case: its lengths, cut by seqused_k (clamped, as the kernels do)."""
    if c.get("seqused_k") is None:
        return list(c["lens_k"])
    return [min(max(int(n), 0), lk) for n, lk in zip(c["seqused_k"].tolist(), c["lens_k"])]


def past_seqused_q(c: dict):
    """Bool mask over the packed q rows: those past their sequence's seqused_q (out 0, lse -inf)."""
    import torch
    mask = torch.zeros(c["q"].shape[0], dtype=torch.bool)
    start = 0
    for lq, n in zip(c["lens_q"], used_q_counts(c)):
        mask[start + n:start + lq] = True
        start += lq
    return mask.to(c["q"].device)


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
        # fastacc: one v descale per (batch, kv head) (block_size None), as fast_accum requires
        c["v"], vd, vcd = fp8.quantize_v_fp8(c["v"], block_size=None if c.get("fast_accum") else c["fp8_block"][1])
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


# "leftpad" parts: (what, capacity, page size, s_q, seqused (or cache_seqlens with the append),
# leftpads, num_splits, causal). 37: a TMA box starting mid-block; a leftpad equal to the row's key
# count (cache_seqlens + 2 new keys with the append): no keys; the paged part's -5 and 10^6: values
# outside the row, which the kernel clamps (to 0 and to the key count: no keys).
# vappend's launches: (queries, new keys) per entry (an int: batched, that many per entry; a list:
# packed), cache_seqlens, leftpad, page size (None: contiguous), splits, causal, rotary
# (interleaved, rotary_seqlens), tail rows of no entry (q, k).
VAPPEND_PARTS = [([3, 0, 5, 1, 70], [2, 3, 0, 1, 70], [40, 0, 77, 255, 100], [0, 0, 37, 2, 5], 16, 0,
                  True, (False, None), (3, 2)),
                 ([1, 4, 0], 2, [10, 200, 5], [3, 0, 0], None, 3, False, (True, [7, 0, 290]), (2, 0)),
                 (2, [0, 5, 1], [50, 120, 0], [49, 0, 0], 64, 0, True, None, (0, 3))]
LEFTPAD_PARTS = [("append", 512, None, 2, [40, 77, 500], [0, 37, 502], 0, True),
                 ("causal", 400, None, 70, [200, 333, 150], [0, 37, 150], 1, True),
                 ("split", 600, None, 2, [600, 450, 37], [37, 0, 37], 3, False),
                 ("paged", 400, 256, 1, [300, 129, 64], [37, -5, 10**6], 0, True)]


def _every_e4m3_value(x8, pt):
    """x8 (slabs, rows, h_k, d) e4m3 with every finite value (254 bytes, the two NaNs made +-0)
    in the first rows of batch entry 0's first slab, kv head 0 (its first keys, unless left-padded):
    the producer's conversion (decode/load.cuh e4m3x8_scaled) meets subnormals, zeros and both signs."""
    import torch
    b = torch.arange(256, dtype=torch.int32)
    b[0x7F], b[0xFF] = 0x00, 0x80
    b = b.to(torch.uint8).to(x8.device)
    d = x8.shape[-1]
    slab = 0 if pt is None else int(pt[0, 0])
    rows = x8[slab if 0 <= slab < x8.shape[0] else 0, :, 0, :].view(torch.uint8)
    for r in range(min(-(-256 // d), rows.shape[0])):
        part = b[r * d:(r + 1) * d]
        rows[r, :part.numel()] = part
    return x8


def _fp8_cache_by_entry(kc, vc, pt, kd, vd, b, device):
    """An fp32 cache quantized to e4m3 with FA3's (batch, kv head) descales kd / vd: each row (or
    page) over its batch entry's (contiguous: row i is entry i's; paged: spare pages are row 0's)."""
    import torch
    from flash3 import reference
    if pt is None:
        owner = torch.arange(b, device=device)
    else:
        owner = torch.zeros(kc.shape[0], dtype=torch.long, device=device)
        owner[pt.long().flatten()] = torch.arange(b, device=device).repeat_interleave(pt.shape[1])
    return tuple(reference.quantize_fp8_cache(x, ds[owner][:, None, :]) for x, ds in ((kc, kd), (vc, vd)))


def _fa3desc_part(part, page, splits, causal, d, dv, g, device, append=False):
    """One "fa3desc" launch: FA3's FP8 decode as flash_attn_interface runs it on the kernel. q8, and
    the caches' e4m3 bytes, from N(0, 1) values over FA3 descales (b, h_k) in [0.01, 0.11), one per
    batch entry and kv head (each page quantized with its row's); the op gets q8 as bf16 (exact),
    k_descale = q_descale * k_descale, v_descale, descale_per_batch. part["fa3"] keeps the spec's
    q8 and unfolded descales for the oracle. `append` ("fa3app"): 2 new e4m3 k/v per row (each
    row's quantized with its descales, an extreme byte or two among them) appended by the fused
    append at cache_seqlens [0, 129, 298] of a 300-key row (no cached keys; filled to capacity)."""
    import torch
    from flash3 import reference
    b, h_k, h = 3, 2, 4
    kc, vc, pt = _dec_cache(b, 300, h_k, d, dv, page, torch.float32, g, device)
    qd, kd, vd = ((torch.rand(b, h_k, generator=g) * 0.1 + 0.01).to(device) for _ in range(3))
    k8, v8 = _fp8_cache_by_entry(kc, vc, pt, kd, vd, b, device)
    s_q = 2
    q = torch.randn(b, s_q, h, d, generator=g).to(device)
    q8 = reference.quantize_fp8_cache(q, qd.repeat_interleave(h // h_k, dim=1)[:, None, :])
    i32 = lambda xs: torch.tensor(xs, dtype=torch.int32, device=device)  # noqa: E731
    app, seqused = None, i32([1, 129, 300])
    if append:
        s_new = s_q
        kn8, vn8 = (reference.quantize_fp8_cache(torch.randn(b, s_new, h_k, n, generator=g).to(device),
                                                 ds[:, None, :]) for n, ds in ((d, kd), (dv, vd)))
        kn8[0, 0, 0, :3] = torch.tensor([448.0, -2.0 ** -9, -0.0]).to(kn8.dtype)  # max, min subnormal, -0
        lens = [0, 129, 300 - s_new]
        app = dict(k=kn8, v=vn8, cache_seqlens=i32(lens), cos=None, sin=None, interleaved=False,
                   per_token=True)
        seqused = i32([n + s_new for n in lens])
    return part(q8.to(torch.bfloat16), k8, v8, pt, ((qd * kd).contiguous(), vd), seqused, num_splits=splits,
                causal=causal, append=app, fa3=dict(q8=q8, q_descale=qd, k_descale=kd, v_descale=vd))


def _fa3pk_part(part, g, d, dv, device, lq, ln, lens, pads, page, splits, causal, tail, rot=None):
    """One "fa3pk" launch (FA3PK_PARTS): FA3's FP8 cache (fa3desc's descales (b, h_k) per batch
    entry, each entry's rows and pages quantized with its own) with q and e4m3 new k/v packed where
    lq / ln are lists (with tail rows of no entry), batched where ints; the op gets q8 as bf16 and
    k_descale = q_descale * k_descale, descale_per_batch. `rot` ("fa3rot", FA3ROT_PARTS): rotary
    (rotary_dim, interleaved, rotary_seqlens): the append gets q8 itself (rotated in e4m3 with the
    keys), and pairs of 448 bytes among the new keys' rotated channels."""
    import torch
    from flash3 import reference
    b, h_k, h = len(lens), 2, 4
    i32 = lambda xs: torch.tensor(xs, dtype=torch.int32, device=device)  # noqa: E731
    qd, kd, vd = ((torch.rand(b, h_k, generator=g) * 0.1 + 0.01).to(device) for _ in range(3))
    kc, vc, pt = _dec_cache(b, 256, h_k, d, dv, page, torch.float32, g, device)
    k8, v8 = _fp8_cache_by_entry(kc, vc, pt, kd, vd, b, device)

    def layout(n, heads, dim, ds, t):  # e4m3 (packed rows, cu) or batched (b, n, ...), entry i's over ds[i]
        if isinstance(n, int):
            x = torch.randn(b, n, heads, dim, generator=g).to(device)
            return reference.quantize_fp8_cache(x, ds[:, None, :]), None
        cu = [0]
        for m in n:
            cu.append(cu[-1] + m)
        x = torch.randn(cu[-1] + t, heads, dim, generator=g).to(device)
        rows = torch.searchsorted(i32(cu[1:]), torch.arange(cu[-1] + t, device=device), right=True)
        return reference.quantize_fp8_cache(x, ds[rows.clamp(max=b - 1)]), i32(cu)

    qd_h = qd.repeat_interleave(h // h_k, dim=1)  # per query head
    q8, cu_q = layout(lq, h, d, qd_h, tail[0])
    app, news = None, [0] * b
    if ln is not None:
        kn8, cu_k = layout(ln, h_k, d, kd, tail[1])
        vn8, _ = layout(ln, h_k, dv, vd, tail[1])
        kn8.view(-1, d)[0, :3] = torch.tensor([448.0, -2.0 ** -9, -0.0]).to(kn8.dtype)  # max, min subnormal, -0
        app = dict(k=kn8, v=vn8, cache_seqlens=i32(lens), cos=None, sin=None, interleaved=False,
                   per_token=causal, cu_k=cu_k)
        if rot is not None:
            rd, interleaved, ro = rot
            rd = min(rd, d)  # FA3ROT_PARTS' rotary_dim, at most the head dim (the op refuses more)
            mate = 1 if interleaved else rd // 2  # the channel channel 0 is rotated with
            rows = kn8.view(-1, h_k, d)
            rows[::2, :, 0] = rows[::2, :, mate] = torch.tensor(448.0).to(kn8.dtype)  # past 448 rotated
            rows[1::2, :, 0] = torch.tensor(-448.0).to(kn8.dtype)
            ang = torch.rand(600, rd // 2, generator=g) * 2 * math.pi  # FA3's tests' tables
            app.update(cos=ang.cos().to(device), sin=ang.sin().to(device), interleaved=interleaved,
                       rotary_seqlens=None if ro is None else i32(ro))
        news = [ln] * b if isinstance(ln, int) else ln
    seqused = i32([n + m for n, m in zip(lens, news)])  # flash3/api.py: cache_seqlens + new keys
    q_op = q8 if rot is not None else q8.to(torch.bfloat16)  # rotary: the append rotates q8
    return part(q_op, k8, v8, pt, ((qd * kd).contiguous(), vd), seqused, num_splits=splits,
                causal=causal, append=app, cu_q=cu_q, max_q=max(lq) if cu_q is not None else 0,
                leftpad=i32(pads), fa3=dict(q8=q8, q_descale=qd, k_descale=kd, v_descale=vd))


def _vappend_part(part, rnd, i32, cache, h_k, d, dv, device, lq, ln, lens, pads, page, splits, causal, rot,
                  tail):
    """One "vappend" launch (VAPPEND_PARTS): GQA g = 2, a cache of 256 keys a row, q and new k/v
    packed where lq / ln are lists (with tail rows of no entry), batched where ints."""
    import torch
    b, h = len(lens), 2 * h_k

    def layout(n, heads, dim, t):  # (packed rows, cu) or batched (b, n, ...)
        if isinstance(n, int):
            return rnd(b, n, heads, dim), None
        cu = [0]
        for x in n:
            cu.append(cu[-1] + x)
        return rnd(cu[-1] + t, heads, dim), i32(cu)

    q, cu_q = layout(lq, h, d, tail[0])
    k, cu_k = layout(ln, h_k, d, tail[1])
    v = rnd(*k.shape[:-1], dv)
    kc, vc, pt, ds = cache(b, 256, h_k, page)
    cos = sin = None
    interleaved, ro = False, None
    if rot is not None:
        interleaved, ro = rot
        ang = torch.arange(600, dtype=torch.float32)[:, None] * 10000.0 ** (
            -torch.arange(0, 64, 2, dtype=torch.float32) / 64)
        cos, sin = ang.cos().to(device), ang.sin().to(device)
    app = dict(k=k, v=v, cache_seqlens=i32(lens), cos=cos, sin=sin, interleaved=interleaved,
               per_token=causal, cu_k=cu_k, rotary_seqlens=None if ro is None else i32(ro))
    news = [ln] * b if isinstance(ln, int) else ln
    seqused = i32([n + m for n, m in zip(lens, news)])  # flash3/api.py: cache_seqlens + new keys
    return part(q, kc, vc, pt, ds, seqused, num_splits=splits, causal=causal, append=app, cu_q=cu_q,
                max_q=max(lq) if cu_q is not None else 0, leftpad=i32(pads))


def _mlaapp_part(part, rnd, i32, cache, d, dv, device, lq, ln, lens, cap, page, h, causal, rot, pads, splits):
    """One "mlaapp" launch (MLAAPP_PARTS): one kv head, qv, FA3's MLA scale 1/sqrt(d + d_v); q/qv and
    new k/v packed where lq / ln are lists (MLAAPP_TAIL rows of no entry after), batched where ints."""
    import torch
    b = len(lens)

    def layout(n, heads, dims):  # [tensors of each head dim], cu (packed) or None (batched)
        if isinstance(n, int):
            return [rnd(b, n, heads, x) for x in dims], None
        cu = [0]
        for x in n:
            cu.append(cu[-1] + x)
        return [rnd(cu[-1] + MLAAPP_TAIL, heads, x) for x in dims], i32(cu)

    (q, qv), cu_q = layout(lq, h, (d, dv))
    (k, v), cu_k = layout(ln, 1, (d, dv))
    kc, vc, pt, ds = cache(b, cap, 1, page)
    rdim, interleaved, ro = rot
    ang = torch.arange(400, dtype=torch.float32)[:, None] * 10000.0 ** (
        -torch.arange(0, rdim, 2, dtype=torch.float32) / rdim)
    app = dict(k=k, v=v, cache_seqlens=i32(lens), cos=ang.cos().to(device), sin=ang.sin().to(device),
               interleaved=interleaved, per_token=causal, cu_k=cu_k, rotary_seqlens=None if ro is None else i32(ro))
    news = [ln] * b if isinstance(ln, int) else ln
    seqused = i32([n + m for n, m in zip(lens, news)])  # flash_attn_interface: cache_seqlens + new keys
    return part(q, kc, vc, pt, ds, seqused, num_splits=splits, causal=causal, append=app, cu_q=cu_q,
                max_q=max(lq) if cu_q is not None else 0, leftpad=None if pads is None else i32(pads), qv=qv,
                scale=(d + dv) ** -0.5)


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
        k8, v8 = (_every_e4m3_value(reference.quantize_fp8_cache(x, ds[:, None, :]), pt)
                  for x, ds in ((kc, kd), (vc, vd)))
        return k8, v8, pt, (kd, vd)

    def part(q, kc, vc, pt, descales, seqused, num_splits=1, causal=False, window=(-1, -1), softcap=0.0,
             append=None, unchecked=(), sinks=None, cu_q=None, max_q=0, alibi=None, leftpad=None, fa3=None,
             qv=None, scale=None, chunk=0):
        # append["cu_k"]: cu_seqlens_k_new (vappend: FA3's packed new keys), else absent
        return dict(feature=feature, q=q, kc=kc, vc=vc, pt=pt, descales=descales, seqused=seqused,
                    num_splits=num_splits, causal=causal, window=window, softcap=softcap, append=append,
                    unchecked=set(unchecked), sinks=sinks, cu_q=cu_q, max_q=max_q, alibi=alibi,
                    leftpad=leftpad, fa3=fa3, qv=qv, scale=scale, chunk=chunk)

    if feature == "mlaapp":
        return [_mlaapp_part(part, rnd, i32, cache, d, dv, device, *spec) for spec in MLAAPP_PARTS]
    if feature == "mlachunk":
        parts, h = [], 16
        for page, s_q, cap, lens, pads, chunk, causal, window, splits in MLACHUNK_PARTS:
            b = len(lens)
            kc, vc, pt, ds = cache(b, cap, 1, page)
            mask = dict(num_splits=splits, causal=causal, window=window, chunk=chunk,
                        leftpad=None if pads is None else i32(pads), scale=(d + dv) ** -0.5)
            if isinstance(s_q, list):  # packed queries, MLAAPP_TAIL rows of no entry after
                cu = [0]
                for n in s_q:
                    cu.append(cu[-1] + n)
                rows = cu[-1] + MLAAPP_TAIL
                parts.append(part(rnd(rows, h, d), kc, vc, pt, ds, i32(lens), cu_q=i32(cu), max_q=max(s_q),
                                  qv=rnd(rows, h, dv), **mask))
            else:
                parts.append(part(rnd(b, s_q, h, d), kc, vc, pt, ds, i32(lens), qv=rnd(b, s_q, h, dv), **mask))
        return parts
    if feature == "mla":
        parts = []
        for with_qv, page, h, s_q, cap, lens, splits, causal, extra in MLA_PARTS:
            b = len(lens)
            kc, vc, pt, ds = cache(b, cap, 1, page)
            qv = rnd(b, s_q, h, dv) if with_qv else None
            q = rnd(b, s_q, h, d)
            if page is None and not with_qv:  # the rows' maxes jump at the last block visited
                _grow_max_late(q, kc, d, row_dim=2, scale=(d + dv) ** -0.5)
            if "leftpad" in extra:
                extra = dict(extra, leftpad=i32(extra["leftpad"]))
            parts.append(part(q, kc, vc, pt, ds, i32(lens), num_splits=splits, causal=causal,
                              qv=qv, scale=(d + dv) ** -0.5, **extra))
        return parts
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
    if feature == "vappend":
        return [_vappend_part(part, rnd, i32, cache, h_k, d, dv, device, *spec) for spec in VAPPEND_PARTS]
    if feature == "dchunk":  # g = 4
        parts = []
        for chunk, causal, window, page, s_q, lens, pads, splits in DCHUNK_PARTS:
            kc, vc, pt, ds = cache(3, max(lens) + 100, h_k, page)
            mask = dict(num_splits=splits, causal=causal, window=window, chunk=chunk,
                        leftpad=None if pads is None else i32(pads))
            if isinstance(s_q, list):  # packed queries
                cu = [0]
                for n in s_q:
                    cu.append(cu[-1] + n)
                parts.append(part(rnd(cu[-1] + VPAGED_TAIL, 4 * h_k, d), kc, vc, pt, ds, i32(lens),
                                  cu_q=i32(cu), max_q=max(s_q), **mask))
            else:
                parts.append(part(rnd(3, s_q, 4 * h_k, d), kc, vc, pt, ds, i32(lens), **mask))
        return parts
    if feature == "fa3desc":
        return [_fa3desc_part(part, page, splits, causal, d, dv, g, device)
                for page, splits, causal in ((16, 1, True), (256, 3, False))]
    if feature == "fa3app":
        return [_fa3desc_part(part, page, splits, causal, d, dv, g, device, append=True)
                for page, splits, causal in FA3APP_PARTS]
    if feature == "fa3pk":
        return [_fa3pk_part(part, g, d, dv, device, *spec) for spec in FA3PK_PARTS]
    if feature == "fa3rot":
        return [_fa3pk_part(part, g, d, dv, device, *spec) for spec in FA3ROT_PARTS]
    if feature == "contig" or feature.startswith("page"):
        page = None if feature == "contig" else int(feature[4:])
        kc, vc, pt, ds = cache(3, 300, h_k, page)
        q = rnd(3, 1, h, d)
        if feature == "contig" and not fp8:  # an FP8 cache cannot hold the large channel
            _grow_max_late(q, kc, d, row_dim=2)
        return [part(q, kc, vc, pt, ds, i32([1, 129, 300]), causal=True)]
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
    if feature == "leftpad":  # g = 2; the append with rotary as the "rotary" feature's
        parts = []
        for what, cap, page, s_q, lens, pads, splits, causal in LEFTPAD_PARTS:
            kc, vc, pt, ds = cache(3, cap, h_k, page)
            q = rnd(3, s_q, h, d)
            app, seqused = None, i32(lens)
            if what == "append":
                s_new = s_q
                k, v = rnd(3, s_new, h_k, d), rnd(3, s_new, h_k, dv)
                ang = torch.arange(600, dtype=torch.float32)[:, None] * 10000.0 ** (
                    -torch.arange(0, 64, 2, dtype=torch.float32) / 64)
                app = dict(k=k, v=v, cache_seqlens=i32(lens), cos=ang.cos().to(device), sin=ang.sin().to(device),
                           interleaved=False, per_token=True)
                seqused = i32([n + s_new for n in lens])
            parts.append(part(q, kc, vc, pt, ds, seqused, num_splits=splits, causal=causal, append=app,
                              leftpad=i32(pads)))
        return parts
    if feature == "badidx":  # test_bad_index_values_stay_in_bounds
        # Pages of 16 (16-bit caches: TMA pieces; FP8: gathered) without and with splits, then of 8
        # (gathered) unsplit.
        parts = []
        for page, n in ((16, 1), (16, 3), (8, 1)):
            kc, vc, pt, ds = cache(3, 256, h_k, page)
            bad = pt.clone()
            bad[1, 2], bad[1, 3] = 10**6, -5
            q = rnd(3, 1, h, d)
            parts.append(part(q, kc, vc, bad, ds, i32([10**8, 100, -40]), num_splits=n, unchecked=[1]))
        return parts
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
    parts = [part(q, kc, vc, pt, ds, seqused, num_splits=0, causal=True, append=app)]
    if feature == "rotary":  # and at FA3's rotary_seqlens, away from the key positions
        parts.append(part(q, kc, vc, pt, ds, seqused, num_splits=0, causal=True,
                          append=dict(app, rotary_seqlens=i32([5, 300, 3]))))
    return parts


def dec_poisoned_outputs(p: dict):
    """NaN out (b, s_q, h, d_v) / lse (b, h, s_q) (packed q: (total_q, h, d_v) / (h, total_q)), and
    q_out (NaN, q's shape) when rotary."""
    import torch
    q = p["q"]
    rot = p["append"] is not None and p["append"]["cos"] is not None
    q_out = torch.full_like(q, float("nan")) if rot else None
    od = torch.bfloat16 if q.dtype == torch.float8_e4m3fn else q.dtype  # FA3's FP8 q (fa3rot): bf16 out
    if p.get("cu_q") is not None:
        return (torch.full((q.shape[0], q.shape[1], p["vc"].shape[-1]), float("nan"), dtype=od, device=q.device),
                torch.full((q.shape[1], q.shape[0]), float("nan"), device=q.device), q_out)
    b, s_q, h, _ = q.shape
    out = torch.full((b, s_q, h, p["vc"].shape[-1]), float("nan"), dtype=od, device=q.device)
    lse = torch.full((b, h, s_q), float("nan"), device=q.device)
    return out, lse, q_out


def dec_scale(p: dict) -> float:
    """The part's softmax_scale: its own (MLA: 1/sqrt(d + d_v)), else 1/sqrt(d)."""
    return float(p["scale"]) if p.get("scale") is not None else float(p["q"].shape[-1] ** -0.5)


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
        per_batch = p.get("fa3") is not None  # FA3's descales: e4m3 k/v copied, no descales here
        extra = {} if a.get("rotary_seqlens") is None else {"rotary_seqlens": a["rotary_seqlens"]}
        if per_batch:
            extra["descale_per_batch"] = True
        torch.ops.flash3.append_kv_sm90(q, kc, vc, a["k"], a["v"], a["cache_seqlens"], p["pt"], a["cos"],
                                        a["sin"], a["interleaved"], a["per_token"],
                                        q_out if q_out is not None else q, *((None, None) if per_batch else (kd, vd)),
                                        **extra,
                                        **({} if a.get("cu_k") is None and p.get("cu_q") is None
                                           else {"cu_seqlens_k_new": a.get("cu_k"), "cu_seqlens_q": p.get("cu_q")}))
        q = q_out if q_out is not None else q
        if q.dtype == torch.float8_e4m3fn:  # FA3's rotated q8, read as bf16 (flash_attn_interface's)
            q = q.to(torch.bfloat16)
    extra = {} if p.get("sinks") is None else {"sinks": p["sinks"]}  # builds without sinks: no argument
    if p.get("alibi") is not None:
        extra["alibi_slopes"] = p["alibi"]
    if p.get("leftpad") is not None:
        extra["cache_leftpad"] = p["leftpad"]
    if p.get("fa3") is not None:  # FA3's descales: per batch entry
        extra["descale_per_batch"] = True
    if p.get("qv") is not None:
        extra["qv"] = p["qv"]
    if p.get("chunk"):  # builds without attention_chunk: no argument
        extra["attention_chunk"] = p["chunk"]
    torch.ops.flash3.fwd_kvcache_sm90(q, kc, vc, out, lse, p["seqused"], p["pt"], dec_scale(p),
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
    bad-index contract leaves undefined: finite. Sinks: the oracles' sink column (smoke_checks).
    Left padding (part["leftpad"]): row i's keys are those positions from clamp(leftpad, 0, n) on.
    FA3 descales (part["fa3"]): the descales are per batch entry; out's oracle is FA3's spec on the
    unfolded values, q8 * q_descale and x8 * k/v_descale of the batch entry."""
    import torch
    from flash3 import reference
    from smoke_checks import attention_naive, attention_ref64, fa_tolerance, max_err
    kd, vd = p["descales"] or (None, None)
    q, kc, vc, pt = p["q"], r["kc"], r["vc"], p["pt"]
    a = p["append"]
    if a is not None:
        q_ref, k_ref = q, a["k"]
        kc_ref, vc_ref = p["kc"].clone(), p["vc"].clone()
        # FA3's layouts (vappend), or FA3's e4m3 q rotated with the keys (fa3rot)
        packed = a.get("cu_k") is not None or p.get("cu_q") is not None or q.dtype == torch.float8_e4m3fn
        ref_name = "reference.kvcache_append_packed" if packed else "reference.kvcache_write"
        if packed:
            q_ref = reference.kvcache_append_packed(q, kc_ref, vc_ref, a["k"], a["v"], a["cache_seqlens"], pt,
                                                    p.get("cu_q"), a.get("cu_k"), a["cos"], a["sin"],
                                                    a["interleaved"], a["per_token"], a.get("rotary_seqlens"))
        else:
            if a["cos"] is not None:
                from flash3.rotary import kvcache_rotary
                ro = a["cache_seqlens"] if a.get("rotary_seqlens") is None else a["rotary_seqlens"]
                q_ref, k_ref = kvcache_rotary(q, a["k"], ro, a["cos"], a["sin"], a["interleaved"], a["per_token"])
            # FA3's descales (per batch entry): the e4m3 keys are stored as they are
            wd = (None, None) if p.get("fa3") is not None else (kd, vd)
            reference.kvcache_write(kc_ref, vc_ref, k_ref, a["v"], a["cache_seqlens"], pt, *wd)
        for name, got, want in (("k_cache", kc, kc_ref), ("v_cache", vc, vc_ref)):
            if not torch.equal(got.view(torch.uint8), want.view(torch.uint8)):
                n = int((got.view(torch.uint8) != want.view(torch.uint8)).sum())
                return {"status": "wrong", "detail": f"append: {name} differs from {ref_name} in {n} bytes"}
        if a["cos"] is not None:
            if not torch.equal(r["q_out"].view(torch.uint8), q_ref.view(torch.uint8)):
                return {"status": "wrong", "detail": "append: q_out differs from the reference's rotated q"}
            q = r["q_out"]
            if q.dtype == torch.float8_e4m3fn:  # fa3rot: the kernel's q is the rotated q8 as bf16,
                p = dict(p, fa3=dict(p["fa3"], q8=q))  # the spec's q8 the rotated one
                q = q.to(torch.bfloat16)
    out, lse = r["out"], r["lse"]
    if torch.isnan(out).any() or torch.isnan(lse).any():
        return {"status": "nan", "detail": f"{int(torch.isnan(out).sum())} NaN in out, "
                                           f"{int(torch.isnan(lse).sum())} in lse (unwritten?)"}
    cap = kc.shape[1] * (pt.shape[1] if pt is not None else 1)
    kw = dict(causal=p["causal"], window_size=p["window"], softcap=p["softcap"], softmax_scale=dec_scale(p))
    if p.get("chunk"):  # FA3's attention_chunk, on the row's keys (from its leftpad on)
        kw["attention_chunk"] = p["chunk"]
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
        qv_rows = None if p.get("qv") is None else [p["qv"][None, a:e] for a, e in zip(cu, cu[1:])]
        if not ((out[cu[-1]:] == 0).all() and torch.isinf(lse[:, cu[-1]:]).all() and (lse[:, cu[-1]:] < 0).all()):
            return dict(res, status="wrong", detail=f"packed rows {cu[-1]}.. of no sequence: want out 0, lse -inf")
    else:
        rows = [(q[i:i + 1], out[i], lse[i]) for i in range(q.shape[0])]
        qv_rows = None if p.get("qv") is None else [p["qv"][i:i + 1] for i in range(q.shape[0])]
    pads = [0] * len(rows) if p.get("leftpad") is None else p["leftpad"].tolist()
    for i, n in enumerate(p["seqused"].tolist()):
        n = max(0, min(n, cap))
        lp = max(0, min(pads[i], n))
        q_i, out_i, lse_i = rows[i]
        if q_i.shape[1] == 0:
            continue
        if i in p["unchecked"]:
            if not torch.isfinite(out_i).all():
                return dict(res, status="wrong", detail=f"row {i} (bad page ids): non-finite out")
            continue
        if n - lp == 0:
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
        per_batch = p.get("fa3") is not None
        k_i = reference.kvcache_gather(kc, i, n, pt, kd, descale_per_batch=per_batch)[None, lp:]
        v_i = reference.kvcache_gather(vc, i, n, pt, vd, descale_per_batch=per_batch)[None, lp:]
        if p.get("alibi") is not None:  # row i's slopes, distances over its n keys
            kw["alibi_slopes"] = p["alibi"][i].double() if p["alibi"].dim() == 2 else p["alibi"].double()
        if qv_rows is not None:  # MLA: q.k + qv.v = [q, qv].[k, v]
            q_i = torch.cat([q_i, qv_rows[i]], -1)
            k_i = torch.cat([k_i, v_i], -1)
        ref, ref_lse = attention_ref64(*(x.double() for x in (q_i, k_i, v_i)), **kw)
        if per_batch:  # FA3's spec: (q8 * q_descale) . (k8 * k_descale), p . (v8 * v_descale)
            f = p["fa3"]
            g_ = q_i.shape[2] // kc.shape[2]
            q8_i = f["q8"][i:i + 1] if p.get("cu_q") is None else f["q8"][None, cu[i]:cu[i + 1]]
            q64 = q8_i.double() * f["q_descale"][i].double().repeat_interleave(g_)[:, None]
            k64, v64 = (reference.kvcache_gather(c8, i, n, pt).double()[None, lp:] * ds[i].double()[:, None]
                        for c8, ds in ((kc, f["k_descale"]), (vc, f["v_descale"])))
            ref, _ = attention_ref64(q64, k64, v64, **kw)
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
    if c.get("seqused_q") is not None:
        extra["seqused_q"] = c["seqused_q"]
    if c.get("chunk"):  # builds without attention_chunk: no argument
        extra["attention_chunk"] = c["chunk"]
    torch.ops.flash3.fwd_sm90(c["q"], c["k"], c["v"], out, lse, c["cu_q"], c["cu_k"], c["seqused_k"],
                              c["max_q"], c["max_k"], c["q"].shape[-1] ** -0.5, *op_window(c),
                              c["softcap"], **extra)


def fp8_op_descales(c):
    """The descales as fwd_fp8_sm90 takes them: fast_accum's v descale (b, h_k) as (b, h_k, 1)."""
    qd, kd, vd, vcd = c["descales"]
    return qd, kd, vd[:, :, None] if c.get("fast_accum") else vd, vcd


def _launch_fp8(c, out, lse):
    import torch
    from flash3 import fp8
    extra = {n: c[n] for n in ("seqused_q", "seqused_k") if c.get(n) is not None}
    if c.get("chunk"):  # builds without attention_chunk: no argument
        extra["attention_chunk"] = c["chunk"]
    qd, kd, vd, vcd = fp8_op_descales(c)
    if c.get("fast_accum"):
        extra["fast_accum"] = True
    if c["cu_q"] is not None:  # packed V past seqused_k zeroed (flash3._backend.run_kernel_fwd_fp8)
        vt = fp8.pack_v_fp8_varlen(c["v"], c["cu_k"], c.get("seqused_k"))
        tail = (c["cu_q"], c["cu_k"], c["max_q"], c["max_k"])
    else:
        vt, tail = fp8.pack_v_fp8(c["v"]), ()
    torch.ops.flash3.fwd_fp8_sm90(c["q"], c["k"], vt, out, lse, qd, kd, vd, vcd, *c["fp8_block"],
                                  c["q"].shape[-1] ** -0.5, *op_window(c), c["softcap"], *tail, **extra)


def _pieces(c, out, lse):
    """(out, lse, q, k, v) per sequence, batched 4-D, for the reference."""
    q, k, v = c["q"], c["k"], c["v"]
    if c["cu_q"] is not None:
        oq = ok = 0
        # n, nk: the used queries and keys (seqused_q, seqused_k)
        for lq, n, lk, nk in zip(c["lens_q"], used_q_counts(c), c["lens_k"], used_k_counts(c)):
            yield (out[oq:oq + n][None], lse[:, oq:oq + n][None], q[oq:oq + n][None],
                   k[ok:ok + nk][None], v[ok:ok + nk][None])
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
    if c.get("seqused_q") is not None:  # rows past it: exactly out 0, lse -inf (the poison overwritten)
        pad = past_seqused_q(c)
        if not (out[pad] == 0).all() or not (lse[:, pad] == -math.inf).all():
            return {"status": "wrong", "detail": "rows past seqused_q: out/lse not 0/-inf"}
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
    from smoke_checks import max_err, noop_rounding
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
    """Per sequence against the fp64 reference: the FlashAttention rule of smoke_checks.py (sinks:
    its sink column)."""
    import torch
    from smoke_checks import attention_naive, attention_ref64, fa_tolerance, max_err
    kw = dict(causal=c["causal"], window_size=c["window"], softcap=c["softcap"])
    if c.get("sinks") is not None:
        kw["sinks"] = c["sinks"].double()
    if c.get("chunk"):
        kw["attention_chunk"] = c["chunk"]
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
              v_channel_descale=vcd, attention_chunk=int(c.get("chunk") or 0),
              fast_accum=bool(c.get("fast_accum")))
    if c["cu_q"] is not None:
        return fp8.fp8_attention_varlen_reference(q, k, v, cpu(c["cu_q"]), cpu(c["cu_k"]), qd, kd, vd,
                                                  max_seqlen_q=c["max_q"], max_seqlen_k=c["max_k"],
                                                  seqused_q=cpu(c.get("seqused_q")),
                                                  seqused_k=cpu(c.get("seqused_k")), **kw)
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
    """out/lse from the forward kernel (launch; with the case's sinks; fwd_by_reference: from
    reference_fwd, as flash3's API), then one synchronized bwd_sm90 launch (with the case's dlse,
    sinks) into NaN-poisoned dq/dk/dv (and dsinks); "determ" a second one. Returns (out, lse, grads,
    second grads or None): grads [dq, dk, dv] (+ [dsinks])."""
    import torch
    out, lse = reference_fwd(c) if fwd_by_reference(c) else launch(c)
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
                                  **({} if c.get("alibi") is None else {"alibi_slopes": c["alibi"]}),
                                  **({} if c.get("seqused_q") is None else {"seqused_q": c["seqused_q"]}),
                                  **({"attention_chunk": c["chunk"]} if c.get("chunk") else {}))
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
    kw = (c["q"].shape[-1] ** -0.5, *op_window(c), c["softcap"])
    sk = {"sinks": c["sinks"]} if c.get("sinks") is not None else {}
    al = {} if c.get("alibi") is None else {"alibi_slopes": c["alibi"]}
    if c.get("seqused_q") is not None:
        al["seqused_q"] = c["seqused_q"]
    if c.get("chunk"):
        al["chunk"] = c["chunk"]
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
