"""Time the lesson 01 panel's redraw the way a student triggers it: a slider move.

Runs inside a real Jupyter kernel (through nbclient), so each redraw goes through the full
path: the slider's observers, interactive_output, the drawing function, the PNG the panel
renders, and its display into the output widget. Moves the batch, layers and
context sliders 20 times in turn and prints the median and the slowest redraw.

    python -m benchmarks.widget_redraw
"""

import json

import nbformat
from nbclient import NotebookClient

REDRAWS = 20

CELL = f"""
%matplotlib inline
import json, statistics, time
from helpers.cache_size_panel import cache_size_panel, BATCHES, CONTEXTS
panel = cache_size_panel("Llama-2-7B")
display(panel)
(pick, layers, kv_heads, head_dim), (dtype, batch, context) = (panel.children[0].children[0].children,
                                                                panel.children[0].children[1].children)
moves = []
for i in range({REDRAWS}):
    target, value = [(batch, BATCHES[(i // 3 + 1) % len(BATCHES)]),
                     (layers, 16 + i),
                     (context, CONTEXTS[(i // 3) % len(CONTEXTS)])][i % 3]
    start = time.perf_counter()
    target.value = value
    moves.append(time.perf_counter() - start)
print(json.dumps(moves))
"""


def main() -> None:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(CELL)])
    NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    stream = "".join(o.get("text", "") for o in nb.cells[0].outputs if o.output_type == "stream")
    moves = sorted(json.loads(stream.strip().splitlines()[-1]))
    print(f"lesson 01 panel, {len(moves)} slider moves in a Jupyter kernel (full redraw, PNG rendered)")
    print(f"median redraw: {1000 * moves[len(moves) // 2]:.0f} ms   slowest: {1000 * moves[-1]:.0f} ms")


if __name__ == "__main__":
    main()
