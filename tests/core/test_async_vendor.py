"""The original API's asynchronous names, on real CPU runs: its status names and terminal set,
``result(logs=True)``, ``workload_metadata``, ``print_runs``, ``stop``, ``cleanup`` and
``from_run_id`` (this process's own runs, and runs read back from their run directories)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from eventually import eventually

from serverless_gpu import (
    CancelledError,
    ConfigurationError,
    DistributedError,
    RunHandle,
    distributed,
)
from serverless_gpu.asynchronous import (
    TERMINAL_STATUSES,
    DistributedFunctionCall,
    print_runs,
    stop,
)
from serverless_gpu.asynchronous import RunStatus as WorkloadStatus
from serverless_gpu.caller.reattach import RecordedRun
from serverless_gpu.caller.runrecord import find_run
from serverless_gpu.runfiles.rundirs import RESULTS_DIR_ENV, RUNS_DIR_ENV
from serverless_gpu.wire.events import RunStatus

pytestmark = pytest.mark.timeout(300)
_WAIT_S = 60.0


@pytest.fixture(autouse=True)
def private_roots(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("SERVERLESS_GPU_CPU_SLOTS", "2")
    monkeypatch.setenv(RUNS_DIR_ENV, str(tmp_path / "runs"))
    monkeypatch.setenv(RESULTS_DIR_ENV, str(tmp_path / "shm"))
    return tmp_path


_OPTIONS: dict[str, Any] = {"gpu_type": "cpu", "tracking": False, "standby": False, "timeout": 120}


@distributed(gpus=2, output="default", **_OPTIONS)
def chatty(lines: int) -> int:
    rank = int(os.environ["RANK"])
    for n in range(lines):
        print(f"line {n} of rank {rank}", flush=True)
    return rank * 10


@distributed(gpus=1, output="none", **_OPTIONS)
def gated(gate: str) -> str:
    """Runs until the file ``gate`` exists (bounded by the call's timeout)."""
    while not os.path.exists(gate):
        time.sleep(0.05)
    return "opened"


@distributed(gpus=1, output="none", **_OPTIONS)
def raises(key: str) -> None:
    raise KeyError(key)


def test_a_loop_on_the_originals_terminal_set_ends_with_its_names(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    first, second = gated.start(str(gate)), gated.start(str(gate))
    third = gated.start(str(gate))  # two CPU slots: it waits for one
    eventually(lambda: third.status == WorkloadStatus.PENDING, "the third run pending")
    eventually(lambda: first.status == WorkloadStatus.RUNNING, "the first run running")
    assert first.status not in TERMINAL_STATUSES
    assert WorkloadStatus.of(third.status) is WorkloadStatus.PENDING
    stop([second])
    gate.touch()
    eventually(lambda: first.status in TERMINAL_STATUSES, "the first run's end", _WAIT_S)
    assert first.status == WorkloadStatus.COMPLETED and first.status != WorkloadStatus.FAILED
    eventually(lambda: second.status in TERMINAL_STATUSES, "the stopped run's end", _WAIT_S)
    assert second.status == WorkloadStatus.STOPPED
    with pytest.raises(CancelledError, match=r"stopped by serverless_gpu\.stop\(\)"):
        second.result(0)
    failed = raises.start("missing")
    eventually(lambda: failed.status in TERMINAL_STATUSES, "the failing run's end", _WAIT_S)
    assert failed.status == WorkloadStatus.FAILED
    assert third.result(_WAIT_S)[0] == "opened"


def test_result_with_logs_prints_every_ranks_lines_once(capsys: pytest.CaptureFixture[str]) -> None:
    h = chatty.start(3)
    assert h.result(logs=True) == [0, 10]
    out = capsys.readouterr().out
    for rank in (0, 1):
        for n in range(3):
            assert out.count(f"[rank {rank}] line {n} of rank {rank}\n") == 1, out
    again = chatty.start(1)
    assert again.result(True) == [0, 10]  # the original's one argument, by position
    assert "[rank 1] line 0 of rank 1" in capsys.readouterr().out


def test_workload_metadata_print_runs_and_cleanup(capsys: pytest.CaptureFixture[str]) -> None:
    handles = gated.map([str(Path.cwd())])  # the gate exists: it returns at once
    h = handles[0]
    assert h.result(_WAIT_S)[0] == "opened"
    meta = h.workload_metadata
    assert (meta.name, meta.gpus, meta.instance) == ("gated", 1, "CPU")
    assert meta.workload_run == h.run_id and meta.status == WorkloadStatus.COMPLETED
    assert meta.params == {"gate": str(Path.cwd())}
    assert meta.view_logs_link == str(h.run_dir / "logs")
    assert meta.workload_run_link == str(h.run_dir) and meta.links == h.links == {}
    h.cleanup()
    print_runs(handles)
    out = capsys.readouterr().out
    assert f"Run ID   : {h.run_id}" in out and "Status   : succeeded" in out
    assert "Function : gated" in out and "GPUs     : 1 x CPU" in out


def test_from_run_id_gives_this_processs_own_handle(tmp_path: Path) -> None:
    h = gated.start(str(tmp_path))
    assert RunHandle.from_run_id(h.run_id) is h
    assert DistributedFunctionCall.from_run_id(h.run_id[:6]) is h  # a unique prefix will do
    assert h.result(_WAIT_S)[0] == "opened"
    with pytest.raises(ConfigurationError, match="no run 'feedface'"):
        RunHandle.from_run_id("feedface")


def test_a_run_read_back_from_its_directory_raises_the_ranks_own_error() -> None:
    h = raises.start("lost-key")
    assert h.wait(_WAIT_S)

    back = RecordedRun(find_run(h.run_id))  # what another process's from_run_id gives

    assert isinstance(back, RecordedRun) and isinstance(back, DistributedFunctionCall)
    assert back.status is RunStatus.FAILED and back.status in TERMINAL_STATUSES
    assert back.done() and back.wait(0)
    assert "KeyError" in back.logs(0)
    assert back.workload_metadata.name == "raises"
    with pytest.raises(KeyError, match="lost-key"):
        back.result(0)


def test_a_run_of_another_caller_is_not_cancelled_from_its_directory(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    h = gated.start(str(gate))
    eventually(lambda: h.status is RunStatus.RUNNING, "the run running")
    back = RecordedRun(find_run(h.run_id))
    assert back.status == WorkloadStatus.RUNNING and not back.wait(0)
    with pytest.raises(ConfigurationError, match="was not started by `serverless-gpu run`"):
        back.cancel()
    gate.touch()
    assert back.result(_WAIT_S).run_id == h.run_id  # its unread result, from the run directory
    assert h.result(0)[0] == "opened"  # and still the caller's
    with pytest.raises(DistributedError, match="its caller read them"):
        back.result(0)  # once the caller has read them, they are gone


def test_the_originals_module_and_names() -> None:
    from serverless_gpu import asynchronous, compat

    assert asynchronous.DistributedFunctionCall is compat.DistributedFunctionCall is RunHandle
    assert asynchronous.RunStatus is compat.WorkloadStatus
    assert asynchronous.TERMINAL_STATUSES is compat.TERMINAL_STATUSES
    assert asynchronous.print_runs is compat.print_runs and asynchronous.stop is compat.stop
    assert [WorkloadStatus.of(s).value for s in RunStatus] == [
        "PENDING",
        "STARTING",
        "RUNNING",
        "COMPLETED",
        "FAILED",
        "FAILED",
        "STOPPED",
    ]
