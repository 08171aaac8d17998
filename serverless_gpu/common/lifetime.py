"""Process lifetime: parent-death signals and the TERM -> grace -> KILL shutdown."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import time
from collections.abc import Callable, Container, Iterable

from serverless_gpu.common.errors import signal_name as signal_name  # worded with exits there
from serverless_gpu.common.settings import MAX_GRACE_S

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def bounded_grace(grace: float, timeout: float | None) -> float:
    """The wait between SIGTERM and SIGKILL: ``grace``, at most the timeout and MAX_GRACE_S, so
    every stop ends in SIGKILL in bounded time. The decorator refuses other values; this holds
    whatever reaches the launcher."""
    if not (isinstance(grace, (int, float)) and grace >= 0):
        return 0.0  # NaN or negative: kill at once rather than guess
    limit = MAX_GRACE_S
    if timeout is not None and timeout > 0:
        limit = min(limit, timeout)
    return float(min(grace, limit))


def _prctl(option: int, value: int) -> bool:
    """Linux's prctl(2); False where there is none."""
    name = ctypes.util.find_library("c")
    prctl = getattr(ctypes.CDLL(name, use_errno=True), "prctl", None) if name else None
    if prctl is None:
        return False
    return int(prctl(option, value, 0, 0, 0)) == 0


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask Linux to send ``sig`` to this process when its parent thread dies (no-op elsewhere)."""
    parent = os.getppid()
    if _prctl(_PR_SET_PDEATHSIG, int(sig)) and (os.getppid() != parent or parent == 1):
        os._exit(1)  # the parent died before prctl took effect


def become_subreaper() -> None:
    """Adopt this process's orphaned descendants (what a rank started, once the rank is gone)
    instead of PID 1, which in some containers reaps late or never: so they can be reaped, and
    killed when they outlive their call."""
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def reap_adopted(known: Container[int]) -> None:
    """Reap exited children that are not in ``known`` (adopted orphans); stops at a known one,
    whose owner reaps it to read its exit status."""
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None or info.si_pid in known:
            return
        try:
            os.waitpid(info.si_pid, 0)
        except ChildProcessError:
            return


def kill_group(pgid: int, sig: int) -> None:
    """Signal a whole process group, ignoring one that is already gone."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def terminate_groups(
    pgids: Iterable[int], grace: float, reap: Callable[[], object] | None = None
) -> None:
    """TERM every group, wait up to ``grace`` seconds for them to empty, then KILL what is left.

    ``reap`` is called while waiting: a group leader that died but is not reaped yet (a zombie)
    still counts as a member, so a parent that does not reap would always wait the full grace.
    Blocking; for ``finally`` and exit paths where nothing else needs to run meanwhile.
    """
    groups = list(pgids)
    for pgid in groups:
        kill_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while groups and time.monotonic() < deadline:
        if reap is not None:
            reap()
        groups = [g for g in groups if _group_alive(g)]
        if groups:
            time.sleep(0.02)
    for pgid in groups:
        kill_group(pgid, signal.SIGKILL)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone else's process, but the group exists
    return True
