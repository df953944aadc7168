"""torch.compile(fullgraph=True) captures flash3 calls without graph breaks."""

import pytest
import torch

import flash3
from helpers import attention_ref64


def test_opcheck_attention():
    q, k, v = torch.randn(1, 9, 4, 8), torch.randn(1, 11, 2, 8), torch.randn(1, 11, 2, 4)
    args = (q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), 0.3, 5, 0, 1.5)
    torch.library.opcheck(torch.ops.flash3.attention_fwd.default, args)


def test_opcheck_attention_varlen_bwd():
    cq, ck = torch.tensor([0, 3, 10], dtype=torch.int32), torch.tensor([0, 5, 12], dtype=torch.int32)
    q, k, v = torch.randn(10, 4, 8), torch.randn(12, 2, 8), torch.randn(12, 2, 4)
    out, lse = torch.ops.flash3.attention_varlen_fwd(q, k, v, cq, ck, 7, 7, 0.3, -1, 0, 0.0)
    dout, dlse = torch.randn_like(out), torch.randn_like(lse)
    # max_seqlen_q/k right after cu_seqlens_k, as in the forward
    args = (dout, q, k, v, out, lse, dlse, cq, ck, 7, 7, 0.3, -1, 0, 0.0, True)
    torch.library.opcheck(torch.ops.flash3.attention_varlen_bwd.default, args)
    names = [a.name for a in torch.ops.flash3.attention_varlen_bwd.default._schema.arguments]
    assert names[7:11] == ["cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k"]


def test_opcheck_attention_fp8_varlen():
    cq, ck = torch.tensor([0, 3, 10], dtype=torch.int32), torch.tensor([0, 5, 12], dtype=torch.int32)
    q8, k8, v8 = (torch.randn(n, h, 16).to(torch.float8_e4m3fn) for n, h in ((10, 4), (12, 2), (12, 2)))
    desc = (torch.rand(2, 4) + 0.5, torch.rand(2, 2) + 0.5, torch.rand(2, 2) + 0.5)
    args = (q8, k8, v8, cq, ck, 7, 7, *desc, 0.25, -1, 0, 0.0, 64, 128)
    # fp8 inputs: the schema test does arithmetic torch lacks for float8 on the CPU
    torch.library.opcheck(torch.ops.flash3.attention_fp8_varlen.default, args,
                          test_utils=("test_faketensor", "test_aot_dispatch_dynamic"))


def test_opcheck_kvcache_append_packed():
    """The packed append op: its schema (mutates the caches), fake and dispatch agree."""
    cq, cn = torch.tensor([0, 2, 2, 5], dtype=torch.int32), torch.tensor([0, 1, 3, 3], dtype=torch.int32)
    ang = torch.arange(16.0)[:, None] * torch.tensor([1.0, 0.1])[None]
    q, k, v = torch.randn(6, 4, 8), torch.randn(4, 2, 8), torch.randn(4, 2, 8)
    kc, vc = torch.randn(3, 8, 2, 8), torch.randn(3, 8, 2, 8)
    n = torch.tensor([3, 0, 5], dtype=torch.int32)
    for rotary in (True, False):
        cos, sin = (ang.cos(), ang.sin()) if rotary else (None, None)
        args = (q, kc, vc, k, v, n, None, cq, cn, cos, sin, False, True, None)
        torch.library.opcheck(torch.ops.flash3.kvcache_append_packed.default, args)


def test_compile_attention_fwd_bwd_aot_eager():
    @torch.compile(backend="aot_eager", fullgraph=True)
    def f(q, k, v):
        out, lse = flash3.attention(q, k, v, causal=True, window_size=(6, -1), softcap=2.0,
                                    return_lse=True)
        return out.sin().sum() + lse.sum()

    q, k, v = (torch.randn(2, 13, 4, 16, requires_grad=True) for _ in range(3))
    f(q, k, v).backward()
    grads = [x.grad.clone() for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    out, lse = flash3.attention(q, k, v, causal=True, window_size=(6, -1), softcap=2.0,
                                return_lse=True)
    (out.sin().sum() + lse.sum()).backward()
    for g, x in zip(grads, (q, k, v)):
        torch.testing.assert_close(g, x.grad)


def test_compile_varlen_aot_eager():
    cq = torch.tensor([0, 3, 10], dtype=torch.int32)
    ck = torch.tensor([0, 5, 12], dtype=torch.int32)

    @torch.compile(backend="aot_eager", fullgraph=True)
    def f(q, k, v):
        return flash3.attention_varlen(q, k, v, cq, ck, 7, 7, causal=True).sum()

    q, k, v = torch.randn(10, 2, 8), torch.randn(12, 2, 8), torch.randn(12, 2, 8)
    q.requires_grad_()
    f(q, k, v).backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


def test_compile_kvcache_aot_eager_mutates():
    @torch.compile(backend="aot_eager", fullgraph=True)
    def step(q, kc, vc, k, v, n):
        return flash3.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=n, causal=True)

    q, k, v = torch.randn(2, 1, 2, 8), torch.randn(2, 1, 2, 8), torch.randn(2, 1, 2, 8)
    kc, vc = torch.zeros(2, 6, 2, 8), torch.zeros(2, 6, 2, 8)
    n = torch.tensor([0, 2], dtype=torch.int32)
    out = step(q, kc, vc, k, v, n)
    assert torch.equal(kc[0, 0], k[0, 0]) and torch.equal(kc[1, 2], k[1, 0])
    assert torch.equal(vc[1, 2], v[1, 0])
    # Row 0 saw just its one new key: output is that value.
    torch.testing.assert_close(out[0, 0], v[0, 0].repeat(1, 1).expand(2, 8))


def test_compile_kvcache_leftpad_aot_eager():
    """cache_leftpad through the custom op under torch.compile: row 1's keys start at slot 2,
    so its one query (causal, bottom-right) sees exactly the appended key."""
    @torch.compile(backend="aot_eager", fullgraph=True)
    def step(q, kc, vc, k, v, n, lp):
        return flash3.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=n, cache_leftpad=lp,
                                             causal=True)

    q, k, v = torch.randn(2, 1, 2, 8), torch.randn(2, 1, 2, 8), torch.randn(2, 1, 2, 8)
    kc, vc = torch.randn(2, 6, 2, 8), torch.randn(2, 6, 2, 8)
    n, lp = torch.tensor([3, 2], dtype=torch.int32), torch.tensor([0, 2], dtype=torch.int32)
    out = step(q, kc, vc, k, v, n, lp)
    torch.testing.assert_close(out[1, 0], v[1, 0].repeat(1, 1).expand(2, 8))
    ref = attention_ref64(q[:1].double(), kc[:1, :4].double(), vc[:1, :4].double())[0]
    assert (out[:1].double() - ref).abs().max() < 1e-5


def test_compile_kvcache_packed_append_aot_eager():
    """FA3's packed appends (cu_seqlens_k_new, packed queries, rotary, cache_leftpad) under
    torch.compile: the append op mutates the caches, the result equals the eager call's."""
    cq, cn = torch.tensor([0, 2, 2, 5], dtype=torch.int32), torch.tensor([0, 1, 3, 3], dtype=torch.int32)
    ang = torch.arange(16.0)[:, None] * torch.tensor([1.0, 0.1])[None]

    def step(q, kc, vc, k, v, n, lp):
        return flash3.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=n, cache_leftpad=lp,
                                             cu_seqlens_q=cq, max_seqlen_q=3, cu_seqlens_k_new=cn,
                                             rotary_cos=ang.cos(), rotary_sin=ang.sin(), causal=True)

    q, k, v = torch.randn(5, 4, 8), torch.randn(3, 2, 8), torch.randn(3, 2, 8)
    caches = torch.randn(3, 8, 2, 8), torch.randn(3, 8, 2, 8)
    n, lp = torch.tensor([3, 0, 5], dtype=torch.int32), torch.tensor([1, 0, 2], dtype=torch.int32)
    kc, vc = (c.clone() for c in caches)
    out = torch.compile(step, backend="aot_eager", fullgraph=True)(q, kc, vc, k, v, n, lp)
    kc_e, vc_e = (c.clone() for c in caches)
    want = step(q, kc_e, vc_e, k, v, n, lp)
    assert torch.equal(kc, kc_e) and torch.equal(vc, vc_e) and not torch.equal(kc, caches[0])
    torch.testing.assert_close(out, want)


def test_compile_kvcache_chunk_aot_eager():
    """attention_chunk through the custom op under torch.compile: with chunk 4 the one query of
    row 0 (at key position 5 of 6, bottom-right) sees keys 4 and 5 only, row 1's (position 3)
    keys 0..3."""
    @torch.compile(backend="aot_eager", fullgraph=True)
    def step(q, kc, vc, n):
        return flash3.attention_with_kvcache(q, kc, vc, cache_seqlens=n, causal=True,
                                             attention_chunk=4)

    q, kc, vc = torch.randn(2, 1, 2, 8), torch.randn(2, 6, 2, 8), torch.randn(2, 6, 2, 8)
    n = torch.tensor([6, 4], dtype=torch.int32)
    out = step(q, kc, vc, n)
    for i, (a, b) in enumerate(((4, 6), (0, 4))):
        ref = attention_ref64(q[i:i + 1].double(), kc[i:i + 1, a:b].double(), vc[i:i + 1, a:b].double())[0]
        assert (out[i:i + 1].double() - ref).abs().max() < 1e-5


def test_compile_inductor_small():
    @torch.compile(backend="inductor", fullgraph=True)
    def f(q, k, v):
        return flash3.attention(q, k, v, causal=True) * 2

    q, k, v = (torch.randn(1, 8, 2, 8) for _ in range(3))
    ref = attention_ref64(q.double(), k.double(), v.double(), causal=True)[0]
    torch.testing.assert_close(f(q, k, v).double(), 2 * ref, rtol=1e-5, atol=1e-5)
