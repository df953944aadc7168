"""The attention mask, stated once.

Everything here is the specification that the reference backend, the tests
and the C++ host code (tile scheduling) agree on.

Conventions
-----------
* Query row ``i`` in ``[0, seqlen_q)``, key column ``j`` in ``[0, seqlen_k)``.
* Masks are aligned bottom-right: query ``i`` sits at key position
  ``i + seqlen_k - seqlen_q`` (the "diagonal").
* A window ``(left, right)`` keeps keys with
  ``diag - left <= j <= diag + right``; ``-1`` on either side means unbounded.
* ``causal`` is the window's right side set to 0; ``causal`` with
  ``(left, right)`` is the same as the window ``(left, 0)``.
"""

from __future__ import annotations

import torch

__all__ = [
    "normalize_window",
    "visible",
    "visible_mask",
    "key_block_range",
    "unmasked_key_block_range",
]


def normalize_window(causal: bool, window_size) -> tuple[int, int]:
    """Fold ``causal`` into the window: returns ``(left, right)``, -1 = unbounded."""
    left, right = int(window_size[0]), int(window_size[1])
    left = -1 if left < 0 else left
    right = -1 if right < 0 else right
    if causal:
        right = 0
    return left, right


def visible(i: int, j: int, seqlen_q: int, seqlen_k: int, causal: bool,
            window_left: int, window_right: int) -> bool:
    """Whether query ``i`` may attend to key ``j`` (scalar version)."""
    left, right = normalize_window(causal, (window_left, window_right))
    if not (0 <= i < seqlen_q and 0 <= j < seqlen_k):
        return False
    diag = i + seqlen_k - seqlen_q
    if left >= 0 and j < diag - left:
        return False
    if right >= 0 and j > diag + right:
        return False
    return True


def visible_mask(row_start: int, row_end: int, col_start: int, col_end: int,
                 seqlen_q: int, seqlen_k: int, causal: bool,
                 window_left: int, window_right: int,
                 device=None) -> torch.Tensor:
    """Bool mask ``(row_end - row_start, col_end - col_start)``: True where visible.

    Rows/columns outside ``[0, seqlen_q)`` / ``[0, seqlen_k)`` are never visible.
    """
    left, right = normalize_window(causal, (window_left, window_right))
    rows = torch.arange(row_start, row_end, device=device).unsqueeze(1)
    cols = torch.arange(col_start, col_end, device=device).unsqueeze(0)
    ok = (rows >= 0) & (rows < seqlen_q) & (cols >= 0) & (cols < seqlen_k)
    diag = rows + (seqlen_k - seqlen_q)
    if left >= 0:
        ok = ok & (cols >= diag - left)
    if right >= 0:
        ok = ok & (cols <= diag + right)
    return ok


def _block_rows(m_block, block_m, seqlen_q):
    """First and last (inclusive) query row of query block ``m_block``."""
    r0 = m_block * block_m
    r1 = min((m_block + 1) * block_m, seqlen_q) - 1
    return r0, r1


def key_block_range(m_block: int, block_m: int, block_n: int, seqlen_q: int,
                    seqlen_k: int, causal: bool, left: int, right: int) -> tuple[int, int]:
    """Half-open range ``[n_min, n_max)`` of key blocks holding a visible key.

    Exact: every block in the range has at least one key visible to at least one
    row of the query block, and no block outside it has any.  An empty range is
    returned as ``(0, 0)``.

    Why exact: row ``i`` sees the interval ``[diag_i - left, diag_i + right]``
    (clipped to the keys); consecutive rows shift it by one and it is at least
    one key wide, so the union over the non-empty rows is one interval.
    """
    left, right = normalize_window(causal, (left, right))
    r0, r1 = _block_rows(m_block, block_m, seqlen_q)
    if r0 > r1 or seqlen_k <= 0 or r0 < 0:
        return 0, 0
    off = seqlen_k - seqlen_q
    # Rows whose clipped interval is non-empty: diag + right >= 0 and diag - left <= seqlen_k - 1.
    if right >= 0:
        r0 = max(r0, -off - right)
    if left >= 0:
        r1 = min(r1, seqlen_k - 1 - off + left)
    if r0 > r1:
        return 0, 0
    k_lo = max(0, r0 + off - left) if left >= 0 else 0
    k_hi = min(seqlen_k - 1, r1 + off + right) if right >= 0 else seqlen_k - 1
    return k_lo // block_n, k_hi // block_n + 1


def unmasked_key_block_range(m_block: int, block_m: int, block_n: int, seqlen_q: int,
                             seqlen_k: int, causal: bool, left: int,
                             right: int) -> tuple[int, int]:
    """Half-open range ``[lo, hi)`` of key blocks needing no mask at all.

    A block qualifies when it is full (all ``block_n`` keys are ``< seqlen_k``)
    and every (row, key) pair with the row in the query block (``< seqlen_q``) is
    visible.  It is always a sub-range of :func:`key_block_range`; an empty
    result has ``lo >= hi``.
    """
    left, right = normalize_window(causal, (left, right))
    r0, r1 = _block_rows(m_block, block_m, seqlen_q)
    if r0 > r1 or seqlen_k <= 0 or r0 < 0:
        return 0, 0
    off = seqlen_k - seqlen_q
    # The interval's left end grows with the row, its right end too: the last
    # row bounds the left edge, the first row bounds the right edge.
    k_lo = max(0, r1 + off - left) if left >= 0 else 0
    k_hi = min(seqlen_k - 1, r0 + off + right) if right >= 0 else seqlen_k - 1
    lo = -(-k_lo // block_n)           # first block starting at or after k_lo
    hi = (k_hi + 1) // block_n         # blocks ending at or before k_hi
    if hi <= lo:
        return 0, 0
    return lo, hi
