"""The lesson 03 tiling panel: sequence length, head dim, SRAM size and blocks ->
the tile schedule, the HBM traffic of both algorithms, and their extra memory.

Counts come from ``helpers.flash`` (the same formulas its instrumented code is tested against).
Sizes in bytes assume 2-byte (fp16/bf16) elements, as on a GPU.
"""

from __future__ import annotations

import math

import ipywidgets as widgets
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import FuncFormatter

from helpers.flash import extra_memory, flash_blocks, flash_traffic, standard_traffic, tile_mask
from helpers.panels.output import show_figure

BYTES = 2  # fp16/bf16 elements
LENGTHS = [256, 512, 1024, 2048, 4096, 8192, 16384]
SRAM_KIB = [16, 32, 64, 128, 192, 256]


def draw_tiling(n: int = 4096, d: int = 64, sram_kib: int = 192, block_q: int | None = None,
                block_k: int | None = None, causal: bool = False):
    """Left: the tile schedule (order of visits). Right: HBM traffic and extra memory. Returns the Figure.

    Blocks default to Algorithm 1's choice for an SRAM of ``sram_kib`` KiB of 2-byte elements.
    """
    auto_q, auto_k = flash_blocks(sram_kib * 1024 // BYTES, d)
    block_q, block_k = block_q or auto_q, block_k or auto_k
    t_r, t_c = math.ceil(n / block_q), math.ceil(n / block_k)
    mask = tile_mask(n, n, block_q, block_k, causal)
    order = np.where(mask, np.cumsum(mask.T).reshape(t_c, t_r).T - 1, np.nan)  # outer loop over j
    standard, flash = standard_traffic(n, d) * BYTES, flash_traffic(n, d, block_q, block_k, causal) * BYTES
    extra_std, extra_flash = extra_memory(n, d, block_q, block_k)

    fig, (a, b) = plt.subplots(1, 2, figsize=(9.5, 3.8), dpi=80, gridspec_kw={"width_ratios": [1, 1.2]})
    image = a.imshow(order, cmap="viridis", aspect="auto", interpolation="nearest")
    fig.colorbar(image, ax=a, label="visit order")
    a.set_xlabel(f"K/V block j ({t_c} of {block_k} rows; outer loop)")
    a.set_ylabel(f"Q block i ({t_r} of {block_q} rows)")
    a.set_title(f"{int(mask.sum()):,} tiles visited" + (" (causal)" if causal else ""), y=1.01)

    labels = ["HBM traffic", "extra memory"]
    x = np.arange(2)
    b.bar(x - 0.2, [standard / 2**20, extra_std / 2**20], width=0.4, label="standard", color="tab:red")
    b.bar(x + 0.2, [flash / 2**20, extra_flash / 2**20], width=0.4, label="FlashAttention", color="tab:green")
    for xi, (s, f) in enumerate(((standard, flash), (extra_std, extra_flash))):
        ratio = s / f
        b.text(xi, max(s, f) / 2**20, f"{ratio:,.0f}x" if ratio >= 100 else f"{ratio:.3g}x", ha="center", va="bottom")
    b.set_yscale("log")
    b.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))  # plain text: no mathtext to lay out
    b.set_xticks(x, labels)
    b.set_ylabel("MiB (2-byte elements)")
    b.set_title(f"n={n:,}, d={d}, SRAM {sram_kib} KiB, B_r={block_q}, B_c={block_k}", y=1.01)
    b.legend(fontsize=8, loc="lower left")
    b.minorticks_off()
    b.set_ylim(None, b.get_ylim()[1] * 4)  # room for the ratios
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.14, top=0.9, wspace=0.45)
    return fig


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
    out = widgets.interactive_output(
        lambda n, d, sram, block_q, block_k, causal: show_figure(draw_tiling(n, d, sram, block_q or None,
                                                                             block_k or None, causal)),
        {"n": n, "d": d, "sram": sram, "block_q": block_q, "block_k": block_k, "causal": causal})
    return widgets.VBox([widgets.HBox([widgets.VBox([n, d, sram]), widgets.VBox([block_q, block_k, causal])]), out])
