"""Eviction policies: budgets respected, promises kept, and no change when the budget is large."""


import pytest
import torch

from helpers.eviction import POLICIES, EvictingCache, evaluate, heavy_keep, kept_history, sinks_keep, window_keep
from helpers.llama import LlamaConfig, LlamaForCausalLM

CONFIG = LlamaConfig(n_layers=2, hidden=32, n_heads=4, n_kv_heads=2, head_dim=8, intermediate=64, max_positions=128)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return LlamaForCausalLM(CONFIG).eval()


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, 256, (1, 48), generator=torch.Generator().manual_seed(1))


# ---- keep-masks --------------------------------------------------------------------------
@pytest.mark.parametrize("n, budget", [(0, 4), (3, 8), (8, 8), (10, 4), (100, 1)])
def test_window_keeps_the_most_recent(n, budget):
    mask = window_keep(n, budget)
    assert mask.tolist() == [i >= n - budget for i in range(n)]
    assert int(mask.sum()) == min(n, budget)


@pytest.mark.parametrize("n, budget, sinks", [(20, 8, 4), (6, 8, 4), (10, 5, 1), (12, 6, 0), (30, 5, 4)])
def test_sinks_keep_the_first_tokens_and_a_window(n, budget, sinks):
    mask = sinks_keep(n, budget, sinks)
    assert int(mask.sum()) <= budget
    assert mask[: min(sinks, n)].all()
    window = budget - sinks
    assert mask[max(0, n - window):].all()


def test_sinks_budget_must_leave_a_window():
    with pytest.raises(ValueError, match="must exceed sinks"):
        sinks_keep(10, 4, 4)


def test_heavy_keeps_recent_and_highest_scores():
    scores = torch.tensor([5.0, 1, 9, 0, 3, 2, 1, 0])
    mask = heavy_keep(scores, budget=4)  # recent = 2: positions 6, 7; then the top older: 2 (9) and 0 (5)
    assert mask.nonzero().flatten().tolist() == [0, 2, 6, 7]
    assert heavy_keep(scores, 4, recent=0).nonzero().flatten().tolist() == [0, 2, 4, 5]
    assert heavy_keep(scores, 20).all()
    with pytest.raises(ValueError, match="recent"):
        heavy_keep(scores, 4, recent=5)


@pytest.mark.parametrize("bad", [0, -1, 2.5])
def test_masks_reject_bad_budgets(bad):
    with pytest.raises(ValueError, match="budget"):
        window_keep(10, bad)


# ---- the cache in the decode loop ----------------------------------------------------------
@pytest.mark.parametrize("policy", ["window", "sinks", "heavy", "merge"])
@pytest.mark.parametrize("budget", [8, 16])
def test_policies_never_exceed_their_budget(model, ids, policy, budget):
    cache = EvictingCache(CONFIG, policy, budget, capacity=budget + 1)
    with torch.no_grad():
        for t in range(ids.shape[1]):
            model(ids[:, t:t + 1], cache)
            assert cache.length <= budget
            assert cache.position == t + 1  # absolute positions keep counting
            held = cache.kept_positions[: cache.length].tolist()
            assert held == sorted(held) and len(set(held)) == len(held)
            if policy in ("sinks", "merge") and t >= 4:
                assert held[:4] == [0, 1, 2, 3]  # the sinks stay
            if policy == "window":
                assert held == list(range(max(0, t + 1 - budget), t + 1))  # exactly the most recent
            if policy == "sinks":
                assert held[4:] == list(range(max(4, t + 1 - (budget - 4)), t + 1))


@pytest.mark.parametrize("policy", POLICIES)
def test_a_budget_as_long_as_the_sequence_equals_the_full_cache(model, ids, policy):
    full = evaluate(model, ids, "full", ids.shape[1])
    result = evaluate(model, ids, policy, ids.shape[1])
    # Heavy hitters need the attention weights, so they take the spelled-out softmax instead of
    # the fused kernel: the same numbers summed in another order, equal to float32 round-off.
    assert result["loss"] == pytest.approx(full["loss"], abs=1e-5) and result["agreement"] == 1.0


def test_full_cache_matches_one_forward_pass(model, ids):
    with torch.no_grad():
        reference = model(ids)[0, :-1]
        cache = EvictingCache(CONFIG, "full", 4, capacity=ids.shape[1])
        stepwise = torch.stack([model(ids[:, t:t + 1], cache)[0, -1] for t in range(ids.shape[1] - 1)])
    assert torch.allclose(stepwise, reference, atol=1e-5)


def test_int8_old_quantizes_only_tokens_outside_the_recent_window(model, ids):
    cache = EvictingCache(CONFIG, "int8_old", 10, capacity=ids.shape[1])
    with torch.no_grad():
        for t in range(30):
            model(ids[:, t:t + 1], cache)
    assert cache.length == 30
    assert cache.quantized[:20].all() and not cache.quantized[20:].any()
    float_bytes = 2 * 2 * 2 * 8 * 4  # layers x K,V x kv_heads x head_dim x 4 bytes
    int8_bytes = 2 * 2 * 2 * (8 + 4)
    assert cache.stored_bytes() == 10 * float_bytes + 20 * int8_bytes


def test_compacted_positions_are_the_documented_mistake(model, ids):
    right = evaluate(model, ids, "window", 8)
    wrong = evaluate(model, ids, "window", 8, compact_positions=True)
    assert right["agreement"] != wrong["agreement"] or right["loss"] != wrong["loss"]


def test_kept_history_records_the_kept_positions(model, ids):
    history = kept_history(model, ids[:, :20], "window", 5)
    assert history.shape == (19, 20)
    assert history[-1].nonzero().flatten().tolist() == list(range(14, 19))
    int8 = kept_history(model, ids[:, :20], "int8_old", 5)
    assert set(int8[-1].tolist()) == {0, 1, 2} and (int8[-1][:14] == 2).all()


def test_bad_policies_are_refused():
    with pytest.raises(ValueError, match="policy must be one of"):
        EvictingCache(CONFIG, "random", 8, capacity=9)
    with pytest.raises(ValueError, match="must exceed sinks"):
        EvictingCache(CONFIG, "sinks", 4, capacity=5)
    with pytest.raises(ValueError, match="budget"):
        EvictingCache(CONFIG, "window", 0, capacity=5)


def test_sink_bias_is_added_to_the_first_token_only_while_it_is_held(model, ids):
    plain = EvictingCache(CONFIG, "window", 8, capacity=9)
    assert plain.score_bias(1) is None
    biased = EvictingCache(CONFIG, "sinks", 8, capacity=9, sink_bias=5.0)
    with torch.no_grad():
        model(ids[:, :1], biased, keep_attention=True)
        first = [w[0, :, -1, 0].mean() for w in model.attention_weights]
        assert all(share == 1.0 for share in first)  # one key: all attention on it, bias or not
        for t in range(1, 20):
            model(ids[:, t:t + 1], biased)
    assert biased.kept_positions[0] == 0
    bias = biased.score_bias(biased.length + 1)
    assert bias.tolist() == [5.0] + [0.0] * biased.length
    window = EvictingCache(CONFIG, "window", 8, capacity=9, sink_bias=5.0)
    with torch.no_grad():
        for t in range(20):
            model(ids[:, t:t + 1], window)
    assert window.score_bias(window.length + 1).abs().sum() == 0  # the first token was evicted


def test_sink_bias_draws_attention_and_keeps_full_agreement(model, ids):
    cache = EvictingCache(CONFIG, "full", 64, capacity=48, sink_bias=8.0)
    with torch.no_grad():
        model(ids, cache, keep_attention=True)
        biased = float(model.attention_weights[0][0, :, 10:, 0].mean())
        model(ids, keep_attention=True)
        unbiased = float(model.attention_weights[0][0, :, 10:, 0].mean())
    assert biased > 5 * unbiased
    assert evaluate(model, ids, "full", 48, sink_bias=8.0)["agreement"] == 1.0


# ---- static policies scored in one pass ---------------------------------------------------------
@pytest.mark.parametrize("policy, budget", [("window", 5), ("window", 12), ("sinks", 8), ("sinks", 12), ("full", 40)])
def test_one_pass_losses_equal_the_step_by_step_cache(model, ids, policy, budget):
    from helpers.eviction import static_policy_losses

    losses = static_policy_losses(model, ids, policy, budget)
    assert losses.shape == (ids.shape[1] - 1,)
    assert float(losses.mean()) == pytest.approx(evaluate(model, ids, policy, budget)["loss"], abs=1e-5)


def test_visible_keys_of_each_static_policy():
    from helpers.eviction import visible_keys

    window = visible_keys(10, "window", 3)
    assert window[9].nonzero().flatten().tolist() == [6, 7, 8, 9]  # the 3 kept before it, and itself
    assert window[2].nonzero().flatten().tolist() == [0, 1, 2]
    sinks = visible_keys(12, "sinks", 6, sinks=2)
    assert sinks[11].nonzero().flatten().tolist() == [0, 1, 7, 8, 9, 10, 11]
    assert torch.equal(visible_keys(5, "full", 1), torch.ones(5, 5, dtype=torch.bool).tril())
    with pytest.raises(ValueError, match="step-by-step cache"):
        visible_keys(5, "heavy", 3)
    with pytest.raises(ValueError, match="must exceed sinks"):
        visible_keys(5, "sinks", 4, sinks=4)
