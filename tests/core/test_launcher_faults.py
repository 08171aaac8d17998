"""Faults inside a call become a clear error in bounded time, and the launcher stays up.

A rank stopped in the middle of a message, a rank that ignores SIGTERM with an endless grace, a
fork that fails, a runs folder that fills up: each fails only its own call.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from procs import the_launcher

from serverless_gpu import distributed, runtime
from serverless_gpu.common.errors import DistributedError, DistributedTimeoutError, StorageError
from serverless_gpu.runfiles.rundirs import RESULTS_DIR_ENV, RUNS_DIR_ENV


def _launcher() -> psutil.Process:
    launcher = the_launcher()
    return launcher


@pytest.mark.timeout(120)
def test_rank_stopped_mid_message_does_not_block_the_timeout() -> None:
    @distributed(gpus=2, timeout=5, tracking=False, output="none", standby=False)
    def stop_mid_message() -> None:
        import os
        import signal
        import stat
        import struct
        import time

        from serverless_gpu import runtime

        if runtime.get_global_rank() == 1:
            # The rank's only socket is its channel to the launcher. A frame header promising
            # more than follows, then SIGSTOP: a rank stopped half-way through a large
            # send_to_caller, made deterministic.
            sockets = []
            for name in os.listdir("/proc/self/fd"):
                with contextlib.suppress(OSError):
                    if stat.S_ISSOCK(os.fstat(int(name)).st_mode):
                        sockets.append(int(name))
            os.write(sockets[0], struct.pack("!i", 1 << 20) + b"half a message")
            os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(600)

    with pytest.raises(DistributedTimeoutError) as info:
        stop_mid_message.start().result(timeout=60)
    assert "timeout of 5 s" in str(info.value)


@pytest.mark.timeout(120)
def test_endless_grace_still_ends_in_sigkill() -> None:
    @distributed(gpus=2, timeout=2, tracking=False, output="none", standby=False)
    def ignore_term() -> None:
        import signal
        import time

        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(600)

    # The decorator refuses such a grace; the launcher must bound it whatever it is sent.
    object.__setattr__(ignore_term.config, "grace", float("inf"))
    with pytest.raises(DistributedTimeoutError) as info:
        ignore_term.start().result(timeout=60)
    assert "timeout of 2 s" in str(info.value)


_FORK_FAILS = """
import sys
from pathlib import Path
from serverless_gpu import distributed
from serverless_gpu.common.errors import DistributedError

@distributed(gpus=2, tracking=False, output="none", standby=False)
def launcher_pid():
    import os
    return os.getppid()

@distributed(gpus=8, tracking=False, output="none", standby=False)
def many():
    pass

first = launcher_pid.distributed()[0]
pids = Path(sys.argv[1])
# Room for 3 more tasks in this group: the next call's sampler thread and 2 ranks, so the 8-rank
# call's fork fails at its third rank.
(pids / "pids.max").write_text(str(int((pids / "pids.current").read_text()) + 3))
try:
    many.distributed()
    print("NO ERROR")
except DistributedError as exc:
    print("ERROR", type(exc).__name__, str(exc).replace("\\n", " "))
# The limit is lifted again: the failed call's first ranks may still be exiting, and what is
# checked next is that the launcher itself stayed up.
(pids / "pids.max").write_text("max")
print("SAME LAUNCHER", launcher_pid.distributed()[0] == first)
"""


@pytest.fixture
def pids_cgroup() -> Iterator[Path]:
    """A pids cgroup of our own (cgroup v1 as root), or skip."""
    group = Path("/sys/fs/cgroup/pids") / f"serverless-gpu-test-{os.getpid()}"
    try:
        group.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot create a pids cgroup to make fork fail ({exc})")
    try:
        yield group
    finally:
        deadline = time.monotonic() + 10
        while True:
            try:
                group.rmdir()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


@pytest.mark.timeout(180)
def test_failed_fork_fails_the_call_with_its_cause_and_the_launcher_stays(
    pids_cgroup: Path,
) -> None:
    # As root, RLIMIT_NPROC is not enforced; a pids cgroup makes fork fail for real (EAGAIN).
    enter = f'echo $$ > {pids_cgroup / "cgroup.procs"} && exec "$@"'
    out = subprocess.run(
        ["sh", "-c", enter, "sh", sys.executable, "-c", _FORK_FAILS, str(pids_cgroup)],
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert "ERROR DistributedError" in out.stdout, (out.stdout, out.stderr)
    assert "could not start 8 ranks" in out.stdout
    assert "Resource temporarily unavailable" in out.stdout
    assert "SAME LAUNCHER True" in out.stdout, (out.stdout, out.stderr)


@pytest.mark.timeout(120)
def test_an_event_the_caller_cannot_handle_fails_the_call_in_bounded_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The caller's event reader hands each event to its run; when that raises (under a pids
    limit, a thread a handler starts cannot start), the reader must not just end: every call
    of that launcher would then wait for ever."""
    from serverless_gpu.caller.handle import RunHandle
    from serverless_gpu.wire.events import RunScheduled

    push = RunHandle.push

    def failing_push(self: RunHandle[Any], event: Any) -> None:
        if isinstance(event, RunScheduled):
            raise RuntimeError("can't start new thread")
        push(self, event)

    @distributed(gpus=2, tracking=False, output="none", standby=False)
    def one() -> int:
        return 1

    monkeypatch.setattr(RunHandle, "push", failing_push)
    with pytest.raises(DistributedError) as info:
        one.start().result(timeout=60)
    assert "could not handle" in str(info.value) and "can't start new thread" in str(info.value)
    monkeypatch.setattr(RunHandle, "push", push)
    assert one.distributed() == [1, 1]  # a fresh launcher takes the next call


@pytest.fixture
def small_runs_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A 20 MB tmpfs as the runs folder (results stay in it), or skip."""
    runs = tmp_path / "runs"
    runs.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=20m,mode=0700", "tmpfs", str(runs)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs: {mounted.stderr.strip()}")
    monkeypatch.setenv(RUNS_DIR_ENV, str(runs))
    monkeypatch.setenv(RESULTS_DIR_ENV, "off")
    try:
        yield runs
    finally:
        import serverless_gpu

        serverless_gpu.shutdown()  # the launcher's log is in the folder
        subprocess.run(["umount", "-l", str(runs)], check=True)


@distributed(gpus=2, tracking=False, output="none", standby=False)
def _launcher_pid() -> int:
    return os.getppid()


@pytest.mark.timeout(120)
def test_full_runs_disk_fails_only_that_call(small_runs_disk: Path) -> None:
    @distributed(gpus=2, tracking=False, output="none", standby=False)
    def flood() -> int:
        line = "x" * (1 << 20)
        for _ in range(40):  # 2 x 40 MB of log into a 20 MB folder
            print(line)
        return 1

    first = _launcher_pid.distributed()[0]
    with pytest.raises(DistributedError) as info:
        flood.distributed()
    assert str(small_runs_disk) in str(info.value)
    assert "No space left on device" in str(info.value)
    assert not list(small_runs_disk.glob("*/payload.pkl"))
    # The user frees space, as the message says, and calls again: the same launcher serves it.
    for log in small_runs_disk.glob("*/logs/*.txt"):
        log.unlink()
    assert _launcher_pid.distributed() == [first, first]


@pytest.mark.timeout(120)
def test_payload_that_does_not_fit_leaves_no_partial_file(small_runs_disk: Path) -> None:
    @distributed(gpus=2, tracking=False, output="none", standby=False)
    def size(data: bytes) -> int:
        return len(data)

    with pytest.raises(DistributedError) as info:
        size.distributed(b"x" * (30 << 20))
    assert str(small_runs_disk) in str(info.value)
    assert not list(small_runs_disk.glob("*/payload.pkl"))
    assert size.distributed(b"x" * 10) == [10, 10]


def test_rank_messages_still_arrive() -> None:
    """The launcher's own framing reads what ranks send with multiprocessing's Connection."""
    got: list[object] = []

    @distributed(gpus=2, tracking=False, output="none", standby=False)
    def send() -> int:
        runtime.send_to_caller("big", b"y" * (3 << 20))
        runtime.send_to_caller("small", runtime.get_global_rank())
        return 7

    handle = send.start()
    handle.subscribe(lambda event: got.append(getattr(event, "data", None)))
    assert handle.result(timeout=120) == [7, 7]
    assert got.count(b"y" * (3 << 20)) == 2
    assert {0, 1} <= set(got)


def _fill(folder: Path) -> Path:
    """Take every free page of the filesystem ``folder`` is on, as another program would."""
    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(b"x" * (1 << 16))
    return filler


@pytest.mark.timeout(120)
def test_a_run_directory_that_cannot_be_made_names_the_folder_and_the_way_out(
    small_runs_disk: Path,
) -> None:
    filler = _fill(small_runs_disk)
    with pytest.raises(StorageError) as info:
        _launcher_pid.distributed()
    text = str(info.value)
    assert text.startswith(f"could not create the run directory in {small_runs_disk}"), text
    assert "No space left on device" in text and "None" not in text, text
    assert f"Free space in {small_runs_disk} or set {RUNS_DIR_ENV}" in text, text
    assert info.value.errno == errno.ENOSPC
    filler.unlink()  # as the message says: the next call works
    assert len(_launcher_pid.distributed()) == 2


@pytest.mark.timeout(120)
def test_a_result_the_full_disk_cannot_take_says_which_rank_returned_what(
    small_runs_disk: Path,
) -> None:
    @distributed(gpus=1, tracking=False, output="none", standby=False)
    def big() -> bytes:
        _fill(small_runs_disk)  # nothing is left for the result, nor for its error record
        return b"x" * (50 << 20)

    handle = big.start()
    with pytest.raises(DistributedError) as info:
        handle.result(timeout=100)
    text = str(info.value)
    assert text.startswith("rank 0 returned a builtins.bytes that could not be written for"), text
    assert "raised returned" not in text and "No space left on device" in text, text
    assert f"Free space in {small_runs_disk} or set {RUNS_DIR_ENV}" in text, text
    assert handle.finished is not None
    assert handle.finished.message.splitlines()[0] == text.splitlines()[0]
