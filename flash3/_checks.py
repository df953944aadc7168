"""Argument validation for every entry point (bf16 and FP8 alike). Every message names the
offending argument.

Two kinds of checks:
* static ones (types, ranks, shapes, dtypes, devices, python numbers), run in
  the public functions; they are traceable by torch.compile;
* value checks that need the tensors' contents (cu_seqlens, page_table,
  cache_seqlens), run inside the operators before anything is written, so a
  compiled graph still validates and a rejected call leaves the caches alone.
  Reading a CUDA tensor is a host sync, so they run only in validation mode
  (flash3/validation.py: always for CPU tensors, on request for CUDA ones,
  never inside CUDA graph capture or torch.compile tracing).
"""

from __future__ import annotations

import math
import numbers
from typing import Optional

import torch

MAX_HEADDIM = 256
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
FP8_DTYPE = getattr(torch, "float8_e4m3fn", None)


def is_fp8(t: torch.Tensor) -> bool:
    return FP8_DTYPE is not None and t.dtype == FP8_DTYPE


def tensor(name, x, ndim=None, what=""):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if ndim is not None and x.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D {what}, got shape {tuple(x.shape)}")
    return x


def flag(name, x):
    if not isinstance(x, bool):
        raise TypeError(f"{name} must be a bool, got {type(x).__name__}")
    return x


def _same_device(ref_name, ref, name, x):
    if x.device != ref.device:
        raise ValueError(f"{name} is on {x.device} but {ref_name} is on {ref.device}")


def _dtypes(named):
    """All tensors share one dtype: fp16/bf16/fp32, or all float8_e4m3fn."""
    (n0, t0), rest = named[0], named[1:]
    if t0.dtype not in FLOAT_DTYPES and not is_fp8(t0):
        raise TypeError(f"{n0} has dtype {t0.dtype}; expected float16, bfloat16, float32 "
                        f"or float8_e4m3fn")
    for n, t in rest:
        if t.dtype != t0.dtype:
            raise TypeError(f"{n} has dtype {t.dtype} but {n0} has {t0.dtype}; they must match")


def heads_and_dims(q, k, v, qn="q", kn="k", vn="v", max_d_v=MAX_HEADDIM):
    """Head counts and head dims of (…, heads, headdim) tensors (d_v up to max_d_v: 512 for
    FA3's MLA decode, flash_attn_interface)."""
    h, d = q.shape[-2], q.shape[-1]
    h_k, d_k, d_v = k.shape[-2], k.shape[-1], v.shape[-1]
    if h == 0 or h_k == 0:
        raise ValueError(f"{qn} and {kn} need at least one head, got {h} and {h_k}")
    if v.shape[-2] != h_k:
        raise ValueError(f"{vn} has {v.shape[-2]} heads but {kn} has {h_k}")
    if h % h_k != 0:
        raise ValueError(f"number of heads in {qn} ({h}) must be divisible by the number "
                         f"of heads in {kn} ({h_k})")
    if not 1 <= d <= MAX_HEADDIM:
        raise ValueError(f"head dim of {qn} must be in 1..{MAX_HEADDIM}, got {d}")
    if d_k != d:
        raise ValueError(f"head dim of {kn} ({d_k}) must equal that of {qn} ({d})")
    if not 1 <= d_v <= max_d_v:
        raise ValueError(f"head dim of {vn} must be in 1..{max_d_v}, got {d_v}")


def options(q, causal, softmax_scale, window_size, softcap):
    """Check the keyword options; returns (scale, left, right, softcap), the window as given (the
    caller folds ``causal`` in with masking.normalize_window, the one place that does)."""
    flag("causal", causal)
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(q.shape[-1])
    elif not isinstance(softmax_scale, numbers.Real) or isinstance(softmax_scale, bool):
        raise TypeError(f"softmax_scale must be a float or None, got {type(softmax_scale).__name__}")
    elif not math.isfinite(softmax_scale):
        raise ValueError(f"softmax_scale must be finite, got {softmax_scale}")
    if (not isinstance(window_size, (tuple, list)) or len(window_size) != 2
            or not all(isinstance(w, numbers.Integral) and not isinstance(w, bool)
                       for w in window_size)):
        raise TypeError(f"window_size must be a pair of ints, got {window_size!r}")
    left, right = int(window_size[0]), int(window_size[1])
    if left < -1 or right < -1:
        raise ValueError(f"window_size entries must be >= -1 (-1 = unbounded), got {window_size!r}")
    if not isinstance(softcap, numbers.Real) or isinstance(softcap, bool):
        raise TypeError(f"softcap must be a float, got {type(softcap).__name__}")
    if not softcap >= 0 or not math.isfinite(softcap):
        raise ValueError(f"softcap must be >= 0 (0 disables it), got {softcap}")
    return float(softmax_scale), left, right, float(softcap)


def batched(q, k, v):
    """flash3.attention: q (b, s_q, h, d), k (b, s_k, h_k, d), v (b, s_k, h_k, d_v)."""
    what = "(batch, seqlen, heads, headdim)"
    for n, t in (("q", q), ("k", k), ("v", v)):
        tensor(n, t, 4, what)
    _dtypes([("q", q), ("k", k), ("v", v)])
    _same_device("q", q, "k", k)
    _same_device("q", q, "v", v)
    if k.shape[0] != q.shape[0] or v.shape[0] != q.shape[0]:
        raise ValueError(f"batch sizes differ: q {q.shape[0]}, k {k.shape[0]}, v {v.shape[0]}")
    if k.shape[1] != v.shape[1]:
        raise ValueError(f"k has seqlen {k.shape[1]} but v has {v.shape[1]}; they must match")
    heads_and_dims(q, k, v)


def _descale_tensor(q, name, d, needed):
    """An FP8 descale: present, a float32 tensor on q's device (its shape is the caller's)."""
    if d is None:
        raise ValueError(f"{name} is required {needed}")
    tensor(name, d)
    _same_device("q", q, name, d)
    if d.dtype != torch.float32:
        raise TypeError(f"{name} must be float32, got {d.dtype}")


def fp8_descales(q, k, v, q_descale, k_descale, v_descale, fp8_block_size, v_channel_descale=None,
                 varlen=None, fast_accum=False):
    """FP8 descales (float32, on q's device), with (B_r, B_c) = fp8_block_size:

    q: (b, h_k) or (b, h_q) per head, or (b, h_k|h_q, ceil(s_q / B_r)) per block of B_r rows
    (the kernel runs B_r = 64 or 128); k, v: (b, h_k) or (b, h_k, ceil(s_k / B_c));
    v_channel_descale: optional (b, h_k, d_v), one scale per v channel.
    ``varlen``: (b, max_seqlen_q, max_seqlen_k) for packed (total, heads, dim) tensors.
    ``fast_accum`` (the FP8 kernel's single accumulation): v per (b, h_k) only.
    """
    flag("fp8_fast_accum", fast_accum)
    fp8 = is_fp8(q)
    if fast_accum and not fp8:
        raise ValueError(f"fp8_fast_accum is only used with float8_e4m3fn inputs (q is {q.dtype})")
    named = (("q_descale", q_descale, q), ("k_descale", k_descale, k), ("v_descale", v_descale, v))
    if not fp8:
        for n, d, _ in named + (("v_channel_descale", v_channel_descale, v),):
            if d is not None:
                raise ValueError(f"{n} is only used with float8_e4m3fn inputs (q is {q.dtype})")
        return
    if (not isinstance(fp8_block_size, (tuple, list)) or len(fp8_block_size) != 2
            or not all(isinstance(x, numbers.Integral) and not isinstance(x, bool) and x > 0
                       for x in fp8_block_size)):
        raise ValueError(f"fp8_block_size must be a pair of positive ints, got {fp8_block_size!r}")
    b, s_q, s_k = varlen if varlen is not None else (q.shape[0], q.shape[1], k.shape[1])
    h_q, h_k = q.shape[-2], k.shape[-2]
    for (n, d, _), blk, s in zip(named, (fp8_block_size[0], fp8_block_size[1], fp8_block_size[1]),
                                 (s_q, s_k, s_k)):
        _descale_tensor(q, n, d, "for float8_e4m3fn inputs")
        nb = -(-s // blk)
        heads = (h_k, h_q) if n == "q_descale" else (h_k,)
        ok = [(b, hh) for hh in heads] + [(b, hh, nb) for hh in heads]
        ok = list(dict.fromkeys(ok))
        if tuple(d.shape) not in ok:
            per_head = " or ".join(str(s) for s in ok if len(s) == 2)
            per_block = " or ".join(str(s) for s in ok if len(s) == 3)
            raise ValueError(f"{n} must have shape {per_head} (per batch and head) or "
                             f"{per_block} (per block of {blk}), got {tuple(d.shape)}")
    if fast_accum and v_descale.dim() != 2:
        raise ValueError(f"v_descale must be one per (batch, kv head), shape {(b, h_k)}, with "
                         f"fp8_fast_accum (P@V accumulates over all keys before v's scale), got "
                         f"{tuple(v_descale.shape)}; per-channel scales go in v_channel_descale")
    if v_channel_descale is not None:
        _descale_tensor(q, "v_channel_descale", v_channel_descale, "")
        want = (b, h_k, v.shape[-1])
        if tuple(v_channel_descale.shape) != want:
            raise ValueError(f"v_channel_descale must have shape {want} (batch, kv head, v channel), "
                             f"got {tuple(v_channel_descale.shape)}")


def varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k):
    """Static checks for attention_varlen (values are checked in the op)."""
    what = "(total, heads, headdim)"
    for n, t in (("q", q), ("k", k), ("v", v)):
        tensor(n, t, 3, what)
    _dtypes([("q", q), ("k", k), ("v", v)])
    for n, t in (("k", k), ("v", v), ("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        tensor(n, t)
        _same_device("q", q, n, t)
    if k.shape[0] != v.shape[0]:
        raise ValueError(f"k has {k.shape[0]} tokens but v has {v.shape[0]}; they must match")
    heads_and_dims(q, k, v)
    for n, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if cu.dtype != torch.int32:
            raise TypeError(f"{n} must be int32, got {cu.dtype}")
        if cu.dim() != 1 or cu.shape[0] < 1:
            raise ValueError(f"{n} must be 1-D of length batch + 1, got shape {tuple(cu.shape)}")
    if cu_seqlens_q.shape[0] != cu_seqlens_k.shape[0]:
        raise ValueError(f"cu_seqlens_q has length {cu_seqlens_q.shape[0]} but cu_seqlens_k has "
                         f"{cu_seqlens_k.shape[0]}; both must be batch + 1")
    for n, m in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if not isinstance(m, numbers.Integral) or isinstance(m, bool):
            raise TypeError(f"{n} must be an int, got {type(m).__name__}")
        if m < 0:
            raise ValueError(f"{n} must be >= 0, got {m}")


def varlen_values(cu_seqlens_q, cu_seqlens_k, total_q, total_k, max_seqlen_q, max_seqlen_k):
    """Value checks on cu_seqlens (one host sync)."""
    for n, cu, total, mx, mn in (("cu_seqlens_q", cu_seqlens_q, total_q, max_seqlen_q, "max_seqlen_q"),
                                 ("cu_seqlens_k", cu_seqlens_k, total_k, max_seqlen_k, "max_seqlen_k")):
        c = cu.tolist()
        if c[0] != 0:
            raise ValueError(f"{n} must start at 0, got {c[0]}")
        lens = [b - a for a, b in zip(c, c[1:])]
        if any(x < 0 for x in lens):
            raise ValueError(f"{n} must be non-decreasing, got {c}")
        if c[-1] > total:
            raise ValueError(f"{n} ends at {c[-1]}, past the packed length {total}")
        if lens and max(lens) > mx:
            raise ValueError(f"{mn} ({mx}) is smaller than the longest sequence ({max(lens)})")


def kvcache(q, k_cache, v_cache, k, v, cache_seqlens, page_table, num_splits, max_d_v=MAX_HEADDIM):
    """Static checks for attention_with_kvcache. Returns cache_seqlens as a tensor.

    The caches share q's dtype, or are both float8_e4m3fn (an FP8 cache; q is then
    fp16/bf16/fp32 and the new k/v have q's dtype, or are both float8_e4m3fn, which
    :func:`kvcache_extras` accepts with descale_per_batch only; it checks the descales too).
    """
    what = "(batch, seqlen, heads, headdim)"
    tensor("q", q, 4, what)
    tensor("k_cache", k_cache, 4, "(batch, capacity, heads, headdim) or (num_pages, page_size, heads, headdim)")
    tensor("v_cache", v_cache, 4, "like k_cache")
    if (k is None) != (v is None):
        raise ValueError("k and v must be given together (k is %s, v is %s)"
                         % ("set" if k is not None else "None", "set" if v is not None else "None"))
    new = []
    if k is not None:
        tensor("k", k, 4, what)
        tensor("v", v, 4, what)
        new = [("k", k), ("v", v)]
    if is_fp8(q):
        raise TypeError("attention_with_kvcache does not take float8_e4m3fn queries "
                        "(an FP8 cache takes fp16/bf16/fp32 q)")
    if is_fp8(k_cache) or is_fp8(v_cache):
        if not (is_fp8(k_cache) and is_fp8(v_cache)):
            raise TypeError(f"k_cache ({k_cache.dtype}) and v_cache ({v_cache.dtype}) must both "
                            f"be float8_e4m3fn for an FP8 cache")
        if new and is_fp8(k):  # e4m3 new keys, copied unchanged (kvcache_extras)
            _dtypes(new)
        else:
            _dtypes([("q", q)] + new)
    else:
        _dtypes([("q", q), ("k_cache", k_cache), ("v_cache", v_cache)] + new)
    for n, t in [("k_cache", k_cache), ("v_cache", v_cache)] + new:
        _same_device("q", q, n, t)
    heads_and_dims(q, k_cache, v_cache, "q", "k_cache", "v_cache", max_d_v)
    if k_cache.shape[:2] != v_cache.shape[:2]:
        raise ValueError(f"v_cache shape {tuple(v_cache.shape)} does not match k_cache "
                         f"{tuple(k_cache.shape)} in its first two dims")
    b = q.shape[0]
    if page_table is None:
        if k_cache.shape[0] != b:
            raise ValueError(f"k_cache has batch {k_cache.shape[0]} but q has {b}")
    else:
        tensor("page_table", page_table, 2, "(batch, max_pages)")
        _same_device("q", q, "page_table", page_table)
        if page_table.dtype != torch.int32:
            raise TypeError(f"page_table must be int32, got {page_table.dtype}")
        if page_table.shape[0] != b:
            raise ValueError(f"page_table has {page_table.shape[0]} rows but q has batch {b}")
    if k is not None:
        h_k, d, d_v = k_cache.shape[2], k_cache.shape[3], v_cache.shape[3]
        if k.shape[0] != b or tuple(k.shape[2:]) != (h_k, d):
            raise ValueError(f"k must have shape ({b}, s_new, {h_k}, {d}), got {tuple(k.shape)}")
        if tuple(v.shape) != (b, k.shape[1], h_k, d_v):
            raise ValueError(f"v must have shape ({b}, {k.shape[1]}, {h_k}, {d_v}), got {tuple(v.shape)}")
    if isinstance(cache_seqlens, numbers.Integral) and not isinstance(cache_seqlens, bool):
        if cache_seqlens < 0:
            raise ValueError(f"cache_seqlens must be >= 0, got {cache_seqlens}")
        cache_seqlens = torch.full((b,), int(cache_seqlens), dtype=torch.int32, device=q.device)
    tensor("cache_seqlens", cache_seqlens)
    _same_device("q", q, "cache_seqlens", cache_seqlens)
    if cache_seqlens.dtype != torch.int32:
        raise TypeError(f"cache_seqlens must be int32, got {cache_seqlens.dtype}")
    if tuple(cache_seqlens.shape) != (b,):
        raise ValueError(f"cache_seqlens must have shape ({b},), got {tuple(cache_seqlens.shape)}")
    if (not isinstance(num_splits, numbers.Integral) or isinstance(num_splits, bool)
            or num_splits < 0):
        raise ValueError(f"num_splits must be an int >= 0, got {num_splits!r}")
    return cache_seqlens


def rotary_tables(q, k, rotary_cos, rotary_sin, rotary_seqlens, b):
    """Static checks of the rotary arguments of attention_with_kvcache (b: the entry count)."""
    if rotary_seqlens is not None:
        if rotary_cos is None:
            raise ValueError("rotary_seqlens needs rotary_cos/rotary_sin (it places the rotary "
                             "embedding)")
        tensor("rotary_seqlens", rotary_seqlens, 1, "(batch,)")
        _same_device("q", q, "rotary_seqlens", rotary_seqlens)
        if rotary_seqlens.dtype != torch.int32 or rotary_seqlens.shape[0] != b:
            raise ValueError(f"rotary_seqlens must be int32 of shape ({b},), got "
                             f"{rotary_seqlens.dtype} {tuple(rotary_seqlens.shape)}")
    if (rotary_cos is None) != (rotary_sin is None):
        raise ValueError("rotary_cos and rotary_sin must be given together")
    if rotary_cos is not None:
        if k is None:
            raise ValueError("rotary_cos/rotary_sin need the new keys k and v (the rotary "
                             "embedding is applied to q and the appended k)")
        d = q.shape[-1]
        for n, t in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)):
            tensor(n, t, 2, "(seqlen_ro, rotary_dim / 2)")
            _same_device("q", q, n, t)
            if t.dtype not in FLOAT_DTYPES:
                raise TypeError(f"{n} must be float16, bfloat16 or float32, got {t.dtype}")
        if rotary_sin.shape != rotary_cos.shape:
            raise ValueError(f"rotary_sin shape {tuple(rotary_sin.shape)} does not match "
                             f"rotary_cos {tuple(rotary_cos.shape)}")
        seqlen_ro, half = rotary_cos.shape
        if seqlen_ro < 1:
            raise ValueError("rotary_cos needs at least one position (seqlen_ro >= 1)")
        if not 1 <= 2 * half <= d:
            raise ValueError(f"rotary_dim (2 * rotary_cos.shape[1] = {2 * half}) must be in "
                             f"2..{d} (the head dim of q)")


def kvcache_extras(q, k_cache, k, page_table, rotary_cos, rotary_sin, rotary_interleaved,
                   k_descale, v_descale, rotary_seqlens=None, cache_leftpad=None,
                   descale_per_batch=False, batch=None):
    """Static checks of the rotary, FP8-cache and left-padding arguments of
    attention_with_kvcache (``batch``: the entry count, default q.shape[0]; packed q's is
    cu_seqlens_q's)."""
    b = q.shape[0] if batch is None else batch
    flag("rotary_interleaved", rotary_interleaved)
    flag("descale_per_batch", descale_per_batch)
    if descale_per_batch:
        if not is_fp8(k_cache):
            raise ValueError(f"descale_per_batch goes with a float8_e4m3fn cache (k_cache is "
                             f"{k_cache.dtype})")
        if k is not None:  # appended as they are: a slab may hold keys of several entries
            if not is_fp8(k):
                raise TypeError(f"attention_with_kvcache: with descale_per_batch the new keys k/v "
                                f"must be float8_e4m3fn (FA3's: copied into the cache unchanged, "
                                f"read with their batch entry's descales), got {k.dtype}")
            if rotary_cos is not None:
                raise NotImplementedError("attention_with_kvcache: rotary (rotary_cos/rotary_sin) "
                                          "with descale_per_batch new keys is not implemented")
    elif k is not None and is_fp8(k):
        raise TypeError("attention_with_kvcache: float8_e4m3fn new keys k/v go with "
                        "descale_per_batch=True (FA3's descales per batch entry: the bytes are "
                        "copied unchanged); with descales per slab pass k/v in q's dtype")
    if cache_leftpad is not None:
        tensor("cache_leftpad", cache_leftpad, 1, "(batch,)")
        _same_device("q", q, "cache_leftpad", cache_leftpad)
        if cache_leftpad.dtype != torch.int32 or cache_leftpad.shape[0] != b:
            raise ValueError(f"cache_leftpad must be int32 of shape ({b},), got "
                             f"{cache_leftpad.dtype} {tuple(cache_leftpad.shape)}")
    rotary_tables(q, k, rotary_cos, rotary_sin, rotary_seqlens, b)
    fp8 = is_fp8(k_cache)
    h_k = k_cache.shape[2]
    slabs = k_cache.shape[0]
    for n, t in (("k_descale", k_descale), ("v_descale", v_descale)):
        if not fp8:
            if t is not None:
                raise ValueError(f"{n} is only used with a float8_e4m3fn cache "
                                 f"(k_cache is {k_cache.dtype})")
            continue
        _descale_tensor(q, n, t, "with a float8_e4m3fn cache")
        if descale_per_batch:
            if tuple(t.shape) != (b, h_k):
                raise ValueError(f"{n} must have shape (batch, kv_heads) = {(b, h_k)} "
                                 f"with descale_per_batch, got {tuple(t.shape)}")
            continue
        what = "(batch, kv_heads)" if page_table is None else "(num_pages, kv_heads)"
        if tuple(t.shape) != (slabs, h_k):
            raise ValueError(f"{n} must have shape {what} = {(slabs, h_k)} for this "
                             f"{'paged' if page_table is not None else 'contiguous'} cache, "
                             f"got {tuple(t.shape)}")


def num_splits(n):
    """attention_with_kvcache's num_splits: an int >= 0 (0 = automatic)."""
    if not isinstance(n, numbers.Integral) or isinstance(n, bool) or n < 0:
        raise ValueError(f"num_splits must be an int >= 0, got {n!r}")


def new_keys(q, k_cache, v_cache, k, v, cu_seqlens_k_new, b):
    """Static checks of attention_with_kvcache's new keys: batched (b, s_new, h_k, d|d_v), or
    packed (total_new, h_k, d|d_v) by ``cu_seqlens_k_new`` int32 (b + 1,) (FA3's); q's dtype,
    or both float8_e4m3fn (an FP8 cache's, which :func:`kvcache_extras` then checks)."""
    packed = cu_seqlens_k_new is not None
    what = "(total_new, heads, headdim)" if packed else "(batch, seqlen, heads, headdim)"
    for n, t in (("k", k), ("v", v)):
        tensor(n, t, 3 if packed else 4, what)
        _same_device("q", q, n, t)
    _dtypes(([] if is_fp8(k) and is_fp8(k_cache) else [("q", q)]) + [("k", k), ("v", v)])
    h_k, d, d_v = k_cache.shape[2], k_cache.shape[3], v_cache.shape[3]
    if packed:
        _int32_vector("cu_seqlens_k_new", cu_seqlens_k_new, q, b + 1, f"({b + 1},) (batch + 1)")
        if tuple(k.shape[1:]) != (h_k, d):
            raise ValueError(f"k must have shape (total_new, {h_k}, {d}), got {tuple(k.shape)}")
        if tuple(v.shape) != (k.shape[0], h_k, d_v):
            raise ValueError(f"v must have shape ({k.shape[0]}, {h_k}, {d_v}), got "
                             f"{tuple(v.shape)}")
        return
    if k.shape[0] != b or tuple(k.shape[2:]) != (h_k, d):
        raise ValueError(f"k must have shape ({b}, s_new, {h_k}, {d}), got {tuple(k.shape)}")
    if tuple(v.shape) != (b, k.shape[1], h_k, d_v):
        raise ValueError(f"v must have shape ({b}, {k.shape[1]}, {h_k}, {d_v}), got "
                         f"{tuple(v.shape)}")


def kvcache_values(k_cache, cache_seqlens, s_new, page_table, s_q=0, rotary_cos=None,
                   q_per_token=True, k_descale=None, v_descale=None, lens_name="cache_seqlens",
                   rotary_seqlens=None, cache_leftpad=None):
    """Value checks needing the contents, run before anything is written (validation mode
    only: they read cache_seqlens/page_table/descales/rotary_seqlens/cache_leftpad on the
    host). ``s_new`` / ``s_q``: new keys / queries per row, an int or a list (FA3's packed
    layouts)."""
    lens = cache_seqlens.tolist()
    news = s_new if isinstance(s_new, list) else [s_new] * len(lens)
    qs = s_q if isinstance(s_q, list) else [s_q] * len(lens)
    for i, n in enumerate(lens):
        if n < 0:
            raise ValueError(f"{lens_name}[{i}] is negative ({n})")
    if cache_leftpad is not None:
        for i, (lp, n) in enumerate(zip(cache_leftpad.tolist(), lens)):
            if not 0 <= lp <= n + news[i]:
                raise ValueError(f"cache_leftpad[{i}] = {lp} is outside [0, {lens_name}[{i}] + "
                                 f"new keys] = [0, {n + news[i]}]")
    if rotary_cos is not None:
        seqlen_ro = rotary_cos.shape[0]
        ro_name = lens_name if rotary_seqlens is None else "rotary_seqlens"
        ro = lens if rotary_seqlens is None else rotary_seqlens.tolist()
        for i, n in enumerate(ro):
            span = max(news[i], qs[i] if q_per_token else 1)
            if n < 0:
                raise ValueError(f"{ro_name}[{i}] is negative ({n})")
            if n + span > seqlen_ro:
                raise ValueError(f"rotary_cos/rotary_sin have {seqlen_ro} positions but row {i} "
                                 f"needs positions up to {n + span - 1} ({ro_name}[{i}] = {n})")
    for n, t in (("k_descale", k_descale), ("v_descale", v_descale)):
        if t is not None and not bool(((t > 0) & torch.isfinite(t)).all()):
            raise ValueError(f"{n} must be finite and > 0 everywhere")
    if page_table is None:
        cap = k_cache.shape[1]
        for i, n in enumerate(lens):
            if n + news[i] > cap:
                raise ValueError(f"cache overflow: {lens_name}[{i}] ({n}) + {news[i]} new keys "
                                 f"> k_cache capacity {cap}")
        return
    num_pages, page_size = k_cache.shape[0], k_cache.shape[1]
    max_pages = page_table.shape[1]
    for i, n in enumerate(lens):
        if n + news[i] > max_pages * page_size:
            raise ValueError(f"page_table has too few pages: row {i} needs {n + news[i]} keys "
                             f"but holds {max_pages} pages of {page_size}")
    # Only the pages a row actually uses must be valid.
    needed = torch.tensor([-(-(n + m) // page_size) for n, m in zip(lens, news)],
                          device=page_table.device)
    used = torch.arange(max_pages, device=page_table.device)[None, :] < needed[:, None]
    bad = used & ((page_table < 0) | (page_table >= num_pages))
    if bool(bad.any()):
        i, j = (int(x) for x in bad.nonzero()[0].tolist())
        raise ValueError(f"page_table[{i}, {j}] = {int(page_table[i, j])} is out of range "
                         f"[0, {num_pages})")


# ----------------------------------------------------------------- other entry points
# flash3.sdpa and flash3.distributed, whose arguments follow torch's conventions.

def sdpa_tensor(name, x):
    """flash3.sdpa: query/key/value (..., heads, seqlen, headdim)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() < 3:
        raise ValueError(f"{name} must be (..., heads, seqlen, headdim) with at least 3 dims, "
                         f"got shape {tuple(x.shape)}")


def attention_chunk(chunk, **excluded):
    """FA3's attention_chunk: an int >= 0 (0 = off), returned as int. `excluded`: name -> whether
    that argument is given, for the paths with no chunked attention (named in the error)."""
    chunk = int_at_least("attention_chunk", chunk, 0)
    if chunk:
        for name, given in excluded.items():
            if given:
                raise NotImplementedError(f"attention_chunk is not supported with {name} "
                                          "(flash3.flash_attn_interface runs such calls on FA3's "
                                          "reference spec)")
    return chunk


def int_at_least(name, x, lo):
    if not isinstance(x, numbers.Integral) or isinstance(x, bool):
        raise TypeError(f"{name} must be an int, got {type(x).__name__}")
    if x < lo:
        raise ValueError(f"{name} must be >= {lo}, got {x}")
    return int(x)


# ----------------------------------------------------------------- FP8 path
# flash3.fp8, flash3.fp8_quant, the emulation (flash3.reference.fp8) and the quantize kernel
# (flash3._quantize): their own rules and messages, which predate options() above.

def is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def typed_tensor(x, name: str, dtypes, ndim: Optional[int] = 4) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in dtypes:
        names = "/".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name} must have dtype {names}, got {x.dtype}")
    if ndim is not None and x.dim() != ndim:
        what = "(batch, seqlen, heads, headdim)" if ndim == 4 else "(total, heads, headdim)"
        raise ValueError(f"{name} must be {ndim}-D {what}, got shape {tuple(x.shape)}")


def quant_block(block_size, name: str) -> Optional[int]:
    """int > 0, or None / -1 meaning one block over the whole sequence."""
    if block_size is None:
        return None
    if not is_int(block_size):
        raise TypeError(f"{name} must be a positive int, -1 or None, got {block_size!r}")
    if block_size == -1:
        return None
    if block_size <= 0:
        raise ValueError(f"{name} must be a positive int, -1 or None, got {block_size}")
    return block_size


def quant_block_pair(block_size, name: str = "block_size") -> tuple[Optional[int], Optional[int]]:
    if block_size is None or is_int(block_size):
        b = quant_block(block_size, name)
        return b, b
    if not isinstance(block_size, (tuple, list)) or len(block_size) != 2:
        raise TypeError(f"{name} must be a (B_r, B_c) pair, an int, -1 or None, got {block_size!r}")
    return quant_block(block_size[0], f"{name}[0]"), quant_block(block_size[1], f"{name}[1]")


def window_pair(window_size):
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2:
        raise TypeError(f"window_size must be a (left, right) pair, got {window_size!r}")
    return window_size[0], window_size[1]


def window(left, right, causal):
    """Check a window and ``causal``; returns (left, right) as ints, any negative = unbounded (the
    caller folds them with masking.normalize_window)."""
    flag("causal", causal)
    for nm, w in (("window_left", left), ("window_right", right)):
        if not is_int(w):
            raise TypeError(f"{nm} must be an int (negative = unbounded), got {w!r}")
    return int(left), int(right)


def scale_softcap(softmax_scale, softcap, d):
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(d)
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)):
        raise TypeError(f"softmax_scale must be a float or None, got {softmax_scale!r}")
    if not math.isfinite(softmax_scale):
        raise ValueError(f"softmax_scale must be finite, got {softmax_scale}")
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)):
        raise TypeError(f"softcap must be a float, got {softcap!r}")
    if not (softcap >= 0.0 and math.isfinite(softcap)):
        raise ValueError(f"softcap must be a finite value >= 0, got {softcap}")
    return float(softmax_scale), float(softcap)


def qkv(q, k, v, dtypes):
    typed_tensor(q, "q", dtypes)
    typed_tensor(k, "k", dtypes)
    typed_tensor(v, "v", dtypes)
    b, s_q, h, d = q.shape
    if k.shape[0] != b or v.shape[0] != b:
        raise ValueError(f"q, k, v must have the same batch size, got {q.shape[0]}, {k.shape[0]}, {v.shape[0]}")
    if k.shape[1] != v.shape[1]:
        raise ValueError(f"k and v must have the same seqlen, got {k.shape[1]} and {v.shape[1]}")
    if k.shape[2] != v.shape[2]:
        raise ValueError(f"k and v must have the same number of heads, got {k.shape[2]} and {v.shape[2]}")
    if k.shape[3] != d:
        raise ValueError(f"q and k must have the same head dim, got {d} and {k.shape[3]}")
    hk = k.shape[2]
    if hk == 0 or h % hk != 0:
        raise ValueError(f"number of q heads ({h}) must be a multiple of the number of k/v heads ({hk})")
    if d == 0:
        raise ValueError("head dim must be > 0")
    if not (q.device == k.device == v.device):
        raise ValueError("q, k, v must be on the same device")


def float_tensor(t, name, also):
    """A descale-like tensor: floating point, not fp8 (`also`: the other dtypes the message names)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None, got {type(t).__name__}")
    if not t.is_floating_point() or t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        raise TypeError(f"{name} must be a float32 (or {also}) tensor, got {t.dtype}")


def per_head_vector(t, name, b, h, d, device):
    """The quantize kernel's optional (b, h, d) mean / channel_descale, as contiguous fp32."""
    if t is None:
        return None
    float_tensor(t, name, "fp16/bf16")
    if tuple(t.shape) != (b, h, d):
        raise ValueError(f"{name} must have shape {(b, h, d)} (batch, head, channel), got {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} must be on {device}, got {t.device}")
    t = t.to(torch.float32)
    if t.stride(-1) != 1:
        t = t.contiguous()
    return t


def sinks(q, sinks, heads_dim=-2):
    """Attention sinks: None, or a float tensor (h,), one logit per query head, on q's device."""
    if sinks is None:
        return None
    float_tensor(sinks, "sinks", "fp16/bf16/fp64")
    h = q.shape[heads_dim]
    if tuple(sinks.shape) != (h,):
        raise ValueError(f"sinks must have shape ({h},) (one logit per query head), "
                         f"got {tuple(sinks.shape)}")
    _same_device("q", q, "sinks", sinks)
    if is_fp8(q):
        raise NotImplementedError("sinks are not implemented for float8_e4m3fn q/k/v "
                                  "(the FP8 attention); pass sinks=None")
    return sinks


def alibi_slopes(q, slopes, batch, heads_dim=-2):
    """ALiBi: None, or a float32 tensor (h,) or (batch, h) of slopes, on q's device.

    Each row adds -slope * |i + s_k - s_q - j| to its scaled (and softcapped) scores
    (FlashAttention-2's convention); no gradient flows to the slopes."""
    if slopes is None:
        return None
    if not isinstance(slopes, torch.Tensor):
        raise TypeError(f"alibi_slopes must be a torch.Tensor or None, got {type(slopes).__name__}")
    if slopes.dtype != torch.float32:
        raise TypeError(f"alibi_slopes must be float32, got {slopes.dtype}")
    h = q.shape[heads_dim]
    if tuple(slopes.shape) not in ((h,), (batch, h)):
        raise ValueError(f"alibi_slopes must have shape ({h},) or ({batch}, {h}) (per query head, "
                         f"or per batch row and query head), got {tuple(slopes.shape)}")
    _same_device("q", q, "alibi_slopes", slopes)
    if is_fp8(q):
        raise NotImplementedError("alibi_slopes is not implemented for float8_e4m3fn q/k/v "
                                  "(the FP8 attention); pass alibi_slopes=None")
    return slopes


def _int32_vector(name, t, q, n=None, what="(batch,)"):
    tensor(name, t)
    _same_device("q", q, name, t)
    if t.dtype != torch.int32:
        raise TypeError(f"{name} must be int32, got {t.dtype}")
    if t.dim() != 1 or (n is not None and t.shape[0] != n):
        raise ValueError(f"{name} must have shape {what}, got {tuple(t.shape)}")


def seqused_q(q, t, b, name="seqused_q"):
    """FA3's seqused_q (or seqused_k on packed keys): int32 (b,) on q's device (its values are
    clamped, never rejected)."""
    _int32_vector(name, t, q, b, f"({b},)")


def varlen_cache(q, k_cache, v_cache, cu_seqlens_q, max_seqlen_q, seqused_k, page_table,
                 cu_seqlens_k, k_descale, v_descale, lens_name="seqused_k", kn="k", vn="v",
                 max_d_v=MAX_HEADDIM, descale_per_batch=False):
    """Static checks of packed queries against a cache: paged (page_table), contiguous
    (b, capacity, ·) (neither page_table nor cu_seqlens_k) or packed (cu_seqlens_k).
    ``descale_per_batch``: an FP8 cache's descales are (b, h_k), b = cu_seqlens_q's sequences."""
    tensor("q", q, 3, "(total_q, heads, headdim)")
    if is_fp8(q):
        raise TypeError(f"q must be fp16/bf16/fp32 with {lens_name}/page_table (an FP8 cache "
                        f"takes 16-bit or fp32 q), got float8_e4m3fn")
    _int32_vector("cu_seqlens_q", cu_seqlens_q, q, what="(batch + 1,)")
    if cu_seqlens_q.shape[0] < 1:
        raise ValueError("cu_seqlens_q must have length batch + 1 >= 1")
    b = cu_seqlens_q.shape[0] - 1
    if not isinstance(max_seqlen_q, numbers.Integral) or isinstance(max_seqlen_q, bool):
        raise TypeError(f"max_seqlen_q must be an int, got {type(max_seqlen_q).__name__}")
    if max_seqlen_q < 0:
        raise ValueError(f"max_seqlen_q must be >= 0, got {max_seqlen_q}")
    packed = cu_seqlens_k is not None
    if page_table is not None and packed:
        raise ValueError("cu_seqlens_k must be None with page_table: a paged cache gives each "
                         f"sequence's key count in {lens_name}")
    if not packed and seqused_k is None:
        raise ValueError(f"{lens_name} (int32 (batch,), each sequence's key count) is required "
                         "with a paged or contiguous cache")
    ndim = 3 if packed else 4
    what = ("(total_k, heads, headdim)" if packed else
            "(num_pages, page_size, heads, headdim)" if page_table is not None else
            "(batch, capacity, heads, headdim)")
    tensor(kn, k_cache, ndim, what)
    tensor(vn, v_cache, ndim, what)
    for n, t in ((kn, k_cache), (vn, v_cache)):
        _same_device("q", q, n, t)
    if is_fp8(k_cache) or is_fp8(v_cache):
        if packed or not (is_fp8(k_cache) and is_fp8(v_cache)):
            raise TypeError(f"an FP8 cache needs both {kn} and {vn} float8_e4m3fn and a paged or "
                            f"contiguous layout (got {k_cache.dtype}, {v_cache.dtype})")
        _dtypes([("q", q)])
    else:
        _dtypes([("q", q), (kn, k_cache), (vn, v_cache)])
    heads_and_dims(q, k_cache, v_cache, "q", kn, vn, max_d_v)
    if k_cache.shape[:-1] != v_cache.shape[:-1]:
        raise ValueError(f"{vn} shape {tuple(v_cache.shape)} does not match {kn} "
                         f"{tuple(k_cache.shape)} but in its last dim")
    if packed:
        _int32_vector("cu_seqlens_k", cu_seqlens_k, q, b + 1, "(batch + 1,) like cu_seqlens_q")
    if seqused_k is not None:
        _int32_vector(lens_name, seqused_k, q, b, f"({b},)")
    if page_table is not None:
        tensor("page_table", page_table, 2, "(batch, max_pages)")
        _same_device("q", q, "page_table", page_table)
        if page_table.dtype != torch.int32:
            raise TypeError(f"page_table must be int32, got {page_table.dtype}")
        if page_table.shape[0] != b:
            raise ValueError(f"page_table has {page_table.shape[0]} rows but cu_seqlens_q holds "
                             f"{b} sequences")
    elif not packed and k_cache.shape[0] != b:
        raise ValueError(f"{kn} has batch {k_cache.shape[0]} but cu_seqlens_q holds {b} sequences")
    kvcache_extras(q, k_cache, None, page_table, None, None, False, k_descale, v_descale,
                   descale_per_batch=descale_per_batch, batch=b)


def packed_lengths(name, cu, total):
    """Entry lengths of FA3 offsets ``cu`` (b + 1,) into ``total`` packed rows (validation mode:
    a host read): they start at 0, never decrease, and end within the rows."""
    c = cu.tolist()
    lens = [b - a for a, b in zip(c, c[1:])]
    if c[0] != 0 or any(x < 0 for x in lens):
        raise ValueError(f"{name} must start at 0 and be non-decreasing, got {c}")
    if c[-1] > total:
        raise ValueError(f"{name} ends at {c[-1]}, past the packed length {total}")
    return lens


def appended_lengths(q, k, varlen, cu_seqlens_q, max_seqlen_q, cu_seqlens_k_new):
    """(new keys, queries) per batch entry of a call that appends new keys (validation mode: host
    reads): ints when batched, lists when packed; packed queries longer than max_seqlen_q refused."""
    news = (0 if k is None else k.shape[1] if cu_seqlens_k_new is None else
            packed_lengths("cu_seqlens_k_new", cu_seqlens_k_new, k.shape[0]))
    if not varlen:
        return news, q.shape[1]
    qs = packed_lengths("cu_seqlens_q", cu_seqlens_q, q.shape[0])
    if qs and max(qs) > max_seqlen_q:
        raise ValueError(f"max_seqlen_q ({max_seqlen_q}) is smaller than the longest "
                         f"sequence ({max(qs)})")
    return news, qs


def varlen_cache_values(q, k_cache, cu_seqlens_q, seqused_k, page_table, cu_seqlens_k,
                        max_seqlen_q, k_descale, v_descale, lens_name="seqused_k",
                        cache_leftpad=None):
    """Value checks of :func:`varlen_cache` (validation mode: host reads)."""
    lens = packed_lengths("cu_seqlens_q", cu_seqlens_q, q.shape[0])
    if lens and max(lens) > max_seqlen_q:
        raise ValueError(f"max_seqlen_q ({max_seqlen_q}) is smaller than the longest sequence "
                         f"({max(lens)})")
    if cu_seqlens_k is None:
        kvcache_values(k_cache, seqused_k, 0, page_table, k_descale=k_descale,
                       v_descale=v_descale, lens_name=lens_name, cache_leftpad=cache_leftpad)
        return
    ck = cu_seqlens_k.tolist()
    have = [b - a for a, b in zip(ck, ck[1:])]
    if ck[0] != 0 or any(x < 0 for x in have) or ck[-1] > k_cache.shape[0]:
        raise ValueError(f"cu_seqlens_k must start at 0, be non-decreasing and end within the "
                         f"{k_cache.shape[0]} packed keys, got {ck}")
    if seqused_k is not None:
        for i, (n, m) in enumerate(zip(seqused_k.tolist(), have)):
            if not 0 <= n <= m:
                raise ValueError(f"{lens_name}[{i}] = {n} is outside [0, {m}] (sequence {i}'s "
                                 f"keys in cu_seqlens_k)")
