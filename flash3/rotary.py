"""Rotary position embedding (RoPE) for attention_with_kvcache: the specification.

``cos``/``sin`` are tables of shape (seqlen_ro, rotary_dim / 2); row p holds the
angles of position p.  The first ``rotary_dim`` channels of each head are rotated,
the rest pass through unchanged.  Channel pairs:

* ``interleaved=False`` (GPT-NeoX): channel c pairs with c + rotary_dim / 2
  (the two halves of the rotated part), angle index c;
* ``interleaved=True`` (GPT-J): channel 2c pairs with 2c + 1, angle index c.

A pair (x0, x1) becomes (x0 cos - x1 sin, x0 sin + x1 cos): multiplication of
x0 + i x1 by e^{i theta}.

Positions are gathered per token from a (b, s) tensor, without host syncs.
They are clamped to [0, seqlen_ro - 1] so a bad ``cache_seqlens`` can never
index past the tables (the validation mode reports such values instead).
"""

from __future__ import annotations

import torch


def kvcache_positions(cache_seqlens: torch.Tensor, s: int, per_token: bool) -> torch.Tensor:
    """(b, s) int64 positions of s tokens following each row's cache.

    per_token: token t of row i is at cache_seqlens[i] + t; otherwise every token of
    row i is at cache_seqlens[i] (flash-attn's rule for q when neither causal nor local).
    """
    base = cache_seqlens.to(torch.long).unsqueeze(1)
    if not per_token:
        return base.expand(-1, s)
    return base + torch.arange(s, device=cache_seqlens.device).unsqueeze(0)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 positions: torch.Tensor, interleaved: bool = False) -> torch.Tensor:
    """Rotate x (b, s, h, d) at ``positions`` (b, s); returns a new tensor of x's dtype.

    The rotation is computed in fp32 (fp64 for fp64 inputs) and rounded once.  An FP8 x (FA3's
    e4m3 q and new keys) is rounded saturating: a rotated value past the format's largest finite
    (448 for e4m3; a pair (x0, x1) rotates up to sqrt(2) max(|x0|, |x1|)) becomes +-448, as the
    fused append kernel's cvt.rn.satfinite does.  Written out because torch's own fp32 -> e4m3
    cast gave NaN above 464 until pytorch#178817 made it saturate (torch 2.11 still NaN, 2.13
    saturates): left to the cast, the specification would depend on the torch version.
    """
    b, s, h, d = x.shape
    half = cos.shape[-1]
    rd = 2 * half
    if rd == 0 or x.numel() == 0:
        return x.clone()
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    pos = positions.to(torch.long).clamp(0, cos.shape[0] - 1).reshape(-1)
    c = cos.index_select(0, pos).to(work).view(b, s, 1, half)
    sn = sin.index_select(0, pos).to(work).view(b, s, 1, half)
    xr = x[..., :rd].to(work)
    if interleaved:
        x0, x1 = xr[..., 0::2], xr[..., 1::2]
        rot = torch.stack((x0 * c - x1 * sn, x0 * sn + x1 * c), dim=-1).flatten(-2)
    else:
        x0, x1 = xr[..., :half], xr[..., half:]
        rot = torch.cat((x0 * c - x1 * sn, x0 * sn + x1 * c), dim=-1)
    if x.element_size() == 1 and x.dtype.is_floating_point:  # FP8: saturating (NaN stays NaN)
        fmax = torch.finfo(x.dtype).max
        rot = rot.clamp(-fmax, fmax)
    out = x.clone()
    out[..., :rd] = rot.to(x.dtype)
    return out


def kvcache_rotary(q, k, cache_seqlens, cos, sin, interleaved, causal_or_local):
    """(q, k) rotated as attention_with_kvcache does: new k token t of row i at position
    cache_seqlens[i] + t; q the same when causal or local, else all q tokens of row i at
    cache_seqlens[i]."""
    q_pos = kvcache_positions(cache_seqlens, q.shape[1], causal_or_local)
    k_pos = kvcache_positions(cache_seqlens, k.shape[1], True)
    return (apply_rotary(q, cos, sin, q_pos, interleaved),
            apply_rotary(k, cos, sin, k_pos, interleaved))
