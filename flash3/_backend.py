"""Dispatch to the Hopper kernel of the C++ extension (flash3._C), when usable.

The extension registers ``flash3::fwd_sm90``, ``flash3::kernel_info`` and ``flash3::pick_kernel``
(and, in builds that have it, the backward ``flash3::bwd_sm90``); this module only asks whether a
call can run there (the extension's own rule, kernel_pick) and, if so, runs it.
"""

from __future__ import annotations

import functools
import json
import warnings

import torch

from .fp8_quant import kernel_tile_n, pack_v_fp8, pack_v_fp8_varlen

_DTYPE_NAMES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@functools.lru_cache(maxsize=None)
def has_append_kernel() -> bool:
    """True when flash3._C has the fused KV-cache append (flash3::append_kv_sm90)."""
    if not has_extension():
        return False
    try:
        torch.ops.flash3.append_kv_sm90
    except (AttributeError, RuntimeError):
        return False
    return True


@functools.lru_cache(maxsize=None)
def has_bwd_kernel() -> bool:
    """True when flash3._C has the backward kernel (flash3::bwd_sm90)."""
    if not has_extension():
        return False
    try:
        torch.ops.flash3.bwd_sm90
    except (AttributeError, RuntimeError):
        return False
    return True


@functools.lru_cache(maxsize=None)
def has_extension() -> bool:
    """True when flash3._C is built and registered its forward kernel."""
    try:
        from . import _C  # noqa: F401
    except ImportError:
        return False
    try:
        torch.ops.flash3.fwd_sm90
        torch.ops.flash3.kernel_info
    except (AttributeError, RuntimeError):
        return False
    return True


def has_sink_kernels() -> bool:
    """True when flash3._C's forward and decode ops take attention sinks (their ``sinks``
    argument: fwd_sm90 and fwd_kvcache_sm90 built with the sink epilogue and combine)."""
    return op_takes("fwd_sm90", "sinks") and op_takes("fwd_kvcache_sm90", "sinks")


def kernel_sinks_reason(q) -> str | None:
    """Why no kernel can add attention sinks to this call (checked after the kernel's own reason);
    None if the forward and decode kernels can."""
    if q.is_cuda and not has_sink_kernels():
        return "flash3._C's kernels take no attention sinks (an older build)"
    return None


def kernel_sinks(sinks):
    """The kernels' form of ``sinks``: None, or contiguous float32 (h,)."""
    return None if sinks is None else sinks.detach().to(torch.float32).contiguous()


@functools.lru_cache(maxsize=None)
def op_takes(op_name: str, argument: str) -> bool:
    """True when flash3._C's op `op_name` has `argument` in its schema (builds older than an
    argument serve calls without it)."""
    if not has_extension():
        return False
    try:
        op = getattr(torch.ops.flash3, op_name).default
        return any(a.name == argument for a in op._schema.arguments)
    except (AttributeError, RuntimeError):
        return False


def kernel_packed_append_reason(q, k_cache, v_cache, k, v) -> str | None:
    """Why the fused append cannot write new keys in FA3's packed layouts (cu_seqlens_k_new, or
    with packed queries: append_kv_sm90's cu_seqlens_q/cu_seqlens_k_new); None if it can. New
    k/v and caches of q's dtype, or all four float8_e4m3fn (FA3's FP8 cache: the bytes copied or
    rotated, descale_per_batch; q bf16/fp16, or e4m3, FA3's, which rotary needs)."""
    reason = _device_reason(q, lambda: None if op_takes("append_kv_sm90", "cu_seqlens_k_new") else
                            "flash3._C's append_kv_sm90 takes no cu_seqlens_q/cu_seqlens_k_new (an "
                            "older build)")
    if reason is not None:
        return reason
    e4m3 = k_cache.dtype == torch.float8_e4m3fn
    if q.dtype not in (torch.bfloat16, torch.float16) and not (e4m3 and q.dtype == k_cache.dtype):
        return (f"the fused append takes bfloat16/float16 q (float8_e4m3fn with an e4m3 cache), "
                f"got {q.dtype}")
    new_dtype = torch.float8_e4m3fn if e4m3 else q.dtype
    if any(t.dtype != new_dtype for t in (k, v, k_cache, v_cache)):
        return ("the fused append takes new k/v and caches of q's dtype, or all float8_e4m3fn")
    if e4m3 and not has_append_e4m3_kernel():
        return "flash3._C's append_kv_sm90 takes no descale_per_batch (an older build)"
    if any(t.stride(-1) != 1 for t in (k_cache, v_cache)):
        return "k_cache/v_cache have a strided last dimension"
    return None


def has_append_e4m3_kernel() -> bool:
    """True when the fused append copies e4m3 new keys into an e4m3 cache under descales per
    batch entry (its schema has ``descale_per_batch``)."""
    return has_append_kernel() and op_takes("append_kv_sm90", "descale_per_batch")


def has_leftpad_kernel() -> bool:
    """True when flash3._C's decode op takes FA3's ``cache_leftpad`` (its schema has it)."""
    return op_takes("fwd_kvcache_sm90", "cache_leftpad")


def kernel_leftpad_reason(q) -> str | None:
    """Why the decode kernel cannot take ``cache_leftpad`` (checked after its own reason); None
    if it can."""
    if q.is_cuda and not has_leftpad_kernel():
        return "flash3._C's fwd_kvcache_sm90 takes no cache_leftpad (an older build)"
    return None


def has_descale_per_batch_kernel() -> bool:
    """True when flash3._C's decode op takes FA3's per-(batch, kv head) FP8-cache descales (its
    schema has ``descale_per_batch``)."""
    return op_takes("fwd_kvcache_sm90", "descale_per_batch")


def kernel_descale_per_batch_reason(q) -> str | None:
    """Why the decode kernel cannot read FP8-cache descales per batch entry (checked after its
    own reason); None if it can."""
    if q.is_cuda and not has_descale_per_batch_kernel():
        return "flash3._C's fwd_kvcache_sm90 takes no descale_per_batch (an older build)"
    return None


_ALIBI_OPS = {"fwd": "fwd_sm90", "decode": "fwd_kvcache_sm90", "bwd": "bwd_sm90"}


def has_alibi_kernel(kind: str) -> bool:
    """True when flash3._C's `kind` op ("fwd", "decode", "bwd") takes ALiBi slopes (an
    ``alibi_slopes`` argument in its schema)."""
    return op_takes(_ALIBI_OPS[kind], "alibi_slopes")


_CHUNK_OPS = {"fwd": "fwd_sm90", "fwd_fp8": "fwd_fp8_sm90", "decode": "fwd_kvcache_sm90",
              "bwd": "bwd_sm90"}


def has_chunk_kernel(kind: str) -> bool:
    """True when flash3._C's `kind` op ("fwd", "fwd_fp8", "decode", "bwd") takes FA3's attention_chunk (an
    ``attention_chunk`` argument in its schema)."""
    return op_takes(_CHUNK_OPS[kind], "attention_chunk")


# The 16-bit forward, decode and backward kernels and the FP8 forward take the chunk at every head
# dim (the 16-bit forward's and decode's d 256 on tiles of their own: csrc/flash3/common/attn_logic.h
# fwd_chunk_tile_shape, decode_chunk_tile_shape); the MLA decode kernel too (asked of the extension's
# pick).


def kernel_chunk_reason(q, kind: str, attention_chunk: int, d_v: int | None = None) -> str | None:
    """Why the `kind` kernel ("fwd", "fwd_fp8", "decode", "bwd") cannot take this attention_chunk for head
    dims (q's, d_v) (checked after the kernel's own reason); None if it can (or there is no
    chunk)."""
    if attention_chunk <= 0 or not q.is_cuda:
        return None
    if not has_chunk_kernel(kind):
        return f"flash3._C's {_CHUNK_OPS[kind]} takes no attention_chunk (an older build)"
    dims = (q.shape[-1], q.shape[-1] if d_v is None else d_v)
    if kind == "decode" and dims[1] > 256:  # the MLA kernel: asked of the extension's pick
        return kernel_pick("decode", q.dtype, *dims, 1.0, attention_chunk=attention_chunk).get("reason")
    return None


# The forward and decode kernels compile the ALiBi term for head dims up to this (FwdTraits::kAlibi,
# csrc/flash3/fwd/traits.cuh: above it the term spilled registers); the backward's covers all.
ALIBI_MAX_HEAD_DIM = 128


def kernel_alibi_reason(q, kind: str, d_v: int | None = None) -> str | None:
    """Why the `kind` kernel ("fwd", "decode", "bwd") cannot take ALiBi slopes for this call with
    head dims (q's, d_v) (checked after the kernel's own reason); None if it can."""
    if not q.is_cuda:
        return None
    if not has_alibi_kernel(kind):
        return f"flash3._C's {_ALIBI_OPS[kind]} takes no alibi_slopes (a build without ALiBi)"
    dims = (q.shape[-1], q.shape[-1] if d_v is None else d_v)
    if kind != "bwd" and max(dims) > ALIBI_MAX_HEAD_DIM:
        return (f"the {kind} kernels take ALiBi for head dims up to {ALIBI_MAX_HEAD_DIM}, got "
                f"(d, d_v) = {dims}")
    return None


def kernel_alibi(slopes):
    """The kernels' form of ``alibi_slopes``: None, or contiguous float32 (h,) or (b, h) (row
    stride 0 or h in the kernels' parameters)."""
    return None if slopes is None else slopes.detach().to(torch.float32).contiguous()


@functools.lru_cache(maxsize=None)
def kernel_info() -> dict:
    """The extension's self-description ({} when not built)."""
    if not has_extension():
        return {}
    return json.loads(torch.ops.flash3.kernel_info())


@functools.lru_cache(maxsize=None)
def kernel_configs() -> frozenset:
    """Compiled forward configs as {(dtype, d, d_v)}."""
    configs = set()
    for name, d, d_v in kernel_info().get("fwd", []):
        if name in _DTYPE_NAMES:
            configs.add((_DTYPE_NAMES[name], int(d), int(d_v)))
    return frozenset(configs)


@functools.lru_cache(maxsize=None)
def kernel_bwd_configs() -> frozenset:
    """Compiled backward configs as {(dtype, d, d_v)} (kernel_info()["bwd"])."""
    return frozenset((_DTYPE_NAMES[name], int(d), int(d_v))
                     for name, d, d_v in kernel_info().get("bwd", []) if name in _DTYPE_NAMES)


@functools.lru_cache(maxsize=4096)
def _ask_pick(family: str, dtype: str, d: int, d_v: int, softmax_scale: float,
              attention_chunk: int = 0) -> dict:
    """The extension's answer for such a call (flash3::pick_kernel: csrc/flash3/host/kernel_pick.h,
    the rule its ops refuse by): {"kernel": [d', d_v']} or {"reason": ...}. Host-only, no
    GPU, cached per call shape."""
    chunk = {"attention_chunk": attention_chunk} if attention_chunk else {}  # the op's default: 0
    return json.loads(torch.ops.flash3.pick_kernel(family, dtype, d, d_v, softmax_scale, **chunk))


def kernel_pick(family: str, dtype, d: int, d_v: int, softmax_scale: float,
                attention_chunk: int = 0) -> dict:
    """Whether a kernel of ``family`` ("fwd", "fwd_fp8", "decode", "decode_fp8_cache", "bwd") runs a
    call of q's ``dtype``, head dims (d, d_v), scale and attention_chunk, and which; asked of the
    extension, never decided here. Without the extension: {"reason": ...}."""
    if not has_extension():
        return {"reason": "flash3._C (the CUDA extension) is not built"}
    try:
        chunk = {"attention_chunk": int(attention_chunk)} if attention_chunk else {}
        return _ask_pick(family, str(dtype).removeprefix("torch."), int(d), int(d_v),
                         float(softmax_scale), **chunk)
    except (AttributeError, RuntimeError):  # a build older than the op
        return {"reason": "flash3._C answers no kernel pick (flash3::pick_kernel): rebuild it"}


def pick_kernel_config(dtype, d, d_v, family: str = "fwd"):
    """The compiled (d', d_v') a call with head dims (d, d_v) runs on (the next ones up: TMA
    zero-fills the extra columns), or None; the extension's pick (kernel_pick)."""
    picked = kernel_pick(family, dtype, d, d_v, 1.0).get("kernel")
    return None if picked is None else (picked[0], picked[1])


@functools.lru_cache(maxsize=None)
def kernel_decode_configs(fp8_cache: bool = False) -> frozenset:
    """Compiled decode (KV-cache) configs as {(q dtype, d, d_v)}: kernel_info()["decode"] (caches of
    q's dtype) or, with fp8_cache, kernel_info()["decode_fp8_cache"] (float8_e4m3fn caches)."""
    key = "decode_fp8_cache" if fp8_cache else "decode"
    return frozenset((_DTYPE_NAMES[name], int(d), int(d_v))
                     for name, d, d_v in kernel_info().get(key, []) if name in _DTYPE_NAMES)


def call_fwd_reason(dtype, d, d_v, softmax_scale, family: str = "fwd") -> str | None:
    """The device-independent part of kernel_fwd_reason: why no ``family`` kernel runs a call of
    this dtype, scale and head dims (the extension's pick); None if one does."""
    return kernel_pick(family, dtype, d, d_v, softmax_scale).get("reason")


def call_bwd_reason(dtype, d, d_v, softmax_scale) -> str | None:
    """The device-independent part of kernel_bwd_reason (the extension's pick of a backward kernel)."""
    return call_fwd_reason(dtype, d, d_v, softmax_scale, "bwd")


@functools.lru_cache(maxsize=None)
def _capability(index):
    """A device's compute capability, asked once (every kernel call checks it)."""
    return torch.cuda.get_device_capability(index)


def _device_reason(q, missing_op=lambda: None) -> str | None:
    """Why no flash3 kernel can run on q's device (CPU tensor, no extension, then missing_op(): an
    op this build lacks, then not sm_90); None if one can."""
    if not q.is_cuda:
        return "inputs are not CUDA tensors"
    if not has_extension():
        return "flash3._C (the CUDA extension) is not built"
    reason = missing_op()
    if reason is not None:
        return reason
    cap = _capability(q.device.index)
    if cap != (9, 0):
        return f"device capability {cap} is not sm_90 (Hopper)"
    return None


def kernel_fwd_reason(q, k, v, softmax_scale) -> str | None:
    """Why the Hopper forward kernel cannot run this call; None if it can."""
    reason = (_device_reason(q)
              or call_fwd_reason(q.dtype, q.shape[-1], v.shape[-1], softmax_scale))
    if reason is not None:
        return reason
    if any(t.stride(-1) != 1 for t in (q, k, v)):
        return "last dim of q/k/v is not contiguous"
    return None


def call_kvcache_reason(dtype, cache_dtype, d, d_v, softmax_scale) -> str | None:
    """The device-independent part of kernel_kvcache_reason. An FP8 (float8_e4m3fn) cache runs
    with bf16/fp16 q, on its own kernel list (the "decode_fp8_cache" family)."""
    fp8 = cache_dtype == torch.float8_e4m3fn
    if cache_dtype != dtype and not fp8:
        return f"cache dtype {cache_dtype} differs from q's {dtype}"
    return call_fwd_reason(dtype, d, d_v, softmax_scale, "decode_fp8_cache" if fp8 else "decode")


def _addressable(x) -> bool:
    """TMA and 16-byte loads can address x in place: 16-byte aligned base, positive 16-byte
    multiple strides on every dimension of size > 1 but the last (see _tma_ready)."""
    eb = x.element_size()
    if x.data_ptr() % 16:
        return False
    if x.is_contiguous() and x.shape[-1] * eb % 16 == 0:
        return True  # each stride above the last is a multiple of the last dim's bytes (~5 us less)
    return all(st > 0 and st * eb % 16 == 0 for st, n in zip(x.stride()[:-1], x.shape[:-1]) if n > 1)


def kernel_kvcache_reason(q, k_cache, v_cache, softmax_scale) -> str | None:
    """Why the decode kernel cannot run this attention_with_kvcache call; None if it can. The
    caches are never copied (they are the caller's state, and large): one the kernel cannot
    address in place sends the call to the reference."""
    reason = _device_reason(q) or call_kvcache_reason(q.dtype, k_cache.dtype, q.shape[-1],
                                                      v_cache.shape[-1], softmax_scale)
    if reason is not None:
        return reason
    if not all(c.stride(-1) == 1 and _addressable(c) for c in (k_cache, v_cache)):
        return "k_cache/v_cache are not 16-byte aligned with 16-byte multiple strides"
    return None


def kernel_varlen_kvcache_reason(q, k_cache, v_cache, softmax_scale, cu_seqlens_k=None,
                                 sinks=None, alibi_slopes=None) -> str | None:
    """Why the decode kernel cannot run packed (varlen) queries against this cache; None if it
    can: a paged or contiguous cache (not a packed one, cu_seqlens_k), a build whose kernels take
    sinks when they are given, and what kernel_kvcache_reason asks of any decode call."""
    if cu_seqlens_k is not None:
        return "a packed cache (cu_seqlens_k) has no decode-kernel path (use page_table or a contiguous cache)"
    return (kernel_kvcache_reason(q, k_cache, v_cache, softmax_scale)
            or (kernel_sinks_reason(q) if sinks is not None else None)
            or (kernel_alibi_reason(q, "decode", v_cache.shape[-1]) if alibi_slopes is not None
                else None))


def _missing_bwd_op() -> str | None:
    return None if has_bwd_kernel() else "flash3._C has no backward kernel (flash3::bwd_sm90)"


def kernel_bwd_reason(q, k, v, softmax_scale) -> str | None:
    """Why the Hopper backward kernel cannot run this call; None if it can."""
    reason = (_device_reason(q, _missing_bwd_op)
              or call_bwd_reason(q.dtype, q.shape[-1], v.shape[-1], softmax_scale))
    if reason is not None:
        return reason
    if any(t.stride(-1) != 1 for t in (q, k, v)):
        return "last dim of q/k/v is not contiguous"
    return None


def _tma_ready(x):
    """x itself when TMA can address it (16-byte aligned base, positive 16-byte multiple strides),
    else a contiguous copy: the kernel's tensor maps need both, and a copy is cheaper than the
    reference. A zero stride on a dimension of size > 1 (an expanded/broadcast tensor) would make
    TMA read past a one-copy allocation, so such tensors are copied too; size-1 dims may keep any
    stride (the op never addresses memory through them)."""
    return x if _addressable(x) else x.clone(memory_format=torch.contiguous_format)


_warned: set = set()


def warn_fallback(reason: str, what: str = "forward") -> None:
    """Warn once per (what, reason) that a CUDA call runs on the reference."""
    key = (what, reason)
    if key not in _warned:
        _warned.add(key)
        warnings.warn(f"flash3: {what} uses the slow reference backend: {reason}",
                      RuntimeWarning, stacklevel=3)


def run_kernel_fwd(q, k, v, softmax_scale, left, right, softcap, *, cu_seqlens_q=None,
                   cu_seqlens_k=None, seqused_k=None, max_seqlen_q=0, max_seqlen_k=0, sinks=None,
                   alibi_slopes=None, seqused_q=None, attention_chunk=0):
    """Call flash3::fwd_sm90; returns (out, lse).

    Batched: q (b, s_q, h, d) -> lse (b, h, s_q). Varlen: q (total_q, h, d) -> lse (h, total_q).
    (left, right): the mask, as every op takes it (masking.normalize_window). ``sinks`` (h,): attention
    sinks (made float32 contiguous; lse includes them); passed only when given, so a build without
    them serves calls without; ``alibi_slopes`` (h,) or (b, h) the same way, ``seqused_q`` (b,)
    int32 (varlen, FA3's) too, and ``attention_chunk`` (FA3's chunked local attention, 0 = off).
    """
    q, k, v = (_tma_ready(x) for x in (q, k, v))
    out = q.new_empty(*q.shape[:-1], v.shape[-1])
    if cu_seqlens_q is None:
        lse = torch.empty(q.shape[0], q.shape[2], q.shape[1], dtype=torch.float32, device=q.device)
    else:
        lse = torch.empty(q.shape[1], q.shape[0], dtype=torch.float32, device=q.device)
    extra = {} if sinks is None else {"sinks": kernel_sinks(sinks)}
    if alibi_slopes is not None:
        extra["alibi_slopes"] = kernel_alibi(alibi_slopes)
    if seqused_q is not None:
        extra["seqused_q"] = seqused_q.contiguous()
    if attention_chunk:
        extra["attention_chunk"] = int(attention_chunk)
    torch.ops.flash3.fwd_sm90(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k,
                              int(max_seqlen_q), int(max_seqlen_k), float(softmax_scale),
                              int(left), int(right), float(softcap), **extra)
    return out, lse


def run_kernel_kvcache(q, k_cache, v_cache, seqused_k, page_table, softmax_scale, left, right,
                       softcap, num_splits, k_descale=None, v_descale=None, sinks=None,
                       alibi_slopes=None, cache_leftpad=None, descale_per_batch=False, qv=None,
                       attention_chunk=0):
    """Call flash3::fwd_kvcache_sm90; returns (out (b, s_q, h, d_v), lse (b, h, s_q)). Reads no
    device value on the host (capturable in a CUDA graph). FP8 caches take float32 descales
    (slabs, h_k), or (b, h_k) with ``descale_per_batch`` (FA3's). ``sinks`` (h,) and
    ``alibi_slopes`` as in run_kernel_fwd; ``cache_leftpad`` int32 (b,); ``attention_chunk``
    (these four passed only when given: builds without them serve calls without). ``qv``
    (b, s_q, h, d_v): FA3's MLA query part (the MLA decode kernel, d_v > 256; kernel_mla_reason)."""
    q = _tma_ready(q)
    out = q.new_empty(*q.shape[:-1], v_cache.shape[-1])
    lse = torch.empty(q.shape[0], q.shape[2], q.shape[1], dtype=torch.float32, device=q.device)
    extra = {} if sinks is None else {"sinks": kernel_sinks(sinks)}
    if alibi_slopes is not None:
        extra["alibi_slopes"] = kernel_alibi(alibi_slopes)
    if cache_leftpad is not None:
        extra["cache_leftpad"] = cache_leftpad.contiguous()
    if descale_per_batch:
        extra["descale_per_batch"] = True
    if qv is not None:
        extra["qv"] = _tma_ready(qv)
    if attention_chunk:
        extra["attention_chunk"] = int(attention_chunk)
    torch.ops.flash3.fwd_kvcache_sm90(q, k_cache, v_cache, out, lse, seqused_k, page_table,
                                      float(softmax_scale), int(left), int(right), float(softcap),
                                      int(num_splits), k_descale, v_descale, **extra)
    return out, lse


def run_kernel_append_packed(q, k_cache, v_cache, k, v, cache_seqlens, page_table, cu_seqlens_q,
                             cu_seqlens_k_new, rotary_cos, rotary_sin, rotary_interleaved,
                             q_per_token, rotary_seqlens):
    """Call flash3::append_kv_sm90 in FA3's packed layouts (cu_seqlens_q: q (total_q, h, d);
    cu_seqlens_k_new: k/v (total_new, h_k, .)); returns q rotated (rotary), else an empty tensor.
    A float8_e4m3fn cache takes float8_e4m3fn k/v, copied unchanged (descale_per_batch: they
    share their entry's descales, which the decode kernel applies), or with rotary (q
    float8_e4m3fn too, FA3's) rotated with q in fp32 and rounded to e4m3. Reads no device value on
    the host (capturable in a CUDA graph)."""
    i32 = lambda t: None if t is None else t.to(torch.int32).contiguous()  # noqa: E731
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    rotary = rotary_cos is not None
    cos, sin = ((None, None) if not rotary else
                (t.to(torch.float32).contiguous() for t in (rotary_cos, rotary_sin)))
    q_out = torch.empty_like(q) if rotary else q  # without rotary the kernel never touches q_out
    # An e4m3 cache here takes e4m3 k/v under descales per batch entry: copied, no descales.
    per_batch = {"descale_per_batch": True} if k_cache.dtype == torch.float8_e4m3fn else {}
    torch.ops.flash3.append_kv_sm90(q, k_cache, v_cache, k, v, i32(cache_seqlens), i32(page_table),
                                    cos, sin, bool(rotary_interleaved), bool(q_per_token), q_out,
                                    rotary_seqlens=i32(rotary_seqlens),
                                    cu_seqlens_q=i32(cu_seqlens_q),
                                    cu_seqlens_k_new=i32(cu_seqlens_k_new), **per_batch)
    return q_out if rotary else q.new_empty(0)


def has_mla_kernel() -> bool:
    """True when flash3._C's decode op takes FA3's ``qv`` (its schema has it)."""
    return op_takes("fwd_kvcache_sm90", "qv")


def kernel_mla_reason(q, k_cache, v_cache, softmax_scale) -> str | None:
    """Why the MLA decode kernel (d <= 64, 256 < d_v <= 512, caches of q's dtype, optional qv)
    cannot run this FA3 call; None if it can (the caller has checked qv's shape and dtype)."""
    d_v = v_cache.shape[-1]
    if d_v <= 256:
        return f"qv needs the MLA decode kernel (256 < d_v <= 512), got d_v={d_v}"
    return (_device_reason(q, lambda: None if has_mla_kernel() else "this build's decode op takes no qv")
            or kernel_kvcache_reason(q, k_cache, v_cache, softmax_scale))


def run_kernel_bwd(dout, q, k, v, out, lse, dlse, softmax_scale, left, right, softcap,
                   deterministic, *, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0,
                   max_seqlen_k=0, sinks=None, alibi_slopes=None, seqused_q=None, attention_chunk=0):
    """Call flash3::bwd_sm90; returns (dq, dk, dv), contiguous, in q/k/v's shapes and dtypes, and
    with ``sinks`` (h,) (lse must then include them) d_sinks (h,) float32 last.

    Layouts as run_kernel_fwd's (lse and dlse (b, h, s_q), varlen (h, total_q)). dout comes from
    autograd in any layout (an expanded gradient has stride 0 everywhere): copied when its last
    dim is not contiguous or TMA cannot address it; lse/dlse are made contiguous fp32.
    """
    dout, out = (x if x.stride(-1) == 1 else x.contiguous() for x in (dout, out))
    q, k, v, out, dout = (_tma_ready(x) for x in (q, k, v, out, dout))
    lse = lse.to(torch.float32).contiguous()
    if dlse is not None:
        dlse = dlse.to(torch.float32).contiguous()
    dq, dk, dv = (x.new_empty(x.shape) for x in (q, k, v))
    if cu_seqlens_q is None:  # batched: the lengths are the shapes
        max_seqlen_q, max_seqlen_k = q.shape[1], k.shape[1]
    tail = ()
    if sinks is not None:  # passed only then: the schema's trailing (sinks, dsinks), both optional
        sinks = kernel_sinks(sinks)
        tail = (sinks, torch.empty_like(sinks))
    extra = {} if alibi_slopes is None else {"alibi_slopes": kernel_alibi(alibi_slopes)}
    if seqused_q is not None:  # passed only when given, as the slopes
        extra["seqused_q"] = seqused_q.contiguous()
    if attention_chunk:
        extra["attention_chunk"] = int(attention_chunk)
    torch.ops.flash3.bwd_sm90(dout, q, k, v, out, lse, dlse, dq, dk, dv, cu_seqlens_q,
                              cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k),
                              float(softmax_scale), int(left), int(right), float(softcap),
                              bool(deterministic), *tail, **extra)
    return (dq, dk, dv) + tail[1:]


# ----------------------------------------------------------------- FP8 forward kernel
@functools.lru_cache(maxsize=None)
def kernel_fp8_configs() -> frozenset:
    """Compiled FP8 (e4m3 in, bf16 out) forward configs as {(d, d_v)}."""
    return frozenset((int(d), int(dv)) for d, dv in kernel_info().get("fwd_fp8", []))


def fp8_tile_n(d: int, d_v: int, attention_chunk: int = 0, fast_accum: bool = False) -> int:
    """Keys per tile of the FP8 kernel that runs (attn_logic.h fwd_fp8_tile_shape, with a chunk
    fwd_fp8_chunk_tile_shape, with fast accumulation fwd_fp8_fast_tile_shape): k/v descale blocks
    must be multiples of it."""
    return kernel_tile_n(max(d, d_v), attention_chunk, fast_accum)


def fp8_kernel_reason(q, k, v, softmax_scale, block_m, block_n, attention_chunk=0,
                      seqused=False, fast_accum=False) -> str | None:
    """Why the FP8 kernel cannot run this call (q/k/v as the kernel gets them: e4m3, batched or
    packed; the caller may quantize 16-bit ones first) with this attention_chunk and, if
    ``seqused``, seqused_q/seqused_k, and ``fast_accum``; None if it can."""
    if not q.is_cuda:
        return "inputs are not CUDA tensors"
    if not has_extension() or not kernel_fp8_configs():
        return "flash3._C has no FP8 kernel"
    cap = _capability(q.device.index)
    if cap != (9, 0):
        return f"device capability {cap} is not sm_90 (Hopper)"
    pick = kernel_pick("fwd_fp8", torch.float8_e4m3fn, q.shape[-1], v.shape[-1], softmax_scale)
    if "reason" in pick:
        return pick["reason"]
    dd, dv = pick["kernel"][:2]
    if block_m % 64:
        return f"q descale blocks of {block_m} rows (the kernel needs a multiple of 64)"
    if fast_accum and not op_takes("fwd_fp8_sm90", "fast_accum"):
        return "flash3._C's fwd_fp8_sm90 takes no fast_accum (an older build)"
    tile_n = fp8_tile_n(dd, dv, attention_chunk, fast_accum)
    if block_n % tile_n:
        return f"k/v descale blocks of {block_n} keys (the kernel needs a multiple of {tile_n})"
    if seqused and not op_takes("fwd_fp8_sm90", "seqused_k"):
        return "flash3._C's fwd_fp8_sm90 takes no seqused_q/seqused_k (an older build)"
    return kernel_chunk_reason(q, "fwd_fp8", attention_chunk)


def _round_up(x: int, m: int) -> int:
    return max(m, -(-x // m) * m)


def run_kernel_fwd_fp8(q, k, v, q_descale, k_descale, v_descale, softmax_scale, left, right,
                       softcap, block_m, block_n, v_channel_descale=None, vt=None, *, cu_seqlens_q=None,
                       cu_seqlens_k=None, max_seqlen_q=0, max_seqlen_k=0, seqused_q=None,
                       seqused_k=None, attention_chunk=0, fast_accum=False):
    """Call flash3::fwd_fp8_sm90 on e4m3 q, k, v (b, s, h, d) or packed; returns (out bf16, lse).

    Descales as flash3.attention takes them: (b, h_k) per head or per block (b, heads, blocks of
    block_m / block_n rows). v is packed here (fp8_quant.pack_v_fp8: transposed, tokens permuted) unless
    the caller passes the packed ``vt`` already (the quantize kernel writes it directly).
    Varlen (cu_seqlens_q/k): q, k, v packed (total, heads, dim), descales per sequence with blocks
    of max_seqlen_q/k (fp8_quant.pack_v_fp8_varlen packs v, zero past seqused_k), out (total_q, h,
    d_v), lse (h, total_q); seqused_q/k int32 (b,) as run_kernel_fwd's. ``attention_chunk`` (0 =
    off) as flash3.attention's. ``fast_accum``: the kernel's single accumulation (v_descale (b, h_k)).
    Reads no device value on the host."""
    varlen = cu_seqlens_q is not None
    h, h_k = q.shape[-2], k.shape[-2]
    b = cu_seqlens_q.shape[0] - 1 if varlen else q.shape[0]
    s_q, s_k = (max_seqlen_q, max_seqlen_k) if varlen else (q.shape[1], k.shape[1])
    g = h // h_k
    f32 = dict(dtype=torch.float32)
    qd = q_descale.to(**f32)
    if qd.shape[1] != h:  # per kv head: each query head of the group takes its kv head's scale
        qd = qd.repeat_interleave(g, dim=1)
    if qd.dim() == 2:  # per head: one block over the whole sequence
        qd, q_block = qd[:, :, None], _round_up(s_q, 64)
    else:
        q_block = block_m
    if k_descale.dim() == 2 and (v_descale.dim() == 2 or fast_accum):
        kv_block = _round_up(s_k, 128)
    else:
        kv_block = block_n
    nkv = -(-s_k // kv_block)

    def kv3(x):
        x = x.to(**f32)
        return x[:, :, None].expand(b, h_k, nkv) if x.dim() == 2 else x

    q, k = _tma_ready(q), _tma_ready(k)
    if vt is None:
        vt = pack_v_fp8_varlen(v, cu_seqlens_k, seqused_k) if varlen else pack_v_fp8(v)
    d_v = vt.shape[-2]
    out = torch.empty(*q.shape[:-2], h, d_v, dtype=torch.bfloat16, device=q.device)
    lse_shape = (h, q.shape[0]) if varlen else (b, h, s_q)
    lse = torch.empty(lse_shape, dtype=torch.float32, device=q.device)
    vd = v_descale.to(**f32)[:, :, None] if fast_accum else kv3(v_descale)  # fast: (b, h_k, 1)
    torch.ops.flash3.fwd_fp8_sm90(q, k, vt, out, lse, qd, kv3(k_descale), vd,
                                  v_channel_descale, int(q_block), int(kv_block), float(softmax_scale),
                                  int(left), int(right), float(softcap),
                                  cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k),
                                  **({} if seqused_q is None else {"seqused_q": seqused_q.contiguous()}),
                                  **({} if seqused_k is None else {"seqused_k": seqused_k.contiguous()}),
                                  **({"attention_chunk": int(attention_chunk)} if attention_chunk else {}),
                                  **({"fast_accum": True} if fast_accum else {}))
    return out, lse


def run_kernel_varlen_kvcache(q, k_cache, v_cache, cu_seqlens_q, max_seqlen_q, seqused_k,
                              page_table, softmax_scale, left, right, softcap, num_splits=0,
                              k_descale=None, v_descale=None, sinks=None, alibi_slopes=None,
                              cache_leftpad=None, qv=None, attention_chunk=0,
                              descale_per_batch=False):
    """Call flash3::fwd_kvcache_sm90 with packed queries (cu_seqlens_q, max_seqlen_q): q
    (total_q, h, d) -> out (total_q, h, d_v), lse (h, total_q); rows of no sequence get out 0,
    lse -inf (the op fills them). Reads no device value on the host (capturable in a CUDA graph).
    Split-KV as in run_kernel_kvcache (partials by packed row). FP8 caches take float32
    descales (slabs, h_k), or (b, h_k) with ``descale_per_batch`` (FA3's, b the sequences of
    cu_seqlens_q). ``sinks`` (h,) as in run_kernel_fwd; ``cache_leftpad`` int32 (b,),
    ``attention_chunk`` and ``descale_per_batch`` as in run_kernel_kvcache (passed only when
    given)."""
    q = _tma_ready(q)
    out = q.new_empty(q.shape[0], q.shape[1], v_cache.shape[-1])
    lse = torch.empty(q.shape[1], q.shape[0], dtype=torch.float32, device=q.device)
    i32 = lambda t: None if t is None else t.to(torch.int32).contiguous()  # noqa: E731
    f32 = lambda t: None if t is None else t.to(torch.float32)  # noqa: E731
    # cu_seqlens_q / max_seqlen_q by keyword: they are the op's last (defaulted) arguments.
    torch.ops.flash3.fwd_kvcache_sm90(q, k_cache, v_cache, out, lse, i32(seqused_k), i32(page_table),
                                      float(softmax_scale), int(left), int(right), float(softcap),
                                      int(num_splits), f32(k_descale), f32(v_descale),
                                      **({} if sinks is None else {"sinks": kernel_sinks(sinks)}),
                                      **({} if alibi_slopes is None
                                         else {"alibi_slopes": kernel_alibi(alibi_slopes)}),
                                      **({} if cache_leftpad is None
                                         else {"cache_leftpad": i32(cache_leftpad)}),
                                      **({} if qv is None else {"qv": _tma_ready(qv)}),
                                      **({"attention_chunk": int(attention_chunk)}
                                         if attention_chunk else {}),
                                      **({"descale_per_batch": True} if descale_per_batch else {}),
                                      cu_seqlens_q=i32(cu_seqlens_q),
                                      max_seqlen_q=int(max_seqlen_q))
    return out, lse
