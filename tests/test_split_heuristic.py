"""Split-KV and page-addressing host logic (csrc/flash3/decode/split_heuristic.h), on the CPU.

The header is compiled with the host C++ compiler into tests/cpp/decode_driver.cpp and checked
against flash3.decode_plan (the Python specification) and against the properties it promises.
"""
import random
from pathlib import Path

import pytest
from helpers import cpp_driver

from flash3 import decode_plan as dp

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    return cpp_driver("decode_driver.cpp", tmp_path_factory.mktemp("decode"))


def heuristic_cases(n, seed=0):
    rng = random.Random(seed)
    cases = [(1, 132, 1, 128), (1, 132, 2, 128), (1, 132, 1000, 128), (0, 132, 10, 128),
             (106, 132, 500, 128), (105, 132, 500, 128), (48, 108, 64, 128), (1, 1, 50, 128),
             (3, 132, 7, 128), (2, 132, 4096, 8)]
    for _ in range(n):
        tiles = rng.choice([1, 2, 3, 4, 5, 8, 12, 16, 24, 32, 48, 64, 100, 105, 106, 200])
        sms = rng.choice([1, 8, 78, 108, 114, 132, 144])
        nb = rng.choice([1, 2, 3, 4, 5, 7, 9, 16, 31, 64, 100, 257, 1024, 4096])
        mx = rng.choice([1, 2, 16, 128, 128, 1000])
        cases.append((tiles, sms, nb, mx))
    return cases


def test_heuristic_cpp_matches_python(driver):
    cases = heuristic_cases(600, seed=1)
    answers = driver([f"splits {t} {s} {n} {m}" for t, s, n, m in cases])
    for (t, s, n, m), a in zip(cases, answers):
        assert int(a) == dp.num_splits_heuristic(t, s, n, m), (t, s, n, m)


def efficiency(tiles, s, sms):
    w = tiles * s / sms
    return w / -(-tiles * s // sms)


@pytest.mark.parametrize("seed", range(3))
def test_heuristic_properties(seed):
    for tiles, sms, nb, mx in heuristic_cases(400, seed=seed + 10):
        s = dp.num_splits_heuristic(tiles, sms, nb, mx)
        assert 1 <= s <= min(128, max(nb, 1), sms, max(mx, 1))
        if tiles * 5 >= sms * 4:  # grid already fills 80% of the SMs
            assert s == 1
        if s > 1:
            per = -(-nb // s)
            assert per >= dp.MIN_BLOCKS_PER_SPLIT  # each split keeps enough work
            assert (s - 1) * per < nb  # no split is empty
            assert -(-nb // (s - 1)) != per  # not a redundant count
            # Within 85% of the best eligible count, and the smallest such.
            cap = min(mx, 128, sms, nb // dp.MIN_BLOCKS_PER_SPLIT)
            elig = [c for c in range(1, cap + 1) if c == 1 or -(-nb // c) != -(-nb // (c - 1))]
            best = max(efficiency(tiles, c, sms) for c in elig)
            assert efficiency(tiles, s, sms) >= 0.85 * best - 1e-12
            assert all(efficiency(tiles, c, sms) < 0.85 * best + 1e-12 for c in elig if c < s)


def test_heuristic_examples():
    # One sequence, 32 q heads in 4 kv groups (one tile each), long cache: split to fill 132 SMs.
    tiles = dp.decode_tiles(batch=1, seqlen_q=1, h=32, h_k=4, block_m=64)
    assert tiles == 4
    s = dp.num_splits_heuristic(tiles, 132, num_n_blocks=8192 // 128)
    assert s == 32 and tiles * s <= 132
    # Large batch: already full.
    assert dp.num_splits_heuristic(dp.decode_tiles(64, 1, 32, 8, 64), 132, 64) == 1
    # Short cache: never more splits than pairs of key blocks.
    assert dp.num_splits_heuristic(1, 132, 3) == 1
    assert dp.num_splits_heuristic(1, 132, 4) == 2


def test_tiles_and_resolve_match(driver):
    rng = random.Random(3)
    tcases = [(rng.randint(1, 64), rng.choice([1, 2, 4, 7, 64, 129]), *rng.choice(
        [(32, 8), (32, 32), (8, 1), (64, 4)]), rng.choice([64, 128, 192])) for _ in range(100)]
    answers = driver([f"tiles {' '.join(map(str, c))}" for c in tcases])
    for c, a in zip(tcases, answers):
        assert int(a) == dp.decode_tiles(*c)
    rcases = [(ns, t, s, n) for ns in (0, 1, 2, 5, 200, 1000) for t in (1, 7, 200)
              for s in (8, 132) for n in (1, 3, 64, 1000)]
    answers = driver([f"resolve {' '.join(map(str, c))}" for c in rcases])
    for (ns, t, s, n), a in zip(rcases, answers):
        want = dp.resolve_num_splits(ns, t, s, n)
        assert int(a) == want
        assert 1 <= want <= min(128, n)
        if ns > 0:
            assert want == min(ns, 128, n)


def test_split_ranges_cover_keys_once(driver):
    cases = [(ns, n, bn) for ns in (1, 2, 3, 5, 8, 128) for n in (0, 1, 127, 128, 129, 1000, 4097)
             for bn in (64, 128, 176)]
    answers = driver([f"ranges {ns} {n} {bn}" for ns, n, bn in cases])
    for (ns, n, bn), line in zip(cases, answers):
        ranges = [tuple(map(int, p.split())) for p in line.split(";") if p]
        assert ranges == [dp.split_key_range(j, ns, n, bn) for j in range(ns)]
        # Contiguous, in order, covering [0, n) exactly once, boundaries on key blocks.
        pos = 0
        for a, b in ranges:
            assert a == pos and a <= b
            assert a % bn == 0 or a == n
            pos = b
        assert pos == n


def test_page_slot_matches_and_skips_bad_values(driver):
    rng = random.Random(5)
    cases = []
    for _ in range(300):
        ps = rng.choice([1, 3, 16, 64])
        mp = rng.choice([0, 1, 4, 9])
        num_pages = rng.choice([1, 5, 40])
        row = [rng.choice([-1, 0, 3, num_pages - 1, num_pages, 1 << 30, -(1 << 31)])
               for _ in range(mp)]
        pos = rng.choice([-1, 0, 1, ps - 1, ps, mp * ps - 1, mp * ps, 1 << 40])
        cases.append((pos, ps, num_pages, mp, row))
    answers = driver([f"page {pos} {ps} {npg} {mp} " + " ".join(map(str, row))
                      for pos, ps, npg, mp, row in cases])
    for (pos, ps, npg, mp, row), a in zip(cases, answers):
        want = dp.page_slot(pos, ps, mp, npg, row)
        assert a == ("skip" if want is None else f"{want[0]} {want[1]}"), (pos, ps, npg, mp, row)
        if want is not None:  # a slot that is used is always inside the cache
            assert 0 <= want[0] < npg and 0 <= want[1] < ps
            assert want == (row[pos // ps], pos % ps)
        else:
            assert (not 0 <= pos < mp * ps) or not 0 <= row[pos // ps] < npg
