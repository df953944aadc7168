"""The FP8 forward kernel (flash3::fwd_fp8_sm90) against its specification, the CPU emulation
flash3.fp8.fp8_attention_reference (same algorithm: a tight bound), and against fp64 on the FA3
paper's outlier distribution. Skipped without an sm_90 device and a built extension."""

import math

import pytest
import torch
from flash3.masking import normalize_window

import flash3
from flash3 import _backend, fp8

HAS_SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
pytestmark = pytest.mark.skipif(not HAS_SM90, reason="needs a CUDA sm_90 (H100/H200) device")


def _needs_kernel(d):
    if not _backend.kernel_fp8_configs():
        pytest.skip("flash3._C without the FP8 kernel (pip install --no-build-isolation .)")
    if not any(c[0] >= d for c in _backend.kernel_fp8_configs()):
        pytest.skip(f"no FP8 kernel for d={d} in this build")


def _inputs(b, s_q, s_k, h, h_k, d, outliers=False, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)

    def rnd(*shape):
        x = torch.randn(*shape, generator=g, device="cuda")
        if outliers:  # FA3 paper, Table 3: N(0,1) + N(0,100) * Bernoulli(0.001)
            x = x + 10 * torch.randn(*shape, generator=g, device="cuda") * (
                torch.rand(*shape, generator=g, device="cuda") < 0.001)
        return x.to(torch.bfloat16)
    return rnd(b, s_q, h, d), rnd(b, s_k, h_k, d), rnd(b, s_k, h_k, d)


def _quantized(q, k, v, bm=64, bn=128):
    q8, qd = fp8.quantize_fp8(q, block_size=bm)
    k8, kd = fp8.quantize_fp8(k, block_size=bn)
    v8, vd, vcd = fp8.quantize_v_fp8(v, block_size=bn)
    return q8, k8, v8, qd, kd, vd, vcd


def _launch(q8, k8, v8, qd, kd, vd, vcd, scale, causal, left, right, softcap, bm=64, bn=128):
    """One launch with NaN-poisoned out and lse."""
    b, s_q, h, _ = q8.shape
    out = torch.full((b, s_q, h, v8.shape[-1]), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.full((b, h, s_q), float("nan"), dtype=torch.float32, device="cuda")
    torch.ops.flash3.fwd_fp8_sm90(q8, k8, fp8.pack_v_fp8(v8), out, lse, qd, kd, vd, vcd, bm, bn, scale,
                                  *normalize_window(causal, (left, right)), softcap)
    return out, lse


def _rms(x):
    return x.double().pow(2).mean().sqrt().item()


CASES = [  # (s_q, s_k, h, h_k, causal, window, softcap)
    (113, 113, 2, 2, False, (-1, -1), 0.0),
    (203, 1023, 4, 2, True, (-1, 0), 0.0),
    (1024, 1024, 4, 1, False, (100, 30), 0.0),
    (1, 4224, 2, 2, False, (-1, -1), 30.0),
    (1023, 203, 2, 2, True, (-1, 0), 0.0),
    (130, 100, 2, 2, False, (-1, -1), 0.0),  # s_k % 16 = 4: real tokens in Vt's last group of 16
]


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"sq{c[0]}_sk{c[1]}_h{c[2]}x{c[3]}_c{int(c[4])}_w{c[5][0]}_cap{c[6]:g}")
def test_fp8_kernel_matches_emulation(d, case):
    _needs_kernel(d)
    s_q, s_k, h, h_k, causal, (left, right), softcap = case
    q, k, v = _inputs(2, s_q, s_k, h, h_k, d)
    q8, k8, v8, qd, kd, vd, vcd = _quantized(q, k, v)
    scale = d ** -0.5
    out, lse = _launch(q8, k8, v8, qd, kd, vd, vcd, scale, causal, left, right, softcap)
    ref, ref_lse = fp8.fp8_attention_reference(
        q8, k8, v8, qd, kd, vd, softmax_scale=scale, causal=causal, window_left=left,
        window_right=right, softcap=softcap, block_size=(64, 128), v_channel_descale=vcd)
    exact, _ = fp8.attention_fp64_reference(q, k, v, causal=causal, softmax_scale=scale,
                                            window_size=(left, 0 if causal else right), softcap=softcap)
    assert not out.isnan().any() and not lse.isnan().any(), "poisoned output left unwritten"
    # The same algorithm: the kernel is much closer to the emulation than either is to fp64
    # (differences: fp32 evaluation order, P's e4m3 rounding at ties, bf16 output rounding).
    err_spec = _rms(ref.double() - exact)
    diff = _rms(out.double() - ref.double())
    assert diff <= 0.25 * err_spec + 2 ** -9 * _rms(exact), (diff, err_spec)
    fin = torch.isfinite(ref_lse)
    assert torch.equal(fin, torch.isfinite(lse))
    assert (lse[fin] - ref_lse[fin]).abs().max().item() < 1e-3


@pytest.mark.parametrize("d", [64, 128, 256])
def test_fp8_kernel_outliers_vs_fp64(d):
    """The paper's Table 3 distribution: block + Hadamard FP8 through flash3.attention_fp8 (quantize
    kernel then attention kernel) is at least as accurate as the emulation of the same algorithm."""
    _needs_kernel(d)
    q, k, v = _inputs(1, 2048, 2048, 4, 4, d, outliers=True)
    exact, _ = fp8.attention_fp64_reference(q, k, v)
    out = flash3.attention_fp8(q, k, v)
    emu = flash3.attention_fp8(q.cpu(), k.cpu(), v.cpu())
    err, err_emu = _rms(out.double() - exact), _rms(emu.double() - exact.cpu())
    assert err <= 1.1 * err_emu + 1e-4, (err, err_emu)


def test_fp8_kernel_no_host_sync_graph():
    """attention(q8, k8, v8, descales) captures in a CUDA graph and replays to the eager result."""
    _needs_kernel(128)
    q, k, v = _inputs(1, 256, 256, 2, 2, 128)
    q8, k8, v8, qd, kd, vd, vcd = _quantized(q, k, v)
    args = dict(q_descale=qd, k_descale=kd, v_descale=vd, v_channel_descale=vcd, causal=True,
                fp8_block_size=(64, 128))
    eager = flash3.attention(q8, k8, v8, **args)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        flash3.attention(q8, k8, v8, **args)  # warm-up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = flash3.attention(q8, k8, v8, **args)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(static, eager)


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal,window,softcap", [(False, (-1, -1), 0.0), (True, (-1, -1), 0.0),
                                                   (False, (100, 20), 15.0)])
def test_fp8_kernel_varlen_matches_emulation(d, causal, window, softcap):
    """Packed sequences (empty ones, s_k % 16 != 0, q longer than k) against the emulation of each
    sequence, with NaN-poisoned out/lse and per-sequence block descales."""
    _needs_kernel(d)
    lens_q, lens_k = [113, 0, 1, 300, 64, 17], [203, 5, 130, 1023, 0, 17]
    b, h, h_k = len(lens_q), 4, 2
    cq = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=torch.int32, device="cuda")
    ck = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), dtype=torch.int32, device="cuda")
    mq, mk = max(lens_q), max(lens_k)
    q, k, v = (x[0] for x in _inputs(1, int(cq[-1]), int(ck[-1]), h, h_k, d, seed=5))
    q8, k8, v8 = (x.float().clamp(-448, 448).to(torch.float8_e4m3fn) for x in (q, k, v))
    g = torch.Generator(device="cuda").manual_seed(1)
    qd = torch.rand(b, h, -(-mq // 64), generator=g, device="cuda") + 0.5
    kd = torch.rand(b, h_k, -(-mk // 128), generator=g, device="cuda") + 0.5
    vd = torch.rand(b, h_k, -(-mk // 128), generator=g, device="cuda") + 0.5
    vcd = torch.rand(b, h_k, d, generator=g, device="cuda") + 0.5
    left, right = window if not causal else (-1, 0)
    scale = d ** -0.5
    out = torch.full((q.shape[0], h, d), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.full((h, q.shape[0]), float("nan"), dtype=torch.float32, device="cuda")
    torch.ops.flash3.fwd_fp8_sm90(q8, k8, fp8.pack_v_fp8_varlen(v8, ck), out, lse, qd, kd, vd, vcd, 64, 128,
                                  scale, *normalize_window(causal, (left, right)), softcap, cq, ck, mq, mk)
    ref, ref_lse = fp8.fp8_attention_varlen_reference(
        q8.cpu(), k8.cpu(), v8.cpu(), cq.cpu(), ck.cpu(), qd.cpu(), kd.cpu(), vd.cpu(), max_seqlen_q=mq,
        max_seqlen_k=mk, v_channel_descale=vcd.cpu(), softmax_scale=scale, causal=causal, window_left=left,
        window_right=right, softcap=softcap, block_size=(64, 128))
    assert not out.isnan().any() and not lse.isnan().any(), "poisoned output left unwritten"
    diff = _rms(out.cpu().double() - ref.double())
    assert diff <= 2 ** -7 * _rms(ref) + 1e-6, (diff, _rms(ref))
    fin = torch.isfinite(ref_lse)
    assert torch.equal(fin, torch.isfinite(lse.cpu()))
    assert (lse.cpu()[fin] - ref_lse[fin]).abs().max().item() < 1e-3
    # the public entry point takes the same path
    pub = flash3.attention_varlen(q8, k8, v8, cq, ck, mq, mk, causal=causal, window_size=window,
                                  softcap=softcap, q_descale=qd, k_descale=kd, v_descale=vd,
                                  v_channel_descale=vcd, fp8_block_size=(64, 128))
    assert torch.equal(pub, out)


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("chunk", [0, 48])
def test_fp8_kernel_seqused_and_chunk_match_emulation(d, chunk):
    """FA3's seqused_q/seqused_k and attention_chunk through attention_varlen on e4m3 inputs (the
    kernel; d 256 with a chunk on its 32-key tile) against the emulation on the CPU: the rows past
    seqused_q exactly 0 / -inf, NaN in every unused key and value never read."""
    _needs_kernel(d)
    lens_q, lens_k = [113, 0, 70, 300, 9], [203, 5, 130, 1023, 0]
    used_q, used_k = [100, 0, 80, 3, 9], [150, 2, 130, 1000, 4]
    b, h, h_k = len(lens_q), 4, 2
    cu = lambda n: torch.tensor([0] + list(torch.tensor(n).cumsum(0)), dtype=torch.int32)  # noqa: E731
    cq, ck = cu(lens_q), cu(lens_k)
    q, k, v = (x[0] for x in _inputs(1, int(cq[-1]), int(ck[-1]), h, h_k, d, seed=7))
    q8, k8, v8 = (x.float().clamp(-448, 448).to(torch.float8_e4m3fn).cpu() for x in (q, k, v))
    for i in range(b):  # NaN in the keys and values past seqused_k
        k8[int(ck[i]) + min(used_k[i], lens_k[i]):int(ck[i + 1])] = float("nan")
        v8[int(ck[i]) + min(used_k[i], lens_k[i]):int(ck[i + 1])] = float("nan")
    g = torch.Generator().manual_seed(2)
    mq, mk = max(lens_q), max(lens_k)
    qd = torch.rand(b, h, -(-mq // 64), generator=g) + 0.5
    kd, vd = (torch.rand(b, h_k, -(-mk // 128), generator=g) + 0.5 for _ in range(2))
    i32 = lambda x: torch.tensor(x, dtype=torch.int32)  # noqa: E731
    args = dict(causal=True, attention_chunk=chunk, q_descale=qd, k_descale=kd, v_descale=vd,
                fp8_block_size=(64, 128), seqused_q=i32(used_q), seqused_k=i32(used_k), return_lse=True)
    cuda = {n: x.cuda() if isinstance(x, torch.Tensor) else x for n, x in args.items()}
    out, lse = flash3.attention_varlen(q8.cuda(), k8.cuda(), v8.cuda(), cq.cuda(), ck.cuda(), mq, mk, **cuda)
    ref, ref_lse = flash3.attention_varlen(q8, k8, v8, cq, ck, mq, mk, **args)  # the emulation
    out, lse = out.cpu(), lse.cpu()
    assert not out.isnan().any() and not lse.isnan().any()
    diff = _rms(out.double() - ref.double())
    assert diff <= 2 ** -7 * _rms(ref) + 1e-6, (diff, _rms(ref))
    fin = torch.isfinite(ref_lse)
    assert torch.equal(fin, torch.isfinite(lse))
    assert (lse[fin] - ref_lse[fin]).abs().max().item() < 1e-3
    past = torch.ones(out.shape[0], dtype=torch.bool)
    for i in range(b):
        past[int(cq[i]):int(cq[i]) + min(used_q[i], lens_q[i])] = False
    assert not out[past].any() and bool((lse[:, past] == -math.inf).all())
    # the op itself into NaN-poisoned out/lse: every row written (rows past seqused_q too), the same bits
    dev = {n: x.cuda() for n, x in dict(q=q8, k=k8, cq=cq, ck=ck, qd=qd, kd=kd, vd=vd).items()}
    used = dict(seqused_q=i32(used_q).cuda(), seqused_k=i32(used_k).cuda())
    out2 = torch.full((q8.shape[0], h, d), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse2 = torch.full((h, q8.shape[0]), float("nan"), dtype=torch.float32, device="cuda")
    torch.ops.flash3.fwd_fp8_sm90(dev["q"], dev["k"], fp8.pack_v_fp8_varlen(v8.cuda(), dev["ck"], used["seqused_k"]),
                                  out2, lse2, dev["qd"], dev["kd"], dev["vd"], None, 64, 128, d ** -0.5, -1, 0, 0.0,
                                  dev["cq"], dev["ck"], mq, mk, **used, attention_chunk=chunk)
    assert torch.equal(out2.cpu(), out) and torch.equal(lse2.cpu(), lse)


def test_attention_fp8_varlen_end_to_end_and_graph():
    """attention_fp8_varlen on CUDA (device quantization, packing, the kernel) against the same call
    on the CPU (emulation), bitwise the same in repeated eager calls, then captured in a CUDA graph
    and replayed to the eager result."""
    _needs_kernel(128)
    lens_q, lens_k = [100, 0, 1, 257], [300, 7, 64, 257]
    cq = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=torch.int32, device="cuda")
    ck = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), dtype=torch.int32, device="cuda")
    q, k, v = (x[0] for x in _inputs(1, int(cq[-1]), int(ck[-1]), 4, 2, 128, seed=9))
    args = (cq, ck, max(lens_q), max(lens_k))
    out = fp8.attention_fp8_varlen(q, k, v, *args, causal=True)
    # run-to-run deterministic (the K-smoothing mean once came from index_add_'s float atomics:
    # eager calls on an H200 differed by a bf16 ulp)
    for _ in range(3):
        again = fp8.attention_fp8_varlen(q, k, v, *args, causal=True)
        assert torch.equal(again, out), (again.float() - out.float()).abs().max().item()
    emu = fp8.attention_fp8_varlen(q.cpu(), k.cpu(), v.cpu(), *(a.cpu() if torch.is_tensor(a) else a for a in args),
                                   causal=True)
    # Not bit-equal: the kernel and the emulation evaluate in another fp32 order (the quantized
    # operands are the CPU's bits: test_varlen_k_mean_bitwise_as_on_the_cpu_and_capturable); a
    # wrong sequence offset or descale would be O(1).
    assert _rms(out.cpu().double() - emu.double()) <= 2 ** -5 * _rms(emu), (_rms(out.cpu().double() - emu.double()), _rms(emu))
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        fp8.attention_fp8_varlen(q, k, v, *args, causal=True)  # warm-up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = fp8.attention_fp8_varlen(q, k, v, *args, causal=True)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(static, out)


@pytest.mark.parametrize("d", [96, 128])
def test_attention_fp8_pipelines_are_deterministic(d):
    """attention_fp8 and attention_fp8_varlen (K smoothing on, return_lse) give the same bits in
    repeated eager calls; d 96 takes the Hartley mix of the rotation too."""
    _needs_kernel(d)
    q, k, v = _inputs(2, 300, 1100, 4, 2, d, seed=3)
    first = fp8.attention_fp8(q, k, v, causal=True, return_lse=True)
    for _ in range(3):
        again = fp8.attention_fp8(q, k, v, causal=True, return_lse=True)
        assert torch.equal(again[0], first[0]) and torch.equal(again[1], first[1])
    lens_q, lens_k = [300, 1, 0, 130], [1100, 4100, 5, 130]  # multi-level mean sums (> 64 * 64 keys)
    cq = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=torch.int32, device="cuda")
    ck = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), dtype=torch.int32, device="cuda")
    q, k, v = (x[0] for x in _inputs(1, int(cq[-1]), int(ck[-1]), 4, 2, d, seed=4))
    k = k + 2  # a shared key mean: smoothing matters
    args = (cq, ck, max(lens_q), max(lens_k))
    first = fp8.attention_fp8_varlen(q, k, v, *args, causal=True, return_lse=True)
    for _ in range(3):
        again = fp8.attention_fp8_varlen(q, k, v, *args, causal=True, return_lse=True)
        assert torch.equal(again[0], first[0]) and torch.equal(again[1], first[1])


@pytest.mark.parametrize("d", [96, 128])
def test_varlen_k_mean_bitwise_as_on_the_cpu_and_capturable(d):
    """quantize_fp8_varlen's K-smoothing mean (flash3.fp8_quant._segment_sum: segment_reduce in one
    fixed order, the CPU's too) is the CPU's bits on CUDA, and so are x8 and the descales (the
    rotation is elementwise fp32 ops, the descale a correctly rounded division); the same in every
    call, and replayed from a CUDA graph."""
    from flash3 import fp8_quant
    g = torch.Generator(device="cuda").manual_seed(11)
    lens = [5000, 1, 0, 64, 65, 300]
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device="cuda")
    x = (torch.randn(int(cu[-1]) + 3, 2, d, generator=g, device="cuda") + 2).bfloat16()
    off = cu.long()
    s = fp8_quant._segment_sum(x.float(), off)
    assert torch.equal(s.cpu(), fp8_quant._segment_sum(x.float().cpu(), off.cpu()))
    for had in (False, True):
        want = fp8.quantize_fp8_varlen(x.cpu(), cu.cpu(), max(lens), block_size=128, hadamard=had, smooth=True)
        got = fp8.quantize_fp8_varlen(x, cu, max(lens), block_size=128, hadamard=had, smooth=True)
        assert torch.equal(got[2].cpu(), want[2]), had
        assert torch.equal(got[1].cpu(), want[1]), had
        assert torch.equal(got[0].view(torch.uint8).cpu(), want[0].view(torch.uint8)), had
    first = fp8.quantize_fp8_varlen(x, cu, max(lens), block_size=128, hadamard=True, smooth=True)
    for _ in range(3):
        again = fp8.quantize_fp8_varlen(x, cu, max(lens), block_size=128, hadamard=True, smooth=True)
        assert torch.equal(again[2], first[2]) and torch.equal(again[1], first[1])
        assert torch.equal(again[0].view(torch.uint8), first[0].view(torch.uint8))
    st = torch.cuda.Stream()
    with torch.cuda.stream(st):
        fp8.quantize_fp8_varlen(x, cu, max(lens), block_size=128, hadamard=True, smooth=True)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = fp8.quantize_fp8_varlen(x, cu, max(lens), block_size=128, hadamard=True, smooth=True)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(static[2], first[2]) and torch.equal(static[1], first[1])
    assert torch.equal(static[0].view(torch.uint8), first[0].view(torch.uint8))


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("case", CASES[:4], ids=lambda c: f"sq{c[0]}_sk{c[1]}_h{c[2]}x{c[3]}_c{int(c[4])}_w{c[5][0]}_cap{c[6]:g}")
def test_fp8_fast_accum_kernel_matches_emulation(d, case):
    """flash3.attention(..., fp8_fast_accum=True): the kernel's single accumulation against the
    emulation's (v descale per (batch, kv head), random; k per 128-key block)."""
    _needs_kernel(d)
    s_q, s_k, h, h_k, causal, (left, right), softcap = case
    q, k, v = _inputs(2, s_q, s_k, h, h_k, d)
    q8, qd = fp8.quantize_fp8(q, block_size=64)
    k8, kd = fp8.quantize_fp8(k, block_size=128)
    v8, vd, vcd = fp8.quantize_v_fp8(v, block_size=None)
    factor = torch.rand(vd.shape, device="cuda") + 0.5  # a wrong or missing v descale shows
    vd = vd * factor
    kw = dict(causal=causal, window_size=(left, right), softcap=softcap, q_descale=qd, k_descale=kd, v_descale=vd,
              fp8_block_size=(64, 128), v_channel_descale=vcd, fp8_fast_accum=True, return_lse=True)
    assert _backend.fp8_kernel_reason(q8, k8, v8, d ** -0.5, 64, 128, fast_accum=True) is None  # the kernel runs
    out, lse = flash3.attention(q8, k8, v8, **kw)
    assert not out.isnan().any() and not lse.isnan().any()
    ref, ref_lse = flash3.attention(q8.cpu(), k8.cpu(), v8.cpu(), **{
        n: (x.cpu() if isinstance(x, torch.Tensor) else x) for n, x in kw.items()})
    exact, _ = fp8.attention_fp64_reference(q, k, v.double() * factor[:, None, :, None], causal=causal,
                                            window_size=(left, 0 if causal else right), softcap=softcap)
    err_spec = _rms(ref.double() - exact.cpu())
    diff = _rms(out.cpu().double() - ref.double())
    assert diff <= 0.25 * err_spec + 2 ** -9 * _rms(exact), (diff, err_spec)
    fin = torch.isfinite(ref_lse)
    assert torch.equal(fin, torch.isfinite(lse.cpu()))
    assert (lse.cpu()[fin] - ref_lse[fin]).abs().max().item() < 1e-3


@pytest.mark.parametrize("d", [64, 128, 256])
def test_fp8_fast_accum_truncates_as_the_tensor_cores_do(d):
    """Only fast accumulation gives this (worked by hand): q = 0, so every P is 256; keys 128-255
    (visited first) have v = 1, keys 0-127 v = 2^-7. After the first tile O = 128 * 256 = 2^15, and
    the second tile's products (2 each) fall below O's truncation unit 2^(15 - 13) = 4: fast gives
    2^15 / 256^2 = 0.5; the default two-level accumulation adds them (256 more): 0.5 + 2^-8, exact
    in bf16 as well."""
    _needs_kernel(d)
    q8 = torch.zeros(1, 1, 1, d, device="cuda").to(torch.float8_e4m3fn)
    k8 = torch.zeros(1, 256, 1, d, device="cuda").to(torch.float8_e4m3fn)
    v = torch.full((1, 256, 1, d), 2.0 ** -7, device="cuda")
    v[:, 128:] = 1.0
    v8 = v.to(torch.float8_e4m3fn)
    one = torch.ones(1, 1, device="cuda")
    kw = dict(q_descale=one, k_descale=one, v_descale=one)
    assert _backend.fp8_kernel_reason(q8, k8, v8, d ** -0.5, 128, 128, fast_accum=True) is None
    fast = flash3.attention(q8, k8, v8, fp8_fast_accum=True, **kw)
    two = flash3.attention(q8, k8, v8, **kw)
    assert torch.equal(fast.float(), torch.full_like(fast.float(), 0.5))
    assert torch.equal(two.float(), torch.full_like(two.float(), 0.5 + 2.0 ** -8))


@pytest.mark.parametrize("d", [128, 256])
def test_attention_fp8_fast_accum_matches_its_emulation(d):
    """flash3.attention_fp8(fast_accum=True) on CUDA (quantize kernel with v per (batch, kv head) and
    channel, then the fast kernel) against the same call on the CPU (the emulation)."""
    _needs_kernel(d)
    q, k, v = _inputs(1, 1024, 1024, 4, 2, d, outliers=True)
    exact, _ = fp8.attention_fp64_reference(q, k, v, causal=True)
    out = flash3.attention_fp8(q, k, v, causal=True, fast_accum=True)
    emu = flash3.attention_fp8(q.cpu(), k.cpu(), v.cpu(), causal=True, fast_accum=True)
    err_spec = _rms(emu.double() - exact.cpu())
    assert _rms(out.cpu().double() - emu.double()) <= 0.25 * err_spec + 2 ** -9 * _rms(exact), err_spec
