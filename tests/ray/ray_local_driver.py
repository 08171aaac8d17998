"""A caller in its own process that is connected to no Ray cluster: ``@ray_launch`` starts one
of this machine for each call and stops it after (tests/ray/test_ray_local_launch.py). Prints
one JSON line: what the calls returned or raised, and the processes left after each."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import psutil
import ray
import ray_fns

from serverless_gpu import ConfigurationError
from serverless_gpu.ray import ray_launch

_GONE_WITHIN_S = 30.0


def left_behind() -> list[str]:
    """This process's descendants still alive once the call has returned (bounded wait)."""
    deadline = time.monotonic() + _GONE_WITHIN_S
    while True:
        alive = [p for p in psutil.Process().children(recursive=True) if _alive(p)]
        if not alive or time.monotonic() > deadline:
            return [" ".join(p.cmdline()[:3]) for p in alive if _alive(p)]
        time.sleep(0.2)


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


report: dict[str, Any] = {}
fn = ray_launch(timeout=240, tracking=False)(ray_fns.tasks_on_every_node)
report["value"] = fn.distributed(2)
report["connected_after"] = ray.is_initialized()
report["left_after_call"] = left_behind()
too_many = ray_launch(num_accelerators=2, accelerator_type="GPU_8xH100", tracking=False)(
    ray_fns.tasks_on_every_node
)
cpu_mode = os.environ.pop("SERVERLESS_GPU_TYPE")  # CPU mode asks no GPU of the cluster
try:
    too_many.distributed(1)
except ConfigurationError as exc:
    report["refused"] = str(exc)
os.environ["SERVERLESS_GPU_TYPE"] = cpu_mode
report["left_after_refusal"] = left_behind()
# CPU mode: the count is of CPU ranks, on a cluster of this machine started without GPUs.
cpu = ray_launch(num_accelerators=2, gpu_type="cpu", tracking=False)(ray_fns.tasks_on_every_node)
report["cpu_mode"] = [None if v is None else v["gpus"] for v in cpu.distributed(1)]
print(json.dumps(report), flush=True)
