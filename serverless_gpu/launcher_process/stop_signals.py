"""In the launcher: signalling ranks for stacks and stop requests, and a timeout's stack capture.

A run that must end (cancel, timeout) ends in steps: on a timeout its stacks are taken first
(:class:`StackCapture`), then, with ``stop_grace``, the ranks are asked to stop and given that
long to return, and only then stopped as usual (TERM, grace, KILL). The run machine
(``lifecycle/run_machine.py``) times the steps; this module holds what each one does.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterable, Sequence

from serverless_gpu.doctor import stacks
from serverless_gpu.launcher_process.rank_handle import RankProcess
from serverless_gpu.wire.runpaths import RunPaths


def signal_ranks(ranks: Sequence[RankProcess], which: Iterable[int], sig: int) -> list[int]:
    """Send ``sig`` to the rank processes ``which`` that have a handler for it, through their
    pidfds (a reaped rank's pid may be someone else's by now); the ranks signalled.

    Every doctor signal's default action ends the process, so a rank whose code put the
    signal back to its default (``signal.signal(sig, SIG_DFL)``) is not sent it: a diagnosis
    or a stop request must never be what kills a rank."""
    sent = []
    for rank in which:
        proc = ranks[rank]
        if proc.exit_status is not None or not catches(proc.pid, sig):
            continue
        with contextlib.suppress(OSError):
            if proc.pidfd >= 0:
                signal.pidfd_send_signal(proc.pidfd, sig)
            else:
                os.kill(proc.pid, sig)
            sent.append(rank)
    return sent


def catches(pid: int, sig: int) -> bool:
    """Whether process ``pid`` has a handler installed for ``sig`` (``SigCgt`` in its
    ``/proc/PID/status``: the dispositions are the process's, shared by its threads)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def request_stacks(
    paths: RunPaths, ranks: Sequence[RankProcess], which: Sequence[int], dump: bool
) -> None:
    """Ask ``which`` for their stacks and, with ``dump`` (GPU ranks: NCCL's recorder answers
    during a hang, gloo's would wait for the collective in progress), their flight recorder.
    A rank that cannot take the request gets a note in its dump file instead."""
    sent = signal_ranks(ranks, which, stacks.SIG_STACKS)
    for rank in set(which) - set(sent):
        stacks.note_unavailable(paths, rank, _unavailable(ranks[rank], stacks.SIG_STACKS))
    if dump:
        signal_ranks(ranks, sent, stacks.SIG_DUMP)


def _unavailable(proc: RankProcess, sig: int) -> str:
    if proc.exit_status is not None:
        return "the rank has exited"
    return (
        f"the rank has no handler for {stacks.signal_label(sig)} (its code reset it, with "
        "signal.signal or a library that does), so it was not signalled: the signal's default "
        "action would end it"
    )


def request_stop(ranks: Sequence[RankProcess], which: Iterable[int]) -> list[int]:
    """Ask ``which`` to stop; the ranks asked (one without the handler cannot be)."""
    return signal_ranks(ranks, which, stacks.SIG_STOP)


class StackCapture:
    """The stacks of a run's ranks, taken before a timeout stops them (``CAPTURE_S`` later,
    the run machine says when)."""

    def __init__(
        self, paths: RunPaths, ranks: Sequence[RankProcess], which: Sequence[int], dump: bool
    ) -> None:
        self.paths = paths
        self.since = stacks.offsets(paths, which)
        request_stacks(paths, ranks, which, dump)

    def finish(self) -> None:
        """Save what the ranks dumped (``RunPaths.stacks``; the caller's error reads them)."""
        stacks.save(self.paths, stacks.read_new(self.paths, self.since))
