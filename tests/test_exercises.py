"""The exercise pipeline: exercises/ is generated from solutions/ and runs blank safely."""

import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tools import exercises

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))
EXERCISES = sorted((ROOT / "exercises").glob("*.ipynb"))


def test_every_solution_has_a_lesson_and_an_exercise():
    assert SOLUTIONS, "no solution notebooks found"
    for src in SOLUTIONS:
        assert (ROOT / "notebooks" / src.name).exists(), f"no lesson for {src.name}"
        assert (ROOT / "exercises" / src.name).exists(), f"no exercise for {src.name}"


def test_exercises_are_not_stale():
    problems = exercises.stale_exercises()
    assert not problems, "exercises/ differs from what solutions/ generates (run `make exercises`):\n" + "\n".join(problems)


def test_generation_is_deterministic():
    for src in SOLUTIONS:
        nb = nbformat.read(src, as_version=4)
        assert exercises.render(exercises.generate(nb)) == exercises.render(exercises.generate(nb))


def test_stale_exercise_is_detected(tmp_path, monkeypatch):
    # Editing a solution without regenerating must be caught.
    solutions, exercises_dir = tmp_path / "solutions", tmp_path / "exercises"
    solutions.mkdir()
    exercises_dir.mkdir()
    src = SOLUTIONS[0]
    (solutions / src.name).write_text(src.read_text())
    (exercises_dir / src.name).write_text(exercises.render(exercises.generate(nbformat.read(src, as_version=4))))
    monkeypatch.setattr(exercises, "ROOT", tmp_path)
    monkeypatch.setattr(exercises, "SOLUTIONS", solutions)
    monkeypatch.setattr(exercises, "EXERCISES", exercises_dir)
    assert exercises.stale_exercises() == []
    nb = nbformat.read(solutions / src.name, as_version=4)
    nb.cells[0].source += "\nAn edit."
    nbformat.write(nb, solutions / src.name)
    assert exercises.stale_exercises() == [f"exercises/{src.name} is missing or out of date"]
    (exercises_dir / "99_orphan.ipynb").write_text("{}")
    assert "exercises/99_orphan.ipynb has no source in solutions/" in exercises.stale_exercises()


@pytest.mark.parametrize("path", EXERCISES, ids=lambda p: p.name)
def test_generated_exercise_structure(path):
    text = path.read_text()
    for marker in ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS"):
        assert marker not in text, f"{path.name} still contains {marker}"
    nb = nbformat.read(path, as_version=4)
    solution = nbformat.read(ROOT / "solutions" / path.name, as_version=4)
    assert [c.id for c in nb.cells] == [c.id for c in solution.cells], "cells must keep their ids and order"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code)
    grade_ids = [c.metadata["nbgrader"]["grade_id"] for c in nb.cells if "nbgrader" in c.metadata]
    assert len(grade_ids) == len(set(grade_ids)), "grade_id values must be unique"
    checks = [c for c in code if exercises.is_check_cell(c)]
    answers = [c for c in code if c.metadata.get("nbgrader", {}).get("solution")]
    assert checks and answers
    for cell in checks:
        assert "raises-exception" in cell.metadata["tags"]
        assert cell.metadata["nbgrader"]["points"] > 0 and cell.metadata["editable"] is False
    for cell in answers:
        assert re.search(r"# YOUR CODE HERE\n\s*raise NotImplementedError\(\)", cell.source)


@pytest.mark.parametrize("path", EXERCISES, ids=lambda p: p.name)
def test_blank_exercise_raises_only_not_answered(path):
    """Run the blank exercise: NotImplementedError is the only error allowed, and every check fails."""
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=60, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        errors = [o for o in cell.outputs if o.output_type == "error"]
        for error in errors:
            assert error.ename in ("NotImplementedError", "NotAnswered"), (
                f"cell {index} of blank {path.name} raised {error.ename}: {error.evalue}")
        if exercises.is_check_cell(cell):
            assert errors, f"check cell {index} of blank {path.name} passed: a blank answer must not earn points"
            assert "not answered yet" in errors[0].evalue


@pytest.mark.parametrize("path", sorted((ROOT / "notebooks").glob("*.ipynb")) + SOLUTIONS, ids=lambda p: p.parent.name + "/" + p.name)
def test_lessons_and_solutions_store_no_errors(path):
    nb = nbformat.read(path, as_version=4)
    for index, cell in enumerate(nb.cells):
        for output in cell.get("outputs", []):
            assert output.output_type != "error", (
                f"{path.name} cell {index} stores an error ({output.ename}: {output.evalue}); re-run `make notebooks`")
