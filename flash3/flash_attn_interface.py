"""FlashAttention-3's Python interface (``hopper/flash_attn_interface.py``) on flash3.

For code written against FlashAttention-3, swap one import::

    from flash3 import flash_attn_interface   # instead of: import flash_attn_interface

The functions keep FA3's names, argument order (positional calls work), defaults and return
conventions, and map onto flash3's public API:

* ``flash_attn_func`` / ``flash_attn_qkvpacked_func`` / ``flash_attn_varlen_func``:
  ``return_attn_probs=True`` returns ``(out, softmax_lse)`` (lse (b, h, s_q), or (h, total_q)
  for varlen), as FA3 does.  float8_e4m3fn q/k/v: descales are optional (FA3: None means 1)
  and may be any shape that broadcasts to (batch, h_k), e.g. (1,); the output is bf16.
  ``seqused_q``/``seqused_k`` (the first seqused[i] queries/keys of sequence i, alone or
  together; query rows past seqused_q get out 0, lse -inf; keys past seqused_k are not seen and,
  16-bit, get dk/dv 0) and ``attention_chunk`` run on flash3's kernels for every dtype.
  Descales given with 16-bit inputs are ignored, as in FA3.
* ``flash_attn_with_kvcache``: ``rotary_interleaved=True`` by default (FA3's default; flash3's
  own ``attention_with_kvcache`` defaults to False).  ``cache_seqlens=None`` means the whole
  cache.  ``return_softmax_lse=True`` returns ``(out, softmax_lse, out_accum, lse_accum)`` as
  FA3's code does (the split partials are not exposed here: the last two are empty tensors).
  ``cache_batch_idx`` is honoured by addressing the contiguous cache as pages of a whole
  row (no copy), or with ``page_table`` by gathering row i's page-table row
  ``page_table[cache_batch_idx[i]]`` on the device (an index outside the table: a row of page ids
  -1, read as zeros, never written; an error in validation mode); ``cu_seqlens_q``/
  ``max_seqlen_q`` by flash3's packed-query path (the decode kernel on CUDA); ``cache_leftpad``
  by flash3's (the decode kernel on CUDA; paged caches, cache_batch_idx and packed queries
  included); ``cu_seqlens_k_new`` (packed new keys) and new keys or rotary with packed queries
  by flash3's packed append (the fused append kernel, then the decode kernel, on CUDA; packed
  query t of entry i at rotary position (rotary_seqlens or cache_seqlens)[i] + t when causal,
  local or chunked, as FA3).  An FP8 cache
  takes FA3's per-(batch, kv head) descales (batch: cu_seqlens_q's sequences when packed):
  batched or packed (cu_seqlens_q) q, paged or not, cache_batch_idx and cache_leftpad included,
  on flash3's decode path with descales per batch entry (FP8 q exactly as bf16, its descale
  folded into k's; bf16 output); e4m3 new k/v (FA3's: they have q's dtype), batched or packed
  (cu_seqlens_k_new), are copied into the cache unchanged by the fused append (they share their
  entry's descales), then attended.  With rotary (FA3's: q e4m3 too; every layout above) the fused
  append rotates q8 and the new keys as FA3's kernel does -- in fp32 from the e4m3 values,
  rounded once to e4m3, saturating at +-448 -- and the decode kernel reads the rotated q8 as bf16
  (_fp8_rotary_on_kernel).  New keys not e4m3, or rotary with a 16-bit q (not FA3's): batched q
  on a contiguous cache as before (q dequantized to bf16), otherwise the spec (below).
  ``attention_chunk`` runs on flash3's decode kernels (16-bit and FP8 caches, every head dim;
  MLA calls: the MLA decode kernel).
  FP8 (e4m3) rotary tables are converted to float32 (exact) and take the same path as other
  tables.
* ``flash_attn_combine``: merges split partials (out (S, b, s, h, d) fp32, lse (S, b, s, h));
  returns (out, lse (b, s, h)).

``num_splits``, ``pack_gqa``, ``sm_margin`` and ``scheduler_metadata`` only tune speed in FA3:
they are accepted; ``num_splits`` reaches flash3's decode call.  ``get_scheduler_metadata``
returns an int32 tensor carrying its plan host-side (no device read when it comes back):
``flash_attn_with_kvcache(..., scheduler_metadata=md)`` with ``num_splits=0`` takes md's
``num_splits``, and refuses (ValueError) an md made for another batch size, max_seqlen_q, head
count or head dim; a tensor without the plan (a copy, a slice of a buffer) is accepted and
ignored.  Results depend on it only through the split count (rounding).

``alibi_slopes`` (FlashAttention-2's keyword; FA3's hopper interface has none): a trailing keyword
of ``flash_attn_func``, ``flash_attn_qkvpacked_func``, ``flash_attn_varlen_func`` and
``flash_attn_with_kvcache``, float32 (h,) or (b, h), passed to flash3's calls (FA2's bias
-slope·|i + s_k - s_q - j|; lse is the exact one, see flash3.attention).  Not with the arguments
below that run the FA3 spec (NotImplementedError).

FA3 arguments flash3's kernels do not take run on flash3/reference/fa3.py, the direct spec of
FA3's forward (on CUDA tensors with the package's one-time fallback warning; forward and, for
``flash_attn_func``/``flash_attn_varlen_func``, autograd through it): ``qv`` (MLA; d_v up to 512
when d <= 64, with or without qv; default scale 1/sqrt(d + d_v)) but in ``flash_attn_with_kvcache``
where the MLA decode kernel takes it (below), ``attention_chunk`` (chunked local attention,
intersected with causal/windows) on the spec's MLA route (``flash_attn_func``/
``flash_attn_varlen_func`` run it on flash3's kernels: 16-bit forward and backward, FP8 forward,
``seqused_k`` included; ``flash_attn_with_kvcache`` on the decode kernels, the MLA one too),
with an FP8 cache, new keys not float8_e4m3fn (or with rotary tables and a 16-bit q) when packed
by ``cu_seqlens_k_new``, with packed queries or on a paged cache (16-bit caches, and FA3's e4m3
q/keys with rotary, take them on flash3's kernels; ``cu_seqlens_k_new`` without new keys is
unused, as in FA3).  ``window_size``
may be any pair that converts to ints (a tensor).

MLA decode (DeepSeek-V3 as FA3 serves it): ``flash_attn_with_kvcache`` with ``qv`` and/or
d_v > 256 runs on flash3's MLA decode kernel (d <= 64, 256 < d_v <= 512, bf16 in the default
build, q and caches of one 16-bit dtype, batched or packed q, paged or contiguous cache,
num_splits, causal/window/softcap, attention_chunk, cache_leftpad, each with batched or packed q)
unless there are ALiBi slopes (NotImplementedError: the spec has none); otherwise on the spec (qv
with d_v <= 256 always).  New keys k (b, s_new, h_k, d) / v (b, s_new, h_k, d_v), batched or
packed (cu_seqlens_k_new, and/or with
cu_seqlens_q), and rotary (rotary_dim <= d, interleaved or not, rotary_seqlens; q and the new
keys, qv never) are first written into the cache by flash3's fused append (new k/v of q's dtype;
else the spec), as for 16-bit caches; the kernel then attends over cache_seqlens[i] + the entry's
new keys, computed on the device (no host read).
"""

from __future__ import annotations

import numbers
from typing import NamedTuple

import torch

from . import _backend, _checks, validation
from .api import (_append_new_keys, _packed_queries_kernel_check, _varlen_cache_seqlens, attention,
                  attention_varlen, attention_with_kvcache)
from .masking import normalize_window
from .reference import combine_splits
from .reference.fa3 import fa3_forward

__all__ = ["flash_attn_func", "flash_attn_qkvpacked_func", "flash_attn_varlen_func",
           "flash_attn_with_kvcache", "flash_attn_combine", "get_scheduler_metadata"]


def _window(window_size):
    """FA3 takes any pair whose entries convert to int (its tests pass a 2-element tensor)."""
    try:
        left, right = (int(w) for w in window_size)
    except (TypeError, ValueError):
        raise TypeError(f"window_size must be a pair of ints, got {window_size!r}") from None
    return max(left, -1), max(right, -1)  # FA3: any negative entry is unbounded


def _on_reference(fn, q, reason, **kw):
    """FA3 arguments flash3's kernels do not take: the reference spec (flash3/reference/fa3.py),
    on CUDA with the package's one-time fallback warning."""
    if q.is_cuda:
        _backend.warn_fallback(reason, f"flash_attn_interface.{fn}")
    left, right = normalize_window(kw.pop("causal"), kw.pop("window"))
    scale = kw.pop("softmax_scale")
    if scale is None:  # FA3: qv's head dim joins the scale
        qv = kw.get("qv")
        scale = (q.shape[-1] + (0 if qv is None else qv.shape[-1])) ** -0.5
    return fa3_forward(q, softmax_scale=float(scale), window_left=left, window_right=right, **kw)


def _reference_shapes(q, k, v, dims, what):
    """The shape rules of the reference route: FA3's (d_v up to 512 when d <= 64, for MLA)."""
    for n, t in (("q", q), ("k", k), ("v", v)):
        _checks.tensor(n, t, dims, what)
    h, d, h_k, d_v = q.shape[-2], q.shape[-1], k.shape[-2], v.shape[-1]
    if h_k == 0 or v.shape[-2] != h_k or h % h_k or k.shape[-1] != d:
        raise ValueError(f"q/k/v shapes {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}: "
                         "need heads(q) % heads(k) == 0, heads(v) == heads(k), headdim(k) == "
                         "headdim(q)")
    if not 1 <= d <= 256 or not 1 <= d_v <= (512 if d <= 64 else 256):
        raise ValueError(f"head dims d={d}, d_v={d_v}: FA3 takes d <= 256 and d_v <= 256, or "
                         "d_v <= 512 with d <= 64")


def _no_alibi_on_reference(reason, alibi_slopes):
    if reason is not None and alibi_slopes is not None:
        raise NotImplementedError(f"alibi_slopes cannot be combined with {reason} (FA3's "
                                  "reference spec, flash3/reference/fa3.py, has no ALiBi)")


def _reference_reason(**named):
    """Names of the given arguments that only the reference computes, or None."""
    given = [n for n, x in named.items()
             if x is not None and x is not False and not (isinstance(x, int) and x == 0)]
    return ", ".join(given) or None


def _speed_only(num_splits, pack_gqa, sm_margin):
    for name, x in (("num_splits", num_splits), ("sm_margin", sm_margin)):
        if not isinstance(x, numbers.Integral) or isinstance(x, bool) or x < 0:
            raise ValueError(f"{name} must be an int >= 0, got {x!r}")
    if pack_gqa is not None and not isinstance(pack_gqa, bool):
        raise TypeError(f"pack_gqa must be None or a bool, got {type(pack_gqa).__name__}")


def _descale(d, name, b, h_k, device):
    """FA3 descale (None = 1, anything broadcastable to (b, h_k)) -> fp32 (b, h_k)."""
    if d is None:
        return torch.ones(b, h_k, dtype=torch.float32, device=device)
    _checks.float_tensor(d, name, "fp16/bf16")
    try:
        return torch.broadcast_to(d.to(device=device, dtype=torch.float32), (b, h_k)).contiguous()
    except RuntimeError:
        raise ValueError(f"{name} must broadcast to (batch, kv_heads) = {(b, h_k)}, got shape "
                         f"{tuple(d.shape)}") from None


def _fp8_descales(q, k, b, q_descale, k_descale, v_descale):
    """Descales for flash3 when q/k/v are float8_e4m3fn, else None (FA3 ignores them then)."""
    if not _checks.is_fp8(q):
        return None, None, None
    h_k = k.shape[-2]
    return tuple(_descale(d, n, b, h_k, q.device) for d, n in
                 ((q_descale, "q_descale"), (k_descale, "k_descale"), (v_descale, "v_descale")))


def flash_attn_func(q, k, v, softmax_scale=None, causal=False, qv=None, q_descale=None,
                    k_descale=None, v_descale=None, window_size=(-1, -1), attention_chunk=0,
                    softcap=0.0, num_splits=1, pack_gqa=None, deterministic=False, sm_margin=0,
                    return_attn_probs=False, *, alibi_slopes=None):
    """FA3 ``flash_attn_func``: q (b, s_q, h, d), k/v (b, s_k, h_k, d|d_v) -> out, or
    (out, softmax_lse (b, h, s_q)) with ``return_attn_probs``."""
    _speed_only(num_splits, pack_gqa, sm_margin)
    qd, kd, vd = _fp8_descales(q, k, q.shape[0], q_descale, k_descale, v_descale)
    chunk = _checks.int_at_least("attention_chunk", attention_chunk, 0)
    # attention_chunk runs on flash3's kernels (16-bit and FP8).
    reason = _reference_reason(qv=qv, head_dim_v_over_256=v.shape[-1] > 256)
    _no_alibi_on_reference(reason, alibi_slopes)
    if reason is not None:
        _reference_shapes(q, k, v, 4, "(batch, seqlen, heads, headdim)")
        out, lse = _on_reference("flash_attn_func", q, reason, k=k, v=v, qv=qv, causal=causal,
                                 softmax_scale=softmax_scale, window=_window(window_size),
                                 attention_chunk=chunk, softcap=float(softcap),
                                 q_descale=qd, k_descale=kd, v_descale=vd)
        return (out, lse) if return_attn_probs else out
    out, lse = attention(q, k, v, causal=causal, softmax_scale=softmax_scale,
                         window_size=_window(window_size), softcap=softcap, return_lse=True,
                         q_descale=qd, k_descale=kd, v_descale=vd, deterministic=deterministic,
                         alibi_slopes=alibi_slopes, attention_chunk=chunk)
    return (out, lse) if return_attn_probs else out


def flash_attn_qkvpacked_func(qkv, softmax_scale=None, causal=False, q_descale=None,
                              k_descale=None, v_descale=None, window_size=(-1, -1),
                              attention_chunk=0, softcap=0.0, deterministic=False,
                              num_heads_q=None, sm_margin=0, return_attn_probs=False, *,
                              alibi_slopes=None):
    """FA3 ``flash_attn_qkvpacked_func``: qkv (b, s, 3, h, d), or (b, s, h + 2 h_k, d) with
    ``num_heads_q`` = h (GQA); gradients flow back into qkv."""
    _checks.tensor("qkv", qkv)
    if qkv.dim() == 5:
        if qkv.shape[2] != 3:
            raise ValueError(f"qkv must be (batch, seqlen, 3, heads, headdim), got {tuple(qkv.shape)}")
        q, k, v = qkv.unbind(dim=2)
    elif qkv.dim() == 4:
        if not isinstance(num_heads_q, numbers.Integral) or num_heads_q <= 0:
            raise ValueError("num_heads_q (an int > 0) is required for a 4-D qkv "
                             "(batch, seqlen, num_heads_q + 2 * num_heads_k, headdim)")
        h_k2 = qkv.shape[2] - num_heads_q
        if h_k2 <= 0 or h_k2 % 2:
            raise ValueError(f"qkv has {qkv.shape[2]} heads: not num_heads_q ({num_heads_q}) + "
                             "2 * num_heads_k")
        q, k, v = qkv.split([num_heads_q, h_k2 // 2, h_k2 // 2], dim=2)
    else:
        raise ValueError(f"qkv must be 5-D or 4-D, got shape {tuple(qkv.shape)}")
    return flash_attn_func(q, k, v, softmax_scale, causal, None, q_descale, k_descale, v_descale,
                           window_size, attention_chunk, softcap, 1, None, deterministic,
                           sm_margin, return_attn_probs, alibi_slopes=alibi_slopes)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           seqused_q=None, seqused_k=None, softmax_scale=None, causal=False,
                           qv=None, q_descale=None, k_descale=None, v_descale=None,
                           window_size=(-1, -1), attention_chunk=0, softcap=0.0, num_splits=1,
                           pack_gqa=None, deterministic=False, sm_margin=0,
                           return_attn_probs=False, *, alibi_slopes=None):
    """FA3 ``flash_attn_varlen_func``: packed q (total_q, h, d), k/v (total_k, h_k, ·) -> out,
    or (out, softmax_lse (h, total_q)).  ``seqused_q`` and ``seqused_k`` (the first seqused[i]
    queries/keys of sequence i), alone or together, run attention_varlen(seqused_q=, seqused_k=)
    (the kernels on CUDA: 16-bit with autograd, FP8 the FP8 forward)."""
    _speed_only(num_splits, pack_gqa, sm_margin)
    b = cu_seqlens_q.shape[0] - 1 if isinstance(cu_seqlens_q, torch.Tensor) else 0
    qd, kd, vd = _fp8_descales(q, k, b, q_descale, k_descale, v_descale)
    chunk = _checks.int_at_least("attention_chunk", attention_chunk, 0)
    # flash3's varlen path takes seqused_q, seqused_k (together too) and the chunk: 16-bit with
    # autograd, FP8 inputs on the FP8 forward.
    reason = _reference_reason(qv=qv, head_dim_v_over_256=v.shape[-1] > 256)
    _no_alibi_on_reference(reason, alibi_slopes)
    if reason is not None:
        _reference_shapes(q, k, v, 3, "(total, heads, headdim)")
        for n, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
            _checks.tensor(n, t, 1)
        out, lse = _on_reference("flash_attn_varlen_func", q, reason, k=k, v=v, qv=qv,
                                 causal=causal, softmax_scale=softmax_scale,
                                 window=_window(window_size), attention_chunk=chunk,
                                 softcap=float(softcap), cu_seqlens_q=cu_seqlens_q,
                                 cu_seqlens_k=cu_seqlens_k, seqused_q=seqused_q,
                                 seqused_k=seqused_k, q_descale=qd, k_descale=kd, v_descale=vd)
        return (out, lse) if return_attn_probs else out
    out, lse = attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                causal=causal, softmax_scale=softmax_scale,
                                window_size=_window(window_size), softcap=softcap,
                                return_lse=True, deterministic=deterministic, q_descale=qd,
                                k_descale=kd, v_descale=vd, seqused_k=seqused_k,
                                alibi_slopes=alibi_slopes, seqused_q=seqused_q, attention_chunk=chunk)
    return (out, lse) if return_attn_probs else out


def flash_attn_combine(out_partial, lse_partial, out=None, out_dtype=None):
    """FA3 ``flash_attn_combine``: out_partial (S, b, s, h, d) fp32 and lse_partial (S, b, s, h)
    fp32 (each split normalized over its keys) -> (out (b, s, h, d) in ``out_dtype`` (default
    fp32), lse (b, s, h) fp32).  A row every split saw nothing of gets out 0, lse -inf."""
    for n, t, nd in (("out_partial", out_partial, 5), ("lse_partial", lse_partial, 4)):
        _checks.tensor(n, t, nd)
        if t.dtype != torch.float32:
            raise TypeError(f"{n} must be float32, got {t.dtype}")
    if tuple(lse_partial.shape) != tuple(out_partial.shape[:4]):
        raise ValueError(f"lse_partial must have shape {tuple(out_partial.shape[:4])} "
                         f"(num_splits, batch, seqlen, heads), got {tuple(lse_partial.shape)}")
    out_dtype = out_dtype or (out.dtype if out is not None else torch.float32)
    if out_dtype not in _checks.FLOAT_DTYPES:
        raise TypeError(f"out_dtype must be float32, float16 or bfloat16, got {out_dtype}")
    o, lse = combine_splits(out_partial, lse_partial.permute(0, 1, 3, 2))
    if out is None:
        out = o.to(out_dtype)
    else:
        if out.shape != o.shape or out.dtype != out_dtype:
            raise ValueError(f"out must be {tuple(o.shape)} {out_dtype}, got "
                             f"{tuple(out.shape)} {out.dtype}")
        out.copy_(o)
    return out, lse.transpose(1, 2)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, qv=None, rotary_cos=None,
                            rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
                            cache_leftpad=None, page_table=None, cu_seqlens_q=None,
                            cu_seqlens_k_new=None, max_seqlen_q=None, rotary_seqlens=None,
                            q_descale=None, k_descale=None, v_descale=None, softmax_scale=None,
                            causal=False, window_size=(-1, -1), attention_chunk=0, softcap=0.0,
                            rotary_interleaved=True, scheduler_metadata=None, num_splits=0,
                            pack_gqa=None, sm_margin=0, return_softmax_lse=False, *,
                            alibi_slopes=None):
    """FA3 ``flash_attn_with_kvcache`` (forward only; k/v, if given, are appended in place)."""
    fn = "flash_attn_with_kvcache"
    _speed_only(num_splits, pack_gqa, sm_margin)
    for n, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        _checks.tensor(n, t)
    _check_qv(qv, q, v_cache)
    varlen = cu_seqlens_q is not None
    b = cu_seqlens_q.shape[0] - 1 if varlen else q.shape[0]
    if scheduler_metadata is not None:  # its split count, when the call gives none (0)
        num_splits = _scheduler_splits(scheduler_metadata, num_splits, b, q, k_cache, v_cache,
                                       max_seqlen_q if varlen else q.shape[1])
    fp8_cache = _checks.is_fp8(k_cache) and _checks.is_fp8(v_cache)
    # FA3's FP8 decode (new keys, if any, e4m3; with rotary, q e4m3 too, FA3's; batched or packed q
    # and new keys): the fused append copies the e4m3 keys unchanged (or rotates them with q, in
    # e4m3: _fp8_rotary_on_kernel) and the decode kernel reads the cache with FA3's (batch, kv
    # head) descales, paged or not (flash3's descale_per_batch).
    fa3_fp8 = fp8_cache and (k is None or (_checks.is_fp8(k) and _checks.is_fp8(v)
                                           and (rotary_cos is None or _checks.is_fp8(q))))
    # FA3 reads cu_seqlens_k_new only with new keys and rotary_seqlens only with rotary tables
    # (hopper/flash_api.cpp); serving engines pass them regardless (SGLang: cu_seqlens_k_new on
    # every call), so unused they send no call to the reference.
    if k is None:
        cu_seqlens_k_new = None
    if rotary_cos is None:
        rotary_seqlens = None
    # FP8 (e4m3) rotary tables, as FA3's FP8 tests pass them: float32 holds every e4m3 value, so
    # the conversion is exact (the kernel path reads the tables as float32 anyway).
    rotary_cos, rotary_sin = (t.to(torch.float32) if t is not None and _checks.is_fp8(t) else t
                              for t in (rotary_cos, rotary_sin))
    chunk = _checks.int_at_least("attention_chunk", attention_chunk, 0)
    # MLA (qv, or d_v > 256): the MLA decode kernel (after the fused append of new keys; the chunk
    # and cache_leftpad, batched or packed, included), unless mla_reason says why not. Packed new
    # keys (cu_seqlens_k_new), new keys or rotary with packed queries, and cache_leftpad with packed
    # queries run on flash3's kernels (the fused append, then the decode kernel); with an FP8 cache
    # too where fa3_fp8 holds, else (new keys not e4m3, or rotary with a 16-bit q) they stay on the
    # spec.
    mla = qv is not None or v_cache.shape[-1] > 256
    mla_reason = _mla_kernel_reason(q, k_cache, v_cache, qv, k, v, alibi_slopes,
                                    softmax_scale, chunk) if mla else None
    reason = _reference_reason(
        qv=qv if mla_reason is not None else None,
        head_dim_v_over_256=v_cache.shape[-1] > 256 and mla_reason is not None,
        cu_seqlens_k_new=cu_seqlens_k_new if fp8_cache and not fa3_fp8 else None,
        # the decode kernels take the chunk (batched q falls back inside flash3 where they cannot;
        # packed q has no fallback there, so such calls take the spec here); MLA: mla_reason
        attention_chunk=chunk if not mla and varlen and q.is_cuda and _backend.kernel_chunk_reason(
            q, "decode", chunk, v_cache.shape[-1]) is not None else 0,
        fp8_paged_cache_with_new_kv=fp8_cache and not fa3_fp8 and page_table is not None,
        cu_seqlens_q_with_new_kv=fp8_cache and not fa3_fp8 and varlen)
    _no_alibi_on_reference(reason, alibi_slopes)
    if reason is not None:
        if cache_seqlens is None:
            full = k_cache.shape[1] * (1 if page_table is None else page_table.shape[1])
            cache_seqlens = full
        if isinstance(cache_seqlens, numbers.Integral):
            cache_seqlens = torch.full((b,), int(cache_seqlens), dtype=torch.int32,
                                       device=q.device)
        qd = kd = vd = None
        if _checks.is_fp8(q) or fp8_cache:
            h_k = k_cache.shape[2]
            qd, kd, vd = (None if x is None else _descale(x, n, b, h_k, q.device) for x, n in
                          ((q_descale if _checks.is_fp8(q) else None, "q_descale"),
                           (k_descale if fp8_cache else None, "k_descale"),
                           (v_descale if fp8_cache else None, "v_descale")))
        with torch.no_grad():
            out, lse = _on_reference(
                fn, q, reason, k=k_cache, v=v_cache, k_new=k, v_new=v, qv=qv, causal=causal,
                softmax_scale=softmax_scale, window=_window(window_size),
                attention_chunk=chunk, softcap=float(softcap),
                cu_seqlens_q=cu_seqlens_q, cu_seqlens_k_new=cu_seqlens_k_new,
                cache_seqlens=cache_seqlens, page_table=page_table,
                cache_batch_idx=cache_batch_idx, cache_leftpad=cache_leftpad,
                rotary_cos=rotary_cos, rotary_sin=rotary_sin, rotary_seqlens=rotary_seqlens,
                rotary_interleaved=rotary_interleaved, q_descale=qd, k_descale=kd, v_descale=vd)
        if not return_softmax_lse:
            return out
        empty = torch.empty(0, device=out.device)
        return out, lse, empty, empty
    if cache_batch_idx is not None:
        _checks.tensor("cache_batch_idx", cache_batch_idx, 1)
        if cache_batch_idx.dtype != torch.int32 or cache_batch_idx.shape[0] != b:
            raise ValueError(f"cache_batch_idx must be int32 of shape ({b},), got "
                             f"{cache_batch_idx.dtype} {tuple(cache_batch_idx.shape)}")
        if page_table is None:  # the contiguous cache as pages of one whole row each
            page_table = cache_batch_idx.view(b, 1)
        else:  # row i reads (and appends through) page_table[cache_batch_idx[i]], gathered on
            # the device (no host read); an index outside the table gives a row of page ids -1,
            # which the kernels read as zeros and never write
            page_table = _gather_page_rows(page_table, cache_batch_idx)
    if cache_seqlens is None:  # FA3: the whole cache
        if k is not None:
            raise ValueError("cache_seqlens is required with new keys k/v (where to append them)")
        full = k_cache.shape[1] * (1 if page_table is None else page_table.shape[1])
        cache_seqlens = full
    if mla:
        out, lse = _mla_on_kernel(q, k_cache, v_cache, qv, k, v, cache_seqlens, page_table,
                                  cu_seqlens_q, max_seqlen_q, cu_seqlens_k_new, cache_leftpad,
                                  rotary_cos, rotary_sin, rotary_seqlens, rotary_interleaved,
                                  softmax_scale, causal, _window(window_size), softcap, num_splits,
                                  chunk)
        if not return_softmax_lse:
            return out
        empty = torch.empty(0, device=out.device)
        return out, lse, empty, empty
    kd = vd = None
    h_k = k_cache.shape[2]
    if fa3_fp8:  # descales (b, h_k) of the batch entry, whatever slab holds its keys
        kd, vd = (_descale(d, n, b, h_k, q.device) for d, n in
                  ((k_descale, "k_descale"), (v_descale, "v_descale")))
        if _checks.is_fp8(q):  # q8 as bf16 exactly; scores = q8 . k8 * (q_descale * k_descale)
            kd = _descale(q_descale, "q_descale", b, h_k, q.device) * kd
            if k is not None and rotary_cos is not None:  # q8 rotated in e4m3 with the keys (FA3's)
                out, lse = _fp8_rotary_on_kernel(
                    q, k_cache, v_cache, k, v, cache_seqlens, page_table, cu_seqlens_q,
                    max_seqlen_q, cu_seqlens_k_new, cache_leftpad, rotary_cos, rotary_sin,
                    rotary_seqlens, rotary_interleaved, kd, vd, softmax_scale, causal,
                    _window(window_size), softcap, num_splits, chunk, alibi_slopes)
                if not return_softmax_lse:
                    return out
                empty = torch.empty(0, device=out.device)
                return out, lse, empty, empty
            q = q.to(torch.bfloat16)
    elif fp8_cache:  # batched q, contiguous, new keys fa3_fp8 does not take (the rest: the spec)
        kd, vd = (_descale(d, n, b, h_k, q.device) for d, n in
                  ((k_descale, "k_descale"), (v_descale, "v_descale")))
        if cache_batch_idx is not None:  # per cache row: row cache_batch_idx[i] has row i's
            idx = cache_batch_idx.long()
            kd, vd = (torch.ones(k_cache.shape[0], h_k, dtype=torch.float32, device=q.device)
                      .index_copy_(0, idx, d) for d in (kd, vd))
        if _checks.is_fp8(q):  # FA3 computes with fp8 q: dequantize once to bf16
            qd = _descale(q_descale, "q_descale", b, h_k, q.device)
            q = _dequantize_q(q, qd)
        if k is not None and _checks.is_fp8(k):  # stored back as the same bytes by flash3
            k, v = (_dequantize_new(x, d, cache_batch_idx, q.dtype) for x, d in ((k, kd), (v, vd)))
    out, lse = attention_with_kvcache(
        q, k_cache, v_cache, k, v, cache_seqlens=cache_seqlens, page_table=page_table,
        causal=causal, softmax_scale=softmax_scale, window_size=_window(window_size),
        softcap=softcap, return_lse=True, num_splits=num_splits, rotary_cos=rotary_cos,
        rotary_sin=rotary_sin, rotary_interleaved=rotary_interleaved, k_descale=kd,
        v_descale=vd, cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q,
        alibi_slopes=alibi_slopes, rotary_seqlens=rotary_seqlens, cache_leftpad=cache_leftpad,
        cu_seqlens_k_new=cu_seqlens_k_new, attention_chunk=chunk,
        **({"descale_per_batch": True} if fa3_fp8 else {}))
    if not return_softmax_lse:
        return out
    empty = torch.empty(0, device=out.device)
    return out, lse, empty, empty


def _check_qv(qv, q, v):
    """FA3's qv: q's rows with v's head dim, q's dtype and device (any route)."""
    if qv is None:
        return
    _checks.tensor("qv", qv, q.dim())
    want = (*q.shape[:-1], v.shape[-1])
    if tuple(qv.shape) != want or qv.dtype != q.dtype or qv.device != q.device:
        raise ValueError(f"qv must be {want} {q.dtype} on {q.device} (q's rows, v's head dim), got "
                         f"{tuple(qv.shape)} {qv.dtype} on {qv.device}")


def _mla_kernel_reason(q, k_cache, v_cache, qv, k, v, alibi_slopes, softmax_scale,
                       attention_chunk=0):
    """Why the MLA decode kernel (with the fused append of new keys) cannot run this MLA call (qv
    or d_v > 256); None if it can."""
    if alibi_slopes is not None:
        return "alibi_slopes with MLA (the MLA kernel has no ALiBi term)"
    if softmax_scale is None:
        softmax_scale = (q.shape[-1] + (0 if qv is None else qv.shape[-1])) ** -0.5
    reason = (_backend.kernel_mla_reason(q, k_cache, v_cache, float(softmax_scale))
              or _backend.kernel_chunk_reason(q, "decode", attention_chunk, v_cache.shape[-1]))
    if reason is None and k is not None and v is not None:  # (k without v: _mla_on_kernel refuses)
        reason = _backend.kernel_packed_append_reason(q, k_cache, v_cache, k, v)
    return reason


def _mla_on_kernel(q, k_cache, v_cache, qv, k, v, cache_seqlens, page_table, cu_seqlens_q,
                   max_seqlen_q, cu_seqlens_k_new, cache_leftpad, rotary_cos, rotary_sin,
                   rotary_seqlens, rotary_interleaved, softmax_scale, causal, window, softcap,
                   num_splits, attention_chunk=0):
    """FA3's MLA decode on the MLA decode kernel, with attention_with_kvcache's checks (d_v up to
    512): (out, lse), lse (b, h, s_q) or packed (h, total_q); cache_leftpad and attention_chunk
    (FA3's chunked local attention, 0 = off) batched or packed.  New keys k (b, s_new, h_k, d) / v
    (b, s_new, h_k, d_v), or packed by cu_seqlens_k_new, are first written into the cache at
    cache_seqlens[i] + t by the fused append (ops_serve.kvcache_append_packed: rotated with q when
    rotary tables are given; qv is never rotated), then the kernel attends over cache_seqlens[i] +
    n_new_i keys (computed on the device).  Every check runs first: a rejected call writes
    nothing."""
    if softmax_scale is None:  # FA3: qv's head dim joins the scale
        softmax_scale = (q.shape[-1] + (0 if qv is None else qv.shape[-1])) ** -0.5
    scale, left, right, softcap = _checks.options(q, causal, softmax_scale, window, softcap)
    left, right = normalize_window(causal, (left, right))
    varlen = cu_seqlens_q is not None
    if (k is None) != (v is None):
        raise ValueError("k and v must be given together (k is %s, v is %s)"
                         % ("set" if k is not None else "None", "set" if v is not None else "None"))
    if varlen:
        if max_seqlen_q is None:
            raise ValueError("cu_seqlens_q and max_seqlen_q must be given together")
        cache_seqlens = _varlen_cache_seqlens(q, cache_seqlens, cu_seqlens_q)
        _checks.varlen_cache(q, k_cache, v_cache, cu_seqlens_q, max_seqlen_q, cache_seqlens,
                             page_table, None, None, None, "cache_seqlens", "k_cache", "v_cache",
                             max_d_v=512)
        b = cu_seqlens_q.shape[0] - 1
    else:
        cache_seqlens = _checks.kvcache(q, k_cache, v_cache, None, None, cache_seqlens, page_table,
                                        num_splits, max_d_v=512)
        b = q.shape[0]
    _checks.num_splits(num_splits)
    if k is not None:  # batched (b, s_new, h_k, d|d_v) or packed (total_new, h_k, d|d_v)
        _checks.new_keys(q, k_cache, v_cache, k, v, cu_seqlens_k_new, b)
    _checks.kvcache_extras(q, k_cache, k, page_table, rotary_cos, rotary_sin, rotary_interleaved,
                           None, None, rotary_seqlens, cache_leftpad, batch=b)
    local = left >= 0 or right >= 0 or attention_chunk > 0  # causal, local or chunked: q rotated
    # per token (FA3's rule)
    if validation.validation_enabled(q, cache_seqlens, page_table, cu_seqlens_q, cu_seqlens_k_new,
                                     cache_leftpad, rotary_seqlens):
        news, qs = _checks.appended_lengths(q, k, varlen, cu_seqlens_q, max_seqlen_q, cu_seqlens_k_new)
        _checks.kvcache_values(k_cache, cache_seqlens, news, page_table, qs, rotary_cos, local,
                               rotary_seqlens=rotary_seqlens, cache_leftpad=cache_leftpad)
    pt = None if page_table is None else page_table.contiguous()
    seqused = cache_seqlens
    with torch.no_grad():
        if k is not None:  # the fused append (d_v as the cache's), then each entry's key count
            q, seqused = _append_new_keys(q, k_cache, v_cache, k, v, cache_seqlens, pt, cu_seqlens_q,
                                          cu_seqlens_k_new, rotary_cos, rotary_sin, rotary_interleaved,
                                          local, rotary_seqlens)
        # passed only when given (builds without them serve calls without)
        extra = {} if cache_leftpad is None else {"cache_leftpad": cache_leftpad}
        if attention_chunk:
            extra["attention_chunk"] = int(attention_chunk)
        if not varlen:
            return _backend.run_kernel_kvcache(q, k_cache, v_cache, seqused, pt, scale, left, right,
                                               softcap, int(num_splits), qv=qv, **extra)
        return _backend.run_kernel_varlen_kvcache(q, k_cache, v_cache, cu_seqlens_q,
                                                  int(max_seqlen_q), seqused, pt, scale, left,
                                                  right, softcap, int(num_splits), qv=qv, **extra)


def _fp8_rotary_on_kernel(q8, k_cache, v_cache, k, v, cache_seqlens, page_table, cu_seqlens_q,
                          max_seqlen_q, cu_seqlens_k_new, cache_leftpad, rotary_cos, rotary_sin,
                          rotary_seqlens, rotary_interleaved, kd, vd, softmax_scale, causal, window,
                          softcap, num_splits, chunk, alibi_slopes):
    """FA3's FP8 decode with rotary new keys: e4m3 q8, new k/v and cache, descales kd (q's folded
    in) / vd per (batch entry, kv head); q and the new keys batched or packed, paged or contiguous.
    Every check first (a rejected call writes nothing), then the fused append rotates the new keys
    and q8 as FA3 does -- in fp32 from the e4m3 values, rounded once to e4m3 (saturating) -- and
    writes k/v into the cache (ops_serve.kvcache_append_packed: the kernel on CUDA, no host reads),
    then the attention of each entry over cache_seqlens[i] + its new keys (attention_with_kvcache
    with descale_per_batch: the FP8-cache decode kernel on CUDA, rotated q8 as bf16 exactly).
    Returns (out, lse)."""
    qb = q8.to(torch.bfloat16)  # exact: the checks' q (and, rotated, the attention's)
    scale, left, right, _ = _checks.options(qb, causal, softmax_scale, window, softcap)
    left, right = normalize_window(causal, (left, right))
    varlen = cu_seqlens_q is not None
    if varlen:
        if max_seqlen_q is None:
            raise ValueError("cu_seqlens_q and max_seqlen_q must be given together")
        cache_seqlens = _varlen_cache_seqlens(qb, cache_seqlens, cu_seqlens_q)
        _checks.varlen_cache(qb, k_cache, v_cache, cu_seqlens_q, max_seqlen_q, cache_seqlens,
                             page_table, None, kd, vd, "cache_seqlens", "k_cache", "v_cache",
                             descale_per_batch=True)
        b = cu_seqlens_q.shape[0] - 1
    else:
        cache_seqlens = _checks.kvcache(qb, k_cache, v_cache, None, None, cache_seqlens, page_table,
                                        num_splits)
        b = q8.shape[0]
    _checks.num_splits(num_splits)
    if (k is None) != (v is None):
        raise ValueError("k and v must be given together")
    _checks.new_keys(qb, k_cache, v_cache, k, v, cu_seqlens_k_new, b)
    _checks.kvcache_extras(qb, k_cache, k, page_table, None, None, rotary_interleaved, kd, vd,
                           cache_leftpad=cache_leftpad, descale_per_batch=True, batch=b)
    _checks.rotary_tables(qb, k, rotary_cos, rotary_sin, rotary_seqlens, b)
    _checks.alibi_slopes(qb, alibi_slopes, b)
    local = left >= 0 or right >= 0 or chunk > 0  # causal, local or chunked: q rotated per token
    if varlen:  # the decode kernel must take it: checked before the append
        _packed_queries_kernel_check(qb, k_cache, v_cache, scale, None, None, alibi_slopes,
                                     cache_leftpad, True, chunk, "flash_attn_with_kvcache",
                                     "cu_seqlens_q")
    if validation.validation_enabled(qb, cache_seqlens, page_table, cu_seqlens_q, cu_seqlens_k_new,
                                     cache_leftpad, rotary_seqlens):
        news, qs = _checks.appended_lengths(q8, k, varlen, cu_seqlens_q, max_seqlen_q, cu_seqlens_k_new)
        _checks.kvcache_values(k_cache, cache_seqlens, news, page_table, qs, rotary_cos, local,
                               kd, vd, rotary_seqlens=rotary_seqlens, cache_leftpad=cache_leftpad)
    pt = None if page_table is None else page_table.contiguous()
    with torch.no_grad():
        q8, seqused = _append_new_keys(q8, k_cache, v_cache, k, v, cache_seqlens, pt, cu_seqlens_q,
                                       cu_seqlens_k_new, rotary_cos, rotary_sin, rotary_interleaved,
                                       local, rotary_seqlens)
        return attention_with_kvcache(
            q8.to(torch.bfloat16), k_cache, v_cache, cache_seqlens=seqused, page_table=pt,
            causal=causal, softmax_scale=softmax_scale, window_size=window, softcap=softcap,
            return_lse=True, num_splits=num_splits, k_descale=kd, v_descale=vd,
            cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q, alibi_slopes=alibi_slopes,
            cache_leftpad=cache_leftpad, attention_chunk=chunk, descale_per_batch=True)


def _gather_page_rows(page_table, idx):
    """page_table[idx] (rows outside the table: -1), int32, with no host read."""
    _checks.tensor("page_table", page_table, 2)
    if page_table.dtype != torch.int32:
        raise ValueError(f"page_table must be int32, got {page_table.dtype}")
    rows = page_table.shape[0]
    if validation.validation_enabled(idx):
        bad = [(i, int(x)) for i, x in enumerate(idx.tolist()) if not 0 <= x < rows]
        if bad:
            raise ValueError(f"cache_batch_idx[{bad[0][0]}] = {bad[0][1]} is not a row of page_table "
                             f"(0..{rows - 1})")
    if rows == 0:
        return torch.full((idx.shape[0], page_table.shape[1]), -1, dtype=torch.int32,
                          device=page_table.device)
    ok = (idx >= 0) & (idx < rows)
    got = page_table.index_select(0, idx.clamp(0, rows - 1).long())
    return torch.where(ok.view(-1, 1), got, torch.full_like(got, -1))


def _dequantize_q(q8, qd):
    """FP8 q (b, s, h, d) times its (b, h_k) descale, as bf16."""
    h = q8.shape[-2]
    scale = qd.repeat_interleave(h // qd.shape[1], dim=1)[:, None]  # (b, 1, h)
    return (q8.to(torch.float32) * scale.unsqueeze(-1)).to(torch.bfloat16)


def _dequantize_new(x8, d, cache_batch_idx, dtype):
    """New FP8 k/v (b, s_new, h_k, d) times the descale of their cache row."""
    rows = d if cache_batch_idx is None else d[cache_batch_idx.long()]
    return (x8.to(torch.float32) * rows[:, None, :, None]).to(dtype)


class _SchedulerPlan(NamedTuple):
    """What get_scheduler_metadata was asked for, kept host-side on the tensor it returns (so a
    call that passes the tensor back reads no device memory)."""
    batch_size: int
    max_seqlen_q: int
    num_heads_q: int
    num_heads_kv: int
    headdim: int
    headdim_v: int
    num_splits: int


_PLAN_ATTR = "_flash3_scheduler_plan"


def _scheduler_splits(md, num_splits, b, q, k_cache, v_cache, max_seqlen_q):
    """The call's num_splits given scheduler_metadata md: the call's own if > 0, else the plan's.
    A tensor get_scheduler_metadata did not return (no plan on it, e.g. a copy or a slice of a
    buffer) is accepted and ignored; one made for another problem is refused (FA3 would schedule
    the call with the other problem's tiles and splits)."""
    _checks.tensor("scheduler_metadata", md, 1)
    plan = getattr(md, _PLAN_ATTR, None)
    if plan is None:
        return num_splits
    call = {"batch_size": b, "num_heads_q": q.shape[-2], "num_heads_kv": k_cache.shape[-2],
            "headdim": q.shape[-1], "headdim_v": v_cache.shape[-1]}
    if max_seqlen_q is not None:  # (packed q without max_seqlen_q: refused later)
        call["max_seqlen_q"] = int(max_seqlen_q)
    bad = [f"{n}={getattr(plan, n)} (the call's: {x})" for n, x in call.items()
           if getattr(plan, n) != x]
    if bad:
        raise ValueError("scheduler_metadata was made by get_scheduler_metadata for another "
                         "problem: " + ", ".join(bad))
    return num_splits if num_splits > 0 else plan.num_splits


def get_scheduler_metadata(batch_size, max_seqlen_q, max_seqlen_k, num_heads_q, num_heads_kv,
                           headdim, cache_seqlens, qkv_dtype=torch.bfloat16, headdim_v=None,
                           cu_seqlens_q=None, cu_seqlens_k_new=None, cache_leftpad=None,
                           page_size=None, max_seqlen_k_new=0, causal=False,
                           window_size=(-1, -1), attention_chunk=0, has_softcap=False,
                           num_splits=0, pack_gqa=None, sm_margin=0):
    """FA3 ``get_scheduler_metadata``: an int32 tensor on cache_seqlens' device to pass back as
    ``flash_attn_with_kvcache(..., scheduler_metadata=...)``.

    In FA3 it precomputes the split-KV schedule once, for every call of the same problem.  flash3's
    decode path plans its own splits (flash3.decode_plan) without host reads; what it takes from
    here is ``num_splits`` (0: flash3 chooses): the returned tensor records the problem --
    (batch_size, max_seqlen_q, max_seqlen_k, num_heads_q, num_heads_kv, headdim, headdim_v,
    num_splits) -- and carries the same plan host-side (a Python attribute), which
    flash_attn_with_kvcache reads when the tensor is passed back: a call with num_splits=0 takes
    the plan's, and a call whose batch size, max_seqlen_q (q's seqlen when batched), heads or head
    dims differ from the plan's is a ValueError.  The device tensor is never read: a copy of it
    (no plan) is accepted and ignored.  Results depend on it only through the split count, which
    changes rounding only."""
    _checks.tensor("cache_seqlens", cache_seqlens, 1)
    _speed_only(num_splits, pack_gqa, sm_margin)
    _window(window_size)
    headdim_v = headdim if headdim_v is None else headdim_v
    plan = _SchedulerPlan(int(batch_size), int(max_seqlen_q), int(num_heads_q), int(num_heads_kv),
                          int(headdim), int(headdim_v), int(num_splits))
    fields = (batch_size, max_seqlen_q, max_seqlen_k, num_heads_q, num_heads_kv, headdim,
              headdim_v, num_splits)
    md = torch.tensor([int(x) for x in fields], dtype=torch.int32, device=cache_seqlens.device)
    setattr(md, _PLAN_ATTR, plan)
    return md
