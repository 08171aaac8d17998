"""Settings and shared fixtures for the whole suite."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from typing import Any

import module_times
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


def pytest_configure(config: pytest.Config) -> None:
    module_times.record_if_asked(config)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under pytest-xdist (scripts/test.sh: ``-n 2 --dist loadfile``) a test module runs in one
    worker, so its module fixtures (one launcher, one session, one store) are made once and its
    tests keep their order. The Ray tests all share one worker: a driver without an address
    attaches to any local cluster ("multiple active Ray instances" when two run), and the
    clusters' default dashboard port would meet. (pytest 9 keeps a node's id where xdist's
    ``loadgroup`` can no longer rename it, hence a scheduler of our own.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByModule(LoadScopeScheduling):
        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            return module_times.scope_of(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            if not self.ordered:  # the whole queue is known at the first assignment
                self.ordered = True
                for scope in module_times.heaviest_first(self.workqueue):
                    self.workqueue.move_to_end(scope)
            super()._assign_work_unit(node)

    return ByModule(config, log)


@pytest.fixture
def other_user() -> Iterator[tuple[int, int]]:
    """(uid, gid) of a second local user, made for this test and removed after it."""
    if os.geteuid() != 0:
        pytest.skip("needs root to add a second local user (CI runs the suite as root)")
    if shutil.which("useradd") is None:
        pytest.skip("useradd is not installed")
    name = f"sgpu{uuid.uuid4().hex[:8]}"
    made = subprocess.run(
        ["useradd", "-M", "-N", "-s", "/usr/sbin/nologin", name],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if made.returncode != 0:
        pytest.skip(f"cannot add a user here: {made.stderr.strip()}")
    try:
        entry = pwd.getpwnam(name)
        yield entry.pw_uid, entry.pw_gid
    finally:
        subprocess.run(["userdel", name], capture_output=True, timeout=30)
