"""The runs table of ``fn.map`` / ``sweep``: its model and drawing (``table_view``, sparklines),
and the live table on real runs made from this process, up to the record it leaves."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from eventually import eventually

from jupyter_ext import run_table
from jupyter_ext.sparkline import MetricTrail, best_index, key_metric, sparkline_svg
from jupyter_ext.table_view import (
    TableState,
    TrialLine,
    record_html,
    short_param,
    short_value,
    table_html,
    table_text,
)
from jupyter_ext.widget import WidgetRenderer
from serverless_gpu import distributed
from serverless_gpu.caller import hooks
from serverless_gpu.caller.hooks import RunContext
from serverless_gpu.tracking.settings import MESSAGE_KIND
from serverless_gpu.wire.events import RankMessage

LINK = "http://127.0.0.1:5000/#/experiments/1/runs/"


def _line(trial: int, **fields: object) -> TrialLine:
    values: dict[str, object] = {
        "trial": trial,
        "params": {"lr": "0.001", "layers": "2"},
        "status": "succeeded",
        "finished": True,
        "queued": 0.5,
        "ran": 12.25,
    }
    values.update(fields)
    return TrialLine(**values)  # type: ignore[arg-type]


def _cells(html: str, trial: int) -> list[str]:
    row = re.search(rf'<tr class="sgpu-trial-row" data-trial="{trial}".*?</tr>', html)
    assert row is not None, html
    return [re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row.group())]


def test_values_are_rounded_for_reading() -> None:
    assert short_value(3.2344765096247365e-16) == "3.234e-16"
    assert short_value(2 / 3) == "0.6667"
    assert short_value(12) == "12" and short_value(True) == "True"
    assert short_value([0.1234567, 2, 3, 4, 5]) == "[0.1235, 2, 3, 4, \u2026]"
    assert short_value({"loss": 0.123456}) == "{loss: 0.1235}"
    assert short_value("x" * 200).endswith("\u2026") and len(short_value("x" * 200)) == 80
    assert short_param("0.0010000000000000002") == "0.001"
    assert short_param("3") == "3" and short_param("'adam'") == "'adam'"


def test_columns_by_parameter_name_with_queue_and_run_time_apart() -> None:
    state = TableState(
        "fit",
        (
            _line(0, link=LINK + "a"),
            _line(1, params={"lr": "0.1"}, status="failed", outcome="rank 0 raised ValueError: x"),
        ),
    )
    assert state.columns() == [
        "trial",
        "lr",
        "layers",
        "status",
        "queued",
        "run time",
        "result / error",
        "MLflow",
    ]
    html = table_html(state)
    assert _cells(html, 0)[:6] == ["0", "0.001", "2", "succeeded", "0.5 s", "12.2 s"]
    assert _cells(html, 1)[2] == "" and "ValueError: x" in _cells(html, 1)[6]
    assert f'href="{LINK}a"' in html and "<button" not in html  # the record: no controls
    text = table_text(state).splitlines()
    assert text[0] == "fit: 2 trials: 1 succeeded, 1 failed"
    column = text[1].index("status")  # each value starts under its header
    assert text[2][column:].startswith("succeeded") and text[3][column:].startswith("failed")


def test_live_table_arms_cancel_only_for_unfinished_trials() -> None:
    running = _line(1, status="running", finished=False, ran=None, outcome="42% (21/50)")
    state = TableState("fit", (_line(0), running, _line(2, status="cancelling", finished=False)))
    html = table_html(state, live=True, open_trial=1)
    buttons = re.findall(r'<button class="sgpu-cancel-trial"[^>]*>[^<]*</button>', html)
    assert ["disabled" in b for b in buttons] == [True, False, True], buttons
    assert buttons[2].endswith(">Cancelling\u2026</button>")
    assert 'aria-expanded="true">hide</button>' in html  # trial 1's details are open
    assert html.count('class="sgpu-sort"') == len(state.columns())
    assert not state.ended and TableState("fit", (_line(0),)).ended


def test_key_metric_sparkline_and_best_trial() -> None:
    assert key_metric(["lr", "val_loss", "loss"]) == "val_loss"
    assert key_metric(["accuracy", "lr"]) == "accuracy" and key_metric([]) == ""
    assert best_index([0.5, 0.2, None], "loss") == 1
    assert best_index([0.5, 0.9, None], "accuracy") == 1 and best_index([None], "x") is None
    lines = tuple(
        _line(i, metric=last, history=(1.0, 0.6, last)) for i, last in enumerate((0.4, 0.25, 0.3))
    )
    state = TableState("fit", lines, metric="loss")
    assert state.best == 1 and state.columns()[6] == "loss"
    html = table_html(state)
    assert html.count("<svg") == 3 and html.count('data-best="true"') == 1
    assert 'data-trial="1" data-status="succeeded" data-best="true"' in html
    assert _cells(html, 1)[0] == "1 \u2605" and "best" in _cells(html, 1)[6]
    assert table_text(state).splitlines()[3].startswith("1 \u2605")
    svg = sparkline_svg([3.0, 1.0, 2.0], width=40, height=10, label="loss")
    points = re.search(r'points="([^"]+)"', svg)
    assert points is not None and len(points.group(1).split()) == 3
    assert 'aria-label="loss"' in svg and sparkline_svg([]) == ""
    flat = sparkline_svg([1.0, 1.0 - 3e-16, 1.0 - 6e-16, 1.0], height=10)  # rounding only
    ys = {xy.split(",")[1] for xy in re.findall(r'points="([^"]+)"', flat)[0].split()}
    assert ys == {"5.0"}, flat
    assert 'points="2.0,5.0"' in sparkline_svg([0.0], height=10)


def test_metric_trail_keeps_rank_zero_points_bounded() -> None:
    trail = MetricTrail(keep=4)
    for step in range(20):
        points = [("loss", 1.0 / (step + 1), 0, step)]
        assert trail.update(RankMessage("r", 0, MESSAGE_KIND, {"metrics": points}, 0.0))
    assert not trail.update(RankMessage("r", 1, MESSAGE_KIND, {"metrics": points}, 0.0))
    assert len(trail.history["loss"]) <= 8 and trail.history["loss"][-1] == pytest.approx(0.05)
    assert trail.values["loss"] == (pytest.approx(0.05), 19)


def test_record_folds_each_trials_run_record() -> None:
    state = TableState("fit", (_line(0), _line(1)), details={0: "<p>zero</p>", 1: "<p>one</p>"})
    html = record_html(state)
    assert html.count('<details class="sgpu-trial-record"') == 2 and "<p>one</p>" in html
    assert "trial 1 &middot; lr=0.001, layers=2 &middot; succeeded" in html


# -- the live table on real runs --------------------------------------------------------------


@distributed(gpus=1, gpu_type="cpu", tracking=False, standby=False, timeout=120)
def step(seconds: float, fail: bool = False) -> float:
    import time

    time.sleep(seconds)
    if fail:
        raise ValueError("asked to fail")
    return seconds / 3


@pytest.fixture
def table(monkeypatch: pytest.MonkeyPatch) -> Iterator[run_table.RunTable]:
    """A table (not displayed) that every trial started from this process joins."""
    monkeypatch.setenv("SERVERLESS_GPU_CPU_SLOTS", "2")
    made = run_table.RunTable(show=False)

    def hook(ctx: RunContext) -> WidgetRenderer:
        ctx.display_claimed = True
        renderer = WidgetRenderer(ctx, show=False)
        made.add(ctx, renderer)
        return renderer

    hooks.register_hook(hook, order=5)
    try:
        yield made
    finally:
        hooks.unregister_hook(hook)


@pytest.mark.usefixtures("in_process")
@pytest.mark.timeout(120)
def test_table_follows_real_runs_to_its_record(table: run_table.RunTable) -> None:
    handles = step.map([(0.2,), {"seconds": 0.1, "fail": True}])
    table.follow()
    eventually(lambda: table.record, "the table's record", timeout=60)
    assert all(h.done() for h in handles) and table.table.ended  # Cancel all disarmed
    lines = table.text().splitlines()
    assert lines[0] == "step: 2 trials: 1 succeeded, 1 failed", lines
    assert lines[1].split()[:3] == ["trial", "seconds", "fail"], lines
    assert lines[2].split()[:3] == ["0", "0.2", "succeeded"] and lines[2].endswith("0.06667")
    assert "ValueError: asked to fail" in lines[3], lines
    assert handles[0].result(0) == [pytest.approx(0.2 / 3)]  # the user still gets the result


@pytest.mark.usefixtures("in_process")
@pytest.mark.timeout(120)
def test_cancel_one_then_all(table: run_table.RunTable) -> None:
    handles = step.map([(600.0,), (600.0,), (600.0,)])
    table.follow()
    table._on_message(table.table, {"type": "cancel", "trial": 1}, [])
    assert handles[1].wait(60) and handles[1].status.value == "cancelled"
    assert not table.table.ended and not table.table.cancelling_all
    table._on_message(table.table, {"type": "cancel_all"}, [])
    assert table.table.cancelling_all
    assert all(h.wait(60) for h in handles)
    eventually(lambda: table.record, "the table's record")
    assert [h.status.value for h in handles] == ["cancelled"] * 3
    assert table.table.ended and table.record.count('data-status="cancelled"') == 3


@pytest.mark.usefixtures("in_process")
@pytest.mark.timeout(120)
def test_shutdown_record_names_trials_that_never_reported_their_end(
    table: run_table.RunTable,
) -> None:
    handles = step.map([(600.0,)])
    try:
        table.shut_down(timeout=0)  # the runs go on: nothing stopped them
        assert 'data-status="unfinished"' in table.record, table.record
        assert "the kernel shut down before the run reported its end" in table.text()
    finally:
        for handle in handles:
            handle.cancel("the test is over")
            handle.wait(60)


@distributed(gpus=1, gpu_type="cpu", tracking=False, standby=False, timeout=120, max_retries=1)
def crash_first_attempt(x: int) -> int:
    import os

    from serverless_gpu import runtime

    if x == 1 and runtime.attempt() == 0:
        os._exit(3)  # a crash: retried
    return x * 10


@pytest.mark.usefixtures("in_process")
@pytest.mark.timeout(120)
def test_a_retried_trial_keeps_one_row_showing_its_last_attempt(
    table: run_table.RunTable,
) -> None:
    handles = crash_first_attempt.map([0, 1])
    table.follow()
    eventually(lambda: table.record, "the table's record", timeout=60)
    assert [list(h.result(0)) for h in handles] == [[0], [10]]
    lines = table.text().splitlines()
    assert lines[0] == "crash_first_attempt: 2 trials: 2 succeeded", lines
    assert [line.split()[:3] for line in lines[2:4]] == [
        ["0", "0", "succeeded"],
        ["1", "1", "succeeded"],
    ]
