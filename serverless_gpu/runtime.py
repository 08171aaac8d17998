"""Helpers for code running inside a rank; one function runs unchanged on GPUs and CPU ranks.

>>> from serverless_gpu import runtime
>>> runtime.get_global_rank(), runtime.device(), runtime.should_stop()

The public face of :mod:`serverless_gpu.rank.runtime` (ranks, devices, the process group, messages
to the caller) and :mod:`serverless_gpu.rank.stop_request` (graceful stop, heartbeats, attempts).
"""

from serverless_gpu.rank.runtime import (
    device,
    get_global_rank,
    get_local_rank,
    get_local_world_size,
    get_node_ip,
    get_node_rank,
    get_replica_rank,
    get_world_size,
    init_process_group,
    is_cpu_mode,
    on_rank_exit,
    send_to_caller,
)
from serverless_gpu.rank.stop_request import attempt, heartbeat, on_stop, should_stop

__all__ = [
    "attempt",
    "device",
    "get_global_rank",
    "get_local_rank",
    "get_local_world_size",
    "get_node_ip",
    "get_node_rank",
    "get_replica_rank",
    "get_world_size",
    "heartbeat",
    "init_process_group",
    "is_cpu_mode",
    "on_rank_exit",
    "on_stop",
    "send_to_caller",
    "should_stop",
]
