"""Settings and shared fixtures for the whole suite."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import pytest
from procs import cmdlines, descendants, launcher_family, launcher_tree, wait_gone

import serverless_gpu

# A shell without job control starts a background command (`bash scripts/test.sh &`) with SIGINT
# ignored, and every child inherits that: a caller the tests interrupt like a user's Ctrl-C
# would never see KeyboardInterrupt. With a handler here, children start with the default again.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

LEAK_GRACE_S = 10.0
"""How long processes of ours may take to exit once the launcher is shut down."""
SETTLE_S = 2.0
"""How long a finished call's ranks may take to exit before the launcher is shut down instead
of kept for the next test (a test that leaves something running gets the full check)."""


@pytest.fixture(scope="module")
def module_launcher() -> Iterator[None]:
    """One launcher for a module's tests (starting one costs over a second): the first call
    starts it, and it is shut down after the module's last test, with every process below it.
    (Each test has checked that nothing else of its own is left: see no_leaked_children.)"""
    yield
    kept = launcher_tree()
    serverless_gpu.shutdown()
    leaked = wait_gone(kept, LEAK_GRACE_S)
    assert not leaked, f"the launcher's processes survived its shutdown: {cmdlines(leaked)}"


@pytest.fixture
def no_leaked_children(module_launcher: None, request: pytest.FixtureRequest) -> Iterator[None]:
    """After the test nothing of ours survives but the module's launcher and its idle standby
    ranks, which the next call reuses as any caller's next call would. Otherwise (or for a test
    marked ``fresh_launcher``) the launcher is shut down and then nothing of ours may survive.

    A test marked ``fresh_launcher`` (one about the launcher's own start, log or standby ranks)
    also starts without one."""
    fresh = request.node.get_closest_marker("fresh_launcher") is not None
    if fresh:
        serverless_gpu.shutdown()
    others = descendants() - launcher_family()
    yield
    if not fresh and _settled(others):
        return
    serverless_gpu.shutdown()
    leaked = wait_gone(descendants() - others, LEAK_GRACE_S)
    assert not leaked, f"child processes survived the test: {cmdlines(leaked)}"


def _settled(others: set[int]) -> bool:
    """Whether, within SETTLE_S, every process of ours not in ``others`` is the launcher or an
    idle standby rank (a rank still running a call is neither)."""
    deadline = time.monotonic() + SETTLE_S
    while descendants() - others - launcher_family():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under pytest-xdist (``-n 2 --dist loadgroup``, scripts/test.sh) a test module runs in
    one worker, so its module fixtures (one launcher, one store) are made once. The Ray tests
    all share one worker: a driver without an address attaches to any local cluster, and the
    clusters' default ports (dashboard 8265) would meet."""
    for item in items:
        path = item.path.relative_to(item.config.rootpath)
        group = "ray" if path.parts[:2] == ("tests", "ray") else str(path)
        item.add_marker(pytest.mark.xdist_group(group))
