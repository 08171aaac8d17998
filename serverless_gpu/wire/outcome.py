"""One run's outcome, gathered while it runs: shared by the launcher's supervisor and the Ray
backend, so that both end a run in the same words (:class:`RunFinished`'s constructors).

Root cause = the first failure in time (:func:`errors.root_cause`); a failure of the run itself
(its supervision, its placement) competes with the ranks' failures by time too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from serverless_gpu.common.errors import RankFailure, root_cause
from serverless_gpu.wire.events import RunFinished, RunStatus


@dataclass
class RunOutcome:
    """What a run has come to so far; :meth:`finished` is the event that ends it."""

    run_id: str
    failures: list[RankFailure] = field(default_factory=list)
    """Each rank's own failure, in the order they were seen."""
    stop: tuple[RunStatus, str] | None = None
    """Why the run was stopped (``FAILED``, ``TIMED_OUT``, ``CANCELLED``) and in what words;
    None while nothing has stopped it."""
    run_failure: tuple[float, str] | None = None
    """A failure of the run itself (not of a rank): its time and message."""

    @property
    def stopped(self) -> bool:
        return self.stop is not None

    def rank_failed(self, failure: RankFailure) -> None:
        """A rank failed on its own (the run is then stopped, see :meth:`stopped_for`)."""
        self.failures.append(failure)

    def run_failed(self, time: float, message: str) -> None:
        """The run itself failed; it counts only if nothing had stopped the run before."""
        if self.stop is None and self.run_failure is None:
            self.run_failure = (time, message)

    def stopped_for(self, status: RunStatus, message: str = "") -> bool:
        """Record the run's first reason to stop; False if it was stopped already."""
        if self.stop is not None:
            return False
        self.stop = (status, message)
        return True

    def finished(self, unfinished: tuple[int, ...], time: float, note: str = "") -> RunFinished:
        """The run's end: a failure (the first in time), the stop, or success (with ``note``
        on how a stop that was asked for came to nothing)."""
        failures = tuple(self.failures)
        first = root_cause(failures)
        failure = self.run_failure
        if failure is not None and (first is None or failure[0] <= first.time):
            return RunFinished.run_failed(self.run_id, failure[1], unfinished, time, failures)
        if self.stop is None:
            return RunFinished.succeeded(self.run_id, time, note)
        status, message = self.stop
        if status is RunStatus.FAILED and first is not None:
            return RunFinished.rank_failed(self.run_id, failures, unfinished, time)
        if status is RunStatus.FAILED:
            return RunFinished.run_failed(self.run_id, message, unfinished, time, failures)
        return RunFinished.stopped(self.run_id, status, message, unfinished, time, failures)
