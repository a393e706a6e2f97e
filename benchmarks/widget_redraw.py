"""Time each lesson panel's redraw the way a student triggers it: a control moved.

Runs inside a real Jupyter kernel (through nbclient), so each redraw goes through the full
path: the widget's observers, interactive_output, the drawing function, the PNG the panel
renders, and its display into the output widget. Moves three controls of each panel 20 times
in turn and prints the median and the slowest redraw.

    python -m benchmarks.widget_redraw
"""

import json

import nbformat
from nbclient import NotebookClient

REDRAWS = 20

TIMER = f"""
import json, time
moves = []
for i in range({REDRAWS}):
    target, value = steps[i % len(steps)](i)
    start = time.perf_counter()
    target.value = value
    moves.append(time.perf_counter() - start)
print(json.dumps(moves))
"""

PANELS = {
    "lesson 01 (cache size)": """
from helpers.cache_size_panel import cache_size_panel, BATCHES, CONTEXTS
panel = cache_size_panel("Llama-2-7B")
display(panel)
(pick, layers, kv_heads, head_dim), (dtype, batch, context) = (panel.children[0].children[0].children,
                                                                panel.children[0].children[1].children)
steps = [lambda i: (batch, BATCHES[(i // 3 + 1) % len(BATCHES)]), lambda i: (layers, 16 + i),
         lambda i: (context, CONTEXTS[(i // 3) % len(CONTEXTS)])]
""",
    "lesson 02 (shrinking the cache)": """
from helpers.cache_shrink_panel import cache_shrink_panel, CONTEXTS, LAYOUTS, STORAGE
panel = cache_shrink_panel()
display(panel)
layout = panel.children[0]
(group, context), (storage, scaling) = (w.children for w in panel.children[1].children)
steps = [lambda i: (layout, LAYOUTS[(i // 3 + 1) % len(LAYOUTS)]), lambda i: (storage, list(STORAGE)[(i // 3 + 1) % 4]),
         lambda i: (context, CONTEXTS[(i // 3) % len(CONTEXTS)])]
""",
}


def time_panel(setup: str) -> list[float]:
    """Seconds per redraw, measured in a fresh kernel, sorted."""
    cell = "%matplotlib inline\n" + setup + TIMER
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(cell)])
    NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    stream = "".join(o.get("text", "") for o in nb.cells[0].outputs if o.output_type == "stream")
    return sorted(json.loads(stream.strip().splitlines()[-1]))


def main() -> None:
    for name, setup in PANELS.items():
        moves = time_panel(setup)
        print(f"{name} panel, {len(moves)} control moves in a Jupyter kernel (full redraw, PNG rendered): "
              f"median {1000 * moves[len(moves) // 2]:.0f} ms, slowest {1000 * moves[-1]:.0f} ms")


if __name__ == "__main__":
    main()
