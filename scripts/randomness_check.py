"""Fresh random numbers in every rank of every call, on CPU and on each rank's GPU.

    PYTHONPATH=. python scripts/randomness_check.py                 # every visible GPU
    PYTHONPATH=. python scripts/randomness_check.py --cpu --gpus 2  # CPU ranks

Three calls; each rank draws from torch's CPU generator, from its CUDA generator (on GPUs), from
numpy's global generator and from Python's ``random``. Checks: every draw differs across all
rank-calls; a seed set inside the function gives the same draw on every rank.
"""

from __future__ import annotations

import sys

from _checks import check, rank_parser, ranks, summary

from serverless_gpu import distributed, runtime

CALLS = 3


def draw() -> dict[str, float]:
    """Runs in every rank."""
    import random

    import numpy
    import torch

    values = {
        "torch cpu": torch.rand(1).item(),
        "numpy": float(numpy.random.rand()),
        "python random": random.random(),
    }
    if not runtime.is_cpu_mode():
        values["torch cuda"] = torch.rand(1, device=runtime.device()).item()
    return values


def seeded() -> float:
    import torch

    torch.manual_seed(1234)
    if runtime.is_cpu_mode():
        return torch.rand(1).item()
    return torch.rand(1, device=runtime.device()).item()


def main() -> int:
    args = rank_parser().parse_args()
    world, gpu_type = ranks(args)
    run = distributed(gpus=world, gpu_type=gpu_type, output="none", tracking=False)
    draws = [value for _ in range(CALLS) for value in run(draw).distributed()]
    print(f"{world} ranks x {CALLS} calls")
    for key in draws[0]:
        values = [d[key] for d in draws]
        distinct = len(set(values))
        check(f"{key}: distinct draws", distinct == len(values), f"{distinct} of {len(values)}")
    same = run(seeded).distributed()
    check("seed set in the function is kept", len(set(same)) == 1, f"{same}")
    return summary()


if __name__ == "__main__":
    sys.exit(main())
