"""flash3's FP8 (e4m3) serving path: the public FP8 module.

:func:`attention_fp8` is the end-to-end pipeline (Hadamard rotation, K smoothing, quantization,
FP8 attention, lse correction): the quantize and FP8 attention kernels on Hopper, the emulation
elsewhere; :func:`attention_fp8_varlen` runs it on packed sequences.  The other names here are
re-exported from their homes, one concern each:

* :mod:`flash3.fp8_quant` -- quantization (:func:`quantize_fp8`, :func:`quantize_v_fp8`, ...) and
  the kernel's operand layout (:func:`kernel_tile_n`, :func:`pack_v_fp8`, ...);
* :mod:`flash3.reference.fp8` -- the CPU emulation of the FP8 kernel
  (:func:`fp8_attention_reference`; that module's docstring states the numerics), the fp16/bf16
  comparison point and the fp64 ground truth.

Layout is ``(batch, seqlen, heads, headdim)``; GQA requires ``heads_q % heads_k == 0``.
"""

from __future__ import annotations

from typing import Optional

import torch

from . import _backend, _checks, _quantize, masking
from .api import attention_varlen
from .fp8_quant import (FP8_DTYPE, FP8_MAX, INPUT_DTYPES, V_PERM16, _descale_from_amax,
                        _descale_from_amax_nosync, _packed_rows, dequantize_fp8, k_smoothing_mean,
                        kernel_tile_n, pack_v_fp8, pack_v_fp8_varlen, quantize_fp8,
                        quantize_fp8_per_tensor, quantize_fp8_varlen, quantize_v_fp8,
                        smoothing_lse_correction, unpack_v_fp8, varlen_vt_offset)
from .hadamard import hadamard_transform
from .reference.fp8 import (P_MAX_OFFSET_LOG2, _key_tiling, attention_fp64_reference,
                            attention_tiled_lowp, fp8_attention_reference,
                            fp8_attention_varlen_reference)
from .reference.fp8 import _tile_state, _tiled_core  # noqa: F401  (tests, benchmarks/fp8_accuracy.py)

__all__ = [
    "FP8_DTYPE",
    "FP8_MAX",
    "P_MAX_OFFSET_LOG2",
    "quantize_fp8",
    "quantize_fp8_per_tensor",
    "quantize_fp8_varlen",
    "attention_fp8_varlen",
    "quantize_v_fp8",
    "k_smoothing_mean",
    "smoothing_lse_correction",
    "kernel_tile_n",
    "V_PERM16",
    "pack_v_fp8",
    "unpack_v_fp8",
    "varlen_vt_offset",
    "pack_v_fp8_varlen",
    "fp8_attention_varlen_reference",
    "dequantize_fp8",
    "fp8_attention_reference",
    "attention_fp8",
    "attention_tiled_lowp",
    "attention_fp64_reference",
]


V_SCALES = ("block", "channel", "block+channel")


def attention_fp8(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                  softmax_scale: Optional[float] = None, window_size=(-1, -1), softcap: float = 0.0,
                  hadamard: bool = True, block_size=(64, 128), smooth_k: Optional[bool] = None,
                  v_scale: str = "block+channel", seed: int = 0, tile_n: Optional[int] = None,
                  return_lse: bool = False, fast_accum: bool = False):
    """End-to-end FP8 attention for fp16/bf16 (or fp32) (b, s, h, d) inputs.

    Pipeline (what a CUDA path runs as quantize kernels + the FP8 kernel):

    1. q and k are rotated with the same randomized Hadamard transform (if
       ``hadamard``); v is never rotated.
    2. K smoothing (``smooth_k``): the per-(batch, kv head) mean of the rotated
       k over tokens (:func:`k_smoothing_mean`, fp32) is subtracted before
       quantization.  Every score of a query row moves by the same
       ``q . mean_k``, so the softmax and ``out`` are unchanged in exact
       arithmetic (masks included), while k's dynamic range -- and its
       quantization error -- shrinks when keys share a large mean (real LLM
       keys).  The returned ``lse`` is the true lse: the kernel's lse plus
       ``softmax_scale * (q . mean_k)`` computed in fp32 from the rotated,
       unquantized q (:func:`smoothing_lse_correction`).  With ``softcap > 0``
       the shift does not commute with ``tanh``, so smoothing is not exact:
       ``smooth_k=None`` (default) means "on iff softcap == 0", and
       ``smooth_k=True`` with ``softcap > 0`` raises ValueError.
    3. q is quantized per block of ``B_r = block_size[0]`` rows, k per block of
       ``B_c = block_size[1]`` keys (``None``/-1: one scale per (batch, head)).
       v (``v_scale``): ``"block"`` one scale per B_c keys; ``"channel"`` one
       scale per (batch, kv head, channel) applied to the output columns;
       ``"block+channel"`` both (see :func:`quantize_v_fp8`).
    4. :func:`fp8_attention_reference` with key tiles of ``tile_n``
       (default :func:`kernel_tile_n`).

    ``fast_accum=True``: the kernel's fast accumulation (FA3's; ``flash3.attention``'s
    ``fp8_fast_accum``): faster, with a looser error bound (README, FP8). v's "block" descale is
    then one per (batch, kv head) (P@V accumulates over all keys before it applies).

    Defaults (chosen with benchmarks/fp8_accuracy.py; none costs the kernel
    anything measurable: a scalar per 64-row slab, a per-row fp32 dot product
    in q's quantize pass, a d_v-vector multiply in the epilogue): Hadamard on
    (2.2x lower RMSE than per-tensor on the paper's outlier inputs, vs 1.2x
    without); K smoothing on when ``softcap == 0`` (1.5x lower RMSE when keys
    share a channel mean, neutral otherwise); v per block of 128 keys *and*
    per channel (about 1% lower RMSE in every case measured); q blocks of 64
    rows (the kernel's native slab; vs 128 rows the difference is within
    noise: e4m3's relative rounding does not depend on the scale unless values
    fall into the subnormal range, so finer scales only help for data with a
    large dynamic range inside a block).
    ``softmax_scale`` defaults to ``1/sqrt(d)`` of the original head dim.
    Returns ``out`` in q's dtype (and ``lse`` (b, h, s_q) fp32 if ``return_lse``).
    """
    _checks.qkv(q, k, v, INPUT_DTYPES)
    _checks.flag("hadamard", hadamard)
    _checks.flag("return_lse", return_lse)
    _checks.flag("fast_accum", fast_accum)
    if not _checks.is_int(seed):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    if smooth_k is not None and not isinstance(smooth_k, bool):
        raise TypeError(f"smooth_k must be a bool or None, got {type(smooth_k).__name__}")
    if v_scale not in V_SCALES:
        raise ValueError(f"v_scale must be one of {V_SCALES}, got {v_scale!r}")
    left, right = masking.normalize_window(causal, _checks.window(*_checks.window_pair(window_size), causal))
    br, bc = _checks.quant_block_pair(block_size)
    scale, softcap = _checks.scale_softcap(softmax_scale, softcap, q.shape[-1])
    if smooth_k is None:
        smooth_k = softcap == 0.0
    elif smooth_k and softcap > 0.0:
        raise ValueError("smooth_k=True is not exact with softcap > 0 (tanh does not commute with the "
                         "per-row score shift); use smooth_k=None or False")
    if q.is_cuda:
        fast = _attention_fp8_cuda(q, k, v, scale=scale, left=left, right=right, softcap=softcap,
                                   hadamard=hadamard, br=br, bc=bc, smooth_k=smooth_k, v_scale=v_scale,
                                   seed=seed, tile_n=tile_n, fast_accum=fast_accum)
        if fast is not None:
            out, lse = fast
            return (out.to(q.dtype), lse) if return_lse else out.to(q.dtype)
    kblk, bn = _key_tiling(bc or 128, tile_n, max(q.shape[-1], v.shape[-1]), 0, fast_accum)  # the kernel's
    q8, qd = quantize_fp8(q, block_size=br, hadamard=hadamard, seed=seed)
    if smooth_k:
        k8, kd, k_mean = quantize_fp8(k, block_size=bc, hadamard=hadamard, seed=seed, smooth=True)
    else:
        k8, kd = quantize_fp8(k, block_size=bc, hadamard=hadamard, seed=seed)
    v8, vd, vcd = quantize_v_fp8(v, block_size=None if fast_accum else bc, channel=v_scale != "block",
                                 block=v_scale != "channel")
    out, lse = fp8_attention_reference(q8, k8, v8, qd, kd, vd, softmax_scale=scale, causal=causal,
                                       window_left=left, window_right=right, softcap=softcap,
                                       block_size=(br or 128, kblk), tile_n=bn, v_channel_descale=vcd,
                                       fast_accum=fast_accum)
    if smooth_k and return_lse:
        q_rot = hadamard_transform(q, seed=seed) if hadamard else q.float()
        lse = lse + smoothing_lse_correction(q_rot, k_mean, scale)
    out = out.to(q.dtype)
    return (out, lse) if return_lse else out


def _attention_fp8_cuda(q, k, v, *, scale, left, right, softcap, hadamard, br, bc, smooth_k, v_scale,
                        seed, tile_n, fast_accum=False):
    """attention_fp8 on Hopper: the quantize kernel (q, k rows; v transposed and permuted for the
    attention kernel) then the FP8 attention kernel, the same algorithm as the emulation and no
    host synchronization. None when the kernels cannot take this call (the caller emulates)."""
    if (q.dtype not in (torch.float16, torch.bfloat16) or k.dtype != q.dtype or v.dtype != q.dtype
            or br is None or bc is None or v_scale == "channel" or not _quantize.available()
            or tile_n not in (None, kernel_tile_n(max(q.shape[-1], v.shape[-1]), 0, fast_accum))
            or _backend.fp8_kernel_reason(q, k, v, scale, br, bc, fast_accum=fast_accum) is not None):
        return None
    mean = None
    if smooth_k:  # the mean of the rotated k is the rotated mean of k (the transform is linear)
        km = k.float().mean(dim=1, keepdim=True)
        mean = (hadamard_transform(km, seed=seed) if hadamard else km)[:, 0].contiguous()
    q8, qd = _quantize.quantize_fp8_cuda(q, block_size=br, hadamard=hadamard, seed=seed)
    k8, kd = _quantize.quantize_fp8_cuda(k, block_size=bc, hadamard=hadamard, seed=seed, mean=mean)
    vcd = None
    if v_scale != "block":
        vf = v.float()
        vcd = _descale_from_amax_nosync(vf.abs().amax(dim=1))  # (b, h_k, d_v)
    if fast_accum:  # v per (batch, kv head): one block over the sequence, too long for the packed
        # layout's shared-memory tile; quantized as rows, then packed (pack_v_fp8, in the backend)
        v8, vd = _quantize.quantize_fp8_cuda(v, block_size=None, channel_descale=vcd)  # vd (b, h_k)
        vt = None
    else:
        v8 = v
        vt, vd = _quantize.quantize_fp8_cuda(v, block_size=bc, channel_descale=vcd, layout="v_packed")
    out, lse = _backend.run_kernel_fwd_fp8(q8, k8, v8, qd, kd, vd, scale, left, right, softcap, br, bc,
                                           v_channel_descale=vcd, vt=vt, fast_accum=fast_accum)
    if smooth_k:
        q_rot = hadamard_transform(q, seed=seed) if hadamard else q.float()
        lse = lse + smoothing_lse_correction(q_rot, mean, scale)
    return out, lse


def attention_fp8_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                         cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, *,
                         causal: bool = False, softmax_scale: Optional[float] = None,
                         window_size=(-1, -1), softcap: float = 0.0, hadamard: bool = True,
                         block_size=(64, 128), smooth_k: Optional[bool] = None,
                         v_scale: str = "block+channel", seed: int = 0, return_lse: bool = False):
    """:func:`attention_fp8` on packed sequences (q (total_q, h, d), k/v (total_k, h_k, d|d_v),
    int32 cu_seqlens as for ``flash3.attention_varlen``): every sequence gets what
    :func:`attention_fp8` gives it alone (same rotation, K smoothing with the sequence's own mean,
    blocks counted from its first row, v's channel scale over its own tokens).

    :func:`quantize_fp8_varlen` for q and k, the same device ops for v, then
    ``flash3.attention_varlen`` on e4m3 -- the FP8 kernel on Hopper (no host sync), the
    emulation elsewhere.  Returns out in q's dtype (computed as the kernel's bf16), and lse
    (h, total_q) fp32 if ``return_lse``.
    """
    for n, t in (("q", q), ("k", k), ("v", v)):
        _checks.typed_tensor(t, n, INPUT_DTYPES, ndim=3)
    if v_scale not in V_SCALES:
        raise ValueError(f"v_scale must be one of {V_SCALES}, got {v_scale!r}")
    _checks.flag("hadamard", hadamard)
    left, right = _checks.window_pair(window_size)
    scale, softcap = _checks.scale_softcap(softmax_scale, softcap, q.shape[-1])
    if smooth_k is None:
        smooth_k = softcap == 0.0
    elif smooth_k and softcap > 0.0:
        raise ValueError("smooth_k=True is not exact with softcap > 0; use smooth_k=None or False")
    br, bc = _checks.quant_block_pair(block_size)
    b = cu_seqlens_q.numel() - 1
    q8, qd = quantize_fp8_varlen(q, cu_seqlens_q, max_seqlen_q, block_size=br, hadamard=hadamard, seed=seed)
    kq = quantize_fp8_varlen(k, cu_seqlens_k, max_seqlen_k, block_size=bc, hadamard=hadamard, seed=seed,
                             smooth=smooth_k)
    k8, kd = kq[0], kq[1]
    vf, vcd = v.float(), None
    seq_k, _ = _packed_rows(cu_seqlens_k, v.shape[0], v.device)
    if v_scale != "block":  # per (sequence, kv head, channel) amax over the sequence's tokens
        hk, dv = v.shape[1], v.shape[2]
        amax = vf.new_zeros(b + 1, hk, dv).scatter_reduce_(0, seq_k[:, None, None].expand_as(vf),
                                                           vf.abs(), "amax")
        vcd_all = _descale_from_amax_nosync(amax) if v.is_cuda else _descale_from_amax(amax, "v")
        vf, vcd = vf / vcd_all[seq_k], vcd_all[:b].contiguous()
    if v_scale != "channel":
        v8, vd = quantize_fp8_varlen(vf, cu_seqlens_k, max_seqlen_k, block_size=bc)
    else:
        v8 = (vf * (seq_k < b)[:, None, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
        vd = torch.ones(b, v.shape[1], dtype=torch.float32, device=v.device)
    out, lse = attention_varlen(q8, k8, v8, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                causal=causal, softmax_scale=scale, window_size=(left, right),
                                softcap=softcap, return_lse=True, q_descale=qd, k_descale=kd,
                                v_descale=vd, fp8_block_size=(br or 128, bc or 128), v_channel_descale=vcd)
    if smooth_k and return_lse:  # lse of the smoothed keys + scale * q . mean_k of the row's sequence
        q_rot = hadamard_transform(q, seed=seed) if hadamard else q.float()
        seq_q, _ = _packed_rows(cu_seqlens_q, q.shape[0], q.device)
        mean = torch.cat([kq[2], kq[2].new_zeros(1, *kq[2].shape[1:])])[seq_q]  # (total_q, h_k, d)
        g = q.shape[1] // k.shape[1]
        lse = lse + (q_rot * mean.repeat_interleave(g, dim=1)).sum(-1).t() * scale
    out = out.to(q.dtype)
    return (out, lse) if return_lse else out
