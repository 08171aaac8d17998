"""The renderers on real runs made from this process: the widget (without a frontend) and text."""

from __future__ import annotations

import html
import io
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from jupyter_helpers import pid_alive

from jupyter_ext.text_renderer import TextRenderer
from jupyter_ext.widget import WidgetRenderer
from serverless_gpu import CancelledError, distributed
from serverless_gpu.caller import hooks
from serverless_gpu.caller.hooks import RunContext

pytestmark = [pytest.mark.usefixtures("in_process"), pytest.mark.timeout(120)]
LINK = "http://mlflow.example/#/experiments/1/runs/"


@pytest.fixture
def attach() -> Iterator[Callable[[Callable[[RunContext], Any]], list[Any]]]:
    """Register a renderer factory as the run hook; returns the renderers it made."""
    registered: list[Callable[[RunContext], Any]] = []

    def add(factory: Callable[[RunContext], Any], order: int = 50) -> list[Any]:
        made: list[Any] = []

        def hook(ctx: RunContext) -> Any:
            ctx.display_claimed = True
            made.append(factory(ctx))
            return made[-1]

        hooks.register_hook(hook, order=order)
        registered.append(hook)
        return made

    yield add
    for hook in registered:
        hooks.unregister_hook(hook)


def _fake_tracking(ctx: RunContext) -> None:
    ctx.links["mlflow"] = LINK + ctx.run_id


@distributed(gpus=2, gpu_type="cpu", standby=False)
def chatty(lines: int) -> float:
    import sys

    from tqdm import tqdm

    from serverless_gpu.runtime import get_global_rank

    rank = get_global_rank()
    print(f"\x1b[32mgreen line\x1b[0m from rank {rank}")
    for _ in tqdm(range(50), desc=f"bar{rank}", mininterval=0, file=sys.stderr, ascii=True):
        pass
    started = time.perf_counter()
    for i in range(lines if rank == 0 else 3):
        print(f"rank {rank} line {i}")
    return time.perf_counter() - started


def test_widget_shows_every_rank_live(attach: Any) -> None:
    hooks.register_hook(_fake_tracking, order=10)
    try:
        made = attach(lambda ctx: WidgetRenderer(ctx, show=False))
        chatty.distributed(5)
    finally:
        hooks.unregister_hook(_fake_tracking)
    widget: WidgetRenderer = made[0]
    assert tuple(widget.tabs.titles) == ("all ranks", "rank 0 · done", "rank 1 · done")
    for rank in (0, 1):
        html = widget.outputs[rank].html
        assert f"rank {rank} line 2" in html
        assert f"rank {1 - rank} line" not in html
        assert '<span style="color:#3a3">green line</span>' in html and "\x1b" not in html
        bars = [line for line in html.split("\n") if f"bar{rank}:" in line]
        assert len(bars) == 1 and "100%" in bars[0], bars  # the bar is one line, redrawn
        assert f"</span> rank {rank} line 2\n" in widget.merged.html  # all ranks, prefixed
    assert widget.rank_status.value.count(">done<") == 2
    header = widget.header.value
    assert f'href="{LINK}{widget.view.run_id}"' in header and "MLflow run" in header
    assert f"serverless-gpu runs logs {widget.view.run_id}" in header  # no local path saved
    assert "succeeded" in widget.record and widget.cancel_button.disabled
    assert f'href="{LINK}{widget.view.run_id}"' in widget.record
    text = widget.text()
    assert "[rank 1] rank 1 line 2" in text and "run succeeded" in text


def test_widget_output_is_bounded_and_throttled(attach: Any) -> None:
    made = attach(lambda ctx: WidgetRenderer(ctx, show=False))
    updates: list[float] = []
    started = time.monotonic()

    def watch(ctx: RunContext) -> None:
        made[-1].outputs[0].observe(lambda _change: updates.append(time.monotonic()), "html")

    hooks.register_hook(watch, order=60)
    try:
        loop_times = chatty.distributed(100_000)
    finally:
        hooks.unregister_hook(watch)
    elapsed = time.monotonic() - started
    widget: WidgetRenderer = made[0]
    rank0 = widget.view.ranks[0]
    assert len(rank0.lines) == 200 and rank0.line_count > 100_000
    html = widget.outputs[0].html
    assert "rank 0 line 99999" in html and "rank 0 line 99799" not in html
    assert f"earlier lines: {widget.view.log_path(0)}" in html
    assert len(html) < 40_000
    log = widget.view.log_path(0).read_text()
    assert log.count("\n") > 100_000
    assert len(updates) <= elapsed * 4 + 8, (len(updates), elapsed)
    assert loop_times[0] < 15, loop_times  # the rank was not held back by its viewer


def test_cancel_button_stops_every_rank(attach: Any) -> None:
    made = attach(lambda ctx: WidgetRenderer(ctx, show=False))
    clicked: list[float] = []

    def click_when_running(ctx: RunContext) -> None:
        def maybe_click() -> None:
            widget: WidgetRenderer = made[-1]
            if not clicked and all(r.state == "running" for r in widget.view.ranks):
                clicked.append(time.monotonic())
                widget.cancel_button.click()

        ctx.idle_callbacks.append(maybe_click)

    @distributed(gpus=2, gpu_type="cpu", standby=False)
    def forever() -> None:
        while True:
            time.sleep(0.1)

    hooks.register_hook(click_when_running, order=60)
    try:
        with pytest.raises(CancelledError, match="cancelled from the notebook widget"):
            forever.distributed()
    finally:
        hooks.unregister_hook(click_when_running)
    assert clicked and time.monotonic() - clicked[0] < 3
    widget: WidgetRenderer = made[0]
    assert widget.view.status == "cancelled"
    assert "was cancelled" in widget.record
    assert [r.state for r in widget.view.ranks] == ["cancelled", "cancelled"]
    pids = [r.pid for r in widget.view.ranks if r.pid is not None]
    assert len(pids) == 2 and not [pid for pid in pids if pid_alive(pid)]


def test_text_renderer_reports_a_failed_run(attach: Any) -> None:
    stream = io.StringIO()
    attach(lambda ctx: TextRenderer(ctx, stream=stream))

    @distributed(gpus=2, gpu_type="cpu", standby=False)
    def fails() -> int:
        import torch.distributed as dist

        from serverless_gpu.runtime import get_global_rank, init_process_group

        print(f"rank {get_global_rank()} says hi", flush=True)
        # Rank 1 raises only once rank 0 has said hi: otherwise its failure may stop rank 0
        # before rank 0 printed anything, and the line this test reads never exists.
        init_process_group()
        dist.barrier()
        if get_global_rank() == 1:
            raise KeyError("missing shard")
        time.sleep(30)
        return 0

    with pytest.raises(KeyError, match="missing shard"):
        fails.distributed()
    text = stream.getvalue()
    assert re.search(r"serverless_gpu: .*fails on 2 x CPU \| logs: ", text), text
    assert "[rank 0] rank 0 says hi" in text
    assert "[rank 1] KeyError: 'missing shard'" in text  # stderr of every rank is shown
    assert "serverless_gpu: rank 1 failed (KeyError: 'missing shard')" in text
    assert re.search(r"run failed after [\d.]+ s: rank 1 raised KeyError: 'missing shard'", text)
    # The peer stopped because of rank 1, in those words; rank 1's error as "Type: message".
    assert re.search(r"\n  0 +stopped +[\d.]+ s +rank 1 failed\n", text), text
    assert re.search(r"\n  1 +failed +[\d.]+ s +KeyError: 'missing shard'\n", text), text
    assert "SIGTERM" not in text


@distributed(gpus=2, gpu_type="cpu", standby=False)
def one_rank_never_reduces() -> None:
    import sys

    import torch
    import torch.distributed as dist
    from tqdm import tqdm

    from serverless_gpu import runtime

    def stuck_here() -> None:
        print("rank 1 stuck", flush=True)
        time.sleep(600)

    runtime.init_process_group()
    tqdm(range(3), file=sys.stderr)  # starts tqdm's monitor thread: library code, folded away
    if runtime.get_global_rank() == 1:
        stuck_here()
    print("rank 0 reducing", flush=True)
    dist.all_reduce(torch.ones(1))


def test_stacks_give_a_line_per_rank_a_verdict_and_stay_in_the_record(attach: Any) -> None:
    made = attach(lambda ctx: WidgetRenderer(ctx, show=False))
    shown: list[str] = []  # what the all-ranks view's stacks pane showed, in order

    def stacks_then_cancel(ctx: RunContext) -> None:
        def step() -> None:
            widget: WidgetRenderer = made[-1]
            said = [widget.outputs[r].html for r in (0, 1)]
            if not shown and "rank 0 reducing" in said[0] and "rank 1 stuck" in said[1]:
                widget.stacks_summary.observe(lambda c: shown.append(c["new"]), "value")
                widget.stacks_button.click()
            elif widget.view.stacks is not None and not widget.cancel_button.disabled:
                widget.cancel_button.click()

        ctx.idle_callbacks.append(step)

    hooks.register_hook(stacks_then_cancel, order=60)
    try:
        with pytest.raises(CancelledError):
            one_rank_never_reduces.distributed()
    finally:
        hooks.unregister_hook(stacks_then_cancel)
    widget: WidgetRenderer = made[0]
    assert "taking every rank" in shown[0]  # the busy state, shown while the stacks are taken
    found = widget.view.stacks
    assert found is not None
    assert re.fullmatch(r"in all_reduce \u2190 test_renderers\.py, line \d+", found.lines[0])
    assert re.fullmatch(r"in stuck_here \u2190 test_renderers\.py, line \d+", found.lines[1])
    assert found.verdict.startswith(
        "rank 1 never entered the collective that rank 0 waits in (all_reduce)"
    ), found.verdict
    assert "rank 0 &middot; in all_reduce" in widget.stacks_summary.value  # all-ranks view
    assert "library thread" in widget.stack_boxes[1].value
    assert "tqdm" in widget.stack_boxes[1].value.split("library thread", 1)[1]
    record = html.unescape(widget.record)
    assert found.verdict in record and "in stuck_here" in record  # kept in the record
