"""What ``from_run_id`` says about a run directory it cannot take at its word: a damaged record,
results deleted by something other than their caller, an id that is no id. The run directories
are written here as a run leaves them (no launcher: only the files are read)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from serverless_gpu import ConfigurationError, DistributedError, RunHandle
from serverless_gpu.caller.reattach import RecordedRun
from serverless_gpu.caller.runrecord import find_run
from serverless_gpu.common.errors import UsageError
from serverless_gpu.runfiles.rundirs import RESULTS_DIR_ENV, RUNS_DIR_ENV
from serverless_gpu.wire.runpaths import MARKER, RunPaths, run_dir_name

RUN_ID = "0123456789ab"


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """Write a run directory with this record (``status`` etc.); returns its RunPaths."""
    monkeypatch.setenv(RUNS_DIR_ENV, str(tmp_path / "runs"))
    monkeypatch.setenv(RESULTS_DIR_ENV, "off")

    def make(**fields: Any) -> RunPaths:
        run_dir = tmp_path / "runs" / run_dir_name("20260101-000000", "train", RUN_ID)
        run_dir.mkdir(parents=True, mode=0o700)
        (run_dir / MARKER).touch()
        record = {"run_id": RUN_ID, "name": "train", "world_size": 2, "started": 1.0}
        paths = RunPaths(run_dir)
        paths.record.write_text(json.dumps({**record, **fields}))
        return paths

    return make


def test_a_damaged_status_names_the_record_and_the_logs(recorded: Any) -> None:
    paths = recorded(status="12", finished=2.0)
    back = RecordedRun(find_run(RUN_ID))
    with pytest.raises(ConfigurationError) as info:
        _ = back.status
    text = str(info.value)
    assert f"its record {paths.record} has a status this version does not know, '12'" in text
    assert "damaged" in text and str(paths.logs) in text
    with pytest.raises(ConfigurationError, match="does not know"):
        back.result(0)


def test_results_deleted_unread_are_not_blamed_on_the_caller(recorded: Any) -> None:
    recorded(status="succeeded", finished=2.0)  # its two result files deleted before any read
    with pytest.raises(DistributedError) as info:
        RecordedRun(find_run(RUN_ID)).result(0)
    text = str(info.value)
    assert "its caller read them (" not in text
    assert "results of rank(s) 0, 1 were deleted" in text and "before its caller read them" in text
    assert "the values are lost: run the function again" in text


def test_results_its_caller_read_or_dropped_are_said_to_be(recorded: Any) -> None:
    paths = recorded(status="succeeded", finished=2.0, results_gone="read")
    with pytest.raises(DistributedError, match="its caller read them"):
        RecordedRun(find_run(RUN_ID)).result(0)
    paths.record.write_text(paths.record.read_text().replace('"read"', '"dropped"'))
    with pytest.raises(DistributedError, match="dropped its handle without reading them"):
        RecordedRun(find_run(RUN_ID)).result(0)


def test_a_huge_id_is_refused_without_being_echoed_whole(recorded: Any) -> None:
    recorded(status="succeeded", finished=2.0)
    huge = "a" * 10 * 2**20
    with pytest.raises(UsageError) as info:
        RunHandle.from_run_id(huge)
    text = str(info.value)
    assert len(text) < 300 and "10,485,760 characters" in text, text
    with pytest.raises(ConfigurationError) as missing:
        find_run("f" * 5000)  # the listing's own reader cuts it too
    assert len(str(missing.value)) < 300
