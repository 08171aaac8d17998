"""The rank-side fast path, in this process: MLflow's own validation, buffering, delivery."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

import pytest
import torch
from mlflow.exceptions import MlflowException
from mlflow.tracking import fluent

from serverless_gpu.tracking import LatestMetrics
from serverless_gpu.tracking.fast_logging import FastLogging
from serverless_gpu.tracking.rank_buffer import RankBuffer
from serverless_gpu.tracking.settings import MESSAGE_KIND
from serverless_gpu.wire.events import RankMessage

RUN = "0123456789abcdef0123456789abcdef"


@pytest.fixture
def sent() -> list[dict[str, Any]]:
    return []


@pytest.fixture
def fast(sent: list[dict[str, Any]]) -> FastLogging:
    def send(kind: str, data: dict[str, Any]) -> None:
        assert kind == MESSAGE_KIND
        sent.append(data)

    return FastLogging(RankBuffer(RUN, 30.0, send), fluent)


def test_points_keep_step_and_timestamp_and_arrive_in_batches(
    fast: FastLogging, sent: list[dict[str, Any]]
) -> None:
    before = int(time.time() * 1000)
    fast.log_metric("loss", 0.5, step=3)
    fast.log_metric("loss", torch.tensor(0.25), step=4)  # converted like plain MLflow does
    fast.log_metric("acc", 1, timestamp=1234)
    fast.log_metrics({"a": 1.0, "b": 2.0}, step=7)
    assert fast.log_param("lr", 0.1) == 0.1
    fast.log_param("lr", 0.1)  # the same value again: sent once
    fast.set_tags({"phase": "train"})
    fast.buffer.close()

    [batch] = sent
    metrics = batch["metrics"]
    assert [(k, v, s) for k, v, _, s in metrics] == [
        ("loss", 0.5, 3), ("loss", 0.25, 4), ("acc", 1.0, 0), ("a", 1.0, 7), ("b", 2.0, 7),
    ]  # fmt: skip
    assert all(ts >= before for _, _, ts, _ in metrics if ts != 1234)
    assert metrics[2][2] == 1234
    assert metrics[3][2] == metrics[4][2]  # log_metrics: one timestamp for all
    assert batch["params"] == [("lr", "0.1")]
    assert batch["tags"] == [("phase", "train")]


def test_invalid_calls_raise_mlflow_errors_like_plain_mlflow(fast: FastLogging) -> None:
    with pytest.raises(MlflowException):
        fast.log_metric("bad\x00name", 1.0)
    with pytest.raises(MlflowException):
        fast.log_metric("loss", "not a number")  # type: ignore[arg-type]
    fast.log_param("lr", 0.1)
    with pytest.raises(MlflowException, match="Changing param values is not allowed"):
        fast.log_param("lr", 0.2)


def test_calls_for_another_run_are_not_buffered(fast: FastLogging) -> None:
    assert fast._ours(None) and fast._ours(RUN)
    assert not fast._ours("another-run-id")
    fast.buffer.active = False  # as in a process forked from the rank
    assert not fast._ours(None)


def test_a_call_does_not_wait_on_the_store(fast: FastLogging) -> None:
    fast.log_metric("loss", 0.0, step=0)
    n = 20000
    start = time.perf_counter()
    for step in range(n):
        fast.log_metric("loss", 0.5, step=step)
    per_call_ms = (time.perf_counter() - start) / n * 1e3
    # Not a speed claim (benchmarks/mlflow_logging.py measures that): a call that reached the
    # store would take milliseconds.
    assert per_call_ms < 1.0
    fast.buffer.close()


def test_rank_initializer_patches_mlflow_when_it_is_imported() -> None:
    script = (
        "import sys\n"
        "from serverless_gpu.rank import runtime\n"
        "from serverless_gpu.tracking import rank\n"
        "sent = []\n"
        "runtime.connect(lambda kind, data: sent.append(data))\n"
        "rank.install()\n"
        "assert 'mlflow' not in sys.modules\n"
        "import mlflow, importlib.machinery\n"
        "from mlflow.tracking import fluent\n"
        "assert mlflow.log_metric is fluent.log_metric\n"
        "assert getattr(mlflow.log_metric, '__serverless_gpu_fast__')\n"
        "assert isinstance(mlflow.__loader__, importlib.machinery.SourceFileLoader)\n"
        "mlflow.log_metric('loss', 1.5, step=2)\n"
        "runtime.run_exit_callbacks()\n"
        "assert sent[0]['metrics'][0][0:2] == ('loss', 1.5), sent\n"
        "print('ok')\n"
    )
    env = {**os.environ, "SERVERLESS_GPU_MLFLOW_RUN_ID": RUN, "MLFLOW_DISABLE_TELEMETRY": "true"}
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.stdout.strip() == "ok", out.stderr


def test_other_ranks_metrics_go_under_their_rank(sent: list[dict[str, Any]]) -> None:
    """Rank 0's metrics keep their names; rank N's go under ``rank_N/`` (one chart per rank,
    never two ranks' values interleaved under one key)."""
    sends: list[dict[str, Any]] = []
    rank1 = FastLogging(
        RankBuffer(RUN, 30.0, lambda _kind, data: sends.append(data)), fluent, rank=1
    )
    rank1.log_metric("loss", 0.5, step=1)
    rank1.log_metrics({"acc": 1.0, "rank_1/own": 2.0}, step=2)
    rank1.buffer.close()
    assert [m[0] for m in sends[0]["metrics"]] == ["rank_1/loss", "rank_1/acc", "rank_1/own"]


def test_latest_metrics_for_renderers() -> None:
    latest = LatestMetrics()

    def batch(rank: int, metrics: list[tuple[str, float, int, int]]) -> RankMessage:
        data = {"metrics": metrics, "params": [], "tags": []}
        return RankMessage("run", rank, MESSAGE_KIND, data, 0.0)

    assert latest.update(batch(0, [("loss", 0.5, 1, 3), ("loss", 0.25, 2, 4)]))
    assert not latest.update(batch(1, [("rank_1/loss", 9.0, 2, 4)]))
    assert not latest.update(RankMessage("run", 0, "other", {}, 0.0))
    assert latest.values == {"loss": (0.25, 4)}
