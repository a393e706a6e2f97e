"""The lesson 03 panels: the online-softmax step-through and the tiling / traffic panel."""

import math

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pytest
from conftest import differing_pixels

from helpers import flash
from helpers.attention import softmax
from helpers.flash import flash_blocks, flash_traffic, standard_traffic, tile_mask, tile_schedule
from helpers.panels import online_softmax as online
from helpers.panels import output as panel_output
from helpers.panels import tiling as tiling

MIB = 2**20


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


@pytest.fixture
def shown(monkeypatch):
    """Every figure a panel displays, recorded instead of shown."""
    displayed = []
    monkeypatch.setattr(panel_output, "display", displayed.append)
    return displayed


# ---- online softmax -----------------------------------------------------------------------


@pytest.mark.parametrize("block", [1, 3, 4, 8, 16, 32, 50])
def test_online_states_end_at_the_exact_softmax(block):
    scores, values = flash.demo_row()
    states = flash.online_states(scores, values, block)
    assert len(states) == math.ceil(len(scores) / block) + 1
    assert [s["end"] for s in states] == [min(i * block, len(scores)) for i in range(len(states))]
    first = states[0]
    assert first["m"] == -math.inf and first["l"] == 0 and np.all(first["o"] == 0)
    last = states[-1]
    np.testing.assert_allclose(last["o"], softmax(scores) @ values, rtol=0, atol=1e-12)
    assert last["m"] == scores.max()
    np.testing.assert_allclose(last["l"], np.exp(scores - last["m"]).sum(), rtol=1e-12)


@pytest.mark.parametrize("block", [1, 4, 8, 16])
def test_online_states_each_step(block):
    scores, values = flash.demo_row()
    states = flash.online_states(scores, values, block)
    ms = [s["m"] for s in states]
    assert all(a <= b for a, b in zip(ms, ms[1:]))  # the running max never falls
    for old, new in zip(states, states[1:]):
        seen = scores[:new["end"]]
        assert new["m"] == seen.max()
        np.testing.assert_allclose(new["l"], np.exp(seen - new["m"]).sum(), rtol=1e-12)
        np.testing.assert_allclose(new["o"], softmax(seen) @ values[:new["end"]], rtol=0, atol=1e-12)
        np.testing.assert_allclose(new["alpha"], math.exp(old["m"] - new["m"]), rtol=1e-12, atol=0)
    assert states[1]["alpha"] == 0.0  # nothing to rescale after the first block
    assert math.isnan(states[0]["alpha"])


def test_demo_row_maximum_moves_later():
    scores, values = flash.demo_row()
    assert scores.shape == (32,) and values.shape == (32, 4)
    states = flash.online_states(scores, values, 8)
    assert any(s["alpha"] < 0.5 for s in states[2:])  # a later block rescales the earlier sum
    again, _ = flash.demo_row()
    np.testing.assert_array_equal(scores, again)  # deterministic


def test_online_states_rejects_bad_block():
    scores, values = flash.demo_row()
    for block in (0, -2, 2.5):
        with pytest.raises(ValueError):
            flash.online_states(scores, values, block)


@pytest.mark.parametrize("block", [4, 8, 16])
def test_draw_online_step_every_step(block):
    last = math.ceil(32 / block)
    for step in range(last + 1):
        fig = online.draw_online_step(step, block)
        assert len(fig.axes) == 3
        assert f"after {step} of {last} blocks of {block}" in fig.axes[0].get_title()
        plt.close(fig)
    assert "equal to exact" in online.draw_online_step(last, block).axes[2].get_title()
    for bad in (-1, last + 1):
        with pytest.raises(ValueError, match="step must be between"):
            online.draw_online_step(bad, block)



def test_online_panel_wiring(monkeypatch, shown):
    figures = []
    real = panel_output.show_figure
    monkeypatch.setattr(panel_output, "show_figure", lambda fig: figures.append(fig) or real(fig))
    box = online.online_softmax_panel()
    block, step = box.children[0].children
    assert block.value == 8 and step.max == 4
    assert len(shown) == 1 and shown[0].data.startswith(b"\x89PNG")
    step.value = 3
    assert len(shown) == 2 and figures[-1] is figures[0]  # the same figure, updated in place
    assert figures[-1].axes[0].get_title().startswith("after 3 of 4 blocks of 8: m = ")
    block.value = 4
    assert step.max == 8 and len(shown) == 3 and figures[-1] is not figures[0]
    step.value = 8
    assert figures[-1].axes[0].get_title().startswith("after 8 of 8 blocks of 4: m = ")
    block.value = 16  # the slider must come back inside 0 .. 2 before anything is drawn: one render
    assert step.max == 2 and step.value == 2 and len(shown) == 5
    assert figures[-1].axes[0].get_title().startswith("after 2 of 2 blocks of 16: m = ")
    block.value = 8  # back to a figure drawn before
    assert figures[-1] is figures[0] and figures[-1].axes[0].get_title().startswith("after 2 of 4 blocks of 8: m = ")
    assert not plt.get_fignums()  # shown, then closed out of pyplot: nothing piles up


@pytest.mark.parametrize("block", [4, 8])
def test_online_view_in_place_draws_what_a_fresh_figure_draws(block):
    view = online.OnlineStepView(block)
    view.freeze()
    last = math.ceil(32 / block)
    for step in (0, 2, last, 1):  # back and forth over the frozen background
        view.move(step)
        fresh = online.draw_online_step(step, block)
        assert differing_pixels(view.fig, fresh) == 0, f"block {block}, step {step}"
        plt.close(fresh)


# ---- tiling panel -------------------------------------------------------------------------


@pytest.mark.parametrize("n, d, block_q, block_k, expected", [
    (4096, 64, 64, 384, (2 * 4096 * 4096 * 2, (2 * 4096 + 64 * 64 + 2 * 384 * 64 + 64 * 384) * 2)),
    (4096, 64, 64, 384, (64 * MIB, 172_032)),
    (256, 32, 16, 16, (262_144, (512 + 512 + 1024 + 256) * 2)),
])
def test_extra_memory(n, d, block_q, block_k, expected):
    assert flash.extra_memory(n, d, block_q, block_k) == expected


def image_of(fig):
    """The schedule image as visit numbers (the panel colours them from 0, first, to 1, last)."""
    left = fig.axes[0]
    (image,) = left.images
    share = np.ma.filled(np.ma.asarray(image.get_array(), dtype=float), np.nan)
    return np.round(share * max(np.count_nonzero(~np.isnan(share)) - 1, 1))


def test_draw_tiling_defaults():
    assert flash_blocks(192 * 1024 // 2, 64) == (64, 384)
    fig = tiling.draw_tiling()
    left, right = fig.axes[:2]
    assert "B_r=64, B_c=384" in right.get_title() and "n=4,096, d=64" in right.get_title()
    mask = tile_mask(4096, 4096, 64, 384)
    order = image_of(fig)
    assert order.shape == mask.shape == (64, 11)
    assert np.count_nonzero(~np.isnan(order)) == mask.sum() == 704
    assert left.get_title().startswith("704 tiles visited")


@pytest.mark.parametrize("kwargs", [
    {},
    {"causal": True},
    {"n": 1024, "d": 32, "sram_kib": 16},
    {"n": 1024, "d": 128, "sram_kib": 64, "causal": True},
    {"n": 512, "block_q": 32, "block_k": 128, "causal": True},
    {"n": 512, "block_q": 128, "block_k": 16, "causal": True},
])
def test_draw_tiling_image_follows_schedule(kwargs):
    n, d = kwargs.get("n", 4096), kwargs.get("d", 64)
    auto_q, auto_k = flash_blocks(kwargs.get("sram_kib", 192) * 1024 // 2, d)
    block_q, block_k = kwargs.get("block_q", auto_q), kwargs.get("block_k", auto_k)
    causal = kwargs.get("causal", False)
    order = image_of(tiling.draw_tiling(**kwargs))
    mask = tile_mask(n, n, block_q, block_k, causal)
    assert order.shape == mask.shape
    np.testing.assert_array_equal(~np.isnan(order), mask)
    schedule = tile_schedule(n, n, block_q, block_k, causal)
    assert np.count_nonzero(~np.isnan(order)) == len(schedule)
    for visit, (i, j) in enumerate(schedule):
        assert order[i, j] == visit


def test_draw_tiling_causal_is_lower_triangular():
    order = image_of(tiling.draw_tiling(n=1024, d=64, block_q=64, block_k=64, causal=True))
    assert order.shape == (16, 16)
    np.testing.assert_array_equal(~np.isnan(order), np.tril(np.ones((16, 16), dtype=bool)))
    fig = tiling.draw_tiling(n=1024, d=64, block_q=64, block_k=64, causal=True)
    assert fig.axes[0].get_title() == "136 tiles visited (causal)"


@pytest.mark.parametrize("n, d, sram_kib, block_q, block_k, causal", [
    (4096, 64, 192, None, None, False),
    (4096, 64, 192, None, None, True),
    (16384, 128, 64, None, None, False),
    (1024, 32, 16, 32, 256, True),
])
def test_draw_tiling_bars(n, d, sram_kib, block_q, block_k, causal):
    fig = tiling.draw_tiling(n, d, sram_kib, block_q, block_k, causal)
    auto_q, auto_k = flash_blocks(sram_kib * 1024 // 2, d)
    bq, bk = block_q or auto_q, block_k or auto_k
    right = fig.axes[1]
    heights = [patch.get_height() for patch in right.patches]
    extra_std, extra_flash = flash.extra_memory(n, d, bq, bk)
    assert heights == pytest.approx([standard_traffic(n, d) * 2 / MIB, extra_std / MIB,
                                     flash_traffic(n, d, bq, bk, causal) * 2 / MIB, extra_flash / MIB], rel=1e-12)
    assert right.get_yscale() == "log" and "MiB" in right.get_ylabel()
    assert f"B_r={bq}, B_c={bk}" in right.get_title()


def test_every_bar_fits_the_fixed_scale():
    low, high = tiling.MIB_RANGE
    sizes = []
    for n in tiling.LENGTHS:
        for d in (32, 64, 128):
            for block_q, block_k in {flash_blocks(kib * 1024 // 2, d) for kib in tiling.SRAM_KIB} | {(16, 16), (256, 512)}:
                sizes += [standard_traffic(n, d) * 2, flash_traffic(n, d, block_q, block_k), *flash.extra_memory(n, d, block_q, block_k)]
    assert low < min(sizes) / MIB and max(sizes) / MIB * 10 < high  # a decade above the tallest: its ratio and the legend


def test_tiling_view_in_place_draws_what_a_fresh_figure_draws():
    view = tiling.TilingView()
    view.freeze()
    for kwargs in ({}, {"n": 16384, "causal": True}, {"n": 256, "d": 128, "sram_kib": 16}, {"block_q": 16, "block_k": 512}, {}):
        view.move(**kwargs)
        fresh = tiling.draw_tiling(**kwargs)
        assert differing_pixels(view.fig, fresh) == 0, kwargs
        plt.close(fresh)


def test_tiling_panel_builds_and_redraws_once(shown):
    box = tiling.tiling_panel()
    (left, right), _ = box.children[0].children, box.children[1]
    n, d, sram = left.children
    block_q, block_k, causal = right.children
    assert len(shown) == 1 and shown[0].data.startswith(b"\x89PNG")
    for widget, value in ((n, 1024), (d, 128), (sram, 64), (block_q, 32), (block_k, 512), (causal, True)):
        count = len(shown)
        widget.value = value
        assert len(shown) == count + 1
    assert not plt.get_fignums()


def test_tiling_blocks_hold_at_most_the_sequence_and_name_an_sram_they_overflow():
    fig = tiling.draw_tiling(n=256, d=32, sram_kib=256)  # Algorithm 1 would take B_c = 1,024
    assert "B_r=32, B_c=256" in fig.axes[1].get_title() and "1 of 256 rows" in fig.axes[0].get_xlabel()
    fig = tiling.draw_tiling(n=16384, d=128, sram_kib=16, block_q=256, block_k=512)
    need = (256 * 128 + 2 * 512 * 128 + 256 * 512) * 2 // 1024
    assert fig.axes[1].get_title().endswith(f"need {need} KiB > SRAM")
    assert "SRAM" not in tiling.draw_tiling(n=16384, d=128, sram_kib=16).axes[1].get_title().split("\n")[1]
