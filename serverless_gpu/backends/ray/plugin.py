"""The Ray backend as a plug-in (the entry point ``ray`` of ``serverless_gpu.backends``):
``remote=True`` or ``backend="ray"``."""

from __future__ import annotations

from serverless_gpu.backends.ray.backend import ray_backend, stop_ray_calls
from serverless_gpu.backends.ray.connect import caller_address, cluster_placement, connect
from serverless_gpu.backends.registry import BackendPlugin
from serverless_gpu.common.gpus import Placement, cpu_mode_requested
from serverless_gpu.wire.config import DistributedConfig


def _placement(config: DistributedConfig) -> Placement:
    """The ranks on the cluster's nodes, connected first (so that a missing cluster fails before
    anything is created)."""
    connect(config.timeout)
    gpus = config.gpus
    if gpus is None and not cpu_mode_requested(config.gpu_type):
        gpus = config.gpus_per_node  # a node shape without a count: one node of it
    return cluster_placement(gpus, config.gpu_type)


PLUGIN = BackendPlugin(
    name="ray",
    backend=lambda config: ray_backend(),
    placement=_placement,
    shutdown=stop_ray_calls,
    # A Session's cells reach its actors over TCP, at the address the cluster knows us by.
    sessions=True,
    session_host=caller_address,
    stacks=True,  # RayRun.request_stacks: the actors' stacks through the rank doctor
    # Actors start with the call (and stay for the next call of its shape): nothing ahead.
    standby=False,
)
