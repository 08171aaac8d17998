"""Persistent sessions on the Ray cluster (``Session(remote=True)``): the local sessions' fault
matrix on a 2-node cluster, a node lost while a session idles, a killed caller, and an idle
session that the standby reaper leaves alone."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

SESSIONS = Path(__file__).resolve().parents[1] / "sessions"
sys.path.insert(0, str(SESSIONS))
import session_matrix  # noqa: E402
from procs import run_script  # noqa: E402

pytestmark = pytest.mark.timeout(600)

WORLD = 4
"""Ranks per session: two on each worker node, so every collective crosses nodes."""
RUNS = (
    ("first", "user,no-warm"),
    ("after-call", "pre-formed,user,no-warm"),
    ("second", "user"),
)
DRIVER = (SESSIONS / "session_matrix.py").read_text()


@pytest.mark.parametrize(("situation", "origins"), RUNS, ids=[f"{s}-{o}" for s, o in RUNS])
def test_every_fault_leaves_a_working_remote_session(
    cluster: Any, situation: str, origins: str, tmp_path: Path
) -> None:
    env = {
        **os.environ,
        "RAY_ADDRESS": cluster.address,
        "SERVERLESS_GPU_TYPE": "cpu",
        "SERVERLESS_GPU_RUNS_DIR": str(tmp_path / "runs"),
        "SESSION_MATRIX_REMOTE": "1",
        "SESSION_MATRIX_WORLD": str(WORLD),
    }
    done = run_script(DRIVER, situation, origins, env=env, cwd=tmp_path, timeout=540)
    cases = [json.loads(x[5:]) for x in done.stdout.splitlines() if x.startswith("CASE ")]
    want = len(origins.split(",")) * len(session_matrix.FAULTS)
    assert len(cases) == want, f"{len(cases)} of {want} cases ran:\n{done.stdout}\n{done.stderr}"
    failed = [c for c in cases if not c["ok"]]
    table = "\n".join(f"{c['origin']:>10} {c['fault']:>20}: {c['detail']}" for c in failed)
    assert not failed, f"{len(failed)} of {len(cases)} cases failed ({situation}):\n{table}"
