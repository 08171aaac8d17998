"""Retrying a call: which failures are retried, and what one call across its attempts holds.

A call with ``max_retries=N`` is started again, up to N times, when an attempt fails with a
crash (a rank killed by a signal or exiting without a result), a lost launcher, or an error of
the collectives (``torch.distributed``'s ``DistError`` family, gloo's and NCCL's runtime errors).
An exception raised by the user's code is the user's answer and is not retried, unless its type
is in ``retry_on``. Timeouts and cancels are never retried unless ``retry_on`` names them.
Each attempt is its own run (own run directory, own MLflow run); ranks read the attempt number
with ``runtime.attempt()`` and resume from ``serverless_gpu.data.latest_checkpoint(root)``.
"""

from __future__ import annotations

import secrets
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from serverless_gpu.common.describe import type_name
from serverless_gpu.common.errors import (
    PEER_LOST_WORDS,
    CancelledError,
    DistributedError,
    DistributedTimeoutError,
    RankFailedError,
    exception_message,
    run_dir_of,
)

_COLLECTIVE_WORDS = ("gloo", "nccl", *PEER_LOST_WORDS)


@dataclass
class Call:
    """One ``.distributed()`` call across its attempts. Hooks keep per-call state in
    ``state`` (tracking keeps the MLflow run grouping the attempts) and learn its end through
    ``on_end``."""

    max_retries: int = 0
    attempt: int = 0
    """The attempt running now: 0 first, then 1, 2 ... (``runtime.attempt()`` in its ranks);
    attempt N > 0 is retry N of ``max_retries``."""
    call_id: str = field(default_factory=lambda: secrets.token_hex(6))
    state: dict[str, Any] = field(default_factory=dict)
    _on_end: list[Callable[[str], None]] = field(default_factory=list)

    def on_end(self, callback: Callable[[str], None]) -> None:
        """``callback(status)`` once the call is over: ``"succeeded"``, ``"failed"`` or
        ``"cancelled"``."""
        self._on_end.append(callback)

    def end(self, status: str) -> None:
        while self._on_end:
            try:
                self._on_end.pop(0)(status)
            except Exception:  # a hook's bookkeeping must not replace the call's outcome
                pass


def retryable(exc: BaseException, retry_on: tuple[type[BaseException] | str, ...] = ()) -> bool:
    names = {type_name(k) for k in retry_on}
    if names & {type_name(cls) for cls in type(exc).__mro__ if issubclass(cls, BaseException)}:
        return True
    if isinstance(exc, (CancelledError, DistributedTimeoutError)):
        return False
    if isinstance(exc, RankFailedError) or type(exc) is DistributedError:
        return True  # a crash, a lost rank, a lost launcher
    return is_collective_error(exc)


def is_collective_error(exc: BaseException) -> bool:
    """An error of torch.distributed's backends, as raised in a rank whose peer went away."""
    for cls in type(exc).__mro__:
        if cls.__module__.startswith("torch.distributed") and cls.__name__.endswith("Error"):
            return True
    if type(exc) is RuntimeError:
        text = str(exc).lower()
        return any(word in text for word in _COLLECTIVE_WORDS)
    return False


@dataclass(frozen=True)
class FailedAttempt:
    number: int
    """Which attempt failed, 0 first (``Call.attempt``)."""
    cause: str
    run_dir: Path | None


def describe(exc: BaseException) -> str:
    """The first line of an attempt's error, with its type."""
    lines = exception_message(exc).strip().splitlines()  # a broken __str__ must not hide exc
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def failed_attempt(number: int, exc: BaseException) -> FailedAttempt:
    return FailedAttempt(number, describe(exc), run_dir_of(exc))


def attempts_note(attempts: list[FailedAttempt]) -> str:
    """Every attempt's root cause, for the last error of a call that was retried."""
    lines = [f"the call was attempted {len(attempts)} times:"]
    for a in attempts:
        where = f" (run directory: {a.run_dir})" if a.run_dir else ""
        lines.append(f"  attempt {a.number}: {a.cause}{where}")
    return "\n".join(lines)


def add_note(exc: BaseException, note: str) -> None:
    if hasattr(exc, "add_note"):
        exc.add_note(note)


def say_retrying(failed: FailedAttempt, call: Call) -> None:
    print(
        f"serverless_gpu: attempt {failed.number} failed ({failed.cause}); starting attempt "
        f"{call.attempt}, retry {call.attempt} of {call.max_retries} (runtime.attempt() tells "
        "the ranks)",
        file=sys.stderr,
        flush=True,
    )
