"""In the launcher: the steps by which one run that must end is ended, on its processes.

The run machine (``lifecycle/run_machine.py``) decides when each step is due; this class takes
it: a timeout's stacks (:class:`StackCapture`), the stop request (``runtime.should_stop()``),
SIGTERM, SIGKILL, and the ``Release`` of ranks that all returned. A rank already reaped is
never signalled: its pid (and group id) may belong to someone else by now.
"""

from __future__ import annotations

import signal
from collections.abc import Iterable, Sequence

from serverless_gpu.common.lifetime import kill_group
from serverless_gpu.launcher_process.rank_handle import RankProcess
from serverless_gpu.launcher_process.stop_signals import StackCapture, request_stacks, request_stop
from serverless_gpu.wire.protocol import Release
from serverless_gpu.wire.runspec import RunSpec


class StopLadder:
    """The stop steps of one run's ranks (``procs``, in rank order)."""

    def __init__(self, spec: RunSpec, procs: Sequence[RankProcess]) -> None:
        self.spec = spec
        self.procs = procs
        self.capture: StackCapture | None = None
        """The timeout's stack capture, while the ranks' dumps are awaited."""

    @property
    def dumps(self) -> bool:
        """Whether the ranks dump their flight recorder with their stacks: NCCL's answers
        during a hang; gloo's (CPU mode) would wait for the collective in progress."""
        return self.spec.device != "cpu"

    def take_stacks(self, live: Sequence[int]) -> None:
        """The timeout's first step: ask the ``live`` ranks for their stacks."""
        self.capture = StackCapture(self.spec.paths, self.procs, live, self.dumps)

    def save_stacks(self) -> None:
        """The timeout's stacks are in (or their wait is over): save them."""
        if self.capture is not None:
            self.capture.finish()
            self.capture = None

    def request_stacks(self, live: Sequence[int]) -> None:
        """Stacks now, for whoever asked (``handle.stacks()``, the widget)."""
        request_stacks(self.spec.paths, self.procs, live, self.dumps)

    def ask(self, which: Iterable[int]) -> bool:
        """Ask ``which`` to return; False when none could be asked (none has the handler)."""
        return bool(request_stop(self.procs, which))

    def term(self, which: Iterable[int]) -> None:
        self._signal(which, signal.SIGTERM)

    def kill(self, which: Iterable[int]) -> None:
        self._signal(which, signal.SIGKILL)

    def _signal(self, which: Iterable[int], sig: int) -> None:
        for rank in which:
            proc = self.procs[rank]
            if proc.exit_status is None:
                kill_group(proc.pid, sig)

    def release(self) -> None:
        """Every rank returned: let them exit (the machine kills those still there later)."""
        for proc in self.procs:
            proc.channel.send(Release())
