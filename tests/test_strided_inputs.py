"""Strided, transposed, expanded and sliced q/k/v give exactly the contiguous call's result.

The README promises any strided view works.  On the CPU, flash3 routes most calls to torch's fused
kernel (flash3/_torch_cpu.py), which reads a tensor's last dim as if its stride were 1 and gets
slightly different fp32 sums for a sequence stride below the head dim; these tests pin every public
entry point to the contiguous call, forward and backward, bit for bit (same path, same numbers).
"""

import pytest
import torch

import flash3
from flash3 import flash_attn_interface as fai

DTYPES = [torch.float32, torch.bfloat16, torch.float16]

def _rand(dtype, *shape):
    return torch.randn(shape).to(dtype)


# Each view of a (..., n, h, d) tensor, built over fresh memory; shapes (..., s, h, d).
VIEWS = {
    "lastdim_step2": lambda shp, dt: _rand(dt, *shp[:-1], 2 * shp[-1])[..., ::2],
    "headdim_permuted": lambda shp, dt: _rand(dt, *shp[:-2], shp[-1], shp[-2]).transpose(-1, -2),
    "seq_head_swapped": lambda shp, dt: _rand(dt, *shp[:-3], shp[-2], shp[-3], shp[-1]).transpose(-3, -2),
    "expanded_heads": lambda shp, dt: _rand(dt, *shp[:-2], 1, shp[-1]).expand(shp),
    "expanded_seq": lambda shp, dt: _rand(dt, *shp[:-3], 1, *shp[-2:]).expand(shp),
    "expanded_lastdim": lambda shp, dt: _rand(dt, *shp[:-1], 1).expand(shp),
    "sliced": lambda shp, dt: _rand(dt, *shp[:-3], shp[-3] + 3, shp[-2] + 1, shp[-1] + 8)[
        ..., 2:2 + shp[-3], :shp[-2], 4:4 + shp[-1]],
}
WHICH = ["q", "k", "v"]


def _make(shapes, view, which, dtype):
    """q, k, v (leaves) with the one named ``which`` built as ``view``, and contiguous copies."""
    xs = [VIEWS[view](s, dtype) if n == which else _rand(dtype, *s) for n, s in zip(WHICH, shapes)]
    strided = [x.detach().requires_grad_() for x in xs]  # detach keeps the strides too
    contig = [x.detach().contiguous().requires_grad_() for x in xs]
    assert not strided[WHICH.index(which)].is_contiguous()
    return strided, contig


def _assert_same(a, b):
    assert a.shape == b.shape and a.dtype == b.dtype
    assert torch.equal(a, b), f"max |diff| = {(a.float() - b.float()).abs().max().item()}"


def _check(fn, strided, contig, grad=True):
    out_s, out_c = fn(*strided), fn(*contig)
    if isinstance(out_s, tuple):
        out_s, out_c = out_s[0], out_c[0]
    _assert_same(out_s, out_c)
    if grad:
        dout = torch.randn(out_c.shape).to(out_c.dtype)
        gs = torch.autograd.grad(out_s, strided, dout)
        gc = torch.autograd.grad(out_c, contig, dout)
        for a, b in zip(gs, gc):
            _assert_same(a, b)


B, S_Q, S_K, H, H_K, D = 2, 24, 40, 4, 2, 16
MASKS = {"none": {}, "causal": {"causal": True}, "window": {"window_size": (9, 3)}}

params = pytest.mark.parametrize("dtype", DTYPES, ids=str)
views = pytest.mark.parametrize("view", list(VIEWS))
which = pytest.mark.parametrize("which", WHICH)


@params
@views
@which
@pytest.mark.parametrize("mask", list(MASKS))
def test_attention(dtype, view, which, mask):
    shapes = [(B, S_Q, H, D), (B, S_K, H_K, D), (B, S_K, H_K, D)]
    strided, contig = _make(shapes, view, which, dtype)
    _check(lambda q, k, v: flash3.attention(q, k, v, **MASKS[mask]), strided, contig)


@params
@views
@which
def test_attention_square_causal(dtype, view, which):
    """s_q == s_k with causal: torch's kernel in one call (its own causal mask)."""
    shapes = [(B, S_K, H, D), (B, S_K, H_K, D), (B, S_K, H_K, D)]
    strided, contig = _make(shapes, view, which, dtype)
    _check(lambda q, k, v: flash3.attention(q, k, v, causal=True), strided, contig)


def _cu(lens):
    return torch.tensor([0] + lens, dtype=torch.int32).cumsum(0, dtype=torch.int32)


@params
@views
@which
@pytest.mark.parametrize("causal", [False, True])
def test_attention_varlen(dtype, view, which, causal):
    lq, lk = [5, 19], [17, 23]
    shapes = [(sum(lq), H, D), (sum(lk), H_K, D), (sum(lk), H_K, D)]
    strided, contig = _make(shapes, view, which, dtype)
    fn = lambda q, k, v: flash3.attention_varlen(q, k, v, _cu(lq), _cu(lk), max(lq), max(lk),  # noqa: E731
                                                 causal=causal)
    _check(fn, strided, contig)


@params
@views
@which
def test_attention_with_kvcache(dtype, view, which):
    """q and the cache as views (no append: the cache stays read-only); forward only."""
    cap = 32
    shapes = [(B, 3, H, D), (B, cap, H_K, D), (B, cap, H_K, D)]
    strided, contig = _make(shapes, view, which, dtype)
    lens = torch.tensor([7, 29], dtype=torch.int32)
    fn = lambda q, kc, vc: flash3.attention_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True)  # noqa: E731
    with torch.no_grad():
        _check(fn, strided, contig, grad=False)


@params
@pytest.mark.parametrize("view", ["lastdim_step2", "headdim_permuted", "expanded_lastdim", "sliced"])
def test_attention_with_kvcache_new_kv(dtype, view):
    """New k/v as views, appended into (separate, equal) contiguous caches."""
    cap = 32
    q = torch.randn(B, 2, H, D).to(dtype)
    knew = VIEWS[view]((B, 2, H_K, D), dtype)
    vnew = VIEWS[view]((B, 2, H_K, D), dtype)
    caches = [torch.randn(B, cap, H_K, D).to(dtype) for _ in range(2)]
    lens = torch.tensor([7, 29], dtype=torch.int32)
    cs = [c.clone() for c in caches]
    cc = [c.clone() for c in caches]
    out_s = flash3.attention_with_kvcache(q, *cs, knew, vnew, cache_seqlens=lens, causal=True)
    out_c = flash3.attention_with_kvcache(q, *cc, knew.contiguous(), vnew.contiguous(),
                                          cache_seqlens=lens, causal=True)
    _assert_same(out_s, out_c)
    for a, b in zip(cs, cc):
        _assert_same(a, b)


@params
@views
@which
@pytest.mark.parametrize("is_causal", [False, True])
def test_sdpa(dtype, view, which, is_causal):
    # torch's layout (b, h, s, d): the views are built on (b, s, h, d) and swapped to it
    shapes = [(B, S_Q, H, D), (B, S_K, H, D), (B, S_K, H, D)]
    strided, contig = _make(shapes, view, which, dtype)
    fn = lambda q, k, v: flash3.sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),  # noqa: E731
                                     is_causal=is_causal)
    _check(fn, strided, contig)


@params
@views
@which
def test_fai_flash_attn_func(dtype, view, which):
    shapes = [(B, S_Q, H, D), (B, S_K, H_K, D), (B, S_K, H_K, D)]
    strided, contig = _make(shapes, view, which, dtype)
    _check(lambda q, k, v: fai.flash_attn_func(q, k, v, causal=True), strided, contig)


@params
@views
@which
def test_fai_flash_attn_varlen_func(dtype, view, which):
    lq, lk = [5, 19], [17, 23]
    shapes = [(sum(lq), H, D), (sum(lk), H_K, D), (sum(lk), H_K, D)]
    strided, contig = _make(shapes, view, which, dtype)
    fn = lambda q, k, v: fai.flash_attn_varlen_func(q, k, v, _cu(lq), _cu(lk), max(lq), max(lk))  # noqa: E731
    _check(fn, strided, contig)


@params
@views
def test_fai_flash_attn_with_kvcache(dtype, view):
    shapes = [(B, 3, H, D), (B, 32, H_K, D), (B, 32, H_K, D)]
    strided, contig = _make(shapes, view, "q", dtype)
    lens = torch.tensor([7, 29], dtype=torch.int32)
    fn = lambda q, kc, vc: fai.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True)  # noqa: E731
    with torch.no_grad():
        _check(fn, strided, contig, grad=False)


@params
@pytest.mark.parametrize("view", ["lastdim_step2", "sliced", "headdim_permuted"])
def test_fai_flash_attn_qkvpacked_func(dtype, view):
    if view == "lastdim_step2":
        qkv = _rand(dtype, B, S_K, 3, H, 2 * D)[..., ::2]
    elif view == "sliced":
        qkv = _rand(dtype, B, S_K, 3, H + 1, D + 4)[..., :H, 2:2 + D]
    else:
        qkv = _rand(dtype, B, S_K, 3, D, H).transpose(-1, -2)
    strided, contig = [qkv.detach().requires_grad_()], [qkv.detach().contiguous().requires_grad_()]
    _check(lambda x: fai.flash_attn_qkvpacked_func(x, causal=True), strided, contig)
