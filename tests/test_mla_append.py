"""MLA decode with new keys through FA3's flash_attn_with_kvcache (qv, d 64 rope, d_v 512 latent,
k (b, s_new, h_k, 64) / v (b, s_new, h_k, 512), rotary): the fused append writes them into the cache
(rotated with q as FA3 does), then the MLA decode kernel attends over cache_seqlens + s_new. Here on
CPU tensors: the kernel calls are faked by flash3's references (the append by
reference.kvcache_append_packed, the decode by the FA3 spec), so these tests check the routing,
what reaches each call, and the argument checks (a rejected call writes nothing). The kernels
themselves: tests/test_mla_append_gpu.py (sm_90) and the simulator's "mlaapp" smoke feature."""
import pytest
import torch

import flash3.flash_attn_interface as fai
from flash3 import _backend, reference, validation
from flash3.reference.fa3 import fa3_forward

D, DV = 64, 512
I32 = torch.int32


@pytest.fixture
def fake_kernels(monkeypatch):
    """The MLA kernel route on CPU tensors: the kernel reasons say yes, the fused append is
    reference.kvcache_append_packed and the decode kernel the FA3 spec over the appended cache;
    each call recorded."""
    calls = []

    def append(q, k_cache, v_cache, k, v, cache_seqlens, page_table, cu_seqlens_q, cu_seqlens_k_new,
               rotary_cos, rotary_sin, rotary_interleaved, q_per_token, rotary_seqlens):
        calls.append(dict(kind="append", cu_q=cu_seqlens_q, cu_k=cu_seqlens_k_new, per_token=q_per_token,
                          interleaved=rotary_interleaved, rotary_seqlens=rotary_seqlens, page_table=page_table))
        q_out = reference.kvcache_append_packed(q, k_cache, v_cache, k, v, cache_seqlens, page_table,
                                                cu_seqlens_q, cu_seqlens_k_new, rotary_cos, rotary_sin,
                                                rotary_interleaved, q_per_token, rotary_seqlens)
        return q.new_empty(0) if q_out is None else q_out

    def decode(q, k_cache, v_cache, seqused, page_table, scale, left, right, softcap, qv, cu, leftpad, chunk):
        return fa3_forward(q, k_cache, v_cache, softmax_scale=scale, window_left=left, window_right=right,
                           softcap=softcap, qv=qv, cache_seqlens=seqused, page_table=page_table,
                           cu_seqlens_q=cu, cache_leftpad=leftpad, attention_chunk=chunk)

    def run_kernel_kvcache(q, k_cache, v_cache, seqused_k, page_table, softmax_scale, left, right, softcap,
                           num_splits, qv=None, cache_leftpad=None, attention_chunk=0, **extra):
        assert not extra
        calls.append(dict(kind="batched", q=q, seqused=seqused_k, qv=qv, leftpad=cache_leftpad,
                          num_splits=num_splits, chunk=attention_chunk))
        return decode(q, k_cache, v_cache, seqused_k, page_table, softmax_scale, left, right, softcap, qv,
                      None, cache_leftpad, attention_chunk)

    def run_kernel_varlen_kvcache(q, k_cache, v_cache, cu_seqlens_q, max_seqlen_q, seqused_k, page_table,
                                  softmax_scale, left, right, softcap, num_splits=0, qv=None, cache_leftpad=None,
                                  attention_chunk=0, **extra):
        assert not extra
        calls.append(dict(kind="varlen", q=q, seqused=seqused_k, qv=qv, max_seqlen_q=max_seqlen_q,
                          leftpad=cache_leftpad, chunk=attention_chunk))
        return decode(q, k_cache, v_cache, seqused_k, page_table, softmax_scale, left, right, softcap, qv,
                      cu_seqlens_q, cache_leftpad, attention_chunk)

    monkeypatch.setattr(_backend, "kernel_chunk_reason", lambda *a: None)  # the extension's pick says yes

    def no_fallback(reason, what="forward"):
        raise AssertionError(f"{what} fell back: {reason}")

    monkeypatch.setattr(_backend, "kernel_mla_reason", lambda *a: None)
    monkeypatch.setattr(_backend, "kernel_packed_append_reason", lambda *a: None)
    monkeypatch.setattr(_backend, "run_kernel_append_packed", append)
    monkeypatch.setattr(_backend, "run_kernel_kvcache", run_kernel_kvcache)
    monkeypatch.setattr(_backend, "run_kernel_varlen_kvcache", run_kernel_varlen_kvcache)
    monkeypatch.setattr(_backend, "warn_fallback", no_fallback)
    return calls


def make_cache(b, cap, page, gen):
    """Contiguous (page None) or pages of `page` keys in shuffled order, 2 spare pages."""
    if page is None:
        return torch.randn(b, cap, 1, D, generator=gen), torch.randn(b, cap, 1, DV, generator=gen), None
    per_row = -(-cap // page)
    n = b * per_row + 2
    table = torch.randperm(n, generator=gen)[:b * per_row].view(b, per_row).to(I32)
    return torch.randn(n, page, 1, D, generator=gen), torch.randn(n, page, 1, DV, generator=gen), table


def rotary_tables(n, rotary_dim):
    ang = torch.arange(n, dtype=torch.float32)[:, None] * 10000.0 ** (
        -torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim)
    return ang.cos(), ang.sin()


def spec(q, kc, vc, **kw):
    """The FA3 spec on copies of the caches: (out, lse, k_cache, v_cache after the append)."""
    kc, vc = kc.clone(), vc.clone()
    scale = kw.pop("softmax_scale", (D + DV) ** -0.5)
    out, lse = fa3_forward(q, kc, vc, softmax_scale=scale, **kw)
    return out, lse, kc, vc


@pytest.mark.parametrize("page", [None, 64])
def test_new_keys_and_rotary_take_the_append_then_the_mla_kernel(fake_kernels, page):
    """DeepSeek's decode with its new latent/rope keys: the append gets the new keys (q rotated per
    token: causal), the kernel q rotated, qv as it is, and cache_seqlens + s_new; caches, out and lse
    are the spec's (rotary at FA3's positions; cache_leftpad moves the masks only)."""
    g = torch.Generator().manual_seed(0)
    b, s, h = 3, 2, 16
    kc, vc, table = make_cache(b, 130, page, g)
    q, qv = torch.randn(b, s, h, D, generator=g), torch.randn(b, s, h, DV, generator=g)
    k, v = torch.randn(b, s, 1, D, generator=g), torch.randn(b, s, 1, DV, generator=g)
    lens = torch.tensor([0, 70, 128], dtype=I32)
    pads = torch.tensor([0, 5, 0], dtype=I32)
    cos, sin = rotary_tables(200, 32)  # rotary_dim 32 < d: the last 32 channels pass through
    kw = dict(cache_seqlens=lens, page_table=table, cache_leftpad=pads, rotary_cos=cos, rotary_sin=sin)
    want, want_lse, want_kc, want_vc = spec(q, kc, vc, qv=qv, k_new=k, v_new=v, window_right=0,
                                            rotary_interleaved=False, **kw)
    out, lse, *_ = fai.flash_attn_with_kvcache(q, kc, vc, k, v, qv=qv, causal=True, rotary_interleaved=False,
                                                num_splits=2, return_softmax_lse=True, **kw)
    app, dec = fake_kernels
    assert app["kind"] == "append" and app["cu_q"] is None and app["cu_k"] is None
    assert app["per_token"] and not app["interleaved"]
    assert dec["kind"] == "batched" and dec["qv"] is qv and dec["num_splits"] == 2
    assert dec["seqused"].dtype == I32 and dec["seqused"].tolist() == [2, 72, 130]
    assert torch.equal(dec["leftpad"], pads) and not torch.equal(dec["q"], q)  # rotated
    assert torch.equal(kc, want_kc) and torch.equal(vc, want_vc)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse, want_lse, rtol=1e-5, atol=1e-5)


def test_interleaved_rotary_at_rotary_seqlens_without_causal(fake_kernels):
    """GPT-J pairs over all 64 rope channels at FA3's rotary_seqlens; without causal or a window
    every query of an entry sits at its entry's position (q_per_token False)."""
    g = torch.Generator().manual_seed(1)
    b, s_q, s_new, h = 2, 2, 3, 8
    kc, vc, table = make_cache(b, 64, 16, g)
    q, qv = torch.randn(b, s_q, h, D, generator=g), torch.randn(b, s_q, h, DV, generator=g)
    k, v = torch.randn(b, s_new, 1, D, generator=g), torch.randn(b, s_new, 1, DV, generator=g)
    cos, sin = rotary_tables(100, 64)
    kw = dict(cache_seqlens=torch.tensor([10, 61], dtype=I32), page_table=table, rotary_cos=cos, rotary_sin=sin,
              rotary_seqlens=torch.tensor([90, 3], dtype=I32))
    want, _, want_kc, want_vc = spec(q, kc, vc, qv=qv, k_new=k, v_new=v, rotary_interleaved=True, **kw)
    out = fai.flash_attn_with_kvcache(q, kc, vc, k, v, qv=qv, **kw)  # FA3's default: interleaved
    app, dec = fake_kernels
    assert app["interleaved"] and not app["per_token"] and app["rotary_seqlens"].tolist() == [90, 3]
    assert dec["seqused"].tolist() == [13, 64]
    assert torch.equal(kc, want_kc) and torch.equal(vc, want_vc)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


def test_packed_layouts_and_cache_batch_idx(fake_kernels):
    """Packed new keys (cu_seqlens_k_new) with packed queries (cu_seqlens_q, with a tail row of no
    entry: out 0) take the append's packed layout and the kernel's packed route over cache_seqlens
    + n_new_i (no host read); batched q with packed keys and cache_batch_idx (the contiguous cache
    as pages of whole rows) the batched route."""
    g = torch.Generator().manual_seed(2)
    h = 8
    kc, vc, table = make_cache(3, 96, 64, g)
    cu_q, cu_k = torch.tensor([0, 1, 3, 3], dtype=I32), torch.tensor([0, 2, 2, 5], dtype=I32)
    q, qv = torch.randn(4, h, D, generator=g), torch.randn(4, h, DV, generator=g)
    k, v = torch.randn(6, 1, D, generator=g), torch.randn(6, 1, DV, generator=g)
    cos, sin = rotary_tables(128, 64)
    lens = torch.tensor([20, 94, 0], dtype=I32)
    kw = dict(cache_seqlens=lens, page_table=table, rotary_cos=cos, rotary_sin=sin, cu_seqlens_q=cu_q,
              cu_seqlens_k_new=cu_k)
    want, want_lse, want_kc, want_vc = spec(q, kc, vc, qv=qv, k_new=k, v_new=v, window_right=0, **kw)
    out, lse, *_ = fai.flash_attn_with_kvcache(q, kc, vc, k, v, qv=qv, max_seqlen_q=2, causal=True,
                                                return_softmax_lse=True, **kw)
    app, dec = fake_kernels
    assert app["cu_q"] is cu_q and app["cu_k"] is cu_k
    assert dec["kind"] == "varlen" and dec["max_seqlen_q"] == 2 and dec["seqused"].tolist() == [22, 94, 3]
    assert torch.equal(kc, want_kc) and torch.equal(vc, want_vc)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse, want_lse, rtol=1e-5, atol=1e-5)
    assert (out[3] == 0).all()

    fake_kernels.clear()
    kc, vc, _ = make_cache(4, 40, None, g)
    idx = torch.tensor([2, 0], dtype=I32)
    q, qv = torch.randn(2, 1, h, D, generator=g), torch.randn(2, 1, h, DV, generator=g)
    cu_k = torch.tensor([0, 1, 4], dtype=I32)
    k, v = torch.randn(4, 1, D, generator=g), torch.randn(4, 1, DV, generator=g)
    kw = dict(cache_seqlens=torch.tensor([7, 30], dtype=I32), cache_batch_idx=idx, cu_seqlens_k_new=cu_k)
    want, _, want_kc, want_vc = spec(q, kc, vc, qv=qv, k_new=k, v_new=v, **kw)
    out = fai.flash_attn_with_kvcache(q, kc, vc, k, v, qv=qv, **kw)
    app, dec = fake_kernels
    assert app["cu_q"] is None and app["page_table"].tolist() == [[2], [0]]
    assert dec["kind"] == "batched" and dec["seqused"].tolist() == [8, 33]
    assert torch.equal(kc, want_kc) and torch.equal(vc, want_vc)  # rows 1 and 3 untouched
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


def test_packed_queries_with_leftpad_and_new_keys_take_the_kernel(fake_kernels):
    """cache_leftpad with packed queries and packed new keys (no longer the spec's): the append
    writes at cache_seqlens[i] + t as FA3 does (the left padding moves the masks only), the
    kernel's packed route gets the leftpad and cache_seqlens + n_new_i; caches, out and lse are
    the spec's."""
    g = torch.Generator().manual_seed(7)
    h = 8
    kc, vc, table = make_cache(3, 96, 16, g)
    cu_q, cu_k = torch.tensor([0, 2, 3, 3], dtype=I32), torch.tensor([0, 2, 3, 4], dtype=I32)
    q, qv = torch.randn(4, h, D, generator=g), torch.randn(4, h, DV, generator=g)
    k, v = torch.randn(4, 1, D, generator=g), torch.randn(4, 1, DV, generator=g)
    cos, sin = rotary_tables(128, 64)
    pads = torch.tensor([3, 0, 50], dtype=I32)
    kw = dict(cache_seqlens=torch.tensor([20, 90, 60], dtype=I32), page_table=table, cache_leftpad=pads,
              rotary_cos=cos, rotary_sin=sin, cu_seqlens_q=cu_q, cu_seqlens_k_new=cu_k)
    want, want_lse, want_kc, want_vc = spec(q, kc, vc, qv=qv, k_new=k, v_new=v, window_right=0, **kw)
    out, lse, *_ = fai.flash_attn_with_kvcache(q, kc, vc, k, v, qv=qv, max_seqlen_q=2, causal=True,
                                                return_softmax_lse=True, **kw)
    app, dec = fake_kernels
    assert app["cu_q"] is cu_q and app["cu_k"] is cu_k and app["per_token"]
    assert dec["kind"] == "varlen" and torch.equal(dec["leftpad"], pads)
    assert dec["seqused"].tolist() == [22, 91, 61]
    assert torch.equal(kc, want_kc) and torch.equal(vc, want_vc)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse, want_lse, rtol=1e-5, atol=1e-5)
    assert (out[3] == 0).all()

@pytest.mark.parametrize("packed", [False, True])
def test_attention_chunk_rotates_q_per_token(fake_kernels, packed):
    """attention_chunk without causal or a window still rotates q per token (FA3: a chunk makes the
    call local), and reaches the MLA kernel; caches, out and lse are the spec's."""
    g = torch.Generator().manual_seed(8)
    h = 8
    kc, vc, table = make_cache(2, 128, 64, g)
    cos, sin = rotary_tables(200, 64)
    kw = dict(cache_seqlens=torch.tensor([30, 100], dtype=I32), page_table=table, rotary_cos=cos, rotary_sin=sin)
    if packed:
        kw.update(cu_seqlens_q=torch.tensor([0, 2, 5], dtype=I32), cu_seqlens_k_new=torch.tensor([0, 2, 5], dtype=I32))
        q, qv = torch.randn(5, h, D, generator=g), torch.randn(5, h, DV, generator=g)
        k, v = torch.randn(5, 1, D, generator=g), torch.randn(5, 1, DV, generator=g)
    else:
        q, qv = torch.randn(2, 3, h, D, generator=g), torch.randn(2, 3, h, DV, generator=g)
        k, v = torch.randn(2, 3, 1, D, generator=g), torch.randn(2, 3, 1, DV, generator=g)
    want, want_lse, want_kc, want_vc = spec(q, kc, vc, qv=qv, k_new=k, v_new=v, attention_chunk=32, **kw)
    out, lse, *_ = fai.flash_attn_with_kvcache(q, kc, vc, k, v, qv=qv, attention_chunk=32, return_softmax_lse=True,
                                                **({"max_seqlen_q": 3} if packed else {}), **kw)
    app, dec = fake_kernels
    assert app["per_token"] and dec["chunk"] == 32 and dec["kind"] == ("varlen" if packed else "batched")
    assert torch.equal(kc, want_kc) and torch.equal(vc, want_vc)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse, want_lse, rtol=1e-5, atol=1e-5)

def test_sglang_views_are_appended_in_place(fake_kernels):
    """SGLang's one 576-wide cache, k_cache / v_cache its rope / latent views: the new keys land in
    that buffer."""
    g = torch.Generator().manual_seed(3)
    kv = torch.randn(4, 64, 1, DV + D, generator=g)
    vc, kc = kv[..., :DV], kv[..., DV:]
    table = torch.tensor([[3, 0], [1, 2]], dtype=I32)
    q, qv = torch.randn(2, 1, 8, D, generator=g), torch.randn(2, 1, 8, DV, generator=g)
    k, v = torch.randn(2, 1, 1, D, generator=g), torch.randn(2, 1, 1, DV, generator=g)
    lens = torch.tensor([100, 64], dtype=I32)
    before = kv.clone()
    fai.flash_attn_with_kvcache(q, kc, vc, k, v, qv=qv, cache_seqlens=lens, page_table=table, causal=True)
    changed = (kv != before).any(-1)[..., 0]  # (pages, page_size)
    assert changed.nonzero().tolist() == [[0, 36], [2, 0]]  # row 0: slot 100 (page 0), row 1: 64 (page 2)
    assert torch.equal(kv[0, 36, 0, DV:], k[0, 0, 0]) and torch.equal(kv[0, 36, 0, :DV], v[0, 0, 0])


def _args(g, b=2, s=1, h=4, cap=16):
    kc, vc = torch.randn(b, cap, 1, D, generator=g), torch.randn(b, cap, 1, DV, generator=g)
    q, qv = torch.randn(b, s, h, D, generator=g), torch.randn(b, s, h, DV, generator=g)
    k, v = torch.randn(b, s, 1, D, generator=g), torch.randn(b, s, 1, DV, generator=g)
    return q, qv, kc, vc, k, v


@pytest.mark.parametrize("case,fragment", [
    ("v_d256", "v must have shape"),
    ("v_missing", "k and v must be given together"),
    ("k_packed_rows", "cu_seqlens_k_new must have shape"),
    ("rotary_no_k", "rotary_cos/rotary_sin need the new keys"),
    ("rotary_dim", "rotary_dim"),
    ("rotary_seqlens", "rotary_seqlens must be int32"),
    ("overflow", "cache overflow"),
    ("rotary_range", "rotary_cos/rotary_sin have 8 positions"),
    ("leftpad", "cache_leftpad[1]"),
    ("cu_k_values", "cu_seqlens_k_new must start at 0"),
])
def test_bad_arguments_raise_and_write_nothing(fake_kernels, case, fragment):
    """Each bad argument raises ValueError naming it before anything is written (the caches are
    unchanged, no kernel called); value checks in validation mode (always for CPU tensors)."""
    g = torch.Generator().manual_seed(4)
    q, qv, kc, vc, k, v = _args(g)
    kc0, vc0 = kc.clone(), vc.clone()
    cos, sin = rotary_tables(64, 64)
    lens = torch.tensor([3, 9], dtype=I32)
    kw = dict(qv=qv, cache_seqlens=lens)
    if case == "v_d256":
        args = (k, v[..., :256])
    elif case == "v_missing":
        args = (k, None)
    elif case == "k_packed_rows":
        args = (k[:, 0], v[:, 0])
        kw["cu_seqlens_k_new"] = torch.tensor([0, 1], dtype=I32)
    elif case == "rotary_no_k":
        args = (None, None)
        kw.update(rotary_cos=cos, rotary_sin=sin)
    elif case == "rotary_dim":
        args = (k, v)
        c2, s2 = rotary_tables(64, 128)
        kw.update(rotary_cos=c2, rotary_sin=s2)
    elif case == "rotary_seqlens":
        args = (k, v)
        kw.update(rotary_cos=cos, rotary_sin=sin, rotary_seqlens=torch.tensor([1], dtype=I32))
    elif case == "overflow":
        args = (k, v)
        kw["cache_seqlens"] = torch.tensor([3, 16], dtype=I32)
    elif case == "rotary_range":
        args = (k, v)
        kw.update(rotary_cos=cos[:8], rotary_sin=sin[:8], cache_seqlens=torch.tensor([3, 8], dtype=I32))
    elif case == "leftpad":
        args = (k, v)
        kw["cache_leftpad"] = torch.tensor([0, 11], dtype=I32)
    else:
        args = (k[:, 0], v[:, 0])
        kw["cu_seqlens_k_new"] = torch.tensor([1, 1, 2], dtype=I32)
    with pytest.raises(ValueError, match=fragment.replace("[", r"\[")):
        fai.flash_attn_with_kvcache(q, kc, vc, *args, **kw)
    assert fake_kernels == []
    assert torch.equal(kc, kc0) and torch.equal(vc, vc0)


def test_value_checks_off_leave_the_kernel_in_bounds(fake_kernels, monkeypatch):
    """With validation off (CUDA tensors without flash3.set_validation) the values are not read on
    the host: the call reaches the append, whose kernel skips slots outside the cache (here the
    reference stands in for it, so only the routing is checked)."""
    monkeypatch.setattr(validation, "validation_enabled", lambda *a: False)
    g = torch.Generator().manual_seed(5)
    q, qv, kc, vc, k, v = _args(g)
    fai.flash_attn_with_kvcache(q, kc, vc, k, v, qv=qv, cache_seqlens=torch.tensor([3, 9], dtype=I32))
    assert [c["kind"] for c in fake_kernels] == ["append", "batched"]


def test_what_the_append_route_does_not_take_runs_the_spec(monkeypatch):
    """Without the fused append's reason saying yes (CPU tensors, or new keys not of q's dtype) MLA
    calls with new keys run the spec."""
    calls = []
    monkeypatch.setattr(_backend, "kernel_mla_reason", lambda *a: None)
    monkeypatch.setattr(_backend, "warn_fallback", lambda reason, what="": calls.append(reason))
    monkeypatch.setattr(_backend, "run_kernel_kvcache", lambda *a, **k: pytest.fail("kernel called"))
    g = torch.Generator().manual_seed(6)
    q, qv, kc, vc, k, v = _args(g)
    assert _backend.kernel_packed_append_reason(q, kc, vc, k, v) is not None  # CPU tensors
    lens = torch.tensor([3, 9], dtype=I32)
    want, _, want_kc, _ = spec(q, kc, vc, qv=qv, k_new=k, v_new=v, cache_seqlens=lens)
    out = fai.flash_attn_with_kvcache(q, kc, vc, k, v, qv=qv, cache_seqlens=lens)
    assert torch.equal(out, want) and torch.equal(kc, want_kc)
