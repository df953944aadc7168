"""Tests for flash3.hadamard: the randomized fast orthogonal head-dim transform."""

import math

import pytest
import torch

from flash3.hadamard import block_structure, hadamard_matrix, hadamard_transform, random_signs

ALL_D = list(range(1, 257))
KEY_D = [1, 2, 3, 8, 40, 64, 80, 96, 128, 192, 256]


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def test_block_structure():
    assert block_structure(128) == (1, 128)
    assert block_structure(96) == (3, 32)
    assert block_structure(192) == (3, 64)
    assert block_structure(80) == (5, 16)
    assert block_structure(40) == (5, 8)
    assert block_structure(7) == (7, 1)
    for d in ALL_D:
        m, p = block_structure(d)
        assert m * p == d and m % 2 == 1 and p & (p - 1) == 0


def test_matrix_exactly_orthogonal():
    for d in KEY_D + [5, 6, 7, 12, 24, 48, 100, 112, 127, 160, 224, 240, 255]:
        M = hadamard_matrix(d, seed=d)
        err = (M @ M.T - torch.eye(d, dtype=torch.float64)).abs().max().item()
        assert err < 1e-12, (d, err)


@pytest.mark.parametrize("d", ALL_D)
def test_fp32_orthogonality_properties(d):
    g = _gen(d)
    x = torch.randn(2, 5, 3, d, generator=g)
    k = torch.randn(2, 7, 3, d, generator=g)
    y = hadamard_transform(x, seed=11)
    ky = hadamard_transform(k, seed=11)
    assert y.dtype == torch.float32 and y.shape == x.shape
    # norm preserved
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1), rtol=1e-5, atol=1e-6)
    # inverse recovers x
    xr = hadamard_transform(y, seed=11, inverse=True)
    torch.testing.assert_close(xr, x, rtol=0, atol=2e-6 * max(1.0, math.sqrt(d) / 4))
    # q k^T preserved to fp32 precision (relative to |q||k|)
    s_ref = torch.einsum("bihd,bjhd->bhij", x.double(), k.double())
    s_rot = torch.einsum("bihd,bjhd->bhij", y, ky).double()
    scale = x.norm(dim=-1).max().item() * k.norm(dim=-1).max().item()
    assert (s_rot - s_ref).abs().max().item() <= 2e-6 * scale


@pytest.mark.parametrize("d", KEY_D)
def test_fast_path_matches_explicit_matrix(d):
    x = torch.randn(4, 9, d, generator=_gen(0), dtype=torch.float64)
    M = hadamard_matrix(d, seed=5)
    torch.testing.assert_close(hadamard_transform(x, seed=5), x @ M, rtol=0, atol=1e-12)
    torch.testing.assert_close(hadamard_transform(x, seed=5, inverse=True), x @ M.T, rtol=0, atol=1e-12)


@pytest.mark.parametrize("d", [1, 2, 4, 16, 64, 128, 256])
def test_power_of_two_is_randomized_walsh_hadamard(d):
    M = hadamard_matrix(d, seed=3)
    torch.testing.assert_close(M.abs(), torch.full((d, d), 1 / math.sqrt(d), dtype=torch.float64))
    # M = D H with H the Sylvester Hadamard: column signs differ from H's only by the row signs
    s = random_signs(d, 3, dtype=torch.float64)
    H = s[:, None] * M * math.sqrt(d)
    torch.testing.assert_close(H, H.T)  # Sylvester matrix is symmetric
    assert torch.all(H[0] == 1) and torch.all(H[:, 0] == 1)


@pytest.mark.parametrize("d", [3, 5, 40, 80, 96, 192, 255])
def test_non_power_of_two_mixes_across_blocks(d):
    M = hadamard_matrix(d, seed=1)
    m, p = block_structure(d)
    # every output coordinate depends on every input coordinate
    assert M.abs().min().item() > (0.2 / math.sqrt(d) if m <= 5 else 0.0)
    # coherence at most sqrt(2) above the Hadamard optimum, i.e. <= sqrt(2/d),
    # far below a block-diagonal Hadamard's 1/sqrt(p)
    assert M.abs().max().item() <= math.sqrt(2.0 / d) + 1e-12
    assert M.abs().max().item() < 1 / math.sqrt(p)


@pytest.mark.parametrize("d", [64, 96, 128, 192, 80])
def test_outlier_is_spread(d):
    x = torch.zeros(d)
    x[d // 3] = 100.0
    y = hadamard_transform(x, seed=0)
    assert y.abs().max().item() <= 100.0 * math.sqrt(2.0 / d) + 1e-4
    assert abs(y.norm().item() - 100.0) < 1e-3


def test_deterministic_and_seed_dependent():
    x = torch.randn(3, 128, generator=_gen(1))
    a = hadamard_transform(x, seed=7)
    b = hadamard_transform(x.clone(), seed=7)
    assert torch.equal(a, b)
    assert not torch.allclose(a, hadamard_transform(x, seed=8))
    s1, s2 = random_signs(128, 7), random_signs(128, 7)
    assert torch.equal(s1, s2) and set(s1.tolist()) == {-1.0, 1.0}
    # generated from a CPU generator: fixed regardless of the global RNG state
    torch.manual_seed(123)
    s3 = random_signs(128, 7)
    torch.manual_seed(456)
    assert torch.equal(s3, random_signs(128, 7))
    assert s1.device.type == "cpu"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_input_dtypes_return_fp32(dtype):
    x = torch.randn(2, 3, 4, 96, generator=_gen(2)).to(dtype)
    y = hadamard_transform(x, seed=0)
    assert y.dtype == torch.float32
    torch.testing.assert_close(y, hadamard_transform(x.float(), seed=0))


def test_float64_kept():
    x = torch.randn(3, 80, dtype=torch.float64)
    assert hadamard_transform(x).dtype == torch.float64


def test_bad_args():
    with pytest.raises(TypeError, match="x"):
        hadamard_transform([1.0, 2.0])
    with pytest.raises(TypeError, match="x"):
        hadamard_transform(torch.ones(4, dtype=torch.int32))
    with pytest.raises(TypeError, match="seed"):
        hadamard_transform(torch.ones(4), seed=1.5)
    with pytest.raises(TypeError, match="inverse"):
        hadamard_transform(torch.ones(4), inverse=1)
    with pytest.raises(ValueError):
        hadamard_transform(torch.ones(3, 0))
    with pytest.raises(ValueError):
        block_structure(0)


def test_device_copies_are_made_once():
    """hadamard_transform reuses one device copy of the signs (and of the Hartley matrix): a copy
    from host memory per call breaks CUDA graph capture (seen in attention_fp8_varlen on an H200)."""
    from flash3 import hadamard
    x = torch.randn(3, 96)  # 96 = 3 x 32: signs and the Hartley mix
    first = hadamard_transform(x, seed=5)
    before = hadamard._on_device.cache_info()
    again = hadamard_transform(x, seed=5)
    after = hadamard._on_device.cache_info()
    assert torch.equal(first, again)
    assert after.misses == before.misses and after.hits == before.hits + 2
    assert torch.allclose(hadamard_transform(first, seed=5, inverse=True), x.float(), atol=1e-5)
