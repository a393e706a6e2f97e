"""Checkers for the lesson 03 exercises (attention without the n x n table).

References: ``helpers.flash``. Random cases are seeded, so a check prints the same line every run.
"""

from __future__ import annotations

import math
import random

import numpy as np

from helpers.checks.core import CheckFailed, WrongType, as_int_pair, as_numbers, check_function, close
from helpers.flash import flash_blocks, flash_traffic, naive_attention, standard_traffic
from helpers.measure import peak_bytes


# ---- exercise 1 ------------------------------------------------------------------------
def _update_reference(m, l, scores):
    m_new = max(m, float(np.max(scores)))
    return m_new, (l * math.exp(m - m_new) if math.isfinite(m) else 0.0) + float(np.exp(scores - m_new).sum())


def online_update(fn, seed: int = 1, n_random: int = 20) -> None:
    """Exercise 1: (m, l) after a new block of scores."""
    rng = np.random.default_rng(seed)
    fixed = [(-math.inf, 0.0, np.array([1.0, 2.0, 3.0])), (2.0, 1.5, np.array([0.5, 1.0])),
             (0.0, 1.0, np.array([5.0])), (1000.0, 3.0, np.array([1001.0, 999.0]))]
    cases = fixed + [(float(rng.normal(0, 3)), float(rng.uniform(1, 20)), rng.normal(0, 3, int(rng.integers(1, 17))))
                     for _ in range(n_random)]

    def diagnose(args, expected, got):
        m, l, scores = args
        if got and math.isclose(got[1], l + float(np.exp(scores - expected[0]).sum()), rel_tol=1e-9) and m < expected[0]:
            return "the old sum l was computed against the old maximum: multiply it by exp(m - m_new)"
        if got and not math.isfinite(got[1]):
            return "exp overflowed: subtract the new maximum before exponentiating"
        return None
    check_function(fn, _update_reference, cases, name="online_update", params=("m", "l", "scores"),
                   convert=as_numbers(2), compare=close(), diagnose=diagnose,
                   hint="m_new = max(m, max(scores)); l_new = l * exp(m - m_new) + sum(exp(scores - m_new)) "
                        "(lesson 03, section 3).")


# ---- exercise 2 ------------------------------------------------------------------------
def _merge_reference(m_a, l_a, o_a, m_b, l_b, o_b):
    m = max(m_a, m_b)
    w_a, w_b = l_a * math.exp(m_a - m), l_b * math.exp(m_b - m)
    return m, w_a + w_b, (w_a * o_a + w_b * o_b) / (w_a + w_b)


def merge_states(fn, seed: int = 2, n_random: int = 20) -> None:
    """Exercise 2: merge the softmax states (m, l, o) of two disjoint blocks of keys."""
    rng = np.random.default_rng(seed)
    fixed = [(0.0, 1.0, np.array([1.0, 0.0]), 0.0, 1.0, np.array([0.0, 1.0])),
             (5.0, 2.0, np.array([1.0, 2.0, 3.0]), -5.0, 4.0, np.array([3.0, 2.0, 1.0])),
             (800.0, 1.5, np.array([0.5]), 801.0, 1.0, np.array([-0.5]))]
    cases = fixed + [(float(rng.normal(0, 3)), float(rng.uniform(1, 9)), rng.normal(size=d),
                      float(rng.normal(0, 3)), float(rng.uniform(1, 9)), rng.normal(size=d))
                     for d in (int(rng.integers(1, 9)) for _ in range(n_random))]

    def diagnose(args, expected, got):
        m_a, l_a, o_a, m_b, l_b, o_b = args
        if len(got) != 3:
            return None
        equal_weights = math.isclose(l_a * math.exp(m_a - expected[0]), l_b * math.exp(m_b - expected[0]))
        if not equal_weights and np.shape(got[2]) == np.shape(o_a) and np.allclose(got[2], (o_a + o_b) / 2):
            return "the two outputs are averaged equally: weight each by its rescaled sum l * exp(m_part - m)"
        lse = expected[0] + math.log(expected[1])
        if math.isclose(got[0], lse, rel_tol=1e-9) and not math.isclose(got[0], expected[0], rel_tol=1e-9):
            return ("m came back as the log-sum-exp m + log l (section 7's form); here m is the running maximum, "
                    "max(m_a, m_b), and l the sum measured against it, as in section 3")
        return None
    check_function(fn, _merge_reference, cases, name="merge_states",
                   params=("m_a", "l_a", "o_a", "m_b", "l_b", "o_b"), convert=as_numbers(3), compare=close(),
                   diagnose=diagnose,
                   hint="m = max(m_a, m_b); w = l * exp(m_part - m) for each part; l = w_a + w_b; "
                        "o = (w_a o_a + w_b o_b) / l (lesson 03, section 3's (m, l, o) update; section 7 merges "
                        "the same way in log-sum-exp form).")


# ---- exercise 3 ------------------------------------------------------------------------
def _array(value):
    if not isinstance(value, np.ndarray) or not np.issubdtype(value.dtype, np.floating):
        raise WrongType(f"{type(value).__name__}; expected a float NumPy array (n_q, d)")
    return value


def _same_output(expected, got, args) -> str | None:
    if got.shape != expected.shape:
        return f"returned shape {got.shape}, expected {expected.shape} (n_q, d)"
    if not np.all(np.isfinite(got)):
        return "returned NaN or inf (a masked block, or exp of a large score?)"
    bad = ~np.isclose(got, expected, rtol=1e-9, atol=1e-9)
    if bad.any():
        row, col = (int(i) for i in np.argwhere(bad)[0])
        return f"returned {got[row, col]:.10g} at [{row}, {col}], expected {expected[row, col]:.10g}"
    return None


def _attention_cases(seed: int, n_random: int) -> list[tuple]:
    rng = np.random.default_rng(seed)

    def qkv(n_q, n_k, d, size=1.0):
        return tuple(rng.normal(0, size, (n, d)) for n in (n_q, n_k, n_k))

    fixed = [(*qkv(8, 8, 4), 4, 4, False), (*qkv(10, 10, 4), 4, 3, True),  # ragged tails
             (*qkv(1, 13, 8), 4, 4, True),  # one decode query against a cache
             (*qkv(5, 12, 8), 2, 5, True),  # causal with n_q < n_k: query i sits at 12 - 5 + i
             (*qkv(6, 6, 4, size=40.0), 3, 2, False),  # large scores
             (*qkv(7, 7, 3), 100, 100, True)]  # blocks bigger than the sequence
    for _ in range(n_random):
        n_k = int(rng.integers(1, 40))
        n_q = int(rng.integers(1, n_k + 1))
        fixed.append((*qkv(n_q, n_k, int(rng.integers(1, 17))), int(rng.integers(1, 12)), int(rng.integers(1, 12)),
                      bool(rng.integers(0, 2))))
    return fixed


def tiled_attention(fn, seed: int = 3, n_random: int = 20) -> None:
    """Exercise 3: the tiled forward pass against naive attention; then its peak memory at
    n = 1024 must stay under a quarter of the full score table."""
    cases = _attention_cases(seed, n_random)

    def small_peak_memory():
        rng = np.random.default_rng(seed)
        n = 1024
        q, k, v = (rng.normal(size=(n, 16)) for _ in range(3))
        table = n * n * 8
        for causal in (False, True):
            _, peak = peak_bytes(fn, q, k, v, 64, 64, causal)
            if peak > table / 4:
                raise CheckFailed(
                    f"tiled_attention(q, k, v of shape ({n}, 16), block_q=64, block_k=64, causal={causal}) gave the "
                    f"right answer but allocated {peak / 2**20:.1f} MiB at its peak; the whole {n} x {n} score "
                    f"table is {table / 2**20:.0f} MiB. Compute scores, and the mask, one (block_q, block_k) tile "
                    "at a time.")

    def diagnose(args, expected, got):
        q, k, v, _, _, causal = args
        if got.shape == expected.shape and np.allclose(got, naive_attention(q * math.sqrt(q.shape[1]), k, v, causal),
                                                       rtol=1e-9, atol=1e-9):
            return "the scores are not divided by sqrt(d): s = q k^T / sqrt(d), as in standard attention"
        return None

    check_function(fn, lambda q, k, v, bq, bk, causal: naive_attention(q, k, v, causal), cases,
                   name="tiled_attention", params=("q", "k", "v", "block_q", "block_k", "causal"),
                   convert=_array, compare=_same_output, diagnose=diagnose, then=small_peak_memory,
                   hint="loop over blocks of K/V and of Q; scores q k^T / sqrt(d); keep m, l and o per query row and "
                        "update them with the rescale of section 3; mask keys after each query's absolute position "
                        "n_k - n_q + i (lesson 03, section 4).")


# ---- exercise 4 ------------------------------------------------------------------------
def _traffic_reference(n, d, sram_elements):
    return standard_traffic(n, d), flash_traffic(n, d, *flash_blocks(sram_elements, d))


def hbm_traffic(fn, seed: int = 4, n_random: int = 20) -> None:
    """Exercise 4: elements each algorithm moves between HBM and SRAM."""
    rng = random.Random(seed)
    fixed = [(1024, 64, 98304), (4096, 64, 98304), (4096, 128, 8192), (100, 16, 1000), (1, 1, 4)]
    cases = fixed + [(rng.randint(1, 20000), rng.choice([16, 32, 64, 128]), rng.randint(64, 200_000))
                     for _ in range(n_random)]

    def diagnose(args, expected, got):
        n, d, m = args
        if got[0] != expected[0]:
            return "standard attention: read Q, K; write S; read S; write P; read P, V; write O"
        b_r, b_c = flash_blocks(m, d)
        floor_c = m // (4 * d)
        if floor_c >= 1 and floor_c != b_c and got[1] == flash_traffic(n, d, min(floor_c, d), floor_c):
            return f"B_c = ceil(M / 4d) = {b_c}: rounding down gives {floor_c}, smaller blocks and more passes"
        if got[1] == expected[1] - n * (d + 2):
            return "count the first write of O, l and m to HBM"
        passes = math.ceil(n / b_c)
        per_pass = n * (3 * d + 4)
        if got[1] == expected[1] - (passes - n // b_c) * per_pass:
            return (f"the number of passes over the rows is ceil(n / B_c) = {passes}: a last, partly filled block "
                    f"of K and V still needs its pass (floor gives {n // b_c})")
        if got[1] == expected[1] - passes * per_pass + math.ceil(n / b_r) * per_pass and b_r != b_c:
            return f"one pass per block of K and V, so ceil(n / B_c) = {passes} passes, not ceil(n / B_r)"
        return None
    check_function(fn, _traffic_reference, cases, name="hbm_traffic", params=("n", "d", "sram_elements"),
                   convert=as_int_pair, diagnose=diagnose,
                   hint="standard: 4 n d + 4 n^2. Flash: B_c = ceil(M / 4d), B_r = min(B_c, d); n (d + 2) to write "
                        "O, l, m once, 2 n d to read K and V, and ceil(n / B_c) passes over all n rows reading "
                        "Q, O, l, m and writing O, l, m: n (3 d + 4) each (lesson 03, section 6).")

