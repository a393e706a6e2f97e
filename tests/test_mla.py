"""Tests for helpers.mla: the MLA cache size, RoPE, and the latent cache's attention."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.mla import MLACache, MLAWeights, expanded_attention, mla_elements_per_token, random_mla, rope

# ---- mla_elements_per_token --------------------------------------------------------------


def test_deepseek_latent_per_layer_is_576():
    assert mla_elements_per_token(512, 64) == 576
    assert mla_elements_per_token(512, 64, layers=1) == 576


@pytest.mark.parametrize("layers, expected", [(60, 34_560), (61, 35_136), (2, 1_152)])
def test_deepseek_v2_and_v3_elements_per_token(layers, expected):
    # DeepSeek-V2: 60 layers, V3: 61 layers, both kv_lora_rank 512 and qk_rope_head_dim 64.
    got = mla_elements_per_token(512, 64, layers)
    assert got == expected
    assert type(got) is int


def test_mla_elements_per_token_has_no_factor_two():
    assert mla_elements_per_token(1, 1) == 2
    assert mla_elements_per_token(16, 8, 3) == 72


@pytest.mark.parametrize("bad", [0, -1, -512])
@pytest.mark.parametrize("position, name", [(0, "kv_lora_rank"), (1, "qk_rope_head_dim"), (2, "layers")])
def test_mla_elements_per_token_rejects_zero_and_negative(bad, position, name):
    args = [512, 64, 60]
    args[position] = bad
    with pytest.raises(ValueError, match=rf"^{name} must be"):
        mla_elements_per_token(*args)


# ---- rope --------------------------------------------------------------------------------


def pair_norms(x):
    return np.hypot(x[..., 0::2], x[..., 1::2])


def test_rope_preserves_the_norm_of_each_channel_pair():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 12, 16))
    out = rope(x, np.arange(12) * 37 + 5)
    assert out.shape == x.shape
    np.testing.assert_allclose(pair_norms(out), pair_norms(x), rtol=1e-12)
    assert not np.allclose(out, x)  # it did rotate something


def test_rope_position_zero_is_identity():
    x = np.random.default_rng(1).normal(size=(5, 8))
    np.testing.assert_allclose(rope(x, np.zeros(5)), x, rtol=0, atol=1e-15)


def test_rope_first_pair_rotates_by_the_position_in_radians():
    # Pair 0 has frequency base**0 = 1: position p rotates (1, 0) to (cos p, sin p).
    x = np.zeros((3, 4))
    x[:, 0] = 1.0
    out = rope(x, np.array([0, 1, 2]))
    np.testing.assert_allclose(out[:, 0], np.cos([0, 1, 2]), atol=1e-15)
    np.testing.assert_allclose(out[:, 1], np.sin([0, 1, 2]), atol=1e-15)
    np.testing.assert_allclose(out[:, 2:], 0.0, atol=1e-15)


@pytest.mark.parametrize("d", [1, 3, 7])
def test_rope_odd_channel_count_raises(d):
    with pytest.raises(ValueError, match=r"even number of channels"):
        rope(np.ones((4, d)), np.arange(4))


def test_rope_dot_product_depends_only_on_relative_position():
    rng = np.random.default_rng(2)
    q, k = rng.normal(size=(1, 32)), rng.normal(size=(1, 32))

    def dot(m, n):
        return float(rope(q, np.array([m]))[0] @ rope(k, np.array([n]))[0])

    for delta in (0, 1, 3, -5, 40):
        ref = dot(100 + delta, 100)
        for n in (0, 7, 250, 1000):
            assert dot(n + delta, n) == pytest.approx(ref, rel=1e-9, abs=1e-9)
    assert dot(3, 0) != pytest.approx(dot(4, 0), rel=1e-6)  # the offset itself does matter
    assert dot(0, 0) == pytest.approx(float(q[0] @ k[0]), rel=1e-12)


def test_rope_leading_axes_match_per_row():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(2, 6, 8))
    pos = np.array([4, 9, 1, 0, 30, 2])
    out = rope(x, pos)
    for h in range(2):
        np.testing.assert_allclose(out[h], rope(x[h], pos), rtol=0, atol=1e-15)
    for i, p in enumerate(pos):
        np.testing.assert_allclose(out[:, i], rope(x[:, i : i + 1], np.array([p]))[:, 0], rtol=0, atol=1e-15)


# ---- MLAWeights and MLACache -------------------------------------------------------------


@pytest.mark.parametrize("rank, d_rope", [(16, 8), (4, 2), (32, 16)])
def test_weights_elements_per_token(rank, d_rope):
    w = random_mla(kv_lora_rank=rank, d_rope=d_rope)
    assert isinstance(w, MLAWeights)
    assert w.elements_per_token == rank + d_rope
    assert w.heads == 4


def test_random_mla_is_deterministic_and_seeded():
    a, b, c = random_mla(seed=3), random_mla(seed=3), random_mla(seed=4)
    np.testing.assert_array_equal(a.w_dkv, b.w_dkv)
    np.testing.assert_array_equal(a.w_q, b.w_q)
    assert not np.allclose(a.w_dkv, c.w_dkv)


def tokens(n, d_model=64, seed=0):
    return np.random.default_rng(seed + 100).normal(size=(n, d_model))


def test_cache_stores_exactly_elements_per_token_numbers_per_token():
    w = random_mla(kv_lora_rank=16, d_rope=8)
    cache = MLACache(w)
    assert len(cache) == 0
    cache.append(tokens(5))
    assert len(cache) == 5
    cache.append(tokens(1, seed=1))
    assert len(cache) == 6
    assert cache.latent.shape == (6, 16) and cache.k_rope.shape == (6, 8)
    assert cache.latent.size + cache.k_rope.size == len(cache) * w.elements_per_token == 6 * 24
    # An ordinary cache of the same heads would hold 2 x heads x head_dim per token: far more.
    assert w.elements_per_token < w.heads * (w.w_uk.shape[2] + w.w_kr.shape[1] + w.w_uv.shape[2])


@pytest.mark.parametrize("pieces", [[7], [1, 6], [3, 4], [1, 1, 1, 1, 1, 1, 1], [2, 5]])
def test_append_in_pieces_equals_append_at_once(pieces):
    w = random_mla()
    x = tokens(7)
    whole = MLACache(w)
    whole.append(x)
    split = MLACache(w)
    start = 0
    for n in pieces:
        split.append(x[start : start + n])
        start += n
    assert len(split) == len(whole) == 7
    np.testing.assert_allclose(split.latent, whole.latent, rtol=0, atol=1e-14)
    np.testing.assert_allclose(split.k_rope, whole.k_rope, rtol=0, atol=1e-14)
    np.testing.assert_allclose(split.attend(x[-2:]), whole.attend(x[-2:]), rtol=0, atol=1e-14)


def test_rotary_keys_use_absolute_positions():
    w = random_mla()
    x = tokens(4)
    cache = MLACache(w)
    cache.append(x)
    np.testing.assert_allclose(cache.k_rope, rope(x @ w.w_kr, np.arange(4)), rtol=0, atol=1e-14)
    np.testing.assert_allclose(cache.k_rope[0], x[0] @ w.w_kr, rtol=0, atol=1e-14)  # position 0: unrotated


SIZES = [
    dict(),
    dict(d_model=32, heads=2, kv_lora_rank=8, d_nope=8, d_rope=4, d_v=8, seed=1),
    dict(d_model=48, heads=8, kv_lora_rank=24, d_nope=12, d_rope=6, d_v=20, seed=2),
]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("n, n_q", [(9, 9), (9, 1), (9, 4), (1, 1), (16, 2)])
@pytest.mark.parametrize("size", SIZES)
def test_attend_equals_expanded_attention(size, n, n_q, causal):
    w = random_mla(**size)
    x = tokens(n, w.w_dkv.shape[0], seed=n)
    cache = MLACache(w)
    cache.append(x)
    got = cache.attend(x[n - n_q :], causal=causal)
    expected = expanded_attention(w, x, n_q, causal=causal)
    assert got.shape == (w.heads, n_q, w.w_uv.shape[2])
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("n, n_q", [(9, 9), (9, 1), (9, 4), (1, 1), (16, 2)])
@pytest.mark.parametrize("size", SIZES)
def test_attend_absorbed_equals_attend(size, n, n_q, causal):
    w = random_mla(**size)
    x = tokens(n, w.w_dkv.shape[0], seed=n + 1)
    cache = MLACache(w)
    cache.append(x)
    np.testing.assert_allclose(cache.attend_absorbed(x[n - n_q :], causal=causal),
                               cache.attend(x[n - n_q :], causal=causal), rtol=0, atol=1e-10)


def test_decoding_token_by_token_matches_expanded_reference():
    w = random_mla()
    x = tokens(8, seed=5)
    cache = MLACache(w)
    for t in range(8):
        cache.append(x[t : t + 1])
        expected = expanded_attention(w, x[: t + 1], 1)
        np.testing.assert_allclose(cache.attend(x[t : t + 1]), expected, rtol=0, atol=1e-12)
        np.testing.assert_allclose(cache.attend_absorbed(x[t : t + 1]), expected, rtol=0, atol=1e-10)


def test_causal_mask_matters_in_mla():
    w = random_mla()
    x = tokens(6, seed=6)
    cache = MLACache(w)
    cache.append(x)
    assert not np.allclose(cache.attend(x, causal=True), cache.attend(x, causal=False))
    # Decoding the last token sees everything either way.
    np.testing.assert_allclose(cache.attend(x[-1:], causal=True), cache.attend(x[-1:], causal=False), atol=1e-14)
