"""The forward and backward kernels' host/device logic (csrc/flash3/common/attn_logic.h), proven
on the CPU.

The header is compiled with the host C++ compiler into a small driver (tests/cpp/) and checked
against flash3.masking (the Python specification) and against brute force over the mask.
"""
import importlib.util
import itertools
import random
import sys
from pathlib import Path

import pytest
from helpers import cpp_driver

from flash3 import masking

ROOT = Path(__file__).resolve().parents[1]
SMEM_LIMIT = 227 * 1024  # Hopper: usable dynamic shared memory per block


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    return cpp_driver("host_logic_driver.cpp", tmp_path_factory.mktemp("host_logic"))


def random_masks(n, seed=0):
    """Mask configurations covering s_q > s_k, s_q < s_k, length 1, odd lengths and windows."""
    rng = random.Random(seed)
    lengths = [1, 2, 7, 63, 64, 65, 113, 128, 129, 203, 256, 300]
    cases = []
    for _ in range(n):
        sq, sk = rng.choice(lengths), rng.choice(lengths)
        causal = rng.random() < 0.5
        left = rng.choice([-1, -1, 0, 1, 17, 64, 100, 500])
        right = rng.choice([-1, -1, 0, 1, 33, 128])
        cases.append((sq, sk, causal, left, right))
    return cases


def brute_visible(sq, sk, causal, left, right):
    left, right = masking.normalize_window(causal, (left, right))
    return [[masking.visible(i, j, sq, sk, False, left, right) for j in range(sk)]
            for i in range(sq)]


def test_mask_predicate_matches_python_spec(driver):
    cases = random_masks(60, seed=1)
    answers = driver([f"visible {sq} {sk} {int(c)} {l} {r}" for sq, sk, c, l, r in cases])
    for (sq, sk, causal, left, right), bits in zip(cases, answers):
        vis = brute_visible(sq, sk, causal, left, right)
        assert bits == "".join("1" if v else "0" for row in vis for v in row), (sq, sk, causal, left, right)


@pytest.mark.parametrize("block_m,block_n", [(128, 128), (192, 128), (128, 112), (128, 80), (64, 48)])
def test_block_ranges_exact(driver, block_m, block_n):
    cases = random_masks(80, seed=block_m * 1000 + block_n)
    answers = driver([f"ranges {sq} {sk} {int(c)} {l} {r} {block_m} {block_n}"
                      for sq, sk, c, l, r in cases])
    for (sq, sk, causal, left, right), line in zip(cases, answers):
        vis = brute_visible(sq, sk, causal, left, right)
        wl, wr = masking.normalize_window(causal, (left, right))
        per_m = [tuple(map(int, part.split())) for part in line.split(";") if part]
        assert len(per_m) == -(-sq // block_m)
        for m, (b, e, ub, ue) in enumerate(per_m):
            rows = range(m * block_m, min((m + 1) * block_m, sq))
            nblocks = -(-sk // block_n)
            keys = lambda n: range(n * block_n, min((n + 1) * block_n, sk))
            touched = {n for n in range(nblocks) if any(vis[i][j] for i in rows for j in keys(n))}
            full = {n for n in range(nblocks) if (n + 1) * block_n <= sk
                    and all(vis[i][j] for i in rows for j in keys(n))}
            # Visited blocks: exactly the blocks holding a visible key, as one contiguous range.
            assert set(range(b, e)) == touched, (sq, sk, causal, left, right, m)
            # Unmasked blocks: exactly the full, fully visible ones, inside the visited range.
            assert set(range(ub, ue)) == full, (sq, sk, causal, left, right, m)
            if ub < ue:
                assert b <= ub and ue <= e
            # The Python specification agrees.
            args = (m, block_m, block_n, sq, sk, causal, wl, wr)
            pb, pe = masking.key_block_range(*args)
            assert set(range(pb, pe)) == touched
            pub, pue = masking.unmasked_key_block_range(*args)
            assert set(range(pub, pue)) == full


DECODE_TILES = [(128, 128, 8, 3), (192, 96, 4, 1), (128, 80, 16, 5), (128, 112, 1, 2), (64, 48, 3, 7)]


@pytest.mark.parametrize("block_m,block_n,g,splits", DECODE_TILES)
def test_decode_tile_ranges_exact(driver, block_m, block_n, g, splits):
    """Packed GQA tiles (row R = token * g + head) and split-KV: the visited key blocks are exactly
    those a tile's tokens see within its split's share (decode_plan.split_key_range, in blocks);
    every visible (row, key) pair lands in exactly one split."""
    cases = [c for c in random_masks(60, seed=block_m + g * 7 + splits) if c[0] * g <= 1200]
    answers = driver([f"decode_ranges {sq} {sk} {int(c)} {l} {r} {block_m} {block_n} {g} {splits}"
                      for sq, sk, c, l, r in cases])
    check_decode_ranges([(c, brute_visible(*c)) for c in cases], answers, block_m, block_n, g, splits)


@pytest.mark.parametrize("block_m,block_n,g,splits", DECODE_TILES)
def test_decode_tile_ranges_exact_with_chunk(driver, block_m, block_n, g, splits):
    """The same with an attention chunk (the decode kernels' ranges from Mask::row_keys of the
    tile's first and last token: one unsigned division each)."""
    cases = [c for c in random_chunk_masks(60, seed=3 + block_m + g * 7 + splits) if c[0] * g <= 1200]
    answers = driver([_line("decode_ranges", c, block_m, block_n, g, splits) for c in cases])
    check_decode_ranges([(c, brute_chunk_visible(*c)) for c in cases], answers, block_m, block_n, g,
                        splits)


def test_row_keys_are_the_visible_runs(driver):
    """Mask::row_keys (the decode kernels' per-row run, with or without a chunk): each row's
    visible keys are exactly [lo, hi) (empty rows: lo >= hi), and lo, hi never decrease."""
    cases = (random_chunk_masks(60, seed=31) + [(10, 4, False, -1, -1, 8), (4, 10, True, -1, -1, 3),
                                                 (300, 65, True, 5, -1, 48)]
             + [c + (0,) for c in random_masks(30, seed=32)])
    for case, line in zip(cases, driver([_line("row_keys", c) for c in cases])):
        vis = brute_chunk_visible(*case)
        runs = [tuple(map(int, x.split())) for x in line.split(";")]
        for i, (lo, hi) in enumerate(runs):
            assert vis[i] == [lo <= j < hi for j in range(case[1])], (case, i)
        assert all(a[0] <= b[0] and a[1] <= b[1] for a, b in zip(runs, runs[1:])), case


def check_decode_ranges(cases, answers, block_m, block_n, g, splits):
    """decode_ranges answers against brute force: cases are (mask case, visible[i][j])."""
    from flash3.decode_plan import split_key_range
    for (case, vis), line in zip(cases, answers):
        sq, sk = case[:2]
        parts = [tuple(map(int, part.split())) for part in line.split(";") if part]
        m_blocks = -(-sq * g // block_m)
        assert len(parts) == m_blocks * splits
        seen = [[0] * sk for _ in range(sq)]
        for idx, (t0, t1, b, e, ub, ue) in enumerate(parts):
            m, s = divmod(idx, splits)
            rows = range(m * block_m, min((m + 1) * block_m, sq * g))
            tokens = sorted({r // g for r in rows})
            assert (t0, t1) == ((tokens[0], tokens[-1] + 1) if tokens else (0, 0))
            k0, k1 = split_key_range(s, splits, sk, block_n)
            share = set(range(k0 // block_n, -(-k1 // block_n))) if k0 < k1 else set()
            keys = lambda n: range(n * block_n, min((n + 1) * block_n, sk))  # noqa: E731
            touched = {n for n in share if any(vis[i][j] for i in tokens for j in keys(n))}
            full = {n for n in touched if (n + 1) * block_n <= sk
                    and all(vis[i][j] for i in tokens for j in keys(n))}
            assert set(range(b, e)) == touched, (case, m, s)
            assert set(range(ub, ue)) == full, (case, m, s)
            for i in tokens:
                for n in range(b, e):
                    for j in keys(n):
                        seen[i][j] += 1
        if block_m % g == 0:  # tiles hold whole tokens: each visible pair is computed once
            assert all(seen[i][j] == 1 for i in range(sq) for j in range(sk) if vis[i][j])


@pytest.mark.parametrize("block_m,block_n", [(64, 128), (128, 128), (64, 80), (128, 48), (48, 64)])
def test_backward_query_block_ranges_exact(driver, block_m, block_n):
    """The backward's transpose: per key block, the query blocks that see it, and those of them
    needing no mask, exactly (brute force), in C++ and in the Python specification."""
    cases = random_masks(80, seed=7 + block_m * 1000 + block_n)
    answers = driver([f"qranges {sq} {sk} {int(c)} {l} {r} {block_m} {block_n}"
                      for sq, sk, c, l, r in cases])
    for (sq, sk, causal, left, right), line in zip(cases, answers):
        vis = brute_visible(sq, sk, causal, left, right)
        wl, wr = masking.normalize_window(causal, (left, right))
        per_n = [tuple(map(int, part.split())) for part in line.split(";") if part]
        assert len(per_n) == -(-sk // block_n)
        mblocks = -(-sq // block_m)
        rows = lambda m: range(m * block_m, min((m + 1) * block_m, sq))
        for n, (b, e, ub, ue) in enumerate(per_n):
            keys = range(n * block_n, min((n + 1) * block_n, sk))
            touched = {m for m in range(mblocks) if any(vis[i][j] for i in rows(m) for j in keys)}
            full = {m for m in range(mblocks) if (m + 1) * block_m <= sq
                    and (n + 1) * block_n <= sk and all(vis[i][j] for i in rows(m) for j in keys)}
            assert set(range(b, e)) == touched, (sq, sk, causal, left, right, n)
            assert set(range(ub, ue)) == full, (sq, sk, causal, left, right, n)
            if ub < ue:
                assert b <= ub and ue <= e
            args = (n, block_m, block_n, sq, sk, causal, wl, wr)
            assert set(range(*masking.query_block_range(*args))) == touched
            assert set(range(*masking.unmasked_query_block_range(*args))) == full


def test_fp8_varlen_vt_offsets(driver):
    """Packed FP8 Vt: each sequence starts at a multiple of 16, its keys rounded up to 16 fit before
    the next one's start, and C++ and flash3.fp8 agree (the kernel and the packer address alike)."""
    from flash3.fp8 import varlen_vt_offset

    rng = random.Random(3)
    for _ in range(40):
        lens = [rng.choice([0, 1, 15, 16, 17, rng.randrange(300)]) for _ in range(rng.randrange(1, 9))]
        cu = [0] + list(itertools.accumulate(lens))
        starts = [int(x) for x in driver([f"vt_offset {c} {i}" for i, c in enumerate(cu)])]
        assert starts == [varlen_vt_offset(c, i) for i, c in enumerate(cu)]
        for i, n in enumerate(lens):
            assert starts[i] % 16 == 0 and starts[i] + -(-n // 16) * 16 <= starts[i + 1], (lens, i)
    assert int(driver(["vt_offset 2000000000 100000"])[0]) == varlen_vt_offset(2000000000, 100000)


def test_mask_transpose_matches_python_spec(driver):
    """Mask::first_query/last_query: key j is seen by exactly the queries [first, last) (empty for
    a key nobody sees, and for keys outside [0, seqlen_k)), as flash3.masking.visible says."""
    cases = random_masks(50, seed=11)
    rng = random.Random(12)
    tiny = [1, 2, 3, 5]
    for _ in range(40):  # tiny lengths, s_q != s_k, windows wider than the sequences
        cases.append((rng.choice(tiny), rng.choice(tiny), rng.random() < 0.5,
                      rng.choice([-1, 0, 1, 2, 7]), rng.choice([-1, 0, 1, 2, 7])))
    cases += [(1, 1, True, -1, -1), (1, 300, True, -1, -1), (300, 1, True, -1, -1),
              (7, 63, False, 0, 0), (63, 7, False, 0, 0), (65, 64, True, 3, -1)]
    lo, hi = -2, 3  # keys from 2 before the first to 3 past seqlen_k
    answers = driver([f"queries {sq} {sk} {int(c)} {l} {r} {lo} {sk + hi}" for sq, sk, c, l, r in cases])
    for (sq, sk, causal, left, right), line in zip(cases, answers):
        per_key = [tuple(map(int, part.split())) for part in line.split(";") if part]
        assert len(per_key) == sk + hi - lo
        for j, (first, last) in zip(range(lo, sk + hi), per_key):
            seen = {i for i in range(sq) if masking.visible(i, j, sq, sk, causal, left, right)}
            assert set(range(first, last)) == seen, (sq, sk, causal, left, right, j, first, last)
            if seen:
                assert 0 <= first and last <= sq


def test_key_counts_match_python_spec(driver):
    """Mask::key_count (the backward's one-key rows, bwd/kernel.cuh one_hot_rows): clamped at 0 it is
    flash3.masking.visible_counts; and it is concave, so over any block of rows its minimum is at the
    block's first or last row (what one_key_step looks at)."""
    cases = random_masks(40, seed=13) + [(7, 1, False, -1, -1), (7, 1, True, -1, -1), (150, 150, False, 0, 0),
                                         (5, 9, True, 2, -1), (9, 5, False, 0, 2), (1, 3, True, -1, -1)]
    answers = driver([f"key_counts {sq} {sk} {int(c)} {l} {r}" for sq, sk, c, l, r in cases])
    for (sq, sk, causal, left, right), line in zip(cases, answers):
        n = [int(x) for x in line.split(";") if x]
        assert [max(0, x) for x in n] == masking.visible_counts(sq, sk, causal, left, right).tolist()
        for a in range(0, sq, 7):
            for b in range(a, min(sq, a + 70), 5):
                assert min(n[a:b + 1]) == min(n[a], n[b]), (sq, sk, causal, left, right, a, b)


def test_row_bounds_key_floor(driver):
    """The kernels' per-row run of visible keys (softmax.cuh apply_mask): key j in [0, seqlen_k) is
    visible to row i iff key_floor(i) <= j < last_key(i + 1); key_floor is first_key before its
    clamp at 0 and grows by exactly 1 per row (a thread's later rows follow from its first), or is
    kNoLeftBound (far below any key) without a left bound."""
    cases = random_masks(40, seed=17) + [(200, 300, False, 97, 13), (300, 200, True, 5, -1), (9, 5, False, 0, 2)]
    answers = driver([f"row_bounds {sq} {sk} {int(c)} {l} {r}" for sq, sk, c, l, r in cases])
    for (sq, sk, causal, left, right), line in zip(cases, answers):
        rows = [tuple(map(int, x.split())) for x in line.split(";")]
        vis = brute_visible(sq, sk, causal, left, right)
        for i, (lo, hi) in enumerate(rows):
            assert vis[i] == [lo <= j < hi for j in range(sk)], (sq, sk, causal, left, right, i)
            if left < 0:
                assert lo == -(1 << 30)
            elif i:
                assert lo == rows[i - 1][0] + 1


@pytest.mark.parametrize("align", [16, 64])
def test_padded_seq_offsets(driver, align):
    """padded_seq_offset: every sequence starts at a multiple of `align` and its rows, rounded up
    to `align`, end before the next sequence starts (zero-length sequences included)."""
    rng = random.Random(align)
    for _ in range(60):
        lens = [rng.choice([0, 0, 1, align - 1, align, align + 1, rng.randrange(1000)])
                for _ in range(rng.randrange(1, 12))]
        cu = [0] + list(itertools.accumulate(lens))
        starts = [int(x) for x in driver([f"padded_offset {c} {b} {align}" for b, c in enumerate(cu)])]
        for b, n in enumerate(lens):
            assert starts[b] % align == 0 and starts[b] >= cu[b], (lens, b)
            assert starts[b + 1] - starts[b] >= -(-n // align) * align, (lens, b)
        assert starts[-1] % align == 0
    # The FP8 varlen Vt offset is the align-16 case.
    for first, batch in [(0, 0), (12345, 67), (2000000000, 100000)]:
        padded, vt = driver([f"padded_offset {first} {batch} 16", f"vt_offset {first} {batch}"])
        assert padded == vt
    big = driver(["padded_offset 2000000000 100000 64"])[0]
    assert int(big) == (2000000000 + 63 * 100001) // 64 * 64


def test_total_rows_limit_same_for_forward_and_backward(driver):
    """total_q / total_k (issue 23: the batched backward rejected b * s >= 2^31 where the forward
    clamped). One rule, csrc/flash3/host/check.h total_rows for both ops: varlen packed row counts are
    int32 in the kernels (rejected past 2^31 - 1); batched calls never read them (clamped)."""
    i32 = 2**31 - 1
    cases = [(0, 0), (0, 1), (5, 0), (5, 1), (i32, 0), (i32, 1), (i32 + 1, 0), (i32 + 1, 1),
             (2**40, 0), (2**40, 1), (-1, 0), (-1, 1)]
    got = [int(a) for a in driver([f"total_rows {t} {v}" for t, v in cases])]
    want = [-1 if t < 0 or (v and t > i32) else min(t, i32) for t, v in cases]
    assert got == want
    root = Path(__file__).resolve().parents[1] / "csrc" / "flash3" / "host"
    for src in ("fwd_params.cpp", "bwd.cpp"):
        text = (root / src).read_text()
        assert 'total_rows(' in text and 'to_int(total_q' not in text and 'to_int(total_k' not in text, src


BWD_SMEM_LIMIT = SMEM_LIMIT - 2048  # slack for the mbarriers and other static shared memory


@pytest.mark.parametrize("d,dv", [(64, 64), (96, 96), (128, 128), (192, 192), (192, 128), (256, 256)])
def test_bwd_tile_shapes_fit_the_hardware(driver, d, dv):
    block_m, block_n, stages_q, stages_do, split_d, smem = map(int, driver([f"bwd_tile_shape {d} {dv}"])[0].split())
    assert block_m == 64 and block_n in (64, 128)
    assert stages_q >= 1 and stages_do >= 1
    # Q and dO stages, K and V, dS twice (16-bit), dQ in fp32.
    assert smem == 2 * (stages_q * 64 * d + stages_do * 64 * dv + block_n * (d + dv) + 2 * 64 * block_n) \
        + 4 * 64 * d
    assert smem <= BWD_SMEM_LIMIT
    # Both warpgroups take the same 64 keys and half of dK's/dV's columns exactly when the full
    # accumulators would not fit.
    assert bool(split_d) == (d > 128 or dv > 128)
    assert block_n == (64 if split_d else 128)  # 64 keys per consumer warpgroup
    # Registers per consumer thread (setmaxnreg 240, 16 for addressing): dK d/2 + dV d_v/2 (half
    # of each when split_d) + S^T 32, dP^T 32, P 16, dS 16.
    acc = (d // 2 + dv // 2) // (2 if split_d else 1)
    assert acc + 96 <= 240 - 16


@pytest.mark.parametrize("block_n", [64, 128])
def test_forward_and_backward_block_ranges_agree(driver, block_n):
    """Key block n is in query block m's key_block_range iff m is in n's query_block_range, and
    bwd_dq_rank numbers the key blocks adding into query block m 0, 1, 2, ... in descending n (the
    last key block that sees m adds first)."""
    block_m = 64
    cases = random_masks(80, seed=21 + block_n)
    cases += [(1, 1, True, -1, -1), (2, 300, True, 0, -1), (300, 2, False, 1, 1), (129, 128, True, -1, -1),
              (700, 1000, True, -1, -1), (1000, 700, False, 200, 100), (1000, 1000, True, 300, -1)]
    answers = driver([f"bwd_ranges {sq} {sk} {int(c)} {l} {r} {block_m} {block_n}" for sq, sk, c, l, r in cases])
    for case, line in zip(cases, answers):
        sq, sk = case[:2]
        fwd_part, bwd_part = line.split("|")
        per_m = [list(map(int, part.split())) for part in fwd_part.split(";") if part]
        per_n = [tuple(map(int, part.split())) for part in bwd_part.split(";") if part]
        assert len(per_m) == -(-sq // block_m) and len(per_n) == -(-sk // block_n)
        for m, (b, e, *ranks) in enumerate(per_m):
            assert ranks == list(range(max(0, e - b)))[::-1], (case, m)
            for n, (qb, qe) in enumerate(per_n):
                assert (b <= n < e) == (qb <= m < qe), (case, m, n)
        # Why the descending order waits little: a key block's first query block never decreases
        # with n, so key block n + 1 reaches a query block no later than n does.
        firsts = [qb for qb, qe in per_n if qb < qe]
        assert firsts == sorted(firsts), case


def test_deterministic_backward_waits_only_on_earlier_ctas(driver):
    """Deterministic mode reverses the backward grid's key blocks (bwd_key_block): key block n waits
    for the key blocks after it (bwd_dq_rank, descending), which then have lower block indices, so
    they were launched before it (no CTA waits on one that may not be resident). The default grid
    keeps key block x at blockIdx.x = x (causal: the longest CTAs first)."""
    for n_blocks in (1, 2, 7, 64):
        det, plain = driver([f"bwd_key_blocks {n_blocks} 1", f"bwd_key_blocks {n_blocks} 0"])
        order = list(map(int, det.split()))
        assert order == list(range(n_blocks))[::-1]
        assert list(map(int, plain.split())) == list(range(n_blocks))
        x_of = {n: x for x, n in enumerate(order)}
        # rank r of query block m is key block last - r; rank r waits for rank r - 1, key block n + 1.
        assert all(x_of[n + 1] < x_of[n] for n in range(n_blocks - 1))


def test_tile_order_is_a_permutation_heaviest_first_and_grouped(driver):
    cases = [(1, 1, 1, 128, 128, 128, 1, 50 << 20, 0),
             (7, 16, 3, 1024, 128, 128, 16, 50 << 20, 1),
             (33, 32, 2, 16384, 128, 128, 8, 50 << 20, 1),     # GQA, K/V larger than L2 per group
             (5, 12, 2, 65536, 256, 256, 12, 50 << 20, 0),     # one head per group
             (64, 8, 1, 8192, 64, 64, 1, 50 << 20, 1)]         # MQA
    answers = driver(["tiles " + " ".join(map(str, c)) for c in cases])
    for (nm, h, b, sk, d, dv, hk, l2, causal), line in zip(cases, answers):
        parts = line.split(";")
        hpg = int(parts[0])
        tiles = [tuple(map(int, p.split())) for p in parts[1:]]
        assert sorted(tiles) == sorted(itertools.product(range(nm), range(h), range(b)))
        # Heads per group: K/V of the group fit in half of L2 (or a single KV head's q heads).
        q_per_kv = h // hk
        assert hpg % q_per_kv == 0 or hpg == h
        assert hpg == q_per_kv or (hpg // q_per_kv) * 2 * sk * (d + dv) <= l2 // 2
        # Within a (batch, head group), causal tiles come heaviest (last query block) first.
        for idx in range(1, len(tiles)):
            (m0, h0, b0), (m1, h1, b1) = tiles[idx - 1], tiles[idx]
            if b0 == b1 and h0 // hpg == h1 // hpg:
                assert (m1 <= m0) if causal else (m1 >= m0)
        # Batches and groups are contiguous runs (K/V stay resident in L2 while used).
        keys = [(bb, hh // hpg) for _, hh, bb in tiles]
        runs = [k for i, k in enumerate(keys) if i == 0 or keys[i - 1] != k]
        assert len(runs) == len(set(runs))


def test_tile_pairs_share_head_and_batch(driver):
    """The forward's 2-CTA clusters (TileOrder::at_pair_tile, fwd/kernel.cuh): tiles 2i and 2i + 1 are
    query blocks 2j and 2j + 1 of one (head, batch), so a cluster of a static schedule (CTAs c, c + 1
    of an even grid, each stepping by the grid) sees the same key blocks in both CTAs; the numbering
    is still a permutation of every tile, and its pairs keep the plain order's head grouping."""
    cases = [(2, 1, 1, 128, 128, 128, 1, 50 << 20, 0),
             (8, 16, 3, 1024, 128, 128, 16, 50 << 20, 0),
             (66, 32, 2, 16384, 128, 128, 8, 50 << 20, 0),   # GQA, K/V larger than L2 per group
             (4, 12, 2, 65536, 128, 128, 12, 50 << 20, 0)]   # one head per group
    answers = driver(["tile_pairs " + " ".join(map(str, c)) for c in cases])
    plain = driver(["tiles " + " ".join(map(str, (nm // 2, *rest))) for nm, *rest in cases])
    for (nm, h, b, *_), line, half in zip(cases, answers, plain):
        tiles = [tuple(map(int, p.split())) for p in line.split(";")[1:]]
        assert sorted(tiles) == sorted(itertools.product(range(nm), range(h), range(b)))
        halves = [tuple(map(int, p.split())) for p in half.split(";")[1:]]
        for i in range(0, len(tiles), 2):
            (m0, h0, b0), (m1, h1, b1) = tiles[i], tiles[i + 1]
            assert (h0, b0) == (h1, b1) and m0 % 2 == 0 and m1 == m0 + 1
            assert (m0 // 2, h0, b0) == halves[i // 2]  # pair j of the plain order over nm / 2 blocks


def test_mla_decode_tile(driver):
    """The MLA decode kernel (d_v > 256): 64 packed rows, 64 keys (FA3's MLA page size: a TMA box
    per key block), 2 stages, 2 consumers (each half of O's columns; decode/mla_traits.cuh)."""
    block_m, block_n, stages, consumers, _ = map(int, driver(["decode_tile_shape 64 512 0"])[0].split())
    assert (block_m, block_n, stages, consumers) == (64, 64, 2, 2)
    # its shared memory: Q, qv (64 x 512), 2 stages of K and V, all bf16, under the 227 KB limit
    assert 2 * (64 * 64 + 64 * 512 + 2 * 64 * (64 + 512)) + 2048 <= SMEM_LIMIT


@pytest.mark.parametrize("d,dv,n16,n8", [(64, 64, 128, 128), (96, 96, 96, 96), (128, 128, 128, 112),
                                         (192, 192, 112, 64), (192, 128, 128, 80), (256, 256, 80, 48)])
def test_decode_tile_shapes_fit_the_hardware(driver, d, dv, n16, n8):
    """Decode tiles: 128 rows, 2 consumers; a 16-bit cache keeps the forward's block_n, an FP8
    cache the largest multiple of 16 whose raw stages also fit (its K/V, 2 blocks in flight)."""
    for fp8, want_n in ((0, n16), (1, n8)):
        block_m, block_n, stages, consumers, smem = map(
            int, driver([f"decode_tile_shape {d} {dv} {fp8}"])[0].split())
        assert (block_m, block_n, stages, consumers) == (128, want_n, 2, 2)
        raw = 2 * (block_n * (d + dv) + 8 * block_n) if fp8 else 0
        assert smem >= 2 * (128 * d + 2 * block_n * d + max(2 * block_n * dv, 128 * dv)) + raw
        assert smem <= SMEM_LIMIT
        if fp8 and block_n < n16:  # the next block_n up would not fit
            bigger = 2 * (128 * d + 2 * (block_n + 16) * d + max(2 * (block_n + 16) * dv, 128 * dv)) \
                + 2 * ((block_n + 16) * (d + dv) + 8 * (block_n + 16))
            assert bigger > SMEM_LIMIT - 2048


@pytest.mark.parametrize("d,dv", [(64, 64), (96, 96), (128, 128), (192, 192), (192, 128), (256, 256)])
def test_tile_shapes_fit_the_hardware(driver, d, dv):
    answer = driver([f"tile_shape {d} {dv}"])[0]
    block_m, block_n, stages, consumers, smem, v_stages, own_o = map(int, answer.split())
    assert block_m == 64 * consumers and consumers in (2, 3)
    assert block_n % 16 == 0 and 16 <= block_n <= 256  # WGMMA N extent and P.V k-steps
    assert stages >= 2  # K and V pipelines at least double-buffered
    # V takes a third stage only beside O's own buffer (its slot frees later than K's), d 96 and 128.
    assert v_stages == (stages + 1 if own_o and d > 64 else stages)
    o_bytes = 2 * block_m * dv
    assert smem == 2 * (block_m * d + stages * block_n * d + v_stages * block_n * dv) + (o_bytes if own_o else 0)
    # With the overlap pins (a float per consumer thread) and 1 KB of barriers: the opt-in limit.
    assert smem + 4 * 128 * consumers + 1024 <= SMEM_LIMIT
    # Without its own buffer O is staged in V's after the tile's last P.V.
    assert own_o or block_m * dv <= v_stages * block_n * dv
    # O has its own buffer at d <= 128 (the overlapped epilogue's).
    assert bool(own_o) == (d <= 128)
    # S (block_n / 2) + P (block_n / 4) + O (d_v / 2) registers per consumer thread, with room for
    # addressing and softmax state, under setmaxnreg's 232 (2 consumers) or 160 (3 consumers).
    budget = 232 if consumers == 2 else 160
    assert block_n // 2 + block_n // 4 + dv // 2 + 32 <= budget


# (elem_bytes, base offset, dims, strides, box) -> None if the TMA map is valid, else a fragment of
# the expected complaint. Dims/strides/box innermost first, as cuTensorMapEncodeTiled takes them.
TMA_CASES = [
    ((2, 0, [128, 1000, 8, 2], [1, 1024, 128, 1024000], [128, 128, 1, 1]), None),
    ((2, 0, [64, 7, 1, 1], [1, 64, 448, 448], [64, 192, 1, 1]), None),  # box past the extent: fine
    ((2, 8, [128, 1000, 8, 2], [1, 1024, 128, 1024000], [128, 128, 1, 1]), "16-byte aligned"),
    ((2, 0, [128, 1000, 8, 2], [2, 1024, 128, 1024000], [128, 128, 1, 1]), "not contiguous"),
    ((2, 0, [128, 1000, 8, 2], [1, 1024, 128, 0], [128, 128, 1, 1]), "broadcast"),
    ((2, 0, [128, 1000, 8, 2], [1, 1028, 128, 1024000], [128, 128, 1, 1]), "multiple of 16"),
    ((2, 0, [128, 1000, 8, 2], [1, 1024, -128, 1024000], [128, 128, 1, 1]), "stride -128"),
    ((2, 0, [128, 1000, 8, 2], [1, 1024, 128, 1 << 40], [128, 128, 1, 1]), "2^40"),
    ((2, 0, [128, 0, 8, 2], [1, 1024, 128, 1024000], [128, 128, 1, 1]), "outside [1, 2^32]"),
    ((2, 0, [128, (1 << 32) + 1, 1, 1], [1, 128, 128, 128], [128, 128, 1, 1]), "outside [1, 2^32]"),
    ((2, 0, [512, 1000, 8, 2], [1, 1024, 128, 1024000], [512, 128, 1, 1]), "box 512"),
    ((2, 0, [128, 1000, 8, 2], [1, 1024, 128, 1024000], [128, 0, 1, 1]), "box 0"),
    ((2, 0, [4, 1000, 8, 2], [1, 1024, 128, 1024000], [4, 128, 1, 1]), "innermost box"),
    # The limits themselves, each just inside and just outside.
    ((2, 16, [64], [1], [64]), None),  # rank 1; base 16 bytes past an aligned one
    ((2, 0, [64, 3, 4, 5, 6], [1, 64, 192, 768, 3840], [64, 3, 4, 5, 6]), None),  # rank 5
    ((2, 0, [128, 1 << 32, 1, 1], [1, 128, 128, 128], [128, 256, 1, 1]), None),  # dim 2^32, box 256
    ((2, 0, [128, 4, 2, 1], [1, (1 << 39) - 8, 128, 128], [128, 1, 1, 1]), None),  # 2^40 - 16 bytes
    ((2, 0, [128, 4, 2, 1], [1, 1 << 39, 128, 128], [128, 1, 1, 1]), "2^40"),  # exactly 2^40 bytes
    ((2, 0, [128, 4, 2, 1], [1, 1 << 62, 128, 128], [128, 1, 1, 1]), "2^40"),  # no int64 overflow
    ((2, 0, [128, 1000, 8, 2], [1, 1024, 128, 1024000], [128, 257, 1, 1]), "box 257"),
    ((2, 0, [8, 1000], [1, 8], [8, 64]), None),  # innermost box of exactly 16 bytes
    ((1, 0, [16, 1000], [1, 16], [16, 64]), None),  # 1-byte elements (fp8)
    ((1, 0, [16, 1000], [1, 24], [16, 64]), "24 bytes, not a multiple of 16"),
    ((4, 0, [4, 1000], [1, 4], [4, 64]), None),  # 4-byte elements: 4-element strides suffice
    ((4, 0, [4, 1000], [1, 4], [2, 64]), "innermost box"),
    ((3, 0, [16, 1000], [1, 16], [16, 64]), "element size 3"),
]


@pytest.mark.parametrize("case,expected", TMA_CASES)
def test_tma_descriptor_checks(driver, case, expected):
    eb, offset, dims, strides, box = case
    rank = len(dims)
    answer = driver([f"tma {eb} {rank} {offset} " + " ".join(map(str, dims + strides + box))])[0]
    if expected is None:
        assert answer == "ok"
    else:
        assert answer.startswith("t: ") and expected in answer, answer


def test_tma_rank_outside_1_to_5(driver):
    assert "rank 6" in driver(["tma 2 6 0 " + " ".join(["1"] * 18)])[0]
    assert "rank 0" in driver(["tma 2 0 0"])[0]


BUILT = [(64, 64), (96, 96), (128, 128), (192, 192), (192, 128), (256, 256)]


@pytest.mark.parametrize("d,dv", [(8, 8), (32, 32), (40, 40), (48, 48), (64, 64), (80, 80), (96, 96),
                                  (112, 112), (128, 128), (160, 160), (128, 64), (64, 128), (192, 128),
                                  (176, 136), (200, 8), (256, 256), (264, 8)])
def test_pick_next_kernel_up(driver, d, dv):
    """pick_fwd_kernel (C++; Python asks it, flash3::pick_kernel) follows the rule: the smallest
    compiled d' >= d, then d_v' >= d_v."""
    query = f"pick 1 {d} {dv} " + " ".join(f"{a} {b}" for a, b in BUILT)
    answer = driver([query])[0]
    fits = sorted((a, b) for a, b in BUILT if a >= d and b >= dv)
    if not fits:
        assert answer == "none"
    else:
        a, b = fits[0]
        assert answer == f"{a} {b}"


@pytest.mark.parametrize("d", [64, 128, 256])
def test_fp8_emulation_key_tiles_are_the_kernel_tiles(driver, d):
    """flash3.fp8_quant.kernel_tile_n (the emulation's key tiles, which its numerics depend on) is
    the FP8 kernel's block_n, with and without an attention chunk (attn_logic.h fwd_fp8_tile_shape,
    fwd_fp8_chunk_tile_shape, fwd_fp8_fast_tile_shape); a chunk keeps the plain tile where it fits
    (fwd_fp8_tile_takes_chunk)."""
    from flash3.fp8_quant import kernel_tile_n
    plain, chunked, fast = (list(map(int, driver([f"fp8_tile_shape {d} {d} {c}"])[0].split())) for c in (0, 1, 2))
    assert plain[1] == kernel_tile_n(d) and chunked[1] == kernel_tile_n(d, attention_chunk=48)
    assert fast[1] == kernel_tile_n(d, fast_accum=True) and fast[0] == plain[0] and fast[3] == plain[3]
    assert (plain == chunked) == (d <= 128)
    assert 128 % chunked[1] == 0 and chunked[0] == plain[0] and chunked[3] == plain[3]


def test_extra_wgmma_n_matches_the_tiles(driver):
    """generate_kernels.py's EXTRA_WGMMA_N (flash3's own WGMMA atoms, csrc/generated/wgmma_extra.h) is
    exactly the n-extents outside CuTe's basic list that the 16-bit tiles use; the traits static_assert
    the same at compile time, this catches it before a compile."""
    spec = importlib.util.spec_from_file_location("gen_kernels", ROOT / "csrc" / "generate_kernels.py")
    gk = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gen_kernels", gk)
    spec.loader.exec_module(gk)
    basic = {8, 16, 32, 64, 96, 128, 192, 256}
    used = set()
    for k in gk.all_kernels():
        d, dv = k.head_dim, k.head_dim_v
        if k.is_fp8:  # block_n 128 or 64, P.V in chunks of at most 128 columns
            continue
        if k.kind == "fwd":
            used.add(int(driver([f"tile_shape {d} {dv}"])[0].split()[1]))
        elif k.kind == "decode":
            used.add(int(driver([f"decode_tile_shape {d} {dv} {int(bool(k.cache))}"])[0].split()[1]))
        else:  # S^T, dP^T: block_m queries; dV, dK: d_v, d (halves in split_d mode): CuTe's atoms
            block_m, _, _, _, split_d, _ = map(int, driver([f"bwd_tile_shape {d} {dv}"])[0].split())
            assert {block_m, dv // 2 if split_d else dv, d // 2 if split_d else d} <= basic, k.name
            used.add(d // 2)  # dQ: ss_op
        # P.V (RS): CuTe's atoms; the MLA kernel's two consumers take d_v / 2 each (mla_traits.cuh)
        assert (dv // 2 if dv > 256 else dv) in basic, k.name
    assert used - basic == set(gk.EXTRA_WGMMA_N)


# ------------------------------------------------------------------ attention_chunk
def random_chunk_masks(n, seed=0):
    """Masks with an attention chunk (FA3's attention_chunk): chunks smaller than a block, not a
    multiple of it and larger, with and without causal or a window, s_q > s_k and s_q < s_k."""
    rng = random.Random(seed)
    lengths = [1, 2, 7, 63, 64, 65, 113, 128, 129, 203, 256, 300]
    cases = []
    for _ in range(n):
        sq, sk = rng.choice(lengths), rng.choice(lengths)
        causal = rng.random() < 0.5
        left = rng.choice([-1, -1, 0, 1, 17, 64, 100])
        right = rng.choice([-1, -1, 0, 1, 33, 128])
        chunk = rng.choice([1, 3, 8, 48, 64, 100, 128, 160, 500])
        cases.append((sq, sk, causal, left, right, chunk))
    return cases


def brute_chunk_visible(sq, sk, causal, left, right, chunk):
    """The spec (flash3/reference/fa3.py _visible), as nested lists."""
    from flash3.reference.fa3 import _visible
    wl, wr = masking.normalize_window(causal, (left, right))
    return _visible(sq, sk, wl, wr, chunk, "cpu").tolist()


def _line(cmd, case, *rest):
    sq, sk, c, l, r, ch = case
    return " ".join(map(str, [cmd, sq, sk, int(c), l, r, f"c{ch}", *rest]))


def test_chunk_mask_predicate_and_row_bounds(driver):
    """Mask::visible and the per-row bounds with a chunk (the chunked kernels' per-row run: key j
    visible iff key_floor(i) <= j < last_key(i + 1)) are the reference's, and flash3.masking's."""
    cases = random_chunk_masks(60, seed=21) + [(10, 4, False, -1, -1, 8), (4, 10, True, -1, -1, 3),
                                               (300, 65, True, 5, -1, 48), (65, 300, False, 7, 9, 160)]
    vis_lines = driver([_line("visible", c) for c in cases])
    row_lines = driver([_line("row_bounds", c) for c in cases])
    for case, bits, rows in zip(cases, vis_lines, row_lines):
        sq, sk, causal, left, right, chunk = case
        vis = brute_chunk_visible(*case)
        assert bits == "".join("1" if v else "0" for row in vis for v in row), case
        wl, wr = masking.normalize_window(causal, (left, right))
        assert vis == [[masking.visible(i, j, sq, sk, causal, left, right, chunk) for j in range(sk)]
                       for i in range(sq)], case
        assert vis == masking.visible_mask(0, sq, 0, sk, sq, sk, False, wl, wr, chunk=chunk).tolist()
        bounds = [tuple(map(int, x.split())) for x in rows.split(";")]
        for i, (lo, hi) in enumerate(bounds):
            assert vis[i] == [lo <= j < hi for j in range(sk)], (case, i)


@pytest.mark.parametrize("block_m,block_n", [(128, 128), (192, 128), (128, 176), (64, 48)])
def test_chunk_block_ranges_exact(driver, block_m, block_n):
    """With a chunk the forward's key-block ranges (visited, unmasked) and the backward's query-block
    ranges stay exact (brute force over the reference mask), in C++ and in flash3.masking: both are
    the same (query block, key block) touch relation, which the deterministic dQ order
    (bwd_dq_rank) relies on."""
    cases = random_chunk_masks(50, seed=block_m * 7 + block_n)
    fwd = driver([_line("ranges", c, block_m, block_n) for c in cases])
    bwd = driver([_line("qranges", c, block_m, block_n) for c in cases])
    for case, fline, bline in zip(cases, fwd, bwd):
        sq, sk, causal, left, right, chunk = case
        vis = brute_chunk_visible(*case)
        wl, wr = masking.normalize_window(causal, (left, right))
        rows = lambda m: range(m * block_m, min((m + 1) * block_m, sq))  # noqa: E731
        keys = lambda n: range(n * block_n, min((n + 1) * block_n, sk))  # noqa: E731
        mblocks, nblocks = -(-sq // block_m), -(-sk // block_n)
        touch = [[any(vis[i][j] for i in rows(m) for j in keys(n)) for n in range(nblocks)]
                 for m in range(mblocks)]
        whole = [[(m + 1) * block_m <= sq and (n + 1) * block_n <= sk
                  and all(vis[i][j] for i in rows(m) for j in keys(n)) for n in range(nblocks)]
                 for m in range(mblocks)]
        per_m = [tuple(map(int, p.split())) for p in fline.split(";") if p]
        assert len(per_m) == mblocks
        for m, (b, e, ub, ue) in enumerate(per_m):
            touched = {n for n in range(nblocks) if touch[m][n]}
            # forward "full" needs only the key block full: rows past s_q do not exist
            full = {n for n in range(nblocks) if (n + 1) * block_n <= sk
                    and all(vis[i][j] for i in rows(m) for j in keys(n))}
            assert set(range(b, e)) == touched, (case, m)
            assert set(range(ub, ue)) == full, (case, m)
            args = (m, block_m, block_n, sq, sk, causal, wl, wr, chunk)
            assert set(range(*masking.key_block_range(*args))) == touched, (case, m)
            assert set(range(*masking.unmasked_key_block_range(*args))) == full, (case, m)
        per_n = [tuple(map(int, p.split())) for p in bline.split(";") if p]
        assert len(per_n) == nblocks
        for n, (b, e, ub, ue) in enumerate(per_n):
            touched = {m for m in range(mblocks) if touch[m][n]}
            full = {m for m in range(mblocks) if whole[m][n]}
            assert set(range(b, e)) == touched, (case, n)
            assert set(range(ub, ue)) == full, (case, n)
            args = (n, block_m, block_n, sq, sk, causal, wl, wr, chunk)
            assert set(range(*masking.query_block_range(*args))) == touched, (case, n)
            assert set(range(*masking.unmasked_query_block_range(*args))) == full, (case, n)
        # The deterministic dQ order (descending key blocks) relies on this with a chunk too.
        firsts = [b for b, e, _, _ in per_n if b < e]
        assert firsts == sorted(firsts), case


def test_chunk_transpose_and_key_counts(driver):
    """first_query/last_query (the backward's per-key run) and key_count (its one-key rows) with a
    chunk match the reference mask; key_count is no longer concave (it drops at each chunk start),
    which is why the backward's one_key_step looks at every masked step of a chunked call."""
    cases = random_chunk_masks(50, seed=23) + [(10, 4, True, -1, -1, 3), (4, 10, False, 2, -1, 4)]
    q_lines = driver([_line("queries", c, -2, c[1] + 3) for c in cases])
    n_lines = driver([_line("key_counts", c) for c in cases])
    for case, ql, nl in zip(cases, q_lines, n_lines):
        sq, sk, causal, left, right, chunk = case
        vis = brute_chunk_visible(*case)
        per_key = [tuple(map(int, p.split())) for p in ql.split(";") if p]
        for j, (first, last) in zip(range(-2, sk + 3), per_key):
            seen = {i for i in range(sq) if 0 <= j < sk and vis[i][j]}
            assert set(range(first, last)) == seen, (case, j)
        counts = [max(0, int(x)) for x in nl.split(";") if x]
        assert counts == [sum(row) for row in vis], case
        wl, wr = masking.normalize_window(causal, (left, right))
        assert counts == masking.visible_counts(sq, sk, False, wl, wr, chunk=chunk).tolist()
