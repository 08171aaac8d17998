"""Faults on the caller's side become ``DistributedError`` subclasses, oversized payloads are
refused without pickling them whole, and an interrupt's traceback ends at the user's frames."""

from __future__ import annotations

import os
import signal
import textwrap
import threading
import time
import traceback
import tracemalloc
from pathlib import Path

import pytest
from procs import run_script

from serverless_gpu import ConfigurationError, DistributedError, distributed
from serverless_gpu.common.errors import PayloadTooLargeError, WaitTimeoutError
from serverless_gpu.runfiles.serialization import dump_payload

MiB = 2**20

"""The checkout under test, also for the scripts these tests start."""


def test_deleted_working_directory_is_a_configuration_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()

    @distributed(gpus=2, tracking=False, standby=False)
    def one() -> int:
        return 1

    with pytest.raises(ConfigurationError, match="working directory"):
        one.distributed()


def test_full_disk_is_a_distributed_error(tmp_path: Path) -> None:
    """A file-size limit makes the payload write fail as a full disk does (an OSError from
    write), without filling a real disk."""
    script = textwrap.dedent(
        """
        import resource, signal
        from serverless_gpu import distributed

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1_000_000, resource.RLIM_INFINITY))

        @distributed(gpus=2, tracking=False, standby=False)
        def size(data):
            return len(data)

        try:
            size.distributed(b"x" * 2_000_000)
        except BaseException as exc:
            print("RAISED", [c.__name__ for c in type(exc).__mro__], exc)
        """
    )
    env = {**os.environ, "SERVERLESS_GPU_TYPE": "cpu", "SERVERLESS_GPU_RUNS_DIR": str(tmp_path)}
    out = run_script(script, env=env, cwd=tmp_path)
    assert "RAISED" in out.stdout, out.stdout + out.stderr
    assert "'DistributedError'" in out.stdout, out.stdout
    assert "File too large" in out.stdout  # the cause, as the system said it


def test_result_timeout_is_ours_and_still_a_timeout_error() -> None:
    @distributed(gpus=2, tracking=False)
    def slow() -> None:
        time.sleep(30)

    handle = slow.start()
    try:
        with pytest.raises(WaitTimeoutError, match="still running") as info:
            handle.result(timeout=0.2)
        assert isinstance(info.value, TimeoutError)
        assert isinstance(info.value, DistributedError)
    finally:
        handle.cancel()
        assert handle.wait(30)


def test_oversized_argument_is_refused_without_pickling_it_whole() -> None:
    data = b"x" * (300 * MiB)
    tracemalloc.start()
    try:
        with pytest.raises(PayloadTooLargeError, match="100 MiB") as info:
            dump_payload(len, (data,), {}, 100 * MiB)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 10 * MiB, f"pickling allocated {peak / MiB:.0f} MiB"
    assert info.value.limit == 100 * MiB


def test_pickling_stops_soon_after_the_limit() -> None:
    chunks = [bytes([i]) * MiB for i in range(40)]  # distinct objects: no memo hits
    tracemalloc.start()
    try:
        with pytest.raises(PayloadTooLargeError):
            dump_payload(len, (chunks,), {}, 8 * MiB)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 12 * MiB, f"pickling allocated {peak / MiB:.0f} MiB before stopping"


def test_interrupt_traceback_ends_at_the_users_frames() -> None:
    @distributed(gpus=2, tracking=False)
    def sleeps() -> None:
        time.sleep(30)

    timer = threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt) as info:
            sleeps.distributed()
    finally:
        timer.cancel()
    files = [frame.filename for frame in traceback.extract_tb(info.value.__traceback__)]
    ours = [f for f in files if "serverless_gpu" in f and not f.endswith("decorator.py")]
    assert not ours, files
    assert not any(f.endswith("queue.py") or f.endswith("threading.py") for f in files), files


def test_oversized_tensor_argument_is_refused_before_torch_copies_it() -> None:
    torch = pytest.importorskip("torch")
    tensor = torch.ones(300 * MiB // 4)
    tracemalloc.start()
    try:
        with pytest.raises(PayloadTooLargeError):
            dump_payload(len, (tensor,), {}, 100 * MiB)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 10 * MiB, f"pickling allocated {peak / MiB:.0f} MiB"
    # The same tensor twice is pickled (and counted) once.
    base = torch.ones(60 * MiB // 4)
    assert len(dump_payload(len, (base, base), {}, 100 * MiB)) > 60 * MiB
