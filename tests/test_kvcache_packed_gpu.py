"""FA3's packed appends on an sm_90 GPU: new keys packed by cu_seqlens_k_new and/or queries packed
by cu_seqlens_q through flash3.attention_with_kvcache (the fused append kernel, then the decode
kernel), against the same call on the CPU (flash3's reference): the caches and the rotated
appends bit for bit, out by the FlashAttention rule against an fp32 computation, lse closely;
CUDA-graph capture and replay. FA3's FP8 cache in the same layouts (e4m3 q/cache/new keys, its
(b, h_k) descales: flash_attn_interface's descale_per_batch path), with rotary new keys too (q8 and
the keys rotated in e4m3 by the fused append), against FA3's spec. Skipped
without an sm_90 device or a bf16 d-128 decode kernel (16-bit or FP8 cache)."""
import json

import pytest
import torch

import flash3
from helpers import assert_close_fa

HAS_SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
pytestmark = [pytest.mark.requires_sm90,
              pytest.mark.skipif(not HAS_SM90, reason="needs a CUDA sm_90 (H100/H200) device")]

H, H_K, D, CAP = 8, 2, 128, 256
# (queries, new keys) per entry: a list is packed, an int batched; cache_seqlens; leftpad.
CASES = {"packed_qk": ([3, 0, 5, 1, 70], [2, 3, 0, 1, 70], [40, 0, 77, 255, 100], [0, 0, 37, 2, 5]),
         "packed_q": ([1, 4, 0], 2, [10, 200, 5], [3, 0, 0]),
         "packed_k": (2, [0, 5, 1], [50, 120, 0], [49, 0, 0])}


def need_kernel():
    info = json.loads(torch.ops.flash3.kernel_info()) if hasattr(torch.ops.flash3, "kernel_info") else {}
    if ["bf16", D, D] not in info.get("decode", []):
        pytest.skip("flash3._C has no bf16 d-128 decode kernel")
    if not flash3._backend.op_takes("append_kv_sm90", "cu_seqlens_k_new"):
        pytest.skip("flash3._C's append takes no packed layouts (an older build)")


def cu(lens):
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)


def make(case, page, seed=0):
    """CPU bf16 inputs: q, k, v (packed with 2 tail rows of no entry, or batched), caches (paged in
    shuffled pages of `page`, or contiguous), and the call's keyword arguments."""
    lq, ln, lens, pads = CASES[case]
    b = len(lens)
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=g).to(torch.bfloat16)  # noqa: E731
    kw = dict(cache_seqlens=torch.tensor(lens, dtype=torch.int32),
              cache_leftpad=torch.tensor(pads, dtype=torch.int32))
    if isinstance(lq, int):
        q = rnd(b, lq, H, D)
    else:
        q = rnd(sum(lq) + 2, H, D)
        kw.update(cu_seqlens_q=cu(lq), max_seqlen_q=max(lq))
    if isinstance(ln, int):
        k, v = rnd(b, ln, H_K, D), rnd(b, ln, H_K, D)
    else:
        k, v = rnd(sum(ln) + 2, H_K, D), rnd(sum(ln) + 2, H_K, D)
        kw["cu_seqlens_k_new"] = cu(ln)
    if page is None:
        kc, vc = rnd(b, CAP, H_K, D), rnd(b, CAP, H_K, D)
    else:
        n = b * CAP // page + 3
        kc, vc = rnd(n, page, H_K, D), rnd(n, page, H_K, D)
        kw["page_table"] = torch.randperm(n, generator=g)[:b * CAP // page].view(b, -1).to(torch.int32)
    ang = torch.arange(600, dtype=torch.float32)[:, None] * 10000.0 ** (-torch.arange(0, 64, 2) / 64)
    kw.update(rotary_cos=ang.cos(), rotary_sin=ang.sin())
    return q, k, v, kc, vc, kw


def call(q, k, v, kc, vc, kw, device, dtype=None):
    to = lambda x: x if not isinstance(x, torch.Tensor) else x.to(device)  # noqa: E731
    cast = lambda x: to(x) if dtype is None else to(x).to(dtype)  # noqa: E731
    kc, vc = cast(kc).clone(), cast(vc).clone()
    out, lse = flash3.attention_with_kvcache(cast(q), kc, vc, cast(k), cast(v), return_lse=True,
                                             **{n: to(x) for n, x in kw.items()})
    return out, lse, kc, vc


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("page", [None, 16, 64])
@pytest.mark.parametrize("causal,interleaved,num_splits", [(True, False, 0), (False, True, 3)])
def test_packed_appends_match_the_reference(case, page, causal, interleaved, num_splits):
    need_kernel()
    q, k, v, kc, vc, kw = make(case, page)
    kw.update(causal=causal, rotary_interleaved=interleaved, num_splits=num_splits)
    out, lse, kc_gpu, vc_gpu = call(q, k, v, kc, vc, kw, "cuda")
    # the reference on the same bf16 values (scores in fp32: lse's oracle), and on fp32 ones (out's)
    naive, naive_lse, kc_ref, vc_ref = call(q, k, v, kc, vc, kw, "cpu")
    ref, _, _, _ = call(q, k, v, kc, vc, kw, "cpu", torch.float32)
    assert torch.equal(kc_gpu.cpu(), kc_ref) and torch.equal(vc_gpu.cpu(), vc_ref)  # the append, bit for bit
    rows = slice(0, int(kw["cu_seqlens_q"][-1])) if "cu_seqlens_q" in kw else slice(None)
    assert_close_fa(out.cpu().float()[rows], naive.float()[rows], ref[rows])
    got, want = lse.cpu()[..., rows], naive_lse[..., rows]
    fin = torch.isfinite(want)
    assert torch.equal(torch.isfinite(got), fin)
    assert (got[fin] - want[fin]).abs().max() <= 1e-4 * (1 + want[fin].abs().max())
    if "cu_seqlens_q" in kw:  # packed rows of no entry
        assert (out[rows.stop:] == 0).all() and (lse[:, rows.stop:] == float("-inf")).all()


def test_packed_append_cuda_graph_replays_like_eager():
    """No host synchronization: a packed append + attention captures into a CUDA graph; replays on
    new values (new keys, lengths) match eager calls."""
    need_kernel()
    q, k, v, kc, vc, kw = make("packed_qk", 16)
    kw.update(causal=True)
    dev = {n: x.cuda() if isinstance(x, torch.Tensor) else x for n, x in kw.items()}
    sq, sk, sv = q.cuda(), k.cuda(), v.cuda()
    kc_g, vc_g = kc.cuda(), vc.cuda()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up (allocations, lazy init) off the capture
        flash3.attention_with_kvcache(sq, kc_g.clone(), vc_g.clone(), sk, sv, **dev)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_g = flash3.attention_with_kvcache(sq, kc_g, vc_g, sk, sv, **dev)
    for step in range(2):
        q2, k2, v2, kc2, vc2, _ = make("packed_qk", 16, seed=step + 1)
        lens2 = (kw["cache_seqlens"] - 7 * step).clamp(min=0).to(torch.int32)
        for dst, src in ((sq, q2), (sk, k2), (sv, v2), (kc_g, kc2), (vc_g, vc2),
                         (dev["cache_seqlens"], lens2)):
            dst.copy_(src)
        graph.replay()
        want, _, kc_e, _ = call(q2, k2, v2, kc2, vc2, dict(kw, cache_seqlens=lens2), "cuda")
        torch.cuda.synchronize()
        assert torch.equal(out_g, want) and torch.equal(kc_g, kc_e)


# ----------------------------------------------------------------- FA3's FP8 cache, packed layouts
def need_fp8_kernel():
    info = json.loads(torch.ops.flash3.kernel_info()) if hasattr(torch.ops.flash3, "kernel_info") else {}
    if ["bf16", D, D] not in info.get("decode_fp8_cache", []):
        pytest.skip("flash3._C has no bf16 d-128 FP8-cache decode kernel")
    if not (flash3._backend.op_takes("append_kv_sm90", "cu_seqlens_k_new")
            and flash3._backend.has_append_e4m3_kernel()
            and flash3._backend.has_descale_per_batch_kernel()):
        pytest.skip("flash3._C's append/decode take no packed layouts or descale_per_batch (an older build)")


@pytest.mark.parametrize("packed_q,packed_k,new_kv", [(True, True, True), (True, False, True),
                                                      (False, True, True), (True, False, False)])
@pytest.mark.parametrize("page,causal,num_splits,extras", [(16, True, 0, ("leftpad",)),
                                                           (None, False, 3, ("batch_idx",)),
                                                           (64, True, 2, ("leftpad", "batch_idx"))])
def test_fp8_packed_layouts_match_the_spec(packed_q, packed_k, new_kv, page, causal, num_splits, extras):
    """flash_attn_interface.flash_attn_with_kvcache with e4m3 q/cache (and e4m3 new keys), FA3's
    (b, h_k) descales, queries packed by cu_seqlens_q and/or new keys by cu_seqlens_k_new: the
    fused append (the bytes copied) and the FP8-cache decode kernel with descales per batch entry,
    no fallback; the caches byte for byte and out against FA3's spec (reference/fa3.py) on the CPU,
    packed rows of no entry out 0, lse -inf."""
    import warnings
    from flash3 import flash_attn_interface as fai
    from test_fa3_fp8_decode import PK_LQ, PK_PADS, fp8_packed, packed_spec
    need_fp8_kernel()
    rows = 5 if "batch_idx" in extras else 4
    (q8, kn8, vn8, k8, v8, qd, kd, vd), kw = fp8_packed(packed_q, packed_k, page is not None, rows,
                                                        seed=page or 1, h=H, h_k=H_K, d=D, cap=CAP,
                                                        page=page or CAP, device="cuda")
    if "leftpad" in extras:
        kw["cache_leftpad"] = torch.tensor(PK_PADS, dtype=torch.int32, device="cuda")
    if "batch_idx" in extras:
        kw["cache_batch_idx"] = torch.tensor([2, 4, 0, 1], dtype=torch.int32, device="cuda")
    if not new_kv:
        kw.pop("cu_seqlens_k_new", None)
    kc, vc = k8.clone(), v8.clone()
    new = (kn8, vn8) if new_kv else (None, None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fallback warning would fail the test
        out, lse, *_ = fai.flash_attn_with_kvcache(q8, kc, vc, *new, q_descale=qd, k_descale=kd,
                                                   v_descale=vd, causal=causal, num_splits=num_splits,
                                                   return_softmax_lse=True, **kw)
    ref, ref_lse, kc_s, vc_s = packed_spec(q8, kn8, vn8, k8, v8, qd, kd, vd, kw, causal, new_kv)
    assert torch.equal(kc.cpu().view(torch.uint8), kc_s.view(torch.uint8))  # FA3's bytes exactly
    assert torch.equal(vc.cpu().view(torch.uint8), vc_s.view(torch.uint8))
    rows_q = slice(0, sum(PK_LQ)) if packed_q else slice(None)
    # the kernel rounds x8 * descale once to bf16 (the 16-bit cache's precision), output bf16
    torch.testing.assert_close(out.cpu().float()[rows_q], ref.float()[rows_q], atol=2e-2, rtol=2e-2)
    got, want = lse.cpu()[..., rows_q], ref_lse[..., rows_q]
    fin = torch.isfinite(want)
    assert torch.equal(torch.isfinite(got), fin)
    # lse against the spec's unrounded values: the keys' bf16 rounding (2^-9 relative) moves the
    # scores by ~1e-3 (the batched FP8-cache GPU runs saw 4.2e-3); the simulator's fa3pk smoke case
    # checks lse tightly against the kernel's own rounding
    assert (got[fin] - want[fin]).abs().max() <= 5e-3 * (1 + want[fin].abs().max())
    if packed_q:  # packed rows of no entry
        assert (out[sum(PK_LQ):] == 0).all() and (lse[:, sum(PK_LQ):] == float("-inf")).all()


@pytest.mark.parametrize("packed_q,packed_k,page,causal,interleaved,rotary_dim,extras", [
    (False, False, None, True, False, 128, ("leftpad",)),
    (True, True, 16, False, True, 64, ("leftpad", "rotary_seqlens")),
    (False, True, 64, True, False, 32, ("batch_idx",)),
    (True, False, None, True, True, 128, ("batch_idx", "rotary_seqlens"))])
def test_fp8_rotary_new_keys_match_the_spec(packed_q, packed_k, page, causal, interleaved, rotary_dim,
                                            extras):
    """FA3's FP8 decode with rotary new keys (e4m3 q, keys and cache; FA3's (b, h_k) descales):
    the fused append rotates q8 and the e4m3 keys (fp32, rounded once to e4m3, saturating), then
    the FP8-cache decode kernel on the rotated q8 as bf16, no fallback; the caches byte for byte
    against FA3's spec (reference/fa3.py) on the CPU, out as the FP8 packed test's."""
    import warnings
    from flash3 import flash_attn_interface as fai
    from test_fa3_fp8_decode import PK_LQ, PK_PADS, fp8_packed, packed_spec, rotary_tables
    need_fp8_kernel()
    rows = 5 if "batch_idx" in extras else 4
    (q8, kn8, vn8, k8, v8, qd, kd, vd), kw = fp8_packed(packed_q, packed_k, page is not None, rows,
                                                        seed=rotary_dim, h=H, h_k=H_K, d=D, cap=CAP,
                                                        page=page or CAP, device="cuda")
    cos, sin = rotary_tables(2 * CAP, rotary_dim, seed=page or 0)
    kw.update(rotary_cos=cos.cuda(), rotary_sin=sin.cuda(), rotary_interleaved=interleaved)
    kn8.view(-1, D)[::3, 0] = torch.tensor(448.0).to(kn8.dtype)  # rotated past 448: saturates
    if "leftpad" in extras:
        kw["cache_leftpad"] = torch.tensor(PK_PADS, dtype=torch.int32, device="cuda")
    if "batch_idx" in extras:
        kw["cache_batch_idx"] = torch.tensor([2, 4, 0, 1], dtype=torch.int32, device="cuda")
    if "rotary_seqlens" in extras:
        kw["rotary_seqlens"] = torch.tensor([3, 300, 0, 17], dtype=torch.int32, device="cuda")
    kc, vc = k8.clone(), v8.clone()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fallback warning would fail the test
        out = fai.flash_attn_with_kvcache(q8, kc, vc, kn8, vn8, q_descale=qd, k_descale=kd,
                                          v_descale=vd, causal=causal, **kw)
    ref, _, kc_s, vc_s = packed_spec(q8, kn8, vn8, k8, v8, qd, kd, vd, kw, causal)
    assert torch.equal(kc.cpu().view(torch.uint8), kc_s.view(torch.uint8))  # FA3's bytes exactly
    assert torch.equal(vc.cpu().view(torch.uint8), vc_s.view(torch.uint8))
    rows_q = slice(0, sum(PK_LQ)) if packed_q else slice(None)
    # the kernel rounds x8 * descale once to bf16 (the 16-bit cache's precision), output bf16
    torch.testing.assert_close(out.cpu().float()[rows_q], ref.float()[rows_q], atol=2e-2, rtol=2e-2)


def _graph_replays_like_eager(run, inputs, first, kw):
    """run(k_cache, v_cache, kw) captured into a CUDA graph on `first` (inputs(0)): two replays on
    inputs(1), inputs(2) copied into its tensors (and shorter cache_seqlens) give an eager call's
    output and cache bytes."""
    q8, kn8, vn8, k8, v8, qd, kd, vd = first
    kc_g, vc_g = k8.clone(), v8.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up off the capture
        run(kc_g.clone(), vc_g.clone(), kw)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_g = run(kc_g, vc_g, kw)
    for step in range(2):
        (q2, kn2, vn2, k2, v2, qd2, kd2, vd2), _ = inputs(step + 1)
        lens2 = (kw["cache_seqlens"] - 3 * step).clamp(min=0).to(torch.int32)
        for dst, src in ((q8, q2), (kn8, kn2), (vn8, vn2), (kc_g, k2), (vc_g, v2), (qd, qd2), (kd, kd2),
                         (vd, vd2), (kw["cache_seqlens"], lens2)):
            dst.copy_(src)
        graph.replay()
        kc_e = k2.clone()
        want = run(kc_e, v2.clone(), dict(kw, cache_seqlens=lens2.clone()))
        torch.cuda.synchronize()
        assert torch.equal(out_g, want) and torch.equal(kc_g.view(torch.uint8), kc_e.view(torch.uint8))


def test_fp8_rotary_cuda_graph_replays_like_eager():
    """No host synchronization on FA3's FP8 rotary path (flash_attn_interface._fp8_rotary_on_kernel):
    it captures into a CUDA graph; replays on new bytes and lengths match eager calls."""
    from flash3 import flash_attn_interface as fai
    from test_fa3_fp8_decode import fp8_packed, rotary_tables
    need_fp8_kernel()

    def inputs(seed):
        return fp8_packed(True, True, True, 4, seed=seed, h=H, h_k=H_K, d=D, cap=CAP, page=16,
                          device="cuda")
    (q8, kn8, vn8, k8, v8, qd, kd, vd), kw = inputs(0)
    cos, sin = (t.cuda() for t in rotary_tables(2 * CAP, 64, seed=5))
    run = lambda kc, vc, kw: fai.flash_attn_with_kvcache(  # noqa: E731
        q8, kc, vc, kn8, vn8, rotary_cos=cos, rotary_sin=sin, q_descale=qd, k_descale=kd,
        v_descale=vd, causal=True, **kw)
    _graph_replays_like_eager(run, inputs, (q8, kn8, vn8, k8, v8, qd, kd, vd), kw)


def test_fp8_packed_append_cuda_graph_replays_like_eager():
    """No host synchronization on the FP8 packed path: it captures into a CUDA graph; replays on new
    bytes (new keys, cache) and lengths match eager calls."""
    from flash3 import flash_attn_interface as fai
    from test_fa3_fp8_decode import fp8_packed
    need_fp8_kernel()

    def inputs(seed):
        return fp8_packed(True, True, True, 4, seed=seed, h=H, h_k=H_K, d=D, cap=CAP, page=16,
                          device="cuda")
    (q8, kn8, vn8, k8, v8, qd, kd, vd), kw = inputs(0)
    run = lambda kc, vc, kw: fai.flash_attn_with_kvcache(  # noqa: E731
        q8, kc, vc, kn8, vn8, q_descale=qd, k_descale=kd, v_descale=vd, causal=True, **kw)
    _graph_replays_like_eager(run, inputs, (q8, kn8, vn8, k8, v8, qd, kd, vd), kw)
