"""The seam between the public API and where ranks actually run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from ..gpus import Placement
from ..handle import RunHandle
from ..hooks import RunContext


@dataclass(frozen=True)
class RunRequest:
    """One call, serialized and checked, ready to start."""

    context: RunContext
    payload: bytes
    """``cloudpickle.dumps((func, args, kwargs))``, made once in the caller."""
    env: dict[str, str]
    """The caller's environment at call time, with the hooks' additions."""
    cwd: str
    sys_path: tuple[str, ...]
    grace: float
    """Seconds between SIGTERM and SIGKILL when ranks are stopped."""


class Backend(Protocol):
    def submit(self, request: RunRequest) -> RunHandle[Any]:
        """Start the ranks; returns at once with a handle whose events are being fed."""
        ...

    def start(self) -> None:
        """Start this backend's helper processes now if they are not running; non-blocking."""
        ...

    def prewarm(self, placement: Placement, preload: tuple[str, ...] = ()) -> None:
        """Get ready for calls of this shape (start processes, standby ranks, import ``preload``
        modules where ranks are created); non-blocking."""
        ...

    def shutdown(self) -> None:
        """Stop every rank and helper process this backend started."""
        ...
