"""Inside the launcher: which of its children are ranks, and reaping them and what they left.

The launcher is a subreaper: a rank's children that outlive it (a daemon that called setsid, a
killed rank's workers) become the launcher's. Every child that is neither a run's rank nor a
standby rank is such an orphan, reaped here so that its pid (and group id) is freed.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterable

import psutil

from serverless_gpu.common.lifetime import reap_adopted
from serverless_gpu.launcher_process.standby import Standby
from serverless_gpu.launcher_process.supervisor import RunSupervisor


def known_pids(runs: Iterable[RunSupervisor], standby: Standby) -> set[int]:
    """Ranks (of runs and standby) not reaped yet; any other child is an adopted orphan."""
    pids = {pid for run in runs for pid in run.unreaped_pids()}
    return pids | standby.pids()


def live_pids(runs: Iterable[RunSupervisor], standby: Standby) -> list[int]:
    """Ranks not reaped yet: a reaped rank's pid (and group id) may belong to someone else."""
    pids = [pid for run in runs for pid in run.unreaped_pids()]
    return pids + [r.pid for s in standby.sets.values() for r in s.ranks if r.alive()]


def reap_orphans(runs: Iterable[RunSupervisor], standby: Standby) -> None:
    """Reap the orphans ranks left to this subreaper (a killed rank's children)."""
    reap_adopted(known_pids(runs, standby))


def reap_all(runs: Iterable[RunSupervisor], standby: Standby) -> None:
    """Reap every rank that has exited (its pid stays reserved until then), then the orphans."""
    runs = list(runs)
    for run in runs:
        run.reap()
    standby.reap()
    reap_orphans(runs, standby)


def kill_adopted(runs: Iterable[RunSupervisor], standby: Standby) -> None:
    """End what ranks left behind outside their process groups (a daemon that called
    setsid): with no call running, every child that is not a standby rank is a leftover."""
    known = known_pids(runs, standby)
    for child in psutil.Process().children():
        if child.pid not in known:
            with contextlib.suppress(psutil.Error, OSError):
                if os.getpgid(child.pid) == child.pid:
                    os.killpg(child.pid, signal.SIGKILL)  # its session's members too
                child.kill()
    reap_adopted(known)
