"""Persistent sessions: an empty cell's round trip (untracked and tracked) beside ipyparallel's
``%px`` on engines of the same machine and nbdistributed's workers, measured side by side in
one run; a fresh process's first cell (the session's start and an empty cell), untracked and
tracked; and push / pull of a 1 GiB tensor per rank.

    .venv/bin/python benchmarks/sessions.py [--ranks 2] [--reps 300] [--quick] [--out FILE]
        [--remote]

``--remote``: the same figures for a session on a Ray cluster of this machine too (two nodes,
one rank on each: ``ray.cluster_utils.Cluster`` on 127.0.0.1, ``pip install ray``), beside the
local ones; its push / pull move 256 MiB per rank.

ipyparallel and nbdistributed are not dependencies of the project: where they are not
importable their rows say so (``pip install ipyparallel nbdistributed``, or put them on
``PYTHONPATH``). The caller never touches CUDA; on a GPU machine the ranks hold one GPU each.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _median_ms(step: Callable[[], object], reps: int, warm: int = 20) -> float:
    for _ in range(warm):
        step()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def session_round_trip(
    ranks: int, reps: int, tracking: bool, gpu_type: str | None, remote: bool = False
) -> float:
    from serverless_gpu import Session

    with Session(
        gpus=ranks, gpu_type=gpu_type, tracking=tracking, output="none", remote=remote
    ) as sess:
        sess.exec("")  # the ranks are up
        return _median_ms(lambda: sess.exec(""), reps)


def first_cell_s(ranks: int, tracking: bool, gpu_type: str | None) -> float:
    """In a fresh process (serverless_gpu imported): the session's start and its first empty
    cell, as the first ``%%distributed --session`` cell of a notebook."""
    code = (
        "import sys, time\n"
        "from serverless_gpu import Session\n"
        "start = time.perf_counter()\n"
        f"sess = Session(gpus={ranks}, gpu_type={gpu_type!r}, tracking={tracking}, "
        "output='none')\n"
        "sess.exec('')\n"
        "print('FIRST_CELL', time.perf_counter() - start, flush=True)\n"
        "sess.close()\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *sys.path])}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    for line in done.stdout.splitlines():
        if line.startswith("FIRST_CELL "):
            return float(line.split()[1])
    raise RuntimeError(f"the first-cell process failed: {done.stderr[-2000:]}")


def first_cells(ranks: int, reps: int, gpu_type: str | None) -> tuple[float, float]:
    """Median first cell (s), untracked and tracked, alternating so that load hits both."""
    plain, tracked = [], []
    for _ in range(reps):
        plain.append(first_cell_s(ranks, False, gpu_type))
        tracked.append(first_cell_s(ranks, True, gpu_type))
    return statistics.median(plain), statistics.median(tracked)


def ipyparallel_round_trip(ranks: int, reps: int) -> float | str:
    try:
        import ipyparallel as ipp
    except ImportError:
        return "not installed"
    cluster = ipp.Cluster(n=ranks, log_level=40)
    client = cluster.start_and_connect_sync()
    try:
        client.wait_for_engines(ranks, timeout=120)
        view = client[:]
        view.block = True
        # What %px does: execute on every engine and wait for every engine's reply.
        return _median_ms(lambda: view.execute("", silent=False), reps)
    finally:
        client.close()
        cluster.stop_cluster_sync()


def nbdistributed_round_trip(ranks: int, reps: int) -> float | str:
    try:
        from nbdistributed.communication import CommunicationManager
        from nbdistributed.process_manager import ProcessManager
    except ImportError:
        return "not installed"
    manager = ProcessManager()
    try:
        port = manager.start_workers(ranks, "localhost", None)
        comm = CommunicationManager(ranks, port)
        try:
            # Its ROUTER socket drops what it sends before a worker has connected: ask until
            # every worker answers.
            deadline = time.monotonic() + 60
            while True:
                try:
                    comm.send_to_all("get_status", {}, timeout=1.0)
                    break
                except TimeoutError:
                    if time.monotonic() > deadline:
                        raise
            return _median_ms(lambda: comm.send_to_all("execute", ""), reps)
        finally:
            comm.shutdown()
    except Exception as exc:  # a baseline that does not start here is reported, not fatal
        return f"did not start: {type(exc).__name__}: {exc}"
    finally:
        manager.shutdown()


def push_pull_rates(
    ranks: int, size: int, gpu_type: str | None, remote: bool = False
) -> tuple[float, float]:
    """GB/s of ``push`` (one tensor of ``size`` bytes to every rank) and of ``pull`` (one such
    tensor from every rank: ranks x size bytes)."""
    import torch

    from serverless_gpu import Session

    values = torch.ones(size // 4, dtype=torch.float32)
    with Session(
        gpus=ranks, gpu_type=gpu_type, tracking=False, output="none", remote=remote
    ) as sess:
        sess.exec("import torch")
        pushes, pulls = [], []
        for _ in range(3):
            start = time.perf_counter()
            sess.push(big=values)
            pushes.append(time.perf_counter() - start)
            sess.exec("big = big + 1")  # a fresh tensor in each rank, as a training state is
            start = time.perf_counter()
            got = sess.pull("big")
            pulls.append(time.perf_counter() - start)
            assert float(got[-1][-1]) == 2.0
            del got
        sess.exec("del big")
    return size / min(pushes) / 1e9, ranks * size / min(pulls) / 1e9


def start_ray_cluster(ranks: int) -> object:
    """Two Ray nodes of this machine on 127.0.0.1 (a head without CPUs), ranks split evenly:
    this process is connected to it. Returns the cluster (``shutdown()`` ends it)."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # before ray is imported
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    for _ in range(2):
        cluster.add_node(num_cpus=max(1, ranks // 2), object_store_memory=256 << 20)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    return cluster


def _noop() -> None:
    return None


def first_cell_on_standby(ranks: int, gpu_type: str | None) -> tuple[float, float]:
    """Seconds of a warm remote call (its actors waiting), and of a remote session's start and
    first cell on the standby actors such a call leaves, each the best of 3."""
    from serverless_gpu import Session, distributed

    call = distributed(gpus=ranks, gpu_type=gpu_type, tracking=False, remote=True, output="none")
    fn = call(_noop)
    fn.distributed()  # the actors start, then wait for the next call of their shape
    calls, cells = [], []
    for _ in range(3):
        start = time.perf_counter()
        fn.distributed()
        calls.append(time.perf_counter() - start)
        start = time.perf_counter()
        with Session(
            gpus=ranks, gpu_type=gpu_type, tracking=False, output="none", remote=True
        ) as sess:
            sess.exec("")
            cells.append(time.perf_counter() - start)
    return min(calls), min(cells)


def remote_rows(ranks: int, reps: int, gpu_type: str | None) -> list[str]:
    cluster: Any = start_ray_cluster(ranks)
    try:
        warm_call, first_cell = first_cell_on_standby(ranks, gpu_type)
        untracked = session_round_trip(ranks, reps, False, gpu_type, remote=True)
        tracked = session_round_trip(ranks, reps, True, gpu_type, remote=True)
        size = 256 << 20
        push, pull = push_pull_rates(ranks, size, gpu_type, remote=True)
    finally:
        import ray

        ray.shutdown()
        cluster.shutdown()
    where = "remote session (Ray, 2 nodes of this machine)"
    return [
        f"| warm remote call (standby actors) -> result | {warm_call * 1000:.0f} ms |",
        f"| {where}: start + first cell, on a call's standby actors | {first_cell * 1000:.0f} ms |",
        f"| empty cell, {where}, untracked | {untracked:.2f} ms |",
        f"| empty cell, {where}, tracked (MLflow) | {tracked:.2f} ms |",
        f"| push, {size >> 20} MiB to every rank, {where} | {push:.2f} GB/s |",
        f"| pull, {size >> 20} MiB from every rank, {where} | {pull:.2f} GB/s |",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--reps", type=int, default=300)
    parser.add_argument("--cpu", action="store_true", help="CPU ranks even with GPUs")
    parser.add_argument("--quick", action="store_true", help="CI size: few reps, 64 MiB")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--skip-baselines", action="store_true")
    parser.add_argument("--remote", action="store_true", help="a session on Ray too")
    parser.add_argument("--first-cell-reps", type=int, default=5)
    args = parser.parse_args()
    reps = 20 if args.quick else args.reps
    size = (64 if args.quick else 1024) << 20
    gpu_type = "cpu" if args.cpu else None
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    store = tempfile.mkdtemp(prefix="sessions-bench-")
    os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{store}/mlflow.db")
    plain_ms = session_round_trip(args.ranks, reps, False, gpu_type)
    tracked_ms = session_round_trip(args.ranks, reps, True, gpu_type)
    first_plain, first_tracked = first_cells(
        args.ranks, 1 if args.quick else args.first_cell_reps, gpu_type
    )
    rows: list[tuple[str, float | str]] = [
        ("empty cell, Session.exec, untracked", plain_ms),
        ("empty cell, Session.exec, tracked (MLflow)", tracked_ms),
        ("empty cell, tracked / untracked", f"{tracked_ms / plain_ms:.2f}x"),
        ("first cell of a fresh process (start + empty cell), untracked", first_plain * 1000),
        ("first cell of a fresh process, tracked (MLflow)", first_tracked * 1000),
        (
            "first cell, tracked / untracked (target <= 1.2x)",
            f"{first_tracked / first_plain:.2f}x",
        ),
    ]
    if not args.skip_baselines:
        rows.append(
            ("empty cell, ipyparallel %px (view.execute)", ipyparallel_round_trip(args.ranks, reps))
        )
        rows.append(
            (
                "empty cell, nbdistributed (send_to_all execute)",
                nbdistributed_round_trip(args.ranks, reps),
            )
        )
    push, pull = push_pull_rates(args.ranks, size, gpu_type)
    lines = [
        f"{args.ranks} ranks; median of {reps} round trips; {size >> 20} MiB tensor per rank",
        "",
        "| what | figure |",
        "| --- | --- |",
        *(
            f"| {name} | {value:.2f} ms |" if isinstance(value, float) else f"| {name} | {value} |"
            for name, value in rows
        ),
        f"| push, {size >> 20} MiB to every rank | {push:.2f} GB/s |",
        f"| pull, {size >> 20} MiB from every rank | {pull:.2f} GB/s |",
        *(remote_rows(args.ranks, reps, gpu_type) if args.remote else []),
    ]
    text = "\n".join(lines)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
