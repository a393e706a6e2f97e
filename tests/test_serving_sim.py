"""helpers.serving_sim: the seeded workload, contiguous and paged waste, and shared parallel sampling."""

import math

import pytest

from helpers.serving_sim import Request, contiguous_waste, paged_waste, parallel_sampling_blocks, workload

TINY = [Request(prompt=10, output=10, generated=5), Request(prompt=20, output=4, generated=4),
        Request(prompt=3, output=6, generated=1)]  # tokens 15, 24, 4 = 43; final lengths 20, 24, 9 = 53


@pytest.fixture(scope="module")
def default_workload():
    return workload()


def test_request_tokens_are_prompt_plus_generated():
    assert [r.tokens for r in TINY] == [15, 24, 4]


def test_workload_is_deterministic_by_seed(default_workload):
    assert workload() == default_workload
    assert workload(seed=0) == default_workload
    assert workload(seed=1) == workload(seed=1)
    assert workload(seed=1) != default_workload
    assert workload(n=20, seed=0) == default_workload[:20]  # the same draws, fewer of them


@pytest.mark.parametrize("n, max_context, seed", [(200, 4096, 0), (300, 4096, 7), (300, 512, 3), (100, 64, 5)])
def test_workload_lengths_within_bounds(n, max_context, seed):
    requests = workload(n, max_context, seed)
    assert len(requests) == n
    for r in requests:
        assert all(type(v) is int for v in (r.prompt, r.output, r.generated))
        assert 4 <= r.prompt <= max_context // 2
        assert 1 <= r.generated <= r.output
        assert r.prompt + r.output <= max_context


def test_default_workload_is_spread_out(default_workload):
    prompts = sorted(r.prompt for r in default_workload)
    outputs = sorted(r.output for r in default_workload)
    assert 150 < prompts[100] < 600 and 100 < outputs[100] < 400  # medians near 300 and 200
    assert len(set(prompts)) > 100 and min(prompts) < 100 and max(prompts) > 1000


def test_contiguous_waste_with_own_final_lengths():
    assert contiguous_waste(TINY) == pytest.approx(1 - 43 / 53)
    assert contiguous_waste([Request(7, 3, 3)]) == 0  # finished: nothing wasted


def test_contiguous_waste_with_a_fixed_reserve():
    assert contiguous_waste(TINY, reserve=100) == pytest.approx(1 - 43 / 300)
    assert contiguous_waste(TINY, reserve=24) == pytest.approx(1 - 43 / 72)
    assert contiguous_waste(TINY, reserve=24) > contiguous_waste(TINY)


def test_reserving_the_context_limit_wastes_most_of_it(default_workload):
    limit = contiguous_waste(default_workload, reserve=4096)
    own = contiguous_waste(default_workload)
    assert 0 < own < limit and limit > 0.6  # FACTS.md: 60-80% wasted before paging


def test_paged_waste_by_hand():
    # blocks of 4: 15 -> 16, 24 -> 24, 4 -> 4 slots
    assert paged_waste(TINY, 4) == pytest.approx(1 - 43 / 44)
    # blocks of 16: 16 + 32 + 16 slots
    assert paged_waste(TINY, 16) == pytest.approx(1 - 43 / 64)


def test_paged_waste_is_zero_for_blocks_of_one(default_workload):
    assert paged_waste(default_workload, 1) == 0


def test_paged_waste_grows_with_block_size(default_workload):
    wastes = [paged_waste(default_workload, b) for b in (1, 2, 4, 8, 16, 32, 64, 128, 256)]
    assert all(a < b for a, b in zip(wastes, wastes[1:]))
    assert 0 < paged_waste(default_workload, 16) < 0.04  # FACTS.md: under 4% with paging
    assert paged_waste(default_workload, 16) < contiguous_waste(default_workload)


def test_parallel_sampling_by_hand():
    # prompt 6 in blocks of 4: blocks 0 (full) and 1 (2 tokens), shared by both samples.
    # Sample 0 writes its token into block 1: copy-on-write takes a third block; sample 1 then
    # owns block 1 alone and writes in place. Unshared: 2 samples x ceil(7 / 4) = 4 blocks.
    assert parallel_sampling_blocks(6, 2, 1, 4) == (4, 3)
    # a prompt of whole blocks needs no copy: 2 shared + 1 new block each
    assert parallel_sampling_blocks(8, 2, 1, 4) == (6, 4)
    # 4 samples of 10 tokens after a 100-token prompt in blocks of 16
    # 110 tokens still fit in 7 blocks: shared = 7 prompt blocks + 3 copies (the last sample writes in place)
    assert parallel_sampling_blocks(100, 4, 10, 16) == (4 * 7, 7 + 3)


@pytest.mark.parametrize("prompt, samples, generated, block", [
    (6, 2, 1, 4), (1, 8, 1, 16), (300, 4, 200, 16), (17, 3, 40, 8), (64, 6, 1, 16), (5, 5, 5, 1), (1000, 2, 3, 128)])
def test_sharing_never_takes_more_blocks(prompt, samples, generated, block):
    unshared, shared = parallel_sampling_blocks(prompt, samples, generated, block)
    assert unshared == samples * math.ceil((prompt + generated) / block)
    assert shared <= unshared


@pytest.mark.parametrize("prompt, generated, block", [(6, 1, 4), (8, 1, 4), (300, 200, 16), (1, 1, 1), (17, 40, 8)])
def test_one_sample_shares_nothing(prompt, generated, block):
    unshared, shared = parallel_sampling_blocks(prompt, 1, generated, block)
    assert shared == unshared == math.ceil((prompt + generated) / block)


def test_sharing_saves_more_with_more_samples():
    saved = []
    for samples in (2, 4, 8):
        unshared, shared = parallel_sampling_blocks(512, samples, 64, 16)
        saved.append(1 - shared / unshared)
    assert 0 < saved[0] < saved[1] < saved[2]


@pytest.mark.parametrize("call", [
    lambda: workload(n=0),
    lambda: contiguous_waste(TINY, reserve=0),
    lambda: contiguous_waste(TINY, reserve=-5),
    lambda: paged_waste(TINY, 0),
    lambda: paged_waste(TINY, 2.0),
    lambda: parallel_sampling_blocks(0, 2, 1, 4),
    lambda: parallel_sampling_blocks(6, 0, 1, 4),
    lambda: parallel_sampling_blocks(6, 2, 0, 4),
    lambda: parallel_sampling_blocks(6, 2, 1, 0),
    lambda: parallel_sampling_blocks(6, 2, 1, -4),
])
def test_bad_inputs_raise_value_error(call):
    with pytest.raises(ValueError):
        call()


def test_bad_workload_inputs_are_refused():
    from helpers.serving_sim import Request, contiguous_waste, paged_waste, workload

    with pytest.raises(ValueError, match="max_context must be at least 8"):
        workload(n=3, max_context=6)
    with pytest.raises(ValueError, match="must not be empty"):
        paged_waste([], 16)
    with pytest.raises(ValueError, match="must not be empty"):
        contiguous_waste([])
    with pytest.raises(ValueError, match=r"reserve \(5\) is smaller than a request's 15 tokens"):
        contiguous_waste([Request(10, 10, 5)], 5)
