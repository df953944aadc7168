"""torch's own CPU flash-attention kernel, where its semantics coincide exactly with flash3's.

``aten::_scaled_dot_product_flash_attention_for_cpu`` (and its backward) compute the same function
as the reference backend — fp32 softmax with a natural-log lse, GQA with query head ``i`` on kv head
``i // (h / h_k)`` — in a fused, blocked C++ kernel, so CPU users get torch's speed. It applies when
flash3's mask is one torch's kernel states: no mask, or causal with ``s_q == s_k`` (where bottom-right
and torch's top-left alignment are the same mask), no softcap, ``d_v == d``, and no gradient through
the lse (its backward has no ``dlse`` input). Everything else stays on the tiled reference
(flash3/reference.py), which is also what the tests exercise with ``USE_TORCH_CPU_KERNEL = False``.

Inputs are computed in fp32 whatever their dtype (the reference's contract): the up-cast is
O(s·d) per head, not O(s²).
"""

from __future__ import annotations

import torch

USE_TORCH_CPU_KERNEL = True  # tests and benchmarks switch it off to measure the tiled reference


def _kernel_ops():
    fwd = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    bwd = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
    return (fwd, bwd) if fwd is not None and bwd is not None else None


def applies(q, k, v, left: int, right: int, softcap: float, explicit_tiles: bool) -> bool:
    """True when torch's CPU kernel computes exactly the reference's function for this call."""
    if not USE_TORCH_CPU_KERNEL or explicit_tiles or q.device.type != "cpu":
        return False
    s_q, s_k = q.shape[1], k.shape[1]
    if min(q.shape[0], s_q, s_k) == 0 or softcap > 0 or v.shape[-1] != q.shape[-1]:
        return False
    no_mask = left < 0 and right < 0
    square_causal = left < 0 and right == 0 and s_q == s_k
    return (no_mask or square_causal) and _kernel_ops() is not None


def _bhsd(x):
    return x.transpose(1, 2).to(torch.float32)


def forward(q, k, v, softmax_scale: float, causal: bool):
    """(b, s, h, d) inputs -> out (b, s_q, h, d) in q's dtype, lse (b, h, s_q) fp32."""
    fwd, _ = _kernel_ops()
    out, lse = fwd(_bhsd(q), _bhsd(k), _bhsd(v), 0.0, causal, attn_mask=None, scale=softmax_scale)
    return out.transpose(1, 2).to(q.dtype).contiguous(), lse.contiguous()


def backward(dout, q, k, v, out, lse, softmax_scale: float, causal: bool):
    """Gradients of :func:`forward` (no dlse), contiguous, in the inputs' dtypes."""
    _, bwd = _kernel_ops()
    dq, dk, dv = bwd(_bhsd(dout), _bhsd(q), _bhsd(k), _bhsd(v), _bhsd(out),
                     lse.to(torch.float32), 0.0, causal, attn_mask=None, scale=softmax_scale)
    return tuple(g.transpose(1, 2).to(x.dtype).contiguous() for g, x in ((dq, q), (dk, k), (dv, v)))
