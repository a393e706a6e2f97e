"""The lesson 03 tiling panel: sequence length, head dim, SRAM size and blocks ->
the tile schedule, the HBM traffic of both algorithms, and their extra memory.

Counts come from ``helpers.flash`` (the same formulas its instrumented code is tested against).
Sizes in bytes assume 2-byte (fp16/bf16) elements, as on a GPU. ``TilingView`` draws the figure
once and ``move``s it; ``draw_tiling`` is a plain function of the settings; ``tiling_panel`` wires
a view to sliders.
"""

from __future__ import annotations

import math

import ipywidgets as widgets
import matplotlib.pyplot as plt
import numpy as np

from helpers.flash import extra_memory, flash_blocks, flash_traffic, standard_traffic, tile_mask
from helpers.panels.output import freeze, moved_figure, show_figure

BYTES = 2  # fp16/bf16 elements
LENGTHS = [256, 512, 1024, 2048, 4096, 8192, 16384]
SRAM_KIB = [16, 32, 64, 128, 192, 256]


MIB_RANGE = (1e-3, 1e6)  # every bar the controls can make lies inside (tests/test_lesson03_panels.py checks)


class TilingView:
    """The panel's figure, drawn once; ``move(n, d, sram_kib, block_q, block_k, causal)`` updates it in place.

    Left: the tile schedule, coloured from the first tile visited to the last, in axes that stay
    the same whatever the grid (its size is in the labels). Right: HBM traffic and extra memory of
    both algorithms on a fixed log scale. So only the image, the bars, the ratios, the labels and
    the titles move; the rest is frozen (``helpers.panels.output.freeze``) after ``freeze()``.
    """

    def __init__(self):
        fig, (a, b) = plt.subplots(1, 2, figsize=(9.5, 3.8), dpi=80, gridspec_kw={"width_ratios": [1, 1.2]})
        self.fig, self.a, self.b = fig, a, b
        self.image = a.imshow(np.zeros((1, 1)), cmap="viridis", vmin=0, vmax=1, aspect="auto",
                              interpolation="nearest", extent=(0, 1, 1, 0))
        bar = fig.colorbar(self.image, ax=a, ticks=[0, 1], label="visit order")
        bar.ax.set_yticklabels(["first", "last"])
        a.set_xticks([])
        a.set_yticks([])
        a.set_title(" ", y=1.01)  # fixed y: no layout pass

        x = np.arange(2)
        self.standard = b.bar(x - 0.2, [1, 1], width=0.4, label="standard", color="tab:red")
        self.flash = b.bar(x + 0.2, [1, 1], width=0.4, label="FlashAttention", color="tab:green")
        self.ratios = [b.text(xi, 1, "", ha="center", va="bottom") for xi in x]
        b.set_yscale("log")
        b.set_ylim(*MIB_RANGE)
        decades = [10.0**k for k in range(-3, 7)]
        b.set_yticks(decades, [f"{value:,.0f}" if value >= 1 else f"{value:g}" for value in decades])  # plain text
        b.minorticks_off()
        b.set_xticks(x, ["HBM traffic", "extra memory"])
        b.set_xlabel("above the bars: standard / FlashAttention", fontsize=8)
        b.set_ylabel("MiB (2-byte elements)")
        b.set_title(" ", y=1.01)
        b.legend(fontsize=8, loc="upper left")  # above every bar and ratio
        fig.subplots_adjust(left=0.08, right=0.98, bottom=0.16, top=0.85, wspace=0.45)
        self.frozen = None

    def freeze(self) -> None:
        """Keep the unchanging parts' pixels from the next render on."""
        if self.frozen is None:
            a, b = self.a, self.b
            self.frozen = freeze(self.fig, [self.image, a.xaxis, a.yaxis, a.title, *self.standard, *self.flash,
                                            *self.ratios, b.title, *a.spines.values(), *b.spines.values()])

    def move(self, n: int = 4096, d: int = 64, sram_kib: int = 192, block_q: int | None = None,
             block_k: int | None = None, causal: bool = False) -> None:
        """Show the schedule and traffic for ``n`` tokens of head dim ``d``; blocks default to
        Algorithm 1's choice for an SRAM of ``sram_kib`` KiB of 2-byte elements."""
        auto_q, auto_k = flash_blocks(sram_kib * 1024 // BYTES, d)
        block_q, block_k = min(block_q or auto_q, n), min(block_k or auto_k, n)  # a block holds at most the sequence

        t_r, t_c = math.ceil(n / block_q), math.ceil(n / block_k)
        mask = tile_mask(n, n, block_q, block_k, causal)
        order = np.where(mask, np.cumsum(mask.T).reshape(t_c, t_r).T - 1, np.nan)  # outer loop over j
        standard, flash = standard_traffic(n, d) * BYTES, flash_traffic(n, d, block_q, block_k, causal) * BYTES
        extra_std, extra_flash = extra_memory(n, d, block_q, block_k)
        sram_bytes = extra_flash - 2 * n * BYTES  # the Q, K, V blocks and the score tile (l and m are in HBM)
        a, b = self.a, self.b
        self.image.set_data(order / max(int(mask.sum()) - 1, 1))
        a.set_xlabel(f"K/V block j ({t_c:,} of {block_k:,} rows; outer loop)")
        a.set_ylabel(f"Q block i ({t_r:,} of {block_q:,} rows)")
        a.set_title(f"{int(mask.sum()):,} tiles visited" + (" (causal)" if causal else ""), y=1.01)
        for xi, (s, f) in enumerate(((standard, flash), (extra_std, extra_flash))):
            self.standard[xi].set_height(s / 2**20)
            self.flash[xi].set_height(f / 2**20)
            ratio = s / f
            self.ratios[xi].set_y(max(s, f) / 2**20)
            self.ratios[xi].set_text(f"{ratio:,.0f}x" if ratio >= 100 else f"{ratio:.3g}x")
        over = f": need {sram_bytes / 1024:,.0f} KiB > SRAM" if sram_bytes > sram_kib * 1024 else ""
        b.set_title(f"n={n:,}, d={d}, SRAM {sram_kib} KiB\nB_r={block_q}, B_c={block_k}{over}", y=1.01,
                    color="tab:red" if over else "black")


def draw_tiling(n: int = 4096, d: int = 64, sram_kib: int = 192, block_q: int | None = None,
                block_k: int | None = None, causal: bool = False):
    """Left: the tile schedule (order of visits). Right: HBM traffic and extra memory (see ``TilingView``).
    Returns the Figure."""
    return moved_figure(TilingView(), n, d, sram_kib, block_q, block_k, causal)


def tiling_panel() -> widgets.VBox:
    """Sliders for n, d, SRAM size and (optionally) block sizes, and a causal switch."""
    style = {"description_width": "70px"}
    n = widgets.SelectionSlider(options=LENGTHS, value=4096, description="n", style=style)
    d = widgets.SelectionSlider(options=[32, 64, 128], value=64, description="d", style=style)
    sram = widgets.SelectionSlider(options=SRAM_KIB, value=192, description="SRAM KiB", style=style)
    block_q = widgets.SelectionSlider(options=[("auto", 0)] + [(str(b), b) for b in (16, 32, 64, 128, 256)],
                                      value=0, description="B_r", style=style)
    block_k = widgets.SelectionSlider(options=[("auto", 0)] + [(str(b), b) for b in (16, 32, 64, 128, 256, 512)],
                                      value=0, description="B_c", style=style)
    causal = widgets.Checkbox(False, description="causal")
    view = TilingView()
    view.freeze()

    def show(n, d, sram, block_q, block_k, causal):
        view.move(n, d, sram, block_q or None, block_k or None, causal)
        show_figure(view.fig)

    out = widgets.interactive_output(
        show, {"n": n, "d": d, "sram": sram, "block_q": block_q, "block_k": block_k, "causal": causal})
    return widgets.VBox([widgets.HBox([widgets.VBox([n, d, sram]), widgets.VBox([block_q, block_k, causal])]), out])
