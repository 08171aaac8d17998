"""Settings and shared fixtures for the whole suite."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import psutil
import pytest

import serverless_gpu

# A shell without job control starts a background command (`bash scripts/test.sh &`) with SIGINT
# ignored, and every child inherits that: a caller the tests interrupt like a user's Ctrl-C
# would never see KeyboardInterrupt. With a handler here, children start with the default again.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def no_leaked_children() -> Iterator[None]:
    """After the test: the launcher is shut down and no child process of ours survives."""
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
