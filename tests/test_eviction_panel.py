"""The lesson 06 panel draws from the stored measurements; no model runs on a slider move."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest

from helpers import eviction_panel as panel

FAKE = {
    "length": 512,
    "results": [{"policy": "full", "budget": 512, "loss": 1.0, "agreement": 1.0, "peak_bytes": 511 * 2048,
                 "seconds_per_step": 0.001}]
    + [{"policy": p, "budget": b, "loss": 1.0 + 8 / b, "agreement": 1 - 4 / b, "peak_bytes": b * 2048,
        "seconds_per_step": 0.001}
       for p in panel.PANEL_POLICIES + ("window (positions compacted)",) for b in (32, 64, 128, 256)],
    "kept_history_128": {f"{p} {b}": ["1" * (t + 1) + "0" * (127 - t) if t < b else "0" * (t + 1 - b) + "1" * b + "0" * (127 - t)
                                      for t in range(127)]
                         for p in panel.PANEL_POLICIES for b in panel.PANEL_BUDGETS},
}


@pytest.fixture(autouse=True)
def _close():
    yield
    plt.close("all")


def test_history_decodes_the_recorded_strings():
    kept = panel.history(FAKE, "window", 16)
    assert kept.shape == (127, 128)
    assert kept[-1].sum() == 16 and kept[5].sum() == 6
    with pytest.raises(ValueError, match="no recorded history"):
        panel.history(FAKE, "window", 17)


def test_draw_highlights_the_policy_and_states_the_ceiling():
    fig = panel.draw_eviction("heavy", 32, FAKE)
    left, right = fig.axes
    assert "16 positions held" not in left.get_title() and "32 positions held" in left.get_title()
    bold = [line for line in right.lines if line.get_linewidth() == 2.5]
    assert len(bold) == 1 and bold[0].get_label() == "heavy"
    assert "memory ceiling at budget 32: 64 KiB" in right.get_title()


def test_missing_results_file_names_the_script(tmp_path):
    panel.load_results.cache_clear()
    with pytest.raises(FileNotFoundError, match="scripts/eviction_quality.py"):
        panel.load_results(tmp_path / "nothing.json")
    panel.load_results.cache_clear()
