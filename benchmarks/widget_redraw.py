"""Time each lesson panel's redraw the way a student triggers it: a control moved.

Runs inside a real Jupyter kernel (through nbclient), so each redraw goes through the full
path: the widget's observers, interactive_output, the drawing function, the PNG the panel
renders, and its display into the output widget. Each panel gets a kernel of its own, which makes
30 moves of its controls, each to a new value (a move to the value a control already has draws
nothing and is skipped), and then 30 more (two passes over the same panel, to show the spread),
and prints each pass's median (the upper one: the 16th of 30), 95th percentile (nearest rank:
the 29th of 30) and slowest redraw.

    python -m benchmarks.widget_redraw            # every panel
    python -m benchmarks.widget_redraw "lesson 07"  # the panels whose name holds this text
"""

import json
import logging
import math
import sys

import nbformat
from nbclient import NotebookClient

REDRAWS = 30
PASSES = 2

TIMER = f"""
import json, time
moves, i = [], 0
while len(moves) < {REDRAWS}:  # moves that change a value: setting the value a control has draws nothing
    target, value = steps[i % len(steps)](i)
    i += 1
    if target.value != value:
        start = time.perf_counter()
        target.value = value
        moves.append(time.perf_counter() - start)
    assert i < 10 * {REDRAWS}, "the moves repeat the controls' values"
print(json.dumps(moves))
"""

TIMELINE = """
from helpers.engine import Engine, workload
from helpers.llama import load_course_model
from helpers.panels.timeline import timeline_panel
from helpers.text_data import encode
model, _ = load_course_model()
prefix = encode("Return a new list of the items in the sequence. ")
prompts = [encode(t) for t in ("Open the file", "Create a new", "The default value is", "Raise ValueError if")]
runs = {}
for name, settings in {"static": dict(policy="static", prefix_caching=False), "continuous": dict(prefix_caching=False),
                       "continuous + prefix cache": {}}.items():
    requests = workload(prompts, 12, prefix=prefix, share=0.6, new_tokens=(4, 24), mean_gap=1.0, seed=0)
    engine = Engine(model, num_blocks=64, block_size=8, max_batch=4, **settings)
    runs[name] = (engine.run(requests), engine.timeline)
panel = timeline_panel(runs, 64)
display(panel)
run, step = panel.children[0].children
"""

PANELS = {
    "lesson 01 (cache size)": """
from helpers.panels.cache_size import BATCHES, CONTEXTS, cache_size_panel
panel = cache_size_panel("Llama-2-7B")
display(panel)
(pick, layers, kv_heads, head_dim), (dtype, batch, context) = (panel.children[0].children[0].children,
                                                                panel.children[0].children[1].children)
steps = [lambda i: (batch, BATCHES[(i // 3 + 1) % len(BATCHES)]), lambda i: (layers, 16 + i),
         lambda i: (context, CONTEXTS[(i // 3) % len(CONTEXTS)])]
""",
    "lesson 02 (shrinking the cache)": """
from helpers.panels.cache_shrink import CONTEXTS, LAYOUTS, STORAGE, cache_shrink_panel
panel = cache_shrink_panel()
display(panel)
layout = panel.children[0]
(group, context), (storage, scaling) = (w.children for w in panel.children[1].children)
steps = [lambda i: (layout, LAYOUTS[(i // 3 + 1) % len(LAYOUTS)]), lambda i: (storage, list(STORAGE)[(i // 3 + 1) % 4]),
         lambda i: (context, CONTEXTS[(i // 3) % len(CONTEXTS)])]
""",
    "lesson 03 (online softmax step-through)": """
from helpers.panels.online_softmax import online_softmax_panel
panel = online_softmax_panel()
display(panel)
block, step = panel.children[0].children
steps = [lambda i: (step, (i // 2) % 5), lambda i: (step, 4 - (i // 2) % 5)]
""",
    "lesson 03 (tiling)": """
from helpers.panels.tiling import LENGTHS, SRAM_KIB, tiling_panel
panel = tiling_panel()
display(panel)
(n, d, sram), (block_q, block_k, causal) = (w.children for w in panel.children[0].children)
steps = [lambda i: (n, LENGTHS[(i // 3) % len(LENGTHS)]), lambda i: (sram, SRAM_KIB[(i // 3) % len(SRAM_KIB)]),
         lambda i: (causal, bool(i % 2))]
""",
    "lesson 04 (decode)": """
import torch
from helpers.panels.decode import decode_panel
from helpers.llama import load_course_model
from helpers.text_data import encode
model, _ = load_course_model()
panel = decode_panel(model, torch.tensor([encode("Return the")]), new_tokens=48)
display(panel)
slider = panel.children[0]
steps = [lambda i: (slider, (7 * i + 3) % 48)]
""",
    "lesson 05 (serving)": """
from helpers.panels.serving import BATCHES, BLOCKS, CONTEXTS, serving_panel
panel = serving_panel()
display(panel)
(model, chip, cache), (batch, context, block) = (w.children for w in panel.children[0].children)
steps = [lambda i: (batch, BATCHES[(i // 3) % len(BATCHES)]), lambda i: (context, CONTEXTS[(i // 3) % len(CONTEXTS)]),
         lambda i: (block, BLOCKS[(i // 3 + 1) % len(BLOCKS)])]
""",
    "lesson 06 (eviction)": """
from helpers.panels.eviction import eviction_panel
from helpers.eviction_results import BUDGETS, POLICIES
panel = eviction_panel()
display(panel)
policy, budget = panel.children[0], panel.children[1]
steps = [lambda i: (policy, POLICIES[(i // 2 + 1) % len(POLICIES)]),
         lambda i: (budget, BUDGETS[(i // 2) % len(BUDGETS)])]
""",
    "lesson 07 (batch timeline, step moves)": TIMELINE + """
steps = [lambda i: (step, (7 * i + 3) % (step.max + 1))]
""",
    "lesson 07 (batch timeline, run changes)": TIMELINE + """
names = list(runs)  # each run's figure is drawn when the panel is built, then moved
steps = [lambda i: (run, names[(i + 1) % len(names)])]
""",
}


def _figures(moves: list[float]) -> tuple[float, float, float]:
    """Median (the upper one), 95th percentile (nearest rank) and slowest of ``moves`` (seconds), in ms."""
    moves = sorted(moves)
    return tuple(1000 * m for m in (moves[len(moves) // 2], moves[math.ceil(0.95 * len(moves)) - 1], moves[-1]))


def main(only: str = "") -> None:
    """Each panel (or those whose name holds ``only``) in a kernel of its own: a cell that builds it,
    then a cell per pass that times its moves; a table row per panel, both passes."""
    panels = {name: setup for name, setup in PANELS.items() if only in name}
    if not panels:
        raise SystemExit(f"no panel's name holds {only!r}; panels: {list(PANELS)}")
    print(f"{REDRAWS} control moves per panel and pass, in a Jupyter kernel (observers, redraw, PNG, display); "
          f"ms, pass {' / pass '.join(str(n + 1) for n in range(PASSES))}\n")
    print("| panel | median | 95th percentile | slowest |\n|---|---|---|---|", flush=True)
    # Closing one kernel and starting the next can leave tornado a callback on a closed socket,
    # which it logs as a traceback ("Socket operation on non-socket"); the timings are not affected.
    logging.getLogger("tornado.application").setLevel(logging.CRITICAL)
    for name, setup in panels.items():
        cells = [nbformat.v4.new_code_cell("%matplotlib inline\n" + setup)]
        cells += [nbformat.v4.new_code_cell(TIMER) for _ in range(PASSES)]
        nb = nbformat.v4.new_notebook(cells=cells)
        NotebookClient(nb, timeout=600, kernel_name="python3").execute()
        passes = []
        for cell in nb.cells[1:]:
            stream = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
            passes.append(_figures(json.loads(stream.strip().splitlines()[-1])))
        print(f"| {name} | " + " | ".join(" / ".join(f"{p[k]:.0f}" for p in passes) for k in range(3)) + " |", flush=True)


if __name__ == "__main__":
    main(" ".join(sys.argv[1:]))
