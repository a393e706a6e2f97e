"""Checkers for the lesson 02 exercises (shrinking the cache). Each takes the student's function(s).

References: ``helpers.kv_cache_size``, ``helpers.mla`` and ``helpers.kv_quant``; random cases are
seeded, so a check prints the same line on every run.
"""

from __future__ import annotations

import random

import numpy as np

from helpers import kv_cache_size as ref
from helpers.checks.core import WrongType, check_function
from helpers.kv_quant import quantize, synthetic_qkv
from helpers.mla import mla_elements_per_token as _mla_reference
from helpers.models import get_model

GQA_HINT = ("saved = cache with q_heads K/V heads - cache with kv_heads K/V heads, where the cache is "
            "tokens x 2 x layers x heads x head_dim x bytes_per_element (lesson 02, section 1).")


def _gqa_reference(tokens, layers, q_heads, kv_heads, head_dim, bytes_per_element):
    full = ref.cache_bytes(tokens, ref.kv_bytes_per_token(layers, q_heads, head_dim, bytes_per_element))
    return full - ref.cache_bytes(tokens, ref.kv_bytes_per_token(layers, kv_heads, head_dim, bytes_per_element))


def gqa_bytes_saved(fn, seed: int = 1, n_random: int = 20) -> None:
    """Exercise 1: bytes a GQA layout saves against MHA with one K/V head per query head."""
    rng = random.Random(seed)
    fixed = [(8192, 32, 32, 8, 128, 2), (4096, 80, 64, 8, 128, 2), (131072, 126, 128, 8, 128, 2),
             (2048, 32, 32, 32, 128, 2), (2048, 32, 32, 1, 64, 2), (0, 28, 28, 4, 128, 1)]
    cases = fixed + [(rng.randint(0, 200_000), rng.randint(1, 128), q, rng.choice([d for d in range(1, q + 1) if q % d == 0]),
                      rng.choice([64, 128, 256]), rng.choice([1, 2, 4]))
                     for q in (rng.choice([8, 16, 32, 64, 128]) for _ in range(n_random))]

    def diagnose(args, expected, got):
        tokens, layers, q_heads, kv_heads, head_dim, bpe = args
        if got == expected // 2:
            if bpe == 2:  # either factor of 2 could be the one missing
                return ("half the saving: either the factor 2 (keys and values are both cached) or bytes_per_element "
                        "(= 2 here) is missing")
            return "half the saving: keys and values are both cached (the factor 2)"
        if kv_heads and got == -expected:
            return "the sign is reversed: subtract the GQA cache from the MHA cache"
        return None
    check_function(fn, _gqa_reference, cases, name="gqa_bytes_saved",
                   params=("tokens", "layers", "q_heads", "kv_heads", "head_dim", "bytes_per_element"),
                   hint=GQA_HINT, diagnose=diagnose)


def _mla_student_order(layers, kv_lora_rank, qk_rope_head_dim):
    return _mla_reference(kv_lora_rank, qk_rope_head_dim, layers)


def mla_elements_per_token(fn, seed: int = 2, n_random: int = 20) -> None:
    """Exercise 2: numbers MLA caches per token over all layers."""
    rng = random.Random(seed)
    fixed = [(60, 512, 64), (61, 512, 64), (27, 512, 64), (1, 1, 1)]
    cases = fixed + [(rng.randint(1, 128), rng.choice([128, 256, 512, 1024]), rng.choice([32, 64, 128]))
                     for _ in range(n_random)]

    def diagnose(args, expected, got):
        layers, rank, rope = args
        if got == 2 * expected:
            return "MLA stores one latent per token, not a key and a value: there is no factor 2"
        if got == layers * rank:
            return "the rotary key (qk_rope_head_dim numbers per layer) is cached too"
        if got == expected // layers:
            return "every layer has its own latent: multiply by layers"
        return None
    check_function(fn, _mla_student_order, cases, name="mla_elements_per_token",
                   params=("layers", "kv_lora_rank", "qk_rope_head_dim"), diagnose=diagnose,
                   hint="per layer MLA caches the latent (kv_lora_rank numbers) plus one rotary key "
                        "(qk_rope_head_dim numbers) shared by all heads (lesson 02, section 3).")


# ---- exercise 3: int8 with one scale per channel ----------------------------------------
INT8_HINT = ("scale = (largest |x| in the channel) / 127, one per channel (axis 0 is tokens); "
             "q = round(x / scale) as int8; a channel of zeros needs a scale that is not 0 (lesson 02, section 4).")


def _pair_of_arrays(value):
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise WrongType(f"{type(value).__name__}; expected a pair (q, scale)")
    q, scale = value
    if isinstance(q, np.ndarray) and isinstance(scale, np.ndarray) and scale.dtype == np.int8 and q.dtype != np.int8:
        raise WrongType("a pair whose second array is int8: the order looks swapped; return (q, scale), q first")
    if not isinstance(q, np.ndarray):
        raise WrongType(f"q of type {type(q).__name__}; expected a NumPy array of int8")
    return q, np.asarray(scale, dtype=np.float64)


def _compare_quantized(expected, got, args) -> str | None:
    (x,) = args
    q_ref, scale_ref = expected
    q, scale = got
    if q.dtype != np.int8:
        return f"returned q of dtype {q.dtype}, expected int8 (use .astype(np.int8) after rounding)"
    if q.shape != x.shape:
        return f"returned q of shape {q.shape}, expected {x.shape} (the same shape as x)"
    if scale.size != x.shape[1]:
        return f"returned {scale.size} scales, expected {x.shape[1]} (one per channel, shape (1, {x.shape[1]}))"
    scale = scale.reshape(1, -1)
    nonzero = np.abs(x).max(axis=0, keepdims=True) > 0
    if not np.all(np.isfinite(scale)) or np.any(scale <= 0):
        c = int(np.argwhere(~(np.isfinite(scale) & (scale > 0)))[0][1])
        zeros = " (that channel is all zeros: use 1.0)" if not nonzero[0, c] else ""
        return f"returned scale[0, {c}] = {scale[0, c]:.6g}, which is not a positive finite number{zeros}"
    bad = ~np.isclose(scale, scale_ref, rtol=1e-5, atol=0) & nonzero
    if bad.any():
        c = int(np.argwhere(bad)[0][1])
        return f"returned scale[0, {c}] = {scale[0, c]:.6g}, expected {scale_ref[0, c]:.6g} (that channel's largest |x| / 127)"
    if q.min() < -127:
        return ("returned q holding -128: a value was rounded down past -127 (np.floor instead of np.round?); "
                "with scale = largest |x| / 127 and rounding to nearest, q stays in [-127, 127]")
    error = np.abs(q * scale - x) - (scale / 2) * (1 + 1e-5) - 1e-12
    if (error > 0).any() and np.mean(q == np.trunc(x / scale)) > 0.99:  # allow rounding at the edges
        return "returned q truncated toward zero (astype(np.int8) alone cuts off the fraction): round first, np.round"
    if (error > 0).any():
        t, c = (int(i) for i in np.argwhere(error > 0)[0])
        return (f"returned q[{t}, {c}] = {q[t, c]}, expected {q_ref[t, c]}: q x scale should be within scale/2 "
                f"of x[{t}, {c}] = {x[t, c]:.6g}")
    return None


def _compare_dequantized(expected, got, args) -> str | None:
    if got.shape != expected.shape:
        return f"returned shape {got.shape}, expected {expected.shape}"
    if not np.allclose(got, expected, rtol=1e-6, atol=0):
        i = tuple(int(j) for j in np.argwhere(~np.isclose(got, expected, rtol=1e-6, atol=0))[0])
        return f"returned {got[i]:.6g} at index {i}, expected {expected[i]:.6g} (q x scale)"
    return None


def _float_array(value):
    if not isinstance(value, np.ndarray) or not np.issubdtype(value.dtype, np.floating):
        raise WrongType(f"{type(value).__name__} {getattr(value, 'dtype', '')}; expected a float NumPy array")
    return value


def _int8_cases(seed: int, n_random: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    tiny = np.array([[1.0, -2.0], [0.5, 4.0], [-1.0, 0.0]], dtype=np.float32)
    with_zero = rng.normal(size=(16, 4)).astype(np.float32)
    with_zero[:, 2] = 0.0
    cases = [tiny, synthetic_qkv(n_kv=64, head_dim=32, seed=seed).k, with_zero]
    for _ in range(n_random):
        shape = (int(rng.integers(1, 65)), int(rng.integers(1, 33)))
        cases.append((rng.normal(size=shape) * 10 ** rng.uniform(-3, 3)).astype(np.float32))
    return cases


def quantize_int8_per_channel(quantize_fn, dequantize_fn, seed: int = 3, n_random: int = 20) -> None:
    """Exercise 3: quantize_int8_per_channel(x) -> (q, scale) and dequantize_int8(q, scale) -> x'."""
    cases = [(x,) for x in _int8_cases(seed, n_random)]
    quantized = [quantize(x, "int8", "channel") for (x,) in cases]
    check_function(dequantize_fn, lambda q, s: q.astype(np.float64) * s, quantized, name="dequantize_int8",
                   params=("q", "scale"), convert=_float_array, compare=_compare_dequantized,
                   hint="x' = q x scale, as floats: convert q from int8 before multiplying.")
    check_function(quantize_fn, lambda x: quantize(x, "int8", "channel"), cases, name="quantize_int8_per_channel",
                   params=("x",), convert=_pair_of_arrays, compare=_compare_quantized, hint=INT8_HINT)


# ---- exercise 4: the longest context within a memory budget ------------------------------
def _fit_reference(budget_bytes, weight_bytes, layers, kv_heads, head_dim, bytes_per_element, batch):
    return ref.tokens_that_fit(budget_bytes, weight_bytes, ref.kv_bytes_per_token(layers, kv_heads, head_dim,
                                                                                  bytes_per_element), batch)


def longest_context(fn, seed: int = 4, n_random: int = 20) -> None:
    """Exercise 4: most tokens per sequence whose cache fits beside the weights."""
    rng = random.Random(seed)
    llama3 = get_model("Llama-3-8B").weight_bytes(2)
    fixed = [(80 * 10**9, llama3, 32, 8, 128, 1, 1), (80 * 10**9, llama3, 32, 8, 128, 2, 16),
             (80 * 10**9, llama3, 32, 32, 128, 2, 1), (10**9, llama3, 32, 8, 128, 1, 1),
             (llama3 + 131072 * 1000, llama3, 32, 8, 128, 1, 1)]
    cases = fixed + [(rng.randint(10**9, 10**12), rng.randint(0, 10**11), rng.randint(1, 128), rng.choice([1, 2, 4, 8, 16]),
                      rng.choice([64, 128, 256]), rng.choice([1, 2]), rng.randint(1, 64)) for _ in range(n_random)]

    def diagnose(args, expected, got):
        if expected == 0 and isinstance(got, int) and got < 0:
            return "when the weights alone exceed the budget, nothing fits: return 0"
        if got == expected + 1:
            return "one token too many: the cache at that length no longer fits"
        budget, weights, *shape, batch = args
        if batch > 1 and expected > 0 and got == _fit_reference(budget, weights, *shape, 1):
            return "that is the length for one sequence: every sequence of the batch needs its own cache"
        return None
    check_function(fn, _fit_reference, cases, name="longest_context",
                   params=("budget_bytes", "weight_bytes", "layers", "kv_heads", "head_dim", "bytes_per_element", "batch"),
                   diagnose=diagnose,
                   hint="tokens = (budget - weights) // (batch x bytes per token), and 0 when the weights do not fit.")
