"""``flash3.sdpa``: torch's ``scaled_dot_product_attention`` calling convention.

A drop-in for ``torch.nn.functional.scaled_dot_product_attention`` on what flash3 covers: inputs
``(..., heads, seqlen, headdim)``, no mask or ``is_causal``, optional ``scale`` and ``enable_gqa``.
It hands flash3 transposed *views* (``(b, s, h, d)`` strides over the caller's memory), so no copy
is made for the layouts torch users have; the output is a view in torch's layout too.

``is_causal`` follows **torch** (top-left aligned: query ``i`` sees keys ``j <= i``), because a
drop-in must compute what it replaces. flash3's own ``causal`` is bottom-right aligned (query ``i``
sees ``j <= i + s_k - s_q``, flash-attn's convention). The two agree when ``s_q == s_k``; otherwise
the adapter expresses torch's mask in flash3's terms: for ``s_k > s_q`` keys past ``s_q`` are never
visible, so it attends to the first ``s_q`` keys (a view) with flash3's causal mask; for
``s_q > s_k`` it is the window ``(-1, s_q - s_k)``.
"""

from __future__ import annotations

import math
import numbers

from . import _checks
from .api import attention

__all__ = ["sdpa"]


def _to_bshd(x):
    """(..., h, s, d) -> a (b, s, h, d) view when the batch dims flatten without a copy."""
    x = x.unsqueeze(0) if x.dim() == 3 else x
    x = x.reshape(-1, *x.shape[-3:]) if x.dim() > 4 else x  # a view for contiguous batch dims
    return x.transpose(1, 2)


def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
         enable_gqa=False, *, sinks=None):
    """``torch.nn.functional.scaled_dot_product_attention`` on flash3.

    query (..., H_q, L, E), key (..., H_k, S, E), value (..., H_k, S, E_v), same leading dims.
    Returns (..., H_q, L, E_v) in query's dtype, differentiable. ``is_causal`` is top-left
    aligned, as in torch. Raises for ``attn_mask`` (flash3 has no arbitrary masks: use
    ``is_causal`` or :func:`flash3.attention`'s ``window_size``), for ``dropout_p > 0``, and for
    ``H_q != H_k`` without ``enable_gqa`` (as torch does).

    ``sinks`` (H_q,), keyword-only and not in torch's signature: attention sinks (gpt-oss's
    ``s_aux``), one logit per query head that joins each row's softmax denominator
    (:func:`flash3.attention`).
    """
    for name, x in (("query", query), ("key", key), ("value", value)):
        _checks.sdpa_tensor(name, x)
    if attn_mask is not None:
        raise ValueError("flash3.sdpa: attn_mask is not supported (flash3 has no arbitrary "
                         "masks); pass attn_mask=None with is_causal, or call flash3.attention "
                         "with window_size for sliding windows, or flash3.attention_varlen for "
                         "padding")
    if not isinstance(dropout_p, numbers.Real) or dropout_p != 0.0:
        raise ValueError(f"flash3.sdpa: dropout_p must be 0.0 (flash3 has no attention dropout), "
                         f"got {dropout_p!r}")
    _checks.flag("is_causal", is_causal)
    if query.dim() != key.dim() or query.dim() != value.dim():
        raise ValueError(f"query, key and value must have the same number of dims, got "
                         f"{query.dim()}, {key.dim()} and {value.dim()}")
    batch_shape = query.shape[:-3]
    for name, x in (("key", key), ("value", value)):
        if x.shape[:-3] != batch_shape:
            raise ValueError(f"{name} has leading (batch) dims {tuple(x.shape[:-3])} but query "
                             f"has {tuple(batch_shape)}; flash3.sdpa does not broadcast them")
    h_q, h_k = query.shape[-3], key.shape[-3]
    if h_q != h_k and not enable_gqa:
        raise ValueError(f"query has {h_q} heads but key has {h_k}: pass enable_gqa=True for "
                         f"grouped-query attention (as with torch's sdpa)")
    if h_k == 0 or h_q % h_k != 0:
        raise ValueError(f"enable_gqa needs query's heads ({h_q}) to be a multiple of key's "
                         f"({h_k})")
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])

    q, k, v = (_to_bshd(x) for x in (query, key, value))
    s_q, s_k = q.shape[1], k.shape[1]
    window = (-1, -1)
    if is_causal and s_k > s_q:
        k, v = k[:, :s_q], v[:, :s_q]  # torch's top-left mask never shows keys >= s_q
    elif is_causal and s_q > s_k:
        window, is_causal = (-1, s_q - s_k), False  # key j visible to query i iff j <= i
    out = attention(q, k, v, causal=is_causal, softmax_scale=scale, window_size=window, sinks=sinks)
    out = out.transpose(1, 2)  # (b, h, s, d_v) view
    return out.reshape(*batch_shape, *out.shape[-3:]) if len(batch_shape) != 1 else out
