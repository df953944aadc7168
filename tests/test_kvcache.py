"""attention_with_kvcache: in-place appends, contiguous and paged caches."""

import pytest
import torch

import flash3
from flash3 import reference
from helpers import attention_ref64, assert_close_fa, attention_naive


@pytest.fixture(autouse=True)
def small_tiles(monkeypatch):
    monkeypatch.setattr(reference, "BLOCK_M", 16)
    monkeypatch.setattr(reference, "BLOCK_N", 32)


def shuffled_table(b, capacity, page_size, gen):
    """A page table with shuffled pages, plus a few pages nobody uses."""
    per_row = -(-capacity // page_size)
    num_pages = b * per_row + 3
    table = torch.randperm(num_pages, generator=gen)[: b * per_row].view(b, per_row)
    return table.to(torch.int32), num_pages


def to_pages(cache, page_size, table, num_pages, gen):
    """Scatter a (b, capacity, h, d) cache into the pages named by ``table``."""
    b, cap, h, d = cache.shape
    per_row = table.shape[1]
    pages = torch.randn(num_pages, page_size, h, d, dtype=cache.dtype, generator=gen)
    padded = torch.randn(b, per_row * page_size, h, d, dtype=cache.dtype, generator=gen)
    padded[:, :cap] = cache
    pages[table.flatten().long()] = padded.view(b * per_row, page_size, h, d)
    return pages


def expected(q, k_cache, v_cache, k, v, seqlens, **kw):
    """Per row: the cache prefix + new keys, attended with the fp64 oracle and naive."""
    outs, naives = [], []
    for i in range(q.shape[0]):
        n = int(seqlens[i])
        ki, vi = k_cache[i:i + 1, :n], v_cache[i:i + 1, :n]
        if k is not None:
            ki, vi = torch.cat([ki, k[i:i + 1]], 1), torch.cat([vi, v[i:i + 1]], 1)
        outs.append(attention_ref64(q[i:i + 1].double(), ki.double(), vi.double(), **kw)[0])
        naives.append(attention_naive(q[i:i + 1], ki, vi, **kw)[0])
    return torch.cat(outs), torch.cat(naives)


CASES = [  # (b, s_q, s_new, capacity, h, h_k, d, d_v, kwargs)
    (3, 1, 1, 40, 4, 2, 16, 16, dict()),
    (2, 4, 3, 50, 2, 1, 16, 8, dict(causal=True)),
    (2, 5, 0, 37, 2, 2, 8, 8, dict(causal=True, window_size=(6, -1), softcap=3.0)),
    (1, 7, 7, 64, 4, 4, 16, 16, dict(window_size=(3, 2))),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("page_size", [None, 1, 3, 16], ids=lambda p: f"page{p}")
@pytest.mark.parametrize("case", range(len(CASES)))
def test_kvcache(dtype, page_size, case):
    b, s_q, s_new, cap, h, h_k, d, d_v, kw = CASES[case]
    gen = torch.Generator().manual_seed(case)
    q = torch.randn(b, s_q, h, d, dtype=dtype, generator=gen)
    k_cache = torch.randn(b, cap, h_k, d, dtype=dtype, generator=gen)
    v_cache = torch.randn(b, cap, h_k, d_v, dtype=dtype, generator=gen)
    k = v = None
    if s_new:
        k = torch.randn(b, s_new, h_k, d, dtype=dtype, generator=gen)
        v = torch.randn(b, s_new, h_k, d_v, dtype=dtype, generator=gen)
    seqlens = torch.randint(0, cap - s_new + 1, (b,), generator=gen, dtype=torch.int32)
    seqlens[0] = cap - s_new  # one row filled to the brim
    ref, naive = expected(q, k_cache, v_cache, k, v, seqlens, **kw)

    want_k, want_v = k_cache.clone(), v_cache.clone()
    for i in range(b):  # where the new keys must land
        n = int(seqlens[i])
        if s_new:
            want_k[i, n:n + s_new], want_v[i, n:n + s_new] = k[i], v[i]

    if page_size is None:
        out, lse = flash3.attention_with_kvcache(q, k_cache, v_cache, k, v,
                                                 cache_seqlens=seqlens, return_lse=True, **kw)
        assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)
    else:
        table, num_pages = shuffled_table(b, cap, page_size, gen)
        kp = to_pages(k_cache, page_size, table, num_pages, gen)
        vp = to_pages(v_cache, page_size, table, num_pages, gen)
        out, lse = flash3.attention_with_kvcache(q, kp, vp, k, v, cache_seqlens=seqlens,
                                                 page_table=table, return_lse=True, **kw)
        for i in range(b):  # read the pages back in order
            rows_k = kp[table[i].long()].flatten(0, 1)[:cap]
            rows_v = vp[table[i].long()].flatten(0, 1)[:cap]
            assert torch.equal(rows_k, want_k[i]) and torch.equal(rows_v, want_v[i])
    assert out.shape == (b, s_q, h, d_v) and lse.shape == (b, h, s_q)
    assert_close_fa(out, naive, ref)


def test_int_cache_seqlens_and_num_splits():
    q = torch.randn(2, 1, 2, 8)
    kc, vc = torch.randn(2, 10, 2, 8), torch.randn(2, 10, 2, 8)
    a = flash3.attention_with_kvcache(q, kc, vc, cache_seqlens=6, num_splits=4)
    b = flash3.attention_with_kvcache(q, kc, vc, cache_seqlens=torch.full((2,), 6, dtype=torch.int32))
    torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)  # splits change rounding only
    ref = attention_ref64(q.double(), kc[:, :6].double(), vc[:, :6].double())[0]
    assert (a.double() - ref).abs().max() < 1e-5


def test_empty_cache_row():
    q = torch.randn(2, 3, 2, 8)
    kc, vc = torch.randn(2, 10, 2, 8), torch.randn(2, 10, 2, 8)
    seqlens = torch.tensor([0, 4], dtype=torch.int32)
    out, lse = flash3.attention_with_kvcache(q, kc, vc, cache_seqlens=seqlens, return_lse=True)
    assert torch.all(out[0] == 0) and torch.all(lse[0] == float("-inf"))
    assert torch.isfinite(lse[1]).all()


# ----------------------------------------------------------------- cache_leftpad (FA3)
@pytest.mark.parametrize("page_size", [None, 3, 16], ids=lambda p: f"page{p}")
@pytest.mark.parametrize("kw", [dict(), dict(causal=True), dict(window_size=(4, 1)),
                                dict(causal=True, num_splits=3)],
                         ids=["full", "causal", "local", "causal_splits"])
def test_cache_leftpad(page_size, kw, monkeypatch):
    """Row i sees cache positions [leftpad[i], cache_seqlens[i] + s_new): the masks count keys
    from leftpad[i] (bottom-right alignment on that count); new keys land at cache_seqlens[i] + t
    and are rotated there (FA3's seqlen_rotary). A leftpad equal to the key count: no keys."""
    monkeypatch.setattr(reference, "SPLIT_BLOCK_N", 4)  # several key blocks per split
    gen = torch.Generator().manual_seed(11)
    b, s_q, s_new, cap, h, h_k, d = 4, 3, 2, 40, 4, 2, 16
    q = torch.randn(b, s_q, h, d, generator=gen)
    k_cache, v_cache = torch.randn(b, cap, h_k, d, generator=gen), torch.randn(b, cap, h_k, d, generator=gen)
    k, v = torch.randn(b, s_new, h_k, d, generator=gen), torch.randn(b, s_new, h_k, d, generator=gen)
    seqlens = torch.tensor([20, 9, 30, 5], dtype=torch.int32)
    leftpad = torch.tensor([0, 7, 13, 7], dtype=torch.int32)  # row 3: 5 + 2 keys, all padding
    ang = torch.arange(64.0)[:, None] * torch.tensor([1.0, 0.3, 0.1, 0.03])[None]
    cos, sin = ang.cos(), ang.sin()
    local = "causal" in kw or "window_size" in kw
    from flash3.rotary import kvcache_rotary
    q_ro, k_ro = kvcache_rotary(q, k, seqlens, cos, sin, False, local)  # absolute positions
    full_k, full_v = k_cache.clone(), v_cache.clone()
    for i in range(b):
        n = int(seqlens[i])
        full_k[i, n:n + s_new], full_v[i, n:n + s_new] = k_ro[i], v[i]
    mask = {x: kw[x] for x in ("causal", "window_size") if x in kw}
    if page_size is None:
        kc, vc, extra = k_cache.clone(), v_cache.clone(), {}
    else:
        table, num_pages = shuffled_table(b, cap, page_size, gen)
        kc, vc = (to_pages(x, page_size, table, num_pages, gen) for x in (k_cache, v_cache))
        extra = dict(page_table=table)
    out, lse = flash3.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=seqlens,
                                             cache_leftpad=leftpad, rotary_cos=cos,
                                             rotary_sin=sin, return_lse=True, **extra, **kw)
    for i in range(b):
        lp, end = int(leftpad[i]), int(seqlens[i]) + s_new
        if lp == end:
            assert torch.all(out[i] == 0) and torch.all(lse[i] == float("-inf"))
            continue
        ki, vi = full_k[i:i + 1, lp:end].double(), full_v[i:i + 1, lp:end].double()
        ref, ref_lse = attention_ref64(q_ro[i:i + 1].double(), ki, vi, **mask)
        assert (out[i].double() - ref[0]).abs().max() < 1e-5, i
        fin = torch.isfinite(ref_lse[0])
        assert torch.equal(fin, torch.isfinite(lse[i]))
        assert (lse[i][fin].double() - ref_lse[0][fin]).abs().max() < 1e-5, i


def test_cache_leftpad_errors():
    """cache_leftpad: int32 (b,) on q's device, values in [0, cache_seqlens + s_new] (validation
    mode); no packed queries. A rejected call leaves the caches untouched."""
    q = torch.randn(2, 1, 2, 8)
    kc, vc = torch.randn(2, 10, 2, 8), torch.randn(2, 10, 2, 8)
    k, v = torch.randn(2, 1, 2, 8), torch.randn(2, 1, 2, 8)
    lens = torch.tensor([3, 5], dtype=torch.int32)
    before = kc.clone(), vc.clone()
    call = lambda lp, **kw: flash3.attention_with_kvcache(  # noqa: E731
        q, kc, vc, k, v, cache_seqlens=lens, cache_leftpad=lp, **kw)
    with pytest.raises(ValueError, match="cache_leftpad must be int32"):
        call(torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="cache_leftpad must be int32 of shape"):
        call(torch.zeros(3, dtype=torch.int32))
    with pytest.raises(ValueError, match="cache_leftpad"):
        call(torch.zeros(2, 1, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"cache_leftpad\[0\] = -1 is outside"):
        call(torch.tensor([-1, 0], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"cache_leftpad\[1\] = 7 is outside"):
        call(torch.tensor([0, 7], dtype=torch.int32))  # 5 + 1 keys
    # with packed queries (flash3's packed-query path takes cache_leftpad): the same checks
    packed = lambda lp: flash3.attention_with_kvcache(  # noqa: E731
        q[:, 0], kc, vc, cache_seqlens=lens, cache_leftpad=lp,
        cu_seqlens_q=torch.tensor([0, 1, 2], dtype=torch.int32), max_seqlen_q=1)
    with pytest.raises(ValueError, match=r"cache_leftpad must be int32 of shape \(2,\)"):
        packed(torch.zeros(3, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"cache_leftpad\[1\] = 6 is outside"):
        packed(torch.tensor([0, 6], dtype=torch.int32))  # 5 keys, no new ones
    assert torch.equal(kc, before[0]) and torch.equal(vc, before[1])
    out = call(torch.tensor([4, 6], dtype=torch.int32))  # the whole row padded: no keys
    assert torch.all(out == 0)


# ----------------------------------------------------------------- FP8 cache
FP8 = torch.float8_e4m3fn


def fp8_cache(shape, descale, gen):
    """A random FP8 cache whose values dequantize to roughly N(0, 1)."""
    x = torch.randn(*shape, generator=gen)
    return reference.quantize_fp8_cache(x, descale[:, None, :])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("page_size", [None, 4], ids=lambda p: f"page{p}")
@pytest.mark.parametrize("kw", [dict(), dict(causal=True), dict(window_size=(5, 0), softcap=2.0)],
                         ids=["full", "causal", "local_softcap"])
def test_fp8_cache_against_fp64(dtype, page_size, kw):
    gen = torch.Generator().manual_seed(7)
    b, s_q, s_new, cap, h, h_k, d, d_v = 3, 2, 2, 24, 4, 2, 16, 8
    q = torch.randn(b, s_q, h, d, generator=gen).to(dtype)
    k = torch.randn(b, s_new, h_k, d, generator=gen).to(dtype)
    v = torch.randn(b, s_new, h_k, d_v, generator=gen).to(dtype)
    seqlens = torch.tensor([cap - s_new, 0, 9], dtype=torch.int32)
    if page_size is None:
        slabs, table = b, None
        shape_k, shape_v = (b, cap, h_k, d), (b, cap, h_k, d_v)
    else:
        per_row = cap // page_size
        slabs = b * per_row + 2
        table = torch.randperm(slabs, generator=gen)[: b * per_row].view(b, per_row).to(torch.int32)
        shape_k, shape_v = (slabs, page_size, h_k, d), (slabs, page_size, h_k, d_v)
    k_descale = torch.rand(slabs, h_k, generator=gen) * 0.5 + 0.25
    v_descale = torch.rand(slabs, h_k, generator=gen) * 0.5 + 0.25
    kc, vc = fp8_cache(shape_k, k_descale, gen), fp8_cache(shape_v, v_descale, gen)
    kc0, vc0 = kc.clone(), vc.clone()
    out, lse = flash3.attention_with_kvcache(
        q, kc, vc, k, v, cache_seqlens=seqlens, page_table=table, k_descale=k_descale,
        v_descale=v_descale, return_lse=True, **kw)
    assert out.dtype == dtype and out.shape == (b, s_q, h, d_v) and lse.shape == (b, h, s_q)
    assert kc.dtype == FP8 and vc.dtype == FP8

    refs = []
    for i in range(b):
        n = int(seqlens[i]) + s_new
        pos = torch.arange(n)
        if table is None:
            slab, off = torch.full((n,), i), pos
        else:
            slab, off = table[i].long()[pos // page_size], pos % page_size
        # Append round trip: new keys stored as e4m3(x / descale) in their slab.
        new = slice(n - s_new, n)
        want_k8 = reference.quantize_fp8_cache(k[i], k_descale[slab[new]])
        want_v8 = reference.quantize_fp8_cache(v[i], v_descale[slab[new]])
        assert torch.equal(kc[slab[new], off[new]].view(torch.uint8), want_k8.view(torch.uint8))
        assert torch.equal(vc[slab[new], off[new]].view(torch.uint8), want_v8.view(torch.uint8))
        deq_k = kc[slab, off].double() * k_descale[slab].double()[..., None]
        deq_v = vc[slab, off].double() * v_descale[slab].double()[..., None]
        # e4m3 keeps 3 mantissa bits: relative rounding error <= 2^-4 (plus subnormals).
        err = (deq_k[new] - k[i].double()).abs()
        assert torch.all(err <= 2 ** -4 * k[i].double().abs() + 2 ** -9 * k_descale[slab[new]]
                         .double()[..., None])
        refs.append(attention_ref64(q[i:i + 1].double(), deq_k[None], deq_v[None], **kw))
    ref_out = torch.cat([r[0] for r in refs])
    ref_lse = torch.cat([r[1] for r in refs])
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
    torch.testing.assert_close(out.double(), ref_out, rtol=tol, atol=tol)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-5, atol=1e-5)
    # Untouched slots keep their bytes.
    mask = torch.ones(kc.shape[:2], dtype=torch.bool)
    for i in range(b):
        n = int(seqlens[i])
        pos = torch.arange(n, n + s_new)
        if table is None:
            mask[i, pos] = False
        else:
            mask[table[i].long()[pos // page_size], pos % page_size] = False
    assert torch.equal(kc.view(torch.uint8)[mask], kc0.view(torch.uint8)[mask])


def test_fp8_append_saturates_and_rounds():
    descale = torch.tensor([[2.0]])
    x = torch.tensor([[[1000.0, -1000.0, 896.0, 3.0, 0.0, 2.0 * 1.0625]]]).view(1, 1, 1, 6)
    q8 = reference.quantize_fp8_cache(x, descale[:, None, :].expand(1, 1, 1))
    got = (q8.float() * 2.0).flatten().tolist()
    # 1000/2 = 500 saturates to 448; 1.0625 rounds to nearest even (1.0) in e4m3.
    assert got == [896.0, -896.0, 896.0, 3.0, 0.0, 2.0]


def test_fp8_cache_errors():
    q = torch.randn(2, 1, 2, 8, dtype=torch.bfloat16)
    kc = torch.zeros(2, 8, 2, 8, dtype=FP8)
    vc = torch.zeros(2, 8, 2, 8, dtype=FP8)
    ds = torch.ones(2, 2)
    call = lambda **kw: flash3.attention_with_kvcache(q, *kw.pop("caches", (kc, vc)),
                                                      cache_seqlens=3, **kw)
    with pytest.raises(ValueError, match="k_descale is required"):
        call(v_descale=ds)
    with pytest.raises(ValueError, match="v_descale is required"):
        call(k_descale=ds)
    with pytest.raises(ValueError, match=r"k_descale must have shape \(batch, kv_heads\)"):
        call(k_descale=torch.ones(2), v_descale=ds)
    with pytest.raises(TypeError, match="v_descale must be float32"):
        call(k_descale=ds, v_descale=ds.double())
    with pytest.raises(ValueError, match="k_descale is only used with a float8_e4m3fn cache"):
        call(caches=(kc.bfloat16(), vc.bfloat16()), k_descale=ds, v_descale=ds)
    with pytest.raises(TypeError, match="must both be float8_e4m3fn"):
        call(caches=(kc, vc.bfloat16()), k_descale=ds, v_descale=ds)
    with pytest.raises(TypeError, match="k has dtype"):
        flash3.attention_with_kvcache(q, kc, vc, torch.zeros(2, 1, 2, 8), torch.zeros(2, 1, 2, 8),
                                      cache_seqlens=3, k_descale=ds, v_descale=ds)
    with pytest.raises(TypeError, match="float8_e4m3fn queries"):
        flash3.attention_with_kvcache(q.to(FP8), kc, vc, cache_seqlens=3, k_descale=ds,
                                      v_descale=ds)
    table = torch.zeros(2, 2, dtype=torch.int32)
    kp, vp = torch.zeros(5, 4, 2, 8, dtype=FP8), torch.zeros(5, 4, 2, 8, dtype=FP8)
    with pytest.raises(ValueError, match=r"\(num_pages, kv_heads\) = \(5, 2\)"):
        flash3.attention_with_kvcache(q, kp, vp, cache_seqlens=3, page_table=table,
                                      k_descale=ds, v_descale=ds)
    with pytest.raises(ValueError, match="k_descale must be finite and > 0"):  # value check (CPU)
        call(k_descale=torch.zeros(2, 2), v_descale=ds)
    out = call(k_descale=ds, v_descale=ds)
    assert out.dtype == torch.bfloat16 and torch.all(out == 0)


# ----------------------------------------------------------------- split-KV (reference)
@pytest.mark.parametrize("num_splits", [2, 3, 5, 64])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_num_splits_matches_one_split(case, num_splits, monkeypatch):
    monkeypatch.setattr(reference, "SPLIT_BLOCK_N", 8)  # several key blocks per row
    b, s_q, s_new, cap, h, h_k, d, d_v, kw = CASES[case]
    gen = torch.Generator().manual_seed(case + 100)
    q = torch.randn(b, s_q, h, d, generator=gen)
    k_cache = torch.randn(b, cap, h_k, d, generator=gen)
    v_cache = torch.randn(b, cap, h_k, d_v, generator=gen)
    k = v = None
    if s_new:
        k = torch.randn(b, s_new, h_k, d, generator=gen)
        v = torch.randn(b, s_new, h_k, d_v, generator=gen)
    seqlens = torch.randint(0, cap - s_new + 1, (b,), generator=gen, dtype=torch.int32)
    seqlens[-1] = 0  # a short row: most splits empty
    outs = []
    for ns in (1, num_splits):
        kc, vc = k_cache.clone(), v_cache.clone()
        outs.append(flash3.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=seqlens,
                                                  num_splits=ns, return_lse=True, **kw))
    (o1, l1), (o2, l2) = outs
    torch.testing.assert_close(o2, o1, rtol=2e-6, atol=2e-6)
    torch.testing.assert_close(l2, l1, rtol=2e-6, atol=2e-6)
    assert torch.equal(torch.isinf(l1), torch.isinf(l2))
    ref, _ = expected(q, k_cache, v_cache, k, v, seqlens, **kw)
    assert (o2.double() - ref).abs().max() < 1e-5


def test_combine_splits_is_inf_safe_and_exact():
    gen = torch.Generator().manual_seed(3)
    S, b, s_q, h, d_v = 4, 2, 3, 2, 5
    o = torch.randn(S, b, s_q, h, d_v, generator=gen)
    lse = torch.randn(S, b, h, s_q, generator=gen) * 3
    lse[1] = -float("inf")  # an empty split everywhere
    o[1] = 0
    lse[:, 0, 0, 0] = -float("inf")  # a row no split saw
    o[:, 0, 0, 0] = 0
    lse[2, 1, 1, 2] = 80.0  # a dominant split (exp would overflow fp32 without the max)
    out, l = reference.combine_splits(o, lse)
    assert torch.isfinite(out).all()
    assert l[0, 0, 0] == -float("inf") and torch.all(out[0, 0, 0] == 0)
    # fp64 oracle: softmax weights over splits.
    L = torch.logsumexp(lse.double(), dim=0)
    w = torch.exp(lse.double() - L).nan_to_num(0.0)
    want = (o.double() * w.permute(0, 1, 3, 2).unsqueeze(-1)).sum(0)
    torch.testing.assert_close(l.double(), L, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out.double(), want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out[1, 2, 1], o[2, 1, 2, 1], rtol=1e-6, atol=1e-6)


def test_fp8_rotary_splits_together():
    """All three features in one paged call: splits change nothing beyond fp32 rounding, and the
    rotated, quantized keys land in the cache."""
    gen = torch.Generator().manual_seed(11)
    b, h, h_k, d, ps, pages = 2, 4, 2, 16, 4, 12
    q = torch.randn(b, 2, h, d, generator=gen).to(torch.bfloat16)
    k = torch.randn(b, 2, h_k, d, generator=gen).to(torch.bfloat16)
    v = torch.randn(b, 2, h_k, d, generator=gen).to(torch.bfloat16)
    ds_k = torch.rand(pages, h_k, generator=gen) + 0.1
    ds_v = torch.rand(pages, h_k, generator=gen) + 0.1
    kc = fp8_cache((pages, ps, h_k, d), ds_k, gen)
    vc = fp8_cache((pages, ps, h_k, d), ds_v, gen)
    table = torch.tensor([[3, 0, 7, 1, 9], [2, 11, 4, 5, 6]], dtype=torch.int32)
    lens = torch.tensor([13, 5], dtype=torch.int32)
    ang = torch.arange(32.0)[:, None] * torch.tensor([1.0, 0.3, 0.1, 0.03])[None]
    outs, caches = [], []
    for ns in (1, 3):
        kc_i, vc_i = kc.clone(), vc.clone()
        outs.append(flash3.attention_with_kvcache(
            q, kc_i, vc_i, k, v, cache_seqlens=lens, page_table=table, causal=True,
            rotary_cos=ang.cos(), rotary_sin=ang.sin(), rotary_interleaved=True,
            k_descale=ds_k, v_descale=ds_v, num_splits=ns))
        caches.append(kc_i)
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=2 ** -7)  # bf16 output rounding
    assert torch.equal(caches[0].view(torch.uint8), caches[1].view(torch.uint8))
    from flash3.rotary import kvcache_rotary
    _, k_rot = kvcache_rotary(q, k, lens, ang.cos(), ang.sin(), True, True)
    for i in range(b):
        for t in range(2):
            pos = int(lens[i]) + t
            page = int(table[i, pos // ps])
            want = reference.quantize_fp8_cache(k_rot[i, t], ds_k[page])
            assert torch.equal(caches[0][page, pos % ps].view(torch.uint8), want.view(torch.uint8))
