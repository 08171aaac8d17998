"""What a Ray rank actor receives for one call: a ``RankSpec`` (``wire/protocol.py``), as a local
rank receives, with what only the caller can work out for a rank on a Ray node.

The caller knows where every rank landed (node-major ranks, rank 0's node and port, the GPUs Ray
gave each node): it works the rank's environment out (``ranks.rank_environment``) and says where
the rank may write its result (``results.ResultsPlace``). The actor then becomes the rank as any
rank does (``rank/become.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from serverless_gpu.backends.ray.ranks import RayRank, rank_environment
from serverless_gpu.backends.ray.results import ResultsPlace
from serverless_gpu.wire.protocol import RankSpec
from serverless_gpu.wire.runspec import RunSpec


@dataclass(frozen=True)
class RayRankSpec(RankSpec):
    """One rank's part of a call on a Ray node."""

    node_env: dict[str, str] = field(default_factory=dict)
    """The rank's complete environment (``ranks.rank_environment``): ``LOCAL_RANK``,
    ``NODE_RANK``, ``MASTER_ADDR`` (rank 0's node), the node's ``CUDA_VISIBLE_DEVICES`` ..."""
    results: ResultsPlace | None = None
    """Where a rank on the caller's machine writes its result; None: Ray's object store."""

    def env(self) -> dict[str, str]:
        return dict(self.node_env)


def rank_spec(
    spec: RunSpec,
    ranks: list[RayRank],
    r: RayRank,
    cpus: int,
    warm: bool,
    results: ResultsPlace | None,
) -> RayRankSpec:
    """Rank ``r``'s spec of the call ``spec`` once every rank has landed (``RayRank.place``);
    ``warm``: every rank holds the group formed ahead among its standby set."""
    return RayRankSpec(
        run=spec,
        rank=r.rank,
        master_port=int(ranks[0].place["port"]),
        warm_group=warm,
        node_env=rank_environment(spec, ranks, r, cpus),
        results=results,
    )
