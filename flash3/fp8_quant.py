"""FP8 (e4m3) quantization and the FP8 kernel's operand layout.

The one home of what the kernel path (flash3._backend, flash3.fp8) and the kernel's emulation
(flash3.reference.fp8) share; flash3.fp8 re-exports the public names.

Quantization: ``x ~= x8.float() * descale`` with one fp32 descale per block of tokens of a
(batch, head), optionally after the randomized Hadamard rotation (:mod:`flash3.hadamard`) and,
for k, K smoothing; batched (b, s, h, d) or packed (total, h, d) sequences.  Kernel operands: the
key tile width (:func:`kernel_tile_n`) and V transposed and permuted for the P@V WGMMA
(:func:`pack_v_fp8`, :func:`pack_v_fp8_varlen`).
"""

from __future__ import annotations

from typing import Optional

import torch

from . import _checks
from .hadamard import hadamard_transform

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0
INPUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _amax_over_fp8_max(amax: torch.Tensor) -> torch.Tensor:
    """amax / 448, correctly rounded on every device. A Python-scalar divisor is not: PyTorch's CUDA
    division multiplies by the scalar's reciprocal (one ulp off, seen on an H200 against the kernels,
    which divide), so the definition would depend on the device. A tensor divisor divides."""
    return amax / torch.full_like(amax, FP8_MAX)


def _descale_from_amax(amax: torch.Tensor, name: str) -> torch.Tensor:
    if not bool(torch.isfinite(amax).all()):
        raise ValueError(f"{name} contains non-finite values (inf/nan) and cannot be quantized to FP8")
    descale = _amax_over_fp8_max(amax)
    # amax == 0 -> descale 1 (all-zero block); tiny amax -> keep descale normal
    # so that x / descale never overflows or divides by zero.
    descale = torch.clamp_min(descale, torch.finfo(torch.float32).tiny)
    return torch.where(amax == 0, torch.ones_like(descale), descale)


def _descale_from_amax_nosync(amax: torch.Tensor) -> torch.Tensor:
    """_descale_from_amax without its finiteness check (a host sync): the CUDA path's contract is
    finite input."""
    descale = torch.clamp_min(_amax_over_fp8_max(amax), torch.finfo(torch.float32).tiny)
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
    _checks.typed_tensor(x, "x", INPUT_DTYPES)
    bs = _checks.quant_block(block_size, "block_size")
    _checks.flag("hadamard", hadamard)
    _checks.flag("smooth", smooth)
    if not _checks.is_int(seed):
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


SEGMENT_SUM_CHUNK = 64


def _segment_sum(x: torch.Tensor, offsets: torch.Tensor, chunk: int = SEGMENT_SUM_CHUNK) -> torch.Tensor:
    """Sums of the rows ``offsets[i]:offsets[i + 1]`` of ``x`` (n, ...): (len(offsets) - 1, ...).

    One order on every device, run to run: a ``chunk``-ary tree aligned on each segment's first
    row -- the rows summed in order in chunks of ``chunk`` (``((0 + r0) + r1) + ...``), those sums
    again in chunks of ``chunk``, ..., until one is left -- so a segment's sum depends only on its
    own rows (not on where it is packed or on its neighbours). Built from ``torch.segment_reduce``
    with offsets, which sums each (segment, element) sequentially in one thread on CUDA and in one
    loop on the CPU: no atomics (``index_add_``/``scatter_add_`` on CUDA add in arrival order), no
    host sync, no data-dependent shape (CUDA graphs). The chunk levels keep the CUDA threads'
    serial loops short (a single level would walk a whole long sequence in one thread).
    ``offsets``: int64 on x's device, nondecreasing, within [0, n] -- not checked (the caller
    sanitizes: segment_reduce reads what the offsets say)."""
    if x.dim() == 1:  # segment_reduce sums 1-D data with CUB's segmented tree on CUDA: another order
        return _segment_sum(x[:, None], offsets, chunk)[:, 0]
    nseg = offsets.numel() - 1
    n = x.shape[0]
    if nseg <= 0 or x.numel() == 0:
        return x.new_zeros(max(nseg, 0), *x.shape[1:])
    bound = n  # the longest a segment can be, in rows of the current level
    while bound > chunk:
        ext = torch.cat([offsets, offsets.new_full((1,), n)])  # + the rows after the last segment
        nch = (ext[1:] - ext[:-1] + (chunk - 1)) // chunk  # chunks per segment
        ends = torch.cumsum(nch, 0)  # integer: exact
        nc = n // chunk + nseg + 1  # >= ends[-1], static: chunks past ends[-1] are empty, at n
        k = torch.arange(nc, device=x.device)
        seg = torch.searchsorted(ends, k, right=True)  # the segment of chunk k (nseg + 1: none)
        s = seg.clamp_max(nseg)
        start = ext[s] + (k - (ends - nch)[s]) * chunk
        start = torch.where(seg <= nseg, start, torch.full_like(start, n))
        x = torch.segment_reduce(x, "sum", offsets=torch.cat([start, start.new_full((1,), n)]),
                                 axis=0, unsafe=True)
        offsets = torch.cat([ends.new_zeros(1), ends[:nseg]])  # segment i: its chunks' sums
        n, bound = nc, -(-bound // chunk)
    return torch.segment_reduce(x, "sum", offsets=offsets, axis=0, unsafe=True)


def quantize_fp8_varlen(x: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int, *,
                        block_size: Optional[int] = 128, hadamard: bool = False, seed: int = 0,
                        smooth: bool = False):
    """:func:`quantize_fp8` of packed sequences: x (total, h, d), sequence i rows
    ``cu_seqlens[i]:cu_seqlens[i+1]``, each quantized as :func:`quantize_fp8` quantizes it alone.

    Returns ``(x8, descale)`` (``, mean`` with ``smooth``): x8 e4m3 (total, h, d) (rows past
    ``cu_seqlens[-1]`` become 0), descale (b, h, ceil(max_seqlen / block_size)) with blocks
    counted from each sequence's first row ((b, h) for ``block_size=None``), mean fp32 (b, h, d)
    -- what ``attention_varlen(q8, ...)`` takes.  A sequence longer than ``max_seqlen`` shares its
    last block's scale.  Built from device ops with no host sync (CUDA graphs) and no atomic
    sums (the same bits in every call; the mean is :func:`_segment_sum`'s fixed order on every
    device, and the block amax a max, exact in any order); on CUDA non-finite input is not
    detected (the caller's contract), on the CPU it raises.
    """
    _checks.typed_tensor(x, "x", INPUT_DTYPES, ndim=3)
    bs = _checks.quant_block(block_size, "block_size")
    if not _checks.is_int(max_seqlen) or max_seqlen < 0:
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
    if smooth:  # per-sequence mean over its rows, fp32 (any vector is exact for softmax; this one is
        # summed in _segment_sum's fixed order: the same bits run to run and on every device -- not
        # index_add_, whose CUDA atomics add in arrival order). Offsets clamped into [0, total] and
        # made nondecreasing, so that bad ones (not validated) still address only x's rows; for valid
        # ones sequence i's segment is exactly its rows (those _packed_rows gives sequence i).
        off = torch.cummax(cu_seqlens.to(device=dev, dtype=torch.int64).clamp(0, total), 0).values
        cnt = (off[1:] - off[:-1]).to(xf.dtype)
        mean = _segment_sum(xf, off) / cnt.clamp_min(1)[:, None, None]
        xf = xf - torch.cat([mean, mean.new_zeros(1, h, d)])[seq]  # rows of no sequence: 0
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
    _checks.typed_tensor(v, "v", INPUT_DTYPES)
    bs = _checks.quant_block(block_size, "block_size")
    _checks.flag("channel", channel)
    _checks.flag("block", block)
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


def quantize_fp8_per_tensor(x: torch.Tensor, *, num_heads: Optional[int] = None,
                            hadamard: bool = False, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor baseline: one scale ``amax(x) / 448`` for the whole tensor.

    The scalar descale is expanded to FA3's ``(b, num_heads)`` form
    (``num_heads`` defaults to ``x``'s head count; pass the kv head count for
    q under GQA if a consumer needs the strict ``(b, h_k)`` form -- this
    module's kernel accepts either).
    """
    _checks.typed_tensor(x, "x", INPUT_DTYPES)
    _checks.flag("hadamard", hadamard)
    b, s, h, d = x.shape
    if num_heads is None:
        num_heads = h
    if not _checks.is_int(num_heads) or num_heads <= 0:
        raise ValueError(f"num_heads must be a positive int, got {num_heads!r}")
    xf = hadamard_transform(x, seed=seed) if hadamard else x.float()
    amax = xf.abs().amax() if xf.numel() else torch.zeros((), device=x.device)
    descale = _descale_from_amax(amax, "x")
    x8 = (xf / descale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return x8, descale.reshape(1, 1).expand(b, num_heads).contiguous()


def dequantize_fp8(x8: torch.Tensor, descale: torch.Tensor, *, block_size: Optional[int] = 128) -> torch.Tensor:
    """Inverse of :func:`quantize_fp8` (without undoing a Hadamard rotation): fp32 (b, s, h, d)."""
    _checks.typed_tensor(x8, "x8", (FP8_DTYPE,))
    b, s, h, d = x8.shape
    bs = _checks.quant_block(block_size, "block_size")
    xf = x8.float()
    if descale.dim() == 2:
        return xf * descale.float()[:, None, :, None]
    if bs is None:
        raise ValueError("block_size must be given for a 3-D (per-block) descale")
    idx = torch.arange(s, device=x8.device) // bs
    return xf * descale.float().permute(0, 2, 1)[:, idx, :, None]


# --------------------------------------------------------------------------
# the FP8 kernel's operands: key tile width, packed V
# --------------------------------------------------------------------------

def kernel_tile_n(d: int, attention_chunk: int = 0, fast_accum: bool = False) -> int:
    """Key tile width ``tile_n`` of the Hopper FP8 forward kernel for head dim ``d``.

    128 keys for ``d <= 128``, 64 keys above: S, P, O and the fresh two-level
    accumulator must fit in a consumer thread's registers (at d = 128 the P.V
    runs in two 64-column chunks to make room for 128 keys; at d = 256, O alone
    takes 128 registers); csrc/flash3/common/attn_logic.h fwd_fp8_tile_shape.
    With an ``attention_chunk`` (> 0), 32 keys above d = 128 (the chunk's bounds
    spilled on 64: fwd_fp8_chunk_tile_shape).  With ``fast_accum`` (no fresh accumulator, no
    chunk), 128 keys at every head dim (fwd_fp8_fast_tile_shape).
    """
    if not _checks.is_int(d) or d <= 0:
        raise ValueError(f"head dim must be a positive int, got {d!r}")
    if fast_accum:
        return 128
    if attention_chunk > 0 and d > 128:
        return 32
    return 128 if d <= 128 else 64


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
    if not _checks.is_int(s) or s < 0 or s_pad != -(-s // 16) * 16:
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


def pack_v_fp8_varlen(v8: torch.Tensor, cu_seqlens_k: torch.Tensor,
                      seqused_k: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Kernel layout of packed (varlen) FP8 v: ``vt`` (h_k, d_v, varlen_vt_offset(total_k, b)).

    Sequence i (tokens ``cu_seqlens_k[i]:cu_seqlens_k[i+1]`` of ``v8`` (total_k, h_k, d_v)) is
    laid out as :func:`pack_v_fp8` lays out one batch row, starting at column
    ``varlen_vt_offset(cu_seqlens_k[i], i)``; every other column is zero (finite: the kernel
    multiplies the padding by P = 0).  With ``seqused_k`` (b,) only sequence i's first
    ``seqused_k[i]`` tokens (clamped into [0, its length]) are copied, its other columns zero: the
    kernel reads them in the used keys' last tile, and they may hold anything (a cache's unused rows).  A gather over the output columns on v8's device: no host
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
    if seqused_k is not None:
        lens = torch.minimum(seqused_k.to(device=dev, dtype=torch.int64).clamp_min(0), lens)
    valid = ((j >= 0) & (i < lens[seq])) if b else torch.zeros_like(c, dtype=torch.bool)
    src = torch.where(valid, cu[seq] + i if b else c, torch.zeros_like(c)).clamp(0, max(total - 1, 0))
    u = _as_bytes(v8)
    if total == 0:
        return torch.zeros(h, dv, cols, dtype=v8.dtype, device=dev)
    vt = torch.where(valid[None, None, :], u[src].permute(1, 2, 0), torch.zeros((), dtype=u.dtype, device=dev))
    vt = vt.contiguous()
    return vt.view(v8.dtype) if u is not v8 else vt
