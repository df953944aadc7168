"""The MLA decode kernel on an sm_90 GPU, through FA3's flash_attn_with_kvcache as DeepSeek-V3
serving calls it: d 64 (rope), d_v 512 (latent), qv, one kv head, 16-128 query heads, s_q 1-2,
pages of 64 (and 16: gathered), split-KV, packed queries. Each batch row against the fp64 oracle
(q.k + qv.v = [q, qv].[k, v]) with the FlashAttention rule; no call may fall back to the spec.
Skipped without an sm_90 device or a flash3._C with the MLA kernel.
"""
import json

import pytest
import torch

import flash3.flash_attn_interface as fai
from flash3 import _backend
from helpers import assert_close_fa, attention_naive, attention_ref64

HAS_SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
pytestmark = [pytest.mark.requires_sm90,
              pytest.mark.skipif(not HAS_SM90, reason="needs a CUDA sm_90 (H100/H200) device")]
D, DV = 64, 512


@pytest.fixture(autouse=True)
def require_mla_kernel(monkeypatch):
    if not hasattr(torch.ops.flash3, "kernel_info") or ["bf16", D, DV] not in json.loads(
            torch.ops.flash3.kernel_info()).get("decode", []):
        pytest.skip("flash3._C without the MLA decode kernel (bf16 64x512)")

    def no_fallback(reason, what="forward"):
        raise AssertionError(f"{what} fell back to the spec: {reason}")
    monkeypatch.setattr(_backend, "warn_fallback", no_fallback)


def paged_cache(b, cap, page, gen):
    pages = -(-cap // page)
    n = b * pages + 3
    kc = torch.randn(n, page, 1, D, generator=gen).to("cuda", torch.bfloat16)
    vc = torch.randn(n, page, 1, DV, generator=gen).to("cuda", torch.bfloat16)
    table = torch.randperm(n, generator=gen)[:b * pages].view(b, pages).to(torch.int32).cuda()
    return kc, vc, table


def row_keys(cache, table, i, n):
    """Row i's first n keys (n, 1, ·) of a paged cache."""
    page = cache.shape[1]
    pos = torch.arange(n, device=cache.device)
    return cache[table[i].long()[pos // page], pos % page]


def check_rows(q, qv, kc, vc, table, lens, out, lse, causal):
    scale = (D + DV) ** -0.5
    for i, n in enumerate(lens):
        if n == 0:
            assert (out[i] == 0).all() and torch.isinf(lse[i]).all()
            continue
        k, v = row_keys(kc, table, i, n)[None], row_keys(vc, table, i, n)[None]
        qq, kk = torch.cat([q[i:i + 1], qv[i:i + 1]], -1), torch.cat([k, v], -1)
        kw = dict(causal=causal, softmax_scale=scale)
        ref, ref_lse = attention_ref64(qq.double(), kk.double(), v.double(), **kw)
        naive, _ = attention_naive(qq, kk, v, **kw)
        assert_close_fa(out[i:i + 1], naive, ref, f"out[{i}]")
        fin = torch.isfinite(ref_lse[0])  # causal s_q 2 over 1 key: query 0 sees none (lse -inf)
        assert torch.equal(torch.isinf(lse[i]), ~fin), f"lse[{i}]: -inf pattern"
        assert (lse[i][fin].double() - ref_lse[0][fin]).abs().max() <= 1e-4 * (1 + ref_lse[0][fin].abs().max())


@pytest.mark.parametrize("h,s_q", [(16, 1), (128, 1), (40, 2), (128, 2)])
@pytest.mark.parametrize("num_splits", [0, 1, 3])
@pytest.mark.parametrize("page", [64, 16])
def test_mla_decode_matches_fp64(h, s_q, num_splits, page):
    g = torch.Generator().manual_seed(h + s_q + num_splits + page)
    lens = [0, 1, 77, 640]
    kc, vc, table = paged_cache(len(lens), 640, page, g)
    q = torch.randn(len(lens), s_q, h, D, generator=g).to("cuda", torch.bfloat16)
    qv = torch.randn(len(lens), s_q, h, DV, generator=g).to("cuda", torch.bfloat16)
    seq = torch.tensor(lens, dtype=torch.int32, device="cuda")
    out, lse, *_ = fai.flash_attn_with_kvcache(q, kc, vc, qv=qv, cache_seqlens=seq, page_table=table,
                                                causal=True, num_splits=num_splits, return_softmax_lse=True)
    check_rows(q, qv, kc, vc, table, lens, out, lse, True)


def test_mla_decode_packed_queries_and_no_qv():
    """SGLang's call (cu_seqlens_q on a decode step), and d_v 512 without qv."""
    g = torch.Generator().manual_seed(7)
    lens, h = [300, 64, 5], 64
    kc, vc, table = paged_cache(len(lens), 320, 64, g)
    q = torch.randn(len(lens), 1, h, D, generator=g).to("cuda", torch.bfloat16)
    qv = torch.randn(len(lens), 1, h, DV, generator=g).to("cuda", torch.bfloat16)
    seq = torch.tensor(lens, dtype=torch.int32, device="cuda")
    cu = torch.arange(len(lens) + 1, dtype=torch.int32, device="cuda")
    out, lse, *_ = fai.flash_attn_with_kvcache(q[:, 0], kc, vc, qv=qv[:, 0], cache_seqlens=seq, page_table=table,
                                                cu_seqlens_q=cu, max_seqlen_q=1, causal=True,
                                                return_softmax_lse=True)
    check_rows(q, qv, kc, vc, table, lens, out[:, None], lse.T[:, :, None], True)
    # Without qv: plain attention over the latent, FA3's default scale 1/sqrt(d).
    out = fai.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seq, page_table=table)
    for i, n in enumerate(lens):
        k, v = row_keys(kc, table, i, n)[None], row_keys(vc, table, i, n)[None]
        ref, _ = attention_ref64(q[i:i + 1].double(), k.double(), v.double(), softmax_scale=D ** -0.5)
        naive, _ = attention_naive(q[i:i + 1], k, v, softmax_scale=D ** -0.5)
        assert_close_fa(out[i:i + 1], naive, ref, f"out[{i}] (no qv)")


def test_mla_decode_sglang_layout():
    """SGLang's MLA cache: one (pages, 64, 1, 576) buffer whose latent [..., :512] is v_cache and
    rope part [..., 512:] k_cache (views: row stride 576, read in place), q and qv views of one
    (b, h, 576) query, cu_seqlens_q on a decode step, 128 heads."""
    g = torch.Generator().manual_seed(11)
    lens, h, page = [300, 64, 5], 128, 64
    pages = -(-320 // page)
    n = len(lens) * pages + 3
    kv = torch.randn(n, page, 1, DV + D, generator=g).to("cuda", torch.bfloat16)
    vc, kc = kv[..., :DV], kv[..., DV:]
    table = torch.randperm(n, generator=g)[:len(lens) * pages].view(len(lens), pages).to(torch.int32).cuda()
    q_all = torch.randn(len(lens), h, DV + D, generator=g).to("cuda", torch.bfloat16)
    qv, q = q_all[..., :DV], q_all[..., DV:]
    seq = torch.tensor(lens, dtype=torch.int32, device="cuda")
    cu = torch.arange(len(lens) + 1, dtype=torch.int32, device="cuda")
    out, lse, *_ = fai.flash_attn_with_kvcache(q, kc, vc, qv=qv, cache_seqlens=seq, page_table=table,
                                                cu_seqlens_q=cu, max_seqlen_q=1, causal=True,
                                                return_softmax_lse=True)
    check_rows(q[:, None], qv[:, None], kc, vc, table, lens, out[:, None], lse.T[:, :, None], True)


def check_entries(q_rows, qv_rows, kc, vc, table, lens, pads, out_rows, lse_rows, **mask):
    """Each entry's (1, s, h, ·) queries against the fp64 oracle on its keys [pads[i], lens[i])
    (FA3's cache_leftpad), masks bottom-right aligned on them; an entry of no keys: out 0, lse -inf.
    lse_rows[i]: (h, s)."""
    scale = (D + DV) ** -0.5
    for i, n in enumerate(lens):
        q, qv, out, lse = q_rows[i], qv_rows[i], out_rows[i], lse_rows[i]
        if q.shape[1] == 0:
            continue
        lp = min(pads[i], n)
        if n - lp == 0:
            assert (out == 0).all() and torch.isinf(lse).all() and (lse < 0).all(), f"entry {i}: no keys"
            continue
        k, v = row_keys(kc, table, i, n)[None, lp:], row_keys(vc, table, i, n)[None, lp:]
        qq, kk = torch.cat([q, qv], -1), torch.cat([k, v], -1)
        kw = dict(softmax_scale=scale, **mask)
        ref, ref_lse = attention_ref64(qq.double(), kk.double(), v.double(), **kw)
        naive, _ = attention_naive(qq, kk, v, **kw)
        assert_close_fa(out, naive, ref, f"out[{i}]")
        fin = torch.isfinite(ref_lse[0])  # a token whose chunk ends at or before key 0 sees none
        assert torch.equal(torch.isinf(lse), ~fin), f"lse[{i}]: -inf pattern"
        if fin.any():
            assert (lse[fin].double() - ref_lse[0][fin]).abs().max() <= 1e-4 * (1 + ref_lse[0][fin].abs().max())


@pytest.mark.parametrize("chunk,causal,window", [(48, True, (-1, -1)), (64, False, (100, 10)),
                                                 (256, False, (-1, -1))])
@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("page", [64, 16])
@pytest.mark.parametrize("leftpad", [False, True])
def test_mla_decode_attention_chunk(chunk, causal, window, num_splits, page, leftpad):
    """FA3's attention_chunk (Llama 4's chunked local attention) on the MLA kernel, with causal or a
    window, splits, TMA (64) and gathered (16) pages, and cache_leftpad (chunk starts off the block
    grid): s_q 3 with 40 heads (a token's rows straddle tiles), rows whose tokens straddle a chunk
    start and one whose first token sees no key."""
    g = torch.Generator().manual_seed(chunk + num_splits + page + leftpad)
    lens, pads = [146, 640, 2, 301], ([37, 0, 1, 200] if leftpad else [0, 0, 0, 0])
    h, s_q = 40, 3
    kc, vc, table = paged_cache(len(lens), 640, page, g)
    q = torch.randn(len(lens), s_q, h, D, generator=g).to("cuda", torch.bfloat16)
    qv = torch.randn(len(lens), s_q, h, DV, generator=g).to("cuda", torch.bfloat16)
    seq = torch.tensor(lens, dtype=torch.int32, device="cuda")
    kw = dict(cache_leftpad=torch.tensor(pads, dtype=torch.int32, device="cuda")) if leftpad else {}
    out, lse, *_ = fai.flash_attn_with_kvcache(q, kc, vc, qv=qv, cache_seqlens=seq, page_table=table,
                                                causal=causal, window_size=window, attention_chunk=chunk,
                                                num_splits=num_splits, return_softmax_lse=True, **kw)
    b = len(lens)
    check_entries([q[i:i + 1] for i in range(b)], [qv[i:i + 1] for i in range(b)], kc, vc, table, lens, pads,
                  [out[i:i + 1] for i in range(b)], [lse[i] for i in range(b)], causal=causal, window_size=window,
                  attention_chunk=chunk)


@pytest.mark.parametrize("chunk", [0, 48])
@pytest.mark.parametrize("page", [64, 16])
def test_mla_decode_packed_queries_with_leftpad(chunk, page):
    """cache_leftpad with packed queries (cu_seqlens_q; no longer the spec's), with and without a
    chunk: entries of 0 queries, of no key left after the padding, packed tail rows of no entry
    (out 0, lse -inf), 2 splits."""
    g = torch.Generator().manual_seed(chunk + page)
    lq, lens, pads, h = [2, 0, 3, 1], [300, 50, 130, 40], [37, 5, 0, 40], 16
    kc, vc, table = paged_cache(len(lens), 320, page, g)
    cu_list = [0]
    for n in lq:
        cu_list.append(cu_list[-1] + n)
    rows = cu_list[-1] + 2  # two rows of no entry
    q = torch.randn(rows, h, D, generator=g).to("cuda", torch.bfloat16)
    qv = torch.randn(rows, h, DV, generator=g).to("cuda", torch.bfloat16)
    cu = torch.tensor(cu_list, dtype=torch.int32, device="cuda")
    out, lse, *_ = fai.flash_attn_with_kvcache(
        q, kc, vc, qv=qv, cache_seqlens=torch.tensor(lens, dtype=torch.int32, device="cuda"), page_table=table,
        cache_leftpad=torch.tensor(pads, dtype=torch.int32, device="cuda"), cu_seqlens_q=cu, max_seqlen_q=max(lq),
        causal=True, attention_chunk=chunk, num_splits=2, return_softmax_lse=True)
    sl = [slice(a, e) for a, e in zip(cu_list, cu_list[1:])]
    check_entries([q[None, s] for s in sl], [qv[None, s] for s in sl], kc, vc, table, lens, pads,
                  [out[None, s] for s in sl], [lse[:, s] for s in sl], causal=True, attention_chunk=chunk)
    assert (out[cu_list[-1]:] == 0).all() and torch.isinf(lse[:, cu_list[-1]:]).all()
