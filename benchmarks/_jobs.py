"""What the ranks run, identical under every launcher (serverless_gpu, spawn, fork, torchrun,
Accelerate). Only the standard library is imported at the top: a spawned child imports this
module before the job records its entry time, and torch is imported inside the job, as a user's
function would.

Rank-side imports are lazy (argparse, json, statistics too): a rank that unpickles
``_jobs.user_fn`` imports this module before the function records its entry time.

Run by torchrun as a script: ``python -m torch.distributed.run ... _jobs.py --job noop --out DIR``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any


def user_fn(job: str, device: str, out_dir: str | None, cfg: dict[str, Any] | None = None) -> Any:
    """The user's function: RANK, WORLD_SIZE, MASTER_* come from the launcher's environment."""
    entry = time.time()  # first thing: "every rank is inside user code" is measured from here
    # Accelerate runs one process in the caller itself and sets none of these.
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    return _run(entry, job, device, out_dir, cfg or {})


def mp_fn(index: int, world_size: int, port: int, job: str, device: str, out_dir: str) -> None:
    """Entry point for torch.multiprocessing spawn/fork: the rank sets its own environment."""
    entry = time.time()
    os.environ.update(
        RANK=str(index),
        LOCAL_RANK=str(index),
        WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    _run(entry, job, device, out_dir, {})


def _run(entry: float, job: str, device: str, out_dir: str | None, cfg: dict[str, Any]) -> Any:
    rank = int(os.environ["RANK"])
    if out_dir is not None:
        Path(out_dir, f"entry_{rank}").write_text(repr(entry))
    if job == "noop":
        return entry
    if job == "allreduce":
        init_group(device)
        allreduce_once(device)
        _destroy()
        return entry
    if job == "parts":  # the allreduce job, with the time of each step
        import torch.distributed as dist

        times = {"entry": entry, "warm": float(dist.is_initialized())}
        init_group(device)
        times["init"] = time.time()
        allreduce_once(device)
        times["allreduce"] = time.time()
        _destroy()
        times["destroy"] = time.time()
        return times
    if job == "ddp":
        import json

        result = ddp_steps(device, cfg)
        if out_dir is not None:
            Path(out_dir, f"ddp_{rank}.json").write_text(json.dumps(result))
        return result
    raise ValueError(f"unknown job {job!r}")


# -- torch.distributed, the same calls under every launcher --------------------------------------


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def init_group(device: str) -> None:
    import torch
    import torch.distributed as dist

    if device == "cpu":
        dist.init_process_group("gloo")
        return
    torch.cuda.set_device(local_rank())
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank()))


def allreduce_once(device: str) -> float:
    import torch
    import torch.distributed as dist

    where = "cpu" if device == "cpu" else f"cuda:{local_rank()}"
    value = torch.ones(1, device=where)
    dist.all_reduce(value)
    return float(value.item())  # .item() waits for the collective to finish


def _destroy() -> None:
    import torch.distributed as dist

    dist.destroy_process_group()


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- DDP training step ------------------------------------------------------------------------

# ~110M parameters on GPU (GPT-2-small-like); a toy model on CPU, where only the ratio matters.
# Batch 32 x 512 keeps an H200 busy (~46 ms a step): at batch 8 the step is bound by Python's
# kernel dispatch and varies by +-20 % from run to run under every launcher.
GPU_MODEL = {"d": 768, "layers": 12, "heads": 12, "vocab": 16384, "batch": 32, "seq": 512}
CPU_MODEL = {"d": 128, "layers": 2, "heads": 4, "vocab": 1000, "batch": 4, "seq": 64}


def build_model(shape: dict[str, int]) -> Any:
    import torch.nn as nn

    d = shape["d"]
    layer = nn.TransformerEncoderLayer(
        d, shape["heads"], 4 * d, dropout=0.0, batch_first=True, norm_first=True
    )
    return nn.Sequential(
        nn.Embedding(shape["vocab"], d),
        nn.TransformerEncoder(layer, shape["layers"], enable_nested_tensor=False),
        nn.Linear(d, shape["vocab"]),
    )


def ddp_steps(device: str, cfg: dict[str, Any]) -> dict[str, float]:
    """Median DDP step time after warm-up; every rank runs the same code under every launcher."""
    import statistics

    import torch
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    init_group(device)
    shape = {**(CPU_MODEL if device == "cpu" else GPU_MODEL), **cfg.get("shape", {})}
    where = torch.device("cpu") if device == "cpu" else torch.device("cuda", local_rank())
    torch.manual_seed(0)
    model = build_model(shape).to(where)
    ddp = DDP(model, device_ids=None if device == "cpu" else [where.index])
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
    tokens = torch.randint(0, shape["vocab"], (shape["batch"], shape["seq"]), device=where)

    def step() -> None:
        with torch.autocast(where.type, dtype=torch.bfloat16, enabled=device != "cpu"):
            logits = ddp(tokens)
            loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device != "cpu":
            torch.cuda.synchronize()

    for _ in range(int(cfg.get("warmup", 10))):
        step()
    times = []
    for _ in range(int(cfg.get("steps", 40))):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    params = sum(p.numel() for p in model.parameters())
    _destroy()
    return {
        "median_step_s": statistics.median(times),
        "params": float(params),
        # CPU-side settings a launcher decides; they matter when the step is dispatch-bound.
        "threads": float(torch.get_num_threads()),
        "cpus": float(len(os.sched_getaffinity(0))),
    }


def main() -> None:
    """torchrun entry point."""
    import argparse
    import json

    parser = argparse.ArgumentParser()
    parser.add_argument("--job", required=True)
    parser.add_argument("--device", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--cfg", default="{}", help="json for the ddp job")
    args = parser.parse_args()
    user_fn(args.job, args.device, args.out, json.loads(args.cfg))


if __name__ == "__main__":
    main()
