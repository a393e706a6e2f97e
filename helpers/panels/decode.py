"""The lesson 04 decode panel: generation one token at a time, with each layer's cache and the
new token's attention row.

``record_decode`` runs greedy generation with a KV cache once and keeps, for every step, the
token, the cache's shape and bytes, and every layer's attention weights of the new token;
``DecodeView`` draws that record once and ``move``s to a step (for a deep model, a spread of its
layers); ``draw_decode_step`` returns one step's figure; ``decode_panel`` puts a slider on a view. It works for the course's byte model and, given the
tokenizer's ``decode``, for SmolLM2.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import ipywidgets as widgets
import matplotlib.pyplot as plt
import numpy as np
import torch

from helpers.llama import LlamaForCausalLM, decode_steps
from helpers.panels.output import freeze, moved_figure, show_figure
from helpers.text_data import decode as decode_bytes
from helpers.units import format_bytes, positive_int


@dataclass
class DecodeStep:
    token: int  # the token this step produced
    length: int  # positions in the cache after the step's forward pass
    cache_shape: tuple  # (batch, kv_heads, length, head_dim), per layer, for keys and for values
    cache_bytes: int
    attention: np.ndarray  # (layers, heads, length): the step's last query over every cached position


def record_decode(model: LlamaForCausalLM, prompt_ids: torch.Tensor, new_tokens: int) -> list[DecodeStep]:
    """Greedy generation with a cache (``helpers.llama.decode_steps``), keeping what the panel
    shows after each step. Step 0 is the prefill."""
    if prompt_ids.ndim != 2 or prompt_ids.shape[0] != 1:
        raise ValueError(f"prompt_ids must be (1, prompt), got shape {tuple(prompt_ids.shape)}")
    c, steps = model.config, []
    for ids, _, cache in decode_steps(model, prompt_ids, positive_int("new_tokens", new_tokens), keep_attention=True):
        rows = torch.stack([w[0, :, -1, :] for w in model.attention_weights]).float().cpu()  # (layers, heads, length)
        steps.append(DecodeStep(int(ids[0, -1]), cache.length, (1, c.kv_heads, cache.length, c.head_dim),
                                cache.nbytes(), rows.numpy()))
    return steps


def shown_layers(n_layers: int, most: int = 6) -> list[int]:
    """Every layer when there are at most ``most``; else ``most`` layers spread from the first to the last."""
    if n_layers <= most:
        return list(range(n_layers))
    return sorted({int(round(x)) for x in np.linspace(0, n_layers - 1, most)})


class DecodeView:
    """The figure of one recorded generation, drawn once; ``move(step)`` shows a step in place.

    Left: the cache held per layer after the step. Right: the attention rows of the token just fed
    in, for ``layers`` (default: ``shown_layers``), over every position the generation will cache:
    positions not cached yet are blank, and one colour scale (the largest weight of any step) serves
    every step. So a move changes the bars, the image and the titles; the rest is frozen
    (``helpers.panels.output.freeze``) after ``freeze()``. ``decode`` turns token ids into text (the
    course's byte decoder by default; pass a tokenizer's ``decode`` for another model).
    """

    def __init__(self, steps: list[DecodeStep], prompt_ids: torch.Tensor,
                 decode: Callable[[list[int]], str] = decode_bytes, layers: list[int] | None = None):
        n_layers, heads, _ = steps[0].attention.shape
        layers = shown_layers(n_layers) if layers is None else list(layers)
        if not layers or any(not 0 <= l < n_layers for l in layers):
            raise ValueError(f"layers must be a non-empty list of layer numbers in 0..{n_layers - 1}; got {layers}")
        self.steps, self.layers, self.decode = steps, layers, decode
        self.prompt = decode(prompt_ids[0].tolist())
        self.rows = np.full((len(steps), len(layers) * heads, steps[-1].length), np.nan)  # (step, row, position)
        for i, s in enumerate(steps):
            self.rows[i, :, : s.length] = s.attention[layers].reshape(len(layers) * heads, s.length)
        fig, (a, b) = plt.subplots(1, 2, figsize=(10.5, 3.6), dpi=80, gridspec_kw={"width_ratios": [1, 2.2]})
        self.fig, self.a, self.b = fig, a, b
        self.bars = a.barh(np.arange(n_layers), [0] * n_layers, color="tab:blue")
        a.set_yticks(shown_layers(n_layers, 10), [f"layer {l}" for l in shown_layers(n_layers, 10)])
        a.invert_yaxis()
        a.tick_params(axis="y", length=0)  # no tick marks where the bars, which move, start
        a.set_xlabel("cache held per layer (KiB)")
        a.set_xlim(0, steps[-1].cache_bytes / n_layers / 1024 * 1.1)
        a.set_title(" ", fontsize=9, y=1.01)  # fixed y: no layout pass
        self.image = b.imshow(self.rows[0], aspect="auto", cmap="magma", vmin=0, vmax=float(np.nanmax(self.rows)),
                              interpolation="nearest")
        b.set_yticks([i * heads for i in range(len(layers))], [f"L{l} h0" for l in layers])
        b.tick_params(length=0)  # no tick marks over the image's edges, which move (the labels stay)
        b.set_xlabel("cached position (blank: not cached yet)")
        fig.colorbar(self.image, ax=b, label="attention weight")
        b.set_title(" ", fontsize=9, y=1.01)
        fig.subplots_adjust(left=0.07, right=0.98, bottom=0.15, top=0.88, wspace=0.25)
        self.frozen = None

    def freeze(self) -> None:
        """Keep the unchanging parts' pixels from the next render on."""
        if self.frozen is None:
            a, b = self.a, self.b
            self.frozen = freeze(self.fig, [*self.bars, self.image, a.title, b.title, *a.spines.values(),
                                            *b.spines.values()])

    def move(self, step: int) -> None:
        """Show the text so far, the cache after ``step``, and the attention rows of the token just fed in."""
        if not 0 <= step < len(self.steps):
            raise ValueError(f"step must be between 0 and {len(self.steps) - 1}; got {step}")
        s = self.steps[step]
        for bar in self.bars:
            bar.set_width(s.cache_bytes / len(self.bars) / 1024)
        self.a.set_title(f"K and V each {s.cache_shape}; total {format_bytes(s.cache_bytes)}", fontsize=9, y=1.01)
        self.image.set_data(self.rows[step])
        made = self.decode([t.token for t in self.steps[: step + 1]])
        shown = (self.prompt + made)[-60:].replace("\n", "\u21b5")
        self.b.set_title(f"step {step}: ...{shown!r}", fontsize=9, y=1.01)


def draw_decode_step(steps: list[DecodeStep], step: int, prompt_ids: torch.Tensor,
                     decode: Callable[[list[int]], str] = decode_bytes, layers: list[int] | None = None):
    """The text so far, the cache after ``step``, and the attention rows of the token just fed in
    (see ``DecodeView``). Returns the Figure."""
    return moved_figure(DecodeView(steps, prompt_ids, decode, layers), step)


def decode_panel(model: LlamaForCausalLM, prompt_ids: torch.Tensor, new_tokens: int = 48,
                 decode: Callable[[list[int]], str] = decode_bytes, layers: list[int] | None = None) -> widgets.VBox:
    """A slider over the steps of one recorded greedy generation (``decode`` and ``layers`` as in
    ``draw_decode_step``)."""
    view = DecodeView(record_decode(model, prompt_ids, new_tokens), prompt_ids, decode, layers)
    view.freeze()
    slider = widgets.IntSlider(0, min=0, max=len(view.steps) - 1, description="step")

    def show(step):
        view.move(step)
        show_figure(view.fig)

    out = widgets.interactive_output(show, {"step": slider})
    return widgets.VBox([slider, out])
