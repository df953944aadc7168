"""The smoke matrix's oracles (tests/helpers.py takes them from here: tests may import tools'
helpers, tools never import tests): an fp64 attention that materializes everything, and the
FlashAttention tolerance rule.

The mask here is written out independently of flash3.masking on purpose, so a
bug in the spec module cannot hide itself.
"""

from __future__ import annotations

import math

import torch


def _mask(s_q, s_k, causal, window, device, chunk=0):
    left, right = window
    if causal:
        right = 0
    i = torch.arange(s_q, device=device)[:, None]
    j = torch.arange(s_k, device=device)[None, :]
    diag = i + s_k - s_q
    keep = torch.ones(s_q, s_k, dtype=torch.bool, device=device)
    if left >= 0:
        keep &= j >= diag - left
    if right >= 0:
        keep &= j <= diag + right
    if chunk > 0:  # FA3's attention_chunk: the diagonal's chunk, floored (a negative diagonal too)
        first = torch.div(diag, chunk, rounding_mode="floor") * chunk
        keep &= (j >= first) & (j < first + chunk)
    return keep


def attention_naive(q, k, v, *, causal=False, softmax_scale=None, window_size=(-1, -1),
                    softcap=0.0, compute_dtype=None, sinks=None, alibi_slopes=None,
                    attention_chunk=0):
    """Plain attention; full (s_q, s_k) matrix. Returns (out, lse).

    ``compute_dtype`` None means q's dtype: fp64 gives the oracle; fp16/bf16
    gives the "naive same precision" baseline (matmuls in that dtype, softmax
    upcast then rounded back, as a straightforward implementation would do).
    ``sinks`` (h,): attention sinks, one more score column per row (the head's
    logit, after softcap) that joins the softmax and lse and carries no value.
    ``alibi_slopes`` (h,) or (b, h): -slope * |i + s_k - s_q - j| added to the scores after
    softcap (FlashAttention-2's convention), in the softmax's precision (fp32 for 16-bit).
    ``attention_chunk`` (FA3's, 0 = none): query i also sees only keys in its diagonal's chunk.
    """
    dt = compute_dtype or q.dtype
    d = q.shape[-1]
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else softmax_scale
    h, h_k = q.shape[2], k.shape[2]
    q, k, v = q.to(dt), k.to(dt), v.to(dt)
    if h != h_k:
        k = k.repeat_interleave(h // h_k, dim=2)
        v = v.repeat_interleave(h // h_k, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    keep = _mask(q.shape[1], k.shape[1], causal, window_size, q.device, attention_chunk)
    s = s.float() if dt in (torch.float16, torch.bfloat16) else s
    if alibi_slopes is not None:
        s_q, s_k = q.shape[1], k.shape[1]
        i = torch.arange(s_q, device=q.device)[:, None] + s_k - s_q
        j = torch.arange(s_k, device=q.device)[None, :]
        dist = (i - j).abs().to(s.dtype)
        sl = alibi_slopes.to(s.dtype).expand(q.shape[0], q.shape[2])
        s = s - sl[:, :, None, None] * dist
    s = s.masked_fill(~keep, -math.inf)
    if sinks is not None:
        s = torch.cat([s, sinks.to(s.dtype).view(1, -1, 1, 1).expand(*s.shape[:-1], 1)], dim=-1)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.softmax(s, dim=-1)
    if sinks is not None:
        p = p[..., :-1]  # the sink's column carries no value
    p = torch.where(keep.any(-1)[:, None], p, torch.zeros_like(p))  # empty rows: 0
    p = p.to(dt)
    out = torch.einsum("bhqk,bkhd->bqhd", p, v)
    return out, lse


def attention_ref64(q, k, v, **kw):
    """The fp64 oracle (out in fp64, lse in fp64; empty rows give 0 and -inf)."""
    return attention_naive(q, k, v, compute_dtype=torch.float64, **kw)


def noop_rounding(ref64: torch.Tensor, dtype) -> float:
    """Size of rounding error of a no-op (x + 0.3 - 0.3) in ``dtype``."""
    x = ref64.to(dtype)
    return (x + 0.3 - 0.3).double().sub(ref64).abs().max().item() if ref64.numel() else 0.0


def max_err(a, b) -> float:
    return (a.double() - b.double()).abs().max().item() if a.numel() else 0.0


def fa_tolerance(naive, ref64, dtype, scale=1.0) -> float:
    """FlashAttention rule: 2 * naive error + 2 * no-op rounding.

    The floor of a few ulps at unit scale covers outputs that are exactly 0
    in exact arithmetic (e.g. dq when each row sees a single key), where both
    terms vanish but any other summation order leaves rounding noise; ``scale``
    is the size of the terms being summed (for gradients: the largest gradient).
    """
    floor = 8 * torch.finfo(dtype).eps * max(1.0, scale)
    return 2 * max_err(naive, ref64) + 2 * noop_rounding(ref64, dtype) + floor
