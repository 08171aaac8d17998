"""Functions the Ray tests run on the cluster's ranks (importable, so they travel by reference)."""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta
from typing import Any

from serverless_gpu import runtime


class NodeOneFailure(ValueError):
    """Raised by a rank on node 1; carries the time it was raised."""


def placement_and_all_reduce(megabytes: int) -> dict[str, Any]:
    """Where the rank runs, a gloo all-reduce over every rank, and a tensor of ``megabytes``."""
    import ray
    import torch
    import torch.distributed as dist

    runtime.init_process_group(timeout=timedelta(seconds=60))
    value = torch.tensor([float(runtime.get_global_rank() + 1)])
    dist.all_reduce(value)
    dist.destroy_process_group()
    print(f"rank {runtime.get_global_rank()} reduced {value.item():g}")
    return {
        "rank": runtime.get_global_rank(),
        "node_rank": runtime.get_node_rank(),
        "local_rank": runtime.get_local_rank(),
        "group_rank": int(os.environ["GROUP_RANK"]),
        "local_world_size": runtime.get_local_world_size(),
        "world_size": runtime.get_world_size(),
        "master": (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])),
        "node_id": ray.get_runtime_context().get_node_id(),
        "node_ip": ray.util.get_node_ip_address(),
        "caller_var": os.environ.get("SERVERLESS_GPU_TEST_CALLER_VAR"),
        "cuda_visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "sum": value.item(),
        "tensor": torch.full((megabytes * 2**18,), float(runtime.get_global_rank())),
    }


def node_one_raises() -> None:
    """Ranks 0, 1 and 3 wait in a collective; rank 2 (node 1) raises."""
    import torch.distributed as dist

    runtime.init_process_group(timeout=timedelta(seconds=600))
    dist.barrier()
    if runtime.get_global_rank() == 2:
        raise NodeOneFailure(time.time())
    dist.barrier()  # never completes: rank 2 is gone


def report_then_block() -> None:
    """Say where the rank runs, then wait in a collective that never completes."""
    import ray
    import torch.distributed as dist

    runtime.init_process_group(timeout=timedelta(seconds=600))
    node = ray.get_runtime_context().get_node_id()
    print(f"ready rank={runtime.get_global_rank()} node={node}", flush=True)
    if runtime.get_global_rank() == 0:
        time.sleep(600)
    dist.barrier()


def sleep_forever() -> None:
    print("sleeping", flush=True)
    sys.stdout.flush()
    time.sleep(600)


def log_metrics(steps: int) -> int:
    """Log the node this rank runs on and a few steps of a metric into the call's MLflow run."""
    import mlflow

    node = runtime.get_node_rank()
    mlflow.log_metric("node", node)
    for step in range(steps):
        mlflow.log_metric("loss", 1.0 / (step + 1), step=step)
    return node


def log_then_peer_fails(steps: int, marker: str) -> None:
    """Both ranks log ``steps`` points; rank 0 then waits to be stopped, rank 1 raises once
    rank 0 has logged (its points still held: a long flush interval)."""
    import threading
    from pathlib import Path

    import mlflow
    from eventually import eventually

    for step in range(steps):
        mlflow.log_metric("loss", float(step), step=step)
    if runtime.get_global_rank() == 0:
        Path(marker).write_text("logged")
        threading.Event().wait(60)  # the actor is killed once rank 1 fails
        return
    eventually(Path(marker).exists, "rank 0 logged", timeout=60)
    raise ValueError("rank 1 gave up")


def tasks_on_every_node(tasks: int) -> dict[str, Any]:
    """Ray-native code: spread plain Ray tasks over the cluster from the launched driver."""
    import ray

    from serverless_gpu.api.ray_launch import launch_gpus

    @ray.remote(num_cpus=1)
    def node_of_task() -> str:
        return str(ray.get_runtime_context().get_node_id())

    nodes = ray.get(
        [node_of_task.options(scheduling_strategy="SPREAD").remote() for _ in range(tasks)]
    )
    print(f"{tasks} tasks ran on {len(set(nodes))} nodes")
    return {
        "nodes": len(set(nodes)),
        "gpus": launch_gpus(),
        "cpu_mode": "SERVERLESS_GPU_DEVICE" in os.environ,
    }


def visible_gpus() -> tuple[int, str, list[str]]:
    """LOCAL_RANK, CUDA_VISIBLE_DEVICES and the GPU ids Ray assigned to this rank's actor."""
    import ray

    ids = [str(i) for i in ray.get_runtime_context().get_accelerator_ids()["GPU"]]
    return runtime.get_local_rank(), os.environ.get("CUDA_VISIBLE_DEVICES", ""), ids


def who_am_i() -> dict[str, Any]:
    """The rank's process, whether a process group was there before the call asked for one,
    and a gloo all-reduce over every rank."""
    import torch
    import torch.distributed as dist

    before = dist.is_initialized()
    runtime.init_process_group(timeout=timedelta(seconds=60))
    value = torch.tensor([1.0])
    dist.all_reduce(value)
    import ray

    return {
        "pid": os.getpid(),
        "node_id": ray.get_runtime_context().get_node_id(),
        "group_before": before,
        "sum": value.item(),
        "var": os.environ.get("SERVERLESS_GPU_TEST_CALLER_VAR"),
    }


def until_asked_to_stop(seconds: float) -> dict[str, Any]:
    """Steps until the caller asks the run to stop (``stop_grace``); an ``on_stop`` callback
    notes the thread it ran in."""
    import threading

    seen: list[str] = []
    runtime.on_stop(lambda: seen.append(threading.current_thread().name))
    print("stepping", flush=True)
    deadline = time.monotonic() + seconds
    steps = 0
    while time.monotonic() < deadline:
        if runtime.should_stop():
            return {"stopped_at": steps, "on_stop_in": seen}
        steps += 1
        time.sleep(0.05)
    return {"stopped_at": None, "on_stop_in": seen}


def stuck_in_a_named_function(seconds: float) -> None:
    """Rank 1 sleeps in ``stuck_here``; the others wait for it in a gloo barrier."""
    import torch.distributed as dist

    runtime.init_process_group(timeout=timedelta(seconds=600))
    print("ready", flush=True)
    if runtime.get_global_rank() == 1:
        stuck_here(seconds)
    dist.barrier()


def stuck_here(seconds: float) -> None:
    time.sleep(seconds)


def rank1_goes_silent() -> None:
    # Every rank shows life once in user code first: on a busy machine the ranks' start alone
    # can outlast a short warning, which then names every rank before rank 1 goes quiet.
    runtime.heartbeat()
    for _ in range(100):
        if runtime.get_global_rank() == 0:
            runtime.heartbeat()  # a sign of life without output
        time.sleep(0.1)


def rank1_dies_on_the_first_attempt() -> int:
    """Rank 1's process ends without a result on attempt 0: a crash, which is retried."""
    if runtime.attempt() == 0 and runtime.get_global_rank() == 1:
        os._exit(3)
    return runtime.attempt()


def tensor_of(mib: int) -> Any:
    """A float32 tensor of ``mib`` MiB, counting up from the rank's number."""
    import torch

    rank = int(os.environ["RANK"])
    return torch.arange(mib * 2**18, dtype=torch.float32) + rank


def bytes_of(mib: int) -> dict[str, Any]:
    """A result without tensors: ``mib`` MiB of bytes in a dict."""
    return {"rank": int(os.environ["RANK"]), "data": bytes(range(256)) * (mib * 4096)}


def tensor_and_views(mib: int) -> dict[str, Any]:
    """``tensor_of`` with two views of its storage and a bfloat16 tensor."""

    tensor = tensor_of(mib)
    return {"t": tensor, "evens": tensor[::2], "head": tensor[:4], "bf": tensor[:8].bfloat16()}


def group_formed_ahead() -> tuple[int, bool]:
    """The rank's process, and whether a process group was there before the call (which
    forms none of its own)."""
    import torch.distributed as dist

    return os.getpid(), dist.is_initialized()
