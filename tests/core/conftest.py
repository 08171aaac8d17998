"""Fixtures for the core tests: CPU mode, and no process of ours may survive a test (the
module's launcher and its idle standby ranks excepted, see ``no_leaked_children``)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from procs import wait_gone

WaitGone = Callable[..., set[int]]


@pytest.fixture
def gone() -> WaitGone:
    """``gone(pids, timeout)`` -> the pids still alive after waiting."""
    return wait_gone


@pytest.fixture(autouse=True)
def cpu_mode(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    monkeypatch.setenv("SERVERLESS_GPU_TYPE", "cpu")
    # Tracking is on by default: keep MLflow's default ./mlflow.db out of the repository.
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))


@pytest.fixture(autouse=True)
def no_leaked_processes(no_leaked_children: None) -> None:
    """Every core test ends with no process of ours left but the module's launcher."""
