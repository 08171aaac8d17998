"""Functions the warm-group tests run in every rank (a module of their own, so that ranks
unpickle them by reference)."""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist


def store_port() -> int:
    """The port of the default group's rendezvous store."""
    store: Any = dist.distributed_c10d._get_default_store()
    while hasattr(store, "underlying_store"):
        store = store.underlying_store
    return int(store.port)


def warm() -> bool:
    return dist.is_initialized()


def _all_reduce() -> float:
    value = torch.ones(1)
    dist.all_reduce(value)
    return float(value)


def init_use_destroy() -> dict[str, Any]:
    """init, all-reduce, destroy."""
    seen: dict[str, Any] = {"warm": dist.is_initialized()}
    dist.init_process_group("gloo")
    seen["first"] = (dist.get_rank(), dist.get_world_size(), dist.get_backend(), _all_reduce())
    seen["first_store_is_master_port"] = store_port() == int(os.environ["MASTER_PORT"])
    dist.destroy_process_group()
    seen["after_destroy"] = dist.is_initialized()
    return seen


def init_use_destroy_twice() -> dict[str, Any]:
    """init, all-reduce, destroy; then the same again (the second group is torch's own).
    Only after a warm first group: two of torch's own groups in a row on MASTER_PORT race in
    torch itself (a rank may meet rank 0's first store, not yet closed, and its stale keys)."""
    seen = init_use_destroy()
    dist.init_process_group("gloo")
    seen["second"] = (dist.get_rank(), dist.get_world_size(), _all_reduce())
    seen["second_store_is_master_port"] = store_port() == int(os.environ["MASTER_PORT"])
    dist.destroy_process_group()
    return seen


def runtime_init_with_timeout() -> dict[str, Any]:
    from serverless_gpu import runtime

    warm_at_start = dist.is_initialized()
    runtime.init_process_group(timeout=timedelta(seconds=42))
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))  # type: ignore[union-attr]
    return {
        "warm": warm_at_start,
        "timeout_s": backend.options._timeout.total_seconds(),
        "taken": store_port() != int(os.environ["MASTER_PORT"]),
        "sum": _all_reduce(),
    }


def init_with_own_store() -> dict[str, Any]:
    warm_at_start = dist.is_initialized()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(
        "127.0.0.1", int(os.environ["MASTER_PORT"]), world, rank == 0, timeout=timedelta(seconds=60)
    )
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    return {
        "warm": warm_at_start,
        "store_is_master_port": store_port() == int(os.environ["MASTER_PORT"]),
        "sum": _all_reduce(),
    }


def last_collective_after_three(folder: str) -> str:
    """Three all-reduces, then the flight recorder as the hang doctor reads it."""
    from pathlib import Path

    from serverless_gpu.doctor import flight
    from serverless_gpu.wire.runpaths import RunPaths

    dist.init_process_group("gloo")
    for _ in range(3):
        _all_reduce()
    paths = RunPaths(Path(folder) / os.environ["RANK"])
    paths.flight_recorder(0).parent.mkdir(parents=True)
    flight.dump(paths.flight_recorder(0))
    return flight.last_collective(paths, 0)


def init_nccl() -> bool:
    warm_at_start = dist.is_initialized()
    dist.init_process_group("nccl")
    return warm_at_start


def init_all_reduce_destroy() -> float:
    dist.init_process_group("gloo")
    total = _all_reduce()
    dist.destroy_process_group()
    return total


def slow_teardown(seconds: float) -> int:
    """Take the warm group and destroy it, with its shutdown (after the result) made slow."""
    import time

    from torch.distributed import ProcessGroup

    real = ProcessGroup.__dict__["shutdown"]

    def slow_shutdown(group: Any) -> None:
        time.sleep(seconds)
        real(group)

    ProcessGroup.shutdown = slow_shutdown  # type: ignore[method-assign,assignment]
    dist.init_process_group("gloo")
    _all_reduce()
    dist.destroy_process_group()
    return os.getpid()


def gone(pids: list[int]) -> bool:
    """Whether none of ``pids`` is a live process (checked when this call's user code starts)."""
    import psutil

    return not any(
        psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        for pid in pids
    )


def init_a_group_of_ones_own() -> tuple[int, float]:
    """Each rank describes a group of its own (world size 1) in ``os.environ``, as code written
    for one process does, then reduces its rank + 1 in it."""
    import socket

    value = torch.ones(1) * (int(os.environ["RANK"]) + 1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_PORT=str(port))
    dist.init_process_group("gloo")
    dist.all_reduce(value)
    return dist.get_world_size(), float(value)


def store_reach(other_user: tuple[int, int] | None) -> dict[str, Any]:
    """In a call that took the warm group: whether its store (formed while the set waited)
    still takes a new connection, from this user and from ``other_user`` (uid, gid), and
    whether a client of this user, without anything but the port, can write and read keys."""
    import socket
    import subprocess

    port = store_port()
    with socket.socket() as s:
        s.settimeout(5)
        connects = s.connect_ex(("127.0.0.1", port)) == 0
    seen: dict[str, Any] = {
        "warm": dist.is_initialized(),
        "connects": connects,
        "other_user_connects": None,
    }
    if other_user is not None:
        probe = f"import socket; print(socket.create_connection(('127.0.0.1', {port}), 5))"
        done = subprocess.run(
            ["/usr/bin/python3", "-c", probe],
            user=other_user[0],
            group=other_user[1],
            capture_output=True,
            text=True,
            timeout=30,
        )
        seen["other_user_connects"] = done.returncode == 0
    try:
        client = dist.TCPStore(
            "127.0.0.1", port, is_master=False, timeout=timedelta(seconds=3), wait_for_workers=False
        )
        client.set("intruder", "x")
        seen["keys_reachable"] = client.get("intruder") == b"x"
    except Exception:  # refused: the store takes no new client
        seen["keys_reachable"] = False
    seen["group_works"] = _all_reduce() == 2.0  # the ranks' own connections still serve it
    return seen
