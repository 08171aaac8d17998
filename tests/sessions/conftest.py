"""Fixtures for the persistent-session tests: CPU ranks, one session per module where the
tests can share it, and nothing of ours left after the module (``module_launcher``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from serverless_gpu import Session


@pytest.fixture(scope="module")
def cwd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The ranks start in the caller's working directory: a temporary one (MLflow's default
    store would otherwise land in the checkout)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path_factory.mktemp("cwd"))
        mp.setenv("SERVERLESS_GPU_TYPE", "cpu")
        yield


@pytest.fixture(scope="module")
def sess(module_launcher: None, cwd: None) -> Iterator[Session]:
    """One untracked session of 2 CPU ranks for the module's tests (they keep its state apart
    by name); closed after the last one. The names every test may use are made here, so that
    a test passes alone as in the module (``-k``)."""
    session = Session(gpus=2, gpu_type="cpu", tracking=False, name="shared")
    session.exec("import os\nimport torch\nr = int(os.environ['RANK'])")
    yield session
    session.close()
