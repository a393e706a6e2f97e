"""How every widget panel shows a figure: one PNG render into the panel's output.

Rendering once ourselves skips the inline backend's second pass for a tight bounding box.
Each panel draws its figure once and updates it in place (a ``...View`` class with ``move``), and
``freeze`` keeps the unchanging parts (axes, ticks, labels) as pixels pasted back on later
renders, so a control move redraws only what moved: text and tick labels are most of
matplotlib's drawing time.

A quick drag queues no stale redraws: jupyter-widgets' frontend keeps at most one message per
control in flight and merges the moves made meanwhile, sending only the latest once the kernel
reports idle for the one in flight. So a burst of moves draws its first value and then its last
(``tests_browser`` checks it).
"""

from __future__ import annotations

import io

import ipywidgets as widgets
import matplotlib.pyplot as plt
import numpy as np
import PIL.Image
from IPython.display import Image, clear_output, display
from matplotlib.artist import Artist
from matplotlib.backends.backend_agg import FigureCanvasAgg


def show_figure(fig) -> None:
    """Display ``fig`` as a PNG in the current output (a panel's Output widget) and close it.

    Drawn on the figure's own canvas and written as RGB with light compression: a few
    milliseconds less per redraw than ``savefig``, for a PNG of about the same size."""
    if not hasattr(fig.canvas, "buffer_rgba"):  # a canvas that does not draw pixels: give it Agg's
        FigureCanvasAgg(fig)
    fig.canvas.draw()
    png = io.BytesIO()
    PIL.Image.fromarray(np.asarray(fig.canvas.buffer_rgba())[..., :3]).save(png, format="png", compress_level=1)
    plt.close(fig)
    display(Image(png.getvalue()))


def moved_figure(view, *args, **kwargs):
    """``view.move(*args, **kwargs)`` and its figure: what every ``draw_*`` function returns. A move
    that raises (a bad argument) closes the figure first, so nothing is left open in pyplot."""
    try:
        view.move(*args, **kwargs)
    except Exception:
        plt.close(view.fig)
        raise
    return view.fig


class Frozen(Artist):
    """Draws ``axes`` (hidden from the figure's own draw) without their ``moving`` artists, keeps
    those pixels, and on later renders pastes them back (Agg's copy_from_bbox / restore_region, as
    in blitting), then draws the ``moving`` artists on top, in zorder. Drawn first (zorder -10): the
    figure's own artists go on top too.

    ``key()`` names the state of the frozen parts (say, the axis limits a control sets): pixels are
    kept per key and canvas size, the ``KEEP`` most recent, so returning to a state pastes it back.
    Whatever changes a frozen part must change the key too. A renderer without those methods (PDF,
    SVG) draws everything each time."""

    KEEP = 16

    def __init__(self, axes: list, moving: list | tuple = (), key=None):
        super().__init__()
        self.axes_drawn, self.moving, self.key, self.pixels = list(axes), list(moving), key, {}
        self.set_zorder(-10)
        for ax in self.axes_drawn:
            ax.set_visible(False)

    def draw(self, renderer) -> None:
        state = (renderer.get_canvas_width_height(), self.key() if self.key else None)
        if state in self.pixels and hasattr(renderer, "restore_region"):
            self.pixels[state] = self.pixels.pop(state)  # the most recent last
            renderer.restore_region(self.pixels[state])
        else:
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
                while len(self.pixels) >= self.KEEP:
                    del self.pixels[next(iter(self.pixels))]
                self.pixels[state] = renderer.copy_from_bbox(self.figure.bbox)
        for artist in sorted(self.moving, key=lambda artist: artist.get_zorder()):  # as the axes would order them
            if artist.get_visible():
                artist.draw(renderer)


def freeze(fig, moving=(), key=None) -> Frozen:
    """Freeze every axes of ``fig`` but the ``moving`` artists, kept per ``key()`` (see ``Frozen``);
    returns the Frozen artist."""
    return fig.add_artist(Frozen(list(fig.axes), moving, key))


def stepped_panel(choice, step, make_view, last_step) -> widgets.VBox:
    """``choice`` (a dropdown) picks a view, made by ``make_view(value)`` and frozen; ``step`` (an
    IntSlider) moves it, ``view.move(step)``, and the view's figure is shown. A view has ``fig``,
    ``freeze()`` and ``move(step)``; ``last_step(view)`` is the slider's maximum for it. Every
    choice's figure is drawn once here, so a later choice only moves it; a choice that clamps the
    slider renders once. Returns the panel: the two controls over the figure."""
    out, views, busy = widgets.Output(), {}, []
    for option in choice.options:
        value = option[1] if isinstance(option, tuple) else option  # (label, value) or value
        views[value] = make_view(value)
        views[value].freeze()
        views[value].move(0)
        views[value].fig.canvas.draw()  # keeps the frozen pixels
        plt.close(views[value].fig)  # out of pyplot, which would show it at the cell's end

    def render(change=None) -> None:
        if busy:  # the slider clamped by a new choice: that choice renders once
            return
        current = views[choice.value]
        current.move(step.value)
        with out:
            clear_output(wait=True)
            show_figure(current.fig)

    def choose(change=None) -> None:
        busy.append(True)
        try:
            step.max = last_step(views[choice.value])
        finally:
            busy.clear()
        render()

    choice.observe(choose, names="value")
    step.observe(render, names="value")
    choose()
    return widgets.VBox([widgets.HBox([choice, step]), out])
