"""Tests for helpers.kv_cache_size.tokens_that_fit: how many tokens fit beside the weights."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.kv_cache_size import cache_bytes, kv_bytes_per_token, tokens_that_fit
from helpers.units import GB, GIB

LLAMA3_8B_WEIGHTS = 8_030_261_248 * 2  # parameters x 2 bytes (bf16) = 16,060,522,496
LLAMA3_8B_PER_TOKEN = 131_072  # 2 x 32 layers x 8 KV heads x 128 x 2 bytes


def test_llama3_8b_on_80_gb():
    assert kv_bytes_per_token(32, 8, 128) == LLAMA3_8B_PER_TOKEN
    n = tokens_that_fit(80 * GB, LLAMA3_8B_WEIGHTS, LLAMA3_8B_PER_TOKEN)
    assert n == 487_819  # (80e9 - 16,060,522,496) // 131,072
    assert type(n) is int
    spare = 80 * GB - LLAMA3_8B_WEIGHTS
    assert cache_bytes(n, LLAMA3_8B_PER_TOKEN) <= spare < cache_bytes(n + 1, LLAMA3_8B_PER_TOKEN)


def test_llama3_8b_on_80_gb_with_a_batch():
    assert tokens_that_fit(80 * GB, LLAMA3_8B_WEIGHTS, LLAMA3_8B_PER_TOKEN, batch=8) == 60_977
    assert tokens_that_fit(80 * GIB, LLAMA3_8B_WEIGHTS, LLAMA3_8B_PER_TOKEN, batch=8) == 66_603


def test_simple_arithmetic():
    assert tokens_that_fit(1000, 100, 10) == 90
    assert tokens_that_fit(1000, 0, 10) == 100  # no weights: the whole budget is cache
    assert tokens_that_fit(1000, 100, 7) == 128  # 900 // 7, rounded down
    assert tokens_that_fit(1, 0, 1) == 1


def test_zero_when_weights_fill_or_exceed_the_budget():
    assert tokens_that_fit(1000, 1000, 10) == 0  # exactly full
    assert tokens_that_fit(1000, 1001, 10) == 0
    assert tokens_that_fit(10 * GB, LLAMA3_8B_WEIGHTS, LLAMA3_8B_PER_TOKEN) == 0
    assert tokens_that_fit(1000, 10**15, 1, batch=64) == 0


def test_zero_when_spare_is_less_than_one_token():
    assert tokens_that_fit(1000, 991, 10) == 0
    assert tokens_that_fit(1000, 990, 10) == 1


def test_exact_boundary():
    per_token, weights = 524_288, 13_476_831_232
    budget = weights + 1000 * per_token  # spare exactly divisible
    assert tokens_that_fit(budget, weights, per_token) == 1000
    assert tokens_that_fit(budget - 1, weights, per_token) == 999
    assert tokens_that_fit(budget + per_token - 1, weights, per_token) == 1000
    assert tokens_that_fit(budget + per_token, weights, per_token) == 1001


@pytest.mark.parametrize("batch", [1, 2, 3, 4, 16, 1000])
def test_batch_divides(batch):
    budget, weights, per_token = 10**9, 10**8, 1000
    n = tokens_that_fit(budget, weights, per_token, batch)
    assert n == (budget - weights) // (per_token * batch)
    assert cache_bytes(n, per_token, batch) <= budget - weights < cache_bytes(n + 1, per_token, batch)


def test_batch_that_divides_exactly():
    assert tokens_that_fit(1100, 100, 10, batch=4) == 25
    assert tokens_that_fit(1100, 100, 10, batch=1) == 100
    assert tokens_that_fit(1100, 100, 10, batch=100) == 1
    assert tokens_that_fit(1100, 100, 10, batch=101) == 0


@pytest.mark.parametrize("budget", [1, 7, 1000, 10**12 + 3])
@pytest.mark.parametrize("weights", [0, 1, 500, 999, 1000, 10**12])
@pytest.mark.parametrize("per_token, batch", [(1, 1), (3, 2), (64, 5)])
def test_result_is_the_largest_count_that_fits(budget, weights, per_token, batch):
    n = tokens_that_fit(budget, weights, per_token, batch)
    assert n >= 0
    if n > 0:
        assert weights + cache_bytes(n, per_token, batch) <= budget
    assert weights + cache_bytes(n + 1, per_token, batch) > budget


def test_accepts_numpy_integers():
    got = tokens_that_fit(np.int64(80 * GB), np.int64(LLAMA3_8B_WEIGHTS), np.int32(LLAMA3_8B_PER_TOKEN), np.int8(1))
    assert got == 487_819 and type(got) is int


# ---- validation --------------------------------------------------------------------------

BAD = [0, -1, -(10**9), 1.0, 2.5, 80e9, True, "1000", None]


@pytest.mark.parametrize("bad", BAD)
def test_budget_bytes_rejected(bad):
    with pytest.raises(ValueError, match=r"^budget_bytes must be"):
        tokens_that_fit(bad, 100, 10)


@pytest.mark.parametrize("bad", [b for b in BAD if b != 0])
def test_weight_bytes_rejected_but_zero_allowed(bad):
    with pytest.raises(ValueError, match=r"^weight_bytes must be"):
        tokens_that_fit(1000, bad, 10)
    assert tokens_that_fit(1000, 0, 10) == 100


def test_negative_weight_bytes_message():
    with pytest.raises(ValueError, match=r"weight_bytes must be zero or more, got -5"):
        tokens_that_fit(1000, -5, 10)


@pytest.mark.parametrize("bad", BAD)
def test_per_token_rejected(bad):
    with pytest.raises(ValueError, match=r"^per_token must be"):
        tokens_that_fit(1000, 100, bad)


@pytest.mark.parametrize("bad", BAD)
def test_batch_rejected(bad):
    with pytest.raises(ValueError, match=r"^batch must be"):
        tokens_that_fit(1000, 100, 10, bad)


def test_bad_arguments_rejected_even_when_weights_exceed_budget():
    with pytest.raises(ValueError, match=r"^per_token must be"):
        tokens_that_fit(100, 1000, 0)
    with pytest.raises(ValueError, match=r"^batch must be"):
        tokens_that_fit(100, 1000, 10, batch=0)
