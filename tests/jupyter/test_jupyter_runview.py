"""The run as renderers word it: states users use, one error wording, progress, all ranks."""

from __future__ import annotations

from pathlib import Path

import pytest

from jupyter_ext import progress
from jupyter_ext.formatting import rank_status, status_words, summary_rows
from jupyter_ext.html_view import header_html, merged_lines_html, rank_status_html, record_html
from jupyter_ext.metrics import data_wait_text, metrics_text
from jupyter_ext.runstate import RunView
from serverless_gpu.caller.hooks import RunContext
from serverless_gpu.common.errors import FailureKind, RankFailure
from serverless_gpu.common.gpus import GPUType, Placement
from serverless_gpu.tracking.settings import MESSAGE_KIND
from serverless_gpu.wire.config import DistributedConfig
from serverless_gpu.wire.events import (
    OutputLines,
    RankFinished,
    RankMessage,
    RankStarted,
    RankState,
    RunFinished,
    RunStarted,
    RunStatus,
)
from serverless_gpu.wire.runpaths import RunPaths
from serverless_gpu.wire.runspec import RunSpec

RUN = "r1"


def _view(tmp_path: Path, ranks: int = 2, tracking: bool = True) -> RunView:
    placement = Placement(ranks, "cpu", GPUType.parse("cpu"), ())
    config = DistributedConfig(gpu_type="cpu", timeout=None, tracking=tracking)
    ctx = RunContext(RunSpec(RUN, "train", placement, RunPaths(tmp_path), config))
    return RunView(ctx)


def _start(view: RunView) -> None:
    view.apply(RunStarted(RUN, "train", len(view.ranks), "cpu", "cpu", (), view.run_dir, None, 1))
    for rank in view.ranks:
        view.apply(RankStarted(RUN, rank.rank, 100 + rank.rank, 2.0))


def _killed(rank: int) -> RankFinished:
    return RankFinished(RUN, rank, RankState.STOPPED, -15, "SIGTERM", 5.0)


def test_a_peer_stopped_for_a_failure_says_which_rank_failed(tmp_path: Path) -> None:
    view = _view(tmp_path, ranks=3)
    _start(view)
    view.apply(RankFinished(RUN, 1, RankState.FAILED, 1, None, 4.0, "ValueError: bad value"))
    view.apply(_killed(0))
    assert "SIGTERM" not in rank_status(view.ranks[0])  # not yet known why: no signal words
    view.apply(_killed(2))
    failure = RankFailure.reported(1, 4.0, FailureKind.RAISED, "ValueError", "bad value")
    view.apply(RunFinished.rank_failed(RUN, (failure,), (0, 2), 6.0))
    rows = [(rank, state, outcome) for rank, state, _time, outcome in summary_rows(view)]
    assert rows == [
        ("0", "stopped", "rank 1 failed"),
        ("1", "failed", "ValueError: bad value"),
        ("2", "stopped", "rank 1 failed"),
    ]


def test_a_crash_is_worded_like_a_raise(tmp_path: Path) -> None:
    view = _view(tmp_path)
    _start(view)
    view.apply(RankFinished(RUN, 0, RankState.STOPPED, -9, "SIGKILL", 4.0))
    view.apply(_killed(1))
    crash = RankFailure.of_exit(0, 4.0, -9)
    view.apply(RunFinished.rank_failed(RUN, (crash,), (1,), 5.0))
    rows = [(state, outcome) for _rank, state, _time, outcome in summary_rows(view)]
    assert rows == [("failed", "was killed by SIGKILL"), ("stopped", "rank 0 failed")]


@pytest.mark.parametrize(
    ("status", "words"),
    [
        (RunStatus.CANCELLED, ("cancelled", "")),
        (RunStatus.TIMED_OUT, ("stopped", "the run timed out")),
    ],
)
def test_ranks_stopped_by_a_cancel_or_a_timeout(
    tmp_path: Path, status: RunStatus, words: tuple[str, str]
) -> None:
    view = _view(tmp_path)
    _start(view)
    view.apply(_killed(0))
    view.apply(_killed(1))
    view.apply(RunFinished.stopped(RUN, status, "", (0, 1), 6.0))
    assert {(rank.state, rank.detail) for rank in view.ranks} == {words}


def test_starting_names_what_the_run_waits_for(tmp_path: Path) -> None:
    view = _view(tmp_path)
    assert status_words(view) == "starting (MLflow run)"
    assert status_words(_view(tmp_path, tracking=False)) == "starting (launcher)"
    view.apply(RunStarted(RUN, "train", 2, "cpu", "cpu", (), tmp_path, None, view.started + 3))
    assert status_words(view) == "starting (ranks)"
    view.apply(RankStarted(RUN, 0, 100, view.started + 4))
    assert status_words(view) == "running"
    assert view.elapsed(view.started + 5) == 5  # the clock counts from the call


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("train:  40%|####      | 12/30 [00:03<00:04, 4.0it/s]", "40% (12/30)"),
        ("\x1b[32mepoch 2\x1b[0m: 100%|██████████| 1.2k/1.2k [00:01<00:00]", "100% (1.2k/1.2k)"),
        ("loss 0.5 at step 12/30", None),
        ("accuracy 97% on 3 classes", None),
    ],
)
def test_progress_bars_are_read_from_tqdm_lines(line: str, expected: str | None) -> None:
    found = progress.parse(line)
    assert (str(found) if found else None) == expected


def test_the_merged_progress_line_names_the_straggler(tmp_path: Path) -> None:
    view = _view(tmp_path, ranks=3)
    _start(view)
    for rank, done in ((0, 20), (1, 12), (2, 18)):
        bar = f"step: {done * 100 // 30}%|###   | {done}/30 [00:01<00:01]\r"
        view.apply(OutputLines(RUN, rank, "stderr", (bar,), 3.0))
    assert view.progress_line() == "slowest rank 1 at 40% (12/30), fastest rank 0 at 66% (20/30)"
    assert rank_status(view.ranks[1]) == "rank 1 \u00b7 running \u00b7 40% (12/30)"
    for rank, done in ((0, 1010), (1, 1003), (2, 1007)):  # a long bar: one percentage for all
        view.apply(OutputLines(RUN, rank, "stderr", (f"1%| | {done}/100000 [00:01]\r",), 4.0))
    assert view.progress_line() == (
        "slowest rank 1 at 1% (1003/100000), fastest rank 0 at 1% (1010/100000)"
    )


def test_all_ranks_view_interleaves_lines_with_rank_prefixes(tmp_path: Path) -> None:
    view = _view(tmp_path)
    _start(view)
    view.apply(OutputLines(RUN, 0, "stdout", ("a0\n", "a1\n"), 3.0))
    view.apply(OutputLines(RUN, 1, "stdout", ("b0\n", "partial"), 3.1))
    view.apply(OutputLines(RUN, 0, "stdout", ("a2\n",), 3.2))
    text = merged_lines_html(view)
    lines = [line.split("</span> ", 1) for line in text.strip().split("\n")]
    assert [(p[0][-8:], p[1]) for p in lines] == [
        ("[rank 0]", "a0"),
        ("[rank 0]", "a1"),
        ("[rank 1]", "b0"),
        ("[rank 0]", "a2"),
        ("[rank 1]", "partial"),  # the line being drawn (a progress bar) comes last
    ]
    status = rank_status_html(view)
    assert "<code>a2</code>" in status and "<code>partial</code>" in status  # each last line


def _metrics(rank: int, *points: tuple[str, float, int]) -> RankMessage:
    batch = {"metrics": [(k, v, 0, step) for k, v, step in points], "params": [], "tags": []}
    return RankMessage(RUN, rank, MESSAGE_KIND, batch, 3.0)


def test_the_header_shows_rank_0s_latest_metrics(tmp_path: Path) -> None:
    view = _view(tmp_path)
    _start(view)
    view.apply(_metrics(1, ("rank_1/loss", 9.0, 50)))  # other ranks' are theirs, not the run's
    assert "sgpu-metrics" not in header_html(view)
    view.apply(_metrics(0, ("lr", 0.001, 10), ("loss", 0.51234, 10), ("loss", 0.41234, 11)))
    assert metrics_text(view.metrics) == "step 11 \u00b7 loss 0.4123 \u00b7 lr 0.001"
    assert metrics_text(view.metrics) in header_html(view)
    view.apply(RunFinished.succeeded(RUN, 9.0))
    assert metrics_text(view.metrics) in record_html(view)  # the record keeps them


def _waits(rank: int, share: float, at_s: float) -> RankMessage:
    key = "dataloader/wait_fraction" if rank == 0 else f"rank_{rank}/dataloader/wait_fraction"
    batch = {"metrics": [(key, share, int(at_s * 1000), 10)], "params": [], "tags": []}
    return RankMessage(RUN, rank, MESSAGE_KIND, batch, 3.0)


def test_the_header_says_when_the_run_waits_on_data_and_which_rank_most(tmp_path: Path) -> None:
    view = _view(tmp_path, ranks=3)
    _start(view)
    view.apply(_waits(0, 0.05, 100.0))
    view.apply(_waits(1, 0.10, 100.0))
    assert "waiting on data" not in header_html(view)  # below the data-bound share
    view.apply(_waits(2, 0.99, 100.0))  # an old window: more than a minute before the newest
    for rank, share in ((0, 0.2), (1, 0.74), (2, 0.2)):
        view.apply(_waits(rank, share, 170.0))
    assert data_wait_text(view.metrics) == "waiting on data 38 % of the last minute, rank 1 slowest"
    assert data_wait_text(view.metrics) in header_html(view)

    alone = _view(tmp_path, ranks=1)
    _start(alone)
    alone.apply(_waits(0, 0.5, 100.0))
    assert data_wait_text(alone.metrics) == "waiting on data 50 % of the last minute"
