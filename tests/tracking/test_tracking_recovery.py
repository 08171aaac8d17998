"""In MLflow: a retried call is one run whose children are its attempts; a timeout's stacks are
artifacts of its run."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from mlflow import MlflowClient
from mlflow.entities import Run

from serverless_gpu import DistributedTimeoutError, distributed

pytestmark = pytest.mark.timeout(240)
RunsOf = Callable[[MlflowClient], list[Run]]


def crash_on_first_attempt(marker: str) -> int:
    from serverless_gpu import runtime

    if runtime.attempt() == 0 and runtime.get_global_rank() == 1:
        os._exit(1)
    return runtime.attempt()


def stuck_here() -> None:
    time.sleep(60)


def test_attempts_are_children_of_the_calls_run(
    embedded: MlflowClient, experiment_runs: RunsOf, tmp_path: Path
) -> None:
    fn = distributed(gpus=2, gpu_type="cpu", max_retries=2, run_name="train")(
        crash_on_first_attempt
    )
    assert list(fn.distributed(str(tmp_path))) == [1, 1]
    runs = {r.info.run_name: r for r in experiment_runs(embedded)}
    assert set(runs) == {"train", "train attempt 0", "train attempt 1"}, set(runs)
    call = runs["train"]
    assert call.info.status == "FINISHED"
    assert call.data.tags["serverless_gpu.max_retries"] == "2"
    for attempt, status in ((0, "FAILED"), (1, "FINISHED")):
        run = runs[f"train attempt {attempt}"]
        assert run.info.status == status
        assert run.data.tags["mlflow.parentRunId"] == call.info.run_id
        assert run.data.tags["serverless_gpu.attempt"] == str(attempt)


def test_a_timeouts_stacks_are_artifacts_of_its_run(
    embedded: MlflowClient, experiment_runs: RunsOf
) -> None:
    # Long enough for the ranks to start the function on a loaded machine (they come from
    # standby with mlflow imported: well under a second on a quiet one).
    fn = distributed(gpus=2, gpu_type="cpu", timeout=12)(stuck_here)
    with pytest.raises(DistributedTimeoutError):
        fn.distributed()
    (run,) = experiment_runs(embedded)
    stacks = {a.path for a in embedded.list_artifacts(run.info.run_id, "stacks")}
    assert stacks == {"stacks/rank_0.txt", "stacks/rank_1.txt"}
    text = (Path(run.data.tags["serverless_gpu.run_dir"]) / "stacks" / "rank_0.txt").read_text()
    assert "in stuck_here" in text
