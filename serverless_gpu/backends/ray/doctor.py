"""Stacks of ranks on Ray nodes, in the caller's run directory as a local run has them.

A rank on another node cannot be signalled from the caller, and its files are on its node's
disk: the caller leaves a ``STACKS`` command in the set's event sink, the rank's event thread
takes it from its next poll's reply (at most 0.3 s later, also while the main thread is
blocked in a collective), walks every thread with faulthandler and sends the text back as a
message. The caller appends it to the rank's dump file (``RunPaths.stacks_dumps``, first line
naming the main thread), so that ``doctor.stacks.take``, ``handle.stacks()``, the widget's
Stacks button and the timeout's per-rank frames read it unchanged.
"""

from __future__ import annotations

import contextlib

from serverless_gpu.doctor import stacks
from serverless_gpu.wire.runpaths import RunPaths

STOP = "serverless_gpu.ray.stop"
STACKS = "serverless_gpu.ray.stacks"
FLUSH = "serverless_gpu.ray.flush"
"""Commands from the caller to a rank (and the kind of the rank's answer to ``STACKS`` and to
``FLUSH``: the rank has sent what it held, just before its actor is killed)."""


def start_dump_file(paths: RunPaths, rank: int, main_thread: str) -> None:
    """The rank's dump file for this call, naming its main thread (its actor's, per call)."""
    with contextlib.suppress(OSError):
        paths.stacks_dir.mkdir(mode=0o700, exist_ok=True)
        path = paths.stacks_dumps(rank)
        if not path.exists():
            path.write_text(f"{stacks.MAIN_THREAD_PREFIX}{main_thread}\n", encoding="utf-8")


def append(paths: RunPaths, rank: int, text: str) -> None:
    """A rank's answer to a stacks request."""
    with contextlib.suppress(OSError), open(paths.stacks_dumps(rank), "a", encoding="utf-8") as f:
        f.write(text if text.endswith("\n\n") else text.rstrip("\n") + "\n\n")


def without_thread(text: str, ident: int) -> str:
    """faulthandler's text without the block of thread ``ident`` (the one that took it)."""
    keep = [b for b in text.split("\n\n") if b.strip() and f"hread 0x{ident:016x}" not in b[:40]]
    return "\n\n".join(keep) + "\n\n"
