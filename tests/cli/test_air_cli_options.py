"""The ``air`` CLI's documented options, as its docs write them: several values after one
``--override``, values typed as air types them, ``--watch`` and ``--idempotency-key``."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from conftest import COMMAND, Cli
from mlflow import MlflowClient

from serverless_gpu.cli.airjob import AirJob
from serverless_gpu.cli.jobfile import load_job
from serverless_gpu.cli.overrides import variadic_overrides

JOB = """
    compute: {num_accelerators: 8, accelerator_type: gpu_8xh100}
    env_variables: {MODE: slow}
    parameters: {lr: 0.1, epochs: 3}
    max_retries: 2
    command: touch ran
"""


@pytest.fixture(autouse=True)
def cpu_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERVERLESS_GPU_TYPE", "cpu")


def test_override_values_are_typed_as_air_types_them(
    write: Callable[[str, str], Path], tmp_path: Path
) -> None:
    """``--override env_variables.MY_FLAG=off`` keeps ``"off"``: a key the file does not set,
    or sets to a string, gets the text; another type reads the text as that type."""
    path = write("job.yaml", JOB)
    job = load_job(
        path,
        [
            "env_variables.MY_FLAG=off",
            "env_variables.MODE=1e3",
            "parameters.lr=0.5",
            "parameters.note=yes",
            "max_retries=0",
            "compute.num_accelerators=4",
        ],
    )
    assert isinstance(job, AirJob)
    assert job.env_variables["MY_FLAG"] == "off" and job.env_variables["MODE"] == "1e3"
    assert job.parameters == {"lr": 0.5, "epochs": 3, "note": "yes"}
    assert (job.max_retries, job.compute.num_accelerators) == (0, 4)


def test_one_override_flag_takes_several_values(
    cli: Cli, write: Callable[[str, str], Path], tmp_path: Path
) -> None:
    """``air run job.yaml --override a=1 b=2`` (the flag is variadic in air's CLI)."""
    write("job.yaml", JOB)
    done = cli(
        "run",
        "job.yaml",
        "--override",
        "compute.num_accelerators=4",
        "env_variables.MY_FLAG=off",
        "--dry-run",
        "--watch",
        "--idempotency-key",
        "nightly-1",
    )
    assert done.returncode == 0, done.stderr
    assert "num_accelerators: 4" in done.stdout and "MY_FLAG: 'off'" in done.stdout
    assert "--idempotency-key is ignored here" in done.stderr
    assert not (tmp_path / "ran").exists()
    both = cli("run", "job.yaml", "--watch", "--detach")  # the one air has, and ours
    assert both.returncode == 2 and "give one of them" in both.stderr


def test_a_scripts_own_arguments_are_left_as_they_are() -> None:
    takes = {"-f", "--override", "--gpus"}
    assert variadic_overrides(["-f", "j.yaml", "--override", "a=1", "b=2", "--dry-run"], takes) == [
        "-f",
        "j.yaml",
        "--override",
        "a=1",
        "--override",
        "b=2",
        "--dry-run",
    ]
    script = ["--gpus", "2", "train.py", "--override", "a=1", "b=2"]
    assert variadic_overrides(script, takes) == script
    assert variadic_overrides(["--", "--override", "a=1", "b=2"], takes)[-1] == "b=2"


TICKER_JOB = """
    experiment_name: {experiment}
    compute: {{num_accelerators: 1, accelerator_type: GPU_1xA10}}
    max_retries: 0
    command: |
      for i in $(seq 1 3000); do echo "tick $i"; sleep 0.2; done
"""


def test_a_detached_air_job_is_listed_followed_and_cancelled(
    cli: Cli, write: Callable[[str, str], Path], cli_env: str, client: MlflowClient
) -> None:
    """``--detach`` for a file of air's format, followed with ``serverless-gpu runs``; its MLflow
    run, without ``mlflow_run_name``, is named after the experiment as air names it."""
    write("job.yaml", TICKER_JOB.format(experiment=cli_env))
    started = cli("run", "job.yaml", "--detach")
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.split()[0]
    record = json.loads(next(Path("runs").glob(f"*-{run_id}/run.json")).read_text())
    detached = psutil.Process(record["cli_pid"])
    listed = cli("runs", "list").stdout.splitlines()
    assert any(line.split()[:3] == [run_id, cli_env, "running"] for line in listed), listed
    follow = subprocess.Popen(
        [*COMMAND, "runs", "logs", run_id, "--follow"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert follow.stdout is not None
        first, second = follow.stdout.readline(), follow.stdout.readline()  # a tick every 0.2 s
        assert first.startswith("serverless-gpu: MLflow run ") and second.startswith("tick ")
        tree = [detached, *detached.children(recursive=True)]
        cancelled = cli("runs", "cancel", run_id)
        assert cancelled.stdout.strip() == f"{run_id}: cancelled", cancelled.stderr
        assert follow.wait(timeout=30) == 0  # following ends with the run
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.wait(10)
    _, alive = psutil.wait_procs(tree, timeout=15)
    assert not alive, [p.cmdline() for p in alive]
    assert "status:    cancelled" in cli("runs", "show", run_id).stdout
    experiment = client.get_experiment_by_name(cli_env)
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    assert (run.info.run_name, run.info.status) == (cli_env, "KILLED")
