"""The forward kernel's host/device logic (csrc/flash3/common/attn_logic.h), proven on the CPU.

The header is compiled with the host C++ compiler into a small driver (tests/cpp/) and checked
against flash3.masking (the Python specification) and against brute force over the mask.
"""
import itertools
import random
import shutil
import subprocess
from pathlib import Path

import pytest

from flash3 import masking

ROOT = Path(__file__).resolve().parents[1]
SMEM_LIMIT = 227 * 1024  # Hopper: usable dynamic shared memory per block


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    cxx = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no host C++ compiler on PATH")
    exe = tmp_path_factory.mktemp("host_logic") / "driver"
    subprocess.run([cxx, "-std=c++17", "-O1", "-Wall", "-Werror", "-I", str(ROOT / "csrc"),
                    str(ROOT / "tests/cpp/host_logic_driver.cpp"), "-o", str(exe)], check=True)

    def ask(lines):
        out = subprocess.run([str(exe)], input="\n".join(lines) + "\n", capture_output=True,
                             text=True, check=True).stdout.splitlines()
        assert len(out) == len(lines)
        return out
    return ask


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


@pytest.mark.parametrize("d,dv", [(64, 64), (96, 96), (128, 128), (192, 192), (192, 128), (256, 256)])
def test_tile_shapes_fit_the_hardware(driver, d, dv):
    block_m, block_n, stages, consumers, smem = map(int, driver([f"tile_shape {d} {dv}"])[0].split())
    assert block_m == 64 * consumers and consumers in (2, 3)
    assert block_n % 16 == 0 and 16 <= block_n <= 256  # WGMMA N extent and P.V k-steps
    assert stages >= 2  # K and V pipelines at least double-buffered
    assert smem == 2 * (block_m * d + stages * block_n * (d + dv))
    assert smem <= SMEM_LIMIT
    # O staged through Q's buffer must fit there.
    assert block_m * dv <= block_m * d
    # fp32 O accumulator per consumer thread stays within the register budget.
    assert 64 * dv // 128 <= 128
