"""Persistent sessions on GPUs, run on the device machine (docs/gpu-validation.md):

    PYTHONPATH=. python3 scripts/sessions_gpu_check.py            # every visible GPU
    PYTHONPATH=. python3 scripts/sessions_gpu_check.py --cpu      # 2 CPU ranks
    PYTHONPATH=. python3 scripts/sessions_gpu_check.py --remote   # on Ray (ray.init here)

1. notebooks/10_sessions.ipynb's session cells, run in order through ``Session.exec`` (each
   cell's ``%%distributed`` line dropped; the ``%distributed_session`` cells are
   ``status_line()`` and ``close()``). Where mlflow is not installed, the cell's ``import
   mlflow`` gives a stand-in whose ``log_metric`` does nothing, and the session is untracked.
2. Cancel while every rank runs a GPU loop (matrix products, no synchronisation): the cell
   ends as cancelled within 3 s and the session goes on.
3. An empty cell's round trip (median of 300), and push / pull of a 1 GiB tensor per rank
   (a CPU tensor pushed; a tensor on the rank's device pulled); 256 MiB with ``--remote``.

``--remote``: the session's ranks are Ray actors (``Session(remote=True)``) on the cluster at
``RAY_ADDRESS``, else on a Ray cluster of this machine that the script starts.

Prints each cell's values and one PASS/FAIL line per check; exits non-zero on a failure.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

from serverless_gpu import CancelledError, Session

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "10_sessions.ipynb"
STAND_IN = (
    "try:\n"
    "    import mlflow\n"
    "except ImportError:  # the device image has no mlflow: a stand-in that logs nothing\n"
    "    import types\n"
    "    mlflow = types.SimpleNamespace(log_metric=lambda *a, **k: None)\n"
)
failed: list[str] = []


def check(name: str, ok: bool, detail: str) -> None:
    print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)
    if not ok:
        failed.append(name)


def session_cells() -> list[str]:
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    codes = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    return [c.split("\n", 1)[1] for c in codes if c.startswith("%%distributed --session")]


def notebook(gpus: int | None, gpu_type: str | None, tracking: bool, remote: bool) -> None:
    with Session(
        gpus=gpus, gpu_type=gpu_type, tracking=tracking, name="gpt", remote=remote
    ) as sess:
        pids = sess.exec("import os\nos.getpid()")
        values = []
        for i, code in enumerate(session_cells(), 1):
            start = time.perf_counter()
            result = list(sess.exec(code.replace("import mlflow\n", STAND_IN)))
            print(f"cell {i} ({time.perf_counter() - start:.2f} s): {result}", flush=True)
            values.append(result)
        print(sess.status_line(), flush=True)
        first, second = values[1][0], values[3][0]
        check(
            "loss goes down across cells",
            second < first,
            f"{first} after 30 steps, {second} after 60",
        )
        check("same processes", sess.exec("os.getpid()") == pids, f"pids {list(pids)}")
        device = sess.exec("str(next(model.parameters()).device)")
        print(f"model on {list(device)}", flush=True)


def cancel_in_a_loop(sess: Session) -> None:
    handle = sess.start_exec(
        "x = torch.randn(2048, 2048, device=runtime.device())\n"
        "print('looping', flush=True)\n"
        "while True:\n"
        "    x = x @ x\n"
        "    x = x / x.norm()\n"
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not all(
        "looping" in sess.handle.logs(r) for r in range(sess.world_size)
    ):
        time.sleep(0.05)
    start = time.monotonic()
    handle.cancel()
    try:
        handle.result(timeout=30)
        outcome = "the cell returned"
    except CancelledError:
        outcome = "cancelled"
    took = time.monotonic() - start
    after = list(sess.exec("float(x.isfinite().all())")) if sess.alive else []
    check(
        "cancel in a GPU loop",
        outcome == "cancelled" and took <= 3.0 and sess.alive and after == [1.0] * sess.world_size,
        f"{outcome} in {took:.2f} s; session alive: {sess.alive}; next cell: {after}",
    )


def speed(gpus: int | None, gpu_type: str | None, remote: bool) -> None:
    import torch

    with Session(
        gpus=gpus, gpu_type=gpu_type, tracking=False, output="none", remote=remote
    ) as sess:
        sess.exec("import torch\nfrom serverless_gpu import runtime")
        cancel_in_a_loop(sess)
        for _ in range(30):
            sess.exec("")
        times = []
        for _ in range(300):
            start = time.perf_counter()
            sess.exec("")
            times.append(time.perf_counter() - start)
        ms = statistics.median(times) * 1000
        check(
            "empty cell round trip", ms < 10, f"{ms:.2f} ms median of 300, {sess.world_size} ranks"
        )
        size = 256 << 20 if remote else 1 << 30
        values = torch.ones(size // 4)
        pushes, pulls = [], []
        for _ in range(3):
            start = time.perf_counter()
            sess.push(big=values)
            pushes.append(time.perf_counter() - start)
            sess.exec("big = big.to(runtime.device()) + 1")
            start = time.perf_counter()
            got = sess.pull("big")
            pulls.append(time.perf_counter() - start)
            del got
        push = size / min(pushes) / 1e9
        pull = sess.world_size * size / min(pulls) / 1e9
        want, what = (1, "256 MiB") if remote else (2, "1 GiB")
        check(f"push {what} to every rank", push >= want, f"{push:.2f} GB/s")
        check(
            f"pull {what} from every rank",
            pull >= want,
            f"{pull:.2f} GB/s (tensors on the ranks' device)",
        )


def _connect_ray(cpu: bool) -> None:
    """The cluster at RAY_ADDRESS, else a Ray cluster of this machine (its GPUs, or none)."""
    import os

    import ray

    if os.environ.get("RAY_ADDRESS"):
        ray.init(log_to_driver=False)
    else:
        ray.init(
            address="local",  # a cluster of its own, not one another process runs here
            num_gpus=0 if cpu else None,
            include_dashboard=False,
            log_to_driver=False,
        )
    print(f"ray {ray.__version__}: {ray.cluster_resources()}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cpu", action="store_true")
    parser.add_argument("--gpus", type=int, default=None)
    parser.add_argument("--remote", action="store_true", help="the session on Ray")
    args = parser.parse_args()
    gpu_type = "cpu" if args.cpu else None
    gpus = args.gpus or (2 if args.cpu else None)
    tracking = importlib.util.find_spec("mlflow") is not None
    print(f"tracking: {'on' if tracking else 'off (mlflow not installed)'}", flush=True)
    if args.remote:
        _connect_ray(args.cpu)
    notebook(gpus, gpu_type, tracking, args.remote)
    speed(gpus, gpu_type, args.remote)
    print("all checks passed" if not failed else f"failed: {', '.join(failed)}", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
