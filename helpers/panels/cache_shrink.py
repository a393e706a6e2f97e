"""The lesson 02 panel: attention layout and storage format -> cache size and measured error.

The shape is Llama-2-7B's (32 layers, 32 query heads, head dim 128). The layouts: MHA (32 K/V
heads), GQA (query heads in groups sharing a K/V head), MQA (one K/V head) and MLA with
DeepSeek's proportions (a latent of 4 x head dim plus a rotary key of head dim / 2 per layer).
``CacheShrinkView`` draws the figure once and ``move``s it; ``draw_cache_shrink`` is a plain function
of the choices; ``cache_shrink_panel`` wires a view to widgets.
"""

from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt

from helpers.kv_cache_size import LAYOUTS, cache_bytes, layout_bytes_per_token
from helpers.kv_quant import measured_errors
from helpers.panels.output import freeze, moved_figure, show_figure
from helpers.units import gib

STORAGE = ("bf16", "int8", "e4m3", "e5m2")  # the formats the panel offers (bytes: helpers.units.DTYPE_BYTES)
SCALINGS = ("tensor", "channel", "token", "uncalibrated")
CONTEXTS = [2**k for k in range(12, 21)]


class CacheShrinkView:
    """The panel's figure, drawn once; ``move(...)`` (the arguments of ``draw_cache_shrink``) updates it in place.

    Left: the cache holding ``context`` tokens (one sequence, or a batch's total) for MHA bf16, the
    layout in bf16, and the layout in ``storage``. Right: the measured attention-output error of that
    storage. The left x axis follows the context only, so the frozen parts (``helpers.panels.output.freeze``)
    are kept per context; a move redraws the bars, their names and numbers, and the titles.
    """

    def __init__(self):
        fig, (left, right) = plt.subplots(1, 2, figsize=(9.5, 3.6), dpi=80, gridspec_kw={"width_ratios": [1.4, 1]})
        self.fig, self.left, self.right = fig, left, right
        self.bars = left.barh(range(3), [0, 0, 0], color=["tab:grey", "tab:blue", "tab:green"])
        self.sizes = [left.text(0, i, "", va="center", fontsize=8) for i in range(3)]
        left.invert_yaxis()
        left.set_title(" ", y=1.01)  # fixed y: no layout pass

        labels = ["keys stored", "values stored"]
        self.errors = right.bar(labels, [1, 1], color=["tab:orange", "tab:purple"])
        bf16 = measured_errors("bf16", "none")
        self.bf16_errors = [100 * bf16["keys"]["output"], 100 * bf16["values"]["output"]]
        self.bf16 = right.scatter(labels, self.bf16_errors, marker="_", s=900, color="black", zorder=3)  # named below
        self.percents = [right.text(i, 1, "", ha="center", va="bottom", fontsize=9) for i in range(2)]
        right.set_yscale("log")
        right.set_ylim(0.05, 300)
        right.set_yticks([0.1, 1, 10, 100], ["0.1", "1", "10", "100"])
        right.minorticks_off()  # fewer ticks to lay out: part of keeping a redraw fast
        right.set_ylabel("attention output error (%)")
        right.set_xlabel("black marks: bf16, for comparison", fontsize=8)
        right.set_title(" ", y=1.01)
        fig.subplots_adjust(left=0.2, right=0.98, bottom=0.16, top=0.88, wspace=0.35)
        self.context, self.frozen = None, None

    def freeze(self) -> None:
        """Keep the unchanging parts' pixels, per context, from the next render on."""
        if self.frozen is None:
            left, right = self.left, self.right
            self.frozen = freeze(self.fig, [left.yaxis, *self.bars, *self.sizes, left.title, *self.errors, self.bf16,
                                            *self.percents, right.title, *left.spines.values(),
                                            *right.spines.values()], key=lambda: self.context)

    def move(self, layout: str = "GQA", group: int = 4, storage: str = "e4m3", scaling: str = "tensor",
             context: int = 131072) -> None:
        """Show ``layout`` (GQA in groups of ``group``) stored in ``storage`` with ``scaling``, for ``context`` tokens."""
        name = f"GQA, groups of {group}" if layout == "GQA" else layout
        bars = [("MHA, bf16", layout_bytes_per_token("MHA")), (f"{name}, bf16", layout_bytes_per_token(layout, group)),
                (f"{name}, {storage}", layout_bytes_per_token(layout, group, storage))]
        errors = measured_errors(storage, scaling)
        baseline = bars[0][1]
        left, right = self.left, self.right
        sizes = [gib(cache_bytes(context, per_token)) for _, per_token in bars]
        for i, (bar, text, (_, per_token), size) in enumerate(zip(self.bars, self.sizes, bars, sizes)):
            bar.set_width(size)
            text.set_position((size, i))
            smaller = "the same" if per_token == baseline else f"{baseline / per_token:.3g}x smaller"
            text.set_text(f" {size:,.2f} GiB ({smaller})" if i else f" {size:,.2f} GiB")
        left.set_yticks(range(3), [b[0] for b in bars])
        left.set_xlim(0, sizes[0] * 2)  # room for the numbers after the longest bar
        left.set_xlabel(f"KV cache holding {context:,} tokens, one sequence or a batch's total (GiB)")
        left.set_title(f"{name} in {storage}: {bars[-1][1]:,} bytes per token", y=1.01)

        values = [100 * errors["keys"]["output"], 100 * errors["values"]["output"]]
        for bar, text, value, reference in zip(self.errors, self.percents, values, self.bf16_errors):
            bar.set_height(value)
            text.set_y(1.15 * max(value, reference))  # above the bar and the bf16 mark
            text.set_text(f"{value:.2g}%")
        right.set_title(f"measured: {storage}" + ("" if storage == "bf16" else f", {scaling} scale"), y=1.01)
        self.context = context


def draw_cache_shrink(layout: str = "GQA", group: int = 4, storage: str = "e4m3", scaling: str = "tensor",
                      context: int = 131072):
    """The figure of ``CacheShrinkView`` for these choices. Returns the Figure."""
    return moved_figure(CacheShrinkView(), layout, group, storage, scaling, context)


def cache_shrink_panel() -> widgets.VBox:
    """Layout, GQA group size, storage format, scaling and context -> the figure above."""
    style = {"description_width": "90px"}
    layout = widgets.ToggleButtons(options=LAYOUTS, value="GQA", description="attention", style=style)
    group = widgets.SelectionSlider(options=[2, 4, 8, 16], value=4, description="GQA group", style=style)
    storage = widgets.Dropdown(options=list(STORAGE), value="e4m3", description="storage", style=style)
    scaling = widgets.Dropdown(options=SCALINGS, value="tensor", description="scale", style=style)
    context = widgets.SelectionSlider(options=[(f"{c:,}", c) for c in CONTEXTS], value=131072,
                                      description="tokens", style=style)

    def enable(change=None):
        group.disabled = layout.value != "GQA"
        scaling.disabled = storage.value == "bf16"

    layout.observe(enable, names="value")
    storage.observe(enable, names="value")
    enable()
    controls = dict(layout=layout, group=group, storage=storage, scaling=scaling, context=context)
    view = CacheShrinkView()
    view.freeze()

    def show(**choices):
        view.move(**choices)
        show_figure(view.fig)

    out = widgets.interactive_output(show, controls)
    return widgets.VBox([layout, widgets.HBox([widgets.VBox([group, context]), widgets.VBox([storage, scaling])]), out])
