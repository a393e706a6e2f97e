"""The lesson 06 panel: policy and budget -> which positions the cache holds over time, its
memory ceiling, and the measured quality against the budget.

Everything it draws comes from ``results/eviction_quality.json`` (written by
``scripts/eviction_quality.py``), so a slider move only redraws.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import ipywidgets as widgets
import matplotlib.pyplot as plt
import numpy as np

from helpers.panel_output import show_figure

RESULTS = Path(__file__).resolve().parents[1] / "results" / "eviction_quality.json"
PANEL_POLICIES = ("window", "sinks", "heavy", "merge", "int8_old")
PANEL_BUDGETS = (16, 32, 64)


@lru_cache(maxsize=2)
def load_results(path: Path = RESULTS) -> dict:
    """The measurements of scripts/eviction_quality.py."""
    if not Path(path).exists():
        raise FileNotFoundError(f"{path} is missing: run scripts/eviction_quality.py")
    return json.loads(Path(path).read_text())


def history(results: dict, policy: str, budget: int) -> np.ndarray:
    """(steps, positions) int array: 0 evicted or unseen, 1 held, 2 held in int8."""
    key = f"{policy} {budget}"
    if key not in results["kept_history_128"]:
        raise ValueError(f"no recorded history for policy {policy!r} with budget {budget}; "
                         f"recorded: {', '.join(results['kept_history_128'])}")
    return np.array([[int(c) for c in row] for row in results["kept_history_128"][key]])


def draw_eviction(policy: str = "sinks", budget: int = 32, results: dict | None = None):
    """Left: kept positions step by step. Right: loss against budget, this policy highlighted."""
    results = results or load_results()
    kept = history(results, policy, budget)
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8), dpi=80, gridspec_kw={"width_ratios": [1, 1.2]})
    a.imshow(kept, cmap=plt.matplotlib.colors.ListedColormap(["white", "tab:blue", "tab:orange"]), vmin=0, vmax=2,
             aspect="auto", interpolation="nearest")
    a.set_xlabel("position in the sequence")
    a.set_ylabel("decode step")
    held = int((kept[-1] > 0).sum())
    a.set_title(f"{policy}, budget {budget}: {held} positions held at the end", y=1.01, fontsize=10)

    rows = results["results"]
    full = next(r for r in rows if r["policy"] == "full")
    for name in PANEL_POLICIES:  # "positions compacted" is off this scale; the lesson's table has it
        points = sorted((r["budget"], r["loss"]) for r in rows if r["policy"] == name)
        style = dict(lw=2.5, marker="o") if name == policy else dict(lw=1, alpha=0.5, marker=".")
        b.plot(*zip(*points), label=name, **style)
    b.axhline(full["loss"], color="black", ls="--", label=f"full cache ({full['loss']:.3f})")
    b.set_xscale("log", base=2)
    budgets = sorted({r["budget"] for r in rows if r["policy"] != "full"})
    b.set_xticks(budgets, [str(x) for x in budgets])
    b.minorticks_off()
    b.set_xlabel(f"budget (tokens; sequences of {results['length']})")
    b.set_ylabel("held-out loss (nats per byte)")
    per_token = next(r for r in rows if r["policy"] == "full")["peak_bytes"] / (results["length"] - 1)
    b.set_title(f"memory ceiling at budget {budget}: {budget * per_token / 1024:.0f} KiB", y=1.01, fontsize=10)
    b.legend(fontsize=7, loc="upper right")
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.14, top=0.9, wspace=0.25)
    return fig


def eviction_panel() -> widgets.VBox:
    results = load_results()
    policy = widgets.ToggleButtons(options=PANEL_POLICIES, value="sinks", description="policy")
    budget = widgets.SelectionSlider(options=PANEL_BUDGETS, value=32, description="budget")
    out = widgets.interactive_output(lambda policy, budget: show_figure(draw_eviction(policy, budget, results)),
                                     {"policy": policy, "budget": budget})
    return widgets.VBox([policy, budget, out])
