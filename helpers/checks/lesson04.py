"""Checkers for the lesson 04 exercises (a decode loop in torch). Each takes the student's function.

References: ``helpers.llama`` and ``helpers.kv_cache_size``; random cases are seeded.
"""

from __future__ import annotations

import math

import torch

from helpers.checks.core import WrongType, as_int, check_function
from helpers.kv_cache_size import kv_bytes_per_token
from helpers.llama import LlamaConfig, causal_mask


def _tensor_pair(value):
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise WrongType(f"{type(value).__name__}; expected a pair (keys, values) of torch tensors")
    if not all(isinstance(t, torch.Tensor) for t in value):
        kinds = ", ".join(type(t).__name__ for t in value)
        raise WrongType(f"a pair of ({kinds}); expected a pair of torch tensors (use torch.cat, not np.concatenate)")
    return tuple(value)


def _tensor(value):
    if not isinstance(value, torch.Tensor):
        raise WrongType(f"{type(value).__name__}; expected a torch tensor")
    return value


def _same_tensors(expected, got, args) -> str | None:
    for name, e, g in zip(("keys", "values"), expected, got):
        if g.shape != e.shape:
            return f"returned {name} of shape {tuple(g.shape)}, expected {tuple(e.shape)} (append along the seq axis, dim 2)"
        if g.dtype != e.dtype:
            return f"returned {name} of dtype {g.dtype}, expected {e.dtype}"
        if not torch.equal(g, e):
            return f"returned {name} whose rows are not the old cache followed by the new rows"
    return None


def _append_reference(k_cache, v_cache, k_new, v_new):
    return torch.cat([k_cache, k_new], dim=2), torch.cat([v_cache, v_new], dim=2)


def _append_cases(seed: int, n_random: int) -> list[tuple]:
    g = torch.Generator().manual_seed(seed)
    cases = []
    for batch, heads, past, new, dim in [(1, 2, 5, 1, 4), (2, 1, 0, 3, 8), (1, 4, 7, 2, 16)] + [
            tuple(int(x) for x in torch.randint(1, 6, (5,), generator=g)) for _ in range(n_random)]:
        past = past % 6  # an empty cache is a case too
        k, v = torch.randn(2, batch, heads, past, dim, generator=g)
        k_new, v_new = torch.randn(2, batch, heads, new, dim, generator=g)
        cases.append((k, v, k_new, v_new))
    return cases


def append_to_cache(fn, seed: int = 1, n_random: int = 20) -> None:
    """Exercise 1: append new keys and values to a layer's cache."""
    check_function(fn, _append_reference, _append_cases(seed, n_random), name="append_to_cache",
                   params=("k_cache", "v_cache", "k_new", "v_new"), convert=_tensor_pair, compare=_same_tensors,
                   hint="tensors are (batch, kv_heads, seq, head_dim): concatenate along dim 2 (torch.cat), "
                        "old rows first (lesson 04: KVCache.append in section 2, the layout in section 3).")


def _attend_reference(q, k, v):
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~causal_mask(q.shape[-2], k.shape[-2]), float("-inf"))
    return scores.softmax(dim=-1) @ v


def _close(expected, got, args) -> str | None:
    if got.shape != expected.shape:
        return f"returned shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
    if not torch.allclose(got, expected, rtol=1e-5, atol=1e-6):
        error = (got - expected).abs().amax(dim=tuple(i for i in range(got.ndim) if i != got.ndim - 2))  # per query row
        rows = [i for i, e in enumerate(error.tolist()) if e > 1e-6 + 1e-5 * float(expected.abs().max())]
        n_new, n_total = args[0].shape[-2], args[1].shape[-2]
        where = ", ".join(f"{i} (position {n_total - n_new + i})" for i in rows[:4]) + (" ..." if len(rows) > 4 else "")
        return (f"returned values up to {float(error.max()):.3g} away from the expected ones, in query rows {where} "
                f"of {n_new} new against {n_total} keys")
    return None


def _attend_cases(seed: int, n_random: int) -> list[tuple]:
    g = torch.Generator().manual_seed(seed)
    shapes = [(2, 1, 6, 8), (2, 3, 9, 4), (1, 5, 5, 4), (4, 2, 12, 16)]
    for _ in range(n_random):
        total = int(torch.randint(1, 20, (1,), generator=g))
        shapes.append((int(torch.randint(1, 5, (1,), generator=g)), int(torch.randint(1, total + 1, (1,), generator=g)),
                       total, int(torch.randint(1, 9, (1,), generator=g))))
    return [(torch.randn(h, new, d, generator=g), torch.randn(h, total, d, generator=g), torch.randn(h, total, d, generator=g))
            for h, new, total, d in shapes]


def attend_new(fn, seed: int = 2, n_random: int = 20) -> None:
    """Exercise 2: attention of the newest tokens' queries over the whole cache, mask offset."""
    def diagnose(args, expected, got):
        q, k, v = args
        top_left = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        scores = ((q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])).masked_fill(~top_left, float("-inf"))
        if got.shape == expected.shape and torch.allclose(got, scores.softmax(-1) @ v, atol=1e-6):
            return ("the mask is aligned to the top-left (as is_causal=True does): new token i sits at position "
                    "n_total - n_new + i")
        if got.shape == expected.shape and torch.allclose(got, _attend_reference(q * math.sqrt(q.shape[-1]), k, v),
                                                          atol=1e-6):
            return "the scores are not divided by sqrt(d)"
        return None
    check_function(fn, _attend_reference, _attend_cases(seed, n_random), name="attend_new", params=("q", "k", "v"),
                   convert=_tensor, compare=_close, diagnose=diagnose,
                   hint="scores = q k^T / sqrt(d); query i may see keys 0 .. n_total - n_new + i; softmax over the "
                        "keys; multiply by v (lesson 04, section 4).")


def _bytes_reference(config, batch, dtype):
    return kv_bytes_per_token(config.layers, config.kv_heads, config.head_dim,
                              torch.empty((), dtype=dtype).element_size()) * batch


def bytes_appended(fn, seed: int = 3, n_random: int = 20) -> None:
    """Exercise 3: bytes one decode step appends to the cache of a LlamaConfig model."""
    g = torch.Generator().manual_seed(seed)
    dtypes = [torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float64]
    cases = [(LlamaConfig(), 1, torch.float32), (LlamaConfig(layers=32, hidden=4096, q_heads=32, kv_heads=8,
                                                              head_dim=128, intermediate=14336), 1, torch.bfloat16)]
    for _ in range(n_random):
        kv = int(torch.randint(1, 9, (1,), generator=g))
        cases.append((LlamaConfig(layers=int(torch.randint(1, 64, (1,), generator=g)), q_heads=kv * 2, kv_heads=kv,
                                  head_dim=2 * int(torch.randint(8, 65, (1,), generator=g))),
                      int(torch.randint(1, 65, (1,), generator=g)), dtypes[int(torch.randint(0, 5, (1,), generator=g))]))
    def diagnose(args, expected, got):
        config, batch, dtype = args
        size = torch.empty((), dtype=dtype).element_size()
        matches = [cause for factor, cause in (
            (8, "bits, not bytes (8 bits to a byte)"), (1 / size, "elements, not bytes: multiply by the element size"),
            (1 / batch, "one sequence, not the batch"),
            (config.q_heads / config.kv_heads, "q_heads where the cache holds kv_heads (GQA)"),
            (1 / 2, "keys only: a value row is appended too"),
            (1 / config.layers, "one layer: every layer appends its own rows")) if factor != 1 and got == expected * factor]
        if len(matches) == 1:
            return f"the answer counts {matches[0]}"
        if matches:  # two factors are equal in this case: name each possibility
            return "the answer is off by a factor that fits more than one mistake: it counts " + ", or ".join(matches)
        return None
    check_function(fn, _bytes_reference, cases, name="bytes_appended", params=("config", "batch", "dtype"),
                   convert=as_int, diagnose=diagnose,
                   hint="each layer appends one key row and one value row of kv_heads x head_dim elements per "
                        "sequence; an element's size is torch.empty((), dtype=dtype).element_size() (lesson 04, section 3).")
