"""Which Ray cluster a ``remote=True`` call runs on: the one this process is connected to."""

from __future__ import annotations

import os
from typing import Any

from ... import settings
from ...errors import ConfigurationError
from ...gpus import GPUType, Placement, check_cpu_count, cpu_mode_requested
from ...vocabulary import Placeholder, option

HOW_TO_CONNECT = (
    'connect this process to a Ray cluster first: call ray.init(address=...) ("auto" on a '
    'cluster node, "ray://<head>:10001" from elsewhere), or set RAY_ADDRESS before the call; '
    "for a cluster of one machine, run `ray start --head` in a terminal and set "
    "RAY_ADDRESS=auto (docs/ray.md)"
)


def connect() -> Any:
    """The ``ray`` module, connected: ``ray.init`` already called, else ``RAY_ADDRESS`` set (then
    we connect). Raises :class:`ConfigurationError` saying how to connect, before anything
    starts."""
    try:
        import ray
    except ImportError:
        raise ConfigurationError(
            f"{option('remote', True)} runs the call on a Ray cluster, and Ray is not installed: "
            "pip install 'serverless-gpu[ray]'"
        ) from None
    if ray.is_initialized():
        return ray
    address = os.environ.get("RAY_ADDRESS", "").strip()
    if not address:
        raise ConfigurationError(
            f"{option('remote', True)} runs the call on a Ray cluster, and this process is "
            f"connected to none: {HOW_TO_CONNECT}"
        )
    try:
        # Ranks' output comes back as the call's own events; Ray's copy would print it twice.
        ray.init(address=address, log_to_driver=False)
    except Exception as exc:
        raise ConfigurationError(
            f"could not connect to the Ray cluster at RAY_ADDRESS={address!r}: "
            f"{type(exc).__name__}: {exc}"
        ) from None
    return ray


def cluster_placement(gpus: int | None, gpu_type: str | GPUType | None) -> Placement:
    """The call's ranks on the cluster; the caller's own GPUs play no part."""
    if cpu_mode_requested(gpu_type):
        check_cpu_count(gpus)
        count = gpus if gpus is not None else settings.CPU_RANKS.read()
        return Placement(count, "cpu", GPUType.CPU, ())
    wanted = GPUType.parse(gpu_type) if gpu_type is not None else GPUType.OTHER
    if gpus is None:
        import ray

        gpus = int(ray.cluster_resources().get("GPU", 0))
        if gpus < 1:
            raise ConfigurationError(
                f"{option('gpus', None)} asks for every GPU of the Ray cluster, and it has "
                f"none; pass {option('gpus', Placeholder('N'))} (nodes with GPUs may still be "
                f"starting) or {option('gpu_type', 'cpu')}"
            )
    return Placement(gpus, "cuda", wanted, ())
