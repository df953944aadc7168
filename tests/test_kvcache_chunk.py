"""FA3's attention_chunk on flash3's KV-cache path: flash3.attention_with_kvcache (batched and
packed queries, splits, cache_leftpad, the append with rotary, FP8 caches) and FA3's
flash_attn_with_kvcache, which now hands the chunk to flash3 instead of running FA3's spec; and FA3's
e4m3 rotary tables, converted to float32 (exact) on the same path.

Against FA3's spec, flash3/reference/fa3.py: query rows aligned at the end of the keys (cache_seqlens
+ new keys, counted from cache_leftpad), chunk starts at multiples of attention_chunk of the key
position, intersected with causal / window. On the CPU these run flash3's reference backend (the
decode kernels' algorithm: split partials and their combine, per-token rotary); on an sm_90 GPU the
decode kernels (the GPU tests at the end, skipped elsewhere).
"""
import pytest
import torch

import flash3
from flash3 import _backend, masking
from flash3 import flash_attn_interface as fai
from flash3.reference import quantize_fp8_cache
from flash3.reference.fa3 import fa3_forward
from helpers import assert_close, cu

HAS_SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def spec(q, kc, vc, chunk, causal=False, window=(-1, -1), **kw):
    left, right = masking.normalize_window(causal, window)
    return fa3_forward(q, kc, vc, softmax_scale=q.shape[-1] ** -0.5, window_left=left,
                       window_right=right, attention_chunk=chunk, **kw)


# (chunk, causal, window, num_splits): a chunk below the reference's split block and above it, with
# causal, a window, alone; one and several splits (split partials cut from the whole row).
MASKS = [(5, True, (-1, -1), 1), (5, True, (-1, -1), 3), (16, False, (6, 2), 2),
         (40, False, (-1, -1), 4), (3, False, (-1, -1), 1), (64, True, (20, -1), 2)]


@pytest.mark.parametrize("chunk,causal,window,splits", MASKS)
@pytest.mark.parametrize("leftpad", [False, True])
def test_attention_with_kvcache_matches_fa3_spec(chunk, causal, window, splits, leftpad):
    """Batched q (s_q 4 and GQA g 2, so a tile's rows sit at different positions) against a
    contiguous cache with rows of 0, few and many keys; cache_leftpad moves the chunk starts (key
    positions count from it), one leftpad equal to the row's keys (no key)."""
    torch.manual_seed(chunk + splits)
    b, cap, h, h_k, d = 3, 96, 4, 2, 32
    q = torch.randn(b, 4, h, d)
    kc, vc = torch.randn(b, cap, h_k, d), torch.randn(b, cap, h_k, d)
    lens = torch.tensor([0, 13, 90], dtype=torch.int32)
    pad = torch.tensor([0, 13, 7], dtype=torch.int32) if leftpad else None
    out, lse = flash3.attention_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=causal,
                                             window_size=window, attention_chunk=chunk,
                                             num_splits=splits, cache_leftpad=pad, return_lse=True)
    ref, ref_lse = spec(q, kc, vc, chunk, causal, window, cache_seqlens=lens, cache_leftpad=pad)
    assert_close(out, ref, 2e-6)
    assert_close(lse, ref_lse, 2e-6)


@pytest.mark.parametrize("interleaved", [False, True])
def test_append_rotary_and_paged_cache(interleaved):
    """New keys appended through a page table and rotated; with a chunk q is rotated per token
    (FA3: causal, local or chunked), the cache bytes and out as FA3's spec."""
    torch.manual_seed(11)
    b, ps, pages, h, h_k, d, s_new = 2, 8, 12, 4, 2, 32, 3
    kp, vp = torch.randn(pages, ps, h_k, d), torch.randn(pages, ps, h_k, d)
    table = torch.randperm(pages)[:10].view(b, 5).to(torch.int32)
    q = torch.randn(b, s_new, h, d)
    k, v = torch.randn(b, s_new, h_k, d), torch.randn(b, s_new, h_k, d)
    lens = torch.tensor([6, 29], dtype=torch.int32)
    ang = torch.rand(48, 8) * 6.28
    cos, sin = ang.cos(), ang.sin()
    kp2, vp2 = kp.clone(), vp.clone()
    out = flash3.attention_with_kvcache(q, kp, vp, k, v, cache_seqlens=lens, page_table=table,
                                        rotary_cos=cos, rotary_sin=sin,
                                        rotary_interleaved=interleaved, attention_chunk=7)
    ref, _ = spec(q, kp2, vp2, 7, k_new=k, v_new=v, cache_seqlens=lens, page_table=table,
                  rotary_cos=cos, rotary_sin=sin, rotary_interleaved=interleaved)
    assert torch.equal(kp, kp2) and torch.equal(vp, vp2)
    assert_close(out, ref, 2e-6)


def test_packed_queries():
    """cu_seqlens_q (a sequence without queries, one without keys, one with more queries than
    keys: rows before the keys see none) against a paged cache."""
    torch.manual_seed(12)
    lq, lens = [3, 0, 5, 9], [40, 7, 0, 4]
    q = torch.randn(sum(lq), 4, 32)
    kp, vp = torch.randn(24, 8, 2, 32), torch.randn(24, 8, 2, 32)
    table = torch.randperm(24)[:20].view(4, 5).to(torch.int32)
    used = torch.tensor(lens, dtype=torch.int32)
    for chunk, causal in ((6, True), (16, False)):
        out, lse = flash3.attention_with_kvcache(q, kp, vp, cache_seqlens=used, page_table=table,
                                                 cu_seqlens_q=cu(lq), max_seqlen_q=max(lq),
                                                 causal=causal, attention_chunk=chunk,
                                                 num_splits=2, return_lse=True)
        ref, ref_lse = spec(q, kp, vp, chunk, causal, cache_seqlens=used, page_table=table,
                            cu_seqlens_q=cu(lq))
        assert_close(out, ref, 2e-6)
        assert_close(lse, ref_lse, 2e-6)


def test_fp8_cache():
    """An e4m3 cache with per-(row, kv head) descales (contiguous: the batch entry's, FA3's
    layout) against the spec on the same bytes."""
    torch.manual_seed(13)
    b, cap, h, h_k, d = 2, 64, 4, 2, 32
    kd, vd = torch.rand(b, h_k) + 0.1, torch.rand(b, h_k) + 0.1
    k8 = quantize_fp8_cache(torch.randn(b, cap, h_k, d), kd[:, None, :])
    v8 = quantize_fp8_cache(torch.randn(b, cap, h_k, d), vd[:, None, :])
    q = torch.randn(b, 3, h, d)
    lens = torch.tensor([50, 17], dtype=torch.int32)
    out = flash3.attention_with_kvcache(q, k8, v8, cache_seqlens=lens, causal=True,
                                        attention_chunk=12, k_descale=kd, v_descale=vd,
                                        num_splits=3)
    ref, _ = spec(q, k8, v8, 12, True, cache_seqlens=lens, k_descale=kd, v_descale=vd)
    assert_close(out, ref, 2e-6)


def test_flash_attn_with_kvcache_takes_flash3s_path(monkeypatch):
    """FA3's interface sends the chunk to flash3 (not to its spec): the same values as
    attention_with_kvcache and as the spec, batched with leftpad and packed queries."""
    def no_spec(*a, **k):
        raise AssertionError("ran FA3's spec")
    monkeypatch.setattr(fai, "_on_reference", no_spec)
    torch.manual_seed(14)
    q = torch.randn(2, 3, 4, 32)
    kc, vc = torch.randn(2, 64, 2, 32), torch.randn(2, 64, 2, 32)
    lens = torch.tensor([9, 60], dtype=torch.int32)
    pad = torch.tensor([2, 0], dtype=torch.int32)
    out, lse, *_ = fai.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, cache_leftpad=pad,
                                               causal=True, attention_chunk=8,
                                               return_softmax_lse=True)
    ref, ref_lse = spec(q, kc, vc, 8, True, cache_seqlens=lens, cache_leftpad=pad)
    assert_close(out, ref, 2e-6)
    assert_close(lse, ref_lse, 2e-6)
    lq = [2, 0, 3]
    qp = torch.randn(sum(lq), 4, 32)
    kc3, vc3 = torch.randn(3, 64, 2, 32), torch.randn(3, 64, 2, 32)
    used = torch.tensor([5, 9, 40], dtype=torch.int32)
    out = fai.flash_attn_with_kvcache(qp, kc3, vc3, cache_seqlens=used, cu_seqlens_q=cu(lq),
                                      max_seqlen_q=3, window_size=(4, 1), attention_chunk=16)
    ref, _ = spec(qp, kc3, vc3, 16, False, (4, 1), cache_seqlens=used, cu_seqlens_q=cu(lq))
    assert_close(out, ref, 2e-6)


@pytest.mark.parametrize("fp8", [False, True])
def test_fp8_rotary_tables_take_flash3s_path(monkeypatch, fp8):
    """FA3's FP8 test passes rotary_cos/rotary_sin in e4m3: float32 holds every e4m3 value, so
    flash_attn_with_kvcache converts them and runs flash3's path (a 16-bit cache; FA3's FP8 call
    with e4m3 q/k/v on a contiguous e4m3 cache), as flash3 with float32 tables computes, and as
    FA3's spec with the e4m3 tables (within the output's rounding)."""
    spec_calls = []
    monkeypatch.setattr(fai, "_on_reference", lambda *a, **k: spec_calls.append(1))
    torch.manual_seed(15)
    b, cap, h, h_k, d = 2, 32, 4, 2, 32
    f8 = torch.float8_e4m3fn
    ang = torch.rand(cap, 8) * 6.28
    cos8, sin8 = ang.cos().to(f8), ang.sin().to(f8)
    lens = torch.tensor([3, 20], dtype=torch.int32)
    dt = f8 if fp8 else torch.bfloat16
    q = torch.randn(b, 2, h, d).to(dt)
    k, v = (torch.randn(b, 2, h_k, d).to(dt) for _ in range(2))
    kc, vc = (torch.randn(b, cap, h_k, d).to(dt) for _ in range(2))
    ds = dict(q_descale=torch.tensor([0.5]), k_descale=torch.tensor([0.25]),
              v_descale=torch.tensor([2.0])) if fp8 else {}
    runs = {}
    for name, tables in (("e4m3", (cos8, sin8)), ("f32", (cos8.float(), sin8.float()))):
        kc2, vc2 = kc.clone(), vc.clone()
        runs[name] = (fai.flash_attn_with_kvcache(q, kc2, vc2, k, v, rotary_cos=tables[0],
                                                  rotary_sin=tables[1], cache_seqlens=lens,
                                                  causal=True, rotary_interleaved=False, **ds), kc2)
    assert not spec_calls
    assert torch.equal(runs["e4m3"][0], runs["f32"][0])
    assert torch.equal(runs["e4m3"][1].view(torch.uint8), runs["f32"][1].view(torch.uint8))
    expand = {n: x.expand(b, h_k) for n, x in ds.items()}
    ref, _ = fa3_forward(q, kc.clone(), vc.clone(), softmax_scale=d ** -0.5, window_right=0,
                         k_new=k, v_new=v, rotary_cos=cos8, rotary_sin=sin8, cache_seqlens=lens,
                         rotary_interleaved=False, **expand)
    out = runs["e4m3"][0]
    assert (out.float() - ref.float()).abs().max().item() <= 2e-2 * max(1.0, ref.abs().max().item())


@pytest.mark.parametrize("splits", [1, 3])
def test_sinks_with_a_chunk(splits):
    """Attention sinks join each row's softmax after the chunk's mask (the kernel's epilogue, or
    the split combine): against the fp64 oracle with both (FA3's spec has no sinks)."""
    from helpers import attention_ref64
    torch.manual_seed(16)
    q, kc, vc = torch.randn(2, 3, 4, 16), torch.randn(2, 40, 2, 16), torch.randn(2, 40, 2, 16)
    lens = torch.tensor([2, 37], dtype=torch.int32)
    sinks = torch.tensor([0.5, -1.0, float("-inf"), 3.0])
    out, lse = flash3.attention_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True,
                                             attention_chunk=9, sinks=sinks, num_splits=splits,
                                             return_lse=True)
    for i, n in enumerate(lens.tolist()):
        ref, ref_lse = attention_ref64(q[i:i + 1].double(), kc[i:i + 1, :n].double(),
                                       vc[i:i + 1, :n].double(), causal=True, attention_chunk=9,
                                       sinks=sinks.double())
        assert_close(out[i:i + 1], ref, 2e-6)
        assert_close(lse[i], ref_lse[0], 2e-6)  # a row before its chunk's keys, sink -inf: -inf


def test_errors_name_the_argument():
    q, kc = torch.randn(1, 1, 2, 16), torch.randn(1, 8, 2, 16)
    lens = torch.tensor([4], dtype=torch.int32)
    with pytest.raises(ValueError, match="attention_chunk must be >= 0"):
        flash3.attention_with_kvcache(q, kc, kc, cache_seqlens=lens, attention_chunk=-1)
    with pytest.raises(TypeError, match="attention_chunk must be an int"):
        flash3.attention_with_kvcache(q, kc, kc, cache_seqlens=lens, attention_chunk=2.0)
    with pytest.raises(ValueError, match="attention_chunk must be >= 0"):
        fai.flash_attn_with_kvcache(q, kc, kc, cache_seqlens=lens, attention_chunk=-3)


def test_decode_kernels_take_a_chunk_at_every_head_dim(monkeypatch):
    """The decode kernels take the chunk at every head dim (above attn_logic.h
    kDecodeChunkMaxHeadDim on a tile of their own, decode_chunk_tile_shape): no CUDA call falls
    back to the reference for it."""
    monkeypatch.setattr(_backend, "has_chunk_kernel", lambda kind: True)
    cuda = lambda d: type("Q", (), {"is_cuda": True, "shape": (2, 1, 4, d)})()  # noqa: E731
    assert _backend.kernel_chunk_reason(cuda(256), "decode", 64) is None
    assert _backend.kernel_chunk_reason(cuda(64), "decode", 64, 256) is None
    assert _backend.kernel_chunk_reason(cuda(192), "decode", 64) is None
    assert _backend.kernel_chunk_reason(cuda(192), "decode", 64, 128) is None
    assert _backend.kernel_chunk_reason(cuda(256), "decode", 0) is None
    monkeypatch.setattr(_backend, "has_chunk_kernel", lambda kind: False)
    assert "older build" in _backend.kernel_chunk_reason(cuda(128), "decode", 64)


# ----------------------------------------------------------------- the decode kernels (sm_90)
gpu = pytest.mark.skipif(not HAS_SM90, reason="needs a CUDA sm_90 (H100/H200) device")


@gpu
@pytest.mark.parametrize("fp8_cache", [False, True])
@pytest.mark.parametrize("chunk,causal,window,splits", MASKS + [(48, True, (-1, -1), 0),
                                                               (256, False, (-1, -1), 3)])
def test_gpu_decode_kernels_match_the_spec(fp8_cache, chunk, causal, window, splits):
    """bf16 q, d 128, GQA g 4, s_q 37 (148 packed rows: two tiles), paged cache of 16-key pages
    with leftpad, 16-bit and e4m3 caches: out and lse against FA3's spec in fp32 on the same
    values; no fallback warning (the decode kernel ran)."""
    import warnings
    if not _backend.has_chunk_kernel("decode"):
        pytest.skip("flash3._C without attention_chunk in fwd_kvcache_sm90")
    torch.manual_seed(chunk + splits)
    dev, b, h, h_k, d, ps = "cuda", 3, 8, 2, 128, 16
    q = torch.randn(b, 37, h, d, device=dev, dtype=torch.bfloat16)
    kp, vp = (torch.randn(60, ps, h_k, d, device=dev) for _ in range(2))
    table = torch.randperm(60, device=dev)[:57].view(b, 19).to(torch.int32)
    lens = torch.tensor([20, 150, 300], dtype=torch.int32, device=dev)
    pad = torch.tensor([0, 37, 5], dtype=torch.int32, device=dev)
    kd = vd = None
    if fp8_cache:
        kd, vd = (torch.rand(60, h_k, device=dev) * 0.1 + 0.01 for _ in range(2))
        kp, vp = quantize_fp8_cache(kp, kd[:, None, :]), quantize_fp8_cache(vp, vd[:, None, :])
    else:
        kp, vp = kp.to(torch.bfloat16), vp.to(torch.bfloat16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a reference fallback warns
        out, lse = flash3.attention_with_kvcache(q, kp, vp, cache_seqlens=lens, page_table=table,
                                                 cache_leftpad=pad, causal=causal,
                                                 window_size=window, attention_chunk=chunk,
                                                 num_splits=splits, k_descale=kd, v_descale=vd,
                                                 return_lse=True)
    # the kernel's operands: x8 * descale rounded once to bf16 (its documented algorithm)
    kf, vf = ((x.float() * ds[:, None, :, None]).to(torch.bfloat16) if fp8_cache else x
              for x, ds in ((kp, kd), (vp, vd)))
    ref, ref_lse = spec(q.cpu().float(), kf.cpu().float(), vf.cpu().float(), chunk, causal,
                        window, cache_seqlens=lens.cpu(), page_table=table.cpu(),
                        cache_leftpad=pad.cpu())
    assert torch.equal(torch.isinf(lse.cpu()), torch.isinf(ref_lse))
    fin = torch.isfinite(ref_lse)
    assert (lse.cpu()[fin] - ref_lse[fin]).abs().max().item() <= 1e-3 * (1 + ref_lse[fin].abs().max().item())
    assert (out.cpu().float() - ref).abs().max().item() <= 2e-2
