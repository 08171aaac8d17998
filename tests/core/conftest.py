"""Fixtures for the core tests: CPU mode, and no process of ours may survive a test."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import psutil
import pytest

import serverless_gpu


def _descendants() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def wait_gone(pids: set[int], timeout: float) -> set[int]:
    """The pids still alive (zombies count as gone) after waiting up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    alive = set(pids)
    while alive and time.monotonic() < deadline:
        alive = {pid for pid in alive if _alive(pid)}
        if alive:
            time.sleep(0.05)
    return alive


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


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
def no_leaked_processes() -> Iterator[None]:
    before = _descendants()
    yield
    serverless_gpu.shutdown()
    leaked = wait_gone(_descendants() - before, timeout=5.0)
    assert not leaked, f"processes left behind: {[psutil.Process(p).cmdline() for p in leaked]}"
