"""FA3 arguments that run on the reference spec (flash3/reference/fa3.py), each against an fp64
computation written out here from FA3's documented meaning (hopper/flash_attn_interface.py and
the oracle of hopper/test_flash_attn.py): qv, attention_chunk, a tensor window_size, seqused_q,
cache_leftpad, cache_batch_idx with page_table, cu_seqlens_k_new, rotary_seqlens, FP8 q/k/v with
a paged cache and per-(batch, kv head) descales, fp8 rotary tables, get_scheduler_metadata."""

import math

import pytest
import torch

from flash3 import flash_attn_interface as fai


def cu(lens):
    return torch.tensor([0] + list(lens), dtype=torch.int32).cumsum(0, dtype=torch.int32)


def visible64(t, c, n_q, n_k, causal, window, chunk):
    """Key c visible to query t (both counted from the entry's first valid row/key)."""
    left, right = window
    if causal:
        right = 0
    p = t + n_k - n_q  # the query's diagonal position
    if left >= 0 and c < p - left:
        return False
    if right >= 0 and c > p + right:
        return False
    if chunk > 0:
        start = (p // chunk) * chunk  # floor division: p may be negative
        if not start <= c < start + chunk:
            return False
    return True


def entry64(q, k, v, qv, scale, causal, window, chunk, softcap=0.0):
    """q (n_q, h, d), k/v (n_k, h_k, .) fp64 -> out (n_q, h, d_v), lse (h, n_q)."""
    n_q, h, _ = q.shape
    n_k, h_k, d_v = v.shape
    out = torch.zeros(n_q, h, d_v, dtype=torch.float64)
    lse = torch.full((h, n_q), -math.inf, dtype=torch.float64)
    for hh in range(h):
        kh = hh // (h // h_k)
        for t in range(n_q):
            cols = [c for c in range(n_k) if visible64(t, c, n_q, n_k, causal, window, chunk)]
            if not cols:
                continue
            s = k[cols, kh] @ q[t, hh] * scale
            if qv is not None:
                s = s + v[cols, kh] @ qv[t, hh] * scale
            if softcap > 0:
                s = softcap * torch.tanh(s / softcap)
            m = s.max()
            w = torch.exp(s - m)
            lse[hh, t] = m + torch.log(w.sum())
            out[t, hh] = (w / w.sum()) @ v[cols, kh]
    return out, lse


def f64(*xs):
    return [None if x is None else x.to(torch.float64) for x in xs]


def assert_close(a, b, tol):
    assert a.shape == b.shape
    err = (a.to(torch.float64) - b).abs().max().item() if a.numel() else 0.0
    assert err <= tol, f"max |err| {err} > {tol}"


# ------------------------------------------------------------------ qv and attention_chunk
@pytest.mark.parametrize("d_v", [64, 256, 512])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("with_qv", [False, True])
def test_qv(d_v, causal, with_qv):
    """MLA: scores q.k + qv.v, scale 1/sqrt(d + d_v) by default; d <= 64 takes d_v up to 512,
    with or without qv."""
    torch.manual_seed(0)
    b, s_q, s_k, h, h_k, d = 2, 5, 9, 4, 2, 64
    q, qv = torch.randn(b, s_q, h, d), torch.randn(b, s_q, h, d_v) if with_qv else None
    k, v = torch.randn(b, s_k, h_k, d), torch.randn(b, s_k, h_k, d_v)
    out, lse = fai.flash_attn_func(q, k, v, causal=causal, qv=qv, return_attn_probs=True)
    scale = 1 / math.sqrt(d + (d_v if with_qv else 0))
    for i in range(b):
        o, l = entry64(*f64(q[i], k[i], v[i], qv[i] if with_qv else None), scale, causal,
                       (-1, -1), 0)
        assert_close(out[i], o, 1e-5)
        assert_close(lse[i], l, 1e-5)


@pytest.mark.parametrize("chunk", [1, 4, 7, 32])
@pytest.mark.parametrize("causal,window", [(False, (-1, -1)), (True, (-1, -1)), (True, (5, -1)),
                                           (False, (6, 2)), (False, (-1, 3))])
@pytest.mark.parametrize("s_q,s_k", [(11, 11), (6, 19), (13, 5)])
def test_attention_chunk(chunk, causal, window, s_q, s_k):
    torch.manual_seed(1)
    b, h, h_k, d = 2, 4, 2, 16
    q, k, v = torch.randn(b, s_q, h, d), torch.randn(b, s_k, h_k, d), torch.randn(b, s_k, h_k, d)
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    out, lse = fai.flash_attn_func(qg, kg, vg, causal=causal, window_size=window,
                                   attention_chunk=chunk, return_attn_probs=True)
    for i in range(b):
        o, l = entry64(*f64(q[i], k[i], v[i]), None, 1 / math.sqrt(d), causal, window, chunk)
        assert_close(out[i], o, 1e-5)
        fin = torch.isfinite(l)
        assert_close(lse[i][fin], l[fin], 1e-5)
        assert bool((lse[i][~fin] == -math.inf).all())
    # differentiable through the spec (FA3 itself has no backward with attention_chunk)
    q64, k64, v64 = (x.to(torch.float64).requires_grad_() for x in (q, k, v))
    o64 = torch.stack([entry64(q64[i], k64[i], v64[i], None, 1 / math.sqrt(d), causal, window,
                               chunk)[0] for i in range(b)])
    g = torch.randn_like(out)
    (out * g).sum().backward()
    (o64 * g.to(torch.float64)).sum().backward()
    for x, x64 in ((qg, q64), (kg, k64), (vg, v64)):
        assert_close(x.grad, x64.grad, 1e-4)


def test_tensor_window_size_and_seqused_q():
    torch.manual_seed(2)
    lq, lk, used = [7, 3, 9], [10, 4, 12], [5, 0, 9]
    h, h_k, d = 4, 1, 16
    q, k, v = torch.randn(sum(lq), h, d), torch.randn(sum(lk), h_k, d), torch.randn(sum(lk), h_k, d)
    win = torch.tensor([3, 1])
    out, lse = fai.flash_attn_varlen_func(q, k, v, cu(lq), cu(lk), max(lq), max(lk),
                                          seqused_q=torch.tensor(used, dtype=torch.int32),
                                          window_size=win, return_attn_probs=True)
    cq, ck = cu(lq), cu(lk)
    for i in range(3):
        r0 = int(cq[i])
        qi = q[r0:r0 + used[i]]
        ki, vi = k[int(ck[i]):int(ck[i + 1])], v[int(ck[i]):int(ck[i + 1])]
        o, l = entry64(*f64(qi, ki, vi), None, 1 / math.sqrt(d), False, (3, 1), 0)
        assert_close(out[r0:r0 + used[i]], o, 1e-5)
        assert_close(lse[:, r0:r0 + used[i]], l, 1e-5)
        pad = out[r0 + used[i]:int(cq[i + 1])]
        assert torch.equal(pad, torch.zeros_like(pad))  # rows past seqused_q: out 0
    same = fai.flash_attn_varlen_func(q, k, v, cq, ck, max(lq), max(lk),
                                      seqused_q=torch.tensor(used, dtype=torch.int32),
                                      window_size=(3, 1))
    assert torch.equal(out, same)


# ------------------------------------------------------------------ KV cache
def rotate64(x, pos, cos, sin, interleaved):
    """x (n, h, d) fp64 at positions pos (n,): the first 2 * cos.shape[1] channels rotated."""
    half = cos.shape[1]
    x = x.clone()
    for n in range(x.shape[0]):
        c, s_ = cos[pos[n]].to(torch.float64), sin[pos[n]].to(torch.float64)
        for j in range(half):
            a, bb = (2 * j, 2 * j + 1) if interleaved else (j, j + half)
            x0, x1 = x[n, :, a].clone(), x[n, :, bb].clone()
            x[n, :, a] = x0 * c[j] - x1 * s_[j]
            x[n, :, bb] = x0 * s_[j] + x1 * c[j]
    return x


def paged(cache_rows, page_size, num_pages, perm):
    """Lay contiguous cache rows (R, cap, h, d) out as pages: row r's page j is perm[r * P + j]."""
    R, cap, h_k, d = cache_rows.shape
    P = cap // page_size
    pages = torch.randn(num_pages, page_size, h_k, d).to(cache_rows.dtype)
    table = perm[:R * P].view(R, P).to(torch.int32)
    for r in range(R):
        for j in range(P):
            pages[table[r, j]] = cache_rows[r, j * page_size:(j + 1) * page_size]
    return pages, table


@pytest.mark.parametrize("paged_cache", [False, True])
@pytest.mark.parametrize("varlen", [False, True])
@pytest.mark.parametrize("causal,window,chunk", [(True, (-1, -1), 0), (False, (4, 1), 0),
                                                 (True, (-1, -1), 5), (False, (-1, -1), 0)])
@pytest.mark.parametrize("rotary", [None, "neox", "gptj"])
@pytest.mark.parametrize("qv", [False, True])
def test_kvcache(paged_cache, varlen, causal, window, chunk, rotary, qv):
    """cache_leftpad, cache_batch_idx (with page_table when paged), cu_seqlens_k_new with packed
    q, rotary_seqlens, attention_chunk and qv, against the fp64 entry-by-entry computation."""
    torch.manual_seed(3)
    b, R, cap, h, h_k, d = 3, 5, 24, 4, 2, 32
    d_v = 128 if qv else d
    s_q, s_new = 4, 3
    caches = torch.randn(R, cap, h_k, d), torch.randn(R, cap, h_k, d_v)
    batch_idx = torch.tensor([3, 0, 4], dtype=torch.int32)
    lens = torch.tensor([9, 2, 15], dtype=torch.int32)
    leftpad = torch.tensor([4, 0, 7], dtype=torch.int32)
    rot_lens = torch.tensor([1, 6, 2], dtype=torch.int32)
    if varlen:
        lq, ln = [4, 1, 3], [3, 0, 2]
        q = torch.randn(sum(lq), h, d)
        qv_t = torch.randn(sum(lq), h, d_v) if qv else None
        knew, vnew = torch.randn(sum(ln), h_k, d), torch.randn(sum(ln), h_k, d_v)
        cu_q, cu_new = cu(lq), cu(ln)
    else:
        lq, ln = [s_q] * b, [s_new] * b
        q = torch.randn(b, s_q, h, d)
        qv_t = torch.randn(b, s_q, h, d_v) if qv else None
        knew, vnew = torch.randn(b, s_new, h_k, d), torch.randn(b, s_new, h_k, d_v)
        cu_q = cu_new = None
    cos = sin = None
    if rotary:
        ang = torch.rand(cap + 8, 8) * 2 * math.pi
        cos, sin = torch.cos(ang), torch.sin(ang)
    kw = {}
    if paged_cache:
        perm = torch.randperm(R * cap // 4 + 3)
        k_cache, table = paged(caches[0], 4, R * cap // 4 + 3, perm)
        v_cache, _ = paged(caches[1], 4, R * cap // 4 + 3, perm)
        kw["page_table"] = table
    else:
        k_cache, v_cache = caches[0].clone(), caches[1].clone()
    out, lse, *_ = fai.flash_attn_with_kvcache(
        q, k_cache, v_cache, knew, vnew, qv=qv_t, rotary_cos=cos, rotary_sin=sin,
        cache_seqlens=lens, cache_batch_idx=batch_idx, cache_leftpad=leftpad, **kw,
        cu_seqlens_q=cu_q, cu_seqlens_k_new=cu_new, max_seqlen_q=max(lq) if varlen else None,
        rotary_seqlens=rot_lens if rotary else None, causal=causal, window_size=window,
        attention_chunk=chunk, rotary_interleaved=rotary == "gptj", return_softmax_lse=True)
    scale = 1 / math.sqrt(d + (d_v if qv else 0))
    positional = causal or window != (-1, -1) or chunk > 0
    k_after = k_cache if not paged_cache else torch.stack(
        [k_cache[kw["page_table"][r].long()].reshape(cap, h_k, d) for r in range(R)])
    v_after = v_cache if not paged_cache else torch.stack(
        [v_cache[kw["page_table"][r].long()].reshape(cap, h_k, d_v) for r in range(R)])
    rq, rn = 0, 0
    for i in range(b):
        r, L, lp = int(batch_idx[i]), int(lens[i]), int(leftpad[i])
        kc, vc = f64(caches[0][r], caches[1][r])
        kn, vn = f64(knew[rn:rn + ln[i]] if varlen else knew[i], vnew[rn:rn + ln[i]] if varlen else vnew[i])
        qi = (q[rq:rq + lq[i]] if varlen else q[i]).to(torch.float64)
        qvi = None if not qv else (qv_t[rq:rq + lq[i]] if varlen else qv_t[i]).to(torch.float64)
        if rotary:
            base = int(rot_lens[i])
            kn = rotate64(kn, [base + t for t in range(ln[i])], cos, sin, rotary == "gptj")
            qi = rotate64(qi, [base + (t if positional else 0) for t in range(lq[i])], cos, sin,
                          rotary == "gptj")
        kc[L:L + ln[i]], vc[L:L + ln[i]] = kn, vn
        # the append landed in cache row r (slots L..), every other slot untouched
        assert_close(k_after[r], kc, 1e-6)
        assert_close(v_after[r], vc, 0.0)
        o, l = entry64(qi, kc[lp:L + ln[i]], vc[lp:L + ln[i]], qvi, scale, causal, window, chunk)
        got_o = out[rq:rq + lq[i]] if varlen else out[i]
        got_l = lse[:, rq:rq + lq[i]] if varlen else lse[i]
        assert_close(got_o, o, 2e-5)
        fin = torch.isfinite(l)
        assert_close(got_l[fin], l[fin], 2e-5)
        if varlen:
            rq, rn = rq + lq[i], rn + ln[i]
    untouched = [r for r in range(R) if r not in batch_idx.tolist()]
    for r in untouched:
        assert torch.equal(k_after[r], caches[0][r]) and torch.equal(v_after[r], caches[1][r])


@pytest.mark.parametrize("new_kv", [False, True])
def test_fp8_paged_cache_with_descales_and_fp8_rotary(new_kv):
    """FP8 q/k/v, a paged cache, FA3's per-(batch, kv head) descales, rotary tables in fp8."""
    torch.manual_seed(4)
    b, cap, h, h_k, d, ps = 2, 16, 4, 2, 32, 4
    f8 = torch.float8_e4m3fn
    rows = torch.randn(b, cap, h_k, d).to(f8), torch.randn(b, cap, h_k, d).to(f8)
    perm = torch.randperm(b * cap // ps + 2)
    k_cache, table = paged(rows[0], ps, b * cap // ps + 2, perm)
    v_cache, _ = paged(rows[1], ps, b * cap // ps + 2, perm)
    q = torch.randn(b, 3, h, d).to(f8)
    knew, vnew = (torch.randn(b, 3, h_k, d).to(f8) for _ in range(2)) if new_kv else (None, None)
    qd, kd, vd = (torch.rand(b, h_k) * 2 + 0.1 for _ in range(3))
    lens = torch.tensor([5, 11], dtype=torch.int32)
    cos = sin = None
    if new_kv:
        ang = torch.rand(cap, 8) * 2 * math.pi
        cos, sin = torch.cos(ang).to(f8), torch.sin(ang).to(f8)
    out = fai.flash_attn_with_kvcache(q, k_cache, v_cache, knew, vnew, rotary_cos=cos,
                                      rotary_sin=sin, cache_seqlens=lens, page_table=table,
                                      q_descale=qd, k_descale=kd, v_descale=vd, causal=True,
                                      rotary_interleaved=False)
    assert out.dtype == torch.bfloat16
    for i in range(b):
        L = int(lens[i])
        kc, vc = f64(rows[0][i], rows[1][i])
        qi = q[i].to(torch.float64)
        n_new = 0
        if new_kv:
            n_new = 3
            kn = rotate64(knew[i].to(torch.float64), [L + t for t in range(3)], cos, sin, False)
            qi = rotate64(qi, [L + t for t in range(3)], cos, sin, False)
            # stored and read back in the cache's dtype (FA3 writes fp8), q rounded to fp8
            kc[L:L + 3] = kn.to(f8).to(torch.float64)
            vc[L:L + 3] = vnew[i].to(torch.float64)
            qi = qi.to(f8).to(torch.float64)
        qi = qi * qd[i].repeat_interleave(h // h_k).to(torch.float64).view(1, h, 1)
        kc = kc * kd[i].to(torch.float64).view(1, h_k, 1)
        vc = vc * vd[i].to(torch.float64).view(1, h_k, 1)
        o, _ = entry64(qi, kc[:L + n_new], vc[:L + n_new], None, 1 / math.sqrt(d), True,
                       (-1, -1), 0)
        assert_close(out[i], o, 2e-2 * max(1.0, o.abs().max().item()))  # bf16 output


def test_get_scheduler_metadata_round_trip():
    torch.manual_seed(5)
    b, cap, h, h_k, d = 2, 16, 4, 2, 32
    q = torch.randn(b, 1, h, d)
    kc, vc = torch.randn(b, cap, h_k, d), torch.randn(b, cap, h_k, d)
    lens = torch.tensor([3, 16], dtype=torch.int32)
    md = fai.get_scheduler_metadata(b, 1, cap, h, h_k, d, lens, torch.float32, causal=True)
    assert md.dtype == torch.int32 and md.dim() == 1
    a = fai.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True)
    m = fai.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True,
                                    scheduler_metadata=md)
    assert torch.equal(a, m)


def _spy_splits(monkeypatch):
    """Records the num_splits each flash_attn_with_kvcache call hands flash3's decode call."""
    seen = []
    real = fai.attention_with_kvcache

    def spy(*args, **kw):
        seen.append(kw["num_splits"])
        return real(*args, **kw)
    monkeypatch.setattr(fai, "attention_with_kvcache", spy)
    return seen


def _md_problem(seed=7):
    torch.manual_seed(seed)
    b, cap, h, h_k, d = 2, 16, 4, 2, 32
    q = torch.randn(b, 1, h, d)
    kc, vc = torch.randn(b, cap, h_k, d), torch.randn(b, cap, h_k, d)
    return q, kc, vc, torch.tensor([3, 16], dtype=torch.int32)


def test_scheduler_metadata_num_splits_reaches_the_decode_call(monkeypatch):
    """FA3's use (vLLM, SGLang): the metadata is made once, with its num_splits, and passed back
    on every call; its split count reaches flash3's decode call where the call gives none (0),
    the call's own otherwise; no host read of the tensor (it is only read host-side)."""
    q, kc, vc, lens = _md_problem()
    b, cap, h, h_k, d = *kc.shape[:2], q.shape[2], kc.shape[2], q.shape[3]
    md = fai.get_scheduler_metadata(b, 1, cap, h, h_k, d, lens, torch.float32, causal=True,
                                    num_splits=3)
    seen = _spy_splits(monkeypatch)
    ref = fai.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True, num_splits=3)
    outs = [fai.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True,
                                        scheduler_metadata=md) for _ in range(2)]  # reused
    own = fai.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True,
                                      scheduler_metadata=md, num_splits=2)
    assert seen == [3, 3, 3, 2]
    for o in outs:
        assert torch.equal(o, ref)  # the same split count: the same result, bit for bit
    assert_close(own, ref, 1e-5)  # another split count: rounding only
    # num_splits=0 in the metadata: flash3 chooses (0 reaches the decode call)
    md0 = fai.get_scheduler_metadata(b, 1, cap, h, h_k, d, lens, torch.float32)
    fai.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, scheduler_metadata=md0)
    assert seen[-1] == 0


@pytest.mark.parametrize("field", ["batch_size", "max_seqlen_q", "num_heads_q", "num_heads_kv",
                                   "headdim", "headdim_v"])
def test_scheduler_metadata_for_another_problem_is_refused(field, monkeypatch):
    q, kc, vc, lens = _md_problem()
    args = dict(batch_size=2, max_seqlen_q=1, max_seqlen_k=16, num_heads_q=4, num_heads_kv=2,
                headdim=32, headdim_v=32)
    args[field] *= 2
    md = fai.get_scheduler_metadata(cache_seqlens=lens, qkv_dtype=torch.float32, num_splits=2,
                                    **args)
    seen = _spy_splits(monkeypatch)
    k_new = torch.randn(2, 1, 2, 32)
    before = kc.clone()
    with pytest.raises(ValueError, match=f"scheduler_metadata.*{field}"):
        fai.flash_attn_with_kvcache(q, kc, vc, k_new, k_new.clone(), cache_seqlens=lens,
                                    scheduler_metadata=md)
    assert not seen and torch.equal(kc, before)  # refused before anything ran or was written


def test_scheduler_metadata_packed_queries_check_max_seqlen_q(monkeypatch):
    torch.manual_seed(8)
    lq, cap, h, h_k, d = [2, 3], 16, 4, 2, 32
    q = torch.randn(sum(lq), h, d)
    kc, vc = torch.randn(2, cap, h_k, d), torch.randn(2, cap, h_k, d)
    lens = torch.tensor([5, 9], dtype=torch.int32)
    md = fai.get_scheduler_metadata(2, 3, cap, h, h_k, d, lens, torch.float32, cu_seqlens_q=cu(lq),
                                    num_splits=2)
    seen = _spy_splits(monkeypatch)
    fai.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, cu_seqlens_q=cu(lq),
                                max_seqlen_q=3, scheduler_metadata=md)
    assert seen == [2]
    with pytest.raises(ValueError, match="scheduler_metadata.*max_seqlen_q=3"):
        fai.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, cu_seqlens_q=cu(lq),
                                    max_seqlen_q=4, scheduler_metadata=md)


def test_scheduler_metadata_without_a_plan_is_ignored(monkeypatch):
    """A tensor get_scheduler_metadata did not return (vLLM copies the metadata into a
    persistent buffer for CUDA graphs and passes a slice of it) carries no plan: accepted and
    ignored, the call's num_splits as given."""
    q, kc, vc, lens = _md_problem()
    md = fai.get_scheduler_metadata(2, 1, 16, 4, 2, 32, lens, torch.float32, num_splits=3)
    buf = torch.zeros(16, dtype=torch.int32)
    buf[:md.shape[0]] = md
    seen = _spy_splits(monkeypatch)
    fai.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, scheduler_metadata=buf[:md.shape[0]])
    fai.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, scheduler_metadata=md.clone())
    assert seen == [0, 0]
    with pytest.raises(ValueError, match="scheduler_metadata"):  # still a 1-D tensor
        fai.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, scheduler_metadata=buf.view(4, 4))


def test_seqused_k_with_grad():
    """seqused_k with tensors that need grad: flash3's varlen path, differentiable (the backward
    on the used keys gathered), against the fp64 spec."""
    torch.manual_seed(6)
    lq, lk, used = [4, 6], [9, 7], [5, 7]
    h, d = 2, 16
    q, k, v = torch.randn(sum(lq), h, d), torch.randn(sum(lk), h, d), torch.randn(sum(lk), h, d)
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    out = fai.flash_attn_varlen_func(qg, kg, vg, cu(lq), cu(lk), max(lq), max(lk),
                                     seqused_k=torch.tensor(used, dtype=torch.int32), causal=True)
    q64, k64, v64 = (x.to(torch.float64).requires_grad_() for x in (q, k, v))
    cq, ck = cu(lq), cu(lk)
    ref = []
    for i in range(2):
        k0 = int(ck[i])
        o, _ = entry64(q64[int(cq[i]):int(cq[i + 1])], k64[k0:k0 + used[i]], v64[k0:k0 + used[i]],
                       None, 1 / math.sqrt(d), True, (-1, -1), 0)
        ref.append(o)
    ref = torch.cat(ref)
    assert_close(out.detach(), ref.detach(), 1e-5)
    g = torch.randn_like(out)
    (out * g).sum().backward()
    (ref * g.to(torch.float64)).sum().backward()
    for x, x64 in ((qg, q64), (kg, k64), (vg, v64)):
        assert_close(x.grad, x64.grad, 1e-4)


# ------------------------------------------- arguments flash3's own kv-cache path takes from FA3
@pytest.mark.parametrize("causal", [False, True])
def test_rotary_seqlens_and_unused_cu_seqlens_k_new_take_flash3s_path(causal, monkeypatch):
    """rotary_seqlens runs flash3's kv-cache path (the fused append on CUDA), not the spec, and
    places the rotary embedding of the new keys (and of q) at rotary_seqlens[i] + t while the keys
    are stored at cache_seqlens[i] + t; cu_seqlens_k_new without new keys is unused (FA3 reads it
    only with k_new: hopper/flash_api.cpp), as SGLang passes it on every call."""
    def no_spec(*a, **k):
        raise AssertionError("the FA3 spec ran")
    monkeypatch.setattr(fai, "_on_reference", no_spec)
    torch.manual_seed(8)
    b, cap, h, h_k, d, s_new = 3, 20, 4, 2, 32, 2
    s_q = s_new
    caches = torch.randn(b, cap, h_k, d), torch.randn(b, cap, h_k, d)
    q, knew, vnew = torch.randn(b, s_q, h, d), torch.randn(b, s_new, h_k, d), torch.randn(b, s_new, h_k, d)
    lens = torch.tensor([0, 7, 18], dtype=torch.int32)
    ro = torch.tensor([11, 2, 0], dtype=torch.int32)  # not the key positions
    ang = torch.rand(cap + 4, 8) * 2 * math.pi
    cos, sin = torch.cos(ang), torch.sin(ang)
    k_cache, v_cache = caches[0].clone(), caches[1].clone()
    out, lse, *_ = fai.flash_attn_with_kvcache(q, k_cache, v_cache, knew, vnew, rotary_cos=cos,
                                               rotary_sin=sin, cache_seqlens=lens,
                                               rotary_seqlens=ro, causal=causal,
                                               rotary_interleaved=False, return_softmax_lse=True)
    for i in range(b):
        L, base = int(lens[i]), int(ro[i])
        kc, vc = f64(caches[0][i], caches[1][i])
        kn = rotate64(knew[i].to(torch.float64), [base + t for t in range(s_new)], cos, sin, False)
        qi = rotate64(q[i].to(torch.float64), [base + (t if causal else 0) for t in range(s_q)], cos,
                      sin, False)
        kc[L:L + s_new], vc[L:L + s_new] = kn, vnew[i].to(torch.float64)
        assert_close(k_cache[i], kc, 1e-6)
        o, l = entry64(qi, kc[:L + s_new], vc[:L + s_new], None, 1 / math.sqrt(d), causal,
                       (-1, -1), 0)
        assert_close(out[i], o, 2e-5)
        assert_close(lse[i], l, 2e-5)
    # cu_seqlens_k_new (any value: unused) with no new keys, packed queries on the cache
    lq = [2, 0, 3]
    qp = torch.randn(sum(lq), h, d)
    got = fai.flash_attn_with_kvcache(qp, k_cache, v_cache, cache_seqlens=lens + s_new,
                                      cu_seqlens_q=cu(lq), cu_seqlens_k_new=cu([5, 5, 5]),
                                      max_seqlen_q=max(lq), causal=causal)
    want = fai.flash_attn_with_kvcache(qp, k_cache, v_cache, cache_seqlens=lens + s_new,
                                       cu_seqlens_q=cu(lq), max_seqlen_q=max(lq), causal=causal)
    assert torch.equal(got, want)


def test_rotary_seqlens_checks():
    """A wrong rotary_seqlens is a clear error naming it, and the caches stay untouched."""
    import flash3
    b, cap, h, d = 2, 8, 2, 16
    q, k, v = torch.randn(b, 1, h, d), torch.randn(b, 1, h, d), torch.randn(b, 1, h, d)
    kc, vc = torch.randn(b, cap, h, d), torch.randn(b, cap, h, d)
    kc0, vc0 = kc.clone(), vc.clone()
    cos = sin = torch.ones(cap + 1, 4)
    lens = torch.tensor([1, 2], dtype=torch.int32)
    bad = [(dict(rotary_seqlens=torch.tensor([1, 2])), "rotary_seqlens must be int32"),
           (dict(rotary_seqlens=torch.tensor([1], dtype=torch.int32)), "rotary_seqlens must be int32 of shape"),
           (dict(rotary_seqlens=torch.tensor([1, 2], dtype=torch.int32), rotary_cos=None, rotary_sin=None),
            "rotary_seqlens needs rotary_cos"),
           (dict(rotary_seqlens=torch.tensor([-1, 2], dtype=torch.int32)), r"rotary_seqlens\[0\] is negative"),
           (dict(rotary_seqlens=torch.tensor([1, cap + 1], dtype=torch.int32)), r"rotary_seqlens\[1\] = 9")]
    for kw, msg in bad:
        args = dict(cache_seqlens=lens, rotary_cos=cos, rotary_sin=sin, causal=True)
        args.update(kw)
        with pytest.raises(ValueError, match=msg):
            flash3.attention_with_kvcache(q, kc, vc, k, v, **args)
        assert torch.equal(kc, kc0) and torch.equal(vc, vc0)


@pytest.mark.parametrize("new_kv", [False, True])
def test_cache_batch_idx_with_page_table_takes_flash3s_path(new_kv, monkeypatch):
    """cache_batch_idx with page_table: row i reads and appends through page-table row
    cache_batch_idx[i] on flash3's own path (not the spec); other rows' pages stay untouched; an
    index outside the table is an error naming cache_batch_idx (validation: CPU tensors)."""
    def no_spec(*a, **k):
        raise AssertionError("the FA3 spec ran")
    monkeypatch.setattr(fai, "_on_reference", no_spec)
    torch.manual_seed(9)
    b, R, cap, ps, h, h_k, d, s_new = 3, 5, 16, 4, 4, 2, 32, 2
    rows = torch.randn(R, cap, h_k, d), torch.randn(R, cap, h_k, d)
    n_pages = R * cap // ps + 3
    perm = torch.randperm(n_pages)
    k_cache, table = paged(rows[0], ps, n_pages, perm)
    v_cache, _ = paged(rows[1], ps, n_pages, perm)
    k0, v0 = k_cache.clone(), v_cache.clone()
    idx = torch.tensor([4, 1, 2], dtype=torch.int32)
    lens = torch.tensor([3, 9, 14 - (s_new if new_kv else 0)], dtype=torch.int32)
    q = torch.randn(b, 2, h, d)
    knew, vnew = ((torch.randn(b, s_new, h_k, d), torch.randn(b, s_new, h_k, d)) if new_kv
                  else (None, None))
    out = fai.flash_attn_with_kvcache(q, k_cache, v_cache, knew, vnew, cache_seqlens=lens,
                                      page_table=table, cache_batch_idx=idx, causal=True)
    n = s_new if new_kv else 0
    for i in range(b):
        r, L = int(idx[i]), int(lens[i])
        kc, vc = f64(rows[0][r], rows[1][r])
        if new_kv:
            kc[L:L + n], vc[L:L + n] = f64(knew[i], vnew[i])
        got_k = k_cache[table[r].long()].reshape(cap, h_k, d)
        assert_close(got_k, kc, 1e-6)
        o, _ = entry64(q[i].to(torch.float64), kc[:L + n], vc[:L + n], None, 1 / math.sqrt(d), True,
                       (-1, -1), 0)
        assert_close(out[i], o, 2e-5)
    for r in set(range(R)) - set(idx.tolist()):  # rows no batch entry names: untouched
        pages = table[r].long()
        assert torch.equal(k_cache[pages], k0[pages]) and torch.equal(v_cache[pages], v0[pages])
    with pytest.raises(ValueError, match=r"cache_batch_idx\[1\] = 5"):
        fai.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens, page_table=table,
                                    cache_batch_idx=torch.tensor([0, 5, 1], dtype=torch.int32))


def test_gather_page_rows_gives_bad_indices_no_pages(monkeypatch):
    """With validation off (a CUDA call), an index outside the table selects no page at all: a row
    of page ids -1, which the decode kernel reads as zeros and the append never writes."""
    from flash3 import validation
    monkeypatch.setattr(validation, "_FORCE", False)
    table = torch.arange(12, dtype=torch.int32).view(4, 3)
    got = fai._gather_page_rows(table, torch.tensor([2, -1, 4, 0], dtype=torch.int32))
    assert got.dtype == torch.int32
    assert got.tolist() == [[6, 7, 8], [-1, -1, -1], [-1, -1, -1], [0, 1, 2]]
    none = fai._gather_page_rows(table[:0], torch.tensor([0, 3], dtype=torch.int32))  # an empty table
    assert none.dtype == torch.int32 and none.tolist() == [[-1, -1, -1], [-1, -1, -1]]
