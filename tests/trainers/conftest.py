"""Fixtures for the third-party trainer tests: CPU ranks, no tracking, no leaked processes."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

import serverless_gpu


@pytest.fixture(autouse=True)
def cpu_ranks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """CPU ranks in the test's own folder; each test ends with the launcher shut down and no
    child process of ours left."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SERVERLESS_GPU_TYPE", "cpu")
    for name in ("ACCELERATE_USE_CPU", "GLOO_SOCKET_IFNAME"):
        monkeypatch.delenv(name, raising=False)
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    yield
    serverless_gpu.shutdown()
    deadline = time.monotonic() + 10
    while True:
        leaked = [p for p in me.children(recursive=True) if p.pid not in before and _alive(p)]
        if not leaked or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert not leaked, f"child processes survived the test: {[p.cmdline() for p in leaked]}"


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
