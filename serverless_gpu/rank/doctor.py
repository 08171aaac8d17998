"""Inside a rank, before user code: stacks on a signal, and the doctor thread.

* ``faulthandler`` is registered on :data:`stacks.SIG_STACKS`. Its handler is C code that runs in
  the signal handler and walks every thread's frames, so it answers while the main thread is
  blocked in a collective (a Python-level handler would wait for the main thread's next
  bytecode, which a hung collective never reaches). py-spy would read the same frames from
  outside, but needs ptrace rights that containers often withhold and an extra package.
* The doctor thread waits in ``sigwait`` for :data:`stacks.DOCTOR_SIGNALS` (blocked in every
  other thread since the rank started): a stop request sets ``stop.should_stop()``, a dump
  request writes the collectives' flight recorder (NCCL's: on GPUs; gloo's waits for the
  collective in progress, so CPU ranks do not dump it).
* The doctor's signals also have a handler, which hands them to the doctor thread: a rank
  whose code unblocked every signal takes them in its main thread (their default action would
  end it), and the launcher, which signals only ranks that have the handler (``SigCgt``), sees
  that it is installed.
"""

from __future__ import annotations

import contextlib
import faulthandler
import signal
import threading
from typing import IO

from serverless_gpu.doctor import flight, stacks
from serverless_gpu.rank import stop_request as stop
from serverless_gpu.rank.runtime import is_cpu_mode
from serverless_gpu.wire.runpaths import RunPaths

_dump_file: list[IO[str]] = []
"""The open dump file: faulthandler writes to its descriptor for the rank's whole life."""


def install(paths: RunPaths, rank: int) -> None:
    """Ready the rank for stack, stop and dump requests; never fails the rank."""
    try:
        paths.stacks_dir.mkdir(mode=0o700, exist_ok=True)
        f = open(paths.stacks_dumps(rank), "a", encoding="utf-8")  # noqa: SIM115
        f.write(f"{stacks.MAIN_THREAD_PREFIX}{threading.get_ident():016x}\n")
        f.flush()
        _dump_file.append(f)
        faulthandler.register(stacks.SIG_STACKS, file=f, all_threads=True, chain=False)
    except OSError:
        pass  # no stacks for this rank (a full disk); the run itself goes on
    thread = threading.Thread(target=_serve, args=(paths, rank), name="serverless-gpu-doctor")
    thread.daemon = True
    thread.start()
    ident = thread.ident or 0  # set once started
    for sig in stacks.DOCTOR_SIGNALS:
        signal.signal(sig, lambda sig, _frame: _forward(ident, sig))


def _forward(doctor: int, sig: int) -> None:
    """A doctor signal that reached another thread (one that unblocked it) goes to the
    doctor thread, which waits for it in ``sigwait``."""
    with contextlib.suppress(OSError, ValueError):
        signal.pthread_kill(doctor, sig)


def _serve(paths: RunPaths, rank: int) -> None:
    while True:
        sig = signal.sigwait(stacks.DOCTOR_SIGNALS)
        if sig == stacks.SIG_STOP:
            stop.request()
        elif sig == stacks.SIG_DUMP and not is_cpu_mode():
            # In its own thread: a dump may wait for a collective in progress (gloo's does),
            # and a stop request must still be taken meanwhile.
            threading.Thread(target=_dump, args=(paths, rank), daemon=True).start()


def _dump(paths: RunPaths, rank: int) -> None:
    try:
        flight.dump(paths.flight_recorder(rank))
    except Exception as exc:  # a dump is a diagnosis aid; a failed one must not end the rank
        with contextlib.suppress(OSError):
            paths.flight_recorder_error(rank).write_text(f"{type(exc).__name__}: {exc}\n")
