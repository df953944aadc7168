"""flash3.flash_attn_interface: FlashAttention-3's functions, called as FA3 users call them
(positional arguments, FA3 defaults and return conventions), against flash3's public API."""

import inspect
import math

import pytest
import torch

import flash3
from flash3 import flash_attn_interface as fai
from helpers import max_err

# FA3's signatures (hopper/flash_attn_interface.py), the order positional callers rely on.
FA3_PARAMS = {
    "flash_attn_func": "q k v softmax_scale causal qv q_descale k_descale v_descale window_size "
                       "attention_chunk softcap num_splits pack_gqa deterministic sm_margin "
                       "return_attn_probs",
    "flash_attn_qkvpacked_func": "qkv softmax_scale causal q_descale k_descale v_descale "
                                 "window_size attention_chunk softcap deterministic num_heads_q "
                                 "sm_margin return_attn_probs",
    "flash_attn_varlen_func": "q k v cu_seqlens_q cu_seqlens_k max_seqlen_q max_seqlen_k "
                              "seqused_q seqused_k softmax_scale causal qv q_descale k_descale "
                              "v_descale window_size attention_chunk softcap num_splits pack_gqa "
                              "deterministic sm_margin return_attn_probs",
    "flash_attn_combine": "out_partial lse_partial out out_dtype",
    "flash_attn_with_kvcache": "q k_cache v_cache k v qv rotary_cos rotary_sin cache_seqlens "
                               "cache_batch_idx cache_leftpad page_table cu_seqlens_q "
                               "cu_seqlens_k_new max_seqlen_q rotary_seqlens q_descale k_descale "
                               "v_descale softmax_scale causal window_size attention_chunk softcap "
                               "rotary_interleaved scheduler_metadata num_splits pack_gqa "
                               "sm_margin return_softmax_lse",
}


@pytest.mark.parametrize("name", list(FA3_PARAMS))
def test_signatures(name):
    params = inspect.signature(getattr(fai, name)).parameters
    positional = [n for n, p in params.items() if p.kind is p.POSITIONAL_OR_KEYWORD]
    assert positional == FA3_PARAMS[name].split()
    # Beyond FA3's: FlashAttention-2's alibi_slopes, keyword-only and last (positional calls keep
    # FA3's meaning).
    extra = [n for n, p in params.items() if p.kind is not p.POSITIONAL_OR_KEYWORD]
    assert extra == ([] if name == "flash_attn_combine" else ["alibi_slopes"])
    assert all(params[n].kind is params[n].KEYWORD_ONLY and params[n].default is None for n in extra)


def test_defaults():
    sig = inspect.signature(fai.flash_attn_with_kvcache).parameters
    assert sig["rotary_interleaved"].default is True  # FA3's default (flash3's own is False)
    assert sig["num_splits"].default == 0 and sig["window_size"].default == (-1, -1)
    assert inspect.signature(fai.flash_attn_func).parameters["num_splits"].default == 1


def test_import_forms():
    import flash3.flash_attn_interface as m
    assert m is fai is flash3.flash_attn_interface


def qkv(b=2, s_q=33, s_k=40, h=4, h_k=2, d=32, dtype=torch.bfloat16, seed=0):
    torch.manual_seed(seed)
    return (torch.randn(b, s_q, h, d).to(dtype), torch.randn(b, s_k, h_k, d).to(dtype),
            torch.randn(b, s_k, h_k, d).to(dtype))


def test_func_positional_and_return_attn_probs():
    q, k, v = qkv()
    want, want_lse = flash3.attention(q, k, v, causal=True, softmax_scale=0.2,
                                      window_size=(10, 0), softcap=4.0, return_lse=True)
    # every argument positionally, as FA3 callers may write it
    got = fai.flash_attn_func(q, k, v, 0.2, True, None, None, None, None, (10, 0), 0, 4.0, 1,
                              None, False, 0, False)
    assert torch.equal(got, want)
    out, lse = fai.flash_attn_func(q, k, v, 0.2, True, window_size=(10, 0), softcap=4.0,
                                   return_attn_probs=True)
    assert torch.equal(out, want) and torch.equal(lse, want_lse)
    assert lse.shape == (2, 4, 33) and lse.dtype == torch.float32


def test_func_gradients_and_speed_knobs():
    q, k, v = (x.float().requires_grad_() for x in qkv())
    out = fai.flash_attn_func(q, k, v, causal=True, num_splits=3, pack_gqa=True, sm_margin=8,
                              deterministic=True)
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), g)
    want = torch.autograd.grad(flash3.attention(q, k, v, causal=True), (q, k, v), g)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_qkvpacked():
    torch.manual_seed(1)
    packed = torch.randn(2, 20, 3, 4, 16, requires_grad=True)
    out, lse = fai.flash_attn_qkvpacked_func(packed, None, True, return_attn_probs=True)
    q, k, v = packed.detach().unbind(2)
    want, want_lse = flash3.attention(q, k, v, causal=True, return_lse=True)
    assert torch.equal(out, want) and torch.equal(lse, want_lse)
    out.sum().backward()
    assert packed.grad.shape == packed.shape and packed.grad.abs().sum() > 0
    # GQA layout: (b, s, h + 2 h_k, d) with num_heads_q
    gqa = torch.randn(2, 20, 6 + 2 * 2, 16)
    out = fai.flash_attn_qkvpacked_func(gqa, causal=True, num_heads_q=6)
    q, k, v = gqa.split([6, 2, 2], dim=2)
    assert torch.equal(out, flash3.attention(q, k, v, causal=True))
    with pytest.raises(ValueError, match="num_heads_q"):
        fai.flash_attn_qkvpacked_func(gqa)


def cu(lens):
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)


def test_varlen_positional_and_lse_layout():
    torch.manual_seed(2)
    lq, lk = [3, 0, 9], [5, 4, 9]
    q, k, v = torch.randn(12, 4, 16), torch.randn(18, 2, 16), torch.randn(18, 2, 16)
    want, want_lse = flash3.attention_varlen(q, k, v, cu(lq), cu(lk), 9, 9, causal=True,
                                             return_lse=True)
    out, lse = fai.flash_attn_varlen_func(q, k, v, cu(lq), cu(lk), 9, 9, None, None, None, True,
                                          return_attn_probs=True)
    assert torch.equal(out, want) and torch.equal(lse, want_lse) and lse.shape == (4, 12)
    # seqused_k: the first seqused_k[i] keys of each sequence
    used = torch.tensor([2, 4, 6], dtype=torch.int32)
    out = fai.flash_attn_varlen_func(q, k, v, cu(lq), cu(lk), 9, 9, seqused_k=used, causal=True)
    want = flash3.attention_varlen(q, k, v, cu(lq), cu(lk), 9, 9, causal=True, seqused_k=used)
    assert torch.equal(out, want)


def test_fp8_descales_optional_and_broadcast():
    q, k, v = (x.to(torch.float8_e4m3fn) for x in qkv(dtype=torch.float32))
    ones = torch.ones(2, 2)
    want = flash3.attention(q, k, v, causal=True, q_descale=ones, k_descale=ones, v_descale=ones)
    assert want.dtype == torch.bfloat16
    assert torch.equal(fai.flash_attn_func(q, k, v, causal=True), want)  # None means 1
    d = torch.tensor([0.5])  # shape (1,), FA3 callers' per-tensor scale
    got = fai.flash_attn_func(q, k, v, None, True, None, d, d, d)
    half = torch.full((2, 2), 0.5)
    assert torch.equal(got, flash3.attention(q, k, v, causal=True, q_descale=half,
                                             k_descale=half, v_descale=half))
    with pytest.raises(ValueError, match="k_descale"):
        fai.flash_attn_func(q, k, v, k_descale=torch.ones(3))
    # 16-bit inputs: descales are ignored, as in FA3
    qb, kb, vb = qkv()
    assert torch.equal(fai.flash_attn_func(qb, kb, vb, q_descale=d, k_descale=d, v_descale=d),
                       flash3.attention(qb, kb, vb))


def cache(b=3, cap=48, h_k=2, d=32, dtype=torch.bfloat16, seed=3):
    torch.manual_seed(seed)
    return torch.randn(b, cap, h_k, d).to(dtype), torch.randn(b, cap, h_k, d).to(dtype)


def test_kvcache_rotary_default_is_interleaved():
    q = torch.randn(3, 1, 4, 32, dtype=torch.bfloat16)
    k_new, v_new = (torch.randn(3, 1, 2, 32, dtype=torch.bfloat16) for _ in range(2))
    lens = torch.tensor([5, 0, 30], dtype=torch.int32)
    cos, sin = torch.randn(64, 8), torch.randn(64, 8)
    results = {}
    for name, call in (("fa3", lambda kc, vc: fai.flash_attn_with_kvcache(
                            q, kc, vc, k_new, v_new, None, cos, sin, lens, causal=True)),
                       ("interleaved", lambda kc, vc: flash3.attention_with_kvcache(
                            q, kc, vc, k_new, v_new, cache_seqlens=lens, rotary_cos=cos,
                            rotary_sin=sin, rotary_interleaved=True, causal=True)),
                       ("halves", lambda kc, vc: flash3.attention_with_kvcache(
                            q, kc, vc, k_new, v_new, cache_seqlens=lens, rotary_cos=cos,
                            rotary_sin=sin, causal=True))):
        kc, vc = cache()
        results[name] = (call(kc, vc), kc)
    assert torch.equal(results["fa3"][0], results["interleaved"][0])
    assert torch.equal(results["fa3"][1], results["interleaved"][1])  # same cache writes
    assert not torch.equal(results["fa3"][0], results["halves"][0])


def test_kvcache_return_softmax_lse_and_full_cache():
    kc, vc = cache()
    q = torch.randn(3, 2, 4, 32, dtype=torch.bfloat16)
    res = fai.flash_attn_with_kvcache(q, kc, vc, causal=True, return_softmax_lse=True)
    assert len(res) == 4 and res[2].numel() == 0 and res[3].numel() == 0  # FA3's 4-tuple
    want, want_lse = flash3.attention(q, kc, vc, causal=True, return_lse=True)  # whole cache
    assert max_err(res[0], want) <= 1e-2 and max_err(res[1], want_lse) <= 1e-4


def test_kvcache_cache_batch_idx():
    kc, vc = cache(b=5)
    kc0 = kc.clone()
    q = torch.randn(3, 1, 4, 32, dtype=torch.bfloat16)
    k_new, v_new = (torch.randn(3, 1, 2, 32, dtype=torch.bfloat16) for _ in range(2))
    idx = torch.tensor([4, 0, 2], dtype=torch.int32)
    lens = torch.tensor([7, 20, 0], dtype=torch.int32)
    out = fai.flash_attn_with_kvcache(q, kc, vc, k_new, v_new, cache_seqlens=lens,
                                      cache_batch_idx=idx, causal=True)
    for i, row in enumerate(idx.tolist()):  # the new key landed in cache row idx[i]
        assert torch.equal(kc[row, lens[i]], k_new[i, 0])
        n = int(lens[i]) + 1
        want = flash3.attention(q[i:i + 1], kc[row:row + 1, :n], vc[row:row + 1, :n], causal=True)
        assert max_err(out[i:i + 1], want) <= 1e-2
    untouched = [r for r in range(5) if r not in idx.tolist()]
    assert torch.equal(kc[untouched], kc0[untouched])


def test_kvcache_packed_queries_on_a_paged_cache():
    torch.manual_seed(5)
    lq, lens = [1, 7, 0, 4], [30, 12, 5, 0]
    q = torch.randn(sum(lq), 4, 32, dtype=torch.bfloat16)
    kp, vp = (torch.randn(12, 8, 2, 32, dtype=torch.bfloat16) for _ in range(2))
    table = torch.randperm(12)[:8].view(4, 2).to(torch.int32)
    table = torch.cat([table, table.flip(0)], 1)  # 4 pages of 8 per sequence
    used = torch.tensor(lens, dtype=torch.int32)
    out, lse, *_ = fai.flash_attn_with_kvcache(q, kp, vp, cache_seqlens=used, page_table=table,
                                               cu_seqlens_q=cu(lq), max_seqlen_q=7, causal=True,
                                               return_softmax_lse=True)
    want, want_lse = flash3.attention_varlen(q, kp, vp, cu(lq), None, 7, 32, causal=True,
                                             page_table=table, seqused_k=used, return_lse=True)
    assert torch.equal(out, want) and torch.equal(lse, want_lse)


def test_kvcache_fp8_cache_fp8_q():
    """FA3's FP8 call: fp8 q, fp8 cache and new k/v, descales (1,) broadcast per (b, h_k)."""
    kc, vc = (x.to(torch.float8_e4m3fn) for x in cache(dtype=torch.float32))
    torch.manual_seed(6)
    q8 = torch.randn(3, 2, 4, 32).to(torch.float8_e4m3fn)
    k8, v8 = (torch.randn(3, 2, 2, 32).to(torch.float8_e4m3fn) for _ in range(2))
    lens = torch.tensor([4, 0, 40], dtype=torch.int32)
    dq, dk, dv = torch.tensor([0.5]), torch.tensor([0.25]), torch.tensor([2.0])
    kc2, vc2 = kc.clone(), vc.clone()
    out = fai.flash_attn_with_kvcache(q8, kc, vc, k8, v8, None, None, None, lens, q_descale=dq,
                                      k_descale=dk, v_descale=dv, causal=True)
    assert out.dtype == torch.bfloat16
    rows = torch.arange(3)
    for j in range(2):  # the new bytes are stored as given
        assert torch.equal(kc[rows, lens.long() + j].view(torch.uint8), k8[:, j].view(torch.uint8))
        assert torch.equal(vc[rows, lens.long() + j].view(torch.uint8), v8[:, j].view(torch.uint8))
    qb = (q8.float() * 0.5).to(torch.bfloat16)
    want = flash3.attention_with_kvcache(qb, kc2, vc2, (k8.float() * 0.25).to(torch.bfloat16),
                                         (v8.float() * 2.0).to(torch.bfloat16),
                                         cache_seqlens=lens, causal=True,
                                         k_descale=torch.full((3, 2), 0.25),
                                         v_descale=torch.full((3, 2), 2.0))
    assert torch.equal(out, want)


def combine_ref64(o, lse):
    """(S, b, s, h, d), (S, b, s, h) -> fp64 out, lse (b, s, h)."""
    o, lse = o.double(), lse.double()
    total = torch.logsumexp(lse, dim=0)
    w = torch.exp(lse - total).nan_to_num(0.0)
    return (w.unsqueeze(-1) * o).sum(0), total


@pytest.mark.parametrize("out_dtype", [None, torch.bfloat16])
def test_combine(out_dtype):
    torch.manual_seed(7)
    o = torch.randn(3, 2, 5, 4, 16)
    lse = torch.randn(3, 2, 5, 4) * 3
    lse[1:, 0] = -math.inf  # some rows seen by one split only
    lse[:, 1, 2] = -math.inf  # a row no split saw
    out, l = fai.flash_attn_combine(o, lse, out_dtype=out_dtype)
    ref, ref_lse = combine_ref64(o, lse)
    assert out.dtype == (out_dtype or torch.float32) and l.shape == (2, 5, 4)
    assert max_err(out, ref.nan_to_num(0.0)) <= (1e-5 if out_dtype is None else 1e-2)
    fin = torch.isfinite(ref_lse)
    assert max_err(l[fin], ref_lse[fin]) <= 1e-5 and bool((l[~fin] == -math.inf).all())
    assert torch.equal(out[1, 2], torch.zeros_like(out[1, 2]))
    buf = torch.empty(2, 5, 4, 16)
    res, _ = fai.flash_attn_combine(o, lse, buf)
    assert res is buf


