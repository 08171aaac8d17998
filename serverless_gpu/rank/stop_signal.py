"""A launcher rank's SIGTERM (a peer failed, the timeout, a cancel): what the rank logged goes to
the caller first (``runtime.on_stopped``), then the rank ends by the signal, as it would have
without a handler (its exit status still says SIGTERM).

Python runs a signal handler in the main thread only, once it is back in Python code: a rank
blocked in a collective (in C) would run it only when SIGKILL is due. So the handler's wakeup
byte also goes to a pipe that a thread of ours reads: that thread flushes and ends the rank at
once, wherever the main thread is. A SIGTERM handler of the user's own replaces all this. A
process forked from the rank (a DataLoader worker) gets SIGTERM's default action back and no
wakeup pipe: its SIGTERM is its own, as before.
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
from typing import Any

from serverless_gpu.rank import runtime

_ending = threading.Lock()


def install() -> None:
    """In the rank's main thread (``runtime.on_stopped``'s first call: the rank initializers,
    before the user's code)."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    signal.signal(signal.SIGTERM, _handler)
    # The user's code may set its own wakeup fd (asyncio does): the handler still runs then.
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    threading.Thread(target=_watch, args=(read_fd,), name="rank-sigterm", daemon=True).start()
    os.register_at_fork(after_in_child=_forked)


def _handler(signum: int, frame: Any) -> None:
    _end()


def _watch(read_fd: int) -> None:
    while True:
        try:
            got = os.read(read_fd, 64)
        except InterruptedError:
            continue
        except OSError:
            return
        if not got:
            return
        # Bytes of signal numbers. Not ours to act on: other signals, and a SIGTERM whose
        # handler the user's code has replaced with its own (a checkpoint on preemption).
        if signal.SIGTERM in got and signal.getsignal(signal.SIGTERM) is _handler:
            _end()


def _end() -> None:
    """Flush, then die by SIGTERM; once, whichever of the handler and the thread comes first."""
    if not _ending.acquire(blocking=False):
        return
    runtime.run_stopped_callbacks()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    else:  # signal.signal works in the main thread only: libc's own call does it here
        libc_signal = ctypes.CDLL(None).signal
        libc_signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
        libc_signal.restype = ctypes.c_void_p
        libc_signal(signal.SIGTERM, None)  # NULL: SIG_DFL
    os.kill(os.getpid(), signal.SIGTERM)


def _forked() -> None:
    try:
        signal.set_wakeup_fd(-1)
        if signal.getsignal(signal.SIGTERM) is _handler:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
    except ValueError:  # forked from a thread Python does not take for the main one
        pass
