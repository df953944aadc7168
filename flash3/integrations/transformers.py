"""flash3 as a Hugging Face transformers attention implementation.

    import flash3.integrations.transformers as flash3_hf
    name = flash3_hf.register()      # "fa3"; idempotent
    model = AutoModelForCausalLM.from_config(config, attn_implementation=name)
    # or, on an existing model: model.set_attn_implementation(name)

:func:`register` adds two functions to transformers' registries under one name:

* :func:`attention_forward` in ``AttentionInterface``: the attention of every
  layer, on ``flash3.attention`` (no padding) or ``flash3.attention_varlen``
  (padding: real tokens are packed, nothing of size s x s is built);
* :func:`mask_function` in ``AttentionMaskInterface``: what the model's
  ``create_causal_mask`` / ``create_sliding_window_causal_mask`` hand to the
  layers.  For the patterns flash3 computes exactly (causal, causal with a
  sliding window, bidirectional; each with a 2D padding mask) it returns the
  2D padding mask of the keys, and remembers the pattern; for any other
  pattern (packed sequences from ``position_ids``, image-token / block masks,
  chunked attention, custom ``or``/``and`` mask functions) it returns
  transformers' own exact 4D mask, which :func:`attention_forward` computes on
  a dense eager path with a one-time :class:`Flash3FallbackWarning`.

The name is not "flash3": transformers >= 5 treats every implementation name
containing "flash" as a flash-attn kernel to load and fails on it.

Semantics, as transformers' eager attention computes them:
``scaling`` is the softmax scale, ``softcap`` caps the scaled logits
(``tanh(s / cap) * cap``, Gemma-2), ``sliding_window=W`` keeps key ``j`` for
query ``i`` when ``i - W < j <= i`` (flash3 ``window_size=(W - 1, 0)``), and a
2D mask's queries are its last ``s_q`` columns (a KV cache's new tokens).
Attention dropout is not implemented (``dropout > 0`` raises), attention
weights are not returned (``output_attentions`` warns once, gives ``None``).
Attention sinks (``s_aux``, gpt-oss: one logit per query head joining each row's softmax
denominator) are passed to flash3 as ``sinks``.
"""

from __future__ import annotations

import dataclasses
import math
import warnings

import torch
import torch.nn.functional as F
from torch.utils.weak import WeakIdKeyDictionary

import transformers
from transformers import masking_utils as _mu

import flash3

__all__ = [
    "NAME",
    "MIN_TRANSFORMERS_VERSION",
    "Flash3FallbackWarning",
    "register",
    "attention_forward",
    "mask_function",
]

NAME = "fa3"
MIN_TRANSFORMERS_VERSION = "4.57.0"

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_MAX_HEADDIM = 256


def _version_tuple(v: str) -> tuple:
    out = []
    for part in v.split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out)


if _version_tuple(transformers.__version__) < _version_tuple(MIN_TRANSFORMERS_VERSION):
    raise ImportError(f"flash3.integrations.transformers needs transformers>="
                      f"{MIN_TRANSFORMERS_VERSION}, found {transformers.__version__}")


class Flash3FallbackWarning(UserWarning):
    """A call ran on the exact dense (eager) path instead of a flash3 kernel."""


_warned: set = set()


def _warn_once(reason: str) -> None:
    if reason not in _warned:
        _warned.add(reason)
        warnings.warn(f"flash3 ({NAME} attention): {reason}", Flash3FallbackWarning, stacklevel=4)


# ----------------------------------------------------------------------------- registration
def register(name: str = NAME) -> str:
    """Register flash3 with transformers under ``name`` (default ``"fa3"``); returns it.

    Idempotent. Afterwards ``attn_implementation=name`` works in ``from_pretrained``,
    ``from_config`` and ``model.set_attn_implementation``.
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty str, got {name!r}")
    if "flash" in name:
        raise ValueError(f"cannot register as {name!r}: transformers treats every "
                         "attn_implementation containing 'flash' as a flash-attn kernel to load; "
                         "use another name "
                         f"(the default is {NAME!r})")
    if name in ("eager", "sdpa", "flex_attention") or "|" in name or "/" in name:
        raise ValueError(f"cannot register as {name!r}: that name means something else to "
                         "transformers")
    transformers.AttentionInterface.register(name, attention_forward)
    _mu.AttentionMaskInterface.register(name, mask_function)
    return name


# ----------------------------------------------------------------------------- mask function
@dataclasses.dataclass
class _MaskInfo:
    """What mask_function knows about a 2D padding mask it returned."""
    causal: bool
    window: int | None     # transformers' sliding_window: keys j with i - window < j <= i
    all_valid: bool        # no padding at all
    version: int           # the tensor's _version when registered
    unpad: dict            # cached unpadding metadata, keyed by (s_q, causal, need_contiguous)


_MASKS = WeakIdKeyDictionary()


def _closure(fn) -> dict:
    code, cells = getattr(fn, "__code__", None), getattr(fn, "__closure__", None)
    if code is None or cells is None:
        return {}
    try:
        return {n: c.cell_contents for n, c in zip(code.co_freevars, cells)}
    except ValueError:  # an empty cell
        return {}


def _is_mu(fn, qualname: str) -> bool:
    return (getattr(fn, "__module__", None) == _mu.__name__
            and getattr(fn, "__qualname__", None) == qualname)


def _recognize(fn, use_vmap: bool):
    """(causal, window) for mask functions flash3 computes exactly; None otherwise.

    Recognized by identity and by the closures of masking_utils' own factories, so a
    mask function that is anything else (a user's, a packed-sequence one, ...) is
    never mistaken for one of these.
    """
    if use_vmap:
        return None
    if fn is _mu.causal_mask_function:
        return True, None
    if fn is getattr(_mu, "bidirectional_mask_function", None):
        return False, None
    if _is_mu(fn, "and_masks.<locals>.and_mask"):
        parts = _closure(fn).get("mask_functions")
        if isinstance(parts, tuple) and len(parts) == 2:
            overlays = [p for p in parts if p is not _mu.causal_mask_function]
            if len(overlays) == 1 and _is_mu(overlays[0],
                                             "sliding_window_overlay.<locals>.inner_mask"):
                w = _closure(overlays[0]).get("sliding_window")
                if isinstance(w, int) and not isinstance(w, bool) and w > 0 and \
                        _keeps_last(overlays[0], w):
                    return True, w
    return None


def _keeps_last(overlay, w: int) -> bool:
    """The overlay keeps the last w keys, the query's own included (kv > q - w): probed at the
    edges, so a change of convention in transformers cannot pass unnoticed."""
    q = torch.tensor(2 * w + 5)
    zero = torch.tensor(0)
    try:
        return (bool(overlay(zero, zero, q, q)) and bool(overlay(zero, zero, q, q - w + 1))
                and not bool(overlay(zero, zero, q, q - w)))
    except Exception:  # noqa: BLE001 - anything unexpected means "not recognized"
        return False


def _version(t: torch.Tensor) -> int:
    """The in-place version counter (-1 for inference tensors, which cannot change in place
    outside inference mode and have none)."""
    try:
        return t._version
    except RuntimeError:
        return -1


@torch.compiler.disable
def _registered(mask: torch.Tensor):
    """The _MaskInfo of a mask returned by mask_function (and not modified since), or None."""
    info = _MASKS.get(mask)
    return info if info is not None and info.version == _version(mask) else None


def _as_int(x) -> int:
    return int(x.item()) if isinstance(x, torch.Tensor) else int(x)


@torch.compiler.disable  # host logic (identity lookups, one sync): never traced
def mask_function(batch_size, q_length=None, kv_length=None, q_offset=0, kv_offset=0,
                  mask_function=_mu.causal_mask_function, attention_mask=None, use_vmap=False,
                  device=None, cache_position=None, **kwargs):
    """transformers ``AttentionMaskInterface`` function for flash3.

    Returns a bool ``(batch, L)`` padding mask of the keys (True = real token) whose
    last ``q_length`` columns are the queries (``L < kv_length`` only with a static
    cache: the keys past the queries are not written yet), or, for a pattern flash3
    cannot compute exactly, transformers' exact 4D bool mask (used on the dense
    fallback path).
    """
    if q_length is None:  # older signature: cache_position instead of q_length / q_offset
        q_length = cache_position.shape[0]
        q_offset = cache_position[0]
    if device is None:
        device = attention_mask.device if attention_mask is not None else "cpu"
    if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 2:
        if _registered(attention_mask) is not None:
            # Already prepared by this function (generate() with a static cache builds the
            # masks ahead and hands them back): use as is, as transformers does with 4D masks.
            return attention_mask
    pattern = _recognize(mask_function, use_vmap)
    if pattern is not None:
        causal, window = pattern
        length = _as_int(q_offset) - _as_int(kv_offset) + q_length if causal else kv_length
        if q_length <= length <= kv_length or (not causal and length == kv_length):
            # contiguous: generate() calls .contiguous() on the masks it prepares, and this
            # object must come back (see above)
            pad = _key_padding(attention_mask, batch_size, _as_int(kv_offset), length, device)
            pad = pad.contiguous()
            _MASKS[pad] = _MaskInfo(causal, window, bool(pad.all()), _version(pad), {})
            return pad
    # Not representable: transformers' exact 4D mask, never a shortcut to None.
    exact = dict(kwargs, batch_size=batch_size, kv_length=kv_length, kv_offset=kv_offset,
                 mask_function=mask_function, attention_mask=attention_mask, use_vmap=use_vmap,
                 device=device, allow_is_causal_skip=False, allow_is_bidirectional_skip=False)
    if cache_position is not None:
        exact["cache_position"] = cache_position
    else:
        exact.update(q_length=q_length, q_offset=q_offset)
    return _mu.sdpa_mask(**exact)


def _key_padding(attention_mask, batch_size, kv_offset, length, device):
    """Columns kv_offset .. kv_offset + length of the 2D mask, as bool; missing ones are padding."""
    if attention_mask is None:
        return torch.ones(batch_size, length, dtype=torch.bool, device=device)
    m = attention_mask.to(device=device, dtype=torch.bool)
    if m.shape[0] != batch_size:
        m = m.expand(batch_size, -1)
    end = kv_offset + length
    if m.shape[-1] < end:  # as transformers' prepare_padding_mask: pad with False
        m = F.pad(m, (0, end - m.shape[-1]))
    return m[:, kv_offset:end]


# ----------------------------------------------------------------------------- attention
def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                      sliding_window=None, softcap=None, is_causal=None, **kwargs):
    """transformers ``AttentionInterface`` function for flash3.

    query (b, h, s_q, d), key/value (b, h_k, s_k, d|d_v) (GQA when h_k < h);
    returns (out (b, s_q, h, d_v), None).  ``attention_mask``: the 2D padding mask
    from :func:`mask_function`, None (no padding), or a 4D mask (dense fallback).
    """
    if dropout:
        raise ValueError(f"flash3 ({NAME} attention) has no attention dropout, got "
                         f"dropout={dropout}; set config.attention_dropout = 0.0 (or call "
                         "model.eval())")
    sinks = kwargs.get("s_aux")
    if kwargs.get("output_attentions"):
        _warn_once("output_attentions=True is not supported; the attention weights are None")

    b, h, s_q, d = query.shape
    s_k = key.shape[2]
    if b == 0 or s_q == 0:
        return query.new_zeros(b, s_q, h, value.shape[-1]), None
    if scaling is None:
        scaling = 1.0 / math.sqrt(d)
    scaling = float(scaling)
    softcap = float(softcap) if softcap else 0.0
    if key.dtype != query.dtype or value.dtype != query.dtype:
        key, value = key.to(query.dtype), value.to(query.dtype)

    mask = attention_mask
    if mask is not None and mask.dim() not in (2, 4):
        raise ValueError(f"attention_mask must be 2D (padding) or 4D, got shape "
                         f"{tuple(mask.shape)}")
    if mask is not None and mask.dim() == 4:  # the mask is the whole pattern, as in eager
        _warn_once("a 4D attention mask (a custom mask, or a pattern other than causal / sliding "
                   "window / bidirectional with padding) runs on the dense eager path")
        return _dense_fallback(query, key, value, mask, scaling, softcap, sinks), None
    info = None
    if mask is not None and mask.dim() == 2:
        info = _registered(mask)
        if mask.dtype != torch.bool:
            mask = mask != 0
    if info is not None:  # the pattern the mask was built for (what eager would apply)
        causal, window = info.causal, info.window
    else:
        causal = bool(getattr(module, "is_causal", True) if is_causal is None else is_causal)
        window = sliding_window
    if window is not None:
        window = int(window)
        if window <= 0:
            raise ValueError(f"sliding_window must be positive, got {window}")
        if not causal:
            raise NotImplementedError(
                f"flash3 ({NAME} attention): a sliding window on non-causal attention without "
                "its mask is ambiguous; use attn_implementation='eager'")

    reason = None
    if query.dtype not in _FLOAT_DTYPES:
        reason = f"dtype {query.dtype} is not supported (fp16, bf16, fp32)"
    elif d > _MAX_HEADDIM or value.shape[-1] > _MAX_HEADDIM:
        reason = f"head dims above {_MAX_HEADDIM} are not supported (d={d}, d_v={value.shape[-1]})"
    length = s_k if mask is None else mask.shape[1]
    if mask is not None and (length > s_k or (causal and length < s_q)):
        raise ValueError(f"2D attention mask of length {length} does not fit {s_q} queries and "
                         f"{s_k} keys")

    q = query.transpose(1, 2)
    k = key.transpose(1, 2)[:, :length]    # keys past the mask (static cache) are not used
    v = value.transpose(1, 2)[:, :length]
    win = (window - 1, 0) if window is not None else (-1, -1)
    opts = dict(causal=causal, softmax_scale=scaling, window_size=win, softcap=softcap,
                sinks=sinks)

    if reason is None and (mask is None or (info is not None and info.all_valid)):
        return flash3.attention(q, k, v, **opts), None

    meta = None
    if reason is None:
        need_contiguous = window is not None and window < length
        meta = _unpad_metadata(mask, s_q, causal, need_contiguous, info)
        if meta is None:
            reason = ("a sliding window with padding between real tokens (not left/right padding) "
                      "is not supported")
    if reason is not None:
        _warn_once(reason + "; this runs on the dense eager path")
        dense = _pattern_mask(mask, b, s_q, s_k, causal, window, query.device)
        return _dense_fallback(query, key, value, dense, scaling, softcap, sinks), None

    idx_q, idx_k, cu_q, cu_k, max_q, max_k, total_q = meta
    d_v = v.shape[-1]
    if total_q == 0:
        return q.new_zeros(b, s_q, h, d_v), None
    qp = q.reshape(b * s_q, h, d)
    if idx_q is not None:
        qp = qp.index_select(0, idx_q)
    kp = k.reshape(b * length, k.shape[2], d).index_select(0, idx_k)
    vp = v.reshape(b * length, v.shape[2], d_v).index_select(0, idx_k)
    out = flash3.attention_varlen(qp, kp, vp, cu_q, cu_k, max_q, max_k, **opts)
    if idx_q is not None:
        out = out.new_zeros(b * s_q, h, d_v).index_copy(0, idx_q, out)
    return out.view(b, s_q, h, d_v), None


def _true_indices(flat: torch.Tensor, total: int) -> torch.Tensor:
    """Positions of the True entries of a 1D bool tensor, given their count (no host sync)."""
    n = flat.numel()
    slot = torch.cumsum(flat, 0) - 1
    slot = torch.where(flat, slot, torch.full_like(slot, total))  # padding -> a scratch slot
    idx = torch.empty(total + 1, dtype=torch.long, device=flat.device)
    idx.scatter_(0, slot, torch.arange(n, device=flat.device))
    return idx[:total]


@torch.compiler.disable  # one host sync; cached per mask
def _unpad_metadata(pad, s_q, causal, need_contiguous, info):
    """Indices and cu_seqlens packing the real tokens of a 2D padding mask; None when the
    real keys of a row are not contiguous and need_contiguous.

    Causal: the queries are the last s_q columns and only the real ones are computed
    (the rest of the output is 0). Order-preserving packing keeps causal masks exact
    (bottom-right alignment: the real queries are the last real keys); a window also
    needs the distances, hence contiguous real keys. Non-causal: every query row is
    computed (it may be cross-attention), against the real keys.
    One host sync; cached on the mask for the other layers.
    """
    key = (s_q, causal, need_contiguous)
    if info is not None and key in info.unpad:
        return info.unpad[key]
    b, length = pad.shape
    dev = pad.device
    lens_k = pad.sum(1, dtype=torch.int32)
    stats = [lens_k.max(), lens_k.sum()]
    qpad = None
    if causal:
        qpad = pad[:, length - s_q:]
        lens_q = qpad.sum(1, dtype=torch.int32)
        stats += [lens_q.max(), lens_q.sum()]
    if need_contiguous:
        pos = torch.arange(length, device=dev)
        first = torch.where(pad, pos, length).amin(1)
        last = torch.where(pad, pos, -1).amax(1)
        stats.append((((last - first + 1) == lens_k) | (lens_k == 0)).all())
    vals = torch.stack([s.to(torch.int64) for s in stats]).tolist()
    if need_contiguous and not vals[-1]:
        meta = None
    else:
        max_k, total_k = vals[0], vals[1]
        cu_k = F.pad(torch.cumsum(lens_k, 0, dtype=torch.int32), (1, 0))
        idx_k = _true_indices(pad.reshape(-1), total_k)
        if causal:
            max_q, total_q = vals[2], vals[3]
            cu_q = F.pad(torch.cumsum(lens_q, 0, dtype=torch.int32), (1, 0))
            idx_q = _true_indices(qpad.reshape(-1), total_q)
        else:
            max_q, total_q = s_q, b * s_q
            cu_q = torch.arange(0, total_q + 1, s_q, dtype=torch.int32, device=dev)
            idx_q = None
        meta = (idx_q, idx_k, cu_q, cu_k, max_q, max_k, total_q)
    if info is not None:
        info.unpad[key] = meta
    return meta


# ----------------------------------------------------------------------------- dense fallback
def _pattern_mask(pad, b, s_q, s_k, causal, window, device):
    """The (b, 1, s_q, s_k) bool mask eager applies: padding, causal, window; the queries are
    the last s_q of the mask's columns (of the keys when pad is None)."""
    length = s_k if pad is None else pad.shape[1]
    cols = torch.arange(length, device=device)[None, :]
    rows = torch.arange(length - s_q, length, device=device)[:, None]
    vis = torch.ones(s_q, length, dtype=torch.bool, device=device)
    if causal:
        vis = vis & (cols <= rows)
    if window is not None:
        vis = vis & (cols > rows - window)
    m = vis[None, None].expand(b, 1, s_q, length)
    if pad is not None:
        m = m & pad[:, None, None, :]
    if length < s_k:
        m = F.pad(m, (0, s_k - length))
    return m


def _dense_fallback(query, key, value, mask, scaling, softcap, sinks=None):
    """transformers' eager attention: (b, h, s_q, d) in, (b, s_q, h, d_v) out; ``sinks`` (h,)
    as gpt-oss's eager attention: a last softmax column, dropped after the softmax."""
    h, h_k = query.shape[1], key.shape[1]
    if h != h_k:
        key = key.repeat_interleave(h // h_k, dim=1)
        value = value.repeat_interleave(h // h_k, dim=1)
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    if mask is not None:
        mask = mask[..., : key.shape[2]]
        if mask.dtype == torch.bool:
            zero = torch.zeros((), dtype=scores.dtype, device=scores.device)
            mask = torch.where(mask, zero, torch.finfo(scores.dtype).min)
        scores = scores + mask
    if sinks is not None:
        col = sinks.to(scores.dtype).view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        scores = torch.cat([scores, col], dim=-1)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    if sinks is not None:
        probs = probs[..., :-1]
    return torch.matmul(probs, value).transpose(1, 2).contiguous()
