"""The fused FP8 rotate-and-quantize kernel (flash3::quantize_fp8_sm90, csrc/flash3/fp8/).

CPU part: the host logic of csrc/flash3/fp8/quantize.h, compiled with the host C++ compiler into
tests/cpp/quantize_driver.cpp, against Python (flash3.hadamard, the V_PERM16 layout built with
torch ops). GPU part (skipped without an sm_90 device and a flash3._C that has the op): the kernel
against flash3.fp8.quantize_fp8 applied to the rotated / smoothed / channel-scaled fp32 input.
"""
import math
import random
import struct

import pytest
import torch
from helpers import cpp_driver

from flash3 import _quantize, fp8, hadamard

V_PERM16 = _quantize.V_PERM16


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    return cpp_driver("quantize_driver.cpp", tmp_path_factory.mktemp("quantize"))


def f32_bits(v: float) -> str:
    return struct.pack("<f", v)[::-1].hex()


def pack_v_ref(x8: torch.Tensor) -> torch.Tensor:
    """(b, s, h, d) -> (b, h, d, s_pad): tokens permuted by V_PERM16 in groups of 16, zero padded
    (built with torch ops only; the kernel's layout 1)."""
    b, s, h, d = x8.shape
    s_pad = -(-s // 16) * 16
    xt = x8.view(torch.uint8) if x8.dtype == torch.float8_e4m3fn else x8
    xt = xt.permute(0, 2, 3, 1)  # (b, h, d, s)
    xt = torch.nn.functional.pad(xt, (0, s_pad - s))
    perm = torch.tensor(V_PERM16, device=x8.device)
    idx = (torch.arange(s_pad, device=x8.device) // 16) * 16 + perm.repeat(s_pad // 16)
    out = xt[..., idx].contiguous()
    return out.view(torch.float8_e4m3fn) if x8.dtype == torch.float8_e4m3fn else out


# ---------------------------------------------------------------------------------------------
# CPU: host logic
# ---------------------------------------------------------------------------------------------

def test_block_structure_matches_python(driver):
    ds = list(range(1, 513))
    for d, a in zip(ds, driver([f"structure {d}" for d in ds])):
        assert tuple(map(int, a.split())) == hadamard.block_structure(d), d


@pytest.mark.parametrize("m", [1, 3, 5])
def test_hartley_coefficients_bitwise(driver, m):
    (a,) = driver([f"hartley {m}"])
    want = [f32_bits(v) for v in hadamard._hartley_cpu(m).to(torch.float32).flatten().tolist()]
    assert a.split() == want


def _plan(driver, cases):
    lines = [f"plan {b} {s} {h} {d} {bs} {lay} {int(had)} {addr} {sb} {ss} {sh}"
             for b, s, h, d, bs, lay, had, addr, sb, ss, sh in cases]
    return driver(lines)


def _supported(d, had, lay, bs, s):
    if d % 8 or not 8 <= d <= 256:
        return False
    if had:
        m, p = hadamard.block_structure(d)
        if m not in (1, 3, 5) or p < 8:
            return False
    if lay == 1:
        rows = -(-min(bs, s) // 16) * 16
        if bs % 16 or rows * (d + 4) > 100 * 1024:
            return False
    return True


def test_plan_matches_python(driver):
    rng = random.Random(0)
    cases = []
    for d in [8, 16, 24, 40, 48, 56, 64, 72, 80, 96, 100, 112, 120, 128, 160, 192, 200, 224, 240,
              256, 264, 4, 12]:
        for had in (False, True):
            for lay in (0, 1):
                for bs in (16, 64, 100, 128, 176, 256, 1024, 4096):
                    s = rng.choice([0, 1, 15, 16, 100, 128, 300, 1000, 8192])
                    stride = rng.choice([8, 16, 12])
                    addr = rng.choice([0, 16, 2, 4096])
                    h = rng.choice([1, 3, 16])
                    cases.append((2, s, h, d, bs, lay, had, addr, s * h * d * stride // 8,
                                  h * d * stride // 8, d * stride // 8))
    for c, a in zip(cases, _plan(driver, cases)):
        b, s, h, d, bs, lay, had, addr, sb, ss, sh = c
        ok = _supported(d, had, lay, bs, s)
        assert a.startswith("error") != ok, (c, a)
        if not ok:
            continue
        m, p, units, chunks, cache, threads, nb, s_pad, smem, vec, scale = a.split()
        m, p, units, chunks, cache, threads, nb, s_pad, smem, vec = map(
            int, (m, p, units, chunks, cache, threads, nb, s_pad, smem, vec))
        if had:
            assert (m, p) == hadamard.block_structure(d)
            assert units == p // 8 and chunks == m and 32 % units == 0
            assert scale == f32_bits(float(torch.tensor(1.0 / math.sqrt(p), dtype=torch.float32)))
        else:
            assert (m, p, units, chunks) == (1, d, d // 8, 1)
        assert nb == -(-s // bs)
        assert s_pad == (-(-s // 16) * 16 if lay == 1 else s)
        cap = 256 if chunks == 5 else 512
        assert threads % 32 == 0 and 32 <= threads <= cap
        need = min(bs, s) * units
        if need <= cap * cache:  # the whole block fits in registers, with the smallest CTA
            assert threads * cache >= need and (threads - 32) * cache < max(need, 1) or threads == 32
        assert smem == (-(-min(bs, s) // 16) * 16 * (d + 4) if lay == 1 else 0)
        assert vec == int(addr % 16 == 0 and sb % 8 == 0 and ss % 8 == 0 and sh % 8 == 0)


def test_unit_walk_past_int32(driver):
    """A thread's units of one block (issue 23): with one descale per head the block has
    s * d / 8 units, past 2^31 for long sequences; in 32 bits the loop count went negative and
    nothing was written. The walk must visit exactly idx = it * threads + tid < ntok * U."""
    big = 2**28 + 3  # ntok * 32 = 2^33 + 96 units; 2^24 + 1 iterations per thread
    cases = [(big, 32, 512, 0), (big, 32, 512, 511), (big, 32, 512, 97), (2**26 + 5, 10, 480, 7),
             (2**31 - 1, 1, 32, 31), (2**31 - 1, 3, 96, 95), (300, 10, 128, 127), (1, 32, 32, 31),
             (5, 3, 32, 20), (0, 8, 32, 0)]
    # Plans of such blocks: one CTA of the largest size, the units counted in 64 bits.
    for line in _plan(driver, [(1, big, 1, 256, big, 0, 0, 0, big * 256, 256, 256),
                               (1, 2**31 - 1, 1, 8, 2**31 - 1, 0, 1, 0, 8, 8, 8)]):
        assert line.split()[5:7] == ["512", "1"], line
    for (ntok, u, nt, tid), a in zip(cases, driver([f"walk {c[0]} {c[1]} {c[2]} {c[3]}" for c in cases])):
        n_iter, valid, last_tok, last_chunk, bad = map(int, a.split())
        units = ntok * u
        assert n_iter == -(-units // nt) and bad == 0, (ntok, u, nt, tid, a)
        want_valid = max(0, -(-(units - tid) // nt))
        assert valid == want_valid, (ntok, u, nt, tid, a)
        if want_valid:
            last = tid + (want_valid - 1) * nt
            assert (last_tok, last_chunk) == (last // u, last % u), (ntok, u, nt, tid, a)


def test_vperm_and_inverse(driver):
    (a,) = driver(["vperm"])
    perm, tok, pos = (list(map(int, part.split())) for part in a.split("|"))
    assert perm == list(V_PERM16) == tok
    assert sorted(V_PERM16) == list(range(16))
    assert all(perm[pos[j]] == j for j in range(16))  # position(j) is the inverse permutation
    if hasattr(fp8, "V_PERM16"):
        assert tuple(fp8.V_PERM16) == tuple(V_PERM16)


def test_vpack_offsets_match_torch_layout(driver):
    rng = random.Random(1)
    for b, s, h, d in [(2, 37, 3, 8), (1, 16, 1, 16), (2, 100, 2, 24)]:
        v = torch.arange(1, b * s * h * d + 1, dtype=torch.int64).reshape(b, s, h, d)
        packed = pack_v_ref(v)
        s_pad = packed.shape[-1]
        assert s_pad == -(-s // 16) * 16
        pos = torch.arange(s_pad)
        tok = (pos // 16) * 16 + torch.tensor(V_PERM16)[pos % 16]
        assert torch.all(packed[..., tok >= s] == 0) and torch.all(packed[..., tok < s] > 0)
        flat = packed.flatten()
        qs = [(rng.randrange(b), rng.randrange(h), rng.randrange(d), rng.randrange(s))
              for _ in range(200)]
        offs = driver([f"vpack {bi} {hi} {c} {t} {h} {d} {s_pad}" for bi, hi, c, t in qs])
        for (bi, hi, c, t), o in zip(qs, offs):
            assert int(flat[int(o)]) == int(v[bi, t, hi, c]), (bi, hi, c, t)


def test_wrapper_rejects_cleanly_without_gpu():
    x = torch.zeros(1, 4, 1, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="CUDA"):
        _quantize.quantize_fp8_cuda(x)
    with pytest.raises(TypeError, match="x must be bfloat16 or float16"):
        _quantize.quantize_fp8_cuda(x.float())
    with pytest.raises(ValueError, match="layout"):
        _quantize.quantize_fp8_cuda(x, layout="cols")
    assert isinstance(_quantize.available(), bool)


# ---------------------------------------------------------------------------------------------
# GPU: the kernel against flash3.fp8.quantize_fp8
# ---------------------------------------------------------------------------------------------

def _gpu_ready():
    if not (torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9):
        pytest.skip("needs a CUDA sm_90 (Hopper) device")
    if not _quantize.available():
        pytest.skip("flash3._C without quantize_fp8_sm90 (pip install --no-build-isolation .)")


def reference(x, *, block_size, had, seed=0, mean=None, cd=None, layout="rows"):
    xf = hadamard.hadamard_transform(x, seed=seed) if had else x.float()
    if mean is not None:
        xf = xf - mean[:, None]
    if cd is not None:
        xf = xf / cd[:, None]
    x8, desc = fp8.quantize_fp8(xf, block_size=block_size)
    if layout == "v_packed":
        x8 = pack_v_ref(x8)
    return x8, desc


def e4m3_ordinal(t: torch.Tensor) -> torch.Tensor:
    u = t.view(torch.uint8).to(torch.int32)
    mag = u & 0x7F
    return torch.where(u >= 0x80, -mag, mag)


def assert_quant_close(got, want, *, exact, what):
    g8, gd = got
    w8, wd = want
    assert g8.shape == w8.shape and gd.shape == wd.shape, what
    assert not torch.isnan(gd).any(), what
    if exact:
        assert torch.equal(gd, wd), what
    else:
        torch.testing.assert_close(gd, wd, rtol=2e-7, atol=0, msg=what)
    go, wo = e4m3_ordinal(g8), e4m3_ordinal(w8)
    diff = (go - wo).abs()
    assert int(diff.max()) <= (0 if exact else 1), f"{what}: max diff {int(diff.max())} e4m3 steps"
    frac = float((diff > 0).float().mean())
    assert frac <= 1e-3, f"{what}: {frac:.2e} of the values differ by one e4m3 step"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("d", [64, 96, 128, 192, 256])
@pytest.mark.parametrize("had", [False, True], ids=["plain", "hadamard"])
@pytest.mark.parametrize("layout", ["rows", "v_packed"])
def test_kernel_matches_reference(dtype, d, had, layout):
    _gpu_ready()
    torch.manual_seed(d + 7 * had)
    dev = "cuda"
    b, s, h, bs = 2, 300, 3, 128
    x = torch.randn(b, s, h, d, device=dev, dtype=dtype)
    x[0, 5, 1, 3] = 40.0  # an outlier
    x[1, 256:, 2] = 0  # an all-zero (last, partial) block
    for use_mean in (False, True):
        for use_cd in (False, True):
            mean = torch.randn(b, h, d, device=dev) * 0.1 if use_mean else None
            cd = torch.rand(b, h, d, device=dev) + 0.5 if use_cd else None
            got = _quantize.quantize_fp8_cuda(x, block_size=bs, hadamard=had, seed=3, mean=mean,
                                              channel_descale=cd, layout=layout)
            want = reference(x, block_size=bs, had=had, seed=3, mean=mean, cd=cd, layout=layout)
            m = hadamard.block_structure(d)[0]
            assert_quant_close(got, want, exact=not had or m == 1,
                               what=f"{dtype} d={d} had={had} mean={use_mean} cd={use_cd} {layout}")


@pytest.mark.parametrize("layout", ["rows", "v_packed"])
@pytest.mark.parametrize("s,bs", [(1, 128), (37, 128), (128, 128), (300, 64), (1000, 176),
                                  (1000, 1024), (1000, None), (4096, 16)])
def test_block_shapes_and_poisoned_outputs(layout, s, bs):
    _gpu_ready()
    if layout == "v_packed" and (bs is None or bs % 16):
        pytest.skip("v_packed needs block_size % 16 == 0")
    dev = "cuda"
    b, h, d = 2, 2, 64 if bs == 1024 else 128
    x = torch.randn(b, s, h, d, device=dev, dtype=torch.bfloat16) * 3
    blk = s if bs is None else bs
    nb = -(-s // blk)
    s_pad = -(-s // 16) * 16
    out = torch.full((b, s, h, d) if layout == "rows" else (b, h, d, s_pad), 0x7F,
                     dtype=torch.uint8, device=dev).view(torch.float8_e4m3fn)  # NaN
    desc = torch.full((b, h, nb), float("nan"), device=dev)
    signs = hadamard.random_signs(d, 0, device=dev)
    torch.ops.flash3.quantize_fp8_sm90(x, signs, None, None, blk, _quantize.LAYOUTS[layout], out, desc)
    want8, wantd = reference(x, block_size=bs, had=True, layout=layout)
    assert_quant_close((out, desc.reshape(wantd.shape)), (want8, wantd), exact=True,
                       what=f"s={s} bs={bs} {layout}")


def test_strided_and_misaligned_input():
    _gpu_ready()
    dev = "cuda"
    b, s, h, d = 2, 200, 4, 128
    base = torch.randn(b, h, s, d + 8, device=dev, dtype=torch.float16)
    for x in (base[..., :d].transpose(1, 2), base[..., 1:d + 1].transpose(1, 2)):
        assert x.stride(-1) == 1
        for had in (False, True):
            got = _quantize.quantize_fp8_cuda(x, block_size=64, hadamard=had, seed=5)
            want = reference(x, block_size=64, had=had, seed=5)
            assert_quant_close(got, want, exact=True, what=f"strided had={had}")


def test_subnormals_and_tiny_blocks_kept():
    """--use_fast_math must not flush: tiny blocks give tiny (not 1, not 0) descales."""
    _gpu_ready()
    dev = "cuda"
    x = (torch.randn(1, 64, 2, 64, device=dev) * 1e-38).to(torch.bfloat16)
    for had in (False, True):
        got = _quantize.quantize_fp8_cuda(x, block_size=32, hadamard=had)
        want = reference(x, block_size=32, had=had)
        assert_quant_close(got, want, exact=True, what=f"subnormal had={had}")


def test_non_finite_input_does_not_crash():
    _gpu_ready()
    x = torch.randn(1, 64, 1, 64, device="cuda", dtype=torch.bfloat16)
    x[0, 3, 0, 5] = float("inf")
    x[0, 40, 0, 7] = float("nan")
    _quantize.quantize_fp8_cuda(x, block_size=32, hadamard=True)
    torch.cuda.synchronize()  # no trap, no illegal access; the values are unspecified


def test_cuda_graph_capture():
    _gpu_ready()
    dev = "cuda"
    x = torch.randn(2, 256, 4, 128, device=dev, dtype=torch.bfloat16)
    mean = torch.randn(2, 4, 128, device=dev) * 0.1
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        _quantize.quantize_fp8_cuda(x, hadamard=True, mean=mean, layout="v_packed")  # warm-up
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = _quantize.quantize_fp8_cuda(x, hadamard=True, mean=mean, layout="v_packed")
    x.copy_(torch.randn_like(x))
    g.replay()
    torch.cuda.synchronize()
    want = reference(x, block_size=128, had=True, mean=mean, layout="v_packed")
    assert_quant_close(out, want, exact=True, what="graph replay")


def test_one_block_past_int32_units():
    """One descale per head with s * d / 8 > 2^31 units (issue 23: 32-bit unit counts wrote
    nothing and gave descale 1). x is one token broadcast with stride 0 (no memory); out is
    s * d bytes (16 GiB), pre-filled with NaN codes so unwritten rows show."""
    _gpu_ready()
    d = 256
    s = 2**26 + 48  # s * d / 8 = 2^31 + 1536 units in one block
    if torch.cuda.mem_get_info()[0] < s * d + (2 << 30):
        pytest.skip("needs about 18 GiB of free GPU memory")
    base = (torch.arange(d, device="cuda", dtype=torch.float32) * 0.37 - 40.0).to(torch.bfloat16)
    x = base.view(1, 1, 1, d).expand(1, s, 1, d)
    want8, wantd = reference(x[:, :16].contiguous(), block_size=16, had=False)
    want_row = want8[0, 0, 0].view(torch.uint8)
    out = torch.full((1, s, 1, d), 0x7F, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
    desc = torch.empty(1, 1, 1, device="cuda")
    torch.ops.flash3.quantize_fp8_sm90(x, None, None, None, s, 0, out, desc)
    torch.cuda.synchronize()
    assert desc.item() == wantd.item()
    rows = out.view(torch.uint8)[0, :, 0]
    chunk = 2**22
    for t0 in range(0, s, chunk):
        assert bool((rows[t0:t0 + chunk] == want_row).all()), f"tokens from {t0}"
    del out, rows


def test_binding_argument_checks():
    _gpu_ready()
    dev = "cuda"
    x = torch.randn(1, 32, 2, 96, device=dev, dtype=torch.bfloat16)
    out = torch.empty(1, 32, 2, 96, dtype=torch.float8_e4m3fn, device=dev)
    desc = torch.empty(1, 2, 1, device=dev)
    op = torch.ops.flash3.quantize_fp8_sm90
    with pytest.raises(RuntimeError, match="descale"):
        op(x, None, None, None, 32, 0, out, torch.empty(1, 2, 2, device=dev))
    with pytest.raises(RuntimeError, match="out"):
        op(x, None, None, None, 32, 0, out[:, :16], desc)
    with pytest.raises(RuntimeError, match="mean"):
        op(x, None, torch.zeros(1, 2, 95, device=dev), None, 32, 0, out, desc)
    with pytest.raises(RuntimeError, match="signs"):
        op(x, torch.ones(95, device=dev), None, None, 32, 0, out, desc)
    x7 = torch.randn(1, 32, 2, 112, device=dev, dtype=torch.bfloat16)  # 112 = 7 * 16
    with pytest.raises(RuntimeError, match="hadamard"):
        op(x7, torch.ones(112, device=dev), None, None, 32, 0,
           torch.empty(1, 32, 2, 112, dtype=torch.float8_e4m3fn, device=dev), desc)
