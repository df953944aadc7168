"""Malformed calls raise ValueError/TypeError naming the argument, and change nothing."""

import pytest
import torch

import flash3

F8 = getattr(torch, "float8_e4m3fn", None)


def qkv(b=2, s_q=5, s_k=7, h=4, h_k=2, d=8, d_v=8, dtype=torch.float32):
    return (torch.randn(b, s_q, h, d, dtype=dtype), torch.randn(b, s_k, h_k, d, dtype=dtype),
            torch.randn(b, s_k, h_k, d_v, dtype=dtype))


def raises(exc, match, fn, *a, **kw):
    with pytest.raises(exc, match=match):
        fn(*a, **kw)


q, k, v = qkv()

ATTENTION_CASES = [  # (exception, message regex, args, kwargs)
    (TypeError, "q must be a torch.Tensor", ([1.0], k, v), {}),
    (TypeError, "v must be a torch.Tensor", (q, k, None), {}),
    (ValueError, "q must be 4-D", (q[0], k, v), {}),
    (ValueError, "k must be 4-D", (q, k[0], v), {}),
    (TypeError, "k has dtype", (q, k.half(), v), {}),
    (TypeError, "v has dtype", (q, k, v.double()), {}),
    (TypeError, "q has dtype", (q.double(), k.double(), v.double()), {}),
    (TypeError, "q has dtype", (q.int(), k.int(), v.int()), {}),
    (ValueError, "divisible", (torch.randn(2, 5, 3, 8), k, v), {}),
    (ValueError, "v has 1 heads", (q, k, v[:, :, :1]), {}),
    (ValueError, "head dim of q must be in 1..256", qkv(d=300), {}),
    (ValueError, "head dim of v must be in 1..256", qkv(d_v=257), {}),
    (ValueError, "head dim of q must be in 1..256", qkv(d=0), {}),
    (ValueError, "head dim of k", (q, torch.randn(2, 7, 2, 4), v), {}),
    (ValueError, "k has seqlen 7 but v has 6", (q, k, v[:, :6]), {}),
    (ValueError, "batch", (q[:1], k, v), {}),
    (ValueError, "window_size", (q, k, v), dict(window_size=(-2, 0))),
    (ValueError, "window_size", (q, k, v), dict(window_size=(0, -5))),
    (TypeError, "window_size", (q, k, v), dict(window_size=3)),
    (ValueError, "softcap", (q, k, v), dict(softcap=-1.0)),
    (TypeError, "softcap", (q, k, v), dict(softcap="1")),
    (TypeError, "softmax_scale", (q, k, v), dict(softmax_scale="x")),
    (TypeError, "causal", (q, k, v), dict(causal=1)),
    (ValueError, "q_descale is only used", (q, k, v), dict(q_descale=torch.ones(2, 2))),
]


@pytest.mark.parametrize("case", range(len(ATTENTION_CASES)))
def test_attention_errors(case):
    exc, match, args, kw = ATTENTION_CASES[case]
    raises(exc, match, flash3.attention, *args, **kw)


def test_device_mismatch():
    if torch.cuda.is_available():
        raises(ValueError, "k is on", flash3.attention, q, k.cuda(), v)
    else:  # meta tensors give a second device without a GPU
        raises(ValueError, "k is on", flash3.attention, q, k.to("meta"), v)


@pytest.mark.skipif(F8 is None, reason="no float8 in this torch")
def test_fp8_descales():
    q8, k8, v8 = (x.to(F8) for x in (q, k, v))
    ok = torch.ones(2, 2)
    raises(ValueError, "q_descale is required", flash3.attention, q8, k8, v8)
    raises(ValueError, "k_descale is required", flash3.attention, q8, k8, v8, q_descale=ok)
    raises(ValueError, "v_descale is required", flash3.attention, q8, k8, v8, q_descale=ok,
           k_descale=ok)
    raises(ValueError, "k_descale must have shape", flash3.attention, q8, k8, v8,
           q_descale=ok, k_descale=torch.ones(2, 3), v_descale=ok)
    raises(TypeError, "v_descale must be float32", flash3.attention, q8, k8, v8,
           q_descale=ok, k_descale=ok, v_descale=ok.double())
    raises(TypeError, "k has dtype", flash3.attention, q8, k, v8)


# ---------------------------------------------------------------- varlen
def varlen_args():
    cq = torch.tensor([0, 3, 5], dtype=torch.int32)
    ck = torch.tensor([0, 4, 7], dtype=torch.int32)
    return [torch.randn(5, 4, 8), torch.randn(7, 2, 8), torch.randn(7, 2, 8), cq, ck, 3, 4]


VARLEN_CASES = [  # (exception, regex, index to replace, value)
    (ValueError, "q must be 3-D", 0, torch.randn(1, 5, 4, 8)),
    (TypeError, "cu_seqlens_q must be int32", 3, torch.tensor([0, 3, 5])),
    (ValueError, "cu_seqlens_k must be 1-D", 4, torch.tensor([[0, 4, 7]], dtype=torch.int32)),
    (ValueError, "cu_seqlens_q has length 2", 3, torch.tensor([0, 5], dtype=torch.int32)),
    (ValueError, "cu_seqlens_q must be non-decreasing", 3, torch.tensor([0, 4, 3], dtype=torch.int32)),
    (ValueError, "cu_seqlens_k must start at 0", 4, torch.tensor([1, 4, 7], dtype=torch.int32)),
    (ValueError, "past the packed length", 4, torch.tensor([0, 4, 8], dtype=torch.int32)),
    (ValueError, "max_seqlen_q", 5, 2),
    (ValueError, "max_seqlen_k", 6, 3),
    (TypeError, "max_seqlen_k must be an int", 6, 4.0),
    (TypeError, "cu_seqlens_k must be a torch.Tensor", 4, [0, 4, 7]),
    (ValueError, "k has 7 tokens but v has 6", 2, torch.randn(6, 2, 8)),
]


@pytest.mark.parametrize("case", range(len(VARLEN_CASES)))
def test_varlen_errors(case):
    exc, match, idx, val = VARLEN_CASES[case]
    args = varlen_args()
    args[idx] = val
    raises(exc, match, flash3.attention_varlen, *args)


# ---------------------------------------------------------------- kv cache
def kv_setup(paged=False):
    q = torch.randn(2, 1, 4, 8)
    if paged:
        kc, vc = torch.randn(6, 4, 2, 8), torch.randn(6, 4, 2, 8)  # 6 pages of 4
        table = torch.tensor([[5, 0], [2, 3]], dtype=torch.int32)     # capacity 8 per row
    else:
        kc, vc, table = torch.randn(2, 8, 2, 8), torch.randn(2, 8, 2, 8), None
    k, v = torch.randn(2, 2, 2, 8), torch.randn(2, 2, 2, 8)
    seqlens = torch.tensor([3, 5], dtype=torch.int32)
    return dict(q=q, k_cache=kc, v_cache=vc, k=k, v=v, cache_seqlens=seqlens, page_table=table)


KV_CASES = [  # (exception, regex, paged, overrides)
    (ValueError, "k and v must be given together", False, dict(v=None)),
    (ValueError, "cache overflow", False, dict(cache_seqlens=torch.tensor([3, 7], dtype=torch.int32))),
    (ValueError, "cache_seqlens\\[0\\] is negative", False,
     dict(cache_seqlens=torch.tensor([-1, 2], dtype=torch.int32))),
    (ValueError, "cache_seqlens must be >= 0", False, dict(cache_seqlens=-2)),
    (ValueError, "cache_seqlens must have shape", False,
     dict(cache_seqlens=torch.tensor([3], dtype=torch.int32))),
    (TypeError, "cache_seqlens must be int32", False, dict(cache_seqlens=torch.tensor([3, 5]))),
    (ValueError, "k_cache must be 4-D", False, dict(k_cache=torch.randn(2, 8, 16))),
    (TypeError, "v_cache has dtype", False, dict(v_cache=torch.randn(2, 8, 2, 8).half())),
    (ValueError, "k must have shape", False, dict(k=torch.randn(2, 2, 1, 8))),
    (ValueError, "v must have shape", False, dict(v=torch.randn(2, 3, 2, 8))),
    (ValueError, "k_cache has batch", False, dict(q=torch.randn(3, 1, 4, 8))),
    (ValueError, "num_splits", False, dict(num_splits=-1)),
    (TypeError, "page_table must be int32", True, dict(page_table=torch.tensor([[5, 0], [2, 3]]))),
    (ValueError, "page_table\\[1, 0\\] = 6 is out of range", True,
     dict(page_table=torch.tensor([[5, 0], [6, 3]], dtype=torch.int32))),
    (ValueError, "page_table\\[0, 1\\] = -1 is out of range", True,
     dict(page_table=torch.tensor([[5, -1], [2, 3]], dtype=torch.int32))),
    (ValueError, "too few pages", True, dict(cache_seqlens=torch.tensor([3, 7], dtype=torch.int32))),
    (ValueError, "page_table must be 2-D", True, dict(page_table=torch.tensor([5, 0], dtype=torch.int32))),
]


@pytest.mark.parametrize("case", range(len(KV_CASES)))
def test_kvcache_errors_leave_cache_unchanged(case):
    exc, match, paged, over = KV_CASES[case]
    args = kv_setup(paged)
    args.update(over)
    kc, vc = args.pop("k_cache"), args.pop("v_cache")
    kc0, vc0 = kc.clone(), vc.clone()
    with pytest.raises(exc, match=match):
        flash3.attention_with_kvcache(args.pop("q"), kc, vc, args.pop("k"), args.pop("v"), **args)
    assert torch.equal(kc, kc0) and torch.equal(vc, vc0)


def test_kvcache_rejected_call_writes_nothing():
    args = kv_setup(paged=True)
    kc, vc = args["k_cache"], args["v_cache"]
    kc0, vc0 = kc.clone(), vc.clone()
    bad = torch.tensor([[5, 0], [2, 9]], dtype=torch.int32)  # row 1 page 9 does not exist
    with pytest.raises(ValueError, match="page_table"):
        flash3.attention_with_kvcache(args["q"], kc, vc, args["k"], args["v"],
                                      cache_seqlens=torch.tensor([3, 5], dtype=torch.int32),
                                      page_table=bad)
    assert torch.equal(kc, kc0) and torch.equal(vc, vc0)
    args = kv_setup()
    kc, vc = args["k_cache"], args["v_cache"]
    kc0 = kc.clone()
    with pytest.raises(ValueError, match="overflow"):
        flash3.attention_with_kvcache(args["q"], kc, vc, args["k"], args["v"],
                                      cache_seqlens=torch.tensor([0, 7], dtype=torch.int32))
    assert torch.equal(kc, kc0)


def test_deterministic_must_be_bool():
    import pytest
    q = torch.randn(1, 8, 2, 16)
    with pytest.raises(TypeError, match="deterministic"):
        flash3.attention(q, q, q, deterministic=1)
    cu = torch.tensor([0, 8], dtype=torch.int32)
    with pytest.raises(TypeError, match="deterministic"):
        flash3.attention_varlen(q[0], q[0], q[0], cu, cu, 8, 8, deterministic="yes")
