"""The Ray backend (``remote=True``): ranks as Ray actors on a multi-node cluster, with the same
results, failures and events as the local backend. Ray is imported only when a call uses it."""

from .backend import RayBackend, ray_backend, stop_ray_calls
from .connect import HOW_TO_CONNECT, cluster_placement, connect, ray_init
from .launch import RayLaunchFunction, launch_gpus, ray_launch

__all__ = [
    "HOW_TO_CONNECT",
    "RayBackend",
    "RayLaunchFunction",
    "cluster_placement",
    "connect",
    "launch_gpus",
    "ray_backend",
    "ray_init",
    "ray_launch",
    "stop_ray_calls",
]
