"""The caller's record of each rank of a call on Ray, and the environment the rank gets."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import IO, Any

from serverless_gpu.wire.env import rank_env
from serverless_gpu.wire.events import RankState
from serverless_gpu.wire.runspec import RunSpec

LIVE = (RankState.STARTING, RankState.RUNNING)


@dataclass(frozen=True)
class HostCopy:
    """A rank's result that held CUDA tensors, pickled with each one copied to host memory:
    the caller gets CPU tensors, as from a local run, and needs no GPU to read them."""

    data: bytes

    def load(self) -> Any:
        import pickle

        return pickle.loads(self.data)


@dataclass
class RayRank:
    """One rank of the call, as the caller follows it."""

    rank: int
    actor: Any = None
    """Its Ray actor handle."""
    place: dict[str, Any] = field(default_factory=dict)
    """Where it runs, as its actor reported it (``RankActor.where``)."""
    node_rank: int = 0
    state: RankState = RankState.STARTING
    summary: str = ""
    """What it returned (type, shape) or how it failed, in one line."""
    result: Any = None
    """The object reference of its return value, or the ``results.ResultFile`` it was written to."""
    log: IO[bytes] | None = None
    """Its log in the caller's run directory (``RunPaths.log``)."""

    @property
    def label(self) -> str:
        """``node 1 (10.0.0.7)``: where the rank runs, as the renderers show it."""
        ip = self.place.get("ip")
        return f"node {self.node_rank} ({ip})" if ip else f"node {self.node_rank}"


def rank_environment(spec: RunSpec, ranks: list[RayRank], r: RayRank, cpus: int) -> dict[str, str]:
    """The rank's environment as torchrun sets it across nodes, on top of the caller's."""
    master = ranks[0].place
    local = [x for x in ranks if x.node_rank == r.node_rank]
    env = rank_env(
        spec.env,
        rank=r.rank,
        world_size=len(ranks),
        master_port=int(master["port"]),
        device=spec.device,
        run_id=spec.run_id,
        run_dir=str(spec.paths.run_dir),
    )
    env.update(
        LOCAL_RANK=str(local.index(r)),
        LOCAL_WORLD_SIZE=str(len(local)),
        GROUP_RANK=str(r.node_rank),
        NODE_RANK=str(r.node_rank),
        MASTER_ADDR=str(master["ip"]),
    )
    if "OMP_NUM_THREADS" not in spec.env:
        env["OMP_NUM_THREADS"] = str(cpus)
    env.pop("CUDA_VISIBLE_DEVICES", None)  # the caller's GPUs are not the node's
    if spec.device == "cuda":
        # Each rank sees every GPU Ray gave this call's ranks on its node, in local-rank order,
        # so that cuda:LOCAL_RANK is its own GPU (as under torchrun) and NCCL sees its peers.
        env["CUDA_VISIBLE_DEVICES"] = ",".join(x.place["gpu_ids"][0] for x in local)
    loopback = str(master["ip"]).startswith("127.")
    if not loopback and "GLOO_SOCKET_IFNAME" not in spec.env:
        env.pop("GLOO_SOCKET_IFNAME", None)  # the loopback would not reach other nodes
    return env
