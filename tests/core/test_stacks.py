"""Stacks on demand and on a timeout: where every rank is, while it runs and when it hangs."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from eventually import wait_for_lines

import serverless_gpu
from serverless_gpu import CancelledError, DistributedTimeoutError, distributed
from serverless_gpu.doctor.stack_text import main_thread_frames

pytestmark = pytest.mark.timeout(120)


def stuck_here(seconds: float) -> None:
    time.sleep(seconds)


def rank1_sleeps_rank0_all_reduces(seconds: float) -> int:
    import torch
    import torch.distributed as dist

    from serverless_gpu.runtime import get_global_rank, init_process_group

    init_process_group()
    print("ready", flush=True)
    if get_global_rank() == 1:
        stuck_here(seconds)
    dist.all_reduce(torch.ones(1))
    return get_global_rank()


def test_stacks_name_where_each_rank_is_without_stopping_the_run() -> None:
    fn = distributed(gpus=2, timeout=120, tracking=False)(rank1_sleeps_rank0_all_reduces)
    handle = fn.start(8)
    wait_for_lines(handle, "ready", 2)
    time.sleep(0.5)  # rank 0 in all_reduce, rank 1 asleep
    found = handle.stacks()
    assert set(found) == {0, 1}, found
    assert main_thread_frames(found[1])[0].func == "stuck_here", found[1]
    assert main_thread_frames(found[0])[0].func == "all_reduce", found[0]
    assert found[1].startswith("Main thread 0x")
    for ours in ("rank/main.py", "rank/become.py", "rank/doctor.py", "sigwait"):  # ours, the doctor
        assert ours not in found[1], found[1]
    assert (Path(serverless_gpu.__file__).parent / "rank" / "become.py").is_file()
    assert (handle.run_dir / "stacks" / "rank_1.txt").read_text() == found[1]
    assert list(handle.result(timeout=60)) == [0, 1]  # the run went on and ended normally


def test_timeout_error_carries_each_ranks_stack() -> None:
    fn = distributed(gpus=2, timeout=3, tracking=False)(rank1_sleeps_rank0_all_reduces)
    with pytest.raises(DistributedTimeoutError) as info:
        fn.distributed(60)
    err = info.value
    assert set(err.stacks) == {0, 1}
    assert "in stuck_here" in err.stacks[1] and "in all_reduce" in err.stacks[0]
    text = str(err)
    assert "rank 1: sleep" not in text  # time.sleep is C: the innermost frame is the user's
    assert "rank 1: stuck_here (test_stacks.py:" in text, text
    assert "rank 0: all_reduce (torch/distributed/distributed_c10d.py:" in text, text
    assert "called from rank1_sleeps_rank0_all_reduces (test_stacks.py:" in text, text
    assert "last collective" not in text  # NCCL's flight recorder: GPUs only
    assert err.run_dir is not None
    for rank in (0, 1):
        saved = err.run_dir / "stacks" / f"rank_{rank}.txt"
        assert saved.read_text() == err.stacks[rank]


def rank1_goes_silent() -> None:
    from serverless_gpu.runtime import get_global_rank, heartbeat

    # Every rank shows life once in user code first: on a busy machine the ranks' start alone
    # can outlast the 2.5 s warning, which then names every rank before rank 1 goes quiet.
    heartbeat()
    for _ in range(60):
        if get_global_rank() == 0:
            heartbeat()  # a sign of life without output
        time.sleep(0.1)


def test_a_silent_rank_is_named_and_nothing_is_stopped(
    capsys: pytest.CaptureFixture[str],
) -> None:
    fn = distributed(gpus=2, hang_warning=2.5, tracking=False)(rank1_goes_silent)
    assert list(fn.distributed()) == [None, None]  # warned, not stopped
    out = capsys.readouterr().out
    assert (
        "serverless_gpu: warning: rank 1 silent for 2.5 s (no output, metric or heartbeat)" in out
    )
    assert "rank 0 silent" not in out and "ranks 0" not in out


def test_flight_recorder_is_on_in_gpu_ranks_only() -> None:
    from serverless_gpu.wire.env import rank_env

    def env(device: str, base: dict[str, str]) -> dict[str, str]:
        return rank_env(
            base, rank=0, world_size=2, master_port=1, device=device, run_id="r", run_dir="/d"
        )

    assert env("cuda", {})["TORCH_FR_BUFFER_SIZE"] == "2000"
    assert "TORCH_FR_BUFFER_SIZE" not in env("cpu", {})
    assert "TORCH_FR_BUFFER_SIZE" not in env("cuda", {"TORCH_NCCL_TRACE_BUFFER_SIZE": "10"})
    assert env("cuda", {"TORCH_FR_BUFFER_SIZE": "0"})["TORCH_FR_BUFFER_SIZE"] == "0"


def test_hang_watch_warns_once_per_silence_and_withdraws() -> None:
    from serverless_gpu.caller.hangs import HangWatch
    from serverless_gpu.wire.events import RankStarted

    watch = HangWatch("r", 10.0)
    for rank in (0, 1):
        watch.seen(RankStarted("r", rank, 1, 0.0))
    start = time.monotonic()
    assert watch.check(start + 5) is None
    watch.last[0] = start + 9  # rank 0 spoke
    first = watch.check(start + 11)
    assert first is not None and first.ranks == (1,) and not first.everyone
    assert watch.check(start + 12) is None  # said once
    both = watch.check(start + 30)
    assert both is not None and both.ranks == (0, 1) and both.everyone
    watch.last = {0: start + 31, 1: start + 31}
    back = watch.check(start + 32)
    assert back is not None and back.ranks == ()


def test_a_rank_that_reset_its_signals_is_never_killed_by_a_stacks_request(tmp_path: Path) -> None:
    """Rank 0 unblocked every signal (no flight-recorder dump is sent in CPU mode, and a stop
    request is caught); rank 1 also put the stack signal back to its default action: the
    launcher sees that it has no handler and says so instead of killing it."""
    from recovery_fns import resets_signals

    fn = distributed(gpus=2, timeout=120, tracking=False)(resets_signals)
    handle = fn.start(str(tmp_path), [1], 60)
    wait_for_lines(handle, "ready", 2)
    found = handle.stacks()
    assert "in resets_signals" in found[0], found[0]
    assert found[1].startswith("stacks unavailable"), found[1]
    assert "SIGRTMIN+4" in found[1] and "signal.signal" in found[1], found[1]
    assert not handle.wait(0.5), handle.finished  # both ranks alive, the run goes on
    handle.cancel()
    with pytest.raises(CancelledError):
        handle.result(timeout=60)


def test_the_ranks_own_frames_and_threads_are_left_out_by_package_not_by_kind_of_run() -> None:
    """The rank's start, a session's loop of cells and the threads the rank's code started are
    the rank's own code (``serverless_gpu/rank``): left out of the stacks shown, sessions or
    not; a user's thread made of threading's frames only stays."""
    from serverless_gpu.doctor.stacks import _mark_main

    pkg = "/site/serverless_gpu"

    def frame(path: str, name: str) -> str:
        return f'  File "{path}", line 1 in {name}'

    def thread(ident: str, *frames: str, current: bool = False) -> str:
        head = "Current thread" if current else "Thread"
        return "\n".join([f"{head} 0x{ident} (most recent call first):", *frames])

    threading_run = frame("/usr/lib/python3.11/threading.py", "run")
    text = "\n\n".join(
        [
            thread(
                "0a",
                frame(f"{pkg}/wire/session.py", "read_frame"),
                frame(f"{pkg}/rank/session_loop.py", "read"),
                threading_run,
            ),
            thread("0b", frame("/usr/lib/python3.11/threading.py", "wait"), threading_run),
            thread("0c", frame(f"{pkg}/rank/doctor.py", "_serve"), threading_run),
            thread(
                "01",
                frame("/usr/lib/python3.11/queue.py", "get"),
                frame(f"{pkg}/rank/runtime.py", "heartbeat"),
                frame("<Cell In[3]>", "cell"),
                frame(f"{pkg}/rank/session_loop.py", "run_code"),
                frame(f"{pkg}/rank/main.py", "_run"),
                frame(f"{pkg}/launcher_process/loop.py", "run"),
                current=True,
            ),
        ]
    )
    shown = _mark_main(text, "01")
    blocks = shown.strip().split("\n\n")
    assert blocks[0].splitlines() == [
        "Main thread 0x01 (most recent call first):",
        frame("/usr/lib/python3.11/queue.py", "get"),
        frame(f"{pkg}/rank/runtime.py", "heartbeat"),
        frame("<Cell In[3]>", "cell"),
    ]
    assert [b.split(" (")[0] for b in blocks[1:]] == ["Thread 0x0b"]
