"""``python -m serverless_gpu.tracking.ui_guard [--gate FD SOCKET] -- COMMAND...``: run COMMAND
until stdin closes.

Started by :func:`serverless_gpu.tracking.ui` as a session leader with a pipe as stdin. When
the pipe reads end-of-file (the notebook stopped the UI, exited or was killed) or the command
exits, the guard kills its whole process group: the server and every worker it started.
With ``--gate``, the guard also keeps the UI's door (:mod:`.ui_gate`): the listening TCP socket
it inherited as descriptor FD, relayed to the server's Unix SOCKET for its owner alone; the
socket's private folder is removed at the end.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from serverless_gpu.tracking import ui_gate

_POLL_S = 0.5
_GRACE_S = 3.0


def main(argv: list[str]) -> int:
    split = argv.index("--") if "--" in argv else 1
    options, command = argv[1:split], argv[split + 1 :]
    upstream = options[2] if options[:1] == ["--gate"] else None
    if os.getpgid(0) != os.getpid():
        os.setsid()  # the group it kills at the end must be its own
    signal.signal(signal.SIGTERM, lambda *_: _stop_group(None, upstream))
    os.umask(0o077)  # a store or artifacts the server creates are the user's alone
    if upstream is not None:
        listener = socket.socket(fileno=int(options[1]))
        ui_gate.serve(listener, upstream)
    child = subprocess.Popen(command, stdin=subprocess.DEVNULL)
    while child.poll() is None:
        ready, _, _ = select.select([sys.stdin.fileno()], [], [], _POLL_S)
        if ready and not os.read(sys.stdin.fileno(), 4096):
            break  # end-of-file: whoever started us is gone or wants us gone
    _stop_group(child, upstream)
    return 0


def _stop_group(child: subprocess.Popen[bytes] | None, upstream: str | None) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if upstream is not None:
        shutil.rmtree(Path(upstream).parent, ignore_errors=True)
    os.killpg(0, signal.SIGTERM)
    deadline = time.monotonic() + _GRACE_S
    while child is not None and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(0, signal.SIGKILL)  # also ends this guard


if __name__ == "__main__":
    sys.exit(main(sys.argv))
