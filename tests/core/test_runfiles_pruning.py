"""Pruning deletes only what is ours and over: never a live run of another caller, never a run
within the grace period, never a folder without our marker, never a live launcher's log."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from serverless_gpu import distributed
from serverless_gpu.runfiles import rundirs
from serverless_gpu.runfiles.rundirs import (
    KEEP_RUNS_ENV,
    MARKER,
    RESULTS_DIR_ENV,
    RUNS_DIR_ENV,
    drop_launcher_log,
    new_run_dir,
    prune_runs,
    release_run,
)

_WAIT_S = 120


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A runs folder of its own, results in the run directory, and only the newest run kept."""
    monkeypatch.setenv(RUNS_DIR_ENV, str(tmp_path / "runs"))
    monkeypatch.setenv(RESULTS_DIR_ENV, "off")
    monkeypatch.setenv(KEEP_RUNS_ENV, "1")
    return tmp_path / "runs"


@distributed(gpus=1, output="none", tracking=False)
def quick() -> int:
    return 1


def _age(path: Path, seconds: float) -> None:
    """Set the modification time ``seconds`` into the past, as if the run were that old."""
    then = time.time() - seconds
    os.utime(path, (then, then), follow_symlinks=False)


def _wait_for(condition: Callable[[], bool], proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + _WAIT_S
    while not condition():
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, "the other caller's ranks did not start"
        time.sleep(0.05)


_LONG_CALLER = """
import os, sys, time
from pathlib import Path

from serverless_gpu import distributed

signals = Path(sys.argv[1])


@distributed(gpus=2, output="none", tracking=False)
def long_call():
    (signals / f"started-{os.environ['RANK']}").touch()
    deadline = time.monotonic() + 120
    while not (signals / "go").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return int(os.environ["RANK"])


print(list(long_call.distributed()))
"""


def test_a_live_run_of_another_caller_is_never_pruned(runs: Path, tmp_path: Path) -> None:
    script, signals = tmp_path / "long_caller.py", tmp_path / "signals"
    script.write_text(_LONG_CALLER)
    signals.mkdir()
    other = subprocess.Popen(
        [sys.executable, str(script), str(signals)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        _wait_for(lambda: len(list(signals.glob("started-*"))) == 2, other)
        (their_run,) = [p for p in runs.iterdir() if p.is_dir()]
        _age(their_run, 3600)  # running for an hour: past any grace period
        assert [quick.distributed() for _ in range(2)] == [[1], [1]]
        assert their_run.is_dir()
        (signals / "go").touch()
        output = other.communicate(timeout=_WAIT_S)[0]
    finally:
        other.kill()
        other.wait(30)
    assert other.returncode == 0 and output.endswith("[0, 1]\n"), output
    # Its caller is gone: now it is an old run like any other.
    _age(their_run, 3600)
    assert quick.distributed() == [1]
    assert not their_run.exists()


def _finished_run(root: Path, name: str, age_s: float) -> Path:
    """A run directory as a finished call leaves it: marker unlocked, logs kept."""
    run = root / name
    (run / "logs").mkdir(parents=True)
    (run / MARKER).write_text("1 0.0\n")
    (run / "logs" / "rank_0.txt").write_text("the log the user was pointed at\n")
    _age(run / MARKER, age_s)
    _age(run, age_s)
    return run


def test_a_finished_run_stays_for_the_grace_period(runs: Path) -> None:
    runs.mkdir(mode=0o700)
    recent = _finished_run(runs, "20200101-000000-fn-00000000000a", rundirs.GRACE_S / 2)
    old = _finished_run(runs, "20200101-000000-fn-00000000000b", rundirs.GRACE_S * 2)
    assert quick.distributed() == [1]
    assert (recent / "logs" / "rank_0.txt").exists()
    assert not old.exists()


def test_folders_that_are_not_runs_are_left_alone(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    mine, shared = tmp_path / "my-folder", tmp_path / "my-results"
    # Named like runs but without a marker, or with a twin's dangling link but not so named.
    projects = [f"project-{i}" for i in range(20)]
    names = projects + [f"2020010{i}-000000-fn-{i:012x}" for i in range(5)]
    for folder in (mine, shared):
        folder.mkdir(mode=0o755)
        os.chmod(folder, 0o755)
        for name in names:
            (folder / name).mkdir()
            (folder / name / "data.txt").write_text("keep me")
            if name in projects:
                (folder / name / "run_dir").symlink_to(tmp_path / "nothing-there")
            _age(folder / name, 3600)
    monkeypatch.setenv(RUNS_DIR_ENV, str(mine))
    monkeypatch.setenv(RESULTS_DIR_ENV, str(shared))
    monkeypatch.setenv(KEEP_RUNS_ENV, "1")
    assert quick.distributed() == [1]
    for folder in (mine, shared):
        assert [n for n in names if not (folder / n / "data.txt").exists()] == []
        assert stat.S_IMODE(folder.stat().st_mode) == 0o755  # not ours to chmod


def test_own_runs_are_pruned_once_released(runs: Path) -> None:
    _, run, _ = new_run_dir("fn")
    _age(run, rundirs.GRACE_S * 2)
    prune_runs(runs, keep=0)
    assert run.is_dir()  # its caller (this process) still holds it
    release_run(run)
    release_run(run)  # the end of a call may be reported twice
    _age(run, 0)
    # This process made every newer run itself: no grace period for its own finished runs.
    prune_runs(runs, keep=0)
    assert not run.exists()


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])


@pytest.mark.fresh_launcher  # the launcher's log goes to this test's runs folder
def test_launcher_logs_of_gone_callers_are_pruned(
    runs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs.mkdir(mode=0o700)
    no_such_pid = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1
    gone = [runs / f"launcher-{no_such_pid + i}.log" for i in range(2)]
    for log in gone:
        log.write_text("old launcher output\n")
        _age(log, 3600)
    live, reused = _sleeper(), _sleeper()
    try:
        time.sleep(0.05)  # the logs are written after their writers started
        live_log, reused_log = (runs / f"launcher-{p.pid}.log" for p in (live, reused))
        live_log.write_text("")
        # The process with this pid started after the log's last write: not its writer.
        reused_log.write_text("")
        _age(reused_log, 3600)
        monkeypatch.setattr(rundirs, "GRACE_S", 0.0)  # only liveness keeps a log now
        assert quick.distributed() == [1]
        assert live_log.exists()
        assert not reused_log.exists()
    finally:
        for proc in (live, reused):
            proc.kill()
            proc.wait(30)
    assert not any(log.exists() for log in gone)
    assert (runs / f"launcher-{os.getpid()}.log").exists()  # this process's own, in use


def test_an_empty_launcher_log_is_dropped_one_with_text_kept(tmp_path: Path) -> None:
    empty, talkative = tmp_path / "launcher-1.log", tmp_path / "launcher-2.log"
    empty.write_text("")
    talkative.write_text("Traceback ...\n")
    for log in (empty, talkative, tmp_path / "launcher-3.log"):
        drop_launcher_log(log)
    assert not empty.exists() and talkative.exists()


def test_a_loop_of_calls_keeps_only_the_newest_runs(runs: Path) -> None:
    for _ in range(3):
        assert quick.distributed() == [1]
    assert len([p for p in runs.iterdir() if p.is_dir()]) == 1
