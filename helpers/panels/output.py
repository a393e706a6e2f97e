"""How every widget panel shows a redrawn figure: one PNG render, then the figure is closed.

Rendering once ourselves skips the inline backend's second pass for a tight bounding box,
which keeps a slider move well under 150 ms.
"""

from __future__ import annotations

import io

import matplotlib.pyplot as plt
from IPython.display import Image, display


def show_figure(fig) -> None:
    """Display ``fig`` as a PNG in the current output (a panel's Output widget) and close it."""
    png = io.BytesIO()
    fig.savefig(png, format="png")
    plt.close(fig)
    display(Image(png.getvalue()))
