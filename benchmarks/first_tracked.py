"""The first call of a process, tracked (MLflow) against untracked, right after decorating
and after a pause (a notebook: the decorator's cell, then the call in a cell written later).

    PYTHONPATH=. python benchmarks/first_tracked.py --cpu --reps 5 [--pause 3] [--out FILE]

Each sample is a fresh Python process: decorate, wait ``pause`` seconds, time the call to its
results. Untracked and tracked processes alternate (a load that changes meanwhile hits both).
The tracked calls log into a SQLite store made once beforehand (a notebook's ``mlflow.db`` is
there before its first call). What a tracked decoration does ahead of the call: the launcher and
standby ranks, as untracked, and the imports of the call's MLflow setup (no store touched).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import _common as C
import _jobs

SUBPROCESS_TIMEOUT_S = 180
TARGET = 1.2
"""Tracked first call / untracked first call (docs/benchmarks.md)."""


def child(pause: float, tracked: bool, device: str, world: int) -> None:
    import serverless_gpu
    from serverless_gpu import distributed

    C.quiet_console()
    gpu_type = "cpu" if device == "cpu" else None
    fn = distributed(gpus=world, gpu_type=gpu_type, tracking=tracked)(_jobs.user_fn)
    time.sleep(pause)  # the user writing the next cell
    start = time.time()
    fn.distributed("noop", device, None)
    took = time.time() - start
    serverless_gpu.shutdown()
    C.print_result({"s": took})


def sample(s: C.Settings, tmp: Path, pause: float, tracked: bool) -> float:
    cmd = [C.python(), str(Path(__file__).resolve()), "--child", str(pause)]
    cmd += [str(int(tracked)), s.device, str(s.world_size)]
    return float(C.run_child_json(cmd, SUBPROCESS_TIMEOUT_S, tmp / "child.log")["s"])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        wait_s, tracked_flag, device, world = sys.argv[2:6]
        child(float(wait_s), tracked_flag == "1", device, int(world))
        return
    pause = 3.0
    if "--pause" in sys.argv:
        at = sys.argv.index("--pause")
        pause = float(sys.argv[at + 1])
        del sys.argv[at : at + 2]
    s = C.parse_settings(__doc__ or "")
    with tempfile.TemporaryDirectory(prefix="sgpu-first-tracked-") as name:
        tmp = Path(name)
        from launch import make_store

        make_store(tmp)  # sets MLFLOW_TRACKING_URI for the children
        times: dict[tuple[float, bool], list[float]] = {}
        for _ in range(s.reps):
            for wait in (0.0, pause):
                for tracked in (False, True):
                    times.setdefault((wait, tracked), []).append(sample(s, tmp, wait, tracked))
    rows = []
    for wait in (0.0, pause):
        plain, tracked_ = times[(wait, False)], times[(wait, True)]
        ratio = C.median(tracked_) / C.median(plain)
        when = "right after decorating" if wait == 0 else f"{wait:g} s after decorating"
        rows.append([when, C.fmt_s(plain), C.fmt_s(tracked_), C.fmt_ratio(ratio), f"<= {TARGET}x"])
    table = C.markdown_table(
        ["first call of a process, no-op job", "untracked", "tracked", "ratio", "target"], rows
    )
    C.emit_report(s, "First call, tracked against untracked", [("First call", table)])


if __name__ == "__main__":
    main()
