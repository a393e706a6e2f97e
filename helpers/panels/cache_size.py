"""The lesson 01 panel: cache size against tokens, with the model's weights as a line.

``draw_cache_vs_tokens`` is a plain function of the parameters (tests call it without a
browser); ``cache_size_panel`` wires it to ipywidgets through ``interactive_output``.
"""

from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt

from helpers.models import MODELS, ModelConfig, get_model, reshaped
from helpers.panels.output import show_figure
from helpers.units import bytes_per_element, format_bytes, gib

CONTEXTS = [2**k for k in range(10, 21)]  # 1,024 .. 1,048,576 tokens
BATCHES = [1, 2, 4, 8, 16, 32, 64, 128]
HEAD_DIMS = [32, 64, 80, 96, 128, 192, 256]
DTYPES = [("fp32 (4 bytes)", "fp32"), ("bf16 / fp16 (2 bytes)", "bf16"), ("fp8 / int8 (1 byte)", "fp8")]


def draw_cache_vs_tokens(model: ModelConfig, dtype: str = "bf16", batch: int = 1, context: int = 131072):
    """Plot cache (GiB) for ``batch`` sequences against tokens 0..context, weights (bf16) as a line.

    Marks the token count where the cache passes the weights when it lies within ``context``.
    Returns the matplotlib Figure.
    """
    bpe = bytes_per_element(dtype)
    weights = model.weight_bytes(2)
    # The cache is piecewise linear (a window bends it), so its corners draw it exactly.
    corners = sorted({0, context} | ({model.window} if model.window and model.window < context else set()))
    cache = [model.cache_bytes(t, batch, bpe) for t in corners]

    fig, ax = plt.subplots(figsize=(7.5, 4.2), dpi=80)
    ax.plot([t / 1000 for t in corners], [gib(c) for c in cache], lw=2.5,
            label=f"KV cache, {dtype}, batch {batch} ({format_bytes(model.kv_bytes_per_token(bpe))}/token/seq)")
    ax.axhline(gib(weights), color="tab:red", ls="--", label=f"weights, bf16: {gib(weights):,.1f} GiB")
    if model.max_context <= context:
        ax.axvline(model.max_context / 1000, color="grey", ls=":",
                   label=f"{model.name} max context ({model.max_context:,})")
    cross = model.crossover_tokens(batch, bpe)
    if cross is not None and cross <= context:
        ax.plot([cross / 1000], [gib(model.cache_bytes(cross, batch, bpe))], "ko", ms=8, zorder=3)
        right_half = cross > context / 2
        low_line = weights < 0.5 * max(weights, cache[-1])  # room above the weights line?
        ax.annotate(f"cache > weights\nfrom {cross:,} tokens", (cross / 1000, gib(weights)),
                    xytext=(-10 if right_half else 10, 12 if low_line else -40), textcoords="offset points",
                    ha="right" if right_half else "left")
    else:
        where = "never (windowed cache)" if cross is None else f"only at {cross:,} tokens"
        ax.text(0.02, 0.8, f"cache passes weights: {where}", transform=ax.transAxes,
                bbox=dict(facecolor="white", edgecolor="none"))
    ax.set_xlabel("tokens per sequence (thousands)")
    ax.set_ylabel("memory (GiB)")
    shape = "published shape" if MODELS.get(model.name) == model else "modified shape"
    ax.set_title(f"{model.name} ({shape}, {model.attention}): cache vs weights", y=1.01)  # fixed y: no layout pass
    ax.set_xlim(0, context / 1000)
    ax.set_ylim(0, None)
    ax.legend(loc="best", fontsize=8)
    fig.subplots_adjust(left=0.09, right=0.98, bottom=0.12, top=0.92)  # fixed: tight_layout costs a draw
    return fig


def _show(model, layers, kv_heads, head_dim, dtype, batch, context):
    show_figure(draw_cache_vs_tokens(reshaped(model, layers, kv_heads, head_dim), dtype, batch, context))


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

    def show(**params):
        if not quiet["on"]:
            _show(**params)

    controls = dict(model=pick, layers=layers, kv_heads=kv_heads, head_dim=head_dim,
                    dtype=dtype, batch=batch, context=context)
    out = widgets.interactive_output(show, controls)
    left = widgets.VBox([pick, layers, kv_heads, head_dim])
    right = widgets.VBox([dtype, batch, context])
    return widgets.VBox([widgets.HBox([left, right]), out])
