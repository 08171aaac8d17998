"""serverless-gpu: run a notebook function on every GPU of the machine.

>>> from serverless_gpu import distributed
>>> @distributed(gpus=8)
... def train(epochs: int) -> float: ...
>>> losses = train.distributed(3)   # one entry per rank, in rank order
"""

from __future__ import annotations

import types
from typing import Any

from . import runrecord as _runrecord  # noqa: F401 - registers the run.json hook
from . import stop as _stop_module
from .aliases import AcceleratorType
from .backends.ray import ray_init, ray_launch
from .caller.statuses import TERMINAL_STATUSES, WorkloadStatus
from .caller.workloads import WorkloadMetadata, print_runs
from .caller.workloads import stop as _stop_runs
from .completion import ALL_COMPLETED, FIRST_COMPLETED, FIRST_EXCEPTION, as_completed, wait
from .decorator import DistributedConfig, DistributedFunction, distributed, warm_up
from .errors import (
    CancelledError,
    ConfigurationError,
    DistributedError,
    DistributedTimeoutError,
    GPUConfigError,
    RankFailedError,
    RemoteError,
    SerializationError,
    StorageError,
    UsageError,
    WaitTimeoutError,
)
from .events import RunStatus
from .gpus import GPUType
from .handle import RunHandle
from .handle import RunHandle as DistributedFunctionCall
from .results import RunResult
from .runtime import (
    get_global_rank,
    get_local_rank,
    get_local_world_size,
    get_node_rank,
    get_world_size,
)
from .sweep import sweep

__version__ = "0.1.0"


class _CallableModule(types.ModuleType):
    """``serverless_gpu.stop(runs)`` (the original API's) is also the name of the rank-side
    module ``stop.py``, which ``from . import stop`` must still find: the module is made
    callable rather than shadowed by the function."""

    def __call__(self, runs: Any) -> None:
        _stop_runs(runs)

    __call__.__doc__ = _stop_runs.__doc__


_stop_module.__class__ = _CallableModule
stop: Any = _stop_module

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
    "GPUConfigError",
    "GPUType",
    "RankFailedError",
    "RemoteError",
    "RunHandle",
    "RunResult",
    "RunStatus",
    "SerializationError",
    "StorageError",
    "UsageError",
    "WaitTimeoutError",
    "WorkloadMetadata",
    "WorkloadStatus",
    "as_completed",
    "distributed",
    "get_global_rank",
    "get_local_rank",
    "get_local_world_size",
    "get_node_rank",
    "get_world_size",
    "print_runs",
    "ray_init",
    "ray_launch",
    "shutdown",
    "stop",
    "sweep",
    "wait",
    "warm_up",
]


def shutdown() -> None:
    """Stop the launcher and every rank it started (also done automatically at exit), and
    the calls running on a Ray cluster."""
    from .backends.local import default_backend
    from .backends.ray import stop_ray_calls
    from .decorator import join_prewarm

    join_prewarm()
    default_backend().shutdown()
    stop_ray_calls()


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext serverless_gpu``: an alias that hands over to ``jupyter_ext`` lazily."""
    import jupyter_ext

    jupyter_ext.load_ipython_extension(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    import jupyter_ext

    jupyter_ext.unload_ipython_extension(ipython)
