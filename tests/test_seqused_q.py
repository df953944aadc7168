"""FA3's seqused_q on flash3's own varlen path: attention_varlen(seqused_q=) and
flash_attn_interface.flash_attn_varlen_func(seqused_q=) (no longer the spec's) against the FA3 spec
(flash3/reference/fa3.py), forward and autograd; values outside [0, the sequence's length] are
clamped; bad tensors raise naming seqused_q. The CUDA kernels: tests/test_seqused_q_gpu.py."""

import math

import pytest
import torch

import flash3
from flash3 import flash_attn_interface as fai
from flash3.reference.fa3 import fa3_forward
from helpers import cu


pytestmark = pytest.mark.usefixtures("small_tiles")


LQ, LK = [7, 3, 9, 12, 5], [10, 4, 12, 6, 0]
# cut, cut to 0, past the length (clamped to 9), negative (clamped to 0), cut; sequence 4 has no key
USED = [5, 0, 40, -3, 2]
CLAMPED = [5, 0, 9, 0, 2]
OPTIONS = [dict(causal=False), dict(causal=True), dict(window_size=(3, 1), softcap=2.0)]


def inputs(h=4, h_k=2, d=16, d_v=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(LQ), h, d, generator=g)
    k = torch.randn(sum(LK), h_k, d, generator=g)
    v = torch.randn(sum(LK), h_k, d_v, generator=g)
    # rows past seqused_q: what no result may depend on
    q[past_used()] = float("nan")
    return q, k, v


def past_used():
    mask = torch.zeros(sum(LQ), dtype=torch.bool)
    start = 0
    for n, used in zip(LQ, CLAMPED):
        mask[start + used:start + n] = True
        start += n
    return mask


def spec(q, k, v, **kw):
    """FA3's forward (its seqused_q taken already clamped: the spec slices with the raw value)."""
    left, right = flash3.masking.normalize_window(kw.get("causal", False),
                                                  kw.get("window_size", (-1, -1)))
    return fa3_forward(q, k, v, softmax_scale=q.shape[-1] ** -0.5, window_left=left,
                       window_right=right, softcap=kw.get("softcap", 0.0), cu_seqlens_q=cu(LQ),
                       cu_seqlens_k=cu(LK), seqused_q=torch.tensor(CLAMPED, dtype=torch.int32))


@pytest.mark.parametrize("kw", OPTIONS, ids=str)
def test_matches_fa3_spec_forward_and_grads(kw):
    q, k, v = inputs()
    used = torch.tensor(USED, dtype=torch.int32)
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    out, lse = flash3.attention_varlen(qg, kg, vg, cu(LQ), cu(LK), max(LQ), max(LK), seqused_q=used,
                                       return_lse=True, **kw)
    qs, ks, vs = (x.clone().requires_grad_() for x in (q, k, v))
    ref, ref_lse = spec(qs, ks, vs, **kw)
    pad = past_used()
    assert torch.equal(out[pad], torch.zeros_like(out[pad]))  # rows past seqused_q: out 0, lse -inf
    assert (lse[:, pad] == -math.inf).all()
    assert torch.allclose(out, ref, atol=1e-5, rtol=0)
    assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse))
    fin = torch.isfinite(ref_lse)
    assert torch.allclose(lse[fin], ref_lse[fin], atol=1e-5, rtol=0)
    g = torch.randn_like(out)
    (out * g).sum().backward()
    (ref * g).sum().backward()
    assert torch.equal(qg.grad[pad], torch.zeros_like(qg.grad[pad]))  # dq 0 past seqused_q
    for x, r in ((qg, qs), (kg, ks), (vg, vs)):
        assert not torch.isnan(x.grad).any()
        assert torch.allclose(x.grad, r.grad, atol=1e-5, rtol=0)


def test_interface_takes_flash3_path(monkeypatch):
    """flash_attn_varlen_func(seqused_q=) runs attention_varlen(seqused_q=), not the spec."""
    def no_spec(*a, **k):
        raise AssertionError("flash_attn_varlen_func sent seqused_q to the FA3 spec")
    monkeypatch.setattr(fai, "fa3_forward", no_spec)
    q, k, v = inputs()
    used = torch.tensor(USED, dtype=torch.int32)
    out, lse = fai.flash_attn_varlen_func(q, k, v, cu(LQ), cu(LK), max(LQ), max(LK), seqused_q=used,
                                          causal=True, return_attn_probs=True)
    want, want_lse = flash3.attention_varlen(q, k, v, cu(LQ), cu(LK), max(LQ), max(LK), causal=True,
                                             seqused_q=used, return_lse=True)
    assert torch.equal(out, want) and torch.equal(lse, want_lse)


def test_clamped_values_equal_explicit_ones():
    q, k, v = inputs()
    a = flash3.attention_varlen(q, k, v, cu(LQ), cu(LK), max(LQ), max(LK), causal=True,
                                seqused_q=torch.tensor(USED, dtype=torch.int32))
    b = flash3.attention_varlen(q, k, v, cu(LQ), cu(LK), max(LQ), max(LK), causal=True,
                                seqused_q=torch.tensor(CLAMPED, dtype=torch.int32))
    assert torch.equal(a, b)


def test_full_lengths_equal_no_seqused_q():
    q, k, v = (x.nan_to_num() for x in inputs())
    a = flash3.attention_varlen(q, k, v, cu(LQ), cu(LK), max(LQ), max(LK), causal=True,
                                seqused_q=torch.tensor(LQ, dtype=torch.int32))
    b = flash3.attention_varlen(q, k, v, cu(LQ), cu(LK), max(LQ), max(LK), causal=True)
    assert torch.equal(a, b)


def test_bad_seqused_q():
    q, k, v = inputs()
    args = (q, k, v, cu(LQ), cu(LK), max(LQ), max(LK))
    used = torch.tensor(USED, dtype=torch.int32)
    with pytest.raises(TypeError, match="seqused_q"):
        flash3.attention_varlen(*args, seqused_q=used.long())
    with pytest.raises(ValueError, match="seqused_q"):
        flash3.attention_varlen(*args, seqused_q=used[:-1])
    with pytest.raises(ValueError, match="seqused_q"):
        flash3.attention_varlen(*args, seqused_q=used[None])
    with pytest.raises(TypeError, match="seqused_q"):
        flash3.attention_varlen(*args, seqused_q=USED)
    with pytest.raises(NotImplementedError, match="seqused_q"):
        flash3.attention_varlen(*args, seqused_q=used, sinks=torch.zeros(q.shape[1]))
    with pytest.raises(NotImplementedError, match="seqused_q"):  # keys from a cache (page_table)
        kc = k.view(-1, 1, *k.shape[1:])
        table = torch.arange(kc.shape[0], dtype=torch.int32).view(-1, 1)[:len(LQ)]
        flash3.attention_varlen(q, kc, kc, cu(LQ), None, max(LQ), 1, seqused_q=used,
                                seqused_k=torch.ones(len(LQ), dtype=torch.int32), page_table=table)


@pytest.mark.skipif(not hasattr(torch, "float8_e4m3fn"), reason="no float8_e4m3fn")
def test_fp8_takes_seqused_q():
    """e4m3 inputs with seqused_q: the FP8 path (tests/test_fp8.py checks it row by row); the rows
    past it (NaN in q) come out 0, lse -inf."""
    q, k, v = (x.to(torch.float8_e4m3fn) for x in inputs())
    ones = torch.ones(len(LQ), k.shape[1])
    out, lse = flash3.attention_varlen(q, k, v, cu(LQ), cu(LK), max(LQ), max(LK), return_lse=True,
                                       seqused_q=torch.tensor(USED, dtype=torch.int32),
                                       q_descale=ones, k_descale=ones, v_descale=ones)
    cut = past_used()
    assert out.dtype == torch.bfloat16 and not out[cut].any() and not out[~cut].isnan().any()
    assert bool((lse[:, cut] == -math.inf).all())


def test_opcheck_with_seqused_q():
    q, k, v = (x.nan_to_num() for x in inputs())
    used = torch.tensor(CLAMPED, dtype=torch.int32)
    fwd = (q, k, v, cu(LQ), cu(LK), max(LQ), max(LK), 0.25, -1, 0, 0.0, False, None, used)
    torch.library.opcheck(torch.ops.flash3.attention_varlen_fwd.default, fwd)
    out, lse = torch.ops.flash3.attention_varlen_fwd(*fwd)
    bwd = (torch.randn_like(out), q, k, v, out, lse, None, cu(LQ), cu(LK), max(LQ), max(LK), 0.25,
           -1, 0, 0.0, False, None, used)
    torch.library.opcheck(torch.ops.flash3.attention_varlen_bwd.default, bwd)


def test_alibi_distances_use_the_used_count():
    """ALiBi with seqused_q: each sequence as flash3.attention on its used queries (s_q = that count)."""
    q, k, v = inputs()
    slopes = torch.rand(len(LQ), q.shape[1]) * 0.1
    used = torch.tensor(USED, dtype=torch.int32)
    out = flash3.attention_varlen(q, k, v, cu(LQ), cu(LK), max(LQ), max(LK), causal=True,
                                  seqused_q=used, alibi_slopes=slopes)
    q0 = k0 = 0
    for i, (n, u, m) in enumerate(zip(LQ, CLAMPED, LK)):
        if u:
            want = flash3.attention(q[None, q0:q0 + u], k[None, k0:k0 + m], v[None, k0:k0 + m],
                                    causal=True, alibi_slopes=slopes[i:i + 1])
            assert torch.allclose(out[q0:q0 + u], want[0], atol=1e-6, rtol=0)
        q0, k0 = q0 + n, k0 + m
