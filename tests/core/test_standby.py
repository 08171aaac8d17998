"""Standby ranks: made between calls, never while one runs, one set per shape asked for."""

from __future__ import annotations

import contextlib
import time

import psutil
import pytest

import serverless_gpu
from serverless_gpu import distributed, runtime
from serverless_gpu.common.proctitle import is_launcher

# The tests count the standby ranks one launcher makes: each starts with a launcher of its own.
pytestmark = pytest.mark.fresh_launcher


def _launcher() -> psutil.Process:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for proc in psutil.Process().children():
            if is_launcher(proc.cmdline()):
                return proc
        time.sleep(0.05)
    raise AssertionError("no launcher process started")


def _ranks(launcher: psutil.Process) -> set[int]:
    """The launcher's live children (a call's ranks exit after its results are back)."""
    live = set()
    for child in launcher.children():
        with contextlib.suppress(psutil.NoSuchProcess):
            if child.status() != psutil.STATUS_ZOMBIE:
                live.add(child.pid)
    return live


def _wait_ranks(launcher: psutil.Process, count: int, timeout: float = 30) -> set[int]:
    deadline = time.monotonic() + timeout
    while len(ranks := _ranks(launcher)) != count:
        assert time.monotonic() < deadline, f"{len(ranks)} rank processes, expected {count}"
        time.sleep(0.05)
    return ranks


def test_no_standby_ranks_are_made_while_a_call_runs() -> None:
    @distributed(gpus=2, output="none", tracking=False)
    def hold(seconds: float) -> int:
        time.sleep(seconds)
        return runtime.get_global_rank()

    launcher = _launcher()
    standby = _wait_ranks(launcher, 2)  # the decoration's warm-up: one set for 2 ranks
    handle = hold.start(3.0)
    serverless_gpu.warm_up(gpus=3, gpu_type="cpu")  # another shape, asked for mid-call
    deadline = time.monotonic() + 2.5
    while time.monotonic() < deadline:
        # Only the call's own ranks (the standby set it took): nothing new while it runs.
        assert _ranks(launcher) <= standby
        time.sleep(0.05)
    assert handle.result() == [0, 1]
    # After the call: a fresh set for each shape asked for, 2 + 3 processes, none reused.
    after = _wait_ranks(launcher, 5)
    assert not after & standby


def test_standby_ranks_of_other_shapes_make_room_for_a_call() -> None:
    @distributed(gpus=2, output="none", tracking=False)
    def hold(seconds: float) -> int:
        time.sleep(seconds)
        return runtime.get_global_rank()

    launcher = _launcher()
    serverless_gpu.warm_up(gpus=3, gpu_type="cpu")
    before = _wait_ranks(launcher, 5)  # a set of 2 (the decoration) and a set of 3
    handle = hold.start(3.0)
    # The call takes the set of 2; the set of 3 would sit on the devices it uses, so it goes.
    during = _wait_ranks(launcher, 2)
    assert during < before
    time.sleep(1.0)
    assert _ranks(launcher) == during  # and nothing new appears while the call runs
    assert handle.result() == [0, 1]
    after = _wait_ranks(launcher, 5)  # both shapes ready again, fresh processes
    assert not after & before


def test_standby_is_kept_for_the_two_latest_shapes() -> None:
    @distributed(gpus=1, output="none", tracking=False)
    def one() -> int:
        return runtime.get_global_rank()

    launcher = _launcher()
    _wait_ranks(launcher, 1)
    serverless_gpu.warm_up(gpus=2, gpu_type="cpu")
    _wait_ranks(launcher, 3)
    serverless_gpu.warm_up(gpus=3, gpu_type="cpu")
    _wait_ranks(launcher, 5)  # the shapes 2 and 3; the set of 1, least recently used, went
    time.sleep(1.0)
    assert len(_ranks(launcher)) == 5
    assert one.distributed() == [0]  # from freshly forked ranks
    _wait_ranks(launcher, 4)  # its call made the shape 1 recent again: the shapes 1 and 3
