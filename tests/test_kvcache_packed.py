"""New keys in FA3's packed layouts on flash3's own kv-cache path (not the spec): cu_seqlens_k_new
(packed new keys), new k/v and rotary with packed queries (cu_seqlens_q), cache_leftpad with
packed queries; paged caches and cache_batch_idx included. The public FA3 call against the spec
(flash3/reference/fa3.py) on the same inputs; rejected calls write nothing; the kernel path reads
no device value on the host (the fused append and the decode kernel are stubs here: their GPU
runs are tests/test_kvcache_packed_gpu.py and the simulator's "vappend" smoke feature)."""

import math

import pytest
import torch

import flash3
from flash3 import _backend, ops_serve, validation
from flash3 import flash_attn_interface as fai
from flash3.reference.fa3 import fa3_forward
from test_validation import HostRead, kernel_path, no_host_reads  # noqa: F401 (a fixture)

LQ = [3, 0, 1, 4]   # queries per entry (packed): one entry without queries
LN = [2, 3, 0, 1]   # new keys per entry (packed): one entry without new keys
LENS = [5, 0, 9, 30]  # cache_seqlens (entry 3 fills its row: 30 + 1 <= 32)
B, CAP, H, H_K, D = 4, 32, 4, 2, 16


def cu(lens):
    return torch.tensor([0] + list(lens), dtype=torch.int32).cumsum(0, dtype=torch.int32)


def i32(xs):
    return torch.tensor(xs, dtype=torch.int32)


def inputs(packed_q, packed_k, seed=0):
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    q = rnd(sum(LQ) + 2, H, D) if packed_q else rnd(B, 2, H, D)  # 2 packed rows of no entry
    k, v = ((rnd(sum(LN) + 1, H_K, D), rnd(sum(LN) + 1, H_K, D)) if packed_k
            else (rnd(B, 2, H_K, D), rnd(B, 2, H_K, D)))
    ang = torch.rand(CAP + 8, D // 4, generator=g) * 2 * math.pi
    return q, k, v, ang.cos(), ang.sin()


def cache(paged, seed=1, rows=B):
    """(k_cache, v_cache, page_table): rows of CAP keys, paged in pages of 4 (shuffled, spares)."""
    g = torch.Generator().manual_seed(seed)
    if not paged:
        return torch.randn(rows, CAP, H_K, D, generator=g), torch.randn(rows, CAP, H_K, D, generator=g), None
    n = rows * CAP // 4 + 3
    perm = torch.randperm(n, generator=g)[:rows * CAP // 4]
    kc, vc = torch.randn(n, 4, H_K, D, generator=g), torch.randn(n, 4, H_K, D, generator=g)
    return kc, vc, perm.view(rows, CAP // 4).to(torch.int32)


@pytest.mark.parametrize("packed_q,packed_k", [(True, True), (True, False), (False, True)])
@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("rotary", [None, "neox", "gptj"])
@pytest.mark.parametrize("mask", ["causal", "window", "none"])
@pytest.mark.parametrize("extras", [(), ("leftpad",), ("batch_idx", "rotary_seqlens"),
                                    ("leftpad", "batch_idx")])
def test_fa3_call_takes_flash3s_path_and_matches_the_spec(packed_q, packed_k, paged, rotary, mask,
                                                         extras, monkeypatch):
    def no_spec(*a, **k):
        raise AssertionError("the FA3 spec ran")
    monkeypatch.setattr(fai, "_on_reference", no_spec)
    q, k, v, cos, sin = inputs(packed_q, packed_k)
    rows = B + 1 if "batch_idx" in extras else B  # one cache row nobody uses
    kc, vc, pt = cache(paged, rows=rows)
    kw = dict(cache_seqlens=i32(LENS), causal=mask == "causal",
              window_size=(3, 1) if mask == "window" else (-1, -1))
    if packed_q:
        kw.update(cu_seqlens_q=cu(LQ), max_seqlen_q=max(LQ))
    if packed_k:
        kw["cu_seqlens_k_new"] = cu(LN)
    if rotary:
        kw.update(rotary_cos=cos, rotary_sin=sin, rotary_interleaved=rotary == "gptj")
        if "rotary_seqlens" in extras:
            kw["rotary_seqlens"] = i32([2, 7, 0, 4])
    if "leftpad" in extras:
        kw["cache_leftpad"] = i32([2, 0, 9, 13])  # entry 2: all padding (no keys)
    if "batch_idx" in extras:
        kw["cache_batch_idx"] = i32([2, 4, 0, 1])
    if paged:
        kw["page_table"] = pt
    kc_spec, vc_spec = kc.clone(), vc.clone()
    out, lse, *_ = fai.flash_attn_with_kvcache(q, kc, vc, k, v, return_softmax_lse=True, **kw)
    left, right = flash3.masking.normalize_window(kw.pop("causal"), kw.pop("window_size"))
    kw.pop("max_seqlen_q", None)
    interleaved = kw.pop("rotary_interleaved", True)
    spec_out, spec_lse = fa3_forward(q, kc_spec, vc_spec, k_new=k, v_new=v, softmax_scale=D ** -0.5,
                                     window_left=left, window_right=right,
                                     rotary_interleaved=interleaved, **kw)
    assert torch.equal(kc, kc_spec) and torch.equal(vc, vc_spec)  # the same slots, the same bits
    rows_q = slice(0, sum(LQ)) if packed_q else slice(None)
    torch.testing.assert_close(out[rows_q], spec_out[rows_q], atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(lse[..., rows_q], spec_lse[..., rows_q], atol=2e-5, rtol=2e-5)
    if packed_q:  # packed rows of no entry: out 0, lse -inf
        assert (out[sum(LQ):] == 0).all() and (lse[:, sum(LQ):] == -math.inf).all()


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_leftpad_with_packed_queries_and_no_new_keys(paged, causal, monkeypatch):
    """cache_leftpad with cu_seqlens_q alone (no new keys): flash3's packed-query path, as the spec."""
    def no_spec(*a, **k):
        raise AssertionError("the FA3 spec ran")
    monkeypatch.setattr(fai, "_on_reference", no_spec)
    q, _, _, _, _ = inputs(True, True)
    kc, vc, pt = cache(paged)
    kw = dict(cache_seqlens=i32(LENS), cache_leftpad=i32([4, 0, 9, 29]), cu_seqlens_q=cu(LQ),
              page_table=pt)
    out, lse, *_ = fai.flash_attn_with_kvcache(q, kc, vc, causal=causal, max_seqlen_q=max(LQ),
                                               return_softmax_lse=True, **kw)
    want, want_lse = fa3_forward(q, kc, vc, softmax_scale=D ** -0.5, window_right=0 if causal else -1,
                                 **kw)
    rows = slice(0, sum(LQ))
    torch.testing.assert_close(out[rows], want[rows], atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(lse[:, rows], want_lse[:, rows], atol=2e-5, rtol=2e-5)


def test_rejected_calls_write_nothing():
    """Bad packed metadata or values are errors naming the argument, before anything is written;
    an FP8 cache with packed new keys is refused by name."""
    q, k, v, cos, sin = inputs(True, True)
    kc, vc, pt = cache(True)
    before = kc.clone(), vc.clone()
    base = dict(cache_seqlens=i32(LENS), page_table=pt, cu_seqlens_q=cu(LQ), max_seqlen_q=4,
                cu_seqlens_k_new=cu(LN), causal=True)
    bad = [(dict(cu_seqlens_k_new=i32([0, 2, 1, 5, 6])), ValueError,
            "cu_seqlens_k_new must start at 0 and be non-decreasing"),
           (dict(cu_seqlens_k_new=i32([0, 2, 5, 5, 9])), ValueError, "cu_seqlens_k_new ends at 9"),
           (dict(cu_seqlens_k_new=i32([0, 2, 5, 5])), ValueError, "cu_seqlens_k_new must have shape"),
           (dict(cu_seqlens_k_new=cu(LN).long()), TypeError, "cu_seqlens_k_new must be int32"),
           (dict(cache_seqlens=i32([5, 0, 9, 32])), ValueError, "page_table has too few pages"),
           (dict(cache_leftpad=i32([0, 4, 0, 0])), ValueError, r"cache_leftpad\[1\] = 4 is outside"),
           (dict(max_seqlen_q=3), ValueError, "max_seqlen_q"),
           (dict(rotary_cos=cos[:33], rotary_sin=sin[:33]), ValueError, "rotary_cos/rotary_sin have 33"),
           (dict(cu_seqlens_q=i32([0, 3, 3, 2, 8])), ValueError, "cu_seqlens_q must start at 0")]
    for change, exc, msg in bad:
        with pytest.raises(exc, match=msg):
            flash3.attention_with_kvcache(q, kc, vc, k, v, **dict(base, **change))
        assert torch.equal(kc, before[0]) and torch.equal(vc, before[1]), msg
    with pytest.raises(ValueError, match=r"k must have shape \(total_new"):
        flash3.attention_with_kvcache(q, kc, vc, k[:, :1], v, **base)
    with pytest.raises(ValueError, match="k must be"):  # 4-D k with cu_seqlens_k_new
        flash3.attention_with_kvcache(q, kc, vc, k[None], v[None], **base)
    with pytest.raises(ValueError, match="cu_seqlens_k_new needs the new keys"):
        flash3.attention_with_kvcache(q, kc, vc, **base)
    kc8, vc8 = kc.to(torch.float8_e4m3fn), vc.to(torch.float8_e4m3fn)
    before8 = kc8.clone(), vc8.clone()
    ds = torch.ones(kc.shape[0], H_K)
    # per-slab descales: refused by name (FA3's per-batch descales with e4m3 k/v take this path)
    with pytest.raises(NotImplementedError, match="float8_e4m3fn cache take FA3's descales"):
        flash3.attention_with_kvcache(q, kc8, vc8, k, v, k_descale=ds, v_descale=ds, **base)
    assert torch.equal(kc8.view(torch.uint8), before8[0].view(torch.uint8))
    assert torch.equal(vc8.view(torch.uint8), before8[1].view(torch.uint8))
    assert torch.equal(kc, before[0]) and torch.equal(vc, before[1])


def test_fp8_caches_keep_the_spec_by_name(monkeypatch):
    """flash_attn_interface: an FP8 cache with packed new keys, or new keys with packed queries,
    that are not e4m3 or come with rotary tables still runs the spec, under the same reason names
    (e4m3 ones without rotary, and cache_leftpad with packed queries, run flash3's path:
    test_fa3_fp8_decode.py)."""
    seen = []

    def record(fn, q, reason, **kw):
        seen.append(reason)
        raise StopIteration
    monkeypatch.setattr(fai, "_on_reference", record)
    f8 = torch.float8_e4m3fn
    q, k, v, cos, sin = inputs(True, True)
    kc, vc, _ = cache(False)
    kc8, vc8 = kc.to(f8), vc.to(f8)
    rot = dict(rotary_cos=cos, rotary_sin=sin)
    calls = [(dict(k=k, v=v, cu_seqlens_k_new=cu(LN)), "cu_seqlens_k_new, cu_seqlens_q_with_new_kv"),
             (dict(k=k.to(f8), v=v.to(f8), cu_seqlens_k_new=cu(LN), **rot),
              "cu_seqlens_k_new, cu_seqlens_q_with_new_kv")]
    for kw, reason in calls:
        with pytest.raises(StopIteration):
            fai.flash_attn_with_kvcache(q, kc8, vc8, cache_seqlens=i32(LENS), cu_seqlens_q=cu(LQ),
                                        max_seqlen_q=4, **kw)
        assert seen[-1] == reason


def test_kernel_path_reads_nothing_on_the_host(monkeypatch):
    """With validation off the packed path reads no device value on the host: the append gets
    the metadata as int32 tensors, the decode op each entry's cache_seqlens + n_new keys (a device
    op) and cache_leftpad; validation mode reads them (the positive control)."""
    calls = {}

    def fake_append(q, k_cache, v_cache, k, v, cache_seqlens, page_table, cu_q, cu_k, cos, sin,
                    interleaved, q_per_token, ro):
        calls["append"] = dict(cache_seqlens=cache_seqlens, cu_q=cu_q, cu_k=cu_k,
                               q_per_token=q_per_token, rotary=cos is not None)
        return q.clone() if cos is not None else q.new_empty(0)

    def fake_attention(q, kc, vc, cu_q, seqused, pt, cu_k, max_q, *args):
        calls["attention"] = dict(seqused=seqused, leftpad=args[-2], chunk=args[-1], max_q=max_q)
        return q.new_zeros(*q.shape[:-1], vc.shape[-1]), torch.zeros(q.shape[1], q.shape[0])

    monkeypatch.setattr(_backend, "kernel_packed_append_reason", lambda *a: None)
    monkeypatch.setattr(_backend, "run_kernel_append_packed", fake_append)
    monkeypatch.setattr(ops_serve, "attention_varlen_kvcache", fake_attention)
    q, k, v, cos, sin = inputs(True, True)
    kc, vc, pt = cache(True)
    kw = dict(cache_seqlens=i32(LENS), page_table=pt, cu_seqlens_q=cu(LQ), max_seqlen_q=4,
              cu_seqlens_k_new=cu(LN), causal=True, rotary_cos=cos, rotary_sin=sin,
              cache_leftpad=i32([1, 0, 2, 3]))
    try:
        validation._FORCE = True
        with no_host_reads(monkeypatch), pytest.raises(HostRead):
            flash3.attention_with_kvcache(q, kc, vc, k, v, **kw)
        validation._FORCE = False
        with no_host_reads(monkeypatch):
            out = flash3.attention_with_kvcache(q, kc, vc, k, v, **kw)
    finally:
        validation._FORCE = None
    assert out.shape == (q.shape[0], H, D)
    a, t = calls["append"], calls["attention"]
    assert torch.equal(a["cu_k"], cu(LN)) and torch.equal(a["cu_q"], cu(LQ)) and a["q_per_token"]
    assert torch.equal(t["seqused"], i32([n + m for n, m in zip(LENS, LN)]))
    assert torch.equal(t["leftpad"], kw["cache_leftpad"]) and t["max_q"] == 4 and t["chunk"] == 0


def test_batched_queries_with_packed_new_keys_read_nothing_on_the_host(monkeypatch, kernel_path):
    """Batched q with cu_seqlens_k_new: the decode op (a stub, test_validation's kernel_path) gets
    cache_seqlens + each entry's new-key count, computed on the device."""
    def fake_append(q, *args):
        return q.new_empty(0)
    monkeypatch.setattr(_backend, "kernel_packed_append_reason", lambda *a: None)
    monkeypatch.setattr(_backend, "run_kernel_append_packed", fake_append)
    q, k, v, _, _ = inputs(False, True)
    kc, vc, pt = cache(False)
    try:
        validation._FORCE = False
        with no_host_reads(monkeypatch):
            flash3.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=i32(LENS),
                                          cu_seqlens_k_new=cu(LN), causal=True,
                                          cache_leftpad=i32([0, 0, 3, 1]))
    finally:
        validation._FORCE = None
    (call,) = kernel_path
    assert torch.equal(call["seqused_k"], i32([n + m for n, m in zip(LENS, LN)]))
    assert torch.equal(call["cache_leftpad"], i32([0, 0, 3, 1]))
