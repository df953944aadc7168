"""Public functions of flash3: validate, then call the registered operators."""

from __future__ import annotations

import torch

from . import _checks, ops


def attention(q, k, v, *, causal=False, softmax_scale=None, window_size=(-1, -1), softcap=0.0,
              return_lse=False, q_descale=None, k_descale=None, v_descale=None,
              fp8_block_size=(128, 128), deterministic=False):
    """Scaled dot-product attention, FlashAttention-3 semantics.

    q (b, s_q, h, d), k (b, s_k, h_k, d), v (b, s_k, h_k, d_v) with h % h_k == 0.
    Returns out (b, s_q, h, d_v) in q's dtype, and lse (b, h, s_q) fp32 if
    ``return_lse``.  Masks are bottom-right aligned; ``causal`` is window
    ``(left, 0)``.  float8_e4m3fn inputs need descales and return bf16 (no grad).
    ``deterministic=True`` makes the backward bitwise reproducible run to run (the
    reference backward always is).
    """
    _checks.batched(q, k, v)
    scale, left, right, softcap = _checks.options(q, causal, softmax_scale, window_size, softcap)
    _checks.fp8_descales(q, k, v, q_descale, k_descale, v_descale, fp8_block_size)
    _checks.flag("deterministic", deterministic)
    if _checks.is_fp8(q):
        out, lse = ops.attention_fp8(q, k, v, q_descale, k_descale, v_descale, scale, left,
                                     right, softcap, int(fp8_block_size[0]), int(fp8_block_size[1]))
    else:
        out, lse = ops.attention_fwd(q, k, v, scale, left, right, softcap, deterministic)
    return (out, lse) if return_lse else out


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                     causal=False, softmax_scale=None, window_size=(-1, -1), softcap=0.0,
                     return_lse=False, deterministic=False):
    """Attention over packed variable-length sequences.

    q (total_q, h, d), k/v (total_k, h_k, d|d_v); sequence i is rows
    cu_seqlens[i]:cu_seqlens[i+1] (int32, length batch + 1).  Masks apply per
    sequence.  Returns out (total_q, h, d_v) and, if ``return_lse``, lse (h, total_q).
    ``deterministic`` as in :func:`attention`.
    """
    _checks.varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    _checks.flag("deterministic", deterministic)
    scale, left, right, softcap = _checks.options(q, causal, softmax_scale, window_size, softcap)
    out, lse = ops.attention_varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q),
                                        int(max_seqlen_k), scale, left, right, softcap,
                                        deterministic)
    return (out, lse) if return_lse else out


def attention_with_kvcache(q, k_cache, v_cache, k=None, v=None, *, cache_seqlens,
                           page_table=None, causal=False, softmax_scale=None,
                           window_size=(-1, -1), softcap=0.0, return_lse=False, num_splits=0):
    """Decoding attention against a KV cache (forward only).

    k_cache/v_cache are (b, capacity, h_k, d|d_v), or paged
    (num_pages, page_size, h_k, d|d_v) addressed through int32 ``page_table``
    (b, max_pages).  New keys k/v (b, s_new, h_k, ·), if given, are written in
    place at positions cache_seqlens[i]... and attended to: row i sees
    cache_seqlens[i] + s_new keys.  ``cache_seqlens`` is int32 (b,) or an int.
    ``num_splits`` is accepted for compatibility and ignored by the reference.
    Returns out (b, s_q, h, d_v) and, if ``return_lse``, lse (b, h, s_q).
    """
    cache_seqlens = _checks.kvcache(q, k_cache, v_cache, k, v, cache_seqlens, page_table,
                                    num_splits)
    scale, left, right, softcap = _checks.options(q, causal, softmax_scale, window_size, softcap)
    out, lse = ops.attention_kvcache(q, k_cache, v_cache, k, v, cache_seqlens, page_table,
                                     scale, left, right, softcap)
    return (out, lse) if return_lse else out
