"""helpers.step_cost: FLOPs and bytes of one forward pass, and their ratio."""

import pytest

from helpers.llama import LlamaConfig
from helpers.models import get_model
from helpers.step_cost import arithmetic_intensity, matmul_weights, step_bytes, step_flops

LLAMA2_7B = get_model("Llama-2-7B")
LLAMA2_7B_PARAMS = 6_738_415_616  # the published count


def attention_term(m, new, past):
    return 4 * m.layers * m.q_heads * m.head_dim * (new * past + new * (new + 1) // 2)


def test_matmul_weights_leave_out_the_embedding_lookup():
    assert LLAMA2_7B.param_count() == LLAMA2_7B_PARAMS
    assert matmul_weights(LLAMA2_7B) == LLAMA2_7B_PARAMS - 32000 * 4096
    untied = LlamaConfig().as_model_config()
    assert matmul_weights(untied) == untied.active_param_count() - untied.vocab * untied.hidden


@pytest.mark.parametrize("model", [LlamaConfig(tie_embeddings=True).as_model_config(), get_model("Gemma-2-9B")],
                         ids=["tiny tied", "Gemma-2-9B"])
def test_tied_embeddings_are_the_output_matmul(model):
    assert model.tied_embeddings
    assert matmul_weights(model) == model.active_param_count()


def test_learned_position_table_is_a_lookup_too():
    gpt2 = get_model("GPT-2 small")
    assert matmul_weights(gpt2) == gpt2.active_param_count() - gpt2.max_context * gpt2.hidden


def test_llama2_7b_decode_flops():
    expected = 2 * (LLAMA2_7B_PARAMS - 32000 * 4096) + 4 * 32 * 32 * 128 * 1
    assert step_flops(LLAMA2_7B, new=1, past=0) == expected
    assert step_flops(LLAMA2_7B, new=1, past=0, batch=3) == 3 * expected


@pytest.mark.parametrize("new, past", [(1, 0), (1, 1000), (7, 0), (512, 0), (16, 300)])
def test_attention_term(new, past):
    m = LLAMA2_7B
    dense = 2 * matmul_weights(m) * new
    assert step_flops(m, new, past) - dense == attention_term(m, new, past)
    assert step_flops(m, new, past, batch=4) == 4 * (dense + attention_term(m, new, past))


def test_attention_term_uses_query_heads_not_kv_heads():
    gqa = get_model("Llama-2-70B")  # 64 query heads, 8 KV heads
    extra = step_flops(gqa, 1, 100) - step_flops(gqa, 1, 0)
    assert extra == 4 * 80 * 64 * 128 * 100


@pytest.mark.parametrize("new, past, batch", [(1, 0, 1), (1, 4095, 1), (1, 1000, 16), (512, 0, 2)])
def test_step_bytes(new, past, batch):
    expected = LLAMA2_7B_PARAMS * 2 + batch * (past + new) * LLAMA2_7B.kv_bytes_per_token(2)
    assert step_bytes(LLAMA2_7B, new, past, batch) == expected
    assert LLAMA2_7B.kv_bytes_per_token(2) == 524_288


def test_step_bytes_element_sizes():
    m = LLAMA2_7B
    assert step_bytes(m, 1, 99, weight_bytes_per_element=1, cache_bytes_per_element=4) == (
        LLAMA2_7B_PARAMS + 100 * m.kv_bytes_per_token(4))
    with pytest.raises(ValueError, match="weight_bytes_per_element"):
        step_bytes(m, 1, weight_bytes_per_element=0)


def test_decode_at_batch_one_is_about_one_flop_per_byte():
    assert arithmetic_intensity(LLAMA2_7B, 1) == pytest.approx(1.0, abs=0.05)
    assert arithmetic_intensity(LLAMA2_7B, 1, past=2000) == pytest.approx(1.0, abs=0.05)


@pytest.mark.parametrize("batch", [2, 4, 8, 16, 32])
def test_decode_intensity_grows_about_linearly_with_batch(batch):
    one = arithmetic_intensity(LLAMA2_7B, 1)
    assert arithmetic_intensity(LLAMA2_7B, 1, batch=batch) / one == pytest.approx(batch, rel=0.05)


def test_long_caches_limit_the_gain_from_batching():
    short = arithmetic_intensity(LLAMA2_7B, 1, past=0, batch=64)
    long = arithmetic_intensity(LLAMA2_7B, 1, past=4095, batch=64)
    assert long < short / 5  # reading 64 caches of 4k tokens dominates the bytes


def test_prefill_intensity_is_in_the_hundreds():
    prefill = arithmetic_intensity(LLAMA2_7B, 512)
    assert 100 < prefill < 1000
    assert prefill > 100 * arithmetic_intensity(LLAMA2_7B, 1, past=511)


def test_moe_counts_active_parameters():
    mixtral = get_model("Mixtral-8x7B")
    active = mixtral.active_param_count()
    assert active < mixtral.param_count() / 3
    assert matmul_weights(mixtral) == active - mixtral.vocab * mixtral.hidden
    assert step_flops(mixtral, 1) == 2 * (active - 32000 * 4096) + attention_term(mixtral, 1, 0)
    assert step_bytes(mixtral, 1) == 2 * active + mixtral.kv_bytes_per_token(2)


@pytest.mark.parametrize("function", [step_flops, step_bytes, arithmetic_intensity])
@pytest.mark.parametrize("kwargs, name", [
    ({"new": 0}, "new"),
    ({"new": 1, "past": -1}, "past"),
    ({"new": 1, "batch": 0}, "batch"),
    ({"new": 1.0}, "new"),
])
def test_bad_counts_raise(function, kwargs, name):
    with pytest.raises(ValueError, match=rf"^{name} must"):
        function(LLAMA2_7B, **kwargs)
