"""FA3's attention_chunk (Llama 4's chunked local attention) in flash3's own calls: flash3.attention /
attention_varlen (and flash_attn_interface's 16-bit flash_attn_func / flash_attn_varlen_func, which
now hand it to them) against FA3's spec, flash3/reference/fa3.py, forward and autograd.

Query row t of an entry with (n_q, n_k) sits at diagonal p = t + n_k - n_q and sees only keys in
[p - p % c, p - p % c + c) (Python's floored %), intersected with the window and causal. On the CPU
these run the reference backend (flash3/reference/__init__.py with the chunk); on an sm_90 GPU the
kernels (the GPU tests at the end, skipped elsewhere).
"""
import math

import pytest
import torch

import flash3
from flash3 import flash_attn_interface as fai
from flash3 import masking
from flash3.reference.fa3 import fa3_forward
from helpers import assert_close, cu

HAS_SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def spec(q, k, v, causal, window, chunk, cu_q=None, cu_k=None):
    left, right = masking.normalize_window(causal, window)
    return fa3_forward(q, k, v, softmax_scale=q.shape[-1] ** -0.5, window_left=left,
                       window_right=right, attention_chunk=chunk, cu_seqlens_q=cu_q,
                       cu_seqlens_k=cu_k)


# (chunk, causal, window): chunks smaller than the reference's blocks and larger, with causal, a
# window, both, and alone.
MASKS = [(1, True, (-1, -1)), (3, False, (-1, -1)), (48, True, (-1, -1)), (48, False, (20, 5)),
         (160, False, (200, 150)), (160, True, (30, -1)), (1000, False, (-1, -1))]


def check_against_spec(run, run_spec, q, k, v):
    """run(q, k, v) -> (out, lse) against run_spec on copies of the same inputs: out and lse within
    2e-6, and dq, dk, dv (autograd through both) within 1e-5."""
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    out, lse = run(qg, kg, vg)
    qs, ks, vs = (x.clone().requires_grad_() for x in (q, k, v))
    ref, ref_lse = run_spec(qs, ks, vs)
    assert_close(out, ref, 2e-6)
    assert_close(lse, ref_lse, 2e-6)
    g = torch.randn_like(out)
    (out * g).sum().backward()
    (ref * g).sum().backward()
    for x, r in ((qg, qs), (kg, ks), (vg, vs)):
        assert_close(x.grad, r.grad, 1e-5)


@pytest.mark.parametrize("chunk,causal,window", MASKS)
@pytest.mark.parametrize("s_q,s_k", [(130, 130), (70, 200), (200, 70), (1, 9)])
def test_forward_and_grads_match_fa3_spec(chunk, causal, window, s_q, s_k):
    """flash3.attention with attention_chunk: out and lse as FA3's spec, and dq, dk, dv as autograd
    through the spec (fp32 both, GQA)."""
    torch.manual_seed(chunk + s_q)
    b, h, h_k, d = 2, 4, 2, 32
    q, k, v = torch.randn(b, s_q, h, d), torch.randn(b, s_k, h_k, d), torch.randn(b, s_k, h_k, d)
    check_against_spec(lambda q, k, v: flash3.attention(q, k, v, causal=causal, window_size=window,
                                                        attention_chunk=chunk, return_lse=True),
                       lambda q, k, v: spec(q, k, v, causal, window, chunk), q, k, v)


def test_varlen_matches_fa3_spec_per_sequence():
    """attention_varlen: the chunk acts per sequence (its own n_q, n_k), both signs of n_k - n_q, a
    sequence of 0 queries and one of 0 keys; forward and gradients."""
    torch.manual_seed(5)
    lq, lk = [203, 77, 150, 1, 5, 0], [331, 40, 97, 64, 0, 20]
    h, h_k, d = 4, 2, 32
    q, k, v = torch.randn(sum(lq), h, d), torch.randn(sum(lk), h_k, d), torch.randn(sum(lk), h_k, d)
    for chunk, causal, window in ((48, True, (-1, -1)), (160, False, (200, 150))):
        check_against_spec(
            lambda q, k, v: flash3.attention_varlen(q, k, v, cu(lq), cu(lk), max(lq), max(lk), causal=causal,
                                                    window_size=window, attention_chunk=chunk, return_lse=True),
            lambda q, k, v: spec(q, k, v, causal, window, chunk, cu(lq), cu(lk)), q, k, v)


def test_flash_attn_interface_runs_flash3_for_16bit():
    """flash_attn_func / flash_attn_varlen_func with attention_chunk call flash3.attention(_varlen)
    (the kernels on Hopper) for 16-bit inputs: bitwise the same here on the CPU."""
    torch.manual_seed(6)
    q, k, v = (torch.randn(2, n, 4, 32, dtype=torch.bfloat16) for n in (70, 90, 90))
    out, lse = fai.flash_attn_func(q, k, v, causal=True, attention_chunk=24, return_attn_probs=True)
    ref, ref_lse = flash3.attention(q, k, v, causal=True, attention_chunk=24, return_lse=True)
    assert torch.equal(out, ref) and torch.equal(lse, ref_lse)
    qf, kf, vf = q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1)
    args = (qf, kf, vf, cu([70, 70]), cu([90, 90]), 70, 90)
    out = fai.flash_attn_varlen_func(*args, window_size=(10, 3), attention_chunk=33)
    ref = flash3.attention_varlen(*args, window_size=(10, 3), attention_chunk=33)
    assert torch.equal(out, ref)


@pytest.mark.parametrize("chunk,exc,msg", [(-1, ValueError, "attention_chunk must be >= 0"),
                                           (2.0, TypeError, "attention_chunk must be an int"),
                                           (True, TypeError, "attention_chunk must be an int")])
def test_bad_chunk_is_refused_naming_it(chunk, exc, msg):
    q = torch.randn(1, 8, 2, 16)
    with pytest.raises(exc, match=msg):
        flash3.attention(q, q, q, attention_chunk=chunk)
    with pytest.raises(exc, match=msg):
        fai.flash_attn_func(q, q, q, attention_chunk=chunk)


def test_paths_without_chunks_refuse_it():
    """Sinks and keys from a cache have no chunked path in flash3's own API: a clear error naming
    attention_chunk (flash_attn_interface runs cache calls on FA3's spec)."""
    q = torch.randn(1, 8, 2, 16)
    with pytest.raises(NotImplementedError, match="attention_chunk .* sinks"):
        flash3.attention(q, q, q, attention_chunk=4, sinks=torch.zeros(2))
    qp = q[0]
    with pytest.raises(NotImplementedError, match="attention_chunk .* page_table/seqused_k"):
        kc = qp.view(8, 1, 2, 16)  # keys from a paged cache (seqused_k on packed keys takes it)
        flash3.attention_varlen(qp, kc, kc, cu([8]), None, 8, 0, attention_chunk=4,
                                page_table=torch.arange(8, dtype=torch.int32).view(1, 8),
                                seqused_k=torch.tensor([8], dtype=torch.int32))


def test_masking_spec_is_the_reference_mask():
    """flash3.masking's chunk (what the reference backend and the kernels' attn_logic.h implement)
    is fa3.py's _visible, p < 0 included (floored %)."""
    from flash3.reference.fa3 import _visible
    for s_q, s_k, causal, window, chunk in [(10, 4, False, (-1, -1), 3), (4, 10, True, (2, -1), 4),
                                            (33, 17, False, (5, 7), 8), (17, 33, True, (-1, -1), 48)]:
        left, right = masking.normalize_window(causal, window)
        got = masking.visible_mask(0, s_q, 0, s_k, s_q, s_k, False, left, right, chunk=chunk)
        assert torch.equal(got, _visible(s_q, s_k, left, right, chunk, "cpu"))
        counts = masking.visible_counts(s_q, s_k, False, left, right, chunk=chunk)
        assert counts.tolist() == got.sum(1).tolist()


# ----------------------------------------------------------------- the kernels (sm_90)
gpu = pytest.mark.skipif(not HAS_SM90, reason="needs a CUDA sm_90 (H100/H200) device")


def _kernels_built():
    from flash3 import _backend
    return _backend.has_chunk_kernel("fwd") and _backend.has_chunk_kernel("bwd")


@gpu
@pytest.mark.parametrize("chunk,causal,window", MASKS)
@pytest.mark.parametrize("s_q,s_k", [(203, 331), (331, 203), (1024, 1024), (1, 300)])
def test_gpu_kernels_match_the_reference(chunk, causal, window, s_q, s_k):
    """The forward and backward kernels (bf16, d 128) with a chunk against the fp32 reference on the
    same inputs: out within bf16's FlashAttention-style bound, lse -inf pattern equal, gradients
    within 4 eps of their largest element; no fallback warning (the kernels ran)."""
    if not _kernels_built():
        pytest.skip("flash3._C without attention_chunk")
    import warnings
    torch.manual_seed(chunk + s_q)
    dev, dt = "cuda", torch.bfloat16
    q = torch.randn(2, s_q, 4, 128, device=dev, dtype=dt, requires_grad=True)
    k = torch.randn(2, s_k, 2, 128, device=dev, dtype=dt, requires_grad=True)
    v = torch.randn(2, s_k, 2, 128, device=dev, dtype=dt, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a reference fallback warns
        out, lse = flash3.attention(q, k, v, causal=causal, window_size=window,
                                    attention_chunk=chunk, return_lse=True)
        g = torch.randn_like(out)
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), g)
    qc, kc, vc = (x.detach().cpu().float().requires_grad_() for x in (q, k, v))
    ref, ref_lse = spec(qc, kc, vc, causal, window, chunk)
    assert torch.equal(torch.isinf(lse.cpu()), torch.isinf(ref_lse))
    fin = torch.isfinite(ref_lse)
    assert (lse.cpu()[fin] - ref_lse[fin]).abs().max().item() <= 1e-3 * (1 + ref_lse[fin].abs().max().item())
    assert (out.cpu().float() - ref).abs().max().item() <= 2e-2
    rg = torch.autograd.grad(ref, (qc, kc, vc), g.cpu().float())
    eps = torch.finfo(dt).eps
    for x, r in zip((dq, dk, dv), rg):
        tol = 4 * eps * r.abs().max().item() + 1e-5
        assert (x.cpu().float() - r).abs().max().item() <= max(tol, 2e-2 * r.abs().max().item()), tol


@gpu
def test_gpu_varlen_kernels_match_the_reference():
    if not _kernels_built():
        pytest.skip("flash3._C without attention_chunk")
    torch.manual_seed(7)
    lq, lk = [203, 77, 150, 1, 5, 0], [331, 40, 97, 64, 0, 20]
    dev, dt = "cuda", torch.bfloat16
    q = torch.randn(sum(lq), 4, 128, device=dev, dtype=dt)
    k, v = (torch.randn(sum(lk), 2, 128, device=dev, dtype=dt) for _ in range(2))
    for chunk, causal, window in ((48, True, (-1, -1)), (160, False, (200, 150))):
        out, lse = flash3.attention_varlen(q, k, v, cu(lq).to(dev), cu(lk).to(dev), max(lq), max(lk),
                                           causal=causal, window_size=window, attention_chunk=chunk,
                                           return_lse=True)
        ref, ref_lse = spec(q.cpu().float(), k.cpu().float(), v.cpu().float(), causal, window, chunk,
                            cu(lq), cu(lk))
        assert torch.equal(torch.isinf(lse.cpu()), torch.isinf(ref_lse))
        assert (out.cpu().float() - ref).abs().max().item() <= 2e-2
        assert not math.isnan(out.float().sum().item())


def test_forward_kernels_take_a_chunk_at_every_head_dim(monkeypatch):
    """The 16-bit forward kernels take the chunk at every head dim (d 256 on a tile of its own,
    attn_logic.h fwd_chunk_tile_shape), and so does the backward: no CUDA call falls back."""
    from flash3 import _backend
    monkeypatch.setattr(_backend, "has_chunk_kernel", lambda kind: True)
    cuda = lambda d: type("Q", (), {"is_cuda": True, "shape": (2, 8, 4, d)})()  # noqa: E731
    assert _backend.kernel_chunk_reason(cuda(256), "fwd", 64) is None
    assert _backend.kernel_chunk_reason(cuda(64), "fwd", 64, 256) is None
    assert _backend.kernel_chunk_reason(cuda(192), "fwd", 64) is None
    assert _backend.kernel_chunk_reason(cuda(256), "bwd", 64) is None
    assert _backend.kernel_chunk_reason(cuda(256), "fwd", 0) is None  # no chunk: nothing to ask


def test_interface_fp8_chunk_runs_flash3_fp8(monkeypatch):
    """e4m3 flash_attn_func / flash_attn_varlen_func with attention_chunk: flash3's FP8 path (its
    kernel on CUDA; tests/test_fp8.py checks the emulation's chunk against fp64), not FA3's spec."""
    def no_spec(*a, **k):
        raise AssertionError("an FP8 chunked call went to the FA3 spec")
    monkeypatch.setattr(fai, "fa3_forward", no_spec)
    g = torch.Generator().manual_seed(3)
    q8, k8, v8 = (torch.randn(2, n, h, 64, generator=g).to(torch.float8_e4m3fn)
                  for n, h in ((40, 4), (50, 2), (50, 2)))
    ones = torch.ones(2, 2)
    out = fai.flash_attn_func(q8, k8, v8, causal=True, attention_chunk=16)
    want = flash3.attention(q8, k8, v8, causal=True, attention_chunk=16, q_descale=ones,
                            k_descale=ones, v_descale=ones)
    assert out.dtype == torch.bfloat16 and torch.equal(out, want)
    assert not torch.equal(out, flash3.attention(q8, k8, v8, causal=True, q_descale=ones,
                                                 k_descale=ones, v_descale=ones))
    lens = [40, 40]
    out = fai.flash_attn_varlen_func(q8.flatten(0, 1), k8[:, :40].flatten(0, 1), v8[:, :40].flatten(0, 1),
                                     cu(lens), cu(lens), 40, 40, causal=True, attention_chunk=16)
    want = flash3.attention(q8, k8[:, :40], v8[:, :40], causal=True, attention_chunk=16,
                            q_descale=ones, k_descale=ones, v_descale=ones)
    assert torch.equal(out, want.flatten(0, 1))


def test_fp8_kernel_takes_32_key_descale_blocks_with_a_chunk_at_d256(monkeypatch):
    """A chunked FP8 call at d 256 runs on the 128 x 32 chunk tile, so k/v descale blocks of 32
    keys are the kernel's (the host's check is the tile's, fwd.cpp); at d 256 without a chunk the
    tile is 64 keys, at d 128 128 keys (chunk or not), and 32-key (at d 128 also 64-key) blocks are
    named as the reason."""
    from flash3 import _backend
    monkeypatch.setattr(_backend, "has_extension", lambda: True)
    monkeypatch.setattr(_backend, "kernel_fp8_configs", lambda: [(256, 256)])
    monkeypatch.setattr(_backend, "has_chunk_kernel", lambda kind: True)
    monkeypatch.setattr(_backend, "_capability", lambda index: (9, 0))  # (cached per device)
    monkeypatch.setattr(_backend, "kernel_pick", lambda kind, dt, d, dv, scale, **kw: {"kernel": (d, dv)})
    cuda = lambda d: type("Q", (), {"is_cuda": True, "shape": (2, 8, 4, d), "device": "cuda"})()  # noqa: E731
    q256, q128 = cuda(256), cuda(128)
    assert _backend.fp8_kernel_reason(q256, q256, q256, 0.1, 64, 32, attention_chunk=48) is None
    assert "multiple of 64" in _backend.fp8_kernel_reason(q256, q256, q256, 0.1, 64, 32)
    assert "multiple of 128" in _backend.fp8_kernel_reason(q128, q128, q128, 0.1, 64, 32, attention_chunk=48)
    assert "multiple of 128" in _backend.fp8_kernel_reason(q128, q128, q128, 0.1, 64, 64)
    assert _backend.fp8_kernel_reason(q128, q128, q128, 0.1, 64, 128) is None
    assert _backend.fp8_kernel_reason(q256, q256, q256, 0.1, 64, 64) is None
