"""Every rank's Python stacks, taken while it runs: the signals, the files and their reading.

Each rank registers ``faulthandler`` on :data:`SIG_STACKS` with a per-rank dump file
(``rank/doctor.py``). faulthandler's handler is C code run in the signal handler itself, not a
Python handler waiting for the main thread's next bytecode, so it dumps a rank whose main thread
is blocked in a gloo or NCCL call, in ``time.sleep`` or in any other C function. The launcher
(on a timeout) or the caller (``RunHandle.stacks()``) notes each dump file's size, has the
launcher signal the ranks, and reads what was appended.

The files are in ``RunPaths.stacks_dir``: each rank's dumps (``RunPaths.stacks_dumps``, appended;
the first line names the main thread), its stacks taken last (``RunPaths.stacks``) and its
flight-recorder dump (``RunPaths.flight_recorder``, written on :data:`SIG_DUMP`).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from serverless_gpu.wire.runpaths import RunPaths

SIG_STACKS = signal.SIGRTMIN + 4
"""faulthandler's signal in every rank: dump every thread's stack into the rank's dump file."""
SIG_STOP = signal.SIGRTMIN + 5
"""A stop request (graceful stop): ``runtime.should_stop()`` turns True."""
SIG_DUMP = signal.SIGRTMIN + 6
"""Dump the flight recorder of the collectives (taken with the stacks)."""
DOCTOR_SIGNALS = frozenset({SIG_STOP, SIG_DUMP})
"""Blocked in every thread of a rank and taken by its doctor thread (``sigwait``), so that they
are handled while the main thread is blocked in C, and never kill a rank (their default)."""

UNAVAILABLE = "stacks unavailable: "
"""How a rank's stacks begin when it could not be asked for them (see :func:`note_unavailable`)."""
MAIN_THREAD_PREFIX = "main thread 0x"
WAIT_S = 2.0
"""How long a request waits for the ranks' dumps (faulthandler's takes milliseconds)."""
_SETTLED_S = 0.1
_POLL_S = 0.02


def signal_label(sig: int) -> str:
    """``SIGRTMIN+4``: how a user finds the signal in ``signal`` (the real-time ones have no
    names of their own)."""
    if signal.SIGRTMIN <= sig <= signal.SIGRTMAX:
        return f"SIGRTMIN+{sig - signal.SIGRTMIN}"
    return signal.Signals(sig).name


def note_unavailable(paths: RunPaths, rank: int, why: str) -> None:
    """In the launcher, for a rank it did not signal: the reader of the rank's dump file finds
    this block where the stacks would be."""
    try:
        with open(paths.stacks_dumps(rank), "a", encoding="utf-8") as f:
            f.write(f"{UNAVAILABLE}{why}\n\n")
    except OSError:
        pass  # no dump file (a full disk): the rank is left out, as one that did not answer


def offsets(paths: RunPaths, ranks: Iterable[int]) -> dict[int, int]:
    """The size of each rank's dump file now: what a request appends starts there."""
    return {rank: _size(paths.stacks_dumps(rank)) for rank in ranks}


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def read_new(paths: RunPaths, since: dict[int, int]) -> dict[int, str]:
    """What each rank's dump file gained since ``since``, with its main thread marked; ranks
    that wrote nothing are left out."""
    found = {}
    for rank, offset in since.items():
        path = paths.stacks_dumps(rank)
        try:
            with open(path, "rb") as f:
                main = f.readline().decode("ascii", "replace").strip()
                f.seek(max(offset, f.tell()))
                text = f.read().decode("utf-8", "replace")
        except OSError:
            continue
        if text.strip():
            found[rank] = _mark_main(text, main.removeprefix(MAIN_THREAD_PREFIX))
    return found


def wait_new(paths: RunPaths, since: dict[int, int], timeout: float = WAIT_S) -> dict[int, str]:
    """Wait (at most ``timeout``) until every rank's dump file has grown and stopped growing,
    then read the new stacks. A rank that did not dump in time is left out."""
    deadline = time.monotonic() + timeout
    last: dict[int, int] = {}
    settled_at = 0.0
    while True:
        now = time.monotonic()
        sizes = offsets(paths, since)
        grown = all(sizes[r] > since[r] for r in since)
        if sizes != last:
            last, settled_at = sizes, now
        if (grown and now - settled_at >= _SETTLED_S) or now >= deadline:
            return read_new(paths, since)
        time.sleep(_POLL_S)


def take(
    paths: RunPaths, ranks: Iterable[int], signal_ranks: Callable[[], None], timeout: float = WAIT_S
) -> dict[int, str]:
    """Have the running ``ranks`` dump their stacks (``signal_ranks`` asks the launcher) and
    return them, saved as ``RunPaths.stacks`` too."""
    since = offsets(paths, ranks)
    signal_ranks()
    found = wait_new(paths, since, timeout)
    save(paths, found)
    return found


def save(paths: RunPaths, found: dict[int, str]) -> None:
    for rank, text in found.items():
        path = paths.stacks(rank)
        tmp = path.with_name(path.name + ".tmp")
        try:
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, path)
        except OSError:  # a full disk costs the saved copy, never the run's error
            tmp.unlink(missing_ok=True)


def load_saved(paths: RunPaths, world_size: int) -> dict[int, str]:
    found = {}
    for rank in range(world_size):
        try:
            found[rank] = paths.stacks(rank).read_text(encoding="utf-8")
        except OSError:
            continue
    return found


def _mark_main(text: str, main_ident: str) -> str:
    """faulthandler names threads by id only: the main thread, the one users look for, is
    marked and put first, its frames below the user's function (the rank's start, forked from
    the launcher's loop) are left out, and so is our doctor thread; the raw dumps stay in
    ``RunPaths.stacks_dumps``."""
    blocks = [
        b for b in text.split("\n\n") if b.strip() and _DOCTOR not in b and not _session_reader(b)
    ]
    main = [b for b in blocks if main_ident and _is_thread(b, main_ident)]
    others = [b for b in blocks if b not in main]
    shown = [_main_block(b) for b in main[:1]] + others
    return "\n\n".join(b.rstrip("\n") for b in shown) + "\n"


def _is_thread(block: str, ident: str) -> bool:
    return block.startswith((f"Current thread 0x{ident}", f"Thread 0x{ident}"))


def _session_reader(block: str) -> bool:
    """A persistent session's thread that reads the caller's cells (``rank/session_loop.py``)."""
    return any(_SESSION in line and line.endswith(" in read") for line in block.splitlines())


_SESSION = f'{os.sep}serverless_gpu{os.sep}rank{os.sep}session_loop.py"'


def _main_block(block: str) -> str:
    header, _, frames = block.partition("\n")
    header = "Main thread 0x" + header.split(" 0x", 1)[1]
    kept = []
    for line in frames.splitlines():
        if line.startswith("  File ") and (_WORKER in line or _SESSION in line):
            break  # the rank's start, or a persistent session's loop of cells
        kept.append(line)
    return "\n".join([header, *kept])


# The rank's call (rank/become.py, on every backend) and its doctor thread (rank/doctor.py), as
# faulthandler names them; tests/core/test_stacks.py reads a real rank's stacks, so a move of
# either shows there.
_WORKER = f'{os.sep}serverless_gpu{os.sep}rank{os.sep}become.py"'
_DOCTOR = f'{os.sep}serverless_gpu{os.sep}rank{os.sep}doctor.py"'
