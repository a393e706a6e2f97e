"""helpers.roofline: the chips of FACTS.md, the roofline, the decode ceiling and the batch that fits."""

import math

import pytest

from helpers.models import MODELS, get_model
from helpers.roofline import CHIPS, attainable_flops, decode_ceiling, get_chip, max_batch, step_seconds_bound
from helpers.step_cost import step_bytes, step_flops
from helpers.units import GB

LLAMA3_8B = get_model("Llama-3-8B")
H100 = CHIPS["H100 SXM"]


@pytest.mark.parametrize("name, memory_gb, bandwidth, peak, ridge", [
    ("A100 40GB SXM", 40, 1555e9, 312e12, 200),
    ("A100 80GB SXM", 80, 2039e9, 312e12, 153),
    ("H100 SXM", 80, 3.35e12, 989e12, 295),
    ("H200 SXM", 141, 4.8e12, 989e12, 206),
])
def test_gpu_figures_match_facts(name, memory_gb, bandwidth, peak, ridge):
    chip = get_chip(name)
    assert chip.name == name
    assert chip.memory_bytes == memory_gb * GB
    assert chip.bandwidth == pytest.approx(bandwidth, rel=1e-12)
    assert chip.peak_flops == pytest.approx(peak, rel=1e-12)
    assert chip.ridge == pytest.approx(ridge, abs=1)  # FACTS.md: ~200, ~153, ~295, ~206


def test_laptop_has_arithmetic_bandwidth_and_no_peak():
    laptop = get_chip("laptop, DDR5-5600 x2")
    assert laptop.bandwidth == pytest.approx(89.6e9, rel=1e-12)  # 5600 MT/s x 16 bytes
    assert laptop.peak_flops is None and laptop.ridge is None
    assert attainable_flops(laptop, 1e6) == pytest.approx(89.6e9 * 1e6)  # no flat roof


def test_the_five_chips_and_nothing_else():
    assert list(CHIPS) == ["A100 40GB SXM", "A100 80GB SXM", "H100 SXM", "H200 SXM", "laptop, DDR5-5600 x2"]
    assert all(CHIPS[name].name == name for name in CHIPS)


def test_get_chip_unknown_name_lists_the_chips():
    with pytest.raises(ValueError, match="unknown chip 'B200'") as info:
        get_chip("B200")
    assert all(name in str(info.value) for name in CHIPS)


@pytest.mark.parametrize("name", ["A100 40GB SXM", "H100 SXM", "H200 SXM"])
@pytest.mark.parametrize("intensity", [0.5, 1, 50, 150, 400, 5000])
def test_attainable_flops_is_the_roofline(name, intensity):
    chip = get_chip(name)
    assert attainable_flops(chip, intensity) == pytest.approx(min(chip.peak_flops, chip.bandwidth * intensity))


def test_attainable_flops_bends_at_the_ridge():
    assert attainable_flops(H100, H100.ridge / 2) == pytest.approx(H100.peak_flops / 2)
    assert attainable_flops(H100, H100.ridge) == pytest.approx(H100.peak_flops)
    assert attainable_flops(H100, H100.ridge * 10) == pytest.approx(H100.peak_flops)


@pytest.mark.parametrize("intensity", [0, -1, -0.5, float("nan")])
def test_attainable_flops_rejects_non_positive_intensity(intensity):
    with pytest.raises(ValueError, match="intensity must be positive"):
        attainable_flops(H100, intensity)


@pytest.mark.parametrize("chip_name", list(CHIPS))
@pytest.mark.parametrize("batch, context", [(1, 1024), (16, 8192), (64, 4096), (256, 131072)])
def test_decode_ceiling_is_batch_times_bandwidth_over_bytes(chip_name, batch, context):
    chip = get_chip(chip_name)
    expected = batch * chip.bandwidth / step_bytes(LLAMA3_8B, 1, context, batch)
    assert decode_ceiling(LLAMA3_8B, chip, batch, context) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("model_name", ["Llama-2-7B", "Llama-3-8B", "Llama-3-70B", "Qwen2.5-7B", "Mixtral-8x7B"])
@pytest.mark.parametrize("chip_name", ["A100 40GB SXM", "H100 SXM", "H200 SXM"])
def test_decode_is_memory_bound_for_realistic_models(model_name, chip_name):
    model, chip = MODELS[model_name], get_chip(chip_name)
    for batch in (1, 32):
        moved = step_bytes(model, 1, 4096, batch) / chip.bandwidth
        assert step_flops(model, 1, 4096, batch) / chip.peak_flops < moved
        assert step_seconds_bound(model, chip, 1, 4096, batch) == pytest.approx(moved, rel=1e-12)


def test_decode_ceiling_numbers_for_llama3_8b_on_h100():
    # the weights once (16,060,522,496 bytes) plus 8,193 tokens x 131,072 bytes per sequence
    assert decode_ceiling(LLAMA3_8B, H100, 1, 8192) == pytest.approx(3.35e12 / (16_060_522_496 + 8193 * 131_072))
    assert decode_ceiling(LLAMA3_8B, H100, 16, 8192) == pytest.approx(
        16 * 3.35e12 / (16_060_522_496 + 16 * 8193 * 131_072))
    # 8-bit cache: half the cache bytes
    assert decode_ceiling(LLAMA3_8B, H100, 16, 8192, cache_bytes_per_element=1) == pytest.approx(
        16 * 3.35e12 / (16_060_522_496 + 16 * 8193 * 65_536))


def test_decode_ceiling_grows_with_batch_and_falls_with_context():
    by_batch = [decode_ceiling(LLAMA3_8B, H100, b, 8192) for b in (1, 2, 4, 8, 16, 32, 64, 128, 256)]
    assert all(a < b for a, b in zip(by_batch, by_batch[1:]))
    assert by_batch[-1] < H100.bandwidth / (8193 * LLAMA3_8B.kv_bytes_per_token())  # the cache-read limit
    by_context = [decode_ceiling(LLAMA3_8B, H100, 16, c) for c in (1024, 4096, 16384, 65536, 131072)]
    assert all(a > b for a, b in zip(by_context, by_context[1:]))


def test_large_prefill_on_a_gpu_is_compute_bound():
    seconds = step_seconds_bound(LLAMA3_8B, H100, 4096, 0)
    computed = step_flops(LLAMA3_8B, 4096, 0) / H100.peak_flops
    moved = step_bytes(LLAMA3_8B, 4096, 0) / H100.bandwidth
    assert computed > moved and seconds == pytest.approx(computed, rel=1e-12)
    # the laptop has no listed peak: its bound is the bytes alone
    laptop = get_chip("laptop, DDR5-5600 x2")
    assert step_seconds_bound(LLAMA3_8B, laptop, 4096, 0) == pytest.approx(
        step_bytes(LLAMA3_8B, 4096, 0) / laptop.bandwidth, rel=1e-12)


def test_max_batch_by_hand_for_llama3_8b_on_h100():
    spare = 80 * GB - 16_060_522_496
    per_sequence = 8192 * 131_072  # 1 GiB
    assert max_batch(LLAMA3_8B, H100, 8192) == spare // per_sequence == 59
    assert max_batch(LLAMA3_8B, H100, 8192, block_size=16) == 59  # 8192 is a whole number of blocks
    assert max_batch(LLAMA3_8B, H100, 8192, cache_bytes_per_element=1) == spare // (per_sequence // 2) == 119


def test_max_batch_with_paging_rounds_each_sequence_up_to_whole_blocks():
    spare = 80 * GB - LLAMA3_8B.weight_bytes()
    per_token = LLAMA3_8B.kv_bytes_per_token()
    for context, block in [(1000, 16), (1001, 128), (8193, 16), (5, 256)]:
        slots = math.ceil(context / block) * block
        assert max_batch(LLAMA3_8B, H100, context, block_size=block) == spare // (slots * per_token)
        assert max_batch(LLAMA3_8B, H100, context, block_size=block) == max_batch(LLAMA3_8B, H100, slots)
    assert max_batch(LLAMA3_8B, H100, 1000) == spare // (1000 * per_token)
    assert max_batch(LLAMA3_8B, H100, 1, block_size=256) < max_batch(LLAMA3_8B, H100, 1)


@pytest.mark.parametrize("model_name, chip_name", [("Llama-3-70B", "A100 40GB SXM"), ("Llama-3-70B", "H100 SXM"),
                                                   ("Llama-3.1-405B", "H200 SXM")])
def test_max_batch_is_zero_when_the_weights_do_not_fit(model_name, chip_name):
    model, chip = MODELS[model_name], get_chip(chip_name)
    assert model.weight_bytes() > chip.memory_bytes
    assert max_batch(model, chip, 1024) == 0
    assert max_batch(model, chip, 1024, block_size=16) == 0


def test_max_batch_rejects_a_bad_context():
    with pytest.raises(ValueError, match="context"):
        max_batch(LLAMA3_8B, H100, 0)


def test_max_batch_rejects_a_zero_block_size():
    from helpers.models import get_model
    from helpers.roofline import get_chip, max_batch

    with pytest.raises(ValueError, match="block_size"):
        max_batch(get_model("Llama-3-8B"), get_chip("H100 SXM"), 8192, block_size=0)
