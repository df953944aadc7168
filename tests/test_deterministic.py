"""deterministic=True: the keyword reaches the operators, and the backward is bitwise reproducible."""

import pytest
import torch

import flash3


def test_ops_carry_the_keyword():
    for op in (torch.ops.flash3.attention_fwd, torch.ops.flash3.attention_bwd,
               torch.ops.flash3.attention_varlen_fwd, torch.ops.flash3.attention_varlen_bwd):
        args = {a.name: a for a in op.default._schema.arguments}
        assert args["deterministic"].default_value is False, op
        # after it only optional arguments that default to off: alibi_slopes, on the varlen ops
        # seqused_q (None), attention_chunk (0), and on the varlen ops seqused_k (None)
        names = [a.name for a in op.default._schema.arguments]
        varlen = "varlen" in str(op)
        tail = ["alibi_slopes"] + (["seqused_q"] if varlen else [])
        after = ["seqused_k"] if varlen else []
        assert names[names.index("deterministic") + 1:] == tail + ["attention_chunk"] + after, op
        assert all(args[n].default_value is None for n in tail + after), op
        assert args["attention_chunk"].default_value == 0, op


@pytest.mark.parametrize("kw", [dict(causal=True), dict(window_size=(40, 7), softcap=5.0)])
def test_backward_bitwise_reproducible(kw):
    q = torch.randn(2, 301, 8, 64, requires_grad=True)
    k = torch.randn(2, 301, 2, 64, requires_grad=True)
    v = torch.randn(2, 301, 2, 64, requires_grad=True)
    g = torch.randn(2, 301, 8, 64)
    runs = []
    for _ in range(3):
        out = flash3.attention(q, k, v, deterministic=True, **kw)
        runs.append(torch.autograd.grad(out, (q, k, v), g))
    for other in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], other))


def test_varlen_deterministic_and_same_as_default():
    cu = torch.tensor([0, 50, 51, 170], dtype=torch.int32)
    q = torch.randn(170, 4, 32, requires_grad=True)
    k = torch.randn(170, 2, 32, requires_grad=True)
    v = torch.randn(170, 2, 32, requires_grad=True)
    g = torch.randn(170, 4, 32)
    grads = []
    for det in (True, True, False):
        out = flash3.attention_varlen(q, k, v, cu, cu, 119, 119, causal=True, deterministic=det)
        grads.append(torch.autograd.grad(out, (q, k, v), g))
    for other in grads[1:]:
        assert all(torch.equal(a, b) for a, b in zip(grads[0], other))
