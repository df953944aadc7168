"""Kernel-path dispatch decisions that need no GPU: which tensors are copied before TMA sees them,
which compiled kernel a head-dim pair runs on, and why a call falls back to the reference."""
import json

import pytest
import torch
from helpers import cpp_driver, host_layer_sources

from flash3 import _backend


def test_tma_ready_keeps_addressable_tensors():
    x = torch.randn(2, 33, 4, 64)
    assert _backend._tma_ready(x) is x
    qkv = torch.randn(2, 33, 3, 4, 64)
    q = qkv[:, :, 0]  # a strided view with 16-byte multiple strides: no copy needed
    assert _backend._tma_ready(q) is q
    one = torch.randn(1, 33, 1, 64).as_strided((1, 33, 1, 64), (0, 64, 0, 1))  # size-1 dims: any stride
    assert _backend._tma_ready(one) is one


def test_tma_ready_copies_broadcast_tensors():
    k1 = torch.randn(1, 33, 4, 64)
    k = k1.expand(3, 33, 4, 64)  # batch stride 0: TMA would read past the one-batch allocation
    assert k.stride(0) == 0
    out = _backend._tma_ready(k)
    assert out is not k and out.is_contiguous() and torch.equal(out, k)
    heads = torch.randn(2, 33, 1, 64).expand(2, 33, 8, 64)  # MQA broadcast over heads
    out = _backend._tma_ready(heads)
    assert out.stride(2) == 64 and torch.equal(out, heads)


def test_tma_ready_copies_misaligned_tensors():
    x = torch.randn(2, 33, 4, 68, dtype=torch.bfloat16)[..., :64]  # 136-byte rows
    out = _backend._tma_ready(x)
    assert out is not x and out.is_contiguous() and torch.equal(out, x)
    base = torch.randn(2 * 33 * 4 * 64 + 1)[1:].view(2, 33, 4, 64)  # base 4 bytes off alignment
    out = _backend._tma_ready(base)
    assert out.data_ptr() % 16 == 0 and torch.equal(out, base)


def test_tma_ready_counts_bytes_not_elements():
    x = torch.randn(2, 33, 4, 68, dtype=torch.float32)[..., :64]  # fp32 row stride 272 bytes: fine
    assert _backend._tma_ready(x) is x
    y = torch.randn(2, 33, 4, 66, dtype=torch.float32)[..., :64]  # 264 bytes: not a multiple of 16
    assert _backend._tma_ready(y).is_contiguous()


def test_tma_ready_copy_is_a_new_allocation_only_when_needed():
    k1 = torch.randn(1, 40, 2, 64, dtype=torch.bfloat16)
    assert _backend._tma_ready(k1).data_ptr() == k1.data_ptr()
    k = k1.expand(4, -1, -1, -1)
    out = _backend._tma_ready(k)
    assert out.data_ptr() != k.data_ptr() and out.stride() == (40 * 2 * 64, 2 * 64, 64, 1)
    assert torch.equal(out, k)


# ----------------------------------------------------------------- the kernel pick, asked of C++
# _backend decides nothing about kernels: it asks the extension (flash3::pick_kernel, the rule of
# csrc/flash3/host/kernel_pick.h that the ops refuse by). Here the extension's answer comes from the
# host layer under g++ (tests/cpp/host_layer_driver.cpp), whose stand-in build holds fwd bf16
# (64, 64), bf16 (128, 128), fp16 (128, 128); fwd_fp8 (128, 128); bwd, decode and
# decode_fp8_cache bf16 (128, 128).


@pytest.fixture(scope="module")
def host_driver(tmp_path_factory):
    return cpp_driver("host_layer_driver.cpp", tmp_path_factory.mktemp("pick"), host_layer_sources())


@pytest.fixture
def cpp_pick(host_driver, monkeypatch):
    """_backend with an extension whose flash3::pick_kernel is the host layer's kernel_pick_json."""
    asked = []

    def ask(family, dtype, d, d_v, scale, attention_chunk=0):
        asked.append((family, dtype, d, d_v) + ((attention_chunk,) if attention_chunk else ()))
        answer = host_driver([f"pick family={family} dtype={dtype} d={d} dv={d_v} scale={scale!r} "
                              f"chunk={attention_chunk}"])[0]
        assert answer.startswith("ok "), answer
        return json.loads(answer[3:])

    monkeypatch.setattr(_backend, "has_extension", lambda: True)
    monkeypatch.setattr(_backend, "_ask_pick", ask)
    return asked


@pytest.mark.parametrize("d,dv,expected", [
    (64, 64, (64, 64)), (32, 32, (64, 64)), (8, 8, (64, 64)), (40, 40, (64, 64)),
    (80, 80, (128, 128)), (112, 112, (128, 128)),
    (128, 64, (128, 128)),  # d_v below d: same d, the smallest d_v that fits
    (64, 128, (128, 128)),  # d_v above d: d' must be >= d, so the smallest D first, then DV
    (136, 136, None), (8, 136, None),
])
def test_pick_is_the_extensions_next_kernel_up(cpp_pick, d, dv, expected):
    assert _backend.pick_kernel_config(torch.bfloat16, d, dv) == expected
    assert cpp_pick[-1] == ("fwd", "bfloat16", d, dv)  # asked, not decided here
    assert _backend.pick_kernel_config(torch.float16, d, dv) == (None if expected is None else (128, 128))


def test_pick_answers_the_kernels_head_dims(cpp_pick):
    assert _backend.kernel_pick("fwd", torch.bfloat16, 128, 128, 0.1) == {"kernel": [128, 128]}
    assert _backend.kernel_pick("fwd", torch.bfloat16, 64, 64, 0.1) == {"kernel": [64, 64]}


@pytest.mark.parametrize("args,fragment", [
    ((torch.float32, 64, 64, 0.1), "bf16/fp16 only"),
    ((torch.bfloat16, 64, 64, 0.0), "softmax_scale must be finite and > 0"),
    ((torch.bfloat16, 64, 64, -0.5), "softmax_scale must be finite and > 0"),
    ((torch.bfloat16, 64, 64, float("nan")), "softmax_scale must be finite and > 0"),
    ((torch.bfloat16, 36, 36, 0.1), "multiples of 8"),
    ((torch.bfloat16, 64, 20, 0.1), "multiples of 8"),
    ((torch.bfloat16, 264, 64, 0.1), "multiples of 8 in [8, 256]"),
    ((torch.bfloat16, 136, 136, 0.1), "no bf16 kernel for head dim (136, 136) or larger in this build"),
])
def test_call_reason_rejections(cpp_pick, args, fragment):
    assert fragment in _backend.call_fwd_reason(*args)


def test_call_bwd_reason_uses_the_backward_kernels(cpp_pick):
    assert _backend.call_bwd_reason(torch.bfloat16, 64, 64, 0.1) is None  # runs on 128
    assert cpp_pick[-1] == ("bwd", "bfloat16", 64, 64)
    assert "no fp16 backward kernel" in _backend.call_bwd_reason(torch.float16, 64, 64, 0.1)
    assert "softmax_scale" in _backend.call_bwd_reason(torch.bfloat16, 64, 64, 0.0)


@pytest.mark.parametrize("dtype,cache_dtype,fragment", [
    (torch.bfloat16, torch.float16, "differs from q's"),
    (torch.float32, torch.float8_e4m3fn, "bf16/fp16 only"),
    (torch.float16, torch.float8_e4m3fn, "no fp16 FP8-cache decode kernel")])
def test_kvcache_reason_rejections(cpp_pick, dtype, cache_dtype, fragment):
    assert fragment in _backend.call_kvcache_reason(dtype, cache_dtype, 64, 64, 0.1)


def test_kvcache_reason_fp8_cache_uses_its_own_kernel_list(cpp_pick):
    """A float8_e4m3fn cache with 16-bit q runs on the FP8-cache decode kernels, every cache layout
    alike (the page table is no argument of the pick)."""
    assert _backend.call_kvcache_reason(torch.bfloat16, torch.float8_e4m3fn, 80, 80, 0.1) is None
    assert cpp_pick[-1] == ("decode_fp8_cache", "bfloat16", 80, 80)
    assert _backend.call_kvcache_reason(torch.bfloat16, torch.bfloat16, 80, 80, 0.1) is None
    assert cpp_pick[-1] == ("decode", "bfloat16", 80, 80)


def test_fp8_pick_wants_multiples_of_16(cpp_pick):
    assert _backend.kernel_pick("fwd_fp8", torch.float8_e4m3fn, 32, 32, 0.1) == {"kernel": [128, 128]}
    assert "multiples of 16" in _backend.kernel_pick("fwd_fp8", torch.float8_e4m3fn, 24, 24, 0.1)["reason"]


def test_call_reason_without_the_extension():
    if _backend.has_extension():
        pytest.skip("the extension is built here")
    assert "not built" in _backend.call_fwd_reason(torch.bfloat16, 64, 64, 0.1)
    assert _backend.pick_kernel_config(torch.bfloat16, 64, 64) is None


def test_mla_decode_pick(cpp_pick):
    """The MLA decode kernel (the stand-in build registers bf16 (64, 512)) takes d <= 64 with
    256 < d_v <= 512 and a cache of q's dtype; other shapes are refused with the reason."""
    assert _backend.call_kvcache_reason(torch.bfloat16, torch.bfloat16, 64, 512, 0.04) is None
    assert _backend.call_kvcache_reason(torch.bfloat16, torch.bfloat16, 32, 264, 0.04) is None
    assert "which takes d <= 64" in _backend.call_kvcache_reason(torch.bfloat16, torch.bfloat16, 128, 512, 0.04)
    assert "d_v up to 512 with d <= 64" in _backend.call_kvcache_reason(torch.bfloat16, torch.bfloat16, 64, 520, 0.04)
    assert "d_v up to 512 with d <= 64" in _backend.call_kvcache_reason(torch.bfloat16, torch.float8_e4m3fn, 64,
                                                                         512, 0.04)
    assert "no fp16 MLA decode kernel" in _backend.call_kvcache_reason(torch.float16, torch.float16, 64, 512, 0.04)
    assert _backend.kernel_pick("decode", torch.bfloat16, 64, 512, 0.04) == {"kernel": [64, 512]}
    assert _backend.kernel_pick("fwd", torch.bfloat16, 64, 512, 0.04)["reason"].startswith("head dims must be")


def test_kernel_kvcache_reason_on_cpu_tensors():
    q = torch.randn(1, 1, 2, 64, dtype=torch.bfloat16)
    assert _backend.kernel_kvcache_reason(q, q, q, 0.125) == "inputs are not CUDA tensors"


def test_kernel_fwd_reason_on_cpu_tensors():
    q = torch.randn(1, 8, 2, 64, dtype=torch.bfloat16)
    assert _backend.kernel_fwd_reason(q, q, q, 0.125) == "inputs are not CUDA tensors"


# ----------------------------------------------------------------- backward kernel
def test_kernel_bwd_configs_from_kernel_info(monkeypatch):
    info = {"fwd": [["bf16", 64, 64]], "bwd": [["bf16", 128, 128], ["fp16", 192, 128], ["e4m3", 64, 64]]}
    monkeypatch.setattr(_backend, "kernel_info", lambda: info)
    assert _backend.kernel_bwd_configs.__wrapped__() == {(torch.bfloat16, 128, 128),
                                                         (torch.float16, 192, 128)}
    monkeypatch.setattr(_backend, "kernel_info", lambda: {"fwd": [["bf16", 64, 64]]})  # before bwd
    assert _backend.kernel_bwd_configs.__wrapped__() == frozenset()


def test_kernel_bwd_reason_on_cpu_tensors():
    q = torch.randn(1, 8, 2, 64, dtype=torch.bfloat16)
    assert _backend.kernel_bwd_reason(q, q, q, 0.125) == "inputs are not CUDA tensors"


def test_has_bwd_kernel_false_without_the_op():
    if not _backend.has_extension():
        assert not _backend.has_bwd_kernel()
    assert _backend.has_bwd_kernel() == (_backend.has_extension() and hasattr(torch.ops.flash3, "bwd_sm90"))


@pytest.fixture
def fake_bwd_op(monkeypatch):
    """The backward ops' kernel branch on CPU tensors, through the real run_kernel_bwd, with
    flash3::bwd_sm90 replaced by a stand-in of its schema that computes the reference into dq/dk/dv."""
    from flash3 import ops, reference
    calls = []

    def bwd_sm90(dout, q, k, v, out, lse, dlse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k,
                 max_seqlen_q, max_seqlen_k, softmax_scale, window_left, window_right,
                 softcap, deterministic):
        assert all(type(x) is int for x in (max_seqlen_q, max_seqlen_k, window_left, window_right))
        assert type(softmax_scale) is float and type(softcap) is float
        assert type(deterministic) is bool
        assert lse.dtype == torch.float32 and lse.is_contiguous()
        assert all(x.stride(-1) == 1 for x in (dout, q, k, v, out, dq, dk, dv))
        calls.append(dict(max_q=max_seqlen_q, max_k=max_seqlen_k, left=window_left,
                          right=window_right, deterministic=deterministic, dlse=dlse is not None))
        args = (softmax_scale, window_left, window_right, softcap)
        if cu_seqlens_q is None:
            grads = reference.backward(dout, q, k, v, out, lse, *args, dlse=dlse)
        else:
            grads = reference.varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                                              *args, dlse=dlse)
        for dst, src in zip((dq, dk, dv), grads):
            dst.copy_(src)

    monkeypatch.setattr(torch.ops.flash3, "bwd_sm90", bwd_sm90, raising=False)
    monkeypatch.setattr(ops, "_bwd_dispatch", lambda q, k, v, scale, run_kernel, run_reference, alibi_slopes=None: run_kernel())
    return calls


def _grads(fn, inputs, g, g_lse):
    leaves = [x.detach().clone().requires_grad_() for x in inputs]
    out, lse = fn(*leaves)
    torch.autograd.backward((out, lse), (g, g_lse))
    return [x.grad for x in leaves]


@pytest.mark.parametrize("kw", [dict(causal=True), dict(window_size=(5, 3), softcap=2.0),
                                dict(deterministic=True)])
def test_backward_kernel_branch_plumbing(fake_bwd_op, monkeypatch, kw):
    import flash3
    q = torch.randn(2, 21, 4, 16)
    k, v = torch.randn(2, 17, 2, 16), torch.randn(2, 17, 2, 8)
    g = torch.randn(2, 21, 8, 4).transpose(2, 3)  # a dout whose last dim is strided: copied
    g_lse = torch.randn(2, 4, 21)
    fn = (lambda q, k, v: flash3.attention(q, k, v, return_lse=True, **kw))
    got = _grads(fn, (q, k, v), g, g_lse)
    assert len(fake_bwd_op) == 1
    c = fake_bwd_op[0]
    assert (c["max_q"], c["max_k"], c["dlse"]) == (21, 17, True)
    assert c["deterministic"] == kw.get("deterministic", False)
    assert (c["left"], c["right"]) == ((-1, 0) if kw.get("causal") else kw.get("window_size", (-1, -1)))
    monkeypatch.undo()  # the reference branch
    want = _grads(fn, (q, k, v), g, g_lse)
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def test_varlen_backward_kernel_branch_gets_the_forward_max_seqlens(fake_bwd_op, monkeypatch):
    import flash3
    cq = torch.tensor([0, 5, 5, 19], dtype=torch.int32)
    ck = torch.tensor([0, 9, 12, 20], dtype=torch.int32)
    q, k, v = torch.randn(19, 4, 16), torch.randn(20, 2, 16), torch.randn(20, 2, 16)
    g, g_lse = torch.randn(19, 4, 16), torch.randn(4, 19)
    fn = (lambda q, k, v: flash3.attention_varlen(q, k, v, cq, ck, 14, 9, causal=True,
                                                  return_lse=True, deterministic=True))
    got = _grads(fn, (q, k, v), g, g_lse)
    (c,) = fake_bwd_op
    assert (c["max_q"], c["max_k"], c["left"], c["right"], c["deterministic"]) == (14, 9, -1, 0, True)
    monkeypatch.undo()
    want = _grads(fn, (q, k, v), g, g_lse)
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def test_mla_chunk_is_the_extensions_pick(cpp_pick, monkeypatch):
    """attention_chunk on the MLA decode kernel (d_v > 256) is asked of the extension's pick with the
    chunk; the plain decode kernels take it at every head dim (decided here, no pick)."""
    monkeypatch.setattr(_backend, "has_chunk_kernel", lambda kind: True)
    q = type("Q", (), {"is_cuda": True, "shape": (1, 1, 16, 64), "dtype": torch.bfloat16})()
    assert _backend.kernel_chunk_reason(q, "decode", 48, 512) is None
    assert cpp_pick[-1] == ("decode", "bfloat16", 64, 512, 48)
    n = len(cpp_pick)
    assert _backend.kernel_chunk_reason(q, "decode", 48, 256) is None
    assert len(cpp_pick) == n
