"""Graceful stop: Cancel asks the ranks to stop, they checkpoint and return; the next call
resumes from the checkpoint. Ranks that do not check are killed after ``stop_grace``."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from eventually import wait_for_lines
from recovery_fns import resets_signals, stops_after_unblocking_signals, train

from serverless_gpu import CancelledError, distributed
from serverless_gpu.data import checkpoint_path, is_complete

pytestmark = pytest.mark.timeout(180)


def test_cancel_with_stop_grace_checkpoints_and_the_next_call_resumes(tmp_path: Path) -> None:
    root = str(tmp_path / "ckpt")
    fn = distributed(gpus=2, stop_grace=20, tracking=False)(train)
    handle = fn.start(root, 100_000, 0.05)
    wait_for_lines(handle, "step 3", 2)
    handle.cancel()
    first = handle.result(timeout=60)  # the ranks returned: the call returns normally
    stopped = first[0]["stopped_at"]
    assert stopped is not None and stopped >= 3
    assert [r["stopped_at"] for r in first] == [stopped, stopped]  # one step for both ranks
    assert is_complete(checkpoint_path(root, stopped))
    assert handle.finished is not None and "stopped early" in handle.finished.message
    for rank in (0, 1):  # the callback ran in the rank's main thread, at a safe point
        log = (handle.run_dir / "logs" / f"rank_{rank}.txt").read_text()
        assert "on_stop in MainThread" in log

    second = fn.distributed(root, stopped + 3, 0.0)
    assert second[0]["start"] == stopped
    curve = first[0]["losses"] + second[0]["losses"]
    assert [step for step, _ in curve] == list(range(stopped + 3))  # no step lost or repeated
    assert curve == [(s, 1.0 / (2.0 + s)) for s in range(stopped + 3)]


def test_ranks_that_do_not_check_are_killed_after_the_grace(tmp_path: Path) -> None:
    fn = distributed(gpus=2, stop_grace=3, tracking=False)(train)
    handle = fn.start(str(tmp_path / "ckpt"), 100_000, 0.05, False)
    wait_for_lines(handle, "step 2", 2)
    asked = time.monotonic()
    handle.cancel()
    with pytest.raises(CancelledError):
        handle.result(timeout=60)
    assert time.monotonic() - asked >= 3  # they had their grace
    assert not (tmp_path / "ckpt").exists()


def test_a_second_cancel_kills_at_once(tmp_path: Path) -> None:
    fn = distributed(gpus=2, stop_grace=120, tracking=False)(train)
    handle = fn.start(str(tmp_path / "ckpt"), 100_000, 0.05, False)
    wait_for_lines(handle, "step 2", 2)
    handle.cancel()
    handle.wait(0.5)
    asked = time.monotonic()
    handle.cancel()
    with pytest.raises(CancelledError):
        handle.result(timeout=60)
    assert time.monotonic() - asked < 60  # not the 120 s of stop_grace


def test_a_rank_without_the_stop_handler_is_stopped_not_killed_by_the_request(
    tmp_path: Path,
) -> None:
    """Its code put the stop signal back to its default action (which ends the process): the
    launcher sees no handler, asks no one, and stops the run as usual (TERM, grace, KILL)."""
    fn = distributed(gpus=2, stop_grace=120, tracking=False)(resets_signals)
    handle = fn.start(str(tmp_path), [0, 1], 120)
    wait_for_lines(handle, "ready", 2)
    handle.cancel()
    with pytest.raises(CancelledError):
        handle.result(timeout=60)  # not the 120 s of stop_grace: nobody could be asked
    assert handle.finished is not None and "signal" not in handle.finished.message


def test_a_rank_that_unblocked_every_signal_still_takes_the_stop_request(tmp_path: Path) -> None:
    fn = distributed(gpus=2, stop_grace=120, tracking=False)(stops_after_unblocking_signals)
    handle = fn.start()
    wait_for_lines(handle, "ready", 2)
    handle.cancel()
    assert list(handle.result(timeout=60)) == ["stopped", "stopped"]
