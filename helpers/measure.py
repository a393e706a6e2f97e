"""Measuring on this machine: peak memory allocated by a call, and its best wall time.

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
