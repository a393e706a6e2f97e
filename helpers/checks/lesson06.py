"""Checkers for the lesson 06 exercises (eviction under a budget). Each takes the student's function.

References: ``helpers.eviction``; random cases are seeded.
"""

from __future__ import annotations

import math
import random

import numpy as np
import torch

from helpers.checks.core import WrongType, as_numbers, check_function, close
from helpers.eviction import heavy_keep, sinks_keep, window_keep


def _mask(value):
    try:
        array = np.asarray(value)
    except Exception:
        raise WrongType(f"{type(value).__name__}; expected a boolean array") from None
    if array.size == 0 and array.dtype == np.float64:  # an empty list: no token kept, type unknown
        array = array.astype(bool)
    if array.dtype != bool:
        raise WrongType(f"an array of dtype {array.dtype}; expected booleans (True = keep)")
    return array


def _same_mask(expected, got, args):
    expected = expected.numpy() if isinstance(expected, torch.Tensor) else expected
    if got.shape != expected.shape:
        what = "one entry per cached token" if expected.ndim == 1 else "one row per head, one entry per cached token"
        return f"returned a mask of shape {got.shape}, expected {expected.shape} ({what})"
    if expected.ndim == 2:  # per head: name the first head that differs
        for head, (e, g) in enumerate(zip(expected, got)):
            if not np.array_equal(e, g):
                return f"head {head} kept positions {np.flatnonzero(g).tolist()}, expected {np.flatnonzero(e).tolist()}"
        return None
    if not np.array_equal(got, expected):
        return (f"kept positions {np.flatnonzero(got).tolist()}, expected {np.flatnonzero(expected).tolist()}")
    return None


def window_mask(fn, seed: int = 1, n_random: int = 20) -> None:
    """Exercise 1a: keep the ``budget`` most recent of n tokens."""
    rng = random.Random(seed)
    cases = [(10, 4), (3, 8), (8, 8), (1, 1), (0, 4)] + [(rng.randint(0, 300), rng.randint(1, 100)) for _ in range(n_random)]
    check_function(fn, lambda n, budget: window_keep(n, budget).numpy(), cases, name="window_mask", params=("n", "budget"), convert=_mask,
                   compare=_same_mask, hint="positions n - budget .. n - 1 (all of them when n <= budget) (lesson 06, section 2).")


def sinks_mask(fn, seed: int = 2, n_random: int = 20) -> None:
    """Exercise 1b: keep the first ``sinks`` tokens and the most recent ``budget - sinks``."""
    rng = random.Random(seed)
    cases = [(20, 8, 4), (6, 8, 4), (10, 14, 2), (10, 5, 1), (12, 6, 0)]
    cases += [(rng.randint(0, 300), b, rng.randint(0, b - 1)) for b in (rng.randint(2, 100) for _ in range(n_random))]

    def diagnose(args, expected, got):
        n, budget, sinks = args
        if got.shape == (n,) and int(got.sum()) > min(n, budget):
            window_start = max(sinks, n - (budget - sinks))
            if got[sinks:window_start].any():
                return (f"the mask keeps {int(got.sum())} tokens, more than the budget of {budget}: it keeps position "
                        f"{sinks + int(np.argmax(got[sinks:window_start]))}, between the sinks and the window; the "
                        "sinks are positions 0 .. sinks - 1")
            return f"the mask keeps {int(got.sum())} tokens, more than the budget of {budget}: the window is budget - sinks long"
        return None
    check_function(fn, lambda n, budget, sinks: sinks_keep(n, budget, sinks).numpy(), cases, name="sinks_mask", params=("n", "budget", "sinks"), convert=_mask,
                   compare=_same_mask, diagnose=diagnose,
                   hint="keep positions 0 .. sinks - 1 and the budget - sinks most recent ones (lesson 06, section 2).")


def _heavy_cases(seed: int, n_random: int) -> list[tuple]:
    rng = np.random.default_rng(seed)
    cases = [(np.array([[5.0, 1, 9, 0, 3, 2, 1, 0], [0.0, 8, 1, 7, 3, 2, 1, 0]]), 4, 2),
             (np.array([[1.0, 2, 3, 9, 8, 7]]), 4, 2),  # the highest scores sit in the recent window
             (np.array([[1.0, 2, 3]]), 8, 4),
             (np.array([[3.0, 1, 4, 1.5, 5]]), 7, 6),  # fewer tokens than the recent window: all kept
             (np.array([[0.5, 0.1, 0.9, 0.2, 0.8, 0.3], [0.9, 0.8, 0.1, 0.2, 0.3, 0.4]]), 4, 0),
             (np.array([[0.5, 0.1, 0.9, 0.2, 0.8, 0.3]]), 4, 4)]
    for _ in range(n_random):
        heads, n, budget = int(rng.integers(1, 10)), int(rng.integers(1, 200)), int(rng.integers(1, 80))
        scores = np.stack([rng.permutation(n) for _ in range(heads)]).astype(np.float64)
        cases.append((scores, budget, int(rng.integers(0, budget + 1))))
    return cases


def _heavy_reference(scores, budget, recent):
    return heavy_keep(torch.from_numpy(np.asarray(scores)), budget, recent).numpy()


def heavy_mask(fn, seed: int = 3, n_random: int = 20) -> None:
    """Exercise 1c: in every head, the ``recent`` newest tokens plus the highest-scoring older ones,
    ``budget`` in all."""
    def diagnose(args, expected, got):
        scores, budget, recent = args
        if got.shape != expected.shape:
            return None
        kept, want = got.sum(axis=1), expected.sum(axis=1)
        if (kept > want).any():
            head = int(np.argmax(kept > want))
            note = f"head {head} keeps {kept[head]} tokens, more than min(n, budget) = {want[head]}"
            if recent == 0:
                note += "; with recent = 0, x[-recent:] is x[0:], the whole row: count from n - recent instead"
            return note
        if (kept < want).any():
            head = int(np.argmax(kept < want))
            return (f"head {head} keeps {kept[head]} tokens, fewer than min(n, budget) = {want[head]}: the heavy "
                    "hitters fill the rest of the budget from the older tokens only, so pick them among those "
                    "(a top score inside the recent window is kept anyway and must not use a heavy-hitter place)")
        if len(scores) > 1 and (got == got[0]).all() and not (expected == expected[0]).all():
            return ("every head kept the same tokens: H2O chooses in each head separately, ranking that head's own "
                    "scores (a row of scores), not their sum over heads")
        return ("the right number of tokens but not the right ones: the heavy hitters are the highest scores "
                "among the tokens outside the recent window, in each head")
    check_function(fn, _heavy_reference, _heavy_cases(seed, n_random),
                   name="heavy_mask", params=("scores", "budget", "recent"), convert=_mask, compare=_same_mask,
                   diagnose=diagnose,
                   hint="for each row of scores (one head, a NumPy array): keep the recent newest tokens, then fill "
                        "the rest of the budget with that head's older tokens of highest score (np.argsort); every "
                        "token is kept when n <= budget; scores are distinct within a head (lesson 06, section 2).")


def memory_ceiling(fn, seed: int = 4, n_random: int = 20) -> None:
    """Exercise 2: the most bytes a policy's cache holds over a sequence of n tokens."""
    rng = random.Random(seed)
    cases = [("full", 512, 64, 131072), ("window", 512, 64, 131072), ("sinks", 40, 64, 1000), ("heavy", 100, 256, 2)]
    cases += [(rng.choice(["full", "window", "sinks", "heavy"]), rng.randint(1, 10**5), rng.randint(1, 4096),
               rng.randint(1, 10**6)) for _ in range(n_random)]

    def reference(policy, n, budget, bytes_per_token):
        return (n if policy == "full" else min(n, budget)) * bytes_per_token

    def diagnose(args, expected, got):
        policy, n, budget, per_token = args
        if policy != "full" and got == budget * per_token and n < budget:
            return "a sequence shorter than the budget holds only its own tokens"
        if policy == "full" and got == min(n, budget) * per_token:
            return "the full cache keeps every token: the budget does not apply"
        return None
    check_function(fn, reference, cases, name="memory_ceiling", params=("policy", "n", "budget", "bytes_per_token"),
                   diagnose=diagnose,
                   hint="full: all n tokens; window, sinks and heavy hitters: at most budget tokens, and never more "
                        "than the n that exist (lesson 06, section 2).")


def _quality_cases(seed: int, n_random: int) -> list[tuple]:
    rng = np.random.default_rng(seed)
    cases = []
    for n, vocab in [(4, 3), (10, 257), (1, 5)] + [(int(rng.integers(1, 60)), int(rng.integers(2, 300))) for _ in range(n_random)]:
        full = rng.normal(size=(n, vocab))
        policy = full + rng.normal(0, 0.5, size=(n, vocab))
        cases.append((policy, full, rng.integers(0, vocab, n)))
    big = rng.normal(size=(6, 50)) * 30 + 1000.0  # logits as large as a confident model's: exp overflows
    cases.insert(3, (big, big, rng.integers(0, 50, 6)))
    return cases


def _quality_reference(policy_logits, full_logits, targets):
    shifted = policy_logits - policy_logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    loss = float(-log_probs[np.arange(len(targets)), targets].mean())
    agreement = float((policy_logits.argmax(axis=1) == full_logits.argmax(axis=1)).mean())
    return loss, agreement


def quality(fn, seed: int = 5, n_random: int = 20) -> None:
    """Exercise 3: loss of a policy's logits on the targets, and agreement with the full cache."""
    def diagnose(args, expected, got):
        if not all(math.isfinite(x) for x in got):
            return ("a result is inf or nan: exp of logits near 1000 overflows; subtract each row's maximum before "
                    "exponentiating (log-sum-exp), as lesson 03 does")
        positions = len(args[2])
        if expected[1] > 0 and got[1] in (expected[1] * positions, expected[1] * 100):
            return "agreement is a share between 0 and 1 (matching positions / positions), not a count or a percent"
        return None
    check_function(fn, _quality_reference, _quality_cases(seed, n_random), name="quality", diagnose=diagnose,
                   params=("policy_logits", "full_logits", "targets"), convert=as_numbers(2, "numbers (loss, agreement)"),
                   compare=close(rel_tol=1e-6, abs_tol=1e-9),
                   hint="loss = mean over positions of -log softmax(policy_logits)[target] (subtract each row's max "
                        "first); agreement = share of rows whose argmax matches full_logits' (lesson 06, section 2, 'How a policy is scored').")


