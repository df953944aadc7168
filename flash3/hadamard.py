"""Randomized fast orthogonal transforms over the head dimension ("incoherent
processing") for the FP8 attention path.

FP8 (e4m3) quantization of q and k suffers from outlier features: one large
coordinate of a query is quantized with a single relative error that then
scales *every* score of that row coherently (it acts like a temperature
change of the softmax).  Multiplying q and k by the same orthogonal matrix M
leaves every score unchanged, ``(q M)(k M)^T = q k^T``, but spreads each
outlier over all coordinates so that its quantization error becomes many small
independent errors that average out.

The transform
-------------
``M = D T`` acting on row vectors (``y = (x * s) T``), where

* ``D = diag(s)``, ``s`` in {-1, +1}^d: random signs drawn deterministically
  from ``seed`` with a CPU ``torch.Generator`` (identical on every device),
  then moved to ``x``'s device.
* ``T`` is a fixed, exactly orthogonal, symmetric and involutory
  (``T = T^T = T^-1``) fast transform.  Write ``d = m * p`` with ``p = 2^k``
  the largest power of two dividing ``d`` and ``m`` odd, and view the head dim
  as ``m`` contiguous blocks of ``p`` coordinates.  Then ``T = C_m (x) H_p``
  (Kronecker product):

  - ``H_p``: the normalized (``1/sqrt(p)``) Sylvester Walsh-Hadamard matrix,
    applied to every block with the O(p log p) butterfly (no matmul);
  - ``C_m``: the normalized ``m``-point discrete Hartley transform,
    ``C[a, b] = (cos(2 pi a b / m) + sin(2 pi a b / m)) / sqrt(m)``, which
    mixes the ``m`` blocks with each other.  It is real, symmetric and
    satisfies ``C^2 = I`` (orthogonal).  For odd ``m`` none of its entries is
    zero (``cas(2 pi j / m) = 0`` would need ``8 j = (4n - 1) m``, impossible
    since the left side is even and the right side odd).

  Consequently, for every d, every output coordinate depends on every input
  coordinate, and ``max |M_ij| <= sqrt(2 / m) / sqrt(p) = sqrt(2 / d)``: at
  most a factor sqrt(2) above the optimum ``1/sqrt(d)`` of a true Hadamard
  matrix (which exists only for d = 1, 2 or a multiple of 4 and has no fast
  algorithm in general).  A plain block-diagonal Hadamard would leave
  ``d - p`` zero entries per row and ``max |M_ij| = 1/sqrt(p)``, e.g. ``d=96``
  would only mix within blocks of 32 instead of across all 96 coordinates.

  Cost: ``O(d log d)`` for every d.  For power-of-two head dims ``m = 1`` and
  this is exactly the randomized Walsh-Hadamard transform used by
  FlashAttention-3.  The common non-power-of-two head dims have tiny ``m``
  (96 = 3*32, 192 = 3*64, 80 = 5*16, 40 = 5*8), where the block mixing is an
  ``m x m`` product (``O(d m)``); for larger ``m`` (odd d such as 255) the
  Hartley transform is computed through the FFT
  (``cas``-transform = ``Re(FFT) - Im(FFT)``), so no ``d x d`` matrix is
  ever formed.

Precision: the transform is computed in float32 and returns float32
(a float64 input is kept in float64, which the tests use to check exact
orthogonality).
"""

from __future__ import annotations

import functools
import math

import torch

__all__ = ["hadamard_transform", "hadamard_matrix", "random_signs", "block_structure"]


def block_structure(d: int) -> tuple[int, int]:
    """Return ``(m, p)`` with ``d = m * p``, ``p`` the largest power of two dividing d."""
    if not isinstance(d, int) or isinstance(d, bool) or d < 1:
        raise ValueError(f"head dim must be a positive int, got {d!r}")
    p = d & (-d)
    return d // p, p


@functools.lru_cache(maxsize=128)
def _signs_cpu(d: int, seed: int) -> torch.Tensor:
    g = torch.Generator(device="cpu")
    g.manual_seed(seed)
    bits = torch.randint(0, 2, (d,), generator=g, dtype=torch.int64, device="cpu")
    signs = (bits * 2 - 1).to(torch.float64)
    signs.requires_grad_(False)
    return signs


def random_signs(d: int, seed: int = 0, *, dtype=torch.float32, device=None) -> torch.Tensor:
    """The ±1 diagonal of ``D`` (generated on CPU from ``seed``, then moved)."""
    block_structure(d)
    return _signs_cpu(d, int(seed)).to(dtype=dtype, device=device, copy=True)


@functools.lru_cache(maxsize=64)
def _on_device(kind: str, n: int, seed: int, dtype, device) -> torch.Tensor:
    """A read-only device copy of the signs (kind "signs": n = d) or of the Hartley matrix ("cas":
    n = m), made once: a copy from pageable host memory per call is illegal inside CUDA graph
    capture (seen on an H200 in attention_fp8_varlen's capture), and costs a transfer per call."""
    src = _signs_cpu(n, seed) if kind == "signs" else _hartley_cpu(n)
    return src.to(dtype=dtype, device=device, copy=True)


@functools.lru_cache(maxsize=64)
def _hartley_cpu(m: int) -> torch.Tensor:
    idx = torch.arange(m, dtype=torch.float64)
    ang = (2.0 * math.pi / m) * torch.outer(idx, idx).remainder(m)  # reduce before scaling
    return (torch.cos(ang) + torch.sin(ang)) / math.sqrt(m)


# Up to this many blocks the Hartley mixing is a tiny dense product; above it
# (only odd-ish head dims such as 255 = 255 * 1) it goes through the FFT.
_HARTLEY_DENSE_MAX = 8


def _fwht_(x: torch.Tensor) -> torch.Tensor:
    """Unnormalized Walsh-Hadamard butterfly over the last dim (a power of two)."""
    p = x.shape[-1]
    shape = x.shape
    h = 1
    while h < p:
        y = x.reshape(-1, p // (2 * h), 2, h)
        a = y[:, :, 0, :]
        b = y[:, :, 1, :]
        x = torch.stack((a + b, a - b), dim=2)
        h *= 2
    return x.reshape(shape)


def _apply_T(y: torch.Tensor) -> torch.Tensor:
    """y -> y T with T = C_m (x) H_p (symmetric, orthogonal, involutory)."""
    d = y.shape[-1]
    m, p = block_structure(d)
    lead = y.shape[:-1]
    y = y.reshape(*lead, m, p)
    if p > 1:
        y = _fwht_(y) * (1.0 / math.sqrt(p))
    if m > _HARTLEY_DENSE_MAX:
        # Hartley via the FFT: cas = cos + sin, so C y = (Re F y - Im F y) / sqrt(m)
        f = torch.fft.fft(y, dim=-2)
        y = (f.real - f.imag) * (1.0 / math.sqrt(m))
    elif m > 1:
        c = _on_device("cas", m, 0, y.dtype, y.device)
        # out[..., a, j] = sum_b C[a, b] y[..., b, j], b in order, every product and sum rounded
        # on its own: elementwise ops only, so the same bits on every device, stream and
        # matmul-precision setting (a GEMM's order and TF32 use are cuBLAS's/BLAS's choice).
        out = c[:, :1] * y[..., :1, :]
        for j in range(1, m):
            out = out + c[:, j:j + 1] * y[..., j:j + 1, :]
        y = out
    return y.reshape(*lead, d)


def hadamard_transform(x: torch.Tensor, *, seed: int = 0, inverse: bool = False) -> torch.Tensor:
    """Apply ``M = D T`` (or its inverse ``M^T = T D``) over the last dim of ``x``.

    Forward: ``y = T(x * s)``; inverse: ``x = T(y) * s``.  Use the same
    ``seed`` for q and k so that ``q k^T`` is preserved.  Returns float32
    (float64 for float64 input).
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if not (x.is_floating_point()) or x.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        raise TypeError(f"x must be a float16/bfloat16/float32/float64 tensor, got {x.dtype}")
    if x.dim() < 1 or x.shape[-1] < 1:
        raise ValueError(f"x must have a non-empty last dim, got shape {tuple(x.shape)}")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    if not isinstance(inverse, bool):
        raise TypeError(f"inverse must be a bool, got {type(inverse).__name__}")
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    y = x.to(dtype)
    d = x.shape[-1]
    block_structure(d)
    s = _on_device("signs", d, int(seed), dtype, x.device)  # read only
    if inverse:
        return _apply_T(y) * s
    return _apply_T(y * s)


def hadamard_matrix(d: int, *, seed: int = 0, dtype=torch.float64, device=None) -> torch.Tensor:
    """The explicit ``d x d`` matrix M with ``hadamard_transform(x) == x @ M``."""
    eye = torch.eye(d, dtype=torch.float64, device=device)
    return hadamard_transform(eye, seed=seed).to(dtype)
