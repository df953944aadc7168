"""attention_varlen: packed sequences give the per-sequence results."""

import pytest
import torch

import flash3
from flash3 import reference
from helpers import attention_ref64, max_err


@pytest.fixture(autouse=True)
def small_tiles(monkeypatch):
    monkeypatch.setattr(reference, "BLOCK_M", 16)
    monkeypatch.setattr(reference, "BLOCK_N", 32)


def cu(lengths):
    return torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)


CASES = [  # (q lengths, k lengths, h, h_k, d, d_v, kwargs)
    ([5, 0, 37, 1], [9, 4, 20, 1], 4, 2, 16, 16, dict(causal=True)),
    ([64, 3], [3, 64], 2, 2, 8, 12, dict()),
    ([17, 40, 0], [0, 33, 5], 2, 1, 16, 16, dict(window_size=(4, 2), softcap=2.0)),
    ([30, 30], [30, 50], 3, 3, 16, 16, dict(causal=True, window_size=(10, -1),
                                            softmax_scale=0.2)),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_varlen_matches_per_sequence(dtype, case):
    lq, lk, h, h_k, d, d_v, kw = CASES[case]
    cq, ck = cu(lq), cu(lk)
    q = torch.randn(sum(lq), h, d, dtype=dtype, requires_grad=True)
    k = torch.randn(sum(lk), h_k, d, dtype=dtype, requires_grad=True)
    v = torch.randn(sum(lk), h_k, d_v, dtype=dtype, requires_grad=True)
    out, lse = flash3.attention_varlen(q, k, v, cq, ck, max(lq), max(lk), return_lse=True, **kw)
    assert out.shape == (sum(lq), h, d_v) and out.dtype == dtype
    assert lse.shape == (h, sum(lq)) and lse.dtype == torch.float32
    g = torch.randn_like(out)
    out.backward(g)

    for i in range(len(lq)):
        q0, q1, k0, k1 = int(cq[i]), int(cq[i + 1]), int(ck[i]), int(ck[i + 1])
        # Per-sequence results of the batched API: identical code path, so equal.
        qi, ki, vi = (x.detach()[None, a:b].clone().requires_grad_()
                      for x, a, b in ((q, q0, q1), (k, k0, k1), (v, k0, k1)))
        oi, li = flash3.attention(qi, ki, vi, return_lse=True, **kw)
        assert torch.equal(out[q0:q1], oi[0].detach())
        assert torch.equal(lse[:, q0:q1], li[0])
        if q1 > q0:
            oi.backward(g[None, q0:q1])
            assert torch.equal(q.grad[q0:q1], qi.grad[0])
            assert torch.equal(k.grad[k0:k1], ki.grad[0])
            assert torch.equal(v.grad[k0:k1], vi.grad[0])
        # And close to fp64 (fp32 only; bf16 is covered by the batched tests).
        if dtype == torch.float32:
            ro, rl = attention_ref64(qi.detach().double(), ki.detach().double(),
                                     vi.detach().double(), **kw)
            assert max_err(oi, ro) < 1e-5


def test_varlen_zero_length_sequences_and_padding():
    # Tokens past cu_seqlens[-1] are ignored: zero output, zero gradient.
    cq, ck = cu([0, 3, 0]), cu([2, 0, 4])
    q = torch.randn(5, 2, 8, requires_grad=True)   # 3 used, 2 padding
    k = torch.randn(7, 2, 8, requires_grad=True)   # 6 used
    v = torch.randn(7, 2, 8, requires_grad=True)
    out, lse = flash3.attention_varlen(q, k, v, cq, ck, 3, 4, return_lse=True)
    assert torch.all(out[:3] == 0) and torch.all(lse[:, :3] == float("-inf"))  # seq 1 has no keys
    assert torch.all(out[3:] == 0)
    out.sum().backward()
    assert torch.all(q.grad == 0) and torch.all(k.grad == 0)


def _poison(x):
    """NaN, +Inf, -Inf in turn over x (in place): what unused buffer space may hold."""
    flat = x.view(-1)
    for i, val in enumerate((float("nan"), float("inf"), float("-inf"))):
        flat[i::3] = val


@pytest.mark.parametrize("kw", [dict(), dict(causal=True), dict(window_size=(5, 3), softcap=2.0)],
                         ids=["full", "causal", "window_softcap"])
def test_varlen_non_finite_tail_is_never_read(kw):
    # Packed buffers longer than cu_seqlens[-1] whose unused rows hold NaN/Inf (q, k, v and the
    # output gradient): every sequence's out, lse and gradients are those of the sequence alone
    # (finite), the tail gets 0 output and 0 gradients. Sequences of 0 queries / 0 keys included.
    lq, lk = [37, 0, 20, 13], [45, 9, 0, 29]
    pad_q, pad_k = 11, 17
    cq, ck = cu(lq), cu(lk)
    nq, nk = sum(lq), sum(lk)
    q = torch.randn(nq + pad_q, 2, 16)
    k = torch.randn(nk + pad_k, 1, 16)
    v = torch.randn(nk + pad_k, 1, 8)
    g = torch.randn(nq + pad_q, 2, 8)
    for x, n in ((q, nq), (k, nk), (v, nk), (g, nq)):
        _poison(x[n:])
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    out, lse = flash3.attention_varlen(q, k, v, cq, ck, max(lq), max(lk), return_lse=True, **kw)
    out.backward(g)
    assert torch.equal(out[nq:], torch.zeros_like(out[nq:]))
    assert torch.isfinite(out).all() and not torch.isnan(lse).any()
    for grad in (q.grad, k.grad, v.grad):
        assert torch.isfinite(grad).all()
    assert not q.grad[nq:].any() and not k.grad[nk:].any() and not v.grad[nk:].any()
    for i in range(len(lq)):
        q0, q1, k0, k1 = int(cq[i]), int(cq[i + 1]), int(ck[i]), int(ck[i + 1])
        if q1 == q0:
            continue
        qi, ki, vi = (x.detach()[None, a:b].clone().requires_grad_()
                      for x, a, b in ((q, q0, q1), (k, k0, k1), (v, k0, k1)))
        oi, li = flash3.attention(qi, ki, vi, return_lse=True, **kw)
        assert torch.equal(out[q0:q1], oi[0].detach()) and torch.equal(lse[:, q0:q1], li[0])
        ro, rl = attention_ref64(qi.detach().double(), ki.detach().double(), vi.detach().double(), **kw)
        assert max_err(oi, ro) < 1e-5
        oi.backward(g[None, q0:q1])
        assert torch.equal(q.grad[q0:q1], qi.grad[0])
        assert torch.equal(k.grad[k0:k1], ki.grad[0]) and torch.equal(v.grad[k0:k1], vi.grad[0])
