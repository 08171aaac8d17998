"""In the launcher: the steps by which one run that must end is ended, and their timers.

On a timeout the ranks' stacks are taken first (:class:`StackCapture`); then, with
``stop_grace``, the ranks are asked to return (``runtime.should_stop()``) and given that long;
then every rank still there gets SIGTERM, and SIGKILL once the grace period is over (also one
blocked in a collective). Ranks that have all returned are released, and killed if their
teardown outlasts ``RELEASE_GRACE_S``. The supervisor decides when to take each step
(``RunPhase``); this class takes it.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterable, Sequence

from serverless_gpu.common.lifetime import kill_group
from serverless_gpu.launcher_process.rank_handle import RankProcess
from serverless_gpu.launcher_process.stop_signals import StackCapture, request_stop
from serverless_gpu.wire.events import RunStatus
from serverless_gpu.wire.protocol import Release
from serverless_gpu.wire.runspec import RunSpec

RELEASE_GRACE_S = 5.0
"""How long ranks that all returned may take to exit (communicator and CUDA teardown)."""


class StopLadder:
    """The stop steps of one run's ranks (``procs``, in rank order)."""

    def __init__(self, spec: RunSpec, procs: Sequence[RankProcess]) -> None:
        self.spec = spec
        self.procs = procs
        self.grace = spec.grace
        self.stop_grace = float(spec.config.stop_grace)
        self.deadline = time.monotonic() + spec.timeout if spec.timeout is not None else None
        """When the call's timeout strikes; None once it has (or without one)."""
        self.capture: StackCapture | None = None
        """The timeout's stack capture, while the ranks' dumps are awaited."""
        self.asked: tuple[RunStatus, str] | None = None
        """The stop the ranks were asked for (graceful stop), and its reason."""
        self.ask_deadline: float | None = None
        self.kill_deadline: float | None = None

    @property
    def dumps(self) -> bool:
        """Whether the ranks dump their flight recorder with their stacks: NCCL's answers
        during a hang; gloo's (CPU mode) would wait for the collective in progress."""
        return self.spec.device != "cpu"

    def timeout_struck(self, now: float) -> bool:
        """True once, when the call's timeout has come."""
        if self.deadline is None or now < self.deadline:
            return False
        self.deadline = None
        return True

    def take_stacks(self, live: Sequence[int]) -> None:
        """The timeout's first step: ask the ``live`` ranks for their stacks."""
        self.capture = StackCapture(self.spec.paths, self.procs, live, self.dumps)

    def stacks_taken(self, now: float) -> bool:
        """True once, when the timeout's stacks are in (or their wait is over): saved."""
        if self.capture is None or now < self.capture.due:
            return False
        self.capture.finish()
        self.capture = None
        return True

    def ask(self, status: RunStatus, message: str, which: Iterable[int]) -> bool:
        """Ask ``which`` to return within ``stop_grace``; False when none can be asked (no
        ``stop_grace``, none has started, or its code reset the handler): stop them now."""
        if self.stop_grace <= 0 or not request_stop(self.procs, which):
            return False
        self.asked = (status, message)
        self.ask_deadline = time.monotonic() + self.stop_grace
        return True

    def ask_expired(self, now: float) -> tuple[RunStatus, str] | None:
        """The stop asked for, once, when its ``stop_grace`` is over."""
        if self.asked is None or self.ask_deadline is None or now < self.ask_deadline:
            return None
        self.ask_deadline = None
        return self.asked

    def term(self, which: Iterable[int]) -> None:
        """SIGTERM to ``which``; SIGKILL to every rank left once the grace period is over."""
        for rank in which:
            kill_group(self.procs[rank].pid, signal.SIGTERM)
        self.kill_deadline = time.monotonic() + self.grace

    def release(self) -> None:
        """Every rank returned: let them exit, and kill those still there after a while."""
        for proc in self.procs:
            proc.channel.send(Release())
        self.kill_deadline = time.monotonic() + RELEASE_GRACE_S

    def kill_if_due(self, now: float, which: Iterable[int]) -> None:
        if self.kill_deadline is not None and now >= self.kill_deadline:
            for rank in which:
                kill_group(self.procs[rank].pid, signal.SIGKILL)
