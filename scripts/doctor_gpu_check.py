"""The hang doctor's signals and the warm group's store on GPUs (NCCL).

    PYTHONPATH=. python scripts/doctor_gpu_check.py                 # every visible GPU
    PYTHONPATH=. python scripts/doctor_gpu_check.py --cpu --gpus 2  # CPU ranks (gloo)

* A warm call's group: the store's port refuses new connections once the group is formed, and
  the group still works (all-reduce, ``new_group``, barrier).
* ``stacks()`` of a call running CUDA work: every rank's stacks, every rank still alive.
* A rank that reset the doctor's signals to ``SIG_DFL`` and unblocked every signal: ``stacks()``
  says "stacks unavailable" for it and kills nothing; Cancel then stops the call as a cancel.
* A timeout with ``max_retries=1``: one attempt only, the error names rank 0's frame (and on
  GPUs its last collective from NCCL's flight recorder).
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _checks import check, rank_parser, ranks, summary

from serverless_gpu import CancelledError, DistributedTimeoutError, distributed, runtime
from serverless_gpu.wire.events import RunStatus

TIMEOUT_S = 15


def store_refuses_and_group_works() -> dict[str, Any]:
    """Runs in every rank of a warm call."""
    import torch
    import torch.distributed as dist

    warm = dist.is_initialized()
    runtime.init_process_group()
    store: Any = dist.distributed_c10d._get_default_store()
    while hasattr(store, "underlying_store"):
        store = store.underlying_store
    try:
        socket.create_connection(("127.0.0.1", int(store.port)), timeout=2).close()
        refused = False
    except OSError:
        refused = True
    t = torch.ones(1, device=runtime.device())
    dist.all_reduce(t)
    sub = dist.new_group(list(range(dist.get_world_size())))
    dist.barrier(group=sub)
    return {"warm": warm, "refused": refused, "sum": float(t.item())}


def busy(seconds: float, reset_signals: bool) -> int:
    """CUDA (or CPU) work for ``seconds``; with ``reset_signals`` the doctor's handlers go."""
    import torch

    if reset_signals:
        for sig in range(signal.SIGRTMIN, signal.SIGRTMAX + 1):
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
    x = torch.ones(256, 256, device=runtime.device())
    print("inside busy", flush=True)  # past the signal changes
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        x = (x @ x) / 256
        time.sleep(0.01)
    return runtime.get_global_rank()


def loops_after_a_collective(marker_dir: str) -> None:
    """One all-reduce, then a loop the timeout ends; each attempt leaves a marker."""
    import torch
    import torch.distributed as dist

    Path(marker_dir, f"attempt_{runtime.attempt()}_{runtime.get_global_rank()}").touch()
    runtime.init_process_group()
    t = torch.ones(1, device=runtime.device())
    dist.all_reduce(t)
    while True:
        time.sleep(0.1)


def _inside_busy(handle: Any, world: int) -> bool:
    """Every rank has said it is inside ``busy`` (its log), within a minute."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if handle.done():
            return False
        if all("inside busy" in handle.logs(r) for r in range(world)):
            return True
        time.sleep(0.05)
    return False


def check_store(world: int, gpu_type: str | None) -> None:
    fn = distributed(gpus=world, gpu_type=gpu_type, tracking=False, output="none")(
        store_refuses_and_group_works
    )
    fn.distributed()  # the first call: the next one finds standby ranks with the group formed
    seen = list(fn.distributed())
    check("the warm call took the formed group", all(s["warm"] for s in seen), str(seen))
    check("the store refuses new connections", all(s["refused"] for s in seen), str(seen))
    check("all-reduce, new_group and barrier work", all(s["sum"] == world for s in seen))


def check_stacks(world: int, gpu_type: str | None, reset: bool) -> None:
    what = "a rank that reset its signals" if reset else "CUDA work"
    fn = distributed(gpus=world, gpu_type=gpu_type, tracking=False, output="none")(busy)
    handle = fn.start(60.0, reset)
    try:
        check(f"{what}: the call runs", _inside_busy(handle, world))
        stacks = handle.stacks()
        alive = handle.status is RunStatus.RUNNING
        if reset:
            ok = all("stacks unavailable" in stacks.get(r, "") for r in range(world))
            check(f"{what}: 'stacks unavailable', nothing killed", ok and alive, str(stacks)[:300])
        else:
            ok = all("busy" in stacks.get(r, "") for r in range(world))
            check(f"{what}: every rank's stacks, nothing killed", ok and alive, str(sorted(stacks)))
    finally:
        handle.cancel("the check is over")
    try:
        handle.result(60)
        check(f"{what}: the cancel ends the call", False, "it returned")
    except CancelledError as exc:
        check(f"{what}: the cancel ends the call as a cancel", True, str(exc).splitlines()[0])


def check_timeout_not_retried(world: int, gpu_type: str | None, gpus: bool) -> None:
    folder = tempfile.mkdtemp(prefix="doctor-check-")
    fn = distributed(
        gpus=world,
        gpu_type=gpu_type,
        tracking=False,
        output="none",
        timeout=TIMEOUT_S,
        max_retries=1,
    )(loops_after_a_collective)
    try:
        fn.distributed(folder)
        check("the timeout stopped the call", False, "it returned")
        return
    except DistributedTimeoutError as exc:
        text = str(exc)
    attempts = {name.split("_")[1] for name in os.listdir(folder)}
    check("a timeout is not retried", attempts == {"0"}, str(sorted(os.listdir(folder))))
    check("the error names rank 0's frame", "loops_after_a_collective (" in text, text[:400])
    if gpus:
        check("rank 0's last collective (flight recorder)", "all_reduce #" in text, text[:600])


def main() -> int:
    args = rank_parser().parse_args()
    world, gpu_type = ranks(args)
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    print(f"{world} ranks, {'CPU (gloo)' if args.cpu else 'GPU (NCCL)'}", flush=True)
    check_store(world, gpu_type)
    check_stacks(world, gpu_type, reset=False)
    check_stacks(world, gpu_type, reset=True)
    check_timeout_not_retried(world, gpu_type, gpus=not args.cpu)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
