"""``remote=True`` on real GPUs: a Ray cluster of this machine (``ray.init``, every GPU), then

* an NCCL all-reduce across the ranks, each on its own GPU, with a CUDA tensor in the result
  (it comes back as a CPU tensor, bit for bit; this process never initializes CUDA);
* ``gpu_type="H200"`` asks the cluster for H200 nodes (Ray's ``accelerator_type:H200``);
* warm calls: the standby actors of the last call, their NCCL group formed ahead;
* a cancel of a call holding GPU memory: the memory is back once the call has ended.

    python scripts/ray_gpu_check.py [--cpu] [--gpus N]

``--cpu`` runs the same checks with CPU ranks (gloo) on a machine without GPUs, the memory
check left out. Prints one PASS/FAIL line per check; exit code 1 on any failure.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # before ray: 127.0.0.1

from _checks import check, summary

from serverless_gpu import CancelledError, distributed, runtime

MiB = 2**20


def all_reduce_and_tensor(values: int) -> dict[str, Any]:
    """One all-reduce over every rank (NCCL on GPUs) and a tensor made on the rank's device."""
    import torch
    import torch.distributed as dist

    entry = time.time()
    warm = dist.is_initialized()
    runtime.init_process_group()
    device = runtime.device()
    total = torch.tensor([float(runtime.get_global_rank() + 1)], device=device)
    dist.all_reduce(total)
    return {
        "entry": entry,
        "warm_group": warm,
        "backend": str(dist.get_backend()),
        "sum": total.item(),
        "device": str(device),
        "name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "tensor": torch.arange(values, device=device, dtype=torch.float32) * (1 + dist.get_rank()),
    }


def hold_memory(gib: float) -> None:
    """Allocate ``gib`` GiB on the rank's GPU, say so, and wait to be cancelled."""
    import torch

    if runtime.device().type == "cuda":
        block = torch.empty(int(gib * 2**30), dtype=torch.uint8, device=runtime.device())
        block.fill_(1)
    print("holding", flush=True)
    time.sleep(600)


def gpu_used_mib() -> list[float]:
    import pynvml

    pynvml.nvmlInit()
    try:
        count = pynvml.nvmlDeviceGetCount()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        return [pynvml.nvmlDeviceGetMemoryInfo(h).used / MiB for h in handles]
    finally:
        pynvml.nvmlShutdown()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cpu", action="store_true")
    parser.add_argument("--gpus", type=int, default=None)
    args = parser.parse_args()
    import ray

    gpus = args.gpus or (2 if args.cpu else len(gpu_used_mib()))
    ray.init(
        address="local",  # a cluster of its own, not one another process runs here
        num_cpus=max(4, gpus + 2),
        num_gpus=0 if args.cpu else gpus,
        include_dashboard=False,
        log_to_driver=False,
    )
    gpu_type = "cpu" if args.cpu else None
    print("cluster:", ray.cluster_resources(), flush=True)
    baseline = None if args.cpu else gpu_used_mib()
    fn = distributed(gpus=gpus, gpu_type=gpu_type, remote=True, timeout=300, tracking=False)(
        all_reduce_and_tensor
    )
    _first_and_warm(fn, gpus, args.cpu)
    if not args.cpu:
        typed = distributed(gpus=gpus, gpu_type="H200", remote=True, timeout=300, tracking=False)
        try:
            out = typed(all_reduce_and_tensor).distributed(16)
            check("gpu_type='H200' accepted", all("H200" in r["name"] for r in out), out[0]["name"])
        except Exception as exc:
            check("gpu_type='H200' accepted", False, f"{type(exc).__name__}: {exc}")
    _cancel_frees_memory(gpus, gpu_type, baseline)
    import serverless_gpu

    serverless_gpu.shutdown()
    ray.shutdown()
    sys.exit(summary())


def _first_and_warm(fn: Any, gpus: int, cpu: bool) -> None:
    import torch

    n = 1 << 20
    times = []
    for _ in range(4):
        t_call = time.time()
        out = fn.distributed(n)
        times.append((max(r["entry"] for r in out) - t_call, time.time() - t_call))
        time.sleep(1.5)
    first = out[0]
    check(
        f"{'gloo' if cpu else 'nccl'} all-reduce over {gpus} rank(s)",
        all(r["sum"] == gpus * (gpus + 1) / 2 for r in out)
        and first["backend"] == ("gloo" if cpu else "nccl"),
        f"backend {first['backend']}, sum {first['sum']}, devices {[r['device'] for r in out]}, "
        f"{first['name']}",
    )
    want = [torch.arange(n, dtype=torch.float32) * (1 + r) for r in range(gpus)]
    tensors = [r["tensor"] for r in out]
    check(
        "CUDA tensor result back as a CPU tensor, bit for bit" if not cpu else "tensor result",
        all(
            t.device.type == "cpu" and torch.equal(t, w) for t, w in zip(tensors, want, strict=True)
        )
        and not torch.cuda.is_initialized(),
        f"{tensors[0].dtype} {tuple(tensors[0].shape)} on {tensors[0].device}; CUDA initialized "
        f"in the caller: {torch.cuda.is_initialized()}",
    )
    check("warm calls took the group formed ahead", all(r["warm_group"] for r in out))
    warm = sorted(t for t, _ in times[1:])
    line = ", ".join(f"{a * 1e3:.0f} ms to user code / {b * 1e3:.0f} ms back" for a, b in times)
    check("warm call reaches user code in <= 0.25x the first", warm[1] <= 0.25 * times[0][0], line)


def _cancel_frees_memory(gpus: int, gpu_type: str | None, baseline: list[float] | None) -> None:
    from serverless_gpu.wire.events import OutputLines

    fn = distributed(gpus=gpus, gpu_type=gpu_type, remote=True, timeout=300, tracking=False)
    handle = fn(hold_memory).start(20.0)
    seen: set[int] = set()
    handle.subscribe(
        lambda e: (
            seen.add(e.rank)
            if isinstance(e, OutputLines) and "holding" in "".join(e.lines)
            else None
        )
    )
    deadline = time.monotonic() + 120
    while len(seen) < gpus and time.monotonic() < deadline and not handle.wait(0.2):
        pass
    held = None if baseline is None else gpu_used_mib()
    cancelled = time.monotonic()
    handle.cancel("enough")
    try:
        handle.result(timeout=60)
        check("cancel ends the call", False, "it returned")
    except CancelledError:
        check("cancel ends the call", True, f"{time.monotonic() - cancelled:.1f} s")
    if baseline is None or held is None:
        return
    end = time.monotonic() + 30
    now = gpu_used_mib()
    while time.monotonic() < end and any(n > b + 1024 for n, b in zip(now, baseline, strict=True)):
        time.sleep(0.2)
        now = gpu_used_mib()
    check(
        "GPU memory back after the cancel",
        all(n <= b + 1024 for n, b in zip(now, baseline, strict=True)),
        f"MiB used per GPU: before {baseline}, holding {held}, "
        f"{time.monotonic() - cancelled:.1f} s after the cancel {now}",
    )


if __name__ == "__main__":
    main()
