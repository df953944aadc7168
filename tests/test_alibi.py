"""ALiBi (``alibi_slopes``): out, lse and gradients against the fp64 oracle of tests/helpers.py
(scores + -slope * |i + s_k - s_q - j| after softcap, then the mask), with the FlashAttention
error rule; varlen per sequence, KV caches (contiguous, paged, split-KV, appended keys), packed
queries on a cache, sinks; and the argument errors."""

import math

import pytest
import torch

import flash3
from flash3 import _torch_cpu, reference
from helpers import attention_naive, attention_ref64, check_against_reference, max_err


@pytest.fixture(params=["torch_cpu_default", "small_tiles"])
def tiles(request, monkeypatch):
    """Default tiles, and tiny ones so short sequences cross tiles (masked and unmasked blocks,
    skipped blocks) with torch's CPU kernel switched off."""
    if request.param == "small_tiles":
        monkeypatch.setattr(reference, "BLOCK_M", 16)
        monkeypatch.setattr(reference, "BLOCK_N", 32)
        monkeypatch.setattr(_torch_cpu, "USE_TORCH_CPU_KERNEL", False)
    return request.param


def slopes_for(b, h, per_batch, seed=0):
    """Random positive slopes (ALiBi's geometric ones lie in (0, 1)), never zero."""
    g = torch.Generator().manual_seed(seed)
    shape = (b, h) if per_batch else (h,)
    return 0.05 + torch.rand(shape, generator=g) * 0.6


def qkv(b, s_q, s_k, h, h_k, d, dtype=torch.float32, d_v=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, s_q, h, d, generator=g).to(dtype)
    k = torch.randn(b, s_k, h_k, d, generator=g).to(dtype)
    v = torch.randn(b, s_k, h_k, d_v or d, generator=g).to(dtype)
    return q, k, v


MASKS = [dict(), dict(causal=True), dict(window_size=(9, 3)), dict(window_size=(5, 0)),
         dict(softcap=2.0, causal=True), dict(softmax_scale=0.5, window_size=(-1, 7))]


@pytest.mark.parametrize("per_batch", [False, True])
@pytest.mark.parametrize("kw", MASKS)
@pytest.mark.parametrize("shape", [(2, 37, 50, 4, 2, 32), (1, 60, 21, 6, 1, 16),
                                   (2, 45, 45, 4, 4, 24)])
def test_batched_fp32(tiles, shape, kw, per_batch):
    q, k, v = qkv(*shape)
    check_against_reference(flash3.attention, q, k, v,
                            alibi_slopes=slopes_for(shape[0], shape[3], per_batch), **kw)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kw", [dict(causal=True), dict(window_size=(20, 4), softcap=3.0)])
def test_batched_16bit_gqa(tiles, dtype, kw):
    q, k, v = qkv(2, 70, 90, 8, 2, 64, dtype)
    check_against_reference(flash3.attention, q, k, v, alibi_slopes=slopes_for(2, 8, True), **kw)


def test_dv_differs(tiles):
    q, k, v = qkv(2, 33, 41, 4, 2, 32, d_v=16)
    check_against_reference(flash3.attention, q, k, v, alibi_slopes=slopes_for(1, 4, False),
                            causal=True)


def test_lse_is_exact_with_causal():
    """lse is the log-sum-exp of the biased scores (not FA2's causal shortcut, slope * j, which
    differs by slope * (s_k - s_q + i) per row); out is the same either way."""
    q, k, v = qkv(1, 12, 20, 2, 2, 16)
    sl = slopes_for(1, 2, False)
    out, lse = flash3.attention(q, k, v, causal=True, alibi_slopes=sl, return_lse=True)
    ref_out, ref_lse = attention_ref64(q.double(), k.double(), v.double(), causal=True,
                                       alibi_slopes=sl.double())
    assert max_err(lse, ref_lse) <= 1e-5 and max_err(out, ref_out) <= 1e-5
    # FA2's causal convention: bias + slope * j, i.e. shifted by slope * (i + s_k - s_q) per row.
    shift = sl.view(1, 2, 1).double() * (torch.arange(12) + 8).double().view(1, 1, 12)
    assert max_err(lse, ref_lse) < 0.01 * max_err(ref_lse + shift, ref_lse)


def test_zero_slopes_are_no_alibi():
    q, k, v = qkv(2, 20, 30, 4, 2, 16)
    for kw in (dict(), dict(causal=True, softcap=3.0)):
        a, la = flash3.attention(q, k, v, return_lse=True, **kw)
        b, lb = flash3.attention(q, k, v, return_lse=True, alibi_slopes=torch.zeros(4), **kw)
        assert max_err(a, b) <= 1e-6 and max_err(la, lb) <= 1e-5


def test_no_gradient_to_slopes():
    q, k, v = (x.requires_grad_() for x in qkv(1, 10, 12, 2, 1, 8))
    sl = slopes_for(1, 2, False).requires_grad_()
    out, lse = flash3.attention(q, k, v, alibi_slopes=sl, return_lse=True)
    (out.sum() + lse.sum()).backward()
    assert sl.grad is None
    assert all(x.grad is not None for x in (q, k, v))


def test_lse_gradient():
    """A gradient into lse flows through P (which the bias shapes) to q and k."""
    q, k, v = qkv(2, 17, 23, 4, 2, 16)
    sl = slopes_for(2, 4, True)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out, lse = flash3.attention(*leaves, causal=True, alibi_slopes=sl, return_lse=True)
    r64 = [x.double().requires_grad_() for x in (q, k, v)]
    ro, rl = attention_ref64(*r64, causal=True, alibi_slopes=sl.double())
    g, gl = torch.randn_like(out), torch.randn_like(lse)
    torch.autograd.backward((out, lse), (g, gl))
    torch.autograd.backward((ro, rl), (g.double(), gl.double()))
    for a, r in zip(leaves, r64):
        assert max_err(a.grad, r.grad) <= 1e-4 * (1 + r.grad.abs().max().item())


def _cu(lens):
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)


@pytest.mark.parametrize("per_batch", [False, True])
@pytest.mark.parametrize("kw", [dict(), dict(causal=True), dict(softcap=2.0, window_size=(5, 0))])
def test_varlen(tiles, kw, per_batch):
    """Distances per sequence (each its own s_q, s_k), slopes per sequence with (b, h)."""
    torch.manual_seed(3)
    lens_q, lens_k = [5, 0, 37, 3, 20], [9, 4, 17, 0, 40]
    h, h_k, d = 4, 2, 32
    cu_q, cu_k = _cu(lens_q), _cu(lens_k)
    q = torch.randn(sum(lens_q), h, d, requires_grad=True)
    k = torch.randn(sum(lens_k), h_k, d, requires_grad=True)
    v = torch.randn(sum(lens_k), h_k, d, requires_grad=True)
    sl = slopes_for(len(lens_q), h, per_batch)
    out, lse = flash3.attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
                                       alibi_slopes=sl, return_lse=True, **kw)
    g = torch.randn_like(out)
    (out * g).sum().backward()
    r64 = [x.detach().double().requires_grad_() for x in (q, k, v)]
    total = 0
    for i in range(len(lens_q)):
        q0, q1, k0, k1 = cu_q[i], cu_q[i + 1], cu_k[i], cu_k[i + 1]
        if q1 == q0:
            continue
        sl_i = (sl[i] if per_batch else sl).double()
        o_i, l_i = attention_ref64(r64[0][None, q0:q1], r64[1][None, k0:k1], r64[2][None, k0:k1],
                                   alibi_slopes=sl_i, **kw)
        o_i = torch.nan_to_num(o_i)  # a sequence with no key: 0 (the oracle's empty rows)
        assert max_err(out[q0:q1], o_i[0]) <= 1e-5
        fin = torch.isfinite(l_i[0])
        assert torch.equal(torch.isinf(lse[:, q0:q1]), ~fin)
        assert max_err(lse[:, q0:q1][fin], l_i[0][fin]) <= 1e-5 * (1 + l_i.abs()[..., fin[None]].max().item() if fin.any() else 1)
        total = total + (o_i[0] * g[q0:q1].double()).sum()
    total.backward()
    for name, a, r in zip("qkv", (q, k, v), r64):
        assert max_err(a.grad, r.grad) <= 2e-5 * (1 + r.grad.abs().max().item()), name


def _paged(kc, vc, ps, seed=0):
    b, cap, h_k, d = kc.shape
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(b * cap // ps, generator=g)
    pt = perm.view(b, cap // ps).to(torch.int32)
    kp = torch.empty(b * cap // ps, ps, h_k, d)
    vp = torch.empty(b * cap // ps, ps, h_k, vc.shape[-1])
    kp[pt.flatten().long()] = kc.view(-1, ps, h_k, d)
    vp[pt.flatten().long()] = vc.view(-1, ps, h_k, vc.shape[-1])
    return kp, vp, pt


@pytest.mark.parametrize("paged,num_splits,s_new", [(False, 0, 0), (True, 0, 0), (True, 3, 0),
                                                    (False, 2, 3), (True, 0, 2)])
@pytest.mark.parametrize("kw", [dict(causal=True), dict(window_size=(7, -1)), dict()])
def test_kvcache(tiles, paged, num_splits, s_new, kw):
    """s_k of row i is its key count (cache_seqlens[i] + s_new), s_q the query count; GQA."""
    torch.manual_seed(4)
    b, s_q, h, h_k, d, cap = 3, 4, 4, 2, 32, 64
    lens = torch.tensor([0, 17, 50], dtype=torch.int32)
    q = torch.randn(b, s_q, h, d)
    kc, vc = torch.randn(b, cap, h_k, d), torch.randn(b, cap, h_k, d)
    kn = vn = None
    if s_new:
        kn, vn = torch.randn(b, s_new, h_k, d), torch.randn(b, s_new, h_k, d)
    sl = slopes_for(b, h, per_batch=paged)
    args = dict(cache_seqlens=lens, alibi_slopes=sl, return_lse=True, num_splits=num_splits, **kw)
    full_k, full_v = kc.clone(), vc.clone()
    for i in range(b):
        if s_new:
            n = int(lens[i])
            full_k[i, n:n + s_new], full_v[i, n:n + s_new] = kn[i], vn[i]
    if paged:
        kp, vp, pt = _paged(kc, vc, 16)
        out, lse = flash3.attention_with_kvcache(q, kp, vp, kn, vn, page_table=pt, **args)
    else:
        out, lse = flash3.attention_with_kvcache(q, kc, vc, kn, vn, **args)
    for i in range(b):
        n = int(lens[i]) + s_new
        sl_i = (sl[i] if paged else sl).double()
        o_i, l_i = attention_ref64(q[i:i + 1].double(), full_k[i:i + 1, :n].double(),
                                   full_v[i:i + 1, :n].double(), alibi_slopes=sl_i, **kw)
        o_i = torch.nan_to_num(o_i)
        assert max_err(out[i:i + 1], o_i) <= 1e-5
        fin = torch.isfinite(l_i)
        assert torch.equal(torch.isinf(lse[i:i + 1]), ~fin)
        if fin.any():
            assert max_err(lse[i:i + 1][fin], l_i[fin]) <= 1e-5 * (1 + l_i[fin].abs().max().item())


def test_kvcache_16bit_against_rule():
    """bf16 q and cache, causal GQA: the FlashAttention rule against the fp64 oracle per row."""
    torch.manual_seed(5)
    b, s_q, h, h_k, d, cap = 2, 3, 8, 2, 64, 96
    lens = torch.tensor([40, 93], dtype=torch.int32)
    q = torch.randn(b, s_q, h, d).to(torch.bfloat16)
    kc = torch.randn(b, cap, h_k, d).to(torch.bfloat16)
    vc = torch.randn(b, cap, h_k, d).to(torch.bfloat16)
    sl = slopes_for(b, h, True)
    out = flash3.attention_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True, alibi_slopes=sl)
    from helpers import assert_close_fa
    for i in range(b):
        n = int(lens[i])
        args = (q[i:i + 1], kc[i:i + 1, :n], vc[i:i + 1, :n])
        ref, _ = attention_ref64(*(x.double() for x in args), causal=True,
                                 alibi_slopes=sl[i].double())
        naive, _ = attention_naive(*args, causal=True, alibi_slopes=sl[i])
        assert_close_fa(out[i:i + 1], naive, ref)


@pytest.mark.parametrize("paged", [False, True])
def test_packed_queries_on_a_cache(paged):
    """attention_with_kvcache(cu_seqlens_q=) and attention_varlen(page_table=, seqused_k=):
    sequence i's queries see its cache_seqlens[i] keys, distances bottom-right per sequence."""
    torch.manual_seed(6)
    lens_q, used = [3, 0, 7, 1], [10, 5, 30, 0]
    h, h_k, d, cap = 4, 2, 16, 32
    cu_q = _cu(lens_q)
    q = torch.randn(sum(lens_q), h, d)
    kc, vc = torch.randn(4, cap, h_k, d), torch.randn(4, cap, h_k, d)
    sl = slopes_for(4, h, True)
    seq = torch.tensor(used, dtype=torch.int32)
    if paged:
        kp, vp, pt = _paged(kc, vc, 8)
        out, lse = flash3.attention_varlen(q, kp, vp, cu_q, None, max(lens_q), cap, causal=True,
                                           page_table=pt, seqused_k=seq, alibi_slopes=sl,
                                           return_lse=True)
    else:
        out, lse = flash3.attention_with_kvcache(q, kc, vc, cache_seqlens=seq, causal=True,
                                                 cu_seqlens_q=cu_q, max_seqlen_q=max(lens_q),
                                                 alibi_slopes=sl, return_lse=True)
    for i in range(4):
        q0, q1, n = int(cu_q[i]), int(cu_q[i + 1]), used[i]
        if q1 == q0:
            continue
        o_i, l_i = attention_ref64(q[None, q0:q1].double(), kc[i:i + 1, :n].double(),
                                   vc[i:i + 1, :n].double(), causal=True,
                                   alibi_slopes=sl[i].double())
        assert max_err(out[q0:q1], torch.nan_to_num(o_i[0])) <= 1e-5
        fin = torch.isfinite(l_i[0])
        assert torch.equal(torch.isinf(lse[:, q0:q1]), ~fin)
        if fin.any():
            assert max_err(lse[:, q0:q1][fin], l_i[0][fin]) <= 1e-5 * (1 + l_i[0][fin].abs().max().item())


def test_with_sinks(tiles):
    """Sinks and ALiBi together: the sink is one more logit, unbiased; d_sink too."""
    q, k, v = qkv(2, 30, 40, 4, 2, 16)
    sl = slopes_for(2, 4, True)
    sinks = torch.randn(4)
    leaves = [x.clone().requires_grad_() for x in (q, k, v, sinks)]
    out, lse = flash3.attention(*leaves[:3], sinks=leaves[3], alibi_slopes=sl, causal=True,
                                return_lse=True)
    r64 = [x.double().requires_grad_() for x in (q, k, v, sinks)]
    ro, rl = attention_ref64(*r64[:3], sinks=r64[3], alibi_slopes=sl.double(), causal=True)
    assert max_err(out, ro) <= 1e-5 and max_err(lse, rl) <= 1e-5
    g = torch.randn_like(out)
    out.backward(g)
    ro.backward(g.double())
    for a, r in zip(leaves, r64):
        assert max_err(a.grad, r.grad) <= 2e-5 * (1 + r.grad.abs().max().item())


def test_varlen_with_sinks():
    torch.manual_seed(7)
    lens_q, lens_k = [4, 9], [6, 12]
    cu_q, cu_k = _cu(lens_q), _cu(lens_k)
    q = torch.randn(13, 4, 16)
    k, v = torch.randn(18, 2, 16), torch.randn(18, 2, 16)
    sl, sinks = slopes_for(2, 4, True), torch.randn(4)
    out, lse = flash3.attention_varlen(q, k, v, cu_q, cu_k, 9, 12, causal=True, sinks=sinks,
                                       alibi_slopes=sl, return_lse=True)
    for i in range(2):
        q0, q1, k0, k1 = cu_q[i], cu_q[i + 1], cu_k[i], cu_k[i + 1]
        o_i, l_i = attention_ref64(q[None, q0:q1].double(), k[None, k0:k1].double(),
                                   v[None, k0:k1].double(), causal=True, sinks=sinks.double(),
                                   alibi_slopes=sl[i].double())
        assert max_err(out[q0:q1], o_i[0]) <= 1e-5 and max_err(lse[:, q0:q1], l_i[0]) <= 1e-5


def test_flash_attn_interface_passes_slopes():
    """FA2 takes alibi_slopes (FA3's hopper interface does not): flash3's FA-style functions take
    it as a keyword and hand it to flash3's calls."""
    from flash3 import flash_attn_interface as fai
    q, k, v = qkv(2, 16, 24, 4, 2, 16)
    sl = slopes_for(2, 4, True)
    out, lse = fai.flash_attn_func(q, k, v, causal=True, alibi_slopes=sl, return_attn_probs=True)
    ref, ref_lse = flash3.attention(q, k, v, causal=True, alibi_slopes=sl, return_lse=True)
    assert torch.equal(out, ref) and torch.equal(lse, ref_lse)
    cu = torch.tensor([0, 16, 32], dtype=torch.int32)
    cuk = torch.tensor([0, 24, 48], dtype=torch.int32)
    out = fai.flash_attn_varlen_func(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu, cuk,
                                     16, 24, causal=True, alibi_slopes=sl)
    assert max_err(out.view_as(ref), ref) <= 1e-6
    kc, vc = torch.zeros(2, 32, 2, 16), torch.zeros(2, 32, 2, 16)
    kc[:, :24], vc[:, :24] = k, v
    out = fai.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=24, causal=True, alibi_slopes=sl)
    assert max_err(out, ref) <= 1e-5
    # attention_chunk runs on flash3's calls now (16-bit), so it takes the slopes too; an argument
    # only FA3's spec computes (qv) still refuses them.
    out = fai.flash_attn_func(q, k, v, attention_chunk=8, alibi_slopes=sl)
    ref_c = flash3.attention(q, k, v, attention_chunk=8, alibi_slopes=sl)
    assert torch.equal(out, ref_c)
    with pytest.raises(NotImplementedError, match="alibi_slopes"):
        fai.flash_attn_func(q, k, v, qv=torch.randn_like(q), alibi_slopes=sl)


# ----------------------------------------------------------------- errors
BAD = [
    (lambda h: torch.rand(h).double(), TypeError, "alibi_slopes must be float32"),
    (lambda h: torch.rand(h).half(), TypeError, "alibi_slopes must be float32"),
    (lambda h: torch.rand(h + 1), ValueError, r"alibi_slopes must have shape \(4,\) or \(2, 4\)"),
    (lambda h: torch.rand(3, h), ValueError, "alibi_slopes must have shape"),
    (lambda h: torch.rand(2, h, 1), ValueError, "alibi_slopes must have shape"),
    (lambda h: torch.rand(()), ValueError, "alibi_slopes must have shape"),
    (lambda h: [0.5] * h, TypeError, "alibi_slopes must be a torch.Tensor"),
    (lambda h: torch.rand(h, device="meta"), ValueError, "alibi_slopes is on meta"),
]


@pytest.mark.parametrize("make,exc,match", BAD)
def test_bad_slopes_batched_and_varlen(make, exc, match):
    q, k, v = qkv(2, 8, 8, 4, 2, 16)
    with pytest.raises(exc, match=match):
        flash3.attention(q, k, v, alibi_slopes=make(4))
    cu = torch.tensor([0, 8, 16], dtype=torch.int32)
    with pytest.raises(exc, match=match):
        flash3.attention_varlen(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu, cu, 8, 8,
                                alibi_slopes=make(4))


@pytest.mark.parametrize("make,exc,match", BAD)
def test_bad_slopes_kvcache_writes_nothing(make, exc, match):
    q = torch.randn(2, 1, 4, 16)
    kc, vc = torch.randn(2, 16, 2, 16), torch.randn(2, 16, 2, 16)
    kn, vn = torch.randn(2, 1, 2, 16), torch.randn(2, 1, 2, 16)
    kc0, vc0 = kc.clone(), vc.clone()
    with pytest.raises(exc, match=match):
        flash3.attention_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=3, alibi_slopes=make(4))
    assert torch.equal(kc, kc0) and torch.equal(vc, vc0)
    cu = torch.tensor([0, 1, 2], dtype=torch.int32)
    with pytest.raises(exc, match=match):
        flash3.attention_with_kvcache(q[:, 0], kc, vc, cache_seqlens=3, cu_seqlens_q=cu,
                                      max_seqlen_q=1, alibi_slopes=make(4))


def test_fp8_inputs_reject_slopes():
    q8 = torch.randn(1, 8, 2, 16).to(torch.float8_e4m3fn)
    d = torch.ones(1, 2)
    with pytest.raises(NotImplementedError, match="alibi_slopes"):
        flash3.attention(q8, q8, q8, q_descale=d, k_descale=d, v_descale=d,
                         alibi_slopes=torch.rand(2))


def test_fake_and_compile_shapes():
    """The ops' fake kernels take the slopes (torch.compile traces them without a graph break)."""
    q, k, v = qkv(1, 8, 8, 2, 2, 16)
    sl = slopes_for(1, 2, False)
    fn = torch.compile(lambda q, k, v, s: flash3.attention(q, k, v, alibi_slopes=s, causal=True),
                       fullgraph=True, backend="eager")
    assert max_err(fn(q, k, v, sl), flash3.attention(q, k, v, alibi_slopes=sl, causal=True)) == 0
    assert math.isfinite(float(fn(q, k, v, sl).sum()))


def test_kernel_routing_without_alibi_kernels(monkeypatch):
    """CUDA calls with slopes reach a kernel only when its op takes alibi_slopes (has_alibi_kernel
    reads the schema); otherwise the reference runs, with the package's one-time warning."""
    from flash3 import _backend, ops

    class FakeCuda:
        is_cuda = True
        shape = (2, 8, 4, 128)
    if not _backend.has_extension():
        assert not any(_backend.has_alibi_kernel(k) for k in ("fwd", "decode", "bwd"))
    monkeypatch.setattr(_backend, "has_alibi_kernel", lambda kind: kind == "fwd")
    assert _backend.kernel_alibi_reason(FakeCuda(), "fwd") is None
    for kind, op in (("decode", "fwd_kvcache_sm90"), ("bwd", "bwd_sm90")):
        assert op in _backend.kernel_alibi_reason(FakeCuda(), kind)
    q = torch.zeros(1)
    assert _backend.kernel_alibi_reason(q, "bwd") is None  # CPU tensors: the reference anyway
    # Head dims above ALIBI_MAX_HEAD_DIM: the forward and decode kernels have no ALiBi term
    monkeypatch.setattr(_backend, "has_alibi_kernel", lambda kind: True)
    big = type("Big", (), {"is_cuda": True, "shape": (2, 8, 4, 256)})()
    assert "up to 128" in _backend.kernel_alibi_reason(big, "fwd")
    assert "up to 128" in _backend.kernel_alibi_reason(FakeCuda(), "decode", 192)
    assert _backend.kernel_alibi_reason(big, "bwd") is None
    assert _backend.kernel_alibi_reason(FakeCuda(), "fwd", 128) is None
    # the dispatch asks only when slopes are given
    asked = []
    monkeypatch.setattr(_backend, "kernel_alibi_reason", lambda q, kind, d_v=None: asked.append(kind) or "no")
    assert ops._with_alibi(lambda: None, FakeCuda(), None, "fwd")() is None and asked == []
    assert ops._with_alibi(lambda: None, FakeCuda(), torch.ones(2), "bwd")() == "no" and asked == ["bwd"]
    assert ops._with_alibi(lambda: "cpu", FakeCuda(), torch.ones(2), "bwd")() == "cpu"
