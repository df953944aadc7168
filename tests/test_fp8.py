"""Tests for flash3.fp8: the CPU specification of the FP8 (e4m3) forward path.

Error bounds are derived from e4m3's precision: 3 mantissa bits give a
round-to-nearest relative error <= 2^-4 for normal values (|y| >= 2^-6) and an
absolute error <= 2^-10 in the subnormal range.
"""

import itertools
import math

import pytest
import torch

import flash3

from flash3.fp8 import (
    FP8_DTYPE,
    attention_fp64_reference,
    attention_fp8,
    attention_tiled_lowp,
    dequantize_fp8,
    fp8_attention_reference,
    quantize_fp8,
    quantize_fp8_per_tensor,
)
from flash3.reference import fp8 as fp8_reference
from flash3.reference.fp8 import fp8_mma

HALF_ULP = 2.0 ** -4      # relative rounding error of a normal e4m3 value
SUB_ABS = 2.0 ** -10      # absolute rounding error in e4m3's subnormal range


@pytest.fixture
def exact_mma(monkeypatch):
    """fp32 products instead of the tensor cores' truncating FP8 accumulation (fp8_mma has its own
    hand-worked tests below): for the tests that isolate the rest of the kernel's numerics."""
    monkeypatch.setattr(fp8_reference, "FP8_MMA_KEPT_BITS", None)


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _randn(shape, seed, scale=1.0):
    return torch.randn(shape, generator=_gen(seed)) * scale


def _outliers(shape, g):
    """FA3 paper Table 3 inputs: N(0, 1) + N(0, 100) * Bernoulli(0.001)."""
    x = torch.randn(shape, generator=g)
    return x + torch.randn(shape, generator=g) * 10.0 * (torch.rand(shape, generator=g) < 1e-3)


def _rmse(a, b):
    return (a.double() - b.double()).pow(2).mean().sqrt().item()


# --------------------------------------------------------------------------
# quantization
# --------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("s,block", [(1, 128), (113, 128), (203, 64), (256, 128), (203, None), (50, -1)])
def test_quantize_roundtrip_bounds(dtype, s, block):
    x = _randn((2, s, 3, 64), s, scale=3.0)
    x[0, 0, 1, 5] = 40.0  # an outlier
    x = x.to(dtype)
    x8, desc = quantize_fp8(x, block_size=block)
    assert x8.dtype == FP8_DTYPE and x8.shape == x.shape
    assert desc.dtype == torch.float32
    if block in (None, -1):
        assert desc.shape == (2, 3)
        dexp = desc[:, None, :, None]
    else:
        nb = -(-s // block)
        assert desc.shape == (2, 3, nb)
        dexp = desc.permute(0, 2, 1).repeat_interleave(block, dim=1)[:, :s, :, None]
    xf = x.float()
    y = xf / dexp                      # the block-max-scaled values
    assert y.abs().max().item() <= 448.0 * (1 + 1e-6)
    err = (x8.float() - y).abs()
    bound = torch.maximum(HALF_ULP * y.abs(), torch.full_like(y, SUB_ABS)) + 1e-6
    assert torch.all(err <= bound)
    # every block's max element maps to 448 (the scale uses e4m3's full range)
    a8 = x8.float().abs()
    if desc.dim() == 2:
        assert torch.all(a8.amax(dim=(1, 3)) == 448.0)
    else:
        for j in range(desc.shape[-1]):
            assert torch.all(a8[:, j * block:(j + 1) * block].amax(dim=(1, 3)) == 448.0)
    # dequantize agrees with x within the same bound scaled back
    xr = dequantize_fp8(x8, desc, block_size=block)
    assert torch.all((xr - xf).abs() <= bound * dexp)


def test_quantize_block_scale_values_and_zero_block():
    x = torch.zeros(1, 300, 2, 16)
    x[0, 130, 0, 3] = -7.0
    x[0, 5, 1, 0] = 0.5
    x8, desc = quantize_fp8(x, block_size=128)
    assert desc.shape == (1, 2, 3)
    assert desc[0, 0, 1].item() == pytest.approx(7.0 / 448.0)
    assert desc[0, 1, 0].item() == pytest.approx(0.5 / 448.0)
    assert desc[0, 0, 0].item() == 1.0 and desc[0, 0, 2].item() == 1.0  # all-zero blocks
    assert x8[0, 130, 0, 3].float().item() == -448.0
    assert torch.count_nonzero(x8.float()).item() == 2
    # tiny but nonzero block: no division by zero / overflow
    t = torch.full((1, 4, 1, 4), 1e-30)
    t8, td = quantize_fp8(t, block_size=2)
    assert torch.isfinite(t8.float()).all() and torch.all(td > 0)
    torch.testing.assert_close(dequantize_fp8(t8, td, block_size=2), t, rtol=HALF_ULP, atol=0)


def test_quantize_hadamard_rotates_head_dim():
    from flash3.hadamard import hadamard_transform
    x = _randn((1, 64, 2, 96), 1)
    x8, d = quantize_fp8(x, block_size=32, hadamard=True, seed=3)
    ref8, refd = quantize_fp8(hadamard_transform(x, seed=3), block_size=32)
    assert torch.equal(x8.float(), ref8.float()) and torch.equal(d, refd)


def test_quantize_per_tensor():
    x = _randn((2, 40, 4, 32), 2)
    x[1, 3, 2, 7] = 100.0
    x8, d = quantize_fp8_per_tensor(x)
    assert d.shape == (2, 4) and torch.all(d == 100.0 / 448.0)
    assert x8[1, 3, 2, 7].float().item() == 448.0
    _, d2 = quantize_fp8_per_tensor(x, num_heads=2)
    assert d2.shape == (2, 2)
    y = x / d[0, 0]
    assert torch.all((x8.float() - y).abs() <= torch.clamp_min(HALF_ULP * y.abs(), SUB_ABS) + 1e-6)


# --------------------------------------------------------------------------
# fp8_attention_reference against fp64
# --------------------------------------------------------------------------

def _p_rounding_bound(q, k, v, s_k, **kw):
    """Elementwise bound on |fp8 kernel - fp64| when only P is rounded.

    Each term P_j v_j carries P's e4m3 rounding: relative 2^-4 for normal P
    (P is scaled so the running max is 256) and absolute 2^-10 for subnormal P,
    i.e. <= 2^-10 / 256 relative to the row sum l.  Plus fp32 slack.
    """
    ref, lse = attention_fp64_reference(q, k, v, **kw)
    # p @ |v| in fp64, via the reference with |v|
    pabs, _ = attention_fp64_reference(q, k, v.abs(), **kw)
    vmax = v.double().abs().max().item()
    bound = HALF_ULP * pabs + s_k * 2.0 ** -18 * vmax + 1e-5 * pabs + 1e-6
    return ref, lse, bound


def _e4m3(shape, seed, scale=1.0):
    return (torch.randn(shape, generator=_gen(seed)) * scale).to(FP8_DTYPE)


# --------------------------------------------------------------------------
# the tensor cores' FP8 accumulation (measured on an H200: tools/device/fp8_accum_probe.py)
# --------------------------------------------------------------------------

def _e4m3_exact(values):
    t = torch.tensor(values, dtype=torch.float64)
    assert torch.equal(t.to(FP8_DTYPE).double(), t)  # every value is an e4m3 number
    return t


def test_fp8_mma_hand_values():
    """Per 32-wide chunk, products and the running sum are aligned to the largest of them and
    truncated toward zero to 13 fractional bits (expected values worked by hand)."""
    e13, e14 = 2.0 ** -13, 2.0 ** -14
    k = 64
    # b: 1 at k 0 and 32, 2^-5 at k 1, 2^-7 elsewhere (one column)
    b = [[1.0 if i % 32 == 0 else 2.0 ** -5 if i == 1 else 2.0 ** -7] for i in range(k)]
    rows = [[0.0] * k for _ in range(5)]
    rows[0][0], rows[0][1] = 1.0, 2.0 ** -9               # 1 + 31 products 2^-14, then 31 more
    for i in list(range(2, 32)) + list(range(33, 64)):
        rows[0][i] = 2.0 ** -7
    rows[1][0], rows[1][1] = 1.0, 3 * 2.0 ** -9          # 1 + 3*2^-14 -> 1 + 2^-13
    rows[2][0] = 1.0                                     # 1 + 30 * 2^-13: all kept
    for i in range(2, 32):
        rows[2][i] = 2.0 ** -6
    rows[3][1] = 2.0 ** -9                               # 31 * 2^-14 alone: kept; then + 1:
    for i in range(2, 32):                               # 15.5 * 2^-13 truncates to 15
        rows[3][i] = 2.0 ** -7
    rows[3][32] = 1.0
    rows[4][0], rows[4][1] = 1.0, -3 * 2.0 ** -9         # toward zero: 1 - 2^-13, not 1 - 2^-12
    a, bb = _e4m3_exact(rows), _e4m3_exact(b)
    got = fp8_mma(a, bb)[:, 0].tolist()
    assert got == [1.0, 1.0 + e13, 1.0 + 30 * e13, 1.0 + 15 * e13, 1.0 - e13]
    # the first chunk alone
    got1 = fp8_mma(a[:, :32], bb[:32])[:, 0].tolist()
    assert got1 == [1.0, 1.0 + e13, 1.0 + 30 * e13, 31 * e14, 1.0 - e13]
    assert fp8_mma(a, bb).dtype == torch.float32


def _scalar_rule(arow, bcol, bits=13, chunk=32):
    """The accumulation rule, one dot product at a time (exact arithmetic on Python floats)."""
    acc = None
    for k0 in range(0, len(arow), chunk):
        terms = [x * y for x, y in zip(arow[k0:k0 + chunk], bcol[k0:k0 + chunk])]
        if acc is not None:
            terms.append(acc)
        mx = max(abs(t) for t in terms)
        if mx == 0:
            acc = 0.0
            continue
        unit = 2.0 ** (math.frexp(mx)[1] - 1 - bits)
        acc = sum(math.trunc(t / unit) for t in terms) * unit
    return acc


def test_fp8_mma_matches_the_rule_on_random_e4m3():
    g = _gen(7)
    a = (torch.randn(6, 96, generator=g) * 3).to(FP8_DTYPE).double()
    b = (torch.randn(96, 5, generator=g) * 0.1).to(FP8_DTYPE).double()
    got = fp8_mma(a, b)
    for i in range(6):
        for j in range(5):
            assert got[i, j].item() == _scalar_rule(a[i].tolist(), b[:, j].tolist()), (i, j)
    # and it is not fp32 accumulation on such data
    assert not torch.equal(got, (a.float() @ b.float()))


def test_fp8_mma_slabs_and_products_near_fp32s_floor():
    """fp8_mma forms the products a slab of batch entries at a time: many slabs give what one
    entry at a time gives, and the rule; products down at 2^-122 (no FP8 data reaches them; the
    truncation unit is then subnormal, from ldexp) still follow it exactly."""
    g = _gen(11)
    a = (torch.randn(40, 64, 64, generator=g) * 4).to(FP8_DTYPE).float()
    b = (torch.randn(40, 64, 64, generator=g)).to(FP8_DTYPE).float()
    got = fp8_mma(a, b)  # 512 KiB of products per entry and chunk: 20 slabs
    assert fp8_reference._MMA_SLAB_BYTES // (32 * 64 * 64 * 4) < 40
    for e in (0, 1, 2, 21, 39):
        assert torch.equal(got[e], fp8_mma(a[e], b[e])), e
    for e, i, j in ((0, 0, 0), (21, 5, 63), (39, 63, 1)):
        assert got[e, i, j].item() == _scalar_rule(a[e, i].tolist(), b[e, :, j].tolist())
    a2, b2 = a[0, :6].clone(), b[0, :, :5].clone()
    a2[:3] *= 2.0 ** -60
    b2[:, :2] *= 2.0 ** -62
    got2 = fp8_mma(a2, b2)
    for i in range(6):
        for j in range(5):
            want = _scalar_rule(a2[i].double().tolist(), b2[:, j].double().tolist())
            assert got2[i, j].item() == want, (i, j)


def test_fp8_mma_wider_rule_in_fp64_and_empty_inner_dim(monkeypatch):
    """A wider rule (20 kept bits: the fp64 path, its unit from int64 exponent bits) follows the
    scalar rule too; an empty inner dimension gives zeros of the broadcast (..., m, n) shape."""
    g = _gen(12)
    a = (torch.randn(2, 5, 70, generator=g) * 3).to(FP8_DTYPE).float()
    b = (torch.randn(70, 4, generator=g) * 0.1).to(FP8_DTYPE).float()
    monkeypatch.setattr(fp8_reference, "FP8_MMA_KEPT_BITS", 20)
    got = fp8_mma(a, b)
    assert got.dtype == torch.float32
    for e, i, j in ((0, 0, 0), (1, 4, 3), (0, 2, 1)):
        assert got[e, i, j].item() == _scalar_rule(a[e, i].tolist(), b[:, j].tolist(), bits=20)
    monkeypatch.setattr(fp8_reference, "FP8_MMA_KEPT_BITS", 13)
    for sa, sb, want in (((2, 5, 0), (0, 3), (2, 5, 3)), ((4, 0), (0, 4), (4, 4)), ((3, 1, 2, 0), (5, 0, 1), (3, 5, 2, 1))):
        z = fp8_mma(torch.ones(sa), torch.ones(sb))
        assert z.shape == want and not z.any(), (sa, sb)


def test_fp8_mma_batched_and_exact_mode(monkeypatch):
    g = _gen(8)
    a = (torch.randn(2, 3, 4, 64, generator=g)).to(FP8_DTYPE).float()
    b = (torch.randn(2, 1, 64, 8, generator=g)).to(FP8_DTYPE).float()
    got = fp8_mma(a, b)
    assert got.shape == (2, 3, 4, 8)
    assert torch.equal(got[1, 2], fp8_mma(a[1, 2], b[1, 0]))
    monkeypatch.setattr(fp8_reference, "FP8_MMA_KEPT_BITS", None)
    torch.testing.assert_close(fp8_mma(a, b), a @ b, rtol=1e-6, atol=1e-6)


@pytest.mark.usefixtures("exact_mma")
@pytest.mark.parametrize("s_q,s_k", [(1, 1), (113, 203), (203, 113), (256, 256)])
def test_exact_inputs_match_fp64_within_p_rounding(s_q, s_k):
    b, h, d = 2, 3, 64
    q, k, v = _e4m3((b, s_q, h, d), 1, 0.5), _e4m3((b, s_k, h, d), 2, 0.5), _e4m3((b, s_k, h, d), 3)
    ones = torch.ones(b, h)
    out, lse = fp8_attention_reference(q, k, v, ones, ones, ones, block_size=(64, 64))
    assert out.dtype == torch.float32 and out.shape == (b, s_q, h, d)
    assert lse.shape == (b, h, s_q)
    ref, ref_lse, bound = _p_rounding_bound(q, k, v, s_k)
    err = (out.double() - ref).abs()
    assert torch.all(err <= bound), (err - bound).max()
    # lse uses the unrounded fp32 row sums: fp32-accurate
    assert (lse.double() - ref_lse).abs().max().item() < 1e-4
    if s_k > 1:
        assert err.max().item() > 0  # P really is rounded to e4m3
    # descale None == ones
    out2, lse2 = fp8_attention_reference(q, k, v, block_size=(64, 64))
    assert torch.equal(out, out2) and torch.equal(lse, lse2)


def test_single_tile_matches_direct_formula():
    """With one key tile the online softmax is a single step: check the formula."""
    b, s, h, d = 1, 50, 2, 32
    q, k, v = _e4m3((b, s, h, d), 4), _e4m3((b, s, h, d), 5), _e4m3((b, s, h, d), 6)
    qd, kd, vd = torch.full((b, h), 0.3), torch.full((b, h), 0.2), torch.full((b, h), 1.7)
    scale = 0.11
    out, lse = fp8_attention_reference(q, k, v, qd, kd, vd, softmax_scale=scale, block_size=(64, 64))
    S = fp8_mma(q.float().permute(0, 2, 1, 3), k.float().permute(0, 2, 3, 1)) * (0.3 * 0.2 * scale)
    m = S.amax(-1, keepdim=True)
    log2e = 1 / math.log(2)
    P = torch.exp2((S - m) * log2e + 8)
    l = P.sum(-1)
    P8 = P.to(FP8_DTYPE).float()
    O = fp8_mma(P8, v.float().permute(0, 2, 1, 3)).permute(0, 2, 1, 3) * 1.7 / l.permute(0, 2, 1)[..., None]
    torch.testing.assert_close(out, O, rtol=2e-6, atol=2e-6)
    torch.testing.assert_close(lse, (m.squeeze(-1) + torch.log(l) - 8 * math.log(2)), rtol=0, atol=1e-5)
    assert P.max().item() == 256.0


def test_per_block_and_per_head_descale_agree():
    b, s_q, s_k, h, hk, d = 2, 203, 150, 4, 2, 32
    q, k, v = _e4m3((b, s_q, h, d), 7), _e4m3((b, s_k, hk, d), 8), _e4m3((b, s_k, hk, d), 9)
    cq = torch.rand(b, hk, generator=_gen(1)) + 0.1
    ck = torch.rand(b, hk, generator=_gen(2)) + 0.1
    cv = torch.rand(b, hk, generator=_gen(3)) + 0.1
    br, bc = 64, 32
    nq, nk = -(-s_q // br), -(-s_k // bc)
    cq_blk = cq.repeat_interleave(h // hk, dim=1)[..., None].expand(b, h, nq).contiguous()
    ck_blk = ck[..., None].expand(b, hk, nk).contiguous()
    cv_blk = cv[..., None].expand(b, hk, nk).contiguous()
    kw = dict(block_size=(br, bc), causal=True, softcap=5.0)
    o1, l1 = fp8_attention_reference(q, k, v, cq, ck, cv, **kw)
    o2, l2 = fp8_attention_reference(q, k, v, cq_blk, ck_blk, cv_blk, **kw)
    o3, l3 = fp8_attention_reference(q, k, v, cq.repeat_interleave(h // hk, dim=1), ck, cv, **kw)
    assert torch.equal(o1, o2) and torch.equal(l1, l2)
    assert torch.equal(o1, o3) and torch.equal(l1, l3)


CASES = [
    # (s_q, s_k, h, hk, d, causal, window, softcap)
    (1, 1, 2, 2, 64, False, (-1, -1), 0.0),
    (113, 113, 4, 2, 64, True, (-1, -1), 0.0),
    (203, 113, 4, 1, 64, True, (-1, -1), 0.0),
    (113, 203, 2, 2, 96, False, (32, 16), 0.0),
    (203, 203, 6, 2, 128, False, (-1, -1), 10.0),
    (113, 256, 2, 1, 80, True, (50, -1), 4.0),
]


@pytest.mark.usefixtures("exact_mma")
@pytest.mark.parametrize("s_q,s_k,h,hk,d,causal,window,softcap", CASES)
def test_block_descales_match_fp64_on_dequantized_inputs(s_q, s_k, h, hk, d, causal, window, softcap):
    """Exact spec of the kernel given its quantized inputs: only P is rounded."""
    b = 2
    q, k, v = _randn((b, s_q, h, d), 11), _randn((b, s_k, hk, d), 12), _randn((b, s_k, hk, d), 13, 2.0)
    q8, qd = quantize_fp8(q, block_size=64)
    k8, kd = quantize_fp8(k, block_size=32)
    v8, vd = quantize_fp8(v, block_size=32)
    qq, kk, vv = (dequantize_fp8(q8, qd, block_size=64), dequantize_fp8(k8, kd, block_size=32),
                  dequantize_fp8(v8, vd, block_size=32))
    kw = dict(causal=causal, window_size=window, softcap=softcap)
    out, lse = fp8_attention_reference(q8, k8, v8, qd, kd, vd, causal=causal, window_left=window[0],
                                       window_right=window[1], softcap=softcap, block_size=(64, 32))
    ref, ref_lse, bound = _p_rounding_bound(qq, kk, vv, s_k, **kw)
    assert torch.all((out.double() - ref).abs() <= bound)
    fin = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), fin)
    assert (lse.double()[fin] - ref_lse[fin]).abs().max().item() < 1e-4


@pytest.mark.parametrize("s_q,s_k,h,hk,d,causal,window,softcap", CASES)
@pytest.mark.parametrize("hadamard", [False, True])
def test_attention_fp8_close_to_fp64(s_q, s_k, h, hk, d, causal, window, softcap, hadamard):
    """End to end against fp64 on the unquantized (bf16) inputs.

    Each of q, k, v carries e4m3 rounding, a relative error of rms about
    0.03 (uniform within +-2^-4 at the bottom of a binade, +-2^-5 at the top).
    * out: a convex combination of rows of v, so V's own rounding alone gives
      an rms error ~0.03 * rms(v) (the whole error when one key is visible);
      P's rounding (<= 2^-4 relative per term, unbiased) and score errors mostly
      average out over keys -> rmse < 0.04 for N(0, 1) v;
      elementwise, V and P rounding contribute <= 2^-4 max|v| each, plus the
      score error -> < 3 * 2^-4 * max|v|.
    * lse: scores s = q.k / sqrt(d) get an absolute error of rms
      ~ sqrt(2) * 0.03 ~ 0.04 for N(0, 1) q, k; lse is a smooth max over
      them -> below 5 sigma = 0.2 on every row.
    """
    b = 1
    q = _randn((b, s_q, h, d), 21).bfloat16()
    k = _randn((b, s_k, hk, d), 22).bfloat16()
    v = _randn((b, s_k, hk, d), 23).bfloat16()
    out, lse = attention_fp8(q, k, v, causal=causal, window_size=window, softcap=softcap, hadamard=hadamard,
                             block_size=(64, 64), return_lse=True)
    assert out.dtype == torch.bfloat16 and out.shape == (b, s_q, h, d)
    ref, ref_lse = attention_fp64_reference(q, k, v, causal=causal, window_size=window, softcap=softcap)
    assert _rmse(out, ref) < 0.04
    vmax = v.float().abs().max().item()
    assert (out.double() - ref).abs().max().item() < 3 * HALF_ULP * vmax
    fin = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), fin)
    assert (lse.double()[fin] - ref_lse[fin]).abs().max().item() < 0.2


def test_fp16_inputs_and_default_scale():
    q, k, v = (_randn((1, 70, 2, 48), i).half() for i in (1, 2, 3))
    o1 = attention_fp8(q, k, v)
    o2 = attention_fp8(q, k, v, softmax_scale=1 / math.sqrt(48))
    assert o1.dtype == torch.float16 and torch.equal(o1, o2)
    o3 = attention_fp8(q, k, v, softmax_scale=0.5)
    assert not torch.equal(o1, o3)
    # per-(batch, head) scale mode
    o4 = attention_fp8(q, k, v, block_size=None)
    ref, _ = attention_fp64_reference(q, k, v)
    assert _rmse(o4, ref) < 0.03


def test_empty_rows_are_exact_zero_and_neg_inf():
    b, h, d = 1, 2, 32
    q, k, v = _e4m3((b, 9, h, d), 1), _e4m3((b, 4, h, d), 2), _e4m3((b, 4, h, d), 3)
    # causal with s_q > s_k: rows i < s_q - s_k see no key
    out, lse = fp8_attention_reference(q, k, v, causal=True, block_size=(4, 2))
    assert torch.all(out[:, :5] == 0) and torch.all(lse[:, :, :5] == -math.inf)
    assert torch.all(torch.isfinite(lse[:, :, 5:])) and torch.all(out[:, 5:].abs().sum(-1) > 0)
    # local window (0, 0) with s_q > s_k: only the diagonal key, same empty rows
    out, lse = fp8_attention_reference(q, k, v, window_left=0, window_right=0, block_size=(4, 2))
    assert torch.all(out[:, :5] == 0) and torch.all(lse[:, :, :5] == -math.inf)
    ref, _ = attention_fp64_reference(q, k, v, window_size=(0, 0))
    # a single visible key: P = 256 exactly, output = v exactly
    torch.testing.assert_close(out.double(), ref, rtol=0, atol=0)
    # no keys at all
    k0, v0 = k[:, :0], v[:, :0]
    out, lse = fp8_attention_reference(q, k0, v0)
    assert torch.all(out == 0) and torch.all(lse == -math.inf)
    o, l = attention_fp8(q.float(), k0.float(), v0.float(), return_lse=True)
    assert torch.all(o == 0) and torch.all(l == -math.inf)


def test_gqa_head_mapping():
    """q head i uses kv head i // (h / h_k): compare with explicitly repeated k/v."""
    b, s, h, hk, d = 1, 77, 6, 2, 32
    q, k, v = _e4m3((b, s, h, d), 1), _e4m3((b, s, hk, d), 2), _e4m3((b, s, hk, d), 3)
    kr = k.float().repeat_interleave(h // hk, dim=2).to(FP8_DTYPE)
    vr = v.float().repeat_interleave(h // hk, dim=2).to(FP8_DTYPE)
    o1, l1 = fp8_attention_reference(q, k, v, causal=True, block_size=(32, 32))
    o2, l2 = fp8_attention_reference(q, kr, vr, causal=True, block_size=(32, 32))
    torch.testing.assert_close(o1, o2, rtol=0, atol=0)
    torch.testing.assert_close(l1, l2, rtol=0, atol=0)


# --------------------------------------------------------------------------
# Hadamard / block quantization accuracy on outliers (FA3 paper, Table 3)
# --------------------------------------------------------------------------

def test_hadamard_more_accurate_on_outliers():
    g = _gen(0)
    shape = (1, 256, 4, 128)
    q, k, v = _outliers(shape, g), _outliers(shape, g), _outliers(shape, g)
    ref, _ = attention_fp64_reference(q, k, v)
    e_plain = _rmse(attention_fp8(q, k, v, hadamard=False), ref)
    e_had = _rmse(attention_fp8(q, k, v, hadamard=True), ref)
    assert e_had < e_plain


def test_table3_inequalities():
    """Block + Hadamard >= 1.5x lower RMSE than per-tensor FP8, and Hadamard
    helps over block quantization alone (benchmarks/fp8_accuracy.py)."""
    g = _gen(0)
    shape = (1, 1024, 4, 128)
    q, k, v = _outliers(shape, g), _outliers(shape, g), _outliers(shape, g)
    ref, _ = attention_fp64_reference(q, k, v)
    (q8, qd), (k8, kd), (v8, vd) = (quantize_fp8_per_tensor(t) for t in (q, k, v))
    e_tensor = _rmse(fp8_attention_reference(q8, k8, v8, qd, kd, vd)[0], ref)
    e_block = _rmse(attention_fp8(q, k, v, hadamard=False), ref)
    e_had = _rmse(attention_fp8(q, k, v, hadamard=True), ref)
    assert e_tensor / e_had >= 1.5, (e_tensor, e_block, e_had)
    assert e_block / e_had >= 1.2, (e_tensor, e_block, e_had)
    assert e_had < 1e-2
    # and FP8 is (as expected) far less accurate than fp16 attention
    e16 = _rmse(attention_tiled_lowp(q.half(), k.half(), v.half()), ref)
    assert e16 < e_had / 10


# --------------------------------------------------------------------------
# argument validation
# --------------------------------------------------------------------------

def test_bad_args():
    x = _randn((1, 8, 2, 16), 0)
    x8 = x.to(FP8_DTYPE)
    with pytest.raises(TypeError, match="x"):
        quantize_fp8(x.to(torch.int32))
    with pytest.raises(ValueError, match="x"):
        quantize_fp8(x[0])
    with pytest.raises(ValueError, match="block_size"):
        quantize_fp8(x, block_size=0)
    with pytest.raises(TypeError, match="block_size"):
        quantize_fp8(x, block_size=2.5)
    with pytest.raises(TypeError, match="hadamard"):
        quantize_fp8(x, hadamard="yes")
    bad = x.clone()
    bad[0, 0, 0, 0] = float("inf")
    with pytest.raises(ValueError, match="non-finite"):
        quantize_fp8(bad)
    with pytest.raises(TypeError, match="q"):
        fp8_attention_reference(x, x8, x8)
    k3 = _e4m3((1, 8, 3, 16), 1)
    with pytest.raises(ValueError, match="heads"):
        fp8_attention_reference(x8, k3, k3)
    with pytest.raises(ValueError, match="head dim"):
        fp8_attention_reference(x8, x8[..., :8], x8)
    with pytest.raises(ValueError, match="seqlen"):
        fp8_attention_reference(x8, x8, x8[:, :4])
    with pytest.raises(ValueError, match="k_descale"):
        fp8_attention_reference(x8, x8, x8, None, torch.ones(1, 3), None)
    with pytest.raises(ValueError, match="q_descale"):
        fp8_attention_reference(x8, x8, x8, torch.ones(1, 2, 5), None, None, block_size=(4, 4))
    with pytest.raises(TypeError, match="v_descale"):
        fp8_attention_reference(x8, x8, x8, None, None, torch.ones(1, 2, dtype=torch.int64))
    with pytest.raises(ValueError, match="softcap"):
        fp8_attention_reference(x8, x8, x8, softcap=-1.0)
    with pytest.raises(TypeError, match="window_left"):
        fp8_attention_reference(x8, x8, x8, window_left=1.5)
    with pytest.raises(TypeError, match="causal"):
        fp8_attention_reference(x8, x8, x8, causal=None)
    with pytest.raises(ValueError, match=r"block_size\[1\]"):
        fp8_attention_reference(x8, x8, x8, block_size=(64, 0))
    with pytest.raises(TypeError, match="block_size"):
        fp8_attention_reference(x8, x8, x8, block_size=(64, 64, 64))
    with pytest.raises(TypeError, match="q"):
        attention_fp8(x8, x8, x8)
    with pytest.raises(TypeError, match="window_size"):
        attention_fp8(x, x, x, window_size=3)
    with pytest.raises(TypeError, match="softmax_scale"):
        attention_fp8(x, x, x, softmax_scale="a")
    with pytest.raises(TypeError, match="seed"):
        attention_fp8(x, x, x, seed=None)
    with pytest.raises(ValueError, match="num_heads"):
        quantize_fp8_per_tensor(x, num_heads=0)


def test_tile_skipping_matches_masking_spec():
    """The tile classifier never skips a visible pair and calls 'full' only fully visible tiles."""
    import itertools

    import flash3.fp8 as F
    from flash3 import masking

    for s_q, s_k, left, right in itertools.product([1, 5, 9], [1, 4, 9], [-1, 0, 2], [-1, 0, 3]):
        for r0, r1, c0, c1 in [(0, s_q, 0, s_k), (1, 3, 0, 2), (2, 7, 1, 5)]:
            r1, c1 = min(r1, s_q), min(c1, s_k)
            if r1 <= r0 or c1 <= c0:
                continue
            spec = masking.visible_mask(r0, r1, c0, c1, s_q, s_k, False, left, right)
            state = F._tile_state(r0, r1, c0, c1, s_q, s_k, left, right)
            assert (state == "skip") == (not spec.any())
            assert state != "full" or bool(spec.all())


@pytest.mark.parametrize("per_block", [True, False])
def test_public_attention_routes_e4m3_to_the_fp8_path(per_block):
    """flash3.attention on e4m3 tensors is the FP8 emulation (bf16 out), under torch.compile too."""
    import flash3

    torch.manual_seed(3)
    q, k, v = (torch.randn(2, 150, h, 64) for h in (4, 2, 2))
    if per_block:
        (q8, qd), (k8, kd), (v8, vd) = (quantize_fp8(x, block_size=64) for x in (q, k, v))
    else:
        (q8, _), (k8, _), (v8, _) = (quantize_fp8(x, block_size=None) for x in (q, k, v))
        qd = kd = vd = torch.rand(2, 2) + 0.5  # FA3's per-(batch, kv head) form
    kw = dict(q_descale=qd, k_descale=kd, v_descale=vd, fp8_block_size=(64, 64))
    out, lse = flash3.attention(q8, k8, v8, causal=True, return_lse=True, **kw)
    ref, ref_lse = fp8_attention_reference(q8, k8, v8, qd, kd, vd, softmax_scale=64 ** -0.5,
                                           causal=True, block_size=(64, 64))
    assert out.dtype == torch.bfloat16 and out.shape == (2, 150, 4, 64)
    assert torch.equal(out, ref.to(torch.bfloat16)) and torch.allclose(lse, ref_lse)
    compiled = torch.compile(lambda a, b, c: flash3.attention(a, b, c, causal=True, **kw),
                             fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(q8, k8, v8), out)
    with pytest.raises(ValueError, match="v_descale"):
        flash3.attention(q8, k8, v8, q_descale=qd, k_descale=kd, fp8_block_size=(64, 64))


# --------------------------------------------------------------------------
# kernel tiling: descending key tiles, tile_n vs the descale block
# --------------------------------------------------------------------------

def test_kernel_tile_n():
    from flash3.fp8 import kernel_tile_n
    assert [kernel_tile_n(d) for d in (32, 64, 96, 128, 192, 256)] == [128, 128, 128, 128, 64, 64]
    assert [kernel_tile_n(d, 48) for d in (32, 64, 96, 128, 192, 256)] == [128, 128, 128, 128, 32, 32]
    assert [kernel_tile_n(d, fast_accum=True) for d in (32, 64, 128, 256)] == [128] * 4
    with pytest.raises(ValueError):
        kernel_tile_n(0)


def _manual_online(q8, k8, v8, scale, tile, descending):
    """Straight transcription of the kernel loop (one head, no descales, no mask)."""
    qf, kf, vf = q8.float()[0, :, 0], k8.float()[0, :, 0], v8.float()[0, :, 0]
    s_k = kf.shape[0]
    starts = list(range(0, s_k, tile))
    if descending:
        starts = starts[::-1]
    m = torch.full((qf.shape[0],), -math.inf)
    l = torch.zeros(qf.shape[0])
    acc = torch.zeros(qf.shape[0], vf.shape[1])
    log2e = 1 / math.log(2)
    for c0 in starts:
        s = fp8_mma(qf, kf[c0:c0 + tile].T) * torch.tensor(scale, dtype=torch.float32)
        m_new = torch.maximum(m, s.amax(-1))
        p = torch.exp2((s - m_new[:, None]) * log2e + 8)
        alpha = torch.exp2((m - m_new) * log2e)
        l = l * alpha + p.sum(-1)
        acc = acc * alpha[:, None] + fp8_mma(p.to(FP8_DTYPE).float(), vf[c0:c0 + tile])
        m = m_new
    return acc / l[:, None]


def test_key_tiles_walk_descending():
    s_q, s_k, d = 40, 300, 64  # tiles [256, 300), [128, 256), [0, 128)
    q, k, v = _e4m3((1, s_q, 1, d), 31), _e4m3((1, s_k, 1, d), 32), _e4m3((1, s_k, 1, d), 33)
    # make the row max move between tiles so the rescale points matter
    k = (k.float() * torch.linspace(0.5, 2.0, s_k)[None, :, None, None]).to(FP8_DTYPE)
    out, _ = fp8_attention_reference(q, k, v, softmax_scale=0.2, block_size=(64, 128))
    desc = _manual_online(q, k, v, 0.2, 128, True)
    asc = _manual_online(q, k, v, 0.2, 128, False)
    torch.testing.assert_close(out[0, :, 0], desc, rtol=1e-5, atol=1e-5)
    assert (out[0, :, 0] - asc).abs().max().item() > 1e-3  # the order is visible in P's rounding


def test_tile_n_smaller_than_descale_block():
    """k/v descale blocks of 128 keys with 64-key tiles: each descale covers 2 tiles."""
    b, s_q, s_k, h, hk, d = 1, 70, 300, 4, 2, 256
    q, k, v = _e4m3((b, s_q, h, d), 41), _e4m3((b, s_k, hk, d), 42), _e4m3((b, s_k, hk, d), 43)
    nk = -(-s_k // 128)
    kd = torch.rand(b, hk, nk, generator=_gen(4)) + 0.2
    vd = torch.rand(b, hk, nk, generator=_gen(5)) + 0.2
    kw = dict(causal=True, softcap=3.0)
    o128, l128 = fp8_attention_reference(q, k, v, None, kd, vd, block_size=(64, 128), **kw)  # tile 64 (d=256)
    o_t64, l_t64 = fp8_attention_reference(q, k, v, None, kd, vd, block_size=(64, 128), tile_n=64, **kw)
    kd64, vd64 = kd.repeat_interleave(2, -1)[..., :-(-s_k // 64)], vd.repeat_interleave(2, -1)[..., :-(-s_k // 64)]
    o64, l64 = fp8_attention_reference(q, k, v, None, kd64, vd64, block_size=(64, 64), **kw)
    assert torch.equal(o128, o_t64) and torch.equal(l128, l_t64)
    assert torch.equal(o128, o64) and torch.equal(l128, l64)
    # 128-key tiles give a different rounding of P, but the same function up to it
    o_t128, _ = fp8_attention_reference(q, k, v, None, kd, vd, block_size=(64, 128), tile_n=128, **kw)
    assert not torch.equal(o_t128, o128)
    assert (o_t128 - o128).abs().max().item() < 3 * HALF_ULP * v.float().abs().max().item() * vd.max().item()
    with pytest.raises(ValueError, match="multiple of tile_n"):
        fp8_attention_reference(q, k, v, None, kd, vd, block_size=(64, 128), tile_n=96)


def test_q_descale_per_64_rows_and_query_tile_height():
    """q blocks of 64 vs 128 rows with equal descale values give identical results."""
    b, s, h, d = 1, 200, 2, 64
    q, k, v = _e4m3((b, s, h, d), 51), _e4m3((b, s, h, d), 52), _e4m3((b, s, h, d), 53)
    c = torch.rand(b, h, 2, generator=_gen(6)) + 0.5
    o128, l128 = fp8_attention_reference(q, k, v, c, None, None, block_size=(128, 128))
    c64 = c.repeat_interleave(2, -1)[..., :4]
    o64, l64 = fp8_attention_reference(q, k, v, c64, None, None, block_size=(64, 128))
    torch.testing.assert_close(o64, o128, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(l64, l128, rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------
# V per-channel descale
# --------------------------------------------------------------------------

def test_v_channel_descale_scales_output_columns():
    b, s, h, hk, d, dv = 2, 150, 4, 2, 64, 32
    q, k, v = _e4m3((b, s, h, d), 61), _e4m3((b, s, hk, d), 62), _e4m3((b, s, hk, dv), 63)
    vd = torch.rand(b, hk, 2, generator=_gen(7)) + 0.5
    vcd = torch.rand(b, hk, dv, generator=_gen(8)) * 3 + 0.1
    o, lse = fp8_attention_reference(q, k, v, None, None, vd, causal=True, window_left=30)
    oc, lsec = fp8_attention_reference(q, k, v, None, None, vd, causal=True, window_left=30,
                                       v_channel_descale=vcd)
    assert torch.equal(lse, lsec)
    want = o * vcd.repeat_interleave(h // hk, dim=1)[:, None]
    torch.testing.assert_close(oc, want, rtol=1e-6, atol=0)
    with pytest.raises(ValueError, match="v_channel_descale"):
        fp8_attention_reference(q, k, v, v_channel_descale=torch.ones(b, hk, dv + 1))
    with pytest.raises(TypeError, match="v_channel_descale"):
        fp8_attention_reference(q, k, v, v_channel_descale=torch.ones(b, hk, dv, dtype=torch.int32))


@pytest.mark.parametrize("channel,block", [(True, True), (True, False), (False, True)])
def test_quantize_v_fp8(channel, block):
    from flash3.fp8 import quantize_v_fp8
    v = _randn((2, 203, 2, 48), 9) * torch.linspace(0.01, 30, 48)
    v[0, :, 1, 3] = 0.0  # all-zero channel
    v8, vd, vcd = quantize_v_fp8(v, block_size=64, channel=channel, block=block)
    assert (vcd is not None) == channel
    assert vd.shape == ((2, 2, 4) if block else (2, 2))
    deq = dequantize_fp8(v8, vd, block_size=64)
    unit = dequantize_fp8(torch.ones_like(v8.float()).to(FP8_DTYPE), vd, block_size=64)  # the descale
    if channel:
        assert vcd.shape == (2, 2, 48) and vcd[0, 1, 3].item() == 1.0
        deq, unit = deq * vcd[:, None], unit * vcd[:, None]
    assert torch.all((deq - v).abs() <= HALF_ULP * v.abs() + SUB_ABS * unit + 1e-6 * unit)
    if not channel:
        r8, rd = quantize_fp8(v, block_size=64)
        assert torch.equal(r8.float(), v8.float()) and torch.equal(rd, vd)


def test_attention_fp8_v_channel_close_to_kernel_spec():
    """attention_fp8(v_scale=...) == the kernel spec on its own quantized inputs."""
    from flash3.fp8 import quantize_v_fp8
    q, k, v = _randn((1, 150, 2, 64), 71), _randn((1, 150, 2, 64), 72), _randn((1, 150, 2, 64), 73)
    v = v * torch.linspace(0.1, 10, 64)
    for mode in ("channel", "block+channel"):
        out = attention_fp8(q, k, v, hadamard=False, smooth_k=False, v_scale=mode, block_size=(64, 128))
        q8, qd = quantize_fp8(q, block_size=64)
        k8, kd = quantize_fp8(k, block_size=128)
        v8, vd, vcd = quantize_v_fp8(v, block_size=128, block=mode != "channel")
        ref, _ = fp8_attention_reference(q8, k8, v8, qd, kd, vd, v_channel_descale=vcd, block_size=(64, 128))
        assert torch.equal(out, ref)
    with pytest.raises(ValueError, match="v_scale"):
        attention_fp8(q, k, v, v_scale="tensor")


# --------------------------------------------------------------------------
# K smoothing
# --------------------------------------------------------------------------

def test_quantize_smooth_returns_mean():
    from flash3.fp8 import k_smoothing_mean
    from flash3.hadamard import hadamard_transform
    k = _randn((2, 100, 3, 64), 81) + 7.0 * _randn((2, 1, 3, 64), 82)
    k8, kd, mean = quantize_fp8(k, block_size=64, hadamard=True, seed=5, smooth=True)
    kr = hadamard_transform(k, seed=5)
    torch.testing.assert_close(mean, kr.mean(dim=1))
    torch.testing.assert_close(k_smoothing_mean(kr), mean)
    r8, rd = quantize_fp8(kr - mean[:, None], block_size=64)
    assert torch.equal(r8.float(), k8.float()) and torch.equal(rd, kd)
    rec = dequantize_fp8(k8, kd, block_size=64) + mean[:, None]
    assert (rec - kr).abs().max().item() < 0.1 * (kr - mean[:, None]).abs().max().item()
    assert torch.equal(k_smoothing_mean(k[:, :0]), torch.zeros(2, 3, 64))
    with pytest.raises(TypeError, match="smooth"):
        quantize_fp8(k, smooth=1)


@pytest.mark.parametrize("causal,window", [(False, (-1, -1)), (True, (-1, -1)), (False, (40, 10))])
def test_k_smoothing_exact_without_softcap(causal, window):
    """Subtracting mean_k shifts each row's scores by q.mean_k: out unchanged, lse shifted.

    Checked in fp64 on the dequantized inputs the kernel sees, and end to end:
    attention_fp8's lse (with the correction) is the true lse.
    """
    from flash3.fp8 import smoothing_lse_correction
    b, s_q, s_k, h, hk, d = 1, 120, 170, 4, 2, 64
    q = _randn((b, s_q, h, d), 91)
    k = _randn((b, s_k, hk, d), 92) + 6.0 * _randn((b, 1, hk, d), 93)  # large shared key mean
    v = _randn((b, s_k, hk, d), 94)
    scale = d ** -0.5
    q8, qd = quantize_fp8(q, block_size=64)
    k8, kd, mean = quantize_fp8(k, block_size=128, smooth=True)
    v8, vd = quantize_fp8(v, block_size=128)
    qq, ks, vv = (dequantize_fp8(q8, qd, block_size=64), dequantize_fp8(k8, kd, block_size=128),
                  dequantize_fp8(v8, vd, block_size=128))
    kw = dict(causal=causal, window_size=window)
    ref_s, lse_s = attention_fp64_reference(qq.double(), ks.double(), vv.double(), **kw)
    ref_u, lse_u = attention_fp64_reference(qq.double(), ks.double() + mean.double()[:, None], vv.double(),
                                            **kw)
    corr = smoothing_lse_correction(qq.double(), mean.double(), scale).double()
    fin = torch.isfinite(lse_u)
    assert torch.equal(fin, torch.isfinite(lse_s))
    torch.testing.assert_close(ref_s, ref_u, rtol=0, atol=1e-9)          # exact in fp64
    # (the correction is computed in fp32)
    torch.testing.assert_close(lse_s[fin] + corr[fin], lse_u[fin], rtol=1e-6, atol=2e-5)
    # the kernel on smoothed k: within P's rounding of the fp64 result
    out, lse = fp8_attention_reference(q8, k8, v8, qd, kd, vd, causal=causal, window_left=window[0],
                                       window_right=window[1], block_size=(64, 128))
    _, _, bound = _p_rounding_bound(qq, ks, vv, s_k, **kw)
    assert torch.all((out.double() - ref_u).abs() <= bound)
    # end to end: true lse, and smoothing beats no smoothing by a wide margin here
    ref, ref_lse = attention_fp64_reference(q, k, v, **kw)
    o_s, l_s = attention_fp8(q, k, v, smooth_k=True, return_lse=True, **kw)
    o_n, l_n = attention_fp8(q, k, v, smooth_k=False, return_lse=True, **kw)
    assert (l_s.double()[fin] - ref_lse[fin]).abs().max().item() < 0.2
    assert _rmse(o_s, ref) < 0.5 * _rmse(o_n, ref)
    o_d, l_d = attention_fp8(q, k, v, return_lse=True, **kw)  # default: smoothing on
    assert torch.equal(o_d, o_s) and torch.equal(l_d, l_s)


def test_k_smoothing_and_softcap():
    q, k, v = _randn((1, 64, 2, 32), 1), _randn((1, 64, 2, 32), 2) + 3.0, _randn((1, 64, 2, 32), 3)
    with pytest.raises(ValueError, match="softcap"):
        attention_fp8(q, k, v, softcap=5.0, smooth_k=True)
    o_def = attention_fp8(q, k, v, softcap=5.0)  # default: off with softcap
    o_off = attention_fp8(q, k, v, softcap=5.0, smooth_k=False)
    assert torch.equal(o_def, o_off)
    with pytest.raises(TypeError, match="smooth_k"):
        attention_fp8(q, k, v, smooth_k="yes")


# --------------------------------------------------------------------------
# V layout for the kernel
# --------------------------------------------------------------------------

@pytest.mark.parametrize("s", [0, 1, 15, 16, 37, 64])
def test_pack_unpack_v_fp8(s):
    from flash3.fp8 import V_PERM16, pack_v_fp8, unpack_v_fp8
    assert sorted(V_PERM16) == list(range(16))
    v8 = _e4m3((2, s, 3, 24), s + 100)
    vt = pack_v_fp8(v8)
    s_pad = -(-s // 16) * 16
    assert vt.dtype == FP8_DTYPE and vt.shape == (2, 3, 24, s_pad) and vt.is_contiguous()
    vb, tb = v8.view(torch.uint8), vt.view(torch.uint8)
    for g in range(s_pad // 16):
        for i in range(16):
            j = 16 * g + V_PERM16[i]
            want = vb[:, j].permute(0, 1, 2) if j < s else torch.zeros(2, 3, 24, dtype=torch.uint8)
            assert torch.equal(tb[:, :, :, 16 * g + i], want)
    back = unpack_v_fp8(vt, s)
    assert back.dtype == FP8_DTYPE and back.shape == v8.shape
    assert torch.equal(back.view(torch.uint8), vb)
    # non-contiguous input (a slice of a wider tensor) and other dtypes
    wide = _e4m3((2, s, 3, 48), 7)
    assert torch.equal(unpack_v_fp8(pack_v_fp8(wide[..., ::2]), s).view(torch.uint8),
                       wide[..., ::2].contiguous().view(torch.uint8))
    x = _randn((1, s, 2, 8), 3)
    assert torch.equal(unpack_v_fp8(pack_v_fp8(x), s), x)
    with pytest.raises(ValueError):
        unpack_v_fp8(vt, s + 16)


def test_checks_fp8_descales_new_forms():
    from flash3 import _checks
    q8, k8, v8 = _e4m3((2, 150, 4, 64), 1), _e4m3((2, 300, 2, 64), 2), _e4m3((2, 300, 2, 32), 3)
    f = torch.ones
    for qd in (f(2, 2), f(2, 4), f(2, 2, 3), f(2, 4, 3)):
        _checks.fp8_descales(q8, k8, v8, qd, f(2, 2, 3), f(2, 2), (64, 128))
    _checks.fp8_descales(q8, k8, v8, f(2, 4, 2), f(2, 2, 3), f(2, 2, 3), (128, 128),
                         v_channel_descale=f(2, 2, 32))
    with pytest.raises(ValueError, match="q_descale"):
        _checks.fp8_descales(q8, k8, v8, f(2, 4, 2), f(2, 2), f(2, 2), (64, 128))
    with pytest.raises(ValueError, match="v_channel_descale must have shape"):
        _checks.fp8_descales(q8, k8, v8, f(2, 2), f(2, 2), f(2, 2), (64, 128), v_channel_descale=f(2, 2, 64))
    with pytest.raises(TypeError, match="v_channel_descale must be float32"):
        _checks.fp8_descales(q8, k8, v8, f(2, 2), f(2, 2), f(2, 2), (64, 128),
                             v_channel_descale=f(2, 2, 32, dtype=torch.float64))
    q = _randn((2, 150, 4, 64), 1)
    with pytest.raises(ValueError, match="v_channel_descale is only used"):
        _checks.fp8_descales(q, q, q, None, None, None, (64, 128), v_channel_descale=f(2, 2, 32))


def test_accuracy_benchmark_quick(tmp_path):
    import importlib.util
    import os
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks",
                        "fp8_accuracy.py")
    spec = importlib.util.spec_from_file_location("fp8_accuracy", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--quick", "--out", str(tmp_path)]) == 0
    import json
    res = json.loads((tmp_path / "fp8_accuracy_quick.json").read_text())
    assert set(res["cases"]) == {"outliers", "kmean", "causal"}
    assert res["targets"]["K smoothing helps on kmean"]


# --------------------------------------------------------------------------
# varlen
# --------------------------------------------------------------------------

def _cu(lens):
    return torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32)


def test_pack_v_fp8_varlen_is_per_sequence_pack():
    from flash3.fp8 import pack_v_fp8, pack_v_fp8_varlen, varlen_vt_offset
    lens = [17, 0, 3, 130, 16, 1]
    cu = _cu(lens)
    total = int(cu[-1]) + 5  # tokens past cu_seqlens_k[-1] are not packed
    v8 = _e4m3((total, 3, 32), 11)
    vt = pack_v_fp8_varlen(v8, cu)
    assert vt.dtype == FP8_DTYPE and vt.shape == (3, 32, varlen_vt_offset(total, len(lens)))
    owned = torch.zeros(vt.shape[-1], dtype=torch.bool)
    for i, n in enumerate(lens):
        start, width = varlen_vt_offset(int(cu[i]), i), -(-n // 16) * 16
        want = pack_v_fp8(v8[None, cu[i]:cu[i + 1]])[0]
        assert torch.equal(vt[:, :, start:start + width].view(torch.uint8), want.view(torch.uint8))
        owned[start:start + width] = True
    assert not vt.view(torch.uint8)[:, :, ~owned].any(), "columns between sequences must be zero"
    assert pack_v_fp8_varlen(v8[:0], torch.zeros(1, dtype=torch.int32)).shape == (3, 32, 0)


@pytest.mark.parametrize("causal,window,softcap", [(False, (-1, -1), 0.0), (True, (-1, -1), 0.0),
                                                   (False, (20, 5), 10.0)])
def test_attention_varlen_fp8_is_per_sequence_attention(causal, window, softcap):
    """attention_varlen on e4m3 inputs computes, per sequence, exactly what attention computes on
    that sequence alone, with the descales of its row (blocks counted from its first row)."""
    import flash3
    lens_q, lens_k = [5, 0, 70, 33, 1], [17, 3, 130, 1, 0]
    b, h, hk, d = len(lens_q), 4, 2, 64
    cq, ck = _cu(lens_q), _cu(lens_k)
    q8, k8, v8 = _e4m3((int(cq[-1]), h, d), 1), _e4m3((int(ck[-1]), hk, d), 2), _e4m3((int(ck[-1]), hk, 32), 3)
    mq, mk = max(lens_q), max(lens_k)
    qd = torch.rand(b, h, -(-mq // 64), generator=_gen(4)) + 0.5
    kd, vd = (torch.rand(b, hk, -(-mk // 128), generator=_gen(s)) + 0.5 for s in (5, 6))
    vcd = torch.rand(b, hk, 32, generator=_gen(7)) + 0.5
    args = dict(causal=causal, window_size=window, softcap=softcap, fp8_block_size=(64, 128), return_lse=True)
    out, lse = flash3.attention_varlen(q8, k8, v8, cq, ck, mq, mk, q_descale=qd, k_descale=kd, v_descale=vd,
                                       v_channel_descale=vcd, **args)
    assert out.dtype == torch.bfloat16 and out.shape == (int(cq[-1]), h, 32) and lse.shape == (h, int(cq[-1]))
    for i in range(b):
        if lens_q[i] == 0:
            continue
        nq, nk = -(-lens_q[i] // 64), -(-lens_k[i] // 128)
        o, l_ = flash3.attention(q8[None, cq[i]:cq[i + 1]], k8[None, ck[i]:ck[i + 1]], v8[None, ck[i]:ck[i + 1]],
                                 q_descale=qd[i:i + 1, :, :nq], k_descale=kd[i:i + 1, :, :nk],
                                 v_descale=vd[i:i + 1, :, :nk], v_channel_descale=vcd[i:i + 1], **args)
        assert torch.equal(out[cq[i]:cq[i + 1]], o[0]) and torch.equal(lse[:, cq[i]:cq[i + 1]], l_[0]), i
    # per-(batch, kv head) descales (FA3's form) are accepted too
    flash3.attention_varlen(q8, k8, v8, cq, ck, mq, mk, q_descale=qd[:, ::2, 0], k_descale=kd[..., 0],
                            v_descale=vd[..., 0])


def test_attention_varlen_fp8_bad_descales():
    import flash3
    cq = ck = _cu([10, 20])
    q8, k8, v8 = _e4m3((30, 2, 64), 1), _e4m3((30, 2, 64), 2), _e4m3((30, 2, 64), 3)
    f = torch.ones
    with pytest.raises(ValueError, match="k_descale must have shape"):
        flash3.attention_varlen(q8, k8, v8, cq, ck, 20, 20, q_descale=f(2, 2), k_descale=f(2, 2, 2),
                                v_descale=f(2, 2))
    with pytest.raises(ValueError, match="q_descale must have shape"):
        flash3.attention_varlen(q8, k8, v8, cq, ck, 20, 20, q_descale=f(3, 2), k_descale=f(2, 2),
                                v_descale=f(2, 2))
    with pytest.raises(ValueError, match="only used with float8"):
        flash3.attention_varlen(q8.float(), k8.float(), v8.float(), cq, ck, 20, 20, q_descale=f(2, 2))


@pytest.mark.parametrize("block,hadamard,smooth", [(64, True, False), (128, False, True), (None, True, True)])
def test_quantize_fp8_varlen_is_per_sequence_quantize(block, hadamard, smooth):
    from flash3.fp8 import quantize_fp8_varlen
    lens = [5, 0, 70, 129, 1]
    cu = _cu(lens)
    x = _randn((int(cu[-1]) + 3, 4, 64), 9) + 2.0  # 3 rows past the last sequence
    res = quantize_fp8_varlen(x, cu, max(lens), block_size=block, hadamard=hadamard, smooth=smooth)
    x8, xd = res[0], res[1]
    nb = 1 if block is None else -(-max(lens) // block)
    assert x8.shape == x.shape and x8.dtype == FP8_DTYPE
    assert xd.shape == ((len(lens), 4) if block is None else (len(lens), 4, nb))
    assert not x8[int(cu[-1]):].float().any()
    for i in range(len(lens)):
        if lens[i] == 0:
            continue
        want = quantize_fp8(x[None, cu[i]:cu[i + 1]], block_size=block, hadamard=hadamard, smooth=smooth)
        got8 = x8[cu[i]:cu[i + 1]]
        if smooth:  # the mean is summed in another order: e4m3 values may differ by a rounding step
            torch.testing.assert_close(res[2][i], want[2][0], rtol=1e-5, atol=1e-5)
            assert (got8.float() - want[0][0].float()).abs().max() <= 2 ** -3 * want[0][0].float().abs().max()
        else:
            assert torch.equal(got8.view(torch.uint8), want[0][0].view(torch.uint8)), i
        wd = want[1][0]
        torch.testing.assert_close(xd[i] if block is None else xd[i, :, :wd.shape[-1]], wd, rtol=1e-6, atol=0)


@pytest.mark.parametrize("causal", [False, True])
def test_attention_fp8_varlen_matches_per_sequence_attention_fp8(causal):
    from flash3.fp8 import attention_fp8_varlen
    lens_q, lens_k = [5, 0, 70, 33, 200], [17, 3, 130, 1, 200]
    cq, ck = _cu(lens_q), _cu(lens_k)
    q = (_randn((int(cq[-1]), 4, 64), 1) + 1).bfloat16()
    k = (_randn((int(ck[-1]), 2, 64), 2, 2.0) + 3).bfloat16()  # a shared key mean: smoothing matters
    v = (_randn((int(ck[-1]), 2, 64), 3) + 0.5).bfloat16()
    out, lse = attention_fp8_varlen(q, k, v, cq, ck, max(lens_q), max(lens_k), causal=causal, return_lse=True)
    assert out.dtype == torch.bfloat16 and out.shape == q.shape and lse.shape == (4, q.shape[0])
    for i in range(len(lens_q)):
        if lens_q[i] == 0:
            continue
        o, l_ = attention_fp8(q[None, cq[i]:cq[i + 1]], k[None, ck[i]:ck[i + 1]], v[None, ck[i]:ck[i + 1]],
                              causal=causal, return_lse=True)
        # the same function; only the K-smoothing mean's summation order differs
        torch.testing.assert_close(out[cq[i]:cq[i + 1]].float(), o[0].float(), rtol=0, atol=2 ** -6)
        got, want = lse[:, cq[i]:cq[i + 1]], l_[0]
        assert torch.equal(torch.isinf(got), torch.isinf(want))
        fin = torch.isfinite(want)
        torch.testing.assert_close(got[fin], want[fin], rtol=0, atol=1e-4)


def test_varlen_packing_stays_in_range_for_bad_offsets():
    """With validation off nothing checks cu_seqlens: unsorted, negative or too large offsets give
    wrong values but every index the device ops form stays in range (no device-side assert)."""
    from flash3.fp8 import pack_v_fp8_varlen, quantize_fp8_varlen
    x = _randn((50, 2, 64), 1)
    for cu in ([5, 20, 50], [0, 30, 10], [40, 10, 60], [0, 0, 0], [-7, 3, 99]):
        c = torch.tensor(cu, dtype=torch.int32)
        x8, xd, _ = quantize_fp8_varlen(x, c, 30, block_size=16, smooth=True)
        assert x8.shape == x.shape and xd.shape == (2, 2, 2)
        assert pack_v_fp8_varlen(x8, c).shape[-1] % 16 == 0


def test_descale_division_is_correctly_rounded():
    """descale = amax / 448 correctly rounded (as the kernels divide), on every device: a
    Python-scalar divisor on CUDA multiplies by the reciprocal instead (one ulp off, seen on an
    H200). fp32 quotients through fp64 are correctly rounded (53 >= 2 * 24 + 2)."""
    from flash3 import fp8_quant
    amax = torch.rand(4096, generator=torch.Generator().manual_seed(3)) * 1e3
    want = (amax.double() / 448.0).float()
    assert torch.equal(fp8_quant._amax_over_fp8_max(amax), want)
    recip = amax * (1.0 / 448.0)  # what the scalar-divisor CUDA path computes
    assert not torch.equal(recip, want)  # so this test would notice a regression to it


# --------------------------------------------------------------------------
# FA3's seqused_q / seqused_k and attention_chunk with e4m3 inputs
# --------------------------------------------------------------------------

def test_pack_v_fp8_varlen_zeroes_columns_past_seqused_k():
    """With seqused_k each sequence is packed as its used tokens alone: the rest of its columns are
    zero (the kernel's last used tile reads them times P = 0; a cache's unused rows may be NaN)."""
    from flash3.fp8 import pack_v_fp8_varlen
    lens, used = [17, 0, 3, 130, 16], [5, 0, 9, 128, -2]  # 9 > 3 and -2 are clamped
    cu = _cu(lens)
    v8 = _e4m3((int(cu[-1]), 3, 32), 12)
    v8[::7] = float("nan")  # e4m3's NaN, in the used rows too: where they go must be the same
    want_v = v8.clone()
    for i, (n, u) in enumerate(zip(lens, used)):  # the unused rows zeroed: the same packing
        want_v[int(cu[i]) + min(max(u, 0), n):int(cu[i + 1])] = 0
    got = pack_v_fp8_varlen(v8, cu, torch.tensor(used, dtype=torch.int32))
    want = pack_v_fp8_varlen(want_v, cu)
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


@pytest.mark.parametrize("causal,window,chunk", [(False, (-1, -1), 0), (True, (-1, -1), 0),
                                                 (True, (-1, -1), 48), (False, (20, 5), 32)])
def test_attention_varlen_fp8_seqused_is_attention_on_used_rows(causal, window, chunk):
    """seqused_q/seqused_k with e4m3 inputs: per sequence exactly flash3.attention on its used
    rows (descale blocks still counted from its first row); rows past seqused_q get out 0, lse -inf;
    the unused keys are never read, so NaN there changes nothing."""
    import flash3
    lens_q, lens_k = [5, 0, 70, 33, 9], [17, 3, 130, 40, 0]
    used_q, used_k = [3, 0, 80, 0, 4], [17, 2, 65, 11, 5]  # 80 and 5 clamp to the lengths
    b, h, hk, d = len(lens_q), 4, 2, 64
    cq, ck = _cu(lens_q), _cu(lens_k)
    q8, k8, v8 = _e4m3((int(cq[-1]), h, d), 1), _e4m3((int(ck[-1]), hk, d), 2), _e4m3((int(ck[-1]), hk, 32), 3)
    for i in range(b):  # NaN in every unused key and value
        k8[int(ck[i]) + min(used_k[i], lens_k[i]):int(ck[i + 1])] = float("nan")
        v8[int(ck[i]) + min(used_k[i], lens_k[i]):int(ck[i + 1])] = float("nan")
    mq, mk = max(lens_q), max(lens_k)
    qd = torch.rand(b, h, -(-mq // 64), generator=_gen(4)) + 0.5
    kd, vd = (torch.rand(b, hk, -(-mk // 128), generator=_gen(s)) + 0.5 for s in (5, 6))
    args = dict(causal=causal, window_size=window, attention_chunk=chunk, fp8_block_size=(64, 128),
                return_lse=True)
    i32 = lambda x: torch.tensor(x, dtype=torch.int32)  # noqa: E731
    out, lse = flash3.attention_varlen(q8, k8, v8, cq, ck, mq, mk, q_descale=qd, k_descale=kd,
                                       v_descale=vd, seqused_q=i32(used_q), seqused_k=i32(used_k), **args)
    assert out.dtype == torch.bfloat16 and out.shape == (int(cq[-1]), h, 32)
    for i in range(b):
        uq, uk = min(used_q[i], lens_q[i]), min(used_k[i], lens_k[i])
        rows = slice(int(cq[i]), int(cq[i]) + uq)
        rest = slice(int(cq[i]) + uq, int(cq[i + 1]))
        assert not out[rest].any() and bool((lse[:, rest] == -math.inf).all()), i
        if uq == 0:
            continue
        nq, nk = -(-uq // 64), -(-uk // 128)
        keys = slice(int(ck[i]), int(ck[i]) + uk)
        o, l_ = flash3.attention(q8[None, rows], k8[None, keys], v8[None, keys],
                                 q_descale=qd[i:i + 1, :, :nq], k_descale=kd[i:i + 1, :, :nk],
                                 v_descale=vd[i:i + 1, :, :nk], **args)
        assert torch.equal(out[rows], o[0]) and torch.equal(lse[:, rows], l_[0]), i


@pytest.mark.usefixtures("exact_mma")
@pytest.mark.parametrize("s_q,s_k,causal,window,chunk", [(203, 203, True, (-1, -1), 64),
                                                          (113, 256, False, (-1, -1), 50),
                                                          (96, 200, False, (30, 10), 37)])
def test_attention_chunk_fp8_matches_fp64_on_dequantized_inputs(s_q, s_k, causal, window, chunk):
    """attention_chunk in the FP8 emulation: given its quantized inputs only P is rounded, against
    fp64 with the same chunked mask (flash3/masking.py)."""
    b, h, hk, d = 2, 4, 2, 64
    q, k, v = _randn((b, s_q, h, d), 31), _randn((b, s_k, hk, d), 32), _randn((b, s_k, hk, d), 33, 2.0)
    q8, qd = quantize_fp8(q, block_size=64)
    k8, kd = quantize_fp8(k, block_size=64)
    v8, vd = quantize_fp8(v, block_size=64)
    qq, kk, vv = (dequantize_fp8(x8, xd, block_size=64) for x8, xd in ((q8, qd), (k8, kd), (v8, vd)))
    out, lse = fp8_attention_reference(q8, k8, v8, qd, kd, vd, causal=causal, window_left=window[0],
                                       window_right=window[1], block_size=(64, 64), attention_chunk=chunk)
    ref, ref_lse, bound = _p_rounding_bound(qq, kk, vv, s_k, causal=causal, window_size=window,
                                            attention_chunk=chunk)
    assert torch.all((out.double() - ref).abs() <= bound)
    fin = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), fin)
    assert (lse.double()[fin] - ref_lse[fin]).abs().max().item() < 1e-4
    # the chunk matters here: without it the result differs
    plain, _ = fp8_attention_reference(q8, k8, v8, qd, kd, vd, causal=causal, window_left=window[0],
                                       window_right=window[1], block_size=(64, 64))
    assert not torch.equal(plain, out)


def test_tile_skipping_with_chunk_matches_masking_spec():
    """The tile classifier with a chunk against each pair's visibility by the formula: row i at
    diagonal p = i + s_k - s_q sees key j iff the window holds and p - p % c <= j < p - p % c + c."""
    import flash3.fp8 as F

    def sees(i, j, s_q, s_k, left, right, chunk):
        p = i + s_k - s_q
        start = p - p % chunk  # Python's floored %, as FA3's spec
        return ((left < 0 or j >= p - left) and (right < 0 or j <= p + right)
                and start <= j < start + chunk)

    for s_q, s_k, left, right, chunk in itertools.product([1, 9], [4, 9], [-1, 2], [-1, 0], [1, 3, 4]):
        for r0, r1, c0, c1 in [(0, s_q, 0, s_k), (1, 3, 0, 2), (2, 7, 1, 5), (0, 2, 6, 9)]:
            r1, c1 = min(r1, s_q), min(c1, s_k)
            if r1 <= r0 or c1 <= c0:
                continue
            vis = [sees(i, j, s_q, s_k, left, right, chunk) for i in range(r0, r1) for j in range(c0, c1)]
            state = F._tile_state(r0, r1, c0, c1, s_q, s_k, left, right, chunk)
            assert (state == "skip") == (not any(vis))
            assert (state == "full") == all(vis)
    # by hand: s_q = s_k = 9, causal, chunk 4: rows 4..7 see keys 4..row; keys 0..3 of them: skip
    assert F._tile_state(4, 8, 0, 4, 9, 9, -1, 0, 4) == "skip"
    assert F._tile_state(4, 8, 4, 8, 9, 9, -1, 0, 4) == "partial"
    assert F._tile_state(7, 8, 4, 8, 9, 9, -1, 0, 4) == "full"


def test_emulation_walks_the_kernel_key_tiles_by_default():
    """fp8_attention_reference's default key tile is the kernel's: 32 keys at d 256 with a chunk (the
    chunk tile), 64 without; the larger head dim's at d != d_v (d 64, d_v 128 runs the d 128
    kernel's 128 keys; d 128, d_v 256 the d 256 kernel's 64). The tile changes the result (P's e4m3 rounding follows the running max per
    tile), so each default equals its explicit tile_n and differs from the other tile."""
    def run(d, dv, **kw):
        q8, k8, v8 = _e4m3((1, 70, 2, d), 41), _e4m3((1, 300, 2, d), 42, 3.0), _e4m3((1, 300, 2, dv), 43)
        return fp8_attention_reference(q8, k8, v8, causal=True, block_size=(64, 128), **kw)[0]
    chunked = run(256, 256, attention_chunk=100)
    assert torch.equal(chunked, run(256, 256, attention_chunk=100, tile_n=32))
    assert not torch.equal(chunked, run(256, 256, attention_chunk=100, tile_n=64))
    plain = run(256, 256)
    assert torch.equal(plain, run(256, 256, tile_n=64)) and not torch.equal(plain, run(256, 256, tile_n=32))
    mixed = run(64, 128)
    assert torch.equal(mixed, run(64, 128, tile_n=128)) and not torch.equal(mixed, run(64, 128, tile_n=64))
    mixed = run(128, 256)
    assert torch.equal(mixed, run(128, 256, tile_n=64)) and not torch.equal(mixed, run(128, 256, tile_n=128))


def test_fp8_mma_into_an_accumulator_hand_values():
    """fp8_mma(a, b, c): c is the WGMMA's accumulator, aligned and truncated with each chunk's
    products (worked by hand): against c = 1024 (leading bit 2^10, unit 2^-3), 32 products of 2^-4
    are 0 each; 32 products of 2^-2 are 2 units each (+8); c = 1 keeps 2^-4 products (unit 2^-13)."""
    ones = torch.ones(1, 32)
    col = lambda x: torch.full((32, 1), x)  # noqa: E731
    c = torch.tensor([[1024.0]])
    assert fp8_mma(ones, col(2.0 ** -4), c).item() == 1024.0  # exact fp32: 1026
    assert fp8_mma(ones, col(2.0 ** -2), c).item() == 1032.0
    assert fp8_mma(ones, col(2.0 ** -4), torch.tensor([[1.0]])).item() == 3.0
    assert fp8_mma(ones, col(-(2.0 ** -4)), c).item() == 1024.0  # toward zero, not 1023.875
    # None: from zero, the same as no accumulator; c broadcasts over the batch
    a, b = torch.ones(3, 2, 64), torch.full((64, 5), 0.5)
    assert torch.equal(fp8_mma(a, b, torch.zeros(2, 5)), fp8_mma(a, b))
    assert fp8_mma(a[:, :, :0], b[:0], torch.full((2, 5), 7.0)).eq(7.0).all()


def _fast_inputs(s_q=200, s_k=700, h=4, hk=2, d=64, seed=3):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, s, n, d, generator=g) for s, n in ((s_q, h), (s_k, hk), (s_k, hk)))
    q8, qd = quantize_fp8(q, block_size=64)
    k8, kd = quantize_fp8(k, block_size=128)
    v8, vd = quantize_fp8(v, block_size=None)
    return q8, k8, v8, qd, kd, vd * (torch.rand(vd.shape, generator=g) + 0.5)


def test_fp8_mma_keeps_an_accumulator_below_fp32s_unit_grid():
    """An accumulator rescaled toward 0 (fast_accum after a large max jump) meets products of 0:
    the unit 2^(e - 13) would fall below the smallest subnormal 2^-149, on whose grid the
    accumulator already lies, so it passes unchanged (the simulator's double arithmetic), not NaN."""
    c = torch.tensor([[2.0 ** -140, -3 * 2.0 ** -149, 0.0, 2.0 ** -126]])
    a, b = torch.zeros(1, 32), torch.ones(32, 4)
    assert torch.equal(fp8_mma(a, b, c), c)
    # one product of 1 beside them: unit 2^-13, every tiny accumulator truncates to 0
    a[0, 0] = 1.0
    assert fp8_mma(a, b, c).tolist() == [[1.0, 1.0, 1.0, 1.0]]


@pytest.mark.parametrize("causal", [False, True])
def test_fast_accum_is_the_same_algorithm_with_exact_adds(monkeypatch, causal):
    """With exact fp32 tensor-core adds (FP8_MMA_KEPT_BITS None), fast accumulation differs from the
    two-level one only by fp32 rounding: the same tiles, maxes, P and v descale."""
    q8, k8, v8, qd, kd, vd = _fast_inputs()
    monkeypatch.setattr(fp8_reference, "FP8_MMA_KEPT_BITS", None)
    kw = dict(causal=causal, block_size=(64, 128), tile_n=128)
    two, lse2 = fp8_attention_reference(q8, k8, v8, qd, kd, vd, **kw)
    fast, lse_f = fp8_attention_reference(q8, k8, v8, qd, kd, vd, fast_accum=True, **kw)
    assert torch.equal(lse2, lse_f)
    assert (fast - two).abs().max().item() < 1e-5


def test_fast_accum_truncates_against_a_large_o():
    """The emulation's fast path adds P@V into O through the truncating accumulator: one row whose
    first (rightmost, visited first) keys carry a large v and later ones small values loses them."""
    d = 64
    q8 = torch.zeros(1, 1, 1, d).to(FP8_DTYPE)  # all scores 0: P = 256 for every key
    k8 = torch.zeros(1, 256, 1, d).to(FP8_DTYPE)
    v = torch.full((1, 256, 1, d), 2.0 ** -9)
    v[:, 128:] = 1.0  # the last key tile (visited first): O = 128 * 256 = 2^15 after it
    v8 = v.to(FP8_DTYPE)
    two, _ = fp8_attention_reference(q8, k8, v8, block_size=(64, 128))
    fast, _ = fp8_attention_reference(q8, k8, v8, block_size=(64, 128), fast_accum=True)
    # two-level: (2^15 + 128 * 256 * 2^-9) / (256 * 256) = 0.5 + 2^-10; fast: the small tile's
    # products (256 * 2^-9 = 2^-1 each) fall below O's unit 2^(15-13) = 4 and truncate to 0
    assert two[0, 0, 0, 0].item() == 0.5 + 2.0 ** -10
    assert fast[0, 0, 0, 0].item() == 0.5


def test_fast_accum_arguments():
    q8, k8, v8, qd, kd, vd = _fast_inputs()
    kw = dict(q_descale=qd, k_descale=kd, fp8_block_size=(64, 128))
    out = flash3.attention(q8, k8, v8, v_descale=vd, fp8_fast_accum=True, **kw)
    ref, _ = fp8_attention_reference(q8, k8, v8, qd, kd, vd, block_size=(64, 128), fast_accum=True)
    assert torch.equal(out, ref.to(torch.bfloat16))
    vd_block = vd[:, :, None].expand(2, 2, 6).contiguous()
    with pytest.raises(ValueError, match="v_descale must be one per"):
        flash3.attention(q8, k8, v8, v_descale=vd_block, fp8_fast_accum=True, **kw)
    with pytest.raises(ValueError, match="attention_chunk"):
        flash3.attention(q8, k8, v8, v_descale=vd, fp8_fast_accum=True, attention_chunk=64, **kw)
    with pytest.raises(TypeError, match="fp8_fast_accum"):
        flash3.attention(q8, k8, v8, v_descale=vd, fp8_fast_accum=1, **kw)
    x = torch.randn(1, 8, 2, 64)
    with pytest.raises(ValueError, match="fp8_fast_accum"):
        flash3.attention(x, x, x, fp8_fast_accum=True)
    with pytest.raises(ValueError, match="v_descale must be one per"):
        fp8_attention_reference(q8, k8, v8, qd, kd, vd_block, block_size=(64, 128), fast_accum=True)


@pytest.mark.parametrize("window", [(10, 30), (20, 100), (50, -1)])
def test_fast_accum_visits_the_kernels_query_tiles(window):
    """With fast accumulation a key tile none of a row's keys sees still passes O through the
    truncating accumulator, so the emulation visits the tiles of the kernel's 128-row query tile
    whatever the q descale block: per-head q descales give the same bits with blocks of 64 and 128
    rows (they did not when 64-row slabs skipped tiles their 128-row tile visits)."""
    q8, k8, v8, _, kd, vd = _fast_inputs(s_q=300, s_k=300)
    qd = torch.rand(2, 4) + 0.5  # per head; raw e4m3 scores of ~100: rescales by ~2^-140 too
    kw = dict(window_left=window[0], window_right=window[1], fast_accum=True)
    a, lse_a = fp8_attention_reference(q8, k8, v8, qd, kd, vd, block_size=(64, 128), **kw)
    b, lse_b = fp8_attention_reference(q8, k8, v8, qd, kd, vd, block_size=(128, 128), **kw)
    assert torch.equal(a, b) and torch.equal(lse_a, lse_b)


def test_fast_accum_varlen_is_per_sequence_attention():
    """attention_varlen(..., fp8_fast_accum=True) gives each sequence what attention gives it alone."""
    g = torch.Generator().manual_seed(5)
    lens = [(130, 200), (0, 40), (77, 0), (64, 300)]
    qs, ks, vs = ([torch.randn(n, h, 64, generator=g).to(FP8_DTYPE) for n, h in zip(ls, hs)]
                  for ls, hs in (([a for a, _ in lens], [4] * 4), ([b for _, b in lens], [2] * 4),
                                 ([b for _, b in lens], [2] * 4)))
    qd, kd, vd = torch.rand(4, 4) + 0.5, torch.rand(4, 2) + 0.5, torch.rand(4, 2) + 0.5
    cq = torch.tensor([0] + list(itertools.accumulate(a for a, _ in lens)), dtype=torch.int32)
    ck = torch.tensor([0] + list(itertools.accumulate(b for _, b in lens)), dtype=torch.int32)
    kw = dict(causal=True, fp8_fast_accum=True, return_lse=True)
    out, lse = flash3.attention_varlen(torch.cat(qs), torch.cat(ks), torch.cat(vs), cq, ck, 130, 300,
                                       q_descale=qd, k_descale=kd, v_descale=vd, **kw)
    for i, (lq, lk) in enumerate(lens):
        if lq == 0:
            continue
        o, l_ = flash3.attention(qs[i][None], ks[i][None], vs[i][None], q_descale=qd[i:i + 1],
                                 k_descale=kd[i:i + 1], v_descale=vd[i:i + 1], **kw)
        assert torch.equal(out[cq[i]:cq[i + 1]], o[0]) and torch.equal(lse[:, cq[i]:cq[i + 1]], l_[0]), i
    with pytest.raises(ValueError, match="v_descale must be one per"):
        flash3.attention_varlen(torch.cat(qs), torch.cat(ks), torch.cat(vs), cq, ck, 130, 300, q_descale=qd,
                                k_descale=kd, v_descale=vd[:, :, None].expand(4, 2, 3), fp8_fast_accum=True)
