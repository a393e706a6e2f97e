"""How every widget panel shows a figure: one PNG render into the panel's output.

Rendering once ourselves skips the inline backend's second pass for a tight bounding box.
A panel that updates its figure in place (``freeze``) has its unchanging parts (axes, ticks,
labels) drawn once and pasted back on later renders, so a control move redraws only what moved:
text and tick labels are most of matplotlib's drawing time.
"""

from __future__ import annotations

import io

import ipywidgets as widgets
import matplotlib.pyplot as plt
from IPython.display import Image, clear_output, display
from matplotlib.artist import Artist


def show_figure(fig) -> None:
    """Display ``fig`` as a PNG in the current output (a panel's Output widget) and close it."""
    png = io.BytesIO()
    fig.savefig(png, format="png")
    plt.close(fig)
    display(Image(png.getvalue()))


class Frozen(Artist):
    """Draws ``axes`` (hidden from the figure's own draw) without their ``moving`` artists once per
    canvas size, keeps those pixels, and on later renders pastes them back (Agg's copy_from_bbox /
    restore_region, as in blitting), then draws the ``moving`` artists on top, in zorder. Drawn first
    (zorder -10): the figure's own artists go on top too. ``redraw()`` after a change to anything
    frozen (axis limits, ticks). A renderer without those methods (PDF, SVG) draws everything each time."""

    def __init__(self, axes: list, moving: list | tuple = ()):
        super().__init__()
        self.axes_drawn, self.moving, self.pixels, self.size = list(axes), list(moving), None, None
        self.set_zorder(-10)
        for ax in self.axes_drawn:
            ax.set_visible(False)

    def redraw(self) -> None:
        """Forget the kept pixels: the next render draws the frozen parts again."""
        self.pixels = None

    def draw(self, renderer) -> None:
        size = renderer.get_canvas_width_height()
        if self.pixels is None or size != self.size or not hasattr(renderer, "restore_region"):
            shown = [artist.get_visible() for artist in self.moving]
            for artist in self.moving:
                artist.set_visible(False)
            for ax in self.axes_drawn:
                ax.set_visible(True)
                try:
                    ax.draw(renderer)
                finally:
                    ax.set_visible(False)
            for artist, visible in zip(self.moving, shown):
                artist.set_visible(visible)
            if hasattr(renderer, "copy_from_bbox"):
                self.pixels, self.size = renderer.copy_from_bbox(self.figure.bbox), size
        else:
            renderer.restore_region(self.pixels)
        for artist in sorted(self.moving, key=lambda artist: artist.get_zorder()):  # as the axes would order them
            if artist.get_visible():
                artist.draw(renderer)


def freeze(fig, moving=()) -> Frozen:
    """Freeze every axes of ``fig`` but the ``moving`` artists (see ``Frozen``); returns the Frozen artist."""
    return fig.add_artist(Frozen(list(fig.axes), moving))


def stepped_panel(choice, step, make_view, last_step) -> widgets.VBox:
    """``choice`` (a dropdown) picks a view, made on its first choice by ``make_view(value)`` and frozen;
    ``step`` (an IntSlider) moves it, ``view.move(step)``, and the view's figure is shown. A view has
    ``fig``, ``freeze()`` and ``move(step)``; ``last_step(view)`` is the slider's maximum for it. A
    choice that clamps the slider renders once. Returns the panel: the two controls over the figure."""
    out, views, busy = widgets.Output(), {}, []

    def view():
        if choice.value not in views:
            views[choice.value] = make_view(choice.value)
            views[choice.value].freeze()
        return views[choice.value]

    def render(change=None) -> None:
        if busy:  # the slider clamped by a new choice: that choice renders once
            return
        current = view()
        current.move(step.value)
        with out:
            clear_output(wait=True)
            show_figure(current.fig)

    def choose(change=None) -> None:
        busy.append(True)
        try:
            step.max = last_step(view())
        finally:
            busy.clear()
        render()

    choice.observe(choose, names="value")
    step.observe(render, names="value")
    choose()
    return widgets.VBox([widgets.HBox([choice, step]), out])
