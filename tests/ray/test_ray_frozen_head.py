"""A remote call or session whose RAY_ADDRESS names a frozen head (its gcs_server stopped with
SIGSTOP: the kernel still accepts connections, nothing answers) fails within 10 s, naming the
address and what did not answer, and a caller SIGTERMed while it waits exits at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

HERE = Path(__file__).resolve().parent
CALLS = {
    "call": "s.distributed(gpus=2, gpu_type='cpu', remote=True, timeout=30)(print).distributed()",
    # a session has no time limit by default: connecting is bounded all the same
    "session": "s.Session(gpus=2, gpu_type='cpu', remote=True).exec('1')",
}


def _code(what: str) -> str:
    return (
        "import serverless_gpu as s\n"
        "print('calling', flush=True)\n"
        "try:\n"
        f"    {CALLS[what]}\n"
        "except s.ConfigurationError as exc:\n"
        "    print('ConfigurationError:', exc)\n"
    )


@pytest.fixture(scope="module")
def frozen_head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """(address, private HOME) of a one-node Ray cluster whose gcs_server is stopped."""
    home = tmp_path_factory.mktemp("frozen-head-home")
    env = {**os.environ, "HOME": str(home)}
    head = subprocess.Popen(
        [sys.executable, str(HERE / "frozen_head.py")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    gcs = None
    try:
        assert head.stdout is not None
        address, pid = head.stdout.readline().split()  # bounded by the test's timeout
        gcs = psutil.Process(int(pid))
        gcs.suspend()
        yield address, home
    finally:
        if gcs is not None:
            gcs.resume()
        assert head.stdin is not None
        head.stdin.close()
        try:
            head.wait(60)
        except subprocess.TimeoutExpired:
            head.kill()
            head.wait(10)


def _caller(address: str, home: Path, tmp_path: Path, what: str) -> subprocess.Popen[str]:
    env = {**os.environ, "RAY_ADDRESS": address, "HOME": str(home)}
    env["SERVERLESS_GPU_RUNS_DIR"] = str(tmp_path / "runs")
    return subprocess.Popen(
        [sys.executable, "-c", _code(what)], env=env, stdout=subprocess.PIPE, text=True
    )


@pytest.mark.timeout(120)
@pytest.mark.parametrize("what", sorted(CALLS))
def test_a_frozen_head_fails_the_call_within_10_s(
    frozen_head: tuple[str, Path], tmp_path: Path, what: str
) -> None:
    address, home = frozen_head
    caller = _caller(address, home, tmp_path, what)
    assert caller.stdout is not None
    assert caller.stdout.readline() == "calling\n"
    started = time.monotonic()
    try:
        out, _ = caller.communicate(timeout=30)
    finally:
        caller.kill()
    assert time.monotonic() - started <= 10.0
    assert f"ConfigurationError: the Ray cluster at RAY_ADDRESS={address!r}" in out, out
    assert "its GCS (the head node's gcs_server) did not answer" in out
    assert not (tmp_path / "runs").exists(), "no run directory was made"


@pytest.mark.timeout(60)
def test_a_caller_waiting_on_a_frozen_head_exits_at_sigterm(
    frozen_head: tuple[str, Path], tmp_path: Path
) -> None:
    caller = _caller(*frozen_head, tmp_path, "call")
    assert caller.stdout is not None
    assert caller.stdout.readline() == "calling\n"
    caller.send_signal(signal.SIGTERM)
    try:
        assert caller.wait(5) == -signal.SIGTERM
    finally:
        caller.kill()
