"""The caller process of the lifetime checks: a fresh Python process, so a SIGKILL is real.

    python tests/core/lifetime_caller.py GPUS GPU_TYPE|auto [no-standby] [fork-child]

Used by ``scripts/lifetime_check.py`` and ``tests/core/test_lifetime.py``. Starts a call whose
ranks each start a grandchild (and, on GPUs, create a CUDA context), prints READY once every
rank runs, then waits for the result; a KeyboardInterrupt prints INTERRUPTED and re-raises.
``no-standby``: no warm-up thread, so the call starts the launcher from the main thread, with a
parent-death signal. ``fork-child``: the launcher is started from another thread (no
parent-death signal) and a child forked by multiprocessing (holding copies of the caller's
descriptors) sleeps on; its pid is printed as ``CHILD <pid>``.
"""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import threading
import time

from serverless_gpu import distributed, runtime
from serverless_gpu.backends.local import default_backend
from serverless_gpu.wire.events import Event, RankStarted

gpus, gpu_type = int(sys.argv[1]), (sys.argv[2] if sys.argv[2] != "auto" else None)
standby = "no-standby" not in sys.argv[3:]
fork_child = "fork-child" in sys.argv[3:]


@distributed(gpus=gpus, gpu_type=gpu_type, output="none", tracking=False, standby=standby)
def forever() -> None:
    if runtime.device().type == "cuda":
        import torch

        torch.ones(1, device=runtime.device())  # a real CUDA context in every rank
    subprocess.Popen(["sleep", "600"])  # a grandchild: must die with the rank
    time.sleep(600)


if fork_child:
    starter = threading.Thread(target=default_backend().start)
    starter.start()
    starter.join()
    child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(600,))
    child.start()
    print(f"CHILD {child.pid}", flush=True)
handle = forever.start()
started: set[int] = set()


def on_event(event: Event) -> None:
    if isinstance(event, RankStarted):
        started.add(event.rank)


handle.subscribe(on_event)
while len(started) < gpus:
    handle.wait(0.05)
time.sleep(1.0)  # the grandchildren (and CUDA contexts) are made after RankStarted
try:  # entered before READY: an interrupt right after it must land in this block
    print("READY", flush=True)
    handle.result()
except KeyboardInterrupt:
    print("INTERRUPTED", flush=True)
    raise
