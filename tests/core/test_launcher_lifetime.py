"""The launcher's lifetime is the caller's, whatever the caller forks and however the launcher
ends: forked children neither keep it alive nor shut it down, what ranks started dies with a
killed launcher, and a call right after a launcher's shutdown starts a fresh one."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from procs import run_script, the_launcher

import serverless_gpu
from serverless_gpu import distributed
from serverless_gpu.common.errors import DistributedError
from serverless_gpu.runfiles.rundirs import RUNS_DIR_ENV
from serverless_gpu.wire.events import Event, RankMessage, RankStarted

WaitGone = Callable[..., set[int]]

# Each test is about a launcher's own start, log or end: none starts with the module's launcher.
pytestmark = pytest.mark.fresh_launcher

_FORKING_CALLER = """
import os, sys
from serverless_gpu import distributed

@distributed(gpus=2, tracking=False, output="none", standby=False)
def slow():
    import time
    time.sleep(3)
    return 1

handle = slow.start()
pid = os.fork()
if pid == 0:
    sys.exit(0)  # a normal exit: the interpreter runs the atexit handlers this child inherited
os.waitpid(pid, 0)
print("RESULT", list(handle.result(timeout=60)))
"""


@pytest.mark.timeout(120)
def test_forked_child_exiting_normally_leaves_the_call_running() -> None:
    out = run_script(_FORKING_CALLER, timeout=100)
    assert "RESULT [1, 1]" in out.stdout, (out.stdout, out.stderr)


@pytest.mark.timeout(120)
def test_children_of_ranks_die_with_a_killed_launcher(gone: WaitGone) -> None:
    @distributed(gpus=2, tracking=False, output="none", standby=False)
    def with_child() -> None:
        import time

        from serverless_gpu import runtime

        child = subprocess.Popen(["sleep", "1000"])  # in the rank's process group
        runtime.send_to_caller("child", child.pid)
        time.sleep(1000)

    children: set[int] = set()

    def on_event(event: Event) -> None:
        if isinstance(event, RankMessage):
            children.add(event.data)

    handle = with_child.start()
    handle.subscribe(on_event)
    try:
        deadline = time.monotonic() + 60
        while len(children) < 2:
            assert time.monotonic() < deadline, "the ranks did not start their children"
            handle.wait(0.05)
        launcher = the_launcher()
        launcher.kill()
        with pytest.raises(DistributedError, match="launcher"):
            handle.result(timeout=30)
        assert not gone(children, timeout=5.0)
    finally:
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.timeout(120)
def test_calls_right_after_a_launcher_shutdown_start_a_fresh_one() -> None:
    @distributed(gpus=2, tracking=False, output="none", standby=False)
    def launcher_pid() -> int:
        import os

        return os.getppid()

    seen = [launcher_pid.distributed()[0]]
    for _ in range(3):
        os.kill(seen[-1], signal.SIGTERM)  # the launcher's orderly shutdown begins
        pids = launcher_pid.distributed()  # at once: no pause for the launcher to exit
        assert pids[0] == pids[1] not in seen
        seen.append(pids[0])


@pytest.mark.timeout(120)
def test_clean_exit_leaves_no_empty_launcher_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = tmp_path / "runs"
    monkeypatch.setenv(RUNS_DIR_ENV, str(runs))

    @distributed(gpus=2, tracking=False, output="none", standby=False)
    def noop() -> None:
        pass

    noop.distributed()
    assert list(runs.glob("launcher-*.log"))  # written to while the launcher runs
    serverless_gpu.shutdown()
    assert not list(runs.glob("launcher-*.log"))


@pytest.mark.timeout(180)
def test_a_stuck_launcher_is_killed_once_a_run_is_long_overdue(gone: WaitGone) -> None:
    @distributed(gpus=2, timeout=2, tracking=False, output="none", standby=False)
    def forever() -> None:
        import time

        time.sleep(600)

    started: set[int] = set()
    handle = forever.start()
    handle.subscribe(lambda e: started.add(e.rank) if isinstance(e, RankStarted) else None)
    while len(started) < 2:
        assert not handle.wait(0.05), "the call ended before its ranks started"
    launcher = the_launcher()
    launcher.suspend()  # SIGSTOP: it can neither time the run out nor report anything
    ranks = {p.pid for p in launcher.children()}
    with pytest.raises(DistributedError, match="launcher process was killed because"):
        handle.result(timeout=120)
    assert not gone(ranks | {launcher.pid}, timeout=5.0)
