"""Validation mode (flash3/validation.py) and the no-host-sync contract of the decode paths."""

import contextlib
import inspect

import pytest
import torch

import flash3
from flash3 import _backend, ops, reference, validation


@pytest.fixture(autouse=True)
def clean_state(monkeypatch):
    monkeypatch.delenv("FLASH3_VALIDATE", raising=False)
    monkeypatch.setattr(validation, "_enabled", None)
    monkeypatch.setattr(validation, "_FORCE", None)
    monkeypatch.setattr(reference, "BLOCK_M", 16)
    monkeypatch.setattr(reference, "BLOCK_N", 32)


CPU = torch.zeros(2, dtype=torch.int32)
DEV = torch.zeros(2, dtype=torch.int32, device="meta")  # stands in for a device tensor


def test_defaults_env_and_setting(monkeypatch):
    assert validation.validation_enabled(CPU)
    assert validation.validation_enabled(DEV, None, CPU)  # any CPU tensor
    assert not validation.validation_enabled(DEV)
    assert not validation.validation_enabled()
    monkeypatch.setenv("FLASH3_VALIDATE", "1")  # read at call time
    assert validation.validation_enabled(DEV)
    validation.set_validation(False)  # explicit off beats the environment ...
    assert not validation.validation_enabled(DEV)
    assert validation.validation_enabled(CPU)  # ... but CPU tensors are still checked
    monkeypatch.setenv("FLASH3_VALIDATE", "0")
    validation.set_validation(True)
    assert validation.validation_enabled(DEV)
    validation.set_validation(None)
    assert not validation.validation_enabled(DEV)
    with pytest.raises(TypeError, match="enabled"):
        validation.set_validation(1)


def test_context_manager_restores():
    validation.set_validation(False)
    with validation.validation(True):
        assert validation.validation_enabled(DEV)
        with validation.validation(None):
            assert validation.get_validation() is None
        assert validation.get_validation() is True
    assert validation.get_validation() is False
    assert validation.validation_mode is validation.validation  # the top-level name
    with pytest.raises(RuntimeError):
        with validation.validation_mode(True):
            raise RuntimeError
    assert validation.get_validation() is False


def test_off_while_compiling_or_capturing(monkeypatch):
    validation.set_validation(True)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert not validation.validation_enabled(CPU)  # even when enabled, even for CPU tensors
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert not validation.validation_enabled(CPU)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert validation.validation_enabled(DEV)


class HostRead(AssertionError):
    pass


@contextlib.contextmanager
def no_host_reads(monkeypatch):
    """Every way Python reads a tensor's value raises HostRead inside the block."""
    def boom(name):
        def f(self, *a, **k):
            raise HostRead(f"Tensor.{name} called")
        return f
    with monkeypatch.context() as m:
        for name in ("tolist", "item", "__bool__", "__int__", "__index__", "__float__",
                     "numpy", "__len__"):
            m.setattr(torch.Tensor, name, boom(name))
        yield


@pytest.fixture
def kernel_path(monkeypatch):
    """Run the ops' CUDA-kernel branch on CPU tensors: dispatch always picks the kernel, and the
    kernel is a stub that records its arguments (reading no values)."""
    calls = []

    def fake_kernel(q, k, v, *args, **kw):
        calls.append(dict(q=q, k=k, v=v, args=args, **kw))
        d_v = v.shape[-1]
        if kw.get("cu_seqlens_q") is None:
            return (q.new_zeros(*q.shape[:-1], d_v),
                    torch.zeros(q.shape[0], q.shape[2], q.shape[1]))
        return q.new_zeros(*q.shape[:-1], d_v), torch.zeros(q.shape[1], q.shape[0])

    def fake_kvcache(*args, **kw):
        # Bound to the real signature: the ops call it exactly as they would the kernel.
        bound = inspect.signature(real_kvcache).bind(*args, **kw)
        calls.append(dict(bound.arguments))
        q, v_cache = bound.arguments["q"], bound.arguments["v_cache"]
        return (q.new_zeros(*q.shape[:-1], v_cache.shape[-1]),
                torch.zeros(q.shape[0], q.shape[2], q.shape[1]))

    real_kvcache = _backend.run_kernel_kvcache
    dispatch = lambda q, k, v, scale, run_kernel, run_reference, *more: run_kernel()  # noqa: E731
    monkeypatch.setattr(ops, "_fwd_dispatch", dispatch)
    monkeypatch.setattr(ops, "_kvcache_dispatch", dispatch)
    monkeypatch.setattr(_backend, "run_kernel_fwd", fake_kernel)
    monkeypatch.setattr(_backend, "run_kernel_kvcache", fake_kvcache)
    return calls


def kvcache_args(gen):
    b, cap, h_k, d = 3, 32, 2, 16
    q = torch.randn(b, 2, 4, d, generator=gen)
    k = torch.randn(b, 2, h_k, d, generator=gen)
    v = torch.randn(b, 2, h_k, d, generator=gen)
    kc = torch.randn(b, cap, h_k, d, generator=gen)
    vc = torch.randn(b, cap, h_k, d, generator=gen)
    seqlens = torch.tensor([0, 5, 30], dtype=torch.int32)
    ang = torch.arange(64.0)[:, None] * torch.tensor([1.0, 0.1, 0.01, 0.001])[None]
    return q, kc, vc, k, v, seqlens, ang.cos(), ang.sin()


def test_kvcache_kernel_path_reads_nothing_on_the_host(monkeypatch, kernel_path):
    q, kc, vc, k, v, seqlens, cos, sin = kvcache_args(torch.Generator().manual_seed(0))
    want_kc, want_vc = kc.clone(), vc.clone()
    reference.kvcache_write(want_kc, want_vc, *reference_rotated_k(q, k, seqlens, cos, sin), v,
                            seqlens)
    # Positive control: with validation on, the value checks read cache_seqlens -> caught.
    validation._FORCE = True
    with no_host_reads(monkeypatch), pytest.raises(HostRead):
        flash3.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=seqlens, causal=True,
                                      rotary_cos=cos, rotary_sin=sin, num_splits=0)
    validation._FORCE = False
    with no_host_reads(monkeypatch):
        out = flash3.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=seqlens, causal=True,
                                            rotary_cos=cos, rotary_sin=sin, num_splits=0)
    assert out.shape == (3, 2, 4, 16)
    (call,) = kernel_path
    assert torch.equal(call["seqused_k"], seqlens + 2)
    assert torch.equal(kc, want_kc) and torch.equal(vc, want_vc)  # rotated k appended


def test_kvcache_leftpad_kernel_path_reads_nothing_on_the_host(monkeypatch, kernel_path):
    """cache_leftpad reaches the decode kernel as int32 (b,), unread on the host (validation off);
    validation mode reads it (the positive control)."""
    q, kc, vc, k, v, seqlens, cos, sin = kvcache_args(torch.Generator().manual_seed(1))
    leftpad = torch.tensor([0, 3, 29], dtype=torch.int32)
    validation._FORCE = True
    with no_host_reads(monkeypatch), pytest.raises(HostRead):
        flash3.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=seqlens, causal=True,
                                      cache_leftpad=leftpad)
    validation._FORCE = False
    with no_host_reads(monkeypatch):
        flash3.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=seqlens, causal=True,
                                      rotary_cos=cos, rotary_sin=sin, cache_leftpad=leftpad)
    (call,) = kernel_path
    assert torch.equal(call["seqused_k"], seqlens + 2)
    assert torch.equal(call["cache_leftpad"], leftpad)


def test_fp8_paged_kvcache_kernel_path_reads_nothing_on_the_host(monkeypatch, kernel_path):
    """An FP8 paged cache takes the kernel path too: descales passed through as float32, the
    new k/v quantized into their pages, nothing read on the host."""
    gen = torch.Generator().manual_seed(4)
    b, h_k, d, ps, pages = 2, 2, 16, 4, 9
    q = torch.randn(b, 1, 4, d, generator=gen)
    k, v = torch.randn(b, 1, h_k, d, generator=gen), torch.randn(b, 1, h_k, d, generator=gen)
    kd = torch.rand(pages, h_k, generator=gen) * 0.1 + 0.01
    vd = torch.rand(pages, h_k, generator=gen) * 0.1 + 0.01
    kc = reference.quantize_fp8_cache(torch.randn(pages, ps, h_k, d, generator=gen), kd[:, None])
    vc = reference.quantize_fp8_cache(torch.randn(pages, ps, h_k, d, generator=gen), vd[:, None])
    pt = torch.tensor([[3, 0, 7], [8, 1, 2]], dtype=torch.int32)
    seqlens = torch.tensor([5, 11], dtype=torch.int32)
    want_kc, want_vc = kc.clone(), vc.clone()
    reference.kvcache_write(want_kc, want_vc, k, v, seqlens, pt, kd, vd)
    validation._FORCE = False
    with no_host_reads(monkeypatch):
        out = flash3.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=seqlens, page_table=pt,
                                            k_descale=kd, v_descale=vd)
    assert out.shape == (b, 1, 4, d)
    (call,) = kernel_path
    assert call["k_descale"].dtype == torch.float32 and torch.equal(call["k_descale"], kd)
    assert torch.equal(call["v_descale"], vd) and torch.equal(call["seqused_k"], seqlens + 1)
    assert torch.equal(kc.view(torch.uint8), want_kc.view(torch.uint8))
    assert torch.equal(vc.view(torch.uint8), want_vc.view(torch.uint8))


def reference_rotated_k(q, k, seqlens, cos, sin):
    from flash3.rotary import kvcache_rotary
    return kvcache_rotary(q, k, seqlens, cos, sin, False, True)[1:]


def test_varlen_kernel_path_reads_nothing_on_the_host(monkeypatch, kernel_path):
    q, k, v = torch.randn(7, 2, 8), torch.randn(9, 2, 8), torch.randn(9, 2, 8)
    cu_q = torch.tensor([0, 3, 7], dtype=torch.int32)
    cu_k = torch.tensor([0, 4, 9], dtype=torch.int32)
    validation._FORCE = True
    with no_host_reads(monkeypatch), pytest.raises(HostRead):
        flash3.attention_varlen(q, k, v, cu_q, cu_k, 4, 5)
    validation._FORCE = False
    with no_host_reads(monkeypatch):
        out = flash3.attention_varlen(q, k, v, cu_q, cu_k, 4, 5, causal=True)
    assert out.shape == (7, 2, 8) and len(kernel_path) == 1


def test_varlen_backward_kernel_path_reads_nothing_on_the_host(monkeypatch, kernel_path):
    """The backward kernel gets the forward's max_seqlen_q/k: nothing computed from cu_seqlens."""
    calls = []

    def fake_bwd(dout, q, k, v, *args, **kw):
        calls.append(kw)
        return q.new_zeros(q.shape), k.new_zeros(k.shape), v.new_zeros(v.shape)

    monkeypatch.setattr(ops, "_bwd_dispatch",
                        lambda q, k, v, scale, run_kernel, run_reference, alibi_slopes=None: run_kernel())
    monkeypatch.setattr(_backend, "run_kernel_bwd", fake_bwd)
    q, k, v = (torch.randn(n, 2, 8, requires_grad=True) for n in (7, 9, 9))
    cu_q = torch.tensor([0, 3, 7], dtype=torch.int32)
    cu_k = torch.tensor([0, 4, 9], dtype=torch.int32)
    validation._FORCE = False
    with no_host_reads(monkeypatch):
        out = flash3.attention_varlen(q, k, v, cu_q, cu_k, 4, 5, causal=True)
        out.backward(torch.ones_like(out))
    (call,) = calls
    assert (call["max_seqlen_q"], call["max_seqlen_k"]) == (4, 5)
    assert call["cu_seqlens_q"] is cu_q and call["cu_seqlens_k"] is cu_k


def test_cpu_values_checked_by_default_and_skipped_when_forced_off():
    q, kc, vc, k, v, seqlens, _, _ = kvcache_args(torch.Generator().manual_seed(1))
    bad = torch.tensor([0, 5, 31], dtype=torch.int32)  # 31 + 2 > 32: overflow
    kc0 = kc.clone()
    with pytest.raises(ValueError, match="cache overflow"):
        flash3.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=bad)
    assert torch.equal(kc, kc0)
    with validation.validation(False):  # set_validation(False) does not silence CPU checks
        with pytest.raises(ValueError, match="cache overflow"):
            flash3.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=bad)
    # Forced off (the device behaviour): no check; PyTorch indexing itself then rejects the slot.
    validation._FORCE = False
    with pytest.raises(IndexError):
        flash3.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=bad)


def test_page_table_values_checked():
    q = torch.randn(2, 1, 2, 8)
    kp, vp = torch.randn(6, 4, 2, 8), torch.randn(6, 4, 2, 8)
    table = torch.tensor([[0, 1], [2, 9]], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"page_table\[1, 1\] = 9"):
        flash3.attention_with_kvcache(q, kp, vp, cache_seqlens=torch.tensor([3, 6],
                                      dtype=torch.int32), page_table=table)
    # The bad page is beyond what row 1 uses: fine.
    flash3.attention_with_kvcache(q, kp, vp, cache_seqlens=torch.tensor([3, 4],
                                  dtype=torch.int32), page_table=table)


def test_varlen_values_checked_on_cpu():
    q, k, v = torch.randn(7, 2, 8), torch.randn(9, 2, 8), torch.randn(9, 2, 8)
    cu_q = torch.tensor([0, 3, 7], dtype=torch.int32)
    with pytest.raises(ValueError, match="cu_seqlens_k ends at 12"):
        flash3.attention_varlen(q, k, v, cu_q, torch.tensor([0, 4, 12], dtype=torch.int32), 4, 8)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_kernel_path_does_not_synchronize(kernel_path):
    """On a GPU: with validation at its default (off for CUDA tensors), the kvcache and varlen
    kernel branches (rotary, append, seqused) launch no synchronizing operation."""
    dev = "cuda"
    # bf16: the dtype of the fused append kernel, which then runs for real (only the attention
    # kernel is stubbed) under the sync debug mode.
    q, kc, vc, k, v, seqlens, cos, sin = (t.to(dev) for t in kvcache_args(
        torch.Generator().manual_seed(0)))
    q, kc, vc, k, v = (t.to(torch.bfloat16) for t in (q, kc, vc, k, v))
    cu = torch.tensor([0, 3, 7], dtype=torch.int32, device=dev)
    qv, kv = torch.randn(7, 2, 8, device=dev), torch.randn(7, 2, 8, device=dev)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        flash3.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=seqlens, causal=True,
                                      rotary_cos=cos, rotary_sin=sin)
        flash3.attention_varlen(qv, kv, kv, cu, cu, 4, 4, causal=True)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert len(kernel_path) == 2
