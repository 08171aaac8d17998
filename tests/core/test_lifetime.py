"""Nothing of ours survives its caller: SIGKILL, KeyboardInterrupt, and 100 calls in a row."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from eventually import eventually
from procs import launcher_tree, the_launcher

from serverless_gpu import distributed
from serverless_gpu.runfiles.rundirs import KEEP_RUNS_ENV, RESULTS_DIR_ENV, RUNS_DIR_ENV

WaitGone = Callable[..., set[int]]
_CALLER = Path(__file__).with_name("lifetime_caller.py")


def _start_caller(*args: str) -> tuple[subprocess.Popen[str], set[int], list[str]]:
    proc = subprocess.Popen(
        [sys.executable, str(_CALLER), "2", "cpu", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    while not lines or lines[-1] not in ("READY\n", ""):
        lines.append(proc.stdout.readline())
    if lines[-1] != "READY\n":
        proc.kill()
        pytest.fail(f"caller did not get ready: {lines!r} {proc.communicate()}")
    tree = {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
    # launcher + 2 ranks + 2 grandchildren (standby ranks may add more)
    assert len(tree) >= 5
    return proc, tree, lines


@pytest.mark.timeout(120)
def test_sigkill_of_the_caller_leaves_nothing(gone: WaitGone) -> None:
    proc, tree, _ = _start_caller()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not gone(tree, timeout=3.0)


@pytest.mark.timeout(120)
def test_sigkill_of_a_caller_that_forked_leaves_nothing(gone: WaitGone) -> None:
    # The launcher was started from a thread (no parent-death signal) and a forked child holds
    # copies of the caller's descriptors, its socket to the launcher among them.
    proc, tree, lines = _start_caller("fork-child")
    (child,) = [int(line.split()[1]) for line in lines if line.startswith("CHILD ")]
    try:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert not gone(tree - {child}, timeout=5.0)
    finally:
        for pid in tree:
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()


@pytest.mark.timeout(120)
def test_keyboard_interrupt_kills_ranks_and_reraises(gone: WaitGone) -> None:
    proc, tree, _ = _start_caller()
    launcher = min(tree)  # started first
    ranks = tree - {launcher}
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:  # the interrupt did not end it: fail without leaving it behind
            proc.kill()
            proc.wait()
    assert "INTERRUPTED" in out
    assert "KeyboardInterrupt" in err
    assert not gone(ranks, timeout=3.0)
    assert not gone(tree, timeout=5.0)


def test_daemon_that_left_the_rank_group_ends_with_the_call(gone: WaitGone) -> None:
    @distributed(gpus=2, output="none", tracking=False)
    def start_daemon() -> int:
        # A new session: killing the rank's process group does not reach it.
        return subprocess.Popen(["sleep", "600"], start_new_session=True).pid

    daemons = set(start_daemon.distributed())
    # Adopted by the launcher (a subreaper) when its rank exited, and killed once no call runs.
    assert not gone(daemons, timeout=5.0)


@pytest.mark.timeout(120)
def test_killed_caller_leaves_no_tmpfs_results(
    tmp_path: Path, gone: WaitGone, monkeypatch: pytest.MonkeyPatch
) -> None:
    results = tmp_path / "results"
    monkeypatch.setenv(RESULTS_DIR_ENV, str(results))
    proc, tree, _ = _start_caller("no-standby")
    assert len(list(results.iterdir())) == 1  # the call's twin
    proc.kill()
    proc.wait()
    assert not gone(tree, timeout=5.0)
    assert not list(results.iterdir())  # the launcher's shutdown deleted it


def _fds() -> dict[int, str]:
    """This process's open descriptors and what each is (a run's lock file, a socket...)."""
    found = {}
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor is gone already
            found[int(name)] = os.readlink(f"/proc/self/fd/{name}")
    # MLflow's SQLAlchemy pool opens the tracking store again when two threads use it at once
    # (up to its pool size, then reused): those are MLflow's, not a call's.
    return {fd: what for fd, what in found.items() if "mlflow.db" not in what}


@pytest.mark.timeout(300)
def test_hundred_calls_leak_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    monkeypatch.setenv(RUNS_DIR_ENV, str(runs))
    monkeypatch.setenv(KEEP_RUNS_ENV, "5")
    # A private TMPDIR for the caller, the launcher and the ranks: nothing else writes there.
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(private_tmp))
    monkeypatch.setattr(tempfile, "tempdir", None)

    @distributed(gpus=2)
    def noop(i: int) -> int:
        return i

    assert noop.distributed(-1) == [-1, -1]  # launcher up
    # Standby ranks are made once the first call is over (after the launcher imports mlflow
    # for tracked calls, seconds on a busy machine): the baseline is taken with them ready.
    # Exactly those: the first call's ranks may still be ending when it has returned.
    deadline = time.monotonic() + 60
    while len(launcher_tree()) != 3:  # the launcher and 2 standby
        assert time.monotonic() < deadline
        time.sleep(0.05)
    fds = _fds()
    procs = launcher_tree()  # (the test's own other children, if any, are not counted)
    tmp_entries = set(os.listdir(private_tmp))
    for i in range(100):
        assert noop.distributed(i) == [i, i]
    # The launcher and one set of standby ranks, as before (fresh pids each call).
    deadline = time.monotonic() + 5
    while len(launcher_tree()) != len(procs):
        assert time.monotonic() < deadline, launcher_tree()
        time.sleep(0.05)
    # A finished call's last descriptors (its lock file, the finisher's) close just after it.
    try:
        eventually(lambda: len(_fds()) <= len(fds), "the calls' descriptors closed", timeout=10)
    except AssertionError:
        raise AssertionError(f"new descriptors: {_new(_fds(), fds)}") from None
    assert set(os.listdir(private_tmp)) <= tmp_entries
    run_dirs = [p for p in runs.iterdir() if p.is_dir()]
    assert len(run_dirs) <= 5
    for run_dir in run_dirs:
        assert not list(run_dir.glob("*.pkl"))  # payload and results are removed after a call
        assert (run_dir.stat().st_mode & 0o777) == 0o700


def _new(now: dict[int, str], before: dict[int, str]) -> dict[int, str]:
    return {fd: what for fd, what in now.items() if before.get(fd) != what}


def test_launcher_has_no_listening_socket() -> None:
    @distributed(gpus=2)
    def noop() -> None:
        pass

    noop.distributed()
    # The launcher, not merely the first child: another module of this worker may have left
    # multiprocessing's resource tracker, which lives as long as this process.
    launcher = the_launcher()

    def listening() -> list[Any]:
        return [c for c in launcher.net_connections(kind="all") if c.status == psutil.CONN_LISTEN]

    # After a call the launcher forks the next standby set; while it forks, it holds the
    # set's formation listener (rank 0 takes its own copy, and it closes once the group is
    # formed). Seen in CI: the check landed in that window. What must hold is that no
    # listening socket stays.
    eventually(lambda: listening() == [], what="the launcher holds no listening socket")


def test_launcher_restarts_transparently_after_dying() -> None:
    @distributed(gpus=2)
    def pid() -> int:
        return os.getppid()

    first = pid.distributed()
    psutil.Process(first[0]).kill()
    psutil.Process(first[0]).wait(5)
    second = pid.distributed()
    assert second[0] == second[1] != first[0]
