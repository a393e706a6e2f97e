"""Tests for helpers.flash: tiled FlashAttention against standard attention, the online-softmax
step, merging partial results, the tile schedule and the HBM traffic formulas."""

from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
import pytest

from helpers.flash import (
    block_update,
    flash_attention,
    flash_blocks,
    flash_traffic,
    merge_partials,
    naive_attention,
    standard_traffic,
    tile_mask,
    tile_schedule,
)


@pytest.fixture(autouse=True)
def _no_runtime_warnings():
    """Any RuntimeWarning (overflow, invalid value, divide by zero) fails the test."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with np.errstate(divide="raise", over="raise", invalid="raise"):
            yield


def qkv(n_q, n_k, d, seed=0, lead=(), dtype=np.float64, scale=1.0):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=lead + (n_q, d)) * scale
    k = rng.normal(size=lead + (n_k, d)) * scale
    v = rng.normal(size=lead + (n_k, d))
    return q.astype(dtype), k.astype(dtype), v.astype(dtype)


def hand_mask(n_q, n_k, causal):
    """Query i sits at absolute position n_k - n_q + i and sees keys 0 .. that position."""
    mask = np.ones((n_q, n_k), dtype=bool)
    if causal:
        for i in range(n_q):
            for j in range(n_k):
                mask[i, j] = j <= n_k - n_q + i
    return mask


def reference(q, k, v, mask):
    """Attention and log-sum-exp for 2-D inputs in float64, written out independently."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    scores = q @ k.T / math.sqrt(q.shape[-1])
    scores = np.where(mask, scores, -np.inf)
    shift = scores.max(axis=-1, keepdims=True)
    weights = np.exp(scores - shift)
    out = weights @ v / weights.sum(axis=-1, keepdims=True)
    lse = np.logaddexp.reduce(scores, axis=-1)
    return out, lse


# ---- flash_attention == naive_attention ---------------------------------------------------

CASES = [  # n_q, n_k, d, block_q, block_k, causal
    (37, 37, 8, 8, 5, False),  # ragged tails in both loops
    (37, 37, 8, 8, 5, True),
    (37, 37, 8, 5, 8, True),
    (10, 10, 4, 64, 64, False),  # blocks larger than n
    (10, 10, 4, 64, 64, True),
    (10, 10, 4, 1, 1, False),  # block size 1
    (10, 10, 4, 1, 1, True),
    (9, 9, 3, 1, 4, True),
    (1, 50, 16, 1, 7, True),  # decode: one new query against the whole cache
    (1, 50, 16, 4, 50, False),
    (13, 40, 8, 4, 6, True),  # chunked prefill: n_q < n_k, end-aligned
    (13, 40, 8, 13, 40, True),
    (40, 13, 8, 6, 4, False),  # non-causal n_q > n_k
    (13, 40, 8, 5, 3, False),
    (64, 64, 16, 16, 16, True),
]


@pytest.mark.parametrize("n_q, n_k, d, block_q, block_k, causal", CASES)
def test_flash_equals_naive_float64(n_q, n_k, d, block_q, block_k, causal):
    q, k, v = qkv(n_q, n_k, d, seed=n_q + n_k)
    out, lse = flash_attention(q, k, v, block_q=block_q, block_k=block_k, causal=causal)
    naive = naive_attention(q, k, v, causal=causal)
    assert out.shape == (n_q, d) and lse.shape == (n_q,)
    assert out.dtype == np.float64 and lse.dtype == np.float64
    np.testing.assert_allclose(out, naive, rtol=0, atol=1e-12)
    expected_out, expected_lse = reference(q, k, v, hand_mask(n_q, n_k, causal))
    np.testing.assert_allclose(naive, expected_out, rtol=0, atol=1e-12)
    np.testing.assert_allclose(out, expected_out, rtol=0, atol=1e-12)
    np.testing.assert_allclose(lse, expected_lse, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("n_q, n_k, d, block_q, block_k, causal", CASES)
def test_flash_equals_naive_float32(n_q, n_k, d, block_q, block_k, causal):
    q, k, v = qkv(n_q, n_k, d, seed=7, dtype=np.float32)
    out, lse = flash_attention(q, k, v, block_q=block_q, block_k=block_k, causal=causal)
    assert out.dtype == np.float32 and lse.dtype == np.float32
    naive = naive_attention(q, k, v, causal=causal)
    assert naive.dtype == np.float32
    expected_out, expected_lse = reference(q, k, v, hand_mask(n_q, n_k, causal))
    np.testing.assert_allclose(out, expected_out, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(naive, expected_out, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lse, expected_lse, rtol=1e-5, atol=1e-5)


def test_causal_with_fewer_queries_uses_end_aligned_mask():
    n_q, n_k, d = 5, 12, 6
    q, k, v = qkv(n_q, n_k, d, seed=11)
    mask = hand_mask(n_q, n_k, True)
    assert mask[0].sum() == 8 and mask[-1].all()  # query 0 is at position 7, the last at 11
    expected, _ = reference(q, k, v, mask)
    out, _ = flash_attention(q, k, v, block_q=2, block_k=3, causal=True)
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-12)
    np.testing.assert_allclose(naive_attention(q, k, v, causal=True), expected, rtol=0, atol=1e-12)
    # Start-aligned masking (query i sees keys 0..i) would give something else.
    wrong, _ = reference(q, k, v, np.tril(np.ones((n_q, n_k), dtype=bool)))
    assert not np.allclose(out, wrong)


def test_decode_causal_is_full_attention():
    q, k, v = qkv(1, 50, 16, seed=5)
    causal, lse_causal = flash_attention(q, k, v, block_q=1, block_k=8, causal=True)
    full, lse_full = flash_attention(q, k, v, block_q=1, block_k=8, causal=False)
    np.testing.assert_allclose(causal, full, rtol=0, atol=1e-12)
    np.testing.assert_allclose(lse_causal, lse_full, rtol=0, atol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
def test_leading_axes_broadcast(causal):
    n, d = 11, 4
    rng = np.random.default_rng(3)
    q, k, v = rng.normal(size=(2, 3, n, d)), rng.normal(size=(1, 3, n, d)), rng.normal(size=(2, 1, n, d))
    out, lse = flash_attention(q, k, v, block_q=4, block_k=3, causal=causal)
    assert out.shape == (2, 3, n, d) and lse.shape == (2, 3, n)
    np.testing.assert_allclose(out, naive_attention(q, k, v, causal=causal), rtol=0, atol=1e-12)
    mask = hand_mask(n, n, causal)
    for b, h in itertools.product(range(2), range(3)):
        expected_out, expected_lse = reference(q[b, h], k[0, h], v[b, 0], mask)
        np.testing.assert_allclose(out[b, h], expected_out, rtol=0, atol=1e-12)
        np.testing.assert_allclose(lse[b, h], expected_lse, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
def test_large_scores_stay_finite(causal):
    n, d = 37, 16
    q, k, v = qkv(n, n, d, seed=9, scale=50.0)
    scores = q @ k.T / math.sqrt(d)
    assert 5e3 < np.abs(scores).max() < 5e4  # exp of these overflows without the max shift
    out, lse = flash_attention(q, k, v, block_q=8, block_k=5, causal=causal)
    assert np.all(np.isfinite(out)) and np.all(np.isfinite(lse))
    naive = naive_attention(q, k, v, causal=causal)
    assert np.all(np.isfinite(naive))
    expected_out, expected_lse = reference(q, k, v, hand_mask(n, n, causal))
    np.testing.assert_allclose(out, naive, rtol=0, atol=1e-12)
    np.testing.assert_allclose(out, expected_out, rtol=0, atol=1e-12)
    np.testing.assert_allclose(lse, expected_lse, rtol=1e-12, atol=0)


def test_large_scores_float32_stay_finite():
    n, d = 37, 16
    q, k, v = qkv(n, n, d, seed=9, scale=50.0, dtype=np.float32)
    out, lse = flash_attention(q, k, v, block_q=8, block_k=5)
    assert out.dtype == np.float32
    assert np.all(np.isfinite(out)) and np.all(np.isfinite(lse))
    # Against float64 on the same (rounded) inputs. Float32 scores of size 1e4 carry an absolute
    # rounding error near 1e-3, so near-ties could move an output by that much; allow 1e-4.
    expected_out, expected_lse = reference(q, k, v, hand_mask(n, n, False))
    np.testing.assert_allclose(lse, expected_lse, rtol=1e-5)
    np.testing.assert_allclose(out, expected_out, rtol=0, atol=1e-4)


def test_lse_is_log_sum_exp_of_scaled_scores():
    n_q, n_k, d = 6, 9, 5
    q, k, v = qkv(n_q, n_k, d, seed=2)
    _, lse = flash_attention(q, k, v, block_q=4, block_k=4)
    scores = q @ k.T / math.sqrt(d)
    shift = scores.max(axis=-1)
    np.testing.assert_allclose(lse, shift + np.log(np.exp(scores - shift[:, None]).sum(axis=-1)), rtol=1e-12)
    np.testing.assert_allclose(lse, np.logaddexp.reduce(scores, axis=-1), rtol=1e-12)


def test_inputs_are_not_modified():
    q, k, v = qkv(12, 12, 4, seed=4)
    copies = [x.copy() for x in (q, k, v)]
    flash_attention(q, k, v, block_q=5, block_k=5, causal=True)
    naive_attention(q, k, v, causal=True)
    for before, after in zip(copies, (q, k, v)):
        np.testing.assert_array_equal(before, after)


# ---- block_update -------------------------------------------------------------------------


def empty_state(rows, d):
    return np.full(rows, -np.inf), np.zeros(rows), np.zeros((rows, d))


def test_block_update_from_empty_state_is_softmax_of_block():
    rng = np.random.default_rng(0)
    scores, values = rng.normal(size=(4, 6)) * 3, rng.normal(size=(6, 5))
    m, l, o = block_update(*empty_state(4, 5), scores, values)
    np.testing.assert_array_equal(m, scores.max(axis=-1))
    np.testing.assert_allclose(l, np.exp(scores - scores.max(axis=-1, keepdims=True)).sum(axis=-1), rtol=1e-12)
    probs = np.exp(scores) / np.exp(scores).sum(axis=-1, keepdims=True)
    np.testing.assert_allclose(o, probs @ values, rtol=0, atol=1e-12)


def test_block_update_two_blocks_equal_one():
    rng = np.random.default_rng(1)
    scores, values = rng.normal(size=(3, 10)) * 4, rng.normal(size=(10, 2))
    state = block_update(*empty_state(3, 2), scores[:, :4], values[:4])
    m, l, o = block_update(*state, scores[:, 4:], values[4:])
    m1, l1, o1 = block_update(*empty_state(3, 2), scores, values)
    np.testing.assert_allclose(m, m1, rtol=0, atol=0)
    np.testing.assert_allclose(l, l1, rtol=1e-12)
    np.testing.assert_allclose(o, o1, rtol=0, atol=1e-12)


def test_block_update_fully_masked_rows_keep_their_state():
    rng = np.random.default_rng(2)
    first, values = rng.normal(size=(3, 4)), rng.normal(size=(4, 3))
    m, l, o = block_update(*empty_state(3, 3), first, values)
    second = rng.normal(size=(3, 5)) + 10  # a much larger maximum where visible
    second[1] = -np.inf  # row 1 sees nothing in this block
    m2, l2, o2 = block_update(m, l, o, second, rng.normal(size=(5, 3)))
    assert m2[1] == m[1] and l2[1] == l[1]
    np.testing.assert_array_equal(o2[1], o[1])
    assert np.all(m2[[0, 2]] > m[[0, 2]])  # the other rows did move


def test_block_update_rows_masked_from_the_start_stay_empty():
    scores = np.array([[-np.inf, -np.inf, -np.inf], [0.5, -np.inf, 1.5]])
    values = np.arange(6.0).reshape(3, 2)
    m, l, o = block_update(*empty_state(2, 2), scores, values)
    assert m[0] == -np.inf and l[0] == 0
    np.testing.assert_array_equal(o[0], [0.0, 0.0])
    assert np.all(np.isfinite(o))
    w = np.exp([0.5 - 1.5, 1.5 - 1.5])
    np.testing.assert_allclose(o[1], (w[0] * values[0] + w[1] * values[2]) / w.sum(), rtol=1e-12)
    # A later block with visible keys then starts the row from scratch.
    m, l, o = block_update(m, l, o, np.array([[2.0], [-np.inf]]), np.array([[7.0, 8.0]]))
    assert m[0] == 2.0 and l[0] == 1.0
    np.testing.assert_allclose(o[0], [7.0, 8.0], rtol=1e-15)


def test_runtime_warnings_are_errors_here():
    """The autouse fixture really does turn NumPy's warnings into failures."""
    with pytest.raises((RuntimeWarning, FloatingPointError)):
        np.log(np.zeros(1))


# ---- merge_partials -----------------------------------------------------------------------


def chunk_parts(q, k, v, bounds):
    return [flash_attention(q, k[lo:hi], v[lo:hi], block_q=3, block_k=4) for lo, hi in zip(bounds, bounds[1:])]


def merge_left(parts):
    out, lse = parts[0]
    for o, s in parts[1:]:
        out, lse = merge_partials(out, lse, o, s)
    return out, lse


def merge_tree(parts):
    while len(parts) > 1:
        parts = [merge_partials(*a, *b) if b is not None else a
                 for a, b in itertools.zip_longest(parts[::2], parts[1::2])]
    return parts[0]


@pytest.mark.parametrize("chunks", [2, 3, 4, 5])
def test_merging_key_chunks_gives_full_attention(chunks):
    n_q, n_k, d = 7, 41, 6
    q, k, v = qkv(n_q, n_k, d, seed=chunks)
    rng = np.random.default_rng(chunks)
    cuts = np.sort(rng.choice(np.arange(1, n_k), size=chunks - 1, replace=False))
    bounds = [0, *map(int, cuts), n_k]
    parts = chunk_parts(q, k, v, bounds)
    full_out, full_lse = flash_attention(q, k, v, block_q=3, block_k=4)
    orders = [parts, parts[::-1], [parts[i] for i in rng.permutation(chunks)]]
    for ordered in orders:
        for merge in (merge_left, merge_tree, lambda p: merge_left(p[::-1])):
            out, lse = merge(ordered)
            np.testing.assert_allclose(out, full_out, rtol=0, atol=1e-12)
            np.testing.assert_allclose(lse, full_lse, rtol=1e-12, atol=1e-12)
    # Right fold: a + (b + (c + ...)).
    out, lse = parts[-1]
    for o, s in parts[-2::-1]:
        out, lse = merge_partials(o, s, out, lse)
    np.testing.assert_allclose(out, full_out, rtol=0, atol=1e-12)
    np.testing.assert_allclose(lse, full_lse, rtol=1e-12, atol=1e-12)


def test_merge_is_not_a_plain_average():
    q, k, v = qkv(4, 10, 3, seed=1)
    (out_a, lse_a), (out_b, lse_b) = chunk_parts(q, k, v, [0, 2, 10])
    out, _ = merge_partials(out_a, lse_a, out_b, lse_b)
    assert not np.allclose(out, (out_a + out_b) / 2)


def test_merge_with_empty_part_returns_the_other():
    q, k, v = qkv(5, 8, 3, seed=6)
    out, lse = flash_attention(q, k, v)
    empty_out, empty_lse = np.zeros_like(out), np.full_like(lse, -np.inf)
    for merged in (merge_partials(empty_out, empty_lse, out, lse), merge_partials(out, lse, empty_out, empty_lse)):
        np.testing.assert_allclose(merged[0], out, rtol=0, atol=1e-15)
        np.testing.assert_array_equal(merged[1], lse)
    both_out, both_lse = merge_partials(empty_out, empty_lse, empty_out, empty_lse)
    np.testing.assert_array_equal(both_out, 0.0)
    assert np.all(both_lse == -np.inf)


def test_merge_with_some_empty_rows():
    q, k, v = qkv(3, 6, 2, seed=8)
    out, lse = flash_attention(q, k, v)
    part_out, part_lse = out.copy(), lse.copy()
    part_out[1], part_lse[1] = 0.0, -np.inf  # row 1 of this part saw no keys
    merged_out, merged_lse = merge_partials(part_out, part_lse, np.zeros_like(out), np.full_like(lse, -np.inf))
    np.testing.assert_allclose(merged_out[[0, 2]], out[[0, 2]], rtol=0, atol=1e-15)
    np.testing.assert_array_equal(merged_out[1], 0.0)
    assert merged_lse[1] == -np.inf


@pytest.mark.parametrize("shapes", [
    ((4, 3), (4,), (5, 3), (5,)),  # different number of rows
    ((4, 3), (4,), (4, 2), (4,)),  # different d
    ((4, 3), (4,), (4, 3), (5,)),  # lse shapes differ
    ((4, 3), (3,), (4, 3), (3,)),  # lse is not out without its last axis
    ((2, 4, 3), (2, 4), (4, 3), (4,)),
])
def test_merge_rejects_mismatched_shapes(shapes):
    out_a, lse_a, out_b, lse_b = (np.zeros(s) for s in shapes)
    with pytest.raises(ValueError, match="matching shapes"):
        merge_partials(out_a, lse_a, out_b, lse_b)


# ---- traffic ------------------------------------------------------------------------------

TRAFFIC_CASES = [  # n, d, block_q, block_k, causal
    (37, 8, 8, 5, False),
    (37, 8, 8, 5, True),
    (37, 8, 5, 8, True),
    (64, 16, 16, 16, False),
    (64, 16, 16, 16, True),
    (64, 16, 8, 32, True),
    (10, 4, 64, 64, True),
    (10, 3, 1, 1, True),
    (10, 3, 1, 1, False),
    (33, 2, 4, 16, True),
]


@pytest.mark.parametrize("n, d, block_q, block_k, causal", TRAFFIC_CASES)
def test_flash_counted_traffic_matches_formula(n, d, block_q, block_k, causal):
    q, k, v = qkv(n, n, d, seed=1)
    traffic = {}
    flash_attention(q, k, v, block_q=block_q, block_k=block_k, causal=causal, traffic=traffic)
    assert set(traffic) == {"read", "write"}
    assert traffic["read"] + traffic["write"] == flash_traffic(n, d, block_q, block_k, causal)


def test_flash_traffic_counts_one_batch_head_slice():
    q, k, v = qkv(12, 12, 4, seed=1, lead=(2, 3))
    traffic = {}
    flash_attention(q, k, v, block_q=4, block_k=5, traffic=traffic)
    assert traffic["read"] + traffic["write"] == flash_traffic(12, 4, 4, 5)


def test_flash_traffic_small_example_by_hand():
    # n=4, d=1, 2x2 tiles: writes O,l,m = 4*3; reads K,V = 2*4; each tile moves 2 rows * (3+4).
    assert flash_traffic(4, 1, 2, 2) == 12 + 8 + 4 * 2 * 7
    assert flash_traffic(4, 1, 2, 2, causal=True) == 12 + 8 + 3 * 2 * 7  # tile (Q0, K1) skipped


@pytest.mark.parametrize("n, d", [(1, 1), (3, 2), (37, 8), (128, 64)])
def test_naive_counted_traffic_is_standard_traffic(n, d):
    q, k, v = qkv(n, n, d, seed=0)
    for causal in (False, True):
        traffic = {}
        naive_attention(q, k, v, causal=causal, traffic=traffic)
        assert traffic["read"] + traffic["write"] == standard_traffic(n, d) == 4 * n * d + 4 * n * n


def test_standard_traffic_values():
    assert standard_traffic(3, 2) == 24 + 36
    assert standard_traffic(4096, 64) == 4 * 4096 * 64 + 4 * 4096**2


def test_traffic_dict_accumulates():
    q, k, v = qkv(8, 8, 2)
    traffic = {}
    naive_attention(q, k, v, traffic=traffic)
    naive_attention(q, k, v, traffic=traffic)
    assert traffic["read"] + traffic["write"] == 2 * standard_traffic(8, 2)


@pytest.mark.parametrize("n", [1, 7, 64, 100, 1000])
@pytest.mark.parametrize("d", [1, 16, 64])
@pytest.mark.parametrize("block_q, block_k", [(1, 1), (16, 16), (64, 384), (7, 3), (2000, 2000)])
def test_flash_traffic_closed_form_without_causal(n, d, block_q, block_k):
    expected = 2 * n * d + n * (d + 2) + math.ceil(n / block_k) * n * (3 * d + 4)
    assert flash_traffic(n, d, block_q, block_k) == expected


@pytest.mark.parametrize("n, d, block_q, block_k", [(64, 16, 16, 16), (100, 8, 7, 9), (4096, 64, 64, 384)])
def test_causal_traffic_is_smaller(n, d, block_q, block_k):
    assert flash_traffic(n, d, block_q, block_k, causal=True) < flash_traffic(n, d, block_q, block_k)


def test_flash_moves_far_less_than_standard_at_long_lengths():
    # n=4096, d=64 with the blocks of a 192 KiB SRAM: about 7x fewer elements.
    assert standard_traffic(4096, 64) / flash_traffic(4096, 64, 64, 384) > 6


@pytest.mark.parametrize("sram, d, expected", [
    (192 * 1024 // 2, 64, (64, 384)),
    (65536, 128, (128, 128)),
    (1000, 64, (4, 4)),
    (100, 1, (1, 25)),
    (1, 8, (1, 1)),
    (257, 8, (8, 9)),
])
def test_flash_blocks_examples(sram, d, expected):
    assert flash_blocks(sram, d) == expected


def test_flash_blocks_rule():
    for sram, d in itertools.product([1, 5, 100, 4096, 98304, 100_000], [1, 3, 32, 64, 128]):
        b_c = math.ceil(sram / (4 * d))
        assert flash_blocks(sram, d) == (min(b_c, d), b_c)


# ---- tile schedule and mask ---------------------------------------------------------------


def test_tile_schedule_outer_kv_inner_q():
    assert tile_schedule(4, 6, 2, 2) == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]
    assert tile_schedule(4, 4, 2, 2, causal=True) == [(0, 0), (1, 0), (1, 1)]
    assert tile_schedule(3, 3, 1, 1, causal=True) == [(0, 0), (1, 0), (2, 0), (1, 1), (2, 1), (2, 2)]


@pytest.mark.parametrize("n_q, n_k, block_q, block_k", [
    (37, 37, 8, 5), (37, 37, 5, 8), (13, 40, 4, 6), (1, 50, 1, 7), (64, 64, 16, 16), (10, 10, 64, 64), (9, 9, 1, 1),
])
def test_tile_schedule_skips_exactly_future_tiles(n_q, n_k, block_q, block_k):
    t_r, t_c = math.ceil(n_q / block_q), math.ceil(n_k / block_k)
    full = tile_schedule(n_q, n_k, block_q, block_k)
    assert full == [(i, j) for j in range(t_c) for i in range(t_r)]
    causal = tile_schedule(n_q, n_k, block_q, block_k, causal=True)
    expected = []
    for j in range(t_c):
        for i in range(t_r):
            first_key = j * block_k
            last_query_position = min((i + 1) * block_q, n_q) - 1 + (n_k - n_q)
            if first_key <= last_query_position:
                expected.append((i, j))
    assert causal == expected
    assert causal == [t for t in full if t in set(causal)]  # same order, a subsequence
    mask = hand_mask(n_q, n_k, True)
    for i, j in set(full) - set(causal):  # skipped tiles hold no visible key
        assert not mask[i * block_q:(i + 1) * block_q, j * block_k:(j + 1) * block_k].any()
    for i, j in causal:  # visited tiles hold at least one
        assert mask[i * block_q:(i + 1) * block_q, j * block_k:(j + 1) * block_k].any()


@pytest.mark.parametrize("n_q, n_k, block_q, block_k, shape", [
    (37, 37, 8, 5, (5, 8)), (64, 64, 16, 16, (4, 4)), (10, 10, 64, 64, (1, 1)), (1, 50, 1, 7, (1, 8)),
    (13, 40, 4, 6, (4, 7)), (4096, 4096, 64, 384, (64, 11)),
])
def test_tile_mask_shapes(n_q, n_k, block_q, block_k, shape):
    full = tile_mask(n_q, n_k, block_q, block_k)
    assert full.shape == shape and full.dtype == bool and full.all()
    causal = tile_mask(n_q, n_k, block_q, block_k, causal=True)
    assert causal.shape == shape and causal.dtype == bool
    assert causal[:, 0].all() and causal[-1].all()  # key 0 is seen by everyone; the last block sees all


def test_tile_mask_square_causal_is_lower_triangular():
    np.testing.assert_array_equal(tile_mask(64, 64, 16, 16, causal=True), np.tril(np.ones((4, 4), dtype=bool)))


# ---- input validation ---------------------------------------------------------------------

A = np.zeros((4, 3))


@pytest.mark.parametrize("q, k, v, causal", [
    (np.zeros((4, 3)), np.zeros((4, 2)), np.zeros((4, 2)), False),  # mismatched d
    (A, np.zeros((4, 3)), np.zeros((5, 3)), False),  # k, v with different n
    (A, np.zeros((4, 3)), np.zeros((4, 2)), False),  # k, v with different d
    (np.zeros(3), np.zeros(3), np.zeros(3), False),  # 1-D
    (A, np.zeros(3), np.zeros(3), False),
    (np.zeros((4, 3), dtype=int), A, A, False),  # integer dtype
    (A, A, np.zeros((4, 3), dtype=np.int32), False),
    (np.zeros((0, 3)), A, A, False),  # empty arrays
    (A, np.zeros((0, 3)), np.zeros((0, 3)), False),
    (np.zeros((4, 0)), np.zeros((4, 0)), np.zeros((4, 0)), False),
    (np.zeros((2, 4, 3)), np.zeros((3, 4, 3)), np.zeros((3, 4, 3)), False),  # leading axes do not broadcast
    (np.zeros((2, 4, 3)), np.zeros((2, 4, 3)), np.zeros((3, 4, 3)), False),
    (np.zeros((5, 3)), A, A, True),  # causal needs n_q <= n_k
])
def test_attention_rejects_bad_inputs(q, k, v, causal):
    with pytest.raises(ValueError):
        naive_attention(q, k, v, causal=causal)
    with pytest.raises(ValueError):
        flash_attention(q, k, v, causal=causal)


def test_non_causal_allows_more_queries_than_keys():
    q, k, v = qkv(5, 4, 3)
    flash_attention(q, k, v)  # no error without the causal mask
    naive_attention(q, k, v)


@pytest.mark.parametrize("block", [0, -1, 2.5, 2.0, "4", None, True])
def test_flash_rejects_bad_block_sizes(block):
    q, k, v = qkv(4, 4, 2)
    with pytest.raises(ValueError):
        flash_attention(q, k, v, block_q=block)
    with pytest.raises(ValueError):
        flash_attention(q, k, v, block_k=block)


def test_flash_accepts_numpy_integer_blocks():
    q, k, v = qkv(9, 9, 2)
    out, _ = flash_attention(q, k, v, block_q=np.int64(4), block_k=np.int32(2))
    np.testing.assert_allclose(out, naive_attention(q, k, v), rtol=0, atol=1e-12)


@pytest.mark.parametrize("call", [
    lambda: standard_traffic(0, 4), lambda: standard_traffic(4, 0), lambda: standard_traffic(-1, 4),
    lambda: standard_traffic(4.5, 4),
    lambda: flash_traffic(0, 4, 2, 2), lambda: flash_traffic(4, 0, 2, 2), lambda: flash_traffic(4, -3, 2, 2),
    lambda: flash_traffic(-4, 4, 2, 2), lambda: flash_traffic(4, 4, 0, 2), lambda: flash_traffic(4, 4, 2, 0),
    lambda: flash_traffic(4, 4, 1.5, 2), lambda: flash_traffic(4, 2.5, 2, 2),
    lambda: flash_blocks(0, 64), lambda: flash_blocks(-1, 64), lambda: flash_blocks(1024, 0),
    lambda: flash_blocks(1024.0, 64),
    lambda: tile_mask(0, 4, 2, 2), lambda: tile_mask(4, 4, 0, 2), lambda: tile_schedule(4, 4, 2, -2),
])
def test_closed_forms_reject_bad_sizes(call):
    with pytest.raises(ValueError):
        call()
