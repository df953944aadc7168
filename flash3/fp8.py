"""CPU specification of flash3's FP8 (e4m3) serving path.

This module is the executable spec for the future Hopper FP8 forward kernel:
it quantizes activations to ``torch.float8_e4m3fn`` with per-block scales
(optionally after a randomized Hadamard rotation, see :mod:`flash3.hadamard`)
and emulates the kernel's numerics tile by tile.

Layout is ``(batch, seqlen, heads, headdim)``; GQA requires
``heads_q % heads_k == 0`` and query head ``i`` uses kv head
``i // (heads_q // heads_k)``.  ``lse`` is the natural-log logsumexp with
shape ``(batch, heads_q, seqlen_q)``.

Numerics of :func:`fp8_attention_reference` (queries are processed per tile
of rows, which are independent; keys in tiles of ``tile_n`` keys --
:func:`kernel_tile_n`: 128 for d <= 128, 64 above -- walked from the LAST
key tile to the FIRST, as the kernel does; the full score matrix is never
formed):

1. ``S = q8.float() @ k8.float()^T`` in fp32 (products of e4m3 values are
   exact in fp32).
2. ``S *= softmax_scale * q_descale[row block] * k_descale[key block]``
   (q descale per block of ``B_r`` rows -- the kernel's native 64-row slab,
   or 128, or per head; k descale per block of ``B_c`` keys, a multiple of
   ``tile_n``, so one descale covers ``B_c / tile_n`` tiles).
3. softcap (``cap * tanh(S / cap)``) if ``softcap > 0``, then the mask
   (``-inf``).
4. Online softmax in fp32 in the exp2 domain with running row max ``m``:
   ``P = exp2(S*log2e - m*log2e + 8)``, so ``P`` lies in ``[0, 256]``
   (evaluated as ``exp2((S - m)*log2e + 8)`` so the row max is exactly 256).  The
   ``+8`` ("max offset") uses the top of e4m3's range (max 448) instead of
   ``[0, 1]``, where P values below 2^-6 would be subnormal and values below
   2^-10 flush to zero; 256 is a power of two so the scaling is exact.
   The rescale points (where ``m`` grows) follow the descending tile order.
5. Row sums ``l`` are accumulated from the *unrounded* fp32 ``P`` (the Hopper
   kernel reduces the fp32 accumulator registers before converting P to FP8),
   so ``lse`` is as accurate as an fp32 kernel and only the P@V product sees
   the e4m3 rounding of ``P``.  The output is therefore not exactly a convex
   combination of V rows: the effective weights ``P8 / l`` sum to ``1 + delta``
   with ``|delta| <= 2^-4`` (round-to-nearest errors, unbiased, mostly
   cancelling over many keys).  Summing the rounded P instead would make the
   weights sum to 1 but put the same rounding error into ``lse``.
6. ``P8 = P.to(float8_e4m3fn)``;
   ``O_acc = O_acc * alpha + (P8 @ v8.float()) * v_descale[key block]`` in fp32
   per tile (the kernel folds the per-block v descale into the running
   rescale; this is mathematically the same).
7. ``O = O_acc / l`` (times ``v_channel_descale[channel]`` if given: an
   optional per-(batch, kv head, channel) v scale applied to O's columns once
   at the end); ``lse = m + log(l) - 8 ln 2``.  Rows that see no key get
   ``O = 0`` exactly and ``lse = -inf``.

:func:`attention_fp8` is the end-to-end pipeline (Hadamard rotation, K
smoothing, quantization, kernel, lse correction); :func:`pack_v_fp8` gives
the kernel's V layout (:func:`pack_v_fp8_varlen` for packed sequences, which
:func:`fp8_attention_varlen_reference` emulates one sequence at a time).

Masking: query ``i`` sees key ``j`` iff
``(left < 0 or j >= i + s_k - s_q - left) and (right < 0 or j <= i + s_k - s_q + right)``;
``causal`` means ``right = 0``.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from .hadamard import hadamard_transform

from .masking import visible_mask

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

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0
P_MAX_OFFSET_LOG2 = 8  # P = exp2(... + 8) spans [0, 256]
_LOG2E = math.log2(math.e)
_LN2 = math.log(2.0)
_INPUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


# --------------------------------------------------------------------------
# argument validation helpers
# --------------------------------------------------------------------------

def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_tensor(x, name: str, dtypes, ndim: Optional[int] = 4) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in dtypes:
        names = "/".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name} must have dtype {names}, got {x.dtype}")
    if ndim is not None and x.dim() != ndim:
        what = "(batch, seqlen, heads, headdim)" if ndim == 4 else "(total, heads, headdim)"
        raise ValueError(f"{name} must be {ndim}-D {what}, got shape {tuple(x.shape)}")


def _norm_block(block_size, name: str) -> Optional[int]:
    """int > 0, or None / -1 meaning one block over the whole sequence."""
    if block_size is None:
        return None
    if not _is_int(block_size):
        raise TypeError(f"{name} must be a positive int, -1 or None, got {block_size!r}")
    if block_size == -1:
        return None
    if block_size <= 0:
        raise ValueError(f"{name} must be a positive int, -1 or None, got {block_size}")
    return block_size


def _norm_block_pair(block_size, name: str = "block_size") -> tuple[Optional[int], Optional[int]]:
    if block_size is None or _is_int(block_size):
        b = _norm_block(block_size, name)
        return b, b
    if not isinstance(block_size, (tuple, list)) or len(block_size) != 2:
        raise TypeError(f"{name} must be a (B_r, B_c) pair, an int, -1 or None, got {block_size!r}")
    return _norm_block(block_size[0], f"{name}[0]"), _norm_block(block_size[1], f"{name}[1]")


def _check_window(left, right, causal):
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    for nm, w in (("window_left", left), ("window_right", right)):
        if not _is_int(w):
            raise TypeError(f"{nm} must be an int (negative = unbounded), got {w!r}")
    left = -1 if left < 0 else left
    right = -1 if right < 0 else right
    if causal:
        right = 0
    return left, right


def _check_scale_softcap(softmax_scale, softcap, d):
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


# --------------------------------------------------------------------------
# quantization
# --------------------------------------------------------------------------

def _descale_from_amax(amax: torch.Tensor, name: str) -> torch.Tensor:
    if not bool(torch.isfinite(amax).all()):
        raise ValueError(f"{name} contains non-finite values (inf/nan) and cannot be quantized to FP8")
    descale = amax / FP8_MAX
    # amax == 0 -> descale 1 (all-zero block); tiny amax -> keep descale normal
    # so that x / descale never overflows or divides by zero.
    descale = torch.clamp_min(descale, torch.finfo(torch.float32).tiny)
    return torch.where(amax == 0, torch.ones_like(descale), descale)


def _quantize_blocks(xf: torch.Tensor, bs: Optional[int], name: str = "x"):
    """Block quantization of an fp32 (b, s, h, d) tensor; see :func:`quantize_fp8`."""
    b, s, h, d = xf.shape
    if bs is None:
        if s == 0:
            return xf.to(FP8_DTYPE), torch.ones(b, h, dtype=torch.float32, device=xf.device)
        amax = xf.abs().amax(dim=(1, 3))  # (b, h)
        descale = _descale_from_amax(amax, name)
        scaled = xf / descale[:, None, :, None]
    else:
        nb = -(-s // bs)
        if s == 0:
            return xf.to(FP8_DTYPE), torch.ones(b, h, 0, dtype=torch.float32, device=xf.device)
        pad = nb * bs - s
        xp = torch.nn.functional.pad(xf, (0, 0, 0, 0, 0, pad)) if pad else xf
        xb = xp.reshape(b, nb, bs, h, d)
        amax = xb.abs().amax(dim=(2, 4))  # (b, nb, h)
        descale_bnh = _descale_from_amax(amax, name)
        scaled = (xb / descale_bnh[:, :, None, :, None]).reshape(b, nb * bs, h, d)[:, :s]
        descale = descale_bnh.permute(0, 2, 1).contiguous()  # (b, h, nb)
    return scaled.clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), descale


def k_smoothing_mean(k_rotated: torch.Tensor) -> torch.Tensor:
    """Per-(batch, head) mean over tokens of (rotated) keys: fp32 (b, h, d).

    ``k_rotated`` is (b, s, h, d) -- k after the Hadamard rotation (if any),
    before quantization.  The mean is accumulated in fp32 (any order: the
    result is exact for *any* subtracted vector as long as the same vector
    goes into :func:`smoothing_lse_correction`).  ``s == 0`` gives zeros.
    """
    if not isinstance(k_rotated, torch.Tensor) or k_rotated.dim() != 4:
        raise ValueError("k_rotated must be a 4-D (batch, seqlen, heads, headdim) tensor")
    kf = k_rotated.float()
    if kf.shape[1] == 0:
        return torch.zeros(kf.shape[0], kf.shape[2], kf.shape[3], dtype=torch.float32, device=kf.device)
    return kf.mean(dim=1)


def quantize_fp8(x: torch.Tensor, *, block_size: Optional[int] = 128, hadamard: bool = False,
                 seed: int = 0, smooth: bool = False):
    """Quantize ``x`` (b, s, h, d) to e4m3 with one fp32 descale per block.

    Each block is ``block_size`` consecutive sequence positions of one
    (batch, head) (all ``d`` features).  Returns ``(x_fp8, descale)`` with
    ``descale`` of shape ``(b, h, ceil(s / block_size))`` and
    ``x ~= x_fp8.float() * descale`` (broadcast per block), where
    ``descale = amax(block) / 448`` (1 for an all-zero block) and the scaled
    values are clamped to +-448 before the round-to-nearest cast.
    ``block_size=None`` or ``-1``: one scale per (batch, head) over the whole
    sequence, ``descale`` of shape ``(b, h)`` (FA3's convention).
    ``hadamard=True``: rotate the head dim with
    ``hadamard_transform(x, seed=seed)`` first (use the same seed for q and k;
    do not rotate v).
    ``smooth=True`` (K smoothing, for k only): subtract
    ``mean = k_smoothing_mean(rotated x)`` before quantizing and return
    ``(x_fp8, descale, mean)`` with ``mean`` fp32 (b, h, d), so that
    ``x ~= x_fp8.float() * descale + mean`` (in the rotated basis).
    """
    _check_tensor(x, "x", _INPUT_DTYPES)
    bs = _norm_block(block_size, "block_size")
    if not isinstance(hadamard, bool):
        raise TypeError(f"hadamard must be a bool, got {type(hadamard).__name__}")
    if not isinstance(smooth, bool):
        raise TypeError(f"smooth must be a bool, got {type(smooth).__name__}")
    if not _is_int(seed):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    if x.shape[3] == 0:
        raise ValueError("x must have a non-empty head dim")
    xf = hadamard_transform(x, seed=seed) if hadamard else x.float()
    if smooth:
        if not bool(torch.isfinite(xf).all()):
            raise ValueError("x contains non-finite values (inf/nan) and cannot be quantized to FP8")
        mean = k_smoothing_mean(xf)
        x8, descale = _quantize_blocks(xf - mean[:, None], bs)
        return x8, descale, mean
    return _quantize_blocks(xf, bs)


def _packed_rows(cu_seqlens: torch.Tensor, total: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(sequence, position within it) of each row of a packed tensor; rows past
    ``cu_seqlens[-1]`` (or before ``cu_seqlens[0]``, or placed nowhere by unsorted offsets) get
    sequence b (= the number of sequences), so every index stays in range whatever the offsets
    hold.  Device ops, no host sync."""
    cu = cu_seqlens.to(device=device, dtype=torch.int64)
    b = cu.numel() - 1
    t = torch.arange(total, device=device)
    seq = torch.searchsorted(cu[1:], t, right=True)
    pos = t - cu[seq]
    seq = seq.masked_fill(pos < 0, b)
    return seq, pos.clamp_min(0)


def quantize_fp8_varlen(x: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int, *,
                        block_size: Optional[int] = 128, hadamard: bool = False, seed: int = 0,
                        smooth: bool = False):
    """:func:`quantize_fp8` of packed sequences: x (total, h, d), sequence i rows
    ``cu_seqlens[i]:cu_seqlens[i+1]``, each quantized as :func:`quantize_fp8` quantizes it alone.

    Returns ``(x8, descale)`` (``, mean`` with ``smooth``): x8 e4m3 (total, h, d) (rows past
    ``cu_seqlens[-1]`` become 0), descale (b, h, ceil(max_seqlen / block_size)) with blocks
    counted from each sequence's first row ((b, h) for ``block_size=None``), mean fp32 (b, h, d)
    -- what ``attention_varlen(q8, ...)`` takes.  A sequence longer than ``max_seqlen`` shares its
    last block's scale.  Built from device ops with no host sync (CUDA graphs); on CUDA
    non-finite input is not detected (the caller's contract), on the CPU it raises.
    """
    _check_tensor(x, "x", _INPUT_DTYPES, ndim=3)
    bs = _norm_block(block_size, "block_size")
    if not _is_int(max_seqlen) or max_seqlen < 0:
        raise ValueError(f"max_seqlen must be an int >= 0, got {max_seqlen!r}")
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 1:
        raise ValueError("cu_seqlens must be a 1-D tensor of batch + 1 offsets")
    total, h, d = x.shape
    b = cu_seqlens.numel() - 1
    dev = x.device
    xf = hadamard_transform(x, seed=seed) if hadamard else x.float()
    seq, pos = _packed_rows(cu_seqlens, total, dev)
    xf = xf * (seq < b)[:, None, None]  # rows past the last sequence quantize to 0
    mean = None
    if smooth:  # per-sequence mean over its rows (fp32; any summation order is exact for softmax)
        sums = xf.new_zeros(b + 1, h, d).index_add_(0, seq, xf)
        cnt = xf.new_zeros(b + 1).index_add_(0, seq, torch.ones_like(seq, dtype=xf.dtype))
        mean_all = sums / cnt.clamp_min(1)[:, None, None]
        mean_all[b] = 0
        xf = xf - mean_all[seq]
        mean = mean_all[:b]
    nb = 1 if bs is None else max(1, -(-max_seqlen // bs))
    blk = torch.zeros_like(pos) if bs is None else (pos // bs).clamp_max(nb - 1)
    idx = seq * nb + blk  # (total,) flat (sequence, block)
    amax = xf.new_zeros((b + 1) * nb, h).scatter_reduce_(0, idx[:, None].expand(total, h),
                                                          xf.abs().amax(dim=-1), "amax")
    desc = _descale_from_amax_nosync(amax) if x.is_cuda else _descale_from_amax(amax, "x")
    x8 = (xf / desc[idx][:, :, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    descale = desc.reshape(b + 1, nb, h)[:b].permute(0, 2, 1).contiguous()
    if bs is None:
        descale = descale[..., 0]
    return (x8, descale, mean) if smooth else (x8, descale)


def quantize_v_fp8(v: torch.Tensor, *, block_size: Optional[int] = 128, channel: bool = True,
                   block: bool = True):
    """Quantize v (b, s, h_k, d_v) for the kernel: ``(v8, v_descale, v_channel_descale)``.

    ``v ~= v8.float() * v_descale[block] * v_channel_descale[channel]``:

    * ``channel``: ``v_channel_descale = amax over all tokens of each
      (batch, head, channel) / 448`` (1 for an all-zero channel), shape
      (b, h_k, d_v); otherwise None.
    * ``block``: ``v_descale`` per block of ``block_size`` keys of
      ``v / v_channel_descale`` (exactly :func:`quantize_fp8` when
      ``channel=False``); otherwise ``v_descale`` is all ones of shape (b, h_k).
    """
    _check_tensor(v, "v", _INPUT_DTYPES)
    bs = _norm_block(block_size, "block_size")
    for nm, f in (("channel", channel), ("block", block)):
        if not isinstance(f, bool):
            raise TypeError(f"{nm} must be a bool, got {type(f).__name__}")
    b, s, h, dv = v.shape
    vf = v.float()
    vcd = None
    if channel:
        amax = vf.abs().amax(dim=1) if s else torch.zeros(b, h, dv, device=v.device)
        vcd = _descale_from_amax(amax, "v")  # (b, h, dv)
        vf = vf / vcd[:, None]
    if block:
        v8, vd = _quantize_blocks(vf, bs, "v")
    else:
        if not bool(torch.isfinite(vf).all()):
            raise ValueError("v contains non-finite values (inf/nan) and cannot be quantized to FP8")
        v8 = vf.clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
        vd = torch.ones(b, h, dtype=torch.float32, device=v.device)
    return v8, vd, vcd


V_PERM16 = (0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15)


def _as_bytes(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.uint8) if x.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else x


def pack_v_fp8(v8: torch.Tensor) -> torch.Tensor:
    """Kernel layout of FP8 v: ``vt`` (b, h_k, d_v, s_pad), ``s_pad = ceil(s / 16) * 16``.

    ``vt[b, h, c, 16*g + i] = v8[b, 16*g + V_PERM16[i], h, c]`` (keys
    transposed to be the contiguous dim, permuted within groups of 16 to match
    the register layout of the FP8 P tile in the P@V WGMMA), zero padding past
    ``s``.  ``V_PERM16[i] = 2*(i // 4) + 8*((i // 2) % 2) + i % 2``, so the
    permutation is a reshape/permute (no index tensor, no host sync); float8
    tensors are moved as uint8.  Inverse: :func:`unpack_v_fp8`.
    """
    if not isinstance(v8, torch.Tensor) or v8.dim() != 4:
        raise ValueError("v8 must be a 4-D (batch, seqlen, heads, headdim) tensor")
    b, s, h, dv = v8.shape
    u = _as_bytes(v8)
    s_pad = -(-s // 16) * 16
    if s_pad != s:
        u = torch.cat([u, u.new_zeros(b, s_pad - s, h, dv)], dim=1)
    # token 16*g + 8*j1 + 2*j2 + j3 goes to position 16*g + 4*j2 + 2*j1 + j3
    vt = u.reshape(b, s_pad // 16, 2, 4, 2, h, dv).permute(0, 5, 6, 1, 3, 2, 4).reshape(b, h, dv, s_pad)
    return vt.contiguous().view(v8.dtype) if u is not v8 else vt.contiguous()


def unpack_v_fp8(vt: torch.Tensor, s: int) -> torch.Tensor:
    """Inverse of :func:`pack_v_fp8`: (b, h_k, d_v, s_pad) -> contiguous (b, s, h_k, d_v)."""
    if not isinstance(vt, torch.Tensor) or vt.dim() != 4:
        raise ValueError("vt must be a 4-D (batch, heads, headdim, seqlen_padded) tensor")
    b, h, dv, s_pad = vt.shape
    if not _is_int(s) or s < 0 or s_pad != -(-s // 16) * 16:
        raise ValueError(f"s ({s!r}) does not match the padded length {s_pad}")
    u = _as_bytes(vt)
    v = u.reshape(b, h, dv, s_pad // 16, 4, 2, 2).permute(0, 3, 5, 4, 6, 1, 2).reshape(b, s_pad, h, dv)
    v = v[:, :s].contiguous()
    return v.view(vt.dtype) if u is not vt else v


def varlen_vt_offset(first_key, batch):
    """Column of packed FP8 Vt where sequence ``batch`` (first key ``first_key``) starts.

    A multiple of 16 (the V_PERM16 groups line up with the kernel's key blocks) computed from
    (first_key, batch) alone -- no prefix sum, so no host sync -- with at least
    ``ceil(len / 16) * 16`` columns before the next sequence's.  ``varlen_vt_offset(total_k, b)``
    is the column count.  Ints or integer tensors (elementwise).  Twin of
    csrc/flash3/common/attn_logic.h ``fp8_varlen_vt_offset``.
    """
    return (first_key + 15 * batch + 15) // 16 * 16


def pack_v_fp8_varlen(v8: torch.Tensor, cu_seqlens_k: torch.Tensor) -> torch.Tensor:
    """Kernel layout of packed (varlen) FP8 v: ``vt`` (h_k, d_v, varlen_vt_offset(total_k, b)).

    Sequence i (tokens ``cu_seqlens_k[i]:cu_seqlens_k[i+1]`` of ``v8`` (total_k, h_k, d_v)) is
    laid out as :func:`pack_v_fp8` lays out one batch row, starting at column
    ``varlen_vt_offset(cu_seqlens_k[i], i)``; every other column is zero (finite: the kernel
    multiplies the padding by P = 0).  A gather over the output columns on v8's device: no host
    sync, so it can run inside CUDA graph capture.  v8 must be finite: the kernel's last key tile of
    a sequence also covers the next one's first columns (times P = 0, and 0 * NaN is NaN).
    """
    if not isinstance(v8, torch.Tensor) or v8.dim() != 3:
        raise ValueError("v8 must be a 3-D (total_k, heads, headdim) tensor")
    if not isinstance(cu_seqlens_k, torch.Tensor) or cu_seqlens_k.dim() != 1 or cu_seqlens_k.numel() < 1:
        raise ValueError("cu_seqlens_k must be a 1-D tensor of batch + 1 offsets")
    total, h, dv = v8.shape
    b = cu_seqlens_k.numel() - 1
    dev = v8.device
    cols = varlen_vt_offset(total, b)
    cu = cu_seqlens_k.to(device=dev, dtype=torch.int64)
    starts = varlen_vt_offset(cu[:-1], torch.arange(b, device=dev))  # (b,) first column per sequence
    c = torch.arange(cols, device=dev)
    seq = (torch.searchsorted(starts, c, right=True) - 1).clamp_min(0)  # sequence owning column c
    j = c - starts[seq] if b else c
    r = j % 16  # V_PERM16[r] by its formula (no host-to-device copy: capturable)
    i = j - r + 2 * (r // 4) + 8 * ((r // 2) % 2) + r % 2  # the token (within its sequence) at column c
    lens = cu[1:] - cu[:-1]
    valid = ((j >= 0) & (i < lens[seq])) if b else torch.zeros_like(c, dtype=torch.bool)
    src = torch.where(valid, cu[seq] + i if b else c, torch.zeros_like(c)).clamp(0, max(total - 1, 0))
    u = _as_bytes(v8)
    if total == 0:
        return torch.zeros(h, dv, cols, dtype=v8.dtype, device=dev)
    vt = torch.where(valid[None, None, :], u[src].permute(1, 2, 0), torch.zeros((), dtype=u.dtype, device=dev))
    vt = vt.contiguous()
    return vt.view(v8.dtype) if u is not v8 else vt


def quantize_fp8_per_tensor(x: torch.Tensor, *, num_heads: Optional[int] = None,
                            hadamard: bool = False, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor baseline: one scale ``amax(x) / 448`` for the whole tensor.

    The scalar descale is expanded to FA3's ``(b, num_heads)`` form
    (``num_heads`` defaults to ``x``'s head count; pass the kv head count for
    q under GQA if a consumer needs the strict ``(b, h_k)`` form -- this
    module's kernel accepts either).
    """
    _check_tensor(x, "x", _INPUT_DTYPES)
    if not isinstance(hadamard, bool):
        raise TypeError(f"hadamard must be a bool, got {type(hadamard).__name__}")
    b, s, h, d = x.shape
    if num_heads is None:
        num_heads = h
    if not _is_int(num_heads) or num_heads <= 0:
        raise ValueError(f"num_heads must be a positive int, got {num_heads!r}")
    xf = hadamard_transform(x, seed=seed) if hadamard else x.float()
    amax = xf.abs().amax() if xf.numel() else torch.zeros((), device=x.device)
    descale = _descale_from_amax(amax, "x")
    x8 = (xf / descale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return x8, descale.reshape(1, 1).expand(b, num_heads).contiguous()


def dequantize_fp8(x8: torch.Tensor, descale: torch.Tensor, *, block_size: Optional[int] = 128) -> torch.Tensor:
    """Inverse of :func:`quantize_fp8` (without undoing a Hadamard rotation): fp32 (b, s, h, d)."""
    _check_tensor(x8, "x8", (FP8_DTYPE,))
    b, s, h, d = x8.shape
    bs = _norm_block(block_size, "block_size")
    xf = x8.float()
    if descale.dim() == 2:
        return xf * descale.float()[:, None, :, None]
    if bs is None:
        raise ValueError("block_size must be given for a 3-D (per-block) descale")
    idx = torch.arange(s, device=x8.device) // bs
    return xf * descale.float().permute(0, 2, 1)[:, idx, :, None]


# --------------------------------------------------------------------------
# masking
# --------------------------------------------------------------------------

def _tile_state(r0, r1, c0, c1, s_q, s_k, left, right):
    """'skip' if no (i, j) in the tile is visible, 'full' if all are, else 'partial'."""
    off = s_k - s_q
    if right >= 0 and c0 > (r1 - 1) + off + right:
        return "skip"
    if left >= 0 and (c1 - 1) < r0 + off - left:
        return "skip"
    full = True
    if right >= 0 and (c1 - 1) > r0 + off + right:
        full = False
    if left >= 0 and c0 < (r1 - 1) + off - left:
        full = False
    return "full" if full else "partial"


# --------------------------------------------------------------------------
# tiled kernel emulation
# --------------------------------------------------------------------------

def kernel_tile_n(d: int) -> int:
    """Key tile width ``tile_n`` of the Hopper FP8 forward kernel for head dim ``d``.

    128 keys for ``d <= 64``, 64 keys above: S, P, O and the fresh two-level
    accumulator must fit in a consumer thread's registers (at d = 128, 128
    keys spilled); csrc/flash3/common/attn_logic.h fwd_fp8_tile_shape.
    """
    if not _is_int(d) or d <= 0:
        raise ValueError(f"head dim must be a positive int, got {d!r}")
    return 128 if d <= 64 else 64


def _tiled_core(qf, kf, vf, qd, kd, vd, *, scale, softcap, left, right, br, bn, kblk,
                p_dtype, p_offset_log2, vcd=None):
    """FlashAttention tile loop, key tiles walked from the LAST to the FIRST.

    qf: (b, hk, g, s_q, d) fp32;  kf: (b, hk, 1, s_k, d);  vf: (b, hk, 1, s_k, dv).
    qd: (b, hk, g, ceil(s_q / br)) or None (query tiles are ``br`` rows: rows are
    independent, so the tile height only decides the q descale granularity).
    kd, vd: (b, hk, 1, ceil(s_k / kblk)) or None, one descale per ``kblk`` keys;
    key tiles are ``bn`` keys with ``kblk % bn == 0`` (each tile lies in one
    descale block).  Tiles start at multiples of ``bn``; the last one may be short.
    vcd: (b, hk, 1, 1, dv) or None, applied to the output columns at the end.
    P is rounded to ``p_dtype`` before the PV product (None = no rounding).
    Returns out (b, hk, g, s_q, dv) fp32 and lse (b, hk, g, s_q) fp32.
    """
    assert kblk % bn == 0, (kblk, bn)
    b, hk, g, s_q, d = qf.shape
    s_k = kf.shape[3]
    dv = vf.shape[-1]
    dev = qf.device
    out = torch.zeros(b, hk, g, s_q, dv, dtype=torch.float32, device=dev)
    lse = torch.full((b, hk, g, s_q), -math.inf, dtype=torch.float32, device=dev)
    offset = float(p_offset_log2)
    key_tiles = list(range(0, s_k, bn))[::-1]  # descending, as the kernel walks them
    for qi, r0 in enumerate(range(0, s_q, br)):
        r1 = min(r0 + br, s_q)
        qt = qf[:, :, :, r0:r1]
        m = torch.full((b, hk, g, r1 - r0), -math.inf, dtype=torch.float32, device=dev)
        l = torch.zeros_like(m)
        acc = torch.zeros(b, hk, g, r1 - r0, dv, dtype=torch.float32, device=dev)
        for c0 in key_tiles:
            c1 = min(c0 + bn, s_k)
            kj = c0 // kblk  # descale block of this tile
            state = _tile_state(r0, r1, c0, c1, s_q, s_k, left, right)
            if state == "skip":
                continue
            s_tile = torch.matmul(qt, kf[:, :, :, c0:c1].transpose(-1, -2))  # (b, hk, g, R, C)
            mult = torch.full((), scale, dtype=torch.float32, device=dev)
            if qd is not None:
                mult = mult * qd[..., qi]
            if kd is not None:
                mult = mult * kd[..., kj]
            s_tile = s_tile * (mult[..., None, None] if mult.dim() else mult)
            if softcap > 0.0:
                s_tile = torch.tanh(s_tile / softcap) * softcap
            if state == "partial":
                vis = visible_mask(r0, r1, c0, c1, s_q, s_k, False, left, right, device=dev)
                s_tile = s_tile.masked_fill(~vis, -math.inf)
            m_new = torch.maximum(m, s_tile.amax(dim=-1))
            m_safe = torch.where(m_new == -math.inf, torch.zeros_like(m_new), m_new)
            # exp2 domain: P = exp2(S*log2e - m*log2e + offset), evaluated as
            # (S - m)*log2e + offset so that the row max maps to exactly 2^offset.
            p = torch.exp2((s_tile - m_safe[..., None]) * _LOG2E + offset)
            alpha = torch.exp2((m - m_safe) * _LOG2E)  # m=-inf -> 0 (acc, l are 0 anyway)
            l = l * alpha + p.sum(dim=-1)  # row sums from the UNROUNDED fp32 P
            if p_dtype is not None:
                p = p.to(p_dtype).float()
            pv = torch.matmul(p, vf[:, :, :, c0:c1])
            if vd is not None:
                pv = pv * vd[..., kj][..., None, None]
            acc = acc * alpha[..., None] + pv
            m = m_new
        has = l > 0
        l_safe = torch.where(has, l, torch.ones_like(l))
        o = acc / l_safe[..., None]
        if vcd is not None:
            o = o * vcd
        out[:, :, :, r0:r1] = torch.where(has[..., None], o, torch.zeros_like(acc))
        lse[:, :, :, r0:r1] = torch.where(has, m + torch.log(l_safe) - offset * _LN2,
                                          torch.full_like(m, -math.inf))
    return out, lse


def _descale_blocks(desc, name, *, b, heads_ok, hk, g, s, blk, is_q, device):
    """Normalize a descale to (b, hk, g|1, n_blocks) fp32 (None stays None)."""
    if desc is None:
        return None
    if not isinstance(desc, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None, got {type(desc).__name__}")
    if not desc.is_floating_point() or desc.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        raise TypeError(f"{name} must be a float32 (or fp16/bf16/fp64) tensor, got {desc.dtype}")
    nb = -(-s // blk)
    d = desc.to(device=device, dtype=torch.float32)
    gq = g if is_q else 1
    if d.dim() == 2 and d.shape[0] == b and d.shape[1] in heads_ok:
        if d.shape[1] == hk:
            return d.reshape(b, hk, 1, 1).expand(b, hk, gq, nb)
        return d.reshape(b, hk, g, 1).expand(b, hk, g, nb)
    if d.dim() == 3 and d.shape[0] == b and d.shape[1] in heads_ok and d.shape[2] == nb:
        if d.shape[1] == hk:
            return d.reshape(b, hk, 1, nb).expand(b, hk, gq, nb)
        return d.reshape(b, hk, g, nb)
    forms = " or ".join(f"({b}, {hh})" for hh in sorted(set(heads_ok)))
    forms += " or " + " or ".join(f"({b}, {hh}, {nb})" for hh in sorted(set(heads_ok)))
    raise ValueError(f"{name} must have shape {forms} (per (batch, head) or per block of {blk} "
                     f"rows), got {tuple(desc.shape)}")


def _check_qkv(q, k, v, dtypes):
    _check_tensor(q, "q", dtypes)
    _check_tensor(k, "k", dtypes)
    _check_tensor(v, "v", dtypes)
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


def _key_tiling(block_c, tile_n, d):
    """(descale block, key tile) for the emulation; see fp8_attention_reference."""
    if tile_n is None:
        tile = kernel_tile_n(d)
        if block_c is not None and block_c % tile:
            tile = math.gcd(block_c, tile)  # not a kernel configuration: finer tiles
    else:
        if not _is_int(tile_n) or tile_n <= 0:
            raise ValueError(f"tile_n must be a positive int or None, got {tile_n!r}")
        tile = tile_n
    if block_c is None:
        return tile, tile
    if block_c % tile:
        raise ValueError(f"block_size[1] (the k/v descale block, {block_c}) must be a multiple of "
                         f"tile_n ({tile})")
    return block_c, tile


def _channel_descale(vcd, *, b, hk, dv, device):
    if vcd is None:
        return None
    if not isinstance(vcd, torch.Tensor):
        raise TypeError(f"v_channel_descale must be a torch.Tensor or None, got {type(vcd).__name__}")
    if not vcd.is_floating_point() or vcd.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        raise TypeError(f"v_channel_descale must be a float32 (or fp16/bf16/fp64) tensor, got {vcd.dtype}")
    if tuple(vcd.shape) != (b, hk, dv):
        raise ValueError(f"v_channel_descale must have shape {(b, hk, dv)} (batch, kv head, v channel), "
                         f"got {tuple(vcd.shape)}")
    return vcd.to(device=device, dtype=torch.float32).reshape(b, hk, 1, 1, dv)


def fp8_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            q_descale: Optional[torch.Tensor] = None,
                            k_descale: Optional[torch.Tensor] = None,
                            v_descale: Optional[torch.Tensor] = None, *,
                            softmax_scale: Optional[float] = None, causal: bool = False,
                            window_left: int = -1, window_right: int = -1, softcap: float = 0.0,
                            block_size=(128, 128), tile_n: Optional[int] = None,
                            v_channel_descale: Optional[torch.Tensor] = None,
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Emulate the Hopper FP8 forward kernel (see the module docstring).

    ``q``, ``k``, ``v`` are ``float8_e4m3fn`` of shape (b, s, h|h_k, d).
    Descales (``None`` = 1) are either per (batch, head) -- ``(b, h_k)``, FA3's
    convention also for q; ``(b, h_q)`` is accepted for q as well -- or per
    block: ``(b, h, ceil(s / B))`` with ``B = block_size[0]`` (B_r; q accepts
    ``h = h_q`` or ``h_k``) for q and ``B = block_size[1]`` (B_c, ``h = h_k``)
    for k and v.  ``block_size`` entries of ``None``/-1 mean 128.
    ``v_channel_descale``: optional ``(b, h_k, d_v)`` scale of v's channels,
    applied to the output columns at the end (``v = v8 * v_descale[block] *
    v_channel_descale[channel]``).

    Tiling: query rows are independent (the tile height does not change the
    result); keys are processed in tiles of ``tile_n`` keys from the last tile
    to the first.  ``tile_n=None`` is the kernel's :func:`kernel_tile_n` (128
    for d <= 128, 64 above), reduced to ``gcd(B_c, tile_n)`` when ``B_c`` is
    not a multiple of it (a configuration the kernel does not run).  An
    explicit ``tile_n`` must divide ``B_c``.
    Returns ``(out, lse)``: out fp32 (b, s_q, h_q, d_v), lse fp32 (b, h_q, s_q).
    """
    _check_qkv(q, k, v, (FP8_DTYPE,))
    b, s_q, h, d = q.shape
    s_k, hk, dv = k.shape[1], k.shape[2], v.shape[3]
    g = h // hk
    br, bc = _norm_block_pair(block_size)
    br = 128 if br is None else br
    bc = 128 if bc is None else bc
    kblk, bn = _key_tiling(bc, tile_n, d)
    scale, softcap = _check_scale_softcap(softmax_scale, softcap, d)
    left, right = _check_window(window_left, window_right, causal)
    dev = q.device
    qd = _descale_blocks(q_descale, "q_descale", b=b, heads_ok=(hk, h), hk=hk, g=g, s=s_q, blk=br,
                         is_q=True, device=dev)
    kd = _descale_blocks(k_descale, "k_descale", b=b, heads_ok=(hk,), hk=hk, g=g, s=s_k, blk=kblk,
                         is_q=False, device=dev)
    vd = _descale_blocks(v_descale, "v_descale", b=b, heads_ok=(hk,), hk=hk, g=g, s=s_k, blk=kblk,
                         is_q=False, device=dev)
    vcd = _channel_descale(v_channel_descale, b=b, hk=hk, dv=dv, device=dev)
    qf = q.float().permute(0, 2, 1, 3).reshape(b, hk, g, s_q, d)
    kf = k.float().permute(0, 2, 1, 3).unsqueeze(2)
    vf = v.float().permute(0, 2, 1, 3).unsqueeze(2)
    out, lse = _tiled_core(qf, kf, vf, qd, kd, vd, scale=scale, softcap=softcap, left=left, right=right,
                           br=br, bn=bn, kblk=kblk, p_dtype=FP8_DTYPE, p_offset_log2=P_MAX_OFFSET_LOG2,
                           vcd=vcd)
    out = out.reshape(b, h, s_q, dv).permute(0, 2, 1, 3).contiguous()
    return out, lse.reshape(b, h, s_q)


def fp8_attention_varlen_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                   cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                                   q_descale: Optional[torch.Tensor] = None,
                                   k_descale: Optional[torch.Tensor] = None,
                                   v_descale: Optional[torch.Tensor] = None, *,
                                   max_seqlen_q: Optional[int] = None, max_seqlen_k: Optional[int] = None,
                                   v_channel_descale: Optional[torch.Tensor] = None, **kwargs,
                                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`fp8_attention_reference` over packed sequences, as the kernel's varlen mode runs it.

    q (total_q, h, d), k (total_k, h_k, d), v (total_k, h_k, d_v) e4m3; sequence i is rows
    ``cu_seqlens[i]:cu_seqlens[i+1]``.  Descales are indexed by sequence: ``(b, heads)`` per
    head, or ``(b, heads, ceil(max_seqlen / B))`` with blocks counted from each sequence's first
    row (``max_seqlen_*`` default to the longest sequence).  ``v_channel_descale`` (b, h_k, d_v).
    Other keywords as :func:`fp8_attention_reference`.  Reads cu_seqlens on the host (the
    emulation syncs; the kernel does not).  Returns out fp32 (total_q, h, d_v), lse fp32
    (h, total_q); rows past ``cu_seqlens_q[-1]`` get out 0 and lse -inf.
    """
    for n, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 3:
            raise ValueError(f"{n} must be a 3-D (total, heads, headdim) tensor")
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    b = len(cq) - 1
    lq = [e - a for a, e in zip(cq, cq[1:])]
    lk = [e - a for a, e in zip(ck, ck[1:])]
    mq = max(lq, default=0) if max_seqlen_q is None else max_seqlen_q
    mk = max(lk, default=0) if max_seqlen_k is None else max_seqlen_k
    h, dv = q.shape[1], v.shape[2]
    out = torch.zeros(q.shape[0], h, dv, dtype=torch.float32, device=q.device)
    lse = torch.full((h, q.shape[0]), -math.inf, dtype=torch.float32, device=q.device)
    br, bc = _norm_block_pair(kwargs.get("block_size", (128, 128)))
    blocks = {"q": br or 128, "k": bc or 128, "v": bc or 128}
    maxlen = {"q": mq, "k": mk, "v": mk}

    def one(desc, name, i, n):
        if desc is None or desc.dim() == 2:
            return None if desc is None else desc[i:i + 1]
        nb = -(-maxlen[name] // blocks[name])
        if desc.dim() != 3 or desc.shape[0] != b or desc.shape[2] != nb:
            raise ValueError(f"{name}_descale must be (b, heads) or (b, heads, {nb}) for varlen, got "
                             f"{tuple(desc.shape)}")
        return desc[i:i + 1, :, :-(-n // blocks[name])]

    for i in range(b):
        if lq[i] == 0:
            continue
        qi = q[cq[i]:cq[i + 1]][None]
        ki, vi = k[ck[i]:ck[i + 1]][None], v[ck[i]:ck[i + 1]][None]
        vcd = None if v_channel_descale is None else v_channel_descale[i:i + 1]
        o, l_ = fp8_attention_reference(qi, ki, vi, one(q_descale, "q", i, lq[i]), one(k_descale, "k", i, lk[i]),
                                        one(v_descale, "v", i, lk[i]), v_channel_descale=vcd, **kwargs)
        out[cq[i]:cq[i + 1]] = o[0]
        lse[:, cq[i]:cq[i + 1]] = l_[0]
    return out, lse


def _window_pair(window_size):
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2:
        raise TypeError(f"window_size must be a (left, right) pair, got {window_size!r}")
    return window_size[0], window_size[1]


def smoothing_lse_correction(q_rotated: torch.Tensor, k_mean: torch.Tensor,
                             softmax_scale: float) -> torch.Tensor:
    """``softmax_scale * (q . mean_k)`` per (b, h_q, row): the lse shift of K smoothing.

    ``q_rotated``: (b, s_q, h_q, d) -- the q that was quantized (after the
    Hadamard rotation, before quantization), ``k_mean``: (b, h_k, d) from
    :func:`k_smoothing_mean`.  Computed in fp32.  Scores of smoothed keys are
    ``q.(k - mean_k)``, so the kernel's lse is the true lse minus this; add it.
    """
    b, s_q, h, d = q_rotated.shape
    hk = k_mean.shape[1]
    qf = q_rotated.float().permute(0, 2, 1, 3).reshape(b, hk, h // hk, s_q, d)
    corr = torch.matmul(qf, k_mean.float().reshape(b, hk, 1, d, 1)).squeeze(-1)
    return (corr * float(softmax_scale)).reshape(b, h, s_q)


V_SCALES = ("block", "channel", "block+channel")


def attention_fp8(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                  softmax_scale: Optional[float] = None, window_size=(-1, -1), softcap: float = 0.0,
                  hadamard: bool = True, block_size=(64, 128), smooth_k: Optional[bool] = None,
                  v_scale: str = "block+channel", seed: int = 0, tile_n: Optional[int] = None,
                  return_lse: bool = False):
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
    _check_qkv(q, k, v, _INPUT_DTYPES)
    if not isinstance(hadamard, bool):
        raise TypeError(f"hadamard must be a bool, got {type(hadamard).__name__}")
    if not isinstance(return_lse, bool):
        raise TypeError(f"return_lse must be a bool, got {type(return_lse).__name__}")
    if not _is_int(seed):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    if smooth_k is not None and not isinstance(smooth_k, bool):
        raise TypeError(f"smooth_k must be a bool or None, got {type(smooth_k).__name__}")
    if v_scale not in V_SCALES:
        raise ValueError(f"v_scale must be one of {V_SCALES}, got {v_scale!r}")
    left, right = _window_pair(window_size)
    _check_window(left, right, causal)
    br, bc = _norm_block_pair(block_size)
    scale, softcap = _check_scale_softcap(softmax_scale, softcap, q.shape[-1])
    if smooth_k is None:
        smooth_k = softcap == 0.0
    elif smooth_k and softcap > 0.0:
        raise ValueError("smooth_k=True is not exact with softcap > 0 (tanh does not commute with the "
                         "per-row score shift); use smooth_k=None or False")
    if q.is_cuda:
        fast = _attention_fp8_cuda(q, k, v, scale=scale, left=left, right=right, softcap=softcap,
                                   hadamard=hadamard, br=br, bc=bc, smooth_k=smooth_k, v_scale=v_scale,
                                   seed=seed, tile_n=tile_n)
        if fast is not None:
            out, lse = fast
            return (out.to(q.dtype), lse) if return_lse else out.to(q.dtype)
    kblk, bn = _key_tiling(bc or 128, tile_n, q.shape[-1])
    q8, qd = quantize_fp8(q, block_size=br, hadamard=hadamard, seed=seed)
    if smooth_k:
        k8, kd, k_mean = quantize_fp8(k, block_size=bc, hadamard=hadamard, seed=seed, smooth=True)
    else:
        k8, kd = quantize_fp8(k, block_size=bc, hadamard=hadamard, seed=seed)
    v8, vd, vcd = quantize_v_fp8(v, block_size=bc, channel=v_scale != "block",
                                 block=v_scale != "channel")
    out, lse = fp8_attention_reference(q8, k8, v8, qd, kd, vd, softmax_scale=scale, causal=causal,
                                       window_left=left, window_right=right, softcap=softcap,
                                       block_size=(br or 128, kblk), tile_n=bn, v_channel_descale=vcd)
    if smooth_k and return_lse:
        q_rot = hadamard_transform(q, seed=seed) if hadamard else q.float()
        lse = lse + smoothing_lse_correction(q_rot, k_mean, scale)
    out = out.to(q.dtype)
    return (out, lse) if return_lse else out


def _attention_fp8_cuda(q, k, v, *, scale, left, right, softcap, hadamard, br, bc, smooth_k, v_scale,
                        seed, tile_n):
    """attention_fp8 on Hopper: the quantize kernel (q, k rows; v transposed and permuted for the
    attention kernel) then the FP8 attention kernel, the same algorithm as the emulation and no
    host synchronization. None when the kernels cannot take this call (the caller emulates)."""
    from . import _backend, _quantize

    if (q.dtype not in (torch.float16, torch.bfloat16) or k.dtype != q.dtype or v.dtype != q.dtype
            or br is None or bc is None or v_scale == "channel" or not _quantize.available()
            or tile_n not in (None, kernel_tile_n(max(q.shape[-1], v.shape[-1])))
            or _backend.fp8_kernel_reason(q, k, v, scale, br, bc) is not None):
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
    vt, vd = _quantize.quantize_fp8_cuda(v, block_size=bc, channel_descale=vcd, layout="v_packed")
    out, lse = _backend.run_kernel_fwd_fp8(q8, k8, v, qd, kd, vd, scale, left, right, softcap, br, bc,
                                           v_channel_descale=vcd, vt=vt)
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
    from .api import attention_varlen

    for n, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(t, n, _INPUT_DTYPES, ndim=3)
    if v_scale not in V_SCALES:
        raise ValueError(f"v_scale must be one of {V_SCALES}, got {v_scale!r}")
    if not isinstance(hadamard, bool):
        raise TypeError(f"hadamard must be a bool, got {type(hadamard).__name__}")
    left, right = _window_pair(window_size)
    scale, softcap = _check_scale_softcap(softmax_scale, softcap, q.shape[-1])
    if smooth_k is None:
        smooth_k = softcap == 0.0
    elif smooth_k and softcap > 0.0:
        raise ValueError("smooth_k=True is not exact with softcap > 0; use smooth_k=None or False")
    br, bc = _norm_block_pair(block_size)
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


def _descale_from_amax_nosync(amax: torch.Tensor) -> torch.Tensor:
    """_descale_from_amax without its finiteness check (a host sync): the CUDA path's contract is
    finite input."""
    descale = torch.clamp_min(amax / FP8_MAX, torch.finfo(torch.float32).tiny)
    return torch.where(amax == 0, torch.ones_like(descale), descale)


def attention_tiled_lowp(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                         softmax_scale: Optional[float] = None, window_size=(-1, -1), softcap: float = 0.0,
                         block_size=(128, 128), round_p: bool = True, return_lse: bool = False):
    """FlashAttention-style fp16/bf16 numerics (the non-FP8 comparison point).

    Inputs must be fp16 or bf16 (they are used as-is, i.e. already rounded to
    that dtype).  Scores and softmax are fp32 with online rescaling, P is
    rounded to the input dtype for the P@V GEMM (as FA2/FA3 do; ``round_p=False``
    keeps it fp32, i.e. exact fp32 attention on rounded inputs), accumulation
    is fp32, the output is rounded to the input dtype.
    """
    if not isinstance(round_p, bool):
        raise TypeError(f"round_p must be a bool, got {type(round_p).__name__}")
    _check_qkv(q, k, v, (torch.float16, torch.bfloat16))
    if q.dtype != k.dtype or q.dtype != v.dtype:
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    b, s_q, h, d = q.shape
    s_k, hk, dv = k.shape[1], k.shape[2], v.shape[3]
    g = h // hk
    left, right = _window_pair(window_size)
    left, right = _check_window(left, right, causal)
    br, bc = _norm_block_pair(block_size)
    scale, softcap = _check_scale_softcap(softmax_scale, softcap, d)
    qf = q.float().permute(0, 2, 1, 3).reshape(b, hk, g, s_q, d)
    kf = k.float().permute(0, 2, 1, 3).unsqueeze(2)
    vf = v.float().permute(0, 2, 1, 3).unsqueeze(2)
    out, lse = _tiled_core(qf, kf, vf, None, None, None, scale=scale, softcap=softcap, left=left,
                           right=right, br=br or 128, bn=bc or 128, kblk=bc or 128,
                           p_dtype=q.dtype if round_p else None, p_offset_log2=0)
    out = out.reshape(b, h, s_q, dv).permute(0, 2, 1, 3).to(q.dtype)
    lse = lse.reshape(b, h, s_q)
    return (out, lse) if return_lse else out


def attention_fp64_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                             softmax_scale: Optional[float] = None, window_size=(-1, -1),
                             softcap: float = 0.0, q_chunk: int = 1024):
    """Ground truth for accuracy measurements: plain softmax attention in float64.

    Any float input dtype (float8 included: its values are taken as-is).
    Returns ``(out, lse)`` in float64: (b, s_q, h, d_v) and (b, h, s_q);
    rows that see no key get 0 and -inf.  Chunked over query rows and heads.
    """
    for nm, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise TypeError(f"{nm} must be a floating-point tensor")
        if t.dim() != 4:
            raise ValueError(f"{nm} must be 4-D, got shape {tuple(t.shape)}")
    b, s_q, h, d = q.shape
    s_k, hk, dv = k.shape[1], k.shape[2], v.shape[3]
    if hk == 0 or h % hk:
        raise ValueError(f"number of q heads ({h}) must be a multiple of the number of k/v heads ({hk})")
    g = h // hk
    left, right = _window_pair(window_size)
    left, right = _check_window(left, right, causal)
    scale, softcap = _check_scale_softcap(softmax_scale, softcap, d)
    qd = q.to(torch.float64)
    kd = k.to(torch.float64)
    vd = v.to(torch.float64)
    out = torch.zeros(b, s_q, h, dv, dtype=torch.float64, device=q.device)
    lse = torch.full((b, h, s_q), -math.inf, dtype=torch.float64, device=q.device)
    for hh in range(h):
        kh = kd[:, :, hh // g]  # (b, s_k, d)
        vh = vd[:, :, hh // g]
        for r0 in range(0, s_q, q_chunk):
            r1 = min(r0 + q_chunk, s_q)
            s = torch.einsum("bid,bjd->bij", qd[:, r0:r1, hh], kh) * scale
            if softcap > 0:
                s = torch.tanh(s / softcap) * softcap
            vis = visible_mask(r0, r1, 0, s_k, s_q, s_k, False, left, right, device=q.device)
            s = s.masked_fill(~vis, -math.inf)
            mx = s.amax(dim=-1, keepdim=True)
            has = torch.isfinite(mx)
            mx = torch.where(has, mx, torch.zeros_like(mx))
            e = torch.exp(s - mx)
            ssum = e.sum(dim=-1, keepdim=True)
            ssum_safe = torch.where(has, ssum, torch.ones_like(ssum))
            o = torch.einsum("bij,bjd->bid", e / ssum_safe, vh)
            out[:, r0:r1, hh] = torch.where(has, o, torch.zeros_like(o))
            lse[:, hh, r0:r1] = torch.where(has, mx + torch.log(ssum_safe),
                                            torch.full_like(mx, -math.inf)).squeeze(-1)
    return out, lse
