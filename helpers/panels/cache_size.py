"""The lesson 01 panel: cache size against tokens, with the model's weights as a line.

``CacheSizeView`` draws the figure once and ``move``s it to new parameters; ``draw_cache_vs_tokens``
is a plain function of the parameters (tests call it without a browser); ``cache_size_panel``
wires a view to ipywidgets through ``interactive_output``.
"""

from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter, MaxNLocator

from helpers.models import MODELS, ModelConfig, get_model, reshaped
from helpers.panels.output import freeze, moved_figure, show_figure
from helpers.units import bytes_per_element, format_bytes, gib

CONTEXTS = [2**k for k in range(10, 21)]  # 1,024 .. 1,048,576 tokens
BATCHES = [1, 2, 4, 8, 16, 32, 64, 128]
HEAD_DIMS = [32, 64, 80, 96, 128, 192, 256]
DTYPES = [("fp32 (4 bytes)", "fp32"), ("bf16 / fp16 (2 bytes)", "bf16"), ("fp8 / int8 (1 byte)", "fp8")]


class CacheSizeView:
    """The panel's figure, drawn once; ``move(model, dtype, batch, context)`` updates it in place.

    The legend names the lines and sits under the axes, where nothing crosses it; the numbers are
    in the title.
    The x axis follows the context only, so the frozen parts (``helpers.panels.output.freeze``) are
    kept per context; a move redraws the lines, the y axis, the note and the title.
    """

    def __init__(self):
        fig, ax = plt.subplots(figsize=(7.5, 4.2), dpi=80)
        self.fig, self.ax = fig, ax
        (self.cache,) = ax.plot([], [], lw=2.5, label="KV cache")
        self.weights = ax.axhline(0, color="tab:red", ls="--", label="weights (bf16)")
        self.max_context = ax.axvline(0, color="grey", ls=":", label="the model's max context")
        (self.cross,) = ax.plot([], [], "ko", ms=8, zorder=3)
        # In the lower right, where the cache line is not (right of the crossing it is above the
        # weights line), and above the weights line when that line is low.
        self.note = ax.annotate("", (0, 0), xytext=(0.98, 0.05), textcoords="axes fraction", ha="right",
                                bbox=dict(facecolor="white", edgecolor="none", alpha=0.8),
                                arrowprops=dict(arrowstyle="-", color="grey", lw=0.8))
        self.never = ax.text(0.02, 0.8, "", transform=ax.transAxes, bbox=dict(facecolor="white", edgecolor="none"))
        ax.set_xlabel("tokens per sequence (thousands)")
        ax.set_ylabel("memory (GiB)")
        ax.yaxis.set_major_locator(MaxNLocator(5))  # few labels to draw on every move
        ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}" if abs(value) >= 100 else f"{value:g}"))
        ax.set_title(" ", y=1.01, fontsize=10)  # fixed y: no layout pass
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=3, fontsize=8, frameon=False)
        fig.subplots_adjust(left=0.12, right=0.98, bottom=0.2, top=0.88)  # fixed: tight_layout costs a draw
        self.context, self.frozen = None, None

    def freeze(self) -> None:
        """Keep the unchanging parts' pixels, per context, from the next render on."""
        if self.frozen is None:
            ax = self.ax
            self.frozen = freeze(self.fig, [ax.yaxis, self.cache, self.weights, self.max_context, self.cross, self.note,
                                            self.never, ax.title, *ax.spines.values()], key=lambda: self.context)

    def move(self, model: ModelConfig, dtype: str = "bf16", batch: int = 1, context: int = 131072) -> None:
        """Show the cache (GiB) of ``batch`` sequences of ``model`` in ``dtype`` against tokens
        0..``context``, the weights (bf16) as a line, and where the cache passes them."""
        bpe = bytes_per_element(dtype)
        weights = model.weight_bytes(2)
        # The cache is piecewise linear (a window bends it), so its corners draw it exactly.
        corners = sorted({0, context} | ({model.window} if model.window and model.window < context else set()))
        cache = [model.cache_bytes(t, batch, bpe) for t in corners]
        ax = self.ax
        self.cache.set_data([t / 1000 for t in corners], [gib(c) for c in cache])
        self.weights.set_ydata([gib(weights)] * 2)
        self.max_context.set_xdata([model.max_context / 1000] * 2)
        self.max_context.set_visible(model.max_context <= context)
        cross = model.crossover_tokens(batch, bpe)
        crosses = cross is not None and cross <= context
        self.cross.set_data(([cross / 1000], [gib(model.cache_bytes(cross, batch, bpe))]) if crosses else ([], []))
        for artist, shown in ((self.cross, crosses), (self.note, crosses), (self.never, not crosses)):
            artist.set_visible(shown)
        if crosses:
            self.note.set_text(f"cache > weights from {cross:,} tokens")
            self.note.xy = (cross / 1000, gib(weights))
            line = weights / (1.05 * max(weights, cache[-1]))  # the weights line's height in the axes
            self.note.xyann = (0.98, 0.05 if line > 0.2 else line + 0.06)
            self.never.set_text("")
        else:
            where = "never (windowed cache)" if cross is None else f"only at {cross:,} tokens"
            self.never.set_text(f"cache passes weights: {where}")
            self.note.set_text("")
        shape = "published shape" if MODELS.get(model.name) == model else "modified shape"
        ax.set_title(f"{model.name} ({shape}, {model.attention}): cache vs weights\n"
                     f"cache {dtype}, batch {batch}: {format_bytes(model.kv_bytes_per_token(bpe))}/token/seq; "
                     f"weights {gib(weights):,.1f} GiB; max context {model.max_context:,}", y=1.01, fontsize=10)
        ax.set_xlim(0, context / 1000)
        ax.set_ylim(0, 1.05 * gib(max(weights, cache[-1])))  # the cache never falls: its last corner is its top
        self.context = context


def draw_cache_vs_tokens(model: ModelConfig, dtype: str = "bf16", batch: int = 1, context: int = 131072):
    """Plot cache (GiB) for ``batch`` sequences against tokens 0..context, weights (bf16) as a line.

    Marks the token count where the cache passes the weights when it lies within ``context``.
    Returns the matplotlib Figure (a ``CacheSizeView``'s).
    """
    return moved_figure(CacheSizeView(), model, dtype, batch, context)


def cache_size_panel(model: str = "Llama-2-7B", batch: int = 1, context: int = 131072) -> widgets.VBox:
    """Dropdown of registry models plus sliders for layers, KV heads, head dim, dtype, batch, context
    (``batch`` and ``context`` are where those two start; each must be one of the slider's values)."""
    if batch not in BATCHES or context not in CONTEXTS:
        raise ValueError(f"batch must be one of {BATCHES} and context one of {CONTEXTS}; got {batch}, {context}")
    base = get_model(model)
    style = {"description_width": "90px"}
    pick = widgets.Dropdown(options=list(MODELS), value=base.name, description="model", style=style)
    layers = widgets.IntSlider(base.layers, min=1, max=160, description="layers", style=style)
    kv_heads = widgets.SelectionSlider(options=[base.kv_heads], description="KV heads", style=style)
    head_dim = widgets.SelectionSlider(options=[base.head_dim], description="head dim", style=style)
    dtype = widgets.Dropdown(options=DTYPES, value="bf16", description="cache dtype", style=style)
    batch = widgets.SelectionSlider(options=BATCHES, value=batch, description="batch", style=style)
    context = widgets.SelectionSlider(options=[(f"{c:,}", c) for c in CONTEXTS], value=context,
                                      description="context", style=style)
    quiet = {"on": False}

    def load(change=None):
        """Set the shape sliders to the chosen model's published values."""
        m = get_model(pick.value)
        quiet["on"] = True
        kv_heads.options = [d for d in range(1, m.q_heads + 1) if m.q_heads % d == 0]
        head_dim.options = sorted(set(HEAD_DIMS) | {m.head_dim})
        layers.value, kv_heads.value, head_dim.value = m.layers, m.kv_heads, m.head_dim
        kv_heads.disabled = head_dim.disabled = m.attention == "MLA"  # the latent sets the cache
        quiet["on"] = False

    pick.observe(load, names="value")  # registered first, so the sliders move before the redraw
    load()

    view = CacheSizeView()
    view.freeze()

    def show(model, layers, kv_heads, head_dim, dtype, batch, context):
        if not quiet["on"]:
            view.move(reshaped(model, layers, kv_heads, head_dim), dtype, batch, context)
            show_figure(view.fig)

    controls = dict(model=pick, layers=layers, kv_heads=kv_heads, head_dim=head_dim,
                    dtype=dtype, batch=batch, context=context)
    out = widgets.interactive_output(show, controls)
    left = widgets.VBox([pick, layers, kv_heads, head_dim])
    right = widgets.VBox([dtype, batch, context])
    return widgets.VBox([widgets.HBox([left, right]), out])
