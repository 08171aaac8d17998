"""Runs started at once with ``fn.start()``: disjoint devices, a FIFO queue, cancel, waiting."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED
from typing import Any

import pytest

import serverless_gpu
from serverless_gpu import CancelledError, RunHandle, distributed
from serverless_gpu.wire.events import RunStatus

_WAIT_S = 60.0


@pytest.fixture(autouse=True)
def two_slots(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERVERLESS_GPU_CPU_SLOTS", "2")


@distributed(gpus=1, gpu_type="cpu", tracking=False, standby=False, timeout=120)
def span(seconds: float) -> tuple[float, float, str]:
    """When the rank ran, and the devices it was given."""
    start = time.time()
    time.sleep(seconds)
    return start, time.time(), os.environ["SERVERLESS_GPU_DEVICES"]


def _wait_for(predicate: Callable[[], bool], what: str, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, f"not within {seconds} s: {what}"
        time.sleep(0.05)


def _status(handle: RunHandle[Any]) -> RunStatus:
    handle.poll()
    return handle.status


def test_two_runs_overlap_on_disjoint_devices() -> None:
    first, second = span.start(2.0), span.start(2.0)
    (s1, e1, d1), (s2, e2, d2) = first.result(_WAIT_S)[0], second.result(_WAIT_S)[0]
    assert s2 < e1 and s1 < e2, "the runs did not overlap in time"
    assert {d1, d2} == {"0", "1"}
    # The allocation is in the handle and in the result's metadata, as the ranks saw it.
    assert first.devices == (d1,) and second.devices == (d2,)
    assert first.result().metadata["devices"] == (d1,)
    record = json.loads(first.context.paths.record.read_text())
    assert record["devices"] == [d1]


def test_third_run_waits_queued_then_starts_when_one_ends() -> None:
    handles = [span.start(1.5), span.start(1.5), span.start(0.1)]
    _wait_for(lambda: _status(handles[2]) is RunStatus.QUEUED, "the third run is queued")
    assert handles[2].devices == ()
    results = [h.result(_WAIT_S)[0] for h in handles]
    first_end = min(results[0][1], results[1][1])
    assert results[2][0] >= first_end - 0.05, "the third run started before a slot was free"
    assert results[2][2] in {results[0][2], results[1][2]}


def test_cancel_of_one_run_leaves_the_others_running() -> None:
    handles = [span.start(2.0), span.start(2.0)]
    _wait_for(lambda: all(_status(h) is RunStatus.RUNNING for h in handles), "both running")
    handles[0].cancel()
    with pytest.raises(CancelledError):
        handles[0].result(_WAIT_S)
    assert handles[1].result(_WAIT_S)[0][1] > 0
    assert handles[1].status is RunStatus.SUCCEEDED


def test_fifty_queued_runs_cancelled_leave_nothing_behind(no_leaked_children: None) -> None:
    running = [span.start(60.0), span.start(60.0)]
    queued = [span.start(0.0) for _ in range(50)]
    _wait_for(lambda: all(_status(h) is RunStatus.QUEUED for h in queued), "50 runs queued")
    for handle in queued + running:
        handle.cancel()
    for handle in queued + running:
        assert handle.wait(_WAIT_S)
        assert handle.status is RunStatus.CANCELLED
        assert not handle.context.paths.payload.exists()


def test_as_completed_yields_runs_in_the_order_they_end(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERVERLESS_GPU_CPU_SLOTS", "3")
    handles = [span.start(3.0), span.start(0.2), span.start(1.5)]
    order = [handles.index(h) for h in serverless_gpu.as_completed(handles, timeout=_WAIT_S)]
    assert order == [1, 2, 0]


def test_wait_first_completed_then_all() -> None:
    handles = [span.start(2.0), span.start(0.1)]
    done, not_done = serverless_gpu.wait(handles, timeout=_WAIT_S, return_when=FIRST_COMPLETED)
    assert done == {handles[1]} and not_done == {handles[0]}
    done, not_done = serverless_gpu.wait(handles, timeout=_WAIT_S)
    assert done == set(handles) and not not_done
