"""In the caller: the launcher process of the local backend, its socket, and the thread that
reads its events.

:class:`LauncherClient` starts ``python -m serverless_gpu.launcher_process`` with its end of a
socketpair, sends it runs and control messages, and hands the events it reads to the backend;
when the launcher ends it reports the runs it had not accepted (the backend sends them on to
a fresh one) and kills what a launcher killed without cleaning up left behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from serverless_gpu.common.errors import exit_words
from serverless_gpu.common.lifetime import kill_group
from serverless_gpu.runfiles.rundirs import drop_launcher_log, launcher_log_path
from serverless_gpu.wire.protocol import Exiting, RankGroups, RunAccepted, Shutdown
from serverless_gpu.wire.runspec import RunSpec

_SHUTDOWN_WAIT_S = 3.0
_READER_JOIN_S = 2.0
"""How long a stop waits for the reader thread to see the launcher's end (it takes ms)."""


class LauncherGone(Exception):
    """This launcher takes no more runs (it is exiting or has exited)."""


class LauncherClient:
    """One running launcher and the thread that reads its events."""

    def __init__(
        self,
        on_message: Callable[[Any], None],
        on_exit: Callable[[LauncherClient, list[RunSpec]], None],
    ) -> None:
        ours, theirs = socket.socketpair()
        self.log_path = launcher_log_path()
        log = open(self.log_path, "ab")  # noqa: SIM115
        package_parent = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_parent, env.get("PYTHONPATH")]))
        args = [sys.executable, "-m", "serverless_gpu.launcher_process", str(theirs.fileno())]
        # The parent-death signal fires when the *thread* that forked exits, so only the main
        # thread may ask for it; the launcher also watches this process through a pidfd, and
        # EOF on the socket covers the rest.
        if threading.current_thread() is threading.main_thread():
            args.append("--pdeathsig")
        try:
            self.proc = subprocess.Popen(
                args,
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # a terminal's Ctrl-C goes to the caller, which decides
            )
        finally:
            theirs.close()
            log.close()
        self.conn = Connection(ours.detach())
        self.send_lock = threading.Lock()
        self.state_lock = threading.Lock()
        self.exiting = False
        """The launcher has begun its shutdown (or is gone): it takes no more runs."""
        self.ended = False
        self.unaccepted: dict[str, RunSpec] = {}
        """Runs sent but not accepted yet: sent again to a fresh launcher if this one exits."""
        self.runs: set[str] = set()
        """Runs this launcher accepted; it reports their end, or its exit fails them."""
        self.rank_groups: tuple[int, ...] = ()
        self.killed_because = ""
        """Why the caller killed this launcher, if it did."""
        self.stopped = False
        """Stopped by the caller (shutdown, exit): its unaccepted runs are not sent on."""
        self._on_message = on_message
        self._on_exit = on_exit
        self.reader = threading.Thread(target=self._read, name="serverless-gpu-events", daemon=True)
        self.reader.start()

    def alive(self) -> bool:
        return not self.exiting and self.proc.poll() is None and not self.conn.closed

    def send(self, message: Any) -> None:
        with self.send_lock:
            self.conn.send(message)

    def start_run(self, start: RunSpec) -> None:
        """Hand a run to this launcher; raises LauncherGone if it takes no more runs."""
        with self.state_lock:
            if self.exiting:
                raise LauncherGone("the launcher is exiting")
            self.unaccepted[start.run_id] = start
        try:
            self.send(start)
        except OSError as exc:
            with self.state_lock:
                self.exiting = True
                ours = self.unaccepted.pop(start.run_id, None) is not None
            if ours:  # else the reader saw the exit first and sends it on itself
                raise LauncherGone(str(exc)) from exc

    def _read(self) -> None:
        try:
            while True:
                self._take(self.conn.recv())
        except (EOFError, OSError):
            pass
        except Exception as exc:  # an event's handler failed: see _unhandled
            self._unhandled(exc)
        with self.state_lock:
            self.exiting = self.ended = True
            unaccepted = list(self.unaccepted.values())
            self.unaccepted.clear()
        self._on_exit(self, unaccepted)
        self._kill_rank_groups()

    def _take(self, message: Any) -> None:
        if isinstance(message, RunAccepted):
            with self.state_lock:
                self.unaccepted.pop(message.run_id, None)
                self.runs.add(message.run_id)
        elif isinstance(message, RankGroups):
            self.rank_groups = message.pgids
        elif isinstance(message, Exiting):
            self.exiting = True
        else:
            self._on_message(message)

    def _unhandled(self, exc: Exception) -> None:
        """An event this side could not take (e.g. a handler's thread could not start under
        a pids limit) leaves it not knowing where its runs stand, and with no reader none of
        them would ever end: the launcher is killed, which fails them with this cause (a
        fresh launcher takes the next call)."""
        traceback.print_exception(exc, file=sys.stderr)
        self.kill(f"the caller could not handle one of its events ({type(exc).__name__}: {exc})")

    def kill(self, because: str) -> None:
        """SIGKILL the launcher: its runs fail with ``because`` once the reader sees the exit,
        and none it had not accepted is sent on (the cause may be on this side). Its ranks end
        by their parent-death signal, what they started through their process groups."""
        self.killed_because = because
        self.stopped = True
        with contextlib.suppress(OSError):
            self.proc.kill()

    def _kill_rank_groups(self) -> None:
        """A launcher that died without cleaning up (SIGKILL) left its ranks to their
        parent-death signal, and what they started to no one: kill their process groups. Once
        the launcher is reaped, every rank has its SIGKILL, so none can start another child."""
        if not self.rank_groups:
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(_SHUTDOWN_WAIT_S)
        for pgid in self.rank_groups:
            kill_group(pgid, signal.SIGKILL)

    def exit_description(self) -> str:
        """``exited with code 1`` / ``was killed by SIGKILL``, waiting briefly for the exit."""
        try:
            code = self.proc.wait(_SHUTDOWN_WAIT_S)
        except subprocess.TimeoutExpired:
            return "closed its connection"
        if self.killed_because:
            return f"was killed because {self.killed_because}"
        return exit_words(code)

    def _close_after_reader(self) -> None:
        """Close our end only once the reader is out of ``recv``: a close between the reads of a
        message's header and body made multiprocessing read from a ``None`` handle (a
        TypeError in the reader thread, printed at the caller's exit), and a close under a
        blocked read leaves the reader on a freed descriptor. A reader still blocked after
        the launcher's exit (its end held elsewhere) is woken by shutting the socket down."""
        if threading.current_thread() is not self.reader:
            self.reader.join(timeout=_READER_JOIN_S)
            if self.reader.is_alive():
                with (
                    contextlib.suppress(OSError),
                    socket.socket(fileno=os.dup(self.conn.fileno())) as ours,
                ):
                    ours.shutdown(socket.SHUT_RDWR)
                self.reader.join(timeout=_READER_JOIN_S)
        self.conn.close()

    def forget(self) -> None:
        """In a forked child of the caller: drop our copy of the socket, so that the launcher
        still sees EOF when the caller dies; the child is not its caller."""
        with contextlib.suppress(OSError):
            self.conn.close()

    def stop(self) -> None:
        self.stopped = True
        try:
            self.send(Shutdown())
        except OSError:
            pass
        try:
            self.proc.wait(_SHUTDOWN_WAIT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._close_after_reader()
        if self.proc.returncode == 0:
            drop_launcher_log(self.log_path)  # a clean exit with nothing to say leaves no file
