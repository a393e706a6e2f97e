"""One kernel's run of a rebuilt notebook, as the grader starts it (in the sandbox, or not).

    python -m tools.grade_run WORKDIR EVENTS_FD

Reads ``WORKDIR/job.json`` ({"notebook", "skip": [cell indexes], "cell_timeout", "seconds_left",
"limits": the fields of ``tools.sandbox.Limits``}), sets those limits on itself (the kernel it
starts inherits them), and writes one JSON line per event to the pipe EVENTS_FD as it goes (a
pipe the kernel does not inherit, not a file in the folder the student's code may write in):
{"start": i} before cell i runs, {"reply": i, "status", "ename", "evalue", "truncated"} after it,
and last {"failure": i, "why": "timeout" | "dead" | "notebook"} or {"done": true}. The grader
reads the lines even when this process is killed half-way: the last cell started and not
finished is the one that killed it.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError, DeadKernelError

from tools.sandbox import Limits


class CappedClient(NotebookClient):
    """A NotebookClient that keeps at most ``output_bytes`` of each cell's output; ``truncated``
    lists the cells that had more."""

    def __init__(self, nb, output_bytes: int, **kwargs):
        super().__init__(nb, **kwargs)
        self.output_bytes, self.truncated, self._kept = output_bytes, set(), {}

    def output(self, outs, msg, display_id, cell_index):
        kept = self._kept.setdefault(cell_index, 0)
        size = len(json.dumps(msg.get("content", {})))
        if kept + size > self.output_bytes:
            self.truncated.add(cell_index)
            return None
        self._kept[cell_index] = kept + size
        return super().output(outs, msg, display_id, cell_index)


def _not_dumpable() -> None:
    """Make this process's /proc entries (its open pipe among them) off limits to the kernel it
    starts: same user, but without CAP_SYS_PTRACE (the sandbox drops it) a process may not open
    another's /proc/PID/fd once that one is not dumpable. Linux only; elsewhere nothing happens."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4, value 0
    except (OSError, AttributeError):
        pass


def main(workdir: Path, events_fd: int) -> int:
    job = json.loads((workdir / "job.json").read_text())
    limits = Limits(**job["limits"])
    limits.apply()
    nb = nbformat.reads(job["notebook"], as_version=4)
    skip = set(job["skip"])
    deadline = time.monotonic() + job["seconds_left"]
    os.set_inheritable(events_fd, False)  # the kernel this process starts must not get the pipe
    _not_dumpable()
    progress = os.fdopen(events_fd, "w", buffering=1, encoding="utf-8")

    def write(event: dict) -> None:
        progress.write(json.dumps(event) + "\n")

    def remember(cell, cell_index, execute_reply):
        content = execute_reply["content"]
        write({"reply": cell_index, "status": content.get("status"), "ename": content.get("ename"),
               "evalue": str(content.get("evalue", "")), "truncated": cell_index in client.truncated})

    def time_left(cell):
        return max(1, min(job["cell_timeout"], deadline - time.monotonic()))

    client = CappedClient(nb, limits.output_bytes, kernel_name="python3", allow_errors=True, timeout_func=time_left,
                          shutdown_kernel="immediate", on_cell_executed=remember,
                          resources={"metadata": {"path": str(workdir)}})
    with client.setup_kernel():
        for index, cell in enumerate(nb.cells):
            if cell.cell_type != "code" or index in skip:
                continue
            if time.monotonic() >= deadline:
                write({"failure": index, "why": "notebook"})
                return 0
            write({"start": index})
            try:
                client.execute_cell(cell, index)
            except CellTimeoutError:
                write({"failure": index, "why": "notebook" if time.monotonic() >= deadline else "timeout"})
                return 0
            except DeadKernelError:
                write({"failure": index, "why": "dead"})
                return 0
    write({"done": True})
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), int(sys.argv[2])))
