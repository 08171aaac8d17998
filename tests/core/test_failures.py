"""Every fault a rank can have, and every mistake a caller can make, on 2 CPU ranks."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from eventually import eventually

from serverless_gpu import (
    DistributedError,
    DistributedTimeoutError,
    RankFailedError,
    distributed,
    runtime,
)
from serverless_gpu.common.errors import (
    GPUConfigError,
    PayloadTooLargeError,
    RemoteError,
    RemoteTraceback,
    SerializationError,
)
from serverless_gpu.wire.events import RunStatus


class ShapeMismatch(ValueError):
    pass


def test_raise_on_one_rank_while_the_other_blocks_in_all_reduce(tmp_path: Path) -> None:
    marker = tmp_path / "raised_at"

    @distributed(gpus=2, gpu_type="cpu")
    def train() -> None:
        import torch
        import torch.distributed as dist

        runtime.init_process_group()
        if runtime.get_global_rank() == 1:
            marker.write_text(repr(time.time()))
            raise ShapeMismatch("bad shape on rank 1")
        dist.all_reduce(torch.ones(1))  # never completes: rank 1 is gone

    with pytest.raises(ShapeMismatch, match="bad shape on rank 1") as info:
        train.distributed()
    caught_at = time.time()
    exc = info.value
    assert caught_at - float(marker.read_text()) < 2.0
    assert isinstance(exc.__cause__, RemoteTraceback)
    assert "ShapeMismatch: bad shape on rank 1" in exc.__cause__.traceback_text
    assert exc.serverless_gpu_rank == 1  # type: ignore[attr-defined]
    assert any("raised on rank 1" in note for note in exc.__notes__)
    assert exc.serverless_gpu_run_dir.is_dir()  # type: ignore[attr-defined]


def test_every_ranks_failure_is_on_the_exception(tmp_path: Path) -> None:
    """torch elastic's "other failures": rank 0 raises first; rank 1 ignores the SIGTERM that
    stops the run and raises after it. The caller gets rank 0's exception, naming rank 1's."""
    ready = tmp_path / "rank_1_ignores_sigterm"

    @distributed(gpus=2, gpu_type="cpu")
    def train() -> None:
        import os
        import signal

        from serverless_gpu.wire.runpaths import RunPaths

        def after(path: Path) -> None:  # bounded wait for the other rank's step
            deadline = time.monotonic() + 30.0
            while not path.exists() and time.monotonic() < deadline:
                time.sleep(0.01)

        if runtime.get_global_rank() == 0:
            after(ready)
            raise ShapeMismatch("first")
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        ready.touch()
        after(RunPaths(Path(os.environ["SERVERLESS_GPU_RUN_DIR"])).error(0))  # rank 0's record
        raise RuntimeError("second")

    with pytest.raises(ShapeMismatch, match="first") as info:
        train.distributed()
    exc = info.value
    assert "other failures: rank 1 raised RuntimeError: second" in exc.__notes__
    from serverless_gpu import failures_of, rank_of, run_dir_of

    assert [(f.rank, f.message) for f in failures_of(exc)] == [
        (0, "raised ShapeMismatch: first"),
        (1, "raised RuntimeError: second"),
    ]
    run_dir = run_dir_of(exc)
    assert rank_of(exc) == 0 and run_dir is not None and run_dir.is_dir()


def test_segfault_is_named() -> None:
    @distributed(gpus=2)
    def crash() -> None:
        import ctypes
        import sys

        if runtime.get_global_rank() == 0:
            print("about to crash", file=sys.stderr)
            ctypes.string_at(0)
        time.sleep(30)

    with pytest.raises(RankFailedError) as info:
        crash.distributed()
    err = info.value
    assert err.rank == 0
    assert err.signal_name == "SIGSEGV"
    assert "about to crash" in str(err)
    assert err.failure.log_path is not None and err.failure.log_path.exists()


def test_sys_exit_code_is_reported() -> None:
    @distributed(gpus=2)
    def leave() -> None:
        import sys

        if runtime.get_global_rank() == 1:
            sys.exit(3)

    with pytest.raises(RankFailedError, match="rank 1 exited with code 3") as info:
        leave.distributed()
    assert info.value.exit_code == 3


def test_exit_zero_without_returning() -> None:
    @distributed(gpus=2)
    def vanish() -> int:
        import os

        if runtime.get_global_rank() == 0:
            os._exit(0)
        return 1

    with pytest.raises(RankFailedError, match="rank 0 exited with code 0 without returning"):
        vanish.distributed()


def test_timeout_kills_hanging_ranks() -> None:
    @distributed(gpus=2, timeout=2)
    def hang() -> None:
        if runtime.get_global_rank() == 1:
            time.sleep(60)

    _wait_for_launcher()  # time the timeout, not the launcher's start
    start = time.monotonic()
    with pytest.raises(DistributedTimeoutError) as info:
        hang.distributed()
    elapsed = time.monotonic() - start
    assert isinstance(info.value, TimeoutError)
    assert info.value.running_ranks == (1,)
    assert "timeout of 2 s" in str(info.value)
    # A bound, not a speed claim: the call ends soon after its timeout instead of hanging (the
    # MLflow run's start and end are inside the timed span; 5.1 s was seen on a loaded machine).
    assert 2.0 <= elapsed < 2.0 + 10.0


def _wait_for_launcher() -> None:
    @distributed(gpus=2, standby=False)
    def noop() -> None:
        pass

    noop.distributed()


def test_cancel_through_the_handle() -> None:
    @distributed(gpus=2)
    def forever() -> None:
        time.sleep(60)

    handle = forever.start()
    eventually(lambda: handle.status is RunStatus.RUNNING, "the run is running")
    handle.cancel("stop it")
    with pytest.raises(DistributedError, match="cancelled: stop it"):
        handle.result(timeout=30)  # a bound, not a speed claim: a loaded machine is slow
    assert handle.status is RunStatus.CANCELLED


def test_unpicklable_argument_is_named_before_launch() -> None:
    @distributed(gpus=2)
    def use(lock: object) -> None:
        pass

    with pytest.raises(SerializationError, match=r"argument 0.*_thread.lock"):
        use.distributed(threading.Lock())


_GLOBAL_LOCK = threading.Lock()


def test_unpicklable_capture_is_named_before_launch() -> None:
    holder = {"inner": [1, _GLOBAL_LOCK]}

    @distributed(gpus=2)
    def use() -> int:
        return len(holder)

    with pytest.raises(SerializationError, match=r"variable 'holder'.*\['inner'\] -> \[1\]"):
        use.distributed()


def test_unpicklable_result_names_rank_and_type() -> None:
    @distributed(gpus=2)
    def lock() -> object:
        return threading.Lock() if runtime.get_global_rank() == 1 else None

    with pytest.raises(SerializationError, match=r"rank 1 returned a _thread.lock"):
        lock.distributed()


class NeedsTwoArgs(Exception):
    def __init__(self, a: int, b: int) -> None:
        super().__init__(f"{a}/{b}")


def test_exception_that_cannot_be_unpickled_still_arrives() -> None:
    @distributed(gpus=2)
    def boom() -> None:
        raise NeedsTwoArgs(1, 2)

    with pytest.raises(RemoteError) as info:
        boom.distributed()
    err = info.value
    assert err.type_name.endswith("NeedsTwoArgs")
    assert err.remote_message == "1/2"
    assert "NeedsTwoArgs: 1/2" in err.remote_traceback


def test_exception_holding_an_unpicklable_object() -> None:
    @distributed(gpus=2)
    def boom() -> None:
        raise ValueError(threading.Lock())

    with pytest.raises(RemoteError, match="ValueError"):
        boom.distributed()


def test_oversized_payload_is_refused() -> None:
    @distributed(gpus=2, max_payload_bytes=1_000_000)
    def big(data: bytes) -> int:
        return len(data)

    with pytest.raises(PayloadTooLargeError, match="Load large data inside the function"):
        big.distributed(b"x" * 2_000_000)
    assert big.distributed(b"x" * 1000) == [1000, 1000]


def test_gpu_mode_without_gpus_says_how_to_use_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SERVERLESS_GPU_TYPE")

    @distributed(gpus=2)
    def nothing() -> None:
        pass

    with pytest.raises(GPUConfigError, match="gpu_type='cpu'"):
        nothing.distributed()

    @distributed(gpus=64, gpu_type="A10")
    def too_many() -> None:
        pass

    with pytest.raises(GPUConfigError, match="no GPU is visible"):
        too_many.distributed()
