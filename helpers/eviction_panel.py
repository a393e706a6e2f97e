"""The lesson 06 panel: policy and budget -> which positions SmolLM2's cache holds in every layer
and K/V head at the end of a 2,048-token text, and the measured perplexity against the memory kept.

Everything it draws comes from ``results/eviction_real.json`` (scripts/eviction_real.py: the exact
window and sinks) and ``results/eviction_chunked.json`` (scripts/eviction_chunked.py: the policies
that need the cache step by step), so a slider move only redraws.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import ipywidgets as widgets
import matplotlib.pyplot as plt
import numpy as np

from helpers.eviction import EVICTING
from helpers.panel_output import show_figure

RESULTS = Path(__file__).resolve().parents[1] / "results"
PANEL_POLICIES = ("window", "sinks", "heavy", "heavy_shared", "merge", "int8_old")
PANEL_BUDGETS = (64, 128, 256, 512)
EXACT = ("window", "sinks")  # scored exactly in one pass; the others ran in chunks


@lru_cache(maxsize=2)
def load_results(directory: Path = RESULTS) -> dict:
    """{"static": scripts/eviction_real.py's results, "chunked": scripts/eviction_chunked.py's}."""
    found = {}
    for key, name, script in (("static", "eviction_real.json", "scripts/eviction_real.py"),
                              ("chunked", "eviction_chunked.json", "scripts/eviction_chunked.py")):
        path = Path(directory) / name
        if not path.exists():
            raise FileNotFoundError(f"{path} is missing: run python {script}")
        found[key] = json.loads(path.read_text())
    return found


def perplexity(results: dict, policy: str, budget: int | None = None) -> float:
    """Mean perplexity over the texts: exact for full, window and sinks, chunked for the others."""
    key = policy if budget is None else f"{policy}/{budget}"
    table = results["static"] if policy in EXACT + ("full",) else results["chunked"]["quality"]
    if key not in table["perplexity_mean"]:
        raise ValueError(f"no measurement for {key!r}; measured: {', '.join(table['perplexity_mean'])}")
    return table["perplexity_mean"][key]


def memory_share(results: dict, policy: str, budget: int | None = None) -> float:
    """The most cache a policy holds over a text, as a share of the full cache at the text's end:
    the budget for an evicting policy (what one-token-at-a-time decoding holds between steps),
    the measured peak for the others."""
    quality = results["chunked"]["quality"]
    n = quality["texts"][0]["tokens"]
    if policy in EVICTING:
        return budget / n
    key = policy if budget is None else f"{policy}/{budget}"
    return quality["peak_bytes"][key] / quality["peak_bytes"]["full"]


def held_map(results: dict, policy: str, budget: int) -> np.ndarray:
    """(layers x K/V heads, positions) ints for the first text once read: 0 not held, 1 held, 2 held in int8."""
    quality = results["chunked"]["quality"]
    n = quality["texts"][0]["tokens"]
    fed = n - 1  # every token but the last was fed to predict the next
    maps = quality["held_at_end_first_text"]["hex_bits"]
    if f"{policy}/{budget}" in maps:  # the policies that choose by the text: recorded
        hex_rows = maps[f"{policy}/{budget}"]
        bits = np.array([[int(c, 16) for c in row] for row in hex_rows], dtype=np.uint8)
        return np.unpackbits(bits[:, :, None], axis=2)[:, :, 4:].reshape(len(hex_rows), -1)[:, :n].astype(int)
    if policy not in PANEL_POLICIES or budget not in PANEL_BUDGETS:
        raise ValueError(f"policy must be one of {', '.join(PANEL_POLICIES)} and budget one of {PANEL_BUDGETS}; "
                         f"got {policy!r}, {budget!r}")
    heads = len(next(iter(maps.values())))
    held = np.zeros(n, dtype=int)
    if policy == "window":
        held[fed - budget: fed] = 1
    elif policy == "sinks":
        held[: results["static"]["sinks"]] = 1
        held[fed - (budget - results["static"]["sinks"]): fed] = 1
    elif policy == "int8_old":
        group = quality["int8_group"]
        held[:fed] = 1
        held[: (fed - budget) // group * group] = 2
    return np.broadcast_to(held, (heads, n))


def draw_eviction(policy: str = "heavy", budget: int = 256, results: dict | None = None):
    """Left: positions held per layer and head at the end of the first text. Right: perplexity
    against the memory kept, every policy, the chosen one in bold and its point ringed."""
    results = results or load_results()
    kept = held_map(results, policy, budget)
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8), dpi=80, gridspec_kw={"width_ratios": [1, 1.1]})
    a.imshow(kept, cmap=plt.matplotlib.colors.ListedColormap(["white", "tab:blue", "tab:orange"]), vmin=0, vmax=2,
             aspect="auto", interpolation="nearest")
    a.set_xlabel("position in the text")
    a.set_ylabel("layer x K/V head (layer 0 at the top)")
    a.set_title(f"{policy}, budget {budget}: held at the end", y=1.01, fontsize=10)

    for name in PANEL_POLICIES:
        x = [100 * memory_share(results, name, v) for v in PANEL_BUDGETS]
        y = [perplexity(results, name, v) for v in PANEL_BUDGETS]
        style = dict(lw=2.5, marker="o") if name == policy else dict(lw=1, alpha=0.5, marker=".")
        b.plot(x, y, label=name + ("" if name in EXACT else " (chunked)"), **style)
        if name == policy:
            b.plot(x[PANEL_BUDGETS.index(budget)], y[PANEL_BUDGETS.index(budget)], "o", ms=12, mfc="none", color="black")
    full = perplexity(results, "full")
    b.axhline(full, color="black", ls="--", label=f"full cache ({full:.2f})")
    b.set_xscale("log")
    b.set_yscale("log")
    b.minorticks_off()
    b.set_yticks([10, 15, 20, 30, 50], ["10", "15", "20", "30", "50"])
    b.set_xticks([3, 6, 12, 25, 50], ["3", "6", "12", "25", "50"])
    b.set_xlabel("cache held at most (% of the full cache; eviction: the budget)")
    b.set_ylabel("perplexity (mean of 3 texts)")
    share, ppl = 100 * memory_share(results, policy, budget), perplexity(results, policy, budget)
    b.set_title(f"{share:.0f}% of the cache, perplexity {ppl:.2f}", y=1.01, fontsize=10)
    b.legend(fontsize=7, loc="upper right")
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.14, top=0.9, wspace=0.25)
    return fig


def eviction_panel() -> widgets.VBox:
    results = load_results()
    policy = widgets.ToggleButtons(options=PANEL_POLICIES, value="heavy", description="policy")
    budget = widgets.SelectionSlider(options=PANEL_BUDGETS, value=256, description="budget")
    out = widgets.interactive_output(lambda policy, budget: show_figure(draw_eviction(policy, budget, results)),
                                     {"policy": policy, "budget": budget})
    return widgets.VBox([policy, budget, out])
