"""Drop-ins for code written for other launchers, running on this library's launcher.

``TorchDistributor`` follows ``pyspark.ml.torch.distributor.TorchDistributor``'s documented
behaviour, so a Spark notebook's training code runs unchanged::

    from serverless_gpu.compat import TorchDistributor   # was: from pyspark.ml.torch.distributor

    model = TorchDistributor(num_processes=2, local_mode=True, use_gpu=True).run(train, 1e-3)
    TorchDistributor(num_processes=2).run("/path/to/train.py", "--learning-rate=1e-3")

A function gets ``*args, **kwargs`` and rank 0's return value comes back; a path runs the file
as a script on every rank (as ``torchrun file args`` would) with its arguments as strings, and
``None`` comes back. ``use_gpu=False`` runs CPU processes over gloo. Every call gets the same
supervision, per-rank logs and MLflow run as ``@distributed``.

The original API's own names are here too, in one place, beside the modules its notebooks import
them from: ``GPUType``, ``AcceleratorType``, ``get_gpus_per_node`` (``serverless_gpu.compute``),
``ray_init``, ``ray_launch`` (``serverless_gpu.ray``), ``DistributedFunctionCall``,
``WorkloadMetadata``, ``TERMINAL_STATUSES``, ``print_runs``, ``stop`` and ``WorkloadStatus``
(``serverless_gpu.asynchronous``, where ``WorkloadStatus`` is called ``RunStatus``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from serverless_gpu.api.decorator import distributed
from serverless_gpu.api.ray_launch import ray_init, ray_launch
from serverless_gpu.api.scripts import ScriptTarget, script_function
from serverless_gpu.caller.handle import RunHandle as DistributedFunctionCall
from serverless_gpu.caller.statuses import TERMINAL_STATUSES, WorkloadStatus
from serverless_gpu.caller.workloads import WorkloadMetadata, print_runs, stop
from serverless_gpu.common.errors import ConfigurationError, GPUConfigError
from serverless_gpu.common.gpus import GPUType, resolve_placement
from serverless_gpu.common.vocabulary import TORCH_DISTRIBUTOR, speaking
from serverless_gpu.wire.accelerators import AcceleratorType, get_gpus_per_node

__all__ = [
    "TERMINAL_STATUSES",
    "AcceleratorType",
    "DistributedFunctionCall",
    "DriverGPUError",
    "GPUType",
    "TorchDistributor",
    "WorkloadMetadata",
    "WorkloadStatus",
    "get_gpus_per_node",
    "print_runs",
    "ray_init",
    "ray_launch",
    "stop",
]


class TorchDistributor:
    """``TorchDistributor(num_processes=1, local_mode=True, use_gpu=True)``: one process per
    GPU (or CPU process) on this machine.

    ``local_mode=False`` (Spark's executors, off the driver's node) runs on the Ray cluster
    this process is connected to, as ``@distributed(remote=True)``; with none, ``run`` raises
    ``ConfigurationError`` saying how to connect rather than run on this machine unasked.
    """

    def __init__(
        self, num_processes: int = 1, local_mode: bool = True, use_gpu: bool = True, **_: Any
    ) -> None:
        # Spark's checks, in its words, when the distributor is made: not when it runs.
        whole = isinstance(num_processes, int) and not isinstance(num_processes, bool)
        if not whole or num_processes < 1:
            raise ConfigurationError(
                f"num_processes has to be a positive integer, not {num_processes!r}"
            )
        self.num_processes = num_processes
        self.local_mode = local_mode
        self.use_gpu = use_gpu
        if local_mode:  # this machine's GPUs (local_mode=False: the cluster's, when it runs)
            with speaking(TORCH_DISTRIBUTOR):
                _check_here(num_processes, use_gpu)

    def run(self, train_object: Callable[..., Any] | str, *args: Any, **kwargs: Any) -> Any:
        """Run ``train_object`` on every process: rank 0's return value for a function,
        ``None`` for a script path."""
        with speaking(TORCH_DISTRIBUTOR):  # hints name num_processes, use_gpu, local_mode
            return self._run(train_object, args, kwargs)

    def _run(
        self, train_object: Callable[..., Any] | str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        gpu_type = None if self.use_gpu else "cpu"
        remote = not self.local_mode
        if isinstance(train_object, (str, os.PathLike)):
            if kwargs:
                raise ConfigurationError(
                    "a script takes command-line arguments (strings) only, not keyword arguments"
                )
            target = ScriptTarget.script(train_object, tuple(str(a) for a in args))
            run = script_function(target, gpus=self.num_processes, gpu_type=gpu_type, remote=remote)
            run.distributed()
            return None
        if not callable(train_object):
            raise ConfigurationError(
                f"train_object must be a function or a script path, not {train_object!r}"
            )
        decorate = distributed(gpus=self.num_processes, gpu_type=gpu_type, remote=remote)
        return decorate(train_object).distributed(*args, **kwargs)[0]


class DriverGPUError(GPUConfigError, RuntimeError):
    """``use_gpu=True`` where this machine has no GPU: a ``RuntimeError`` as Spark raises it,
    and the library's ``GPUConfigError``."""


def _check_here(num_processes: int, use_gpu: bool) -> None:
    """What ``run`` would refuse on this machine (no GPU for ``use_gpu=True``, too many CPU
    processes), refused now."""
    try:
        resolve_placement(num_processes, None if use_gpu else "cpu")
    except GPUConfigError as exc:
        if not use_gpu or "no GPU is visible" not in str(exc):
            raise
        raise DriverGPUError(f"GPUs were unable to be found on the driver: {exc}") from None
