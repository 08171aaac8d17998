"""A caller that exits right after a tracked call still leaves the run complete in MLflow:
FINISHED (or FAILED) with every metric its ranks logged, although the run's end and its
metrics are written behind the call, by a thread (the exit handler sees them through)."""

from __future__ import annotations

import os
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import tracking_fns
from mlflow import MlflowClient
from mlflow.entities import Run
from procs import run_script
from tracking_checks import rank_key

from serverless_gpu import distributed
from serverless_gpu.wire.events import RankFinished, RankState

HERE = Path(__file__).resolve().parent
STEPS = 200

_CALLER = """
import sys
sys.path[:0] = [{here!r}, {tests!r}]
import tracking_fns
from serverless_gpu import distributed

exit_how = sys.argv[1]
fn = distributed(gpus=2, gpu_type="cpu", timeout=300, output="none")
if exit_how == "fail":
    try:
        fn(tracking_fns.log_points_then_fail).distributed({steps}, {fill}, sys.argv[2])
    except ValueError:
        print("failed as planned", flush=True)
else:
    fn(tracking_fns.log_points).distributed({steps})
    print("returned", flush=True)
    if exit_how == "sys.exit":
        sys.exit(0)
"""


FILL = 2_000
"""Points rank 0 logs last in the failing call, all held back (a long flush interval, fewer
than wake the flusher early)."""


# "fail": rank 1 raises while rank 0 still runs, every point it logged still held back (a long
# flush interval): the stop that rank 1's failure brings lets rank 0 send them first.
@pytest.mark.parametrize("exit_how", ["end", "sys.exit", "fail"])
def test_a_caller_exiting_at_once_after_a_call_leaves_its_run_complete(
    exit_how: str,
    embedded: MlflowClient,
    experiment_runs: Callable[[MlflowClient], list[Run]],
    tmp_path: Path,
) -> None:
    env = {**os.environ, "MLFLOW_TRACKING_URI": embedded.tracking_uri}
    if exit_how == "fail":
        env["SERVERLESS_GPU_MLFLOW_FLUSH_INTERVAL"] = "3600"
    code = textwrap.dedent(
        _CALLER.format(here=str(HERE), tests=str(HERE.parent), steps=STEPS, fill=FILL)
    )
    marker = str(tmp_path / "rank0-returned")
    done = run_script(code, exit_how, marker, env=env, cwd=tmp_path, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    [run] = experiment_runs(embedded)
    assert run.info.status == ("FAILED" if exit_how == "fail" else "FINISHED")
    assert run.data.tags["serverless_gpu.status"] == (
        "failed" if exit_how == "fail" else "succeeded"
    )
    for rank in range(2):
        history = embedded.get_metric_history(run.info.run_id, rank_key(rank, "loss"))
        points = sorted((m.step, m.value) for m in history)
        assert points == [(s, float(rank * 1_000_000 + s)) for s in range(STEPS)]
        assert run.data.metrics[f"rank_{rank}/done"] == 1.0
    if exit_how == "fail":
        fill = embedded.get_metric_history(run.info.run_id, rank_key(0, "fill"))
        assert sorted(m.step for m in fill) == list(range(FILL))
    assert run.data.params["lr"] == "0.1"
    logs = {a.path for a in embedded.list_artifacts(run.info.run_id, "logs")}
    assert logs == {"logs/rank_0.txt", "logs/rank_1.txt"}


def test_a_rank_stopped_inside_c_code_sends_its_points_and_ends_by_sigterm_at_once(
    embedded: MlflowClient,
    experiment_runs: Callable[[MlflowClient], list[Run]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rank 0 is in a long matrix product (C code: Python runs no signal handler there) when
    rank 2's failure stops the run: it still sends every point it held back, and it ends by
    the launcher's SIGTERM, not by the SIGKILL that follows a second later."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", embedded.tracking_uri)
    monkeypatch.setenv("SERVERLESS_GPU_MLFLOW_FLUSH_INTERVAL", "3600")
    fn = distributed(gpus=3, gpu_type="cpu", timeout=300, output="none")
    handle = fn(tracking_fns.points_then_stopped_in_c).start(STEPS, str(tmp_path / "marker"))
    seen: list[Any] = []
    handle.subscribe(seen.append)
    with pytest.raises(ValueError, match="rank 2 gave up"):
        handle.result()
    ends = {e.rank: e for e in seen if isinstance(e, RankFinished)}
    assert (ends[0].state, ends[0].signal_name) == (RankState.STOPPED, "SIGTERM")
    [run] = experiment_runs(embedded)
    for rank in range(3):
        history = embedded.get_metric_history(run.info.run_id, rank_key(rank, "loss"))
        assert sorted(m.step for m in history) == list(range(STEPS)), rank
