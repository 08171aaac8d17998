"""What a rank costs: the same call, session, sweep, stacks and cancel at several world sizes,
side by side in one run, on CPU ranks (gloo).

    PYTHONPATH=. python benchmarks/world_size.py [--sizes 2 8 16] [--reps 5] [--quick] [--out F]

A machine with 16 cores runs 16 CPU ranks: the stand-in for 8 or 16 GPUs where no such machine
is at hand. Untracked (``tracking=False``), so it runs where MLflow is not installed. Rows:

* first call of a fresh Python process (import, launcher start, ranks forked): median of reps;
* call, warm: median of ``--reps`` later calls (standby ranks with their group formed);
* all-reduce job, warm: ``init_process_group`` + one all-reduce + ``destroy_process_group``;
* session: opening it and its first cell; an empty cell's round trip (median of 50);
  ``push`` / ``pull`` of 64 MiB per rank;
* stacks of a hang: every rank blocked in ``time.sleep``; ``stacks()`` until every rank's stack
  is back; then ``cancel()`` until the run has ended and its ranks are gone;
* a sweep of 32 ``gpus=1`` trials over every CPU slot (once, at the largest size's slots).
"""

# ruff: noqa: E402 - the slot count must be set before serverless_gpu reads it.
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

_sizes = [int(a) for a in sys.argv[sys.argv.index("--sizes") + 1 :] if a.isdigit()] or [2, 8, 16]
os.environ.setdefault("SERVERLESS_GPU_CPU_SLOTS", str(max(_sizes)))

import psutil

from serverless_gpu import Session, distributed, runtime

SETTLE_S = 1.5
"""After a call the launcher makes standby ranks of its shape: give them time to form their group
(a benchmark may pause; tests may not)."""


def noop() -> int:
    return 0


def allreduce() -> float:
    import torch
    import torch.distributed as dist

    runtime.init_process_group()
    t = torch.ones(1)
    dist.all_reduce(t)
    dist.destroy_process_group()
    return float(t)


def hang() -> None:
    time.sleep(600)


def trial(x: int) -> int:
    time.sleep(0.2)
    return x * x


def _timed(step: Callable[[], object]) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


FIRST_CALL = """
import time; start = time.perf_counter()
from serverless_gpu import distributed
distributed(gpus={n}, gpu_type="cpu", tracking=False, output="none")(lambda: 0).distributed()
print(time.perf_counter() - start)
"""


def _first_call(n: int) -> float:
    """Seconds from ``import serverless_gpu`` to a first call's results, in a fresh process."""
    code = FIRST_CALL.format(n=n)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    return float(out.stdout.split()[-1])


def _fmt(seconds: float) -> str:
    return f"{seconds * 1e3:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


def calls(n: int, reps: int) -> list[tuple[str, str]]:
    call = distributed(gpus=n, gpu_type="cpu", tracking=False, output="none")
    job, reduce_job = call(noop), call(allreduce)
    cold = statistics.median(_first_call(n) for _ in range(reps))
    warm = []
    for _ in range(reps):
        time.sleep(SETTLE_S)
        warm.append(_timed(job.distributed))
    reduced = []
    for _ in range(reps):
        time.sleep(SETTLE_S)
        start = time.perf_counter()
        values = reduce_job.distributed()
        reduced.append(time.perf_counter() - start)
        assert values == [float(n)] * n, values
    return [
        ("first call of a fresh process -> results", _fmt(cold)),
        (f"call, warm -> results (median of {reps})", _fmt(statistics.median(warm))),
        ("all-reduce job, warm -> results", _fmt(statistics.median(reduced))),
    ]


def session(n: int, quick: bool) -> list[tuple[str, str]]:
    import torch

    time.sleep(SETTLE_S)
    start = time.perf_counter()
    sess = Session(gpus=n, gpu_type="cpu", tracking=False, output="none")
    with sess:
        sess.exec("import torch")
        opened = time.perf_counter() - start
        trips = [_timed(lambda: sess.exec("")) for _ in range(20 if quick else 50)]
        size = 64 << 20
        big = torch.ones(size // 4)
        push = _timed(lambda: sess.push(big=big))
        sess.exec("big = big + 1")
        pull = _timed(lambda: sess.pull("big"))
    return [
        ("session: open + first cell", _fmt(opened)),
        ("session: empty cell round trip (median)", f"{statistics.median(trips) * 1e3:.2f} ms"),
        ("session: push 64 MiB to every rank", f"{size / push / 1e9:.2f} GB/s"),
        ("session: pull 64 MiB from every rank", f"{n * size / pull / 1e9:.2f} GB/s"),
    ]


def stacks_and_cancel(n: int) -> list[tuple[str, str]]:
    time.sleep(SETTLE_S)
    job = distributed(gpus=n, gpu_type="cpu", tracking=False, output="none")(hang)
    handle = job.start()
    deadline = time.monotonic() + 120
    while handle.status != "running" and time.monotonic() < deadline:
        time.sleep(0.05)
    got: dict[int, str] = {}
    start = time.perf_counter()
    while len(got) < n and time.monotonic() < deadline:
        got = handle.stacks(timeout=10)
    took_stacks = time.perf_counter() - start
    ranks = [
        c for c in psutil.Process().children(recursive=True) if "rank" in " ".join(c.cmdline())
    ]
    start = time.perf_counter()
    handle.cancel(force=True)
    ended = handle.wait(timeout=60)
    gone = psutil.wait_procs(ranks, timeout=30)[1] == []
    took_cancel = time.perf_counter() - start
    return [
        ("stacks of a hang: every rank's stack", f"{_fmt(took_stacks)} ({len(got)} of {n} ranks)"),
        (
            "cancel a hang -> ended, ranks gone",
            f"{_fmt(took_cancel)} ({handle.status.value}"
            + ("" if ended and gone else ", NOT all gone")
            + ")",
        ),
    ]


def sweep(trials: int) -> list[tuple[str, str]]:
    time.sleep(SETTLE_S)
    job = distributed(gpus=1, gpu_type="cpu", tracking=False, output="none")(trial)
    start = time.perf_counter()
    handles = job.map(range(trials))
    values = [h.result(timeout=600)[0] for h in handles]
    took = time.perf_counter() - start
    assert values == [x * x for x in range(trials)], values
    slots = os.environ["SERVERLESS_GPU_CPU_SLOTS"]
    return [(f"sweep of {trials} gpus=1 trials (0.2 s each) over {slots} slots", _fmt(took))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 8, 16])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="CI size: 2 reps, 20 round trips")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    reps = 2 if args.quick else args.reps
    columns = {
        n: calls(n, reps) + session(n, args.quick) + stacks_and_cancel(n) for n in args.sizes
    }
    names = [name for name, _ in columns[args.sizes[0]]]
    header = "| | " + " | ".join(f"{n} ranks" for n in args.sizes) + " |"
    lines = [
        f"CPU ranks (gloo); {os.cpu_count()} CPU cores; load average {os.getloadavg()[0]:.1f}; "
        f"{time.strftime('%Y-%m-%d %H:%M')}",
        "",
        header,
        "|---" * (len(args.sizes) + 1) + "|",
        *(
            f"| {name} | " + " | ".join(columns[n][i][1] for n in args.sizes) + " |"
            for i, name in enumerate(names)
        ),
        "",
        *(f"{name}: {value}" for name, value in sweep(8 if args.quick else 32)),
    ]
    text = "\n".join(lines)
    print(text, flush=True)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
