"""Timing generation step by step, with and without the KV cache, and fitting how it scales.

``step_seconds`` runs the loop ``helpers.llama.generate`` runs (``decode_steps``, greedy) and
times every forward pass; ``cached_step_seconds`` and ``uncached_step_seconds`` time the step at a few
chosen positions, best of several runs; ``scaling_exponent`` fits t ~ c n^k on a log-log scale.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from helpers.llama import KVCache, LlamaForCausalLM, decode_steps
from helpers.measure import best_seconds
from helpers.units import positive_int


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def step_seconds(model: LlamaForCausalLM, prompt_ids: torch.Tensor, new_tokens: int, use_cache: bool) -> np.ndarray:
    """Wall seconds of each of ``new_tokens`` greedy steps (the first includes the prefill)."""
    steps = decode_steps(model, prompt_ids, positive_int("new_tokens", new_tokens), use_cache)
    times = []
    while True:
        _sync(prompt_ids.device)
        start = time.perf_counter()
        if next(steps, None) is None:  # the loop has run all its steps
            return np.array(times)
        _sync(prompt_ids.device)
        times.append(time.perf_counter() - start)


def _positions(ids: torch.Tensor, positions) -> list[int]:
    positions = [positive_int("position", p, allow_zero=True) for p in positions]
    if ids.ndim != 2 or not positions or max(positions) >= ids.shape[1]:
        raise ValueError(f"ids must be (batch, length) with length above every position; got shape "
                         f"{tuple(ids.shape)} for positions {positions}")
    return positions


@torch.no_grad()
def cached_step_seconds(model: LlamaForCausalLM, ids: torch.Tensor, positions, repeat: int = 3) -> np.ndarray:
    """Best-of-``repeat`` wall seconds of the cached decode step that reads token ``ids[:, p]``
    against p cached positions (prefilled once, untimed), for each position p. ``ids``: (batch, length)."""
    device, dtype = ids.device, next(model.parameters()).dtype
    times = []
    for p in _positions(ids, positions):
        cache = KVCache(model.config, ids.shape[0], p + 1, dtype, device)
        if p:
            model(ids[:, :p], cache)

        def one_step():
            model(ids[:, p:p + 1], cache)
            _sync(device)
            cache.rewind(1)  # the same step again next time

        times.append(best_seconds(one_step, repeat=repeat))
    return np.array(times)


@torch.no_grad()
def uncached_step_seconds(model: LlamaForCausalLM, ids: torch.Tensor, positions, repeat: int = 3) -> np.ndarray:
    """Best-of-``repeat`` wall seconds of the step without a cache at each position p: a forward
    pass over all p + 1 tokens ``ids[:, :p + 1]`` (the same as a prefill of p + 1 tokens)."""
    device = ids.device
    return np.array([best_seconds(lambda: (model(ids[:, :p + 1]), _sync(device)), repeat=repeat)
                     for p in _positions(ids, positions)])


def scaling_exponent(sizes, seconds) -> float:
    """k in seconds ~ c * sizes^k, by least squares on log-log axes."""
    sizes, seconds = np.asarray(sizes, float), np.asarray(seconds, float)
    if sizes.shape != seconds.shape or sizes.size < 2 or not (np.isfinite(sizes).all() and np.isfinite(seconds).all()) \
            or (sizes <= 0).any() or (seconds <= 0).any():
        raise ValueError("sizes and seconds must be equal-length arrays of at least 2 positive, finite numbers")
    if np.unique(sizes).size < 2:
        raise ValueError("sizes must hold at least two different values to fit a slope")
    return float(np.polyfit(np.log(sizes), np.log(seconds), 1)[0])
