"""The lesson 03 step-through: the online softmax of one query row, block by block.

``online_states`` replays ``helpers.flash.block_update`` on one row and records every state;
``draw_online_step`` draws the state after a given number of blocks; ``online_softmax_panel``
puts a slider on it.
"""

from __future__ import annotations

import math

import ipywidgets as widgets
import matplotlib.pyplot as plt
import numpy as np

from helpers.attention import softmax
from helpers.flash import demo_row, online_states
from helpers.panels.output import show_figure


def draw_online_step(step: int, block: int = 8, seed: int = 3):
    """Three panels after ``step`` blocks: the scores seen and the running max; m and l so far;
    the partial output against the exact one. Returns the Figure."""
    scores, values = demo_row(seed=seed)
    states = online_states(scores, values, block)
    if not 0 <= step < len(states):
        raise ValueError(f"step must be between 0 and {len(states) - 1} for block {block}; got {step}")
    state = states[step]
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(10.5, 3.3), dpi=80, gridspec_kw={"width_ratios": [1.6, 1, 1]})
    seen = np.arange(len(scores)) < state["end"]
    current = seen & (np.arange(len(scores)) >= states[step - 1]["end"]) if step else np.zeros_like(seen)
    a.bar(np.arange(len(scores)), scores, color=np.where(current, "tab:red", np.where(seen, "tab:blue", "lightgrey")))
    if step:
        a.axhline(state["m"], color="black", ls="--", lw=1, label=f"m = {state['m']:.2f}")
        a.legend(loc="upper left", fontsize=8)
    a.set_xlabel("key position (red: this block, blue: seen, grey: not yet)")
    a.set_ylabel("score")
    a.set_title(f"after {step} of {len(states) - 1} blocks of {block}", y=1.01)

    steps = np.arange(1, step + 1)
    b.plot(steps, [s["m"] for s in states[1:step + 1]], "o-", label="m (running max)")
    b.plot(steps, [s["l"] for s in states[1:step + 1]], "s-", label="l (running sum)")
    b.set_xlim(0.5, len(states) - 0.5)
    b.set_xlabel("block")
    b.legend(fontsize=8, loc="lower right")
    alpha = state["alpha"]
    b.set_title("rescale exp(m_old - m_new) = " + ("-" if step < 2 else f"{alpha:.3f}"), y=1.01)

    exact = softmax(scores) @ values
    x = np.arange(values.shape[1])
    c.bar(x - 0.2, state["o"], width=0.4, label="o so far")
    c.bar(x + 0.2, exact, width=0.4, label="exact", color="lightgrey")
    c.set_xticks(x, [f"o[{i}]" for i in x])
    c.legend(fontsize=8, loc="lower right")
    c.set_title("output" + (": equal to exact" if step == len(states) - 1 else ""), y=1.01)
    fig.subplots_adjust(left=0.06, right=0.99, bottom=0.17, top=0.88, wspace=0.3)
    return fig


def online_softmax_panel() -> widgets.VBox:
    """A block-size dropdown and a step slider over ``draw_online_step``."""
    block = widgets.Dropdown(options=[4, 8, 16], value=8, description="block")
    step = widgets.IntSlider(0, min=0, max=4, description="blocks seen")

    def limit(change=None):
        step.max = math.ceil(32 / block.value)

    block.observe(limit, names="value")
    limit()
    out = widgets.interactive_output(lambda step, block: show_figure(draw_online_step(step, block)),
                                     {"step": step, "block": block})
    return widgets.VBox([widgets.HBox([block, step]), out])
