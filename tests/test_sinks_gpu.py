"""Attention sinks in the kernels on an sm_90 GPU: the forward kernel's epilogue (batched and
varlen, rows that see no key, a -inf sink), the decode kernel's epilogue and the split-KV
combine (packed GQA, a row of 0 keys), and the ops' checks of ``sinks``.

Every launch writes into NaN-poisoned out/lse where the op is called directly; results are
checked against the fp64 oracle with a sink column (tests/helpers.py) by the FlashAttention rule,
lse within 1e-4 relative. Skipped without an sm_90 device or a flash3._C whose ops take sinks.
"""
import json
import math
import warnings

import pytest
import torch

import flash3
from flash3 import _backend
from helpers import assert_close_fa, attention_naive, attention_ref64, max_err

HAS_SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
pytestmark = [pytest.mark.requires_sm90,
              pytest.mark.skipif(not HAS_SM90, reason="needs a CUDA sm_90 (H100/H200) device")]


def built(key):
    if not hasattr(torch.ops.flash3, "kernel_info"):
        return set()
    return {tuple(x) for x in json.loads(torch.ops.flash3.kernel_info()).get(key, [])}


@pytest.fixture(scope="module", autouse=True)
def require_extension():
    if HAS_SM90 and not _backend.has_sink_kernels():
        pytest.skip("flash3._C without sinks in its kernels (pip install --no-build-isolation .)")


def need(key, name, d, dv):
    if (name, d, dv) not in built(key):
        pytest.skip(f"{key} kernel {name} d={d} d_v={dv} not built")


DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def sink_logits(h, gen):
    """Logits about the rows' lse, one large (the sink then dominates) and one -inf (no sink)."""
    s = torch.randn(h, device="cuda", generator=gen) * 2
    s[1], s[-1] = 8.0, -math.inf
    return s


def check(out, lse, q, k, v, sinks, **kw):
    """out (b, s_q, h, d_v) and lse (b, h, s_q) against the fp64 oracle with the sink column."""
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    ref, ref_lse = attention_ref64(q.double(), k.double(), v.double(), sinks=sinks.double(), **kw)
    naive, _ = attention_naive(q, k, v, sinks=sinks, **kw)
    assert_close_fa(out, naive, ref, "out")
    assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse))
    fin = torch.isfinite(ref_lse)
    if fin.any():
        assert max_err(lse[fin], ref_lse[fin]) <= 1e-4 * (1 + ref_lse[fin].abs().max().item())


@pytest.mark.parametrize("name", ["bf16", "fp16"])
@pytest.mark.parametrize("kw", [dict(causal=True), dict(window_size=(40, 7)), dict(softcap=5.0)])
def test_forward_kernel_adds_the_sink(name, kw):
    """Causal with more queries than keys (the first rows see no key: lse = the sink), a window
    (rows whose window misses the keys), softcap (the sink is in the capped space)."""
    need("fwd", name, 128, 128)
    gen = torch.Generator(device="cuda").manual_seed(0)
    b, s_q, s_k, h, h_k, d = 2, 331, 190, 6, 2, 128
    dt = DTYPES[name]
    q, k, v = (torch.randn(*shape, device="cuda", generator=gen).to(dt)
               for shape in ((b, s_q, h, d), (b, s_k, h_k, d), (b, s_k, h_k, d)))
    sinks = sink_logits(h, gen)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # the kernel, not the reference fallback
        out, lse = flash3.attention(q, k, v, sinks=sinks, return_lse=True, **kw)
    check(out, lse, q, k, v, sinks, **kw)


def test_forward_op_poisoned_outputs_and_no_keys():
    """fwd_sm90 itself into NaN out/lse, then a call with no keys at all: out 0, lse = the sink."""
    need("fwd", "bf16", 128, 128)
    gen = torch.Generator(device="cuda").manual_seed(1)
    b, s_q, s_k, h, h_k, d = 1, 200, 150, 4, 1, 128
    q = torch.randn(b, s_q, h, d, device="cuda", generator=gen).bfloat16()
    k, v = (torch.randn(b, s_k, h_k, d, device="cuda", generator=gen).bfloat16() for _ in range(2))
    sinks = sink_logits(h, gen)
    out = torch.full_like(q, math.nan)
    lse = torch.full((b, h, s_q), math.nan, device="cuda")
    torch.ops.flash3.fwd_sm90(q, k, v, out, lse, None, None, None, 0, 0, d ** -0.5, -1, 0, 0.0,
                              sinks=sinks)
    check(out, lse, q, k, v, sinks, causal=True)
    empty = k[:, :0]
    torch.ops.flash3.fwd_sm90(q, empty, empty, out, lse, None, None, None, 0, 0, d ** -0.5, -1, -1,
                              0.0, sinks=sinks)
    assert (out == 0).all() and torch.equal(lse, sinks.view(1, h, 1).expand(b, h, s_q))


def test_varlen_forward_kernel_adds_the_sink():
    need("fwd", "bf16", 128, 128)
    gen = torch.Generator(device="cuda").manual_seed(2)
    lens_q, lens_k = [203, 0, 77, 5], [331, 40, 150, 0]
    h, h_k, d = 4, 2, 128
    cu = lambda ls: torch.tensor([0] + ls, device="cuda").cumsum(0).to(torch.int32)  # noqa: E731
    q = torch.randn(sum(lens_q), h, d, device="cuda", generator=gen).bfloat16()
    k, v = (torch.randn(sum(lens_k), h_k, d, device="cuda", generator=gen).bfloat16() for _ in range(2))
    sinks = sink_logits(h, gen)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        out, lse = flash3.attention_varlen(q, k, v, cu(lens_q), cu(lens_k), max(lens_q), max(lens_k),
                                           causal=True, sinks=sinks, return_lse=True)
    oq = ok = 0
    for lq, lk in zip(lens_q, lens_k):
        if lq:
            check(out[oq:oq + lq][None], lse[:, oq:oq + lq][None], q[oq:oq + lq][None],
                  k[ok:ok + lk][None], v[ok:ok + lk][None], sinks, causal=True)
        oq, ok = oq + lq, ok + lk


@pytest.mark.parametrize("num_splits", [1, 3, 0])
@pytest.mark.parametrize("fp8_cache", [False, True])
def test_decode_kernel_and_combine_add_the_sink(num_splits, fp8_cache):
    """Packed GQA (g = 4, s_q 5) on a paged cache, a row of 0 keys: without splits the decode
    kernel's epilogue adds the sink, with splits the combine (the partials stay sink-free)."""
    need("decode_fp8_cache" if fp8_cache else "decode", "bf16", 128, 128)
    from flash3 import reference
    gen = torch.Generator(device="cuda").manual_seed(3)
    b, s_q, h_k, g, d, page, cap = 3, 5, 2, 4, 128, 64, 512
    h = g * h_k
    pages = b * cap // page + 2
    kc, vc = (torch.randn(pages, page, h_k, d, device="cuda", generator=gen) for _ in range(2))
    pt = torch.randperm(pages, device="cuda", generator=gen)[:b * cap // page].view(b, -1).to(torch.int32)
    kd = vd = None
    if fp8_cache:
        kd, vd = (torch.rand(pages, h_k, device="cuda", generator=gen) * 0.1 + 0.01 for _ in range(2))
        kc, vc = reference.quantize_fp8_cache(kc, kd[:, None, :]), reference.quantize_fp8_cache(vc, vd[:, None, :])
    else:
        kc, vc = kc.bfloat16(), vc.bfloat16()
    q = torch.randn(b, s_q, h, d, device="cuda", generator=gen).bfloat16()
    lens = torch.tensor([0, 333, 512], dtype=torch.int32, device="cuda")
    sinks = sink_logits(h, gen)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        out, lse = flash3.attention_with_kvcache(q, kc, vc, cache_seqlens=lens, page_table=pt, causal=True,
                                                 sinks=sinks, num_splits=num_splits, return_lse=True,
                                                 k_descale=kd, v_descale=vd)
    assert (out[0] == 0).all() and torch.equal(lse[0], sinks.view(h, 1).expand(h, s_q))
    for i in (1, 2):
        n = int(lens[i])
        k_i = reference.kvcache_gather(kc, i, n, pt, kd)[None].to(q.dtype)
        v_i = reference.kvcache_gather(vc, i, n, pt, vd)[None].to(q.dtype)
        check(out[i:i + 1], lse[i:i + 1], q[i:i + 1], k_i, v_i, sinks, causal=True)


def test_bad_sinks_are_refused_by_name():
    need("fwd", "bf16", 128, 128)
    q = torch.randn(1, 8, 4, 128, device="cuda").bfloat16()
    k = v = torch.randn(1, 8, 2, 128, device="cuda").bfloat16()
    out, lse = torch.empty_like(q), torch.empty(1, 4, 8, device="cuda")
    for bad in (torch.zeros(4, device="cuda", dtype=torch.float16), torch.zeros(3, device="cuda"),
                torch.zeros(8, device="cuda")[::2], torch.zeros(4)):
        with pytest.raises(RuntimeError, match="sinks"):
            torch.ops.flash3.fwd_sm90(q, k, v, out, lse, None, None, None, 0, 0, 0.1, -1, -1, 0.0,
                                      sinks=bad)
