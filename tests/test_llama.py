"""helpers.llama: the config, the KV cache, cached vs uncached decoding, RoPE, masks, loading
weights, and equivalence with Hugging Face's LlamaForCausalLM."""

import pytest
import torch

from helpers.llama import (
    KVCache,
    LlamaConfig,
    LlamaForCausalLM,
    apply_rope,
    causal_mask,
    generate,
    load_hf_state_dict,
    rope_cos_sin,
)
from helpers.models import ModelConfig

TINY = LlamaConfig(vocab_size=50, layers=2, hidden=32, q_heads=4, kv_heads=2, head_dim=8, intermediate=48,
                   max_positions=32)
TIED = LlamaConfig(**{**TINY.to_dict(), "tie_embeddings": True})


def make_model(config=TINY, seed=0):
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


def ids(batch, length, vocab=TINY.vocab_size, seed=1):
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def close(a, b, atol=1e-5):
    torch.testing.assert_close(a, b, atol=atol, rtol=0)


# ---- config ---------------------------------------------------------------------------------
SIZES = ("vocab_size", "layers", "hidden", "q_heads", "kv_heads", "head_dim", "intermediate", "max_positions")


@pytest.mark.parametrize("field", SIZES)
@pytest.mark.parametrize("value", [0, -2])
def test_config_rejects_non_positive_sizes_naming_the_field(field, value):
    with pytest.raises(ValueError, match=rf"^{field} must be at least 1"):
        LlamaConfig(**{**TINY.to_dict(), field: value})


def test_config_rejects_bad_shapes():
    with pytest.raises(ValueError, match=r"q_heads \(6\) must be a multiple of kv_heads \(4\)"):
        LlamaConfig(q_heads=6, kv_heads=4)
    with pytest.raises(ValueError, match="head_dim must be even"):
        LlamaConfig(head_dim=7)
    with pytest.raises(ValueError, match="hidden must be a whole number"):
        LlamaConfig(hidden=32.0)


@pytest.mark.parametrize("theta", [0.0, -10000.0])
def test_config_rejects_non_positive_rope_theta(theta):
    with pytest.raises(ValueError, match="rope_theta"):
        LlamaConfig(rope_theta=theta)


def test_config_rejects_non_positive_norm_eps():
    with pytest.raises(ValueError, match="norm_eps"):
        LlamaConfig(norm_eps=0.0)


def test_as_model_config_is_a_registry_shape():
    m = TINY.as_model_config()
    assert isinstance(m, ModelConfig)
    assert (m.layers, m.hidden, m.q_heads, m.kv_heads, m.head_dim, m.intermediate, m.vocab, m.max_context) == (
        2, 32, 4, 2, 8, 48, 50, 32)
    assert m.attention == "GQA" and not m.tied_embeddings and TIED.as_model_config().tied_embeddings
    assert LlamaConfig(**TINY.to_dict()) == TINY  # to_dict round trip


@pytest.mark.parametrize("config", [TINY, TIED, LlamaConfig()], ids=["untied", "tied", "default"])
def test_param_count_matches_the_torch_model(config):
    model = LlamaForCausalLM(config)
    assert config.as_model_config().param_count() == sum(p.numel() for p in model.parameters())


def test_tied_model_shares_one_matrix():
    model = make_model(TIED)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    untied = sum(p.numel() for p in make_model(TINY).parameters())
    assert untied - sum(p.numel() for p in model.parameters()) == TINY.vocab_size * TINY.hidden


# ---- cached vs uncached ---------------------------------------------------------------------
def test_greedy_generation_is_identical_with_and_without_cache():
    model, prompt = make_model(), ids(2, 5)
    cached = generate(model, prompt, 12, use_cache=True)
    uncached = generate(model, prompt, 12, use_cache=False)
    assert cached.shape == (2, 17) and torch.equal(cached[:, :5], prompt)
    assert torch.equal(cached, uncached)
    assert torch.equal(generate(model, prompt, 0), prompt)


def test_cached_step_logits_equal_uncached_forward():
    model, prompt = make_model(), ids(2, 5)
    cache = KVCache(TINY, batch=2)
    with torch.no_grad():
        step_logits = model(prompt, cache)
        close(step_logits, model(prompt))
        seq = prompt
        for _ in range(8):
            nxt = step_logits[:, -1].argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], dim=1)
            step_logits = model(nxt, cache)
            assert step_logits.shape == (2, 1, TINY.vocab_size)
            close(step_logits[:, -1], model(seq)[:, -1])
    assert cache.length == seq.shape[1]


def test_sampling_is_reproducible_and_the_same_with_and_without_cache():
    model, prompt = make_model(), ids(1, 4)

    def sample(seed, use_cache):
        return generate(model, prompt, 15, use_cache=use_cache, temperature=1.5,
                        generator=torch.Generator().manual_seed(seed))

    first = sample(7, True)
    assert torch.equal(first, sample(7, True))
    assert torch.equal(first, sample(7, False))
    assert not torch.equal(first, sample(8, True))  # the seed matters: it really samples
    assert not torch.equal(first, generate(model, prompt, 15))  # and is not greedy
    assert torch.equal(sample_at(model, prompt, 1e-4), generate(model, prompt, 15))  # near 0: greedy again


def sample_at(model, prompt, temperature):
    return generate(model, prompt, 15, temperature=temperature, generator=torch.Generator().manual_seed(7))


@pytest.mark.parametrize("pieces", [(3, 4, 2), (5, 4), (1, 1, 7)])
def test_chunked_prefill_equals_one_prefill(pieces):
    model, prompt = make_model(), ids(2, 9)
    whole, chunked = KVCache(TINY, batch=2), KVCache(TINY, batch=2)
    with torch.no_grad():
        reference = model(prompt, whole)
        parts, start = [], 0
        for n in pieces:
            parts.append(model(prompt[:, start:start + n], chunked))
            start += n
            assert chunked.length == start
        close(torch.cat(parts, dim=1), reference)
        nxt = reference[:, -1].argmax(-1, keepdim=True)
        close(model(nxt, chunked), model(nxt, whole))
    close(chunked.keys[:, :, :, :10], whole.keys[:, :, :, :10])
    close(chunked.values[:, :, :, :10], whole.values[:, :, :, :10])


# ---- the cache ------------------------------------------------------------------------------
def test_cache_shape_and_default_capacity():
    cache = KVCache(TINY, batch=3)
    assert cache.keys.shape == cache.values.shape == (2, 3, 2, TINY.max_positions, 8)
    assert cache.capacity == TINY.max_positions and cache.length == 0 and cache.nbytes() == 0
    assert KVCache(TINY, capacity=5).keys.shape == (2, 1, 2, 5, 8)
    with pytest.raises(ValueError, match="batch"):
        KVCache(TINY, batch=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_cache_nbytes_is_lesson_01s_formula(dtype):
    model = make_model().to(dtype)
    cache = KVCache(TINY, batch=2, dtype=dtype)
    per_token = TINY.as_model_config().kv_bytes_per_token(torch.tensor([], dtype=dtype).element_size())
    with torch.no_grad():
        model(ids(2, 6), cache)
        assert cache.nbytes() == 2 * 6 * per_token
        model(ids(2, 1), cache)
    assert cache.nbytes() == 2 * 7 * per_token
    assert per_token == 2 * TINY.layers * TINY.kv_heads * TINY.head_dim * cache.keys.element_size()


def test_cache_overflow_raises():
    model, cache = make_model(), KVCache(TINY, capacity=4)
    with torch.no_grad():
        with pytest.raises(ValueError, match="overflows"):
            model(ids(1, 5), cache)
        model(ids(1, 4), cache)
        with pytest.raises(ValueError, match="holds 4 positions"):
            model(ids(1, 1), cache)
    assert cache.length == 4
    k = torch.zeros(1, 2, 5, 8)
    with pytest.raises(ValueError, match="overflows"):
        KVCache(TINY, capacity=4).append(0, k, k)


def test_cache_length_advances_once_per_forward_pass():
    model, cache = make_model(), KVCache(TINY)
    with torch.no_grad():
        model(ids(1, 5), cache)
        assert cache.length == 5  # not 5 per layer
        model(ids(1, 1), cache)
        assert cache.length == 6
    k = torch.ones(1, 2, 3, 8)
    fresh = KVCache(TINY)
    held_k, held_v = fresh.append(0, k, 2 * k)
    assert fresh.length == 0 and held_k.shape == (1, 2, 3, 8) and torch.equal(held_v, 2 * k)
    fresh.append(1, k, k)
    fresh.advance()
    assert fresh.length == 3
    held_k, _ = fresh.append(0, k, k)
    assert held_k.shape[2] == 6


# ---- attention, masks, RoPE -----------------------------------------------------------------
def test_keep_attention_matches_sdpa_and_weights_are_causal_distributions():
    model = make_model()
    prompt, more = ids(2, 4), ids(2, 3, seed=5)
    fused, explicit = KVCache(TINY, batch=2), KVCache(TINY, batch=2)
    with torch.no_grad():
        close(model(prompt, explicit, keep_attention=True), model(prompt, fused))
        expected = model(more, fused)
        close(model(more, explicit, keep_attention=True), expected)
        weights = model.attention_weights
        assert len(weights) == TINY.layers
        for w in weights:
            assert w.shape == (2, TINY.q_heads, 3, 7)
            close(w.sum(-1), torch.ones(2, TINY.q_heads, 3))
            future = ~causal_mask(3, 7)
            assert torch.all(w[..., future] == 0)
            assert torch.all(w[..., ~future] > 0)
        model(more[:, :1], fused)
        assert model.attention_weights is None
        close(model(ids(1, 6), keep_attention=True), model(ids(1, 6)))  # and without a cache


def test_causal_mask_is_end_aligned():
    assert causal_mask(2, 5).tolist() == [[True, True, True, True, False], [True, True, True, True, True]]
    assert torch.equal(causal_mask(4, 4), torch.ones(4, 4, dtype=torch.bool).tril())
    assert causal_mask(1, 6).all() and causal_mask(1, 6).shape == (1, 6)


def test_rope_preserves_norms_and_is_identity_at_position_zero():
    x = torch.randn(2, 3, 7, 8, generator=torch.Generator().manual_seed(0))
    cos, sin = rope_cos_sin(8, torch.arange(7), 10000.0)
    assert cos.shape == sin.shape == (7, 8)
    rotated = apply_rope(x, cos, sin)
    close(rotated.norm(dim=-1), x.norm(dim=-1))
    assert torch.equal(rotated[:, :, 0], x[:, :, 0])
    assert not torch.allclose(rotated[:, :, 1:], x[:, :, 1:])


def test_rope_scores_depend_only_on_relative_position():
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(1, 1, 1, 8, generator=g), torch.randn(1, 1, 1, 8, generator=g)

    def score(m, n):
        cq, sq = rope_cos_sin(8, torch.tensor([m]), 500.0)
        ck, sk = rope_cos_sin(8, torch.tensor([n]), 500.0)
        return (apply_rope(q, cq, sq) * apply_rope(k, ck, sk)).sum()

    close(score(5, 2), score(13, 10), atol=1e-4)
    assert abs(score(5, 2) - score(5, 4)) > 1e-3


# ---- errors ---------------------------------------------------------------------------------
def test_generate_and_forward_reject_bad_input():
    model = make_model()
    with pytest.raises(ValueError, match="33 positions exceed max_positions 32"):
        generate(model, ids(1, 30), 4)
    generate(model, ids(1, 30), 3)  # the last token made is never fed back: 32 positions, exactly max_positions
    with pytest.raises(ValueError, match="temperature"):
        generate(model, ids(1, 3), 2, temperature=-0.5)
    with pytest.raises(ValueError, match="prompt_ids"):
        generate(model, torch.tensor([1, 2, 3]), 2)
    with pytest.raises(ValueError, match="prompt_ids"):
        generate(model, torch.zeros(1, 0, dtype=torch.long), 2)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(model, ids(1, 3), -1)
    with pytest.raises(ValueError, match="input_ids"):
        model(torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="exceed max_positions"):
        model(ids(1, 33))
    cache = KVCache(TINY)
    with torch.no_grad():
        model(ids(1, 30), cache)
        with pytest.raises(ValueError, match="exceed max_positions"):
            model(ids(1, 3), cache)


def test_model_runs_in_float64():
    model = make_model()
    prompt = ids(1, 6)
    with torch.no_grad():
        expected = model(prompt)
        model = model.to(torch.float64)
        logits = model(prompt)
        assert logits.dtype == torch.float64
        close(logits, expected.double(), atol=1e-4)
        cache = KVCache(TINY, dtype=torch.float64)
        close(model(prompt, cache, keep_attention=True), logits)
    out = generate(model, prompt, 4)
    assert torch.equal(out, generate(model, prompt, 4, use_cache=False))


# ---- loading weights ------------------------------------------------------------------------
@pytest.mark.parametrize("config", [TINY, TIED], ids=["untied", "tied"])
def test_state_dict_round_trip(config):
    source, target, prompt = make_model(config, seed=0), make_model(config, seed=1), ids(1, 7)
    with torch.no_grad():
        assert not torch.allclose(source(prompt), target(prompt))
        load_hf_state_dict(target, source.state_dict())
        assert torch.equal(source(prompt), target(prompt))


def test_tied_model_loads_without_lm_head_key():
    source, target, prompt = make_model(TIED, seed=0), make_model(TIED, seed=1), ids(1, 7)
    state = {k: v for k, v in source.state_dict().items() if k != "lm_head.weight"}
    load_hf_state_dict(target, state)
    with torch.no_grad():
        assert torch.equal(source(prompt), target(prompt))


def test_load_rejects_missing_unexpected_and_misshapen_keys():
    model, state = make_model(), make_model(seed=1).state_dict()
    missing = {k: v for k, v in state.items() if k != "model.norm.weight"}
    with pytest.raises(ValueError, match=r"missing \['model.norm.weight'\]"):
        load_hf_state_dict(model, missing)
    with pytest.raises(ValueError, match=r"unexpected \['model.layers.2.mlp.up_proj.weight'\]"):
        load_hf_state_dict(model, {**state, "model.layers.2.mlp.up_proj.weight": torch.zeros(48, 32)})
    with pytest.raises(ValueError, match=r"wrong shapes.*lm_head.weight: \(51, 32\) \(expected \(50, 32\)\)"):
        load_hf_state_dict(model, {**state, "lm_head.weight": torch.zeros(51, 32)})
    assert torch.equal(model.model.norm.weight, torch.ones(32))  # nothing half-loaded


def test_load_ignores_rotary_inv_freq():
    source, target, prompt = make_model(seed=0), make_model(seed=1), ids(1, 5)
    state = {**source.state_dict(), "model.rotary_emb.inv_freq": torch.zeros(4),
             "model.layers.0.self_attn.rotary_emb.inv_freq": torch.zeros(4)}
    load_hf_state_dict(target, state)
    with torch.no_grad():
        assert torch.equal(source(prompt), target(prompt))


# ---- Hugging Face equivalence ---------------------------------------------------------------
HF_SHAPE = dict(vocab_size=300, hidden_size=64, intermediate_size=160, num_hidden_layers=3, num_attention_heads=8,
                num_key_value_heads=2, head_dim=8, max_position_embeddings=128, rope_theta=5000.0, rms_norm_eps=1e-6)


def ours_for(tied):
    return LlamaConfig(vocab_size=300, layers=3, hidden=64, q_heads=8, kv_heads=2, head_dim=8, intermediate=160,
                       rope_theta=5000.0, max_positions=128, norm_eps=1e-6, tie_embeddings=tied)


def hf_model(tied):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(**HF_SHAPE, tie_word_embeddings=tied)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # weights larger than HF's 0.02 init, and norm weights not all 1, so mistakes show
        for name, p in model.named_parameters():
            p.copy_(1 + 0.3 * torch.randn_like(p) if name.endswith("norm.weight") else 0.15 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_logits_equal_hugging_face_llama(tied):
    hf = hf_model(tied)
    ours = LlamaForCausalLM(ours_for(tied)).eval()
    load_hf_state_dict(ours, hf.state_dict())
    prompt = ids(2, 40, vocab=300)
    with torch.no_grad():
        expected = hf(prompt).logits
        assert expected.abs().max() > 1  # the comparison below is not trivially small numbers
        close(ours(prompt), expected)
        cache = KVCache(ours.config, batch=2)
        close(torch.cat([ours(prompt[:, :25], cache), ours(prompt[:, 25:], cache)], dim=1), expected)
        # the check is sensitive: a different RoPE base gives visibly different logits
        wrong = LlamaForCausalLM(LlamaConfig(**{**ours_for(tied).to_dict(), "rope_theta": 10000.0})).eval()
        load_hf_state_dict(wrong, hf.state_dict())
        assert (wrong(prompt) - expected).abs().max() > 1e-3


def test_greedy_generation_matches_hugging_face():
    hf = hf_model(False)
    ours = LlamaForCausalLM(ours_for(False)).eval()
    load_hf_state_dict(ours, hf.state_dict())
    prompt = ids(1, 6, vocab=300)
    with torch.no_grad():
        expected = hf.generate(prompt, max_new_tokens=10, do_sample=False, attention_mask=torch.ones_like(prompt),
                               pad_token_id=0)
    assert torch.equal(generate(ours, prompt, 10), expected)


@pytest.mark.parametrize("use_cache", [True, False], ids=["cached", "uncached"])
def test_generate_stops_once_every_sequence_has_made_the_stop_token(use_cache):
    model, prompt = make_model(), ids(2, 4)
    full = generate(model, prompt, 20, use_cache=use_cache)
    new = full[:, 4:]
    stop = int(new[0, 3])  # a token the first sequence makes at its 4th step
    first_seen = [int((row == stop).nonzero()[0]) if (row == stop).any() else None for row in new]
    out = generate(model, prompt, 20, use_cache=use_cache, stop_token=stop)
    if None in first_seen:  # the other sequence never makes it: generation runs to the end
        assert torch.equal(out, full)
    else:  # ends at the step where the last of the two makes it, and is the same up to there
        end = max(first_seen) + 1
        assert torch.equal(out, full[:, :4 + end])
    assert torch.equal(generate(model, prompt, 20, use_cache=use_cache, stop_token=TINY.vocab_size + 5), full)
