"""Grade submitted exercise notebooks into a gradebook.

    python -m tools.grade SUBMISSIONS --out DIR [--lessons 01] [--student NAME]
                          [--cell-timeout 30] [--notebook-timeout 300] [--workers N] [--fail-under PCT]
                          [--no-sandbox] [--memory-gib 4] [--cpu-seconds 600] [--processes 2048]
                          [--file-mb 100] [--output-mb 10]

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
4. It runs in its own kernel with a per-cell and a per-notebook time limit, inside a bubblewrap
   sandbox (``tools/sandbox.py``: read-only file system with a pristine copy of helpers, a
   private temp folder, no network, its own PID namespace, resource limits), driven by
   ``tools/grade_run.py`` in a subprocess. A cell that runs too long, kills its kernel or kills
   that subprocess is recorded, and the notebook is run again without it; nothing a submission
   does reaches this process or another student's notebook.

Written to DIR: grades.csv and grades.json (student, lesson, exercise, points, max_points,
reason), junit.xml, and feedback/<student>.md. The exit status is 0 whenever grading ran,
whatever the scores; 2 when it could not run; 1 with --fail-under when a student's total is
below that percentage.

Where bubblewrap cannot run, grading stops (exit 2) with the reason, unless --no-sandbox is
given: then student code runs with your permissions, each notebook still with a pristine copy of
helpers, and the output says so. Results are appended to DIR/progress.jsonl as each notebook
finishes.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from xml.etree import ElementTree as ET

import nbformat
from tqdm import tqdm

from tools import sandbox
from tools.exercises import SOLUTIONS, generate

ROOT = Path(__file__).resolve().parents[1]

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
    truncated: set[int] = field(default_factory=set)  # cells whose output went over the limit


def run(nb, options: Options, release: Release) -> Run:
    """Execute ``nb`` in fresh kernels (each attempt in its own sandbox, unless ``options.isolate``
    is off) until every code cell ran, failed or was cut off. A cell that runs too long, kills its
    kernel or kills the process running the kernel is recorded, and the notebook runs again
    without it."""
    result = Run()
    deadline = time.monotonic() + options.notebook_timeout
    while True:
        result.replies = {}
        failure = _run_once(nb, result, options, release, deadline)
        if failure is None:
            return result
        index, why = failure
        if why == "notebook":
            result.not_run_from = index
            return result
        result.stopped[index] = why  # run again from a fresh kernel without that cell


def _run_once(nb, result: Run, options: Options, release: Release, deadline: float) -> tuple[int, str] | None:
    """One kernel: returns (cell index, why) when a cell stopped the run, else None."""
    with tempfile.TemporaryDirectory(prefix="grade-") as folder:
        workdir = Path(folder)
        job = {"notebook": nbformat.writes(nb), "skip": sorted(result.stopped), "cell_timeout": options.cell_timeout,
               "seconds_left": max(1.0, deadline - time.monotonic()), "limits": asdict(options.limits)}
        (workdir / "job.json").write_text(json.dumps(job))
        read_end, write_end = os.pipe()  # the runner's events: a pipe the kernel does not inherit
        argv = [sys.executable, "-m", "tools.grade_run", str(workdir), str(write_end)]
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
        if options.isolate:
            argv = sandbox.command(argv, workdir, release.helpers, ROOT / "helpers")
            env["PYTHONPATH"] = str(ROOT)  # the runner (tools/) and, mounted over ROOT/helpers, the pristine helpers
        else:  # no isolation: still a pristine copy of helpers, first on the path
            shutil.copytree(release.helpers, workdir / "helpers")
            env["PYTHONPATH"] = os.pathsep.join([str(workdir), str(ROOT)])
        process = subprocess.Popen(argv, cwd=ROOT if options.isolate else workdir, env=env, stdin=subprocess.DEVNULL,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                                   pass_fds=(write_end,))
        os.close(write_end)
        received: list[bytes] = []
        reader = threading.Thread(target=lambda: received.append(os.fdopen(read_end, "rb").read()), daemon=True)
        reader.start()
        try:
            process.wait(timeout=max(1.0, deadline - time.monotonic()) + 60)
        except subprocess.TimeoutExpired:  # the runner stopped answering: what it wrote so far says where
            process.kill()
            process.wait()
        reader.join(30)
        started = None
        for line in b"".join(received).decode("utf-8", "replace").splitlines():
            event = json.loads(line)
            if "start" in event:
                started = event["start"]
            elif "reply" in event:
                result.replies[event["reply"]] = event
                if event.get("truncated"):
                    result.truncated.add(event["reply"])
                started = None
            elif "failure" in event:
                return event["failure"], event["why"]
            elif event.get("done"):
                return None
    if started is None:  # it died before its first cell, or between cells: nothing to blame
        raise RuntimeError("the grading process stopped before it reported a cell (is the environment complete?)")
    return started, "killed"  # the cell running when the grading process died took it down


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
    isolate: bool = True  # each notebook in a bubblewrap sandbox
    limits: sandbox.Limits = sandbox.Limits()


@dataclass(frozen=True)
class Release:
    """The pristine copy of the course's helpers every notebook is graded against."""

    helpers: Path


def copy_release(folder: Path) -> Release:
    """Copy the checkout's helpers (without caches) into ``folder``; the sandbox mounts it read-only."""
    target = folder / "helpers"
    shutil.copytree(ROOT / "helpers", target, ignore=shutil.ignore_patterns("__pycache__"))
    return Release(target)


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


def _cell_problem(run_result: Run, index: int, options: Options) -> tuple[str, str] | None:
    """What went wrong in the cell at ``index``, as (short, full) phrases that follow a subject
    ("raised NameError: ...", "ran past ...", "killed the kernel ..."); None when it ran cleanly."""
    if index in run_result.stopped:
        why = run_result.stopped[index]
        if why == "timeout":
            text = f"ran past the {options.cell_timeout:g} s time limit (an endless loop?)"
        elif why == "killed":
            text = "killed the process running its kernel (killed by a signal)"
        else:
            text = "killed the kernel (os._exit, a crash, killed by a signal, or out of memory)"
        if index in run_result.truncated:
            text += f"; its output over {options.limits.output_bytes / sandbox.MB:g} MB was truncated"
        return text, text
    if run_result.not_run_from is not None and index >= run_result.not_run_from:
        text = f"was not run: the notebook ran past its {options.notebook_timeout:g} s time limit"
        return text, text
    reply = run_result.replies.get(index)
    if reply is None:
        return "was not run", "was not run"
    if reply.get("status") != "ok":
        name = reply.get("ename") or "an error"
        value = re.sub(r"\(\d+\.py, line (\d+)\)", r"(line \1)", str(reply.get("evalue", "")))  # IPython's temp file
        note = ""
        if name == "MemoryError":
            note = f" (memory limit ({options.limits.memory_bytes / sandbox.GIB:g} GiB) exceeded)"
        elif "Network is unreachable" in value or "Temporary failure in name resolution" in value:
            note = " (network is not available while grading)"
        if index in run_result.truncated:
            note += f" (output over {options.limits.output_bytes / sandbox.MB:g} MB truncated)"
        return f"raised {name}: {_first_line(value)}{note}", f"raised {name}: {value}{note}"
    return None


def _check_reason(phrase: str) -> str:
    if phrase.startswith(("raised NotImplementedError", "raised NotAnswered")) and "not answered yet" in phrase:
        return "not answered yet"
    return phrase.removeprefix("raised ") if phrase.startswith("raised ") else f"the check {phrase}"


def grade_notebook(student: str, path: Path, lessons: dict[str, Lesson], options: Options, release: Release) -> dict:
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
    result = run(nb, options, release)
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


def _safe_grade(student: str, path: Path, lessons: dict[str, Lesson], options: Options, release: Release) -> dict:
    try:
        return grade_notebook(student, path, lessons, options, release)
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


def looks_like_one_student(submissions: Path, student: str | None, rows: list[Row]) -> bool:
    """True for a folder of loose notebooks, two or more, each graded as a different lesson."""
    if student or not submissions.is_dir() or any(p.is_dir() for p in submissions.iterdir() if not p.name.startswith(".")):
        return False
    lesson_of = {}
    for row in rows:
        if row.points or "no notebook of lesson" not in row.reason:
            lesson_of.setdefault(row.student, set()).add(row.lesson)
    graded = [next(iter(v)) for v in lesson_of.values() if len(v) == 1]
    return len(graded) >= 2 and len(set(graded)) == len(graded)


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
class SandboxUnavailable(RuntimeError):
    """The sandbox cannot run here and --no-sandbox was not given."""


def grade(submissions: Path, out: Path, *, lessons_wanted: list[str] | None = None, student: str | None = None,
          options: Options = Options(), workers: int | None = None, progress: bool = True) -> list[Row]:
    """Grade everything under ``submissions`` and write the reports to ``out``; returns the rows."""
    lessons = load_lessons(options.solutions)
    if not lessons:
        raise FileNotFoundError(f"no solution notebooks in {options.solutions}")
    wanted = _wanted_lessons(lessons_wanted, lessons)
    found = find_submissions(submissions, student)
    students = list(dict.fromkeys(s for s, _ in found))
    if options.isolate and (why := sandbox.unavailable()):
        raise SandboxUnavailable(why)
    out.mkdir(parents=True, exist_ok=True)
    outcomes = []
    # Each notebook runs in its own subprocess (in its own sandbox): threads only wait for them,
    # and whatever a submission kills, it is that notebook's subprocess, never this process.
    with tempfile.TemporaryDirectory(prefix="release-") as folder, \
            open(out / "progress.jsonl", "w", encoding="utf-8") as saved, \
            ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 1) as pool:
        release = copy_release(Path(folder))
        futures = [pool.submit(_safe_grade, s, p, lessons, options, release) for s, p in found]
        for future in tqdm(as_completed(futures), total=len(futures), desc="grading", unit="notebook",
                           disable=not progress, file=sys.stderr):
            outcomes.append(future.result())
            saved.write(json.dumps(outcomes[-1]) + "\n")  # an interrupted run keeps what it graded
            saved.flush()
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
    parser.add_argument("--no-sandbox", action="store_true",
                        help="grade without bubblewrap: student code then runs with your permissions")
    defaults = sandbox.Limits()
    parser.add_argument("--memory-gib", type=float, default=defaults.memory_bytes / sandbox.GIB,
                        help="address space per sandboxed process (default 4)")
    parser.add_argument("--cpu-seconds", type=int, default=defaults.cpu_seconds, help="CPU time per notebook run (default 600)")
    parser.add_argument("--processes", type=int, default=defaults.processes, help="processes per user, counted by Linux over all your processes (default 2048; root is exempt)")
    parser.add_argument("--file-mb", type=float, default=defaults.file_bytes / sandbox.MB,
                        help="largest file a submission may write, MB (default 100)")
    parser.add_argument("--output-mb", type=float, default=defaults.output_bytes / sandbox.MB,
                        help="output kept per cell, MB (default 10)")
    parser.add_argument("--solutions", type=Path, default=SOLUTIONS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    limits = sandbox.Limits(int(args.memory_gib * sandbox.GIB), args.cpu_seconds, args.processes,
                            int(args.file_mb * sandbox.MB), int(args.output_mb * sandbox.MB))
    options = Options(args.cell_timeout, args.notebook_timeout, args.solutions, not args.no_sandbox, limits)
    try:
        rows = grade(args.submissions, args.out, lessons_wanted=[x.strip() for x in args.lessons.split(",") if x.strip()],
                     student=args.student, workers=args.workers, options=options)
    except (FileNotFoundError, ValueError, SandboxUnavailable) as error:
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
    print(f"each notebook ran in a sandbox (bubblewrap; {limits.describe()})" if options.isolate else
          "NOT ISOLATED (--no-sandbox): student code ran with your permissions; each notebook had a pristine copy "
          "of helpers")
    if looks_like_one_student(args.submissions, args.student, rows):
        print(f"note: every notebook in {args.submissions} belongs to a different lesson, which looks like one "
              "student's work graded as several students; if so, pass --student NAME (STUDENT=NAME with make)",
              file=sys.stderr)
    if args.fail_under is not None:
        below = [s for s, (got, best) in totals.items() if best and 100 * got / best < args.fail_under]
        if below:
            print(f"below {args.fail_under:g}%: {', '.join(below)}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
