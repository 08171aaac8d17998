"""A sweep is one parent MLflow run with one child run per trial, params = its arguments."""

from __future__ import annotations

from collections.abc import Callable

from mlflow import MlflowClient
from mlflow.entities import Run
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

import serverless_gpu
from serverless_gpu import distributed


@distributed(gpus=1, gpu_type="cpu", standby=False, timeout=120)
def trial(lr: float, layers: int = 1) -> float:
    if lr < 0:
        raise ValueError("negative learning rate")
    return lr * layers


def test_sweep_is_a_parent_run_with_a_child_per_trial(
    embedded: MlflowClient, experiment_runs: Callable[[MlflowClient], list[Run]]
) -> None:
    items = [{"lr": 0.1, "layers": 2}, {"lr": -1.0}]
    outcomes = serverless_gpu.sweep(trial, items, timeout=120)
    assert isinstance(outcomes[1], ValueError)
    runs = experiment_runs(embedded)
    parents = [r for r in runs if MLFLOW_PARENT_RUN_ID not in r.data.tags]
    children = [r for r in runs if MLFLOW_PARENT_RUN_ID in r.data.tags]
    assert len(parents) == 1 and len(children) == 2
    parent = parents[0]
    assert parent.info.run_name == "trial sweep"
    assert parent.data.metrics["trials_failed"] == 1
    assert {c.data.tags[MLFLOW_PARENT_RUN_ID] for c in children} == {parent.info.run_id}
    by_name = {c.info.run_name: c for c in children}
    assert by_name["trial trial 0"].data.params["lr"] == "0.1"
    assert by_name["trial trial 0"].data.params["layers"] == "2"
    assert by_name["trial trial 0"].info.status == "FINISHED"
    assert by_name["trial trial 1"].data.params["lr"] == "-1.0"
    assert by_name["trial trial 1"].info.status == "FAILED"
    first = outcomes[0]
    assert not isinstance(first, BaseException), first
    assert f"/runs/{by_name['trial trial 0'].info.run_id}" in first.links["mlflow"]


def crash_first_attempt(lr: float) -> float:
    """Killed on attempt 0 (a crash: retried)."""
    import os

    from serverless_gpu import runtime

    if runtime.attempt() == 0:
        os._exit(3)
    return lr


def test_a_retried_trial_ends_every_run_it_opened(
    embedded: MlflowClient, experiment_runs: Callable[[MlflowClient], list[Run]]
) -> None:
    fn = distributed(gpus=1, gpu_type="cpu", standby=False, max_retries=1, output="none")(
        crash_first_attempt
    )
    outcomes = serverless_gpu.sweep(fn, [{"lr": 0.5}], timeout=120)
    assert list(outcomes[0]) == [0.5]  # type: ignore[arg-type]
    runs = experiment_runs(embedded)
    statuses = sorted(r.info.status for r in runs)
    # The sweep, the trial's call and its two attempts: none left RUNNING.
    assert statuses == ["FAILED", "FINISHED", "FINISHED", "FINISHED"], [
        (r.info.run_name, r.info.status) for r in runs
    ]
