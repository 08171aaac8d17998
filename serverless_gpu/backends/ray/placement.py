"""Reserving a call's ranks on the cluster: one placement-group bundle per rank, packed onto as
few nodes as possible, ranks of one node contiguous (node-major, as torchrun numbers them)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from serverless_gpu.common import settings
from serverless_gpu.common.errors import DistributedError

_SLICE_S = 0.1


class PlacementError(DistributedError):
    """The cluster cannot hold the call's ranks (within the reservation timeout)."""


@dataclass(frozen=True)
class Reservation:
    """A ready placement group and where each rank goes in it."""

    group: Any
    """The ``ray.util.placement_group.PlacementGroup``."""
    bundle_of_rank: tuple[int, ...]
    node_of_rank: tuple[str, ...]
    """Ray node id of each rank's bundle."""
    node_rank: tuple[int, ...]
    """``NODE_RANK`` of each rank: nodes numbered in rank order."""


def bundles(
    world_size: int, device: str, cpus_per_rank: float, accelerator: str | None = None
) -> list[dict[str, float]]:
    """One bundle per rank; ``accelerator`` (``"H100"``) asks for nodes whose GPUs Ray
    recognised as that type (its ``accelerator_type:<type>`` node resource)."""
    one: dict[str, float] = {"CPU": cpus_per_rank}
    if device == "cuda":
        one["GPU"] = 1
        if accelerator:
            one[f"accelerator_type:{accelerator}"] = 0.001
    return [dict(one) for _ in range(world_size)]


def ray_accelerator(gpu_type: str) -> str | None:
    """Ray's name for a ``GPUType`` value (Ray calls the A10 ``A10G``); None for any GPU."""
    if gpu_type in ("OTHER", "CPU"):
        return None
    return "A10G" if gpu_type == "A10" else gpu_type


def reserve(
    world_size: int,
    device: str,
    cpus_per_rank: float,
    timeout: float,
    stop: Callable[[], str | None],
    accelerator: str | None = None,
    waiting: Callable[[float], None] = lambda waited: None,
) -> Reservation:
    """Reserve the ranks' bundles, waiting at most ``timeout`` seconds (and not past ``stop()``
    returning a reason); ``waiting(seconds)`` is called while the group is not ready. The
    group is removed again on any failure."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    asked = bundles(world_size, device, cpus_per_rank, accelerator)
    group = placement_group(asked, strategy="PACK")
    try:
        start = time.monotonic()
        deadline = start + timeout
        ready = group.ready()
        while not ray.wait([ready], timeout=_SLICE_S)[0]:
            waiting(time.monotonic() - start)
            reason = stop()
            if reason is not None:
                raise _Stopped(reason)
            if time.monotonic() >= deadline:
                raise PlacementError(_not_enough(asked, timeout))
        return _layout(group, world_size)
    except BaseException:
        remove_placement_group(group)
        raise


class _Stopped(Exception):
    """The call was cancelled or timed out while its ranks were being reserved."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _layout(group: Any, world_size: int) -> Reservation:
    from ray.util.placement_group import placement_group_table

    node_of_bundle: dict[int, str] = {
        int(b): str(n) for b, n in placement_group_table(group)["bundles_to_node_id"].items()
    }
    # Nodes in the order their first bundle appears; each node's bundles get consecutive ranks.
    nodes: list[str] = []
    for b in range(world_size):
        if node_of_bundle[b] not in nodes:
            nodes.append(node_of_bundle[b])
    order = sorted(range(world_size), key=lambda b: (nodes.index(node_of_bundle[b]), b))
    return Reservation(
        group=group,
        bundle_of_rank=tuple(order),
        node_of_rank=tuple(node_of_bundle[b] for b in order),
        node_rank=tuple(nodes.index(node_of_bundle[b]) for b in order),
    )


def _not_enough(asked: list[dict[str, float]], timeout: float) -> str:
    import ray

    need: dict[str, float] = {}
    for bundle in asked:
        for key, value in bundle.items():
            need[key] = need.get(key, 0) + value
    total = ray.cluster_resources()
    free = ray.available_resources()
    per_node = [
        {k: v for k, v in node["Resources"].items() if k in need}
        for node in ray.nodes()
        if node.get("Alive")
    ]
    return (
        f"the Ray cluster could not hold {len(asked)} ranks of {fmt_resources(asked[0])} each "
        f"({fmt_resources(need)} in all) within {timeout:g} s: it has "
        f"{fmt_resources(_pick(total, need))} "
        f"({fmt_resources(_pick(free, need))} free now) on {len(per_node)} node(s): "
        + "; ".join(fmt_resources(n) for n in per_node)
        + f". Ask for fewer ranks, add nodes, or raise {settings.RAY_RESERVE_TIMEOUT.name}."
    )


def _pick(resources: dict[str, float], keys: dict[str, float]) -> dict[str, float]:
    return {k: resources.get(k, 0.0) for k in keys}


def fmt_resources(resources: dict[str, float]) -> str:
    return ", ".join(f"{v:g} {k}" for k, v in sorted(resources.items())) or "nothing"
