"""GPU validation of the core, run on the device machine (see docs/gpu-validation.md).

    PYTHONPATH=. python scripts/gpu_validation.py            # every visible GPU
    PYTHONPATH=. python scripts/gpu_validation.py --cpu      # the same checks on 2 CPU ranks

Prints one line per check (PASS/FAIL with the measured figure) and exits non-zero on a failure.
The caller (this process) never initialises CUDA: GPU facts come from NVML.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

from _checks import check, rank_parser, ranks, summary

import serverless_gpu
from serverless_gpu import distributed, runtime
from serverless_gpu.common.errors import GPUConfigError
from serverless_gpu.common.gpus import resolve_placement, visible_gpu_names
from serverless_gpu.common.proctitle import is_launcher
from serverless_gpu.wire.events import RankStarted

MIN_CONTEXT_MIB = 64
"""Less than this freed at shutdown means no standby CUDA context was measured."""


def nccl_all_reduce() -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    runtime.init_process_group()
    t = torch.full((1024,), float(runtime.get_global_rank() + 1), device=runtime.device())
    dist.all_reduce(t)
    name = torch.cuda.get_device_name() if runtime.device().type == "cuda" else "cpu"
    dist.destroy_process_group()
    return {"rank": runtime.get_global_rank(), "sum": float(t[0]), "device": name}


def cuda_tensor() -> Any:
    import torch

    return torch.arange(4, device=runtime.device()) + runtime.get_global_rank()


def raise_while_peers_block(marker: str) -> None:
    import torch
    import torch.distributed as dist

    runtime.init_process_group()
    if runtime.get_global_rank() == runtime.get_world_size() - 1:
        with open(marker, "w") as f:
            f.write(repr(time.time()))
        raise RuntimeError("deliberate failure on the last rank")
    dist.all_reduce(torch.ones(1, device=runtime.device()))
    torch.cuda.synchronize() if runtime.device().type == "cuda" else None
    time.sleep(600)


def hold_memory_forever() -> None:
    import torch

    if runtime.device().type == "cuda":
        block = torch.empty(10 * 2**30, dtype=torch.uint8, device=runtime.device())
        block.fill_(1)
    time.sleep(600)


def noop() -> int:
    return runtime.get_global_rank()


def gpu_used_bytes() -> list[int]:
    try:
        import pynvml
    except ImportError:
        return []
    pynvml.nvmlInit()
    try:
        count = pynvml.nvmlDeviceGetCount()
        return [
            int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).used)
            for i in range(count)
        ]
    finally:
        pynvml.nvmlShutdown()


def gpu_process_counts() -> list[int]:
    """Compute processes NVML lists on each GPU (counts: in a container NVML may report host
    pids, which are not ours to compare)."""
    try:
        import pynvml
    except ImportError:
        return []
    pynvml.nvmlInit()
    try:
        return [
            len(pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(i)))
            for i in range(pynvml.nvmlDeviceGetCount())
        ]
    finally:
        pynvml.nvmlShutdown()


def caller_on_gpu() -> bool:
    """True if this process shows up as a compute process on any GPU (it must not)."""
    try:
        import pynvml
    except ImportError:
        return False
    pynvml.nvmlInit()
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            pids = {p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}
            if os.getpid() in pids:
                return True
        return False
    finally:
        pynvml.nvmlShutdown()


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def run_checks(gpus: int, gpu_type: str | None) -> None:
    cpu = gpu_type == "cpu"
    if not cpu:
        names = visible_gpu_names()
        placement = resolve_placement(None, None)
        check(
            "auto-detect through NVML",
            placement.world_size == len(names) and placement.gpu_type.value != "OTHER",
            f"{len(names)} x {names[0]} -> gpu_type={placement.gpu_type.value}",
        )
        try:
            resolve_placement(None, "A10")
            check("gpu_type='A10' rejected", False, "no error")
        except GPUConfigError as exc:
            check("gpu_type='A10' rejected", True, str(exc))

    reduce_fn = distributed(gpus=gpus, gpu_type=gpu_type)(nccl_all_reduce)
    results, first = timed(reduce_fn.distributed)
    expected = float(sum(range(1, gpus + 1)))
    check(
        "ranks return in order, all-reduce correct",
        [r["rank"] for r in results] == list(range(gpus))
        and all(r["sum"] == expected for r in results),
        f"{results} (first call {first:.2f} s)",
    )

    from serverless_gpu.examples.mlp import train

    ddp = distributed(gpus=gpus, gpu_type=gpu_type, tracking=False)(train)
    out, took = timed(lambda: ddp.distributed(2, 64))
    losses = [[round(v, 4) for v in r["epoch_losses"]] for r in out]
    # Each rank's loss is over its own shard: with 16 ranks one shard's loss may rise for an
    # epoch while the model (the same on every rank) improves, so the mean over ranks decides.
    check(
        "DDP SimpleMLP",
        sum(r[-1] for r in losses) < sum(r[0] for r in losses),
        f"epoch losses per rank {losses} ({took:.2f} s)",
    )

    tensors = distributed(gpus=gpus, gpu_type=gpu_type)(cuda_tensor).distributed()
    check(
        "CUDA tensor result arrives on CPU",
        all(t.device.type == "cpu" for t in tensors),
        f"{[(str(t.device), t.tolist()) for t in tensors]}",
    )

    warm = distributed(gpus=gpus, gpu_type=gpu_type, output="none")(noop)
    warm.distributed()
    time.sleep(3.0)  # fresh standby ranks (with CUDA contexts) are prepared meanwhile
    _, warm_s = timed(warm.distributed)
    check("warm call -> results (no-op)", warm_s < 1.0, f"{warm_s * 1000:.0f} ms")
    if not cpu:
        check_standby_memory(gpus)

    if gpus >= 2:
        marker = "/tmp/sgpu-raised-at"
        failing = distributed(gpus=gpus, gpu_type=gpu_type, output="none")(raise_while_peers_block)
        try:
            failing.distributed(marker)
            check("failure while peers block in a collective", False, "no exception")
        except RuntimeError as exc:
            with open(marker) as f:
                delay = time.time() - float(f.read())
            check(
                "failure while peers block in a collective",
                delay <= 2.0,
                f"{type(exc).__name__} from rank {getattr(exc, 'serverless_gpu_rank', '?')} "
                f"after {delay:.2f} s",
            )

    check_cancel(gpus, gpu_type)
    if not cpu:
        check("no CUDA context in the caller", not caller_on_gpu(), f"pid {os.getpid()}")
        torch_mod = sys.modules.get("torch")
        initialised = bool(torch_mod is not None and torch_mod.cuda.is_initialized())
        check("torch.cuda not initialised in the caller", not initialised, str(initialised))


def check_standby_memory(gpus: int) -> None:
    """GPU memory the standby ranks hold: used memory with them ready, minus after shutdown."""
    import psutil

    launchers = [p for p in psutil.Process().children() if is_launcher(p.cmdline())]
    # They are forked once the last call has ended; give them time to create their contexts.
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and min(gpu_process_counts()[:gpus] or [0]) < 1:
        time.sleep(0.1)
    time.sleep(1.0)
    with_standby, processes = gpu_used_bytes(), gpu_process_counts()
    standby = [c for p in launchers for c in p.children()]
    serverless_gpu.shutdown()
    psutil.wait_procs(launchers + standby, timeout=10)
    time.sleep(1.0)
    without = gpu_used_bytes()
    held = [(a - b) / 2**20 for a, b in zip(with_standby, without, strict=True)]
    check(
        "standby ranks hold GPU memory, freed at shutdown",
        len(held) >= gpus and all(h >= MIN_CONTEXT_MIB for h in held[:gpus]),
        f"{len(standby)} standby rank(s); NVML compute processes per GPU {processes}; "
        f"memory held per GPU {[f'{h:.0f} MiB' for h in held]}",
    )


def check_cancel(gpus: int, gpu_type: str | None) -> None:
    import psutil

    baseline = gpu_used_bytes() if gpu_type != "cpu" else []
    holder = distributed(gpus=gpus, gpu_type=gpu_type, output="none")(hold_memory_forever)
    handle = holder.start()
    pids: list[int] = []
    handle.subscribe(lambda e: pids.append(e.pid) if isinstance(e, RankStarted) else None)
    while len(pids) < gpus:
        handle.wait(0.05)
    time.sleep(3.0)  # let every rank allocate its block
    during = gpu_used_bytes() if baseline else []
    if baseline:
        counts = gpu_process_counts()
        check(
            "during a call only its ranks are on the GPUs (no standby context)",
            counts[:gpus] == [1] * gpus,
            f"NVML compute processes per GPU {counts}",
        )
    start = time.perf_counter()
    handle.cancel("validation cancel")
    handle.wait(30)
    while any(psutil.pid_exists(p) for p in pids) and time.perf_counter() - start < 30:
        time.sleep(0.01)
    gone_s = time.perf_counter() - start
    back = gpu_used_bytes() if baseline else []
    while baseline and any(b > base + 2**30 for b, base in zip(back, baseline, strict=True)):
        if time.perf_counter() - start > 30:
            break
        time.sleep(0.01)
        back = gpu_used_bytes()
    back_s = time.perf_counter() - start
    gib = [round(x / 2**30, 1) for x in during]
    check(
        "cancel -> every rank gone, GPU memory back",
        back_s <= 3.0,
        f"processes gone {gone_s:.2f} s, memory back {back_s:.2f} s (GiB used during: {gib})",
    )


def main() -> int:
    gpus, gpu_type = ranks(rank_parser().parse_args())
    print(f"serverless_gpu {serverless_gpu.__version__}, python {sys.version.split()[0]}")
    try:
        run_checks(gpus, gpu_type)
    finally:
        serverless_gpu.shutdown()
    return summary()


if __name__ == "__main__":
    sys.exit(main())
