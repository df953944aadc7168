"""MLA decode through FA3's flash_attn_with_kvcache (qv, d_v > 256): which calls the MLA decode
kernel takes (flash_attn_interface._mla_kernel_reason, _backend.kernel_mla_reason), what reaches
it (the kernel call faked on CPU tensors by the spec, flash3/reference/fa3.py), and the checks of
qv on every route. The kernel itself: tests/test_mla_gpu.py (sm_90) and the simulator's "mla"
smoke feature (tools/smoke/smoke_cases.py)."""
import math

import pytest
import torch

import flash3.flash_attn_interface as fai
from flash3 import _backend
from flash3.reference.fa3 import fa3_forward

D, DV = 64, 512


def paged(b, pages_per_row, page, h_k, gen):
    n = b * pages_per_row + 2
    kc = torch.randn(n, page, h_k, D, generator=gen)
    vc = torch.randn(n, page, h_k, DV, generator=gen)
    table = torch.randperm(n, generator=gen)[:b * pages_per_row].view(b, pages_per_row).to(torch.int32)
    return kc, vc, table


@pytest.fixture
def fake_kernel(monkeypatch):
    """The MLA kernel route on CPU tensors: kernel_mla_reason says yes, and the decode op's Python
    callers compute with the spec, recording what they were given."""
    calls = []

    def spec(q, k_cache, v_cache, seqused, page_table, scale, left, right, softcap, qv, cu=None, extra=None):
        extra = extra or {}
        assert set(extra) <= {"cache_leftpad", "attention_chunk"}, extra
        return fa3_forward(q, k_cache, v_cache, softmax_scale=scale, window_left=left, window_right=right,
                           softcap=softcap, qv=qv, cache_seqlens=seqused, page_table=page_table,
                           cu_seqlens_q=cu, **extra)

    def run_kernel_kvcache(q, k_cache, v_cache, seqused_k, page_table, softmax_scale, left, right, softcap,
                           num_splits, qv=None, **extra):
        calls.append(dict(kind="batched", k_cache=k_cache, v_cache=v_cache, q=q, seqused=seqused_k,
                          page_table=page_table, scale=softmax_scale,
                          window=(left, right), num_splits=num_splits, qv=qv, extra=extra))
        return spec(q, k_cache, v_cache, seqused_k, page_table, softmax_scale, left, right, softcap, qv,
                    extra=extra)

    def run_kernel_varlen_kvcache(q, k_cache, v_cache, cu_seqlens_q, max_seqlen_q, seqused_k, page_table,
                                  softmax_scale, left, right, softcap, num_splits=0, qv=None, **extra):
        calls.append(dict(kind="varlen", seqused=seqused_k, page_table=page_table, scale=softmax_scale,
                          window=(left, right), num_splits=num_splits, qv=qv, max_seqlen_q=max_seqlen_q,
                          extra=extra))
        return spec(q, k_cache, v_cache, seqused_k, page_table, softmax_scale, left, right, softcap, qv,
                    cu_seqlens_q, extra)

    monkeypatch.setattr(_backend, "kernel_mla_reason", lambda *a: None)
    monkeypatch.setattr(_backend, "run_kernel_kvcache", run_kernel_kvcache)
    monkeypatch.setattr(_backend, "run_kernel_varlen_kvcache", run_kernel_varlen_kvcache)
    return calls


@pytest.mark.parametrize("with_qv", [True, False])
def test_mla_call_reaches_the_kernel(fake_kernel, with_qv):
    """DeepSeek's decode (one kv head, 16 query heads, s_q 2, pages of 64): the kernel gets qv, FA3's
    default scale 1/sqrt(d + d_v) (1/sqrt(d) without qv), int32 key counts and the page table, and
    its result is the call's."""
    g = torch.Generator().manual_seed(0)
    b, s_q, h = 2, 2, 16
    kc, vc, table = paged(b, 3, 64, 1, g)
    q = torch.randn(b, s_q, h, D, generator=g)
    qv = torch.randn(b, s_q, h, DV, generator=g) if with_qv else None
    lens = torch.tensor([150, 7], dtype=torch.int32)
    out, lse, *_ = fai.flash_attn_with_kvcache(q, kc, vc, qv=qv, cache_seqlens=lens, page_table=table,
                                                causal=True, num_splits=3, return_softmax_lse=True)
    (c,) = fake_kernel
    assert c["kind"] == "batched" and c["qv"] is qv and c["num_splits"] == 3 and c["window"] == (-1, 0)
    assert c["scale"] == pytest.approx((D + (DV if with_qv else 0)) ** -0.5)
    assert c["seqused"].dtype == torch.int32 and c["seqused"].tolist() == [150, 7]
    assert torch.equal(c["page_table"], table)
    want, want_lse = fa3_forward(q, kc, vc, softmax_scale=c["scale"], window_left=-1, window_right=0, qv=qv,
                                 cache_seqlens=lens, page_table=table)
    assert torch.equal(out, want) and torch.equal(lse, want_lse)


def test_mla_packed_queries_and_cache_batch_idx(fake_kernel):
    """cu_seqlens_q (SGLang passes it on every decode step) takes the kernel's packed route with qv;
    cache_batch_idx becomes a page table of whole rows; an int cache_seqlens a vector."""
    g = torch.Generator().manual_seed(1)
    h, lq = 8, [1, 2, 1]
    kc, vc = torch.randn(4, 96, 1, D, generator=g), torch.randn(4, 96, 1, DV, generator=g)
    q, qv = torch.randn(sum(lq), h, D, generator=g), torch.randn(sum(lq), h, DV, generator=g)
    cu = torch.tensor([0, 1, 3, 4], dtype=torch.int32)
    idx = torch.tensor([3, 0, 2], dtype=torch.int32)
    out = fai.flash_attn_with_kvcache(q, kc, vc, qv=qv, cache_seqlens=50, cache_batch_idx=idx, cu_seqlens_q=cu,
                                      max_seqlen_q=2, softmax_scale=0.05, window_size=(20, 0))
    (c,) = fake_kernel
    assert c["kind"] == "varlen" and c["qv"] is qv and c["max_seqlen_q"] == 2 and c["scale"] == 0.05
    assert c["seqused"].tolist() == [50, 50, 50] and c["page_table"].tolist() == [[3], [0], [2]]
    assert c["window"] == (20, 0)
    want, _ = fa3_forward(q, kc, vc, softmax_scale=0.05, window_left=20, window_right=0, qv=qv,
                          cache_seqlens=torch.full((3,), 50, dtype=torch.int32), cache_batch_idx=idx,
                          cu_seqlens_q=cu)
    assert torch.equal(out, want)


def test_mla_sglang_layout_reaches_the_kernel_as_views(fake_kernel):
    """SGLang's layout: k_cache / v_cache the rope / latent views of one 576-wide cache, q / qv views
    of one query; they reach the kernel call as they are (the caches are never copied)."""
    g = torch.Generator().manual_seed(4)
    kv = torch.randn(5, 64, 1, DV + D, generator=g)
    vc, kc = kv[..., :DV], kv[..., DV:]
    q_all = torch.randn(2, 1, 8, DV + D, generator=g)
    qv, q = q_all[..., :DV], q_all[..., DV:]
    table = torch.tensor([[3, 0], [4, 1]], dtype=torch.int32)
    lens = torch.tensor([100, 64], dtype=torch.int32)
    out = fai.flash_attn_with_kvcache(q, kc, vc, qv=qv, cache_seqlens=lens, page_table=table, causal=True)
    (c,) = fake_kernel
    assert c["qv"] is qv and c["q"] is q and c["k_cache"] is kc and c["v_cache"] is vc
    want, _ = fa3_forward(q, kc, vc, softmax_scale=(D + DV) ** -0.5, window_left=-1, window_right=0, qv=qv,
                          cache_seqlens=lens, page_table=table)
    assert torch.equal(out, want)


def test_what_the_mla_kernel_does_not_take_runs_the_spec(fake_kernel, monkeypatch):
    """New keys where the fused append cannot run (here: CPU tensors; tests/test_mla_append.py has
    the kernel route) run the spec; a build whose MLA kernel takes no attention_chunk (the
    extension's pick refuses it) runs chunked calls on the spec; ALiBi with MLA is refused (the spec
    has none); qv with d_v <= 256 is the spec's (the MLA kernel is d_v > 256 only)."""
    monkeypatch.setattr(_backend, "warn_fallback", lambda *a, **k: None)
    g = torch.Generator().manual_seed(2)
    kc, vc = torch.randn(2, 40, 1, D, generator=g), torch.randn(2, 40, 1, DV, generator=g)
    q, qv = torch.randn(2, 1, 4, D, generator=g), torch.randn(2, 1, 4, DV, generator=g)
    k, v = torch.randn(2, 1, 1, D, generator=g), torch.randn(2, 1, 1, DV, generator=g)
    lens = torch.tensor([3, 9], dtype=torch.int32)
    fai.flash_attn_with_kvcache(q, kc, vc, k, v, qv=qv, cache_seqlens=lens)
    assert fake_kernel == []
    # attention_chunk where the build's MLA kernel refuses it (older builds): the spec
    monkeypatch.setattr(_backend, "kernel_chunk_reason", lambda q, kind, chunk, d_v=None: (
        f"no chunk for {kind} d_v={d_v}" if chunk else None))
    out = fai.flash_attn_with_kvcache(q, kc, vc, qv=qv, cache_seqlens=lens, attention_chunk=4, causal=True)
    assert fake_kernel == []
    want, _ = fa3_forward(q, kc, vc, softmax_scale=(D + DV) ** -0.5, qv=qv, cache_seqlens=lens,
                          attention_chunk=4, window_right=0)
    assert torch.equal(out, want)
    with pytest.raises(NotImplementedError, match="alibi_slopes"):
        fai.flash_attn_with_kvcache(q, kc, vc, qv=qv, cache_seqlens=lens, alibi_slopes=torch.ones(4))
    monkeypatch.undo()  # the real kernel_mla_reason
    assert _backend.kernel_mla_reason(q, kc, vc[..., :128], 0.1).startswith("qv needs the MLA decode kernel")
    assert _backend.kernel_mla_reason(q, kc, vc, 0.1) == "inputs are not CUDA tensors"


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("chunk,causal,window", [(16, True, (-1, -1)), (48, False, (30, 5)), (0, False, (-1, -1))])
def test_mla_chunk_and_leftpad_reach_the_kernel(fake_kernel, monkeypatch, packed, chunk, causal, window):
    """attention_chunk (Llama 4's chunked local attention, with causal or a window) and cache_leftpad,
    with batched or packed queries (cu_seqlens_q), are the MLA kernel's: it gets both as they are
    (the chunk only when given), and its result is the spec's."""
    monkeypatch.setattr(_backend, "kernel_chunk_reason", lambda *a: None)  # the extension's pick says yes
    g = torch.Generator().manual_seed(5)
    b, s_q, h = 3, 2, 8
    kc, vc, table = paged(b, 3, 64, 1, g)
    lens = torch.tensor([150, 7, 192], dtype=torch.int32)
    pads = torch.tensor([37, 0, 100], dtype=torch.int32)
    if packed:
        cu = torch.tensor([0, 2, 3, 5], dtype=torch.int32)
        q, qv = torch.randn(5, h, D, generator=g), torch.randn(5, h, DV, generator=g)
        kw = dict(cu_seqlens_q=cu, max_seqlen_q=2)
    else:
        q, qv = torch.randn(b, s_q, h, D, generator=g), torch.randn(b, s_q, h, DV, generator=g)
        kw = {}
    out, lse, *_ = fai.flash_attn_with_kvcache(q, kc, vc, qv=qv, cache_seqlens=lens, page_table=table,
                                                cache_leftpad=pads, causal=causal, window_size=window,
                                                attention_chunk=chunk, num_splits=2, return_softmax_lse=True, **kw)
    (c,) = fake_kernel
    assert c["kind"] == ("varlen" if packed else "batched") and c["qv"] is qv and c["num_splits"] == 2
    assert c["extra"].get("attention_chunk", 0) == chunk and ("attention_chunk" in c["extra"]) == (chunk > 0)
    assert torch.equal(c["extra"]["cache_leftpad"], pads)
    left, right = (window[0], 0) if causal else window
    want, want_lse = fa3_forward(q, kc, vc, softmax_scale=(D + DV) ** -0.5, window_left=left, window_right=right,
                                 qv=qv, cache_seqlens=lens, page_table=table, cache_leftpad=pads,
                                 attention_chunk=chunk, cu_seqlens_q=kw.get("cu_seqlens_q"))
    assert torch.equal(out, want) and torch.equal(lse, want_lse)


def test_mla_chunk_reason_asks_the_extension(monkeypatch):
    """The MLA kernel's chunk is the extension's to say (kernel_pick with attention_chunk): no
    head-dim limit of the plain decode kernels (192) applies at d_v 512; what the pick refuses is
    the reason."""
    monkeypatch.setattr(_backend, "has_chunk_kernel", lambda kind: True)
    asked = []

    def pick(family, dtype, d, d_v, scale, attention_chunk=0):
        asked.append((family, d, d_v, attention_chunk))
        return {"kernel": [64, 512]} if attention_chunk < 100 else {"reason": "no chunk here"}

    monkeypatch.setattr(_backend, "kernel_pick", pick)
    q = type("Q", (), {"is_cuda": True, "shape": (1, 1, 16, D), "dtype": torch.bfloat16})()
    assert _backend.kernel_chunk_reason(q, "decode", 64, DV) is None
    assert _backend.kernel_chunk_reason(q, "decode", 128, DV) == "no chunk here"
    assert asked == [("decode", D, DV, 64), ("decode", D, DV, 128)]
    assert _backend.kernel_chunk_reason(q, "decode", 64, 256) is None  # a plain kernel: no pick asked
    assert asked == [("decode", D, DV, 64), ("decode", D, DV, 128)]

@pytest.mark.parametrize("bad,fragment", [
    (lambda q, qv: qv[..., :-8], "qv must be (2, 1, 4, 512)"),
    (lambda q, qv: qv.double(), "qv must be (2, 1, 4, 512) torch.float32"),
    (lambda q, qv: qv[:, :, :2], "(q's rows, v's head dim)"),
])
def test_qv_is_checked_on_every_route(bad, fragment):
    """A qv that is not q's rows with v's head dim in q's dtype raises ValueError naming qv, before
    any route is chosen (CPU: the spec's route)."""
    q = torch.randn(2, 1, 4, D)
    kc, vc = torch.randn(2, 8, 1, D), torch.randn(2, 8, 1, DV)
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        fai.flash_attn_with_kvcache(q, kc, vc, qv=bad(q, torch.randn(2, 1, 4, DV)),
                                    cache_seqlens=torch.tensor([3, 8], dtype=torch.int32))


def test_mla_cpu_call_matches_fp64(monkeypatch):
    """Without the kernel (CPU) the call runs the spec: scores (q.k + qv.v) / sqrt(d + d_v)."""
    monkeypatch.setattr(_backend, "warn_fallback", lambda *a, **k: None)
    g = torch.Generator().manual_seed(3)
    kc, vc = torch.randn(1, 20, 1, D, generator=g), torch.randn(1, 20, 1, DV, generator=g)
    q, qv = torch.randn(1, 1, 2, D, generator=g), torch.randn(1, 1, 2, DV, generator=g)
    out = fai.flash_attn_with_kvcache(q, kc, vc, qv=qv, cache_seqlens=torch.tensor([20], dtype=torch.int32))
    s = (torch.einsum("hd,nd->hn", q[0, 0].double(), kc[0, :, 0].double())
         + torch.einsum("hd,nd->hn", qv[0, 0].double(), vc[0, :, 0].double())) / math.sqrt(D + DV)
    want = torch.softmax(s, -1) @ vc[0, :, 0].double()
    assert torch.allclose(out[0, 0].double(), want, atol=1e-5)
