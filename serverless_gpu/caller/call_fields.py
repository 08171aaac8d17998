"""The fields the original API's call handle lists (``func_name``, ``gpus``, ``instance``,
``params``, ``exception``, ``start_time``), on :class:`~serverless_gpu.RunHandle`.

They are read from the run's ``run.json`` (``runrecord.py``) as ``workload_metadata`` is, so a
handle re-attached from another process (``from_run_id``) has them too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from serverless_gpu.caller.runrecord import read_record
from serverless_gpu.wire.events import RunStatus

if TYPE_CHECKING:
    from serverless_gpu.caller.workloads import WorkloadMetadata


class CallFields:
    """Mixed into the handle, which provides what is declared here."""

    if TYPE_CHECKING:
        run_dir: Any

        @property
        def workload_metadata(self) -> WorkloadMetadata: ...

        @property
        def status(self) -> RunStatus: ...

        def done(self) -> bool: ...

        def result(self, timeout: float | None = None, logs: bool = False) -> Any: ...

    @property
    def func_name(self) -> str:
        """The function's name (the run's name)."""
        return self.workload_metadata.name

    @property
    def gpus(self) -> int:
        """The run's ranks: GPUs, or CPU ranks in CPU mode."""
        return self.workload_metadata.gpus

    @property
    def instance(self) -> str:
        """The GPU family of the ranks (``"H100"``), or ``"CPU"``."""
        return self.workload_metadata.instance

    @property
    def params(self) -> dict[str, Any]:
        """The call's arguments by parameter name, as short strings."""
        return self.workload_metadata.params

    @property
    def start_time(self) -> float | None:
        """When the call started (seconds since the epoch, ``time.time()``)."""
        started = read_record(self.run_dir).get("started")
        return None if started is None else float(started)

    @property
    def exception(self) -> BaseException | None:
        """The exception ``result()`` raises for a run that has ended without succeeding;
        ``None`` while it runs and after it succeeded."""
        if not self.done() or self.status is RunStatus.SUCCEEDED:
            return None  # a success's values are not loaded for this
        try:
            self.result(0)
        except Exception as exc:  # the same exception every time (the outcome is built once)
            return exc
        return None
