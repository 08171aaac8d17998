"""Persistent sessions on GPUs, run on the device machine (docs/gpu-validation.md):

    PYTHONPATH=. python3 scripts/sessions_gpu_check.py            # every visible GPU
    PYTHONPATH=. python3 scripts/sessions_gpu_check.py --cpu      # 2 CPU ranks

1. notebooks/10_sessions.ipynb's session cells, run in order through ``Session.exec`` (each
   cell's ``%%distributed`` line dropped; the ``%distributed_session`` cells are
   ``status_line()`` and ``close()``). Where mlflow is not installed, the cell's ``import
   mlflow`` gives a stand-in whose ``log_metric`` does nothing, and the session is untracked.
2. An empty cell's round trip (median of 300), and push / pull of a 1 GiB tensor per rank
   (a CPU tensor pushed; a tensor on the rank's device pulled).

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

from serverless_gpu import Session

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


def notebook(gpus: int | None, gpu_type: str | None, tracking: bool) -> None:
    with Session(gpus=gpus, gpu_type=gpu_type, tracking=tracking, name="gpt") as sess:
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


def speed(gpus: int | None, gpu_type: str | None) -> None:
    import torch

    with Session(gpus=gpus, gpu_type=gpu_type, tracking=False, output="none") as sess:
        sess.exec("import torch\nfrom serverless_gpu import runtime")
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
        size = 1 << 30
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
        check("push 1 GiB to every rank", push >= 2, f"{push:.2f} GB/s")
        check(
            "pull 1 GiB from every rank",
            pull >= 2,
            f"{pull:.2f} GB/s (tensors on the ranks' device)",
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cpu", action="store_true")
    parser.add_argument("--gpus", type=int, default=None)
    args = parser.parse_args()
    gpu_type = "cpu" if args.cpu else None
    gpus = args.gpus or (2 if args.cpu else None)
    tracking = importlib.util.find_spec("mlflow") is not None
    print(f"tracking: {'on' if tracking else 'off (mlflow not installed)'}", flush=True)
    notebook(gpus, gpu_type, tracking)
    speed(gpus, gpu_type)
    print("all checks passed" if not failed else f"failed: {', '.join(failed)}", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
