"""The lesson 02 panel: attention layout and storage format -> cache size and measured error.

The shape is Llama-2-7B's (32 layers, 32 query heads, head dim 128). The layouts: MHA (32 K/V
heads), GQA (query heads in groups sharing a K/V head), MQA (one K/V head) and MLA with
DeepSeek's proportions (a latent of 4 x head dim plus a rotary key of head dim / 2 per layer).
``draw_cache_shrink`` is a plain function of the choices; ``cache_shrink_panel`` wires it to widgets.
"""

from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt

from helpers.kv_cache_size import LAYOUTS, cache_bytes, layout_bytes_per_token
from helpers.kv_quant import measured_errors
from helpers.panels.output import show_figure
from helpers.units import gib

STORAGE = ("bf16", "int8", "e4m3", "e5m2")  # the formats the panel offers (bytes: helpers.units.DTYPE_BYTES)
SCALINGS = ("tensor", "channel", "token", "uncalibrated")
CONTEXTS = [2**k for k in range(12, 21)]


def draw_cache_shrink(layout: str = "GQA", group: int = 4, storage: str = "e4m3", scaling: str = "tensor",
                      context: int = 131072):
    """Left: cache holding ``context`` tokens (one sequence, or a batch's total) for MHA bf16, the layout in bf16, and the layout
    in ``storage``. Right: the measured attention-output error of that storage. Returns the Figure."""
    name = f"GQA, groups of {group}" if layout == "GQA" else layout
    bars = [("MHA, bf16", layout_bytes_per_token("MHA")), (f"{name}, bf16", layout_bytes_per_token(layout, group)),
            (f"{name}, {storage}", layout_bytes_per_token(layout, group, storage))]
    baseline = bars[0][1]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9.5, 3.6), dpi=80, gridspec_kw={"width_ratios": [1.4, 1]})
    sizes = [gib(cache_bytes(context, per_token)) for _, per_token in bars]
    left.barh([b[0] for b in bars], sizes, color=["tab:grey", "tab:blue", "tab:green"])
    for i, ((_, per_token), size) in enumerate(zip(bars, sizes)):
        left.text(size, i, f" {size:,.2f} GiB ({baseline / per_token:.3g}x smaller)" if i else f" {size:,.1f} GiB",
                  va="center", fontsize=8)
    left.invert_yaxis()
    left.set_xlim(0, sizes[0] * 1.6)
    left.set_xlabel(f"KV cache holding {context:,} tokens, one sequence or a batch's total (GiB)")
    left.set_title(f"{name} in {storage}: {bars[-1][1]:,} bytes per token", y=1.01)  # fixed y: no layout pass

    errors = measured_errors(storage, scaling)
    labels = ["keys stored", "values stored"]
    values = [100 * errors["keys"]["output"], 100 * errors["values"]["output"]]
    right.bar(labels, values, color=["tab:orange", "tab:purple"])
    bf16 = measured_errors("bf16", "none")
    right.scatter(labels, [100 * bf16["keys"]["output"], 100 * bf16["values"]["output"]], marker="_", s=900,
                  color="black", zorder=3, label="bf16, for comparison")
    right.legend(loc="upper right", fontsize=8)
    for i, v in enumerate(values):
        right.text(i, v, f"{v:.2g}%", ha="center", va="bottom", fontsize=9)
    right.set_yscale("log")
    right.set_ylim(0.05, 300)
    right.set_yticks([0.1, 1, 10, 100], ["0.1", "1", "10", "100"])
    right.minorticks_off()  # fewer ticks to lay out: part of keeping a redraw fast
    right.set_ylabel("attention output error (%)")
    right.set_title(f"measured: {storage}" + ("" if storage == "bf16" else f", {scaling} scale"), y=1.01)
    fig.subplots_adjust(left=0.2, right=0.98, bottom=0.16, top=0.88, wspace=0.35)
    return fig


def _show(**choices):
    show_figure(draw_cache_shrink(**choices))


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
    out = widgets.interactive_output(_show, controls)
    return widgets.VBox([layout, widgets.HBox([widgets.VBox([group, context]), widgets.VBox([storage, scaling])]), out])
