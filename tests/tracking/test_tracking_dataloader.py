"""``serverless_gpu.data.DataLoader`` logs each rank's batch timing to the call's MLflow run."""

from __future__ import annotations

from collections.abc import Callable

from mlflow import MlflowClient
from mlflow.entities import Run

from serverless_gpu import distributed


def read_batches() -> int:
    import torch

    from serverless_gpu.data import DataLoader

    loader = DataLoader(torch.arange(24), batch_size=4, num_workers=1)
    return sum(len(batch) for batch in loader)


def test_every_ranks_fetch_timing_lands_in_the_calls_run(
    embedded: MlflowClient, experiment_runs: Callable[[MlflowClient], list[Run]]
) -> None:
    result = distributed(gpus=2, gpu_type="cpu")(read_batches).distributed()
    assert list(result) == [24, 24]
    (run,) = experiment_runs(embedded)
    assert run.info.run_id == result.metadata["mlflow_run_id"]
    names = set(run.data.metrics)
    for name in (
        "dataloader/fetch_seconds",
        "dataloader/fetch_seconds_variance",
        "dataloader/between_next_seconds",
        "dataloader/between_next_seconds_variance",
    ):
        assert {name, f"rank_1/{name}"} <= names, sorted(names)
    history = embedded.get_metric_history(run.info.run_id, "dataloader/fetch_seconds")
    assert [m.step for m in history] == [6]  # one window, at the loader's batch count
    assert history[0].value >= 0
