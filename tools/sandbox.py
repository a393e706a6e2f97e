"""The sandbox a submitted notebook is graded in: bubblewrap (``bwrap``) and resource limits.

Inside it, the whole file system is read-only, the course's ``helpers`` are a pristine copy of the
release mounted over the checkout's, and the only writable place is a private temp folder (the
working directory, also HOME and TMPDIR). It has its own network namespace (a loopback and
nothing else), its own PID namespace (a kill reaches only the sandbox's own processes) and its own
session, and it dies with the grader; it holds no capabilities, so even a grader run as root
cannot be remounted from inside. Limits apply to every process in it: address space, CPU
time, file size, process count (not enforced for root; the PID namespace and the time limits
bound a flood then), and the grader caps each cell's output.
"""

from __future__ import annotations

import resource
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

GIB = 1024**3
MB = 1000**2


@dataclass(frozen=True)
class Limits:
    """Per sandbox. Memory is address space (RLIMIT_AS), so it counts what a process maps."""

    memory_bytes: int = 4 * GIB
    cpu_seconds: int = 600
    processes: int = 2048  # Linux counts every process of the user (root is exempt)
    file_bytes: int = 100 * MB
    output_bytes: int = 10 * MB  # per cell, what the grader keeps of a cell's output

    def describe(self) -> str:
        return (f"memory {self.memory_bytes / GIB:g} GiB, CPU {self.cpu_seconds} s, {self.processes} processes, "
                f"files {self.file_bytes / MB:g} MB, output {self.output_bytes / MB:g} MB per cell")

    def apply(self) -> None:
        """Set the limits on the calling process and what it starts (``tools.grade_run`` does, first)."""
        for limit, value in ((resource.RLIMIT_AS, self.memory_bytes), (resource.RLIMIT_CPU, self.cpu_seconds),
                             (resource.RLIMIT_NPROC, self.processes), (resource.RLIMIT_FSIZE, self.file_bytes)):
            resource.setrlimit(limit, (value, value))


INSTALL_HINT = ("install bubblewrap (Debian/Ubuntu: sudo apt-get install bubblewrap; `make grade` does it when run "
                "as root), or pass --no-sandbox (NO_SANDBOX=1 with make) to grade without isolation, with your "
                "permissions")


def unavailable() -> str | None:
    """Why the sandbox cannot run here, or None when it can."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return f"bubblewrap (bwrap) is not installed: {INSTALL_HINT}"
    trial = subprocess.run([bwrap, "--ro-bind", "/", "/", "--unshare-net", "--unshare-pid", "--die-with-parent",
                            "true"], capture_output=True, text=True)
    if trial.returncode != 0:
        why = trial.stderr.strip() or f"exit status {trial.returncode}"
        fix = (" On Ubuntu 23.10 and later, AppArmor blocks unprivileged user namespaces: "
               "sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0." if "uid map" in why else "")
        return f"bubblewrap cannot create a sandbox here ({why}).{fix} Or {INSTALL_HINT.split(', or ')[1]}"
    return None


def command(argv: list[str], workdir: Path, helpers_copy: Path, helpers_target: Path) -> list[str]:
    """``argv`` wrapped in bwrap: ``workdir`` is the writable working directory (mounted at the same
    path), ``helpers_copy`` is mounted read-only over ``helpers_target`` (the checkout's helpers)."""
    # No tmpfs over /tmp: the checkout and its .venv may well live there. /tmp stays read-only like
    # the rest, and TMPDIR points at the private folder.
    return ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
            "--bind", str(workdir), str(workdir), "--ro-bind", str(helpers_copy), str(helpers_target),
            "--chdir", str(workdir), "--setenv", "HOME", str(workdir), "--setenv", "MPLCONFIGDIR", str(workdir),
            "--setenv", "TMPDIR", str(workdir),
            "--unshare-net", "--unshare-pid", "--unshare-ipc", "--die-with-parent", "--new-session",
            "--cap-drop", "ALL",  # run as root, the sandbox could otherwise remount / read-write
            *argv]
