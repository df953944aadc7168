"""Run-to-run determinism of the FP8 pipeline's host-side ops, checked on the CPU.

On CUDA, ops that add through atomics (index_add_, scatter_add_, scatter_reduce sum/mean, float
cumsum, ...; torch.use_deterministic_algorithms's list) sum in arrival order: attention_fp8_varlen's
K-smoothing mean once came from index_add_, and eager calls on an H200 differed by a bf16 ulp.
These tests record the aten ops that the CUDA path's host code runs (the kernels stubbed out) and
pin the fixed summation order of the per-sequence mean (flash3.fp8_quant._segment_sum), which is
the same on every device. tests/test_fp8_gpu.py checks two eager calls bitwise on Hopper.
"""

import itertools
import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from flash3 import _backend, _quantize, fp8, fp8_quant, hadamard


class _Ops(TorchDispatchMode):
    """Records every aten op (with its arguments) dispatched inside the context."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.calls.append((func, args, kwargs))
        return func(*args, **kwargs)


def _arg(func, args, kwargs, name, default=None):
    """The argument ``name`` of an aten call, positional or keyword."""
    for i, a in enumerate(func._schema.arguments):
        if a.name == name:
            if name in kwargs:
                return kwargs[name]
            return args[i] if i < len(args) else default
    return default


def nondeterministic_on_cuda(func, args, kwargs):
    """Why this aten call would not be run-to-run deterministic (or would sync the host) on CUDA,
    per torch.use_deterministic_algorithms's documentation; None when it is fine."""
    name = func.overloadpacket.__name__.rstrip("_")
    if name in ("index_add", "scatter_add", "index_copy", "put", "histc", "_local_scalar_dense"):
        return name
    if name == "scatter_reduce" and _arg(func, args, kwargs, "reduce") in ("sum", "mean", "prod"):
        return "scatter_reduce sum/mean/prod"
    if name == "scatter" and isinstance(_arg(func, args, kwargs, "src"), torch.Tensor):
        return "scatter with a tensor src"
    if name in ("index_put", "_index_put_impl") and _arg(func, args, kwargs, "accumulate", False):
        return "index_put accumulate=True (sort-based on CUDA: a host sync, not capturable)"
    if name == "bincount" and _arg(func, args, kwargs, "weights") is not None:
        return "bincount with weights"
    if name in ("cumsum", "cumprod") and args[0].is_floating_point():
        return "floating-point cumsum/cumprod"
    return None


def _offenders(rec):
    return sorted({f"{func}: {why}" for func, args, kwargs in rec.calls
                   if (why := nondeterministic_on_cuda(func, args, kwargs)) is not None})


def test_the_checker_catches_the_old_formulation():
    seq = torch.tensor([0, 0, 1])
    x = torch.randn(3, 2)
    with _Ops() as rec:
        x.new_zeros(2, 2).index_add_(0, seq, x)
        x.new_zeros(2, 2).scatter_reduce_(0, seq[:, None].expand(3, 2), x, "sum")
        x.new_zeros(2, 2).scatter_reduce_(0, seq[:, None].expand(3, 2), x.abs(), "amax")  # exact: fine
        x.cumsum(0)
        seq.cumsum(0)  # integer: exact
        x.sum().item()
    got = _offenders(rec)
    assert len(got) == 4, got
    for want in ("index_add", "scatter_reduce sum", "cumsum", "_local_scalar_dense"):
        assert any(want in g for g in got), (want, got)


@pytest.fixture
def cuda_branches(monkeypatch):
    """The CUDA branches of the host code on CPU tensors: the finiteness checks (host syncs the
    CUDA path skips) replaced by the no-sync descale, as x.is_cuda selects there."""
    nosync = lambda amax, name: fp8_quant._descale_from_amax_nosync(amax)  # noqa: E731
    monkeypatch.setattr(fp8_quant, "_descale_from_amax", nosync)
    monkeypatch.setattr(fp8, "_descale_from_amax", nosync)


@pytest.mark.parametrize("d", [64, 96])
@pytest.mark.parametrize("smooth_k", [True, False])
def test_varlen_pipeline_is_deterministic_and_sync_free(cuda_branches, monkeypatch, d, smooth_k):
    """attention_fp8_varlen's device ops before the kernel (the rotation, K smoothing, amax,
    quantization of q, k, v, the lse correction) use no op that is nondeterministic on CUDA and
    read nothing back to the host."""
    lens_q, lens_k = [100, 0, 1, 257], [300, 7, 64, 257]
    cq = torch.tensor([0] + list(itertools.accumulate(lens_q)), dtype=torch.int32)
    ck = torch.tensor([0] + list(itertools.accumulate(lens_k)), dtype=torch.int32)
    g = torch.Generator().manual_seed(9)
    q = torch.randn(int(cq[-1]), 4, d, generator=g).bfloat16()
    k, v = (torch.randn(int(ck[-1]), 2, d, generator=g).bfloat16() for _ in range(2))

    def kernel(q8, k8, v8, cu_q, cu_k, mq, mk, **kw):  # stands in for the FP8 kernel
        return torch.zeros(q8.shape, dtype=torch.bfloat16), torch.zeros(q8.shape[1], q8.shape[0])

    monkeypatch.setattr(fp8, "attention_varlen", kernel)
    with _Ops() as rec:
        fp8.attention_fp8_varlen(q, k, v, cq, ck, max(lens_q), max(lens_k), causal=True,
                                 smooth_k=smooth_k, return_lse=True)
    assert _offenders(rec) == []
    if smooth_k:
        assert any(f.overloadpacket.__name__ == "segment_reduce" for f, _, _ in rec.calls)


@pytest.mark.parametrize("d", [64, 96])
def test_batched_cuda_pipeline_is_deterministic_and_sync_free(monkeypatch, d):
    """attention_fp8's CUDA path (_attention_fp8_cuda) around its two kernels: the K mean, its
    rotation, v's channel amax, the lse correction."""
    monkeypatch.setattr(_quantize, "available", lambda: True)
    monkeypatch.setattr(_backend, "fp8_kernel_reason", lambda *a, **kw: None)

    def quantize(x, *, block_size=128, layout="rows", **kw):
        b, s, h, dd = x.shape
        nb = 1 if block_size is None else -(-s // block_size)
        x8 = torch.zeros(x.shape if layout == "rows" else (b, h, dd, -(-s // 16) * 16), dtype=fp8.FP8_DTYPE)
        return x8, torch.ones(b, h, nb) if block_size is not None else torch.ones(b, h)

    def kernel(q8, k8, v8, *a, **kw):
        b, s, h, dd = q8.shape
        return torch.zeros(b, s, h, dd, dtype=torch.bfloat16), torch.zeros(b, h, s)

    monkeypatch.setattr(_quantize, "quantize_fp8_cuda", quantize)
    monkeypatch.setattr(_backend, "run_kernel_fwd_fp8", kernel)
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 200, h, d, generator=g).bfloat16() for h in (4, 2, 2))
    with _Ops() as rec:
        res = fp8._attention_fp8_cuda(q, k, v, scale=d ** -0.5, left=-1, right=0, softcap=0.0, hadamard=True,
                                      br=64, bc=128, smooth_k=True, v_scale="block+channel", seed=0,
                                      tile_n=None)
    assert res is not None
    assert _offenders(rec) == []


def _tree_sum_reference(rows, chunk):
    """The order _segment_sum defines, written out: sums of `chunk` consecutive rows (in order,
    from 0), then of `chunk` consecutive such sums, ..., until one is left."""
    if not rows:
        return None
    while True:
        sums = []
        for a in range(0, len(rows), chunk):
            acc = torch.zeros_like(rows[0])
            for r in rows[a:a + chunk]:
                acc = acc + r
            sums.append(acc)
        rows = sums
        if len(rows) == 1:
            return rows[0]


@pytest.mark.parametrize("lens,pre", [([100, 0, 1, 257], 0), ([64, 65, 1, 0, 4099], 7), ([3] * 40, 2),
                                      ([5000], 0), ([0, 0], 3)])
def test_segment_sum_order(lens, pre):
    """_segment_sum is the written-out chunk tree, bitwise, wherever the segments start; close to
    the fp64 sum; a segment's sum does not depend on its neighbours."""
    g = torch.Generator().manual_seed(len(lens) + pre)
    total = pre + sum(lens) + 5  # rows before the first and after the last segment
    x = torch.randn(total, 2, 8, generator=g) * 3 + 1
    off = torch.tensor([pre] + [pre + c for c in itertools.accumulate(lens)], dtype=torch.int64)
    got = fp8_quant._segment_sum(x, off)
    assert got.shape == (len(lens), 2, 8)
    for i in range(len(lens)):
        rows = list(x[off[i]:off[i + 1]])
        want = _tree_sum_reference(rows, fp8_quant.SEGMENT_SUM_CHUNK)
        if want is None:
            assert not got[i].any()
            continue
        assert torch.equal(got[i], want), i
        exact = x[off[i]:off[i + 1]].double().sum(0)
        assert (got[i].double() - exact).abs().max() <= 1e-6 * len(rows) * x.abs().max()
        alone = fp8_quant._segment_sum(x[off[i]:off[i + 1]].clone(), torch.tensor([0, lens[i]]))
        assert torch.equal(alone[0], got[i]), i


def test_segment_sum_edges():
    x = torch.randn(10, 3)
    assert fp8_quant._segment_sum(x, torch.tensor([4])).shape == (0, 3)
    assert not fp8_quant._segment_sum(x[:0], torch.tensor([0, 0, 0])).any()
    assert torch.equal(fp8_quant._segment_sum(x, torch.tensor([0, 10]))[0], _tree_sum_reference(list(x), 64))


def test_varlen_k_mean_does_not_depend_on_the_packing():
    """A sequence's K-smoothing mean (and so its e4m3 keys) is the same bits wherever it is packed
    and whatever its neighbours."""
    g = torch.Generator().manual_seed(4)
    seq = torch.randn(300, 2, 64, generator=g) + 2
    other = torch.randn(1000, 2, 64, generator=g)
    alone = fp8.quantize_fp8_varlen(seq, torch.tensor([0, 300], dtype=torch.int32), 300, smooth=True,
                                    hadamard=True)
    packed = fp8.quantize_fp8_varlen(torch.cat([other[:77], seq, other[77:]]),
                                     torch.tensor([0, 77, 377, 1077], dtype=torch.int32), 700,
                                     smooth=True, hadamard=True)
    assert torch.equal(alone[2][0], packed[2][1])
    assert torch.equal(alone[0].view(torch.uint8), packed[0][77:377].view(torch.uint8))
    assert torch.equal(alone[1][0], packed[1][1, :, :alone[1].shape[-1]])


def test_varlen_quantize_is_repeatable():
    g = torch.Generator().manual_seed(6)
    x = torch.randn(1500, 2, 96, generator=g).bfloat16()
    cu = torch.tensor([0, 100, 100, 101, 1400], dtype=torch.int32)
    a = fp8.quantize_fp8_varlen(x, cu, 1299, block_size=128, hadamard=True, smooth=True)
    b = fp8.quantize_fp8_varlen(x, cu, 1299, block_size=128, hadamard=True, smooth=True)
    assert all(torch.equal(s.view(torch.uint8) if s.dtype == fp8.FP8_DTYPE else s,
                           t.view(torch.uint8) if t.dtype == fp8.FP8_DTYPE else t) for s, t in zip(a, b))


@pytest.mark.parametrize("d", [40, 96, 160, 224])
def test_hartley_mix_is_elementwise_in_a_fixed_order(d):
    """The m-block Hartley mix (m > 1) is b-ordered fp32 products and sums (no GEMM: its order and
    TF32 use would be the BLAS's choice), written out here."""
    m, p = hadamard.block_structure(d)
    assert 1 < m <= 8
    g = torch.Generator().manual_seed(d)
    x = torch.randn(5, 3, d, generator=g)
    with _Ops() as rec:
        y = hadamard.hadamard_transform(x, seed=2)
    assert not {f.overloadpacket.__name__ for f, _, _ in rec.calls} & {"mm", "bmm", "matmul", "addmm", "baddbmm"}
    s = hadamard.random_signs(d, 2)
    z = hadamard._fwht_((x * s).reshape(5, 3, m, p)) * (1.0 / math.sqrt(p))
    c = hadamard._hartley_cpu(m).float()
    want = torch.stack([sum((c[a, b] * z[..., b, :] for b in range(1, m)), c[a, 0] * z[..., 0, :])
                        for a in range(m)], dim=-2).reshape(5, 3, d)
    assert torch.equal(y, want)
