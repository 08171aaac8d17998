"""The Ray backend (``remote=True``): ranks as Ray actors on a multi-node cluster, with the same
results, failures and events as the local backend. Ray is imported only when a call uses it."""

from .backend import RayBackend, ray_backend
from .connect import HOW_TO_CONNECT, cluster_placement, connect

__all__ = ["HOW_TO_CONNECT", "RayBackend", "cluster_placement", "connect", "ray_backend"]
