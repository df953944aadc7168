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


def test_int_cache_seqlens_and_ignored_num_splits():
    q = torch.randn(2, 1, 2, 8)
    kc, vc = torch.randn(2, 10, 2, 8), torch.randn(2, 10, 2, 8)
    a = flash3.attention_with_kvcache(q, kc, vc, cache_seqlens=6, num_splits=4)
    b = flash3.attention_with_kvcache(q, kc, vc, cache_seqlens=torch.full((2,), 6, dtype=torch.int32))
    assert torch.equal(a, b)
    ref = attention_ref64(q.double(), kc[:, :6].double(), vc[:, :6].double())[0]
    assert (a.double() - ref).abs().max() < 1e-5


def test_empty_cache_row():
    q = torch.randn(2, 3, 2, 8)
    kc, vc = torch.randn(2, 10, 2, 8), torch.randn(2, 10, 2, 8)
    seqlens = torch.tensor([0, 4], dtype=torch.int32)
    out, lse = flash3.attention_with_kvcache(q, kc, vc, cache_seqlens=seqlens, return_lse=True)
    assert torch.all(out[0] == 0) and torch.all(lse[0] == float("-inf"))
    assert torch.isfinite(lse[1]).all()
