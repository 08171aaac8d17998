"""Processing widget messages (the Cancel click) while a cell blocks in ``RunHandle.wait``.

ipykernel handles a shell message only after the running cell returns, so a click would arrive
after the run it wanted to stop. While a run waits, the renderer calls :meth:`UiPump.poll` from
the handle's idle callbacks:

* where the kernel still offers ``do_one_iteration`` (ipykernel 6 and early 7.x), through
  ``jupyter_ui_poll``, which also postpones execute requests until the cell is over;
* on ipykernel 7 releases without it (``jupyter_ui_poll`` then silently processes nothing), by
  reading the main shell's inbound socket directly: comm messages are handled at once, anything
  else is handed back to the kernel's own dispatcher, which runs it after the cell as it would
  have anyway, in arrival order.

Any message the kernel handles while the cell runs (a widget's comm message, a control
channel's ``kernel_info_request`` from the server's connection check, a debugger request) ends
with an ``idle`` status, and JupyterLab's status bar then reads "Idle" beside a ``[*]`` cell.
:class:`BusyWhileRunning` follows every such ``idle`` with a ``busy`` for the running cell.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

_COMM_MESSAGES = frozenset({"comm_open", "comm_msg", "comm_close"})
_MESSAGES_PER_POLL = 20


class UiPump:
    """Handles pending frontend messages for one run; a no-op outside a kernel's main thread."""

    def __init__(self, shell: Any) -> None:
        self._kernel = getattr(shell, "kernel", None)
        self._poll: Callable[[], None] | None = None
        self._closer: contextlib.ExitStack | None = None
        # Installed at once: JupyterLab asks for a subshell (a control request, then "idle") as
        # soon as the run's widget shows, before the first poll.
        self._busy = BusyWhileRunning.install(shell) if _in_main_thread() else None
        self._broken = False

    def poll(self) -> None:
        if self._broken or self._kernel is None:
            return
        if not _in_main_thread():
            return  # the kernel's sockets belong to its main thread
        try:
            if self._poll is None:
                self._poll = self._start()
            self._poll()
        except Exception:  # never let UI plumbing break the user's run; just stop pumping
            self._broken = True
            self.close()

    def close(self) -> None:
        if self._closer is not None:
            self._closer.close()
            self._closer = None
        if self._busy is not None:
            self._busy.remove()
            self._busy = None
        self._poll = None

    def _start(self) -> Callable[[], None]:
        kernel = self._kernel
        if hasattr(kernel, "do_one_iteration"):
            from jupyter_ui_poll import ui_events

            self._closer = contextlib.ExitStack()
            process = self._closer.enter_context(ui_events())
            return lambda: process(_MESSAGES_PER_POLL)
        return _ShellInbox(kernel).pump


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


class BusyWhileRunning:
    """While the cell that waits on a run is running, the kernel's status stays ``busy``: an
    ``idle`` published for any other request is followed by a ``busy`` for the cell's.

    Installed from the cell's own thread (where the kernel's parent is the cell's execute
    request); removed when the cell ends (``post_run_cell``) or the run does.
    """

    def __init__(self, shell: Any, kernel: Any, cell: dict[str, Any]) -> None:
        self._shell, self._kernel, self._cell = shell, kernel, cell
        self._cell_id = cell["header"]["msg_id"]
        self._publish = kernel._publish_status
        kernel._publish_status = self._publish_status
        shell.events.register("post_run_cell", self._cell_ended)

    @classmethod
    def install(cls, shell: Any) -> BusyWhileRunning | None:
        kernel = getattr(shell, "kernel", None)
        get_parent = getattr(kernel, "get_parent", None)
        cell = get_parent("shell") if get_parent is not None else None
        if not (isinstance(cell, dict) and cell.get("header", {}).get("msg_id")):
            return None
        if not hasattr(kernel, "_publish_status") or not hasattr(shell, "events"):
            return None
        return cls(shell, kernel, cell)

    def _publish_status(self, status: str, channel: str, parent: Any = None) -> None:
        self._publish(status, channel, parent)
        if status != "idle":
            return
        about = parent or self._kernel.get_parent(channel)
        if (about or {}).get("header", {}).get("msg_id") != self._cell_id:
            self._publish("busy", "shell", self._cell)

    def _cell_ended(self, *_args: Any) -> None:
        self.remove()

    def remove(self) -> None:
        if self._kernel.__dict__.get("_publish_status") == self._publish_status:
            del self._kernel._publish_status
        with contextlib.suppress(ValueError):
            self._shell.events.unregister("post_run_cell", self._cell_ended)


class _ShellInbox:
    """The main shell's inbound socket, read between the waiting thread's slices."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        channel_thread = getattr(kernel, "shell_channel_thread", None)
        if channel_thread is not None:
            # ipykernel 7: a channel thread receives shell messages and forwards those for the
            # main shell over an in-process pair that the (now blocked) main loop reads.
            self.socket = channel_thread.manager.get_shell_channel_to_subshell_pair(None).to_socket
        else:
            self.socket = kernel.shell_stream.socket

    def pump(self) -> None:
        for _ in range(_MESSAGES_PER_POLL):
            if not self.socket.poll(0):
                return
            self._handle(self.socket.recv_multipart(copy=False))

    def _handle(self, frames: list[Any]) -> None:
        session = self.kernel.session
        idents, parts = session.feed_identities(frames, copy=False)
        # Peek at the header only: a full read records the signature, and the kernel would
        # then reject the message it is handed back as a replay.
        msg_type = session.deserialize(parts, content=False, copy=False)["header"]["msg_type"]
        handler = self.kernel.shell_handlers.get(msg_type)
        if msg_type in _COMM_MESSAGES and handler is not None:
            handler(self.kernel.shell_stream, idents, session.deserialize(parts, copy=False))
        else:
            # The kernel's own entry point queues it behind the running cell.
            self.kernel.io_loop.add_callback(self.kernel.shell_main, None, frames)
