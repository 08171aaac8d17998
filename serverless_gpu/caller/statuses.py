"""The original API's names for a run's status (``PENDING``, ``RUNNING``, ``COMPLETED`` ...),
read from this library's :class:`~serverless_gpu.RunStatus` through one table.

``handle.status`` stays a :class:`RunStatus`; each :class:`WorkloadStatus` member compares
equal to the statuses it names, and :data:`TERMINAL_STATUSES` holds either kind, so code
written for the original runs unchanged:

>>> while h.status not in TERMINAL_STATUSES:
...     time.sleep(2)
>>> h.status == WorkloadStatus.COMPLETED      # True when it succeeded
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

from serverless_gpu.wire.events import RunStatus


class WorkloadStatus(enum.Enum):
    """A run's status under the original API's names; ``WorkloadStatus.of(h.status)``."""

    RATE_LIMITED = "RATE_LIMITED"
    """Never here: the original holds back runs a client-side rate limit has not sent yet."""
    PENDING = "PENDING"
    """Waiting for devices that other runs of this caller hold (``queued``)."""
    QUEUED = "QUEUED"
    """Never here: the original's platform has accepted the run and not yet placed it."""
    STARTING = "STARTING"
    """Devices allocated, ranks starting."""
    RUNNING = "RUNNING"
    TERMINATING = "TERMINATING"
    """Never here: a cancelled run reads ``RUNNING`` until its ranks are gone, then ``STOPPED``."""
    COMPLETED = "COMPLETED"
    STOPPED = "STOPPED"
    """Cancelled (by the user, ``stop()``, an interrupt or SIGTERM)."""
    FAILED = "FAILED"
    """A rank failed, the run timed out, or its caller was lost."""
    UNKNOWN = "UNKNOWN"

    @classmethod
    def of(cls, status: RunStatus) -> WorkloadStatus:
        return _NAMES[status]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RunStatus):  # reached from ``h.status == WorkloadStatus.X`` too
            return _NAMES[other] is self
        return self is other

    def __hash__(self) -> int:
        # As the RunStatus it equals hashes, so that `h.status in {WorkloadStatus.COMPLETED}`
        # (a plain set) finds it; a name no RunStatus has hashes by its own name.
        ours = [status for status, name in _NAMES.items() if name is self]
        return hash(ours[0]) if ours else hash(self._name_)


def _starting() -> RunStatus:
    """Our "devices allocated, ranks starting" member, whatever it is spelled: the one that is
    neither queued, running nor finished."""
    (member,) = (
        s for s in RunStatus if not s.finished and s not in (RunStatus.QUEUED, RunStatus.RUNNING)
    )
    return member


_NAMES: dict[RunStatus, WorkloadStatus] = {
    RunStatus.QUEUED: WorkloadStatus.PENDING,
    _starting(): WorkloadStatus.STARTING,
    RunStatus.RUNNING: WorkloadStatus.RUNNING,
    RunStatus.SUCCEEDED: WorkloadStatus.COMPLETED,
    RunStatus.FAILED: WorkloadStatus.FAILED,
    RunStatus.TIMED_OUT: WorkloadStatus.FAILED,
    RunStatus.CANCELLED: WorkloadStatus.STOPPED,
}
"""The one table from this library's statuses to the original's names."""


class _Statuses(frozenset[WorkloadStatus]):
    """A set of :class:`WorkloadStatus` that a :class:`RunStatus` is found in by its name."""

    def __new__(cls, members: Iterable[WorkloadStatus]) -> _Statuses:
        return super().__new__(cls, members)

    def __contains__(self, item: object) -> bool:
        if isinstance(item, RunStatus):
            item = WorkloadStatus.of(item)
        return super().__contains__(item)


TERMINAL_STATUSES = _Statuses(
    {WorkloadStatus.COMPLETED, WorkloadStatus.FAILED, WorkloadStatus.STOPPED}
)
"""The statuses of a run that has ended (the original's set): ``h.status in TERMINAL_STATUSES``
is ``h.status.finished``."""
