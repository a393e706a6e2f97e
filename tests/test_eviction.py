"""Eviction policies: budgets respected, promises kept, and no change when the budget is large."""


import pytest
import torch
from conftest import random_ids, random_llama, small_config

from helpers.eviction import POLICIES, EvictingCache, chunked_losses, evaluate, heavy_keep, sinks_keep, window_keep

CONFIG = small_config(layers=2, max_positions=128)


@pytest.fixture(scope="module")
def model():
    return random_llama(CONFIG)


@pytest.fixture(scope="module")
def ids():
    return random_ids(48, seed=1)


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
def held(cache) -> list[list[int]]:
    """Positions held, per layer and K/V head."""
    return cache.positions[:, :, : cache.length].flatten(0, 1).tolist()


@pytest.mark.parametrize("policy", ["window", "sinks", "heavy", "heavy_shared", "merge"])
@pytest.mark.parametrize("budget, chunk", [(8, 1), (16, 1), (16, 4)])
def test_policies_never_exceed_their_budget(model, ids, policy, budget, chunk):
    cache = EvictingCache(CONFIG, policy, budget, capacity=budget + 1, chunk=chunk)
    with torch.no_grad():
        for t in range(0, ids.shape[1], chunk):
            model(ids[:, t:t + chunk], cache)
            seen = min(t + chunk, ids.shape[1])
            assert cache.length <= budget - chunk + 1  # room for the next chunk within budget + 1
            assert cache.position == seen  # absolute positions keep counting
            for head in held(cache):
                assert head == sorted(head) and len(set(head)) == len(head)
                assert head[-1] == seen - 1  # the newest token is always held
                if policy in ("sinks", "merge") and seen > 4:
                    assert head[:4] == [0, 1, 2, 3]  # the sinks stay
                if policy == "window":
                    assert head == list(range(max(0, seen - cache.keep_rows), seen))  # exactly the most recent
                if policy == "sinks":
                    assert head[4:] == list(range(max(4, seen - (cache.keep_rows - 4)), seen))


def test_heavy_hitters_choose_per_layer_and_head(ids):
    model = random_llama(CONFIG)
    with torch.no_grad():  # sharper attention than a fresh model's near-uniform one, so heads differ
        for layer in model.model.layers:
            layer.self_attn.k_proj.weight *= 8
    per_head = EvictingCache(CONFIG, "heavy", 12, capacity=13)
    shared = EvictingCache(CONFIG, "heavy_shared", 12, capacity=13)
    with torch.no_grad():
        for t in range(ids.shape[1]):
            model(ids[:, t:t + 1], per_head)
            model(ids[:, t:t + 1], shared)
    assert len({tuple(h) for h in held(per_head)}) > 1  # the heads disagree about which old tokens matter
    assert len({tuple(h) for h in held(shared)}) == 1
    for head in held(per_head):
        assert head[-6:] == list(range(ids.shape[1] - 6, ids.shape[1]))  # half the budget is the recent tokens


def test_heavy_keep_per_row():
    scores = torch.tensor([[5.0, 1, 9, 0, 3, 2, 1, 0], [0.0, 8, 1, 7, 3, 2, 1, 0]])
    mask = heavy_keep(scores, budget=4)
    assert mask[0].nonzero().flatten().tolist() == [0, 2, 6, 7]
    assert mask[1].nonzero().flatten().tolist() == [1, 3, 6, 7]


def test_merge_keeps_the_token_count_and_averages(model, ids):
    cache = EvictingCache(CONFIG, "merge", 16, capacity=17, sinks=2, memory=4)
    with torch.no_grad():
        for t in range(ids.shape[1]):
            model(ids[:, t:t + 1], cache)
        assert cache.length == 16 and cache.slots == 4
        counts = cache.counts[:, :, : cache.length]
        assert torch.equal(counts.sum(dim=-1), torch.full(counts.shape[:2], float(ids.shape[1])))  # every token counted once
        assert (counts[:, :, :2] == 1).all() and (counts[:, :, 6:] == 1).all()  # sinks and window untouched
        bias = cache.score_bias(0, cache.length + 1)
        assert bias.shape == (CONFIG.q_heads, 1, cache.length + 1)
        assert torch.allclose(bias[0, 0, : cache.length], counts[0, 0].log()) and bias[0, 0, -1] == 0


def test_merge_of_identical_keys_with_log_counts_equals_keeping_them():
    """A slot standing for w copies of one key, with log(w) on its score, gets what w copies would get."""
    q, k, v = torch.randn(1, 8), torch.randn(1, 8), torch.randn(1, 8)
    others_k, others_v = torch.randn(5, 8), torch.randn(5, 8)
    copies = torch.softmax(q @ torch.cat([k.expand(3, 8), others_k]).T, -1) @ torch.cat([v.expand(3, 8), others_v])
    bias = torch.tensor([3.0, 1, 1, 1, 1, 1]).log()
    slot = torch.softmax(q @ torch.cat([k, others_k]).T + bias, -1) @ torch.cat([v, others_v])
    assert torch.allclose(copies, slot, atol=1e-6)


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


def test_int8_old_quantizes_whole_groups_outside_the_recent_window(model, ids):
    cache = EvictingCache(CONFIG, "int8_old", 10, capacity=ids.shape[1], group=8)
    with torch.no_grad():
        before = None
        for t in range(30):
            model(ids[:, t:t + 1], cache)
            if t == 17:
                before = cache.keys[:, :, :, :8].clone()
    assert cache.length == 30 and cache.quantized == 16  # 20 rows are older than 10; two whole groups of 8
    assert torch.equal(cache.keys[:, :, :, :8], before)  # a group is stored once, not again
    float_bytes = 2 * 2 * 2 * 8 * 4  # layers x K,V x kv_heads x head_dim x 4 bytes
    int8_bytes = 2 * 2 * (2 * 8 + 4)  # layers x kv_heads x (K and V codes + a value scale)
    key_scales = 2 * 2 * 2 * 8 * 4  # layers x kv_heads x groups x head_dim x 4 bytes
    assert cache.stored_bytes() == 14 * float_bytes + 16 * int8_bytes + key_scales


def test_int8_old_keys_have_one_scale_per_channel_and_group(model, ids):
    cache = EvictingCache(CONFIG, "int8_old", 4, capacity=ids.shape[1], group=8)
    with torch.no_grad():
        model(ids[:, :12], cache)
    keys = cache.keys[0, 0, 0, :8]  # (group, head_dim): each channel holds at most 255 levels of one step
    for channel in keys.T:
        step = channel.abs().max() / 127
        assert torch.allclose(channel / step, (channel / step).round(), atol=1e-3)


@pytest.mark.parametrize("policy", ["window", "heavy", "merge"])
def test_chunks_of_one_are_the_step_by_step_policy(model, ids, policy):
    step = evaluate(model, ids, policy, 12)
    chunked = EvictingCache(CONFIG, policy, 12, capacity=13, chunk=1)
    losses, _, _ = chunked_losses(model, ids, chunked, chunk=1)
    assert torch.allclose(losses, step["losses"])


def test_compacted_positions_are_the_documented_mistake(model, ids):
    right = evaluate(model, ids, "window", 8)
    wrong = evaluate(model, ids, "window", 8, compact_positions=True)
    assert right["agreement"] != wrong["agreement"] or right["loss"] != wrong["loss"]


def test_bad_policies_are_refused():
    with pytest.raises(ValueError, match="policy must be one of"):
        EvictingCache(CONFIG, "random", 8, capacity=9)
    with pytest.raises(ValueError, match="must exceed sinks"):
        EvictingCache(CONFIG, "sinks", 4, capacity=5)
    with pytest.raises(ValueError, match="budget"):
        EvictingCache(CONFIG, "window", 0, capacity=5)
    with pytest.raises(ValueError, match="at least chunk"):
        EvictingCache(CONFIG, "window", 4, capacity=5, chunk=8)
    with pytest.raises(ValueError, match="no room for a window"):
        EvictingCache(CONFIG, "merge", 10, capacity=11, sinks=4, memory=6)
    with pytest.raises(ValueError, match=r"ids must be \(1, n\)"):
        chunked_losses(None, torch.zeros(2, 3, dtype=torch.long), EvictingCache(CONFIG, "full", 4, capacity=4))


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
