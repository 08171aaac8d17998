"""Launch latency of ``remote=True`` (the Ray backend), run by ``launch.py --backend ray``.

Each call starts fresh rank actors in a placement group on the cluster, so every call pays for
Ray's actor start; there are no standby ranks. Without ``RAY_ADDRESS`` the script starts a Ray
cluster on this machine with ``ray.cluster_utils.Cluster``: a head node without CPUs and two
nodes holding half the ranks each, on 127.0.0.1. Its processes do not import
``rfc3987_syntax`` (``tests/ray/no_rfc3987``), as on a cluster image without jupyterlab: where it
is installed, every Ray process (each rank's actor too) spends about 3 s of CPU importing it.

    PYTHONPATH=. python benchmarks/launch.py --backend ray --cpu [--gpus N] [--reps K] [--out F]
"""

from __future__ import annotations

import os

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # before ray: 127.0.0.1 nodes

import time
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import _common as C
import _jobs

JOBS = ("noop", "allreduce")
LEAN_PATH = Path(__file__).resolve().parents[1] / "tests" / "ray" / "no_rfc3987"


class _LocalCluster(AbstractContextManager["_LocalCluster"]):
    def __init__(self, world_size: int, device: str) -> None:
        from ray.cluster_utils import Cluster

        os.environ["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(LEAN_PATH), os.environ.get("PYTHONPATH")])
        )
        per_node = (world_size + 1) // 2
        node: dict[str, Any] = {"num_cpus": per_node, "object_store_memory": 200 * 2**20}
        if device == "cuda":
            node["num_gpus"] = per_node
        self.cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
        for _ in range(2):
            self.cluster.add_node(**node)
        self.cluster.wait_for_nodes()

    def __exit__(self, *exc: object) -> None:
        self.cluster.shutdown()


def measure(s: C.Settings) -> dict[str, list[tuple[float, float]]]:
    import ray

    from serverless_gpu import distributed

    cluster: AbstractContextManager[Any] = nullcontext()
    if not os.environ.get("RAY_ADDRESS"):
        cluster = _LocalCluster(s.world_size, s.device)
    samples: dict[str, list[tuple[float, float]]] = {}
    with cluster:
        if not ray.is_initialized():
            address = getattr(cluster, "cluster", None)
            ray.init(address=address.address if address else None, log_to_driver=False)
        C.quiet_console()
        gpu_type = "cpu" if s.cpu else None
        fn = distributed(
            gpus=s.world_size, gpu_type=gpu_type, remote=True, output="none", tracking=False
        )(_jobs.user_fn)
        for job in ("first call", *(JOBS if not s.quick else JOBS[1:])):
            name = "allreduce" if job == "first call" else job
            reps = 1 if job == "first call" else s.reps
            samples[job] = []
            for _ in range(reps):
                samples[job].append(_one_call(fn, name, s.device))
                time.sleep(C.SETTLE_S[s.device])
        ray.shutdown()
    return samples


def _one_call(fn: Any, job: str, device: str) -> tuple[float, float]:
    t_call, t_back, entries = C.timed(lambda: fn.distributed(job, device, None))
    return max(entries) - t_call, t_back - t_call


def main(argv: Sequence[str]) -> None:
    s = C.parse_settings(__doc__.splitlines()[0], argv)
    samples = measure(s)
    where = os.environ.get("RAY_ADDRESS") or "2 Ray nodes on this machine (127.0.0.1)"
    rows = [
        [job, C.fmt_s([a for a, _ in xs]), C.fmt_s([b for _, b in xs])]
        for job, xs in samples.items()
    ]
    table = C.markdown_table(
        ["job", "call -> all ranks in user code", "call -> results back"], rows
    )
    intro = (
        f"{s.world_size} ranks on {where}; medians over the reps, (min-max) after them. "
        f"'first call' is the allreduce job right after connecting. Collective backend: "
        f"{C.gloo_or_nccl(s)}."
    )
    C.emit_report(
        s, "Launch benchmark, remote=True (Ray)", [("Launch latency", intro + "\n\n" + table)]
    )
