"""A run's result and end belong to the run, not to whoever reads its handle: every reader gets
the same value, a finished run keeps no descriptor, payload or tmpfs result, and its status is
live whether or not anyone polls."""

from __future__ import annotations

import gc
import math
import os
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from eventually import eventually
from procs import run_script

import serverless_gpu
from serverless_gpu import distributed
from serverless_gpu.caller.runrecord import read_record
from serverless_gpu.common.errors import SerializationError
from serverless_gpu.runfiles.rundirs import RESULTS_DIR_ENV, RUNS_DIR_ENV
from serverless_gpu.wire.events import RunFinished, RunStatus

pytestmark = pytest.mark.timeout(300)
_WAIT_S = 60.0


@pytest.fixture(autouse=True)
def private_roots(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The runs and the results twins of this test only (the twins stand for /dev/shm)."""
    monkeypatch.setenv("SERVERLESS_GPU_CPU_SLOTS", "2")
    monkeypatch.setenv(RUNS_DIR_ENV, str(tmp_path / "runs"))
    monkeypatch.setenv(RESULTS_DIR_ENV, str(tmp_path / "shm"))
    return tmp_path


@distributed(gpus=1, gpu_type="cpu", tracking=False, standby=False, timeout=120, output="none")
def square(x: int) -> dict[str, Any]:
    return {"x": x, "square": x * x, "blob": b"r" * 4096}


def _twin_files(root: Path) -> list[Path]:
    # os.walk, not rglob: the finisher removes a run's twin folder while we look, and rglob raises
    # FileNotFoundError for a folder that vanished between listing and entering it.
    return [
        Path(folder, name)
        for folder, _, names in os.walk(root / "shm")
        for name in names
        if name.startswith("result_")
    ]


def test_two_threads_reading_every_handle_get_the_same_values() -> None:
    handles = square.map(range(20))
    seen: dict[str, list[Any]] = {"a": [], "b": []}
    errors: list[BaseException] = []

    def read(name: str) -> None:
        for h in handles:
            try:
                seen[name].append(h.result(_WAIT_S)[0]["square"])
            except BaseException as exc:
                errors.append(exc)

    threads = [threading.Thread(target=read, args=(n,)) for n in seen]
    for t in threads:
        t.start()
    for t in threads:
        t.join(_WAIT_S * 2)
    assert not errors, f"a reader failed: {errors[0]!r}"
    assert seen["a"] == seen["b"] == [x * x for x in range(20)]
    assert all(h.result(0) is h.result(0) for h in handles), "a result was loaded twice"


def test_the_documented_map_flow_while_a_background_reader_polls() -> None:
    """The notebook's runs table reads ``result(0)`` in the background, as here."""
    hs = square.map(range(8))
    stop = threading.Event()
    background_errors: list[BaseException] = []

    def table() -> None:
        while not stop.is_set():
            for h in hs:
                if h.status is RunStatus.SUCCEEDED:
                    try:
                        h.result(0)
                    except BaseException as exc:
                        background_errors.append(exc)
            stop.wait(0.001)

    poller = threading.Thread(target=table)
    poller.start()
    try:
        values = [h.result()[0]["x"] for h in hs]
    finally:
        stop.set()
        poller.join(_WAIT_S)
    assert values == list(range(8))
    assert not background_errors, repr(background_errors[0])


def test_a_status_loop_ends_without_polling() -> None:
    h = square.start(3)
    eventually(lambda: h.status is RunStatus.SUCCEEDED, "status shows the run's end", _WAIT_S)
    assert h.result(0)[0]["square"] == 9


def test_a_wait_only_handle_leaves_nothing_on_the_tmpfs(private_roots: Path) -> None:
    h = square.start(4)
    assert h.wait(_WAIT_S)
    eventually(lambda: not _twin_files(private_roots), "the twin emptied once the run ended")
    assert not h.context.paths.payload.exists()
    assert h.result(0)[0]["square"] == 16, "the spilled result is still the run's"


def test_a_dropped_handle_leaves_nothing_behind(private_roots: Path) -> None:
    h = square.start(5)
    paths = h.context.paths
    del h
    gc.collect()
    ended = lambda: read_record(paths.run_dir).get("status") == "succeeded"  # noqa: E731
    eventually(ended, "run.json records the end", _WAIT_S)
    gc.collect()
    eventually(lambda: not _twin_files(private_roots), "the twin emptied once the run ended")
    spilled = lambda: gc.collect() >= 0 and list(paths.run_dir.glob("result_*"))  # noqa: E731
    eventually(lambda: not spilled(), "no spilled result is kept")
    assert not paths.payload.exists()


_MANY_TRIALS = """
import resource, sys
import serverless_gpu
from serverless_gpu import distributed

soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))

@distributed(gpus=1, gpu_type="cpu", tracking=False, standby=False, timeout=120, output="none")
def trial(x):
    return x + 1

outcomes = serverless_gpu.sweep(trial, list(range(150)), max_concurrent=2, timeout=240)
bad = [o for o in outcomes if isinstance(o, BaseException)]
print("errors", len(bad), repr(bad[:1]))
print("values", sum(o[0] for o in outcomes if not isinstance(o, BaseException)))
"""


def test_many_trials_under_a_low_descriptor_limit_all_return(private_roots: Path) -> None:
    done = run_script(textwrap.dedent(_MANY_TRIALS), timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "errors 0 " in done.stdout, done.stdout[-3000:]
    assert f"values {sum(range(1, 151))}" in done.stdout


@distributed(gpus=1, gpu_type="cpu", tracking=False, standby=False, timeout=30, output="none")
def until_stopped() -> str:
    from serverless_gpu import runtime

    while not runtime.should_stop():
        time.sleep(0.05)
    return "stopped"


@pytest.mark.parametrize("bad", [math.nan, -1.0])
def test_a_nan_or_negative_timeout_is_refused(bad: float) -> None:
    h = until_stopped.start()
    try:
        with pytest.raises(ValueError, match="timeout"):
            h.result(bad)
        with pytest.raises(ValueError, match="timeout"):
            h.wait(bad)
        with pytest.raises(ValueError, match="timeout"):
            list(serverless_gpu.as_completed([h], timeout=bad))
        with pytest.raises(ValueError, match="timeout"):
            serverless_gpu.wait([h], timeout=bad)
        with pytest.raises(ValueError, match="timeout"):
            serverless_gpu.sweep(square, [1], timeout=bad)
    finally:
        h.cancel(force=True)
        h.wait(_WAIT_S)


class _Unpicklable:
    def __reduce__(self) -> Any:
        raise TypeError("cannot pickle this item")


def test_a_map_with_an_unpicklable_item_starts_no_run(private_roots: Path) -> None:
    with pytest.raises(SerializationError, match="cannot pickle this item") as info:
        square.map([1, 2, 3, _Unpicklable()])
    assert "item 3 of the map; no run of the map was started" in str(info.value.__notes__)
    runs = private_roots / "runs"
    assert not runs.exists() or not [p for p in runs.iterdir() if p.is_dir()], "a run started"


def crash_first_attempt(tag: str) -> tuple[str, int]:
    """Killed on attempt 0 (a crash: retried); the item and the attempt number after."""
    from serverless_gpu import runtime

    if runtime.attempt() == 0:
        os._exit(3)
    return tag, runtime.attempt()


def test_sweep_trials_honour_max_retries(capsys: pytest.CaptureFixture[str]) -> None:
    fn = distributed(gpus=1, max_retries=1, tracking=False, standby=False, output="none")(
        crash_first_attempt
    )
    outcomes = serverless_gpu.sweep(fn, ["a", "b", "c"], max_concurrent=2)
    assert [o if isinstance(o, BaseException) else list(o) for o in outcomes] == [
        [("a", 1)],
        [("b", 1)],
        [("c", 1)],
    ]
    assert capsys.readouterr().err.count("starting attempt 1, retry 1 of 1") == 3


def crash_first_attempt_if(tag: str, crash: bool) -> tuple[str, int]:
    """Killed on attempt 0 when ``crash`` (a crash: retried); the item and the attempt number."""
    from serverless_gpu import runtime

    if crash and runtime.attempt() == 0:
        os._exit(3)
    return tag, runtime.attempt()


_CRASHES = [("a", False), ("b", True), ("c", False)]


def _crashing(max_retries: int) -> serverless_gpu.DistributedFunction[..., tuple[str, int]]:
    return distributed(
        gpus=1, max_retries=max_retries, tracking=False, standby=False, output="none"
    )(crash_first_attempt_if)


def test_map_handles_follow_a_retried_item_to_its_last_attempt(
    capsys: pytest.CaptureFixture[str],
) -> None:
    handles = _crashing(1).map(_CRASHES)
    first_run = handles[1].run_id
    seen: list[RunStatus] = []
    handles[1].subscribe(lambda e: seen.append(e.status) if isinstance(e, RunFinished) else None)
    assert [list(h.result(_WAIT_S)) for h in handles] == [[("a", 0)], [("b", 1)], [("c", 0)]]
    assert handles[1].run_id != first_run  # the attempt that succeeded is a run of its own
    assert handles[1].status is RunStatus.SUCCEEDED and handles[1].done()
    assert seen == [RunStatus.FAILED, RunStatus.SUCCEEDED]  # a subscriber follows the retry
    err = capsys.readouterr().err
    assert err.count("starting attempt 1, retry 1 of 1") == 1, err


def test_without_max_retries_a_map_item_crash_is_its_error() -> None:
    handles = _crashing(0).map(_CRASHES)
    with pytest.raises(serverless_gpu.RankFailedError, match="exited with code 3"):
        handles[1].result(_WAIT_S)
    assert [list(handles[i].result(_WAIT_S)) for i in (0, 2)] == [[("a", 0)], [("c", 0)]]


def test_as_completed_yields_a_retrying_map_handle_once_after_its_last_attempt() -> None:
    handles = _crashing(1).map(_CRASHES)
    yielded = list(serverless_gpu.as_completed(handles, _WAIT_S))
    assert sorted(map(id, yielded)) == sorted(map(id, handles))
    assert [h.status for h in yielded] == [RunStatus.SUCCEEDED] * 3
    assert sorted(h.result(0)[0] for h in yielded) == [("a", 0), ("b", 1), ("c", 0)]
    done, not_done = serverless_gpu.wait(handles, 0)
    assert len(done) == 3 and not not_done


def test_a_map_handle_retries_no_plain_exception_and_no_cancel(tmp_path: Path) -> None:
    from recovery_fns import resets_signals, value_error

    failing = distributed(gpus=1, max_retries=2, tracking=False, standby=False, output="none")
    (tmp_path / "raises").mkdir()
    (raising,) = failing(value_error).map([str(tmp_path / "raises")])
    with pytest.raises(ValueError, match="bad labels"):
        raising.result(_WAIT_S)
    assert [p.name.split("_")[1] for p in (tmp_path / "raises").iterdir()] == ["0"]
    (tmp_path / "named").mkdir()
    named = failing(value_error).with_overrides(max_retries=1, retry_on=(ValueError,))
    with pytest.raises(ValueError) as info:
        named.map([str(tmp_path / "named")])[0].result(_WAIT_S)
    assert sorted(p.name.split("_")[1] for p in (tmp_path / "named").iterdir()) == ["0", "1"]
    assert "the call was attempted 2 times:" in "\n".join(info.value.__notes__)
    (tmp_path / "cancels").mkdir()
    (working,) = failing(resets_signals).map([(str(tmp_path / "cancels"), [], 120)])
    eventually(lambda: "ready" in working.logs(0), "the rank works", _WAIT_S)
    working.cancel()
    with pytest.raises(serverless_gpu.CancelledError):
        working.result(_WAIT_S)
    assert working.status is RunStatus.CANCELLED
    assert [p.name.split("_")[1] for p in (tmp_path / "cancels").iterdir()] == ["0"]


def test_a_started_call_is_retried_while_nobody_waits_on_it() -> None:
    handle = _crashing(1).start("b", True)
    first_run = handle.run_id
    eventually(lambda: handle.status is RunStatus.SUCCEEDED, "the retry succeeded", _WAIT_S)
    assert handle.run_id != first_run
    assert list(handle.result(0)) == [("b", 1)]
