"""Helpers for code running inside a rank; one function runs unchanged on GPUs and CPU ranks.

Users import them as :mod:`serverless_gpu.runtime`, which adds the stop requests of
:mod:`.stop_request`."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from serverless_gpu.common import settings

if TYPE_CHECKING:
    import torch

__all__ = [
    "device",
    "get_global_rank",
    "get_local_rank",
    "get_local_world_size",
    "get_node_ip",
    "get_node_rank",
    "get_replica_rank",
    "get_world_size",
    "init_process_group",
    "is_cpu_mode",
    "on_rank_exit",
    "send_to_caller",
]


def _int_env(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def _default_group() -> Any | None:
    """``torch.distributed`` once a default process group exists, else None. Never imports
    torch: a process that has not imported ``torch.distributed`` has no group."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return dist


def get_global_rank(group: Any | None = None) -> int:
    """This process's global rank: torch.distributed's once a process group exists, else
    ``RANK``; 0 outside a distributed call. With ``group`` (a ``ProcessGroup``), the rank in
    that group (``dist.get_rank(group)``: -1 where this process is not a member)."""
    if group is not None:
        import torch.distributed

        return int(torch.distributed.get_rank(group))
    dist = _default_group()
    return int(dist.get_rank()) if dist is not None else _int_env("RANK", 0)


def get_local_rank() -> int:
    """This process's rank on its node (``LOCAL_RANK``)."""
    return _int_env("LOCAL_RANK", 0)


def get_world_size() -> int:
    """Number of ranks in the call: torch.distributed's once a process group exists, else
    ``WORLD_SIZE``; 1 outside a distributed call."""
    dist = _default_group()
    return int(dist.get_world_size()) if dist is not None else _int_env("WORLD_SIZE", 1)


def get_local_world_size() -> int:
    """Number of ranks on this node (``LOCAL_WORLD_SIZE``)."""
    return _int_env("LOCAL_WORLD_SIZE", 1)


def get_node_rank() -> int:
    """Index of this node (``NODE_RANK``); always 0 on the local backend."""
    return _int_env("NODE_RANK", 0)


def get_replica_rank() -> int:
    """Which copy of the whole run this is (``REPLICA_RANK``), for the original API's code;
    always 0 here, where a call runs one copy."""
    return _int_env("REPLICA_RANK", 0)


def get_node_ip() -> str:
    """This node's IP address as other nodes reach it: that of the interface the default route
    leaves through (found without sending a packet); ``127.0.0.1`` without a network."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.255.255.255", 1))  # UDP: chooses a route, sends nothing
            return str(probe.getsockname()[0])
        except OSError:
            return "127.0.0.1"


def is_cpu_mode() -> bool:
    return settings.DEVICE.read() == "cpu"


def device() -> torch.device:
    """``cuda:LOCAL_RANK`` on GPUs, ``cpu`` in CPU mode."""
    import torch

    if is_cpu_mode():
        return torch.device("cpu")
    return torch.device("cuda", get_local_rank())


def init_process_group(timeout: timedelta | None = None, **kwargs: Any) -> None:
    """``torch.distributed.init_process_group`` with nccl on GPUs and gloo in CPU mode.

    On GPUs it also binds the process to ``cuda:LOCAL_RANK``. Extra keyword arguments go to torch.
    """
    import torch
    import torch.distributed as dist

    backend = "gloo" if is_cpu_mode() else "nccl"
    if backend == "nccl":
        torch.cuda.set_device(get_local_rank())
        kwargs.setdefault("device_id", device())
    if timeout is not None:
        kwargs["timeout"] = timeout
    dist.init_process_group(backend=backend, **kwargs)


# -- channel to the caller (set up by the worker inside a rank) -------------------------------

_channel: Callable[[str, Any], None] | None = None
_exit_callbacks: list[Callable[[], None]] = []
_cell_callbacks: list[Callable[[], None]] = []
_stop_callbacks: list[Callable[[], None]] = []
_stop_hook: Callable[[], None] | None = None
"""How the backend gets to run ``on_stopped`` callbacks, set up at the first one (a forked
rank's SIGTERM handler; Ray asks its actors itself): an untracked call pays nothing for it."""


def connect(channel: Callable[[str, Any], None]) -> None:
    """Where :func:`send_to_caller` sends: the worker connects it when the rank's call starts."""
    global _channel
    _channel = channel


def send_to_caller(kind: str, data: Any) -> None:
    """Send picklable ``data`` to the caller's subscribers as a ``RankMessage`` event."""
    if _channel is None:
        raise RuntimeError("send_to_caller works only inside a rank of a distributed call")
    _channel(kind, data)


def on_rank_exit(callback: Callable[[], None]) -> None:
    """Run ``callback`` after the user's function ends and before its result is reported."""
    _exit_callbacks.append(callback)


def run_exit_callbacks() -> None:
    """Run (and forget) what :func:`on_rank_exit` registered; the worker calls it once the
    user's function has ended."""
    _stop_callbacks.clear()  # past the function: what they would send goes now
    while _exit_callbacks:
        _exit_callbacks.pop(0)()


def on_stopped(callback: Callable[[], None]) -> None:
    """Run ``callback`` if the rank is stopped while its function runs (a peer failed, the
    timeout, a cancel), just before it ends: a last flush of what it logged. It must be quick
    and may find its locks held (bound every wait): the rank is killed soon after."""
    global _stop_hook
    _stop_callbacks.append(callback)
    hook, _stop_hook = _stop_hook, None
    if hook is not None:
        hook()


def when_stopped_wanted(hook: Callable[[], None]) -> None:
    """``hook`` runs (once, in the caller of ``on_stopped``) when a first callback is
    registered: the backend's rank readies its way to run them."""
    global _stop_hook
    _stop_hook = hook


def run_stopped_callbacks() -> None:
    """Run (and forget) what :func:`on_stopped` registered; a failing callback is skipped."""
    while _stop_callbacks:
        try:
            _stop_callbacks.pop(0)()
        except Exception:  # the rank ends next whatever happens
            pass


def on_cell_end(callback: Callable[[], None]) -> None:
    """Run ``callback`` after each cell of a persistent session, before the cell's answer
    (a metrics flush: the cell's points reach the caller with it)."""
    _cell_callbacks.append(callback)


def run_cell_callbacks() -> None:
    """The session loop calls it after each cell; a failing callback is printed, not raised."""
    for callback in list(_cell_callbacks):
        try:
            callback()
        except Exception:
            import traceback

            traceback.print_exc()
