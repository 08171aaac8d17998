"""Rank functions for the graceful stop and retry tests: a small "training" loop whose state is
a DCP checkpoint written with VolumeWriter; loss = 1 / (1 + w), w grows by 1 each step, so a
resumed run's loss curve continues exactly where the stopped one left it."""

from __future__ import annotations

import os
import threading
import time
from typing import Any


def _setup(root: str) -> tuple[Any, int]:
    import torch
    import torch.distributed.checkpoint as dcp

    from serverless_gpu import runtime
    from serverless_gpu.data import VolumeReader, latest_checkpoint

    runtime.init_process_group()
    state = {"w": torch.zeros(1), "step": torch.zeros(1, dtype=torch.int64)}
    latest = latest_checkpoint(root)
    if latest is not None:
        dcp.load(state, storage_reader=VolumeReader(latest))
    return state, int(state["step"].item())


def _save(root: str, state: dict[str, Any]) -> None:
    import torch.distributed.checkpoint as dcp

    from serverless_gpu.data import VolumeWriter, checkpoint_path

    dcp.save(state, storage_writer=VolumeWriter(checkpoint_path(root, int(state["step"]))))


def train(root: str, steps: int, pause: float, check: bool = True) -> dict[str, Any]:
    """Steps until ``steps`` or until asked to stop (when ``check``): then a checkpoint."""
    import torch.distributed as dist

    from serverless_gpu import runtime

    state, start = _setup(root)
    runtime.on_stop(lambda: print(f"on_stop in {threading.current_thread().name}", flush=True))
    losses = []
    while int(state["step"]) < steps:
        state["w"] += 1
        losses.append((int(state["step"]), 1.0 / (1.0 + float(state["w"]))))
        state["step"] += 1
        dist.barrier()
        print(f"step {int(state['step'])}", flush=True)
        time.sleep(pause)
        if check and runtime.should_stop(sync=True):
            _save(root, state)
            return {"stopped_at": int(state["step"]), "start": start, "losses": losses}
    return {"stopped_at": None, "start": start, "losses": losses}


def crash_once_after_step_5(root: str) -> dict[str, Any]:
    """Saves step 5; on the first attempt rank 1 then dies (os._exit(1))."""
    import torch.distributed as dist

    from serverless_gpu import runtime

    state, start = _setup(root)
    while int(state["step"]) < 8:
        state["w"] += 1
        state["step"] += 1
        dist.barrier()
        if int(state["step"]) == 5:
            _save(root, state)
            if runtime.attempt() == 0 and runtime.get_global_rank() == 1:
                os._exit(1)
    return {"attempt": runtime.attempt(), "start": start, "step": int(state["step"])}


def value_error(marker_dir: str) -> None:
    from serverless_gpu import runtime

    open(os.path.join(marker_dir, f"attempt_{runtime.attempt()}_{os.getpid()}"), "w").close()
    raise ValueError("bad labels")


def resets_signals(marker_dir: str, handler_ranks: list[int], seconds: float) -> int:
    """Code that resets what a rank inherits, as some libraries do: every signal unblocked and,
    in ``handler_ranks``, the doctor's signals (stacks, stop, dump) back to their default action,
    which ends the process. Then it works ``seconds`` without checking ``should_stop``."""
    import signal

    from serverless_gpu import runtime
    from serverless_gpu.doctor import stacks

    open(os.path.join(marker_dir, f"attempt_{runtime.attempt()}_{os.getpid()}"), "w").close()
    if runtime.get_global_rank() in handler_ranks:
        for sig in (stacks.SIG_STACKS, stacks.SIG_STOP, stacks.SIG_DUMP):
            signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    print("ready", flush=True)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.05)
    return runtime.get_global_rank()


def stops_after_unblocking_signals() -> str:
    """Unblocks every signal, then works until asked to stop."""
    import signal

    from serverless_gpu import runtime

    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    print("ready", flush=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if runtime.should_stop():
            return "stopped"
        time.sleep(0.05)
    return "never asked"
