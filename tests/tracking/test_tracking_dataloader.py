"""``serverless_gpu.data``'s loaders log each rank's batch timing to the call's MLflow run, and
the widget's header says when the run waits on data."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from mlflow import MlflowClient
from mlflow.entities import Run

from jupyter_ext.html_view import header_html
from jupyter_ext.runstate import RunView
from serverless_gpu import distributed
from serverless_gpu.caller import hooks
from serverless_gpu.caller.hooks import RunContext
from serverless_gpu.data.batch_timing import METRICS
from serverless_gpu.wire.events import Event, Subscriber


def read_batches() -> int:
    import torch

    from serverless_gpu.data import DataLoader

    loader = DataLoader(torch.arange(24), batch_size=4, num_workers=1)
    return sum(len(batch) for batch in loader)


def test_every_ranks_fetch_timing_lands_in_the_calls_run(
    embedded: MlflowClient, experiment_runs: Callable[[MlflowClient], list[Run]]
) -> None:
    result = distributed(gpus=2, gpu_type="cpu")(read_batches).distributed()
    assert list(result) == [24, 24]
    (run,) = experiment_runs(embedded)
    assert run.info.run_id == result.metadata["mlflow_run_id"]
    names = set(run.data.metrics)
    for name in (
        "dataloader/fetch_seconds",
        "dataloader/fetch_seconds_variance",
        "dataloader/between_next_seconds",
        "dataloader/between_next_seconds_variance",
        "dataloader/wait_fraction",
    ):
        assert {name, f"rank_1/{name}"} <= names, sorted(names)
    history = embedded.get_metric_history(run.info.run_id, "dataloader/fetch_seconds")
    assert [m.step for m in history] == [6]  # one window, at the loader's batch count
    assert history[0].value >= 0


def data_bound_on_rank_1(volume: str, cache: str) -> int:
    import time

    from serverless_gpu.data import VolumeDataset
    from serverless_gpu.runtime import get_global_rank

    rank = get_global_rank()

    def slow_read(path: str) -> str:
        time.sleep(0.05)  # rank 1's data is slow to decode
        return path

    dataset = VolumeDataset(
        volume, cache, transform=slow_read if rank == 1 else None, min_free_bytes=0
    )
    batches = 0
    for _batch in dataset.loader(batch_size=2, num_workers=0):
        if rank == 0:
            time.sleep(0.05)  # rank 0's step is slow
        batches += 1
    return batches


def test_volume_loader_waits_reach_the_run_and_the_widget_header(
    embedded: MlflowClient, experiment_runs: Callable[[MlflowClient], list[Run]], tmp_path: Path
) -> None:
    volume = tmp_path / "volume"
    volume.mkdir()
    for i in range(20):
        (volume / f"item_{i:02d}.bin").write_bytes(b"x" * 64)
    views: list[RunView] = []

    def follow(ctx: RunContext) -> Subscriber:
        """What the widget's header draws from (the widget would also start the MLflow UI)."""
        ctx.display_claimed = True
        view = RunView(ctx)
        views.append(view)

        def apply(event: Event) -> None:
            view.apply(event)

        return apply

    hooks.register_hook(follow, order=50)
    try:
        call = distributed(gpus=2, gpu_type="cpu")(data_bound_on_rank_1)
        result = call.distributed(str(volume), str(tmp_path / "cache"))
    finally:
        hooks.unregister_hook(follow)
    assert list(result) == [5, 5]
    (run,) = experiment_runs(embedded)
    metrics = run.data.metrics
    for name in METRICS:
        assert {name, f"rank_1/{name}"} <= set(metrics), sorted(metrics)
    # Rank 1 waits for its data nearly all the time, rank 0 for a small part of it.
    assert metrics["rank_1/dataloader/wait_fraction"] > 0.5 > metrics["dataloader/wait_fraction"]
    header = header_html(views[0])
    assert re.search(r"waiting on data \d+ % of the last minute, rank 1 slowest", header), header
