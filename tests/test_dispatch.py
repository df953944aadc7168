"""Kernel-path dispatch decisions that need no GPU: which tensors are copied before TMA sees them."""
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
    x = torch.randn(2, 33, 4, 68)[..., :64]  # row stride 68 elements: not a multiple of 16 bytes
    out = _backend._tma_ready(x)
    assert out is not x and out.is_contiguous() and torch.equal(out, x)
    base = torch.randn(2 * 33 * 4 * 64 + 1)[1:].view(2, 33, 4, 64)  # base 4 bytes off alignment
    out = _backend._tma_ready(base)
    assert out.data_ptr() % 16 == 0 and torch.equal(out, base)
