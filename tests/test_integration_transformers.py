"""flash3 as a transformers attention implementation: tiny random models built from configs
(no downloads) give the logits, generations and gradients of transformers' eager/sdpa."""

import contextlib
import inspect
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")

import flash3  # noqa: E402
import flash3.integrations.transformers as f3hf  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402
from transformers import masking_utils as mu  # noqa: E402

NAME = f3hf.register()
ATOL = 1e-4  # fp32 logits / gradients
VOCAB, SEQ = 100, 20

# Tiny fp32 configs. initializer_range 0.2 makes the attention logits large enough that the
# softcap and the window change the result (checked in test_configs_exercise_the_features).
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, initializer_range=0.2,
              pad_token_id=0, bos_token_id=1, eos_token_id=2)
FAMILIES = {
    "llama": ("LlamaConfig", {}),
    "mistral": ("MistralConfig", dict(sliding_window=4)),
    "gemma2": ("Gemma2Config", dict(head_dim=16, sliding_window=4, attn_logit_softcapping=1.0,
                                    query_pre_attn_scalar=16,
                                    layer_types=["sliding_attention", "full_attention"])),
}


def make_config(family, **overrides):
    cls_name, extra = FAMILIES[family]
    return getattr(transformers, cls_name)(**{**COMMON, **extra, **overrides})


def make_pair(family, reference="eager", **overrides):
    """(reference model, flash3 model) with the same weights, in eval mode."""
    # Each model gets its own config: from_config writes the implementation into it.
    torch.manual_seed(0)
    ref = AutoModelForCausalLM.from_config(make_config(family, **overrides),
                                           attn_implementation=reference).eval()
    fa = AutoModelForCausalLM.from_config(make_config(family, **overrides),
                                          attn_implementation=NAME).eval()
    fa.load_state_dict(ref.state_dict())
    assert ref.config._attn_implementation == reference and fa.config._attn_implementation == NAME
    return ref, fa


_PAIRS = {}


def pair(family, reference="eager"):
    if (family, reference) not in _PAIRS:
        _PAIRS[family, reference] = make_pair(family, reference)
    return _PAIRS[family, reference]


def padded_batch(seq=SEQ):
    """Row 0 left-padded, row 1 right-padded, row 2 full."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, VOCAB, (3, seq), generator=g)
    mask = torch.ones(3, seq, dtype=torch.long)
    mask[0, :5] = 0
    mask[1, seq - 6:] = 0
    ids[mask == 0] = 0
    return ids, mask


def left_padded_prompts(seq=12):
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(3, VOCAB, (3, seq), generator=g)
    mask = torch.ones(3, seq, dtype=torch.long)
    mask[0, :5] = 0
    mask[1, :2] = 0
    ids[mask == 0] = 0
    return ids, mask


@pytest.fixture(autouse=True)
def fresh_warnings():
    f3hf._warned.clear()
    yield
    f3hf._warned.clear()


@pytest.fixture
def calls(monkeypatch):
    """Counts the calls into flash3.attention / flash3.attention_varlen."""
    counts = {"attention": 0, "attention_varlen": 0}
    for fn in list(counts):
        orig = getattr(flash3, fn)

        def counted(*args, _orig=orig, _fn=fn, **kwargs):
            counts[_fn] += 1
            return _orig(*args, **kwargs)

        monkeypatch.setattr(flash3, fn, counted)
    return counts


@contextlib.contextmanager
def no_fallback():
    """A fallback warning is an error here (the flash3 path must be taken)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", f3hf.Flash3FallbackWarning)
        yield


def fallback_messages(record):
    return [str(w.message) for w in record if issubclass(w.category, f3hf.Flash3FallbackWarning)]


# ------------------------------------------------------------------------------ registration
def test_register_is_idempotent_and_usable():
    assert f3hf.register() == NAME == "fa3"
    assert f3hf.register() == NAME
    assert transformers.AttentionInterface._global_mapping[NAME] is f3hf.attention_forward
    assert mu.AttentionMaskInterface._global_mapping[NAME] is f3hf.mask_function
    model = AutoModelForCausalLM.from_config(make_config("llama"), attn_implementation=NAME)
    assert model.config._attn_implementation == NAME
    with pytest.raises(ValueError, match="flash"):
        f3hf.register("flash3")


def test_set_attn_implementation(calls):
    ref, _ = pair("llama")
    cfg = make_config("llama")
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    model.load_state_dict(ref.state_dict())
    if not hasattr(model, "set_attn_implementation"):
        pytest.skip("this transformers has no set_attn_implementation")
    ids, mask = padded_batch()
    with torch.no_grad():
        want = model(ids, attention_mask=mask).logits
        model.set_attn_implementation(NAME)
        got = model(ids, attention_mask=mask).logits
    assert model.config._attn_implementation == NAME
    assert calls["attention_varlen"] > 0
    valid = mask.bool()
    torch.testing.assert_close(got[valid], want[valid], atol=ATOL, rtol=0)


# ------------------------------------------------------------------------------ logits
def assert_padded_logits_match(ref, fa):
    """Logits of the padded batch on its real tokens, the flash3 path taken (no fallback)."""
    ids, mask = padded_batch()
    with no_fallback(), torch.no_grad():
        want = ref(ids, attention_mask=mask).logits
        got = fa(ids, attention_mask=mask).logits
    valid = mask.bool()
    torch.testing.assert_close(got[valid], want[valid], atol=ATOL, rtol=0)
    return ids


@pytest.mark.parametrize("family", list(FAMILIES))
def test_padded_logits_match_eager(family, calls):
    ref, fa = pair(family)
    ids = assert_padded_logits_match(ref, fa)
    assert calls["attention_varlen"] == 2 and calls["attention"] == 0  # 2 layers, unpadded
    # Without padding: the batched kernel.
    with no_fallback(), torch.no_grad():
        want = ref(ids[2:]).logits
        got = fa(ids[2:]).logits
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    assert calls["attention"] == 2


@pytest.mark.parametrize("family", ["llama", "mistral"])
def test_padded_logits_match_sdpa(family, calls):
    assert_padded_logits_match(*pair(family, "sdpa"))
    assert calls["attention_varlen"] == 2


def test_configs_exercise_the_features():
    """The window and the softcap of the tiny configs change the logits (so matching eager
    checks them), and so does a window one wider or narrower (the off-by-one)."""
    ids, mask = padded_batch()
    valid = mask.bool()

    def eager_logits(family, **overrides):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(make_config(family, **overrides),
                                                 attn_implementation="eager").eval()
        model.load_state_dict(pair(family)[0].state_dict())
        with torch.no_grad():
            return model(ids, attention_mask=mask).logits[valid]

    base = eager_logits("mistral")
    for w in (3, 5, None):
        assert (eager_logits("mistral", sliding_window=w) - base).abs().max() > 100 * ATOL
    base = eager_logits("gemma2")
    assert (eager_logits("gemma2", attn_logit_softcapping=None) - base).abs().max() > 100 * ATOL
    assert (eager_logits("gemma2", sliding_window=5) - base).abs().max() > 100 * ATOL


@pytest.mark.parametrize("window", [1, 2, 3, 4, 7, 30])
def test_sliding_window_matches_transformers_mask(window, calls):
    """The attention function with sliding_window=W applies exactly the mask transformers
    builds for W (kv > q - W and kv <= q), with left and right padding."""
    torch.manual_seed(0)
    b, h, h_k, s, d = 3, 4, 2, 12, 16
    q = torch.randn(b, h, s, d) * 2
    k = torch.randn(b, h_k, s, d) * 2
    v = torch.randn(b, h_k, s, d)
    pad = torch.ones(b, s, dtype=torch.bool)
    pad[0, :3] = False
    pad[1, 9:] = False
    module = torch.nn.Module()
    module.is_causal = True
    if "q_length" in inspect.signature(mu.sdpa_mask).parameters:
        where = dict(q_length=s)
    else:  # transformers < 5.x: cache_position
        where = dict(cache_position=torch.arange(s))
    dense = mu.sdpa_mask(batch_size=b, kv_length=s, attention_mask=pad,
                         mask_function=mu.sliding_window_causal_mask_function(window),
                         allow_is_causal_skip=False, **where)
    want = f3hf._dense_fallback(q, k, v, dense, 0.25, 0.0)
    with no_fallback():
        got, _ = f3hf.attention_forward(module, q, k, v, pad, scaling=0.25, sliding_window=window)
    assert calls["attention_varlen"] == 1
    torch.testing.assert_close(got[pad], want[pad], atol=1e-5, rtol=0)


# ------------------------------------------------------------------------------ generate
@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_generate_left_padded_matches_eager(family, cache, calls):
    ref, fa = pair(family)
    ids, mask = left_padded_prompts()
    kw = dict(attention_mask=mask, max_new_tokens=4, do_sample=False, cache_implementation=cache,
              pad_token_id=0)
    with no_fallback():
        want = ref.generate(ids, **kw)
        got = fa.generate(ids, **kw)
    assert torch.equal(got, want)
    assert calls["attention"] + calls["attention_varlen"] == 2 * 4  # every layer, every step


def test_generate_static_cache_compiled(calls):
    """generate() compiles the forward with a static cache (on GPUs by default; forced here,
    with dynamo's eager backend): same tokens."""
    from transformers import CompileConfig
    compile_config = CompileConfig(backend="eager", fullgraph=False)
    if not hasattr(compile_config, "_compile_all_devices"):
        pytest.skip("this transformers cannot compile generate() on the CPU")
    compile_config._compile_all_devices = True
    ref, _ = pair("mistral")
    _, fa = make_pair("mistral")  # its own model: compilation sticks to it
    fa.load_state_dict(ref.state_dict())
    ids, mask = left_padded_prompts()
    kw = dict(attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0,
              cache_implementation="static")
    with no_fallback():
        want = ref.generate(ids, **kw)
        got = fa.generate(ids, compile_config=compile_config, **kw)
    assert torch.equal(got, want)
    assert calls["attention"] + calls["attention_varlen"] > 0  # (dynamo may trace, not call)


def test_generate_under_inference_mode(calls):
    ref, fa = pair("mistral")
    ids, mask = left_padded_prompts()
    kw = dict(attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0)
    with no_fallback(), torch.inference_mode():
        want = ref.generate(ids, **kw)
        got = fa.generate(ids, **kw)
    assert torch.equal(got, want)
    assert calls["attention"] + calls["attention_varlen"] == 2 * 4


def test_generate_then_logits_of_the_continuation(calls):
    """Logits of one decoding step with a cache, a left-padded batch: equal to eager's."""
    ref, fa = pair("mistral")
    ids, mask = left_padded_prompts()
    outs = []
    for model in (ref, fa):
        with torch.no_grad():
            first = model(ids, attention_mask=mask, use_cache=True)
            nxt = first.logits[:, -1].argmax(-1, keepdim=True)
            mask2 = torch.cat([mask, torch.ones_like(nxt)], 1)
            step = model(nxt, attention_mask=mask2, past_key_values=first.past_key_values,
                         use_cache=True)
        outs.append(step.logits)
    torch.testing.assert_close(outs[1], outs[0], atol=ATOL, rtol=0)
    # Prefill unpadded; the step sees only the window's last keys, all real: no padding left.
    assert calls["attention_varlen"] == 2 and calls["attention"] == 2


# ------------------------------------------------------------------------------ training
@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_training_gradients_match_eager(family, calls):
    ref, fa = make_pair(family)
    ids, mask = padded_batch()
    # A label counts when it and the token predicting it are real: the outputs at padding
    # differ (eager's are garbage, flash3's zeros), so the first token after left padding,
    # which a padding position predicts, is left out.
    prev = torch.cat([torch.zeros_like(mask[:, :1]), mask[:, :-1]], 1)
    labels = ids.masked_fill((mask == 0) | (prev == 0), -100)
    grads, losses = [], []
    for model in (ref, fa):
        model.train()
        loss = model(ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        losses.append(loss.detach())
        grads.append({n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    assert calls["attention_varlen"] == 2
    torch.testing.assert_close(losses[1], losses[0], atol=1e-5, rtol=0)
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], atol=ATOL, rtol=1e-3,
                                   msg=lambda m: f"{name}: {m}")


def test_dropout_raises_in_training():
    _, fa = make_pair("llama", attention_dropout=0.1)
    ids, mask = padded_batch()
    with torch.no_grad():
        fa(ids, attention_mask=mask)  # eval: dropout is 0
        fa.train()
        with pytest.raises(ValueError, match="dropout"):
            fa(ids, attention_mask=mask)


# ------------------------------------------------------------------------------ fallbacks
def test_custom_4d_mask_falls_back_exactly_with_one_warning(calls):
    """A prefix-LM 4D mask (bidirectional prefix of 6 tokens, causal after): the dense path,
    warned about once."""
    ref, fa = pair("llama")
    ids, _ = padded_batch()
    s = ids.shape[1]
    allowed = torch.ones(s, s).tril().bool()
    allowed[:6, :6] = True
    mask4d = torch.zeros(3, 1, s, s).masked_fill(~allowed, torch.finfo(torch.float32).min)
    with warnings.catch_warnings(record=True) as record, torch.no_grad():
        warnings.simplefilter("always")
        want = ref(ids, attention_mask=mask4d).logits
        got = fa(ids, attention_mask=mask4d).logits
        got2 = fa(ids, attention_mask=mask4d).logits
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    torch.testing.assert_close(got2, want, atol=ATOL, rtol=0)
    msgs = fallback_messages(record)
    assert len(msgs) == 1 and "4D" in msgs[0]
    assert calls["attention"] == calls["attention_varlen"] == 0


def test_packed_sequences_fall_back_exactly(calls):
    """position_ids restarting inside a row (packed sequences, no attention mask): transformers
    builds a block-diagonal mask; flash3 gets its exact 4D form and warns."""
    ref, fa = pair("mistral")
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, VOCAB, (1, 16), generator=g)
    position_ids = torch.cat([torch.arange(9), torch.arange(7)])[None]
    with warnings.catch_warnings(record=True) as record, torch.no_grad():
        warnings.simplefilter("always")
        want = ref(ids, position_ids=position_ids, use_cache=False).logits
        got = fa(ids, position_ids=position_ids, use_cache=False).logits
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    assert len(fallback_messages(record)) == 1
    assert calls["attention"] == calls["attention_varlen"] == 0
    # Sanity: the packing matters (a plain causal pass over the row differs).
    with torch.no_grad():
        plain = ref(ids, use_cache=False).logits
    assert (plain - want)[0, 9:].abs().max() > 100 * ATOL


def test_holes_in_the_padding(calls):
    """Padding between real tokens: exact on the varlen path when causal without a window;
    with a window (positions matter) the dense path, with a warning."""
    ids, mask = padded_batch()
    mask[2, 8:11] = 0
    valid = mask.bool()
    for family, expect_warning in (("llama", False), ("mistral", True)):
        ref, fa = pair(family)
        with warnings.catch_warnings(record=True) as record, torch.no_grad():
            warnings.simplefilter("always")
            want = ref(ids, attention_mask=mask).logits
            got = fa(ids, attention_mask=mask).logits
        torch.testing.assert_close(got[valid], want[valid], atol=ATOL, rtol=0)
        assert bool(fallback_messages(record)) == expect_warning
    assert calls["attention_varlen"] == 2  # llama's two layers


def test_bidirectional_with_padding(calls):
    """config.is_causal=False: transformers builds a bidirectional padding mask; flash3 computes
    every query row against the real keys."""
    if not hasattr(mu, "create_bidirectional_mask"):
        pytest.skip("this transformers has no bidirectional decoder masks")
    ref, fa = make_pair("llama", is_causal=False)
    ids, mask = padded_batch()
    with no_fallback(), torch.no_grad():
        want = ref(ids, attention_mask=mask).logits
        got = fa(ids, attention_mask=mask).logits
        causal = pair("llama")[0](ids, attention_mask=mask).logits
    valid = mask.bool()
    if torch.allclose(want[valid], causal[valid], atol=ATOL):
        pytest.skip("is_causal=False has no effect in this transformers")
    torch.testing.assert_close(got[valid], want[valid], atol=ATOL, rtol=0)
    assert calls["attention_varlen"] == 2


def test_output_attentions_warns_and_gives_none():
    _, fa = pair("llama")
    ids, mask = padded_batch()
    with warnings.catch_warnings(record=True) as record, torch.no_grad():
        warnings.simplefilter("always")
        out = fa(ids, attention_mask=mask, output_attentions=True)
    assert any("output_attentions" in m for m in fallback_messages(record))
    assert out.attentions is None or all(a is None for a in out.attentions)


# ------------------------------------------------------------------------------ attention sinks
def test_attention_interface_sinks_match_eager_with_a_sink_column():
    """s_aux (gpt-oss's sinks) through the attention function: the eager softmax with a sink
    column, causal and with a sliding window, with and without padding (varlen path)."""
    torch.manual_seed(0)
    b, h, h_k, s, d = 2, 4, 2, 9, 16
    q, k, v = torch.randn(b, h, s, d), torch.randn(b, h_k, s, d), torch.randn(b, h_k, s, d)
    sinks = torch.randn(h)

    class Module(torch.nn.Module):
        is_causal = True

    for window in (None, 4):
        got, _ = f3hf.attention_forward(Module(), q, k, v, None, scaling=0.3,
                                        sliding_window=window, s_aux=sinks)
        kk, vv = k.repeat_interleave(2, 1).double(), v.repeat_interleave(2, 1).double()
        scores = q.double() @ kk.transpose(2, 3) * 0.3
        i, j = torch.arange(s)[:, None], torch.arange(s)[None, :]
        hide = (j > i) | ((j <= i - window) if window else torch.zeros_like(j > i))
        scores = scores.masked_fill(hide, -float("inf"))
        scores = torch.cat([scores, sinks.double().view(1, h, 1, 1).expand(b, h, s, 1)], -1)
        want = (torch.softmax(scores, -1)[..., :-1] @ vv).transpose(1, 2)
        torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=0)


@pytest.mark.skipif(not hasattr(transformers, "GptOssConfig"), reason="no gpt-oss in transformers")
def test_gpt_oss_logits_match_eager(calls):
    """A tiny random gpt-oss (sinks in every layer, sliding and full layers): flash3's logits
    equal eager's on a padded batch and on an unpadded one."""
    cfg = dict(COMMON, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
               sliding_window=4, layer_types=["sliding_attention", "full_attention"])
    torch.manual_seed(0)
    ref = AutoModelForCausalLM.from_config(transformers.GptOssConfig(**cfg),
                                           attn_implementation="eager").eval()
    fa = AutoModelForCausalLM.from_config(transformers.GptOssConfig(**cfg),
                                          attn_implementation=NAME).eval()
    with torch.no_grad():  # sinks are zeros at init: make them matter
        for name, p in ref.named_parameters():
            if name.endswith("sinks"):
                p.copy_(torch.randn_like(p) * 2)
    fa.load_state_dict(ref.state_dict())
    assert_padded_logits_match(ref, fa)
    ids, _ = padded_batch()
    with no_fallback(), torch.no_grad():
        torch.testing.assert_close(fa(ids[2:]).logits, ref(ids[2:]).logits, atol=ATOL, rtol=0)
    assert calls["attention"] > 0 and calls["attention_varlen"] > 0
