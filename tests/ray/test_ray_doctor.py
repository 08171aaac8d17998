"""The doctor and the graceful stop on a real 2-node Ray cluster: stop_grace with
``should_stop()`` and ``on_stop``, ``handle.stacks()``, the timeout's per-rank frames, the hang
warning and ``max_retries``."""

from __future__ import annotations

import pytest
import ray_fns
from eventually import wait_for_lines

from serverless_gpu import distributed
from serverless_gpu.common.errors import DistributedTimeoutError

pytestmark = [pytest.mark.usefixtures("cluster", "untracked"), pytest.mark.timeout(600)]


def test_a_cancel_with_stop_grace_asks_the_ranks_and_they_return() -> None:
    fn = distributed(gpus=4, gpu_type="cpu", remote=True, stop_grace=30, timeout=300)(
        ray_fns.until_asked_to_stop
    )
    handle = fn.start(240)
    wait_for_lines(handle, "stepping", 4, seconds=120)
    handle.cancel()
    results = handle.result(timeout=60)  # the ranks returned: the call returns normally
    assert all(r["stopped_at"] is not None for r in results)
    assert [r["on_stop_in"] for r in results] == [["MainThread"]] * 4
    assert handle.finished is not None and "stopped early" in handle.finished.message
    again = fn.distributed(0.5)  # on the same actors, which were asked to stop last time
    assert [r["stopped_at"] for r in again] == [None] * 4, "a new call is not asked to stop"


def test_stacks_while_it_runs_then_the_timeout_names_each_ranks_frame() -> None:
    fn = distributed(gpus=4, gpu_type="cpu", remote=True, timeout=30, output="none")(
        ray_fns.stuck_in_a_named_function
    )
    handle = fn.start(600)
    wait_for_lines(handle, "ready", 4, seconds=120)
    found = handle.stacks()
    assert set(found) == {0, 1, 2, 3}, found
    assert found[1].startswith("Main thread 0x") and "in stuck_here" in found[1], found[1]
    assert "in barrier" in found[0], found[0]
    assert not handle.done(), "the run went on"
    with pytest.raises(DistributedTimeoutError) as info:
        handle.result(timeout=120)
    text = str(info.value)
    assert "rank 1: stuck_here (ray_fns.py:" in text, text
    assert "rank 0: barrier (torch/distributed/" in text, text


def test_a_silent_rank_is_named_and_nothing_is_stopped(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # 5 s, rank 1 silent for 10: rank 0's heartbeats (one a second at most) reach the caller
    # through Ray's actors, and on a busy machine a 2.5 s warning once named rank 0 too.
    fn = distributed(gpus=2, gpu_type="cpu", remote=True, hang_warning=5, timeout=180)(
        ray_fns.rank1_goes_silent
    )
    assert list(fn.distributed()) == [None, None]  # warned, not stopped
    out = capsys.readouterr().out
    assert "warning: rank 1 silent for 5 s (no output, metric or heartbeat)" in out, out
    assert "rank 0 silent" not in out


def test_max_retries_starts_a_crashed_call_again_on_the_cluster() -> None:
    fn = distributed(gpus=4, gpu_type="cpu", remote=True, max_retries=1, timeout=180)(
        ray_fns.rank1_dies_on_the_first_attempt
    )
    assert list(fn.distributed()) == [1, 1, 1, 1]
