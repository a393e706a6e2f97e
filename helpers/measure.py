"""Measuring on this machine: peak memory allocated by a call, its best wall time, and the
memory bandwidth.

Peak memory uses tracemalloc, which sees NumPy's array allocations (not the BLAS library's
small internal buffers). Times are the best of a few runs, to keep other work on the machine
out of the figure as far as possible.
"""

from __future__ import annotations

import time
import tracemalloc
from typing import Any, Callable


def peak_bytes(fn: Callable[..., Any], *args, **kwargs) -> tuple[Any, int]:
    """(fn's result, the most bytes it had allocated at once while running)."""
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    tracemalloc.reset_peak()
    start, _ = tracemalloc.get_traced_memory()
    try:
        result = fn(*args, **kwargs)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        if not was_tracing:
            tracemalloc.stop()
    return result, peak - start


def best_seconds(fn: Callable[..., Any], *args, repeat: int = 3, **kwargs) -> float:
    """The shortest wall time of ``repeat`` calls of fn(*args, **kwargs), in seconds."""
    if repeat < 1:
        raise ValueError(f"repeat must be at least 1, got {repeat}")
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn(*args, **kwargs)
        best = min(best, time.perf_counter() - start)
    return best


def memory_bandwidth(megabytes: int = 256, repeat: int = 5) -> float:
    """Bytes per second this machine reads from memory: the best of ``repeat`` sums, in torch, of a
    float32 tensor of ``megabytes`` MB (1e6 bytes), far larger than the CPU's caches. A sum reads
    every byte once and writes almost nothing, like the weight read of a decode step."""
    import torch

    if not (isinstance(megabytes, int) and megabytes >= 64):
        raise ValueError(f"megabytes must be an int of at least 64 (to exceed the CPU caches), got {megabytes!r}")
    data = torch.ones(megabytes * 1_000_000 // 4, dtype=torch.float32)
    data.sum()  # touch every page once before timing
    return data.numel() * 4 / best_seconds(data.sum, repeat=repeat)
