"""flash3.sdpa: a drop-in for torch's scaled_dot_product_attention (CPU, reference backend)."""

import pytest
import torch
import torch.nn.functional as F

import flash3


def _inputs(b, h, h_k, s_q, s_k, d, d_v=None, grad=False, dtype=torch.float32):
    d_v = d_v or d
    q = torch.randn(b, h, s_q, d, dtype=dtype, requires_grad=grad)
    k = torch.randn(b, h_k, s_k, d, dtype=dtype, requires_grad=grad)
    v = torch.randn(b, h_k, s_k, d_v, dtype=dtype, requires_grad=grad)
    return q, k, v


def _close(a, b, tol=2e-5):
    assert a.shape == b.shape
    assert (a - b).abs().max().item() <= tol


@pytest.mark.parametrize("s_q,s_k", [(64, 64), (17, 80), (80, 17), (1, 50), (50, 1), (33, 34)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_matches_torch_including_top_left_causal(s_q, s_k, is_causal):
    q, k, v = _inputs(2, 4, 4, s_q, s_k, 32)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    _close(flash3.sdpa(q, k, v, is_causal=is_causal), ref)


def test_causal_is_top_left_not_flash3s_bottom_right():
    # The difference that bites people: with s_q != s_k, torch's is_causal and flash3's causal
    # are different masks. flash3.sdpa follows torch; flash3.attention follows flash-attn.
    q, k, v = _inputs(1, 2, 2, 8, 24, 16)
    ours = flash3.sdpa(q, k, v, is_causal=True)
    _close(ours, F.scaled_dot_product_attention(q, k, v, is_causal=True))
    bottom_right = flash3.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                    causal=True).transpose(1, 2)
    assert (ours - bottom_right).abs().max().item() > 1e-2
    # Row 0 sees exactly key 0 under torch's convention: the output is v[..., 0, :].
    _close(ours[:, :, 0], v[:, :, 0])


def test_scale_gqa_dv_and_grads():
    q, k, v = _inputs(2, 6, 2, 40, 56, 32, d_v=24, grad=True)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3, enable_gqa=True)
    g = torch.randn_like(ref)
    grads_ref = torch.autograd.grad(ref, (q, k, v), g)
    out = flash3.sdpa(q, k, v, is_causal=True, scale=0.3, enable_gqa=True)
    _close(out, ref)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), g), grads_ref):
        _close(a, b, 5e-5)


@pytest.mark.parametrize("shape", [(3, 20, 16), (2, 3, 2, 20, 16)])
def test_three_and_five_dim_inputs(shape):
    q, k, v = (torch.randn(*shape) for _ in range(3))
    _close(flash3.sdpa(q, k, v, is_causal=True),
           F.scaled_dot_product_attention(q, k, v, is_causal=True))


def test_bf16_output_dtype_and_layout_views():
    q, k, v = _inputs(1, 2, 2, 32, 32, 16, dtype=torch.bfloat16)
    out = flash3.sdpa(q, k, v)
    assert out.dtype == torch.bfloat16 and out.shape == (1, 2, 32, 16)
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
    assert (out.float() - ref).abs().max().item() < 2e-2


def test_no_transposed_copies_for_torch_layout(monkeypatch):
    # flash3 receives views over the caller's memory, not copies.
    q, k, v = _inputs(2, 4, 4, 16, 16, 8)
    seen = {}

    def spy(q_, k_, v_, **kw):
        seen.update(q=q_, k=k_, v=v_)
        return real(q_, k_, v_, **kw)

    import flash3.torch_sdpa as mod
    real = mod.attention
    monkeypatch.setattr(mod, "attention", spy)
    flash3.sdpa(q, k, v)
    for name, orig in (("q", q), ("k", k), ("v", v)):
        assert seen[name].data_ptr() == orig.data_ptr(), name
        assert seen[name].shape == orig.transpose(1, 2).shape


@pytest.mark.parametrize("kwargs,match", [
    (dict(attn_mask=torch.ones(16, 16, dtype=torch.bool)), "attn_mask"),
    (dict(dropout_p=0.1), "dropout_p"),
    (dict(is_causal=1), "is_causal"),
])
def test_clear_errors(kwargs, match):
    q, k, v = _inputs(1, 2, 2, 16, 16, 8)
    with pytest.raises((ValueError, TypeError), match=match):
        flash3.sdpa(q, k, v, **kwargs)


def test_gqa_needs_enable_gqa_and_shapes_are_named():
    q, k, v = _inputs(1, 4, 2, 16, 16, 8)
    with pytest.raises(ValueError, match="enable_gqa"):
        flash3.sdpa(q, k, v)
    with pytest.raises(ValueError, match="key"):
        flash3.sdpa(q, k[0:1].expand(2, -1, -1, -1), v, enable_gqa=True)
    with pytest.raises(ValueError, match="query"):
        flash3.sdpa(q[0, 0], k, v)


def test_torch_compile_fullgraph():
    q, k, v = _inputs(1, 4, 2, 16, 24, 32, grad=True)
    f = torch.compile(lambda q, k, v: flash3.sdpa(q, k, v, is_causal=True, enable_gqa=True),
                      fullgraph=True)
    out = f(q, k, v)
    _close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))
    out.sum().backward()
    assert torch.isfinite(q.grad).all() and torch.isfinite(k.grad).all()
