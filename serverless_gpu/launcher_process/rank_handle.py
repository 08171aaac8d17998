"""One forked rank as the launcher sees it: pid, pidfd, control channel and output pipes."""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import signal
import socket
import time
from multiprocessing.connection import Connection

from serverless_gpu.common.output import LineSplitter, OutputPacer
from serverless_gpu.common.proctitle import set_title
from serverless_gpu.rank.warm_group import GroupPlan
from serverless_gpu.wire.channel import Channel

_F_SETPIPE_SZ = 1031
_F_GETPIPE_SZ = 1032
_PIPE_BYTES = 1 << 20  # a large pipe lets a rank burst output while the launcher is busy
_BLOCKED = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}


class RankProcess:
    """The launcher's handle on one rank process."""

    def __init__(self, pid: int, channel: Channel, stdout_r: int, stderr_r: int) -> None:
        self.pid = pid
        self.channel = channel
        self.pidfd = os.pidfd_open(pid)
        self.pipes = {"stdout": stdout_r, "stderr": stderr_r}
        self.splitters = {"stdout": LineSplitter(), "stderr": LineSplitter()}
        self.pacer = OutputPacer(min(fcntl.fcntl(fd, _F_GETPIPE_SZ) for fd in self.pipes.values()))
        self.exit_status: int | None = None

    def alive(self) -> bool:
        return self.exit_status is None and self.poll() is None

    def poll(self) -> int | None:
        """Reap the process if it has exited; returns its Popen-style return code."""
        if self.exit_status is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                return self.exit_status
            if pid != 0:
                self.exit_status = os.waitstatus_to_exitcode(status)
        return self.exit_status

    def reap_by(self, deadline: float) -> int | None:
        """Wait (until the ``time.monotonic()`` deadline) for the process to exit, reap it and
        close its descriptors. For shutdown, after SIGKILL: a process stuck in the kernel
        (a driver's teardown) must not hold the launcher forever; one not reaped by then is
        left to whoever adopts it."""
        if self.exit_status is None and self.pidfd >= 0:
            with contextlib.suppress(OSError, ValueError):
                select.select([self.pidfd], [], [], max(0.0, deadline - time.monotonic()))
        self.poll()
        self.close()
        return self.exit_status

    def read(self, stream: str) -> tuple[bytes, bool]:
        """Everything the pipe holds right now, and whether it reached end of file."""
        fd = self.pipes.get(stream)
        if fd is None:
            return b"", True
        chunks = []
        eof = False
        while True:
            try:
                data = os.read(fd, 1 << 20)
            except BlockingIOError:
                break
            if not data:
                eof = True
                break
            chunks.append(data)
        return b"".join(chunks), eof

    def close_pipe(self, stream: str) -> None:
        fd = self.pipes.pop(stream, None)
        if fd is not None:
            os.close(fd)

    def open_fds(self) -> list[int]:
        fds = [self.pidfd, *self.pipes.values(), self.channel.fileno()]
        return [fd for fd in fds if fd >= 0]

    def close(self) -> None:
        for fd in (self.pidfd, *self.pipes.values()):
            if fd >= 0:
                os.close(fd)
        self.pipes = {}
        self.pidfd = -1
        self.channel.close()


def _pipe(opened: list[int]) -> tuple[int, int]:
    r, w = os.pipe()
    opened += (r, w)
    try:
        fcntl.fcntl(w, _F_SETPIPE_SZ, _PIPE_BYTES)
    except OSError:
        pass  # capped by /proc/sys/fs/pipe-max-size; the default size still works
    os.set_blocking(r, False)
    return r, w


def fork_rank(warm_gpu: int | None, title: str, plan: GroupPlan | None = None) -> RankProcess:
    """Fork a rank that waits for its spec; it first creates a CUDA context on GPU ``warm_gpu``
    (an index) unless that is None, and forms its process group by ``plan`` unless that is None.

    ``title`` names the process until its spec arrives (``standby cpu``). Raises ``OSError``
    when the fork fails (process limit), with nothing left open.
    """
    parent_sock, child_sock = socket.socketpair()
    fds: list[int] = []
    try:
        out_r, out_w = _pipe(fds)
        err_r, err_w = _pipe(fds)
        pid = _fork(child_sock, out_w, err_w, warm_gpu, title, plan)
    except BaseException:
        for fd in fds:
            os.close(fd)
        parent_sock.close()
        child_sock.close()
        raise
    try:
        os.setpgid(pid, pid)
    except OSError:
        pass  # the child already did it (or already exited)
    child_sock.close()
    os.close(out_w)
    os.close(err_w)
    return RankProcess(pid, Channel(parent_sock), out_r, err_r)


def _fork(
    child_sock: socket.socket,
    out_w: int,
    err_w: int,
    warm_gpu: int | None,
    title: str,
    plan: GroupPlan | None,
) -> int:
    # Until the child has reset the launcher's signal handlers, a TERM must not run launcher
    # code in it: block the signals across fork; rank_main unblocks them.
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, _BLOCKED)
    try:
        pid = os.fork()
        if pid == 0:  # the child never returns from rank_main
            from serverless_gpu.rank.main import rank_main

            set_title(title)
            rank_main(Connection(child_sock.detach()), out_w, err_w, warm_gpu, plan)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
    return pid
