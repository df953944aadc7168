"""CPU specification of flash3's FP8 (e4m3) serving path.

This module is the executable spec for the future Hopper FP8 forward kernel:
it quantizes activations to ``torch.float8_e4m3fn`` with per-block scales
(optionally after a randomized Hadamard rotation, see :mod:`flash3.hadamard`)
and emulates the kernel's numerics tile by tile.

Layout is ``(batch, seqlen, heads, headdim)``; GQA requires
``heads_q % heads_k == 0`` and query head ``i`` uses kv head
``i // (heads_q // heads_k)``.  ``lse`` is the natural-log logsumexp with
shape ``(batch, heads_q, seqlen_q)``.

Numerics of :func:`fp8_attention_reference` (one query tile of ``B_r`` rows
against key tiles of ``B_c`` keys; the full score matrix is never formed):

1. ``S = q8.float() @ k8.float()^T`` in fp32 (products of e4m3 values are
   exact in fp32).
2. ``S *= q_descale[row block] * k_descale[key block] * softmax_scale``.
3. softcap (``cap * tanh(S / cap)``) if ``softcap > 0``, then the mask
   (``-inf``).
4. Online softmax in fp32 in the exp2 domain with running row max ``m``:
   ``P = exp2(S*log2e - m*log2e + 8)``, so ``P`` lies in ``[0, 256]``
   (evaluated as ``exp2((S - m)*log2e + 8)`` so the row max is exactly 256).  The
   ``+8`` ("max offset") uses the top of e4m3's range (max 448) instead of
   ``[0, 1]``, where P values below 2^-6 would be subnormal and values below
   2^-10 flush to zero; 256 is a power of two so the scaling is exact.
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
   (the kernel folds the per-block v descale into the running rescale; this is
   mathematically the same).
7. ``O = O_acc / l``; ``lse = m + log(l) - 8 ln 2``.  Rows that see no key
   get ``O = 0`` exactly and ``lse = -inf``.

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
        raise ValueError(f"{name} must be {ndim}-D (batch, seqlen, heads, headdim), got shape {tuple(x.shape)}")


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


def quantize_fp8(x: torch.Tensor, *, block_size: Optional[int] = 128, hadamard: bool = False,
                 seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
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
    """
    _check_tensor(x, "x", _INPUT_DTYPES)
    bs = _norm_block(block_size, "block_size")
    if not isinstance(hadamard, bool):
        raise TypeError(f"hadamard must be a bool, got {type(hadamard).__name__}")
    if not _is_int(seed):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    b, s, h, d = x.shape
    if d == 0:
        raise ValueError("x must have a non-empty head dim")
    xf = hadamard_transform(x, seed=seed) if hadamard else x.float()

    if bs is None:
        if s == 0:
            return xf.to(FP8_DTYPE), torch.ones(b, h, dtype=torch.float32, device=x.device)
        amax = xf.abs().amax(dim=(1, 3))  # (b, h)
        descale = _descale_from_amax(amax, "x")
        scaled = xf / descale[:, None, :, None]
    else:
        nb = -(-s // bs)
        if s == 0:
            return xf.to(FP8_DTYPE), torch.ones(b, h, 0, dtype=torch.float32, device=x.device)
        pad = nb * bs - s
        xp = torch.nn.functional.pad(xf, (0, 0, 0, 0, 0, pad)) if pad else xf
        xb = xp.reshape(b, nb, bs, h, d)
        amax = xb.abs().amax(dim=(2, 4))  # (b, nb, h)
        descale_bnh = _descale_from_amax(amax, "x")
        scaled = (xb / descale_bnh[:, :, None, :, None]).reshape(b, nb * bs, h, d)[:, :s]
        descale = descale_bnh.permute(0, 2, 1).contiguous()  # (b, h, nb)
    x8 = scaled.clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return x8, descale


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

def _tiled_core(qf, kf, vf, qd, kd, vd, *, scale, softcap, left, right, br, bc,
                p_dtype, p_offset_log2):
    """FlashAttention tile loop.

    qf: (b, hk, g, s_q, d) fp32;  kf: (b, hk, 1, s_k, d);  vf: (b, hk, 1, s_k, dv).
    qd: (b, hk, g, n_qblocks) or None;  kd, vd: (b, hk, 1, n_kblocks) or None.
    P is rounded to ``p_dtype`` before the PV product (None = no rounding).
    Returns out (b, hk, g, s_q, dv) fp32 and lse (b, hk, g, s_q) fp32.
    """
    b, hk, g, s_q, d = qf.shape
    s_k = kf.shape[3]
    dv = vf.shape[-1]
    dev = qf.device
    out = torch.zeros(b, hk, g, s_q, dv, dtype=torch.float32, device=dev)
    lse = torch.full((b, hk, g, s_q), -math.inf, dtype=torch.float32, device=dev)
    offset = float(p_offset_log2)
    for qi, r0 in enumerate(range(0, s_q, br)):
        r1 = min(r0 + br, s_q)
        qt = qf[:, :, :, r0:r1]
        m = torch.full((b, hk, g, r1 - r0), -math.inf, dtype=torch.float32, device=dev)
        l = torch.zeros_like(m)
        acc = torch.zeros(b, hk, g, r1 - r0, dv, dtype=torch.float32, device=dev)
        for kj, c0 in enumerate(range(0, s_k, bc)):
            c1 = min(c0 + bc, s_k)
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
        out[:, :, :, r0:r1] = torch.where(has[..., None], acc / l_safe[..., None], torch.zeros_like(acc))
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


def fp8_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            q_descale: Optional[torch.Tensor] = None,
                            k_descale: Optional[torch.Tensor] = None,
                            v_descale: Optional[torch.Tensor] = None, *,
                            softmax_scale: Optional[float] = None, causal: bool = False,
                            window_left: int = -1, window_right: int = -1, softcap: float = 0.0,
                            block_size=(128, 128)) -> tuple[torch.Tensor, torch.Tensor]:
    """Emulate the Hopper FP8 forward kernel (see the module docstring).

    ``q``, ``k``, ``v`` are ``float8_e4m3fn`` of shape (b, s, h|h_k, d).
    Descales (``None`` = 1) are either per (batch, head) -- ``(b, h_k)``, FA3's
    convention also for q; ``(b, h_q)`` is accepted for q as well -- or per
    block: ``(b, h, ceil(s / B))`` with ``B = block_size[0]`` (B_r) for q and
    ``block_size[1]`` (B_c) for k and v.  ``block_size`` is also the tile shape.
    Returns ``(out, lse)``: out fp32 (b, s_q, h_q, d_v), lse fp32 (b, h_q, s_q).
    """
    _check_qkv(q, k, v, (FP8_DTYPE,))
    b, s_q, h, d = q.shape
    s_k, hk, dv = k.shape[1], k.shape[2], v.shape[3]
    g = h // hk
    br, bc = _norm_block_pair(block_size)
    br = 128 if br is None else br
    bc = 128 if bc is None else bc
    scale, softcap = _check_scale_softcap(softmax_scale, softcap, d)
    left, right = _check_window(window_left, window_right, causal)
    dev = q.device
    qd = _descale_blocks(q_descale, "q_descale", b=b, heads_ok=(hk, h), hk=hk, g=g, s=s_q, blk=br,
                         is_q=True, device=dev)
    kd = _descale_blocks(k_descale, "k_descale", b=b, heads_ok=(hk,), hk=hk, g=g, s=s_k, blk=bc,
                         is_q=False, device=dev)
    vd = _descale_blocks(v_descale, "v_descale", b=b, heads_ok=(hk,), hk=hk, g=g, s=s_k, blk=bc,
                         is_q=False, device=dev)
    qf = q.float().permute(0, 2, 1, 3).reshape(b, hk, g, s_q, d)
    kf = k.float().permute(0, 2, 1, 3).unsqueeze(2)
    vf = v.float().permute(0, 2, 1, 3).unsqueeze(2)
    out, lse = _tiled_core(qf, kf, vf, qd, kd, vd, scale=scale, softcap=softcap, left=left, right=right,
                           br=br, bc=bc, p_dtype=FP8_DTYPE, p_offset_log2=P_MAX_OFFSET_LOG2)
    out = out.reshape(b, h, s_q, dv).permute(0, 2, 1, 3).contiguous()
    return out, lse.reshape(b, h, s_q)


def _window_pair(window_size):
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2:
        raise TypeError(f"window_size must be a (left, right) pair, got {window_size!r}")
    return window_size[0], window_size[1]


def attention_fp8(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                  softmax_scale: Optional[float] = None, window_size=(-1, -1), softcap: float = 0.0,
                  hadamard: bool = True, block_size=(128, 128), seed: int = 0, return_lse: bool = False):
    """End-to-end FP8 attention for fp16/bf16 (or fp32) (b, s, h, d) inputs.

    q and k are rotated with the same randomized Hadamard transform (if
    ``hadamard``), q is block-quantized with ``B_r = block_size[0]`` rows per
    scale and k, v with ``B_c = block_size[1]`` (``block_size=None``: one scale
    per (batch, head), 128x128 tiles); v is never rotated.  ``softmax_scale``
    defaults to ``1/sqrt(d)`` of the original head dim.  Returns ``out`` in
    q's dtype (and ``lse`` (b, h, s_q) fp32 if ``return_lse``).
    """
    _check_qkv(q, k, v, _INPUT_DTYPES)
    if not isinstance(hadamard, bool):
        raise TypeError(f"hadamard must be a bool, got {type(hadamard).__name__}")
    if not isinstance(return_lse, bool):
        raise TypeError(f"return_lse must be a bool, got {type(return_lse).__name__}")
    if not _is_int(seed):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    left, right = _window_pair(window_size)
    _check_window(left, right, causal)
    br, bc = _norm_block_pair(block_size)
    scale, softcap = _check_scale_softcap(softmax_scale, softcap, q.shape[-1])
    q8, qd = quantize_fp8(q, block_size=br, hadamard=hadamard, seed=seed)
    k8, kd = quantize_fp8(k, block_size=bc, hadamard=hadamard, seed=seed)
    v8, vd = quantize_fp8(v, block_size=bc, hadamard=False)
    out, lse = fp8_attention_reference(q8, k8, v8, qd, kd, vd, softmax_scale=scale, causal=causal,
                                       window_left=left, window_right=right, softcap=softcap,
                                       block_size=(br or 128, bc or 128))
    out = out.to(q.dtype)
    return (out, lse) if return_lse else out


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
                           right=right, br=br or 128, bc=bc or 128,
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
