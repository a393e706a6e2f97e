"""Generate exercises/NN_slug.ipynb from solutions/NN_slug.ipynb (the one source).

Uses nbgrader's own preprocessors on each notebook directly (no nbgrader course folder or
database is needed for the flat layout): ClearSolutions turns every
``### BEGIN SOLUTION`` ... ``### END SOLUTION`` region into ``# YOUR CODE HERE`` and
``raise NotImplementedError()``, ClearHiddenTests drops ``### BEGIN HIDDEN TESTS`` blocks,
ClearOutput clears outputs and counts, LockCells marks check cells read-only. We then tag
every check cell ``raises-exception`` (a blank exercise fails its checks, and nbval and
nbclient know that is expected) and drop execution metadata and saved widget state.

    python -m tools.exercises           # regenerate exercises/
    python -m tools.exercises --check   # exit 1 and name the stale files
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import nbformat
from nbgrader.preprocessors import ClearHiddenTests, ClearOutput, ClearSolutions, LockCells

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS, EXERCISES = ROOT / "solutions", ROOT / "exercises"


def is_check_cell(cell) -> bool:
    """A graded check cell in nbgrader's metadata: a code cell with grade=True."""
    return cell.cell_type == "code" and bool(cell.metadata.get("nbgrader", {}).get("grade"))


def generate(solution: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The student's version of a solution notebook (the input is not modified)."""
    nb = copy.deepcopy(solution)
    resources: dict = {}
    for step in (ClearSolutions(), ClearHiddenTests(), ClearOutput(), LockCells()):
        nb, resources = step.preprocess(nb, resources)
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        if is_check_cell(cell):
            tags = cell.metadata.setdefault("tags", [])
            if "raises-exception" not in tags:
                tags.append("raises-exception")
    nb.metadata.pop("widgets", None)
    return nb


def render(nb: nbformat.NotebookNode) -> str:
    """The file text of a notebook, the way the course stores every notebook."""
    return nbformat.writes(nb) + "\n"


def expected_exercises() -> dict[Path, str]:
    """exercises/ path -> the text generated from its solution notebook."""
    return {EXERCISES / src.name: render(generate(nbformat.read(src, as_version=4)))
            for src in sorted(SOLUTIONS.glob("*.ipynb"))}


def stale_exercises() -> list[str]:
    """Names of exercise files that differ from, lack, or have no solution source."""
    wanted = expected_exercises()
    problems = [f"{path.relative_to(ROOT)} is missing or out of date" for path, text in wanted.items()
                if not path.exists() or path.read_text() != text]
    problems += [f"{path.relative_to(ROOT)} has no source in solutions/"
                 for path in sorted(EXERCISES.glob("*.ipynb")) if path not in wanted]
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report stale exercises instead of writing")
    args = parser.parse_args(argv)
    if args.check:
        problems = stale_exercises()
        for problem in problems:
            print(problem, "- run `make exercises`", file=sys.stderr)
        return 1 if problems else 0
    EXERCISES.mkdir(exist_ok=True)
    for path, text in expected_exercises().items():
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
