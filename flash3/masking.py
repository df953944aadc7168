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
* ``chunk`` (FA3's ``attention_chunk``, Llama 4's chunked local attention), 0 = none: query ``i``
  also sees only the keys of its diagonal's chunk, ``[c0, c0 + chunk)`` with
  ``c0 = diag - diag % chunk`` (Python's floored ``%``: a row with ``diag < 0`` sees no key). It
  intersects the window (flash3/reference/fa3.py ``_visible`` is the same).
"""

from __future__ import annotations

import torch

__all__ = [
    "normalize_window",
    "visible",
    "visible_mask",
    "visible_counts",
    "key_block_range",
    "unmasked_key_block_range",
    "query_block_range",
    "unmasked_query_block_range",
]


def normalize_window(causal: bool, window_size) -> tuple[int, int]:
    """Fold ``causal`` into the window: returns ``(left, right)``, -1 = unbounded."""
    left, right = int(window_size[0]), int(window_size[1])
    left = -1 if left < 0 else left
    right = -1 if right < 0 else right
    if causal:
        right = 0
    return left, right


def _chunk_start(pos: int, chunk: int) -> int:
    return pos - pos % chunk


def visible(i: int, j: int, seqlen_q: int, seqlen_k: int, causal: bool,
            window_left: int, window_right: int, chunk: int = 0) -> bool:
    """Whether query ``i`` may attend to key ``j`` (scalar version)."""
    left, right = normalize_window(causal, (window_left, window_right))
    if not (0 <= i < seqlen_q and 0 <= j < seqlen_k):
        return False
    diag = i + seqlen_k - seqlen_q
    if chunk > 0 and not (0 <= j - _chunk_start(diag, chunk) < chunk):
        return False
    if left >= 0 and j < diag - left:
        return False
    if right >= 0 and j > diag + right:
        return False
    return True


def visible_mask(row_start: int, row_end: int, col_start: int, col_end: int,
                 seqlen_q: int, seqlen_k: int, causal: bool,
                 window_left: int, window_right: int,
                 device=None, chunk: int = 0) -> torch.Tensor:
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
    if chunk > 0:
        c0 = diag - torch.remainder(diag, chunk)
        ok = ok & (cols >= c0) & (cols < c0 + chunk)
    return ok


def visible_counts(seqlen_q: int, seqlen_k: int, causal: bool, window_left: int,
                   window_right: int, device=None, chunk: int = 0) -> torch.Tensor:
    """Number of keys each query row sees, int64 ``(seqlen_q,)`` (``Mask::last_key(i + 1) -
    Mask::first_key(i)`` in attn_logic.h, clamped at 0)."""
    left, right = normalize_window(causal, (window_left, window_right))
    diag = torch.arange(seqlen_q, device=device) + (seqlen_k - seqlen_q)
    lo = (diag - left).clamp(min=0) if left >= 0 else torch.zeros_like(diag)
    hi = (diag + right + 1).clamp(max=seqlen_k) if right >= 0 else torch.full_like(diag, seqlen_k)
    if chunk > 0:
        c0 = diag - torch.remainder(diag, chunk)
        lo, hi = torch.maximum(lo, c0), torch.minimum(hi, c0 + chunk)
    return (hi - lo).clamp(min=0)


def _first_key(row: int, off: int, left: int, chunk: int) -> int:
    """No key below it is visible to ``row`` (>= 0); nondecreasing in the row."""
    lo = max(0, row + off - left) if left >= 0 else 0
    return max(lo, _chunk_start(row + off, chunk)) if chunk > 0 else lo


def _last_key(row: int, off: int, right: int, chunk: int, seqlen_k: int) -> int:
    """One past the last key visible to ``row`` (<= seqlen_k); nondecreasing in the row."""
    hi = min(seqlen_k, row + off + right + 1) if right >= 0 else seqlen_k
    return min(hi, _chunk_start(row + off, chunk) + chunk) if chunk > 0 else hi


def _block_rows(m_block, block_m, seqlen_q):
    """First and last (inclusive) query row of query block ``m_block``."""
    r0 = m_block * block_m
    r1 = min((m_block + 1) * block_m, seqlen_q) - 1
    return r0, r1


def key_block_range(m_block: int, block_m: int, block_n: int, seqlen_q: int,
                    seqlen_k: int, causal: bool, left: int, right: int, chunk: int = 0) -> tuple[int, int]:
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
    if chunk > 0:
        # Each row with diag >= 0 sees its diagonal key and both bounds are nondecreasing in the
        # row (rows with diag < 0 see nothing): the union is [first of r0, last of r1).
        k_lo, k_hi = _first_key(r0, off, left, chunk), _last_key(r1, off, right, chunk, seqlen_k)
        return (k_lo // block_n, -(-k_hi // block_n)) if k_lo < k_hi else (0, 0)
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
                             right: int, chunk: int = 0) -> tuple[int, int]:
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
    if chunk > 0:  # the same with the chunk bounds (rows of two chunks share no key)
        k_lo = _first_key(r1, off, left, chunk)
        k_hi = _last_key(r0, off, right, chunk, seqlen_k) - 1
    lo = -(-k_lo // block_n)           # first block starting at or after k_lo
    hi = (k_hi + 1) // block_n         # blocks ending at or before k_hi
    if hi <= lo:
        return 0, 0
    return lo, hi


# The backward walks the transpose: one CTA per key block visits the query blocks that see it.

def _block_keys(n_block, block_n, seqlen_k):
    """First and last (inclusive) key of key block ``n_block``."""
    c0 = n_block * block_n
    return c0, min((n_block + 1) * block_n, seqlen_k) - 1


def query_block_range(n_block: int, block_m: int, block_n: int, seqlen_q: int,
                      seqlen_k: int, causal: bool, left: int, right: int, chunk: int = 0) -> tuple[int, int]:
    """Half-open range ``[m_min, m_max)`` of query blocks with a row that sees key block ``n_block``.

    Exact, by the argument of :func:`key_block_range` with rows and keys swapped: key ``j`` is
    seen by the rows ``i`` with ``j - off - right <= i <= j - off + left`` (off = s_k - s_q),
    an interval that shifts by one per key, so the rows seeing any key of the block form one
    interval. Empty as ``(0, 0)``.
    """
    left, right = normalize_window(causal, (left, right))
    c0, c1 = _block_keys(n_block, block_n, seqlen_k)
    if c0 > c1 or seqlen_q <= 0 or c0 < 0:
        return 0, 0
    off = seqlen_k - seqlen_q
    r_lo = max(0, c0 - off - right) if right >= 0 else 0
    r_hi = min(seqlen_q - 1, c1 - off + left) if left >= 0 else seqlen_q - 1
    if chunk > 0:
        # The chunk is symmetric: key j is seen only by rows whose diagonal is in j's chunk. The
        # keys no row sees form a prefix of the keys, so the union stays one interval.
        r_lo = max(r_lo, _chunk_start(c0, chunk) - off)
        r_hi = min(r_hi, _chunk_start(c1, chunk) + chunk - 1 - off)
    if r_lo > r_hi:
        return 0, 0
    return r_lo // block_m, r_hi // block_m + 1


def unmasked_query_block_range(n_block: int, block_m: int, block_n: int, seqlen_q: int,
                               seqlen_k: int, causal: bool, left: int,
                               right: int, chunk: int = 0) -> tuple[int, int]:
    """Half-open range ``[lo, hi)`` of query blocks that need no mask against key block ``n_block``.

    As in the forward, both blocks must be full (``block_m`` rows ``< seqlen_q``, ``block_n``
    keys ``< seqlen_k``) and every (row, key) pair visible. A sub-range of
    :func:`query_block_range`; empty as ``lo >= hi``.
    """
    left, right = normalize_window(causal, (left, right))
    c0, c1 = _block_keys(n_block, block_n, seqlen_k)
    if c0 < 0 or c0 + block_n > seqlen_k or seqlen_q <= 0:
        return 0, 0
    off = seqlen_k - seqlen_q
    # Every key of the block visible to row i: the last key bounds the rows from below (right
    # edge), the first key bounds them from above (left edge).
    r_lo = max(0, c1 - off - right) if right >= 0 else 0
    r_hi = min(seqlen_q - 1, c0 - off + left) if left >= 0 else seqlen_q - 1
    if chunk > 0:
        r_lo = max(r_lo, _chunk_start(c1, chunk) - off)
        r_hi = min(r_hi, _chunk_start(c0, chunk) + chunk - 1 - off)
    lo = -(-r_lo // block_m)          # first block starting at or after r_lo
    hi = (r_hi + 1) // block_m        # full blocks ending at or before r_hi
    if hi <= lo:
        return 0, 0
    return lo, hi
