"""Time the grader on lesson 01: one submission, then 50 on all cores.

The 50 are a mix the grader meets in practice (complete, blank, half done), copied from the
solution and exercise notebooks. Prints wall times measured in this one run.

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
        start = time.perf_counter()
        grade.grade(one, Path(tmp, "out1"), lessons_wanted=["01"], progress=False)
        single = time.perf_counter() - start
        start = time.perf_counter()
        rows = grade.grade(many, Path(tmp, "out50"), lessons_wanted=["01"], progress=False)
        batch = time.perf_counter() - start
    cores = os.cpu_count()
    print(f"one submission of lesson {LESSON}: {single:.1f} s")
    print(f"50 submissions on {cores} cores: {batch:.1f} s ({batch / 50:.2f} s per submission, "
          f"{50 * single / batch:.1f}x the one-at-a-time rate); {len(rows)} gradebook rows")


if __name__ == "__main__":
    main()
