"""The grader on a corpus of submissions built here: each gets exactly the expected points and reason."""

import copy
import csv
import json
import os
import shutil
from pathlib import Path
from xml.etree import ElementTree as ET

import nbformat
import pytest

from tools import grade, sandbox

pytestmark = pytest.mark.slow

_NO_SANDBOX = sandbox.unavailable()
if _NO_SANDBOX and not os.environ.get("REQUIRE_SANDBOX"):
    pytest.skip(f"the grader's sandbox cannot run here: {_NO_SANDBOX}", allow_module_level=True)

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

    # Hostile submissions. Each attack runs at the top of the last answer cell, before its (right)
    # definition, so that the reason shows where the points are lost; the honest answers above stay.
    for student, (attack, points, reason) in ATTACKS.items():
        put(student, _set_answer(_answered(*ALL), "ex01_crossover_tokens",
                                 attack + "\n" + _answer("ex01_crossover_tokens")))
        expected[student] = (points, ["", "", "", reason] if points[3] == 0 else [""] * 4)
    # The attack of the issue: patch the checker on disk so every check prints its success line, answer nothing.
    put("patch_checker", _set_answer(copy.deepcopy(EXERCISE), "ex01_bytes_per_token", PATCH_CHECKER))
    expected["patch_checker"] = ([0, 0, 0, 0], ["Read-only file system"] + ["not answered yet"] * 3)
    # Forge the runner's report: write "every cell ok, done" into its event pipe through /proc, then kill it.
    put("forged_pipe", _set_answer(copy.deepcopy(EXERCISE), "ex01_bytes_per_token", FORGE_PIPE))
    expected["forged_pipe"] = ([0, 0, 0, 0], ["killed the process running its kernel"] + ["not answered yet"] * 3)
    return expected


def _answer(grade_id):
    return next(c.source for c in SOLUTION.cells if _gid(c) == grade_id)


PATCH_CHECKER = """import pathlib
import helpers.checks.lesson01 as checks
path = pathlib.Path(checks.__file__)
path.write_text(path.read_text() + "\\ndef bytes_per_token(fn, *args, **kwargs):\\n    print('bytes_per_token: all 26 cases correct.')\\n")
"""

FORGE_PIPE = """import json, os
parent = os.getppid()
for fd in os.listdir(f"/proc/{parent}/fd"):
    try:
        if os.readlink(f"/proc/{parent}/fd/{fd}").startswith("pipe:"):
            with open(f"/proc/{parent}/fd/{fd}", "w") as pipe:
                pipe.write("".join(json.dumps({"reply": i, "status": "ok"}) + "\\n" for i in range(100)))
                pipe.write(json.dumps({"done": True}) + "\\n")
    except OSError as error:
        print(error)
os.kill(parent, 9)
"""

# student -> (code run at the top of the last answer cell, expected points, a fragment of its reason)
ATTACKS = {
    "kill_parent": ("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)", [2, 2, 2, 0],
                    "killed the process running its kernel (killed by a signal)"),
    "kill_everything": ("import os, signal\nos.kill(-1, signal.SIGKILL)", [2, 2, 2, 0], "killed"),
    "kill_group": ("import os, signal\nos.killpg(os.getpgid(0), signal.SIGKILL)", [2, 2, 2, 0], "killed"),
    "process_flood": ("import subprocess\nsleepers = [subprocess.Popen(['sleep', '600']) for _ in range(100)]",
                      [2, 2, 2, 2], ""),
    "memory_hog": ("hog = bytearray(8 * 1024**3)", [2, 2, 2, 0], "memory limit (4 GiB) exceeded"),
    "network": ("import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=2)", [2, 2, 2, 0],
                "network is not available while grading"),
    "output_flood": ("for _ in range(60):\n    print('x' * 1_000_000)\nraise RuntimeError('flooded')", [2, 2, 2, 0],
                     "(output over 10 MB truncated)"),
    "write_outside": (f"open({str(ROOT / 'solutions' / 'planted.txt')!r}, 'w').write('x')", [2, 2, 2, 0],
                      "Read-only file system"),
    "sleep_at_import": ("import time\ntime.sleep(60)", [2, 2, 2, 0], f"{CELL_TIMEOUT:g} s time limit"),
    "forged_events": ("import json, os, signal\nfor name in ('progress.jsonl', 'events.jsonl'):\n"
                      "    open(name, 'a').write(json.dumps({'done': True}) + '\\n')\nos.kill(os.getppid(), signal.SIGKILL)",
                      [2, 2, 2, 0], "killed the process running its kernel"),
    "remount": ("import subprocess\nsubprocess.run(['mount', '-o', 'remount,rw,bind', '/'])\n"
                f"open({str(ROOT / 'helpers' / 'planted.py')!r}, 'w').write('x')", [2, 2, 2, 0], "Read-only file system"),
}


def _release_digest() -> str:
    """One hash over every file of the checkout a submission could try to change."""
    import hashlib

    digest = hashlib.sha256()
    for folder in ("helpers", "solutions", "exercises", "tools", "notebooks"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    base = tmp_path_factory.mktemp("grading")
    release = base / "release"
    release.mkdir()
    shutil.copy(ROOT / "solutions" / f"{LESSON}.ipynb", release)
    (release / "02_other.ipynb").write_text(nbformat.writes(_other_lesson()))
    expected = _corpus(base / "submissions")
    before = _release_digest()
    status = grade.main([str(base / "submissions"), "--out", str(base / "out"), "--lessons", "01",
                         "--cell-timeout", str(CELL_TIMEOUT), "--workers", "2", "--solutions", str(release)])
    assert _release_digest() == before, "grading changed the checkout"
    assert not (ROOT / "solutions" / "planted.txt").exists() and not (ROOT / "helpers" / "planted.py").exists()
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
                                     *ATTACKS, "patch_checker", "forged_pipe",
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
    command = next(s["run"] for s in steps if "make grade" in s.get("run", ""))
    assert any("bubblewrap" in s.get("run", "") for s in steps), "the recipe grades in the sandbox: it installs bwrap"
    assert command.startswith("make grade SUBMISSIONS=exercises OUT=grades")
    report = next(s for s in steps if "junit" in s.get("uses", ""))
    assert report["with"]["report_paths"] == "grades/junit.xml"
    dry = subprocess.run(["make", "-n", "grade", "SUBMISSIONS=exercises", "OUT=grades", "STUDENT=me"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert 'tools.grade "exercises" --out "grades"' in dry and '--student "me"' in dry


def test_grading_refuses_when_the_sandbox_cannot_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sandbox, "unavailable", lambda: "bubblewrap (bwrap) is not installed: install it")
    (tmp_path / "ann.ipynb").write_text(nbformat.writes(EXERCISE))
    assert grade.main([str(tmp_path / "ann.ipynb"), "--out", str(tmp_path / "out")]) == 2
    assert "grading could not run: bubblewrap (bwrap) is not installed" in capsys.readouterr().err


def test_no_sandbox_grades_says_so_and_saves_as_it_goes(tmp_path, capsys):
    (tmp_path / "subs").mkdir()
    (tmp_path / "subs" / "ann.ipynb").write_text(nbformat.writes(SOLUTION))
    assert grade.main([str(tmp_path / "subs"), "--out", str(tmp_path / "out"), "--lessons", "01", "--no-sandbox"]) == 0
    out = capsys.readouterr().out
    assert "ann: 8 / 8 points" in out and "NOT ISOLATED (--no-sandbox)" in out
    saved = [json.loads(line) for line in (tmp_path / "out" / "progress.jsonl").read_text().splitlines()]
    assert [(s["student"], s["lesson"], len(s["rows"])) for s in saved] == [("ann", LESSON, 4)]


def test_loose_notebooks_of_different_lessons_look_like_one_student(tmp_path, capsys):
    (tmp_path / "subs").mkdir()
    for name in ("01_kv_cache_size", "05_memory_bound_decode"):
        shutil.copy(ROOT / "exercises" / f"{name}.ipynb", tmp_path / "subs")
    assert grade.main([str(tmp_path / "subs"), "--out", str(tmp_path / "out"), "--lessons", "01,05"]) == 0
    assert "looks like one student's work" in capsys.readouterr().err
    assert grade.main([str(tmp_path / "subs"), "--out", str(tmp_path / "out2"), "--lessons", "01,05",
                       "--student", "ann"]) == 0
    assert "looks like one student's work" not in capsys.readouterr().err
