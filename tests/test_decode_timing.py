"""helpers.decode_timing: per-step wall times of generation, and the log-log fit of how they scale."""

import math

import numpy as np
import pytest
import torch

from helpers.decode_timing import scaling_exponent, step_seconds
from helpers.llama import LlamaConfig, LlamaForCausalLM

TINY = LlamaConfig(vocab_size=20, layers=1, hidden=16, q_heads=2, kv_heads=1, head_dim=8, intermediate=32,
                   max_positions=16)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return LlamaForCausalLM(TINY).eval()


@pytest.mark.parametrize("use_cache", [True, False], ids=["cached", "uncached"])
@pytest.mark.parametrize("batch", [1, 2])
def test_step_seconds_gives_one_positive_time_per_new_token(model, use_cache, batch):
    prompt = torch.randint(0, TINY.vocab_size, (batch, 3), generator=torch.Generator().manual_seed(1))
    times = step_seconds(model, prompt, 5, use_cache)
    assert isinstance(times, np.ndarray) and times.shape == (5,) and times.dtype == np.float64
    assert np.all(times > 0) and np.all(np.isfinite(times)) and times.sum() < 10


@pytest.mark.parametrize("use_cache", [True, False], ids=["cached", "uncached"])
def test_step_seconds_stops_at_max_positions(model, use_cache):
    prompt = torch.zeros(1, 4, dtype=torch.long)
    # the last token made is never fed back, so 13 new tokens need forward passes over 16 positions
    assert step_seconds(model, prompt, 13, use_cache).shape == (13,)
    with pytest.raises(ValueError, match="max_positions"):
        step_seconds(model, prompt, 14, use_cache)


def test_step_seconds_works_in_float64():
    torch.manual_seed(0)
    model = LlamaForCausalLM(TINY).to(torch.float64).eval()
    assert step_seconds(model, torch.zeros(1, 2, dtype=torch.long), 3, True).shape == (3,)


@pytest.mark.parametrize("new_tokens", [0, -1, 2.0])
def test_step_seconds_rejects_bad_counts(model, new_tokens):
    with pytest.raises(ValueError, match="new_tokens"):
        step_seconds(model, torch.zeros(1, 2, dtype=torch.long), new_tokens, True)


@pytest.mark.parametrize("seconds, k", [
    (lambda n: 3 * n ** 2, 2.0),
    (lambda n: n, 1.0),
    (lambda n: 0.5 * n ** 1.5, 1.5),
    (lambda n: 7 + 0 * n, 0.0),
])
def test_scaling_exponent_recovers_k(seconds, k):
    sizes = np.array([64, 128, 256, 480])
    assert scaling_exponent(sizes, seconds(sizes.astype(float))) == pytest.approx(k, abs=1e-9)
    assert scaling_exponent(list(sizes[:2]), list(seconds(sizes[:2].astype(float)))) == pytest.approx(k, abs=1e-9)


def test_scaling_exponent_fits_noisy_data():
    sizes = np.array([10, 20, 40, 80, 160])
    noise = np.array([1.05, 0.97, 1.02, 0.99, 1.01])
    k = scaling_exponent(sizes, 2e-4 * sizes ** 2.0 * noise)
    assert isinstance(k, float) and k == pytest.approx(2.0, abs=0.05)


@pytest.mark.parametrize("sizes, seconds", [
    ([1, 2, 3], [1, 2]),  # lengths differ
    ([4], [1.0]),  # one point
    ([], []),
    ([0, 2, 4], [1, 2, 3]),  # a zero size
    ([1, 2, 4], [1, -2, 3]),  # a negative time
    ([1, 2, 4], [1, 0, 3]),
])
def test_scaling_exponent_rejects_bad_input(sizes, seconds):
    with pytest.raises(ValueError, match="at least 2 positive, finite numbers"):
        scaling_exponent(sizes, seconds)


@pytest.mark.filterwarnings("ignore")
def test_scaling_exponent_rejects_identical_sizes():
    with pytest.raises(ValueError, match="two different values"):
        scaling_exponent([5, 5, 5], [1.0, 2.0, 3.0])


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_scaling_exponent_rejects_non_finite_input(bad):
    with pytest.raises(ValueError, match="positive, finite numbers"):
        scaling_exponent([1.0, 2.0, bad], [1.0, 2.0, 3.0])


# ---- one step at chosen positions -------------------------------------------------------------
def test_cached_and_uncached_step_seconds_time_each_position(model, monkeypatch):
    from helpers import decode_timing

    ids = torch.randint(0, TINY.vocab_size, (2, 12), generator=torch.Generator().manual_seed(2))
    fed = []
    original = model.forward
    monkeypatch.setattr(model, "forward", lambda x, cache=None, **kw: (fed.append((x.shape[1], cache is not None,
                                                                                   cache.length if cache else 0)),
                                                                      original(x, cache, **kw))[1])
    cached = decode_timing.cached_step_seconds(model, ids, [0, 5], repeat=2)
    # position 0: two timed one-token steps on an empty cache; position 5: a 5-token prefill, then two steps
    assert fed == [(1, True, 0), (1, True, 0), (5, True, 0), (1, True, 5), (1, True, 5)]
    fed.clear()
    uncached = decode_timing.uncached_step_seconds(model, ids, [0, 5], repeat=2)
    assert fed == [(1, False, 0), (1, False, 0), (6, False, 0), (6, False, 0)]  # all p + 1 tokens, no cache
    for times in (cached, uncached):
        assert times.shape == (2,) and np.all(times > 0) and np.all(np.isfinite(times))


@pytest.mark.parametrize("positions", [[12], [], [-1]])
def test_step_seconds_at_positions_reject_positions_outside_the_ids(model, positions):
    from helpers.decode_timing import cached_step_seconds, uncached_step_seconds

    ids = torch.zeros(1, 12, dtype=torch.long)
    for timer in (cached_step_seconds, uncached_step_seconds):
        with pytest.raises(ValueError, match="position"):
            timer(model, ids, positions)
