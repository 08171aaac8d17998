"""How long a successful call's ranks take to exit after its results are back, and what that
does to the next call: the ranks' teardown (communicators, CUDA context) runs after the results,
and the next call's ranks start once those ranks are gone.

Two ways of ending a rank are timed side by side: shutting its process groups down first
(``warm_group.finish``, the library's way) and exiting at once (``_exit_at_once.py`` is imported
in the launcher and turns ``finish`` into a no-op for the ranks it forks).

    PYTHONPATH=. python benchmarks/rank_teardown.py [--gpus N] [--cpu] [--reps K]
"""

# ruff: noqa: E402 - the environment below must be set before anything else is imported.
from __future__ import annotations

import os

from serverless_gpu.wire.env import multicast_off

multicast_off(os.environ)

import sys
import time
from pathlib import Path
from typing import Any

import _common as C
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))


def job() -> tuple[int, bool]:
    """init (the warm group), one all-reduce, a 1 GiB tensor on the device, destroy."""
    import torch
    import torch.distributed as dist

    from serverless_gpu import runtime

    runtime.init_process_group()
    value = torch.ones(1, device=runtime.device())
    dist.all_reduce(value)
    held = torch.ones(2**28, device=runtime.device())
    del held
    dist.destroy_process_group()
    from serverless_gpu.rank import warm_group

    return os.getpid(), warm_group.finish.__name__ == "<lambda>"


def gone_after(pids: list[int], limit: float = 30.0) -> float:
    start = time.time()
    while time.time() - start < limit:
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
        if not alive:
            return time.time() - start
        time.sleep(0.002)
    return float("nan")


def measure(s: C.Settings, exit_at_once: bool) -> dict[str, float]:
    import serverless_gpu
    from serverless_gpu import distributed
    from serverless_gpu.backends.local import LocalBackend
    from serverless_gpu.common.gpus import resolve_placement

    serverless_gpu.shutdown()
    here = str(Path(__file__).resolve().parent)
    if exit_at_once and here not in os.environ.get("PYTHONPATH", ""):  # for the launcher
        os.environ["PYTHONPATH"] = os.pathsep.join(
            filter(None, [os.environ.get("PYTHONPATH"), here])
        )
    options: dict[str, Any] = {"gpus": s.world_size, "gpu_type": "cpu" if s.cpu else None}
    fn = distributed(**options, output="none", tracking=False)(job)
    if exit_at_once:
        backend = fn.backend
        assert isinstance(backend, LocalBackend)
        backend.prewarm(resolve_placement(s.world_size, options["gpu_type"]), ("_exit_at_once",))
    fn.distributed()
    gone, back_to_back = [], []
    for _ in range(s.reps):
        time.sleep(C.SETTLE_S[s.device])
        ranks = list(fn.distributed())
        assert all(patched == exit_at_once for _, patched in ranks), ranks
        gone.append(gone_after([pid for pid, _ in ranks]))
        time.sleep(C.SETTLE_S[s.device])
        fn.distributed()  # then at once the next call: it waits for these ranks
        start = time.time()
        fn.distributed()
        back_to_back.append(time.time() - start)
    serverless_gpu.shutdown()
    return {"gone": C.median(gone), "next": C.median(back_to_back)}


def main() -> None:
    s = C.parse_settings(__doc__.splitlines()[0])
    C.quiet_console()
    rows = []
    for name, at_once in (("shut down groups, then exit", False), ("exit at once", True)):
        m = measure(s, at_once)
        rows.append([name, f"{m['gone']:.3f} s", f"{m['next']:.3f} s"])
    table = C.markdown_table(
        ["rank ending", "results back -> ranks gone", "back-to-back call -> results"], rows
    )
    C.emit_report(s, "Rank teardown after the results", [("Teardown", table)])


if __name__ == "__main__":
    main()
