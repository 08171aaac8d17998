"""``python -m serverless_gpu.launcher_process FD``: the launcher process the caller starts.

FD is the launcher's end of a socketpair with its caller. :func:`main` ties the process's life
to the caller's, preloads what every rank needs and serves the loop (``loop.py``) until the
caller is gone or asks it to shut down.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys

from serverless_gpu.common.lifetime import become_subreaper, die_with_parent
from serverless_gpu.common.proctitle import set_title
from serverless_gpu.launcher_process.loop import LauncherLoop
from serverless_gpu.wire.channel import Channel


def _watch_parent() -> int | None:
    """A pidfd of the caller (our parent), readable once it has exited: unlike the parent-death
    signal it does not depend on which of the caller's threads started us, and unlike EOF it
    does not wait for a child the caller forked (holding a copy of our socket) to exit."""
    parent = os.getppid()
    try:
        pidfd = os.pidfd_open(parent)
    except (OSError, AttributeError):  # an old kernel: EOF and the death signal remain
        return None
    if os.getppid() != parent:  # the caller died before the pidfd was opened
        os._exit(1)
    return pidfd


def main(argv: list[str]) -> int:
    fd = int(argv[1])
    set_title("launcher")
    if "--pdeathsig" in argv:
        # TERM, not KILL: the orderly shutdown below also deletes the runs' tmpfs results. The
        # ranks die with this process whatever happens (their own parent-death signal is KILL).
        die_with_parent(signal.SIGTERM)
    caller_pidfd = _watch_parent()
    become_subreaper()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the caller decides what an interrupt means
    started: list[LauncherLoop] = []

    def on_term(*_: object) -> None:
        # Once serving, end the loop rather than raise: the caller's death brings both EOF and
        # (through the parent-death signal) TERM, and an exception raised into the shutdown
        # that EOF started would cut it short. Before that there is nothing to clean up.
        if not started:
            raise SystemExit(0)
        started[0].running = False

    signal.signal(signal.SIGTERM, on_term)
    caller = Channel(socket.socket(fileno=fd))
    # Preload what every rank needs, so that a forked rank starts with it already imported.
    import cloudpickle  # noqa: F401
    import torch  # noqa: F401

    from serverless_gpu.rank import runtime  # noqa: F401

    launcher = LauncherLoop(caller, caller_pidfd)
    started.append(launcher)
    try:
        launcher.serve()
    finally:
        launcher.shutdown()
    return 0


if __name__ == "__main__":
    exit_code = main(sys.argv)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    # Everything is cleaned up: skip the interpreter's teardown (torch, mlflow), which takes
    # seconds during which the launcher would still look alive.
    os._exit(exit_code)
