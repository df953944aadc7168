"""The fused FP8 rotate-and-quantize kernel (``flash3::quantize_fp8_sm90``, csrc/flash3/fp8/).

``quantize_fp8_cuda`` is :func:`flash3.fp8.quantize_fp8` in one memory-bound pass on a Hopper
GPU, with two extras of the FP8 attention path: a per-(batch, head) ``mean`` subtracted after the
rotation (K smoothing) and a per-channel ``channel_descale`` divided out before the block amax
(V per-channel scaling), and a second output layout, ``"v_packed"``: ``(b, h, d, s_pad)`` with
``s_pad = ceil(s / 16) * 16``, tokens contiguous and permuted by :data:`V_PERM16` inside every
aligned group of 16 (``vt[b, h, c, 16*g + i] = x8[b, 16*g + V_PERM16[i], h, c]``), padding 0 --
the operand order the FP8 attention kernel's P.V WGMMA reads.

No host synchronization (CUDA-graph capturable); the contract is finite input (non-finite values
give unspecified output, no error). Supported: bf16/fp16 x (b, s, h, d) with contiguous channels,
d a multiple of 8 in [8, 256]; with ``hadamard`` d = m * 2^k, m in {1, 3, 5}, 2^k >= 8 (64, 80,
96, 128, 160, 192, 256, ...); ``"v_packed"`` needs ``block_size % 16 == 0`` and
``block_size * (d + 4) <= 102400``.
"""

from __future__ import annotations

import functools
from typing import Optional

import torch

from . import _backend, _checks
from .fp8_quant import V_PERM16
from .hadamard import block_structure, random_signs

__all__ = ["available", "quantize_fp8_cuda", "device_signs", "V_PERM16", "LAYOUTS"]

LAYOUTS = {"rows": 0, "v_packed": 1}
_MAX_HARTLEY = (1, 3, 5)
_VPACK_MAX_SMEM = 100 * 1024


@functools.lru_cache(maxsize=None)
def available() -> bool:
    """True when flash3._C is built with the quantize kernel (it still needs an sm_90 device)."""
    if not _backend.has_extension():
        return False
    try:
        torch.ops.flash3.quantize_fp8_sm90
    except (AttributeError, RuntimeError):
        return False
    return True


_SIGNS: dict = {}


def device_signs(d: int, seed: int, device) -> torch.Tensor:
    """random_signs(d, seed) as fp32 on ``device``, cached: the copy from the CPU happens once,
    so later calls (also inside a CUDA-graph capture) launch only the kernel."""
    key = (d, seed, torch.device(device))
    t = _SIGNS.get(key)
    if t is None:
        t = random_signs(d, seed, dtype=torch.float32, device=device)
        _SIGNS[key] = t
    return t


def quantize_fp8_cuda(x: torch.Tensor, *, block_size: Optional[int] = 128, hadamard: bool = False,
                      seed: int = 0, mean: Optional[torch.Tensor] = None,
                      channel_descale: Optional[torch.Tensor] = None,
                      layout: str = "rows") -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``x`` (b, s, h, d) to e4m3 with one fp32 descale per block of tokens.

    Per element: ``y = hadamard_transform(x, seed)`` (if ``hadamard``), ``y -= mean[b, h]``,
    ``y /= channel_descale[b, h]``; per block of ``block_size`` tokens of one (batch, head):
    ``descale = amax|y| / 448`` (1 for an all-zero block), ``x8 = e4m3(clamp(y / descale))``.
    ``block_size=None`` or ``-1``: one block over the whole sequence, descale (b, h).
    Returns ``(x8, descale)``: x8 (b, s, h, d) for ``layout="rows"`` or (b, h, d, s_pad) for
    ``"v_packed"``; descale fp32 (b, h, ceil(s / block_size)).
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"x must be bfloat16 or float16, got {x.dtype}")
    if x.dim() != 4:
        raise ValueError(f"x must be 4-D (batch, seqlen, heads, headdim), got shape {tuple(x.shape)}")
    _checks.flag("hadamard", hadamard)
    if not _checks.is_int(seed):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {sorted(LAYOUTS)}, got {layout!r}")
    b, s, h, d = x.shape
    per_head = block_size is None or block_size == -1
    if per_head:
        bs = max(s, 1)
    elif not _checks.is_int(block_size) or block_size <= 0:
        raise ValueError(f"block_size must be a positive int, -1 or None, got {block_size!r}")
    else:
        bs = block_size
    if d % 8 or not 8 <= d <= 256:
        raise ValueError(f"head dim must be a multiple of 8 in [8, 256] for the quantize kernel, got {d}")
    if hadamard:
        m, p = block_structure(d)
        if m not in _MAX_HARTLEY or p < 8:
            raise ValueError(f"hadamard on the quantize kernel needs head dim = m * 2^k with m in "
                             f"{{1, 3, 5}} and 2^k >= 8 (e.g. 64, 96, 128, 192, 256), got {d} = {m} * {p}")
    if layout == "v_packed":
        if bs % 16:
            raise ValueError(f"layout 'v_packed' needs block_size to be a multiple of 16, got {bs}")
        rows = -(-min(bs, s) // 16) * 16
        if rows * (d + 4) > _VPACK_MAX_SMEM:
            raise ValueError(f"layout 'v_packed' needs block_size * (head dim + 4) <= {_VPACK_MAX_SMEM}, "
                             f"got block_size {bs}, head dim {d}")
    if x.device.type != "cuda":
        raise ValueError(f"x must be a CUDA tensor, got {x.device}")
    if x.stride(-1) != 1:
        x = x.contiguous()
    mean = _checks.per_head_vector(mean, "mean", b, h, d, x.device)
    channel_descale = _checks.per_head_vector(channel_descale, "channel_descale", b, h, d, x.device)
    signs = device_signs(d, seed, x.device) if hadamard else None
    nb = -(-s // bs)
    if layout == "rows":
        out = torch.empty(b, s, h, d, dtype=torch.float8_e4m3fn, device=x.device)
    else:
        out = torch.empty(b, h, d, -(-s // 16) * 16, dtype=torch.float8_e4m3fn, device=x.device)
    descale = torch.empty(b, h, nb, dtype=torch.float32, device=x.device)
    torch.ops.flash3.quantize_fp8_sm90(x, signs, mean, channel_descale, bs, LAYOUTS[layout], out,
                                       descale)
    if per_head:
        descale = descale.reshape(b, h, -1)[:, :, 0] if nb else torch.ones(b, h, device=x.device)
    return out, descale
