"""torch's own CPU flash-attention kernel, where its semantics coincide exactly with flash3's.

``aten::_scaled_dot_product_flash_attention_for_cpu`` (and its backward) compute the same function
as the reference backend — fp32 softmax with a natural-log lse, GQA with query head ``i`` on kv head
``i // (h / h_k)`` — in a fused, blocked C++ kernel, so CPU users get torch's speed. Two ways in,
both without softcap, with ``d_v == d`` and no gradient through the lse (its backward has no
``dlse`` input):

* :func:`forward` / :func:`backward`: flash3's mask is one torch's kernel states by itself: no
  mask, or causal with ``s_q == s_k`` (bottom-right and torch's top-left alignment coincide);
* :func:`forward_masked` / :func:`backward_masked`: any other window (sliding windows, causal with
  ``s_q != s_k``): per block of ``CHUNK_M`` query rows, the keys the block can see and an additive
  mask of that (rows x keys) band, so memory stays O(CHUNK_M x band), never s_q x s_k. Rows that
  see nothing get out 0 and lse -inf, as in the reference.

Everything else stays on the tiled reference (flash3.reference), which is also what the tests
exercise with ``USE_TORCH_CPU_KERNEL = False``.

Inputs are computed in fp32 whatever their dtype (the reference's contract): the up-cast is
O(s·d) per head, not O(s²).
"""

from __future__ import annotations

import torch

from . import masking

USE_TORCH_CPU_KERNEL = True  # tests and benchmarks switch it off to measure the tiled reference


def _kernel_ops():
    fwd = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    bwd = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
    return (fwd, bwd) if fwd is not None and bwd is not None else None


def applies_masked(q, k, v, softcap: float, explicit_tiles: bool) -> bool:
    """True when torch's kernel, per query block with a band mask, computes the reference's
    function (any window)."""
    if not USE_TORCH_CPU_KERNEL or explicit_tiles or q.device.type != "cpu":
        return False
    if min(q.shape[0], q.shape[1], k.shape[1]) == 0 or softcap > 0:
        return False
    return v.shape[-1] == q.shape[-1] and _kernel_ops() is not None


def applies(q, k, v, left: int, right: int, softcap: float, explicit_tiles: bool) -> bool:
    """True when torch's kernel computes it in one call, with no mask of ours."""
    no_mask = left < 0 and right < 0
    square_causal = left < 0 and right == 0 and q.shape[1] == k.shape[1]
    return (no_mask or square_causal) and applies_masked(q, k, v, softcap, explicit_tiles)


CHUNK_M = 256  # query rows per masked call: the mask is CHUNK_M x (keys the block sees)


def _chunks(s_q, s_k, left, right):
    """(m0, m1, lo, hi, mask or None, empty rows or None) per block of query rows: the keys
    [lo, hi) its rows can see (empty when lo >= hi) and the additive mask hiding the rest of
    that band (flash3.masking states both)."""
    for mb in range(-(-s_q // CHUNK_M)):
        m0, m1 = mb * CHUNK_M, min((mb + 1) * CHUNK_M, s_q)
        lo, hi = masking.key_block_range(mb, CHUNK_M, 1, s_q, s_k, False, left, right)
        if lo >= hi:
            yield m0, m1, lo, hi, None, None
            continue
        hide = ~masking.visible_mask(m0, m1, lo, hi, s_q, s_k, False, left, right)
        if not hide.any():
            yield m0, m1, lo, hi, None, None
            continue
        mask = torch.zeros(m1 - m0, hi - lo).masked_fill_(hide, float("-inf"))
        empty = hide.all(dim=1)
        yield m0, m1, lo, hi, mask, (empty if empty.any() else None)


def forward_masked(q, k, v, softmax_scale: float, left: int, right: int):
    """(b, s, h, d) inputs, any window -> out (b, s_q, h, d) in q's dtype, lse (b, h, s_q) fp32."""
    fwd, _ = _kernel_ops()
    b, s_q, h, d = q.shape
    out = torch.zeros(b, s_q, h, d, dtype=torch.float32)
    lse = torch.full((b, h, s_q), float("-inf"), dtype=torch.float32)
    for m0, m1, lo, hi, mask, empty in _chunks(s_q, k.shape[1], left, right):
        if lo >= hi:
            continue  # no row of the block sees a key: out 0, lse -inf
        o, l = fwd(_bhsd(q[:, m0:m1]), _bhsd(k[:, lo:hi]), _bhsd(v[:, lo:hi]), 0.0, False,
                   attn_mask=mask, scale=softmax_scale)
        if empty is not None:
            l = l.masked_fill(empty, float("-inf"))  # torch gives out 0 but lse 0 there
        out[:, m0:m1] = o.transpose(1, 2)
        lse[:, :, m0:m1] = l
    return out.to(q.dtype), lse


def backward_masked(dout, q, k, v, out, lse, softmax_scale: float, left: int, right: int,
                    fp32=False):
    """Gradients of :func:`forward_masked`, contiguous, in the inputs' dtypes (fp32: in fp32)."""
    _, bwd = _kernel_ops()
    dq = torch.zeros(q.shape, dtype=torch.float32)
    dk = torch.zeros(k.shape, dtype=torch.float32)
    dv = torch.zeros(v.shape, dtype=torch.float32)
    for m0, m1, lo, hi, mask, _ in _chunks(q.shape[1], k.shape[1], left, right):
        if lo >= hi:
            continue
        # Rows that see nothing: torch's kernel expects the lse it produced (0), not -inf
        # (exp(-inf - -inf) would be NaN); every score of such a row is masked, so P = 0.
        l = lse[:, :, m0:m1].to(torch.float32)
        l = l.masked_fill(torch.isinf(l), 0.0)
        gq, gk, gv = bwd(_bhsd(dout[:, m0:m1]), _bhsd(q[:, m0:m1]), _bhsd(k[:, lo:hi]),
                         _bhsd(v[:, lo:hi]), _bhsd(out[:, m0:m1]), l, 0.0, False,
                         attn_mask=mask, scale=softmax_scale)
        dq[:, m0:m1] = gq.transpose(1, 2)
        dk[:, lo:hi] += gk.transpose(1, 2)
        dv[:, lo:hi] += gv.transpose(1, 2)
    if fp32:
        return dq, dk, dv
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def _bhsd(x):
    """(b, s, h, d) -> the (b, h, s, d) fp32 form torch's kernel reads correctly: a view where the
    strides allow it, else a contiguous copy.

    The kernel reads each row's d values as consecutive (it ignores the last dim's stride, so
    ``x[..., ::2]``, a permuted head dim or a stride-0 last dim give wrong results) and hands the
    sequence stride to its GEMMs as the leading dimension: a stride below d (an expanded or
    overlapping sequence dim) computes other fp32 sums than the contiguous call. Stride-0 batch or
    head dims (expanded GQA heads) are read exactly."""
    y = x.transpose(1, 2).to(torch.float32)
    s, d = y.shape[-2], y.shape[-1]
    if (d > 1 and y.stride(-1) != 1) or (s > 1 and y.stride(-2) < d):
        y = y.contiguous()
    return y


def forward(q, k, v, softmax_scale: float, causal: bool):
    """(b, s, h, d) inputs -> out (b, s_q, h, d) in q's dtype, lse (b, h, s_q) fp32."""
    fwd, _ = _kernel_ops()
    out, lse = fwd(_bhsd(q), _bhsd(k), _bhsd(v), 0.0, causal, attn_mask=None, scale=softmax_scale)
    return out.transpose(1, 2).to(q.dtype).contiguous(), lse.contiguous()


def backward(dout, q, k, v, out, lse, softmax_scale: float, causal: bool, fp32=False):
    """Gradients of :func:`forward` (no dlse), contiguous, in the inputs' dtypes (fp32: in fp32)."""
    _, bwd = _kernel_ops()
    dq, dk, dv = bwd(_bhsd(dout), _bhsd(q), _bhsd(k), _bhsd(v), _bhsd(out),
                     lse.to(torch.float32), 0.0, causal, attn_mask=None, scale=softmax_scale)
    return tuple(g.transpose(1, 2).to(torch.float32 if fp32 else x.dtype).contiguous()
                 for g, x in ((dq, q), (dk, k), (dv, v)))
