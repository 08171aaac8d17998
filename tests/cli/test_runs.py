"""``serverless-gpu runs``: what it shows of run directories whose records were damaged."""

from __future__ import annotations

import time
from pathlib import Path

from conftest import Cli

from serverless_gpu.caller.runrecord import RunInfo, read_record, update_record
from serverless_gpu.runfiles.rundirs import new_run_dir, release_run
from serverless_gpu.wire.events import RunStatus

DAMAGES = [
    '{"links": 5}',
    '{"started": 1e308}',
    '{"started": NaN}',
    '{"finished": 1e308, "status": "succeeded"}',
    '{"status": ["running"], "world_size": {}}',
    '{"run_id": "x", "status',  # cut short
    '["not", "a", "record"]',
    "\udcff",  # not UTF-8
]


def _run_dir(name: str, record: dict[str, object]) -> tuple[str, Path]:
    run_id, run_dir, _ = new_run_dir(name)
    release_run(run_dir)
    update_record(run_dir, {"run_id": run_id, "name": name, "status": "succeeded", **record})
    return run_id, run_dir


def test_damaged_records_are_listed_as_unreadable_among_the_others(cli: Cli) -> None:
    good_id, _ = _run_dir("good", {"started": time.time() - 60, "world_size": 2})
    damaged = {}
    for damage in DAMAGES:
        run_id, run_dir = _run_dir("bad", {})
        (run_dir / "run.json").write_bytes(damage.encode(errors="surrogateescape"))
        damaged[run_id] = run_dir
    listed = cli("runs", "list", timeout=60)
    assert listed.returncode == 0, listed.stderr
    rows = {line.split()[0]: line.split() for line in listed.stdout.splitlines()[1:]}
    assert rows[good_id][1:3] == ["good", "succeeded"]
    for run_id in damaged:
        assert "unreadable" in rows[run_id], (run_id, listed.stdout)
    for run_id, run_dir in list(damaged.items())[:2]:
        shown = cli("runs", "show", run_id, timeout=60)
        assert shown.returncode == 0, shown.stderr
        assert "status:    unreadable" in shown.stdout
        assert str(run_dir / "run.json") in shown.stdout


def test_a_record_that_says_pending_reads_as_starting() -> None:
    """Records written before ``RunStatus.STARTING`` was named so said ``pending``."""
    run_id, run_dir = _run_dir("older", {"status": "pending"})
    assert RunInfo(run_id, run_dir, read_record(run_dir)).status == "starting"
    assert RunStatus("pending") is RunStatus.STARTING
    assert not RunStatus("pending").finished
