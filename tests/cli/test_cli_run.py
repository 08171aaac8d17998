"""``serverless-gpu run``: a torchrun-style script on every rank, as a real process."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import COMMAND, Cli
from mlflow import MlflowClient

TRAIN = """
    import argparse

    from serverless_gpu.examples.mlp import train

    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args()
    result = train(args.epochs, batch_size=64)
    print(f"{__name__} rank {result['rank']} losses {result['epoch_losses']}")
"""

RAISES_ON_RANK_1 = """
    import os
    import time

    def load_shard():
        raise ValueError("shard 1 is missing")

    if os.environ["RANK"] == "1":
        load_shard()
    time.sleep(60)
"""


def _record(tmp_path: Path) -> dict:
    (record,) = (tmp_path / "runs").glob("*/run.json")
    return json.loads(record.read_text())


def test_script_trains_the_mlp_with_ddp_and_the_run_is_listed(
    cli: Cli, write: Callable[[str, str], Path], tmp_path: Path, client: MlflowClient, cli_env: str
) -> None:
    write("train.py", TRAIN)
    done = cli("run", "--gpus", "2", "--gpu-type", "cpu", "train.py", "--", "--epochs", "2")
    assert done.returncode == 0, done.stderr
    assert "[rank 0] epoch 1: mean loss" in done.stdout
    assert "[rank 0] __main__ rank 0 losses" in done.stdout  # run as a script
    record = _record(tmp_path)
    run_dir = next((tmp_path / "runs").glob(f"*-{record['run_id']}"))
    for rank in (0, 1):
        log = (run_dir / "logs" / f"rank_{rank}.txt").read_text()
        assert "epoch 1: mean loss" in log and f"__main__ rank {rank} losses" in log
    experiment = client.get_experiment_by_name(cli_env)
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "train.py"
    assert run.data.params["serverless_gpu.timeout"] == "10800"  # the default: 3 h
    assert set(run.data.metrics) >= {"epoch_loss", "loss", "rank_1/loss"}

    listed = cli("runs", "list")
    assert listed.returncode == 0, listed.stderr
    header, row = listed.stdout.splitlines()[:2]
    assert header.split()[:4] == ["ID", "NAME", "STATUS", "GPUS"]
    assert row.split()[:3] == [record["run_id"], "train.py", "succeeded"]
    assert "2 x CPU" in row and run.info.run_id in row  # the MLflow link

    shown = cli("runs", "show", record["run_id"][:6])
    assert shown.returncode == 0, shown.stderr
    assert f"mlflow run: {run.info.run_id} (FINISHED)" in shown.stdout
    assert "epoch_loss = " in shown.stdout and "command:   " in shown.stdout

    rank1 = cli("runs", "logs", record["run_id"], "--rank", "1")
    assert "__main__ rank 1 losses" in rank1.stdout and "[rank" not in rank1.stdout
    both = cli("runs", "logs", record["run_id"])
    assert "[rank 0] __main__ rank 0 losses" in both.stdout
    assert "[rank 1] __main__ rank 1 losses" in both.stdout


def test_a_rank_that_raises_fails_the_command_with_its_traceback(
    cli: Cli, write: Callable[[str, str], Path], tmp_path: Path
) -> None:
    write("fails.py", RAISES_ON_RANK_1)
    done = cli("run", "--gpus", "2", "--gpu-type", "cpu", "fails.py", timeout=120)
    assert done.returncode == 1
    # The live view (stdout) shows rank 1's traceback; the last line on stderr names the rank.
    assert "[rank 1] ValueError: shard 1 is missing" in done.stdout
    assert 'fails.py", line 6, in load_shard' in done.stdout
    assert "failed: rank 1 raised ValueError: shard 1 is missing" in done.stderr
    record = _record(tmp_path)
    assert record["status"] == "failed" and record["message"].startswith("rank 1 raised")


def test_ctrl_c_stops_every_rank_and_leaves_nothing(
    write: Callable[[str, str], Path], tmp_path: Path
) -> None:
    write("sleeps.py", "import time\nprint('ready', flush=True)\ntime.sleep(300)\n")
    command = [*COMMAND, "run", "--gpus", "2", "--gpu-type", "cpu", "--output", "all"]
    proc = subprocess.Popen(
        [*command, "sleeps.py"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        ready = 0
        assert proc.stdout is not None
        for line in proc.stdout:  # bounded by the Popen.wait below if the run never starts
            ready += line.endswith("] ready\n")
            if ready == 2:
                break
        assert ready == 2
        tree = psutil.Process(proc.pid).children(recursive=True)
        assert len(tree) >= 3  # the launcher and both ranks
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    _, alive = psutil.wait_procs(tree, timeout=15)
    assert not alive, [p.cmdline() for p in alive]
    assert "stopped: interrupted (Ctrl-C)" in (proc.stderr.read() if proc.stderr else "")
    assert _record(tmp_path)["status"] == "cancelled"


def test_a_run_past_its_timeout_exits_124(
    cli: Cli, write: Callable[[str, str], Path], tmp_path: Path
) -> None:
    write("sleeps.py", "import time\ntime.sleep(300)\n")
    done = cli("run", "--gpus", "1", "--gpu-type", "cpu", "--timeout", "2", "sleeps.py")
    assert done.returncode == 124, done.stderr
    assert "timed out" in done.stderr
    assert _record(tmp_path)["status"] == "timed_out"


CRASHES_ON_ITS_FIRST_ATTEMPT = """
    import os

    from serverless_gpu import runtime

    if runtime.attempt() == 0 and os.environ["RANK"] == "1":
        os._exit(1)  # a crash, which max_retries starts again
    print(f"attempt {runtime.attempt()} done")
"""


def test_max_retries_starts_a_crashed_script_again(
    cli: Cli, write: Callable[[str, str], Path], cli_env: str
) -> None:
    write("crash.py", CRASHES_ON_ITS_FIRST_ATTEMPT)
    once = cli("run", "--gpus", "2", "--gpu-type", "cpu", "crash.py")
    assert once.returncode != 0 and "rank 1" in once.stderr, once.stderr
    again = cli("run", "--gpus", "2", "--gpu-type", "cpu", "--max-retries", "1", "crash.py")
    assert again.returncode == 0, again.stderr
    assert "[rank 0] attempt 1 done" in again.stdout


def _mlflow_run(client: MlflowClient, experiment: str) -> Any:
    found = client.get_experiment_by_name(experiment)
    assert found is not None
    (run,) = client.search_runs([found.experiment_id])
    return run


def test_the_default_timeout_of_3_hours_reaches_the_run(
    cli: Cli, write: Callable[[str, str], Path], client: MlflowClient, cli_env: str
) -> None:
    write("quick.py", "print('done')\n")
    write("job.yaml", "script: quick.py\ngpus: 1\ngpu_type: cpu\n")  # no timeout_minutes
    done = cli("run", "-f", "job.yaml")
    assert done.returncode == 0, done.stderr
    assert _mlflow_run(client, cli_env).data.params["serverless_gpu.timeout"] == "10800"


def test_a_timeout_prints_where_each_rank_was(
    cli: Cli, write: Callable[[str, str], Path], tmp_path: Path
) -> None:
    write("naps.py", "import time\n\n\ndef nap():\n    time.sleep(300)\n\n\nnap()\n")
    done = cli("run", "--gpus", "2", "--gpu-type", "cpu", "--timeout", "3", "naps.py")
    assert done.returncode == 124, done.stderr
    assert "ranks still running: 0, 1" in done.stderr
    for rank in (0, 1):  # the frames the decorator's DistributedTimeoutError carries
        assert f"  rank {rank}: " in done.stderr and "naps.py:5" in done.stderr
    assert _record(tmp_path)["status"] == "timed_out"


@pytest.mark.parametrize(
    ("options", "hint"),
    [
        (["--gpus", "1"], "pass --gpu-type cpu or set"),
        (["--gpus", "1000", "--gpu-type", "cpu"], "--gpus 1000 CPU ranks were requested"),
        (["--gpu-type", "h1000"], "unknown --gpu-type 'h1000'"),
        (["--remote", "--gpus", "1", "--gpu-type", "cpu"], "--remote runs the call on a Ray"),
    ],
)
def test_hints_speak_the_command_lines_options(
    cli: Cli,
    write: Callable[[str, str], Path],
    monkeypatch: pytest.MonkeyPatch,
    options: list[str],
    hint: str,
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPU, whatever the machine has
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    write("quick.py", "print('done')\n")
    done = cli("run", *options, "quick.py", timeout=60)
    assert done.returncode == 2, done.stderr
    assert hint in done.stderr
    assert "gpu_type=" not in done.stderr and "remote=True" not in done.stderr


def test_runs_cancel_of_a_foreground_run_says_and_records_a_cancel(
    cli: Cli, write: Callable[[str, str], Path], tmp_path: Path
) -> None:
    write("sleeps.py", "import time\nprint('ready', flush=True)\ntime.sleep(300)\n")
    command = [*COMMAND, "run", "--gpus", "1", "--gpu-type", "cpu", "--output", "all"]
    proc = subprocess.Popen(
        [*command, "sleeps.py"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # bounded by the Popen.wait below if the run never starts
            if line.endswith("] ready\n"):
                break
        run_id = _record(tmp_path)["run_id"]
        # the run's process is this test's child, not reaped until proc.wait below: the cancel
        # sees it end all the same (it waited 30 s for the reaping before)
        cancelled = cli("runs", "cancel", run_id, timeout=20)
        assert cancelled.stdout.strip() == f"{run_id}: cancelled", cancelled.stderr
        assert proc.wait(timeout=60) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    said = proc.stderr.read() if proc.stderr else ""
    assert f"run {run_id} cancelled by SIGTERM (`serverless-gpu runs cancel`" in said, said
    record = _record(tmp_path)
    assert record["status"] == "cancelled" and "KeyboardInterrupt" not in record["message"]
