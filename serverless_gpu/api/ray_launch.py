"""``@ray_launch``: run Ray-native code (Ray Train, Ray Data, plain tasks) as one driver process
on the cluster, with its output, errors, timeout, cancel and MLflow run handled as for
``@distributed``.

The function runs once, in an actor that holds one CPU; it calls Ray itself and Ray places its
work. ``gpus`` is checked against the cluster before the call starts, and the function can read
it back with :func:`launch_gpus` (e.g. for ``ScalingConfig(num_workers=launch_gpus(),
use_gpu=True)``); the GPUs are not reserved ahead, so Ray Train's own placement group gets them.

The original API's Ray names (``ray_launch``, ``ray_init``) are reached through this module, the
one module outside ``backends/`` that names the Ray backend (tests/core/test_backend_registry.py).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any, Generic, ParamSpec, TypeVar

from serverless_gpu.api.decorator import DistributedFunction
from serverless_gpu.backends.ray.connect import ray_init as ray_init  # the original API re-export
from serverless_gpu.common import settings
from serverless_gpu.common.errors import ConfigurationError
from serverless_gpu.common.gpus import GPUType, cpu_mode_requested
from serverless_gpu.wire.accelerators import AcceleratorType, node_shape, one_count
from serverless_gpu.wire.config import DEFAULT_TIMEOUT, DistributedConfig

P = ParamSpec("P")
R = TypeVar("R")
_CPU_MODE_VARS = ("ACCELERATE_USE_CPU", "GLOO_SOCKET_IFNAME", settings.DEVICE.name)


def launch_gpus() -> int:
    """Inside a ``@ray_launch`` function: the ``gpus`` it was decorated with."""
    return settings.RAY_LAUNCH_GPUS.read()


class RayLaunchFunction(Generic[P, R]):
    """A function decorated with ``@ray_launch``: ``.distributed(*args)`` returns one entry per
    rank, as the original's (``gpus`` ranks, at least one): the function's value first, where
    the original's rank 0 runs it as the driver, and ``None`` for the others."""

    def __init__(self, func: Callable[P, R], gpus: int, gpu_type: str | None, **options: Any):
        self.func = func
        self.gpus = gpus
        self.gpu_type = gpu_type
        config = DistributedConfig(gpus=1, gpu_type="cpu", remote=True, **options)
        self._inner: DistributedFunction[P, R] = DistributedFunction(
            _as_driver(func, gpus, tuple(k for k in _CPU_MODE_VARS if k in os.environ)), config
        )
        functools.update_wrapper(self, func)  # type: ignore[arg-type]

    def distributed(self, *args: P.args, **kwargs: P.kwargs) -> list[R | None]:
        """``[value, None, ...]``, one entry per rank: the function run on the connected Ray
        cluster; without one, on a Ray cluster of this machine started for the call (the
        original's local mode). In CPU mode (``gpu_type="cpu"`` or ``SERVERLESS_GPU_TYPE=cpu``)
        the count is of CPU ranks, as for ``@distributed``: no GPU is asked of the cluster."""
        __tracebackhide__ = True
        from serverless_gpu.backends.ray.connect import local_cluster

        with local_cluster(cpu_only=cpu_mode_requested(self.gpu_type)):
            self._check_cluster()
            value: R | None = self._inner.distributed(*args, **kwargs)[0]
        return [value, *[None] * (max(self.gpus, 1) - 1)]

    def start(self, *args: P.args, **kwargs: P.kwargs) -> Any:
        """The run's handle (its result is a one-element list), on the connected cluster:
        a cluster of this machine lives only as long as ``.distributed()``."""
        self._check_cluster()
        return self._inner.start(*args, **kwargs)

    def _check_cluster(self) -> None:
        from serverless_gpu.backends.ray.connect import connect

        ray = connect()
        if self.gpus == 0 or cpu_mode_requested(self.gpu_type):
            return  # CPU mode: the count is of CPU ranks, as @distributed's
        total = ray.cluster_resources()
        have = total.get("GPU", 0)
        if self.gpu_type is not None:
            key = f"accelerator_type:{GPUType.parse(self.gpu_type).value}"
            have = sum(n["Resources"].get("GPU", 0) for n in ray.nodes() if key in n["Resources"])
        if have < self.gpus:
            kind = f" {self.gpu_type}" if self.gpu_type else ""
            raise ConfigurationError(
                f"@ray_launch(gpus={self.gpus}) needs {self.gpus}{kind} GPUs on the Ray cluster, "
                f"and it has {have:g}"
            )


def _as_driver(func: Callable[..., Any], gpus: int, caller_set: tuple[str, ...]) -> Any:
    """The function as the driver runs it: told its GPU count, without CPU-rank settings."""

    @functools.wraps(func)
    def driver(*args: Any, **kwargs: Any) -> Any:
        for key in _CPU_MODE_VARS:
            if key not in caller_set:
                os.environ.pop(key, None)
        os.environ[settings.RAY_LAUNCH_GPUS.name] = str(gpus)
        return func(*args, **kwargs)

    return driver


def ray_launch(
    num_accelerators: int | None = None,
    accelerator_type: str | AcceleratorType | GPUType | None = None,
    remote: bool = False,
    timeout: float | None = DEFAULT_TIMEOUT,
    *,
    gpus: int | None = None,
    gpu_type: str | GPUType | None = None,
    **options: Any,
) -> Callable[[Callable[P, R]], RayLaunchFunction[P, R]]:
    """Decorate Ray-native code: ``fn.distributed(*args)`` runs ``fn`` once on the connected
    Ray cluster and returns its value. ``gpus`` (``num_accelerators``): GPUs the cluster must
    have, of ``gpu_type`` (or of ``accelerator_type``'s family, ``"GPU_8xH100"``); none by
    default. ``remote`` is accepted for the original's signature: the call runs on the
    connected cluster either way."""
    count = one_count(gpus, num_accelerators)
    family = _family(gpu_type, accelerator_type)
    if count is None:
        count = 0
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise ConfigurationError(f"gpus must be a whole number >= 0, not {count!r}")

    def wrap(func: Callable[P, R]) -> RayLaunchFunction[P, R]:
        return RayLaunchFunction(func, count, family, timeout=timeout, **options)

    return wrap


def _family(gpu_type: str | GPUType | None, accelerator_type: object) -> str | None:
    """The GPU family asked for in either spelling; both given must agree."""
    if accelerator_type is None:
        return None if gpu_type is None else str(getattr(gpu_type, "value", gpu_type))
    family = node_shape(accelerator_type)[1]
    if gpu_type is not None and GPUType.parse(gpu_type) is not family:
        raise ConfigurationError(
            f"gpu_type={gpu_type!r} and accelerator_type={str(accelerator_type)!r} are two "
            "spellings of one option with different values: give one of them"
        )
    return family.value
