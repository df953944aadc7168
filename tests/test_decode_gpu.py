"""The fused KV-cache append (flash3::append_kv_sm90) on a Hopper GPU, against the reference.

Skipped without an sm_90 device and a flash3._C that has the append kernel.
"""

import pytest
import torch

import flash3
from flash3 import _backend, reference
from flash3.rotary import kvcache_rotary

pytestmark = pytest.mark.requires_sm90


@pytest.fixture(autouse=True)
def _needs_append_kernel():
    if not (torch.cuda.is_available() and _backend.has_append_kernel()):
        pytest.skip("flash3._C without append_kv_sm90 (pip install --no-build-isolation .)")


def _rope(seqlen_ro, rd, device):
    ang = torch.arange(seqlen_ro, dtype=torch.float32, device=device)[:, None] * \
        10000.0 ** (-torch.arange(0, rd, 2, dtype=torch.float32, device=device) / rd)
    return ang.cos(), ang.sin()


def _append(q, kc, vc, k, v, lens, page_table, rope, interleaved, per_token):
    """Run the kernel; returns q_out (q when no rotary)."""
    cos, sin = rope if rope is not None else (None, None)
    q_out = torch.full_like(q, float("nan")) if rope is not None else q
    torch.ops.flash3.append_kv_sm90(q, kc, vc, k, v, lens, page_table, cos, sin, interleaved,
                                    per_token, q_out)
    return q_out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("rotary", [None, "neox", "interleaved"])
@pytest.mark.parametrize("per_token", [False, True])
def test_append_matches_reference(dtype, paged, rotary, per_token):
    dev = "cuda"
    b, s_new, h, h_k, d, d_v, page = 3, 5, 8, 2, 128, 64, 16
    q = torch.randn(b, s_new, h, d, device=dev, dtype=dtype)
    k = torch.randn(b, s_new, h_k, d, device=dev, dtype=dtype)
    v = torch.randn(b, s_new, h_k, d_v, device=dev, dtype=dtype)
    lens = torch.tensor([0, 37, 250], device=dev, dtype=torch.int32)
    if paged:
        num_pages, max_pages = 64, 20
        kc = torch.randn(num_pages, page, h_k, d, device=dev, dtype=dtype)
        page_table = torch.randperm(num_pages, device=dev)[:b * max_pages].view(b, max_pages)
        page_table = page_table.to(torch.int32)
    else:
        kc = torch.randn(b, 300, h_k, d, device=dev, dtype=dtype)
        page_table = None
    vc = torch.randn(*kc.shape[:3], d_v, device=dev, dtype=dtype)
    rope = _rope(400, 64, dev) if rotary else None
    interleaved = rotary == "interleaved"
    kc_ref, vc_ref, q_ref, k_ref = kc.clone(), vc.clone(), q, k
    if rope is not None:
        q_ref, k_ref = kvcache_rotary(q, k, lens, *rope, interleaved, per_token)
    reference.kvcache_write(kc_ref, vc_ref, k_ref, v, lens, page_table)
    q_out = _append(q, kc, vc, k, v, lens, page_table, rope, interleaved, per_token)
    torch.cuda.synchronize()
    assert torch.equal(kc, kc_ref) and torch.equal(vc, vc_ref)
    assert torch.equal(q_out, q_ref)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_append_keeps_denormals_like_torch(dtype):
    """The build's --use_fast_math must not flush subnormal products (torch does not)."""
    dev = "cuda"
    tiny = torch.finfo(dtype).tiny
    k = (torch.randn(1, 3, 1, 64, device=dev) * tiny * 4).to(dtype)
    v = torch.randn(1, 3, 1, 64, device=dev, dtype=dtype)
    q = torch.randn(1, 3, 2, 64, device=dev, dtype=dtype)
    lens = torch.tensor([5], device=dev, dtype=torch.int32)
    kc = torch.zeros(1, 16, 1, 64, device=dev, dtype=dtype)
    vc = torch.zeros_like(kc)
    rope = _rope(32, 64, dev)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    q_ref, k_ref = kvcache_rotary(q, k, lens, *rope, False, True)
    reference.kvcache_write(kc_ref, vc_ref, k_ref, v, lens, None)
    q_out = _append(q, kc, vc, k, v, lens, None, rope, False, True)
    torch.cuda.synchronize()
    assert torch.equal(kc, kc_ref) and torch.equal(q_out, q_ref)
    assert (kc_ref != 0).any()  # the test data really holds nonzero tiny values


def test_append_skips_slots_outside_the_cache():
    """Bad cache_seqlens / page ids are skipped: nothing outside the cache, nor any other
    row's pages, is written."""
    dev, dt = "cuda", torch.bfloat16
    b, s_new, h_k, d, page, num_pages = 4, 3, 2, 64, 8, 16
    k = torch.randn(b, s_new, h_k, d, device=dev, dtype=dt)
    v = torch.randn(b, s_new, h_k, d, device=dev, dtype=dt)
    q = torch.randn(b, 1, 4, d, device=dev, dtype=dt)
    # Row 0 valid; row 1 negative length; row 2 runs past its table; row 3's pages are bad:
    # its keys 7, 8, 9 land on page ids 16 (= num_pages) and 2^30.
    lens = torch.tensor([2, -5, 4 * page - 1, page - 1], device=dev, dtype=torch.int32)
    page_table = torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [16, 2**30, -1, 99]],
                              device=dev, dtype=torch.int32)
    kc = torch.randn(num_pages, page, h_k, d, device=dev, dtype=dt)
    vc = torch.randn(num_pages, page, h_k, d, device=dev, dtype=dt)
    kc0, vc0 = kc.clone(), vc.clone()
    _append(q, kc, vc, k, v, lens, page_table, None, False, True)
    torch.cuda.synchronize()
    expect_k, expect_v = kc0.clone(), vc0.clone()
    for t in range(s_new):  # row 0: slots 2..4 of page 0
        expect_k[0, 2 + t], expect_v[0, 2 + t] = k[0, t], v[0, t]
    expect_k[11, page - 1], expect_v[11, page - 1] = k[2, 0], v[2, 0]  # row 2: only the last slot
    assert torch.equal(kc, expect_k) and torch.equal(vc, expect_v)


def test_decode_step_captured_in_a_cuda_graph():
    """Append (with rotary) + attention on a contiguous cache: no host sync, so the step is
    captured once and replayed with new cache_seqlens."""
    if not _backend.kernel_fwd_reason(torch.empty(1, 1, 8, 128, device="cuda", dtype=torch.bfloat16),
                                      torch.empty(1, 1, 2, 128, device="cuda", dtype=torch.bfloat16),
                                      torch.empty(1, 1, 2, 128, device="cuda", dtype=torch.bfloat16),
                                      128 ** -0.5) is None:
        pytest.skip("no bf16 d=128 forward kernel in this build")
    dev, dt = "cuda", torch.bfloat16
    b, h, h_k, d, cap = 2, 8, 2, 128, 512
    kc = torch.randn(b, cap, h_k, d, device=dev, dtype=dt)
    vc = torch.randn(b, cap, h_k, d, device=dev, dtype=dt)
    q = torch.randn(b, 1, h, d, device=dev, dtype=dt)
    k = torch.randn(b, 1, h_k, d, device=dev, dtype=dt)
    v = torch.randn(b, 1, h_k, d, device=dev, dtype=dt)
    lens = torch.tensor([10, 300], device=dev, dtype=torch.int32)
    cos, sin = _rope(cap, d, dev)

    def step():
        return flash3.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=lens, causal=True,
                                             rotary_cos=cos, rotary_sin=sin)

    step()  # warm-up (compiles nothing, allocates the caching allocator's pools)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for new_lens in ([11, 301], [100, 7]):
        lens.copy_(torch.tensor(new_lens, dtype=torch.int32))
        kc_before, vc_before = kc.clone(), vc.clone()
        graph.replay()
        torch.cuda.synchronize()
        got_k, got_v = kc.clone(), vc.clone()
        kc.copy_(kc_before), vc.copy_(vc_before)
        kc_ref, vc_ref = kc.clone(), vc.clone()
        expect = step()  # eager, same inputs
        torch.cuda.synchronize()
        assert torch.equal(got_k, kc) and torch.equal(got_v, vc)
        assert (out.float() - expect.float()).abs().max().item() < 1e-2
        # And both are right: the reference on the same inputs (append with rotary, attention).
        ref, _ = reference.kvcache_forward(q, kc_ref, vc_ref, k, v, lens, None, d ** -0.5, -1, 0,
                                           0.0, cos, sin, False)
        assert torch.equal(kc_ref, kc) and torch.equal(vc_ref, vc)
        assert (out.float() - ref.float()).abs().max().item() < 2e-2
