"""Every rank of every call draws fresh random numbers, as processes under torchrun do."""

from __future__ import annotations

from serverless_gpu import distributed
from serverless_gpu.backends.local import default_backend
from serverless_gpu.common.gpus import resolve_placement


@distributed(gpus=2, gpu_type="cpu", output="none", tracking=False)
def draws() -> dict[str, float]:
    import random

    import torch

    values = {
        "torch": torch.rand(1).item(),
        "randperm": float(torch.randperm(1000)[0]),
        "random": random.random(),
    }
    try:
        import numpy
    except ImportError:
        return values
    values["numpy"] = float(numpy.random.rand())
    return values


def test_each_rank_and_each_call_draws_different_numbers() -> None:
    # numpy imported in the launcher (as importing mlflow there does) is inherited by the ranks.
    default_backend().prewarm(resolve_placement(2, "cpu"), ("numpy",))
    results = draws.distributed() + draws.distributed()
    for key in results[0]:
        values = [r[key] for r in results]
        assert len(set(values)) == len(values), f"{key}: {values}"


def test_a_seed_set_in_the_function_is_kept() -> None:
    @distributed(gpus=2, gpu_type="cpu", output="none", tracking=False)
    def seeded() -> float:
        import torch

        torch.manual_seed(1234)
        return torch.rand(1).item()

    first, second = seeded.distributed()
    assert first == second
