"""The Hopper backward kernel (flash3::bwd_sm90) against fp64 autograd of a plain attention
(FlashAttention rule: error <= 2 x that of the same-precision PyTorch backward + 2 x a no-op
rounding), on an sm_90 GPU.

Skipped without a CUDA sm_90 device or without a build that has the backward kernel. out and lse
come from the forward kernel (flash3._backend.run_kernel_fwd); dq/dk/dv are poisoned with NaN
before every launch, so an unwritten element fails. Deterministic mode is bitwise reproducible.
"""
import pytest
import torch
from flash3.masking import normalize_window

import flash3
from flash3 import _backend
from helpers import _mask, assert_close_fa

HAS_SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
pytestmark = pytest.mark.skipif(not HAS_SM90, reason="needs a CUDA sm_90 (H100/H200) device")


@pytest.fixture(scope="module", autouse=True)
def require_bwd_kernel():
    if HAS_SM90 and not _backend.has_bwd_kernel():
        pytest.skip("flash3._C has no backward kernel (flash3::bwd_sm90): build it on this machine "
                    "(pip install --no-build-isolation .)")


DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
HDIMS = [(64, 64), (96, 96), (128, 128), (192, 192), (192, 128), (256, 256)]
MODES = {  # name: (causal, window, softcap)
    "full": (False, (-1, -1), 0.0),
    "causal": (True, (-1, -1), 0.0),
    "window": (False, (64, 32), 0.0),
    "softcap": (False, (-1, -1), 30.0),
}
HEADS = [(4, 4), (8, 2), (4, 1)]  # MHA, GQA, MQA


def need(dtype_name, d, dv):
    """Skip unless both kernels this test launches (forward for out/lse, backward) run (d, dv)."""
    dtype = DTYPES[dtype_name]
    if _backend.call_bwd_reason(dtype, d, dv, 1.0) or _backend.call_fwd_reason(dtype, d, dv, 1.0):
        pytest.skip(f"no {dtype_name} forward/backward kernel for d={d} d_v={dv} in this build")


def inputs(b, sq, sk, h, hk, d, dv, dtype, seed, varlen_lengths=None):
    g = torch.Generator(device="cuda").manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=g, device="cuda").to(dtype)  # noqa: E731
    if varlen_lengths:
        (lq, lk) = varlen_lengths
        return rnd(sum(lq), h, d), rnd(sum(lk), hk, d), rnd(sum(lk), hk, dv), rnd(sum(lq), h, dv)
    return rnd(b, sq, h, d), rnd(b, sk, hk, d), rnd(b, sk, hk, dv), rnd(b, sq, h, dv)


def kernel_fwd_bwd(q, k, v, dout, *, causal=False, window=(-1, -1), softcap=0.0, dlse=None,
                   deterministic=False, cu_q=None, cu_k=None, max_q=0, max_k=0):
    """out/lse from the forward kernel, then one launch of bwd_sm90 into NaN-poisoned dq/dk/dv."""
    scale = q.shape[-1] ** -0.5
    left, right = window[0], 0 if causal else window[1]
    out, lse = _backend.run_kernel_fwd(q, k, v, scale, left, right, softcap, cu_seqlens_q=cu_q,
                                       cu_seqlens_k=cu_k, max_seqlen_q=max_q, max_seqlen_k=max_k)
    return kernel_bwd(dout, q, k, v, out, lse, dlse, causal=causal, window=window, softcap=softcap,
                      deterministic=deterministic, cu_q=cu_q, cu_k=cu_k, max_q=max_q, max_k=max_k)


def kernel_bwd(dout, q, k, v, out, lse, dlse=None, *, causal=False, window=(-1, -1), softcap=0.0,
               deterministic=False, cu_q=None, cu_k=None, max_q=0, max_k=0):
    if cu_q is None:  # batched: the lengths are the shapes
        max_q, max_k = q.shape[1], k.shape[1]
    dq, dk, dv = (torch.full_like(x, float("nan")) for x in (q, k, v))
    torch.ops.flash3.bwd_sm90(dout, q, k, v, out, lse, dlse, dq, dk, dv, cu_q, cu_k, max_q, max_k,
                              q.shape[-1] ** -0.5, *normalize_window(causal, window),
                              softcap, deterministic)
    return dq, dk, dv


def plain_grads(q, k, v, dout, dlse, dt, *, causal=False, window_size=(-1, -1), softcap=0.0):
    """Autograd of a plain attention computed in ``dt`` (fp64: the oracle; bf16/fp16: the
    same-precision PyTorch baseline, softmax in fp32). Masked scores are a finite -1e30 and P of a
    row that sees no key is zeroed, so such rows give 0 gradients (not NaN) as the kernel must."""
    leaves = [x.detach().to(dt).requires_grad_() for x in (q, k, v)]
    qq, kk, vv = leaves
    h, hk = q.shape[2], k.shape[2]
    if h != hk:
        kk, vv = kk.repeat_interleave(h // hk, dim=2), vv.repeat_interleave(h // hk, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", qq, kk) * q.shape[-1] ** -0.5
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    keep = _mask(q.shape[1], k.shape[1], causal, window_size, q.device)
    s = s.float() if dt in (torch.float16, torch.bfloat16) else s
    s = s.masked_fill(~keep, -1e30)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.softmax(s, dim=-1) * keep.any(-1, keepdim=True)
    out = torch.einsum("bhqk,bkhd->bqhd", p.to(dt), vv)
    outs, grads = [out], [dout.to(dt)]
    if dlse is not None:
        outs.append(lse)
        grads.append(dlse.to(lse.dtype))
    torch.autograd.backward(outs, grads)
    return [x.grad for x in leaves]


def check(grads, q, k, v, dout, dlse=None, **kw):
    for name, g in zip("qkv", grads):
        assert not torch.isnan(g).any(), f"d{name}: unwritten (NaN-poisoned) or non-finite elements"
    ref = plain_grads(q, k, v, dout, dlse, torch.float64, **kw)
    naive = plain_grads(q, k, v, dout, dlse, q.dtype, **kw)
    gmax = max((r.abs().max().item() for r in ref if r.numel()), default=0.0)
    for name, a, r, n in zip("qkv", grads, ref, naive):
        assert a.shape == r.shape and a.dtype == q.dtype
        assert_close_fa(a, n, r, "d" + name, gmax)


def mode_kw(mode):
    causal, window, softcap = MODES[mode]
    return dict(causal=causal, window_size=window, softcap=softcap)


def run_mode(mode):
    causal, window, softcap = MODES[mode]
    return dict(causal=causal, window=window, softcap=softcap)


# ----------------------------------------------------------------- batched
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("hdims", HDIMS, ids=lambda h: f"d{h[0]}_{h[1]}")
@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_feature_matrix(dtype_name, hdims, mode):
    """Every head dim x feature at mid lengths (partial tiles, s_q != s_k both ways), MHA / GQA /
    MQA cycled across the matrix."""
    need(dtype_name, *hdims)
    (d, dv), i = hdims, HDIMS.index(hdims) + list(MODES).index(mode) + list(DTYPES).index(dtype_name)
    h, hk = HEADS[i % 3]
    sq, sk = [(113, 203), (203, 113), (1023, 1024)][(i // 3 + i) % 3]
    q, k, v, dout = inputs(2, sq, sk, h, hk, d, dv, DTYPES[dtype_name], seed=i)
    grads = kernel_fwd_bwd(q, k, v, dout, **run_mode(mode))
    check(grads, q, k, v, dout, **mode_kw(mode))


LENGTHS = [(1, 1), (113, 113), (203, 203), (1023, 1023), (1024, 1024), (4224, 4224),
           (1, 300), (300, 1), (113, 203), (1023, 1024), (1024, 1023)]


@pytest.mark.parametrize("seqlens", LENGTHS, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("mode", ["full", "causal"])
def test_lengths_d128(mode, seqlens):
    need("bf16", 128, 128)
    sq, sk = seqlens
    b = 2 if sq * sk < 2_000_000 else 1
    q, k, v, dout = inputs(b, sq, sk, 8, 2, 128, 128, torch.bfloat16, seed=sq + 3 * sk)
    grads = kernel_fwd_bwd(q, k, v, dout, **run_mode(mode))
    check(grads, q, k, v, dout, **mode_kw(mode))


@pytest.mark.parametrize("mode", ["full", "causal", "window", "softcap"])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_dlse(d, mode):
    """A gradient flowing into lse (d lse / d s = P: it enters like the row sum D, D - dlse)."""
    need("bf16", d, d)
    q, k, v, dout = inputs(2, 203, 331, 8, 2, d, d, torch.bfloat16, seed=d)
    dlse = torch.randn(2, 8, 203, device="cuda")
    grads = kernel_fwd_bwd(q, k, v, dout, dlse=dlse, **run_mode(mode))
    check(grads, q, k, v, dout, dlse, **mode_kw(mode))


@pytest.mark.parametrize("hdims", HDIMS, ids=lambda h: f"d{h[0]}_{h[1]}")
def test_deterministic_bitwise(hdims):
    """deterministic=True: dq, dk, dv bitwise equal over two runs (GQA: dk/dv summed over the
    group too); default mode: within the rule."""
    need("bf16", *hdims)
    q, k, v, dout = inputs(2, 1029, 1029, 8, 2, *hdims, torch.bfloat16, seed=hdims[0] + hdims[1])
    scale = hdims[0] ** -0.5
    out, lse = _backend.run_kernel_fwd(q, k, v, scale, -1, 0, 0.0)
    first = kernel_bwd(dout, q, k, v, out, lse, causal=True, deterministic=True)
    second = kernel_bwd(dout, q, k, v, out, lse, causal=True, deterministic=True)
    for name, a, b in zip("qkv", first, second):
        assert torch.equal(a, b), f"d{name} differs between two deterministic runs"
    check(first, q, k, v, dout, causal=True)
    check(kernel_bwd(dout, q, k, v, out, lse, causal=True), q, k, v, dout, causal=True)


@pytest.mark.parametrize("d,dv", [(32, 32), (80, 80), (160, 160), (128, 64)])
def test_head_dims_without_their_own_kernel(d, dv):
    """Run on the next compiled kernel up (TMA zero-fills the extra columns)."""
    need("bf16", d, dv)
    q, k, v, dout = inputs(2, 301, 233, 4, 2, d, dv, torch.bfloat16, seed=d + dv)
    grads = kernel_fwd_bwd(q, k, v, dout, causal=True)
    check(grads, q, k, v, dout, causal=True)


# ----------------------------------------------------------------- varlen
VARLEN_Q = [1, 113, 0, 203, 64, 1024]
VARLEN_K = [1, 203, 7, 113, 64, 1023]


def cu(lengths):
    return torch.tensor([0] + lengths, device="cuda").cumsum(0).to(torch.int32)


@pytest.mark.parametrize("mode", ["full", "causal", "window", "softcap"])
@pytest.mark.parametrize("d", [64, 128])
def test_varlen_matches_per_sequence(d, mode):
    need("bf16", d, d)
    q, k, v, dout = inputs(0, 0, 0, 6, 2, d, d, torch.bfloat16, seed=d, varlen_lengths=(VARLEN_Q, VARLEN_K))
    cq, ck = cu(VARLEN_Q), cu(VARLEN_K)
    dlse = torch.randn(6, sum(VARLEN_Q), device="cuda") if mode == "causal" else None
    dq, dk, dv = kernel_fwd_bwd(q, k, v, dout, dlse=dlse, cu_q=cq, cu_k=ck, max_q=max(VARLEN_Q),
                                max_k=max(VARLEN_K), **run_mode(mode))
    for i in range(len(VARLEN_Q)):
        a, e, ka, ke = cq[i].item(), cq[i + 1].item(), ck[i].item(), ck[i + 1].item()
        if a == e:  # keys no query sees: zero gradients
            assert torch.equal(dk[ka:ke], torch.zeros_like(dk[ka:ke]))
            assert torch.equal(dv[ka:ke], torch.zeros_like(dv[ka:ke]))
            continue
        dl = None if dlse is None else dlse[None, :, a:e]
        check((dq[a:e][None], dk[ka:ke][None], dv[ka:ke][None]), q[a:e][None], k[ka:ke][None],
              v[ka:ke][None], dout[a:e][None], dl, **mode_kw(mode))


def test_varlen_padding_tokens_get_zero_gradients():
    """Tokens past cu_seqlens[-1] belong to no sequence: their gradients are 0 (the reference's)."""
    need("bf16", 128, 128)
    lq, lk = [100, 37], [64, 130]
    q, k, v, dout = inputs(0, 0, 0, 4, 2, 128, 128, torch.bfloat16, seed=5,
                           varlen_lengths=([*lq, 11], [*lk, 9]))
    dq, dk, dv = kernel_fwd_bwd(q, k, v, dout, causal=True, cu_q=cu(lq), cu_k=cu(lk), max_q=100,
                                max_k=130)
    for g, n in ((dq, sum(lq)), (dk, sum(lk)), (dv, sum(lk))):
        assert torch.equal(g[n:], torch.zeros_like(g[n:]))


# ----------------------------------------------------------------- one-key rows (issue 23)
def dyadic_dout(shape, seed):
    """Multiples of 1/16 in [-4, 4): every sum of them in dv is exact in fp32 and the dtype."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randint(-64, 64, shape, generator=g, device="cuda") / 16


def exact_dv(dout, sq, sk, hk, causal, window):
    """sum_i visible(i, j) dO_i in fp64 (exact here), over each kv head's query heads."""
    from flash3 import masking
    left, right = masking.normalize_window(causal, window)
    vis = masking.visible_mask(0, sq, 0, sk, sq, sk, False, left, right, device="cuda").double()
    b, _, h, d = dout.shape
    return torch.einsum("qk,bqhd->bkhd", vis, dout.double()).view(b, sk, hk, h // hk, d).sum(3)


@pytest.mark.parametrize("mode", ["full", "causal", "softcap"])
@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_one_key_rows_exact(dtype_name, mode):
    """s_k = 1: a row that sees the key has softmax 1, so dq is exactly 0, dk too (no row sees two
    keys) and dv is exactly the sum of dO (causal: only the last row sees the key)."""
    need(dtype_name, 128, 128)
    dt = DTYPES[dtype_name]
    q, k, v, _ = inputs(2, 70, 1, 4, 2, 128, 128, dt, seed=23)
    dout = dyadic_dout((2, 70, 4, 128), 23).to(dt)
    dq, dk, dv = kernel_fwd_bwd(q, k, v, dout, **run_mode(mode))
    assert torch.equal(dq, torch.zeros_like(dq)) and torch.equal(dk, torch.zeros_like(dk))
    assert torch.equal(dv, exact_dv(dout, 70, 1, 2, mode == "causal", (-1, -1)).to(dt))


@pytest.mark.parametrize("softcap", [0.0, 30.0])
def test_diagonal_window_rows_exact(softcap):
    """Window (0, 0): every row sees only its own key, across query and key blocks."""
    need("bf16", 128, 128)
    q, k, v, _ = inputs(1, 300, 300, 2, 2, 128, 128, torch.bfloat16, seed=24)
    dout = dyadic_dout((1, 300, 2, 128), 24).to(torch.bfloat16)
    dq, dk, dv = kernel_fwd_bwd(q, k, v, dout, window=(0, 0), softcap=softcap)
    assert torch.equal(dq, torch.zeros_like(dq)) and torch.equal(dk, torch.zeros_like(dk))
    assert torch.equal(dv, dout)


@pytest.mark.parametrize("mode", ["full", "causal"])
def test_varlen_one_key_sequences_exact(mode):
    """(s_q, s_k) = (1, 3), (2, 1), (5, 1), (70, 1): dq exactly 0 in the one-key sequences, their dv
    exact; the (1, 3) row by the FlashAttention rule."""
    need("bf16", 128, 128)
    lq, lk = [1, 2, 5, 70], [3, 1, 1, 1]
    q, k, v, _ = inputs(0, 0, 0, 4, 2, 128, 128, torch.bfloat16, seed=25, varlen_lengths=(lq, lk))
    dout = dyadic_dout((sum(lq), 4, 128), 25).to(torch.bfloat16)
    cq, ck = cu(lq), cu(lk)
    dq, dk, dv = kernel_fwd_bwd(q, k, v, dout, cu_q=cq, cu_k=ck, max_q=70, max_k=3, **run_mode(mode))
    check((dq[:1][None], dk[:3][None], dv[:3][None]), q[:1][None], k[:3][None], v[:3][None], dout[:1][None],
          **mode_kw(mode))
    for i in range(1, 4):
        a, e, j = cq[i].item(), cq[i + 1].item(), ck[i].item()
        assert torch.equal(dq[a:e], torch.zeros_like(dq[a:e]))
        assert torch.equal(dk[j:j + 1], torch.zeros_like(dk[j:j + 1]))
        want = exact_dv(dout[a:e][None], e - a, 1, 2, mode == "causal", (-1, -1))[0]
        assert torch.equal(dv[j:j + 1], want.to(torch.bfloat16))


def poison(x):
    """NaN, +Inf, -Inf in turn over x (in place): what unused buffer space may hold."""
    flat = x.view(-1)
    for i, val in enumerate((float("nan"), float("inf"), float("-inf"))):
        flat[i::3] = val


@pytest.mark.parametrize("mode", ["full", "causal", "softcap"])
@pytest.mark.parametrize("d", [64, 128])
def test_varlen_nan_tail_is_never_read_into_the_gradients(d, mode):
    """Packed buffers longer than cu_seqlens[-1] whose unused rows hold NaN/Inf (q, k, v, dout; out
    and lse there are whatever the forward left): the last sequence's partial query block and
    key block cover them. The kernel zeroes those Q/dO and K/V rows in shared memory, so dV = P^T dO,
    dK = dS^T Q and dQ = dS K of the real rows stay finite and right; the tail's gradients are 0."""
    need("bf16", d, d)
    lq, lk = [203, 0, 77, 45], [331, 40, 0, 93]
    nq, nk = sum(lq), sum(lk)
    q, k, v, dout = inputs(0, 0, 0, 6, 2, d, d, torch.bfloat16, seed=d + 1,
                           varlen_lengths=([*lq, 37], [*lk, 61]))
    for x, n in ((q, nq), (k, nk), (v, nk), (dout, nq)):
        poison(x[n:])
    cq, ck = cu(lq), cu(lk)
    dq, dk, dv = kernel_fwd_bwd(q, k, v, dout, cu_q=cq, cu_k=ck, max_q=max(lq), max_k=max(lk), **run_mode(mode))
    for g, n in ((dq, nq), (dk, nk), (dv, nk)):
        assert torch.equal(g[n:], torch.zeros_like(g[n:]))
    for i in range(len(lq)):
        a, e, ka, ke = cq[i].item(), cq[i + 1].item(), ck[i].item(), ck[i + 1].item()
        if a == e or ka == ke:  # nothing seen: zero gradients
            assert not dq[a:e].any() and not dk[ka:ke].any() and not dv[ka:ke].any()
            continue
        check((dq[a:e][None], dk[ka:ke][None], dv[ka:ke][None]), q[a:e][None], k[ka:ke][None],
              v[ka:ke][None], dout[a:e][None], **mode_kw(mode))

# ----------------------------------------------------------------- public API
def test_public_api_backward_runs_the_kernel(recwarn):
    need("bf16", 128, 128)
    q, k, v, dout = inputs(2, 517, 517, 8, 2, 128, 128, torch.bfloat16, seed=11)
    assert _backend.kernel_bwd_reason(q, k, v, 128 ** -0.5) is None
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out = flash3.attention(*leaves, causal=True)
    out.backward(dout)
    assert not [w for w in recwarn if "reference backend" in str(w.message)], "a path fell back"
    check([x.grad for x in leaves], q, k, v, dout, causal=True)


def test_public_api_varlen_backward_runs_the_kernel(recwarn):
    need("bf16", 64, 64)
    q, k, v, dout = inputs(0, 0, 0, 4, 4, 64, 64, torch.bfloat16, seed=12,
                           varlen_lengths=(VARLEN_Q, VARLEN_Q))
    cq = cu(VARLEN_Q)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out = flash3.attention_varlen(*leaves, cq, cq, max(VARLEN_Q), max(VARLEN_Q), causal=True,
                                  deterministic=True)
    out.backward(dout)
    assert not [w for w in recwarn if "reference backend" in str(w.message)], "a path fell back"
    for i in range(len(VARLEN_Q)):
        a, e = cq[i].item(), cq[i + 1].item()
        if a < e:
            check([x.grad[a:e][None] for x in leaves], q[a:e][None], k[a:e][None], v[a:e][None],
                  dout[a:e][None], causal=True)


# ----------------------------------------------------------------- attention sinks
# bwd_sm90 with sinks (float32 (h,)) writes d_sink into dsinks; lse must include the sink, so out/lse
# come from flash3.reference's forward with sinks (the forward kernel has none yet). d_sink: fp32 sums
# in a fixed order against the fp64 sink_grad, within DSINK_REL of the sum of the magnitudes it is
# summed from (tools/smoke/smoke.py DSINK_REL says why); dq/dk/dv against the fp64 reference backward of
# the same out/lse by the smoke matrix's rule (4 eps(dtype) x the largest reference element + 1e-5).
DSINK_REL = 2.0 ** -16


def sink_fwd(q, k, v, sinks, causal, cu_q=None, cu_k=None):
    from flash3 import reference
    left, right = -1, 0 if causal else -1
    if cu_q is None:
        return reference.forward(q, k, v, q.shape[-1] ** -0.5, left, right, 0.0, sinks=sinks)
    return reference.varlen_forward(q, k, v, cu_q, cu_k, q.shape[-1] ** -0.5, left, right, 0.0, sinks=sinks)


def kernel_bwd_sinks(dout, q, k, v, out, lse, dlse, sinks, *, causal, cu_q=None, cu_k=None, max_q=0, max_k=0,
                     deterministic=False):
    if cu_q is None:
        max_q, max_k = q.shape[1], k.shape[1]
    dq, dk, dv = (torch.full_like(x, float("nan")) for x in (q, k, v))
    ds = torch.full_like(sinks, float("nan"))
    torch.ops.flash3.bwd_sm90(dout, q, k, v, out, lse, dlse, dq, dk, dv, cu_q, cu_k, max_q, max_k,
                              q.shape[-1] ** -0.5, -1, 0 if causal else -1, 0.0, deterministic, sinks, ds)
    return dq, dk, dv, ds


def sink_expected(dout, q, k, v, out, lse, dlse, sinks, causal, cu_q=None, cu_k=None):
    """fp64 (dq, dk, dv, d_sink) of the reference on these very inputs, and d_sink's bound."""
    from flash3 import reference
    f64 = [x.double() for x in (dout, q, k, v, out, lse)]
    dl = None if dlse is None else dlse.double()
    kw = dict(dlse=dl, sinks=sinks.double())
    sc, right = q.shape[-1] ** -0.5, 0 if causal else -1
    ref = (reference.backward(*f64, sc, -1, right, 0.0, **kw) if cu_q is None
           else reference.varlen_backward(*f64, cu_q, cu_k, sc, -1, right, 0.0, **kw))
    absd = (dout.double().abs(), out.double().abs())
    neg = None if dlse is None else -dlse.double().abs()
    if cu_q is None:
        bound = -reference.sink_grad(sinks.double(), *absd, lse.double(), neg)
    else:
        bound = torch.zeros_like(ref[3])
        c = cu_q.tolist()
        for a, e in zip(c[:-1], c[1:]):
            bound -= reference.sink_grad(sinks.double(), absd[0][None, a:e], absd[1][None, a:e],
                                         lse.double()[None, :, a:e], None if neg is None else neg[None, :, a:e])
    return ref, bound


def check_sinks(got, ref, bound, dtype):
    eps = torch.finfo(dtype).eps
    for name, a, r in zip(("dq", "dk", "dv"), got[:3], ref[:3]):
        assert not torch.isnan(a).any(), f"{name}: unwritten (NaN-poisoned) or non-finite elements"
        tol = 4 * eps * (r.abs().max().item() if r.numel() else 0.0) + 1e-5
        err = (a.double() - r).abs().max().item() if r.numel() else 0.0
        assert err <= tol, f"{name}: max err {err:.3e} > tol {tol:.3e}"
    ds = got[3]
    assert ds.dtype == torch.float32 and torch.isfinite(ds).all(), "dsinks unwritten or non-finite"
    err, tol = (ds.double() - ref[3]).abs(), DSINK_REL * bound
    assert (err <= tol).all(), f"d_sink: err {err.tolist()} > tol {tol.tolist()}"


@pytest.mark.parametrize("hdims", [(64, 64), (128, 128)], ids=lambda h: f"d{h[0]}_{h[1]}")
@pytest.mark.parametrize("causal", [False, True])
def test_sinks_batched(hdims, causal):
    need("bf16", *hdims)
    q, k, v, dout = inputs(2, 203, 331, 6, 2, *hdims, torch.bfloat16, seed=31)
    sinks = torch.randn(6, device="cuda") + 4.0
    sinks[1] = -float("inf")  # no sink for head 1
    dlse = torch.randn(2, 6, 203, device="cuda")
    out, lse = sink_fwd(q, k, v, sinks, causal)
    got = kernel_bwd_sinks(dout, q, k, v, out, lse, dlse, sinks, causal=causal)
    ref, bound = sink_expected(dout, q, k, v, out, lse, dlse, sinks, causal)
    check_sinks(got, ref, bound, torch.bfloat16)
    again = kernel_bwd_sinks(dout, q, k, v, out, lse, dlse, sinks, causal=causal)
    assert torch.equal(got[3], again[3]), "d_sink must be bitwise reproducible"


def test_sinks_varlen_causal_gqa():
    """A sequence of 0 queries, one of 0 keys (its rows: P_sink = 1), one with more queries than keys."""
    need("bf16", 128, 128)
    lq, lk = [203, 0, 77, 90], [331, 40, 0, 61]
    q, k, v, dout = inputs(0, 0, 0, 6, 2, 128, 128, torch.bfloat16, seed=32, varlen_lengths=(lq, lk))
    cq, ck = cu(lq), cu(lk)
    sinks = torch.randn(6, device="cuda") + 4.0
    dlse = torch.randn(6, sum(lq), device="cuda")
    out, lse = sink_fwd(q, k, v, sinks, True, cq, ck)
    kw = dict(causal=True, cu_q=cq, cu_k=ck, max_q=max(lq), max_k=max(lk))
    got = kernel_bwd_sinks(dout, q, k, v, out, lse, dlse, sinks, **kw, deterministic=True)
    ref, bound = sink_expected(dout, q, k, v, out, lse, dlse, sinks, True, cq, ck)
    check_sinks(got, ref, bound, torch.bfloat16)
    again = kernel_bwd_sinks(dout, q, k, v, out, lse, dlse, sinks, **kw, deterministic=True)
    assert all(torch.equal(a, b) for a, b in zip(got, again)), "deterministic mode: bitwise reproducible"


def test_sinks_no_key_at_all():
    """No key anywhere (k empty): dq = 0, and only the sink has a gradient (every row's P_sink = 1)."""
    need("bf16", 64, 64)
    lq, lk = [5, 0, 70], [0, 0, 0]
    q, k, v, dout = inputs(0, 0, 0, 4, 2, 64, 64, torch.bfloat16, seed=33, varlen_lengths=(lq, lk))
    cq, ck = cu(lq), cu(lk)
    sinks = torch.randn(4, device="cuda")
    dlse = torch.randn(4, sum(lq), device="cuda")
    out, lse = sink_fwd(q, k, v, sinks, False, cq, ck)
    got = kernel_bwd_sinks(dout, q, k, v, out, lse, dlse, sinks, causal=False, cu_q=cq, cu_k=ck,
                           max_q=max(lq), max_k=0)
    ref, bound = sink_expected(dout, q, k, v, out, lse, dlse, sinks, False, cq, ck)
    assert torch.equal(got[0], torch.zeros_like(q))
    check_sinks(got, ref, bound, torch.bfloat16)


def test_sinks_are_validated():
    need("bf16", 64, 64)
    q, k, v, dout = inputs(1, 16, 16, 4, 2, 64, 64, torch.bfloat16, seed=34)
    out, lse = sink_fwd(q, k, v, torch.zeros(4, device="cuda"), False)
    bad = [torch.zeros(4, device="cuda", dtype=torch.bfloat16), torch.zeros(2, device="cuda"),
           torch.zeros(8, device="cuda")[::2], torch.zeros(4)]
    for s in bad:
        with pytest.raises(RuntimeError, match="sinks"):
            kernel_bwd_sinks(dout, q, k, v, out, lse, None, s, causal=False)


def test_public_api_sink_backward_runs_the_kernel(recwarn):
    """flash3.attention(..., sinks=): the forward falls back to the reference (no forward kernel has
    sinks yet), the backward runs bwd_sm90 with sinks (no backward fallback warning)."""
    need("bf16", 128, 128)
    q, k, v, dout = inputs(2, 130, 150, 4, 2, 128, 128, torch.bfloat16, seed=35)
    sinks = torch.randn(4, device="cuda")
    leaves = [x.clone().requires_grad_() for x in (q, k, v, sinks)]
    out, lse = flash3.attention(*leaves[:3], causal=True, sinks=leaves[3], return_lse=True)
    g_lse = torch.randn_like(lse)
    torch.autograd.backward((out, lse), (dout, g_lse))
    assert not [w for w in recwarn if "backward uses the slow reference" in str(w.message)], "bwd fell back"
    ref, bound = sink_expected(dout, q, k, v, out.detach(), lse.detach(), g_lse, sinks, True)
    check_sinks([x.grad for x in leaves], ref, bound, torch.bfloat16)
