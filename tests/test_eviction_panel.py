"""The lesson 06 panel draws from the stored measurements; no model runs on a slider move."""

import json

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pytest
from conftest import differing_pixels

from helpers import eviction_results as results
from helpers.panels import eviction as panel

N, HEADS = 256, 6
BUDGETS = results.BUDGETS


def _hex(held: set[int]) -> str:
    bits = "".join("1" if i in held else "0" for i in range(N))
    return "".join(f"{int(bits[i:i + 4], 2):x}" for i in range(0, N, 4))


FAKE = {
    "static": {"sinks": 4, "perplexity_mean": {"full": 10.0, **{f"{p}/{b}": 10 + 100 / b for p in results.EXACT
                                                                for b in BUDGETS}}},
    "chunked": {"quality": {
        "texts": [{"topic": "x", "tokens": N}], "int8_group": 32,
        "perplexity_mean": {f"{p}/{b}": 10 + 50 / b for p in results.POLICIES for b in BUDGETS},
        "peak_bytes": {"full": N * 100, **{f"{p}/{b}": b * 100 for p in results.POLICIES for b in BUDGETS}},
        "held_at_end_first_text": {"hex_bits": {f"heavy/{b}": [_hex({h, *range(N - 1 - b // 2, N - 1)}) for h in range(HEADS)]
                                                for b in BUDGETS}},
    }},
}


@pytest.fixture(autouse=True)
def _close():
    yield
    plt.close("all")


def test_held_maps():
    heavy = results.held_map(FAKE, "heavy", 64)
    assert heavy.shape == (HEADS, N)
    assert heavy[3, 3] == 1 and heavy[3, 2] == 0 and heavy[:, -33:-1].all() and not heavy[:, -1].any()
    window = results.held_map(FAKE, "window", 64)
    assert np.flatnonzero(window[0]).tolist() == list(range(N - 1 - 64, N - 1))
    sinks = results.held_map(FAKE, "sinks", 64)
    assert np.flatnonzero(sinks[0]).tolist() == [0, 1, 2, 3] + list(range(N - 1 - 60, N - 1))
    int8 = results.held_map(FAKE, "int8_old", 64)
    assert (int8[0, :160] == 2).all() and (int8[0, 160:N - 1] == 1).all()  # (255 - 64) // 32 * 32 = 160 in int8
    with pytest.raises(ValueError, match="policy must be one of"):
        results.held_map(FAKE, "random", 64)


def test_draw_highlights_the_policy_and_states_the_share():
    fig = panel.draw_eviction("heavy", 128, FAKE)
    left, right = fig.axes
    assert "heavy, budget 128" in left.get_title()
    bold = [line for line in right.lines if line.get_linewidth() == 2.5]
    assert len(bold) == 1 and bold[0].get_label() == "heavy (chunked)"
    assert right.get_title() == "50% of the cache, perplexity 10.39"


def test_missing_results_file_names_the_script(tmp_path):
    results.load_results.cache_clear()
    with pytest.raises(FileNotFoundError, match="scripts/eviction_real.py"):
        results.load_results(tmp_path)
    (tmp_path / "eviction_real.json").write_text(json.dumps(FAKE["static"]))
    with pytest.raises(FileNotFoundError, match="scripts/eviction_chunked.py"):
        results.load_results(tmp_path)
    results.load_results.cache_clear()


def test_unknown_measurement_is_named():
    with pytest.raises(ValueError, match="no measurement for 'heavy/100'"):
        results.perplexity(FAKE, "heavy", 100)



def test_the_view_updates_in_place_as_a_fresh_figure_draws():
    view = panel.EvictionView(FAKE)
    view.freeze()
    for policy, budget in (("heavy", 128), ("window", 256), ("sinks", 512), ("heavy", 256)):
        view.move(policy, budget)
        fresh = panel.draw_eviction(policy, budget, FAKE)
        assert differing_pixels(view.fig, fresh) == 0, f"{policy}/{budget}"
        plt.close(fresh)
    with pytest.raises(ValueError, match="budget one of"):
        view.move("heavy", 100)


def test_the_panel_draws_one_figure_and_moves_it(monkeypatch):
    from helpers.panels import output as panel_output

    shown, figures = [], []
    monkeypatch.setattr(panel_output, "display", shown.append)
    monkeypatch.setattr(panel, "show_figure", lambda fig: figures.append(fig) or panel_output.show_figure(fig))
    monkeypatch.setattr(panel, "load_results", lambda: FAKE)
    box = panel.eviction_panel()
    policy, budget = box.children[0], box.children[1]
    budget.value = 128
    policy.value = "window"
    assert len(shown) == 3 and len(set(map(id, figures))) == 1
    left, right = figures[-1].axes[:2]
    assert left.get_title() == "window, budget 128: held at the end"
    bold = [line for line in right.lines if line.get_linewidth() == 2.5]
    assert [line.get_label() for line in bold] == ["window"]


def test_the_image_keeps_a_single_held_position_in_view():
    held = np.zeros((2, 20), dtype=int)
    held[0, 0], held[1, 9], held[1, 10], held[1, 17] = 1, 2, 1, 1
    assert panel.pooled(held).tolist() == [[1, 0, 0], [0, 2, 1]]  # 8 positions a column, the most held
    fig = panel.draw_eviction("sinks", 64, FAKE)
    assert (fig.axes[0].images[0].get_array()[:, 0] == 1).all()  # the sinks, in every row
    left = fig.axes[0].images[0].get_extent()[0]
    assert fig.axes[0].get_xlim()[0] <= left - panel.POOL  # a column clear of the frame, which would cover it
