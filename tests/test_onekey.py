"""Rows that see a single key (issue 23): their softmax is the constant 1, so the exact gradient
has dS = 0 there: dq of such a row is exactly 0, the row adds nothing to dk, and it adds exactly
1 * dO to its key's dv. The reference backend must give these exactly (flash3.reference
ONE_HOT_TOL), on the tiled path and with torch's CPU kernel enabled, in every dtype, with and
without causal and softcap; with a gradient into lse, dS = dlse (checked against fp64 autograd).

dO holds multiples of 1/16 in [-4, 4), so every sum of dO in the expected dv is exact in fp32.
"""
import pytest
import torch

from flash3 import _torch_cpu, masking
from flash3 import reference as R

DTYPES = [torch.bfloat16, torch.float16, torch.float32]


@pytest.fixture(params=[True, False], ids=["torch_kernel_on", "tiled"])
def torch_kernel(request, monkeypatch):
    monkeypatch.setattr(_torch_cpu, "USE_TORCH_CPU_KERNEL", request.param)


def _inputs(b, sq, sk, h, hk, d, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, sq, h, d, generator=g).to(dtype)
    k = torch.randn(b, sk, hk, d, generator=g).to(dtype)
    v = torch.randn(b, sk, hk, d, generator=g).to(dtype)
    dout = (torch.randint(-64, 64, (b, sq, h, d), generator=g) / 16).to(dtype)
    return q, k, v, dout


def _expected_dv(dout, sq, sk, hk, left, right):
    """sum_i visible(i, j) dO_i (fp64, exact here), summed over each kv head's query heads."""
    vis = masking.visible_mask(0, sq, 0, sk, sq, sk, False, left, right).double()  # (sq, sk)
    b, _, h, d = dout.shape
    per_head = torch.einsum("qk,bqhd->bkhd", vis, dout.double())
    return per_head.view(b, sk, hk, h // hk, d).sum(3)


def _grads(q, k, v, dout, left, right, softcap, dlse=None):
    scale = q.shape[-1] ** -0.5
    out, lse = R.forward(q, k, v, scale, left, right, softcap)
    return out, lse, R.backward(dout, q, k, v, out, lse, scale, left, right, softcap, dlse=dlse)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("softcap", [0.0, 5.0])
@pytest.mark.parametrize("heads", [(3, 3), (4, 2)], ids=["mha", "gqa"])
def test_one_key(torch_kernel, dtype, causal, softcap, heads):
    """s_k = 1: every row sees the key (causal: only the last row does; the others see nothing)."""
    h, hk = heads
    q, k, v, dout = _inputs(2, 7, 1, h, hk, 64, dtype, seed=1)
    left, right = -1, 0 if causal else -1
    out, lse, (dq, dk, dv) = _grads(q, k, v, dout, left, right, softcap)
    assert torch.equal(dq, torch.zeros_like(dq))
    assert torch.equal(dk, torch.zeros_like(dk))
    assert torch.equal(dv, _expected_dv(dout, 7, 1, hk, left, right).to(dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("softcap", [0.0, 5.0])
def test_diagonal_window(torch_kernel, dtype, softcap):
    """Window (0, 0): each row sees only its own key, over several query and key tiles."""
    q, k, v, dout = _inputs(1, 150, 150, 2, 2, 32, dtype, seed=2)
    scale = q.shape[-1] ** -0.5
    out, lse = R.forward(q, k, v, scale, 0, 0, softcap, block_m=64, block_n=64)
    dq, dk, dv = R.backward(dout, q, k, v, out, lse, scale, 0, 0, softcap, block_m=64, block_n=64)
    assert torch.equal(out, v)
    assert torch.equal(dq, torch.zeros_like(dq)) and torch.equal(dk, torch.zeros_like(dk))
    assert torch.equal(dv, dout)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("softcap", [0.0, 5.0])
def test_varlen_one_key_sequences(torch_kernel, dtype, causal, softcap):
    """Sequences (s_q, s_k) = (1, 3), (2, 1), (5, 1), (4, 6): dq exactly 0 in the rows that see one
    key (all of (2, 1) and (5, 1); causal (1, 3) sees all three keys), dv of those keys exact."""
    lq, lk = [1, 2, 5, 4], [3, 1, 1, 6]
    g = torch.Generator().manual_seed(3)
    q = torch.randn(sum(lq), 2, 64, generator=g).to(dtype)
    k = torch.randn(sum(lk), 2, 64, generator=g).to(dtype)
    v = torch.randn(sum(lk), 2, 64, generator=g).to(dtype)
    dout = (torch.randint(-64, 64, (sum(lq), 2, 64), generator=g) / 16).to(dtype)
    cq = torch.tensor([0] + lq).cumsum(0).to(torch.int32)
    ck = torch.tensor([0] + lk).cumsum(0).to(torch.int32)
    left, right = -1, 0 if causal else -1
    scale = 64 ** -0.5
    out, lse = R.varlen_forward(q, k, v, cq, ck, scale, left, right, softcap)
    dq, dk, dv = R.varlen_backward(dout, q, k, v, out, lse, cq, ck, scale, left, right, softcap)
    for i in range(len(lq)):
        a, e, ka, ke = cq[i].item(), cq[i + 1].item(), ck[i].item(), ck[i + 1].item()
        counts = masking.visible_counts(e - a, ke - ka, False, left, right)
        one = counts == 1
        assert torch.equal(dq[a:e][one], torch.zeros_like(dq[a:e][one]))
        if bool((counts <= 1).all()):  # causal (5, 1): four rows see nothing, the last one key
            assert torch.equal(dk[ka:ke], torch.zeros_like(dk[ka:ke]))
            want = _expected_dv(dout[None, a:e], e - a, ke - ka, 2, left, right)[0]
            assert torch.equal(dv[ka:ke], want.to(dtype))
        else:
            assert dq[a:e][counts > 1].abs().max() > 0  # rows that see several keys: a real gradient


def _autograd64(q, k, v, dout, dlse, left, right, softcap):
    leaves = [x.detach().double().requires_grad_() for x in (q, k, v)]
    qq, kk, vv = leaves
    g = q.shape[2] // k.shape[2]
    kk, vv = kk.repeat_interleave(g, dim=2), vv.repeat_interleave(g, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", qq, kk) * q.shape[-1] ** -0.5
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    keep = masking.visible_mask(0, q.shape[1], 0, k.shape[1], q.shape[1], k.shape[1], False, left, right)
    s = s.masked_fill(~keep, -1e30)
    lse = torch.logsumexp(s, dim=-1)
    out = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, dim=-1), vv)
    torch.autograd.backward([out, lse], [dout.double(), dlse.double()])
    return [x.grad for x in leaves]


@pytest.mark.parametrize("softcap", [0.0, 5.0])
def test_one_key_with_dlse(softcap):
    """With a gradient into lse a one-key row has dS = dlse (d lse / d s = P = 1): dq = scale dlse k."""
    q, k, v, dout = _inputs(1, 5, 1, 2, 2, 32, torch.float32, seed=4)
    dlse = torch.randn(1, 2, 5, generator=torch.Generator().manual_seed(5))
    _, _, got = _grads(q, k, v, dout, -1, -1, softcap, dlse=dlse)
    want = _autograd64(q, k, v, dout, dlse, -1, -1, softcap)
    for name, a, w in zip("qkv", got, want):
        assert (a.double() - w).abs().max().item() <= 1e-5 * (1 + w.abs().max().item()), name


def test_foreign_lse_keeps_the_plain_formula():
    """An lse over more keys than the call sees (ring attention's chunks): a row that sees one key of
    this call but whose P there is far from 1 keeps P = exp(s - lse) and dS = P (dP - D)."""
    q, k, v, dout = _inputs(1, 6, 12, 2, 2, 32, torch.float32, seed=6)
    scale = 32 ** -0.5
    out, lse = R.forward(q, k, v, scale, -1, 0, 0.0)  # causal over all 12 keys
    full = R.backward(dout, q, k, v, out, lse, scale, -1, 0, 0.0)
    # The same gradients as two calls: keys [0, 6) (every row sees all) and keys [6, 12) causal
    # (row 0 sees one key of it: P = exp(s - lse) < 1 there).
    a = R.backward(dout, q, k[:, :6], v[:, :6], out, lse, scale, -1, -1, 0.0)
    b = R.backward(dout, q, k[:, 6:], v[:, 6:], out, lse, scale, -1, 0, 0.0)
    assert masking.visible_counts(6, 6, True, -1, -1)[0] == 1
    torch.testing.assert_close(a[0] + b[0], full[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(torch.cat([a[1], b[1]], 1), full[1], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(torch.cat([a[2], b[2]], 1), full[2], rtol=1e-5, atol=1e-6)


def test_visible_counts_match_the_mask():
    for sq, sk in [(7, 1), (5, 9), (9, 5), (1, 3), (0, 4)]:
        for left, right in [(-1, -1), (-1, 0), (2, 0), (0, 0), (3, 1), (0, 2)]:
            want = masking.visible_mask(0, sq, 0, sk, sq, sk, False, left, right).sum(1)
            assert torch.equal(masking.visible_counts(sq, sk, False, left, right), want), (sq, sk, left, right)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_causal_square_first_row(monkeypatch, dtype):
    """Causal with s_q = s_k: row 0 sees key 0 only, so its dq is exactly 0 on both paths; torch's
    kernel still serves the call (row 0 apart), by the FlashAttention rule against fp64."""
    import flash3
    from helpers import check_against_reference
    q, k, v, dout = _inputs(2, 50, 50, 4, 2, 32, dtype, seed=7)
    taken = []
    real = _torch_cpu.backward
    monkeypatch.setattr(_torch_cpu, "backward", lambda *a, **kw: taken.append(1) or real(*a, **kw))
    check_against_reference(flash3.attention, q, k, v, causal=True)
    assert taken
    out, lse, fast = _grads(q, k, v, dout, -1, 0, 0.0)
    monkeypatch.setattr(_torch_cpu, "USE_TORCH_CPU_KERNEL", False)
    tiled = R.backward(dout, q, k, v, out, lse, 32 ** -0.5, -1, 0, 0.0)
    for dq in (fast[0], tiled[0]):
        assert torch.equal(dq[:, 0], torch.zeros_like(dq[:, 0])) and dq[:, 1].abs().max() > 0
