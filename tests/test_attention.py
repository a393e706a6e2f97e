"""Tests for helpers.attention: softmax, the causal mask, and MHA / GQA / MQA."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.attention import causal_mask, grouped_query_attention, multi_head_attention, softmax


def qkv(q_heads=8, kv_heads=8, n_q=6, n_kv=6, d=16, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(q_heads, n_q, d)), rng.normal(size=(kv_heads, n_kv, d)),
            rng.normal(size=(kv_heads, n_kv, d)))


# ---- softmax -----------------------------------------------------------------------------


def test_softmax_rows_sum_to_one_and_are_positive():
    scores = np.random.default_rng(1).normal(scale=5, size=(4, 7, 9))
    p = softmax(scores)
    assert p.shape == scores.shape
    np.testing.assert_allclose(p.sum(axis=-1), 1.0, rtol=0, atol=1e-12)
    assert np.all(p > 0)


def test_softmax_other_axis():
    scores = np.random.default_rng(2).normal(size=(5, 3))
    p = softmax(scores, axis=0)
    np.testing.assert_allclose(p.sum(axis=0), 1.0, rtol=0, atol=1e-12)
    np.testing.assert_allclose(p, np.exp(scores) / np.exp(scores).sum(axis=0, keepdims=True), rtol=1e-12)


def test_softmax_equals_naive_on_small_inputs():
    scores = np.random.default_rng(3).normal(size=(6, 10))
    naive = np.exp(scores) / np.exp(scores).sum(axis=-1, keepdims=True)
    np.testing.assert_allclose(softmax(scores), naive, rtol=1e-12, atol=0)
    np.testing.assert_allclose(softmax(np.array([0.0, np.log(3.0)])), [0.25, 0.75], rtol=1e-12)


def test_softmax_is_stable_for_huge_scores():
    with np.errstate(over="raise", invalid="raise", divide="raise"):  # overflow or NaN fails the test
        p = softmax(np.array([[1e4, 0.0, -1e4], [1e4, 1e4, 1e4], [1e4, 1e4 - np.log(3.0), -1e4]]))
    assert np.all(np.isfinite(p))
    np.testing.assert_allclose(p[0], [1.0, 0.0, 0.0], atol=1e-12)
    np.testing.assert_allclose(p[1], [1 / 3, 1 / 3, 1 / 3], rtol=1e-12)
    np.testing.assert_allclose(p[2], [0.75, 0.25, 0.0], rtol=1e-9, atol=1e-12)


def test_softmax_is_shift_invariant():
    scores = np.random.default_rng(4).normal(size=(3, 8))
    np.testing.assert_allclose(softmax(scores + 1000.0), softmax(scores), rtol=1e-10)


# ---- causal_mask -------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 5, 17])
def test_causal_mask_square_is_lower_triangular(n):
    mask = causal_mask(n, n)
    assert mask.shape == (n, n) and mask.dtype == bool
    np.testing.assert_array_equal(mask, np.tril(np.ones((n, n), dtype=bool)))


@pytest.mark.parametrize("n_kv", [1, 2, 10, 100])
def test_causal_mask_single_query_sees_everything(n_kv):
    mask = causal_mask(1, n_kv)
    assert mask.shape == (1, n_kv)
    assert mask.all()


def test_causal_mask_is_end_aligned():
    # 3 queries at absolute positions 2, 3, 4 of a 5-token sequence.
    expected = np.array([[1, 1, 1, 0, 0],
                         [1, 1, 1, 1, 0],
                         [1, 1, 1, 1, 1]], dtype=bool)
    np.testing.assert_array_equal(causal_mask(3, 5), expected)


@pytest.mark.parametrize("n_q, n_kv", [(2, 1), (5, 4), (10, 3)])
def test_causal_mask_more_queries_than_keys_raises(n_q, n_kv):
    with pytest.raises(ValueError, match=r"n_q .* cannot exceed n_kv"):
        causal_mask(n_q, n_kv)


# ---- MHA vs GQA vs MQA -------------------------------------------------------------------


def explicit_mha(q, k, v, causal=False):
    """Head by head with the naive softmax, mask built with np.tril (n_q == n_kv only)."""
    d = q.shape[-1]
    outs = []
    for h in range(q.shape[0]):
        s = q[h] @ k[h].T / np.sqrt(d)
        if causal:
            s = np.where(np.tril(np.ones(s.shape, dtype=bool)), s, -np.inf)
        w = np.exp(s - s.max(axis=-1, keepdims=True))
        outs.append(w / w.sum(axis=-1, keepdims=True) @ v[h])
    return np.stack(outs)


@pytest.mark.parametrize("causal", [False, True])
def test_multi_head_attention_matches_explicit_reference(causal):
    q, k, v = qkv(4, 4, 7, 7, 8, seed=5)
    np.testing.assert_allclose(multi_head_attention(q, k, v, causal), explicit_mha(q, k, v, causal), rtol=0, atol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_q, n_kv", [(6, 6), (1, 6), (3, 9)])
def test_gqa_equals_mha_when_kv_heads_equal_q_heads(causal, n_q, n_kv):
    q, k, v = qkv(8, 8, n_q, n_kv, 16, seed=6)
    np.testing.assert_allclose(grouped_query_attention(q, k, v, causal=causal),
                               multi_head_attention(q, k, v, causal=causal), rtol=0, atol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("group", [2, 4, 8])
def test_gqa_equals_mha_on_repeated_kv(group, causal):
    q_heads = 8
    q, k, v = qkv(q_heads, q_heads // group, 5, 5, 16, seed=group)
    expected = multi_head_attention(q, np.repeat(k, group, axis=0), np.repeat(v, group, axis=0), causal=causal)
    got = grouped_query_attention(q, k, v, causal=causal)
    assert got.shape == (q_heads, 5, 16)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)


def test_gqa_head_assignment_is_contiguous_groups_not_interleaved():
    # Query head h reads K/V head h // group (np.repeat), not h % kv_heads (np.tile).
    q, k, v = qkv(4, 2, 3, 3, 8, seed=7)
    got = grouped_query_attention(q, k, v)
    tiled = multi_head_attention(q, np.tile(k, (2, 1, 1)), np.tile(v, (2, 1, 1)))
    assert not np.allclose(got, tiled)


@pytest.mark.parametrize("causal", [False, True])
def test_mqa_every_head_uses_the_single_kv_head(causal):
    q, k, v = qkv(6, 1, 5, 5, 8, seed=8)
    d = q.shape[-1]
    expected = []
    for h in range(6):
        s = q[h] @ k[0].T / np.sqrt(d)
        if causal:
            s = np.where(np.tril(np.ones((5, 5), dtype=bool)), s, -np.inf)
        w = np.exp(s - s.max(axis=-1, keepdims=True))
        expected.append(w / w.sum(axis=-1, keepdims=True) @ v[0])
    np.testing.assert_allclose(grouped_query_attention(q, k, v, causal=causal), np.stack(expected), rtol=0, atol=1e-12)


def test_return_weights_rows_sum_to_one_and_are_causal():
    q, k, v = qkv(8, 2, 7, 7, 16, seed=9)
    out, weights = grouped_query_attention(q, k, v, causal=True, return_weights=True)
    assert weights.shape == (8, 7, 7)
    np.testing.assert_allclose(weights.sum(axis=-1), 1.0, rtol=0, atol=1e-12)
    upper = np.triu(np.ones((7, 7), dtype=bool), k=1)
    assert np.all(weights[:, upper] == 0.0)
    assert np.all(weights[:, ~upper] > 0.0)
    # The output is the weights applied to the K/V head each query head reads.
    np.testing.assert_allclose(out, weights @ np.repeat(v, 4, axis=0), rtol=0, atol=1e-12)
    np.testing.assert_array_equal(out, grouped_query_attention(q, k, v, causal=True))


def test_return_weights_without_mask_are_all_positive():
    q, k, v = qkv(4, 4, 3, 5, 8, seed=10)
    _, weights = grouped_query_attention(q, k, v, return_weights=True)
    assert weights.shape == (4, 3, 5)
    assert np.all(weights > 0)
    np.testing.assert_allclose(weights.sum(axis=-1), 1.0, rtol=0, atol=1e-12)


def test_first_causal_query_returns_first_value():
    q, k, v = qkv(4, 2, 6, 6, 8, seed=11)
    out = grouped_query_attention(q, k, v, causal=True)
    np.testing.assert_allclose(out[:, 0], np.repeat(v, 2, axis=0)[:, 0], rtol=0, atol=1e-12)


@pytest.mark.parametrize("kv_heads", [8, 2, 1])
def test_decode_step_equals_last_row_of_full_causal(kv_heads):
    q, k, v = qkv(8, kv_heads, 10, 10, 16, seed=12)
    full = grouped_query_attention(q, k, v, causal=True)
    decode = grouped_query_attention(q[:, -1:], k, v, causal=True)
    assert decode.shape == (8, 1, 16)
    np.testing.assert_allclose(decode, full[:, -1:], rtol=0, atol=1e-12)
    # ... and not the first row (which only sees key 0).
    assert not np.allclose(decode[:, 0], full[:, 0])


def test_causal_with_fewer_queries_equals_tail_of_full():
    q, k, v = qkv(4, 4, 10, 10, 8, seed=13)
    full = multi_head_attention(q, k, v, causal=True)
    np.testing.assert_allclose(grouped_query_attention(q[:, -3:], k, v, causal=True), full[:, -3:], rtol=0, atol=1e-12)
    np.testing.assert_allclose(multi_head_attention(q[:, -3:], k, v, causal=True), full[:, -3:], rtol=0, atol=1e-12)


# ---- validation --------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["q", "k", "v"])
@pytest.mark.parametrize("bad_shape", [(5, 8), (1, 2, 5, 8), (2, 2, 5, 8)])
def test_wrong_ndim_names_the_argument(which, bad_shape):
    args = dict(zip("qkv", qkv(2, 2, 5, 5, 8)))
    args[which] = np.zeros(bad_shape)
    with pytest.raises(ValueError, match=rf"^{which} must have 3 dimensions"):
        grouped_query_attention(args["q"], args["k"], args["v"])


def test_multi_head_attention_wrong_ndim_of_v_names_it():
    q, k, _ = qkv(2, 2, 5, 5, 8)
    with pytest.raises(ValueError, match=r"^v must have 3 dimensions"):
        multi_head_attention(q, k, np.zeros((2, 5)))


@pytest.mark.parametrize("which, bad_shape", [("q", (5, 8)), ("k", (5, 8)), ("q", (1, 2, 5, 8)), ("k", (1, 2, 5, 8))])
def test_multi_head_attention_wrong_ndim_names_the_argument(which, bad_shape):
    args = dict(zip("qkv", qkv(2, 2, 5, 5, 8)))
    args[which] = np.zeros(bad_shape)
    with pytest.raises(ValueError, match=rf"^{which} must have 3 dimensions"):
        multi_head_attention(args["q"], args["k"], args["v"])


def test_mismatched_k_and_v_shapes():
    q, k, v = qkv(4, 2, 5, 5, 8)
    with pytest.raises(ValueError, match=r"k and v must have the same shape"):
        grouped_query_attention(q, k, v[:, :4])
    with pytest.raises(ValueError, match=r"k and v must have the same shape"):
        grouped_query_attention(q, k, v[:1])


def test_mismatched_head_dim():
    q, k, v = qkv(4, 2, 5, 5, 8)
    with pytest.raises(ValueError, match=r"q and k must have the same head_dim"):
        grouped_query_attention(q[..., :4], k, v)
    with pytest.raises(ValueError, match=r"head_dim"):
        multi_head_attention(qkv(2, 2, 5, 5, 8)[0][..., :4], *qkv(2, 2, 5, 5, 8)[1:])


@pytest.mark.parametrize("q_heads, kv_heads", [(6, 4), (4, 3), (2, 4), (5, 2)])
def test_q_heads_must_be_multiple_of_kv_heads(q_heads, kv_heads):
    q, k, v = qkv(q_heads, kv_heads, 3, 3, 8)
    with pytest.raises(ValueError, match=rf"q_heads \({q_heads}\) must be a multiple of kv_heads \({kv_heads}\)"):
        grouped_query_attention(q, k, v)


def test_zero_kv_heads_raises_value_error():
    q, _, _ = qkv(4, 1, 3, 3, 8)
    empty = np.zeros((0, 3, 8))
    with pytest.raises(ValueError, match=r"kv_heads"):
        grouped_query_attention(q, empty, empty)


@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_multi_head_attention_needs_equal_head_counts(kv_heads):
    q, k, v = qkv(8, kv_heads, 3, 3, 8)
    with pytest.raises(ValueError, match=r"MHA needs as many K/V heads as query heads"):
        multi_head_attention(q, k, v)


def test_causal_with_more_queries_than_keys_raises():
    q, k, v = qkv(2, 2, 5, 3, 8)
    with pytest.raises(ValueError, match=r"cannot exceed n_kv"):
        grouped_query_attention(q, k, v, causal=True)
    grouped_query_attention(q, k, v, causal=False)  # fine without a mask
