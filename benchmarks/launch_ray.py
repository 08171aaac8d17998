"""Launch latency of ``remote=True`` (the Ray backend) beside Ray Train's ``TorchTrainer``, on one
Ray cluster in one run; run by ``launch.py --backend ray``.

The same all-reduce job three ways: our first call (fresh rank actors and placement group),
our warm calls (the standby actors the last call left, their process group formed ahead),
and ``TorchTrainer(fn, scaling_config=ScalingConfig(num_workers=N)).fit()`` (Ray Train starts
its workers and forms their group on every fit). Without ``RAY_ADDRESS`` the script starts a Ray
cluster on this machine with ``ray.cluster_utils.Cluster``: a head node without CPUs and two
nodes holding half the ranks each, on 127.0.0.1. Its processes do not import
``rfc3987_syntax`` (``tests/ray/no_rfc3987``), as on a cluster image without jupyterlab: where it
is installed, every Ray process (each rank's actor too) spends about 3 s of CPU importing it.

Our calls are measured untracked and tracked (MLflow, a SQLite store in a temporary folder),
the ratio tracked / untracked beside them.

    PYTHONPATH=. python benchmarks/launch.py --backend ray --cpu [--gpus N] [--reps K] [--out F]
"""

from __future__ import annotations

import os

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # before ray: 127.0.0.1 nodes

import tempfile
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

    cluster: AbstractContextManager[Any] = nullcontext()
    if not os.environ.get("RAY_ADDRESS"):
        cluster = _LocalCluster(s.world_size, s.device)
    samples: dict[str, list[tuple[float, float]]] = {}
    with cluster:
        if not ray.is_initialized():
            address = getattr(cluster, "cluster", None)
            ray.init(address=address.address if address else None, log_to_driver=False)
        C.quiet_console()
        from serverless_gpu.backends.ray import stop_ray_calls

        for tracked in (False, True):
            suffix = ", tracked" if tracked else ""
            for name, values in _our_calls(s, tracked).items():
                samples[name + suffix] = values
            stop_ray_calls()  # fresh actors for the next first call; Ray Train's workers last
        samples["TorchTrainer.fit"] = [
            _one_fit(s.world_size, s.device) for _ in range(1 if s.quick else TRAINER_REPS)
        ]
        ray.shutdown()
    return samples


TRAINER_REPS = 2


def _our_calls(s: C.Settings, tracked: bool) -> dict[str, list[tuple[float, float]]]:
    from serverless_gpu import distributed

    gpu_type = "cpu" if s.cpu else None
    fn = distributed(
        gpus=s.world_size, gpu_type=gpu_type, remote=True, output="none", tracking=tracked
    )(_jobs.user_fn)
    samples = {"first call": [_one_call(fn, "allreduce", s.device)]}
    time.sleep(C.SETTLE_S[s.device])
    for job in JOBS if not s.quick else JOBS[1:]:
        samples[f"warm call, {job}"] = []
        for _ in range(s.reps):
            samples[f"warm call, {job}"].append(_one_call(fn, job, s.device))
            time.sleep(C.SETTLE_S[s.device])
    return samples


def _one_call(fn: Any, job: str, device: str) -> tuple[float, float]:
    t_call, t_back, entries = C.timed(lambda: fn.distributed(job, device, None))
    return max(entries) - t_call, t_back - t_call


def trainer_loop(config: dict[str, Any]) -> None:
    """Ray Train's worker: the same all-reduce on the group Ray Train formed for it."""
    entry = time.time()
    import ray.train

    rank = ray.train.get_context().get_world_rank()
    Path(config["out"], f"entry_{rank}").write_text(repr(entry))
    os.environ.setdefault("LOCAL_RANK", str(ray.train.get_context().get_local_rank()))
    _jobs.allreduce_once(config["device"])


def _one_fit(world_size: int, device: str) -> tuple[float, float]:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    with tempfile.TemporaryDirectory() as out:
        trainer = TorchTrainer(
            trainer_loop,
            train_loop_config={"out": out, "device": device},
            scaling_config=ScalingConfig(num_workers=world_size, use_gpu=device == "cuda"),
            run_config=RunConfig(storage_path=out, name="fit"),
        )
        t_call, t_back, _ = C.timed(trainer.fit)
        entries = [float(Path(out, f"entry_{r}").read_text()) for r in range(world_size)]
    return max(entries) - t_call, t_back - t_call


def main(argv: Sequence[str]) -> None:
    s = C.parse_settings(__doc__.splitlines()[0], argv)
    store = tempfile.mkdtemp(prefix="sgpu-bench-ray-mlflow-")
    os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{store}/mlflow.db")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    samples = measure(s)
    where = os.environ.get("RAY_ADDRESS") or "2 Ray nodes on this machine (127.0.0.1)"
    rows = [
        [job, C.fmt_s([a for a, _ in xs]), C.fmt_s([b for _, b in xs])]
        for job, xs in samples.items()
    ]
    table = C.markdown_table(
        ["job", "call -> all ranks in user code", "call -> results back"], rows
    )
    fit = C.median([b for _, b in samples["TorchTrainer.fit"]])
    first = samples["first call"][0][1]
    warm = C.median([b for _, b in samples["warm call, allreduce"]])
    ratios = C.markdown_table(
        ["call -> results back, against TorchTrainer.fit", "ratio", "target", "verdict"],
        [
            ["first call", C.fmt_ratio(first / fit), "<= 0.3x", C.verdict(first / fit <= 0.3)],
            ["warm call", C.fmt_ratio(warm / fit), "<= 0.01x", C.verdict(warm / fit <= 0.01)],
        ],
    )
    intro = (
        f"{s.world_size} ranks on {where}; medians over the reps, (min-max) after them. "
        f"Every job is one all-reduce of one float ('noop' returns at once); 'first call' "
        f"starts the rank actors, 'warm call' uses those the last call left. Collective "
        f"backend: {C.gloo_or_nccl(s)}."
    )
    C.emit_report(
        s,
        "Launch benchmark, remote=True (Ray) beside Ray Train",
        [
            ("Launch latency", intro + "\n\n" + table + "\n\n" + ratios),
            ("Tracked against untracked", _tracking_table(samples)),
        ],
    )


def _tracking_table(samples: dict[str, list[tuple[float, float]]]) -> str:
    """Call -> results back, tracked / untracked (medians), for each of our rows."""
    rows = []
    for name, plain in samples.items():
        tracked = samples.get(name + ", tracked")
        if tracked is None:
            continue
        ratio = C.median([b for _, b in tracked]) / C.median([b for _, b in plain])
        limit = 1.2 if name == "first call" else 1.5
        rows.append([name, C.fmt_ratio(ratio), f"<= {limit}x", C.verdict(ratio <= limit)])
    return C.markdown_table(
        ["call -> results back", "tracked / untracked", "target", "verdict"], rows
    )
