"""``run --detach`` with ``-m``, then ``runs list``, ``runs logs --follow`` and ``runs cancel``."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import psutil
from conftest import COMMAND, Cli

TICKER = """
    import argparse
    import time

    parser = argparse.ArgumentParser()
    parser.add_argument("--every", type=float)
    args = parser.parse_args()
    for n in range(3000):
        print(f"{__name__} tick {n}", flush=True)
        time.sleep(args.every)
"""


def test_detached_module_is_listed_followed_and_cancelled(
    cli: Cli, write: Callable[[str, str], Path], tmp_path: Path
) -> None:
    write("ticker.py", TICKER)
    started = cli(
        "run", "--detach", "--gpus", "2", "--gpu-type", "cpu", "-m", "ticker", "--every", "0.2"
    )
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.split()[0]
    assert f"serverless-gpu runs cancel {run_id}" in started.stderr
    (record_file,) = (tmp_path / "runs").glob(f"*-{run_id}/run.json")
    record = json.loads(record_file.read_text())
    assert record["detached"] and record["command"] == "-m ticker --every 0.2"
    detached = psutil.Process(record["cli_pid"])
    tree = [detached, *detached.children(recursive=True)]  # the run, its launcher, its ranks

    listed = cli("runs", "list")
    assert any(
        line.split()[:3] == [run_id, "ticker", "running"] for line in listed.stdout.splitlines()
    )

    follow = subprocess.Popen(
        [*COMMAND, "runs", "logs", run_id, "--rank", "0", "--follow"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert follow.stdout is not None
        first = follow.stdout.readline()  # bounded: the run prints every 0.2 s
        assert first.startswith("__main__ tick ")
        cancelled = cli("runs", "cancel", run_id[:8])
        assert cancelled.returncode == 0, cancelled.stderr
        assert cancelled.stdout.strip() == f"{run_id}: cancelled"
        assert follow.wait(timeout=30) == 0  # following ends with the run
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.wait(10)
    _, alive = psutil.wait_procs(tree, timeout=15)
    assert not alive, [p.cmdline() for p in alive]
    assert "cancelled" in cli("runs", "show", run_id).stdout
