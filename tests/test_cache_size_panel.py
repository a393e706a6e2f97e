"""Tests for helpers.cache_size_panel: the lesson 01 plot and its widget panel (no browser)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg", force=True)

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from conftest import differing_pixels  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from helpers.models import MODELS, get_model, reshaped  # noqa: E402
from helpers.panels import cache_size as panel_module  # noqa: E402
from helpers.panels.cache_size import cache_size_panel, draw_cache_vs_tokens  # noqa: E402
from helpers.units import gib  # noqa: E402


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def _marker_lines(ax):
    return [line for line in ax.lines if line.get_marker() == "o" and line.get_visible()]


def _texts(ax):
    return [t.get_text() for t in ax.texts if t.get_visible()]


# ---- draw_cache_vs_tokens ----------------------------------------------------------------


def test_draw_returns_labelled_figure():
    fig = draw_cache_vs_tokens(get_model("Llama-2-7B"))
    assert isinstance(fig, Figure)
    (ax,) = fig.axes
    assert ax.get_title().split("\n")[0] == "Llama-2-7B (published shape, MHA): cache vs weights"
    assert "GiB" in ax.get_ylabel()
    assert "tokens" in ax.get_xlabel() and "thousands" in ax.get_xlabel()
    legend = ax.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == ["KV cache", "weights (bf16)", "the model's max context"]
    assert ax.get_title().split("\n")[1] == "cache bf16, batch 1: 512 KiB/token/seq; weights 12.6 GiB; max context 4,096"


def test_draw_cache_line_and_weights_line_values():
    model = get_model("Llama-2-7B")
    fig = draw_cache_vs_tokens(model, "bf16", batch=1, context=131_072)
    ax = fig.axes[0]
    cache_line = ax.lines[0]
    assert list(cache_line.get_xdata()) == [0, 131.072]
    assert list(cache_line.get_ydata()) == pytest.approx([0, 64.0])  # 64 GiB at 128k tokens
    weights_line = ax.lines[1]
    assert list(weights_line.get_ydata()) == pytest.approx([gib(model.weight_bytes(2))] * 2)
    assert ax.get_xlim() == pytest.approx((0, 131.072))


def test_draw_marks_crossover_within_context():
    model = get_model("Llama-2-7B")
    fig = draw_cache_vs_tokens(model, "bf16", batch=1, context=131_072)
    ax = fig.axes[0]
    (marker,) = _marker_lines(ax)
    cross = model.crossover_tokens(1, 2)
    assert cross == 25_706
    assert list(marker.get_xdata()) == pytest.approx([25.706])
    assert list(marker.get_ydata()) == pytest.approx([gib(25_706 * 524_288)])
    assert any("from 25,706 tokens" in t for t in _texts(ax))


def test_draw_marker_follows_batch_and_dtype():
    model = get_model("Llama-3-8B")
    fig = draw_cache_vs_tokens(model, "fp8", batch=16, context=65_536)
    ax = fig.axes[0]
    (marker,) = _marker_lines(ax)
    cross = model.crossover_tokens(16, 1)
    assert cross <= 65_536
    assert marker.get_xdata()[0] == pytest.approx(cross / 1000)
    assert marker.get_ydata()[0] == pytest.approx(gib(model.cache_bytes(cross, 16, 1)))
    assert "cache fp8, batch 16: 64 KiB/token/seq" in ax.get_title()


def test_draw_windowed_model_bends_at_window_and_marks_crossover():
    model = get_model("Gemma-2-9B")
    fig = draw_cache_vs_tokens(model, "bf16", 1, 131_072)
    ax = fig.axes[0]
    cache_line = ax.lines[0]
    assert list(cache_line.get_xdata()) == [0, 4.096, 131.072]
    assert list(cache_line.get_ydata()) == pytest.approx([gib(model.cache_bytes(t)) for t in (0, 4096, 131_072)])
    (marker,) = _marker_lines(ax)
    assert marker.get_xdata()[0] == pytest.approx(103.346)


def test_draw_crossover_beyond_context_has_no_marker():
    fig = draw_cache_vs_tokens(get_model("Llama-2-7B"), "bf16", 1, 16_384)
    ax = fig.axes[0]
    assert _marker_lines(ax) == []
    assert "cache passes weights: only at 25,706 tokens" in _texts(ax)


def test_draw_mistral_never_crosses():
    fig = draw_cache_vs_tokens(get_model("Mistral-7B-v0.1"), "bf16", 1, 131_072)
    ax = fig.axes[0]
    assert _marker_lines(ax) == []
    texts = _texts(ax)
    assert "cache passes weights: never (windowed cache)" in texts
    cache_line = ax.lines[0]
    assert list(cache_line.get_xdata()) == [0, 4.096, 131.072]
    assert list(cache_line.get_ydata()) == pytest.approx([0, 0.5, 0.5])  # 4,096 x 128 KiB, then flat


def test_draw_modified_shape_title():
    fig = draw_cache_vs_tokens(reshaped("Llama-2-7B", 32, 8, 128))
    assert fig.axes[0].get_title().split("\n")[0] == "Llama-2-7B (modified shape, GQA): cache vs weights"


def test_draw_rejects_unknown_dtype():
    with pytest.raises(ValueError, match="dtype must be one of"):
        draw_cache_vs_tokens(get_model("Llama-2-7B"), "float64")


# ---- reshaped ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(MODELS))
def test_reshaped_with_published_values_is_the_registry_entry(name):
    m = MODELS[name]
    assert reshaped(name, m.layers, m.kv_heads, m.head_dim) == m


@pytest.mark.parametrize("layers", [2, 4, 10, 42, 84])
def test_reshaped_gemma_keeps_half_the_layers_windowed(layers):
    m = reshaped("Gemma-2-9B", layers, 8, 256)
    assert m.layers == layers
    assert m.windowed_layers == layers // 2
    assert m.window == 4096


@pytest.mark.parametrize("layers", [1, 7, 32, 100])
def test_reshaped_mistral_keeps_every_layer_windowed(layers):
    m = reshaped("Mistral-7B-v0.1", layers, 8, 128)
    assert m.windowed_layers == layers and m.window == 4096
    assert m.crossover_tokens() is None


def test_reshaped_changes_cache_shape():
    m = reshaped("Llama-2-7B", 16, 8, 64)
    assert (m.layers, m.kv_heads, m.head_dim) == (16, 8, 64)
    assert m.kv_bytes_per_token(2) == 2 * 16 * 8 * 64 * 2


def test_reshaped_mla_keeps_latent_and_dense_layers():
    m = reshaped("DeepSeek-V3", 2, 128, 128)
    assert m.attention == "MLA"
    assert m.kv_bytes_per_token(2) == 2 * 576 * 2
    assert m.first_dense_layers == 2


@pytest.mark.parametrize("bad", ["Llama-9", "", "gpt2"])
def test_reshaped_rejects_unknown_model(bad):
    with pytest.raises(ValueError, match="unknown model"):
        reshaped(bad, 32, 8, 128)


# ---- the panel ---------------------------------------------------------------------------


def _widgets(panel):
    model, layers, kv_heads, head_dim = panel.children[0].children[0].children
    dtype, batch, context = panel.children[0].children[1].children
    return dict(model=model, layers=layers, kv_heads=kv_heads, head_dim=head_dim,
                dtype=dtype, batch=batch, context=context)


@pytest.fixture
def redraws(monkeypatch):
    """Record what the panel displays and the figure it shows, one entry per redraw."""
    record = {"displayed": [], "figures": []}
    show = panel_module.show_figure

    def recording_show(fig):
        record["figures"].append(fig)
        show(fig)

    monkeypatch.setattr(panel_module, "show_figure", recording_show)
    monkeypatch.setattr("helpers.panels.output.display", record["displayed"].append)
    return record


def _is_rendered_plot(obj) -> bool:
    """A matplotlib Figure, or an IPython image holding the rendered PNG."""
    if isinstance(obj, Figure):
        return True
    data = getattr(obj, "data", None)
    return isinstance(data, bytes) and data.startswith(b"\x89PNG")


def test_panel_builds_with_model_values(redraws):
    panel = cache_size_panel()
    w = _widgets(panel)
    assert w["model"].value == "Llama-2-7B"
    assert list(w["model"].options) == list(MODELS)
    assert (w["layers"].value, w["kv_heads"].value, w["head_dim"].value) == (32, 32, 128)
    assert (w["dtype"].value, w["batch"].value, w["context"].value) == ("bf16", 1, 131_072)
    assert not w["kv_heads"].disabled and not w["head_dim"].disabled
    # The first drawing is shown at once.
    assert len(redraws["displayed"]) == len(redraws["figures"]) == 1
    assert _is_rendered_plot(redraws["displayed"][0])


def test_panel_starts_on_requested_model(redraws):
    w = _widgets(cache_size_panel("falcon-7b"))
    assert w["model"].value == "Falcon-7B"
    assert (w["layers"].value, w["kv_heads"].value, w["head_dim"].value) == (32, 1, 64)
    assert list(w["kv_heads"].options) == [1, 71]
    assert redraws["figures"][-1].axes[0].get_title().split("\n")[0] == "Falcon-7B (published shape, MQA): cache vs weights"


def test_panel_rejects_unknown_model():
    with pytest.raises(ValueError, match="unknown model"):
        cache_size_panel("no-such-model")


@pytest.mark.parametrize("name", sorted(MODELS))
def test_dropdown_sets_shape_sliders(redraws, name):
    w = _widgets(cache_size_panel())
    w["model"].value = name
    m = MODELS[name]
    assert (w["layers"].value, w["kv_heads"].value, w["head_dim"].value) == (m.layers, m.kv_heads, m.head_dim)
    is_mla = m.attention == "MLA"
    assert w["kv_heads"].disabled is is_mla
    assert w["head_dim"].disabled is is_mla


def test_dropdown_reenables_sliders_after_mla(redraws):
    w = _widgets(cache_size_panel())
    w["model"].value = "DeepSeek-V2"
    assert w["kv_heads"].disabled and w["head_dim"].disabled
    w["model"].value = "Qwen2.5-7B"
    assert not w["kv_heads"].disabled and not w["head_dim"].disabled
    assert (w["layers"].value, w["kv_heads"].value, w["head_dim"].value) == (28, 4, 128)


@pytest.mark.parametrize(
    "control, value",
    [("layers", 10), ("kv_heads", 8), ("head_dim", 64), ("dtype", "fp8"), ("batch", 8), ("context", 8192),
     ("model", "DeepSeek-V3"), ("model", "Gemma-2-9B"), ("model", "Llama-3-8B")],
)
def test_one_redraw_per_change(redraws, control, value):
    w = _widgets(cache_size_panel())
    assert len(redraws["displayed"]) == 1
    w[control].value = value
    assert len(redraws["displayed"]) == 2
    assert len(redraws["figures"]) == 2
    assert _is_rendered_plot(redraws["displayed"][-1])


def _shown_items(out: str) -> list[str]:
    """What display() printed outside IPython, without clear_output's terminal escapes."""
    text = out.replace("\x1b[2K", "")
    return [part for part in text.replace("\r", "\n").split("\n") if part.strip()]


def test_panel_output_prints_one_item_per_redraw(capsys):
    # Outside IPython, display() prints the object's repr (a Figure or an Image) to stdout.
    w = _widgets(cache_size_panel())
    assert len(_shown_items(capsys.readouterr().out)) == 1
    w["batch"].value = 2
    (item,) = _shown_items(capsys.readouterr().out)
    assert "Figure(" in item or "Image" in item
    w["model"].value = "Gemma-2-9B"
    assert len(_shown_items(capsys.readouterr().out)) == 1


def test_each_change_redraws_with_current_values(redraws):
    figures = redraws["figures"]
    w = _widgets(cache_size_panel())
    assert len(figures) == 1
    assert figures[-1].axes[0].get_title().split("\n")[0] == "Llama-2-7B (published shape, MHA): cache vs weights"

    w["kv_heads"].value = 8
    assert len(figures) == 2
    assert figures[-1].axes[0].get_title().split("\n")[0] == "Llama-2-7B (modified shape, GQA): cache vs weights"

    # The model change draws once, with the new model's published shape (sliders moved first).
    w["model"].value = "DeepSeek-V3"
    assert len(figures) == 3
    assert figures[-1].axes[0].get_title().split("\n")[0] == "DeepSeek-V3 (published shape, MLA): cache vs weights"

    w["batch"].value = 4
    w["dtype"].value = "fp32"
    w["context"].value = 1_048_576
    assert len(figures) == 6
    ax = figures[-1].axes[0]
    assert "cache fp32, batch 4: 137.25 KiB/token/seq" in ax.get_title()
    assert ax.get_xlim() == pytest.approx((0, 1048.576))
    assert len(redraws["displayed"]) == 6
    assert len({id(fig) for fig in figures}) == 1  # one figure, updated in place


@pytest.mark.parametrize("model, dtype, batch, context", [
    ("Llama-2-7B", "bf16", 1, 131_072), ("Llama-3-8B", "fp8", 16, 65_536), ("Mistral-7B-v0.1", "bf16", 1, 131_072),
    ("Llama-2-7B", "bf16", 1, 16_384), ("Gemma-2-9B", "fp32", 128, 1_048_576), ("Llama-2-7B", "bf16", 4, 131_072)])
def test_the_view_in_place_draws_what_a_fresh_figure_draws(model, dtype, batch, context):
    view = panel_module.CacheSizeView()
    view.freeze()
    for before in (("DeepSeek-V3", "fp32", 64, 4096), ("Falcon-7B", "bf16", 2, context)):  # other states first
        view.move(get_model(before[0]), *before[1:])
        view.fig.canvas.draw()
    view.move(get_model(model), dtype, batch, context)
    fresh = draw_cache_vs_tokens(get_model(model), dtype, batch, context)
    assert differing_pixels(view.fig, fresh) == 0

def test_small_caches_get_decimal_labels():
    fig = draw_cache_vs_tokens(reshaped("Llama-2-7B", 32, 8, 128), "fp8", 32, 4096)
    fig.canvas.draw()
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert "2.5" in labels and "7.5" in labels, labels
