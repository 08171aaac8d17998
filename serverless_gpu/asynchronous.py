"""The original API's ``asynchronous`` module, for code that imports from it: its names are
this library's (``DistributedFunctionCall`` is :class:`~serverless_gpu.RunHandle`; ``RunStatus``
here is ``WorkloadStatus``, the original's status names, also
``serverless_gpu.compat.WorkloadStatus``; ``serverless_gpu.RunStatus`` is this library's own).

>>> from serverless_gpu.asynchronous import DistributedFunctionCall, RunStatus, print_runs
>>> run = DistributedFunctionCall.from_run_id("3f2a9c1b7d04")
>>> run.status == RunStatus.COMPLETED
"""

from __future__ import annotations

from serverless_gpu.caller.handle import RunHandle as DistributedFunctionCall
from serverless_gpu.caller.statuses import TERMINAL_STATUSES
from serverless_gpu.caller.statuses import WorkloadStatus as RunStatus
from serverless_gpu.caller.workloads import WorkloadMetadata, print_runs, stop

__all__ = [
    "TERMINAL_STATUSES",
    "DistributedFunctionCall",
    "RunStatus",
    "WorkloadMetadata",
    "print_runs",
    "stop",
]
