"""Waiting on many runs at once, as ``concurrent.futures`` waits on futures.

``as_completed(handles)`` yields each :class:`RunHandle` as its run ends; ``wait(handles,
return_when=...)`` returns ``(done, not_done)``. Both pump the handles' events in the calling
thread (renderers and trackers update there), and both are bounded by ``timeout``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ALL_COMPLETED, FIRST_COMPLETED, FIRST_EXCEPTION
from typing import Any, NamedTuple

from serverless_gpu.caller.handle import RunHandle, deadline_of
from serverless_gpu.common.errors import WaitTimeoutError
from serverless_gpu.wire.events import RunStatus

__all__ = ["ALL_COMPLETED", "FIRST_COMPLETED", "FIRST_EXCEPTION", "as_completed", "wait"]

_SLICE_S = 0.05


class DoneAndNotDone(NamedTuple):
    done: set[RunHandle[Any]]
    not_done: set[RunHandle[Any]]


def _newly_done(pending: list[RunHandle[Any]]) -> list[RunHandle[Any]]:
    """The pending handles whose run has ended, in the order the runs ended."""
    done = [h for h in pending if h.done()]
    return sorted(done, key=lambda h: h.finished.time if h.finished else 0.0)


def _pump(pending: list[RunHandle[Any]], deadline: float | None) -> None:
    """Wait one short slice on a pending handle (its events; idle callbacks run)."""
    if deadline is not None and deadline - time.monotonic() <= 0:
        return
    seconds = _SLICE_S if deadline is None else min(_SLICE_S, deadline - time.monotonic())
    pending[0].wait(max(0.0, seconds))


def as_completed(
    handles: Iterable[RunHandle[Any]], timeout: float | None = None
) -> Iterator[RunHandle[Any]]:
    """Yield each handle once its run has ended (succeeded, failed or cancelled), first ended
    first. Raises :class:`WaitTimeoutError` (a ``TimeoutError``) if ``timeout`` seconds pass
    with runs still going; those go on."""
    pending = list(dict.fromkeys(handles))
    deadline = deadline_of(timeout)
    while pending:
        ended = _newly_done(pending)
        for handle in ended:
            pending.remove(handle)
            yield handle
        if not pending:
            return
        if deadline is not None and time.monotonic() >= deadline:
            raise WaitTimeoutError(f"{len(pending)} of the runs still going after {timeout:g} s")
        if not ended:
            _pump(pending, deadline)


def wait(
    handles: Iterable[RunHandle[Any]],
    timeout: float | None = None,
    return_when: str = ALL_COMPLETED,
) -> DoneAndNotDone:
    """``(done, not_done)`` once ``return_when`` holds (``FIRST_COMPLETED``,
    ``FIRST_EXCEPTION``: a run ended other than succeeded, ``ALL_COMPLETED``) or ``timeout``
    seconds have passed; never raises for a timeout, as ``concurrent.futures.wait``."""
    if return_when not in (ALL_COMPLETED, FIRST_COMPLETED, FIRST_EXCEPTION):
        raise ValueError(
            f"return_when must be one of {ALL_COMPLETED!r}, {FIRST_COMPLETED!r}, "
            f"{FIRST_EXCEPTION!r}, not {return_when!r}"
        )
    everything = set(handles)
    deadline = deadline_of(timeout)
    while True:
        done = {h for h in everything if h.done()}
        not_done = everything - done
        failed = any(h.status is not RunStatus.SUCCEEDED for h in done)
        if (
            not not_done
            or (return_when == FIRST_COMPLETED and done)
            or (return_when == FIRST_EXCEPTION and failed)
            or (deadline is not None and time.monotonic() >= deadline)
        ):
            return DoneAndNotDone(done, not_done)
        _pump(list(not_done), deadline)
