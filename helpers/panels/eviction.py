"""The lesson 06 panel: policy and budget -> which positions SmolLM2's cache holds in every layer
and K/V head at the end of a 2,048-token text, and the measured perplexity against the memory kept.

Everything it draws comes from ``results/eviction_real.json`` (scripts/eviction_real.py: the exact
window and sinks) and ``results/eviction_chunked.json`` (scripts/eviction_chunked.py: the policies
that need the cache step by step), so a slider move only redraws.
"""

from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt

from helpers.eviction_results import BUDGETS, EXACT, POLICIES, held_map, load_results, memory_share, perplexity
from helpers.panels.output import show_figure


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

    for name in POLICIES:
        x = [100 * memory_share(results, name, v) for v in BUDGETS]
        y = [perplexity(results, name, v) for v in BUDGETS]
        style = dict(lw=2.5, marker="o") if name == policy else dict(lw=1, alpha=0.5, marker=".")
        b.plot(x, y, label=name + ("" if name in EXACT else " (chunked)"), **style)
        if name == policy:
            b.plot(x[BUDGETS.index(budget)], y[BUDGETS.index(budget)], "o", ms=12, mfc="none", color="black")
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
    policy = widgets.ToggleButtons(options=POLICIES, value="heavy", description="policy")
    budget = widgets.SelectionSlider(options=BUDGETS, value=256, description="budget")
    out = widgets.interactive_output(lambda policy, budget: show_figure(draw_eviction(policy, budget, results)),
                                     {"policy": policy, "budget": budget})
    return widgets.VBox([policy, budget, out])
