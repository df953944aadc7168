"""Tests for flash3.fp8: the CPU specification of the FP8 (e4m3) forward path.

Error bounds are derived from e4m3's precision: 3 mantissa bits give a
round-to-nearest relative error <= 2^-4 for normal values (|y| >= 2^-6) and an
absolute error <= 2^-10 in the subnormal range.
"""

import math

import pytest
import torch

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

HALF_ULP = 2.0 ** -4      # relative rounding error of a normal e4m3 value
SUB_ABS = 2.0 ** -10      # absolute rounding error in e4m3's subnormal range


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
    S = torch.einsum("bihd,bjhd->bhij", q.float(), k.float()) * (0.3 * 0.2 * scale)
    m = S.amax(-1, keepdim=True)
    log2e = 1 / math.log(2)
    P = torch.exp2((S - m) * log2e + 8)
    l = P.sum(-1)
    P8 = P.to(FP8_DTYPE).float()
    O = torch.einsum("bhij,bjhd->bihd", P8, v.float()) * 1.7 / l.permute(0, 2, 1)[..., None]
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
