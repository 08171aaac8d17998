"""What a run's record keeps (issue 28): how far each rank's progress bar got, the stacks and
the hang warning, no second copy of the traceback, a result's value; and the all-ranks view of
bars being drawn, the header's sparkline, the Stacks doctor's lines and verdict."""

from __future__ import annotations

import pickle
import sysconfig
from pathlib import Path

from jupyter_ext import stacks_view
from jupyter_ext.formatting import snapshot_text, summary_text
from jupyter_ext.html_view import header_html, merged_lines_html, record_html
from jupyter_ext.runstate import RunView
from serverless_gpu.caller.hooks import RunContext
from serverless_gpu.common.describe import describe_value
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
CELL_FILE = "/tmp/ipykernel_4242/2623648678.py"
SITE = sysconfig.get_paths()["purelib"]
STDLIB = sysconfig.get_paths()["stdlib"]


def _view(tmp_path: Path, ranks: int = 2) -> RunView:
    placement = Placement(ranks, "cpu", GPUType.parse("cpu"), ())
    config = DistributedConfig(gpu_type="cpu", timeout=None, tracking=False)
    ctx = RunContext(RunSpec(RUN, "train", placement, RunPaths(tmp_path), config))
    view = RunView(ctx)
    view.apply(RunStarted(RUN, "train", ranks, "cpu", "cpu", (), view.run_dir, None, 1))
    for rank in view.ranks:
        view.apply(RankStarted(RUN, rank.rank, 100 + rank.rank, 2.0))
    return view


def _bar(done: int, total: int = 600) -> str:
    return f"\rtrain: {done * 100 // total:3d}%|#      | {done}/{total} [00:09<00:51, 10it/s]"


def _end(view: RunView, status: RunStatus) -> None:
    for rank in view.ranks:
        view.apply(RankFinished(RUN, rank.rank, RankState.STOPPED, -15, "SIGTERM", 5.0))
    view.apply(RunFinished.stopped(RUN, status, "", (0, 1), 6.0))


def test_a_cancelled_record_keeps_how_far_each_bar_got(tmp_path: Path) -> None:
    view = _view(tmp_path)
    view.apply(OutputLines(RUN, 0, "stderr", (_bar(60), _bar(90)), 3.0))
    view.apply(OutputLines(RUN, 1, "stderr", (_bar(84),), 3.0))
    _end(view, RunStatus.CANCELLED)
    record = record_html(view)
    assert "cancelled at 15 % \u00b7 90/600" in record
    assert "cancelled at 14 % \u00b7 84/600" in record
    assert "(no output)" not in record and "last 0 lines" not in record
    assert "train:  15%|#      | 90/600" in record  # the bar as it stood, in the rank's tail
    assert "progress when it ended: slowest rank 1 at 14% (84/600)" in record
    assert "cancelled at 15 % \u00b7 90/600" in summary_text(view)  # the text form too


def test_a_timed_out_record_keeps_the_bar_too(tmp_path: Path) -> None:
    view = _view(tmp_path)
    view.apply(OutputLines(RUN, 0, "stderr", (_bar(90),), 3.0))
    _end(view, RunStatus.TIMED_OUT)
    assert "the run timed out \u00b7 stopped at 15 % \u00b7 90/600" in record_html(view)


def test_the_all_ranks_view_shows_a_bar_being_drawn(tmp_path: Path) -> None:
    view = _view(tmp_path)
    view.apply(OutputLines(RUN, 1, "stderr", (_bar(30),), 3.0))
    merged = merged_lines_html(view)
    assert "(no output yet)" not in merged
    assert "[rank 1]</span> train:   5%|#      | 30/600" in merged


def test_the_record_does_not_repeat_the_traceback_shown_under_it(tmp_path: Path) -> None:
    view = _view(tmp_path)
    lines = (
        "loading\n",
        "Traceback (most recent call last):\n",
        '  File "/tmp/ipykernel_1/1.py", line 3, in step\n',
        "ValueError: bad batch\n",
    )
    view.apply(OutputLines(RUN, 1, "stderr", lines, 3.0))
    failure = RankFailure.reported(1, 4.0, FailureKind.RAISED, "ValueError", "")
    view.apply(RankFinished(RUN, 1, RankState.FAILED, 1, None, 4.0, failure.detail))
    view.apply(RunFinished.rank_failed(RUN, (failure,), (0,), 5.0))
    tail = record_html(view).split('data-rank="1"', 1)[1]
    assert "loading" in tail and "its traceback is shown under this record" in tail
    assert "Traceback (most recent call last)" not in tail and "bad batch" not in tail


def test_a_string_result_is_described_with_its_value() -> None:
    assert describe_value("42 is the answer") == "str '42 is the answer'"
    assert describe_value("x" * 100) == "str '" + "x" * 54 + "\u2026"  # 60 characters


def _metrics(value: float, step: int) -> RankMessage:
    batch = {"metrics": [("loss", value, 0, step)], "params": [], "tags": []}
    return RankMessage(RUN, 0, MESSAGE_KIND, batch, 3.0)


def test_the_header_draws_the_key_metric_as_a_sparkline(tmp_path: Path) -> None:
    view = _view(tmp_path)
    view.apply(_metrics(1.0, 1))
    assert "sgpu-sparkline" not in header_html(view)  # one point is no line
    for step, value in enumerate((0.8, 0.5, 0.4), start=2):
        view.apply(_metrics(value, step))
    header = header_html(view)
    assert '<svg class="sgpu-sparkline" role="img"' in header
    assert 'aria-label="loss over the run: from 1 to 0.4"' in header
    points = header.split('points="', 1)[1].split('"', 1)[0].split()
    assert len(points) == 4 and points[0] == "0.0,1.0" and points[-1] == "120.0,15.0"


# -- the Stacks doctor ------------------------------------------------------------------------

RANK0 = f"""Main thread 0x00007f0000000001 (most recent call first):
  File "{SITE}/torch/distributed/distributed_c10d.py", line 2501 in all_reduce
  File "{SITE}/torch/distributed/c10d_logger.py", line 81 in wrapper
  File "{CELL_FILE}", line 16 in train

Thread 0x00007f0000000002 (most recent call first):
  File "{STDLIB}/threading.py", line 331 in wait
  File "{SITE}/tqdm/_monitor.py", line 60 in run
  File "{STDLIB}/threading.py", line 1045 in _bootstrap_inner
"""
RANK1 = f"""Main thread 0x00007f0000000003 (most recent call first):
  File "{CELL_FILE}", line 9 in stuck_here
  File "{CELL_FILE}", line 14 in train
"""


def _label(filename: str) -> str | None:
    return "Cell In[7]" if filename == CELL_FILE else None


def test_stacks_name_cells_and_give_a_verdict(tmp_path: Path) -> None:
    view = _view(tmp_path)
    found = stacks_view.take({0: RANK0, 1: RANK1}, 2, view.paths, _label)
    assert found.lines == {
        0: "in all_reduce \u2190 Cell In[7], line 16",
        1: "in stuck_here \u2190 Cell In[7], line 9",
    }
    assert found.verdict.startswith(
        "rank 1 never entered the collective that rank 0 waits in (all_reduce)"
    )
    html = stacks_view.stacks_html(0, found, _label)
    assert "Cell In[7], line 16 in train" in html and "2623648678.py" not in html
    shown, folded = html.split('class="sgpu-library-threads"', 1)
    assert "_monitor.py" not in shown  # tqdm's monitor thread is folded away
    assert "1 library thread: run (tqdm/_monitor.py)" in folded


def test_the_flight_recorder_names_the_rank_that_never_entered(tmp_path: Path) -> None:
    view = _view(tmp_path)
    paths = view.paths
    paths.stacks_dir.mkdir(parents=True, exist_ok=True)
    entries = {
        0: [{"record_id": 7, "profiling_name": "gloo:all_reduce", "collective_seq_id": 5,
             "state": "scheduled"}],
        1: [{"record_id": 6, "profiling_name": "gloo:all_reduce", "collective_seq_id": 4,
             "state": "completed"}],
    }  # fmt: skip
    for rank, rows in entries.items():
        paths.flight_recorder(rank).write_bytes(pickle.dumps({"entries": rows}))
    found = stacks_view.take({0: RANK1, 1: RANK1}, 2, paths, _label)
    assert found.verdict == (
        "rank 1 never entered the collective that rank 0 waits in (gloo:all_reduce #5)"
    )
    assert found.lines[0].endswith("; last collective: gloo:all_reduce #5 (scheduled)")


def test_the_record_keeps_the_stacks_and_the_hang_warning(tmp_path: Path) -> None:
    view = _view(tmp_path)
    view.hang_warning = "rank 1 silent for 3 s (no output, metric or heartbeat)"
    view.stacks = stacks_view.take({0: RANK0}, 2, view.paths, _label)
    _end(view, RunStatus.CANCELLED)
    record = record_html(view, label=_label)
    assert "during the run: rank 1 silent for 3 s" in record
    assert "rank 0 &middot; in all_reduce \u2190 Cell In[7], line 16" in record
    assert "rank 1 &middot; did not answer" in record
    assert 'class="sgpu-record-stacks"' in record and "Cell In[7], line 16 in train" in record
    text = snapshot_text(view)  # the record's text form (nbconvert, GitHub's text view)
    assert "warning during the run: rank 1 silent for 3 s" in text
    assert "  rank 0 \u00b7 in all_reduce \u2190 Cell In[7], line 16" in text


def test_gloo_entries_left_scheduled_at_the_same_collective_give_no_verdict(
    tmp_path: Path,
) -> None:
    """gloo never marks its entries completed: ranks level with the newest are not named."""
    view = _view(tmp_path)
    paths = view.paths
    paths.stacks_dir.mkdir(parents=True, exist_ok=True)
    for rank in (0, 1):
        row = {"record_id": 3, "profiling_name": "gloo:all_reduce", "collective_seq_id": 3,
               "state": "scheduled"}  # fmt: skip
        paths.flight_recorder(rank).write_bytes(pickle.dumps({"entries": [row]}))
    assert stacks_view.take({0: RANK1, 1: RANK1}, 2, paths, _label).verdict == ""
