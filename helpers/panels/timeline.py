"""The lesson 07 panel: what every request did at every step of a finished engine run, and the
block pool under it.

``runs`` is a dict name -> (requests, timeline) of finished ``helpers.engine`` runs: the
``Request`` list given to ``Engine.run`` and the engine's ``timeline`` (``StepRecord`` list).
``timeline_cells`` turns one run into a (requests, steps) array of states; ``draw_timeline`` draws
it; ``timeline_panel`` puts a run dropdown and a step slider on it. The figure of a run is drawn
once; a slider move only moves the cursor and rewrites the caption, then renders the PNG.
"""

from __future__ import annotations

import textwrap

import ipywidgets as widgets
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import MaxNLocator
from matplotlib.transforms import blended_transform_factory

from helpers.engine import Request, StepRecord
from helpers.panels.output import freeze, moved_figure, stepped_panel
from helpers.units import positive_int

# a cell of the image: what a request did at a step
ABSENT, WAITING, PREFILL, TOKEN = 0, 1, 2, 3
STATES = {ABSENT: ("not arrived / finished", "white"),
          WAITING: ("waiting (arrived, not fed)", "lightgrey"),
          PREFILL: ("prefill chunk (fed, no token yet)", "tab:orange"),
          TOKEN: ("token out (decode, or last prefill chunk)", "tab:blue")}
CACHE_COLOUR, USED_COLOUR, PREEMPT_COLOUR = "tab:green", "slategrey", "tab:red"


def _check_run(where: str, run) -> tuple[list[Request], list[StepRecord]]:
    """``run`` as (requests, timeline), or a ValueError that starts with ``where`` and says what is wrong."""
    if not isinstance(run, (tuple, list)) or len(run) != 2:
        raise ValueError(f"{where} must be a pair (requests, timeline), got {type(run).__name__}")
    requests, timeline = list(run[0]), list(run[1])
    if not requests or not timeline:
        raise ValueError(f"{where} has no requests or no steps: pass a finished Engine.run")
    rids = [r.rid for r in requests]
    if len(set(rids)) != len(rids):
        raise ValueError(f"{where}: request ids must be unique, got {rids}")
    steps = [s.step for s in timeline]
    if steps[0] < 0 or any(b <= a for a, b in zip(steps, steps[1:])):
        raise ValueError(f"{where}: the timeline's steps must be increasing from 0 or more")
    known = set(rids)
    for s in timeline:
        unknown = ({rid for rid, _ in s.fed} | set(s.produced) | set(s.preempted)) - known
        if unknown:
            raise ValueError(f"{where}: step {s.step} names requests not in its list: {sorted(unknown)}")
    return requests, timeline


def _pick(runs: dict, run: str) -> tuple[list[Request], list[StepRecord]]:
    if not runs:
        raise ValueError("runs is empty: give at least one name -> (requests, timeline)")
    if run not in runs:
        raise ValueError(f"unknown run {run!r}; runs: {list(runs)}")
    return _check_run(f"run {run!r}", runs[run])


def _pool(num_blocks, run: str) -> int | None:
    """The pool size of ``run``: ``num_blocks`` is None, one int for every run, or a dict name -> int."""
    if num_blocks is None:
        return None
    if isinstance(num_blocks, dict):
        if run not in num_blocks:
            raise ValueError(f"num_blocks has no pool size for run {run!r}")
        num_blocks = num_blocks[run]
    return positive_int("num_blocks", num_blocks)


def timeline_cells(requests: list[Request], timeline: list[StepRecord]) -> np.ndarray:
    """(len(requests), last step + 1) int8 array, row i = requests[i], column = step index: TOKEN where
    the request is in the step's ``produced``, PREFILL where it was fed without producing, WAITING
    from its arrival to its finish step when not fed, ABSENT otherwise. Steps the engine skipped
    (idle until the next arrival) have no record: their columns hold only WAITING/ABSENT cells."""
    requests, timeline = _check_run("timeline_cells", (requests, timeline))
    cells = np.full((len(requests), timeline[-1].step + 1), ABSENT, dtype=np.int8)
    row = {r.rid: i for i, r in enumerate(requests)}
    for i, r in enumerate(requests):
        end = cells.shape[1] - 1 if r.finish_step is None else r.finish_step
        cells[i, r.arrival:end + 1] = WAITING
    for s in timeline:
        for rid, _ in s.fed:
            cells[row[rid], s.step] = PREFILL
        for rid in s.produced:
            cells[row[rid], s.step] = TOKEN
    return cells


class TimelineView:
    """One run's figure, drawn once, and ``move(step)``: the cursor and caption updated in place.

    ``fig``: top axes, the requests (r0 at the top) against the step, an image of ``timeline_cells``;
    bottom axes, blocks in use and free blocks holding a cached prefix after each step (left axis,
    blocks; ``StepRecord.blocks_used`` and ``blocks_cached_free``),
    the pool as a dashed line, and the prefix-cache hit tokens per step (right axis, tokens).
    """

    def __init__(self, runs: dict, run: str, num_blocks: int | dict | None = None):
        requests, timeline = _pick(runs, run)
        self.run, self.pool = run, _pool(num_blocks, run)
        self.requests, self.cells = requests, timeline_cells(requests, timeline)
        self.steps = self.cells.shape[1]
        self.records = {s.step: s for s in timeline}
        self.admitted = [(rid, s.step, cached) for s in timeline for rid, cached in s.admitted]  # (rid, step, hits)
        row = {r.rid: i for i, r in enumerate(requests)}

        fig, (top, bottom) = plt.subplots(2, 1, figsize=(10.5, 5.6), dpi=80, sharex=True,
                                          gridspec_kw={"height_ratios": [2.2, 1]})
        self.fig, self.top, self.bottom = fig, top, bottom
        cmap = ListedColormap([STATES[k][1] for k in sorted(STATES)])
        self.image = top.imshow(self.cells, cmap=cmap, vmin=-0.5, vmax=len(STATES) - 0.5, aspect="auto",
                                interpolation="nearest", extent=(-0.5, self.steps - 0.5, len(requests) - 0.5, -0.5))
        every = max(1, int(np.ceil(len(requests) / 24)))
        top.set_yticks(range(0, len(requests), every), [r.rid for r in requests][::every], fontsize=8)
        top.set_ylabel("request")
        pre = [(s.step, row[rid]) for s in timeline for rid in s.preempted]
        hit = [(step, row[rid]) for rid, step, cached in self.admitted if cached]
        top.plot([x for x, _ in pre], [y for _, y in pre], "x", color=PREEMPT_COLOUR, ms=8, mew=2.5)
        top.plot([x for x, _ in hit], [y for _, y in hit], "*", color=CACHE_COLOUR, mec="black", mew=0.5, ms=10)
        handles = [Patch(facecolor=c, edgecolor="grey", label=label) for label, c in STATES.values()]
        handles += [Line2D([], [], ls="", marker="x", color=PREEMPT_COLOUR, ms=8, mew=2.5, label="preempted"),
                    Line2D([], [], ls="", marker="*", color=CACHE_COLOUR, mec="black", mew=0.5, ms=10,
                           label="admitted with prefix-cache hits")]
        top.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        figures = (f"{len(requests)} requests, {len(timeline)} steps, {len(pre)} preemption{'s' * (len(pre) != 1)}, "
                   f"{sum(r.cached_tokens for r in requests)} tokens served by the prefix cache (at every admission)")
        top.set_title(f"{run}: {figures}", fontsize=10, y=1.01, loc="left")  # runs on over the legend, not off the left

        x = np.arange(self.steps)
        used = np.zeros(self.steps)
        cached = np.zeros(self.steps)
        hits = np.zeros(self.steps)
        last = 0
        for step in x:  # a step the engine skipped while idle: no block in use, the cached ones stay
            s = self.records.get(step)
            last = s.blocks_cached_free if s else last
            used[step], cached[step], hits[step] = (s.blocks_used, last, s.cache_hit_tokens) if s else (0, last, 0)
        bottom.fill_between(x, 0, used, step="mid", color=USED_COLOUR, alpha=0.8, lw=0, label="blocks in use (after the step)")
        bottom.fill_between(x, used, used + cached, step="mid", color=CACHE_COLOUR, alpha=0.35, lw=0,
                            label="free, holding a cached prefix")
        if self.pool is not None:
            bottom.axhline(self.pool, color="black", ls="--", lw=1, label=f"pool: {self.pool} blocks")
        top_blocks = max(float((used + cached).max()), float(self.pool or 0), 1.0)
        bottom.set_ylim(0, top_blocks * 1.15)
        bottom.set_ylabel("blocks")
        bottom.set_xlabel("step (one forward pass)")
        bottom.set_xlim(-0.5, self.steps - 0.5)
        right = bottom.twinx()
        at = np.flatnonzero(hits)
        right.vlines(at, 0, hits[at], color=CACHE_COLOUR, lw=1.5)
        right.plot(at, hits[at], "v", color=CACHE_COLOUR, mec="black", mew=0.5, ms=6, label="prefix-cache hits")
        right.set_ylim(0, max(float(hits.max()), 1.0) * 1.3)
        right.set_ylabel("hit tokens", color=CACHE_COLOUR)
        for axis in (bottom.yaxis, right.yaxis):
            axis.set_major_locator(MaxNLocator(nbins=4, integer=True))
        lines, labels = bottom.get_legend_handles_labels()
        more, more_labels = right.get_legend_handles_labels()
        bottom.legend(lines + more, labels + more_labels, fontsize=8, loc="upper left", bbox_to_anchor=(1.08, 1.0))

        fig.subplots_adjust(left=0.06, right=0.7, bottom=0.09, top=0.84, hspace=0.08)
        # figure-level artists placed through the axes' transforms: they still draw once the axes are frozen
        self.cursors = [fig.add_artist(Rectangle((-0.5, 0), 1, 1, transform=blended_transform_factory(
            ax.transData, ax.transAxes), fill=False, ec="black", lw=1.5, zorder=5, gid="cursor")) for ax in (top, bottom)]
        self.caption = fig.text(0.01, 0.985, "", fontsize=9, va="top", family="monospace", gid="caption")
        self.frozen = False

    def freeze(self) -> None:
        """From now on the axes (all but the cursor and caption) are rendered once per image size
        and pasted back on later renders (``helpers.panels.output.freeze``): a step move renders only the cursor, the
        caption and the PNG. The axes keep their artists, hidden from the figure's own draw."""
        if not self.frozen:
            freeze(self.fig)
            self.frozen = True

    def describe(self, step: int) -> str:
        """Who was fed how many tokens at ``step`` (wrapped), then a line of blocks, hits and preemptions."""
        s = self.records.get(step)
        if s is None:
            return f"step {step}: idle (no request waiting or running; the engine skipped to the next arrival)\n"
        fed = ", ".join(f"{rid} {n} " + ("(token)" if rid in s.produced else "(prefill)") for rid, n in s.fed)
        pool = f" of {self.pool}" if self.pool is not None else ""
        hits = [f"{rid} {cached}" for rid, at, cached in self.admitted if at == step and cached]
        hit = f"prefix-cache hits {s.cache_hit_tokens} tokens" + (f" ({', '.join(hits)})" if hits else "")
        preempted = f" | preempted {', '.join(s.preempted)}" if s.preempted else ""
        return "\n".join(textwrap.wrap(f"step {step}, tokens fed: {fed}", 125, subsequent_indent="  ") +
                         [f"{s.blocks_used}{pool} blocks in use, {s.blocks_cached_free} free with a cached prefix | "
                          f"{hit}{preempted}"])

    def move(self, step: int) -> None:
        """Put the cursor on ``step`` (0 .. steps - 1) and rewrite the caption; nothing is redrawn."""
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or not 0 <= step < self.steps:
            raise ValueError(f"step must be an int between 0 and {self.steps - 1} for run {self.run!r}; got {step!r}")
        for cursor in self.cursors:
            cursor.set_x(step - 0.5)
        self.caption.set_text(self.describe(int(step)))


def draw_timeline(runs: dict, run: str, step: int = 0, num_blocks: int | dict | None = None):
    """The figure of ``runs[run]`` (requests x steps, and the block pool) with the cursor on ``step``.

    ``runs``: name -> (requests, timeline) of finished engine runs. ``num_blocks``: the pool size
    to draw as a dashed line, one int for every run or a dict name -> int (None: no line).
    Returns the Figure."""
    return moved_figure(TimelineView(runs, run, num_blocks), step)


def timeline_panel(runs: dict, num_blocks: int | dict | None = None) -> widgets.VBox:
    """A run dropdown and a step slider over ``draw_timeline`` (``runs`` and ``num_blocks`` as
    there). Each run's figure is drawn once, when the panel is built, and frozen
    (``TimelineView.freeze``); a step move updates the cursor and caption in place and renders the
    PNG (``helpers.panels.output.stepped_panel``); choosing a run clamps the slider to that run's steps."""
    if not runs:
        raise ValueError("runs is empty: give at least one name -> (requests, timeline)")
    for name in runs:
        _check_run(f"run {name!r}", runs[name])
        _pool(num_blocks, name)
    first = next(iter(runs))
    run = widgets.Dropdown(options=list(runs), value=first, description="run")
    step = widgets.IntSlider(0, min=0, max=1, description="step")
    return stepped_panel(run, step, lambda name: TimelineView(runs, name, num_blocks), lambda view: view.steps - 1)
