"""serverless-gpu: run a notebook function on every GPU of the machine.

>>> from serverless_gpu import distributed
>>> @distributed(gpus=8)
... def train(epochs: int) -> float: ...
>>> losses = train.distributed(3)   # one entry per rank, in rank order
"""

from __future__ import annotations

from typing import Any

from serverless_gpu.api.completion import (
    ALL_COMPLETED,
    FIRST_COMPLETED,
    FIRST_EXCEPTION,
    as_completed,
    wait,
)
from serverless_gpu.api.decorator import (
    DistributedConfig,
    DistributedFunction,
    distributed,
    warm_up,
)
from serverless_gpu.api.ray_launch import ray_init, ray_launch
from serverless_gpu.api.session import Session, SessionEndedError
from serverless_gpu.api.shutdown import shutdown
from serverless_gpu.api.sweep import sweep
from serverless_gpu.caller import reattach as _reattach  # noqa: F401 - gives RunHandle.from_run_id
from serverless_gpu.caller import runrecord as _runrecord  # noqa: F401 - registers the run.json hook
from serverless_gpu.caller.handle import RunHandle
from serverless_gpu.caller.handle import RunHandle as DistributedFunctionCall
from serverless_gpu.caller.results import RunResult
from serverless_gpu.caller.statuses import TERMINAL_STATUSES, WorkloadStatus
from serverless_gpu.caller.workloads import WorkloadMetadata, print_runs, stop
from serverless_gpu.common.errors import (
    CancelledError,
    ConfigurationError,
    DistributedError,
    DistributedTimeoutError,
    FailureKind,
    GPUConfigError,
    RankFailedError,
    RankFailure,
    RemoteError,
    SerializationError,
    StorageError,
    UsageError,
    WaitTimeoutError,
    failures_of,
    rank_of,
    run_dir_of,
)
from serverless_gpu.common.gpus import GPUType
from serverless_gpu.rank.runtime import (
    get_global_rank,
    get_local_rank,
    get_local_world_size,
    get_node_rank,
    get_world_size,
)
from serverless_gpu.wire.accelerators import AcceleratorType
from serverless_gpu.wire.events import RunStatus

__version__ = "0.1.0"


__all__ = [
    "ALL_COMPLETED",
    "FIRST_COMPLETED",
    "FIRST_EXCEPTION",
    "TERMINAL_STATUSES",
    "AcceleratorType",
    "CancelledError",
    "ConfigurationError",
    "DistributedConfig",
    "DistributedError",
    "DistributedFunction",
    "DistributedFunctionCall",
    "DistributedTimeoutError",
    "FailureKind",
    "GPUConfigError",
    "GPUType",
    "RankFailedError",
    "RankFailure",
    "RemoteError",
    "RunHandle",
    "RunResult",
    "RunStatus",
    "SerializationError",
    "Session",
    "SessionEndedError",
    "StorageError",
    "UsageError",
    "WaitTimeoutError",
    "WorkloadMetadata",
    "WorkloadStatus",
    "as_completed",
    "distributed",
    "failures_of",
    "get_global_rank",
    "get_local_rank",
    "get_local_world_size",
    "get_node_rank",
    "get_world_size",
    "print_runs",
    "rank_of",
    "ray_init",
    "ray_launch",
    "run_dir_of",
    "shutdown",
    "stop",
    "sweep",
    "wait",
    "warm_up",
]


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext serverless_gpu``: an alias that hands over to ``jupyter_ext`` lazily."""
    import jupyter_ext

    jupyter_ext.load_ipython_extension(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    import jupyter_ext

    jupyter_ext.unload_ipython_extension(ipython)
