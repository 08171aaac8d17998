"""FSDP2 through ``@distributed``: a model that does not fit one GPU unsharded trains sharded.

    PYTHONPATH=. python scripts/fsdp2_check.py                 # every visible GPU
    PYTHONPATH=. python scripts/fsdp2_check.py --cpu --gpus 2  # a tiny model on CPU ranks

The stand-in for "does not fit one GPU": each rank caps its CUDA allocator at ``--cap-gib``
(``torch.cuda.set_per_process_memory_fraction``), and the default model (24 Linear layers of
8192 x 8192, 1.6 B fp32 parameters) needs about 26 GB to train unsharded with Adam (weights,
gradients, two moments). Rank 0 first tries exactly that under the cap and must hit
``torch.OutOfMemoryError``; then every rank trains the same model with ``fully_shard`` per layer
(meta-device init, ``to_empty``, ``reset_parameters``), which needs about 26/N GB per rank.
Checks: every rank returns; each holds 1/N of the parameters; the loss falls; on GPUs the
unsharded attempt ran out of memory and the sharded peak stayed under the cap.
"""

from __future__ import annotations

import math
import sys
from typing import Any

from _checks import check, rank_parser, ranks, summary

import serverless_gpu
from serverless_gpu import distributed, runtime
from serverless_gpu.common.gpus import visible_gpu_names


def train_sharded(layers: int, width: int, cap_gib: float, steps: int) -> dict[str, Any]:
    """Runs in every rank."""
    import gc

    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    runtime.init_process_group()
    device = runtime.device()
    cuda = device.type == "cuda"
    if cuda:
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, cap_gib * 2**30 / total), device)

    def build() -> torch.nn.Sequential:
        with torch.device("meta"):
            return torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])

    unsharded = "not tried (rank 0 tries it, on GPUs)"
    if cuda and runtime.get_global_rank() == 0:
        unsharded = _train_unsharded(build(), device)
        gc.collect()  # the attempt's frame is gone: give its memory back before measuring
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    dist.barrier()

    model = build()
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    model.to_empty(device=device)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            layer.reset_parameters()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    generator = torch.Generator(device=device).manual_seed(0)  # the same batch on every step
    x = torch.randn(8, width, device=device, generator=generator)
    losses = []
    for _ in range(steps):
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    # fully_shard turns each parameter into a DTensor; this rank's shard is its local tensor.
    local = sum(p.to_local().numel() for p in model.parameters() if isinstance(p, DTensor))
    total_params = sum(p.numel() for p in model.parameters())
    peak = torch.cuda.max_memory_allocated(device) if cuda else 0
    dist.destroy_process_group()
    return {
        "rank": runtime.get_global_rank(),
        "losses": losses,
        "local_params": local,
        "total_params": total_params,
        "peak_gib": peak / 2**30,
        "unsharded": unsharded,
    }


def _train_unsharded(model: Any, device: Any) -> str:
    """One Adam step of the whole model on this GPU alone: "out of memory" is the expected
    answer under the cap."""
    import torch

    try:
        model.to_empty(device=device)
        opt = torch.optim.Adam(model.parameters())
        model(torch.randn(8, model[0].in_features, device=device)).pow(2).mean().backward()
        opt.step()
        return "fit"
    except torch.OutOfMemoryError:
        return "out of memory"


def main() -> int:
    parser = rank_parser()
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--width", type=int, default=None)
    parser.add_argument("--cap-gib", type=float, default=16.0)
    parser.add_argument("--steps", type=int, default=5)
    a = parser.parse_args()
    gpus, gpu_type = ranks(a)
    layers = a.layers or (4 if a.cpu else 24)
    width = a.width or (64 if a.cpu else 8192)
    params = layers * (width * width + width)
    print(
        f"FSDP2 on {gpus} x {'CPU' if a.cpu else visible_gpu_names()[0]}: {layers} x Linear"
        f"({width}, {width}) = {params / 1e9:.2f} B parameters, ~{params * 16 / 1e9:.1f} GB to "
        f"train unsharded with Adam; cap {a.cap_gib:g} GiB per GPU",
        flush=True,
    )
    fn = distributed(gpus=gpus, gpu_type=gpu_type, tracking=False)(train_sharded)
    try:
        out = fn.distributed(layers, width, a.cap_gib, a.steps)
    finally:
        serverless_gpu.shutdown()
    for r in out:
        print(
            f"rank {r['rank']}: {r['local_params']:,} of {r['total_params']:,} parameters; "
            f"loss {r['losses'][0]:.4g} -> {r['losses'][-1]:.4g}; peak {r['peak_gib']:.2f} GiB; "
            f"unsharded: {r['unsharded']}"
        )
    check("every rank returned, in order", [r["rank"] for r in out] == list(range(gpus)))
    check(
        "each rank holds 1/N of the parameters",
        all(
            r["total_params"] == params and abs(r["local_params"] * gpus - params) <= gpus * width
            for r in out
        ),
    )
    check(
        "the loss falls",
        all(math.isfinite(r["losses"][-1]) and r["losses"][-1] < r["losses"][0] for r in out),
    )
    if not a.cpu:
        check(
            "unsharded one-GPU step ran out of memory under the cap",
            out[0]["unsharded"] == "out of memory",
        )
        check("sharded peak under the cap", all(r["peak_gib"] < a.cap_gib for r in out))
    return summary()


if __name__ == "__main__":
    sys.exit(main())
