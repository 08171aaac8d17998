"""Job files of the ``air`` CLI's format, run with ``serverless-gpu run`` as they are.

The files are written as air's documentation writes them: a ``compute`` block, a bash
``command`` (once per node) that calls ``torchrun``, ``parameters`` read from
``$HYPERPARAMETERS_PATH``, code under ``$CODE_SOURCE_PATH``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import COMMAND, Cli
from eventually import eventually
from mlflow import MlflowClient

from serverless_gpu.cli.airjob import AirJob
from serverless_gpu.cli.jobfile import JobSpec, load_job
from serverless_gpu.common.errors import ConfigurationError, GPUConfigError
from serverless_gpu.common.gpus import visible_gpu_names

TRAIN = """
    import json
    import os

    import torch
    import torch.distributed as dist
    import yaml

    dist.init_process_group("gloo")
    total = torch.tensor([dist.get_rank() + 1])
    dist.all_reduce(total)
    with open(os.environ["HYPERPARAMETERS_PATH"]) as f:
        params = yaml.safe_load(f)
    names = ("NUM_NODES", "NODE_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
             "RANK", "WORLD_SIZE", "GREETING", "MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_NAME")
    seen = {name: os.environ.get(name) for name in names}
    seen.update(params=params, total=int(total), cwd=os.getcwd())
    with open(os.path.join(os.environ["OUT"], f"rank_{dist.get_rank()}.json"), "w") as f:
        json.dump(seen, f)
    dist.destroy_process_group()
"""

BASE = """
    compute:
      num_accelerators: 8
      accelerator_type: GPU_8xH100
    env_variables:
      GREETING: from-base
      OMP_NUM_THREADS: 1
    max_retries: 0
"""

JOB = """
    _bases_: [base.yaml]
    experiment_name: {experiment}
    mlflow_run_name: ddp-smoke
    compute:
      num_accelerators: 2
    code_source:
      type: snapshot
      snapshot:
        root_path: ../src
    env_variables:
      GREETING: hello
      OUT: {out}
    parameters:
      learning_rate: 0.001
      layer_sizes: [512, 256]
    secrets:
      HF_TOKEN: my_scope/hf_token
    environment:
      dependencies: [transformers]
    command: |
      cd $CODE_SOURCE_PATH
      torchrun \\
        --nproc-per-node=$LOCAL_WORLD_SIZE \\
        --nnodes=$NUM_NODES \\
        --node-rank=$NODE_RANK \\
        --master-addr=$MASTER_ADDR \\
        --master-port=$MASTER_PORT \\
        train.py
"""


@pytest.fixture(autouse=True)
def cpu_and_torchrun(monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU mode, and the venv's ``torchrun`` on PATH as in an activated environment."""
    monkeypatch.setenv("SERVERLESS_GPU_TYPE", "cpu")
    bin_dir = str(Path(sys.executable).parent)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")


def test_a_torchrun_command_runs_once_with_airs_node_environment(
    cli: Cli,
    write: Callable[[str, str], Path],
    tmp_path: Path,
    client: MlflowClient,
    cli_env: str,
) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "jobs").mkdir()
    write("src/train.py", TRAIN)
    out = tmp_path / "out"
    out.mkdir()
    write("jobs/base.yaml", BASE)
    write("jobs/job.yaml", JOB.format(experiment=cli_env, out=out))
    done = cli("run", "jobs/job.yaml")  # air's spelling: the file as the argument
    assert done.returncode == 0, done.stderr
    assert "secrets is ignored here" in done.stderr
    assert "environment is ignored here" in done.stderr
    ranks = [json.loads((out / f"rank_{r}.json").read_text()) for r in (0, 1)]
    for rank, seen in enumerate(ranks):
        assert seen["RANK"] == str(rank) and seen["WORLD_SIZE"] == "2"
        assert seen["NUM_NODES"] == "1" and seen["NODE_RANK"] == "0"
        assert seen["LOCAL_WORLD_SIZE"] == "2" and seen["MASTER_ADDR"] == "127.0.0.1"
        assert int(seen["MASTER_PORT"]) > 0
        assert seen["GREETING"] == "hello"  # the file's keys over its base's
        assert seen["params"] == {"learning_rate": 0.001, "layer_sizes": [512, 256]}
        assert seen["cwd"] == str((tmp_path / "src").resolve())  # relative to the YAML, not the cwd
        assert seen["total"] == 3  # the gloo all-reduce ran over both ranks
        assert seen["MLFLOW_EXPERIMENT_NAME"] == cli_env
    experiment = client.get_experiment_by_name(cli_env)
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "ddp-smoke" and run.info.status == "FINISHED"
    assert ranks[0]["MLFLOW_RUN_ID"] == run.info.run_id


def test_a_failing_command_is_retried_three_times_by_default_each_a_new_mlflow_run(
    cli: Cli, write: Callable[[str, str], Path], tmp_path: Path, client: MlflowClient, cli_env: str
) -> None:
    write(
        "job.yaml",
        f"""
        experiment_name: {cli_env}
        compute: {{num_accelerators: 1, accelerator_type: GPU_1xA10}}
        command: |
          echo "attempt $SERVERLESS_GPU_ATTEMPT" >> {tmp_path}/attempts
          exit 3
        """,
    )
    done = cli("run", "-f", "job.yaml")
    assert done.returncode == 1, done.stderr
    assert "the command failed with exit status 3" in done.stderr
    lines = (tmp_path / "attempts").read_text().splitlines()
    assert lines == ["attempt 0", "attempt 1", "attempt 2", "attempt 3"]
    # The same numbers as runtime.attempt() reads them, 0 first
    assert "attempt 0 failed; retry 1 of 3" in done.stderr, done.stderr
    assert "attempt 2 failed; retry 3 of 3" in done.stderr
    experiment = client.get_experiment_by_name(cli_env)
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id])
    assert [r.info.status for r in runs] == ["FAILED"] * 4


def test_a_command_past_timeout_minutes_is_stopped_with_its_children(
    cli: Cli, write: Callable[[str, str], Path], tmp_path: Path
) -> None:
    write(
        "job.yaml",
        """
        experiment_name: slow
        compute: {num_accelerators: 1, accelerator_type: cpu}
        timeout_minutes: 0.05
        command: |
          sleep 120 &
          echo $! > child.pid
          wait
        """,
    )
    done = cli("run", "job.yaml")
    assert done.returncode == 124, done.stderr
    assert "timed out after 0.05 minutes" in done.stderr
    child = int((tmp_path / "child.pid").read_text())
    with pytest.raises(ProcessLookupError):  # the whole group was stopped
        os.kill(child, 0)


def test_dry_run_prints_the_effective_job_with_overrides_and_runs_nothing(
    cli: Cli, write: Callable[[str, str], Path], tmp_path: Path
) -> None:
    write(
        "job.yaml",
        """
        experiment_name: dry
        compute: {num_accelerators: 8, accelerator_type: gpu_8xh100}
        parameters: {lr: 0.1}
        command: touch ran
        """,
    )
    done = cli(
        "run",
        "job.yaml",
        "--dry-run",
        "--override",
        "compute.num_accelerators=4",
        "--override",
        "parameters.lr=0.5",
        "--override",
        "env_variables.MODE=fast",
    )
    assert done.returncode == 0, done.stderr
    assert "num_accelerators: 4" in done.stdout
    assert "lr: 0.5" in done.stdout
    assert "LOCAL_WORLD_SIZE: '4'" in done.stdout and "MODE: fast" in done.stdout
    assert "max_retries: 3" in done.stdout  # air's default
    assert not (tmp_path / "ran").exists()


def test_our_options_with_an_air_file_point_to_override(
    cli: Cli, write: Callable[[str, str], Path]
) -> None:
    write("job.yaml", "compute: {num_accelerators: 1, accelerator_type: cpu}\ncommand: 'true'\n")
    done = cli("run", "-f", "job.yaml", "--gpus", "2")
    assert done.returncode == 2
    assert "--gpus: not for a job file of air's format" in done.stderr
    assert "--override" in done.stderr


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "compute:\n  num_accelerators: 1\n  accelerator_type: GPU_1xA10\n  gpus: 1\n"
            "command: 'true'\n",
            "job.yaml:4: unknown key 'compute.gpus' ('compute.gpus' is this library's key; in "
            "air's format it is 'compute.num_accelerators')",
        ),
        (
            "compute: {num_accelerators: 1, accelerator_type: GPU_1xA10}\ngpu_type: a10\n"
            "command: 'true'\n",
            "job.yaml:2: unknown key 'gpu_type' ('gpu_type' is this library's key; in air's "
            "format it is 'compute.accelerator_type')",
        ),
        (
            "compute: {num_accelerators: 1, accelerator_type: GPU_1xA10}\nenv: {A: 1}\n"
            "command: 'true'\n",
            "job.yaml:2: unknown key 'env' ('env' is this library's key; in air's format it "
            "is 'env_variables')",
        ),
        (
            "script: t.py\naccelerator_type: GPU_1xA10\n",
            "job.yaml:2: unknown key 'accelerator_type' ('accelerator_type' is air's key; here "
            "it is 'gpu_type')",
        ),
        (
            "script: t.py\nenv_variables: {A: 1}\n",
            "job.yaml:2: unknown key 'env_variables' ('env_variables' is air's key; here it is "
            "'env')",
        ),
        (
            "compute: {num_accelerators: 1, accelerator_type: GPU_1xA10, pool: x}\n"
            "command: 'true'\n",
            "job.yaml:1: unknown key 'compute.pool' (did you mean 'pool_name'?)",
        ),
        (
            "compute: {num_accelerators: 1, accelerator_type: TPU_v5}\ncommand: 'true'\n",
            "compute.accelerator_type: Value error, unknown",
        ),
        (
            "compute: {num_accelerators: 1, accelerator_type: GPU_1xA10}\n",
            "job.yaml:1: command: Field required",
        ),
    ],
)
def test_a_key_of_the_other_format_gets_its_place_in_this_one(
    tmp_path: Path, text: str, message: str
) -> None:
    (tmp_path / "job.yaml").write_text(text)
    with pytest.raises(ConfigurationError) as caught:
        load_job(tmp_path / "job.yaml")
    assert message in str(caught.value)


def test_the_format_is_airs_exactly_when_the_file_has_a_compute_block(tmp_path: Path) -> None:
    (tmp_path / "ours.yaml").write_text("script: t.py\ngpus: 2\n")
    (tmp_path / "base.yaml").write_text("compute: {num_accelerators: 2, accelerator_type: cpu}\n")
    (tmp_path / "air.yaml").write_text("_bases_: [base.yaml]\ncommand: 'true'\n")
    assert isinstance(load_job(tmp_path / "ours.yaml"), JobSpec)
    air = load_job(tmp_path / "air.yaml")  # the compute block comes from the base
    assert isinstance(air, AirJob) and air.max_retries == 3
    assert air.compute.num_accelerators == 2


def test_a_cycle_of_bases_more_nodes_than_one_and_missing_gpus_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a.yaml").write_text("_bases_: [b.yaml]\ncommand: 'true'\n")
    (tmp_path / "b.yaml").write_text("_bases_: [a.yaml]\n")
    with pytest.raises(ConfigurationError, match="a cycle"):
        load_job(tmp_path / "a.yaml")
    (tmp_path / "big.yaml").write_text(
        "compute: {num_accelerators: 16, accelerator_type: GPU_8xH100}\ncommand: 'true'\n"
    )
    job = load_job(tmp_path / "big.yaml")
    assert isinstance(job, AirJob)
    assert job.compute.ranks() == 16  # CPU mode ignores the shape
    monkeypatch.delenv("SERVERLESS_GPU_TYPE")
    with pytest.raises(ConfigurationError, match="is 2 nodes; a job file runs on one node"):
        job.compute.ranks()
    if not visible_gpu_names():  # checked as a decorated call's GPUs are
        one = load_job(tmp_path / "big.yaml", ["compute.num_accelerators=8"])
        assert isinstance(one, AirJob)
        with pytest.raises(GPUConfigError, match="no GPU is visible"):
            one.compute.ranks()


def test_sigterm_stops_the_command_and_its_children_as_a_cancel(
    write: Callable[[str, str], Path], tmp_path: Path
) -> None:
    write(
        "job.yaml",
        """
        experiment_name: cancelled
        compute: {num_accelerators: 1, accelerator_type: cpu}
        command: |
          sleep 120 &
          echo $! > child.pid
          wait
        """,
    )
    proc = subprocess.Popen([*COMMAND, "run", "job.yaml"], stderr=subprocess.PIPE, text=True)
    try:
        pid_file = tmp_path / "child.pid"
        eventually(lambda: pid_file.exists() and pid_file.read_text().strip(), "it started")
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait(30)
    assert proc.returncode == 130, stderr
    assert "cancelled by SIGTERM" in stderr
    with pytest.raises(ProcessLookupError):
        os.kill(int((tmp_path / "child.pid").read_text()), 0)


def test_override_and_dry_run_work_on_this_librarys_own_files_too(
    cli: Cli, write: Callable[[str, str], Path], tmp_path: Path
) -> None:
    write("t.py", "open('ran', 'w').close()\n")
    write("base.yaml", "gpus: 2\nenv: {A: base}\n")
    write("job.yaml", "_bases_: [base.yaml]\nscript: t.py\nenv: {B: own}\n")
    done = cli("run", "job.yaml", "--dry-run", "--override", "gpus=3", "--override", "env.A=x")
    assert done.returncode == 0, done.stderr
    assert "gpus: 3" in done.stdout
    assert "A: x" in done.stdout and "B: own" in done.stdout
    assert not (tmp_path / "ran").exists()


def test_an_mlflow_server_that_does_not_answer_leaves_the_attempt_untracked(
    cli: Cli, write: Callable[[str, str], Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
    write(
        "job.yaml",
        "compute: {num_accelerators: 1, accelerator_type: cpu}\nmax_retries: 0\n"
        "command: 'echo ran > out'\n",
    )
    done = cli("run", "job.yaml", timeout=60)
    assert done.returncode == 0, done.stderr
    assert "does not answer: this attempt is not tracked" in done.stderr
    assert (tmp_path / "out").read_text() == "ran\n"
