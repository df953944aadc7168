"""Rotary embedding of q and the new k in attention_with_kvcache (flash3/rotary.py)."""

import math

import pytest
import torch

import flash3
from flash3 import reference, rotary
from helpers import attention_ref64


@pytest.fixture(autouse=True)
def small_tiles(monkeypatch):
    monkeypatch.setattr(reference, "BLOCK_M", 16)
    monkeypatch.setattr(reference, "BLOCK_N", 32)


def tables(seqlen_ro, rotary_dim, base=10000.0, dtype=torch.float32):
    inv = 1.0 / base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    ang = torch.arange(seqlen_ro, dtype=torch.float64)[:, None] * inv[None, :]
    return ang.cos().to(dtype), ang.sin().to(dtype)


def rotate_loop(x, cos, sin, positions, interleaved):
    """Straightforward per-element loops, fp64."""
    b, s, h, d = x.shape
    half = cos.shape[1]
    out = x.double().clone()
    for i in range(b):
        for t in range(s):
            p = int(positions[i][t])
            for j in range(h):
                for c in range(half):
                    a, bb = (2 * c, 2 * c + 1) if interleaved else (c, c + half)
                    x0, x1 = float(x[i, t, j, a]), float(x[i, t, j, bb])
                    co, si = float(cos[p, c]), float(sin[p, c])
                    out[i, t, j, a] = x0 * co - x1 * si
                    out[i, t, j, bb] = x0 * si + x1 * co
    return out


def rotate_complex(x, cos, sin, positions, interleaved):
    """The same rotation as multiplication by e^{i theta} of complex channel pairs."""
    half = cos.shape[1]
    xd = x.double()
    rd = xd[..., :2 * half]
    if interleaved:
        pairs = rd.reshape(*rd.shape[:-1], half, 2)
    else:
        pairs = torch.stack((rd[..., :half], rd[..., half:]), dim=-1)
    z = torch.view_as_complex(pairs.contiguous())
    theta = torch.atan2(sin.double(), cos.double())[positions.long()]  # (b, s, half)
    radius = torch.sqrt(cos.double() ** 2 + sin.double() ** 2)[positions.long()]
    z = z * torch.polar(radius, theta)[:, :, None, :]
    r = torch.view_as_real(z)
    rot = r.flatten(-2) if interleaved else torch.cat((r[..., 0], r[..., 1]), dim=-1)
    return torch.cat((rot, xd[..., 2 * half:]), dim=-1)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rotary_dim,d", [(8, 8), (4, 16), (16, 24)])
def test_apply_rotary_matches_loop_and_complex(interleaved, rotary_dim, d):
    gen = torch.Generator().manual_seed(rotary_dim * 100 + d)
    b, s, h = 2, 3, 2
    x = torch.randn(b, s, h, d, generator=gen)
    cos, sin = tables(20, rotary_dim)
    pos = torch.randint(0, 20, (b, s), generator=gen)
    got = rotary.apply_rotary(x, cos, sin, pos, interleaved)
    assert got.dtype == x.dtype and got.shape == x.shape
    loop = rotate_loop(x, cos, sin, pos, interleaved)
    cplx = rotate_complex(x, cos, sin, pos, interleaved)
    torch.testing.assert_close(got.double(), loop, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(cplx, loop, rtol=1e-9, atol=1e-9)
    assert torch.equal(got[..., rotary_dim:], x[..., rotary_dim:])  # pass-through channels
    # A rotation keeps the norm of every pair.
    torch.testing.assert_close(got.norm(dim=-1), x.norm(dim=-1), rtol=1e-5, atol=1e-5)


def test_apply_rotary_bf16_rounds_once():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, 4, 2, 16, generator=gen).to(torch.bfloat16)
    cos, sin = tables(8, 16)
    pos = torch.arange(4)[None]
    got = rotary.apply_rotary(x, cos, sin, pos, False)
    want = rotate_loop(x, cos, sin, pos, False).to(torch.bfloat16)
    assert got.dtype == torch.bfloat16
    assert (got.float() - want.float()).abs().max() <= 2 ** -7 * want.float().abs().max()


def test_positions_rule():
    cs = torch.tensor([3, 0, 7], dtype=torch.int32)
    assert rotary.kvcache_positions(cs, 2, True).tolist() == [[3, 4], [0, 1], [7, 8]]
    assert rotary.kvcache_positions(cs, 2, False).tolist() == [[3, 3], [0, 0], [7, 7]]


CASES = [  # b, s_q, s_new, cap, h, h_k, d, rotary_dim, kwargs
    (3, 1, 1, 24, 4, 2, 16, 16, dict()),
    (2, 3, 3, 30, 2, 1, 16, 8, dict(causal=True)),
    (2, 4, 2, 30, 2, 2, 16, 16, dict()),  # not causal: all q tokens at cache_seqlens
    (2, 3, 3, 30, 2, 2, 8, 4, dict(window_size=(4, 1))),  # local: q per token
]


@pytest.mark.parametrize("paged", [False, True], ids=["contig", "paged"])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_kvcache_rotary_against_manual(case, interleaved, paged):
    b, s_q, s_new, cap, h, h_k, d, rd, kw = CASES[case]
    gen = torch.Generator().manual_seed(case)
    q = torch.randn(b, s_q, h, d, generator=gen)
    k = torch.randn(b, s_new, h_k, d, generator=gen)
    v = torch.randn(b, s_new, h_k, d, generator=gen)
    k_cache = torch.randn(b, cap, h_k, d, generator=gen)
    v_cache = torch.randn(b, cap, h_k, d, generator=gen)
    seqlens = torch.randint(0, cap - s_new + 1, (b,), generator=gen, dtype=torch.int32)
    cos, sin = tables(cap, rd)
    local = kw.get("causal", False) or kw.get("window_size", (-1, -1)) != (-1, -1)

    # Expected: rotate by loops with flash-attn's position rule, then plain attention (fp64).
    k_pos = seqlens.long()[:, None] + torch.arange(s_new)[None]
    q_pos = (seqlens.long()[:, None] + torch.arange(s_q)[None]) if local else \
        seqlens.long()[:, None].expand(b, s_q)
    q_rot = rotate_loop(q, cos, sin, q_pos, interleaved)
    k_rot = rotate_loop(k, cos, sin, k_pos, interleaved)
    want_out = []
    for i in range(b):
        n = int(seqlens[i])
        ki = torch.cat([k_cache[i:i + 1, :n].double(), k_rot[i:i + 1]], 1)
        vi = torch.cat([v_cache[i:i + 1, :n].double(), v[i:i + 1].double()], 1)
        want_out.append(attention_ref64(q_rot[i:i + 1], ki, vi, **kw)[0])
    want_out = torch.cat(want_out)

    if paged:
        page_size = 4
        per_row = -(-cap // page_size)
        table = torch.randperm(b * per_row, generator=gen).view(b, per_row).to(torch.int32)
        kp = torch.zeros(b * per_row, page_size, h_k, d)
        vp = torch.zeros(b * per_row, page_size, h_k, d)
        for i in range(b):
            for j in range(per_row):
                sl = slice(j * page_size, min((j + 1) * page_size, cap))
                kp[table[i, j], : sl.stop - sl.start] = k_cache[i, sl]
                vp[table[i, j], : sl.stop - sl.start] = v_cache[i, sl]
        out = flash3.attention_with_kvcache(q, kp, vp, k, v, cache_seqlens=seqlens,
                                            page_table=table, rotary_cos=cos, rotary_sin=sin,
                                            rotary_interleaved=interleaved, **kw)
        for i in range(b):
            n = int(seqlens[i])
            rows = kp[table[i].long()].flatten(0, 1)
            torch.testing.assert_close(rows[n:n + s_new].double(), k_rot[i], rtol=1e-6, atol=1e-6)
    else:
        out = flash3.attention_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=seqlens,
                                            rotary_cos=cos, rotary_sin=sin,
                                            rotary_interleaved=interleaved, **kw)
        for i in range(b):  # the *rotated* k is what lands in the cache; v is not rotated
            n = int(seqlens[i])
            torch.testing.assert_close(k_cache[i, n:n + s_new].double(), k_rot[i],
                                       rtol=1e-6, atol=1e-6)
            assert torch.equal(v_cache[i, n:n + s_new], v[i])
    torch.testing.assert_close(out.double(), want_out, rtol=1e-5, atol=1e-5)


def test_caller_tensors_not_modified():
    q, k, v = torch.randn(1, 2, 2, 8), torch.randn(1, 2, 2, 8), torch.randn(1, 2, 2, 8)
    q0, k0 = q.clone(), k.clone()
    cos, sin = tables(16, 8)
    flash3.attention_with_kvcache(q, torch.zeros(1, 16, 2, 8), torch.zeros(1, 16, 2, 8), k, v,
                                  cache_seqlens=3, rotary_cos=cos, rotary_sin=sin, causal=True)
    assert torch.equal(q, q0) and torch.equal(k, k0)


def test_rotary_errors():
    q, k, v = torch.randn(1, 1, 2, 8), torch.randn(1, 1, 2, 8), torch.randn(1, 1, 2, 8)
    kc, vc = torch.zeros(1, 16, 2, 8), torch.zeros(1, 16, 2, 8)
    cos, sin = tables(16, 8)
    call = lambda **kw: flash3.attention_with_kvcache(q, kc, vc, **{"k": k, "v": v, **kw},
                                                      cache_seqlens=3)
    with pytest.raises(ValueError, match="rotary_cos and rotary_sin"):
        call(rotary_cos=cos)
    with pytest.raises(ValueError, match="new keys"):
        flash3.attention_with_kvcache(q, kc, vc, cache_seqlens=3, rotary_cos=cos, rotary_sin=sin)
    with pytest.raises(ValueError, match="rotary_dim"):
        c2, s2 = tables(16, 10)
        call(rotary_cos=c2, rotary_sin=s2)
    with pytest.raises(ValueError, match="rotary_sin shape"):
        call(rotary_cos=cos, rotary_sin=sin[:, :2])
    with pytest.raises(ValueError, match="rotary_cos must be 2-D"):
        call(rotary_cos=cos[None], rotary_sin=sin[None])
    with pytest.raises(TypeError, match="rotary_cos must be float"):
        call(rotary_cos=cos.long(), rotary_sin=sin.long())
    with pytest.raises(TypeError, match="rotary_interleaved"):
        call(rotary_cos=cos, rotary_sin=sin, rotary_interleaved=1)
    # Value check (CPU tensors always validate): positions past the tables.
    kc0 = kc.clone()
    with pytest.raises(ValueError, match="rotary_cos/rotary_sin have 3 positions"):
        call(rotary_cos=cos[:3], rotary_sin=sin[:3])  # the new key sits at position 3
    assert torch.equal(kc, kc0)  # rejected before the append
    call(rotary_cos=cos[:4], rotary_sin=sin[:4])  # just enough


@pytest.mark.parametrize("nan_on_overflow", [False, True])
def test_fp8_rotation_saturates(monkeypatch, nan_on_overflow):
    """An e4m3 x (FA3's FP8 q and new keys) rotates in fp32 and rounds once to e4m3 saturating: a
    pair of 448s rotates up to 448 sqrt(2), stored as +-448 (0x7E / 0xFE), as the fused append's
    cvt.rn.satfinite stores it, whatever torch's own cast does past 464 (NaN before pytorch#178817,
    emulated here: the H200's torch 2.11 made the reference's bytes NaN where the kernel's are 448);
    NaN stays NaN, values in range round to nearest even as before."""
    from helpers import e4m3_cast_nan_on_overflow
    if nan_on_overflow:
        probe = e4m3_cast_nan_on_overflow(monkeypatch)
        assert torch.isnan(probe.float()).all()  # the emulation is on
    e4 = torch.float8_e4m3fn
    # rotary_dim 8, NeoX pairs (c, c + 4): (448, 448) at -pi/4 and (448, -448) at pi/4 rotate to
    # 448 sqrt(2) and 0; (448, -448) at 0.0494 to 448 (cos + sin) = 470 (past 464, which the old
    # cast rounded to NaN) and -425; (NaN, 1) to NaN; channels 8, 9 pass through
    x = torch.tensor([448.0, 448.0, 448.0, float("nan"), 448.0, -448.0, -448.0, 1.0, 3.0, 0.25]).to(e4)
    x = x.view(1, 1, 1, 10)
    ang = torch.tensor([[-math.pi / 4, math.pi / 4, 0.0494, 0.0]])
    out = rotary.apply_rotary(x, ang.cos(), ang.sin(), torch.zeros(1, 1, dtype=torch.long))
    xr = x[..., :8].float()
    c, s = ang.cos().view(1, 1, 1, 4), ang.sin().view(1, 1, 1, 4)
    want = torch.cat((xr[..., :4] * c - xr[..., 4:] * s, xr[..., :4] * s + xr[..., 4:] * c), -1)
    assert (want.nan_to_num().abs() > 464).sum() == 3  # 633, 633, 470
    assert torch.equal(out[..., :8].view(torch.uint8), want.clamp(-448, 448).to(e4).view(torch.uint8))
    assert (out[0, 0, 0, :3].view(torch.uint8) == 0x7E).all() and torch.isnan(out[0, 0, 0, [3, 7]].float()).all()
    assert torch.equal(out[..., 8:].view(torch.uint8), x[..., 8:].view(torch.uint8))
