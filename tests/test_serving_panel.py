"""The lesson 05 panel: where the chip's memory goes, the figure, and the widget wiring."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest
from conftest import differing_pixels

from helpers.models import get_model
from helpers.panels import output as panel_output
from helpers.panels import serving as panel
from helpers.roofline import decode_ceiling, get_chip, max_batch, memory_split
from helpers.units import GB

LLAMA3_8B = get_model("Llama-3-8B")
H100 = get_chip("H100 SXM")


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


@pytest.mark.parametrize("model_name, chip_name, batch, context, cache, block", [
    ("Llama-3-8B", "H100 SXM", 16, 8192, 2, 16),
    ("Llama-3-8B", "H100 SXM", 256, 131072, 2, 16),  # far too big: free is negative
    ("Llama-2-7B", "A100 40GB SXM", 3, 1000, 1, 128),
    ("Llama-3-70B", "A100 40GB SXM", 1, 1024, 2, 16),  # the weights alone do not fit
    ("Qwen2.5-7B", "laptop, DDR5-5600 x2", 7, 4097, 2, 256),
])
def test_memory_split_adds_up_to_the_chip(model_name, chip_name, batch, context, cache, block):
    model, chip = get_model(model_name), get_chip(chip_name)
    split = memory_split(model, chip, batch, context, cache, block)
    assert list(split) == ["weights", "cache (tokens)", "cache (block tails)", "free"]
    assert sum(split.values()) == chip.memory_bytes
    assert split["weights"] == model.weight_bytes(2)
    assert split["cache (tokens)"] == batch * context * model.kv_bytes_per_token(cache)
    assert split["cache (block tails)"] >= 0


def test_free_is_negative_when_it_does_not_fit():
    split = memory_split(LLAMA3_8B, H100, 256, 131072)
    assert split["cache (tokens)"] == 256 * 131072 * 131_072
    assert split["free"] == 80 * GB - 16_060_522_496 - 256 * 131072 * 131_072 < 0


def test_block_tails_by_hand():
    per_token = LLAMA3_8B.kv_bytes_per_token()
    # 1,000 tokens in blocks of 16 hold 63 blocks = 1,008 slots: 8 empty slots per sequence
    split = memory_split(LLAMA3_8B, H100, 5, 1000, 2, 16)
    assert split["cache (block tails)"] == 5 * 8 * per_token
    # blocks of 128: 1,024 slots, 24 empty; an 8-bit cache halves them
    assert memory_split(LLAMA3_8B, H100, 5, 1000, 1, 128)["cache (block tails)"] == 5 * 24 * per_token // 2
    # whole blocks, or blocks of one token: no tail
    assert memory_split(LLAMA3_8B, H100, 5, 8192, 2, 16)["cache (block tails)"] == 0
    assert memory_split(LLAMA3_8B, H100, 5, 1000, 2, 1)["cache (block tails)"] == 0


def red_marker(ax):
    (marker,) = [line for line in ax.lines if line.get_color() == "tab:red"]
    return marker


@pytest.mark.parametrize("batch", [1, 16, 128])
def test_red_marker_sits_on_the_decode_ceiling(batch):
    fig = panel.draw_serving("Llama-3-8B", "H100 SXM", batch, 8192, 2, 16)
    left = fig.axes[0]
    marker = red_marker(left)
    assert list(marker.get_xdata()) == [batch]
    assert marker.get_ydata()[0] == pytest.approx(decode_ceiling(LLAMA3_8B, get_chip("H100 SXM"), batch, 8192))
    (curve,) = [line for line in left.lines if line.get_color() == "tab:blue"]
    assert list(curve.get_xdata()) == panel.BATCHES
    assert curve.get_ydata()[panel.BATCHES.index(batch)] == pytest.approx(marker.get_ydata()[0])


def test_shaded_region_starts_at_max_batch():
    fig = panel.draw_serving("Llama-3-8B", "H100 SXM", 16, 8192, 2, 16)
    fits = max_batch(LLAMA3_8B, get_chip("H100 SXM"), 8192, 2, 2, 16)
    assert fits == 59
    (span,) = fig.axes[0].patches
    assert span.get_x() == pytest.approx(fits)
    assert span.get_visible() and f"max batch {fits}" in fig.axes[0].get_title()


def test_shaded_region_follows_block_size_and_cache_format():
    # 4,000 tokens: blocks of 256 hold 4,096 slots (44 fit), blocks of 1 hold 4,000 (45 fit);
    # an 8-bit cache fits twice as many
    chip = get_chip("A100 40GB SXM")
    for cache, block, expected in [(2, 256, 44), (1, 256, 89), (2, 1, 45)]:
        fits = max_batch(LLAMA3_8B, chip, 4000, 2, cache, block)
        assert fits == expected
        fig = panel.draw_serving("Llama-3-8B", "A100 40GB SXM", 16, 4000, cache, block)
        (span,) = fig.axes[0].patches
        assert span.get_x() == pytest.approx(fits)


def test_no_shaded_region_when_every_batch_fits():
    assert max_batch(LLAMA3_8B, get_chip("H200 SXM"), 1024, 2, 2, 16) >= 256
    fig = panel.draw_serving("Llama-3-8B", "H200 SXM", 16, 1024, 2, 16)
    (span,) = fig.axes[0].patches
    assert not span.get_visible() and "every batch fits" in fig.axes[0].get_title()


def test_shaded_region_covers_everything_when_the_weights_do_not_fit():
    fig = panel.draw_serving("Llama-3-70B", "A100 40GB SXM", 1, 1024, 2, 16)
    (span,) = fig.axes[0].patches
    assert span.get_x() == pytest.approx(0.7)  # the left edge of the axis: max batch 0
    assert "does NOT fit" in fig.axes[1].get_title()
    short = -memory_split(get_model("Llama-3-70B"), get_chip("A100 40GB SXM"), 1, 1024, 2, 16)["free"] / GB
    assert f"free: none, {short:,.1f} GB short" in [t.get_text() for t in fig.axes[1].texts]


def test_memory_bars_stack_to_the_chip_when_it_fits():
    fig = panel.draw_serving("Llama-3-8B", "H100 SXM", 16, 1000, 2, 16)
    right = fig.axes[1]
    split = memory_split(LLAMA3_8B, H100, 16, 1000, 2, 16)
    heights = [patch.get_height() for patch in right.patches[:4]]  # the stack (the key's marks follow)
    assert heights == pytest.approx([size / GB for size in split.values()])
    assert sum(heights) == pytest.approx(80)
    assert "does NOT fit" not in right.get_title()
    key = [t.get_text() for t in right.texts][:5]  # the key beside the bar, then the note under the axes
    assert key == ["the chip: 80 GB"] + [f"{part}: {size / GB:,.1f} GB" for part, size in split.items()]


def test_panel_builds_and_one_change_redraws_once(monkeypatch):
    shown, figures = [], []
    monkeypatch.setattr(panel_output, "display", shown.append)
    real_show = panel.show_figure
    monkeypatch.setattr(panel, "show_figure", lambda fig: figures.append(fig) or real_show(fig))
    box = panel.serving_panel()
    (model, chip, cache), (batch, context, block) = (v.children for v in box.children[0].children)
    assert len(shown) == 1 and shown[0].data.startswith(b"\x89PNG")
    left, right = figures[-1].axes
    assert left.get_title().startswith("Llama-3-8B on H100 SXM, 8,192 tokens each\nbatch 16:")
    batch.value = 64
    assert len(shown) == 2 and "batch 64:" in left.get_title()
    chip.value = "H200 SXM"
    assert len(shown) == 3 and "on H200 SXM" in left.get_title()
    assert len({id(fig) for fig in figures}) == 1  # one figure, updated in place
    assert model.options and all(get_model(m).max_context >= 4096 for m in model.options)
    assert "GPT-2 small" not in model.options
    assert not plt.get_fignums()  # shown, then closed out of pyplot: nothing piles up


@pytest.mark.parametrize("choices", [
    ("Llama-3-8B", "H100 SXM", 16, 8192, 2, 16), ("Llama-3-70B", "A100 40GB SXM", 1, 1024, 2, 16),
    ("Llama-3-8B", "H200 SXM", 256, 1024, 1, 1), ("Llama-3-8B", "A100 40GB SXM", 64, 131072, 2, 256),
    ("Llama-3-8B", "H100 SXM", 16, 65536, 2, 16)])
def test_the_view_in_place_draws_what_a_fresh_figure_draws(choices):
    view = panel.ServingView()
    view.freeze()
    for before in (("Llama-3-8B", "H200 SXM", 2, 65536, 1, 8), choices[:2] + (128, 2048, 2, 64),
                   choices[:3] + (16384,) + choices[4:]):  # other states first, one beyond the model's context
        view.move(*before)
        view.fig.canvas.draw()
    view.move(*choices)
    fresh = panel.draw_serving(*choices)
    assert differing_pixels(view.fig, fresh) == 0


def test_a_context_beyond_the_model_is_named_instead_of_reserving():
    note = panel.draw_serving("Llama-3-8B", "H100 SXM", 16, 131072, 2, 16).axes[1].texts[-1].get_text()
    assert note == "this context is beyond Llama-3-8B's 8,192 tokens"
    note = panel.draw_serving("Llama-3-8B", "H100 SXM", 16, 8192, 2, 16).axes[1].texts[-1].get_text()
    assert note == f"reserving 8,192 per sequence: max batch {max_batch(LLAMA3_8B, H100, 8192, 2, 2)}"
