"""Tests for helpers.decode_work: key/value projection counts with and without a cache."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from helpers.decode_work import kv_projections_per_step, kv_projections_total

PROMPTS = [1, 2, 7, 64, 1000]
NEWS = [1, 2, 3, 10, 257]
LAYERS = [1, 4, 32, 61]


@pytest.mark.parametrize("cached", [False, True])
@pytest.mark.parametrize("prompt_len, new_tokens, layers", list(itertools.product(PROMPTS, NEWS, LAYERS)))
def test_sum_of_steps_equals_closed_form(prompt_len, new_tokens, layers, cached):
    steps = kv_projections_per_step(prompt_len, new_tokens, layers, cached)
    total = kv_projections_total(prompt_len, new_tokens, layers, cached)
    assert int(steps.sum()) == total
    assert type(total) is int


def test_per_step_values_small_example():
    # Prompt of 3 tokens, 4 new tokens, 2 layers: pass s sees 3 + s - 1 tokens.
    assert kv_projections_per_step(3, 4, 2, cached=False).tolist() == [6, 8, 10, 12]
    assert kv_projections_per_step(3, 4, 2, cached=True).tolist() == [6, 2, 2, 2]
    assert kv_projections_total(3, 4, 2, cached=False) == 36
    assert kv_projections_total(3, 4, 2, cached=True) == 12


def test_closed_forms():
    p, n, layers = 100, 50, 32
    assert kv_projections_total(p, n, layers, cached=True) == layers * (p + n - 1)
    assert kv_projections_total(p, n, layers, cached=False) == layers * sum(p + s for s in range(n))


@pytest.mark.parametrize("prompt_len, layers", [(1, 1), (5, 3), (128, 32)])
def test_one_new_token_costs_the_same_either_way(prompt_len, layers):
    # The first pass (prefill) projects the prompt in both cases.
    cached = kv_projections_per_step(prompt_len, 1, layers, True)
    uncached = kv_projections_per_step(prompt_len, 1, layers, False)
    assert cached.tolist() == uncached.tolist() == [prompt_len * layers]


@pytest.mark.parametrize("prompt_len, new_tokens, layers", [(1, 2, 1), (16, 100, 12), (512, 512, 32)])
def test_cache_saves_work(prompt_len, new_tokens, layers):
    cached = kv_projections_per_step(prompt_len, new_tokens, layers, True)
    uncached = kv_projections_per_step(prompt_len, new_tokens, layers, False)
    assert cached[0] == uncached[0]
    assert np.all(cached[1:] == layers)
    assert np.all(cached[1:] < uncached[1:])
    assert np.all(np.diff(uncached) == layers)  # each pass sees one more token


def test_uncached_grows_quadratically_cached_linearly():
    small_u = kv_projections_total(1, 1000, 1, cached=False)
    big_u = kv_projections_total(1, 2000, 1, cached=False)
    small_c = kv_projections_total(1, 1000, 1, cached=True)
    big_c = kv_projections_total(1, 2000, 1, cached=True)
    assert big_u / small_u == pytest.approx(4, rel=0.01)
    assert big_c / small_c == pytest.approx(2, rel=0.01)


@pytest.mark.parametrize("cached", [False, True])
@pytest.mark.parametrize("new_tokens", [1, 5, 300])
def test_shape_and_dtype(new_tokens, cached):
    steps = kv_projections_per_step(10, new_tokens, 3, cached)
    assert isinstance(steps, np.ndarray)
    assert steps.shape == (new_tokens,)
    assert steps.dtype == np.int64


def test_numpy_integer_inputs():
    steps = kv_projections_per_step(np.int64(3), np.int32(4), np.int16(2), False)
    assert steps.tolist() == [6, 8, 10, 12]
    assert kv_projections_total(np.int64(3), np.int32(4), np.int16(2), True) == 12


def test_large_values_do_not_overflow():
    p, n, layers = 1_000_000, 1_000_000, 126
    expected = layers * (n * p + n * (n - 1) // 2)
    assert kv_projections_total(p, n, layers, cached=False) == expected
    assert int(kv_projections_per_step(p, n, layers, False).sum()) == expected


@pytest.mark.parametrize("func", [kv_projections_per_step, kv_projections_total])
@pytest.mark.parametrize("position, name", [(0, "prompt_len"), (1, "new_tokens"), (2, "layers")])
@pytest.mark.parametrize("bad", [0, -1, 2.0, 1.5, True, "3", None])
def test_bad_input_raises_value_error_naming_argument(func, position, name, bad):
    args = [3, 4, 2]
    args[position] = bad
    with pytest.raises(ValueError, match=rf"^{name} must be"):
        func(*args, cached=True)
