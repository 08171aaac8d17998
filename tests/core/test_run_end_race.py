"""A run that ends before its call is back from starting it (a fast attempt on a loaded
machine: the launcher ends it and the finisher thread dispatches its end while the caller is
still between submitting and waiting) is seen whole by its subscribers: the console prints it,
its record says how it ended. Its subscribers were attached after the submit, so they saw
none of it: no output, a record left "running", an MLflow run the exit marked KILLED."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from eventually import eventually

from serverless_gpu import distributed
from serverless_gpu.caller.runrecord import read_record


def _rank() -> int:
    print("inside", flush=True)
    return int(os.environ["RANK"])


def test_a_run_that_ends_before_the_call_waits_is_seen_by_its_subscribers(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setenv("SERVERLESS_GPU_RUNS_DIR", str(tmp_path / "runs"))
    fn = distributed(gpus=2, gpu_type="cpu", tracking=False)(_rank)
    backend = fn.backend
    submit = backend.submit

    def submit_then_let_it_end(ctx: Any, payload: bytes) -> Any:
        handle = submit(ctx, payload)  # the order a loaded machine gives at times
        eventually(lambda: handle.finished is not None, "the finisher to handle the run's end")
        return handle

    monkeypatch.setattr(backend, "submit", submit_then_let_it_end)
    result = fn.distributed()
    assert list(result) == [0, 1]
    out = capsys.readouterr().out
    assert "[rank 0] inside" in out and "run succeeded" in out, out
    assert read_record(Path(result.run_dir))["status"] == "succeeded"
