"""The lesson 02 panel: byte counts of each layout, the figure, and the widget wiring."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest
from conftest import differing_pixels

from helpers.kv_cache_size import layout_bytes_per_token
from helpers.kv_quant import error_table, measured_errors
from helpers.panels import cache_shrink as panel
from helpers.panels import output as panel_output


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


@pytest.mark.parametrize("layout, group, storage, expected", [
    ("MHA", 4, "bf16", 524_288),  # the 7B example of lesson 01
    ("GQA", 4, "bf16", 131_072),
    ("GQA", 4, "e4m3", 65_536),  # GQA 4x and 8 bits: 8x
    ("GQA", 16, "int8", 16_384),
    ("MQA", 4, "bf16", 16_384),
    ("MLA", 4, "bf16", 32 * 576 * 2),
    ("MLA", 4, "e5m2", 32 * 576),
])
def test_layout_bytes_per_token(layout, group, storage, expected):
    assert layout_bytes_per_token(layout, group, storage) == expected


@pytest.mark.parametrize("args, message", [
    (("GQA", 3, "bf16"), "group must divide"),
    (("GQA", 0, "bf16"), "group must divide"),
    (("SWA", 4, "bf16"), "layout must be one of"),
    (("MHA", 4, "fp4"), "dtype must be one of .*e4m3, e5m2; got 'fp4'"),
])
def test_layout_bytes_per_token_rejects_bad_input(args, message):
    with pytest.raises(ValueError, match=message):
        layout_bytes_per_token(*args)


def test_measured_errors_come_from_the_error_table():
    errors = measured_errors("int8", "channel")
    row = next(r for r in error_table() if (r["which"], r["fmt"], r["scaling"]) == ("keys", "int8", "channel"))
    assert errors["keys"] == row
    assert set(measured_errors("bf16", "token")) == {"keys", "values"}  # bf16 ignores the scale
    with pytest.raises(ValueError, match="no measurement"):
        measured_errors("int8", "per-head")


def test_figure_shows_cache_sizes_and_errors():
    fig = panel.draw_cache_shrink("GQA", 4, "e4m3", "tensor", 131_072)
    left, right = fig.axes
    widths = [patch.get_width() for patch in left.patches]
    assert widths == pytest.approx([64.0, 16.0, 8.0])  # GiB at 131,072 tokens
    assert any("8x smaller" in t.get_text() for t in left.texts)
    assert "65,536 bytes per token" in left.get_title()
    heights = [patch.get_height() for patch in right.patches]
    errors = measured_errors("e4m3", "tensor")
    assert heights == pytest.approx([100 * errors["keys"]["output"], 100 * errors["values"]["output"]])
    assert right.get_yscale() == "log" and "%" in right.get_ylabel()


def test_panel_widgets_enable_and_redraw(monkeypatch):
    drawn, figures = [], []
    real_move = panel.CacheShrinkView.move
    monkeypatch.setattr(panel.CacheShrinkView, "move", lambda view, **choices: drawn.append(choices) or real_move(view, **choices))
    monkeypatch.setattr(panel, "show_figure", figures.append)
    box = panel.cache_shrink_panel()
    layout = box.children[0]
    (group, context), (storage, scaling) = (w.children for w in box.children[1].children)
    assert drawn[-1] == {"layout": "GQA", "group": 4, "storage": "e4m3", "scaling": "tensor", "context": 131072}
    layout.value = "MLA"
    assert group.disabled and drawn[-1]["layout"] == "MLA"
    assert figures[-1].axes[0].get_title().startswith("MLA in e4m3")
    storage.value = "bf16"
    assert scaling.disabled
    count = len(drawn)
    context.value = 4096
    assert len(drawn) == len(figures) == count + 1 and drawn[-1]["context"] == 4096
    assert len({id(fig) for fig in figures}) == 1  # one figure, updated in place


@pytest.mark.parametrize("choices", [("GQA", 4, "e4m3", "tensor", 131_072), ("MLA", 4, "int8", "channel", 4096),
                                     ("MHA", 4, "bf16", "tensor", 1_048_576), ("GQA", 16, "e5m2", "uncalibrated", 131_072)])
def test_the_view_in_place_draws_what_a_fresh_figure_draws(choices):
    view = panel.CacheShrinkView()
    view.freeze()
    for before in (("MQA", 2, "int8", "token", 8192), ("GQA", 8, "bf16", "tensor", choices[-1])):  # other states first
        view.move(*before)
        view.fig.canvas.draw()
    view.move(*choices)
    fresh = panel.draw_cache_shrink(*choices)
    assert differing_pixels(view.fig, fresh) == 0


def test_show_figure_renders_one_png_and_closes(monkeypatch):

    shown = []
    monkeypatch.setattr(panel_output, "display", shown.append)
    fig = panel.draw_cache_shrink()
    panel_output.show_figure(fig)
    assert len(shown) == 1 and shown[0].data.startswith(b"\x89PNG")
    assert not plt.fignum_exists(fig.number)
