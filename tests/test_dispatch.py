"""Kernel-path dispatch decisions that need no GPU: which tensors are copied before TMA sees them,
which compiled kernel a head-dim pair runs on, and why a call falls back to the reference."""
import pytest
import torch

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


# A fake build: the configs kernel_configs() would report for the default kernel set.
BUILT = frozenset((dt, d, dv) for dt in (torch.bfloat16, torch.float16)
                  for d, dv in [(64, 64), (96, 96), (128, 128), (192, 192), (192, 128), (256, 256)])


@pytest.mark.parametrize("d,dv,expected", [
    (64, 64, (64, 64)), (32, 32, (64, 64)), (8, 8, (64, 64)), (40, 40, (64, 64)),
    (48, 48, (64, 64)), (80, 80, (96, 96)), (112, 112, (128, 128)), (160, 160, (192, 192)),
    (128, 64, (128, 128)),   # d_v below d: same d, the smallest d_v that fits
    (64, 128, (128, 128)),   # d_v above d: d' must be >= d, so the smallest D first, then DV
    (176, 128, (192, 128)),  # the (192, 128) kernel beats (192, 192)
    (192, 136, (192, 192)), (200, 8, (256, 256)), (256, 256, (256, 256)),
    (264, 8, None), (8, 264, None),
])
def test_pick_kernel_config_next_kernel_up(d, dv, expected):
    assert _backend.pick_kernel_config(torch.bfloat16, d, dv, BUILT) == expected
    assert _backend.pick_kernel_config(torch.float16, d, dv, BUILT) == expected


def test_pick_kernel_config_respects_dtype_and_build_subset():
    only = frozenset({(torch.bfloat16, 128, 128)})  # FLASH3_HDIMS=128 FLASH3_DTYPES=bf16
    assert _backend.pick_kernel_config(torch.bfloat16, 40, 40, only) == (128, 128)
    assert _backend.pick_kernel_config(torch.bfloat16, 160, 160, only) is None
    assert _backend.pick_kernel_config(torch.float16, 64, 64, only) is None
    assert _backend.pick_kernel_config(torch.bfloat16, 64, 64, frozenset()) is None


@pytest.mark.parametrize("d,dv", [(32, 32), (40, 40), (48, 48), (80, 80), (112, 112), (160, 160),
                                  (128, 64), (64, 128), (8, 256)])
def test_call_reason_accepts_any_multiple_of_8_up_to_256(d, dv):
    assert _backend.call_fwd_reason(torch.bfloat16, d, dv, 0.1, configs=BUILT) is None


@pytest.mark.parametrize("args,kw,fragment", [
    ((torch.float32, 64, 64, 0.1), {}, "bf16/fp16 only"),
    ((torch.bfloat16, 64, 64, 0.1), {"paged": True}, "paged"),
    ((torch.bfloat16, 64, 64, 0.0), {}, "softmax_scale > 0"),
    ((torch.bfloat16, 64, 64, -0.5), {}, "softmax_scale > 0"),
    ((torch.bfloat16, 64, 64, float("nan")), {}, "softmax_scale > 0"),
    ((torch.bfloat16, 36, 36, 0.1), {}, "multiples of 8"),
    ((torch.bfloat16, 64, 20, 0.1), {}, "multiples of 8"),
    ((torch.bfloat16, 264, 64, 0.1), {}, "no kernel compiled"),
])
def test_call_reason_rejections(args, kw, fragment):
    assert fragment in _backend.call_fwd_reason(*args, configs=BUILT, **kw)


def test_call_reason_without_a_build_has_no_kernel():
    assert "no kernel compiled" in _backend.call_fwd_reason(torch.bfloat16, 64, 64, 0.1,
                                                            configs=frozenset())


def test_kernel_fwd_reason_on_cpu_tensors():
    q = torch.randn(1, 8, 2, 64, dtype=torch.bfloat16)
    assert _backend.kernel_fwd_reason(q, q, q, 0.125) == "inputs are not CUDA tensors"
