#!/usr/bin/env python3
"""What the deterministic backward's dQ order costs: schedule arithmetic, not a replay.

The timing model cannot replay the deterministic backward at a real shape (a sampled CTA would wait
on skipped ones, and a semaphore poll has no event in the replay: perf_model.md, "Deterministic
backward"), so this works the grid's schedule out from three times taken from the model:

  T     one 64-query step of a backward CTA (d 128): the model's main kernel at b 4 s 4096 h 16,
        1478.7 us over 2048 CTAs x 64 steps / 132 SMs = 993 steps per SM: 1.49 us;
  A     one ordered dQ add, issue to the semaphore's increment: the model's local deterministic row
        waits 1486 cycles for the bulk reduce-add's global completion, plus ~300 for the fences and
        the atomic, at 1673 MHz: 1.07 us (0.16 us for the default mode's `.read` wait);
  WAKE  a poll's wake-up after the turn came: half the longest sleep (256 ns) plus a load of ~260
        cycles: 0.29 us.

CTAs (key block, head, batch), key blocks fastest, one per SM, take the first SM that frees, in
block-index order. A CTA's consumers run its query blocks in ascending order, one step each, and
hand each step's dQ to the writer warp, one step ahead at most (one staging buffer); the writer
adds step i once the query block's semaphore shows its turn. Orders: `ascending` (key block n adds
after every key block before it; the grid ascending: flash3 until 2026-12-01) and `descending`
(after every key block after it; the grid reversed so those launched first: attn_logic.h
bwd_dq_rank / bwd_key_block). Masks: full or causal (s_q = s_k); equal step times, no tile tail.

The H200 (benchmarks/results/h200_2026-11-30.md, bench_bwd, d 128, h 16, b*s 16k) measured the
ascending order's cost at +32% / +13% (full, s 2k / 8k) and +78% / +110% (causal): the check of
this arithmetic, never an input to it.
"""

from __future__ import annotations

import argparse
import heapq

T_STEP_US, ADD_US, WAKE_US, ADD_DEFAULT_US = 1.49, 1.07, 0.29, 0.16


def grid_time(s: int, heads: int, batch: int, causal: bool, order: str | None, *, t=T_STEP_US, add=ADD_US,
              wake=WAKE_US, add_default=ADD_DEFAULT_US, sms=132, block_m=64, block_n=128) -> float:
    """The backward main kernel's time (the unit of t) with the dQ adds in `order` ('ascending',
    'descending', or None: the default mode, unordered)."""
    m_blocks, n_blocks = -(-s // block_m), -(-s // block_n)

    def first_query_block(n):  # the first query block that sees key block n
        return n * block_n // block_m if causal else 0

    def key_blocks(m):  # the key blocks query block m sees: [0, end)
        return min(n_blocks, (m * block_m + block_m - 1) // block_n + 1) if causal else n_blocks

    done = {}  # (batch, head, m, rank) -> when that add completed
    free = [0.0] * sms
    end = 0.0
    for z in range(batch):
        for y in range(heads):
            for x in range(n_blocks):
                n = n_blocks - 1 - x if order == "descending" else x
                start = heapq.heappop(free)
                hand = writer = start
                for i, m in enumerate(range(first_query_block(n), m_blocks)):
                    hand = max(hand + t, writer if i else start)  # step i handed to the writer
                    if order is None:
                        writer = max(hand, writer) + add_default
                        continue
                    rank = n if order == "ascending" else key_blocks(m) - 1 - n
                    turn = 0.0
                    if rank:  # the previous add, by a CTA launched earlier (else a KeyError)
                        turn = done[(z, y, m, rank - 1)] + wake
                    writer = max(hand, writer, turn) + add
                    done[(z, y, m, rank)] = writer
                heapq.heappush(free, writer)
                end = max(end, writer)
    return end


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=16384, help="b * s")
    args = ap.parse_args()
    print("| mask | s | b | default us | ascending: cost | descending: cost |")
    print("|---|---|---|---|---|---|")
    for causal in (False, True):
        for s in (2048, 8192):
            b = args.tokens // s
            base = grid_time(s, args.heads, b, causal, None)
            asc = grid_time(s, args.heads, b, causal, "ascending")
            desc = grid_time(s, args.heads, b, causal, "descending")
            print(f"| {'causal' if causal else 'full'} | {s} | {b} | {base:.0f} | {asc:.0f}: +{asc / base - 1:.0%} "
                  f"| {desc:.0f}: +{desc / base - 1:.0%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
