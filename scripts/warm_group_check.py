"""The process group formed ahead of the call, on GPUs (NCCL): what the call's code sees.

    PYTHONPATH=. python scripts/warm_group_check.py                 # every GPU (NCCL)
    PYTHONPATH=. python scripts/warm_group_check.py --cpu --gpus 2  # CPU ranks (gloo)

Each check runs after a call of the same shape, so that its ranks are standby ranks whose
group is formed. It checks that the call starts with the group, that ``init_process_group``
hands it over (no store on ``MASTER_PORT``), that Accelerate, Lightning Fabric and HF
``Trainer`` train in it unchanged, and that 20 warm init/all-reduce/destroy calls leave the
GPUs' memory and the launcher's processes as they were.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from _checks import check, rank_parser, ranks, summary

from serverless_gpu import distributed, runtime


def seen_by_the_call() -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    warm = dist.is_initialized()
    start = time.perf_counter()
    runtime.init_process_group()
    init_s = time.perf_counter() - start
    backend = dist.get_backend()
    value = torch.ones(1, device=runtime.device())
    dist.all_reduce(value)
    store: Any = dist.distributed_c10d._get_default_store()
    while hasattr(store, "underlying_store"):
        store = store.underlying_store
    start = time.perf_counter()
    dist.destroy_process_group()
    return {
        "warm": warm,
        "backend": backend,
        "sum": float(value.item()),
        "own_store": store.port != int(os.environ["MASTER_PORT"]),
        "init_s": init_s,
        "destroy_s": time.perf_counter() - start,
    }


def _batch(rank: int, device: Any) -> tuple[Any, Any]:
    import torch

    return torch.full((8, 4), float(rank + 1), device=device), torch.zeros(8, 1, device=device)


def accelerate_step() -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from accelerate import Accelerator

    warm = dist.is_initialized()
    accelerator = Accelerator(cpu=runtime.is_cpu_mode())
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    x, y = _batch(accelerator.process_index, accelerator.device)
    accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
    optimizer.step()
    return {
        "warm": warm,
        "world": accelerator.num_processes,
        "type": str(accelerator.distributed_type),
    }


def fabric_step() -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from lightning.fabric import Fabric

    warm = dist.is_initialized()
    accelerator = "cpu" if runtime.is_cpu_mode() else "cuda"
    fabric = Fabric(accelerator=accelerator, devices=runtime.get_world_size(), strategy="ddp")
    fabric.launch()
    torch.manual_seed(0)
    model, optimizer = fabric.setup(*_model_and_optimizer())
    x, y = _batch(fabric.global_rank, fabric.device)
    fabric.backward(torch.nn.functional.mse_loss(model(x), y))
    optimizer.step()
    return {"warm": warm, "world": fabric.world_size, "type": str(fabric.device.type)}


def _model_and_optimizer() -> tuple[Any, Any]:
    import torch

    model = torch.nn.Linear(4, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def all_reduce_once() -> float:
    import torch
    import torch.distributed as dist

    runtime.init_process_group()
    value = torch.ones(1, device=runtime.device())
    dist.all_reduce(value)
    dist.destroy_process_group()
    return float(value.item())


def _after_a_call(fn: Any, options: dict[str, Any]) -> list[Any]:
    distributed(**options)(all_reduce_once).distributed()
    return list(distributed(**options)(fn).distributed())


def _memory_used_mib() -> list[float]:
    import pynvml

    pynvml.nvmlInit()
    try:
        count = pynvml.nvmlDeviceGetCount()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        return [pynvml.nvmlDeviceGetMemoryInfo(h).used / 2**20 for h in handles]
    finally:
        pynvml.nvmlShutdown()


def main() -> int:
    args = rank_parser().parse_args()
    world, gpu_type = ranks(args)
    options: dict[str, Any] = {"gpus": world, "gpu_type": gpu_type, "tracking": False}
    options["output"] = "none"
    seen = _after_a_call(seen_by_the_call, options)
    check("the call starts with the group", all(s["warm"] for s in seen), str(seen))
    check("init_process_group hands it over", all(s["own_store"] for s in seen))
    check("the group all-reduces", all(s["sum"] == world for s in seen))
    expected = "gloo" if gpu_type == "cpu" else "nccl"
    check(f"its backend is {expected}", all(s["backend"] == expected for s in seen))
    init_ms = max(s["init_s"] for s in seen) * 1000
    destroy_ms = max(s["destroy_s"] for s in seen) * 1000
    check("init_process_group returns at once", init_ms < 50, f"{init_ms:.1f} ms")
    check("destroy_process_group returns at once", destroy_ms < 50, f"{destroy_ms:.1f} ms")
    for name, fn in (("Accelerate", accelerate_step), ("Lightning Fabric", fabric_step)):
        try:
            results = _after_a_call(fn, options)
        except Exception as exc:  # a missing library or a failure: a FAIL line, not a crash
            check(f"{name} trains in the warm group", False, f"{type(exc).__name__}: {exc}")
            continue
        ok = all(r["warm"] and r["world"] == world for r in results)
        check(f"{name} trains in the warm group", ok, str(results))
    fn = distributed(**options)(all_reduce_once)
    fn.distributed()
    time.sleep(2)
    before = None if gpu_type == "cpu" else _memory_used_mib()
    start = time.time()
    for _ in range(20):
        fn.distributed()
    check("20 warm calls", True, f"{(time.time() - start) / 20 * 1000:.0f} ms a call")
    time.sleep(2)
    if before is not None:
        after = _memory_used_mib()
        grown = max(a - b for a, b in zip(after, before, strict=True))
        check("GPU memory after 20 calls as before", grown < 64, f"{before} -> {after} MiB")
    return summary()


if __name__ == "__main__":
    sys.exit(main())
