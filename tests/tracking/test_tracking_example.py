"""The example follows the metrics convention: one value per step under each key."""

from __future__ import annotations

from collections import Counter

from mlflow import MlflowClient

from serverless_gpu import distributed
from serverless_gpu.examples.mlp import train
from serverless_gpu.tracking import wait_written


def test_example_logs_one_value_per_step_and_key(embedded: MlflowClient) -> None:
    result = distributed(gpus=2, gpu_type="cpu", timeout=300)(train).distributed(2, 256)
    run_id = result.metadata["mlflow_run_id"]
    assert wait_written(60)
    steps = {
        key: Counter(m.step for m in embedded.get_metric_history(run_id, key))
        for key in ("loss", "rank_1/loss", "epoch_loss")
    }
    for key, counts in steps.items():
        assert counts and set(counts.values()) == {1}, f"{key}: several values for one step"
    assert steps["loss"].keys() == steps["rank_1/loss"].keys()
    assert sorted(steps["epoch_loss"]) == [0, 1]
    rank0 = {m.step: m.value for m in embedded.get_metric_history(run_id, "epoch_loss")}
    mean = sum(r["epoch_losses"][1] for r in result) / 2
    assert abs(rank0[1] - mean) < 1e-6
