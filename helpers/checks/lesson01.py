"""Checkers for the lesson 01 exercises (cache size). Each takes the student's function.

The references are the functions of ``helpers.kv_cache_size``; the random cases are seeded,
so a check prints the same line on every run.
"""

from __future__ import annotations

import numbers
import random

from helpers import kv_cache_size as ref
from helpers.checks.core import as_int_pair, check_function
from helpers.models import get_model

SHAPE = ("layers", "kv_heads", "head_dim", "bytes_per_element")
# Fixed cases: the 7B worked example, GQA, MQA, fp8, fp32 and the smallest shape.
FIXED_SHAPES = [(32, 32, 128, 2), (32, 8, 128, 2), (32, 1, 64, 2), (80, 8, 128, 1), (12, 12, 64, 4), (1, 1, 1, 1)]
FORMULA = "bytes per token = 2 x layers x kv_heads x head_dim x bytes_per_element (lesson 01, 'The formula')."


def _random_shapes(seed: int, n: int) -> list[tuple]:
    rng = random.Random(seed)
    return [(rng.randint(1, 128), rng.choice([1, 2, 4, 8, 16, 32, 64]), rng.choice([64, 80, 96, 128, 256]),
             rng.choice([1, 2, 4])) for _ in range(n)]


def _factor_note(expected: int, got, factors: dict[str, int]) -> str | None:
    """Name the mistakes that would make ``got`` off from ``expected`` by one of ``factors``."""
    if not isinstance(got, numbers.Real) or got == 0:
        return None
    for direction, ratio in (("small", expected / got), ("large", got / expected)):
        causes = [cause for cause, factor in factors.items() if factor > 1 and ratio == factor]
        if causes:
            return f"the result is {ratio:g}x too {direction}: " + ", or ".join(causes)
    return None


def bytes_per_token(fn, seed: int = 1, n_random: int = 20) -> None:
    """Exercise 1: bytes one token adds to the cache."""
    def diagnose(args, expected, got):
        layers, kv_heads, head_dim, bpe = args
        return _factor_note(expected, got, {"count keys and values (the factor 2)": 2,
                                            "multiply by bytes_per_element": bpe, "multiply by layers": layers})
    check_function(fn, ref.kv_bytes_per_token, FIXED_SHAPES + _random_shapes(seed, n_random),
                   name="bytes_per_token", params=SHAPE, hint=FORMULA, diagnose=diagnose)


def _sequence_reference(tokens, batch, *shape):
    return ref.cache_bytes(tokens, ref.kv_bytes_per_token(*shape), batch)


def sequence_cache_bytes(fn, seed: int = 2, n_random: int = 20) -> None:
    """Exercise 2: the cache of a batch of sequences."""
    rng = random.Random(seed)
    fixed = [(131072, 1, *FIXED_SHAPES[0]), (4096, 1, *FIXED_SHAPES[0]), (8192, 16, *FIXED_SHAPES[1]),
             (0, 4, *FIXED_SHAPES[2]), (1, 1, 1, 1, 1, 1)]
    cases = fixed + [(rng.randint(0, 200_000), rng.randint(1, 64), *shape) for shape in _random_shapes(seed, n_random)]

    def diagnose(args, expected, got):
        tokens, batch, *_ = args
        return _factor_note(expected, got, {"every sequence in the batch has its own cache": batch,
                                            "multiply by the number of tokens": tokens})
    check_function(fn, _sequence_reference, cases, name="sequence_cache_bytes",
                   params=("tokens", "batch") + SHAPE, diagnose=diagnose,
                   hint="cache = tokens x batch x bytes per token; each sequence keeps its own keys and values.")


def append_step_bytes(fn, seed: int = 3, n_random: int = 20) -> None:
    """Exercise 3: bytes one decode step writes, into one layer and into all layers."""
    rng = random.Random(seed)
    cases = [(*shape, batch) for shape, batch in zip(FIXED_SHAPES, [1, 1, 8, 1, 2, 1])]
    cases += [(*shape, rng.randint(1, 64)) for shape in _random_shapes(seed, n_random)]

    def diagnose(args, expected, got):
        if got == expected[::-1]:
            return "the pair is in the wrong order: (per layer, all layers)"
        batch = args[-1]
        if batch > 1 and got == (expected[0] // batch, expected[1] // batch):
            return "every sequence of the batch appends its own rows: multiply by batch"
        if got == (expected[0] // 2, expected[1] // 2):
            return "a step appends a value row as well as a key row: the factor 2"
        return None
    check_function(fn, ref.append_bytes, cases, name="append_step_bytes", params=SHAPE + ("batch",),
                   convert=as_int_pair, diagnose=diagnose,
                   hint="one step appends one K row and one V row of kv_heads x head_dim elements per layer, "
                        "for each sequence; return (into one layer, into all layers).")


def _crossover_reference(weight_bytes, *shape_and_batch):
    *shape, batch = shape_and_batch
    return ref.crossover_tokens(weight_bytes, ref.kv_bytes_per_token(*shape), batch)


def crossover_tokens(fn, seed: int = 4, n_random: int = 20) -> None:
    """Exercise 4: the first token count at which the cache holds more bytes than the weights."""
    rng = random.Random(seed)
    llama2_weights = get_model("Llama-2-7B").weight_bytes(2)  # 13,476,831,232 bytes
    fixed = [(llama2_weights, *FIXED_SHAPES[0], 1), (llama2_weights, *FIXED_SHAPES[0], 8),
             (524288 * 1000, *FIXED_SHAPES[0], 1),  # exactly equal at 1,000 tokens: not yet larger
             (1, 1, 1, 1, 1, 1)]
    cases = fixed + [(rng.randint(10**6, 10**12), *shape, rng.randint(1, 32)) for shape in _random_shapes(seed, n_random)]

    def diagnose(args, expected, got):
        if got == expected - 1:
            return "at that count the cache is not yet larger than the weights (equal or smaller); give the first count where it is larger"
        return None
    check_function(fn, _crossover_reference, cases, name="crossover_tokens",
                   params=("weight_bytes",) + SHAPE + ("batch",), diagnose=diagnose,
                   hint="find the smallest whole n with n x batch x bytes per token > weight_bytes; "
                        "floor division, then one more.")
