"""Adjacent layers sharing one cache: the interpolation, the two modes, the bytes counted."""

import math

import pytest
import torch
from conftest import random_ids, random_llama, small_config

from helpers.eviction import chunked_losses
from helpers.layer_sharing import CrossLayerCache, layer_pairs, slerp
from helpers.llama import KVCache

CONFIG = small_config(layers=4, max_positions=64)


@pytest.fixture(scope="module")
def model():
    return random_llama(CONFIG)


@pytest.fixture(scope="module")
def ids():
    return random_ids(24, seed=2)


def test_slerp_walks_the_great_circle():
    a, b = torch.tensor([2.0, 0.0]), torch.tensor([0.0, 5.0])
    assert torch.allclose(slerp(a, b, 0.0), torch.tensor([1.0, 0.0]))
    assert torch.allclose(slerp(a, b, 1.0), torch.tensor([0.0, 1.0]), atol=1e-6)
    half = math.sqrt(0.5)
    assert torch.allclose(slerp(a, b), torch.tensor([half, half]))  # halfway: 45 degrees from each
    assert torch.allclose(slerp(a, 3 * a), torch.tensor([1.0, 0.0]))  # parallel: a's direction
    with pytest.raises(ValueError, match="t must lie"):
        slerp(a, b, 1.5)


def test_layer_pairs():
    assert layer_pairs(30, 16) == [(16, 17), (18, 19), (20, 21), (22, 23), (24, 25), (26, 27), (28, 29)]
    assert layer_pairs(5, 0) == [(0, 1), (2, 3)]  # an odd layer out stays alone
    with pytest.raises(ValueError, match="first_layer"):
        layer_pairs(4, 3)


def test_share_gives_the_upper_layer_the_lower_layers_cache(model, ids):
    cache = CrossLayerCache(CONFIG, "share", 2, capacity=ids.shape[1])
    plain = KVCache(CONFIG, capacity=ids.shape[1])
    with torch.no_grad():
        model(ids, cache)
        model(ids, plain)
    assert torch.equal(cache.keys[3], cache.keys[2]) and torch.equal(cache.values[3], cache.values[2])
    assert torch.equal(cache.keys[:3], plain.keys[:3])  # layers below the shared one are untouched
    assert not torch.equal(cache.keys[3], plain.keys[3])


def test_share_is_the_same_whatever_the_chunk(model, ids):
    one_pass, _, _ = chunked_losses(model, ids, CrossLayerCache(CONFIG, "share", 0, ids.shape[1]), chunk=ids.shape[1])
    stepwise, _, _ = chunked_losses(model, ids, CrossLayerCache(CONFIG, "share", 0, ids.shape[1]), chunk=1)
    assert torch.allclose(one_pass, stepwise, atol=1e-5)


def test_slerp_keeps_each_layers_lengths_and_shares_directions(model, ids):
    cache = CrossLayerCache(CONFIG, "slerp", 0, capacity=ids.shape[1])
    plain = KVCache(CONFIG, capacity=ids.shape[1])
    with torch.no_grad():
        for t in range(0, ids.shape[1], 5):
            model(ids[:, t:t + 5], cache)
        model(ids, plain)
    first = slice(0, 5)  # the first chunk's rows were computed from unmerged caches, as in the plain run
    for lower, upper in cache.pairs:
        for merged, original in ((cache.keys, plain.keys), (cache.values, plain.values)):
            for layer in (lower, upper):
                assert torch.allclose(merged[layer, :, :, first].norm(dim=-1),
                                      original[layer, :, :, first].norm(dim=-1), atol=1e-5)
            direction = torch.nn.functional.normalize
            assert torch.allclose(direction(merged[lower], dim=-1), direction(merged[upper], dim=-1), atol=1e-5)
    full, _, _ = chunked_losses(model, ids, KVCache(CONFIG, capacity=ids.shape[1]), chunk=5)
    losses, _, _ = chunked_losses(model, ids, CrossLayerCache(CONFIG, "slerp", 0, ids.shape[1]), chunk=5)
    assert torch.allclose(losses[:4], full[:4], atol=1e-5)  # the first chunk reads only its own rows, unmerged
    assert not torch.allclose(losses, full, atol=1e-3)


def test_stored_bytes_count_one_layer_per_pair(model, ids):
    share = CrossLayerCache(CONFIG, "share", 2, capacity=10)
    slerped = CrossLayerCache(CONFIG, "slerp", 0, capacity=10)
    with torch.no_grad():
        model(ids[:, :10], share)
        model(ids[:, :10], slerped)
    layer = 2 * 2 * 10 * 8 * 4  # K,V x kv_heads x tokens x head_dim x 4 bytes
    assert share.stored_bytes() == 3 * layer
    assert slerped.stored_bytes() == 2 * layer + 2 * (2 * 2 * 2 * 10 * 4)  # + a length per token, head, layer, K/V


def test_bad_mode_is_refused():
    with pytest.raises(ValueError, match="mode must be one of"):
        CrossLayerCache(CONFIG, "average", 0, capacity=4)
