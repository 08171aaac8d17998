"""In the launcher: signalling ranks for stacks and stop requests, and a timeout's stack capture.

A run that must end (cancel, timeout) ends in steps: on a timeout its stacks are taken first
(:class:`StackCapture`), then, with ``stop_grace``, the ranks are asked to stop and given that
long to return, and only then stopped as usual (TERM, grace, KILL). ``supervision`` drives the
steps; this module holds what each one does.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable, Sequence

from . import stacks
from .rank_process import RankProcess
from .runpaths import RunPaths

CAPTURE_S = 1.5
"""How long a timeout waits for the ranks' stack and flight-recorder dumps before it stops them
(faulthandler's dump takes milliseconds; the flight recorder's, from a thread, a little more)."""


def signal_ranks(ranks: Sequence[RankProcess], which: Iterable[int], *sigs: int) -> None:
    """Send ``sigs`` to the rank processes ``which`` (through their pidfds: a reaped rank's pid
    may be someone else's by now)."""
    for rank in which:
        proc = ranks[rank]
        for sig in sigs:
            with contextlib.suppress(OSError):
                if proc.pidfd >= 0:
                    signal.pidfd_send_signal(proc.pidfd, sig)
                elif proc.exit_status is None:
                    os.kill(proc.pid, sig)


def request_stacks(ranks: Sequence[RankProcess], which: Iterable[int]) -> None:
    signal_ranks(ranks, which, stacks.SIG_STACKS, stacks.SIG_DUMP)


def request_stop(ranks: Sequence[RankProcess], which: Iterable[int]) -> None:
    signal_ranks(ranks, which, stacks.SIG_STOP)


class StackCapture:
    """The stacks of a run's ranks, taken before a timeout stops them."""

    def __init__(self, paths: RunPaths, ranks: Sequence[RankProcess], which: Sequence[int]) -> None:
        self.paths = paths
        self.since = stacks.offsets(paths, which)
        request_stacks(ranks, which)
        self.due = time.monotonic() + (CAPTURE_S if which else 0.0)

    def finish(self) -> None:
        """Save what the ranks dumped (``RunPaths.stacks``; the caller's error reads them)."""
        stacks.save(self.paths, stacks.read_new(self.paths, self.since))
