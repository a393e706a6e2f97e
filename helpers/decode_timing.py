"""Timing generation step by step, with and without the KV cache, and fitting how it scales.

``step_seconds`` runs the same loop as ``helpers.llama.generate`` (greedy) and times every
forward pass; ``scaling_exponent`` fits t ~ c n^k on a log-log scale.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from helpers.kv_cache_size import positive_int
from helpers.llama import KVCache, LlamaForCausalLM


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def step_seconds(model: LlamaForCausalLM, prompt_ids: torch.Tensor, new_tokens: int, use_cache: bool) -> np.ndarray:
    """Wall seconds of each of ``new_tokens`` greedy steps (the first includes the prefill)."""
    new_tokens = positive_int("new_tokens", new_tokens)
    device = prompt_ids.device
    cache = KVCache(model.config, prompt_ids.shape[0], prompt_ids.shape[1] + new_tokens,
                    next(model.parameters()).dtype, device) if use_cache else None
    ids, step_input, times = prompt_ids, prompt_ids, []
    for _ in range(new_tokens):
        _sync(device)
        start = time.perf_counter()
        logits = model(step_input, cache) if use_cache else model(ids)
        token = logits[:, -1].argmax(dim=-1, keepdim=True)
        _sync(device)
        times.append(time.perf_counter() - start)
        ids = torch.cat([ids, token], dim=1)
        step_input = token
    return np.array(times)


def scaling_exponent(sizes, seconds) -> float:
    """k in seconds ~ c * sizes^k, by least squares on log-log axes."""
    sizes, seconds = np.asarray(sizes, float), np.asarray(seconds, float)
    if sizes.shape != seconds.shape or sizes.size < 2 or not (np.isfinite(sizes).all() and np.isfinite(seconds).all()) \
            or (sizes <= 0).any() or (seconds <= 0).any():
        raise ValueError("sizes and seconds must be equal-length arrays of at least 2 positive, finite numbers")
    if np.unique(sizes).size < 2:
        raise ValueError("sizes must hold at least two different values to fit a slope")
    return float(np.polyfit(np.log(sizes), np.log(seconds), 1)[0])
