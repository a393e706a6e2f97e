"""Tests for helpers.models: the registry of published shapes, cache rules and parameter counts."""

from __future__ import annotations

import pytest

from helpers.kv_cache_size import kv_bytes_per_token
from helpers.models import MODELS, ModelConfig, get_model

# FACTS.md, "Model configurations": bytes per token in bf16.
FACTS_BYTES_PER_TOKEN = {
    "GPT-2 small": 36_864,
    "Llama-2-7B": 524_288,
    "Llama-2-70B": 327_680,
    "Llama-3-8B": 131_072,
    "Llama-3-70B": 327_680,
    "Llama-3.1-405B": 516_096,
    "Mistral-7B-v0.1": 131_072,
    "Mixtral-8x7B": 131_072,
    "Falcon-7B": 8_192,
    "Qwen2.5-7B": 57_344,
    "Gemma-2-9B": 344_064,
    "DeepSeek-V2": 69_120,
    "DeepSeek-V3": 70_272,
}

ATTENTION = {
    "GPT-2 small": "MHA",
    "Llama-2-7B": "MHA",
    "Llama-2-70B": "GQA",
    "Llama-3-8B": "GQA",
    "Llama-3-70B": "GQA",
    "Llama-3.1-405B": "GQA",
    "Mistral-7B-v0.1": "GQA",
    "Mixtral-8x7B": "GQA",
    "Falcon-7B": "MQA",
    "Qwen2.5-7B": "GQA",
    "Gemma-2-9B": "GQA",
    "DeepSeek-V2": "MLA",
    "DeepSeek-V3": "MLA",
}


def test_registry_holds_exactly_the_facts_table():
    assert set(MODELS) == set(FACTS_BYTES_PER_TOKEN)
    for name, model in MODELS.items():
        assert model.name == name


@pytest.mark.parametrize("name, expected", sorted(FACTS_BYTES_PER_TOKEN.items()))
def test_bytes_per_token_matches_facts(name, expected):
    model = MODELS[name]
    assert model.kv_bytes_per_token(2) == expected
    assert model.kv_bytes_per_token() == expected  # bf16 default
    assert model.kv_bytes_per_token(1) * 2 == expected
    assert model.kv_bytes_per_token(4) == 2 * expected


@pytest.mark.parametrize("name, kind", sorted(ATTENTION.items()))
def test_attention_kind(name, kind):
    assert MODELS[name].attention == kind


@pytest.mark.parametrize("name", [n for n, k in ATTENTION.items() if k != "MLA"])
def test_non_mla_bytes_follow_the_general_formula(name):
    m = MODELS[name]
    assert m.kv_bytes_per_token(2) == kv_bytes_per_token(m.layers, m.kv_heads, m.head_dim, 2)


# ---- parameter counts --------------------------------------------------------------------


def test_exact_parameter_counts():
    assert MODELS["Llama-2-7B"].param_count() == 6_738_415_616
    assert MODELS["GPT-2 small"].param_count() == 124_439_808
    assert MODELS["Llama-2-7B"].weight_bytes(2) == 13_476_831_232
    assert MODELS["Llama-2-7B"].weight_bytes(1) == 6_738_415_616


@pytest.mark.parametrize(
    "name, published, tolerance",
    [
        ("Llama-2-7B", 6.74e9, 0.005),
        ("Mixtral-8x7B", 46.7e9, 0.005),
        ("Qwen2.5-7B", 7.61e9, 0.005),
        ("Falcon-7B", 6.92e9, 0.005),
        ("DeepSeek-V2", 236e9, 0.02),
        ("DeepSeek-V3", 671e9, 0.02),
    ],
)
def test_total_parameters_near_published(name, published, tolerance):
    assert MODELS[name].param_count() == pytest.approx(published, rel=tolerance)


@pytest.mark.parametrize(
    "name, active, tolerance",
    [("Mixtral-8x7B", 12.9e9, 0.005), ("DeepSeek-V2", 21e9, 0.02), ("DeepSeek-V3", 37e9, 0.02)],
)
def test_active_parameters_near_published(name, active, tolerance):
    model = MODELS[name]
    assert model.active_param_count() == pytest.approx(active, rel=tolerance)
    assert model.active_param_count() < model.param_count()


@pytest.mark.parametrize("name", [n for n, m in MODELS.items() if not m.experts])
def test_dense_models_use_every_parameter(name):
    model = MODELS[name]
    assert model.active_param_count() == model.param_count()


# ---- windows -----------------------------------------------------------------------------


def test_mistral_cache_stops_growing_at_window():
    m = MODELS["Mistral-7B-v0.1"]
    per_token = 131_072
    assert m.cache_bytes(0) == 0
    assert m.cache_bytes(4095) == 4095 * per_token
    assert m.cache_bytes(4096) == 4096 * per_token
    assert m.cache_bytes(4097) == 4096 * per_token
    assert m.cache_bytes(32_768) == 4096 * per_token
    assert m.cache_bytes(32_768, batch=3) == 3 * 4096 * per_token
    assert m.crossover_tokens() is None
    assert m.crossover_tokens(batch=4) is None


def test_mistral_crossover_within_window_for_a_large_batch():
    m = MODELS["Mistral-7B-v0.1"]
    n = m.crossover_tokens(batch=128)
    assert n is not None and n <= m.window
    assert m.cache_bytes(n, 128) > m.weight_bytes() >= m.cache_bytes(n - 1, 128)


def test_gemma_cache_grows_at_half_rate_past_window():
    m = MODELS["Gemma-2-9B"]
    per_token = 344_064
    assert m.cache_bytes(4096) == 4096 * per_token
    assert m.cache_bytes(4096) - m.cache_bytes(4095) == per_token
    assert m.cache_bytes(4097) - m.cache_bytes(4096) == per_token // 2
    assert m.cache_bytes(8192) == 4096 * per_token + 4096 * per_token // 2


def test_gemma_crossover_is_first_count_above_weights():
    m = MODELS["Gemma-2-9B"]
    weights = m.weight_bytes()
    n = m.crossover_tokens()
    assert n == 103_346
    assert n > m.window
    assert m.cache_bytes(n - 1) <= weights < m.cache_bytes(n)


# ---- MLA ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["DeepSeek-V2", "DeepSeek-V3"])
@pytest.mark.parametrize("bpe", [1, 2, 4])
def test_mla_cache_is_layers_times_576_elements(name, bpe):
    m = MODELS[name]
    assert m.kv_lora_rank + m.qk_rope_head_dim == 576
    assert m.kv_bytes_per_token(bpe) == m.layers * 576 * bpe
    assert m.cache_bytes(1000, batch=2, bytes_per_element=bpe) == 2 * 1000 * m.layers * 576 * bpe


def test_mla_cache_ignores_kv_heads_and_head_dim():
    m = MODELS["DeepSeek-V3"]
    assert m.with_shape(kv_heads=1, head_dim=64).kv_bytes_per_token(2) == 70_272


# ---- get_model ---------------------------------------------------------------------------


@pytest.mark.parametrize("spelling", ["Llama-2-7B", "llama-2-7b", "LLAMA-2-7B", "  llama-2-7B "])
def test_get_model_is_case_insensitive(spelling):
    assert get_model(spelling) is MODELS["Llama-2-7B"]


@pytest.mark.parametrize("bad", ["GPT-5", "", "llama", None, 7])
def test_get_model_unknown_lists_known_names(bad):
    with pytest.raises(ValueError, match="known models") as info:
        get_model(bad)
    message = str(info.value)
    assert repr(bad) in message
    for name in MODELS:
        assert name in message


# ---- ModelConfig validation --------------------------------------------------------------


def _config(**changes):
    fields = dict(name="toy", source="test", layers=2, hidden=64, q_heads=8, kv_heads=4, head_dim=8,
                  intermediate=128, vocab=100, max_context=256)
    fields.update(changes)
    return ModelConfig(**fields)


def test_valid_toy_config():
    toy = _config()
    assert toy.attention == "GQA"
    assert toy.kv_bytes_per_token(2) == 2 * 2 * 4 * 8 * 2


def test_q_heads_must_be_multiple_of_kv_heads():
    with pytest.raises(ValueError, match=r"q_heads \(8\) must be a multiple of kv_heads \(3\)"):
        _config(kv_heads=3)


@pytest.mark.parametrize("bias", ["some", "QKV", "", None])
def test_bad_bias(bias):
    with pytest.raises(ValueError, match="bias must be one of 'none', 'qkv', 'all'"):
        _config(bias=bias)


@pytest.mark.parametrize("field", ["layers", "hidden", "q_heads", "kv_heads", "head_dim", "intermediate",
                                   "vocab", "max_context"])
@pytest.mark.parametrize("bad", [0, -4, 2.0])
def test_sizes_must_be_positive_ints(field, bad):
    with pytest.raises(ValueError, match=rf"^{field} must be"):
        _config(**{field: bad})


def test_window_rules():
    with pytest.raises(ValueError, match="windowed_layers"):
        _config(window=16, windowed_layers=3)  # more than layers
    with pytest.raises(ValueError, match="window and windowed_layers"):
        _config(window=16)
    with pytest.raises(ValueError, match="window and windowed_layers"):
        _config(windowed_layers=1)


@pytest.mark.parametrize("window, windowed_layers", [(0, 2), (-5, 2), (16, -1)])
def test_window_sizes_must_be_positive(window, windowed_layers):
    with pytest.raises(ValueError, match="window"):
        _config(window=window, windowed_layers=windowed_layers)


def test_with_shape():
    base = MODELS["Llama-2-7B"]
    gqa = base.with_shape(kv_heads=8)
    assert gqa.kv_heads == 8 and gqa.attention == "GQA"
    assert gqa.kv_bytes_per_token(2) == 131_072
    assert base.kv_heads == 32  # the registry entry is unchanged
    assert base.with_shape() == base


def test_with_shape_rejects_unknown_fields():
    with pytest.raises(ValueError, match=r"unknown ModelConfig fields: \['heads', 'n_layers'\]"):
        MODELS["Llama-2-7B"].with_shape(n_layers=4, heads=8)


def test_with_shape_validates_like_the_original():
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        MODELS["Llama-2-7B"].with_shape(kv_heads=5)
    with pytest.raises(ValueError, match="^layers must be"):
        MODELS["Llama-2-7B"].with_shape(layers=0)


# ---- crossover property ------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("batch, bpe, weight_bpe", [(1, 2, 2), (3, 1, 2), (16, 4, 2), (128, 2, 2), (7, 2, 1)])
def test_crossover_is_first_count_with_cache_above_weights(name, batch, bpe, weight_bpe):
    m = MODELS[name]
    weights = m.weight_bytes(weight_bpe)
    n = m.crossover_tokens(batch, bpe, weight_bpe)
    if n is None:
        assert m.window is not None and m.windowed_layers == m.layers
        # The cache stops growing at the window and never passes the weights.
        assert m.cache_bytes(m.window, batch, bpe) <= weights
        assert m.cache_bytes(100 * m.window, batch, bpe) == m.cache_bytes(m.window, batch, bpe)
    else:
        assert n >= 1
        assert m.cache_bytes(n, batch, bpe) > weights
        assert m.cache_bytes(n - 1, batch, bpe) <= weights


def test_known_crossovers():
    assert MODELS["Llama-2-7B"].crossover_tokens() == 25_706
    assert MODELS["Llama-2-7B"].crossover_tokens(batch=8) == 3_214
    assert MODELS["GPT-2 small"].crossover_tokens() == 6_752
