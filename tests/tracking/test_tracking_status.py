"""The MLflow run's status follows the call: FAILED with the root cause, KILLED when stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import tracking_fns
from mlflow import MlflowClient
from mlflow.entities import Run

from serverless_gpu import CancelledError, DistributedTimeoutError, RankFailedError, distributed
from serverless_gpu.tracking import wait_written

RunsOf = Callable[[MlflowClient], list[Run]]
HERE = Path(__file__).resolve().parent


def _wait_for(path: Path, timeout: float, pump: Callable[[], object] = lambda: None) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear"
        pump()
        time.sleep(0.1)


def test_failed_status_carries_the_root_cause(
    embedded: MlflowClient, experiment_runs: RunsOf
) -> None:
    fn = distributed(gpus=2, gpu_type="cpu", timeout=300)(tracking_fns.fail_on_rank_1)
    with pytest.raises(ValueError, match="rank 1 gave up"):
        fn.distributed("raise")
    with pytest.raises(RankFailedError):
        fn.distributed("crash")
    with pytest.raises(DistributedTimeoutError):
        distributed(gpus=2, gpu_type="cpu", timeout=4)(tracking_fns.fail_on_rank_1).distributed(
            "timeout"
        )

    runs = sorted(experiment_runs(embedded), key=lambda r: r.info.start_time)
    assert [r.info.status for r in runs] == ["FAILED", "FAILED", "FAILED"]
    errors = [r.data.tags["serverless_gpu.error"] for r in runs]
    assert errors[0].startswith("rank 1 raised") and "ValueError: rank 1 gave up" in errors[0]
    assert "rank 1 was killed by SIGKILL" in errors[1]
    assert "exceeded its timeout of 4 s" in errors[2]
    statuses = [r.data.tags["serverless_gpu.status"] for r in runs]
    assert statuses == ["failed", "failed", "timed_out"]
    for run in runs:  # the logs of a failed run are there too
        logs = {a.path for a in embedded.list_artifacts(run.info.run_id, "logs")}
        assert logs == {"logs/rank_0.txt", "logs/rank_1.txt"}
    # Rank 1's point at least (rank 0, stopped in its sleep, may lose its last second).
    assert "rank_1/before_failure" in runs[0].data.metrics


def test_cancel_marks_the_run_killed(embedded: MlflowClient, tmp_path: Path) -> None:
    marker = tmp_path / "running"
    handle = distributed(gpus=2, gpu_type="cpu", timeout=300)(
        tracking_fns.sleep_until_stopped
    ).start(str(marker))
    _wait_for(marker, 120, pump=handle.poll)
    handle.cancel()
    assert handle.wait(60)
    with pytest.raises(CancelledError):
        handle.result()

    assert wait_written(60)
    run = embedded.get_run(handle.context.metadata["mlflow_run_id"])
    assert run.info.status == "KILLED"
    assert run.data.tags["serverless_gpu.error"] == "cancelled by the user"


def test_keyboard_interrupt_marks_the_run_killed(
    embedded: MlflowClient, experiment_runs: RunsOf, store_dir: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "running"
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(HERE)!r})
        import tracking_fns
        from serverless_gpu import distributed

        fn = distributed(gpus=2, gpu_type="cpu", timeout=300)(tracking_fns.sleep_until_stopped)
        try:
            fn.distributed({str(marker)!r})
        except KeyboardInterrupt:
            sys.exit(3)
        """
    )
    caller = subprocess.Popen([sys.executable, "-c", script], cwd=store_dir, env=dict(os.environ))
    try:
        _wait_for(marker, 120)
        caller.send_signal(signal.SIGINT)
        assert caller.wait(60) == 3
    finally:
        if caller.poll() is None:
            caller.kill()
            caller.wait()

    [run] = experiment_runs(embedded)
    assert run.info.status == "KILLED"
    assert "KeyboardInterrupt" in run.data.tags["serverless_gpu.error"]


def test_a_run_whose_caller_was_sigkilled_is_marked_killed_by_the_next_call(
    embedded: MlflowClient, experiment_runs: RunsOf, store_dir: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "running"
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(HERE)!r})
        import tracking_fns
        from serverless_gpu import distributed

        fn = distributed(gpus=2, gpu_type="cpu", timeout=300)(tracking_fns.sleep_until_stopped)
        fn.distributed({str(marker)!r})
        """
    )
    caller = subprocess.Popen([sys.executable, "-c", script], cwd=store_dir, env=dict(os.environ))
    try:
        _wait_for(marker, 120)
        caller.kill()  # no atexit, no cleanup in the caller
        caller.wait(60)
    finally:
        if caller.poll() is None:
            caller.kill()
            caller.wait()
    [orphan] = experiment_runs(embedded)
    assert orphan.info.status == "RUNNING"

    distributed(gpus=2, gpu_type="cpu", timeout=300)(tracking_fns.no_mlflow).distributed()
    assert wait_written(60)  # the orphan is ended after the call's own run

    run = embedded.get_run(orphan.info.run_id)
    assert run.info.status == "KILLED"
    assert "exited during the run" in run.data.tags["serverless_gpu.error"]
    assert run.info.end_time is not None


def test_a_failed_run_explains_itself_and_its_experiment_is_a_training_one(
    embedded: MlflowClient, experiment_runs: RunsOf, tracking_env: str
) -> None:
    fn = distributed(gpus=2, gpu_type="cpu", timeout=300)(tracking_fns.fail_on_rank_1)
    with pytest.raises(ValueError, match="rank 1 gave up"):
        fn.distributed("raise")
    [run] = experiment_runs(embedded)
    # MLflow 3's UI lists the runs of such an experiment as training runs.
    experiment = embedded.get_experiment(run.info.experiment_id)
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    # The description (the run page's first text): root cause, then the rank's traceback.
    description = run.data.tags["mlflow.note.content"]
    assert description.startswith("rank 1 raised ValueError: rank 1 gave up")
    assert "Traceback (most recent call last)" in description
    assert "in fail_on_rank_1" in description
    assert "logs/rank_1.txt" in description


def test_a_users_experiment_kind_is_kept(
    embedded: MlflowClient, experiment_runs: RunsOf, tracking_env: str
) -> None:
    experiment_id = embedded.create_experiment(tracking_env)
    embedded.set_experiment_tag(experiment_id, "mlflow.experimentKind", "genai_development")
    distributed(gpus=2, gpu_type="cpu", timeout=300)(tracking_fns.no_mlflow).distributed()
    assert wait_written(60)
    tags = embedded.get_experiment(experiment_id).tags
    assert tags["mlflow.experimentKind"] == "genai_development"
