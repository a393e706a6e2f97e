"""The lesson 06 panel: policy and budget -> which positions SmolLM2's cache holds in every layer
and K/V head at the end of a 2,048-token text, and the measured perplexity against the memory kept.

Everything it draws comes from ``results/eviction_real.json`` (scripts/eviction_real.py: the exact
window and sinks) and ``results/eviction_chunked.json`` (scripts/eviction_chunked.py: the policies
that need the cache step by step), so a slider move only redraws.
"""

from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt
import numpy as np

from helpers.eviction_results import BUDGETS, EXACT, POLICIES, held_map, load_results, memory_share, perplexity
from helpers.panels.output import freeze, moved_figure, show_figure

CHOSEN = dict(linewidth=2.5, alpha=1.0, marker="o")
OTHER = dict(linewidth=1, alpha=0.5, marker=".")


POOL = 8  # positions per image column: 2,048 positions would be more columns than the image has pixels


def pooled(held: np.ndarray) -> np.ndarray:
    """(rows, positions) -> (rows, ceil(positions / POOL)): each column the most a group of ``POOL``
    positions holds (2 int8 over 1 held over 0), so a single held position (a sink) still shows."""
    rows, positions = held.shape
    padded = np.zeros((rows, -(-positions // POOL) * POOL), dtype=held.dtype)
    padded[:, :positions] = held
    return padded.reshape(rows, -1, POOL).max(axis=2)


class EvictionView:
    """The panel's figure, drawn once; ``move(policy, budget)`` updates it in place.

    Left: the positions held per layer and K/V head at the end of the first text (an image).
    Right: perplexity against the memory kept for every policy, the chosen one in bold and its
    point ringed. The axes do not change with the controls, so everything but the image, the
    lines' styles, the ring and the titles is frozen (``helpers.panels.output.freeze``)
    after ``freeze()``.
    """

    def __init__(self, results: dict | None = None):
        self.results = results = results or load_results()
        fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8), dpi=80, gridspec_kw={"width_ratios": [1, 1.1]})
        self.fig = fig
        held = held_map(results, POLICIES[0], BUDGETS[0])
        rows, positions = held.shape
        self.image = a.imshow(pooled(held), cmap=plt.matplotlib.colors.ListedColormap(["white", "tab:blue", "tab:orange"]),
                              vmin=0, vmax=2, aspect="auto", interpolation="nearest",
                              extent=(-0.5, positions - 0.5, rows - 0.5, -0.5))
        a.set_xlim(-0.5 - 2 * POOL, positions - 0.5)  # the first column (the sinks) clear of the frame
        a.set_xlabel(f"position in the text (a column: {POOL} positions, coloured if any is held)")
        a.set_ylabel("layer x K/V head (layer 0 at the top)")
        a.tick_params(length=0)  # no tick marks over the image's edges, which move (the labels stay)
        self.points = {}
        self.lines = {}
        for name in POLICIES:
            x = [100 * memory_share(results, name, v) for v in BUDGETS]
            y = [perplexity(results, name, v) for v in BUDGETS]
            self.points[name] = list(zip(x, y))
            (self.lines[name],) = b.plot(x, y, label=name + ("" if name in EXACT else " (chunked)"), **OTHER)
        (self.ring,) = b.plot([], [], "o", ms=12, mfc="none", color="black", zorder=2.1)  # over every line
        full = perplexity(results, "full")
        self.full = b.axhline(full, color="black", ls="--", label=f"full cache ({full:.2f})")
        b.set_xscale("log")
        b.set_yscale("log")
        b.minorticks_off()
        b.set_yticks([10, 15, 20, 30, 50], ["10", "15", "20", "30", "50"])
        b.set_xticks([3, 6, 12, 25, 50], ["3", "6", "12", "25", "50"])
        b.set_xlabel("cache held at most (% of the full cache; eviction: the budget)")
        b.set_ylabel("perplexity (mean of 3 texts)")
        for ax in (a, b):
            ax.set_title(" ", y=1.01, fontsize=10)
        legend = b.legend(fontsize=7, loc="upper right")  # names the colours; the chosen line is the bold one
        for handle in legend.legend_handles:
            handle.set(linewidth=1.5, alpha=1.0)
        fig.subplots_adjust(left=0.07, right=0.98, bottom=0.14, top=0.9, wspace=0.25)
        self.frozen = None

    def freeze(self) -> None:
        """Keep the unchanging parts' pixels from the next render on (see ``helpers.panels.output.Frozen``)."""
        if self.frozen is None:
            a, b = self.fig.axes
            # what a move changes, and what the axes draw over it (the dashed line, the spines)
            self.frozen = freeze(self.fig, [self.image, *self.lines.values(), self.ring, self.full, a.title, b.title,
                                            *a.spines.values(), *b.spines.values()])

    def move(self, policy: str, budget: int) -> None:
        """Show ``policy`` at ``budget``."""
        if policy not in POLICIES or budget not in BUDGETS:
            raise ValueError(f"policy must be one of {POLICIES} and budget one of {BUDGETS}; got {policy!r}, {budget!r}")
        a, b = self.fig.axes
        self.image.set_data(pooled(held_map(self.results, policy, budget)))
        a.set_title(f"{policy}, budget {budget}: held at the end", y=1.01, fontsize=10)
        for name, line in self.lines.items():
            line.set(**(CHOSEN if name == policy else OTHER))
        self.ring.set_data(*zip(self.points[policy][BUDGETS.index(budget)]))
        share, ppl = 100 * memory_share(self.results, policy, budget), perplexity(self.results, policy, budget)
        b.set_title(f"{share:.0f}% of the cache, perplexity {ppl:.2f}", y=1.01, fontsize=10)


def draw_eviction(policy: str = "heavy", budget: int = 256, results: dict | None = None):
    """The figure for ``policy`` at ``budget`` (see ``EvictionView``). Returns the Figure."""
    return moved_figure(EvictionView(results), policy, budget)


def eviction_panel() -> widgets.VBox:
    """Policy buttons and a budget slider; the figure is drawn once and updated in place (``EvictionView``)."""
    view = EvictionView()
    view.freeze()
    policy = widgets.ToggleButtons(options=POLICIES, value="heavy", description="policy")
    budget = widgets.SelectionSlider(options=BUDGETS, value=256, description="budget")

    def show(policy, budget):
        view.move(policy, budget)
        show_figure(view.fig)

    out = widgets.interactive_output(show, {"policy": policy, "budget": budget})
    return widgets.VBox([policy, budget, out])
