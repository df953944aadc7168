"""Attention sinks (``sinks=``): values, lse and gradients against an fp64 softmax-with-sink
oracle written here (logits, a sink column, softmax, the column dropped, @ v)."""

import math

import pytest
import torch

import flash3
from flash3 import reference
from helpers import attention_naive, assert_close_fa, max_err


def sink_ref(q, k, v, sinks, *, causal=False, window_size=(-1, -1), softcap=0.0,
             softmax_scale=None, dtype=torch.float64):
    """(b, s_q, h, d) inputs -> out (b, s_q, h, d_v), lse (b, h, s_q), computed in ``dtype``."""
    q, k, v, sinks = (x.to(dtype) for x in (q, k, v, sinks))
    scale = 1.0 / math.sqrt(q.shape[-1]) if softmax_scale is None else softmax_scale
    g = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(g, dim=2), v.repeat_interleave(g, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    s_q, s_k = s.shape[-2:]
    i = torch.arange(s_q)[:, None] + s_k - s_q  # bottom-right aligned diagonal
    j = torch.arange(s_k)[None, :]
    left, right = window_size
    right = 0 if causal else right
    hide = torch.zeros(s_q, s_k, dtype=torch.bool)
    if left >= 0:
        hide |= j < i - left
    if right >= 0:
        hide |= j > i + right
    s = s.masked_fill(hide, -math.inf)
    col = sinks.view(1, -1, 1, 1).expand(s.shape[0], -1, s_q, 1)
    s = torch.cat([s, col], dim=-1)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.masked_fill(lse == -math.inf, 0.0).unsqueeze(-1))[..., :-1]
    return torch.einsum("bhqk,bkhd->bqhd", p, v), lse


def check(fn, q, k, v, sinks, **kw):
    """Out, lse and the gradients of q, k, v, sinks against the fp64 oracle, FA error rule
    (the naive baseline computes in the inputs' dtype)."""
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v, sinks)]
    out, lse = fn(*leaves, **kw)
    r64 = [x.detach().double().requires_grad_() for x in (q, k, v, sinks)]
    ref_out, ref_lse = sink_ref(*r64, **kw)
    nv = [x.detach().clone().requires_grad_() for x in (q, k, v, sinks)]
    naive_out, _ = sink_ref(*nv, dtype=torch.float32 if q.dtype == torch.float32 else q.dtype, **kw)
    assert out.dtype == q.dtype
    assert_close_fa(out, naive_out, ref_out, "out")
    fin = torch.isfinite(ref_lse)
    assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse))
    assert max_err(lse[fin], ref_lse[fin]) <= 1e-4 * (1 + ref_lse[fin].abs().max().item())
    g = torch.randn_like(ref_out)
    out.backward(g.to(out.dtype))
    ref_out.backward(g)
    naive_out.backward(g.to(naive_out.dtype))
    gmax = max(r.grad.abs().max().item() for r in r64)
    for name, a, r, n in zip(("q", "k", "v", "sinks"), leaves, r64, nv):
        assert a.grad.dtype == a.dtype, name
        assert_close_fa(a.grad, n.grad, r.grad, "d" + name, gmax)


def batched(q, k, v, sinks, **kw):
    return flash3.attention(q, k, v, sinks=sinks, return_lse=True, **kw)


def inputs(b, s_q, s_k, h, h_k, d, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    q = torch.randn(b, s_q, h, d).to(dtype)
    k = torch.randn(b, s_k, h_k, d).to(dtype)
    v = torch.randn(b, s_k, h_k, d).to(dtype)
    return q, k, v, (torch.randn(h) * 2).to(torch.float32)


@pytest.mark.parametrize("kw", [dict(), dict(causal=True), dict(window_size=(9, 3)),
                                dict(softcap=2.0, causal=True), dict(softmax_scale=0.5)])
@pytest.mark.parametrize("shape", [(2, 37, 50, 4, 2, 32), (1, 60, 21, 6, 1, 16)])
def test_batched_fp32(shape, kw):
    check(batched, *inputs(*shape), **kw)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_batched_16bit_gqa_causal(dtype):
    check(batched, *inputs(2, 70, 90, 8, 2, 64, dtype), causal=True)


def test_rows_with_no_key_get_the_sink():
    """Causal with s_q > s_k: the first rows see no key; softmax over the sink alone."""
    q, k, v, sinks = inputs(1, 20, 5, 2, 2, 16)
    check(batched, q, k, v, sinks, causal=True)
    out, lse = batched(q, k, v, sinks, causal=True)
    assert torch.equal(out[0, :15], torch.zeros_like(out[0, :15]))
    assert max_err(lse[0, :, :15], sinks.view(2, 1).expand(2, 15)) <= 1e-6  # log2 round trip


def test_minus_inf_sink_is_no_sink():
    q, k, v, _ = inputs(2, 33, 40, 4, 2, 32)
    for kw in (dict(), dict(causal=True, softcap=3.0)):
        a, la = flash3.attention(q, k, v, return_lse=True, **kw)
        b, lb = batched(q, k, v, torch.full((4,), -math.inf), **kw)
        assert max_err(a, b) <= 1e-6 and max_err(la, lb) <= 1e-5


def test_dsink_formula_fp64():
    """d_sink = -sum_rows P_sink * (rowsum(dO*O) - dlse), evaluated in fp64 on the oracle's
    O and lse, against central finite differences of the oracle (gradcheck-style)."""
    torch.manual_seed(1)
    q, k, v = torch.randn(2, 9, 4, 8), torch.randn(2, 11, 2, 8), torch.randn(2, 11, 2, 8)
    q, k, v = (x.double() for x in (q, k, v))
    sinks = torch.randn(4, dtype=torch.float64)
    g, gl = torch.randn(2, 9, 4, 8, dtype=torch.float64), torch.randn(2, 4, 9, dtype=torch.float64)

    def loss(s):
        o, l = sink_ref(q, k, v, s, causal=True, softcap=1.5)
        return (o * g).sum() + (l * gl).sum()

    o, l = sink_ref(q, k, v, sinks, causal=True, softcap=1.5)
    ds = reference.sink_grad(sinks, g, o, l, gl)
    assert ds.dtype == torch.float64
    eps = 1e-6
    for h in range(4):
        e = torch.zeros(4, dtype=torch.float64)
        e[h] = eps
        fd = (loss(sinks + e) - loss(sinks - e)) / (2 * eps)
        assert abs(ds[h].item() - fd.item()) <= 1e-7 * (1 + abs(fd.item()))
    assert torch.autograd.gradcheck(lambda s: loss(s), (sinks.clone().requires_grad_(),))


def test_lse_gradient_reaches_the_sink():
    q, k, v, sinks = inputs(1, 12, 12, 2, 1, 16)
    s1 = sinks.clone().requires_grad_()
    _, lse = batched(q, k, v, s1)
    lse.sum().backward()
    s2 = sinks.double().requires_grad_()
    sink_ref(q, k, v, s2)[1].sum().backward()
    assert max_err(s1.grad, s2.grad) <= 1e-5


@pytest.mark.parametrize("kw", [dict(), dict(causal=True), dict(softcap=2.0, window_size=(5, 0))])
def test_varlen(kw):
    torch.manual_seed(3)
    lens_q, lens_k = [5, 0, 17, 3], [9, 4, 17, 0]
    h, h_k, d = 4, 2, 32
    cu_q = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=torch.int32)
    cu_k = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), dtype=torch.int32)
    q = torch.randn(sum(lens_q), h, d, requires_grad=True)
    k = torch.randn(sum(lens_k), h_k, d, requires_grad=True)
    v = torch.randn(sum(lens_k), h_k, d, requires_grad=True)
    sinks = torch.randn(h, requires_grad=True)
    out, lse = flash3.attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), sinks=sinks,
                                       return_lse=True, **kw)
    g = torch.randn_like(out)
    (out * g).sum().backward()
    r64 = [x.detach().double().requires_grad_() for x in (q, k, v, sinks)]
    total = 0
    for i in range(len(lens_q)):
        q0, q1, k0, k1 = cu_q[i], cu_q[i + 1], cu_k[i], cu_k[i + 1]
        o_i, l_i = sink_ref(r64[0][None, q0:q1], r64[1][None, k0:k1], r64[2][None, k0:k1],
                            r64[3], **kw)
        assert max_err(out[q0:q1], o_i[0]) <= 1e-5
        assert max_err(lse[:, q0:q1], l_i[0]) <= 1e-5
        total = total + (o_i[0] * g[q0:q1].double()).sum()
    total.backward()
    for name, a, r in zip(("q", "k", "v", "sinks"), (q, k, v, sinks), r64):
        assert max_err(a.grad, r.grad) <= 2e-5 * (1 + r.grad.abs().max().item()), name


@pytest.mark.parametrize("paged,num_splits", [(False, 0), (True, 0), (True, 3)])
def test_kvcache(paged, num_splits):
    torch.manual_seed(4)
    b, s_q, h, h_k, d, cap = 3, 2, 4, 2, 32, 64
    lens = torch.tensor([0, 17, 50], dtype=torch.int32)
    q = torch.randn(b, s_q, h, d)
    kc, vc = torch.randn(b, cap, h_k, d), torch.randn(b, cap, h_k, d)
    sinks = torch.randn(h)
    args = dict(cache_seqlens=lens, causal=True, sinks=sinks, return_lse=True,
                num_splits=num_splits)
    if paged:
        ps = 16
        perm = torch.randperm(b * cap // ps)
        pt = perm.view(b, cap // ps).to(torch.int32)
        kp = torch.empty(b * cap // ps, ps, h_k, d)
        vp = torch.empty_like(kp)
        kp[pt.flatten().long()] = kc.view(-1, ps, h_k, d)
        vp[pt.flatten().long()] = vc.view(-1, ps, h_k, d)
        out, lse = flash3.attention_with_kvcache(q, kp, vp, page_table=pt, **args)
    else:
        out, lse = flash3.attention_with_kvcache(q, kc, vc, **args)
    for i in range(b):
        n = int(lens[i])
        o_i, l_i = sink_ref(q[i:i + 1], kc[i:i + 1, :n], vc[i:i + 1, :n], sinks, causal=True)
        assert max_err(out[i:i + 1], o_i) <= 1e-5
        assert max_err(lse[i:i + 1], l_i) <= 1e-5


def test_sdpa_sinks():
    q, k, v, sinks = inputs(2, 16, 16, 4, 2, 32)
    out = flash3.sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                      enable_gqa=True, sinks=sinks)
    ref, _ = sink_ref(q, k, v, sinks, causal=True)
    assert max_err(out.transpose(1, 2), ref) <= 1e-5


def test_bad_sinks():
    q, k, v, sinks = inputs(1, 8, 8, 4, 2, 16)
    with pytest.raises(ValueError, match="sinks"):
        flash3.attention(q, k, v, sinks=torch.zeros(2))
    with pytest.raises(TypeError, match="sinks"):
        flash3.attention(q, k, v, sinks=torch.zeros(4, dtype=torch.int32))
    q8, k8, v8 = (x.to(torch.float8_e4m3fn) for x in (q, k, v))
    d = torch.ones(1, 2)
    with pytest.raises(NotImplementedError, match="sinks"):
        flash3.attention(q8, k8, v8, q_descale=d, k_descale=d, v_descale=d, sinks=sinks)


def test_naive_helper_agrees_without_sink():
    """The oracle here equals tests/helpers.py's without a sink (a -inf sink)."""
    q, k, v, _ = inputs(1, 10, 14, 2, 1, 8)
    a, la = sink_ref(q, k, v, torch.full((2,), -math.inf), causal=True)
    b, lb = attention_naive(q, k, v, causal=True, compute_dtype=torch.float64)
    assert max_err(a, b) <= 1e-12 and max_err(la, lb) <= 1e-12


def test_opcheck_sink_operators():
    q, k, v, sinks = inputs(1, 9, 11, 4, 2, 8)
    args = (q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), sinks.requires_grad_(),
            0.3, 5, 0, 1.5)
    torch.library.opcheck(torch.ops.flash3.attention_sinks_fwd.default, args)
    cq, ck = torch.tensor([0, 3, 10], dtype=torch.int32), torch.tensor([0, 5, 12], dtype=torch.int32)
    qv, kv, vv = torch.randn(10, 4, 8), torch.randn(12, 2, 8), torch.randn(12, 2, 8)
    args = (qv.requires_grad_(), kv.requires_grad_(), vv.requires_grad_(), cq, ck,
            torch.randn(4, requires_grad=True), 7, 7, 0.3, -1, 0, 0.0)
    torch.library.opcheck(torch.ops.flash3.attention_varlen_sinks_fwd.default, args)


@pytest.fixture
def fake_bwd_op_with_sinks(monkeypatch):
    """The sink backward operators' kernel branch on CPU tensors, through the real
    _backend.run_kernel_bwd, with flash3::bwd_sm90 replaced by a stand-in of its schema (sinks and
    dsinks trailing) that computes the reference into dq/dk/dv and dsinks."""
    from flash3 import ops
    calls = []

    def bwd_sm90(dout, q, k, v, out, lse, dlse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k,
                 max_seqlen_q, max_seqlen_k, softmax_scale, window_left, window_right,
                 softcap, deterministic, sinks=None, dsinks=None):
        assert sinks is not None and dsinks is not None
        assert sinks.dtype == dsinks.dtype == torch.float32 and sinks.is_contiguous()
        assert sinks.shape == dsinks.shape == (q.shape[-2],)
        calls.append(dict(varlen=cu_seqlens_q is not None, max_q=max_seqlen_q, max_k=max_seqlen_k))
        args = (softmax_scale, window_left, window_right, softcap)
        if cu_seqlens_q is None:
            grads = reference.backward(dout, q, k, v, out, lse, *args, dlse=dlse, sinks=sinks)
        else:
            grads = reference.varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                                              *args, dlse=dlse, sinks=sinks)
        for dst, src in zip((dq, dk, dv, dsinks), grads):
            dst.copy_(src)

    monkeypatch.setattr(torch.ops.flash3, "bwd_sm90", bwd_sm90, raising=False)
    monkeypatch.setattr(ops, "_bwd_dispatch", lambda q, k, v, scale, run_kernel, run_reference, alibi_slopes=None: run_kernel())
    return calls


def _sink_grads(fn, inputs, g, g_lse):
    leaves = [x.detach().clone().requires_grad_() for x in inputs]
    out, lse = fn(*leaves)
    torch.autograd.backward((out, lse), (g, g_lse))
    return [x.grad for x in leaves]


def test_sink_backward_kernel_branch_plumbing(fake_bwd_op_with_sinks, monkeypatch):
    """attention_sinks_bwd / attention_varlen_sinks_bwd call bwd_sm90 with sinks (float32,
    contiguous) and a dsinks buffer, and return d_sink in sinks' dtype: the same gradients as the
    reference branch, bit for bit (the stand-in computes the reference)."""
    q, k, v, sinks = inputs(2, 13, 17, 4, 2, 16)
    sinks = sinks.to(torch.bfloat16)
    g, g_lse = torch.randn(2, 13, 4, 16), torch.randn(2, 4, 13)
    fn = lambda q, k, v, s: batched(q, k, v, s, causal=True)  # noqa: E731
    cq, ck = torch.tensor([0, 5, 5, 19], dtype=torch.int32), torch.tensor([0, 9, 12, 12], dtype=torch.int32)
    qv, kv, vv = torch.randn(19, 4, 16), torch.randn(12, 2, 16), torch.randn(12, 2, 16)
    gv, gv_lse = torch.randn(19, 4, 16), torch.randn(4, 19)
    fnv = lambda q, k, v, s: flash3.attention_varlen(q, k, v, cq, ck, 14, 9, sinks=s,  # noqa: E731
                                                     return_lse=True, deterministic=True)
    got = _sink_grads(fn, (q, k, v, sinks), g, g_lse)
    got_v = _sink_grads(fnv, (qv, kv, vv, sinks), gv, gv_lse)
    calls = list(fake_bwd_op_with_sinks)
    assert calls == [dict(varlen=False, max_q=13, max_k=17), dict(varlen=True, max_q=14, max_k=9)]
    assert got[3].dtype == got_v[3].dtype == torch.bfloat16
    monkeypatch.undo()  # the reference branch
    want = _sink_grads(fn, (q, k, v, sinks), g, g_lse)
    want_v = _sink_grads(fnv, (qv, kv, vv, sinks), gv, gv_lse)
    for a, b in zip(got + got_v, want + want_v):
        assert torch.equal(a, b)
