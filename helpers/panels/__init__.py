"""The lessons' widget panels: one module per panel, each a plain ``draw_...`` function of the
choices (tested without a browser) and a ``..._panel()`` that wires it to ipywidgets. These are the
only modules that need widgets; what they draw is computed by the concept modules one level up.
``output.show_figure`` is how every panel shows a redrawn figure.
"""
