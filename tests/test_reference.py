"""flash3.attention (reference backend) against the fp64 oracle."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import flash3
from flash3 import _torch_cpu, reference
from helpers import attention_ref64, check_against_reference

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.fixture
def small_tiles(monkeypatch):
    """Tiny tiles so short sequences still exercise tile skipping and masking (and the tiled
    algorithm itself: torch's CPU kernel, which serves some calls by default, is switched off)."""
    monkeypatch.setattr(reference, "BLOCK_M", 16)
    monkeypatch.setattr(reference, "BLOCK_N", 32)
    monkeypatch.setattr(_torch_cpu, "USE_TORCH_CPU_KERNEL", False)


TORCH_KERNEL_CASES = [  # (b, s_q, s_k, h, h_k, d, keyword arguments): where torch's kernel applies
    (2, 113, 113, 4, 4, 32, dict()),
    (2, 113, 113, 4, 2, 32, dict(causal=True)),
    (1, 40, 203, 6, 1, 64, dict(softmax_scale=0.3)),
    (1, 257, 257, 2, 2, 128, dict(causal=True, window_size=(-1, 5))),  # causal wins: (-1, 0)
    (2, 1, 1, 2, 1, 8, dict(causal=True)),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", range(len(TORCH_KERNEL_CASES)))
def test_torch_cpu_kernel_path(monkeypatch, dtype, case):
    """Calls torch's fused CPU kernel serves compute the same function (fp64 oracle, FA rule)."""
    b, s_q, s_k, h, h_k, d, kw = TORCH_KERNEL_CASES[case]
    taken = []
    for name in ("forward", "backward"):
        real = getattr(_torch_cpu, name)
        monkeypatch.setattr(_torch_cpu, name,
                            lambda *a, _r=real, _n=name, **k: taken.append(_n) or _r(*a, **k))
    check_against_reference(flash3.attention, *make(b, s_q, s_k, h, h_k, d, d, dtype), **kw)
    assert taken == ["forward", "backward"]


MASKED_CASES = [  # (s_q, s_k, h, h_k, keyword arguments): torch's kernel per query block + mask
    (40, 600, 4, 2, dict(causal=True)),      # bottom-right != torch's top-left when s_q != s_k
    (600, 40, 4, 4, dict(causal=True)),      # the first 560 rows see nothing: out 0, lse -inf
    (531, 531, 6, 2, dict(window_size=(70, 9))),
    (300, 300, 2, 1, dict(causal=True, window_size=(0, -1))),
    (257, 100, 2, 2, dict(window_size=(3, -1))),
    (1, 1, 2, 2, dict(window_size=(0, 0))),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", range(len(MASKED_CASES)))
def test_torch_cpu_kernel_with_band_masks(monkeypatch, dtype, case):
    """Windows and non-square causal: torch's kernel on each block of query rows with the
    mask of its band of keys computes the reference's function (fp64 oracle, FA rule)."""
    s_q, s_k, h, h_k, kw = MASKED_CASES[case]
    monkeypatch.setattr(_torch_cpu, "CHUNK_M", 128)  # several blocks at these lengths
    monkeypatch.setattr(_torch_cpu, "forward", None)  # the plain path must not be taken
    taken = []
    for name in ("forward_masked", "backward_masked"):
        real = getattr(_torch_cpu, name)
        monkeypatch.setattr(_torch_cpu, name,
                            lambda *a, _r=real, _n=name, **k: taken.append(_n) or _r(*a, **k))
    check_against_reference(flash3.attention, *make(2, s_q, s_k, h, h_k, 32, 32, dtype), **kw)
    assert taken == ["forward_masked", "backward_masked"]


@pytest.mark.parametrize("kw,dims", [(dict(softcap=2.0), (16, 16)), (dict(causal=True), (16, 8))])
def test_torch_cpu_kernel_not_used_where_it_cannot_compute_it(monkeypatch, kw, dims):
    for name in ("forward", "forward_masked"):  # would raise if called
        monkeypatch.setattr(_torch_cpu, name, None)
    check_against_reference(flash3.attention, *make(1, 50, 60, 2, 2, *dims, torch.float32), **kw)


def test_lse_gradient_uses_the_tiled_backward(monkeypatch):
    monkeypatch.setattr(_torch_cpu, "backward", None)
    monkeypatch.setattr(_torch_cpu, "backward_masked", None)
    q, k, v = (x.requires_grad_() for x in make(1, 30, 30, 2, 2, 16, 16, torch.float32))
    out, lse = flash3.attention(q, k, v, return_lse=True)
    (out.sum() + lse.sum()).backward()
    assert torch.isfinite(q.grad).all()


def make(b, s_q, s_k, h, h_k, d, d_v, dtype):
    return (torch.randn(b, s_q, h, d, dtype=dtype), torch.randn(b, s_k, h_k, d, dtype=dtype),
            torch.randn(b, s_k, h_k, d_v, dtype=dtype))


CONFIGS = [  # (h, h_k, d, d_v, keyword arguments)
    (2, 2, 16, 16, dict()),
    (2, 2, 16, 16, dict(causal=True)),
    (4, 2, 16, 16, dict(window_size=(7, 3))),
    (4, 1, 32, 16, dict(causal=True, window_size=(20, 5))),  # MQA; causal overrides right
    (2, 2, 8, 24, dict(softcap=3.0)),
    (6, 2, 16, 8, dict(causal=True, softcap=1.5, softmax_scale=0.3)),
    (3, 3, 12, 12, dict(window_size=(-1, 0))),
    (2, 1, 16, 16, dict(window_size=(0, -1), softcap=5.0)),
    (2, 2, 16, 16, dict(window_size=(0, 0))),
]
LENGTHS = [(1, 1), (113, 203), (203, 113), (40, 1)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("cfg", range(len(CONFIGS)))
@pytest.mark.parametrize("lengths", LENGTHS, ids=str)
def test_matrix(small_tiles, dtype, cfg, lengths):
    h, h_k, d, d_v, kw = CONFIGS[cfg]
    check_against_reference(flash3.attention, *make(2, *lengths, h, h_k, d, d_v, dtype), **kw)


@pytest.mark.parametrize("causal", [False, True])
def test_default_tiles_odd_length(causal):
    # 1023 spans several default tiles, with a partial last tile.
    q, k, v = make(1, 1023, 1023, 2, 1, 32, 32, torch.float32)
    check_against_reference(flash3.attention, q, k, v, causal=causal, window_size=(300, -1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_large_headdim(dtype):
    q, k, v = make(1, 17, 29, 2, 1, 256, 200, dtype)
    check_against_reference(flash3.attention, q, k, v, causal=True)


def test_return_lse_flag():
    q, k, v = make(1, 5, 7, 2, 2, 8, 8, torch.float32)
    out = flash3.attention(q, k, v)
    assert isinstance(out, torch.Tensor) and out.shape == (1, 5, 2, 8)
    out2, lse = flash3.attention(q, k, v, return_lse=True)
    assert torch.equal(out, out2) and lse.shape == (1, 2, 5)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_empty_rows_are_exactly_zero(small_tiles, dtype):
    # s_q > s_k with causal: the first s_q - s_k rows see no key.
    q, k, v = make(2, 50, 20, 2, 1, 16, 16, dtype)
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    out, lse = flash3.attention(q, k, v, causal=True, return_lse=True)
    assert torch.all(out[:, :30] == 0)
    assert torch.all(lse[:, :, :30] == float("-inf"))
    assert torch.isfinite(lse[:, :, 30:]).all()
    out.backward(torch.randn_like(out))
    assert torch.all(q.grad[:, :30] == 0)
    assert torch.isfinite(q.grad).all() and torch.isfinite(k.grad).all()
    # A window that leaves the first rows without keys, s_q < s_k.
    q, k, v = make(1, 10, 12, 1, 1, 8, 8, dtype)
    out, lse = flash3.attention(q, k[:, :3], v[:, :3], window_size=(0, 0), return_lse=True)
    assert torch.all(out[:, :7] == 0) and torch.all(lse[:, :, :7] == float("-inf"))


def test_zero_length():
    q, k, v = make(2, 0, 5, 2, 2, 8, 8, torch.float32)
    out, lse = flash3.attention(q, k, v, return_lse=True)
    assert out.shape == (2, 0, 2, 8) and lse.shape == (2, 2, 0)
    q, k, v = make(2, 3, 0, 2, 2, 8, 8, torch.float32)
    q.requires_grad_()
    out, lse = flash3.attention(q, k, v, return_lse=True)
    assert torch.all(out == 0) and torch.all(lse == float("-inf"))
    out.sum().backward()
    assert torch.all(q.grad == 0)


def test_lse_is_differentiable(small_tiles):
    q, k, v = make(1, 37, 45, 4, 2, 16, 16, torch.float32)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out, lse = flash3.attention(*leaves, causal=True, softcap=2.0, return_lse=True)
    (out.square().sum() + (lse * torch.linspace(-1, 1, 37)).sum()).backward()
    r = [x.double().requires_grad_() for x in (q, k, v)]
    ro, rl = attention_ref64(*r, causal=True, softcap=2.0)
    (ro.square().sum() + (rl * torch.linspace(-1, 1, 37).double()).sum()).backward()
    for a, b in zip(leaves, r):
        torch.testing.assert_close(a.grad, b.grad.float(), rtol=1e-4, atol=1e-4)


def test_noncontiguous_inputs_unchanged(small_tiles):
    q, k, v = (torch.randn(1, 3, 40, 16).transpose(1, 2) for _ in range(3))  # (1, 40, 3, 16) views
    before = [x.clone() for x in (q, k, v)]
    check_against_reference(flash3.attention, q, k, v, causal=True)
    out = flash3.attention(q, k, v)
    assert out.shape == (1, 40, 3, 16)
    assert all(torch.equal(a, b) for a, b in zip(before, (q, k, v)))


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc")
@pytest.mark.parametrize("torch_kernel", [True, False], ids=["torch-cpu-kernel", "tiled"])
def test_forward_memory_stays_small(torch_kernel):
    """s=16384 causal fp32 forward: the s x s score matrix per head would be 1 GiB."""
    # VmHWM (peak RSS of this process image) rather than ru_maxrss: the latter
    # also counts the forked parent's (pytest's) footprint from before exec.
    code = textwrap.dedent("""
        import torch, flash3
        flash3._torch_cpu.USE_TORCH_CPU_KERNEL = {torch_kernel}

        def status(key):  # KiB
            with open("/proc/self/status") as f:
                return next(int(l.split()[1]) for l in f if l.startswith(key + ":"))

        q, k, v = (torch.randn(1, 16384, 2, 64) for _ in range(3))
        flash3.attention(q[:, :64], k[:, :64], v[:, :64], causal=True)  # warm-up allocations
        with open("/proc/self/clear_refs", "w") as f:  # reset VmHWM to the current RSS
            f.write("5")
        before = status("VmRSS")
        out = flash3.attention(q, k, v, causal=True)
        print(max(status("VmHWM") - before, 0) / 1024)  # MiB
    """).replace("{torch_kernel}", str(torch_kernel))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr
    peak_mib = float(res.stdout.strip().splitlines()[-1])
    print(f"\npeak RSS increase of the s=16384 forward: {peak_mib:.1f} MiB")
    assert peak_mib < 256, f"forward grew RSS by {peak_mib:.0f} MiB"
