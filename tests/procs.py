"""The suite's process bookkeeping: which of our child processes are alive, waiting (bounded)
for them to be gone, and the shared launcher that a module's tests may keep between them."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

import psutil

from serverless_gpu.common.proctitle import PREFIX, is_launcher

REPO = Path(__file__).resolve().parents[1]
STANDBY = f"{PREFIX} standby"
"""The title of a rank waiting for a call (``serverless-gpu standby cpu``)."""


def alive(proc: psutil.Process) -> bool:
    """Running, and not a zombie (a zombie has exited; only its parent's wait() is missing)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def pid_alive(pid: int) -> bool:
    try:
        return alive(psutil.Process(pid))
    except psutil.NoSuchProcess:
        return False


def descendants() -> set[int]:
    """The pids of every live process below this one."""
    return {p.pid for p in psutil.Process().children(recursive=True) if alive(p)}


def wait_gone(pids: Iterable[int], timeout: float) -> set[int]:
    """The pids still alive (zombies count as gone) after waiting up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    left = set(pids)
    while True:
        left = {pid for pid in left if pid_alive(pid)}
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.05)


def launcher_family() -> set[int]:
    """This process's launcher and its idle standby ranks: what a shared launcher keeps
    between two tests. A rank running a call, or anything a rank started, is not in it."""
    keep: set[int] = set()
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            if alive(child) and is_launcher(child.cmdline()):
                keep.add(child.pid)
                keep |= {g.pid for g in child.children() if _is_standby(g)}
    return keep


def the_launcher() -> psutil.Process:
    """This process's launcher (one): other children, such as a session's MLflow server or
    the data tests' forkserver, are left out."""
    (launcher,) = [
        child
        for child in psutil.Process().children()
        if alive(child) and is_launcher(_cmdline(child))
    ]
    return launcher


def _cmdline(proc: psutil.Process) -> list[str]:
    with contextlib.suppress(psutil.Error):
        return proc.cmdline()
    return []


def launcher_tree() -> set[int]:
    """This process's launcher and every live process below it."""
    tree: set[int] = set()
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            if alive(child) and is_launcher(child.cmdline()):
                tree.add(child.pid)
                tree |= {g.pid for g in child.children(recursive=True) if alive(g)}
    return tree


def _is_standby(proc: psutil.Process) -> bool:
    with contextlib.suppress(psutil.Error):
        return " ".join(proc.cmdline()).startswith(STANDBY)
    return False


def cmdlines(pids: Iterable[int]) -> list[list[str]]:
    """Each live pid's command line, for a failure message."""
    lines = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            lines.append(psutil.Process(pid).cmdline())
    return lines


def run_script(
    code: str,
    *args: str,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """``python -c code args`` as a caller of its own: this interpreter, this checkout first on
    its PYTHONPATH, ``env`` (default: ours), its output captured as text, within ``timeout``."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
