"""Fixtures for the Jupyter extension tests: CPU mode, private run directories, test kernels
without MLflow tracking, and a check that no test leaves a process behind."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from IPython.core.interactiveshell import InteractiveShell
from jupyter_helpers import Kernel, KernelFactory, write_ipython_profile

from jupyter_ext import lifecycle
from serverless_gpu import tracking
from serverless_gpu.caller import hooks


@pytest.fixture(autouse=True)
def no_leftover_processes(no_leaked_children: None) -> None:
    """Every test leaves no child process of its own behind (after a short grace period), but
    the module's launcher and its idle standby ranks (tests/conftest.py)."""


@pytest.fixture(autouse=True)
def cpu_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """CPU ranks and run directories under the test's tmp dir (kernels inherit both).

    Returns the runs directory.
    """
    runs = tmp_path / "runs"
    monkeypatch.setenv("SERVERLESS_GPU_TYPE", "cpu")
    monkeypatch.setenv("SERVERLESS_GPU_RUNS_DIR", str(runs))
    monkeypatch.setenv("IPYTHONDIR", str(write_ipython_profile(tmp_path / "ipython")))
    monkeypatch.delenv("SERVERLESS_GPU_DISPLAY", raising=False)
    # Loading the extension starts the launcher in the background; tests that count processes
    # opt out (test_kernel.py::test_load_ext_warms_up_the_launcher turns it back on).
    monkeypatch.setenv("SERVERLESS_GPU_WARMUP", "0")
    return runs


@pytest.fixture
def in_process() -> Iterator[None]:
    """Runs made by the test process itself, untracked (the module's tests share a launcher)."""
    hooks.unregister_hook(tracking.tracking_hook)
    try:
        yield
    finally:
        hooks.register_hook(tracking.tracking_hook, order=10)


@pytest.fixture
def make_kernel(tmp_path: Path) -> Iterator[KernelFactory]:
    """``make_kernel(**env)``: a real ipykernel (the venv's python) started with this process's
    environment plus ``env``, the extension loaded; every kernel made is closed afterwards."""
    made: list[Kernel] = []

    def make(**env: str) -> Kernel:
        k = Kernel({**os.environ, **env}, cwd=tmp_path)
        made.append(k)
        out = k.run("%load_ext jupyter_ext\nimport sys; print(sys.executable)")
        assert not out.errors, out.all_text
        return k

    try:
        yield make
    finally:
        for k in made:
            k.close()


@pytest.fixture
def kernel(make_kernel: KernelFactory) -> Kernel:
    """A real ipykernel with the extension loaded and the test environment."""
    return make_kernel()


@pytest.fixture
def shell() -> Iterator[InteractiveShell]:
    """A real in-process IPython shell; the extension is unloaded and the shell cleared after."""
    ip = InteractiveShell.instance()
    try:
        yield ip
    finally:
        if lifecycle.is_loaded():
            ip.run_line_magic("unload_ext", "jupyter_ext")
        InteractiveShell.clear_instance()
