"""torch.library operators of flash3 (namespace ``flash3``).

Each operator has a fake (meta) implementation and, where differentiable, an
autograd formula, so torch.compile captures calls without graph breaks. The public
functions call them through `run`, which in plain eager mode runs the same bodies
without torch.library's dispatch (see "eager calls" below).
Forward and backward implementations try the Hopper kernels on CUDA and
otherwise run the reference backend (with a warning once per reason).

The C++ extension defines ``flash3::fwd_sm90`` / ``flash3::kernel_info`` with
TORCH_LIBRARY(flash3, ...); it must be loaded before the ops below are
defined (flash3/__init__.py imports it first), and those two names are its own.
"""

# No ``from __future__ import annotations``: custom_op reads real annotations.
from typing import Optional

import torch
import torch.autograd.forward_ad as _forward_ad
from torch import Tensor

from . import _backend, _checks, _used_keys, reference, validation
from .reference.fp8 import fp8_attention_reference, fp8_attention_varlen_reference
from .rotary import kvcache_rotary

try:  # make sure TORCH_LIBRARY(flash3) runs before our custom ops register
    from . import _C  # noqa: F401
except ImportError:
    pass


def _lse_batched(q: Tensor) -> Tensor:
    return torch.empty(q.shape[0], q.shape[2], q.shape[1], dtype=torch.float32, device=q.device)


def _lse_varlen(q: Tensor) -> Tensor:
    """The (h, total_q) fp32 lse of a packed q (total_q, h, d), unwritten."""
    return torch.empty(q.shape[1], q.shape[0], dtype=torch.float32, device=q.device)


def _like(x: Tensor) -> Tensor:
    """Contiguous tensor of x's shape (empty_like would copy x's strides)."""
    return x.new_empty(x.shape)


def _dispatch(q, why_not, what, run_kernel, run_reference):
    """Kernel when possible; on CUDA, say (once per reason) why not. why_not() -> reason or None."""
    if q.is_cuda:
        reason = why_not()
        if reason is None:
            return run_kernel()
        _backend.warn_fallback(reason, what)
    return run_reference()


def _with_alibi(reason, q, alibi_slopes, kind, d_v=None):
    """reason() and then, with ALiBi slopes, whether this build's `kind` kernel takes them (for
    head dims (q's, d_v))."""
    return lambda: (reason() or (None if alibi_slopes is None
                                 else _backend.kernel_alibi_reason(q, kind, d_v)))


def _with_chunk(reason, q, attention_chunk, kind, d_v=None):
    """reason() and then, with an attention chunk, whether this build's `kind` kernel takes it
    (for head dims (q's, d_v))."""
    return lambda: reason() or _backend.kernel_chunk_reason(q, kind, attention_chunk, d_v)


def _fwd_dispatch(q, k, v, softmax_scale, run_kernel, run_reference, alibi_slopes=None,
                  attention_chunk=0):
    why = _with_alibi(lambda: _backend.kernel_fwd_reason(q, k, v, softmax_scale), q, alibi_slopes,
                      "fwd", v.shape[-1])
    return _dispatch(q, _with_chunk(why, q, attention_chunk, "fwd", v.shape[-1]), "forward", run_kernel,
                     run_reference)


def _kvcache_reason(q, k_cache, v_cache, softmax_scale, cache_leftpad=None,
                    descale_per_batch=False):
    """Why the decode kernel cannot run a call (with cache_leftpad, per-batch descales when
    given); None if it can."""
    return (_backend.kernel_kvcache_reason(q, k_cache, v_cache, softmax_scale)
            or (None if cache_leftpad is None else _backend.kernel_leftpad_reason(q))
            or (_backend.kernel_descale_per_batch_reason(q) if descale_per_batch else None))


def _kvcache_dispatch(q, k_cache, v_cache, softmax_scale, run_kernel, run_reference,
                      alibi_slopes=None, cache_leftpad=None, descale_per_batch=False,
                      attention_chunk=0):
    why = _with_alibi(lambda: _kvcache_reason(q, k_cache, v_cache, softmax_scale, cache_leftpad,
                                              descale_per_batch),
                      q, alibi_slopes, "decode", v_cache.shape[-1])
    return _dispatch(q, _with_chunk(why, q, attention_chunk, "decode", v_cache.shape[-1]),
                     "attention_with_kvcache", run_kernel, run_reference)


def _bwd_dispatch(q, k, v, softmax_scale, run_kernel, run_reference, alibi_slopes=None,
                  attention_chunk=0):
    why = _with_alibi(lambda: _backend.kernel_bwd_reason(q, k, v, softmax_scale), q, alibi_slopes,
                      "bwd", v.shape[-1])
    return _dispatch(q, _with_chunk(why, q, attention_chunk, "bwd", v.shape[-1]), "backward", run_kernel,
                     run_reference)


def _alibi_kw(alibi_slopes):
    """The kernels' keyword for the slopes: passed only when given (a build without ALiBi serves
    calls without)."""
    return {} if alibi_slopes is None else {"alibi_slopes": alibi_slopes}


def _chunk_kw(attention_chunk):
    """The kernels' keyword for FA3's attention_chunk, passed only when on (as _alibi_kw)."""
    return {"attention_chunk": int(attention_chunk)} if attention_chunk else {}


# ----------------------------------------------------------------- batched
def _attention_fwd(q: Tensor, k: Tensor, v: Tensor, softmax_scale: float, window_left: int,
                   window_right: int, softcap: float, deterministic: bool = False,
                   alibi_slopes: Optional[Tensor] = None,
                   attention_chunk: int = 0) -> tuple[Tensor, Tensor]:
    # `deterministic` only concerns the backward; it travels with the forward for autograd.
    # attention_chunk: FA3's chunked local attention (flash3/masking.py), 0 = off.
    args = (softmax_scale, window_left, window_right, softcap)
    return _fwd_dispatch(
        q, k, v, softmax_scale,
        lambda: _backend.run_kernel_fwd(q, k, v, *args, **_alibi_kw(alibi_slopes),
                                        **_chunk_kw(attention_chunk)),
        lambda: reference.forward(q, k, v, *args, alibi_slopes=alibi_slopes,
                                  chunk=attention_chunk),
        alibi_slopes, **_chunk_kw(attention_chunk))


attention_fwd = torch.library.custom_op("flash3::attention_fwd", mutates_args=())(_attention_fwd)


@attention_fwd.register_fake
def _(q, k, v, softmax_scale, window_left, window_right, softcap, deterministic=False,
      alibi_slopes=None, attention_chunk=0):
    return q.new_empty(*q.shape[:-1], v.shape[-1]), _lse_batched(q)


def _attention_bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                   dlse: Optional[Tensor], softmax_scale: float, window_left: int,
                   window_right: int, softcap: float, deterministic: bool = False,
                   alibi_slopes: Optional[Tensor] = None,
                   attention_chunk: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    # The reference backward is bitwise reproducible run to run either way (fixed tile order,
    # no atomics); `deterministic` chooses the ordered dQ reduction of the backward kernel.
    args = (softmax_scale, window_left, window_right, softcap)
    return _bwd_dispatch(
        q, k, v, softmax_scale,
        lambda: _backend.run_kernel_bwd(dout, q, k, v, out, lse, dlse, *args, deterministic,
                                        **_alibi_kw(alibi_slopes), **_chunk_kw(attention_chunk)),
        lambda: reference.backward(dout, q, k, v, out, lse, *args, dlse=dlse,
                                   alibi_slopes=alibi_slopes, chunk=attention_chunk),
        alibi_slopes, **_chunk_kw(attention_chunk))


attention_bwd = torch.library.custom_op("flash3::attention_bwd", mutates_args=())(_attention_bwd)


@attention_bwd.register_fake
def _(dout, q, k, v, out, lse, dlse, softmax_scale, window_left, window_right, softcap,
      deterministic=False, alibi_slopes=None, attention_chunk=0):
    return _like(q), _like(k), _like(v)


def _setup(ctx, inputs, output):
    # inputs: q, k, v, scale, left, right, softcap, deterministic, alibi_slopes (a tensor or None:
    # saved as one, and handed back; it gets no gradient), attention_chunk.
    q, k, v = inputs[:3]
    ctx.save_for_backward(q, k, v, inputs[8], *output)
    ctx.extra = inputs[3:8]
    ctx.chunk = inputs[9]
    # An unused output's gradient then arrives as None rather than zeros: the usual call never
    # touches lse, and a None dlse lets the backward skip it (and use torch's CPU kernel).
    ctx.set_materialize_grads(False)


def _grads_or_zeros(dout, out):
    return torch.zeros_like(out) if dout is None else dout


def _attention_backward(ctx, dout, dlse):
    q, k, v, alibi, out, lse = ctx.saved_tensors
    dout = _grads_or_zeros(dout, out)
    dq, dk, dv = run(attention_bwd, dout, q, k, v, out, lse, dlse, *ctx.extra, alibi, ctx.chunk)
    return (dq, dk, dv) + (None,) * (len(ctx.extra) + 2)


attention_fwd.register_autograd(_attention_backward, setup_context=_setup)


# ----------------------------------------------------------------- varlen
def _attention_varlen_fwd(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor,
                          cu_seqlens_k: Tensor, max_seqlen_q: int, max_seqlen_k: int,
                          softmax_scale: float, window_left: int, window_right: int,
                          softcap: float, deterministic: bool = False,
                          alibi_slopes: Optional[Tensor] = None,
                          seqused_q: Optional[Tensor] = None,
                          attention_chunk: int = 0,
                          seqused_k: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    # seqused_q/seqused_k (FA3's): any value is clamped into [0, the sequence's length], kernel and
    # reference; masks align on the used counts.
    if validation.validation_enabled(q, cu_seqlens_q, cu_seqlens_k):  # a host sync on CUDA
        _checks.varlen_values(cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0],
                              max_seqlen_q, max_seqlen_k)
    args = (softmax_scale, window_left, window_right, softcap)
    return _fwd_dispatch(
        q, k, v, softmax_scale,
        lambda: _backend.run_kernel_fwd(q, k, v, *args, cu_seqlens_q=cu_seqlens_q,
                                        cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                                        max_seqlen_k=max_seqlen_k, seqused_q=seqused_q,
                                        seqused_k=None if seqused_k is None else seqused_k.contiguous(),
                                        **_alibi_kw(alibi_slopes), **_chunk_kw(attention_chunk)),
        lambda: reference.varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, *args,
                                         alibi_slopes=alibi_slopes, seqused_q=seqused_q,
                                         chunk=attention_chunk, seqused_k=seqused_k),
        alibi_slopes, **_chunk_kw(attention_chunk))


attention_varlen_fwd = torch.library.custom_op("flash3::attention_varlen_fwd",
                                              mutates_args=())(_attention_varlen_fwd)


@attention_varlen_fwd.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
      window_left, window_right, softcap, deterministic=False, alibi_slopes=None, seqused_q=None,
      attention_chunk=0, seqused_k=None):
    out = q.new_empty(q.shape[0], q.shape[1], v.shape[-1])
    return out, _lse_varlen(q)


def _attention_varlen_bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor,
                          lse: Tensor, dlse: Optional[Tensor], cu_seqlens_q: Tensor,
                          cu_seqlens_k: Tensor, max_seqlen_q: int, max_seqlen_k: int,
                          softmax_scale: float, window_left: int, window_right: int,
                          softcap: float, deterministic: bool = False,
                          alibi_slopes: Optional[Tensor] = None,
                          seqused_q: Optional[Tensor] = None,
                          attention_chunk: int = 0,
                          seqused_k: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor]:
    # max_seqlen_q/k size the kernel's grid (the forward's values: no host read of cu_seqlens).
    args = (softmax_scale, window_left, window_right, softcap)

    def kernel():
        # The backward kernel has no seqused_k: it runs on each sequence's used keys gathered
        # (their own cu_seqlens_k; max_seqlen_k still bounds them), dk/dv scattered back.
        kk, vv, cu_k, back = k, v, cu_seqlens_k, None
        if seqused_k is not None:
            kk, vv, cu_k, back = _used_keys.compact(k, v, cu_seqlens_k, seqused_k)
        dq, dk, dv = _backend.run_kernel_bwd(dout, q, kk, vv, out, lse, dlse, *args, deterministic,
                                             cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_k,
                                             max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                                             seqused_q=seqused_q, **_alibi_kw(alibi_slopes),
                                             **_chunk_kw(attention_chunk))
        return (dq, dk, dv) if back is None else (dq, back(dk), back(dv))

    return _bwd_dispatch(
        q, k, v, softmax_scale, kernel,
        lambda: reference.varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                                          *args, dlse=dlse, alibi_slopes=alibi_slopes,
                                          seqused_q=seqused_q, chunk=attention_chunk,
                                          seqused_k=seqused_k),
        alibi_slopes, **_chunk_kw(attention_chunk))


attention_varlen_bwd = torch.library.custom_op("flash3::attention_varlen_bwd",
                                              mutates_args=())(_attention_varlen_bwd)


@attention_varlen_bwd.register_fake
def _(dout, q, k, v, out, lse, dlse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
      softmax_scale, window_left, window_right, softcap, deterministic=False, alibi_slopes=None,
      seqused_q=None, attention_chunk=0, seqused_k=None):
    return _like(q), _like(k), _like(v)


def _varlen_setup(ctx, inputs, output):
    q, k, v, cu_q, cu_k = inputs[:5]
    # inputs[12:14]: alibi_slopes, seqused_q; inputs[15]: seqused_k (tensors or None, handed
    # back; no gradient)
    ctx.save_for_backward(q, k, v, cu_q, cu_k, *inputs[12:14], inputs[15], *output)
    # max_seqlen_q, max_seqlen_k, scale, left, right, softcap, deterministic
    ctx.extra = inputs[5:12]
    ctx.chunk = inputs[14]
    ctx.n_inputs = len(inputs)
    ctx.set_materialize_grads(False)  # as in _setup


def _varlen_backward(ctx, dout, dlse):
    q, k, v, cu_q, cu_k, alibi, used_q, used_k, out, lse = ctx.saved_tensors
    dout = _grads_or_zeros(dout, out)
    dq, dk, dv = run(attention_varlen_bwd, dout, q, k, v, out, lse, dlse, cu_q, cu_k, *ctx.extra,
                     alibi, used_q, ctx.chunk, used_k)
    return (dq, dk, dv) + (None,) * (ctx.n_inputs - 3)


attention_varlen_fwd.register_autograd(_varlen_backward, setup_context=_varlen_setup)


# ----------------------------------------------------------------- kv cache
def _attention_kvcache(q: Tensor, k_cache: Tensor, v_cache: Tensor, k: Optional[Tensor],
                       v: Optional[Tensor], cache_seqlens: Tensor, page_table: Optional[Tensor],
                       softmax_scale: float, window_left: int, window_right: int,
                       softcap: float, rotary_cos: Optional[Tensor] = None,
                       rotary_sin: Optional[Tensor] = None, rotary_interleaved: bool = False,
                       k_descale: Optional[Tensor] = None, v_descale: Optional[Tensor] = None,
                       num_splits: int = 0, sinks: Optional[Tensor] = None,
                       alibi_slopes: Optional[Tensor] = None,
                       rotary_seqlens: Optional[Tensor] = None,
                       cache_leftpad: Optional[Tensor] = None,
                       descale_per_batch: bool = False,
                       attention_chunk: int = 0) -> tuple[Tensor, Tensor]:
    s_new = 0 if k is None else k.shape[1]
    # causal, local or chunked (FA3's rule): q rotated per token
    local = window_left >= 0 or window_right >= 0 or attention_chunk > 0
    # Value checks (host reads) only in validation mode; everything is validated before the
    # caches are touched. With validation off this path reads no device value on the host.
    if validation.validation_enabled(q, cache_seqlens, page_table):
        _checks.kvcache_values(k_cache, cache_seqlens, s_new, page_table, q.shape[1],
                               rotary_cos, local, k_descale, v_descale,
                               rotary_seqlens=rotary_seqlens, cache_leftpad=cache_leftpad)
    args = (softmax_scale, window_left, window_right, softcap)

    def run_reference():
        return reference.kvcache_forward(q, k_cache, v_cache, k, v, cache_seqlens, page_table,
                                         *args, rotary_cos, rotary_sin, rotary_interleaved,
                                         k_descale, v_descale, max(num_splits, 1), sinks,
                                         alibi_slopes, rotary_seqlens, cache_leftpad,
                                         descale_per_batch, attention_chunk)

    def kernel():
        # Rotate and append (the fused kernel: one launch, no host reads, slots outside the
        # cache or behind a bad page id skipped; the same with torch ops where that op cannot
        # run: an extension without it, or the tests' forced kernel branch on CPU tensors), then
        # the decode kernel (paged or contiguous cache, packed GQA, split-KV; no host reads).
        qk = q
        pt = None if page_table is None else page_table.to(torch.int32).contiguous()
        kd, vd = (None if t is None else t.to(torch.float32) for t in (k_descale, v_descale))
        # descale_per_batch: e4m3 new keys, copied unchanged (_checks.kvcache_extras); the append
        # then takes no descales (the decode kernel applies the batch entry's).
        new_dtype = torch.float8_e4m3fn if descale_per_batch else q.dtype
        fused = (k is not None and q.is_cuda and q.dtype in (torch.bfloat16, torch.float16)
                 and k.dtype == new_dtype and v.dtype == new_dtype
                 and (_backend.has_append_e4m3_kernel() if descale_per_batch
                      else _backend.has_append_kernel()))
        wd = (None, None) if descale_per_batch else (kd, vd)  # the append's descales
        if fused:
            cos = sin = None
            if rotary_cos is not None:
                qk = q.new_empty(q.shape)
                cos, sin = (t.to(torch.float32).contiguous() for t in (rotary_cos, rotary_sin))
            kk, vv = (x if x.stride(-1) == 1 else x.contiguous() for x in (k, v))
            # Without rotary q_out is q itself, which the kernel then never touches.
            torch.ops.flash3.append_kv_sm90(q, k_cache, v_cache, kk, vv,
                                            cache_seqlens.contiguous(), pt, cos, sin,
                                            rotary_interleaved, local, qk, *wd,
                                            rotary_seqlens,
                                            **({"descale_per_batch": True}
                                               if descale_per_batch else {}))
        elif k is not None:
            kk = k
            if rotary_cos is not None:
                qk, kk = kvcache_rotary(q, k, cache_seqlens if rotary_seqlens is None
                                        else rotary_seqlens, rotary_cos, rotary_sin,
                                        rotary_interleaved, local)
            reference.kvcache_write(k_cache, v_cache, kk, v, cache_seqlens, page_table, *wd)
        # Each row's key count (no host read); the kernel clamps it into [0, capacity] (and
        # cache_leftpad into [0, that]).
        seqused = (cache_seqlens.to(torch.int64) + s_new).clamp(0, 2**31 - 1).to(torch.int32)
        lp = {} if cache_leftpad is None else {"cache_leftpad": cache_leftpad.to(torch.int32)}
        if descale_per_batch:  # FA3's (b, h_k) descales, new keys included
            lp["descale_per_batch"] = True
        return _backend.run_kernel_kvcache(qk, k_cache, v_cache, seqused, pt, *args, num_splits,
                                           kd, vd, sinks, **_alibi_kw(alibi_slopes), **lp,
                                           **_chunk_kw(attention_chunk))

    if sinks is not None:  # the decode kernel adds them (its epilogue, or the split combine)
        why_not = _with_alibi(lambda: (_kvcache_reason(q, k_cache, v_cache, softmax_scale,
                                                       cache_leftpad, descale_per_batch)
                                       or _backend.kernel_sinks_reason(q)),
                              q, alibi_slopes, "decode", v_cache.shape[-1])
        return _dispatch(q, _with_chunk(why_not, q, attention_chunk, "decode", v_cache.shape[-1]),
                         "attention_with_kvcache", kernel, run_reference)
    return _kvcache_dispatch(q, k_cache, v_cache, softmax_scale, kernel, run_reference,
                             alibi_slopes, cache_leftpad, descale_per_batch, attention_chunk)


attention_kvcache = torch.library.custom_op("flash3::attention_kvcache",
                                           mutates_args=("k_cache", "v_cache"))(_attention_kvcache)


@attention_kvcache.register_fake
def _(q, k_cache, v_cache, k, v, cache_seqlens, page_table, softmax_scale, window_left,
      window_right, softcap, rotary_cos=None, rotary_sin=None, rotary_interleaved=False,
      k_descale=None, v_descale=None, num_splits=0, sinks=None, alibi_slopes=None,
      rotary_seqlens=None, cache_leftpad=None, descale_per_batch=False, attention_chunk=0):
    return q.new_empty(*q.shape[:-1], v_cache.shape[-1]), _lse_batched(q)


# ----------------------------------------------------------------- fp8
def _attention_fp8(q: Tensor, k: Tensor, v: Tensor, q_descale: Tensor, k_descale: Tensor,
                   v_descale: Tensor, softmax_scale: float, window_left: int,
                   window_right: int, softcap: float, block_m: int,
                   block_n: int, v_channel_descale: Optional[Tensor] = None,
                   attention_chunk: int = 0, fast_accum: bool = False) -> tuple[Tensor, Tensor]:
    if q.is_cuda:
        reason = _backend.fp8_kernel_reason(q, k, v, softmax_scale, block_m, block_n, attention_chunk,
                                            fast_accum=fast_accum)
        if reason is None:
            return _backend.run_kernel_fwd_fp8(q, k, v, q_descale, k_descale, v_descale, softmax_scale,
                                               window_left, window_right, softcap, block_m, block_n,
                                               v_channel_descale=v_channel_descale,
                                               attention_chunk=attention_chunk, fast_accum=fast_accum)
        _backend.warn_fallback(reason, "FP8 forward")
    out, lse = fp8_attention_reference(
        q, k, v, q_descale, k_descale, v_descale, softmax_scale=softmax_scale,
        window_left=window_left, window_right=window_right, softcap=softcap, block_size=(block_m, block_n),
        v_channel_descale=v_channel_descale, attention_chunk=attention_chunk, fast_accum=fast_accum)
    return out.to(torch.bfloat16), lse.to(torch.float32).clone()


attention_fp8 = torch.library.custom_op("flash3::attention_fp8", mutates_args=())(_attention_fp8)


@attention_fp8.register_fake
def _(q, k, v, q_descale, k_descale, v_descale, softmax_scale, window_left, window_right,
      softcap, block_m, block_n, v_channel_descale=None, attention_chunk=0, fast_accum=False):
    out = torch.empty(*q.shape[:-1], v.shape[-1], dtype=torch.bfloat16, device=q.device)
    return out, _lse_batched(q)


def _attention_fp8_varlen(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                          max_seqlen_q: int, max_seqlen_k: int, q_descale: Tensor, k_descale: Tensor,
                          v_descale: Tensor, softmax_scale: float, window_left: int,
                          window_right: int, softcap: float, block_m: int, block_n: int,
                          v_channel_descale: Optional[Tensor] = None, seqused_q: Optional[Tensor] = None,
                          seqused_k: Optional[Tensor] = None,
                          attention_chunk: int = 0, fast_accum: bool = False) -> tuple[Tensor, Tensor]:
    if validation.validation_enabled(q, cu_seqlens_q, cu_seqlens_k):  # a host sync on CUDA
        _checks.varlen_values(cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0],
                              max_seqlen_q, max_seqlen_k)
    if q.is_cuda:
        reason = _backend.fp8_kernel_reason(q, k, v, softmax_scale, block_m, block_n, attention_chunk,
                                            seqused=seqused_q is not None or seqused_k is not None,
                                            fast_accum=fast_accum)
        if reason is None:
            return _backend.run_kernel_fwd_fp8(
                q, k, v, q_descale, k_descale, v_descale, softmax_scale, window_left, window_right,
                softcap, block_m, block_n, v_channel_descale=v_channel_descale,
                cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                max_seqlen_k=max_seqlen_k, seqused_q=seqused_q, seqused_k=seqused_k,
                attention_chunk=attention_chunk, fast_accum=fast_accum)
        _backend.warn_fallback(reason, "FP8 forward")
    out, lse = fp8_attention_varlen_reference(
        q, k, v, cu_seqlens_q, cu_seqlens_k, q_descale, k_descale, v_descale,
        max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, v_channel_descale=v_channel_descale,
        seqused_q=seqused_q, seqused_k=seqused_k, attention_chunk=attention_chunk, fast_accum=fast_accum,
        softmax_scale=softmax_scale, window_left=window_left, window_right=window_right, softcap=softcap, block_size=(block_m, block_n))
    return out.to(torch.bfloat16), lse


attention_fp8_varlen = torch.library.custom_op("flash3::attention_fp8_varlen",
                                              mutates_args=())(_attention_fp8_varlen)


@attention_fp8_varlen.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, q_descale, k_descale,
      v_descale, softmax_scale, window_left, window_right, softcap, block_m, block_n,
      v_channel_descale=None, seqused_q=None, seqused_k=None, attention_chunk=0, fast_accum=False):
    out = torch.empty(q.shape[0], q.shape[1], v.shape[-1], dtype=torch.bfloat16, device=q.device)
    return out, _lse_varlen(q)


# ----------------------------------------------------------------- eager calls
# torch.library's dispatch costs a call ~20 us before the op's body runs and ~60 us with autograd
# (the custom op's autograd wrapper binds every argument), the backward op as much again (measured
# on the CPU with the Hopper ops stubbed, 2026-11-30; an attention kernel at s 512 takes ~100 us).
# In plain eager mode `run` calls the same body directly, through a plain autograd.Function where a
# gradient is wanted; the registered ops stay what torch.compile, torch.export, fake tensors,
# tensor subclasses and functorch transforms see.
# The private probes _plain needs; a torch without one of them takes the ops on every call.
_PROBES = all(hasattr(torch._C, name) for name in (
    "_is_torch_function_mode_enabled", "_len_torch_dispatch_stack", "_are_functorch_transforms_active",
    "_get_tracing_state")) and hasattr(torch._C._functorch, "is_functorch_wrapped_tensor") and hasattr(
    _forward_ad, "_current_level") and hasattr(torch.autograd.graph, "increment_version")


def _plain(args) -> bool:
    """Whether a call may skip torch.library: eager (not compiling, no torch.jit trace, no
    functorch transform, no forward-mode AD level), no torch function or dispatch mode active
    (FakeTensorMode, a device context, ...), and every tensor argument a plain torch.Tensor with
    storage (no subclass, no functorch wrapper, not on the meta device: the ops' fake impls)."""
    if (not _PROBES or torch.compiler.is_compiling() or torch._C._is_torch_function_mode_enabled()
            or torch._C._len_torch_dispatch_stack() > 0 or torch._C._are_functorch_transforms_active()
            or torch._C._get_tracing_state() is not None or _forward_ad._current_level >= 0):
        return False
    return all(type(a) is Tensor and not a.is_meta
               and not torch._C._functorch.is_functorch_wrapped_tensor(a)
               for a in args if isinstance(a, Tensor))


def _eager_function(body, setup_context, backward):
    """A torch.autograd.Function running body with an op's registered autograd formula. Its forward
    takes ctx itself: a separate setup_context makes every apply bind the arguments through
    inspect.signature (~100 us; functorch needs that form, but its tensors take the op)."""
    def forward(ctx, *inputs):
        output = body(*inputs)
        setup_context(ctx, inputs, output)
        return output

    return type(f"Eager{body.__name__}", (torch.autograd.Function,), {
        "forward": staticmethod(forward), "backward": staticmethod(backward)})


def _kvcache_body(*args):
    """attention_kvcache's body, then its caches' version counters bumped as the op (which declares
    them mutated) bumps them, whether or not this call wrote to them: autograd's saved-tensor
    checks see the same thing either way."""
    result = _attention_kvcache(*args)
    for cache in args[1:3]:
        if not cache.is_inference():
            torch.autograd.graph.increment_version(cache)
    return result


# op -> (its body, its parameters' defaults, an autograd.Function for it or None: no gradient, its
# name for the profiler)
_EAGER = {op: (body, body.__defaults__ or (), fn, getattr(op, "_qualname", body.__name__))
          for op, body, fn in (
    (attention_fwd, _attention_fwd, _eager_function(_attention_fwd, _setup, _attention_backward)),
    (attention_bwd, _attention_bwd, None),
    (attention_varlen_fwd, _attention_varlen_fwd,
     _eager_function(_attention_varlen_fwd, _varlen_setup, _varlen_backward)),
    (attention_varlen_bwd, _attention_varlen_bwd, None),
    (attention_kvcache, _kvcache_body, None),
    (attention_fp8, _attention_fp8, None),
    (attention_fp8_varlen, _attention_fp8_varlen, None),
)}


def run(op, *args):
    """op(*args) (positional, as the op takes them), or in plain eager mode (_plain) its body: called
    directly when no gradient is wanted, else through an autograd.Function with the op's formula
    (an op without one, e.g. a backward under create_graph, stays the op: it raises as before)."""
    body, defaults, fn, name = _EAGER[op]
    if not _plain(args):
        return op(*args)
    if torch.autograd.profiler._is_profiler_enabled:  # a profile still names the op
        with torch.autograd.profiler.record_function(name):
            return _eager(body, defaults, fn, op, args)
    return _eager(body, defaults, fn, op, args)


def _eager(body, defaults, fn, op, args):
    if torch.is_grad_enabled() and any(isinstance(a, Tensor) and a.requires_grad for a in args):
        if fn is None:
            return op(*args)
        missing = body.__code__.co_argcount - len(args)  # setup_context reads every input
        return fn.apply(*args, *defaults[len(defaults) - missing:] if missing > 0 else ())
    return body(*args)
