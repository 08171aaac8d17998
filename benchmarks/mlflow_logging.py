"""Cost of ``mlflow.log_metric`` inside a rank: serverless_gpu's tracking vs plain MLflow.

    python benchmarks/mlflow_logging.py [--ranks 4] [--points 1000] [--dir DIR]

Every mode runs the same function body in every rank (``mlflow.log_metric("loss", v, step=s)``
``points`` times) against MLflow's embedded default store (``sqlite:///mlflow.db`` in a fresh
directory) and reports, side by side:

* per call: the rank's own timing of the loop, median and worst rank, in milliseconds;
* in store: points found in the store right after ``.distributed()`` returned, of those logged;
* errors: calls that raised in the ranks.

Modes: serverless_gpu's tracking (points buffered in the rank, written by the caller); plain
MLflow, synchronous; plain MLflow with ``synchronous=False`` (its async queue, flushed before the
rank returns); and the floor: MLflow's fluent API over a store that does nothing, i.e. what any
faster *store* could at best achieve. CPU ranks unless ``--gpu``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

FAKE_RUN_ID = "0" * 32


@dataclass
class Row:
    mode: str
    per_call_ms: list[float]
    stored: int | None
    expected: int
    errors: int
    wall_s: float


# -- what the ranks run (pickled by value: this file is __main__) -----------------------------


def _timed_loop(points: int, log: Callable[[int, float], object]) -> tuple[float, int]:
    from serverless_gpu.runtime import get_global_rank

    rank = get_global_rank()
    log(0, float(rank * 1_000_000))  # first call outside the timing: imports, validation
    errors = 0
    start = time.perf_counter()
    for step in range(1, points):
        try:
            log(step, float(rank * 1_000_000 + step))
        except Exception:  # counted: concurrent writers may hit "database is locked"
            errors += 1
    return (time.perf_counter() - start) / max(points - 1, 1) * 1e3, errors


def rank_ours(points: int) -> tuple[float, int]:
    import mlflow

    return _timed_loop(points, lambda s, v: mlflow.log_metric("loss", v, step=s))


def rank_plain(points: int, run_id: str, synchronous: bool) -> tuple[float, int]:
    import mlflow

    mlflow.start_run(run_id=run_id)
    result = _timed_loop(
        points, lambda s, v: mlflow.log_metric("loss", v, step=s, synchronous=synchronous)
    )
    if not synchronous:
        mlflow.flush_async_logging()  # what a rank must do before returning, to lose nothing
    return result


def rank_floor(points: int) -> tuple[float, int]:
    import mlflow
    from mlflow.tracking._tracking_service.utils import _tracking_store_registry

    store = _noop_store()
    _tracking_store_registry.register("noop", lambda store_uri=None, artifact_uri=None: store)
    mlflow.set_tracking_uri("noop://")
    mlflow.start_run(run_id=FAKE_RUN_ID)
    return _timed_loop(points, lambda s, v: mlflow.log_metric("loss", v, step=s))


def _noop_store() -> Any:
    """A tracking store that answers ``get_run`` and drops every write."""
    from mlflow.entities import LifecycleStage, Run, RunData, RunInfo
    from mlflow.store.tracking.abstract_store import AbstractStore

    info = RunInfo(
        run_id=FAKE_RUN_ID,
        experiment_id="0",
        user_id="bench",
        status="RUNNING",
        start_time=0,
        end_time=None,
        lifecycle_stage=LifecycleStage.ACTIVE,
        artifact_uri=tempfile.gettempdir(),
    )
    run = Run(info, RunData())

    class NoopStore(AbstractStore):
        # Instantiable although most of the store is left abstract: the loop calls no more.
        __abstractmethods__: frozenset[str] = frozenset()

        def get_run(self, run_id: str) -> Run:
            return run

        def update_run_info(self, *args: Any, **kwargs: Any) -> RunInfo:
            return info

        def log_metric(self, run_id: str, metric: Any) -> None:
            pass

        def log_batch(self, *args: Any, **kwargs: Any) -> None:
            pass

    store: Any = NoopStore  # abstract to a type checker, see above
    return store()


# -- the caller ----------------------------------------------------------------------------------


def measure(args: argparse.Namespace) -> list[Row]:
    import mlflow

    from serverless_gpu import distributed

    gpu_type = None if args.gpu else "cpu"
    client = mlflow.MlflowClient()
    experiment_id = client.create_experiment(f"mlflow-logging-{int(time.time())}")
    expected = args.ranks * args.points
    rows = []

    def stored(run_id: str) -> int:
        # Through our tracking, rank N's points are recorded under rank_N/loss.
        keys = ["loss"] + [f"rank_{r}/loss" for r in range(1, args.ranks)]
        return sum(len(client.get_metric_history(run_id, key)) for key in keys)

    ours = distributed(gpus=args.ranks, gpu_type=gpu_type, timeout=3600)(rank_ours)
    os.environ["MLFLOW_EXPERIMENT_ID"] = experiment_id
    start = time.perf_counter()
    result = ours.distributed(args.points)
    wall = time.perf_counter() - start
    run_id = result.metadata["mlflow_run_id"]
    rows.append(_row("ours (serverless_gpu tracking)", result, stored(run_id), expected, wall))

    plain = distributed(gpus=args.ranks, gpu_type=gpu_type, timeout=3600, tracking=False)
    for mode, synchronous in (("plain MLflow, sync", True), ("plain MLflow, async", False)):
        run_id = client.create_run(experiment_id, run_name=mode).info.run_id
        start = time.perf_counter()
        result = plain(rank_plain).distributed(args.points, run_id, synchronous)
        wall = time.perf_counter() - start
        rows.append(_row(mode, result, stored(run_id), expected, wall))
        client.set_terminated(run_id)

    start = time.perf_counter()
    result = plain(rank_floor).distributed(args.points)
    rows.append(
        _row("MLflow fluent floor (no-op store)", result, None, 0, time.perf_counter() - start)
    )
    return rows


def _row(
    mode: str, result: list[tuple[float, int]], stored: int | None, expected: int, wall: float
) -> Row:
    return Row(mode, [r[0] for r in result], stored, expected, sum(r[1] for r in result), wall)


def report(rows: list[Row], args: argparse.Namespace, where: str) -> None:
    print(
        f"\nmlflow.log_metric inside a rank: {args.ranks} ranks x {args.points} points, "
        f"embedded store {where}"
    )
    header = (
        f"{'mode':36} {'per call ms (median/worst rank)':>32} "
        f"{'in store at return':>19} {'errors':>7} {'call s':>7}"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        per_call = f"{statistics.median(row.per_call_ms):.4f} / {max(row.per_call_ms):.4f}"
        in_store = "-" if row.stored is None else f"{row.stored}/{row.expected}"
        print(f"{row.mode:36} {per_call:>32} {in_store:>19} {row.errors:>7} {row.wall_s:>7.1f}")
    print("\n(call s includes starting the ranks and their ~3 s import of mlflow)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--points", type=int, default=1000)
    parser.add_argument("--dir", help="where mlflow.db goes (default: a fresh temporary dir)")
    parser.add_argument("--gpu", action="store_true", help="GPU ranks instead of CPU ranks")
    args = parser.parse_args()
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_NAME"):
        os.environ.pop(name, None)
    where = args.dir or tempfile.mkdtemp(prefix="mlflow-logging-")
    os.makedirs(where, exist_ok=True)
    os.chdir(where)  # MLflow's default store is sqlite:///mlflow.db in the working directory
    report(measure(args), args, f"sqlite:///{where}/mlflow.db")


if __name__ == "__main__":
    main()
