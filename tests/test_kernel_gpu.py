"""The Hopper forward kernel against the fp64 reference (FlashAttention rule), on an sm_90 GPU.

Skipped without a CUDA sm_90 device or without the built extension. Outputs are poisoned with NaN
before every launch, so an unwritten element fails; lse is checked; repeated runs are bitwise equal.
"""
import json
import math

import pytest
import torch
from flash3.masking import normalize_window

import flash3
from flash3 import _backend
from helpers import assert_close_fa, attention_naive, attention_ref64, max_err

HAS_SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
pytestmark = pytest.mark.skipif(not HAS_SM90, reason="needs a CUDA sm_90 (H100/H200) device")


def built_kernels():
    if not hasattr(torch.ops.flash3, "kernel_info"):
        return set()
    return {tuple(x) for x in json.loads(torch.ops.flash3.kernel_info())["fwd"]}


@pytest.fixture(scope="module", autouse=True)
def require_extension():
    if HAS_SM90 and not built_kernels():
        pytest.skip("flash3._C is not built (pip install --no-build-isolation . on this machine)")


DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
HDIMS = [(64, 64), (96, 96), (128, 128), (192, 192), (192, 128), (256, 256)]
MODES = {  # name: (causal, window, softcap)
    "full": (False, (-1, -1), 0.0),
    "causal": (True, (-1, -1), 0.0),
    "window": (False, (97, 13), 0.0),
    "causal_window_softcap": (True, (64, -1), 15.0),
}
LENGTHS = [(1, 1), (113, 203), (203, 113), (1023, 1024), (1024, 1023), (4224, 4224), (1, 300)]


def need(dtype_name, d, dv):
    if (dtype_name, d, dv) not in built_kernels():
        pytest.skip(f"kernel {dtype_name} d={d} d_v={dv} not built")


def kernel_fwd(q, k, v, *, causal=False, window=(-1, -1), softcap=0.0, scale=None,
               cu_seqlens_q=None, cu_seqlens_k=None, seqused_k=None, max_q=None, max_k=None):
    """One launch of flash3::fwd_sm90 with NaN-poisoned out and lse."""
    varlen = cu_seqlens_q is not None
    dv = v.shape[-1]
    if varlen:
        out = torch.full((q.shape[0], q.shape[1], dv), float("nan"), device=q.device, dtype=q.dtype)
        lse = torch.full((q.shape[1], q.shape[0]), float("nan"), device=q.device)
    else:
        out = torch.full((*q.shape[:3], dv), float("nan"), device=q.device, dtype=q.dtype)
        lse = torch.full((q.shape[0], q.shape[2], q.shape[1]), float("nan"), device=q.device)
    torch.ops.flash3.fwd_sm90(
        q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k,
        max_q if max_q is not None else q.shape[-3], max_k if max_k is not None else k.shape[-3],
        scale if scale is not None else q.shape[-1] ** -0.5, *normalize_window(causal, window), softcap)
    return out, lse


def check(out, lse, q, k, v, **kw):
    assert not torch.isnan(out).any(), "unwritten (NaN-poisoned) output elements"
    assert not torch.isnan(lse).any(), "unwritten (NaN-poisoned) lse elements"
    ref, ref_lse = attention_ref64(q, k, v, **kw)
    naive, _ = attention_naive(q, k, v, **kw)
    assert_close_fa(out, naive, ref)
    assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse)), "lse -inf pattern"
    fin = torch.isfinite(ref_lse)
    if fin.any():
        assert max_err(lse[fin], ref_lse[fin]) <= 1e-3 * (1 + ref_lse[fin].abs().max().item())


@pytest.mark.parametrize("seqlens", LENGTHS, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("hdims", HDIMS, ids=lambda h: f"d{h[0]}_{h[1]}")
@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_feature_matrix(dtype_name, hdims, mode, seqlens):
    need(dtype_name, *hdims)
    (d, dv), (sq, sk), dtype = hdims, seqlens, DTYPES[dtype_name]
    causal, window, softcap = MODES[mode]
    # Cycle MHA / GQA / MQA across the matrix without multiplying it.
    h, hk = [(4, 4), (6, 2), (4, 1)][(d + sq + len(mode)) % 3]
    b = 2 if sq * sk < 2_000_000 else 1
    torch.manual_seed(sq * 7 + sk + d)
    q = torch.randn(b, sq, h, d, device="cuda", dtype=dtype)
    k = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype)
    v = torch.randn(b, sk, hk, dv, device="cuda", dtype=dtype)
    out, lse = kernel_fwd(q, k, v, causal=causal, window=window, softcap=softcap)
    check(out, lse, q, k, v, causal=causal, window_size=window, softcap=softcap)


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("d", [64, 128, 256])
def test_bitwise_deterministic(dtype_name, d):
    need(dtype_name, d, d)
    q, k, v = (torch.randn(2, 1029, 8, d, device="cuda", dtype=DTYPES[dtype_name]) for _ in range(3))
    o1, l1 = kernel_fwd(q, k, v, causal=True)
    o2, l2 = kernel_fwd(q, k, v, causal=True)
    assert torch.equal(o1, o2) and torch.equal(l1, l2)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
def test_varlen_matches_per_sequence(causal, d):
    need("bf16", d, d)
    lengths_q = [1, 113, 0, 203, 64, 1024]
    lengths_k = [1, 203, 7, 113, 64, 1023]
    h, hk = 6, 2
    tq, tk = sum(lengths_q), sum(lengths_k)
    q = torch.randn(tq, h, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(tk, hk, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(tk, hk, d, device="cuda", dtype=torch.bfloat16)
    cu_q = torch.tensor([0] + lengths_q, device="cuda").cumsum(0).to(torch.int32)
    cu_k = torch.tensor([0] + lengths_k, device="cuda").cumsum(0).to(torch.int32)
    out, lse = kernel_fwd(q, k, v, causal=causal, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                          max_q=max(lengths_q), max_k=max(lengths_k))
    for i in range(len(lengths_q)):
        a, e = cu_q[i].item(), cu_q[i + 1].item()
        ka, ke = cu_k[i].item(), cu_k[i + 1].item()
        if a == e:
            continue
        check(out[a:e][None], lse[:, a:e][None], q[a:e][None], k[ka:ke][None], v[ka:ke][None],
              causal=causal)


def test_kvcache_seqused_k():
    need("bf16", 128, 128)
    b, cap, h, hk, d = 3, 700, 8, 2, 128
    q = torch.randn(b, 5, h, d, device="cuda", dtype=torch.bfloat16)
    kc = torch.randn(b, cap, hk, d, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn(b, cap, hk, d, device="cuda", dtype=torch.bfloat16)
    used = torch.tensor([1, 333, 700], device="cuda", dtype=torch.int32)
    out, lse = kernel_fwd(q, kc, vc, causal=True, seqused_k=used)
    for i, n in enumerate(used.tolist()):
        check(out[i:i + 1], lse[i:i + 1], q[i:i + 1], kc[i:i + 1, :n], vc[i:i + 1, :n], causal=True)


def test_strided_inputs_from_packed_qkv():
    need("bf16", 128, 128)
    qkv = torch.randn(2, 517, 3, 8, 128, device="cuda", dtype=torch.bfloat16)
    q, k, v = qkv.unbind(2)  # non-contiguous views, last dim contiguous
    out, lse = kernel_fwd(q, k, v, causal=True)
    check(out, lse, q, k, v, causal=True)


def test_public_api_dispatches_to_kernel_without_fallback(recwarn):
    need("bf16", 128, 128)
    q, k, v = (torch.randn(2, 300, 4, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    assert _backend.kernel_fwd_reason(q, k, v, 128 ** -0.5) is None
    out, lse = flash3.attention(q, k, v, causal=True, return_lse=True)
    assert not [w for w in recwarn if "reference backend" in str(w.message)], "kernel path fell back"
    check(out, lse, q, k, v, causal=True)
    ref = flash3.attention(q.cpu(), k.cpu(), v.cpu(), causal=True)
    assert max_err(out.cpu(), ref) < 0.05


def test_empty_rows_are_zero_with_minus_inf_lse():
    need("bf16", 64, 64)
    q = torch.randn(1, 300, 2, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 100, 2, 64, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(1, 100, 2, 64, device="cuda", dtype=torch.bfloat16)
    out, lse = kernel_fwd(q, k, v, causal=True)  # rows 0..199 see no key (bottom-right)
    assert torch.equal(out[:, :200], torch.zeros_like(out[:, :200]))
    assert torch.isneginf(lse[:, :, :200]).all()
    check(out, lse, q, k, v, causal=True)
    assert math.isfinite(lse[0, 0, 250].item())


@pytest.mark.parametrize("causal", [False, True])
def test_many_tiles_dynamic_scheduler(causal):
    """More tiles than SMs: causal calls go through the atomic tile counter and the producer ->
    consumer hand-off; full calls through the static stride."""
    need("bf16", 128, 128)
    q, k, v = (torch.randn(4, 1500, 12, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out, lse = kernel_fwd(q, k, v, causal=causal)
    check(out, lse, q, k, v, causal=causal)
    o2, l2 = kernel_fwd(q, k, v, causal=causal)  # the dynamic order may differ; results may not
    assert torch.equal(out, o2) and torch.equal(lse, l2)


def test_varlen_many_sequences_dynamic_scheduler():
    need("bf16", 64, 64)
    torch.manual_seed(3)
    lengths = torch.randint(0, 700, (40,)).tolist()
    lengths[5] = 0
    h, d = 4, 64
    cu = torch.tensor([0] + lengths, device="cuda").cumsum(0).to(torch.int32)
    q = torch.randn(sum(lengths), h, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(sum(lengths), h, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(sum(lengths), h, d, device="cuda", dtype=torch.bfloat16)
    out, lse = kernel_fwd(q, k, v, causal=True, cu_seqlens_q=cu, cu_seqlens_k=cu,
                          max_q=max(lengths), max_k=max(lengths))
    for i in range(0, len(lengths), 7):
        a, e = cu[i].item(), cu[i + 1].item()
        if a < e:
            check(out[a:e][None], lse[:, a:e][None], q[a:e][None], k[a:e][None], v[a:e][None], causal=True)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d,dv", [(32, 32), (40, 40), (48, 48), (80, 80), (112, 112), (160, 160), (128, 64)])
def test_head_dims_without_their_own_kernel(d, dv, causal):
    """Run on the next compiled kernel up: TMA zero-fills the extra columns of Q/K/V, O's extra
    columns are never written (out has exactly d_v columns; NaN poison catches unwritten ones)."""
    if _backend.pick_kernel_config(torch.bfloat16, d, dv) is None:
        pytest.skip("no compiled kernel large enough in this build")
    q = torch.randn(2, 301, 4, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 233, 2, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(2, 233, 2, dv, device="cuda", dtype=torch.bfloat16)
    out, lse = kernel_fwd(q, k, v, causal=causal)
    check(out, lse, q, k, v, causal=causal)
    assert _backend.kernel_fwd_reason(q, k, v, d ** -0.5) is None  # the public API runs the kernel
    api = flash3.attention(q, k, v, causal=causal, softmax_scale=d ** -0.5)
    assert torch.equal(api, out)


@pytest.mark.parametrize("over", ["batch", "heads"])
def test_broadcast_inputs(over):
    """An expanded k/v (stride 0 over batch, or one kv head over all heads) is rejected by the op,
    which would otherwise read past the one-copy allocation, and copied by the public API."""
    need("bf16", 128, 128)
    q = torch.randn(3, 200, 8, 128, device="cuda", dtype=torch.bfloat16)
    if over == "batch":  # one copy of K/V for the 3 batch rows
        shape, expanded = (1, 250, 2, 128), (3, -1, -1, -1)
    else:  # one kv head for the 8 query heads
        shape, expanded = (3, 250, 1, 128), (-1, -1, 8, -1)
    k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16).expand(expanded) for _ in range(2))
    with pytest.raises(RuntimeError, match=r"k\.stride\(\d\) is 0 on a dimension of size \d+ \(a broad"):
        kernel_fwd(q, k, v)
    with pytest.raises(RuntimeError, match=r"v\.stride\(\d\) is 0"):
        kernel_fwd(q, k.contiguous(), v)
    assert _backend.kernel_fwd_reason(q, k, v, 128 ** -0.5) is None  # copied, not a fallback
    out = flash3.attention(q, k, v, causal=True, softmax_scale=128 ** -0.5)
    kc, vc = k.contiguous(), v.contiguous()
    expected, _ = kernel_fwd(q, kc, vc, causal=True, scale=128 ** -0.5)
    assert torch.equal(out, expected)
    ref, _ = attention_ref64(q, kc, vc, causal=True)
    naive, _ = attention_naive(q, kc, vc, causal=True)
    assert_close_fa(out, naive, ref)


def test_non_positive_scale_is_rejected_by_the_op():
    need("bf16", 64, 64)
    q, k, v = (torch.randn(1, 64, 2, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    for scale in (0.0, -0.125, float("inf"), float("nan")):
        with pytest.raises(RuntimeError, match="softmax_scale"):
            kernel_fwd(q, k, v, scale=scale)


@pytest.mark.parametrize("used", [[1, 77, 128], [129, 333, 700]])
def test_kvcache_nan_tail_is_never_read_into_the_output(used):
    """A cache from torch.empty may hold NaN past seqused_k, inside the last partial key block:
    the kernel zeroes those V rows before P.V (P is 0 there, but 0 * NaN = NaN)."""
    need("bf16", 128, 128)
    b, cap, h, hk, d = 3, 704, 8, 2, 128
    q = torch.randn(b, 4, h, d, device="cuda", dtype=torch.bfloat16)
    kc = torch.full((b, cap, hk, d), float("nan"), device="cuda", dtype=torch.bfloat16)
    vc = torch.full((b, cap, hk, d), float("nan"), device="cuda", dtype=torch.bfloat16)
    for i, n in enumerate(used):
        kc[i, :n] = torch.randn(n, hk, d, device="cuda", dtype=torch.bfloat16)
        vc[i, :n] = torch.randn(n, hk, d, device="cuda", dtype=torch.bfloat16)
    seqused = torch.tensor(used, device="cuda", dtype=torch.int32)
    assert _backend.kernel_fwd_reason(q, kc, vc, d ** -0.5) is None  # the decoding API runs the kernel
    for causal in (False, True):
        out, lse = kernel_fwd(q, kc, vc, causal=causal, seqused_k=seqused)
        assert torch.isfinite(out).all()
        for i, n in enumerate(used):
            check(out[i:i + 1], lse[i:i + 1], q[i:i + 1], kc[i:i + 1, :n], vc[i:i + 1, :n], causal=causal)
    # Through the public decoding API, appending one new token per row.
    k_new = torch.randn(b, 1, hk, d, device="cuda", dtype=torch.bfloat16)
    v_new = torch.randn(b, 1, hk, d, device="cuda", dtype=torch.bfloat16)
    step = flash3.attention_with_kvcache(q[:, :1], kc, vc, k_new, v_new, cache_seqlens=seqused, causal=True)
    assert torch.isfinite(step).all()
    for i, n in enumerate(used):
        ref, _ = attention_ref64(q[i:i + 1, :1], kc[i:i + 1, :n + 1], vc[i:i + 1, :n + 1], causal=True)
        naive, _ = attention_naive(q[i:i + 1, :1], kc[i:i + 1, :n + 1], vc[i:i + 1, :n + 1], causal=True)
        assert_close_fa(step[i:i + 1], naive, ref)



def poison(x):
    """NaN, +Inf, -Inf in turn over x (in place): what unused buffer space may hold."""
    flat = x.view(-1)
    for i, val in enumerate((float("nan"), float("inf"), float("-inf"))):
        flat[i::3] = val


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
def test_varlen_nan_tail_is_never_read_into_the_output(d, causal):
    """Packed buffers longer than cu_seqlens[-1] (unused rows of NaN/Inf) whose last sequence ends
    inside a key block: the kernel zeroes V's rows past the sequence end before P.V (P is 0 there,
    but 0 * NaN = NaN); K's are masked by replacing their scores. Out past cu_seqlens_q[-1] stays
    unwritten (the poison)."""
    need("bf16", d, d)
    lengths_q, lengths_k = [203, 0, 77, 45], [331, 40, 0, 93]
    pad_q, pad_k = 37, 61
    tq, tk = sum(lengths_q), sum(lengths_k)
    q = torch.randn(tq + pad_q, 6, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(tk + pad_k, 2, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(tk + pad_k, 2, d, device="cuda", dtype=torch.bfloat16)
    for x, n in ((q, tq), (k, tk), (v, tk)):
        poison(x[n:])
    cu_q = torch.tensor([0] + lengths_q, device="cuda").cumsum(0).to(torch.int32)
    cu_k = torch.tensor([0] + lengths_k, device="cuda").cumsum(0).to(torch.int32)
    out, lse = kernel_fwd(q, k, v, causal=causal, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                          max_q=max(lengths_q), max_k=max(lengths_k))
    assert torch.isnan(out[tq:]).all() and torch.isnan(lse[:, tq:]).all(), "wrote past cu_seqlens_q[-1]"
    for i in range(len(lengths_q)):
        a, e = cu_q[i].item(), cu_q[i + 1].item()
        ka, ke = cu_k[i].item(), cu_k[i + 1].item()
        if a < e:
            check(out[a:e][None], lse[:, a:e][None], q[a:e][None], k[ka:ke][None], v[ka:ke][None],
                  causal=causal)

def test_dynamic_scheduler_in_a_cuda_graph():
    """The tile counter is a fresh zeroed tensor per call (a memset on the call's stream), so a
    captured causal launch replays correctly, every time."""
    need("bf16", 128, 128)
    q, k, v = (torch.randn(2, 1100, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out = torch.empty_like(q)
    lse = torch.empty(2, 8, 1100, device="cuda")

    def launch():
        torch.ops.flash3.fwd_sm90(q, k, v, out, lse, None, None, None, 1100, 1100, 128 ** -0.5, -1, 0,
                                  0.0)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up off the default stream, as graph capture wants
        launch()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch()
    for _ in range(3):
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check(out, lse, q, k, v, causal=True)
