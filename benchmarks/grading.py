"""Time the grader on lesson 01: one submission, then 50 on all cores, with and without the sandbox.

The 50 are a mix the grader meets in practice (complete, blank, half done), copied from the
solution and exercise notebooks. Each measurement runs in both modes, interleaved, and the wall
times are printed side by side from this one run (the sandbox needs bubblewrap).

    python -m benchmarks.grading
"""

import copy
import os
import tempfile
import time
from pathlib import Path

import nbformat

from tools import grade

ROOT = Path(__file__).resolve().parents[1]
LESSON = "01_kv_cache_size"


def _half_done() -> nbformat.NotebookNode:
    solution = nbformat.read(ROOT / "solutions" / f"{LESSON}.ipynb", as_version=4)
    nb = copy.deepcopy(nbformat.read(ROOT / "exercises" / f"{LESSON}.ipynb", as_version=4))
    answers = {c.metadata["nbgrader"]["grade_id"]: c.source for c in solution.cells
               if c.metadata.get("nbgrader", {}).get("solution")}
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid in ("ex01_bytes_per_token", "ex01_append_step_bytes"):
            cell.source = answers[gid]
    return nb


def main() -> None:
    kinds = [(ROOT / "solutions" / f"{LESSON}.ipynb").read_text(),
             (ROOT / "exercises" / f"{LESSON}.ipynb").read_text(),
             nbformat.writes(_half_done())]
    with tempfile.TemporaryDirectory() as tmp:
        one, many = Path(tmp, "one"), Path(tmp, "many")
        one.mkdir()
        many.mkdir()
        (one / "student.ipynb").write_text(kinds[0])
        for i in range(50):
            (many / f"student{i:02d}.ipynb").write_text(kinds[i % 3])
        seconds = {}
        for folder, count in ((one, 1), (many, 50)):
            for isolate in (True, False):
                options = grade.Options(isolate=isolate)
                start = time.perf_counter()
                rows = grade.grade(folder, Path(tmp, f"out{count}{isolate}"), lessons_wanted=["01"],
                                   options=options, progress=False)
                seconds[count, isolate] = time.perf_counter() - start
    cores = os.cpu_count()
    for count in (1, 50):
        with_box, without = seconds[count, True], seconds[count, False]
        print(f"{count:>2} submission{'s' if count > 1 else ' '} of lesson {LESSON} on {cores} cores: sandboxed "
              f"{with_box:.1f} s ({with_box / count:.2f} s per notebook), not isolated {without:.1f} s "
              f"({without / count:.2f} s per notebook); sandbox / plain = {with_box / without:.2f}")
    print(f"{len(rows)} gradebook rows in the last run")


if __name__ == "__main__":
    main()
