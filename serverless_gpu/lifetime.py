"""Process lifetime: parent-death signals and the TERM -> grace -> KILL shutdown."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import time
from collections.abc import Iterable

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask Linux to send ``sig`` to this process when its parent thread dies (no-op elsewhere)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return
    libc = ctypes.CDLL(name, use_errno=True)
    prctl = getattr(libc, "prctl", None)
    if prctl is None:
        return
    parent = os.getppid()
    prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    if os.getppid() != parent or parent == 1:  # the parent died before prctl took effect
        os._exit(1)


def signal_name(status: int) -> str | None:
    """``-11`` (a Popen-style return code) -> ``"SIGSEGV"``."""
    if status >= 0:
        return None
    try:
        return signal.Signals(-status).name
    except ValueError:
        return f"signal {-status}"


def kill_group(pgid: int, sig: int) -> None:
    """Signal a whole process group, ignoring one that is already gone."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def terminate_groups(pgids: Iterable[int], grace: float) -> None:
    """TERM every group, wait up to ``grace`` seconds for them to empty, then KILL what is left.

    Blocking; for ``finally`` and exit paths where nothing else needs to run meanwhile.
    """
    groups = list(pgids)
    for pgid in groups:
        kill_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while groups and time.monotonic() < deadline:
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
