"""FA3's seqused_k on packed keys, alone and with seqused_q, on flash3's varlen path:
attention_varlen(seqused_k=, seqused_q=) and flash_attn_interface.flash_attn_varlen_func (no longer
the spec's, autograd included) against the FA3 spec (flash3/reference/fa3.py); values outside
[0, the sequence's length] are clamped; keys past seqused_k (NaN here) are never seen and get
dk/dv 0. The backward kernel has no seqused_k: flash3/_used_keys.py gathers the used keys for it,
checked here on the CPU with the reference standing in for the kernel. The kernels: the "sequsedk"
smoke feature (forward) and tests/test_seqused_q_gpu.py."""

import math

import pytest
import torch

import flash3
from flash3 import _backend, _used_keys, ops, reference
from flash3 import flash_attn_interface as fai
from flash3.reference.fa3 import fa3_forward
from helpers import cu


pytestmark = pytest.mark.usefixtures("small_tiles")


LQ, LK = [7, 3, 9, 12, 5], [10, 4, 12, 6, 0]
USED_Q, CLAMPED_Q = [5, 0, 40, -3, 2], [5, 0, 9, 0, 2]
# keys: cut, cut to 1, past the length (clamped to 12), negative (clamped to 0), a sequence of none
USED_K, CLAMPED_K = [6, 1, 99, -2, 3], [6, 1, 12, 0, 0]
OPTIONS = [dict(causal=False), dict(causal=True), dict(window_size=(3, 1), softcap=2.0),
           dict(causal=True, attention_chunk=4)]


def past(lengths, used):
    mask = torch.zeros(sum(lengths), dtype=torch.bool)
    start = 0
    for n, u in zip(lengths, used):
        mask[start + u:start + n] = True
        start += n
    return mask


def inputs(with_q_cut, h=4, h_k=2, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(LQ), h, d, generator=g)
    k = torch.randn(sum(LK), h_k, d, generator=g)
    v = torch.randn(sum(LK), h_k, d, generator=g)
    k[past(LK, CLAMPED_K)] = float("nan")  # unused keys: no result may depend on them
    v[past(LK, CLAMPED_K)] = float("nan")
    if with_q_cut:
        q[past(LQ, CLAMPED_Q)] = float("nan")
    return q, k, v


def i32(xs):
    return torch.tensor(xs, dtype=torch.int32)


def spec(q, k, v, used_q, **kw):
    """FA3's forward (its seqused taken already clamped: the spec slices with the raw values)."""
    left, right = flash3.masking.normalize_window(kw.get("causal", False),
                                                  kw.get("window_size", (-1, -1)))
    return fa3_forward(q, k, v, softmax_scale=q.shape[-1] ** -0.5, window_left=left,
                       window_right=right, softcap=kw.get("softcap", 0.0),
                       attention_chunk=kw.get("attention_chunk", 0), cu_seqlens_q=cu(LQ),
                       cu_seqlens_k=cu(LK), seqused_k=i32(CLAMPED_K),
                       seqused_q=None if used_q is None else i32(CLAMPED_Q))


@pytest.mark.parametrize("with_q", [False, True], ids=["seqused_k", "seqused_q+k"])
@pytest.mark.parametrize("kw", OPTIONS, ids=str)
def test_matches_fa3_spec_forward_and_grads(kw, with_q):
    q, k, v = inputs(with_q)
    used_q = i32(USED_Q) if with_q else None
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    out, lse = flash3.attention_varlen(qg, kg, vg, cu(LQ), cu(LK), max(LQ), max(LK),
                                       seqused_q=used_q, seqused_k=i32(USED_K), return_lse=True,
                                       **kw)
    qs, ks, vs = (torch.nan_to_num(x).requires_grad_() for x in (q, k, v))
    ref, ref_lse = spec(qs, ks, vs, used_q, **kw)
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    assert torch.allclose(out, ref, atol=1e-5, rtol=0)
    assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse))
    fin = torch.isfinite(ref_lse)
    assert torch.allclose(lse[fin], ref_lse[fin], atol=1e-5, rtol=0)
    if with_q:
        assert (lse[:, past(LQ, CLAMPED_Q)] == -math.inf).all()
    g = torch.randn_like(out)
    (out * g).sum().backward()
    (ref * g).sum().backward()
    unused = past(LK, CLAMPED_K)
    for x in (kg, vg):  # keys past seqused_k: no gradient
        assert torch.equal(x.grad[unused], torch.zeros_like(x.grad[unused]))
    for x, r in ((qg, qs), (kg, ks), (vg, vs)):
        assert not torch.isnan(x.grad).any()
        assert torch.allclose(x.grad, r.grad, atol=1e-5, rtol=0)


def test_backward_kernel_path_gathers_the_used_keys(monkeypatch):
    """ops.attention_varlen_bwd's kernel branch (forced on CPU, the reference standing in for the
    kernel, which has no seqused_k): the used keys gathered with their own cu_seqlens_k, dk/dv
    scattered back; equal to the reference's backward with seqused_k, with no host read."""
    q, k, v = (torch.nan_to_num(x) for x in inputs(True))
    args = (cu(LQ), cu(LK), max(LQ), max(LK), 0.25, -1, 0, 0.0)
    out, lse = reference.varlen_forward(q, k, v, cu(LQ), cu(LK), 0.25, -1, 0,
                                        seqused_q=i32(USED_Q), seqused_k=i32(USED_K))
    dout = torch.randn_like(out)
    seen = []

    def fake_bwd(dout, q, k, v, out, lse, dlse, scale, left, right, softcap, deterministic, *,
                 cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q=None, **kw):
        seen.append((k.shape, cu_seqlens_k.clone()))
        return reference.varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                                         scale, left, right, softcap, dlse=dlse,
                                         seqused_q=seqused_q)
    monkeypatch.setattr(ops, "_bwd_dispatch", lambda q, k, v, s, run_kernel, *more, **kw: run_kernel())
    monkeypatch.setattr(_backend, "run_kernel_bwd", fake_bwd)
    got = ops.attention_varlen_bwd(dout, q, k, v, out, lse, None, *args, False, None, i32(USED_Q),
                                   0, i32(USED_K))
    want = reference.varlen_backward(dout, q, k, v, out, lse, cu(LQ), cu(LK), 0.25, -1, 0,
                                     seqused_q=i32(USED_Q), seqused_k=i32(USED_K))
    (shape, cu_used), = seen
    assert shape == k.shape and cu_used.tolist() == cu(CLAMPED_K).tolist()
    for a, b in zip(got, want):
        assert torch.allclose(a, b, atol=1e-6, rtol=0)


def test_gather_stays_in_bounds_whatever_the_lengths():
    """Any cu_seqlens_k/seqused_k (decreasing, past the tensor, negative): the gather reads inside
    k and the scatter writes inside dk (rows it cannot place are dropped)."""
    k = torch.arange(12.0).view(6, 1, 2)
    for cu_k, used in (([0, 4, 2, 9], [3, 5, 9]), ([-3, 2, 6, 6], [9, 9, 1]), ([0], [])):
        kk, vv, cu_used, back = _used_keys.compact(k, k, i32(cu_k), i32(used))
        assert kk.shape == k.shape and cu_used.shape[0] == len(cu_k)
        assert back(torch.ones_like(kk)).shape == k.shape


def test_interface_takes_flash3_path_with_autograd(monkeypatch):
    """flash_attn_varlen_func(seqused_q=, seqused_k=) runs attention_varlen, not the spec, and
    differentiates through flash3's backward."""
    def no_spec(*a, **k):
        raise AssertionError("flash_attn_varlen_func sent seqused_k to the FA3 spec")
    monkeypatch.setattr(fai, "fa3_forward", no_spec)
    q, k, v = (torch.nan_to_num(x) for x in inputs(True))
    kw = dict(seqused_q=i32(USED_Q), seqused_k=i32(USED_K), causal=True)
    qg = q.clone().requires_grad_()
    out, lse = fai.flash_attn_varlen_func(qg, k, v, cu(LQ), cu(LK), max(LQ), max(LK),
                                          return_attn_probs=True, **kw)
    want, want_lse = flash3.attention_varlen(q, k, v, cu(LQ), cu(LK), max(LQ), max(LK),
                                             return_lse=True, **kw)
    assert torch.equal(out, want) and torch.equal(lse, want_lse)
    out.sum().backward()
    assert qg.grad is not None and not torch.isnan(qg.grad).any()


@pytest.mark.parametrize("kw", [dict(), dict(causal=True), dict(causal=True, attention_chunk=4)])
def test_fp8_with_seqused_runs_flash3_fp8(monkeypatch, kw):
    """e4m3 q/k/v with seqused_q and seqused_k: flash_attn_varlen_func runs flash3's FP8 varlen path
    (not the spec), never reading the unused rows (NaN here), within the FP8 kernel's P rounding of
    the spec: |out - spec| <= 2^-4 * (P @ |v|) (P's e4m3 rounding, relative 2^-4 per term) + bf16's
    output rounding (2^-8 |out|) + 1e-3 (fp32), with the products in fp32 (the tensor cores'
    truncated FP8 sums have their own tests in tests/test_fp8.py)."""
    def no_spec(*a, **k):
        raise AssertionError("flash_attn_varlen_func sent FP8 seqused to the FA3 spec")
    from flash3.reference import fp8 as fp8_reference
    monkeypatch.setattr(fp8_reference, "FP8_MMA_KEPT_BITS", None)
    q, k, v = (x.to(torch.float8_e4m3fn) for x in inputs(True))
    used = dict(seqused_q=i32(USED_Q), seqused_k=i32(USED_K))
    monkeypatch.setattr(fai, "fa3_forward", no_spec)
    out, lse = fai.flash_attn_varlen_func(q, k, v, cu(LQ), cu(LK), max(LQ), max(LK),
                                          return_attn_probs=True, **used, **kw)
    monkeypatch.setattr(fai, "fa3_forward", fa3_forward)
    assert out.dtype == torch.bfloat16
    ones = torch.ones(len(LQ), k.shape[1])
    want = flash3.attention_varlen(q, k, v, cu(LQ), cu(LK), max(LQ), max(LK), return_lse=True,
                                   q_descale=ones, k_descale=ones, v_descale=ones, **used, **kw)
    assert torch.equal(out, want[0]) and torch.equal(lse, want[1])
    cut = past(LQ, CLAMPED_Q)
    assert not out[cut].any() and bool((lse[:, cut] == -math.inf).all())
    q, k, v = (x.float().nan_to_num() for x in (q, k, v))
    ref, ref_lse = spec(q, k, v, CLAMPED_Q, **kw)
    pv, _ = spec(q, k, v.abs(), CLAMPED_Q, **kw)
    assert torch.all((out.double() - ref.double()).abs() <= 2 ** -4 * pv + 2 ** -8 * ref.abs() + 1e-3)
    fin = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), fin)
    assert (lse[fin] - ref_lse[fin]).abs().max() < 1e-4


def test_bad_seqused_k_names_it():
    q, k, v = inputs(False)
    for bad, exc in ((torch.tensor(USED_K), TypeError), (i32(USED_K[:3]), ValueError)):
        with pytest.raises(exc, match="seqused_k"):
            flash3.attention_varlen(q, k, v, cu(LQ), cu(LK), max(LQ), max(LK), seqused_k=bad)
