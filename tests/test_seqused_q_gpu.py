"""FA3's seqused_q on the Hopper kernels (fwd_sm90 and bwd_sm90 with seqused_q): a causal GQA varlen
batch whose sequences are cut mid-tile (with whole tiles past the cut), to 0 queries, not at all
(a value past the length: clamped) and negatively (clamped to 0); NaN/Inf in the packed rows past
the cut (nothing may read them). Forward against the fp64 oracle per sequence on its used queries
(FlashAttention rule), rows past the cut exactly out 0 / lse -inf over NaN-poisoned outputs; the
backward against the reference's (fp32, same out/lse); no fallback to the reference, no host sync
needed (the op is graph-capturable). Skipped without an sm_90 device or a bf16 forward+backward
kernel of d 128.
"""
import json
import math
import warnings

import pytest
import torch

import flash3
from flash3 import reference
from helpers import assert_close_fa, attention_naive, attention_ref64

HAS_SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
pytestmark = [pytest.mark.requires_sm90,
              pytest.mark.skipif(not HAS_SM90, reason="needs a CUDA sm_90 (H100/H200) device")]

LQ, LK = [203, 40, 77, 130, 300], [331, 50, 64, 100, 0]
USED = [100, 0, 1000, 70, -5]  # cut mid-tile, to 0, clamped to 77, cut mid-tile, clamped to 0
H, H_K, D = 6, 2, 128


def needs_kernels():
    if not hasattr(torch.ops.flash3, "kernel_info"):
        pytest.skip("no flash3._C")
    info = json.loads(torch.ops.flash3.kernel_info())
    if ["bf16", D, D] not in info.get("fwd", []) or ["bf16", D, D] not in info.get("bwd", []):
        pytest.skip("flash3._C has no bf16 d 128 forward and backward kernels")


def cu(lengths):
    return torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32,
                        device="cuda")


def clamped():
    return [min(max(u, 0), n) for u, n in zip(USED, LQ)]


def past_used():
    mask = torch.zeros(sum(LQ), dtype=torch.bool, device="cuda")
    start = 0
    for n, u in zip(LQ, clamped()):
        mask[start + u:start + n] = True
        start += n
    return mask


def inputs():
    g = torch.Generator(device="cuda").manual_seed(0)
    rnd = lambda *s: torch.randn(*s, device="cuda", generator=g).to(torch.bfloat16)  # noqa: E731
    q, k, v = rnd(sum(LQ), H, D), rnd(sum(LK), H_K, D), rnd(sum(LK), H_K, D)
    pad = past_used()
    q[pad] = float("nan")
    q[pad.nonzero()[::2, 0]] = float("inf")
    return q, k, v


@pytest.mark.parametrize("causal,alibi", [(False, False), (True, False), (True, True)])
def test_forward_kernel(causal, alibi):
    needs_kernels()
    q, k, v = inputs()
    used = torch.tensor(USED, dtype=torch.int32, device="cuda")
    out = torch.full((sum(LQ), H, D), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.full((H, sum(LQ)), float("nan"), device="cuda")
    slopes = torch.rand(len(LQ), H, device="cuda") * 0.1 if alibi else None  # distances on the used count
    torch.ops.flash3.fwd_sm90(q, k, v, out, lse, cu(LQ), cu(LK), None, max(LQ), max(LK), D ** -0.5,
                              -1, 0 if causal else -1, 0.0, seqused_q=used,
                              **({} if slopes is None else {"alibi_slopes": slopes}))
    pad = past_used()
    assert torch.equal(out[pad], torch.zeros_like(out[pad]))
    assert (lse[:, pad] == -math.inf).all()
    q0 = k0 = 0
    for i, (n, u, m) in enumerate(zip(LQ, clamped(), LK)):
        if u:
            qi, ki, vi = q[None, q0:q0 + u], k[None, k0:k0 + m], v[None, k0:k0 + m]
            kw = dict(causal=causal) if slopes is None else dict(causal=causal, alibi_slopes=slopes[i].double())
            ref, ref_lse = attention_ref64(qi, ki, vi, **kw)
            naive, _ = attention_naive(qi, ki, vi, **kw)
            assert_close_fa(out[None, q0:q0 + u], naive, ref)
            assert torch.equal(torch.isinf(lse[:, q0:q0 + u]), torch.isinf(ref_lse[0]))
        q0, k0 = q0 + n, k0 + m


def test_api_kernel_path_and_backward():
    needs_kernels()
    q, k, v = inputs()
    used = torch.tensor(USED, dtype=torch.int32, device="cuda")
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fallback to the reference warns
        out, lse = flash3.attention_varlen(qg, kg, vg, cu(LQ), cu(LK), max(LQ), max(LK), causal=True,
                                           seqused_q=used, return_lse=True)
        dout = torch.randn_like(out)
        dout[past_used()] = float("nan")  # gradients of rows that are no queries: never read
        out.backward(dout)
    pad = past_used()
    assert torch.equal(out[pad], torch.zeros_like(out[pad]))
    assert torch.equal(qg.grad[pad], torch.zeros_like(qg.grad[pad]))
    ref = reference.varlen_backward(dout.float(), q.float(), k.float(), v.float(), out.float(), lse,
                                    cu(LQ), cu(LK), D ** -0.5, -1, 0, seqused_q=used)
    eps = torch.finfo(torch.bfloat16).eps
    for name, x, r in zip("qkv", (qg.grad, kg.grad, vg.grad), ref):
        assert not torch.isnan(x).any(), name
        err = (x.double() - r.double()).abs().max().item()
        assert err <= 4 * eps * r.abs().max().item() + 1e-5, (name, err)


def test_flash_attn_interface_runs_the_kernel():
    needs_kernels()
    from flash3 import flash_attn_interface as fai
    q, k, v = inputs()
    used = torch.tensor(USED, dtype=torch.int32, device="cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = fai.flash_attn_varlen_func(q, k, v, cu(LQ), cu(LK), max(LQ), max(LK), seqused_q=used,
                                         causal=True)
    want = flash3.attention_varlen(q, k, v, cu(LQ), cu(LK), max(LQ), max(LK), causal=True,
                                   seqused_q=used)
    assert torch.equal(out, want)


USED_K = [200, 1000, 0, 37, 3]  # FA3's seqused_k with it: mid-block, clamped to 50, 0, below the queries


def past_used_k():
    mask = torch.zeros(sum(LK), dtype=torch.bool, device="cuda")
    start = 0
    for n, u in zip(LK, USED_K):
        mask[start + min(max(u, 0), n):start + n] = True
        start += n
    return mask


@pytest.mark.parametrize("causal", [False, True])
def test_with_seqused_k_forward_kernel_and_backward(causal):
    """seqused_q and seqused_k together: the forward kernel takes both (masks on both used counts;
    the keys past seqused_k, NaN/Inf here, are never seen), the backward kernel runs on the used
    keys gathered (dk/dv 0 past them), against the reference; no fallback."""
    needs_kernels()
    q, k, v = inputs()
    k[past_used_k()], v[past_used_k()] = float("nan"), float("inf")
    used_q = torch.tensor(USED, dtype=torch.int32, device="cuda")
    used_k = torch.tensor(USED_K, dtype=torch.int32, device="cuda")
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fallback to the reference warns
        out, lse = flash3.attention_varlen(qg, kg, vg, cu(LQ), cu(LK), max(LQ), max(LK), causal=causal,
                                           seqused_q=used_q, seqused_k=used_k, return_lse=True)
        dout = torch.randn_like(out)
        out.backward(dout)
    pad = past_used()
    assert torch.equal(out[pad], torch.zeros_like(out[pad])) and (lse[:, pad] == -math.inf).all()
    qz, kz, vz = (torch.nan_to_num(x.float(), nan=0.0, posinf=0.0, neginf=0.0) for x in (q, k, v))
    ref_out, ref_lse = reference.varlen_forward(qz.double(), kz.double(), vz.double(), cu(LQ), cu(LK),
                                                D ** -0.5, -1, 0 if causal else -1, seqused_q=used_q,
                                                seqused_k=used_k)
    assert (out.double() - ref_out).abs().max().item() <= 2e-2
    assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse))
    fin = torch.isfinite(ref_lse)
    assert (lse[fin].double() - ref_lse[fin]).abs().max().item() <= 1e-3
    ref = reference.varlen_backward(dout.float(), qz, kz, vz, out.float(), lse, cu(LQ), cu(LK),
                                    D ** -0.5, -1, 0 if causal else -1, seqused_q=used_q,
                                    seqused_k=used_k)
    eps = torch.finfo(torch.bfloat16).eps
    unused = past_used_k()
    for name, x, r in zip("qkv", (qg.grad, kg.grad, vg.grad), ref):
        assert not torch.isnan(x).any(), name
        if name != "q":
            assert torch.equal(x[unused], torch.zeros_like(x[unused])), name
        err = (x.double() - r.double()).abs().max().item()
        assert err <= 4 * eps * r.abs().max().item() + 1e-5, (name, err)
