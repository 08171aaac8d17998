"""serverless-gpu: run a notebook function on every GPU of the machine.

>>> from serverless_gpu import distributed
>>> @distributed(gpus=8)
... def train(epochs: int) -> float: ...
>>> losses = train.distributed(3)   # one entry per rank, in rank order

The top level holds what a user of this library needs (``__all__``, the list docs/api.md
gives); what a rank uses is :mod:`serverless_gpu.runtime`, and the original API's names are in
its own modules (``compute``, ``launcher``, ``ray``, ``asynchronous``, ``exceptions``) and in
:mod:`serverless_gpu.compat`.
"""

from __future__ import annotations

import importlib
import warnings
from typing import TYPE_CHECKING, Any

from serverless_gpu.api.completion import as_completed, wait
from serverless_gpu.api.decorator import (
    DistributedConfig,
    DistributedFunction,
    distributed,
    warm_up,
)
from serverless_gpu.api.session import Session, SessionEndedError
from serverless_gpu.api.shutdown import shutdown
from serverless_gpu.api.sweep import sweep
from serverless_gpu.caller import reattach as _reattach  # noqa: F401 - gives RunHandle.from_run_id
from serverless_gpu.caller import runrecord as _runrecord  # noqa: F401 - registers the run.json hook
from serverless_gpu.caller.handle import RunHandle
from serverless_gpu.caller.results import RunResult
from serverless_gpu.common.errors import (
    CancelledError,
    ConfigurationError,
    DistributedError,
    DistributedTimeoutError,
    RankFailedError,
    WaitTimeoutError,
    failures_of,
    rank_of,
    run_dir_of,
)
from serverless_gpu.wire.events import RunStatus

__version__ = "0.1.0"


__all__ = [
    "CancelledError",
    "ConfigurationError",
    "DistributedConfig",
    "DistributedError",
    "DistributedFunction",
    "DistributedTimeoutError",
    "RankFailedError",
    "RunHandle",
    "RunResult",
    "RunStatus",
    "Session",
    "SessionEndedError",
    "WaitTimeoutError",
    "as_completed",
    "distributed",
    "failures_of",
    "rank_of",
    "run_dir_of",
    "shutdown",
    "sweep",
    "wait",
    "warm_up",
]

_ERRORS = "serverless_gpu.common.errors"
_RUNTIME = "serverless_gpu.runtime"
_MOVED: dict[str, str] = {
    # the original API's names, in its own modules
    "AcceleratorType": "serverless_gpu.compute",
    "GPUType": "serverless_gpu.compute",
    "ray_init": "serverless_gpu.ray",
    "ray_launch": "serverless_gpu.ray",
    "DistributedFunctionCall": "serverless_gpu.asynchronous",
    "TERMINAL_STATUSES": "serverless_gpu.asynchronous",
    "WorkloadMetadata": "serverless_gpu.asynchronous",
    "print_runs": "serverless_gpu.asynchronous",
    "stop": "serverless_gpu.asynchronous",
    # `asynchronous` calls it RunStatus, which names this library's own statuses here
    "WorkloadStatus": "serverless_gpu.compat",
    # what a rank asks
    "get_global_rank": _RUNTIME,
    "get_local_rank": _RUNTIME,
    "get_local_world_size": _RUNTIME,
    "get_node_rank": _RUNTIME,
    "get_world_size": _RUNTIME,
    # errors seldom caught by name, and what describes a failure
    "FailureKind": _ERRORS,
    "GPUConfigError": _ERRORS,
    "RankFailure": _ERRORS,
    "RemoteError": _ERRORS,
    "SerializationError": _ERRORS,
    "StorageError": _ERRORS,
    "UsageError": _ERRORS,
    # wait()'s return_when values are concurrent.futures' own
    "ALL_COMPLETED": "concurrent.futures",
    "FIRST_COMPLETED": "concurrent.futures",
    "FIRST_EXCEPTION": "concurrent.futures",
}
"""Names the top level exported until 0.1 and no longer lists, with the module that has them
now: they still import from here, with a ``DeprecationWarning``, until 0.2."""


if not TYPE_CHECKING:  # type checkers see only the names above: a moved name is an error there

    def __getattr__(name: str) -> Any:
        """A moved name, from its new module, with a warning naming that module."""
        module = _MOVED.get(name)
        if module is None:
            raise AttributeError(f"module 'serverless_gpu' has no attribute {name!r}")
        warnings.warn(
            f"serverless_gpu.{name} is deprecated and leaves the top level in 0.2: "
            f"use `from {module} import {name}`",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(module), name)


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext serverless_gpu``: an alias that hands over to ``jupyter_ext`` lazily."""
    import jupyter_ext

    jupyter_ext.load_ipython_extension(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    import jupyter_ext

    jupyter_ext.unload_ipython_extension(ipython)
