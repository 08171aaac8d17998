"""The Ray backend (``remote=True``): ranks as Ray actors on a multi-node cluster, with the same
results, failures and events as the local backend. Ray is imported only when a call uses it."""

from serverless_gpu.backends.ray.backend import RayBackend, ray_backend, stop_ray_calls
from serverless_gpu.backends.ray.connect import HOW_TO_CONNECT, cluster_placement, connect, ray_init

__all__ = [
    "HOW_TO_CONNECT",
    "RayBackend",
    "cluster_placement",
    "connect",
    "ray_backend",
    "ray_init",
    "stop_ray_calls",
]
