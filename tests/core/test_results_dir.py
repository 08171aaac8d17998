"""Result files go to a tmpfs twin of the run directory, fall back to the run directory, and
leave nothing behind."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from serverless_gpu import distributed
from serverless_gpu.runfiles.rundirs import RESULTS_DIR_ENV, RUNS_DIR_ENV, results_root


@pytest.fixture
def dirs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> tuple[Path, Path]:
    runs, results = tmp_path / "runs", tmp_path / "results"
    monkeypatch.setenv(RUNS_DIR_ENV, str(runs))
    monkeypatch.setenv(RESULTS_DIR_ENV, str(results))
    return runs, results


def _tensor_rank() -> Any:
    import torch

    return torch.full((1000,), float(os.environ["RANK"]))


def test_results_travel_through_the_twin_and_are_deleted(dirs: tuple[Path, Path]) -> None:
    runs, results = dirs

    @distributed(gpus=2, output="none", tracking=False)
    def where() -> tuple[Any, list[str]]:
        return _tensor_rank(), os.listdir(results)  # the twin exists while the call runs

    values = where.distributed()
    assert [float(t[0]) for t, _ in values] == [0.0, 1.0]
    run_dir = values.run_dir
    assert values[0][1] == [run_dir.name]
    assert not list(results.iterdir())  # deleted once loaded; the run directory stays
    assert run_dir.parent == runs and run_dir.is_dir()


def test_unusable_twin_falls_back_to_the_run_directory(dirs: tuple[Path, Path]) -> None:
    _, results = dirs

    @distributed(gpus=2, output="none", tracking=False)
    def lose_twin() -> Any:
        shutil.rmtree(results, ignore_errors=True)  # as if the tmpfs refused the write
        return _tensor_rank()

    assert [float(t[-1]) for t in lose_twin.distributed()] == [0.0, 1.0]


def test_only_twins_of_vanished_runs_are_pruned(dirs: tuple[Path, Path], tmp_path: Path) -> None:
    _, results = dirs
    # Another caller's run, in another runs directory, still live: its twin must stay.
    live_run = tmp_path / "other-runs" / "20200101-000000-fn-0123456789ab"
    live_run.mkdir(parents=True)
    twins = {name: results / name for name in ("20200101-000000-fn-deadbeef0000", live_run.name)}
    for twin, owner in zip(twins.values(), (tmp_path / "gone", live_run), strict=True):
        twin.mkdir(parents=True)
        (twin / "run_dir").symlink_to(owner)
        (twin / "result_0.pkl").write_bytes(b"x" * 1000)

    @distributed(gpus=1, output="none", tracking=False)
    def one() -> int:
        return 1

    assert one.distributed() == [1]
    assert not twins["20200101-000000-fn-deadbeef0000"].exists()
    assert (twins[live_run.name] / "result_0.pkl").exists()


def test_off_keeps_results_in_the_run_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(RESULTS_DIR_ENV, "off")
    assert results_root() is None

    @distributed(gpus=2, output="none", tracking=False)
    def ranks() -> Any:
        return _tensor_rank()

    assert [float(t[0]) for t in ranks.distributed()] == [0.0, 1.0]


def test_twin_of_a_cancelled_call_goes_even_if_nobody_asks_for_its_result(
    dirs: tuple[Path, Path],
) -> None:
    _, results = dirs

    @distributed(gpus=2, output="none", tracking=False)
    def forever() -> None:
        time.sleep(600)

    handle = forever.start()
    deadline = time.monotonic() + 30
    while not list(results.iterdir()):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    handle.cancel("test")
    assert handle.wait(30)  # as .distributed() does on KeyboardInterrupt: no result() call
    assert not list(results.iterdir())
