"""Host logic of the decoding (KV-cache) kernels: the Python specification.

csrc/flash3/decode/split_heuristic.h implements the same functions in C++ and
tests/test_split_heuristic.py checks that both agree on many inputs.

Split-KV
--------
A decoding call has few query rows: ``batch * h_k * ceil(s_q * g / block_m)``
work tiles (GQA packed: the g = h / h_k query heads sharing a kv head are rows of
one tile).  With fewer tiles than SMs most of the GPU idles while each CTA walks a
long cache.  Splitting each row's key blocks into ``num_splits`` contiguous ranges
multiplies the tiles; each split writes a partial O (fp32) and lse, and a combine
pass merges them (``reference.combine_splits``).  Splits cost extra HBM traffic
(partials written and read back) and a second launch, so the heuristic picks the
*smallest* count that is nearly as good as the best:

1. Grid already (almost) full: ``tiles >= 0.8 * num_sms`` -> 1.
2. Candidates s = 1 .. cap, cap = min(max_splits, 128, num_sms,
   num_n_blocks // MIN_BLOCKS_PER_SPLIT): every split keeps at least
   MIN_BLOCKS_PER_SPLIT key blocks of work, so a split's fixed cost (loading Q,
   writing its partial) stays amortized, and never more splits than key blocks.
3. Only *non-redundant* counts: s is skipped when ceil(n/s) == ceil(n/(s-1))
   (same blocks per split as s-1, so the extra split would only add an empty
   or shorter range).  The smallest s for a given blocks-per-split leaves no
   split empty.
4. Wave efficiency of s: the busy fraction of the last wave,
   ``w / ceil(w)`` with ``w = tiles * s / num_sms``.  Take the best over the
   candidates and return the smallest candidate reaching 85% of it.

Everything is integer arithmetic (efficiencies compared by cross-multiplying)
so C++ and Python agree exactly.  Unlike flash-attn's heuristic there is no
L2-size rule for full grids with very long caches: a full grid returns 1.

Page addressing
---------------
Key position ``pos`` of a row lives in page ``page_table[row, pos // page_size]``
at offset ``pos % page_size``.  The kernels' contract for bad values (no host
check in their call path): a key position outside ``[0, max_pages * page_size)``
or a page id outside ``[0, num_pages)`` is never written (the append drops it) and
never read outside the cache: the decode kernel attends to a key position past the
capacity not at all (lengths are clamped) and to a key behind a bad page id as a
zero key and value (that row's result is wrong, every other row's untouched).  So a
bad page id never touches another sequence's memory.  :func:`page_slot` states the
addressing.
"""

from __future__ import annotations

MAX_SPLITS = 128
MIN_BLOCKS_PER_SPLIT = 2
FILL_NUM, FILL_DEN = 4, 5  # "grid full" threshold: tiles >= 0.8 * num_sms
SLACK_NUM, SLACK_DEN = 85, 100  # smallest split count within 85% of the best efficiency


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def decode_tiles(batch: int, seqlen_q: int, h: int, h_k: int, block_m: int) -> int:
    """Work tiles of one (unsplit) decoding launch, GQA packed into the rows."""
    g = h // h_k
    return batch * h_k * ceil_div(seqlen_q * g, block_m)


def _eligible(s: int, n_blocks: int) -> bool:
    return s == 1 or ceil_div(n_blocks, s) != ceil_div(n_blocks, s - 1)


def _work_waves(tiles: int, s: int, num_sms: int):
    work = tiles * s
    return work, ceil_div(work, num_sms)


def num_splits_heuristic(total_tiles: int, num_sms: int, num_n_blocks: int,
                         max_splits: int = MAX_SPLITS) -> int:
    """The number of splits for ``num_splits=0`` (see the module docstring)."""
    if total_tiles <= 0 or num_sms <= 0 or num_n_blocks <= 0:
        return 1
    if total_tiles * FILL_DEN >= num_sms * FILL_NUM:
        return 1
    cap = min(max_splits, MAX_SPLITS, num_sms, num_n_blocks // MIN_BLOCKS_PER_SPLIT)
    if cap <= 1:
        return 1
    cands = [s for s in range(1, cap + 1) if _eligible(s, num_n_blocks)]
    best_work, best_waves = _work_waves(total_tiles, 1, num_sms)
    for s in cands:
        work, waves = _work_waves(total_tiles, s, num_sms)
        if work * best_waves > best_work * waves:  # strictly better efficiency
            best_work, best_waves = work, waves
    for s in cands:
        work, waves = _work_waves(total_tiles, s, num_sms)
        if SLACK_DEN * work * best_waves >= SLACK_NUM * best_work * waves:
            return s
    return 1  # unreachable: the best candidate qualifies


def resolve_num_splits(num_splits: int, total_tiles: int, num_sms: int,
                       num_n_blocks: int) -> int:
    """num_splits as the kernel will run it: 0 = heuristic; an explicit count is clamped to
    [1, min(128, num_n_blocks)] (more splits than key blocks would only be empty)."""
    if num_splits <= 0:
        return num_splits_heuristic(total_tiles, num_sms, num_n_blocks)
    return max(1, min(num_splits, MAX_SPLITS, max(num_n_blocks, 1)))


def split_key_range(split: int, num_splits: int, n_keys: int, block_n: int):
    """Keys [begin, end) of split ``split`` of a row with n_keys keys: the row's key blocks are
    dealt out in contiguous runs of ceil(n_blocks / num_splits); a split past the end is empty
    (begin == end == n_keys)."""
    n_blocks = ceil_div(n_keys, block_n)
    per = ceil_div(n_blocks, num_splits) if n_blocks else 0
    begin = min(split * per * block_n, n_keys)
    end = min((split + 1) * per * block_n, n_keys)
    return begin, end


def page_slot(pos: int, page_size: int, max_pages: int, num_pages: int, page_table_row):
    """(page, offset) holding key position ``pos`` of a row, or None if it must be skipped
    (position outside the row's table, or a page id outside [0, num_pages))."""
    if pos < 0 or page_size <= 0 or pos >= max_pages * page_size:
        return None
    page = int(page_table_row[pos // page_size])
    if page < 0 or page >= num_pages:
        return None
    return page, pos % page_size
