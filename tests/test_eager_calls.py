"""Eager calls skip torch.library's dispatch (flash3/ops.py `run`) and compute exactly what the
registered ops compute; anything else (fake tensors, dispatch modes, subclasses, torch.compile)
still goes through the ops."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

import flash3
from flash3 import ops


def _qkv(shape_q, shape_kv, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g, requires_grad=True) for s in (shape_q, shape_kv, shape_kv)]


def _grads(out, lse, inputs, seed):
    g = torch.Generator().manual_seed(seed)
    loss = (out * torch.randn(out.shape, generator=g)).sum() + (lse * torch.randn(lse.shape, generator=g)).sum()
    return torch.autograd.grad(loss, inputs)


class _Count(TorchDispatchMode):
    """Counts the flash3 ops that reach the dispatcher."""
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "flash3":
            self.names.append(func.name())
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("alibi,chunk", [(False, 0), (True, 0), (False, 4)])
def test_eager_attention_equals_the_op_bitwise(alibi, chunk):
    q, k, v = _qkv((2, 11, 4, 16), (2, 13, 2, 16), 1)
    slopes = torch.rand(4) if alibi else None
    args = (0.3, 5, 0, 1.5, False, slopes, chunk)
    out, lse = ops.run(ops.attention_fwd, q, k, v, *args)
    assert type(out.grad_fn).__name__.startswith("Eager")  # the plain autograd.Function
    ref_out, ref_lse = ops.attention_fwd(q, k, v, *args)
    assert "Eager" not in type(ref_out.grad_fn).__name__
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)
    for a, b in zip(_grads(out, lse, (q, k, v), 2), _grads(ref_out, ref_lse, (q, k, v), 2)):
        assert torch.equal(a, b)


def test_eager_varlen_equals_the_op_bitwise():
    cq, ck = torch.tensor([0, 3, 10], dtype=torch.int32), torch.tensor([0, 5, 12], dtype=torch.int32)
    q, k, v = _qkv((10, 4, 8), (12, 2, 8), 3)
    used_k = torch.tensor([4, 6], dtype=torch.int32)
    args = (cq, ck, 7, 7, 0.3, -1, 0, 0.0, True, None, None, 0, used_k)
    out, lse = ops.run(ops.attention_varlen_fwd, q, k, v, *args)
    ref_out, ref_lse = ops.attention_varlen_fwd(q, k, v, *args)
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)
    for a, b in zip(_grads(out, lse, (q, k, v), 4), _grads(ref_out, ref_lse, (q, k, v), 4)):
        assert torch.equal(a, b)


def test_missing_defaults_are_filled_and_dispatch_modes_take_the_ops():
    # torch.distributed's ring passes the first seven arguments: the Function still gets ten.
    q, k, v = _qkv((1, 9, 2, 8), (1, 9, 2, 8), 5)
    out, lse = ops.run(ops.attention_fwd, q, k, v, 0.35, -1, 0, 0.0)
    dq, dk, dv = _grads(out, lse, (q, k, v), 6)
    ref = ops.attention_fwd(q, k, v, 0.35, -1, 0, 0.0)
    assert all(torch.equal(a, b) for a, b in zip(_grads(*ref, (q, k, v), 6), (dq, dk, dv)))
    # A dispatch mode is not plain eager: the ops run (and are seen), forward and backward.
    with _Count() as seen:
        out, lse = flash3.attention(q, k, v, causal=True, return_lse=True)
        _grads(out, lse, (q, k, v), 7)
    assert seen.names == ["flash3::attention_fwd", "flash3::attention_bwd"]


def test_no_grad_and_kvcache_calls_run_the_body():
    q, k, v = (x.detach() for x in _qkv((1, 5, 2, 8), (1, 7, 2, 8), 8))
    out = flash3.attention(q, k, v, causal=True)
    assert out.grad_fn is None
    assert torch.equal(out, ops.attention_fwd(q, k, v, 8 ** -0.5, -1, 0, 0.0)[0])
    kc, vc = torch.randn(1, 16, 2, 8), torch.randn(1, 16, 2, 8)
    n = torch.tensor([7], dtype=torch.int32)
    kc2, vc2 = kc.clone(), vc.clone()
    out = flash3.attention_with_kvcache(q, kc, vc, k=k[:, :3], v=v[:, :3], cache_seqlens=n, causal=True)
    ref, _ = ops.attention_kvcache(q, kc2, vc2, k[:, :3], v[:, :3], n, None, 8 ** -0.5, -1, 0, 0.0)
    assert torch.equal(out, ref) and torch.equal(kc, kc2) and torch.equal(vc, vc2)


def test_fake_tensors_take_the_op():
    with FakeTensorMode():
        q, k, v = torch.randn(2, 9, 4, 8), torch.randn(2, 9, 2, 8), torch.randn(2, 9, 2, 4)
        out, lse = flash3.attention(q, k, v, causal=True, return_lse=True)
    assert type(out).__name__ == "FakeTensor" and out.shape == (2, 9, 4, 4) and lse.shape == (2, 4, 9)


def test_second_derivative_still_raises():
    q, k, v = _qkv((1, 6, 2, 8), (1, 6, 2, 8), 9)
    dq, = torch.autograd.grad(flash3.attention(q, k, v).sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="no autograd formula"):
        dq.sum().backward()


def test_transforms_traces_and_meta_tensors_take_the_op():
    """Each context where the body would differ from the op takes the op (found in review)."""
    q, k, v = _qkv((1, 6, 2, 8), (1, 6, 2, 8), 10)
    # torch.func over a function that closes over grad-requiring q/k/v
    g = torch.func.grad(lambda x: flash3.attention(q, k, v).sum() * x)(torch.tensor(1.0))
    assert torch.equal(g, flash3.attention(q, k, v).sum().detach())
    # torch.jit.trace records the op, not the reference backend's operations
    traced = torch.jit.trace(lambda a, b, c: flash3.attention(a, b, c, causal=True),
                             tuple(x.detach() for x in (q, k, v)), check_trace=False)
    assert "flash3::attention_fwd" in str(traced.graph)
    # meta tensors: the op's fake impl (the body would read values)
    cq = torch.tensor([0, 6], dtype=torch.int32, device="meta")
    qm, km, vm = (torch.empty(6, 2, 8, device="meta") for _ in range(3))
    out = flash3.attention_varlen(qm, km, vm, cq, cq, 6, 6, causal=True)
    assert out.is_meta and out.shape == (6, 2, 8)
    # forward-mode AD: the op's behaviour (no tangent through it), not the body's
    import torch.autograd.forward_ad as fwAD
    x = torch.randn(1, 6, 2, 8)
    with fwAD.dual_level():
        dual = fwAD.make_dual(x, torch.ones_like(x))
        with _Count() as seen:
            flash3.attention(dual, x, x, softcap=5.0)
    assert seen.names == ["flash3::attention_fwd"]


@pytest.mark.parametrize("append", [False, True])
def test_kvcache_bumps_cache_versions_like_the_op(append):
    q = torch.randn(1, 2, 2, 8)
    k, v = torch.randn(1, 2, 2, 8), torch.randn(1, 2, 2, 8)
    n = torch.tensor([5], dtype=torch.int32)
    kw = dict(k=k, v=v) if append else {}
    versions = []
    for call in (lambda kc, vc: flash3.attention_with_kvcache(q, kc, vc, cache_seqlens=n, **kw),
                 lambda kc, vc: ops.attention_kvcache(q, kc, vc, kw.get("k"), kw.get("v"), n, None,
                                                      8 ** -0.5, -1, -1, 0.0)):
        kc, vc = torch.randn(1, 16, 2, 8), torch.randn(1, 16, 2, 8)
        before = (kc._version, vc._version)
        call(kc, vc)
        versions.append((kc._version - before[0], vc._version - before[1]))
    assert versions[0] == versions[1] and min(versions[0]) >= 1


def test_a_torch_without_the_probes_takes_the_op(monkeypatch):
    monkeypatch.setattr(ops, "_PROBES", False)
    q, k, v = _qkv((1, 5, 2, 8), (1, 5, 2, 8), 11)
    out = flash3.attention(q, k, v, causal=True)
    assert "Eager" not in type(out.grad_fn).__name__
