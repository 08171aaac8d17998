"""The seam between the public API and where ranks actually run."""

from __future__ import annotations

from typing import Any, Protocol

from serverless_gpu.caller.handle import RunHandle
from serverless_gpu.caller.hooks import RunContext
from serverless_gpu.common.gpus import Placement


class Backend(Protocol):
    def submit(self, context: RunContext, payload: bytes) -> RunHandle[Any]:
        """Start the ranks of ``context.spec`` (sealed: the one record of the call a backend
        ships) with ``payload``, ``cloudpickle.dumps((func, args, kwargs))`` made once in the
        caller; returns at once with a handle whose events are being fed."""
        ...

    def start(self) -> None:
        """Start this backend's helper processes now if they are not running; non-blocking."""
        ...

    def prewarm(
        self, placement: Placement, preload: tuple[str, ...] = (), warm_group: bool = True
    ) -> None:
        """Get ready for calls of this shape (start processes, standby ranks, import ``preload``
        modules where ranks are created, form their process group if ``warm_group``);
        non-blocking."""
        ...

    def shutdown(self) -> None:
        """Stop every rank and helper process this backend started."""
        ...
