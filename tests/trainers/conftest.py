"""Fixtures for the third-party trainer tests: CPU ranks, no tracking, no leaked processes."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def cpu_ranks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, no_leaked_children: None) -> None:
    """CPU ranks in the test's own folder; each test ends with the launcher shut down and no
    child process of ours left."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SERVERLESS_GPU_TYPE", "cpu")
    for name in ("ACCELERATE_USE_CPU", "GLOO_SOCKET_IFNAME"):
        monkeypatch.delenv(name, raising=False)
