"""Running a job file of air's format: its ``command`` as a bash script, once for the one
node of this machine, with air's per-node environment; retried up to ``max_retries`` times.

The command starts the ranks itself (usually with ``torchrun``), so each attempt is one bash
process in a process group of its own: a timeout, Ctrl-C or SIGTERM stops the whole group
(TERM, then KILL after :data:`STOP_GRACE_S`), ranks included.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import yaml

from serverless_gpu.cli.airjob import AirJob
from serverless_gpu.cli.launch import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_TIMED_OUT
from serverless_gpu.common import settings
from serverless_gpu.common.lifetime import terminate_groups
from serverless_gpu.wire.env import free_port

STOP_GRACE_S = 10.0
"""How long the command's processes get between SIGTERM and SIGKILL."""
_POLL_S = 0.2


def node_env(job: AirJob, job_dir: Path, work: Path) -> dict[str, str]:
    """The variables air sets on each node, for node 0 of 1, plus the file's own."""
    ranks = job.compute.ranks()
    env = {
        **job.env_variables,
        "NUM_NODES": "1",
        "NODE_RANK": "0",
        "LOCAL_WORLD_SIZE": str(ranks),
        "WORLD_SIZE": str(ranks),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port(set())),
    }
    code = job.code_source_path(job_dir)
    if code is not None:
        env["CODE_SOURCE_PATH"] = str(code)
    if job.parameters is not None:
        path = work / "hyperparameters.yaml"
        path.write_text(yaml.safe_dump(job.parameters, sort_keys=False))
        env["HYPERPARAMETERS_PATH"] = str(path)
    if job.experiment_name:
        env["MLFLOW_EXPERIMENT_NAME"] = job.experiment_name
    return env


def effective(job: AirJob, job_dir: Path) -> str:
    """What ``--dry-run`` prints: the job as it would run, and the node's environment."""
    with tempfile.TemporaryDirectory(prefix="serverless-gpu-air-") as work:
        env = node_env(job, job_dir, Path(work))
    env.pop("MASTER_PORT")  # chosen at start
    if "HYPERPARAMETERS_PATH" in env:
        env["HYPERPARAMETERS_PATH"] = "<a file holding the parameters>"
    shown = {"job": job.model_dump(exclude_none=True), "node environment": env}
    return yaml.dump(shown, Dumper=_Dumper, sort_keys=False)


class _Dumper(yaml.SafeDumper):
    """Writes a multi-line string (the command) as a block, as it reads in the file."""


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _text)


def say_ignored(job: AirJob) -> None:
    """One line per platform-only key the file sets."""
    for name in job.ignored():
        _say(f"{name} is ignored here (it configures the vendor's platform)")


def run_air_job(job: AirJob, job_dir: Path) -> int:
    """Run the job's command, retried on failure; the exit status, as for our own files."""
    say_ignored(job)
    with tempfile.TemporaryDirectory(prefix="serverless-gpu-air-") as work:
        env = {**os.environ, **node_env(job, job_dir, Path(work))}
        for attempt in range(job.max_retries + 1):
            code = _attempt(job, env, attempt)
            if code in (0, EXIT_TIMED_OUT, EXIT_INTERRUPTED) or attempt == job.max_retries:
                return code
            env["MASTER_PORT"] = str(free_port({int(env["MASTER_PORT"])}))
            _say(f"attempt {attempt} failed; retry {attempt + 1} of {job.max_retries}")
    return EXIT_FAILED  # not reached: max_retries >= 0


def _attempt(job: AirJob, env: dict[str, str], attempt: int) -> int:
    run = _MlflowRun.start(job, env)
    code = EXIT_INTERRUPTED
    try:
        # runtime.attempt() in the ranks reads it, as in a retried decorated call
        code = _run_command(job, {**env, **run.env, settings.ATTEMPT.name: str(attempt)})
    finally:
        run.end(code)
    return code


def _run_command(job: AirJob, env: dict[str, str]) -> int:
    # SIGTERM is a cancel from before the command starts, so that none escapes unstopped.
    with _term_as_interrupt():
        proc = subprocess.Popen(["bash", "-c", job.command], env=env, start_new_session=True)
        try:
            code = _wait(proc, job.timeout_minutes)
        except KeyboardInterrupt as exc:
            _say(f"the command stopped: {str(exc) or 'interrupted (Ctrl-C)'}")
            code = EXIT_INTERRUPTED
        finally:
            terminate_groups([proc.pid], STOP_GRACE_S, reap=proc.poll)
            proc.wait(STOP_GRACE_S)
    if code == 0 and proc.returncode != 0:
        _say(f"the command failed with exit status {proc.returncode}")
        return EXIT_FAILED
    return code


def _wait(proc: subprocess.Popen[bytes], timeout_minutes: float | None) -> int:
    """0 once the command has ended, :data:`EXIT_TIMED_OUT` when its time is up first."""
    deadline = None if timeout_minutes is None else time.monotonic() + timeout_minutes * 60
    while proc.poll() is None:
        if deadline is not None and time.monotonic() > deadline:
            _say(f"the command timed out after {timeout_minutes:g} minutes")
            return EXIT_TIMED_OUT
        time.sleep(_POLL_S)
    return 0


@contextlib.contextmanager
def _term_as_interrupt() -> Iterator[None]:
    def on_term(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt("cancelled by SIGTERM")

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class _MlflowRun:
    """The attempt's MLflow run (air: each retry is a new run), named ``mlflow_run_name``, else
    after its experiment as air names it; the command gets its id as ``MLFLOW_RUN_ID``. None
    without MLflow installed."""

    def __init__(self, client: Any = None, run_id: str = "") -> None:
        self.client, self.run_id = client, run_id
        self.env = {"MLFLOW_RUN_ID": run_id} if run_id else {}

    @classmethod
    def start(cls, job: AirJob, env: dict[str, str]) -> _MlflowRun:
        try:
            import mlflow

            from serverless_gpu.tracking.store import reachable
        except ImportError:
            return cls()
        uri = env.get("MLFLOW_TRACKING_URI") or mlflow.get_tracking_uri()
        if not reachable(uri):  # MLflow would retry for minutes before the command starts
            _say(f"the MLflow server {uri} does not answer: this attempt is not tracked")
            return cls()
        client = mlflow.MlflowClient(uri)
        name = env.get("MLFLOW_EXPERIMENT_NAME") or "Default"
        experiment = client.get_experiment_by_name(name)
        experiment_id = experiment.experiment_id if experiment else client.create_experiment(name)
        # air names a run without mlflow_run_name after its experiment
        run_name = job.mlflow_run_name or job.experiment_name or env.get("MLFLOW_EXPERIMENT_NAME")
        run = client.create_run(experiment_id, run_name=run_name)
        _say(f"MLflow run {run.info.run_id} in experiment {name!r}")
        return cls(client, run.info.run_id)

    def end(self, code: int) -> None:
        if self.client is None:
            return
        status = {0: "FINISHED", EXIT_INTERRUPTED: "KILLED"}.get(code, "FAILED")
        self.client.set_terminated(self.run_id, status)


def _say(text: str) -> None:
    print(f"serverless-gpu: {text}", file=sys.stderr, flush=True)
