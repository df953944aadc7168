"""flash3.masking checked by brute force against the scalar definition."""

import random

import pytest
import torch

from flash3 import masking


def brute_visible(i, j, s_q, s_k, causal, left, right):
    # Independent restatement of the spec.
    if causal:
        right = 0
    d = i + s_k - s_q
    return (0 <= i < s_q and 0 <= j < s_k and (left < 0 or j >= d - left)
            and (right < 0 or j <= d + right))


def random_configs(n, seed=0):
    rng = random.Random(seed)
    lengths = [1, 2, 3, 5, 7, 16, 17, 33, 64, 100]
    for _ in range(n):
        s_q, s_k = rng.choice(lengths), rng.choice(lengths)
        causal = rng.random() < 0.4
        left = rng.choice([-1, -1, 0, 1, 2, 5, 40])
        right = rng.choice([-1, -1, 0, 1, 3, 40])
        bm, bn = rng.choice([1, 2, 4, 16, 32]), rng.choice([1, 3, 8, 16, 64])
        yield s_q, s_k, causal, left, right, bm, bn


def test_normalize_window():
    assert masking.normalize_window(False, (-1, -1)) == (-1, -1)
    assert masking.normalize_window(True, (-1, -1)) == (-1, 0)
    assert masking.normalize_window(True, (4, 7)) == (4, 0)
    assert masking.normalize_window(False, (3, 2)) == (3, 2)


def test_visible_examples():
    # causal is bottom-right aligned: with s_q < s_k the last query sees all keys
    assert masking.visible(1, 2, 2, 3, True, -1, -1)
    assert masking.visible(0, 1, 2, 3, True, -1, -1)
    assert not masking.visible(0, 2, 2, 3, True, -1, -1)
    # s_q > s_k: early queries see nothing
    assert not any(masking.visible(0, j, 5, 2, True, -1, -1) for j in range(2))
    assert masking.visible(4, 1, 5, 2, True, -1, -1)
    # out of range
    assert not masking.visible(3, 0, 3, 3, False, -1, -1)


@pytest.mark.parametrize("seed", range(3))
def test_visible_mask_matches_scalar(seed):
    for s_q, s_k, causal, left, right, _, _ in random_configs(30, seed):
        r0, c0 = random.randint(-2, 2), random.randint(-2, 2)
        m = masking.visible_mask(r0, s_q + 2, c0, s_k + 2, s_q, s_k, causal, left, right)
        want = torch.tensor([[brute_visible(i, j, s_q, s_k, causal, left, right)
                              for j in range(c0, s_k + 2)] for i in range(r0, s_q + 2)])
        assert torch.equal(m, want), (s_q, s_k, causal, left, right)
        assert all(masking.visible(i, j, s_q, s_k, causal, left, right) == bool(want[i - r0, j - c0])
                   for i in range(r0, s_q + 2, 3) for j in range(c0, s_k + 2, 3))


@pytest.mark.parametrize("seed", range(4))
def test_block_ranges_exact(seed):
    for s_q, s_k, causal, left, right, bm, bn in random_configs(60, seed):
        vis = masking.visible_mask(0, s_q, 0, s_k, s_q, s_k, causal, left, right)
        for mb in range(-(-s_q // bm)):
            rows = vis[mb * bm:(mb + 1) * bm]
            n_blocks = -(-s_k // bn)
            any_vis = {nb for nb in range(n_blocks) if rows[:, nb * bn:(nb + 1) * bn].any()}
            full = {nb for nb in range(n_blocks)
                    if (nb + 1) * bn <= s_k and rows[:, nb * bn:(nb + 1) * bn].all()}
            cfg = (mb, bm, bn, s_q, s_k, causal, left, right)
            lo, hi = masking.key_block_range(*cfg)
            assert set(range(lo, hi)) == any_vis, cfg
            ulo, uhi = masking.unmasked_key_block_range(*cfg)
            assert set(range(ulo, uhi)) == full, cfg
            assert not full or (lo <= ulo and uhi <= hi)


def test_block_range_edge_cases():
    # zero keys, one key, block past the rows
    assert masking.key_block_range(0, 4, 4, 3, 0, False, -1, -1)[0] >= \
        masking.key_block_range(0, 4, 4, 3, 0, False, -1, -1)[1]
    assert masking.key_block_range(0, 1, 1, 1, 1, True, -1, -1) == (0, 1)
    lo, hi = masking.key_block_range(5, 4, 4, 3, 8, False, -1, -1)
    assert lo >= hi
    # s_q much larger than s_k with causal: first rows see nothing
    assert masking.key_block_range(0, 4, 4, 100, 3, True, -1, -1)[0] >= \
        masking.key_block_range(0, 4, 4, 100, 3, True, -1, -1)[1]
