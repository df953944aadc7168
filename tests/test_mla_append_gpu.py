"""MLA decode with new keys on an sm_90 GPU, through FA3's flash_attn_with_kvcache as DeepSeek-V3
serving calls it: qv, d 64 (rope), d_v 512 (latent), one kv head, new k (b, s_new, 1, 64) / v (b,
s_new, 1, 512), rotary on q and the new keys. The fused append writes them (checked bit for bit
against flash3.reference.kvcache_append_packed on the CPU), then the MLA decode kernel attends over
cache_seqlens + s_new: each entry against the fp64 oracle on the caches after the append (q.k +
qv.v = [q, qv].[k, v], q rotated by the reference) with the FlashAttention rule. No call may fall
back to the spec; a CUDA graph captures the whole step (no host synchronization). Skipped without
an sm_90 device or a flash3._C with the MLA kernel and the packed append.
"""
import json

import pytest
import torch

import flash3.flash_attn_interface as fai
from flash3 import _backend, reference
from helpers import assert_close_fa, attention_naive, attention_ref64

HAS_SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
pytestmark = [pytest.mark.requires_sm90,
              pytest.mark.skipif(not HAS_SM90, reason="needs a CUDA sm_90 (H100/H200) device")]
D, DV, I32 = 64, 512, torch.int32
# (queries, new keys) per entry (an int: batched; a list: packed, 2 tail rows of no entry after),
# cache_seqlens, capacity, page size (None: contiguous), heads, causal, (rotary_dim, interleaved,
# rotary_seqlens) or None, leftpad, num_splits
CASES = {
    "paged64_neox": (2, 2, [0, 62, 254, 100], 256, 64, 128, True, (64, False, None), None, 0),
    "contig_gptj_leftpad": (1, 3, [100, 157], 160, None, 16, False, (32, True, [7, 150]), [37, 0], 3),
    "paged16_no_rotary": (1, 1, [5, 300], 320, 16, 64, True, None, None, 1),
    "packed_qk": ([1, 0, 2], [2, 3, 0], [33, 0, 120], 128, 16, 8, True, (64, False, None), None, 2),
    "packed_q": ([1, 1, 1], 1, [40, 0, 200], 256, 64, 128, True, (64, False, None), None, 0),
}


@pytest.fixture(autouse=True)
def require_kernels(monkeypatch):
    info = json.loads(torch.ops.flash3.kernel_info()) if hasattr(torch.ops.flash3, "kernel_info") else {}
    if ["bf16", D, DV] not in info.get("decode", []):
        pytest.skip("flash3._C without the MLA decode kernel (bf16 64x512)")
    if not _backend.op_takes("append_kv_sm90", "cu_seqlens_k_new"):
        pytest.skip("flash3._C's append takes no packed layouts (an older build)")

    def no_fallback(reason, what="forward"):
        raise AssertionError(f"{what} fell back to the spec: {reason}")
    monkeypatch.setattr(_backend, "warn_fallback", no_fallback)


def cu(lens):
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=I32)


def make(case, seed=0):
    """CPU bf16 inputs of CASES[case]: q, qv, k, v, the caches, the call's keyword arguments, and
    each entry's count of new keys."""
    lq, ln, lens, cap, page, h, causal, rot, pads, splits = CASES[case]
    b = len(lens)
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=g).to(torch.bfloat16)  # noqa: E731
    kw = dict(cache_seqlens=torch.tensor(lens, dtype=I32), causal=causal, num_splits=splits)
    if isinstance(lq, int):
        q, qv = rnd(b, lq, h, D), rnd(b, lq, h, DV)
    else:
        q, qv = rnd(sum(lq) + 2, h, D), rnd(sum(lq) + 2, h, DV)
        kw.update(cu_seqlens_q=cu(lq), max_seqlen_q=max(lq))
    news = [ln] * b if isinstance(ln, int) else ln
    if isinstance(ln, int):
        k, v = rnd(b, ln, 1, D), rnd(b, ln, 1, DV)
    else:
        k, v = rnd(sum(ln) + 2, 1, D), rnd(sum(ln) + 2, 1, DV)
        kw["cu_seqlens_k_new"] = cu(ln)
    if page is None:
        kc, vc = rnd(b, cap, 1, D), rnd(b, cap, 1, DV)
    else:
        per_row = -(-cap // page)
        n = b * per_row + 3
        kc, vc = rnd(n, page, 1, D), rnd(n, page, 1, DV)
        kw["page_table"] = torch.randperm(n, generator=g)[:b * per_row].view(b, per_row).to(I32)
    if rot is not None:
        rdim, interleaved, ro = rot
        ang = torch.arange(400, dtype=torch.float32)[:, None] * 10000.0 ** (
            -torch.arange(0, rdim, 2, dtype=torch.float32) / rdim)
        kw.update(rotary_cos=ang.cos(), rotary_sin=ang.sin(), rotary_interleaved=interleaved)
        if ro is not None:
            kw["rotary_seqlens"] = torch.tensor(ro, dtype=I32)
    if pads is not None:
        kw["cache_leftpad"] = torch.tensor(pads, dtype=I32)
    return q, qv, k, v, kc, vc, kw, news


def cuda(kw):
    return {n: x.cuda() if isinstance(x, torch.Tensor) else x for n, x in kw.items()}


def reference_append(q, k, v, kc, vc, kw):
    """The append's spec on CPU copies: (q rotated (q itself without rotary), k_cache, v_cache)."""
    kc, vc = kc.clone(), vc.clone()
    local = kw["causal"]
    q_rot = reference.kvcache_append_packed(q, kc, vc, k, v, kw["cache_seqlens"], kw.get("page_table"),
                                            kw.get("cu_seqlens_q"), kw.get("cu_seqlens_k_new"), kw.get("rotary_cos"),
                                            kw.get("rotary_sin"), kw.get("rotary_interleaved", True), local,
                                            kw.get("rotary_seqlens"))
    return (q if q_rot is None else q_rot), kc, vc


def check_entries(q_rot, qv, kc, vc, kw, news, out, lse):
    """Each entry against the fp64 oracle over its keys [leftpad, cache_seqlens + new keys)."""
    lens = kw["cache_seqlens"].tolist()
    b = len(lens)
    pads = kw["cache_leftpad"].tolist() if "cache_leftpad" in kw else [0] * b
    table = kw.get("page_table")
    scale = (D + DV) ** -0.5
    for i in range(b):
        n = lens[i] + news[i]
        if "cu_seqlens_q" in kw:
            a, e = kw["cu_seqlens_q"][i].item(), kw["cu_seqlens_q"][i + 1].item()
            qi, qvi, oi, li = q_rot[None, a:e], qv[None, a:e], out[None, a:e], lse[:, a:e]
        else:
            qi, qvi, oi, li = q_rot[i:i + 1], qv[i:i + 1], out[i:i + 1], lse[i]
        if qi.shape[1] == 0:
            continue
        ki = reference.kvcache_gather(kc, i, n, table)[None, pads[i]:]
        vi = reference.kvcache_gather(vc, i, n, table)[None, pads[i]:]
        qq, kk = torch.cat([qi, qvi], -1), torch.cat([ki, vi], -1)
        mask = dict(causal=kw["causal"], softmax_scale=scale)
        ref, ref_lse = attention_ref64(qq.double(), kk.double(), vi.double(), **mask)
        naive, _ = attention_naive(qq, kk, vi, **mask)
        assert_close_fa(oi, naive, ref, f"out[{i}]")
        fin = torch.isfinite(ref_lse[0])
        assert torch.equal(torch.isinf(li), ~fin), f"lse[{i}]: -inf pattern"
        assert (li[fin].double() - ref_lse[0][fin]).abs().max() <= 1e-4 * (1 + ref_lse[0][fin].abs().max())


def run_case(case, seed=0):
    q, qv, k, v, kc, vc, kw, news = make(case, seed)
    kc_g, vc_g = kc.cuda(), vc.cuda()
    out, lse, *_ = fai.flash_attn_with_kvcache(q.cuda(), kc_g, vc_g, k.cuda(), v.cuda(), qv=qv.cuda(),
                                                return_softmax_lse=True, **cuda(kw))
    q_rot, kc_ref, vc_ref = reference_append(q, k, v, kc, vc, kw)
    assert torch.equal(kc_g.cpu(), kc_ref) and torch.equal(vc_g.cpu(), vc_ref)  # the append, bit for bit
    check_entries(q_rot, qv, kc_ref, vc_ref, kw, news, out.cpu(), lse.cpu())
    if "cu_seqlens_q" in kw:  # packed rows of no entry
        end = int(kw["cu_seqlens_q"][-1])
        assert (out[end:] == 0).all() and (lse[:, end:] == float("-inf")).all()


@pytest.mark.parametrize("case", list(CASES))
def test_mla_append_then_decode_matches_fp64(case):
    run_case(case)


def test_sglang_views_take_the_new_keys_in_place():
    """SGLang's one (pages, 64, 1, 576) buffer, v_cache its latent [..., :512] and k_cache its rope
    [..., 512:]: the new keys land in that buffer (k and v rows of one slot), nothing else changes."""
    g = torch.Generator().manual_seed(3)
    kv = torch.randn(6, 64, 1, DV + D, generator=g).to("cuda", torch.bfloat16)
    vc, kc = kv[..., :DV], kv[..., DV:]
    table = torch.tensor([[3, 0], [5, 1]], dtype=I32, device="cuda")
    q, qv = (torch.randn(2, 1, 16, n, generator=g).to("cuda", torch.bfloat16) for n in (D, DV))
    k, v = (torch.randn(2, 1, 1, n, generator=g).to("cuda", torch.bfloat16) for n in (D, DV))
    lens = torch.tensor([100, 64], dtype=I32, device="cuda")
    before = kv.clone()
    fai.flash_attn_with_kvcache(q, kc, vc, k, v, qv=qv, cache_seqlens=lens, page_table=table, causal=True)
    changed = (kv != before).any(-1)[..., 0]
    assert changed.nonzero().tolist() == [[0, 36], [1, 0]]  # row 0: slot 100 (page 0), row 1: 64 (page 1)
    assert torch.equal(kv[0, 36, 0, DV:], k[0, 0, 0]) and torch.equal(kv[0, 36, 0, :DV], v[0, 0, 0])


def test_mla_append_cuda_graph_replays_like_eager():
    """No host synchronization: the append and the MLA decode capture into a CUDA graph; replays on
    new values (new keys, lengths) match eager calls."""
    q, qv, k, v, kc, vc, kw, _ = make("paged64_neox")
    dev = cuda(kw)
    sq, sqv, sk, sv = q.cuda(), qv.cuda(), k.cuda(), v.cuda()
    kc_g, vc_g = kc.cuda(), vc.cuda()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up (allocations, lazy init) off the capture
        fai.flash_attn_with_kvcache(sq, kc_g.clone(), vc_g.clone(), sk, sv, qv=sqv, **dev)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_g = fai.flash_attn_with_kvcache(sq, kc_g, vc_g, sk, sv, qv=sqv, **dev)
    for step in range(2):
        q2, qv2, k2, v2, kc2, vc2, _, _ = make("paged64_neox", seed=step + 1)
        lens2 = (kw["cache_seqlens"] - 7 * step).clamp(min=0).to(I32)
        for dst, src in ((sq, q2), (sqv, qv2), (sk, k2), (sv, v2), (kc_g, kc2), (vc_g, vc2),
                         (dev["cache_seqlens"], lens2)):
            dst.copy_(src)
        graph.replay()
        kc_e, vc_e = kc2.cuda(), vc2.cuda()
        want = fai.flash_attn_with_kvcache(q2.cuda(), kc_e, vc_e, k2.cuda(), v2.cuda(), qv=qv2.cuda(),
                                           **cuda(dict(kw, cache_seqlens=lens2)))
        torch.cuda.synchronize()
        assert torch.equal(out_g, want) and torch.equal(kc_g, kc_e) and torch.equal(vc_g, vc_e)
