"""The lesson 03 step-through: the online softmax of one query row, block by block.

``online_states`` replays ``helpers.flash.block_update`` on one row and records every state;
``OnlineStepView`` draws them once and shows the state after a given number of blocks in place;
``draw_online_step`` returns that figure for one step; ``online_softmax_panel`` puts a slider on it.
"""

from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt
import numpy as np

from helpers.attention import softmax
from helpers.flash import demo_row, online_states
from helpers.panels.output import freeze, moved_figure, stepped_panel


class OnlineStepView:
    """The figure of one row's online softmax, drawn once; ``move(step)`` updates it in place.

    Three axes: the scores (this block red, seen blue, not yet grey) and the running max m; m and l
    after each block; the partial output o against the exact one. Axis limits cover every step and
    the axis labels and titles name what is drawn (no legend for the data to cross), so a move
    changes only bar colours and heights, line data and titles: the rest is frozen
    (``helpers.panels.output.freeze``) after ``freeze()``.
    """

    def __init__(self, block: int = 8, seed: int = 3):
        scores, values = demo_row(seed=seed)
        self.block, self.scores = block, scores
        self.states = online_states(scores, values, block)
        fig, (a, b, c) = plt.subplots(1, 3, figsize=(10.5, 3.3), dpi=80, gridspec_kw={"width_ratios": [1.6, 1, 1]})
        self.fig = fig
        self.score_bars = a.bar(np.arange(len(scores)), scores, color="lightgrey")
        self.m_line = a.axhline(scores.max(), color="black", ls="--", lw=1)  # named in the title: no legend to cross
        a.set_xlabel("key position (red: this block, blue: seen, grey: not yet)")
        a.set_ylabel("score")

        ms = [state["m"] for state in self.states[1:]]
        ls = [state["l"] for state in self.states[1:]]
        (self.m_plot,) = b.plot([], [], "o-")
        (self.l_plot,) = b.plot([], [], "s-")
        b.set_xlim(0.5, len(self.states) - 0.5)
        b.set_xticks(range(1, len(self.states)))
        low, high = min(ms + ls), max(ms + ls)
        b.set_ylim(low - 0.08 * (high - low), high + 0.08 * (high - low))
        b.set_xlabel("block: m, the max (circles); l, the sum (squares)", fontsize=8)

        self.exact = softmax(scores) @ values
        x = np.arange(values.shape[1])
        self.o_bars = c.bar(x - 0.2, np.zeros(len(x)), width=0.4)
        c.bar(x + 0.2, self.exact, width=0.4, color="lightgrey")
        every = np.concatenate([self.exact] + [state["o"] for state in self.states] + [[0.0]])
        c.set_ylim(every.min() - 0.1 * np.ptp(every), every.max() + 0.1 * np.ptp(every))
        c.set_xticks(x, [f"o[{i}]" for i in x])
        c.set_xlabel("blue: o so far; grey: exact", fontsize=8)
        for ax in (a, b, c):
            ax.set_title(" ", y=1.01)
        fig.subplots_adjust(left=0.06, right=0.99, bottom=0.17, top=0.88, wspace=0.3)
        # what a move changes, and the spines the bars touch
        self.moving = [*self.score_bars, self.m_line, self.m_plot, self.l_plot, *self.o_bars, a.title, b.title,
                       c.title, *a.spines.values()]
        self.frozen = None

    def freeze(self) -> None:
        """Keep the unchanging parts' pixels from the next render on (see ``helpers.panels.output.Frozen``)."""
        if self.frozen is None:
            self.frozen = freeze(self.fig, self.moving)

    def move(self, step: int) -> None:
        """Show the state after ``step`` blocks (0 .. number of blocks)."""
        states = self.states
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or not 0 <= step < len(states):
            raise ValueError(f"step must be between 0 and {len(states) - 1} for block {self.block}; got {step}")
        state = states[step]
        a, b, c = self.fig.axes[:3]
        position = np.arange(len(self.scores))
        seen = position < state["end"]
        current = seen & (position >= states[step - 1]["end"]) if step else np.zeros_like(seen)
        for bar, now, was in zip(self.score_bars, current, seen):
            bar.set_color("tab:red" if now else "tab:blue" if was else "lightgrey")
        self.m_line.set_visible(step > 0)
        if step:
            self.m_line.set_ydata([state["m"], state["m"]])
        a.set_title(f"after {step} of {len(states) - 1} blocks of {self.block}"
                    + (f": m = {state['m']:.2f} (dashed)" if step else ""), y=1.01)
        steps = np.arange(1, step + 1)
        self.m_plot.set_data(steps, [s["m"] for s in states[1:step + 1]])
        self.l_plot.set_data(steps, [s["l"] for s in states[1:step + 1]])
        b.set_title("rescale exp(m_old - m_new) = " + ("-" if step < 1 else f"{state['alpha']:.3f}"), y=1.01)
        for bar, height in zip(self.o_bars, state["o"]):
            bar.set_height(height)
        c.set_title("output" + (": equal to exact" if step == len(states) - 1 else ""), y=1.01)


def draw_online_step(step: int, block: int = 8, seed: int = 3):
    """The figure after ``step`` blocks (see ``OnlineStepView``). Returns the Figure."""
    return moved_figure(OnlineStepView(block, seed), step)


def online_softmax_panel() -> widgets.VBox:
    """A block-size dropdown and a step slider; each block size's figure is drawn once and then
    updated in place (``OnlineStepView``)."""
    block = widgets.Dropdown(options=[4, 8, 16], value=8, description="block")
    step = widgets.IntSlider(0, min=0, max=4, description="blocks seen")
    return stepped_panel(block, step, OnlineStepView, lambda view: len(view.states) - 1)
