"""Grade submitted exercise notebooks into a gradebook.

    python -m tools.grade SUBMISSIONS --out DIR [--lessons 01] [--student NAME]
                          [--cell-timeout 30] [--notebook-timeout 300] [--workers N] [--fail-under PCT]

SUBMISSIONS is one notebook, a folder of notebooks (one student each, named by the file), or
a folder of student folders (named by the folder). With --student, every notebook found
belongs to that one student (a student's own repository).

For every notebook:
1. Which lesson it belongs to is read from its content (nbgrader grade_ids and cell ids), not
   from its file name.
2. The notebook is rebuilt from the release in solutions/: every locked cell and every check
   cell, hidden tests included, comes from the source; the student's answer cells are taken
   by grade_id; cells the student added stay where they were (after the same release cell).
3. Each check cell first drops every imported ``helpers`` module and re-runs the lesson's
   import cell, so patches the student made to checkers or references are gone.
4. It runs in its own kernel with a per-cell and a per-notebook time limit. A cell that runs
   too long or kills its kernel is recorded, and the notebook is run again without it.

Written to DIR: grades.csv and grades.json (student, lesson, exercise, points, max_points,
reason), junit.xml, and feedback/<student>.md. The exit status is 0 whenever grading ran,
whatever the scores; 2 when it could not run; 1 with --fail-under when a student's total is
below that percentage.

Student code runs with your permissions (nothing here is a sandbox): grade submissions you do
not trust inside a container or a throwaway machine.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from xml.etree import ElementTree as ET

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from tqdm import tqdm

from tools.exercises import SOLUTIONS, generate

# Run at the top of every check cell: forget every helpers module the student's code could
# have patched; the lesson's own import cell (appended after this) then imports them afresh.
PRISTINE = """\
import sys as _grader_sys
for _grader_name in [m for m in _grader_sys.modules if m == "helpers" or m.startswith("helpers.")]:
    del _grader_sys.modules[_grader_name]
del _grader_sys
"""


def _nbgrader(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {}) or {}


@dataclass
class Check:
    """One graded check cell of a lesson and the answer cells it grades."""

    grade_id: str
    points: float
    answers: list[str]  # grade_ids of the solution cells since the previous check


@dataclass
class Lesson:
    """A lesson's release: the solution notebook (checks, hidden tests) and its generated stubs."""

    name: str  # e.g. "01_kv_cache_size"
    solution: nbformat.NotebookNode
    stubs: dict[str, nbformat.NotebookNode]  # answer grade_id -> generated exercise cell
    checks: list[Check]
    setup: str  # source of the locked import cells, re-run before each check

    @property
    def max_points(self) -> float:
        return sum(c.points for c in self.checks)

    def keys(self) -> set[str]:
        """What identifies this lesson in a submission: its grade_ids and cell ids."""
        return {_nbgrader(c).get("grade_id") or c.get("id") for c in self.solution.cells} - {None}


def load_lessons(solutions: Path = SOLUTIONS) -> dict[str, Lesson]:
    """Every lesson in ``solutions`` by name, in order."""
    lessons = {}
    for path in sorted(solutions.glob("*.ipynb")):
        solution = nbformat.read(path, as_version=4)
        exercise = generate(solution)
        stubs = {_nbgrader(c)["grade_id"]: c for c in exercise.cells if _nbgrader(c).get("solution")}
        checks, pending, setup = [], [], []
        for cell in solution.cells:
            meta = _nbgrader(cell)
            if meta.get("solution"):
                pending.append(meta["grade_id"])
            elif meta.get("grade") and cell.cell_type == "code":
                checks.append(Check(meta["grade_id"], float(meta.get("points", 0)), pending))
                pending = []
            elif meta.get("locked") and cell.cell_type == "code":
                setup.append(cell.source)
        lessons[path.stem] = Lesson(path.stem, solution, stubs, checks, "\n".join(setup))
    return lessons


def identify(nb, lessons: dict[str, Lesson]) -> Lesson | None:
    """The lesson whose grade_ids and cell ids the notebook shares most, or None if none."""
    keys = {_nbgrader(c).get("grade_id") for c in nb.cells} | {c.get("id") for c in nb.cells}
    scored = sorted(((len(keys & lesson.keys()), name) for name, lesson in lessons.items()), reverse=True)
    return lessons[scored[0][1]] if scored and scored[0][0] > 0 else None


def rebuild(lesson: Lesson, submission) -> tuple[nbformat.NotebookNode, set[str]]:
    """The notebook to run: the release with the student's answers and added cells.

    Returns it and the grade_ids of answer cells missing from the submission.
    """
    release = lesson.solution.cells
    release_keys = {(_nbgrader(c).get("grade_id") or c.get("id")): i for i, c in enumerate(release)}
    seen: set[str] = set()
    answers: dict[str, nbformat.NotebookNode] = {}  # answer grade_id -> the student's cell
    added: dict[int, list] = {}  # release index the student's own cells follow (-1: the top)
    anchor = -1
    for cell in submission.cells:
        key = _nbgrader(cell).get("grade_id") or cell.get("id")
        if key in release_keys and key not in seen:
            seen.add(key)
            anchor = release_keys[key]
            if _nbgrader(release[anchor]).get("solution") and cell.cell_type == "code":
                answers[key] = cell
            continue  # any other release cell only marks the place: its content comes from the release
        if _nbgrader(cell).get("grade") or _nbgrader(cell).get("locked"):
            continue  # a copy of a check or locked cell: the release has the real one
        added.setdefault(anchor, []).append(cell)

    cells, missing = [], set()
    for cell in added.get(-1, []):
        cells.append(_plain(cell))
    for index, cell in enumerate(release):
        meta = _nbgrader(cell)
        if meta.get("solution"):
            gid = meta["grade_id"]
            student = answers.get(gid)
            if student is None:
                missing.add(gid)
                student = lesson.stubs[gid]
            new = _plain(student)
            new.metadata["nbgrader"] = dict(meta)
        elif meta.get("grade") and cell.cell_type == "code":
            new = _plain(cell)
            new.source = PRISTINE + lesson.setup + "\n" + cell.source
            new.metadata["nbgrader"] = dict(meta)
        else:
            new = _plain(cell)
        cells.append(new)
        cells.extend(_plain(c) for c in added.get(index, []))
    nb = nbformat.v4.new_notebook(cells=cells, metadata={"kernelspec": lesson.solution.metadata.get("kernelspec", {})})
    return nb, missing


def _plain(cell) -> nbformat.NotebookNode:
    """A fresh cell with the same type and source (outputs, ids and metadata left behind)."""
    source = cell.get("source", "")
    source = "".join(source) if isinstance(source, list) else source
    if cell.get("cell_type") == "code":
        return nbformat.v4.new_code_cell(source)
    return nbformat.v4.new_markdown_cell(source)


# ---- running -----------------------------------------------------------------------------
@dataclass
class Run:
    replies: dict[int, dict] = field(default_factory=dict)  # cell index -> execute_reply content
    stopped: dict[int, str] = field(default_factory=dict)  # cell index -> why it was cut off
    not_run_from: int | None = None  # the notebook time limit stopped the run here


def run(nb, cell_timeout: float, notebook_timeout: float) -> Run:
    """Execute ``nb`` (in place) in fresh kernels until every code cell ran, failed or was cut off."""
    result = Run()
    deadline = time.monotonic() + notebook_timeout
    while True:
        result.replies = {}
        failure = _run_once(nb, result, cell_timeout, deadline)
        if failure is None:
            return result
        index, why = failure
        if why == "notebook":
            result.not_run_from = index
            return result
        result.stopped[index] = why  # run again from a fresh kernel without that cell


def _run_once(nb, result: Run, cell_timeout: float, deadline: float) -> tuple[int, str] | None:
    def remember(cell, cell_index, execute_reply):
        result.replies[cell_index] = execute_reply["content"]

    def time_left(cell):
        return max(1, min(cell_timeout, deadline - time.monotonic()))

    with tempfile.TemporaryDirectory(prefix="grade-") as workdir:
        client = NotebookClient(nb, kernel_name="python3", allow_errors=True, timeout_func=time_left,
                                shutdown_kernel="immediate", on_cell_executed=remember,
                                resources={"metadata": {"path": workdir}})
        with client.setup_kernel():
            for index, cell in enumerate(nb.cells):
                if cell.cell_type != "code" or index in result.stopped:
                    continue
                if time.monotonic() >= deadline:
                    return index, "notebook"
                try:
                    client.execute_cell(cell, index)
                except CellTimeoutError:
                    return index, "notebook" if time.monotonic() >= deadline else "timeout"
                except DeadKernelError:
                    return index, "dead"
    return None


# ---- grading -----------------------------------------------------------------------------
@dataclass
class Row:
    student: str
    lesson: str
    exercise: str
    points: float
    max_points: float
    reason: str
    details: str = ""  # the full failure message, for the feedback file


@dataclass
class Options:
    cell_timeout: float = 30.0
    notebook_timeout: float = 300.0
    solutions: Path = SOLUTIONS


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


def _cell_problem(run_result: Run, index: int, options: Options) -> tuple[str, str] | None:
    """What went wrong in the cell at ``index``, as (short, full) phrases that follow a subject
    ("raised NameError: ...", "ran past ...", "killed the kernel ..."); None when it ran cleanly."""
    if index in run_result.stopped:
        if run_result.stopped[index] == "timeout":
            text = f"ran past the {options.cell_timeout:g} s time limit (an endless loop?)"
        else:
            text = "killed the kernel (os._exit, a crash, or out of memory)"
        return text, text
    if run_result.not_run_from is not None and index >= run_result.not_run_from:
        text = f"was not run: the notebook ran past its {options.notebook_timeout:g} s time limit"
        return text, text
    reply = run_result.replies.get(index)
    if reply is None:
        return "was not run", "was not run"
    if reply.get("status") != "ok":
        name = reply.get("ename", "an error")
        value = re.sub(r"\(\d+\.py, line (\d+)\)", r"(line \1)", str(reply.get("evalue", "")))  # IPython's temp file
        return f"raised {name}: {_first_line(value)}", f"raised {name}: {value}"
    return None


def _check_reason(phrase: str) -> str:
    if phrase.startswith(("raised NotImplementedError", "raised NotAnswered")) and "not answered yet" in phrase:
        return "not answered yet"
    return phrase.removeprefix("raised ") if phrase.startswith("raised ") else f"the check {phrase}"


def grade_notebook(student: str, path: Path, lessons: dict[str, Lesson], options: Options) -> dict:
    """Grade one submitted file. Returns {'student', 'path', 'lesson', 'rows', 'note'}."""
    outcome = {"student": student, "path": str(path), "lesson": None, "rows": [], "note": ""}
    try:
        submission = nbformat.reads(path.read_text(encoding="utf-8"), as_version=4)
    except Exception as error:  # invalid JSON, not a notebook, unreadable bytes
        outcome["note"] = f"{path.name} could not be read as a notebook ({type(error).__name__}: {_first_line(str(error))})"
        return outcome
    lesson = identify(submission, lessons)
    if lesson is None:
        outcome["note"] = f"{path.name} is not a notebook of this course"
        return outcome
    outcome["lesson"] = lesson.name
    nb, missing = rebuild(lesson, submission)
    result = run(nb, options.cell_timeout, options.notebook_timeout)
    index_of = {_nbgrader(c).get("grade_id"): i for i, c in enumerate(nb.cells) if _nbgrader(c).get("grade_id")}
    for check in lesson.checks:
        reasons, details = [], []
        for answer in check.answers:  # the root cause first: a broken answer cell
            if answer in missing:
                text = f"answer cell {answer} is missing from the submission"
                reasons.append(text)
                details.append(text)
            elif problem := _cell_problem(result, index_of[answer], options):
                reasons.append(f"your answer cell {problem[0]}")
                details.append(f"your answer cell {problem[1]}")
        problem = _cell_problem(result, index_of[check.grade_id], options)
        if problem:
            reasons.append(_check_reason(problem[0]))
            details.append(_check_reason(problem[1]))
        outcome["rows"].append(asdict(Row(student, lesson.name, check.grade_id, 0.0 if problem else check.points,
                                          check.points, "; ".join(reasons) if problem else "",
                                          "\n".join(details) if problem else "")))
    return outcome


def _safe_grade(student: str, path: Path, lessons: dict[str, Lesson], options: Options) -> dict:
    try:
        return grade_notebook(student, path, lessons, options)
    except Exception as error:  # a failure of the grader on this file must not stop the batch
        return {"student": student, "path": str(path), "lesson": None, "rows": [],
                "note": f"{path.name} could not be graded ({type(error).__name__}: {_first_line(str(error))})"}


def find_submissions(path: Path, student: str | None = None) -> list[tuple[str, Path]]:
    """(student, notebook) pairs under ``path``; see the module docstring for the naming rules."""
    def notebooks(folder: Path) -> list[Path]:
        return sorted(p for p in folder.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)

    if path.is_file():
        return [(student or path.stem, path)]
    if not path.is_dir():
        raise FileNotFoundError(f"no notebook or folder at {path}")
    if student:
        return [(student, p) for p in notebooks(path)]
    found = [(p.stem, p) for p in sorted(path.glob("*.ipynb"))]
    for folder in sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith(".")):
        found += [(folder.name, p) for p in notebooks(folder)]
    return found


def assemble(outcomes: list[dict], students: list[str], lessons: dict[str, Lesson], wanted: list[str]) -> list[Row]:
    """One row per student, expected lesson and check: graded, or zero with the reason why not."""
    rows = []
    for student in students:
        mine = [o for o in outcomes if o["student"] == student]
        for name in wanted:
            graded = sorted((o for o in mine if o["lesson"] == name), key=lambda o: o["path"])
            if graded:
                extra = [Path(o["path"]).name for o in graded[1:]]
                for row in graded[0]["rows"]:
                    row = Row(**row)
                    if extra:
                        row.reason = "; ".join(filter(None, [row.reason, f"graded {Path(graded[0]['path']).name}, "
                                                             f"not {', '.join(extra)}"]))
                    rows.append(row)
                continue
            others = [o["note"] or f"{Path(o['path']).name} is a notebook of lesson {o['lesson']}"
                      for o in mine if o["lesson"] != name]
            reason = f"no notebook of lesson {name} found" + (f" ({'; '.join(others)})" if others else "")
            rows += [Row(student, name, c.grade_id, 0.0, c.points, reason, reason) for c in lessons[name].checks]
    return rows


# ---- reports -----------------------------------------------------------------------------
COLUMNS = ["student", "lesson", "exercise", "points", "max_points", "reason"]


def write_reports(rows: list[Row], out: Path) -> None:
    """grades.csv, grades.json, junit.xml and feedback/<student>.md in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    table = [{k: _number(getattr(r, k)) for k in COLUMNS} for r in rows]
    with open(out / "grades.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(table)
    (out / "grades.json").write_text(json.dumps(table, indent=1) + "\n", encoding="utf-8")

    suites = ET.Element("testsuites", name="course grades")
    for (student, lesson), group in _groups(rows).items():
        failed = [r for r in group if r.points < r.max_points]
        suite = ET.SubElement(suites, "testsuite", name=f"{student} / {lesson}", tests=str(len(group)),
                              failures=str(len(failed)), errors="0", skipped="0")
        for r in group:
            case = ET.SubElement(suite, "testcase", classname=f"{student}.{lesson}", name=r.exercise)
            if r.points < r.max_points:
                ET.SubElement(case, "failure", message=r.reason).text = r.details or r.reason
    ET.indent(suites)
    ET.ElementTree(suites).write(out / "junit.xml", encoding="utf-8", xml_declaration=True)

    feedback = out / "feedback"
    feedback.mkdir(exist_ok=True)
    for student in dict.fromkeys(r.student for r in rows):
        mine = [r for r in rows if r.student == student]
        got, best = sum(r.points for r in mine), sum(r.max_points for r in mine)
        lines = [f"# Feedback for {student}", "", f"Total: **{got:g} / {best:g}** points.", ""]
        for (_, lesson), group in _groups(mine).items():
            lines += [f"## Lesson {lesson}", "", "| exercise | points | |", "|---|---|---|"]
            lines += [f"| {r.exercise} | {r.points:g} / {r.max_points:g} | {'passed' if r.points == r.max_points else 'failed'} |"
                      for r in group]
            for r in group:
                if r.points < r.max_points:
                    lines += ["", f"### {r.exercise}: why it failed", "", "```", r.details or r.reason, "```"]
            lines.append("")
        (feedback / f"{_file_name(student)}.md").write_text("\n".join(lines), encoding="utf-8")


def _number(value):
    """Whole points as ints (2, not 2.0) in the reports."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _groups(rows: list[Row]) -> dict[tuple[str, str], list[Row]]:
    groups: dict[tuple[str, str], list[Row]] = {}
    for r in rows:
        groups.setdefault((r.student, r.lesson), []).append(r)
    return groups


def _file_name(student: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in student) or "student"


# ---- command line --------------------------------------------------------------------------
def grade(submissions: Path, out: Path, *, lessons_wanted: list[str] | None = None, student: str | None = None,
          options: Options = Options(), workers: int | None = None, progress: bool = True) -> list[Row]:
    """Grade everything under ``submissions`` and write the reports to ``out``; returns the rows."""
    lessons = load_lessons(options.solutions)
    if not lessons:
        raise FileNotFoundError(f"no solution notebooks in {options.solutions}")
    wanted = _wanted_lessons(lessons_wanted, lessons)
    found = find_submissions(submissions, student)
    students = list(dict.fromkeys(s for s, _ in found))
    outcomes = []
    with ProcessPoolExecutor(max_workers=workers or os.cpu_count() or 1) as pool:
        futures = [pool.submit(_safe_grade, s, p, lessons, options) for s, p in found]
        for future in tqdm(as_completed(futures), total=len(futures), desc="grading", unit="notebook",
                           disable=not progress, file=sys.stderr):
            outcomes.append(future.result())
    rows = assemble(outcomes, students, lessons, wanted)
    write_reports(rows, out)
    return rows


def _wanted_lessons(requested: list[str] | None, lessons: dict[str, Lesson]) -> list[str]:
    if not requested:
        return list(lessons)
    wanted = []
    for item in requested:
        matches = [name for name in lessons if name == item or name.split("_")[0] == item]
        if not matches:
            raise ValueError(f"unknown lesson {item!r}; lessons: {', '.join(lessons)}")
        wanted += matches
    return wanted


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Grade submitted exercise notebooks into a gradebook.")
    parser.add_argument("submissions", type=Path, help="a notebook, a folder of notebooks, or a folder of student folders")
    parser.add_argument("--out", type=Path, required=True, help="folder for grades.csv, grades.json, junit.xml, feedback/")
    parser.add_argument("--lessons", default="", help="comma-separated lessons to expect, e.g. 01 (default: all)")
    parser.add_argument("--student", help="all notebooks belong to this student (a student's own repository)")
    parser.add_argument("--cell-timeout", type=float, default=30.0, help="seconds one cell may run (default 30)")
    parser.add_argument("--notebook-timeout", type=float, default=300.0, help="seconds one notebook may run (default 300)")
    parser.add_argument("--workers", type=int, default=None, help="parallel kernels (default: one per core)")
    parser.add_argument("--fail-under", type=float, default=None,
                        help="exit 1 when a student's total is below this percentage (for a student's CI)")
    parser.add_argument("--solutions", type=Path, default=SOLUTIONS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        rows = grade(args.submissions, args.out, lessons_wanted=[x.strip() for x in args.lessons.split(",") if x.strip()],
                     student=args.student, workers=args.workers,
                     options=Options(args.cell_timeout, args.notebook_timeout, args.solutions))
    except (FileNotFoundError, ValueError) as error:
        print(f"grading could not run: {error}", file=sys.stderr)
        return 2
    totals: dict[str, list[float]] = {}
    for r in rows:
        totals.setdefault(r.student, [0.0, 0.0])
        totals[r.student][0] += r.points
        totals[r.student][1] += r.max_points
    for student, (got, best) in totals.items():
        print(f"{student}: {got:g} / {best:g} points")
    print(f"wrote {args.out / 'grades.csv'}, grades.json, junit.xml and feedback/ ({len(totals)} students)")
    if args.fail_under is not None:
        below = [s for s, (got, best) in totals.items() if best and 100 * got / best < args.fail_under]
        if below:
            print(f"below {args.fail_under:g}%: {', '.join(below)}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
