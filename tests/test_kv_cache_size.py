"""Tests for helpers.kv_cache_size (the per-token formula and what follows from it) and helpers.units."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.kv_cache_size import append_bytes, cache_bytes, crossover_tokens, kv_bytes_per_token
from helpers.units import DTYPE_BYTES, GB, GIB, bytes_per_element, format_bytes, gb, gib, positive_int

SEVEN_B = dict(layers=32, kv_heads=32, head_dim=128)  # Llama-2-7B shape


# ---- kv_bytes_per_token ------------------------------------------------------------------


def test_seven_b_example_is_512_kib_per_token():
    assert kv_bytes_per_token(**SEVEN_B, bytes_per_element=2) == 524_288
    assert kv_bytes_per_token(32, 32, 128) == 524_288  # bf16 is the default
    assert format_bytes(kv_bytes_per_token(32, 32, 128)) == "512 KiB"


def test_seven_b_at_128k_tokens_is_64_gib_or_68_7_gb():
    total = cache_bytes(131_072, kv_bytes_per_token(32, 32, 128))
    assert total == 64 * GIB == 68_719_476_736
    assert gib(total) == 64.0
    assert round(gb(total), 1) == 68.7
    assert GIB == 1024**3 and GB == 1000**3


@pytest.mark.parametrize(
    "shape, expected",
    [
        ((12, 12, 64, 2), 36_864),  # GPT-2 small
        ((32, 8, 128, 2), 131_072),  # Llama-3-8B (GQA)
        ((32, 1, 64, 2), 8_192),  # Falcon-7B (MQA)
        ((80, 8, 128, 1), 163_840),  # 70B GQA in fp8
        ((12, 12, 64, 4), 73_728),  # fp32
        ((1, 1, 1, 1), 2),  # smallest: one K and one V element
    ],
)
def test_kv_bytes_per_token_known_shapes(shape, expected):
    assert kv_bytes_per_token(*shape) == expected


def test_kv_bytes_per_token_is_linear_in_each_argument():
    base = kv_bytes_per_token(4, 2, 16, 2)
    assert kv_bytes_per_token(8, 2, 16, 2) == 2 * base
    assert kv_bytes_per_token(4, 6, 16, 2) == 3 * base
    assert kv_bytes_per_token(4, 2, 80, 2) == 5 * base
    assert kv_bytes_per_token(4, 2, 16, 1) * 2 == base


def test_kv_bytes_per_token_accepts_numpy_integers_and_returns_int():
    got = kv_bytes_per_token(np.int64(32), np.int32(32), np.int16(128), np.uint8(2))
    assert got == 524_288
    assert type(got) is int


# ---- cache_bytes -------------------------------------------------------------------------


def test_cache_bytes_values():
    assert cache_bytes(4096, 524_288) == 2 * GIB  # Llama-2-7B at its own context
    assert cache_bytes(8192, 131_072, batch=16) == 16 * GIB
    assert cache_bytes(0, 524_288, batch=4) == 0  # zero tokens is allowed
    assert cache_bytes(1, 1) == 1


def test_cache_bytes_is_linear_in_tokens_and_batch():
    one = cache_bytes(1000, 36_864)
    assert cache_bytes(3000, 36_864) == 3 * one
    assert cache_bytes(1000, 36_864, batch=7) == 7 * one


# ---- append_bytes ------------------------------------------------------------------------


def test_append_bytes_seven_b():
    assert append_bytes(32, 32, 128) == (16_384, 524_288)
    assert append_bytes(32, 32, 128, 2, batch=8) == (131_072, 4_194_304)


@pytest.mark.parametrize("layers, kv_heads, head_dim, bpe, batch",
                         [(1, 1, 1, 1, 1), (12, 12, 64, 4, 2), (80, 8, 128, 1, 3), (61, 16, 96, 2, 64)])
def test_append_bytes_matches_per_token_formula(layers, kv_heads, head_dim, bpe, batch):
    per_layer, total = append_bytes(layers, kv_heads, head_dim, bpe, batch)
    assert per_layer == 2 * kv_heads * head_dim * bpe * batch
    assert total == per_layer * layers == kv_bytes_per_token(layers, kv_heads, head_dim, bpe) * batch


# ---- crossover_tokens --------------------------------------------------------------------


def test_crossover_llama2_7b():
    weights = 13_476_831_232  # 6,738,415,616 parameters x 2 bytes
    n = crossover_tokens(weights, 524_288)
    assert n == 25_706
    assert cache_bytes(n, 524_288) > weights >= cache_bytes(n - 1, 524_288)
    assert crossover_tokens(weights, 524_288, batch=8) == 3_214


def test_crossover_exact_multiple_is_one_more():
    # At exactly 1,000 tokens the cache equals the weights: not yet larger.
    assert crossover_tokens(524_288 * 1000, 524_288) == 1001
    assert crossover_tokens(524_288 * 1000 - 1, 524_288) == 1000
    assert crossover_tokens(524_288 * 1000 + 1, 524_288) == 1001
    assert crossover_tokens(10, 5) == 3
    assert crossover_tokens(10, 5, batch=2) == 2
    assert crossover_tokens(1, 1) == 2
    assert crossover_tokens(1, 2) == 1


@pytest.mark.parametrize("weights", [1, 2, 7, 99, 100, 101, 4096, 10**9 + 7])
@pytest.mark.parametrize("per_token, batch", [(1, 1), (3, 1), (5, 4), (512, 3)])
def test_crossover_is_first_count_where_cache_is_larger(weights, per_token, batch):
    n = crossover_tokens(weights, per_token, batch)
    assert cache_bytes(n, per_token, batch) > weights
    assert cache_bytes(n - 1, per_token, batch) <= weights


# ---- format_bytes and bytes_per_element --------------------------------------------------


@pytest.mark.parametrize(
    "n_bytes, text",
    [
        (0, "0 B"),
        (1, "1 B"),
        (1023, "1,023 B"),
        (1024, "1 KiB"),
        (1536, "1.5 KiB"),
        (524_288, "512 KiB"),
        (2**20, "1 MiB"),
        (64 * GIB, "64 GiB"),
        (13_476_831_232, "12.55 GiB"),
        (2**40, "1 TiB"),
        (2**50, "1,024 TiB"),  # TiB is the largest unit
    ],
)
def test_format_bytes(n_bytes, text):
    assert format_bytes(n_bytes) == text


def test_format_bytes_rejects_negative():
    with pytest.raises(ValueError, match="n_bytes"):
        format_bytes(-1)


def test_format_bytes_docstring_example_one_and_a_half_mib():
    assert format_bytes(1.5 * 2**20) == "1.5 MiB"


def test_format_bytes_never_shows_1024_of_a_unit_below_tib():
    assert format_bytes(2**20 - 1) == "1 MiB"


@pytest.mark.parametrize("dtype, size", [("fp32", 4), ("bf16", 2), ("fp16", 2), ("fp8", 1), ("int8", 1)])
def test_bytes_per_element(dtype, size):
    assert bytes_per_element(dtype) == size
    assert DTYPE_BYTES[dtype] == size


@pytest.mark.parametrize("dtype", ["float32", "BF16", "", None, 2, ["bf16"]])
def test_bytes_per_element_unknown_dtype(dtype):
    with pytest.raises(ValueError, match=r"dtype must be one of fp32, bf16, fp16, fp8, int8"):
        bytes_per_element(dtype)


# ---- validation --------------------------------------------------------------------------

BAD_SIZES = [0, -1, 2.0, 2.5, True, False, "2", None]


@pytest.mark.parametrize("bad", BAD_SIZES)
@pytest.mark.parametrize("position, name", [(0, "layers"), (1, "kv_heads"), (2, "head_dim"), (3, "bytes_per_element")])
def test_kv_bytes_per_token_rejects_bad_sizes(bad, position, name):
    args = [32, 32, 128, 2]
    args[position] = bad
    with pytest.raises(ValueError, match=rf"^{name} must be"):
        kv_bytes_per_token(*args)


@pytest.mark.parametrize("bad", BAD_SIZES)
def test_cache_bytes_rejects_bad_sizes(bad):
    if bad != 0:  # zero tokens is a valid (empty) cache
        with pytest.raises(ValueError, match=r"^tokens must be"):
            cache_bytes(bad, 100)
    with pytest.raises(ValueError, match=r"^per_token must be"):
        cache_bytes(10, bad)
    with pytest.raises(ValueError, match=r"^batch must be"):
        cache_bytes(10, 100, bad)


def test_cache_bytes_negative_tokens_message():
    with pytest.raises(ValueError, match=r"tokens must be zero or more, got -1"):
        cache_bytes(-1, 100)


@pytest.mark.parametrize("bad", BAD_SIZES)
def test_append_bytes_rejects_bad_sizes(bad):
    with pytest.raises(ValueError, match=r"^layers must be"):
        append_bytes(bad, 8, 128)
    with pytest.raises(ValueError, match=r"^batch must be"):
        append_bytes(32, 8, 128, 2, bad)


@pytest.mark.parametrize("bad", BAD_SIZES)
def test_crossover_tokens_rejects_bad_sizes(bad):
    with pytest.raises(ValueError, match=r"^weight_bytes must be"):
        crossover_tokens(bad, 100)
    with pytest.raises(ValueError, match=r"^per_token must be"):
        crossover_tokens(1000, bad)
    with pytest.raises(ValueError, match=r"^batch must be"):
        crossover_tokens(1000, 100, bad)


def test_positive_int_messages():
    assert positive_int("x", 3) == 3
    assert positive_int("x", 0, allow_zero=True) == 0
    with pytest.raises(ValueError, match=r"x must be at least 1, got 0"):
        positive_int("x", 0)
    with pytest.raises(ValueError, match=r"x must be a whole number, got 2\.0 \(float\)"):
        positive_int("x", 2.0)
    with pytest.raises(ValueError, match=r"x must be a whole number, got True \(bool\)"):
        positive_int("x", True)
