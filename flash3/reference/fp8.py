"""CPU specification of flash3's FP8 (e4m3) forward kernel: its numerics, tile by tile.

:func:`fp8_attention_reference` emulates the Hopper FP8 kernel on e4m3 inputs quantized by
:mod:`flash3.fp8_quant` (:func:`fp8_attention_varlen_reference` for packed sequences, one
sequence at a time); :func:`attention_tiled_lowp` is the fp16/bf16 comparison point and
:func:`attention_fp64_reference` the ground truth.  The public FP8 path is :mod:`flash3.fp8`.

Layout is ``(batch, seqlen, heads, headdim)``; GQA requires
``heads_q % heads_k == 0`` and query head ``i`` uses kv head
``i // (heads_q // heads_k)``.  ``lse`` is the natural-log logsumexp with
shape ``(batch, heads_q, seqlen_q)``.

Numerics of :func:`fp8_attention_reference` (queries are processed per tile
of rows, which are independent; keys in tiles of ``tile_n`` keys --
:func:`kernel_tile_n`: 128 for d <= 128, 64 above, 32 above 128 with a chunk -- walked from the LAST
key tile to the FIRST, as the kernel does; the full score matrix is never
formed):

1. ``S = q8 @ k8^T`` as the tensor cores compute FP8 products into fp32
   (:func:`fp8_mma`, measured on an H200): per 32-wide chunk of the inner
   dimension, in order, the 32 products and the running sum are aligned to
   the largest exponent among them and each is truncated toward zero to 13
   fractional bits of it.  Not fp32 accumulation: small products next to a
   large one are lost, which moves ``lse`` by up to ~2e-3.
2. ``S *= softmax_scale * q_descale[row block] * k_descale[key block]``
   (q descale per block of ``B_r`` rows -- the kernel's native 64-row slab,
   or 128, or per head; k descale per block of ``B_c`` keys, a multiple of
   ``tile_n``, so one descale covers ``B_c / tile_n`` tiles).  (The kernel folds this
   product, when it is > 0 and no softcap follows, into the row max and the exponentials'
   scale instead of multiplying each score: the same math, fp32 rounding apart.)
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
   ``O_acc = O_acc * alpha + (P8 @ v8) * v_descale[key block]`` in fp32
   per tile (``P8 @ v8`` by :func:`fp8_mma` over the tile's keys, from zero) (the kernel folds the per-block v descale into the running
   rescale; this is mathematically the same).
6'. With fast accumulation (``fast_accum``; FA3's, torch._scaled_mm's use_fast_accum): no
   fresh accumulator, ``O_acc = fp8_mma(P8, v8, O_acc * alpha)``: the tensor cores add each 32-key
   chunk's products into O itself, truncated to 13 bits below the largest of them and O (so late
   keys lose bits against a large O); ``v_descale`` is one per (batch, kv head), multiplied at 7.
7. ``O = O_acc / l`` (with fast accumulation times ``v_descale``) (times ``v_channel_descale[channel]`` if given: an
   optional per-(batch, kv head, channel) v scale applied to O's columns once
   at the end); ``lse = m + log(l) - 8 ln 2``.  Rows that see no key get
   ``O = 0`` exactly and ``lse = -inf``.

Masking: query ``i`` sees key ``j`` iff
``(left < 0 or j >= i + s_k - s_q - left) and (right < 0 or j <= i + s_k - s_q + right)``;
``causal`` means ``right = 0``; with ``attention_chunk`` c > 0 also j in the chunk of
p = i + s_k - s_q, ``[p - p % c, p - p % c + c)`` (FA3's; flash3/masking.py).  Key tiles no row of a
query tile sees are skipped, as the kernel skips them (visiting one would change nothing; with fast
accumulation it would, 6': the query tiles are then the kernel's 128 rows).
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from .. import _checks
from ..fp8_quant import FP8_DTYPE, kernel_tile_n
from ..masking import normalize_window, visible_mask
from . import _used_ends

P_MAX_OFFSET_LOG2 = 8  # P = exp2(... + 8) spans [0, 256]
KERNEL_ROWS = 128  # query rows per tile of the FP8 kernel (attn_logic.h fwd_fp8_*tile_shape block_m)
_LOG2E = math.log2(math.e)
_LN2 = math.log(2.0)


# The FP8 tensor-core accumulation (wgmma k32 e4m3 into f32), measured on an H200 with
# tools/device/fp8_accum_probe.py (benchmarks/results/h200_2026-11-28.md): per instruction, the 32
# products and the old accumulator are aligned to the largest exponent among them and each is
# truncated toward zero to FP8_MMA_KEPT_BITS fractional bits of it.  The simulator's QGMMA does
# the same (tools/hopper_sim/src/tensor_core.cpp).  None = plain fp32 matmul (for comparisons).
FP8_MMA_KEPT_BITS: Optional[int] = 13
FP8_MMA_CHUNK = 32


def fp8_mma(a: torch.Tensor, b: torch.Tensor, c: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``c + a @ b`` (broadcasting batch dims; ``c`` None: 0) of exact FP8 values (any float dtype
    holding them) with the tensor cores' FP8 accumulation, chunk by chunk along the inner
    dimension, into ``c`` as the WGMMA's accumulator (fp32, truncated with the first chunk's
    products as any accumulator is); fp32 result.

    Exact in fp32 for up to 17 kept bits: an e4m3 product has at most 8 significant bits, the
    units are powers of two (so dividing by them is exact), and each chunk's truncated terms are
    integers below 2^(bits + 1) whose 33-term sum stays below 2^24.  Wider rules (a tool's --bits)
    run in fp64.  The FP8 tests and FA3's suite spend most of their time here: the products are
    formed a slab of batch entries at a time (_MMA_SLAB_BYTES) so that the few passes over them
    stay in the CPU's cache, 3-4x faster than one pass over a whole tile batch."""
    if FP8_MMA_KEPT_BITS is None:
        out = torch.matmul(a.float(), b.float())
        return out if c is None else c.float() + out
    work = torch.float32 if FP8_MMA_KEPT_BITS <= 17 else torch.float64
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    if c is not None:
        batch = torch.broadcast_shapes(batch, c.shape[:-2])
    # (entries, k, m) and (entries, k, n): each chunk's products are then (entries, 32, m, n),
    # reduced over a leading dim with the key/column dim contiguous
    entries = math.prod(batch)
    at = a.to(work).transpose(-1, -2).expand(*batch, k, m).reshape(entries, k, m)
    bk = b.to(work).expand(*batch, k, n).reshape(entries, k, n)
    ck = None if c is None else c.to(work).expand(*batch, m, n).reshape(entries, m, n)
    step = max(1, _MMA_SLAB_BYTES // (FP8_MMA_CHUNK * max(m * n, 1) * at.element_size()))
    out = torch.cat([_fp8_mma_slab(at[i:i + step], bk[i:i + step], None if ck is None else ck[i:i + step])
                     for i in range(0, entries, step)]) if entries else at.new_zeros(0, m, n)
    return out.reshape(*batch, m, n).float()


_MMA_SLAB_BYTES = 1 << 20  # one chunk's products per slab: about a core's L2


def _fp8_mma_slab(at: torch.Tensor, b: torch.Tensor, c: Optional[torch.Tensor] = None) -> torch.Tensor:
    """fp8_mma on (e, k, m) transposed and (e, k, n) operands and an (e, m, n) accumulator or None;
    (e, m, n) in their dtype."""
    acc = c
    for k0 in range(0, at.shape[1], FP8_MMA_CHUNK):
        prod = at[:, k0:k0 + FP8_MMA_CHUNK, :, None] * b[:, k0:k0 + FP8_MMA_CHUNK, None, :]
        mx = torch.maximum(prod.amax(dim=1), prod.amin(dim=1).neg_())
        if acc is not None:
            mx = torch.maximum(mx, acc.abs())
        unit = _truncation_unit(mx)
        s = prod.div_(unit.unsqueeze(1), rounding_mode="trunc").sum(dim=1)
        if acc is not None:
            s += torch.div(acc, unit, rounding_mode="trunc")
        acc = s.mul_(unit)
    if acc is None:
        return at.new_zeros(at.shape[0], at.shape[2], b.shape[2])
    return acc.clone() if acc is c else acc


def _truncation_unit(mx: torch.Tensor) -> torch.Tensor:
    """2^(e - bits) for mx's leading bit 2^e (1 where mx is 0: every term is 0 and any unit will
    do): mx's exponent field less ``bits``, by integer arithmetic on its bits (frexp and ldexp
    cost as much as a pass over the products).  Where that leaves the normal range (mx below
    2^(bits - 126) in fp32: never for FP8 products, which are at least 2^-18, but an accumulator
    rescaled by a tiny factor can be, fast_accum), ldexp computes it, a subnormal unit, exact down
    to mx = 2^(bits - 149); below that the unit is the smallest subnormal, on whose grid every term
    already lies (the truncation keeps them, as the simulator's double arithmetic does; the old
    code's unit 0 gave NaN)."""
    bits = FP8_MMA_KEPT_BITS
    ints, mant = (torch.int32, 23) if mx.dtype == torch.float32 else (torch.int64, 52)
    field = mx.view(ints) & ((torch.iinfo(ints).max >> mant) << mant)  # mx >= 0: no sign bit
    ubits = field - (bits << mant)
    unit = torch.where(ubits > 0, ubits, torch.ones((), dtype=mx.dtype).view(ints)).view(mx.dtype)
    tiny = (ubits <= 0) & (mx > 0)
    if bool(tiny.any()):
        _, e = torch.frexp(mx)  # mx = f * 2^e, f in [0.5, 1): the leading bit is 2^(e-1)
        lowest = -149 if mx.dtype == torch.float32 else -1074  # the smallest subnormal's exponent
        unit = torch.where(tiny, torch.ldexp(torch.ones_like(mx), (e - 1 - bits).clamp_min(lowest)), unit)
    return unit


def _tile_state(r0, r1, c0, c1, s_q, s_k, left, right, chunk=0):
    """'skip' if no (i, j) in the tile is visible, 'full' if all are, else 'partial'."""
    if chunk:
        vis = visible_mask(r0, r1, c0, c1, s_q, s_k, False, left, right, chunk=chunk)
        return "skip" if not bool(vis.any()) else "full" if bool(vis.all()) else "partial"
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


def _tiled_core(qf, kf, vf, qd, kd, vd, *, scale, softcap, left, right, br, bn, kblk,
                p_dtype, p_offset_log2, vcd=None, mma=torch.matmul, chunk=0, fast=False):
    """FlashAttention tile loop, key tiles walked from the LAST to the FIRST.

    qf: (b, hk, g, s_q, d) fp32;  kf: (b, hk, 1, s_k, d);  vf: (b, hk, 1, s_k, dv).
    qd: (b, hk, g, ceil(s_q / br)) or None (query tiles are ``br`` rows: rows are
    independent, so the tile height only decides the q descale granularity).
    kd, vd: (b, hk, 1, ceil(s_k / kblk)) or None, one descale per ``kblk`` keys;
    key tiles are ``bn`` keys with ``kblk % bn == 0`` (each tile lies in one
    descale block).  Tiles start at multiples of ``bn``; the last one may be short.
    vcd: (b, hk, 1, 1, dv) or None, applied to the output columns at the end.
    P is rounded to ``p_dtype`` before the PV product (None = no rounding).  ``mma`` computes
    both products (:func:`fp8_mma` for the FP8 kernel's tensor cores).  ``chunk``: attention_chunk.
    ``fast``: fast accumulation -- P@V accumulates into ``acc`` itself (``mma(p, v, acc * alpha)``)
    and ``vd`` (one per (batch, kv head)) multiplies the output at the end.  Then even a key tile
    none of a row's keys sees changes its O (P = 0, but O passes through the truncating
    accumulator), so the tiles visited are the kernel's: those some row of its KERNEL_ROWS-row
    query tile sees (query tiles of gcd(br, KERNEL_ROWS) rows, each in one q descale block).
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
    rows = math.gcd(br, KERNEL_ROWS) if fast else br
    for r0 in range(0, s_q, rows):
        qi, r1 = r0 // br, min(r0 + rows, s_q)
        t0 = r0 // KERNEL_ROWS * KERNEL_ROWS  # the kernel's query tile (fast: its visits count)
        t1 = min(t0 + KERNEL_ROWS, s_q)
        qt = qf[:, :, :, r0:r1]
        m = torch.full((b, hk, g, r1 - r0), -math.inf, dtype=torch.float32, device=dev)
        l = torch.zeros_like(m)
        acc = torch.zeros(b, hk, g, r1 - r0, dv, dtype=torch.float32, device=dev)
        for c0 in key_tiles:
            c1 = min(c0 + bn, s_k)
            kj = c0 // kblk  # descale block of this tile
            state = _tile_state(r0, r1, c0, c1, s_q, s_k, left, right, chunk)
            if fast and state == "skip" and _tile_state(t0, t1, c0, c1, s_q, s_k, left, right, chunk) != "skip":
                state = "partial"  # the kernel's tile visits it: every score masked, P = 0
            if state == "skip":
                continue
            s_tile = mma(qt, kf[:, :, :, c0:c1].transpose(-1, -2))  # (b, hk, g, R, C)
            mult = torch.full((), scale, dtype=torch.float32, device=dev)
            if qd is not None:
                mult = mult * qd[..., qi]
            if kd is not None:
                mult = mult * kd[..., kj]
            s_tile = s_tile * (mult[..., None, None] if mult.dim() else mult)
            if softcap > 0.0:
                s_tile = torch.tanh(s_tile / softcap) * softcap
            if state == "partial":
                vis = visible_mask(r0, r1, c0, c1, s_q, s_k, False, left, right, device=dev, chunk=chunk)
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
            if fast:  # the WGMMA accumulates into O, rescaled first (FwdConsumer::step)
                acc = mma(p, vf[:, :, :, c0:c1], acc * alpha[..., None])
            else:
                pv = mma(p, vf[:, :, :, c0:c1])
                if vd is not None:
                    pv = pv * vd[..., kj][..., None, None]
                acc = acc * alpha[..., None] + pv
            m = m_new
        has = l > 0
        l_safe = torch.where(has, l, torch.ones_like(l))
        o = acc / l_safe[..., None]
        if fast and vd is not None and vd.shape[-1]:  # (no keys, no blocks: every row is 0 anyway)
            o = o * vd[..., :1, None]
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
    _checks.float_tensor(desc, name, "fp16/bf16/fp64")
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


def _key_tiling(block_c, tile_n, d, attention_chunk=0, fast_accum=False):
    """(descale block, key tile) for the emulation; see fp8_attention_reference."""
    if tile_n is None:
        tile = kernel_tile_n(d, attention_chunk, fast_accum)
        if block_c is not None and block_c % tile:
            tile = math.gcd(block_c, tile)  # not a kernel configuration: finer tiles
    else:
        if not _checks.is_int(tile_n) or tile_n <= 0:
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
    _checks.float_tensor(vcd, "v_channel_descale", "fp16/bf16/fp64")
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
                            v_channel_descale: Optional[torch.Tensor] = None, attention_chunk: int = 0,
                            fast_accum: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Emulate the Hopper FP8 forward kernel (see the module docstring).

    ``q``, ``k``, ``v`` are ``float8_e4m3fn`` of shape (b, s, h|h_k, d).
    Descales (``None`` = 1) are either per (batch, head) -- ``(b, h_k)``, FA3's
    convention also for q; ``(b, h_q)`` is accepted for q as well -- or per
    block: ``(b, h, ceil(s / B))`` with ``B = block_size[0]`` (B_r; q accepts
    ``h = h_q`` or ``h_k``) for q and ``B = block_size[1]`` (B_c, ``h = h_k``)
    for k and v.  ``block_size`` entries of ``None``/-1 mean 128.
    ``v_channel_descale``: optional ``(b, h_k, d_v)`` scale of v's channels,
    applied to the output columns at the end (``v = v8 * v_descale[block] *
    v_channel_descale[channel]``).  ``attention_chunk`` (0 = off): FA3's chunked local attention.
    ``fast_accum``: the kernel's fast accumulation (module docstring, 6'): ``v_descale`` one per
    (batch, kv head), key tiles of 128, no ``attention_chunk``.

    Tiling: query rows are independent (the tile height does not change the
    result; with ``fast_accum`` the key tiles a row visits are those of its kernel
    tile of 128 rows); keys are processed in tiles of ``tile_n`` keys from the last tile
    to the first.  ``tile_n=None`` is the kernel's :func:`kernel_tile_n` of
    max(d, d_v) (128 up to 128, 64 above; with a chunk 32 above 128; 128 with
    ``fast_accum``), reduced to
    ``gcd(B_c, tile_n)`` when ``B_c`` is not a multiple of it (a configuration
    the kernel does not run).  An
    explicit ``tile_n`` must divide ``B_c``.
    Returns ``(out, lse)``: out fp32 (b, s_q, h_q, d_v), lse fp32 (b, h_q, s_q).
    """
    _checks.qkv(q, k, v, (FP8_DTYPE,))
    b, s_q, h, d = q.shape
    s_k, hk, dv = k.shape[1], k.shape[2], v.shape[3]
    g = h // hk
    br, bc = _checks.quant_block_pair(block_size)
    br = 128 if br is None else br
    bc = 128 if bc is None else bc
    chunk = _checks.int_at_least("attention_chunk", attention_chunk, 0)
    _checks.flag("fast_accum", fast_accum)
    if fast_accum:
        if chunk:
            raise ValueError("attention_chunk is not available with fast_accum (no such FP8 kernel)")
        if v_descale is not None and v_descale.dim() != 2:
            raise ValueError(f"v_descale must be one per (batch, kv head), (b, h_k), with fast_accum "
                             f"(P@V accumulates over every key block), got shape {tuple(v_descale.shape)}")
    kblk, bn = _key_tiling(bc, tile_n, max(d, dv), chunk, fast_accum)  # the kernel that runs: the larger dim's
    scale, softcap = _checks.scale_softcap(softmax_scale, softcap, d)
    left, right = normalize_window(causal, _checks.window(window_left, window_right, causal))
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
                           vcd=vcd, mma=fp8_mma, chunk=chunk, fast=fast_accum)
    out = out.reshape(b, h, s_q, dv).permute(0, 2, 1, 3).contiguous()
    return out, lse.reshape(b, h, s_q)


def fp8_attention_varlen_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                   cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                                   q_descale: Optional[torch.Tensor] = None,
                                   k_descale: Optional[torch.Tensor] = None,
                                   v_descale: Optional[torch.Tensor] = None, *,
                                   max_seqlen_q: Optional[int] = None, max_seqlen_k: Optional[int] = None,
                                   v_channel_descale: Optional[torch.Tensor] = None,
                                   seqused_q: Optional[torch.Tensor] = None,
                                   seqused_k: Optional[torch.Tensor] = None, **kwargs,
                                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`fp8_attention_reference` over packed sequences, as the kernel's varlen mode runs it.

    q (total_q, h, d), k (total_k, h_k, d), v (total_k, h_k, d_v) e4m3; sequence i is rows
    ``cu_seqlens[i]:cu_seqlens[i+1]``.  Descales are indexed by sequence: ``(b, heads)`` per
    head, or ``(b, heads, ceil(max_seqlen / B))`` with blocks counted from each sequence's first
    row (``max_seqlen_*`` default to the longest sequence).  ``v_channel_descale`` (b, h_k, d_v).
    ``seqused_q``/``seqused_k`` (b,) int (FA3's): sequence i's queries/keys are only its first
    seqused[i] rows (clamped into [0, its length]); masks align on those counts, its other query
    rows get out 0 and lse -inf.  Other keywords as :func:`fp8_attention_reference`.  Reads
    cu_seqlens and seqused on the host (the emulation syncs; the kernel does not).  Returns out
    fp32 (total_q, h, d_v), lse fp32 (h, total_q); rows past ``cu_seqlens_q[-1]`` get out 0 and
    lse -inf.
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
    qe, ke = _used_ends(cq, seqused_q), _used_ends(ck, seqused_k)  # where each sequence's used rows end
    h, dv = q.shape[1], v.shape[2]
    out = torch.zeros(q.shape[0], h, dv, dtype=torch.float32, device=q.device)
    lse = torch.full((h, q.shape[0]), -math.inf, dtype=torch.float32, device=q.device)
    br, bc = _checks.quant_block_pair(kwargs.get("block_size", (128, 128)))
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
        nq, nk = qe[i] - cq[i], ke[i] - ck[i]
        if nq <= 0:
            continue
        qi = q[cq[i]:qe[i]][None]
        ki, vi = k[ck[i]:ke[i]][None], v[ck[i]:ke[i]][None]
        vcd = None if v_channel_descale is None else v_channel_descale[i:i + 1]
        o, l_ = fp8_attention_reference(qi, ki, vi, one(q_descale, "q", i, nq), one(k_descale, "k", i, nk),
                                        one(v_descale, "v", i, nk), v_channel_descale=vcd, **kwargs)
        out[cq[i]:qe[i]] = o[0]
        lse[:, cq[i]:qe[i]] = l_[0]
    return out, lse


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
    _checks.flag("round_p", round_p)
    _checks.qkv(q, k, v, (torch.float16, torch.bfloat16))
    if q.dtype != k.dtype or q.dtype != v.dtype:
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    b, s_q, h, d = q.shape
    s_k, hk, dv = k.shape[1], k.shape[2], v.shape[3]
    g = h // hk
    left, right = normalize_window(causal, _checks.window(*_checks.window_pair(window_size), causal))
    br, bc = _checks.quant_block_pair(block_size)
    scale, softcap = _checks.scale_softcap(softmax_scale, softcap, d)
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
                             softcap: float = 0.0, q_chunk: int = 1024, attention_chunk: int = 0):
    """Ground truth for accuracy measurements: plain softmax attention in float64.

    Any float input dtype (float8 included: its values are taken as-is).
    Returns ``(out, lse)`` in float64: (b, s_q, h, d_v) and (b, h, s_q);
    rows that see no key get 0 and -inf.  Chunked over query rows and heads.  ``attention_chunk``
    as :func:`fp8_attention_reference`'s.
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
    left, right = normalize_window(causal, _checks.window(*_checks.window_pair(window_size), causal))
    scale, softcap = _checks.scale_softcap(softmax_scale, softcap, d)
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
            vis = visible_mask(r0, r1, 0, s_k, s_q, s_k, False, left, right, device=q.device,
                               chunk=attention_chunk)
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
