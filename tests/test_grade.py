"""The grader on a corpus of submissions built here: each gets exactly the expected points and reason."""

import copy
import csv
import json
import shutil
from pathlib import Path
from xml.etree import ElementTree as ET

import nbformat
import pytest

from tools import grade

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
LESSON = "01_kv_cache_size"
SOLUTION = nbformat.read(ROOT / "solutions" / f"{LESSON}.ipynb", as_version=4)
EXERCISE = nbformat.read(ROOT / "exercises" / f"{LESSON}.ipynb", as_version=4)
CHECKS = ["ex01_bytes_per_token_check", "ex01_sequence_cache_bytes_check",
          "ex01_append_step_bytes_check", "ex01_crossover_tokens_check"]
CELL_TIMEOUT = 4


def _gid(cell):
    return cell.metadata.get("nbgrader", {}).get("grade_id")


def _answered(*grade_ids, base=EXERCISE):
    """The blank exercise with the solution's answers filled in for ``grade_ids``."""
    nb = copy.deepcopy(base)
    answers = {_gid(c): c.source for c in SOLUTION.cells if _gid(c) in grade_ids}
    for cell in nb.cells:
        if _gid(cell) in answers:
            cell.source = answers[_gid(cell)]
    return nb


ALL = ("ex01_bytes_per_token", "ex01_sequence_cache_bytes", "ex01_append_step_bytes", "ex01_crossover_tokens")


def _set_answer(nb, grade_id, source):
    for cell in nb.cells:
        if _gid(cell) == grade_id:
            cell.source = source
    return nb


def _other_lesson():
    """A small second lesson, so a student can hand in the wrong one."""
    nb = nbformat.v4.new_notebook()
    meta = {"schema_version": 3, "task": False}
    nb.cells = [
        nbformat.v4.new_code_cell("def double(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION",
                                  id="o2-answer", metadata={"nbgrader": {**meta, "grade": False, "solution": True,
                                                                         "locked": False, "grade_id": "ex02_double"}}),
        nbformat.v4.new_code_cell("assert double(3) == 6", id="o2-check",
                                  metadata={"nbgrader": {**meta, "grade": True, "solution": False, "locked": True,
                                                         "points": 1, "grade_id": "ex02_double_check"}}),
    ]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def _corpus(folder: Path) -> dict[str, tuple[list[float], list[str]]]:
    """Write the submissions; return student -> (points per check, a reason fragment per check)."""
    def put(student, nb_or_text, name=f"{LESSON}.ipynb"):
        path = folder / student / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(nb_or_text if isinstance(nb_or_text, str) else nbformat.writes(nb_or_text))

    expected = {}
    put("all_correct", SOLUTION)
    expected["all_correct"] = ([2, 2, 2, 2], ["", "", "", ""])

    put("blank", EXERCISE)
    expected["blank"] = ([0, 0, 0, 0], ["not answered yet"] * 4)

    put("partly", _answered("ex01_bytes_per_token", "ex01_append_step_bytes"))
    expected["partly"] = ([2, 0, 2, 0], ["", "not answered yet", "", "not answered yet"])

    wrong_types = _set_answer(_answered(*ALL), "ex01_bytes_per_token",
                              "def bytes_per_token(layers, kv_heads, head_dim, bytes_per_element):\n"
                              "    return 2.0 * layers * kv_heads * head_dim * bytes_per_element")
    put("wrong_types", wrong_types)
    # sequence_cache_bytes and crossover_tokens call bytes_per_token, so its float spreads.
    expected["wrong_types"] = ([0, 0, 2, 0], ["return it as an int", "return it as an int", "", "return it as an int"])

    edited = copy.deepcopy(EXERCISE)
    for cell in edited.cells:
        if _gid(cell) in CHECKS:
            cell.source = f"print('{_gid(cell)}: all cases correct.')"
    put("edited_checks", edited)
    expected["edited_checks"] = ([0, 0, 0, 0], ["not answered yet"] * 4)

    deleted = copy.deepcopy(SOLUTION)
    deleted.cells = [c for c in deleted.cells if _gid(c) not in CHECKS]
    put("deleted_checks", deleted)
    expected["deleted_checks"] = ([2, 2, 2, 2], [""] * 4)

    moved = _answered(*ALL)
    answers = [c for c in moved.cells if _gid(c) in ALL]
    moved.cells = [c for c in moved.cells if _gid(c) not in ALL] + answers[::-1]
    put("moved_cells", moved)
    expected["moved_cells"] = ([2, 2, 2, 2], [""] * 4)

    added = _set_answer(_answered(*ALL), "ex01_bytes_per_token",
                        "def bytes_per_token(layers, kv_heads, head_dim, bytes_per_element):\n"
                        "    return my_formula(layers, kv_heads, head_dim, bytes_per_element)")
    index = next(i for i, c in enumerate(added.cells) if _gid(c) == "ex01_bytes_per_token")
    added.cells.insert(index, nbformat.v4.new_code_cell("def my_formula(*sizes):\n    out = 2\n"
                                                        "    for s in sizes:\n        out *= s\n    return out"))
    put("added_cells", added)
    expected["added_cells"] = ([2, 2, 2, 2], [""] * 4)

    patched = copy.deepcopy(EXERCISE)
    patched.cells.insert(1, nbformat.v4.new_code_cell(
        "import helpers.checks.core, helpers.checks.lesson01, helpers.kv_cache_size\n"
        "helpers.checks.core.check_function = lambda *a, **k: print('all cases correct.')\n"
        "for name in ['bytes_per_token', 'sequence_cache_bytes', 'append_step_bytes', 'crossover_tokens']:\n"
        "    setattr(helpers.checks.lesson01, name, lambda *a, **k: print('all cases correct.'))\n"
        "helpers.kv_cache_size.kv_bytes_per_token = lambda *a, **k: 0"))
    for gid, signature in zip(ALL, ["layers, kv_heads, head_dim, bytes_per_element",
                                    "tokens, batch, layers, kv_heads, head_dim, bytes_per_element",
                                    "layers, kv_heads, head_dim, bytes_per_element, batch",
                                    "weight_bytes, layers, kv_heads, head_dim, bytes_per_element, batch"]):
        name = gid.removeprefix("ex01_")
        result = "(0, 0)" if name == "append_step_bytes" else "0"
        _set_answer(patched, gid, f"def {name}({signature}):\n    return {result}")
    put("monkeypatched", patched)
    expected["monkeypatched"] = ([0, 0, 0, 0], ["expected 524288", "expected 68719476736", "expected (16384, 524288)",
                                                "expected 25706"])

    swallowed = copy.deepcopy(EXERCISE)
    swallowed.cells.insert(1, nbformat.v4.new_code_cell(
        "get_ipython().set_custom_exc((BaseException,), lambda *args, **kwargs: None)"))
    put("swallowed_errors", swallowed)
    expected["swallowed_errors"] = ([0, 0, 0, 0], ["not answered yet"] * 4)

    loop = _set_answer(_answered(*ALL), "ex01_append_step_bytes",
                       "def append_step_bytes(layers, kv_heads, head_dim, bytes_per_element, batch):\n"
                       "    while True:\n        pass")
    put("infinite_loop", loop)
    expected["infinite_loop"] = ([2, 2, 0, 2], ["", "", f"{CELL_TIMEOUT:g} s time limit", ""])

    syntax = _set_answer(_answered(*ALL), "ex01_sequence_cache_bytes",
                         "def sequence_cache_bytes(tokens, batch, layers, kv_heads, head_dim, bytes_per_element)\n"
                         "    return tokens")
    put("syntax_error", syntax)
    expected["syntax_error"] = ([2, 0, 2, 2], ["", "your answer cell raised SyntaxError: expected ':' (line 1); NameError", "", ""])

    crash = _set_answer(_answered(*ALL), "ex01_crossover_tokens",
                        "def crossover_tokens(weight_bytes, layers, kv_heads, head_dim, bytes_per_element, batch):\n"
                        "    import os\n    os._exit(1)")
    put("kernel_crash", crash)
    expected["kernel_crash"] = ([2, 2, 2, 0], ["", "", "", "the check killed the kernel"])

    put("invalid_json", '{"cells": [ this is not json', name="lesson.ipynb")
    expected["invalid_json"] = ([0, 0, 0, 0], ["lesson.ipynb could not be read as a notebook"] * 4)

    put("renamed", SOLUTION, name="my homework (final).ipynb")
    expected["renamed"] = ([2, 2, 2, 2], [""] * 4)

    put("other_lesson", _other_lesson(), name=f"{LESSON}.ipynb")
    expected["other_lesson"] = ([0, 0, 0, 0], [f"{LESSON}.ipynb is a notebook of lesson 02_other"] * 4)

    missing = _answered(*ALL)
    missing.cells = [c for c in missing.cells if _gid(c) != "ex01_append_step_bytes"]
    put("missing_answer", missing)
    expected["missing_answer"] = ([2, 2, 0, 2], ["", "", "answer cell ex01_append_step_bytes is missing from the submission; not answered yet", ""])
    return expected


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    base = tmp_path_factory.mktemp("grading")
    release = base / "release"
    release.mkdir()
    shutil.copy(ROOT / "solutions" / f"{LESSON}.ipynb", release)
    (release / "02_other.ipynb").write_text(nbformat.writes(_other_lesson()))
    expected = _corpus(base / "submissions")
    status = grade.main([str(base / "submissions"), "--out", str(base / "out"), "--lessons", "01",
                         "--cell-timeout", str(CELL_TIMEOUT), "--workers", "2", "--solutions", str(release)])
    return base / "out", expected, status


def test_the_whole_batch_grades_in_one_run(graded):
    out, expected, status = graded
    assert status == 0
    rows = list(csv.DictReader(open(out / "grades.csv")))
    assert set(rows[0]) == {"student", "lesson", "exercise", "points", "max_points", "reason"}
    assert {r["student"] for r in rows} == set(expected)
    assert len(rows) == 4 * len(expected)
    assert json.loads((out / "grades.json").read_text()) == [
        {**r, "points": float(r["points"]), "max_points": float(r["max_points"])} for r in rows]


@pytest.mark.parametrize("student", ["all_correct", "blank", "partly", "wrong_types", "edited_checks",
                                     "deleted_checks", "moved_cells", "added_cells", "monkeypatched",
                                     "swallowed_errors", "infinite_loop", "syntax_error", "kernel_crash",
                                     "invalid_json", "renamed", "other_lesson", "missing_answer"])
def test_each_submission_gets_its_points_and_reason(graded, student):
    out, expected, _ = graded
    rows = [r for r in csv.DictReader(open(out / "grades.csv")) if r["student"] == student]
    assert [r["exercise"] for r in rows] == CHECKS
    assert all(r["lesson"] == LESSON and float(r["max_points"]) == 2 for r in rows)
    points, reasons = expected[student]
    assert [float(r["points"]) for r in rows] == points, [r["reason"] for r in rows]
    for row, fragment in zip(rows, reasons):
        if fragment:
            assert fragment in row["reason"], row
        else:
            assert row["reason"] == "", row


def test_junit_report(graded):
    out, expected, _ = graded
    root = ET.parse(out / "junit.xml").getroot()
    cases = root.findall(".//testcase")
    assert len(cases) == 4 * len(expected)
    failed = {(c.get("classname"), c.get("name")) for c in cases if c.find("failure") is not None}
    assert ("blank." + LESSON, CHECKS[0]) in failed
    assert not any(name.startswith("all_correct.") for name, _ in failed)
    suite = next(s for s in root.findall("testsuite") if s.get("name") == f"partly / {LESSON}")
    assert suite.get("tests") == "4" and suite.get("failures") == "2"


def test_feedback_file_says_what_failed_and_why(graded):
    out, _, _ = graded
    text = (out / "feedback" / "wrong_types.md").read_text()
    assert "Total: **2 / 8** points." in text
    assert "ex01_bytes_per_token_check: why it failed" in text
    assert "returned a float (524288.0); expected an int. The value is right: return it as an int" in text
    assert "Hint:" in text
    assert "ex01_append_step_bytes_check: why it failed" not in text
    assert "Total: **8 / 8** points." in (out / "feedback" / "all_correct.md").read_text()


def test_fail_under_and_unrunnable_grading(tmp_path):
    folder = tmp_path / "subs"
    folder.mkdir()
    (folder / "eve.ipynb").write_text(nbformat.writes(EXERCISE))
    args = [str(folder), "--out", str(tmp_path / "out"), "--lessons", "01"]
    assert grade.main(args) == 0
    assert grade.main(args + ["--fail-under", "50"]) == 1
    assert grade.main([str(tmp_path / "nowhere"), "--out", str(tmp_path / "out")]) == 2
    assert grade.main(args[:3] + ["--lessons", "99"]) == 2


def test_rebuild_restores_checks_and_keeps_added_cells_in_place():
    lessons = grade.load_lessons()
    lesson = lessons[LESSON]
    nb = _answered(*ALL)
    for cell in nb.cells:
        if _gid(cell) == CHECKS[0]:
            cell.source = "pass"
    nb.cells.insert(3, nbformat.v4.new_code_cell("x = 'mine'"))
    assert grade.identify(nb, lessons) is lesson
    rebuilt, missing = grade.rebuild(lesson, nb)
    assert missing == set()
    check = next(c for c in rebuilt.cells if _gid(c) == CHECKS[0])
    release = next(c for c in SOLUTION.cells if _gid(c) == CHECKS[0])
    assert check.source == grade.PRISTINE + lesson.setup + "\n" + release.source
    assert "BEGIN HIDDEN TESTS" in check.source
    sources = [c.source for c in rebuilt.cells]
    assert sources.index("x = 'mine'") == 3


def test_find_submissions_naming(tmp_path):
    (tmp_path / "ann.ipynb").write_text("{}")
    (tmp_path / "ben").mkdir()
    (tmp_path / "ben" / "work.ipynb").write_text("{}")
    assert grade.find_submissions(tmp_path) == [("ann", tmp_path / "ann.ipynb"), ("ben", tmp_path / "ben" / "work.ipynb")]
    assert [s for s, _ in grade.find_submissions(tmp_path, student="zoe")] == ["zoe", "zoe"]
    assert grade.find_submissions(tmp_path / "ann.ipynb") == [("ann", tmp_path / "ann.ipynb")]


def test_ci_recipe_grades_exercises_with_the_make_command():
    import subprocess

    import yaml

    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "grade-exercises.yml").read_text())
    steps = workflow["jobs"]["grade"]["steps"]
    command = next(s["run"] for s in steps if "run" in s)
    assert command.startswith("make grade SUBMISSIONS=exercises OUT=grades")
    report = next(s for s in steps if "junit" in s.get("uses", ""))
    assert report["with"]["report_paths"] == "grades/junit.xml"
    dry = subprocess.run(["make", "-n", "grade", "SUBMISSIONS=exercises", "OUT=grades", "STUDENT=me"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert 'tools.grade "exercises" --out "grades"' in dry and '--student "me"' in dry
