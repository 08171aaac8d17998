"""The session fault matrix: every fault x where the group came from x the session's place in its
process, each fault followed by a cell that checks the namespace and an all-reduce (rank death:
a clear end). One caller process per situation runs ``session_matrix.py``; the regressions
it guards: a session whose ranks start with the group formed could not recover from a failed,
interrupted or cancelled cell ("Process group cannot be None"), nor from a destroy and a later
init."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import session_matrix
from procs import run_script

RUNS = (
    ("first", "pre-formed"),
    ("first", "user"),
    ("first", "no-warm"),
    ("after-call", "pre-formed,user,no-warm"),
    ("second", "pre-formed,user,no-warm"),
)
DRIVER = Path(session_matrix.__file__).read_text()


@pytest.mark.timeout(session_matrix.DRIVER_S + 60)
@pytest.mark.parametrize(("situation", "origins"), RUNS, ids=[f"{s}-{o}" for s, o in RUNS])
def test_every_fault_leaves_a_working_session(situation: str, origins: str, tmp_path: Path) -> None:
    env = {"SERVERLESS_GPU_TYPE": "cpu", "SERVERLESS_GPU_RUNS_DIR": str(tmp_path / "runs")}
    # the driver bounds itself (each cell, then the whole run: it prints its stacks and exits)
    limit = session_matrix.DRIVER_S + 30
    done = run_script(
        DRIVER, situation, origins, env={**os.environ, **env}, cwd=tmp_path, timeout=limit
    )
    session_matrix.check_output(done.stdout, done.stderr, situation, origins)
