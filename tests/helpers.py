"""Test helpers: the fp64 oracle and the FlashAttention tolerance rule (tools/smoke/smoke_checks.py,
shared with the smoke matrix), the assertions built on them, and the C++ driver builder.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch

# The oracles live with the smoke matrix, which checks the kernels with them too.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "smoke"))
from smoke_checks import _mask, attention_naive, attention_ref64, fa_tolerance, max_err, noop_rounding  # noqa: E402,F401


def assert_close_fa(out, naive, ref64, name="out", scale=1.0):
    tol = fa_tolerance(naive, ref64, out.dtype, scale)
    err = max_err(out, ref64)
    assert err <= tol, f"{name}: max err {err:.3e} > tolerance {tol:.3e}"


def assert_close(a, b, tol):
    """a close to b (max |a - b| <= tol) with infinities at the same places."""
    a, b = a.double(), b.double()
    assert a.shape == b.shape
    inf = torch.isinf(b)
    assert torch.equal(torch.isinf(a), inf)
    err = (a - b).masked_fill(inf, 0).abs().max().item() if a.numel() else 0.0
    assert err <= tol, f"max |err| {err} > {tol}"


def cu(lengths):
    """FA3's cu_seqlens of a list of sequence lengths: int32 offsets from 0."""
    return torch.tensor([0] + list(lengths)).cumsum(0).to(torch.int32)


def check_against_reference(fn, q, k, v, grads=True, **kw):
    """Run ``fn(q, k, v, return_lse=True, **kw)`` and compare out, lse and grads
    with the fp64 oracle using the FlashAttention rule."""
    dtype = q.dtype
    leaves = [x.detach().clone().requires_grad_(grads) for x in (q, k, v)]
    out, lse = fn(*leaves, return_lse=True, **kw)
    assert out.dtype == dtype and lse.dtype == torch.float32
    assert out.shape == (q.shape[0], q.shape[1], q.shape[2], v.shape[-1])
    assert lse.shape == (q.shape[0], q.shape[2], q.shape[1])

    r64 = [x.detach().double().requires_grad_(grads) for x in (q, k, v)]
    ref_out, ref_lse = attention_ref64(*r64, **kw)
    nv = [x.detach().clone().requires_grad_(grads) for x in (q, k, v)]
    naive_out, _ = attention_naive(*nv, **kw)

    assert_close_fa(out, naive_out, ref_out, "out")
    # lse: both finite-or--inf at the same places, then close.
    assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse)), "lse -inf pattern"
    fin = torch.isfinite(ref_lse)
    if fin.any():
        lse_tol = 1e-4 * (1 + ref_lse[fin].abs().max().item())
        assert max_err(lse[fin], ref_lse[fin]) <= lse_tol, "lse"
    if grads:
        g = torch.randn_like(out)
        out.backward(g)
        ref_out.backward(g.double())
        naive_out.backward(g.to(naive_out.dtype))
        gmax = max(r.grad.abs().max().item() if r.grad.numel() else 0.0 for r in r64)
        for name, a, r, n in zip("qkv", leaves, r64, nv):
            assert a.grad.dtype == dtype
            assert_close_fa(a.grad, n.grad, r.grad, "d" + name, gmax)
    return out, lse


def host_layer_sources() -> list:
    """The host layer's sources but device.cpp (tests/cpp/host_layer_driver.cpp stands in for the CUDA
    runtime), and the kernel registries it looks kernels up in; relative to csrc/."""
    from pathlib import Path
    host = Path(__file__).resolve().parents[1] / "csrc" / "flash3" / "host"
    return ([f"flash3/host/{p.name}" for p in sorted(host.glob("*.cpp")) if p.name != "device.cpp"]
            + ["flash3/fwd/registry.cpp", "flash3/decode/registry.cpp", "flash3/bwd/registry.cpp"])


def cpp_driver(source: str, workdir, sources=(), csrc=None):
    """Build tests/cpp/<source> (a stdin line -> stdout line driver of host headers in csrc/) with
    the host C++ compiler, with `sources` (paths relative to csrc, e.g. the host layer's .cpp files)
    linked in; csrc: another copy of csrc/ to build against. Returns ask(lines) -> answer lines.
    Skips without a compiler."""
    import shutil
    import subprocess
    from pathlib import Path

    import pytest

    root = Path(__file__).resolve().parents[1]
    csrc = Path(csrc) if csrc else root / "csrc"
    cxx = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no host C++ compiler on PATH")
    exe = Path(workdir) / Path(source).stem
    subprocess.run([cxx, "-std=c++17", "-O1", "-Wall", "-Werror", "-I", str(csrc),
                    str(root / "tests/cpp" / source)] + [str(csrc / s) for s in sources] + ["-o", str(exe)],
                   check=True)

    def ask(lines):
        out = subprocess.run([str(exe)], input="\n".join(lines) + "\n", capture_output=True,
                             text=True, check=True).stdout.splitlines()
        assert len(out) == len(lines)
        return out
    return ask


def e4m3_cast_nan_on_overflow(monkeypatch):
    """Make torch's cast to float8_e4m3fn (Tensor.to) give NaN (0x7F / 0xFF) for |x| > 464, as torch
    did before pytorch#178817 (torch 2.11, the H200's; 2.13 saturates to +-448): code that leaves the
    saturation of an FP8 result to torch's cast then depends on the torch version, which this
    exposes on a torch that saturates. Returns the cast of an out-of-range value, for the caller to
    see the emulation is on."""
    real = torch.Tensor.to

    def to(self, *args, **kw):
        out = real(self, *args, **kw)
        if (out.dtype == torch.float8_e4m3fn and self.dtype != torch.float8_e4m3fn
                and self.is_floating_point()):
            big = real(self, torch.float32).abs() > 464
            if big.any():
                out = out.clone()
                u = out.view(torch.uint8)
                u[big] = 0x7F | (u[big] & 0x80)
        return out
    monkeypatch.setattr(torch.Tensor, "to", to)
    return torch.tensor([470.0, -1000.0]).to(torch.float8_e4m3fn)
