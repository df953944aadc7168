"""Packed (varlen) queries against a paged or contiguous KV cache on the decode kernel
(fwd_kvcache_sm90 with cu_seqlens_q) on an sm_90 GPU: the issue's batch (1, 7, 300, 0 and 5
queries over caches of 2000, 0, 777, 1234 and 16 keys), pages of 1, 16 and 256 keys, bf16 and
FP8 (e4m3) caches, GQA, causal bottom-right per sequence, split-KV, packed rows of no sequence.
Each sequence against the fp64 oracle on its logical keys (FlashAttention rule). Skipped without
an sm_90 device or a flash3._C with a decode kernel of the head dim.
"""
import json
import math

import pytest
import torch

import flash3
from helpers import assert_close_fa, attention_naive, attention_ref64, max_err

HAS_SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
pytestmark = [pytest.mark.requires_sm90,
              pytest.mark.skipif(not HAS_SM90, reason="needs a CUDA sm_90 (H100/H200) device")]

LENS_Q = [1, 7, 300, 0, 5]
LENS_K = [2000, 0, 777, 1234, 16]
H, H_K = 8, 2  # GQA g = 4: sequence 2 packs 1200 rows (10 tiles of 128)


def built_decode(key="decode"):
    if not hasattr(torch.ops.flash3, "kernel_info"):
        return set()
    return {tuple(x) for x in json.loads(torch.ops.flash3.kernel_info()).get(key, [])}


def head_dim(fp8):
    """A built bf16 decode kernel's head dim (128 first), else skip."""
    built = built_decode("decode_fp8_cache" if fp8 else "decode")
    for d in (128, 64, 256, 96, 192):
        if ("bf16", d, d) in built:
            return d
    pytest.skip(f"flash3._C has no bf16 decode kernel{' (FP8 cache)' if fp8 else ''}")


def cu(lens):
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)


def make_batch(page_size, fp8, d, tail=0, seed=0):
    """CUDA q (total_q + tail, H, d) bf16; a paged cache (page_size None: contiguous
    (b, capacity, ·)) in shuffled pages; the logical keys of each sequence (fp32, on the CPU:
    x8 * descale for an FP8 cache); descales (slabs, H_K)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(LENS_Q) + tail, H, d, generator=g).to(torch.bfloat16)
    cache_dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
    b = len(LENS_K)
    if page_size is None:
        cap = max(LENS_K) + 5
        kc = torch.randn(b, cap, H_K, d, generator=g).to(cache_dtype)
        vc = torch.randn(b, cap, H_K, d, generator=g).to(cache_dtype)
        table = None
        slab_of = [[i] * cap for i in range(b)]
        rows = lambda i, n: (torch.full((n,), i), torch.arange(n))  # noqa: E731
    else:
        pages_per = [-(-n // page_size) for n in LENS_K]
        max_pages = max(pages_per) + 1
        num_pages = sum(pages_per) + 3
        perm = torch.randperm(num_pages, generator=g)
        table = torch.zeros(b, max_pages, dtype=torch.int32)
        nxt = 0
        for i in range(b):
            table[i, :pages_per[i]] = perm[nxt:nxt + pages_per[i]].to(torch.int32)
            nxt += pages_per[i]
        kc = torch.randn(num_pages, page_size, H_K, d, generator=g).to(cache_dtype)
        vc = torch.randn(num_pages, page_size, H_K, d, generator=g).to(cache_dtype)
        rows = lambda i, n: (table[i, torch.arange(n) // page_size].long(),  # noqa: E731
                             torch.arange(n) % page_size)
    kd = vd = None
    if fp8:
        kd = torch.rand(kc.shape[0], H_K, generator=g) + 0.25
        vd = torch.rand(kc.shape[0], H_K, generator=g) + 0.25
    lk, lv = [], []
    for i, n in enumerate(LENS_K):
        slab, row = rows(i, n)
        k_i, v_i = kc[slab, row].float(), vc[slab, row].float()
        if fp8:
            k_i, v_i = k_i * kd[slab].unsqueeze(-1), v_i * vd[slab].unsqueeze(-1)
        lk.append(k_i)
        lv.append(v_i)
    dev = lambda t: None if t is None else t.cuda()  # noqa: E731
    return (q.cuda(), kc.cuda(), vc.cuda(), dev(table), dev(kd), dev(vd), lk, lv)


def check(out, lse, q, lk, lv, fp8, **kw):
    out, lse, q = out.cpu(), lse.cpu(), q.cpu()
    cq = cu(LENS_Q).tolist()
    assert out.shape == (q.shape[0], H, q.shape[-1]) and lse.shape == (H, q.shape[0])
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    # packed rows of no sequence: out 0, lse -inf
    assert (out[cq[-1]:] == 0).all() and (lse[:, cq[-1]:] == -math.inf).all()
    for i in range(len(LENS_Q)):
        q0, q1 = cq[i], cq[i + 1]
        if q1 == q0:
            continue
        if lk[i].shape[0] == 0:  # no key: out 0, lse -inf (with sinks: the head's sink)
            sinks = kw.get("sinks")
            want = torch.full((H, q1 - q0), -math.inf) if sinks is None else sinks.cpu().view(H, 1).expand(H, q1 - q0)
            assert (out[q0:q1] == 0).all() and torch.equal(lse[:, q0:q1], want)
            continue
        q_i = q[None, q0:q1]
        k_q, v_q = lk[i][None].to(q.dtype), lv[i][None].to(q.dtype)  # what the kernel computes with
        ref, _ = attention_ref64(q_i.double(), lk[i][None].double(), lv[i][None].double(), **kw)
        naive, _ = attention_naive(q_i, k_q, v_q, **kw)
        assert_close_fa(out[None, q0:q1], naive, ref, f"out of sequence {i}")
        # lse: tight, against the oracle on the values in q's dtype (an FP8 cache's x8 * descale
        # is rounded once to q's dtype by the kernel)
        _, ref_lse = attention_ref64(q_i.double(), k_q.double(), v_q.double(), **kw)
        fin = torch.isfinite(ref_lse[0])
        assert torch.equal(torch.isinf(lse[:, q0:q1]), ~fin)
        assert max_err(lse[:, q0:q1][fin], ref_lse[0][fin]) <= 1e-4 * (1 + ref_lse.abs()[0][fin].max())


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16_cache", "fp8_cache"])
@pytest.mark.parametrize("page_size", [1, 16, 256, None], ids=["page1", "page16", "page256", "contig"])
def test_varlen_queries_on_cache_kernel(page_size, fp8):
    d = head_dim(fp8)
    q, kc, vc, table, kd, vd, lk, lv = make_batch(page_size, fp8, d, tail=3)
    used = torch.tensor(LENS_K, dtype=torch.int32, device="cuda")
    cq = cu(LENS_Q).cuda()
    out, lse = flash3.attention_with_kvcache(q, kc, vc, cache_seqlens=used, page_table=table,
                                             cu_seqlens_q=cq, max_seqlen_q=max(LENS_Q),
                                             causal=True, k_descale=kd, v_descale=vd,
                                             return_lse=True)
    check(out, lse, q, lk, lv, fp8, causal=True)
    if page_size is not None:  # attention_varlen(page_table=) is the same call
        out2, lse2 = flash3.attention_varlen(q, kc, vc, cq, None, max(LENS_Q), max(LENS_K),
                                             causal=True, page_table=table, seqused_k=used,
                                             k_descale=kd, v_descale=vd, return_lse=True)
        assert torch.equal(out, out2) and torch.equal(lse, lse2)


@pytest.mark.parametrize("num_splits", [1, 3, 0])
@pytest.mark.parametrize("kw", [dict(causal=True), dict(window_size=(100, 5)),
                                dict(causal=True, softcap=5.0), dict()])
def test_varlen_kernel_splits_and_masks(kw, num_splits):
    d = head_dim(False)
    q, kc, vc, table, _, _, lk, lv = make_batch(16, False, d, tail=2, seed=1)
    used = torch.tensor(LENS_K, dtype=torch.int32, device="cuda")
    out, lse = flash3.attention_with_kvcache(q, kc, vc, cache_seqlens=used, page_table=table,
                                             cu_seqlens_q=cu(LENS_Q).cuda(),
                                             max_seqlen_q=max(LENS_Q), num_splits=num_splits,
                                             return_lse=True, **kw)
    check(out, lse, q, lk, lv, False, **kw)


def test_varlen_kernel_cuda_graph():
    """No host synchronization: the call captures into a CUDA graph and replays on new data."""
    d = head_dim(False)
    q, kc, vc, table, _, _, lk, lv = make_batch(16, False, d)
    used = torch.tensor(LENS_K, dtype=torch.int32, device="cuda")
    cq = cu(LENS_Q).cuda()
    call = lambda: flash3.attention_with_kvcache(  # noqa: E731
        q, kc, vc, cache_seqlens=used, page_table=table, cu_seqlens_q=cq,
        max_seqlen_q=max(LENS_Q), causal=True, num_splits=2, return_lse=True)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        call()  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = call()
    q.copy_(torch.randn_like(q))
    graph.replay()
    torch.cuda.synchronize()
    check(out, lse, q, lk, lv, False, causal=True)


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16_cache", "fp8_cache"])
def test_varlen_kernel_sinks(fp8, num_splits):
    """Sinks on packed queries: the epilogue (1 split) or the combine (3); a sequence without keys
    gets lse = the sink, rows of no sequence keep out 0, lse -inf."""
    d = head_dim(fp8)
    q, kc, vc, table, kd, vd, lk, lv = make_batch(16, fp8, d, tail=3, seed=2)
    used = torch.tensor(LENS_K, dtype=torch.int32, device="cuda")
    sinks = torch.tensor([0.5, 3.0, -1.0, 6.0, -math.inf, 1.5, 2.0, 4.0], device="cuda")
    out, lse = flash3.attention_with_kvcache(q, kc, vc, cache_seqlens=used, page_table=table,
                                             cu_seqlens_q=cu(LENS_Q).cuda(), max_seqlen_q=max(LENS_Q),
                                             causal=True, k_descale=kd, v_descale=vd, sinks=sinks,
                                             num_splits=num_splits, return_lse=True)
    check(out, lse, q, lk, lv, fp8, causal=True, sinks=sinks.cpu())


def test_varlen_kernel_refuses_what_it_cannot_run():
    d = head_dim(False)
    q, _, _, _, _, _, lk, lv = make_batch(16, False, d)
    k, v = (torch.cat(x).to(torch.bfloat16).cuda() for x in (lk, lv))  # a packed cache
    used = torch.tensor(LENS_K, dtype=torch.int32, device="cuda")
    with pytest.raises(NotImplementedError, match="cu_seqlens_k"):
        flash3.attention_varlen(q, k, v, cu(LENS_Q).cuda(), cu(LENS_K).cuda(), max(LENS_Q), max(LENS_K),
                                causal=True, seqused_k=used)

