"""The lesson 05 panel: model, chip, batch, context, cache format and block size -> the decode
speed limit, the largest batch that fits, and where the chip's memory goes.

``ServingView`` draws the figure once and ``move``s it; ``draw_serving`` is a plain function of the
choices; ``serving_panel`` wires a view to widgets.
"""

from __future__ import annotations

import functools

import ipywidgets as widgets
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Rectangle
from matplotlib.ticker import FuncFormatter

from helpers.models import MODELS, get_model
from helpers.panels.output import freeze, moved_figure, show_figure
from helpers.roofline import CHIPS, decode_ceiling, get_chip, max_batch, memory_split
from helpers.units import GB

BATCHES = [1, 2, 4, 8, 16, 32, 64, 128, 256]
CONTEXTS = [1000, 2048, 3000, 4096, 6000, 8192, 12000, 16384, 32768, 65536, 131072]  # some not whole blocks: tails
BLOCKS = [1, 8, 16, 32, 64, 128, 256]


COLOURS = {"weights": "tab:grey", "cache (tokens)": "tab:blue", "cache (block tails)": "tab:orange", "free": "white"}


@functools.lru_cache(maxsize=64)
def _ceiling_range(model_name: str, chip_name: str, cache_bytes_per_element: int) -> tuple[float, float]:
    """Log-scale limits (tokens/s) holding the decode ceiling of every batch and context, with 5% margins."""
    model, chip = get_model(model_name), get_chip(chip_name)
    values = [decode_ceiling(model, chip, b, c, 2, cache_bytes_per_element) for b in BATCHES for c in CONTEXTS]
    low, high = np.log10(min(values)), np.log10(max(values))
    return 10 ** (low - 0.05 * (high - low or 1)), 10 ** (high + 0.05 * (high - low or 1))


class ServingView:
    """The panel's figure, drawn once; ``move(...)`` (the arguments of ``draw_serving``) updates it in place.

    Left: the decode ceiling (tokens/s) against batch, the chosen batch marked, the batches that do
    not fit shaded (named in the x label; the numbers are in the title). Right: how the chip's
    memory is split, the sizes in a key beside the bar (its numbers move). The y axes cover every
    batch and context of a model, chip and cache format, so the frozen parts
    (``helpers.panels.output.freeze``) are kept per those three and whether the context is beyond
    the model's (the note under the bar says so); a move redraws the curve, the
    marker, the shading, the bar, the key's numbers and the titles.
    """

    def __init__(self):
        fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8), dpi=80, gridspec_kw={"width_ratios": [1.4, 1]})
        self.fig, self.a, self.b = fig, a, b
        batches = np.array(BATCHES)
        (self.curve,) = a.plot(batches, np.ones(len(batches)), "o-", color="tab:blue")
        (self.marker,) = a.plot([1], [1], "o", ms=10, color="tab:red")
        self.span = a.axvspan(1, 2, color="grey", alpha=0.2)
        a.set_xscale("log", base=2)
        a.set_yscale("log")
        a.set_xlim(0.7, batches[-1] * 1.3)
        a.set_xlabel("batch (sequences decoded together; red: the chosen one; grey: does not fit)")
        a.set_ylabel("tokens/s at most (bandwidth ceiling)")
        a.set_title(" ", y=1.01, fontsize=10)  # fixed y: no layout pass
        a.set_xticks(batches, [str(x) for x in batches])
        a.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}"))  # plain labels: fast to draw
        a.minorticks_off()
        a.tick_params(axis="y", length=0)  # no tick marks for the shading, which moves, to cover

        self.parts = {part: b.bar([0], [0], color=colour, edgecolor="black")[0] for part, colour in COLOURS.items()}
        (self.chip_line,) = b.plot([-0.6, 0.5], [0, 0], color="black", ls="--")  # the chip's memory, left of the key
        # The key: a fixed column beside the bar, nothing crosses it; its marks are frozen, the cache's and
        # the free memory's numbers move.
        rows = 1 - 0.09 * np.arange(1 + len(COLOURS)) - 0.06
        b.plot([0.41, 0.46], [rows[0]] * 2, color="black", ls="--", transform=b.transAxes)
        for y, colour in zip(rows[1:], COLOURS.values()):
            b.add_patch(Rectangle((0.41, y - 0.025), 0.05, 0.05, facecolor=colour, edgecolor="black", transform=b.transAxes))
        self.sizes = [b.text(0.48, y, "", va="center", fontsize=8, transform=b.transAxes) for y in rows]
        b.set_xticks([])
        b.set_ylabel("GB")
        b.set_xlim(-0.6, 2.2)
        b.set_title(" ", y=1.01, fontsize=10)
        self.note = b.text(-0.55, -0.12, "", fontsize=8, transform=b.get_xaxis_transform())  # under the axes
        fig.subplots_adjust(left=0.08, right=0.98, bottom=0.16, top=0.86, wspace=0.2)
        self.key, self.frozen = None, None

    def freeze(self) -> None:
        """Keep the unchanging parts' pixels, per model, chip, cache format and note, from the next render on."""
        if self.frozen is None:
            a, b = self.a, self.b
            self.frozen = freeze(self.fig, [self.curve, self.marker, self.span, a.title, *self.parts.values(),
                                            self.chip_line, *self.sizes[2:], b.title, *a.spines.values(),
                                            *b.spines.values()],  # the chip's and the weights' sizes follow the key
                                 key=lambda: self.key)

    def move(self, model_name: str = "Llama-3-8B", chip_name: str = "H100 SXM", batch: int = 16, context: int = 8192,
             cache_bytes_per_element: int = 2, block_size: int = 16) -> None:
        """Show ``batch`` sequences of ``context`` tokens of ``model_name`` on ``chip_name``, the cache
        in ``cache_bytes_per_element``-byte elements and blocks of ``block_size`` tokens."""
        model, chip = get_model(model_name), get_chip(chip_name)
        fits = max_batch(model, chip, context, 2, cache_bytes_per_element, block_size)
        contiguous = max_batch(model, chip, model.max_context, 2, cache_bytes_per_element)  # reserving the model's max context
        ceiling = [decode_ceiling(model, chip, b, context, 2, cache_bytes_per_element) for b in BATCHES]
        here = decode_ceiling(model, chip, batch, context, 2, cache_bytes_per_element)
        split = memory_split(model, chip, batch, context, cache_bytes_per_element, block_size)
        a, b = self.a, self.b
        self.curve.set_ydata(ceiling)
        self.marker.set_data([batch], [here])
        start = max(fits, 0.7)
        self.span.set_visible(fits < BATCHES[-1])
        self.span.set_x(start)
        self.span.set_width(BATCHES[-1] * 1.3 - start)
        beyond = context > model.max_context
        self.key = (model.name, chip.name, cache_bytes_per_element, beyond)  # what the note under the bar follows
        a.set_ylim(*_ceiling_range(model.name, chip.name, cache_bytes_per_element))
        a.set_title(f"{model.name} on {chip.name}, {context:,} tokens each\nbatch {batch}: {here:,.0f} tokens/s at most; "
                    + (f"max batch {fits}" if fits < BATCHES[-1] else f"every batch fits (max {fits})"), y=1.01, fontsize=10)

        bottom = 0.0
        for (part, size), text in zip(split.items(), self.sizes[1:]):
            bar = self.parts[part]
            bar.set_visible(size > 0)
            bar.set_y(bottom)
            bar.set_height(max(size, 0) / GB)
            text.set_text(f"{part}: {size / GB:,.1f} GB" if size >= 0 else f"{part}: none, {-size / GB:,.1f} GB short")
            bottom += max(size, 0) / GB
        memory = chip.memory_bytes / GB
        self.chip_line.set_ydata([memory, memory])
        self.sizes[0].set_text(f"the chip: {memory:,.0f} GB")
        b.set_ylim(0, 1.3 * memory)  # a stack that does not fit goes past the top
        over = f" - does NOT fit: {bottom:,.0f} GB" if split["free"] < 0 else ""
        b.set_title(f"memory, blocks of {block_size}{over}", y=1.01, fontsize=10)
        self.note.set_text(f"this context is beyond {model.name}'s {model.max_context:,} tokens" if beyond else
                           f"reserving {model.max_context:,} per sequence: max batch {contiguous}")


def draw_serving(model_name: str = "Llama-3-8B", chip_name: str = "H100 SXM", batch: int = 16, context: int = 8192,
                 cache_bytes_per_element: int = 2, block_size: int = 16):
    """Left: decode ceiling (tokens/s) against batch, the chosen batch marked, the memory limit
    drawn. Right: how the chip's memory is split (see ``ServingView``). Returns the Figure."""
    return moved_figure(ServingView(), model_name, chip_name, batch, context, cache_bytes_per_element, block_size)


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
    view = ServingView()
    view.freeze()

    def show(model, chip, batch, context, cache, block):
        view.move(model, chip, batch, context, cache, block)
        show_figure(view.fig)

    out = widgets.interactive_output(
        show, {"model": model, "chip": chip, "batch": batch, "context": context, "cache": cache, "block": block})
    return widgets.VBox([widgets.HBox([widgets.VBox([model, chip, cache]), widgets.VBox([batch, context, block])]), out])
