"""FA3's FP8 decode as vLLM calls it: flash_attn_interface.flash_attn_with_kvcache with e4m3 q and
cache and FA3's (batch, kv head) descales runs flash3's decode path (descale_per_batch: the kernel
on CUDA, reference.kvcache_forward on the CPU) instead of the FA3 spec, with q8 taken exactly as
bf16 and q's descale folded into K's; new e4m3 keys are appended unchanged (the fused append's
copy), or with rotary rotated with q8 in e4m3 as FA3 does, and attended the same way. CPU
tests: the route, the argument checks and the result against flash3/reference/fa3.py; GPU tests
(sm_90) of the kernels against the spec (here, and in tests/test_kvcache_packed_gpu.py, which the
device check runs)."""

import pytest
import torch

import flash3
from flash3 import flash_attn_interface as fai
from flash3 import reference
from flash3.reference.fa3 import fa3_forward

F8 = torch.float8_e4m3fn
HAS_SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def fp8_paged(b=3, cap=40, h=4, h_k=2, d=64, page=8, s_q=1, device="cpu", seed=0):
    """e4m3 q and a paged cache (shuffled pages, 2 spare), FA3 descales (b, h_k) in [0.01, 0.11)
    that differ per batch entry and kv head, each row's pages quantized with its own."""
    g = torch.Generator().manual_seed(seed)
    max_pages = -(-cap // page)
    n_pages = b * max_pages + 2
    table = torch.randperm(n_pages, generator=g)[:b * max_pages].view(b, max_pages).to(torch.int32)
    qd, kd, vd = (torch.rand(b, h_k, generator=g) * 0.1 + 0.01 for _ in range(3))
    owner = torch.zeros(n_pages, dtype=torch.long)
    owner[table.long().flatten()] = torch.arange(b).repeat_interleave(max_pages)
    k8, v8 = (reference.quantize_fp8_cache(torch.randn(n_pages, page, h_k, d, generator=g),
                                           ds[owner][:, None, :]) for ds in (kd, vd))
    q8 = reference.quantize_fp8_cache(torch.randn(b, s_q, h, d, generator=g),
                                      qd.repeat_interleave(h // h_k, dim=1)[:, None, :])
    lens = torch.randint(1, cap + 1, (b,), generator=g, dtype=torch.int32)
    to = lambda *xs: [x.to(device) for x in xs]  # noqa: E731
    return (*to(q8, k8, v8, table, lens), *to(qd, kd, vd))


def spec(q8, k8, v8, table, lens, qd, kd, vd, causal, **kw):
    """FA3's spec (reference/fa3.py) on the CPU."""
    cpu = [None if x is None else x.cpu() for x in (q8, k8, v8, table, lens, qd, kd, vd)]
    q8, k8, v8, table, lens, qd, kd, vd = cpu
    left, right = (-1, 0) if causal else (-1, -1)
    return fa3_forward(q8, k8, v8, softmax_scale=q8.shape[-1] ** -0.5, window_left=left,
                       window_right=right, cache_seqlens=lens, page_table=table, q_descale=qd,
                       k_descale=kd, v_descale=vd, **kw)


def no_spec(monkeypatch):
    def fail(*a, **k):
        raise AssertionError("flash_attn_with_kvcache took the reference spec")
    monkeypatch.setattr(fai, "_on_reference", fail)


@pytest.mark.parametrize("causal,num_splits", [(True, 0), (False, 3)])
def test_fp8_paged_runs_flash3_path_and_matches_spec(monkeypatch, causal, num_splits):
    q8, k8, v8, table, lens, qd, kd, vd = fp8_paged(s_q=2, seed=1)
    seen = {}
    real = fai.attention_with_kvcache

    def spy(*a, **k):
        seen.update(k)
        return real(*a, **k)
    monkeypatch.setattr(fai, "attention_with_kvcache", spy)
    no_spec(monkeypatch)
    out, lse, *_ = fai.flash_attn_with_kvcache(q8, k8, v8, cache_seqlens=lens, page_table=table,
                                               q_descale=qd, k_descale=kd, v_descale=vd,
                                               causal=causal, num_splits=num_splits,
                                               return_softmax_lse=True)
    assert seen["descale_per_batch"] is True
    # q's descale folded into K's; v's as given (b, h_k)
    assert torch.allclose(seen["k_descale"], qd * kd) and torch.equal(seen["v_descale"], vd)
    ref, ref_lse = spec(q8, k8, v8, table, lens, qd, kd, vd, causal)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref.float(), atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(lse, ref_lse, atol=1e-4, rtol=1e-4)


def test_fp8_cache_batch_idx_reads_batch_entry_descales(monkeypatch):
    """cache_batch_idx (contiguous cache, and page_table rows): the descales are those of the
    batch entry (FA3), even when two entries read the same cache row."""
    q8, k8, v8, table, lens, qd, kd, vd = fp8_paged(seed=2)
    no_spec(monkeypatch)
    idx = torch.tensor([2, 0, 2], dtype=torch.int32)  # rows 0 and 2 share table row 2
    out = fai.flash_attn_with_kvcache(q8, k8, v8, cache_seqlens=lens, page_table=table,
                                      cache_batch_idx=idx, q_descale=qd, k_descale=kd,
                                      v_descale=vd)
    ref, _ = spec(q8, k8, v8, table, lens, qd, kd, vd, False, cache_batch_idx=idx)
    torch.testing.assert_close(out.float(), ref.float(), atol=1e-2, rtol=1e-2)
    # a contiguous cache: rows of the page table's first page each (pages of the whole row)
    kc, vc = k8[table[:, 0].long()], v8[table[:, 0].long()]
    lens8 = lens.clamp(max=kc.shape[1])
    out = fai.flash_attn_with_kvcache(q8, kc, vc, cache_seqlens=lens8, cache_batch_idx=idx,
                                      q_descale=qd, k_descale=kd, v_descale=vd)
    ref, _ = fa3_forward(q8, kc, vc, softmax_scale=q8.shape[-1] ** -0.5, cache_seqlens=lens8,
                         cache_batch_idx=idx, q_descale=qd, k_descale=kd, v_descale=vd)
    torch.testing.assert_close(out.float(), ref.float(), atol=1e-2, rtol=1e-2)


def test_fp8_descales_none_and_broadcast(monkeypatch):
    """FA3: a missing descale is 1; (1,) broadcasts to (b, h_k)."""
    q8, k8, v8, table, lens, qd, kd, vd = fp8_paged(seed=3)
    no_spec(monkeypatch)
    one = torch.ones(3, 2)
    out = fai.flash_attn_with_kvcache(q8, k8, v8, cache_seqlens=lens, page_table=table,
                                      k_descale=torch.tensor([0.05]))
    ref, _ = spec(q8, k8, v8, table, lens, one, one * 0.05, one, False)
    torch.testing.assert_close(out.float(), ref.float(), atol=1e-2, rtol=1e-2)


def fp8_new_keys(kd, vd, s_new, seed, h_k=2, d=64):
    """e4m3 new k/v (b, s_new, h_k, d), each batch entry's quantized with its own descales."""
    g = torch.Generator().manual_seed(seed)
    return tuple(reference.quantize_fp8_cache(torch.randn(kd.shape[0], s_new, h_k, d, generator=g),
                                              ds[:, None, :]) for ds in (kd, vd))


@pytest.mark.parametrize("paged,causal,s_new", [(True, True, 2), (True, False, 1),
                                                (False, True, 3)])
def test_fp8_new_keys_appended_unchanged_and_match_spec(monkeypatch, paged, causal, s_new):
    """FA3 (vLLM): e4m3 new keys are copied into the e4m3 cache bit for bit (sharing the batch
    entry's descales) and attended, on flash3's path (descale_per_batch), paged or contiguous."""
    q8, k8, v8, table, lens, qd, kd, vd = fp8_paged(s_q=s_new, seed=6 + s_new)
    lens = lens.clamp(max=40 - s_new)
    if not paged:  # a contiguous cache (b, 40, h_k, d) of each entry's descales
        g = torch.Generator().manual_seed(9)
        k8, v8 = (reference.quantize_fp8_cache(torch.randn(3, 40, 2, 64, generator=g),
                                               ds[:, None, :]) for ds in (kd, vd))
        table = None
    kn8, vn8 = fp8_new_keys(kd, vd, s_new, seed=s_new)
    seen = {}
    real = fai.attention_with_kvcache

    def spy(*a, **k):
        seen.update(k, k_new=a[3])
        return real(*a, **k)
    monkeypatch.setattr(fai, "attention_with_kvcache", spy)
    no_spec(monkeypatch)
    kc, vc = k8.clone(), v8.clone()
    out, lse, *_ = fai.flash_attn_with_kvcache(q8, kc, vc, kn8, vn8, cache_seqlens=lens,
                                               page_table=table, q_descale=qd, k_descale=kd,
                                               v_descale=vd, causal=causal,
                                               return_softmax_lse=True)
    assert seen["descale_per_batch"] is True and seen["k_new"].dtype == F8  # handed on as e4m3
    kc_s, vc_s = k8.clone(), v8.clone()
    ref, ref_lse = spec(q8, kc_s, vc_s, table, lens, qd, kd, vd, causal, k_new=kn8, v_new=vn8)
    for got, want in ((kc, kc_s), (vc, vc_s)):  # the append: FA3's bytes exactly
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    assert not torch.equal(kc.view(torch.uint8), k8.view(torch.uint8))  # something was appended
    torch.testing.assert_close(out.float(), ref.float(), atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(lse, ref_lse, atol=1e-4, rtol=1e-4)


def test_fp8_new_keys_kernel_branch_copies_and_decodes_per_batch(monkeypatch):
    """The kernel branch of ops.attention_kvcache (forced on CPU tensors: the torch-op append, then
    a recorded decode call): the e4m3 keys land unchanged, the decode gets descale_per_batch and
    each row's count cache_seqlens + s_new, with no host read."""
    from flash3 import _backend, ops
    q8, k8, v8, table, lens, qd, kd, vd = fp8_paged(s_q=2, seed=11)
    lens = lens.clamp(max=38)
    kn8, vn8 = fp8_new_keys(kd, vd, 2, seed=3)
    calls = []

    def fake(q, k_cache, v_cache, seqused_k, page_table, *a, **kw):
        calls.append(dict(seqused_k=seqused_k, **kw, k_descale=a[5], v_descale=a[6]))
        return q.new_zeros(*q.shape[:-1], v_cache.shape[-1]), torch.zeros(3, q.shape[2], q.shape[1])
    monkeypatch.setattr(ops, "_kvcache_dispatch", lambda q, k, v, s, run_kernel, *more: run_kernel())
    monkeypatch.setattr(_backend, "run_kernel_kvcache", fake)
    kc, vc = k8.clone(), v8.clone()
    flash3.attention_with_kvcache(q8.to(torch.bfloat16), kc, vc, kn8, vn8, cache_seqlens=lens,
                                  page_table=table, k_descale=kd, v_descale=vd,
                                  descale_per_batch=True)
    want_k, want_v = k8.clone(), v8.clone()
    reference.kvcache_write(want_k, want_v, kn8, vn8, lens, table)  # no descales: a copy
    assert torch.equal(kc.view(torch.uint8), want_k.view(torch.uint8))
    assert torch.equal(vc.view(torch.uint8), want_v.view(torch.uint8))
    (c,) = calls
    assert c["descale_per_batch"] is True and torch.equal(c["seqused_k"], lens + 2)
    assert torch.equal(c["k_descale"], kd) and torch.equal(c["v_descale"], vd)


@pytest.mark.parametrize("bad", ["k_descale", "k_shape", "overflow"])
def test_fp8_new_keys_rejected_call_writes_nothing(bad):
    """A call refused (a descale that does not broadcast to (b, h_k), new keys of the wrong shape, a
    cache overflow in validation mode) raises naming the argument and leaves the caches as they were."""
    q8, k8, v8, table, lens, qd, kd, vd = fp8_paged(seed=12)
    kn8, vn8 = fp8_new_keys(kd, vd, 2, seed=4)
    kw = dict(cache_seqlens=lens.clamp(max=38), page_table=table, q_descale=qd, k_descale=kd,
              v_descale=vd)
    if bad == "k_descale":
        kw["k_descale"], match = torch.ones(3), "k_descale"
    elif bad == "k_shape":
        kn8, match = kn8[:, :, :1], "k must have shape"
    else:
        kw["cache_seqlens"] = torch.tensor([5, 39, 0], dtype=torch.int32)  # 39 + 2 new > 40 keys
        match = "page_table has too few pages"
    kc, vc = k8.clone(), v8.clone()
    with pytest.raises(ValueError, match=match):
        fai.flash_attn_with_kvcache(q8, kc, vc, kn8, vn8, **kw)
    assert torch.equal(kc.view(torch.uint8), k8.view(torch.uint8))
    assert torch.equal(vc.view(torch.uint8), v8.view(torch.uint8))


def test_fp8_new_keys_with_rotary_and_16bit_q_stay_on_spec(monkeypatch):
    """Rotary with e4m3 new keys and a bf16 q (not FA3's: its q has the keys' dtype) on a paged
    cache: not on the fused append (it rotates q in e4m3 with the keys); the spec."""
    q8, k8, v8, table, lens, qd, kd, vd = fp8_paged(seed=4)
    called = []
    real = fai._on_reference
    monkeypatch.setattr(fai, "_on_reference", lambda *a, **k: called.append(a[2]) or real(*a, **k))
    kn = torch.randn(3, 1, 2, 64).to(F8)
    cos = torch.ones(64, 16)
    fai.flash_attn_with_kvcache(q8.to(torch.bfloat16), k8, v8, kn, kn, rotary_cos=cos,
                                rotary_sin=cos * 0, cache_seqlens=lens.clamp(max=30),
                                page_table=table, k_descale=kd, v_descale=vd)
    assert called and "fp8_paged_cache" in called[0]


def rotary_tables(rows, rotary_dim, seed, dtype=torch.float32):
    """FA3's tests' tables: angles uniform in [0, 2 pi), (rows, rotary_dim / 2)."""
    g = torch.Generator().manual_seed(seed)
    ang = torch.rand(rows, rotary_dim // 2, generator=g) * 2 * torch.pi
    return ang.cos().to(dtype), ang.sin().to(dtype)


@pytest.mark.parametrize("packed_q,packed_k", [(False, False), (True, True), (True, False),
                                               (False, True)])
@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("extras", [(), ("leftpad", "batch_idx", "rotary_seqlens")])
@pytest.mark.parametrize("causal,interleaved,rotary_dim", [(True, False, 64), (False, True, 32)])
def test_fp8_rotary_new_keys_run_flash3_path_and_match_spec(monkeypatch, packed_q, packed_k, paged,
                                                            extras, causal, interleaved,
                                                            rotary_dim):
    """FA3's FP8 decode with rotary new keys (e4m3 q, keys and cache), every layout FA3's kernels
    take (batched or packed q and keys, paged or contiguous, cache_leftpad, cache_batch_idx,
    rotary_seqlens): flash3's path (the fused append rotates q8 and the keys in e4m3, then the
    decode with descale_per_batch), not the spec; the appended bytes are the spec's exactly (FA3:
    rotated in fp32 from the e4m3 values, rounded once to e4m3), out/lse as the spec's."""
    rows = 5 if "batch_idx" in extras else 4
    (q8, kn8, vn8, k8, v8, qd, kd, vd), kw = fp8_packed(packed_q, packed_k, paged, rows, seed=8)
    kw["rotary_cos"], kw["rotary_sin"] = rotary_tables(64, rotary_dim, seed=rotary_dim)
    kw["rotary_interleaved"] = interleaved
    if "leftpad" in extras:
        kw["cache_leftpad"] = torch.tensor(PK_PADS, dtype=torch.int32)
    if "batch_idx" in extras:
        kw["cache_batch_idx"] = torch.tensor([2, 4, 0, 1], dtype=torch.int32)
    if "rotary_seqlens" in extras:
        kw["rotary_seqlens"] = torch.tensor([3, 60, 0, 17], dtype=torch.int32)
    seen = {}
    real_append = fai._append_new_keys

    def spy_append(q, *a, **k):
        seen["append_q"] = q
        return real_append(q, *a, **k)
    real_attn = fai.attention_with_kvcache

    def spy_attn(*a, **k):
        seen.update(k, q=a[0], k_new=a[3] if len(a) > 3 else None)
        return real_attn(*a, **k)
    monkeypatch.setattr(fai, "_append_new_keys", spy_append)
    monkeypatch.setattr(fai, "attention_with_kvcache", spy_attn)
    no_spec(monkeypatch)
    kc, vc = k8.clone(), v8.clone()
    out, lse, *_ = fai.flash_attn_with_kvcache(q8, kc, vc, kn8, vn8, q_descale=qd, k_descale=kd,
                                               v_descale=vd, causal=causal,
                                               return_softmax_lse=True, **kw)
    # the append gets q8 itself; the attention the rotated q8 as bf16, no new keys, FA3's descales
    assert seen["append_q"] is q8 and seen["q"].dtype == torch.bfloat16 and seen["k_new"] is None
    assert seen["descale_per_batch"] is True
    assert torch.allclose(seen["k_descale"], qd * kd) and torch.equal(seen["v_descale"], vd)
    ref, ref_lse, kc_s, vc_s = packed_spec(q8, kn8, vn8, k8, v8, qd, kd, vd, kw, causal)
    for got, want in ((kc, kc_s), (vc, vc_s)):  # the append: FA3's bytes exactly
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    assert not torch.equal(kc.view(torch.uint8), k8.view(torch.uint8))  # something was appended
    assert out.dtype == torch.bfloat16
    rows_q = slice(0, sum(PK_LQ)) if packed_q else slice(None)
    torch.testing.assert_close(out[rows_q].float(), ref[rows_q].float(), atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(lse[..., rows_q], ref_lse[..., rows_q], atol=1e-4, rtol=1e-4)


def test_fp8_rotary_saturates_as_fa3():
    """A rotated e4m3 key past 448 is stored as 448 (FA3's saturating conversion), not NaN; the
    unrotated channels are copied byte for byte; the cache bytes are the spec's."""
    (q8, kn8, vn8, k8, v8, qd, kd, vd), kw = fp8_packed(False, False, False, seed=9)
    kn8[..., 0] = kn8[..., 24] = torch.tensor(448.0).to(F8)  # a NeoX pair (rotary_dim 48)
    kn8[..., 48:] = torch.tensor(-2.0 ** -9).to(F8)  # channels past rotary_dim: copied
    ang = torch.full((64, 24), 3 * torch.pi / 4)  # cos = -sin: x0 cos - x1 sin = -448 sqrt(2)
    kc, vc = k8.clone(), v8.clone()
    fai.flash_attn_with_kvcache(q8, kc, vc, kn8, vn8, rotary_cos=ang.cos(), rotary_sin=ang.sin(),
                                rotary_interleaved=False, q_descale=qd, k_descale=kd, v_descale=vd,
                                **kw)
    lens = kw["cache_seqlens"].long()
    rows = kc[torch.arange(4), lens]  # each entry's appended key (b, h_k, d)
    assert (rows[..., 0].float() == -448).all() and not rows.float().isnan().any()
    assert torch.equal(rows[..., 48:].view(torch.uint8), kn8[:, 0, :, 48:].view(torch.uint8))
    kc_s, vc_s = k8.clone(), v8.clone()
    fa3_forward(q8, kc_s, vc_s, k_new=kn8, v_new=vn8, softmax_scale=0.125,
                rotary_cos=ang.cos(), rotary_sin=ang.sin(), rotary_interleaved=False,
                q_descale=qd, k_descale=kd, v_descale=vd, **kw)
    assert torch.equal(kc.view(torch.uint8), kc_s.view(torch.uint8))


def test_fp8_rotary_rejected_call_writes_nothing():
    """FA3's FP8 decode with rotary new keys: bad rotary or FP8 arguments raise naming the
    argument before anything is written."""
    (q8, kn8, vn8, k8, v8, qd, kd, vd), kw = fp8_packed(True, True, True, seed=10)
    cos, sin = rotary_tables(64, 32, seed=1)
    i32 = lambda xs: torch.tensor(xs, dtype=torch.int32)  # noqa: E731
    base = dict(kw, rotary_cos=cos, rotary_sin=sin, q_descale=qd, k_descale=kd, v_descale=vd)
    bad = [(dict(rotary_seqlens=i32([0, 1, 2])), ValueError, "rotary_seqlens must be int32"),
           (dict(rotary_sin=sin[:, :8]), ValueError, "rotary_sin shape"),
           (dict(rotary_cos=torch.ones(64, 40), rotary_sin=torch.ones(64, 40)), ValueError,
            "rotary_dim"),
           (dict(k_descale=torch.ones(3)), ValueError, "k_descale"),
           (dict(cache_leftpad=i32([0, 4, 0, 0])), ValueError, r"cache_leftpad\[1\] = 4"),
           (dict(cache_seqlens=i32([5, 0, 9, 40])), ValueError, "page_table has too few pages"),
           (dict(max_seqlen_q=3), ValueError, "max_seqlen_q")]
    for change, exc, msg in bad:
        kc, vc = k8.clone(), v8.clone()
        with pytest.raises(exc, match=msg):
            fai.flash_attn_with_kvcache(q8, kc, vc, kn8, vn8, **dict(base, **change))
        assert torch.equal(kc.view(torch.uint8), k8.view(torch.uint8)), msg
        assert torch.equal(vc.view(torch.uint8), v8.view(torch.uint8)), msg


def test_fp8_rotary_kernel_path_reads_nothing_on_the_host(monkeypatch):
    """The kernel branch of FA3's FP8 decode with rotary new keys (stubs for the fused append and
    the decode op, packed q and keys on a paged cache, validation off): no device value read on
    the host; the append gets q8, the e4m3 keys, the fp32 tables and the packed metadata, the
    decode the rotated q8 as bf16. Validation mode reads them (positive control)."""
    from flash3 import _backend, ops_serve, validation
    from test_validation import HostRead, no_host_reads
    calls = {}

    def fake_append(q, k_cache, v_cache, k, v, cache_seqlens, page_table, cu_q, cu_k, cos, sin,
                    interleaved, q_per_token, ro):
        calls["append"] = dict(q=q, k=k, cos=cos, cu_q=cu_q, cu_k=cu_k, ro=ro, per_token=q_per_token)
        return q.clone()

    def fake_varlen(q, kc, vc, cu_q, seqused, pt, cu_k, max_q, *args, **kw):
        calls["attention"] = dict(q=q, seqused=seqused, k_descale=args[4], **kw)
        return q.new_zeros(*q.shape[:-1], vc.shape[-1]), torch.zeros(q.shape[1], q.shape[0])

    monkeypatch.setattr(_backend, "kernel_packed_append_reason", lambda *a: None)
    monkeypatch.setattr(_backend, "run_kernel_append_packed", fake_append)
    monkeypatch.setattr(ops_serve, "attention_varlen_kvcache", fake_varlen)
    (q8, kn8, vn8, k8, v8, qd, kd, vd), kw = fp8_packed(True, True, True, seed=11)
    cos, sin = rotary_tables(64, 32, seed=2)
    args = (q8, k8.clone(), v8.clone(), kn8, vn8)
    opts = dict(kw, rotary_cos=cos, rotary_sin=sin, q_descale=qd, k_descale=kd, v_descale=vd,
                causal=True, cache_leftpad=torch.tensor(PK_PADS, dtype=torch.int32),
                rotary_seqlens=torch.tensor([1, 2, 3, 4], dtype=torch.int32))
    try:
        validation._FORCE = True
        with no_host_reads(monkeypatch), pytest.raises(HostRead):
            fai.flash_attn_with_kvcache(*args, **opts)
        validation._FORCE = False
        calls.clear()
        with no_host_reads(monkeypatch):
            fai.flash_attn_with_kvcache(*args, **opts)
    finally:
        validation._FORCE = None
    a, t = calls["append"], calls["attention"]
    assert a["q"] is q8 and a["k"] is kn8 and a["cos"] is cos and a["per_token"]
    assert a["cu_q"] is kw["cu_seqlens_q"] and a["cu_k"] is kw["cu_seqlens_k_new"]
    assert t["q"].dtype == torch.bfloat16 and torch.equal(t["q"], q8.to(torch.bfloat16))
    assert t["descale_per_batch"] is True and torch.allclose(t["k_descale"], qd * kd)
    n_new = PK_LN
    assert torch.equal(t["seqused"], torch.tensor([n + m for n, m in zip(PK_LENS, n_new)],
                                                  dtype=torch.int32))


def test_descale_per_batch_argument_checks():
    q8, k8, v8, table, lens, qd, kd, vd = fp8_paged(seed=5)
    q = q8.to(torch.bfloat16)
    kw = dict(cache_seqlens=lens, page_table=table, descale_per_batch=True)
    with pytest.raises(ValueError, match="k_descale"):  # (num_pages, h_k) is the per-page shape
        flash3.attention_with_kvcache(q, k8, v8, k_descale=torch.ones(k8.shape[0], 2),
                                      v_descale=vd, **kw)
    with pytest.raises(ValueError, match="v_descale"):
        flash3.attention_with_kvcache(q, k8, v8, k_descale=kd, v_descale=vd[:, :1], **kw)
    with pytest.raises(ValueError, match="descale_per_batch"):  # a 16-bit cache
        flash3.attention_with_kvcache(q, k8.to(torch.bfloat16), v8.to(torch.bfloat16), **kw)
    with pytest.raises(TypeError, match="descale_per_batch"):
        flash3.attention_with_kvcache(q, k8, v8, k_descale=kd, v_descale=vd,
                                      **dict(kw, descale_per_batch=1))
    kn = torch.randn(3, 1, 2, 64, dtype=torch.bfloat16)
    kn8 = kn.to(F8)
    before = k8.clone()
    kw30 = dict(kw, cache_seqlens=lens.clamp(max=30))
    with pytest.raises(TypeError, match="float8_e4m3fn"):  # per batch: e4m3 new keys only
        flash3.attention_with_kvcache(q, k8, v8, kn, kn, k_descale=kd, v_descale=vd, **kw30)
    with pytest.raises(NotImplementedError, match="rotary"):
        flash3.attention_with_kvcache(q, k8, v8, kn8, kn8, k_descale=kd, v_descale=vd,
                                      rotary_cos=torch.ones(64, 16),
                                      rotary_sin=torch.zeros(64, 16), **kw30)
    with pytest.raises(TypeError, match="descale_per_batch"):  # e4m3 keys with per-slab descales
        flash3.attention_with_kvcache(q, k8, v8, kn8, kn8, k_descale=torch.ones(k8.shape[0], 2),
                                      v_descale=torch.ones(k8.shape[0], 2),
                                      **dict(kw30, descale_per_batch=False))
    with pytest.raises(TypeError, match="v has dtype"):  # k e4m3, v not
        flash3.attention_with_kvcache(q, k8, v8, kn8, kn, k_descale=kd, v_descale=vd, **kw30)
    assert torch.equal(before.view(torch.uint8), k8.view(torch.uint8))  # nothing written
    # packed queries: (batch, h_k) counts cu_seqlens_q's sequences (4 here), not q's rows
    with pytest.raises(ValueError, match=r"k_descale must have shape \(batch, kv_heads\) = \(4, 2\)"):
        flash3.attention_with_kvcache(q.view(3, 4, 64), k8, v8, k_descale=kd, v_descale=vd,
                                      cu_seqlens_q=torch.tensor([0, 1, 2, 2, 3], dtype=torch.int32),
                                      max_seqlen_q=1, **dict(kw, page_table=torch.cat([table, table[:1]]),
                                                             cache_seqlens=torch.cat([lens, lens[:1]])))


# FA3's packed layouts on an FP8 cache: queries per entry (cu_seqlens_q), new keys per entry
# (cu_seqlens_k_new), cache_seqlens and leftpads. Entry 1 has no queries, entry 2 no new keys,
# entry 3 fills its 40-key row; entry 0's leftpad leaves it no cached key before its new ones.
PK_LQ, PK_LN, PK_LENS, PK_PADS = [3, 0, 1, 4], [2, 3, 0, 1], [5, 0, 9, 39], [5, 0, 9, 13]


def cu32(lens):
    return torch.tensor([0] + list(lens), dtype=torch.int32).cumsum(0, dtype=torch.int32)


def fp8_packed(packed_q, packed_k, paged, rows=4, seed=0, h=4, h_k=2, d=64, cap=40, page=8,
               device="cpu"):
    """e4m3 q and new k/v (packed per PK_LQ / PK_LN with tail rows of no entry, or batched: 2
    queries, 1 new key per entry), each entry's quantized with its own FA3 descales (b, h_k); an e4m3 cache of `rows`
    rows of `cap` keys (paged in shuffled pages of `page`, 3 spares; or contiguous)."""
    g = torch.Generator().manual_seed(seed)
    b = len(PK_LENS)
    qd, kd, vd = (torch.rand(b, h_k, generator=g) * 0.1 + 0.01 for _ in range(3))
    q8s = lambda x, ds, per: reference.quantize_fp8_cache(  # noqa: E731
        x, ds.repeat_interleave(h // h_k, dim=-1) if per == "q" else ds)

    def rows_of(lens, heads, dim, ds, per, tail):  # packed (total + tail, heads, dim) or batched
        if lens is None:
            n = 2 if per == "q" else 1
            return q8s(torch.randn(b, n, heads, dim, generator=g), ds[:, None, :], per)
        parts = [q8s(torch.randn(n, heads, dim, generator=g), ds[i][None, :], per)
                 for i, n in enumerate(lens)]
        parts.append(torch.randn(tail, heads, dim, generator=g).to(F8))  # rows of no entry
        return torch.cat(parts)
    q8 = rows_of(PK_LQ if packed_q else None, h, d, qd, "q", 2)
    kn8 = rows_of(PK_LN if packed_k else None, h_k, d, kd, "k", 1)
    vn8 = rows_of(PK_LN if packed_k else None, h_k, d, vd, "k", 1)
    if paged:
        n = rows * cap // page + 3
        table = torch.randperm(n, generator=g)[:rows * cap // page].view(rows, -1).to(torch.int32)
        k8, v8 = (torch.randn(n, page, h_k, d, generator=g).to(F8) for _ in range(2))
    else:
        table = None
        k8, v8 = (torch.randn(rows, cap, h_k, d, generator=g).to(F8) for _ in range(2))
    kw = dict(cache_seqlens=torch.tensor(PK_LENS, dtype=torch.int32), page_table=table)
    if packed_q:
        kw.update(cu_seqlens_q=cu32(PK_LQ), max_seqlen_q=max(PK_LQ))
    if packed_k:
        kw["cu_seqlens_k_new"] = cu32(PK_LN)
    to = lambda x: x.to(device) if isinstance(x, torch.Tensor) else x  # noqa: E731
    return ([to(x) for x in (q8, kn8, vn8, k8, v8, qd, kd, vd)],
            {n: to(x) for n, x in kw.items()})


def packed_spec(q8, kn8, vn8, k8, v8, qd, kd, vd, kw, causal, new_kv=True):
    """FA3's spec (CPU) of a packed call: out, lse, and the caches after its append."""
    kc, vc = k8.cpu().clone(), v8.cpu().clone()
    spec_kw = {n: x.cpu() if isinstance(x, torch.Tensor) else x for n, x in kw.items()
               if n != "max_seqlen_q"}
    if not new_kv:
        spec_kw.pop("cu_seqlens_k_new", None)
    out, lse = fa3_forward(q8.cpu(), kc, vc, k_new=kn8.cpu() if new_kv else None,
                           v_new=vn8.cpu() if new_kv else None, softmax_scale=q8.shape[-1] ** -0.5,
                           window_right=0 if causal else -1, q_descale=qd.cpu(),
                           k_descale=kd.cpu(), v_descale=vd.cpu(), **spec_kw)
    return out, lse, kc, vc


@pytest.mark.parametrize("packed_q,packed_k,new_kv", [(True, True, True), (True, False, True),
                                                      (False, True, True), (True, False, False)])
@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("extras", [(), ("leftpad",), ("batch_idx",), ("leftpad", "batch_idx")])
@pytest.mark.parametrize("causal", [False, True])
def test_fp8_packed_layouts_run_flash3_path_and_match_spec(monkeypatch, packed_q, packed_k, new_kv,
                                                           paged, extras, causal):
    """FP8 cache with packed queries (cu_seqlens_q) and/or packed e4m3 new keys (cu_seqlens_k_new),
    paged or contiguous, cache_leftpad / cache_batch_idx: flash3's path (descale_per_batch, q8 as
    bf16 with q's descale folded into K's), the appended bytes FA3's exactly, out/lse as the spec."""
    rows = 5 if "batch_idx" in extras else 4  # one cache row nobody uses
    (q8, kn8, vn8, k8, v8, qd, kd, vd), kw = fp8_packed(packed_q, packed_k, paged, rows, seed=3)
    if "leftpad" in extras:
        kw["cache_leftpad"] = torch.tensor(PK_PADS, dtype=torch.int32)
    if "batch_idx" in extras:
        kw["cache_batch_idx"] = torch.tensor([2, 4, 0, 1], dtype=torch.int32)
    if not new_kv:
        kw.pop("cu_seqlens_k_new", None)
    seen = {}
    real = fai.attention_with_kvcache

    def spy(*a, **k):
        seen.update(k, k_new=a[3] if len(a) > 3 else None)
        return real(*a, **k)
    monkeypatch.setattr(fai, "attention_with_kvcache", spy)
    no_spec(monkeypatch)
    kc, vc = k8.clone(), v8.clone()
    new = (kn8, vn8) if new_kv else (None, None)
    out, lse, *_ = fai.flash_attn_with_kvcache(q8, kc, vc, *new, q_descale=qd, k_descale=kd,
                                               v_descale=vd, causal=causal, return_softmax_lse=True,
                                               **kw)
    assert seen["descale_per_batch"] is True
    assert torch.allclose(seen["k_descale"], qd * kd) and torch.equal(seen["v_descale"], vd)
    assert not new_kv or seen["k_new"].dtype == F8  # handed on as e4m3
    ref, ref_lse, kc_s, vc_s = packed_spec(q8, kn8, vn8, k8, v8, qd, kd, vd, kw, causal, new_kv)
    for got, want in ((kc, kc_s), (vc, vc_s)):  # the append: FA3's bytes exactly
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    assert out.dtype == torch.bfloat16
    rows_q = slice(0, sum(PK_LQ)) if packed_q else slice(None)
    torch.testing.assert_close(out[rows_q].float(), ref[rows_q].float(), atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(lse[..., rows_q], ref_lse[..., rows_q], atol=1e-4, rtol=1e-4)
    if packed_q:  # packed rows of no entry: out 0, lse -inf
        assert (out[sum(PK_LQ):] == 0).all() and (lse[:, sum(PK_LQ):] == float("-inf")).all()


@pytest.mark.parametrize("packed_q,packed_k", [(True, True), (False, True), (True, False)])
def test_fp8_packed_kernel_path_reads_nothing_on_the_host(monkeypatch, packed_q, packed_k):
    """The kernel branch (stubs for the fused append and the decode ops, on CPU tensors, validation
    off): no device value read on the host; the append gets the e4m3 bytes and the packed
    metadata, the decode op descale_per_batch with FA3's (b, h_k) descales, each entry's
    cache_seqlens + n_new keys and the leftpads. Validation mode reads them (positive control)."""
    from flash3 import _backend, ops_serve, validation
    from test_validation import HostRead, no_host_reads
    calls = {}

    def fake_append(q, k_cache, v_cache, k, v, cache_seqlens, page_table, cu_q, cu_k, cos, sin,
                    interleaved, q_per_token, ro):
        calls["append"] = dict(k=k, v=v, k_cache=k_cache, cu_q=cu_q, cu_k=cu_k, rotary=cos)
        return q.new_empty(0)

    def fake_varlen(q, kc, vc, cu_q, seqused, pt, cu_k, max_q, *args, **kw):
        calls["attention"] = dict(seqused=seqused, k_descale=args[4], v_descale=args[5],
                                  leftpad=args[9], **kw)
        return q.new_zeros(*q.shape[:-1], vc.shape[-1]), torch.zeros(q.shape[1], q.shape[0])

    def fake_batched(q, k_cache, v_cache, seqused_k, page_table, *a, **kw):
        calls["attention"] = dict(seqused=seqused_k, k_descale=a[5], v_descale=a[6], **kw)
        return q.new_zeros(*q.shape[:-1], v_cache.shape[-1]), torch.zeros(q.shape[0], q.shape[2], q.shape[1])

    from flash3 import ops
    monkeypatch.setattr(_backend, "kernel_packed_append_reason", lambda *a: None)
    monkeypatch.setattr(_backend, "run_kernel_append_packed", fake_append)
    monkeypatch.setattr(ops_serve, "attention_varlen_kvcache", fake_varlen)
    monkeypatch.setattr(ops, "_kvcache_dispatch", lambda q, k, v, s, run_kernel, *more: run_kernel())
    monkeypatch.setattr(_backend, "run_kernel_kvcache", fake_batched)
    (q8, kn8, vn8, k8, v8, qd, kd, vd), kw = fp8_packed(packed_q, packed_k, True, seed=5)
    kw["cache_leftpad"] = torch.tensor(PK_PADS, dtype=torch.int32)
    q = q8.to(torch.bfloat16)
    args = (q, k8.clone(), v8.clone(), kn8, vn8)
    opts = dict(k_descale=kd, v_descale=vd, descale_per_batch=True, causal=True, **kw)
    try:
        validation._FORCE = True
        with no_host_reads(monkeypatch), pytest.raises(HostRead):
            flash3.attention_with_kvcache(*args, **opts)
        validation._FORCE = False
        calls.clear()
        with no_host_reads(monkeypatch):
            flash3.attention_with_kvcache(*args, **opts)
    finally:
        validation._FORCE = None
    a, t = calls["append"], calls["attention"]
    assert a["k"] is kn8 and a["v"] is vn8 and a["k_cache"].dtype == F8 and a["rotary"] is None
    assert (a["cu_q"] is None) != packed_q and (a["cu_k"] is None) != packed_k
    n_new = PK_LN if packed_k else [1] * 4
    assert torch.equal(t["seqused"], torch.tensor([n + m for n, m in zip(PK_LENS, n_new)],
                                                  dtype=torch.int32))
    assert t["descale_per_batch"] is True
    assert torch.equal(t["k_descale"], kd) and torch.equal(t["v_descale"], vd)


def test_fp8_kernel_wrappers_pass_descale_per_batch(monkeypatch):
    """_backend's wrappers of the C++ ops: an e4m3 cache's packed append asks the copy
    (descale_per_batch, no descales); the packed-query decode passes descale_per_batch when set,
    and nothing new when not (builds without it serve 16-bit calls)."""
    from flash3 import _backend
    seen = {}
    fake_ns = type("ns", (), {})()
    fake_ns.append_kv_sm90 = lambda *a, **kw: seen.setdefault("append", (a, kw))
    fake_ns.fwd_kvcache_sm90 = lambda *a, **kw: seen.setdefault("decode", []).append(kw)
    monkeypatch.setattr(torch.ops, "flash3", fake_ns)
    (q8, kn8, vn8, k8, v8, qd, kd, vd), kw = fp8_packed(True, True, True, seed=6)
    q = q8.to(torch.bfloat16)
    _backend.run_kernel_append_packed(q, k8, v8, kn8, vn8, kw["cache_seqlens"], kw["page_table"],
                                      kw["cu_seqlens_q"], kw["cu_seqlens_k_new"], None, None,
                                      False, True, None)
    a, akw = seen["append"]
    # the copy: descale_per_batch, no k_descale/v_descale (positional 13/14, or by keyword)
    assert akw["descale_per_batch"] is True and a[3] is kn8 and len(a) == 12
    assert "k_descale" not in akw and "v_descale" not in akw
    for per_batch in (True, False):
        _backend.run_kernel_varlen_kvcache(q, k8, v8, kw["cu_seqlens_q"], 4, kw["cache_seqlens"],
                                           kw["page_table"], 0.125, -1, 0, 0.0, 0, kd, vd,
                                           descale_per_batch=per_batch)
    with_flag, without = seen["decode"]
    assert with_flag["descale_per_batch"] is True and "descale_per_batch" not in without


def test_fp8_packed_rejected_calls_write_nothing():
    """Bad shapes or values with packed layouts on an FP8 cache: a ValueError (TypeError for a
    dtype) naming the argument, raised before anything is written."""
    (q8, kn8, vn8, k8, v8, qd, kd, vd), kw = fp8_packed(True, True, True, seed=7)
    q = q8.to(torch.bfloat16)
    i32 = lambda xs: torch.tensor(xs, dtype=torch.int32)  # noqa: E731
    base = dict(k_descale=kd, v_descale=vd, descale_per_batch=True, **kw)
    bad = [(dict(k_descale=torch.ones(q.shape[0], 2)), ValueError, "k_descale must have shape"),
           (dict(v_descale=vd[:, :1]), ValueError, "v_descale must have shape"),
           (dict(k_descale=kd.to(torch.float64)), TypeError, "k_descale"),
           (dict(cu_seqlens_k_new=i32([0, 2, 5, 5])), ValueError, "cu_seqlens_k_new must have shape"),
           (dict(cu_seqlens_k_new=i32([0, 2, 1, 5, 6])), ValueError, "cu_seqlens_k_new must start at 0"),
           (dict(cu_seqlens_q=i32([0, 3, 3, 2, 8])), ValueError, "cu_seqlens_q must start at 0"),
           (dict(cache_seqlens=i32([5, 0, 9, 40])), ValueError, "page_table has too few pages"),
           (dict(cache_leftpad=i32([0, 4, 0, 0])), ValueError, r"cache_leftpad\[1\] = 4 is outside"),
           (dict(cache_leftpad=i32([0, 0, 0])), ValueError, "cache_leftpad must be int32 of shape"),
           (dict(page_table=kw["page_table"][:3]), ValueError, "page_table has 3 rows"),
           (dict(k_descale=kd * float("nan")), ValueError, "k_descale must be finite"),
           (dict(max_seqlen_q=3), ValueError, "max_seqlen_q")]
    for change, exc, msg in bad:
        kc, vc = k8.clone(), v8.clone()
        with pytest.raises(exc, match=msg):
            flash3.attention_with_kvcache(q, kc, vc, kn8, vn8, **dict(base, **change))
        assert torch.equal(kc.view(torch.uint8), k8.view(torch.uint8)), msg
        assert torch.equal(vc.view(torch.uint8), v8.view(torch.uint8)), msg
    kc, vc = k8.clone(), v8.clone()
    with pytest.raises(ValueError, match=r"k must have shape \(total_new, 2, 64\)"):
        flash3.attention_with_kvcache(q, kc, vc, kn8[:, :1], vn8, **base)
    with pytest.raises(TypeError, match="float8_e4m3fn"):  # per batch: e4m3 new keys only
        flash3.attention_with_kvcache(q, kc, vc, kn8.to(torch.bfloat16), vn8.to(torch.bfloat16),
                                      **base)
    with pytest.raises(TypeError, match="v has dtype"):
        flash3.attention_with_kvcache(q, kc, vc, kn8, vn8.to(torch.bfloat16), **base)
    cos = torch.ones(64, 16)
    with pytest.raises(NotImplementedError, match="rotary"):
        flash3.attention_with_kvcache(q, kc, vc, kn8, vn8, rotary_cos=cos, rotary_sin=cos, **base)
    with pytest.raises(NotImplementedError, match="descales per slab"):
        flash3.attention_with_kvcache(q, kc, vc, kn8.to(torch.bfloat16), vn8.to(torch.bfloat16),
                                      **dict(base, descale_per_batch=False,
                                             k_descale=torch.ones(k8.shape[0], 2),
                                             v_descale=torch.ones(k8.shape[0], 2)))
    assert torch.equal(kc.view(torch.uint8), k8.view(torch.uint8))
    assert torch.equal(vc.view(torch.uint8), v8.view(torch.uint8))
    # through FA3's interface: a descale that does not broadcast to (sequences, h_k)
    with pytest.raises(ValueError, match="k_descale must broadcast"):
        fai.flash_attn_with_kvcache(q8, kc, vc, kn8, vn8, q_descale=qd, k_descale=kd[:, :1].T,
                                    v_descale=vd, **kw)
    assert torch.equal(kc.view(torch.uint8), k8.view(torch.uint8))



@pytest.mark.parametrize("packed_q", [False, True])
def test_descale_per_batch_on_16bit_cache_with_packed_new_keys(packed_q):
    """descale_per_batch with FA3's (batch, kv head) descales on a 16-bit cache and new keys packed
    by cu_seqlens_k_new (the packed append's route): the batched call's ValueError naming
    descale_per_batch, not a NotImplementedError, and nothing written. flash3's own API only:
    flash_attn_with_kvcache never sets descale_per_batch on a 16-bit cache (FA3 reads descales
    with FP8 only)."""
    b, h, h_k, d = 3, 4, 2, 64
    kc, vc = (torch.randn(b, 40, h_k, d, dtype=torch.bfloat16) for _ in range(2))
    kn, vn = (torch.randn(4, h_k, d, dtype=torch.bfloat16) for _ in range(2))
    kd, vd = (torch.rand(b, h_k) + 0.5 for _ in range(2))
    q = torch.randn(b, 1, h, d, dtype=torch.bfloat16)
    kw = dict(cache_seqlens=torch.tensor([5, 0, 17], dtype=torch.int32),
              cu_seqlens_k_new=torch.tensor([0, 1, 3, 4], dtype=torch.int32), k_descale=kd,
              v_descale=vd, descale_per_batch=True)
    if packed_q:
        q, kw = q.view(b, h, d), dict(kw, cu_seqlens_q=torch.tensor([0, 1, 2, 3], dtype=torch.int32),
                                      max_seqlen_q=1)
    before = kc.clone(), vc.clone()
    with pytest.raises(ValueError, match="descale_per_batch"):
        flash3.attention_with_kvcache(q, kc, vc, kn, vn, **kw)
    assert torch.equal(before[0], kc) and torch.equal(before[1], vc)  # nothing written

@pytest.mark.skipif(not HAS_SM90, reason="needs a CUDA sm_90 (H100/H200) device")
@pytest.mark.parametrize("page,causal,num_splits", [(16, True, 1), (256, False, 3), (16, False, 0)])
def test_fp8_paged_kernel_matches_spec_gpu(page, causal, num_splits):
    """The decode kernel (gathered FP8 loads) with FA3 descales against the spec; no fallback."""
    from flash3 import _backend
    if not _backend.has_descale_per_batch_kernel():
        pytest.skip("flash3._C without descale_per_batch")
    q8, k8, v8, table, lens, qd, kd, vd = fp8_paged(b=3, cap=600, h=8, h_k=2, d=128, page=page,
                                                    s_q=2, device="cuda", seed=page)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fallback warning would fail the test
        out = fai.flash_attn_with_kvcache(q8, k8, v8, cache_seqlens=lens, page_table=table,
                                          q_descale=qd, k_descale=kd, v_descale=vd,
                                          causal=causal, num_splits=num_splits)
    ref, _ = spec(q8, k8, v8, table, lens, qd, kd, vd, causal)
    # the kernel rounds x8 * descale once to bf16 (the 16-bit cache's precision), output bf16
    torch.testing.assert_close(out.float().cpu(), ref.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.skipif(not HAS_SM90, reason="needs a CUDA sm_90 (H100/H200) device")
@pytest.mark.parametrize("page,causal,s_new", [(16, True, 2), (None, False, 1), (256, True, 3)])
def test_fp8_new_keys_kernel_matches_spec_gpu(page, causal, s_new):
    """The fused append (e4m3 keys copied) then the decode kernel, against the spec: the caches
    byte for byte, the output as the decode test's; no fallback."""
    from flash3 import _backend
    if not _backend.has_append_e4m3_kernel():
        pytest.skip("flash3._C's append without descale_per_batch")
    q8, k8, v8, table, lens, qd, kd, vd = fp8_paged(b=3, cap=600, h=8, h_k=2, d=128,
                                                    page=page or 600, s_q=s_new, device="cuda",
                                                    seed=s_new)
    if page is None:  # one page of the whole row per entry: a contiguous cache
        k8, v8, table = k8[table[:, 0].long()], v8[table[:, 0].long()], None
    lens = lens.clamp(max=600 - s_new)
    kn8, vn8 = (x.cuda() for x in fp8_new_keys(kd.cpu(), vd.cpu(), s_new, seed=7, d=128))
    kc, vc = k8.clone(), v8.clone()
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fallback warning would fail the test
        out = fai.flash_attn_with_kvcache(q8, kc, vc, kn8, vn8, cache_seqlens=lens,
                                          page_table=table, q_descale=qd, k_descale=kd,
                                          v_descale=vd, causal=causal)
    kc_s, vc_s = k8.cpu(), v8.cpu()
    ref, _ = spec(q8, kc_s, vc_s, table, lens, qd, kd, vd, causal, k_new=kn8.cpu(),
                  v_new=vn8.cpu())
    assert torch.equal(kc.cpu().view(torch.uint8), kc_s.view(torch.uint8))
    assert torch.equal(vc.cpu().view(torch.uint8), vc_s.view(torch.uint8))
    torch.testing.assert_close(out.float().cpu(), ref.float(), atol=2e-2, rtol=2e-2)
