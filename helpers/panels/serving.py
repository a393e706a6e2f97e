"""The lesson 05 panel: model, chip, batch, context, cache format and block size -> the decode
speed limit, the largest batch that fits, and where the chip's memory goes.
"""

from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import FuncFormatter

from helpers.models import MODELS, get_model
from helpers.panels.output import show_figure
from helpers.roofline import CHIPS, decode_ceiling, get_chip, max_batch, memory_split
from helpers.units import GB

BATCHES = [1, 2, 4, 8, 16, 32, 64, 128, 256]
CONTEXTS = [1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]
BLOCKS = [1, 8, 16, 32, 64, 128, 256]


def draw_serving(model_name: str = "Llama-3-8B", chip_name: str = "H100 SXM", batch: int = 16, context: int = 8192,
                 cache_bytes_per_element: int = 2, block_size: int = 16):
    """Left: decode ceiling (tokens/s) against batch, the chosen batch marked, the memory limit
    drawn. Right: how the chip's memory is split. Returns the Figure."""
    model, chip = get_model(model_name), get_chip(chip_name)
    fits = max_batch(model, chip, context, 2, cache_bytes_per_element, block_size)
    contiguous = max_batch(model, chip, model.max_context, 2, cache_bytes_per_element)  # reserving the model's max context
    batches = np.array(BATCHES)
    ceiling = [decode_ceiling(model, chip, int(b), context, 2, cache_bytes_per_element) for b in batches]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8), dpi=80, gridspec_kw={"width_ratios": [1.4, 1]})
    a.plot(batches, ceiling, "o-", color="tab:blue", label="memory-bandwidth ceiling")
    here = decode_ceiling(model, chip, batch, context, 2, cache_bytes_per_element)
    a.plot([batch], [here], "o", ms=10, color="tab:red", label=f"batch {batch}: {here:,.0f} tokens/s")
    if fits < batches[-1]:
        a.axvspan(max(fits, 0.7), batches[-1] * 1.3, color="grey", alpha=0.2, label=f"does not fit (max batch {fits})")
    a.set_xscale("log", base=2)
    a.set_yscale("log")
    a.set_xlim(0.7, batches[-1] * 1.3)
    a.set_xlabel("batch (sequences decoded together)")
    a.set_ylabel("tokens per second, at most")
    a.set_title(f"{model.name} on {chip.name}, {context:,} tokens each", y=1.01)
    a.legend(fontsize=8, loc="upper left")
    a.set_xticks(batches, [str(x) for x in batches])
    a.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}"))  # plain labels: fast to draw
    a.minorticks_off()

    split = memory_split(model, chip, batch, context, cache_bytes_per_element, block_size)
    bottom = 0.0
    colours = {"weights": "tab:grey", "cache (tokens)": "tab:blue", "cache (block tails)": "tab:orange",
               "free": "white"}
    for part, size in split.items():
        if size > 0:
            b.bar([0], [size / GB], bottom=bottom, color=colours[part], edgecolor="black", label=f"{part}: {size / GB:,.1f} GB")
            bottom += size / GB
    b.axhline(chip.memory_bytes / GB, color="black", ls="--")
    b.set_xticks([])
    b.set_ylabel("GB")
    b.set_xlim(-0.6, 2.2)
    over = " - does NOT fit" if split["free"] < 0 else ""
    b.set_title(f"memory, blocks of {block_size}{over}", y=1.01)
    b.legend(fontsize=8, loc="upper right")
    b.text(-0.55, -0.12 * chip.memory_bytes / GB, f"reserving {model.max_context:,} per sequence: max batch {contiguous}",
           fontsize=8)
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.16, top=0.9, wspace=0.2)
    return fig


def serving_panel() -> widgets.VBox:
    style = {"description_width": "80px"}
    model = widgets.Dropdown(options=[m for m in MODELS if MODELS[m].max_context >= 4096], value="Llama-3-8B",
                             description="model", style=style)
    chip = widgets.Dropdown(options=list(CHIPS), value="H100 SXM", description="chip", style=style)
    batch = widgets.SelectionSlider(options=BATCHES, value=16, description="batch", style=style)
    context = widgets.SelectionSlider(options=[(f"{c:,}", c) for c in CONTEXTS], value=8192, description="context",
                                      style=style)
    cache = widgets.Dropdown(options=[("bf16 (2 bytes)", 2), ("8-bit (1 byte)", 1)], value=2, description="cache",
                             style=style)
    block = widgets.SelectionSlider(options=BLOCKS, value=16, description="block size", style=style)
    out = widgets.interactive_output(
        lambda model, chip, batch, context, cache, block: show_figure(draw_serving(model, chip, batch, context, cache, block)),
        {"model": model, "chip": chip, "batch": batch, "context": context, "cache": cache, "block": block})
    return widgets.VBox([widgets.HBox([widgets.VBox([model, chip, cache]), widgets.VBox([batch, context, block])]), out])
