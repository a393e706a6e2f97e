"""Tests for helpers.measure: peak memory of a call and its best wall time."""

from __future__ import annotations

import time
import tracemalloc

import numpy as np
import pytest

from helpers.measure import best_seconds, peak_bytes


@pytest.fixture(autouse=True)
def _tracemalloc_off_afterwards():
    was_tracing = tracemalloc.is_tracing()
    yield
    if tracemalloc.is_tracing() and not was_tracing:
        tracemalloc.stop()


def test_peak_bytes_returns_result_and_sees_a_large_array():
    result, peak = peak_bytes(np.ones, 1_000_000)
    assert isinstance(result, np.ndarray) and result.shape == (1_000_000,) and result.sum() == 1_000_000
    assert isinstance(peak, int)
    assert 8_000_000 <= peak < 9_000_000


def test_peak_bytes_sees_a_temporary_that_is_freed():
    def temporary():
        big = np.zeros(500_000)  # 4 MB, freed before returning
        return float(big.sum())

    result, peak = peak_bytes(temporary)
    assert result == 0.0
    assert peak >= 4_000_000


def test_peak_bytes_passes_args_and_kwargs():
    result, peak = peak_bytes(np.full, (1000, 250), fill_value=2.0)
    assert result.shape == (1000, 250) and np.all(result == 2.0)
    assert peak >= 2_000_000


def test_peak_bytes_is_small_without_allocations():
    result, peak = peak_bytes(lambda a, b: a + b, 2, b=3)
    assert result == 5
    assert 0 <= peak < 50_000


def test_peak_bytes_leaves_tracing_off_when_it_was_off():
    assert not tracemalloc.is_tracing()
    peak_bytes(np.ones, 1000)
    assert not tracemalloc.is_tracing()


def test_peak_bytes_stops_tracing_even_if_the_function_raises():
    def boom():
        raise KeyError("boom")

    with pytest.raises(KeyError):
        peak_bytes(boom)
    assert not tracemalloc.is_tracing()


def test_peak_bytes_works_when_already_tracing():
    tracemalloc.start()
    try:
        held = np.ones(2_000_000)  # allocated before the call: not part of its peak
        freed = np.ones(4_000_000)  # an earlier, higher peak (32 MB) that must not be reported
        del freed
        result, peak = peak_bytes(np.ones, 1_000_000)
        assert tracemalloc.is_tracing()  # still on: it was on before
        assert result.shape == (1_000_000,)
        assert 8_000_000 <= peak < 9_000_000  # counted from where the call started, not from zero
        _, small = peak_bytes(lambda: 1 + 1)
        assert 0 <= small < 50_000
        assert tracemalloc.is_tracing()
        del held
    finally:
        tracemalloc.stop()


def test_best_seconds_is_a_positive_float():
    t = best_seconds(sum, range(1000))
    assert isinstance(t, float) and 0 < t < 1


def test_best_seconds_is_the_shortest_run():
    calls = []

    def fast_second(pause):
        calls.append(pause)
        if len(calls) != 2:
            time.sleep(pause)  # every call but the second sleeps

    t = best_seconds(fast_second, pause=0.05, repeat=3)
    assert len(calls) == 3
    assert 0 < t < 0.05  # the best run is the one without the sleep, not the first or the last


def test_best_seconds_times_the_call():
    t = best_seconds(time.sleep, 0.01, repeat=2)
    assert 0.01 <= t < 1


@pytest.mark.parametrize("repeat", [1, 4])
def test_best_seconds_calls_repeat_times(repeat):
    calls = []
    best_seconds(calls.append, "x", repeat=repeat)
    assert calls == ["x"] * repeat


@pytest.mark.parametrize("repeat", [0, -1])
def test_best_seconds_rejects_repeat_below_one(repeat):
    calls = []
    with pytest.raises(ValueError, match="repeat"):
        best_seconds(calls.append, 1, repeat=repeat)
    assert calls == []


def test_memory_bandwidth_is_a_plausible_rate():
    from helpers.measure import memory_bandwidth

    rate = memory_bandwidth(64, repeat=2)
    assert 1e8 < rate < 1e13  # between 0.1 GB/s and 10 TB/s: bytes per second, not GB/s or seconds


@pytest.mark.parametrize("megabytes", [0, 16, 64.0, "256"])
def test_memory_bandwidth_rejects_sizes_that_fit_in_a_cache_or_are_not_ints(megabytes):
    from helpers.measure import memory_bandwidth

    with pytest.raises(ValueError, match="megabytes"):
        memory_bandwidth(megabytes)
