"""torch.library operators for serving features the reference specifies first (namespace
``flash3``): attention sinks (forward and backward, batched and varlen) and packed
variable-length queries against a (paged) KV cache.

Sinks: on CUDA the forward operators run the Hopper forward kernel (the sink is added in its
epilogue) and the backward operators the backward kernel (dq/dk/dv from the lse that includes the
sink, and d_sink from its preprocess); where a kernel cannot run (flash3/_backend.py's reasons)
they run the reference with a one-time RuntimeWarning (the package's fallback rule, flash3/ops.py).
Varlen queries on a paged or contiguous KV cache run the decode kernel on CUDA (fwd_kvcache_sm90
with cu_seqlens_q: no host reads; sinks too) and the reference on the CPU; a CUDA call the kernel
cannot take (a packed cache, fp32 q, ...) raises NotImplementedError naming why: the reference's
per-sequence loop would read cu_seqlens on the host. New keys in FA3's packed layouts
(kvcache_append_packed: cu_seqlens_k_new, or with packed queries) are written by the fused append
kernel on CUDA (no host reads), by the reference elsewhere.
"""

# No ``from __future__ import annotations``: custom_op reads real annotations.
from typing import Optional

import torch
from torch import Tensor

from . import _backend, _checks, ops, reference, validation


def _sinks_fwd_dispatch(q, k, v, softmax_scale, run_kernel, run_reference, alibi_slopes=None):
    """ops._fwd_dispatch, plus: the extension's kernels take sinks (and ALiBi, when given)."""
    return ops._dispatch(q, ops._with_alibi(lambda: (_backend.kernel_fwd_reason(q, k, v,
                                                                                softmax_scale)
                                                     or _backend.kernel_sinks_reason(q)),
                                            q, alibi_slopes, "fwd", v.shape[-1]),
                         "forward", run_kernel, run_reference)


# ----------------------------------------------------------------- batched, with sinks
@torch.library.custom_op("flash3::attention_sinks_fwd", mutates_args=())
def attention_sinks_fwd(q: Tensor, k: Tensor, v: Tensor, sinks: Tensor, softmax_scale: float,
                        window_left: int, window_right: int, softcap: float,
                        deterministic: bool = False,
                        alibi_slopes: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    args = (softmax_scale, window_left, window_right, softcap)
    return _sinks_fwd_dispatch(
        q, k, v, softmax_scale,
        lambda: _backend.run_kernel_fwd(q, k, v, *args, sinks=sinks, **ops._alibi_kw(alibi_slopes)),
        lambda: reference.forward(q, k, v, *args, sinks=sinks, alibi_slopes=alibi_slopes),
        alibi_slopes)


@attention_sinks_fwd.register_fake
def _(q, k, v, sinks, softmax_scale, window_left, window_right, softcap, deterministic=False,
      alibi_slopes=None):
    return q.new_empty(*q.shape[:-1], v.shape[-1]), ops._lse_batched(q)


@torch.library.custom_op("flash3::attention_sinks_bwd", mutates_args=())
def attention_sinks_bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                        dlse: Optional[Tensor], sinks: Tensor, softmax_scale: float,
                        window_left: int, window_right: int, softcap: float,
                        deterministic: bool = False, alibi_slopes: Optional[Tensor] = None
                        ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    args = (softmax_scale, window_left, window_right, softcap)
    dq, dk, dv, ds = ops._bwd_dispatch(
        q, k, v, softmax_scale,
        lambda: _backend.run_kernel_bwd(dout, q, k, v, out, lse, dlse, *args, deterministic,
                                        sinks=sinks, **ops._alibi_kw(alibi_slopes)),
        lambda: reference.backward(dout, q, k, v, out, lse, *args, dlse=dlse, sinks=sinks,
                                   alibi_slopes=alibi_slopes), alibi_slopes)
    return dq, dk, dv, ds.to(sinks.dtype)


@attention_sinks_bwd.register_fake
def _(dout, q, k, v, out, lse, dlse, sinks, softmax_scale, window_left, window_right, softcap,
      deterministic=False, alibi_slopes=None):
    return ops._like(q), ops._like(k), ops._like(v), ops._like(sinks)


def _sinks_setup(ctx, inputs, output):
    q, k, v, sinks = inputs[:4]
    ctx.save_for_backward(q, k, v, sinks, inputs[-1], *output)  # inputs[-1]: alibi_slopes
    ctx.extra = inputs[4:-1]
    ctx.set_materialize_grads(False)  # as in ops._setup


def _sinks_backward(ctx, dout, dlse):
    q, k, v, sinks, alibi, out, lse = ctx.saved_tensors
    dout = ops._grads_or_zeros(dout, out)
    grads = attention_sinks_bwd(dout, q, k, v, out, lse, dlse, sinks, *ctx.extra, alibi)
    return grads + (None,) * (len(ctx.extra) + 1)


attention_sinks_fwd.register_autograd(_sinks_backward, setup_context=_sinks_setup)


# ----------------------------------------------------------------- varlen, with sinks
@torch.library.custom_op("flash3::attention_varlen_sinks_fwd", mutates_args=())
def attention_varlen_sinks_fwd(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor,
                               cu_seqlens_k: Tensor, sinks: Tensor, max_seqlen_q: int,
                               max_seqlen_k: int, softmax_scale: float, window_left: int,
                               window_right: int, softcap: float, deterministic: bool = False,
                               alibi_slopes: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    if validation.validation_enabled(q, cu_seqlens_q, cu_seqlens_k):  # a host sync on CUDA
        _checks.varlen_values(cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0],
                              max_seqlen_q, max_seqlen_k)
    args = (softmax_scale, window_left, window_right, softcap)
    return _sinks_fwd_dispatch(
        q, k, v, softmax_scale,
        lambda: _backend.run_kernel_fwd(q, k, v, *args, cu_seqlens_q=cu_seqlens_q,
                                        cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                                        max_seqlen_k=max_seqlen_k, sinks=sinks,
                                        **ops._alibi_kw(alibi_slopes)),
        lambda: reference.varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, *args, sinks=sinks,
                                         alibi_slopes=alibi_slopes), alibi_slopes)


@attention_varlen_sinks_fwd.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, sinks, max_seqlen_q, max_seqlen_k, softmax_scale,
      window_left, window_right, softcap, deterministic=False, alibi_slopes=None):
    out = q.new_empty(q.shape[0], q.shape[1], v.shape[-1])
    return out, ops._lse_varlen(q)


@torch.library.custom_op("flash3::attention_varlen_sinks_bwd", mutates_args=())
def attention_varlen_sinks_bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor,
                               lse: Tensor, dlse: Optional[Tensor], cu_seqlens_q: Tensor,
                               cu_seqlens_k: Tensor, sinks: Tensor, max_seqlen_q: int,
                               max_seqlen_k: int, softmax_scale: float, window_left: int,
                               window_right: int, softcap: float, deterministic: bool = False,
                               alibi_slopes: Optional[Tensor] = None
                               ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    # max_seqlen_q/k size the kernel's grid (the forward's values: no host read of cu_seqlens).
    args = (softmax_scale, window_left, window_right, softcap)
    dq, dk, dv, ds = ops._bwd_dispatch(
        q, k, v, softmax_scale,
        lambda: _backend.run_kernel_bwd(dout, q, k, v, out, lse, dlse, *args, deterministic,
                                        cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                                        max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                                        sinks=sinks, **ops._alibi_kw(alibi_slopes)),
        lambda: reference.varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                                          *args, dlse=dlse, sinks=sinks,
                                          alibi_slopes=alibi_slopes), alibi_slopes)
    return dq, dk, dv, ds.to(sinks.dtype)


@attention_varlen_sinks_bwd.register_fake
def _(dout, q, k, v, out, lse, dlse, cu_seqlens_q, cu_seqlens_k, sinks, max_seqlen_q,
      max_seqlen_k, softmax_scale, window_left, window_right, softcap, deterministic=False,
      alibi_slopes=None):
    return ops._like(q), ops._like(k), ops._like(v), ops._like(sinks)


def _varlen_sinks_setup(ctx, inputs, output):
    q, k, v, cu_q, cu_k, sinks = inputs[:6]
    ctx.save_for_backward(q, k, v, cu_q, cu_k, sinks, inputs[-1], *output)  # + alibi_slopes
    ctx.extra = inputs[6:-1]
    ctx.set_materialize_grads(False)


def _varlen_sinks_backward(ctx, dout, dlse):
    q, k, v, cu_q, cu_k, sinks, alibi, out, lse = ctx.saved_tensors
    dout = ops._grads_or_zeros(dout, out)
    dq, dk, dv, ds = attention_varlen_sinks_bwd(dout, q, k, v, out, lse, dlse, cu_q, cu_k,
                                                sinks, *ctx.extra, alibi)
    return (dq, dk, dv, None, None, ds) + (None,) * (len(ctx.extra) + 1)


attention_varlen_sinks_fwd.register_autograd(_varlen_sinks_backward,
                                             setup_context=_varlen_sinks_setup)


# ----------------------------------------------------------------- varlen queries on a KV cache
@torch.library.custom_op("flash3::attention_varlen_kvcache", mutates_args=())
def attention_varlen_kvcache(q: Tensor, k_cache: Tensor, v_cache: Tensor, cu_seqlens_q: Tensor,
                             seqused_k: Optional[Tensor], page_table: Optional[Tensor],
                             cu_seqlens_k: Optional[Tensor], max_seqlen_q: int,
                             softmax_scale: float, window_left: int, window_right: int,
                             softcap: float, k_descale: Optional[Tensor] = None,
                             v_descale: Optional[Tensor] = None,
                             sinks: Optional[Tensor] = None, num_splits: int = 0,
                             alibi_slopes: Optional[Tensor] = None,
                             cache_leftpad: Optional[Tensor] = None,
                             attention_chunk: int = 0,
                             descale_per_batch: bool = False) -> tuple[Tensor, Tensor]:
    # Forward only.  CUDA: the decode kernel (packed GQA, split-KV by packed row), or
    # NotImplementedError (varlen_kvcache_reason, kernel_chunk_reason); CPU: the reference.
    # descale_per_batch: an FP8 cache's descales are FA3's (b, h_k), b = sequences.
    if validation.validation_enabled(q, cu_seqlens_q, seqused_k, page_table, cache_leftpad):
        _checks.varlen_cache_values(q, k_cache, cu_seqlens_q, seqused_k, page_table,
                                    cu_seqlens_k, max_seqlen_q, k_descale, v_descale,
                                    cache_leftpad=cache_leftpad)
    if q.is_cuda:
        reason = (varlen_kvcache_reason(q, k_cache, v_cache, softmax_scale, cu_seqlens_k, sinks,
                                        alibi_slopes, cache_leftpad, descale_per_batch)
                  or _backend.kernel_chunk_reason(q, "decode", attention_chunk, v_cache.shape[-1]))
        if reason is not None:
            raise NotImplementedError(f"packed queries against a KV cache on CUDA: {reason} "
                                      "(the reference runs on CPU tensors)")
        return _backend.run_kernel_varlen_kvcache(q, k_cache, v_cache, cu_seqlens_q, max_seqlen_q,
                                                  seqused_k, page_table, softmax_scale,
                                                  window_left, window_right, softcap, num_splits,
                                                  k_descale, v_descale, sinks,
                                                  **ops._alibi_kw(alibi_slopes),
                                                  cache_leftpad=cache_leftpad,
                                                  **ops._chunk_kw(attention_chunk),
                                                  **({"descale_per_batch": True}
                                                     if descale_per_batch else {}))
    return reference.varlen_cache_forward(q, k_cache, v_cache, cu_seqlens_q, seqused_k,
                                          page_table, cu_seqlens_k, softmax_scale, window_left,
                                          window_right, softcap, k_descale, v_descale, sinks,
                                          alibi_slopes, cache_leftpad, attention_chunk,
                                          descale_per_batch)


@attention_varlen_kvcache.register_fake
def _(q, k_cache, v_cache, cu_seqlens_q, seqused_k, page_table, cu_seqlens_k, max_seqlen_q,
      softmax_scale, window_left, window_right, softcap, k_descale=None, v_descale=None,
      sinks=None, num_splits=0, alibi_slopes=None, cache_leftpad=None, attention_chunk=0,
      descale_per_batch=False):
    out = q.new_empty(q.shape[0], q.shape[1], v_cache.shape[-1])
    return out, ops._lse_varlen(q)


def varlen_kvcache_reason(q, k_cache, v_cache, softmax_scale, cu_seqlens_k=None, sinks=None,
                          alibi_slopes=None, cache_leftpad=None, descale_per_batch=False):
    """Why the decode kernel cannot run packed queries against this cache (with cache_leftpad,
    FA3's per-batch FP8 descales when given); None if it can."""
    return (_backend.kernel_varlen_kvcache_reason(q, k_cache, v_cache, softmax_scale, cu_seqlens_k,
                                                  sinks, alibi_slopes)
            or (None if cache_leftpad is None else _backend.kernel_leftpad_reason(q))
            or (_backend.kernel_descale_per_batch_reason(q) if descale_per_batch else None))


# ----------------------------------------------------------------- new keys in FA3's packed layouts
@torch.library.custom_op("flash3::kvcache_append_packed", mutates_args=("k_cache", "v_cache"))
def kvcache_append_packed(q: Tensor, k_cache: Tensor, v_cache: Tensor, k: Tensor, v: Tensor,
                          cache_seqlens: Tensor, page_table: Optional[Tensor],
                          cu_seqlens_q: Optional[Tensor], cu_seqlens_k_new: Optional[Tensor],
                          rotary_cos: Optional[Tensor], rotary_sin: Optional[Tensor],
                          rotary_interleaved: bool, q_per_token: bool,
                          rotary_seqlens: Optional[Tensor]) -> Tensor:
    """New k/v written into a (paged) cache of q's dtype at cache_seqlens[i] + t, rotated with q
    when rotary tables are given, in FA3's packed layouts: q packed by cu_seqlens_q and/or k/v by
    cu_seqlens_k_new (reference.kvcache_append_packed says what lands where).  A float8_e4m3fn
    cache takes float8_e4m3fn k/v (FA3's FP8 cache, descales per batch entry): copied unchanged,
    the bytes sharing their entry's descales (applied by the attention); with rotary q is
    float8_e4m3fn too (FA3's) and k and q are rotated in fp32 and rounded to e4m3 (saturating, as
    FA3; flash3.rotary.apply_rotary on e4m3 tensors).  Returns q rotated,
    or an empty tensor without rotary.  CUDA: the fused append (append_kv_sm90: no host reads,
    slots outside the cache or behind a bad page id skipped), or where it cannot run the reference
    (host reads) with the package's one-time fallback warning; CPU: the reference.  The caller
    validated everything first (flash3.api attention_with_kvcache)."""
    if k_cache.dtype == torch.float8_e4m3fn and (
            any(t.dtype != k_cache.dtype for t in (k, v, v_cache))
            or (rotary_cos is not None and q.dtype != k_cache.dtype)):
        raise TypeError("kvcache_append_packed: a float8_e4m3fn cache takes float8_e4m3fn k/v "
                        "(copied unchanged), and with rotary float8_e4m3fn q (FA3's)")
    reason = _backend.kernel_packed_append_reason(q, k_cache, v_cache, k, v)
    if reason is None:
        return _backend.run_kernel_append_packed(q, k_cache, v_cache, k, v, cache_seqlens,
                                                 page_table, cu_seqlens_q, cu_seqlens_k_new,
                                                 rotary_cos, rotary_sin, rotary_interleaved,
                                                 q_per_token, rotary_seqlens)
    if q.is_cuda:
        _backend.warn_fallback(reason, "attention_with_kvcache (append)")
    q_out = reference.kvcache_append_packed(q, k_cache, v_cache, k, v, cache_seqlens, page_table,
                                            cu_seqlens_q, cu_seqlens_k_new, rotary_cos, rotary_sin,
                                            rotary_interleaved, q_per_token, rotary_seqlens)
    return q.new_empty(0) if q_out is None else q_out


@kvcache_append_packed.register_fake
def _(q, k_cache, v_cache, k, v, cache_seqlens, page_table, cu_seqlens_q, cu_seqlens_k_new,
      rotary_cos, rotary_sin, rotary_interleaved, q_per_token, rotary_seqlens):
    return torch.empty_like(q) if rotary_cos is not None else q.new_empty(0)
