"""What ``@distributed`` checks of the function it decorates, and what it says of its nodes."""

from __future__ import annotations

import inspect

from serverless_gpu.common.errors import GPUConfigError, UsageError
from serverless_gpu.common.gpus import GPUType
from serverless_gpu.wire.accelerators import get_gpus_per_node
from serverless_gpu.wire.config import DistributedConfig


def check_function(func: object) -> None:
    """What ``.distributed`` can run: a plain callable whose return value is the result."""
    if not callable(func):
        raise UsageError(f"@distributed needs a function (a callable), not {func!r}")
    target = inspect.unwrap(func) if inspect.isfunction(func) else func
    if inspect.isasyncgenfunction(target) or inspect.iscoroutinefunction(target):
        raise UsageError(
            f"{getattr(func, '__qualname__', func)!r} is an async function: each rank calls the "
            "function and returns its value, and nothing would run a coroutine there; wrap it "
            "in a plain function that calls asyncio.run(...)"
        )
    if inspect.isgeneratorfunction(target):
        raise UsageError(
            f"{getattr(func, '__qualname__', func)!r} is a generator function: a generator "
            "cannot be sent back from a rank; return a list instead (e.g. list(gen()))"
        )


def gpus_per_node(config: DistributedConfig) -> int | None:
    """GPUs of one node (the original API's ``gpus_per_node``): the named node shape's; for a
    ``gpu_type`` of one of the original's shapes, the shape a call of this count gets
    (``get_gpus_per_node``); ``None`` when neither says (this machine's GPUs)."""
    if config.gpus_per_node is not None:
        return config.gpus_per_node
    if config.gpu_type is None:
        return None
    try:
        return get_gpus_per_node(GPUType.parse(config.gpu_type), config.gpus)
    except GPUConfigError:  # a family the original has no node shape of (or "cpu")
        return None
