"""Packed variable-length queries against a KV cache (chunked prefill on a paged cache):
attention_varlen(page_table=, seqused_k=) and attention_with_kvcache(cu_seqlens_q=), against
an fp64 per-sequence oracle built here from each sequence's logical keys."""

import math

import pytest
import torch

import flash3
from helpers import assert_close_fa, attention_naive, attention_ref64, max_err
from test_sinks import sink_ref

H, H_K, D = 4, 2, 64
# The batch: 1, 7, 300 and 0 queries over caches of 0..2000 keys.
LENS_Q = [1, 7, 300, 0, 5]
LENS_K = [2000, 0, 777, 1234, 16]


def cu(lens):
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)


def make_batch(page_size, fp8, dtype=torch.bfloat16, seed=0):
    """q (total_q, H, D); the logical keys of each sequence (what the oracle reads, fp32);
    the paged cache holding them in shuffled pages; descales for an FP8 cache."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(LENS_Q), H, D, generator=g).to(dtype)
    pages_per = [-(-n // page_size) for n in LENS_K]
    max_pages = max(pages_per) + 1  # a spare column: entries past a row's keys are never read
    num_pages = sum(pages_per) + 3  # spare pages, never used
    perm = torch.randperm(num_pages, generator=g)
    table = torch.zeros(len(LENS_K), max_pages, dtype=torch.int32)
    cache_dtype = torch.float8_e4m3fn if fp8 else dtype
    kc = torch.randn(num_pages, page_size, H_K, D, generator=g).to(cache_dtype)
    vc = torch.randn(num_pages, page_size, H_K, D, generator=g).to(cache_dtype)
    kd = vd = None
    if fp8:
        kd = torch.rand(num_pages, H_K, generator=g) + 0.25
        vd = torch.rand(num_pages, H_K, generator=g) + 0.25
    logical_k, logical_v, nxt = [], [], 0
    for i, n in enumerate(LENS_K):
        ids = perm[nxt:nxt + pages_per[i]]
        nxt += pages_per[i]
        table[i, :len(ids)] = ids.to(torch.int32)
        pos = torch.arange(n)
        page = ids[pos // page_size] if n else torch.zeros(0, dtype=torch.long)
        k_i, v_i = kc[page, pos % page_size].float(), vc[page, pos % page_size].float()
        if fp8:  # the stored byte times its page's descale
            k_i = k_i * kd[page].unsqueeze(-1)
            v_i = v_i * vd[page].unsqueeze(-1)
        logical_k.append(k_i)
        logical_v.append(v_i)
    return q, kc, vc, table, kd, vd, logical_k, logical_v


def check_per_sequence(out, lse, q, logical_k, logical_v, **kw):
    """Each sequence against the fp64 oracle, FlashAttention rule (naive: q's dtype)."""
    cq = cu(LENS_Q).tolist()
    assert out.shape == (q.shape[0], H, D) and out.dtype == q.dtype
    assert lse.shape == (H, q.shape[0]) and lse.dtype == torch.float32
    for i in range(len(LENS_Q)):
        q0, q1 = cq[i], cq[i + 1]
        if q1 == q0:
            continue
        q_i = q[None, q0:q1]
        k_i, v_i = logical_k[i][None].to(q.dtype), logical_v[i][None].to(q.dtype)
        if k_i.shape[1] == 0:  # no key: out 0, lse -inf
            assert torch.equal(out[q0:q1], torch.zeros_like(out[q0:q1]))
            assert bool((lse[:, q0:q1] == -math.inf).all())
            continue
        # The oracle reads the logical keys in fp64 (for FP8, byte * descale exactly).
        ref, ref_lse = attention_ref64(q_i.double(), logical_k[i][None].double(),
                                       logical_v[i][None].double(), **kw)
        naive, _ = attention_naive(q_i, k_i, v_i, **kw)
        assert_close_fa(out[None, q0:q1], naive, ref, f"out of sequence {i}")
        fin = torch.isfinite(ref_lse[0])
        assert torch.equal(torch.isinf(lse[:, q0:q1]), ~fin)
        assert max_err(lse[:, q0:q1][fin], ref_lse[0][fin]) <= 1e-4 * (1 + ref_lse.abs()[0][fin].max())


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16_cache", "fp8_cache"])
@pytest.mark.parametrize("page_size", [1, 16, 256])
def test_chunked_prefill_paged(page_size, fp8):
    q, kc, vc, table, kd, vd, lk, lv = make_batch(page_size, fp8)
    used = torch.tensor(LENS_K, dtype=torch.int32)
    out, lse = flash3.attention_varlen(q, kc, vc, cu(LENS_Q), None, max(LENS_Q), max(LENS_K),
                                       causal=True, page_table=table, seqused_k=used,
                                       k_descale=kd, v_descale=vd, return_lse=True)
    check_per_sequence(out, lse, q, lk, lv, causal=True)
    # The kv-cache call with packed queries is the same computation.
    out2, lse2 = flash3.attention_with_kvcache(q, kc, vc, cache_seqlens=used, page_table=table,
                                               cu_seqlens_q=cu(LENS_Q), max_seqlen_q=max(LENS_Q),
                                               causal=True, k_descale=kd, v_descale=vd,
                                               return_lse=True)
    assert torch.equal(out, out2) and torch.equal(lse, lse2)


def test_fp8_cache_fp32_queries_tight():
    """fp32 q on an FP8 paged cache: the tolerance is then fp32's, so a wrong descale shows."""
    q, kc, vc, table, kd, vd, lk, lv = make_batch(16, True, torch.float32, seed=5)
    used = torch.tensor(LENS_K, dtype=torch.int32)
    out, lse = flash3.attention_varlen(q, kc, vc, cu(LENS_Q), None, max(LENS_Q), 0, causal=True,
                                       page_table=table, seqused_k=used, k_descale=kd,
                                       v_descale=vd, return_lse=True)
    check_per_sequence(out, lse, q, lk, lv, causal=True)
    cq = cu(LENS_Q).tolist()
    for i in (0, 2, 4):
        ref, _ = attention_ref64(q[None, cq[i]:cq[i + 1]].double(), lk[i][None].double(),
                                 lv[i][None].double(), causal=True)
        assert max_err(out[cq[i]:cq[i + 1]], ref[0]) <= 1e-5


@pytest.mark.parametrize("kw", [dict(window_size=(50, 0)), dict(softcap=3.0, causal=True),
                                dict(window_size=(20, 4), softmax_scale=0.2), dict()])
def test_window_softcap_noncausal(kw):
    q, kc, vc, table, _, _, lk, lv = make_batch(16, False, torch.float16, seed=1)
    out, lse = flash3.attention_varlen(q, kc, vc, cu(LENS_Q), None, max(LENS_Q), 0,
                                       page_table=table, seqused_k=torch.tensor(LENS_K, dtype=torch.int32),
                                       return_lse=True, **kw)
    check_per_sequence(out, lse, q, lk, lv, **kw)


def test_contiguous_cache_kvcache_call():
    """attention_with_kvcache(cu_seqlens_q=) on a (b, capacity, ·) cache; an int cache_seqlens."""
    torch.manual_seed(2)
    lens_q, cap = [3, 0, 9, 1], 40
    q = torch.randn(sum(lens_q), H, D, dtype=torch.bfloat16)
    kc = torch.randn(4, cap, H_K, D, dtype=torch.bfloat16)
    vc = torch.randn(4, cap, H_K, D, dtype=torch.bfloat16)
    for seqlens in ([33, 5, 40, 0], 12):
        used = (torch.tensor(seqlens, dtype=torch.int32) if isinstance(seqlens, list) else seqlens)
        out = flash3.attention_with_kvcache(q, kc, vc, cache_seqlens=used, causal=True,
                                            cu_seqlens_q=cu(lens_q), max_seqlen_q=9)
        n_k = seqlens if isinstance(seqlens, list) else [seqlens] * 4
        cq = cu(lens_q).tolist()
        for i in range(4):
            if lens_q[i] == 0:
                continue
            q_i = q[None, cq[i]:cq[i + 1]]
            k_i, v_i = kc[i:i + 1, :n_k[i]], vc[i:i + 1, :n_k[i]]
            ref, _ = attention_ref64(q_i.double(), k_i.double(), v_i.double(), causal=True)
            naive, _ = attention_naive(q_i, k_i, v_i, causal=True)
            assert_close_fa(out[None, cq[i]:cq[i + 1]], naive, ref)


def test_packed_keys_with_seqused_k():
    """seqused_k without a page table: the first seqused_k[i] keys of each packed sequence."""
    torch.manual_seed(3)
    lens_q, lens_k, used = [4, 6, 2], [10, 3, 8], [7, 0, 8]
    q = torch.randn(sum(lens_q), H, D)
    k, v = torch.randn(sum(lens_k), H_K, D), torch.randn(sum(lens_k), H_K, D)
    out = flash3.attention_varlen(q, k, v, cu(lens_q), cu(lens_k), 6, 10, causal=True,
                                  seqused_k=torch.tensor(used, dtype=torch.int32))
    cq, ck = cu(lens_q).tolist(), cu(lens_k).tolist()
    for i in range(3):
        q_i = q[None, cq[i]:cq[i + 1]].double()
        k_i = k[None, ck[i]:ck[i] + used[i]].double()
        v_i = v[None, ck[i]:ck[i] + used[i]].double()
        ref, _ = attention_ref64(q_i, k_i, v_i, causal=True)
        assert max_err(out[cq[i]:cq[i + 1]], ref[0]) <= 1e-5


def test_sinks_on_a_paged_cache():
    q, kc, vc, table, _, _, lk, lv = make_batch(16, False, torch.float32, seed=4)
    sinks = torch.randn(H)
    out, lse = flash3.attention_varlen(q, kc, vc, cu(LENS_Q), None, max(LENS_Q), 0, causal=True,
                                       page_table=table, seqused_k=torch.tensor(LENS_K, dtype=torch.int32),
                                       sinks=sinks, return_lse=True)
    cq = cu(LENS_Q).tolist()
    for i in range(len(LENS_Q)):
        q0, q1 = cq[i], cq[i + 1]
        if q1 > q0:
            ref, ref_lse = sink_ref(q[None, q0:q1], lk[i][None], lv[i][None], sinks, causal=True)
            assert max_err(out[q0:q1], ref[0]) <= 1e-5
            assert max_err(lse[:, q0:q1], ref_lse[0]) <= 1e-4


def test_errors_name_the_argument():
    q, kc, vc, table, _, _, _, _ = make_batch(16, False, torch.float32)
    used = torch.tensor(LENS_K, dtype=torch.int32)
    cq = cu(LENS_Q)
    with pytest.raises(ValueError, match="cu_seqlens_k"):
        flash3.attention_varlen(q, kc, vc, cq, cu(LENS_K), 300, 2000, page_table=table,
                                seqused_k=used)
    with pytest.raises(ValueError, match="seqused_k"):
        flash3.attention_varlen(q, kc, vc, cq, None, 300, 2000, page_table=table)
    with pytest.raises(TypeError, match="seqused_k"):
        flash3.attention_varlen(q, kc, vc, cq, None, 300, 2000, page_table=table,
                                seqused_k=used.long())
    with pytest.raises(ValueError, match="max_seqlen_q"):  # a value check (CPU: validated)
        flash3.attention_varlen(q, kc, vc, cq, None, 299, 2000, page_table=table, seqused_k=used)
    with pytest.raises(ValueError, match="page_table"):
        bad = table.clone()
        bad[0, 0] = 10**6
        flash3.attention_varlen(q, kc, vc, cq, None, 300, 2000, page_table=bad, seqused_k=used)
    with pytest.raises(NotImplementedError, match="forward only"):
        flash3.attention_varlen(q.requires_grad_(), kc, vc, cq, None, 300, 2000,
                                page_table=table, seqused_k=used)
    q = q.detach()
    k_new = torch.randn(len(LENS_Q) + 1, 1, H_K, D)  # new keys take packed q's path: one per entry
    before = kc.clone()
    with pytest.raises(ValueError, match=r"k must have shape \(%d, s_new" % len(LENS_Q)):
        flash3.attention_with_kvcache(q, kc, vc, k_new, k_new, cache_seqlens=used,
                                      page_table=table, cu_seqlens_q=cq, max_seqlen_q=300)
    assert torch.equal(kc, before)
    with pytest.raises(ValueError, match="max_seqlen_q"):
        flash3.attention_with_kvcache(q, kc, vc, cache_seqlens=used, page_table=table,
                                      cu_seqlens_q=cq)
