"""Functions the tracking tests run in every rank, with plain MLflow calls only.

They live in their own module so that ranks unpickle them by reference without importing the
test modules.
"""

from __future__ import annotations

import os
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path


def _rank() -> int:
    from serverless_gpu.runtime import get_global_rank

    return get_global_rank()


def log_points(steps: int) -> float:
    """``steps`` points of "loss" (distinct per rank), a param, a tag; ms per log_metric call."""
    import mlflow

    rank = _rank()
    mlflow.log_metric("loss", float(rank * 1_000_000), step=0)  # first call: validation, thread
    start = time.perf_counter()
    for step in range(1, steps):
        mlflow.log_metric("loss", float(rank * 1_000_000 + step), step=step)
    per_call_ms = (time.perf_counter() - start) / max(steps - 1, 1) * 1e3
    mlflow.log_metrics({f"rank_{rank}/done": 1.0, "shared/steps": float(steps)}, step=steps)
    mlflow.log_param("lr", 0.1)
    mlflow.set_tag(f"from_rank_{rank}", "yes")
    print(f"rank {rank} logged {steps} points")
    return per_call_ms


def log_and_watch_log_upload(steps: int, wait_s: float) -> bool:
    """Log points; rank 0 also waits until its own log shows up as an artifact mid-run."""
    import mlflow

    log_points(steps)
    if _rank() != 0:
        return True
    client = mlflow.MlflowClient()
    run_id = os.environ["SERVERLESS_GPU_MLFLOW_RUN_ID"]
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if any(a.path == "logs/rank_0.txt" for a in client.list_artifacts(run_id, "logs")):
            return True
        time.sleep(0.2)
    return False


def log_points_and_a_file(steps: int, directory: str) -> float:
    """``log_points``, plus one artifact per rank under ``notes/`` through plain MLflow."""
    import mlflow

    per_call_ms = log_points(steps)
    path = Path(directory) / f"note_{_rank()}.txt"
    path.write_text(f"rank {_rank()}\n")
    mlflow.log_artifact(str(path), artifact_path="notes")
    return per_call_ms


def log_points_then_fail(steps: int, fill: int, marker: str) -> None:
    """``log_points``, and rank 0 ``fill`` points more (of "fill"); then rank 1 raises while
    rank 0 still runs (it waits to be stopped), its points not yet sent."""
    import threading

    import mlflow

    log_points(steps)
    if _rank() == 0:
        for step in range(fill):
            mlflow.log_metric("fill", float(step), step=step)
        Path(marker).write_text("logged")
        threading.Event().wait(60)  # stopped by the launcher once rank 1 fails
        return
    from eventually import eventually  # tests/: on the caller's path, which the ranks take

    eventually(Path(marker).exists, "rank 0 logged", timeout=60)
    raise ValueError("rank 1 gave up after logging")


def fail_on_rank_1(how: str) -> None:
    if how == "raise":  # the other cases skip MLflow's ~3 s import, to keep the tests short
        import mlflow

        mlflow.log_metric("before_failure", 1.0)
    if _rank() != 1:
        time.sleep(60)  # stopped by the launcher once rank 1 fails
        return
    if how == "raise":
        raise ValueError("rank 1 gave up")
    if how == "crash":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)  # "timeout": outlive the call's timeout


def sleep_until_stopped(marker: str) -> None:
    """Tell the test that the ranks run (rank 0), then wait to be stopped."""
    if _rank() == 0:
        Path(marker).write_text("running")
    time.sleep(120)


def survive_server_death(marker: str, server: str, steps: int) -> int:
    """Log, let the test kill the server, log again once it is gone; rank 0 coordinates."""
    import mlflow

    for step in range(steps):
        mlflow.log_metric("before", float(step), step=step)
    if _rank() == 0:
        time.sleep(1.0)  # let the first batches reach the server
        Path(marker).write_text("killing time")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and _answers(server):
        time.sleep(0.2)
    for step in range(steps):
        mlflow.log_metric("after", float(step), step=step)
    mlflow.log_param("p", 1)
    return _rank()


def _answers(server: str) -> bool:
    try:
        with urllib.request.urlopen(f"{server}/health", timeout=2):
            return True
    except (urllib.error.URLError, OSError):
        return False


def many_points(steps: int) -> float:
    """The concurrency check: ``steps`` distinct points; ms per call after the first."""
    return log_points(steps)


def no_mlflow() -> int:
    return _rank()


def points_then_stopped_in_c(steps: int, marker: str) -> None:
    """Every rank logs ``steps`` points (held back by a long flush interval); then rank 0
    multiplies two large matrices (C code, seconds long, where Python runs no signal handler),
    rank 1 waits in Python, and rank 2 raises once rank 0 is about to multiply."""
    import threading

    import torch

    log_points(steps)
    rank = _rank()
    if rank == 0:
        a = torch.randn(6000, 6000)
        Path(marker).write_text("multiplying")
        for _ in range(10):
            a = a @ a
    elif rank == 1:
        threading.Event().wait(60)
    else:
        from eventually import eventually

        eventually(Path(marker).exists, "rank 0 is about to multiply", timeout=60)
        raise ValueError("rank 2 gave up")
