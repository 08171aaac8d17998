"""The ``air`` CLI's documented options, as its docs write them: several values after one
``--override``, values typed as air types them, ``--watch`` and ``--idempotency-key``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import Cli

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
    both = cli("run", "job.yaml", "--watch", "--detach")
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
