"""Execute notebooks in place and store their outputs (lessons and solutions).

    python -m tools.execute notebooks/01_kv_cache_size.ipynb solutions/01_kv_cache_size.ipynb

Each notebook runs top to bottom in a fresh kernel from this environment, in its own folder,
with a time limit per cell; a cell that fails stops the run (nothing is written). The saved
kernelspec is the course kernel that `make lab` registers. Prints each notebook's run time.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

KERNELSPEC = {"name": "kv-course", "display_name": "Python (KV course)", "language": "python"}
CELL_TIMEOUT_S = 120


WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def stable_widget_ids(nb, name: str) -> nbformat.NotebookNode:
    """Rename the saved widget models' random ids to ids derived from ``name`` and their order.

    The order is a walk from the widgets the cells display through the models they refer to,
    so re-executing an unchanged notebook gives an identical file.
    """
    state = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    if not state:
        return nb
    order = [o.data[WIDGET_VIEW]["model_id"] for c in nb.cells if c.cell_type == "code"
             for o in c.outputs if WIDGET_VIEW in o.get("data", {})]
    for model in order:  # the list grows while we walk it
        for ref in re.findall(r"IPY_MODEL_([0-9a-f]{32})", json.dumps(state.get(model, {}), sort_keys=True)):
            if ref not in order:
                order.append(ref)
    order += sorted(set(state) - set(order), key=lambda m: json.dumps(state[m], sort_keys=True))
    text = nbformat.writes(nb)
    for index, model in enumerate(order):
        text = text.replace(model, hashlib.md5(f"{name}:{index}".encode()).hexdigest())
    return nbformat.reads(text, as_version=4)


def execute(path: Path) -> float:
    """Run the notebook at ``path`` and write it back with outputs; returns seconds taken."""
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    # "python3" is this environment's own kernel (jupyter_client maps it to sys.executable).
    NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3", record_timing=False,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    seconds = time.perf_counter() - start
    for cell in nb.cells:
        cell.metadata.pop("execution", None)  # timestamps would change the file on every run
    nb.metadata["kernelspec"] = KERNELSPEC
    nb = stable_widget_ids(nb, path.name)
    path.write_text(nbformat.writes(nb) + "\n")
    return seconds


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    for name in argv:
        print(f"{name}: executed in {execute(Path(name)):.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
