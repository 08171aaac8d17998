"""A cluster that must grow: what a waiting reservation lacks, and a request that never fits.

The autoscaler's own report is read from the cluster (the GCS key ``ray status`` reads, written
by the head's monitor every few seconds). A cluster started without an autoscaling config runs
the monitor too, with a read-only provider that can add nothing: its report names each node's
type after the node itself.
"""

from __future__ import annotations

import json
import time
from typing import Any

_STALE_S = 60.0
"""A report older than this is from a monitor that is gone."""


def autoscaler_report(ray: Any) -> dict[str, Any] | None:
    """The autoscaler's last report, or None where no autoscaler can add nodes."""
    try:
        from ray._private import ray_constants
        from ray.experimental import internal_kv

        raw = internal_kv._internal_kv_get(ray_constants.DEBUG_AUTOSCALING_STATUS)
        status = json.loads(raw) if raw else None
    except Exception:  # a Ray without this key or a client connection: say nothing of it
        return None
    if not isinstance(status, dict) or time.time() - float(status.get("time", 0)) > _STALE_S:
        return None
    report = status.get("autoscaler_report") or {}
    types = list(report.get("active_nodes") or {}) + list(report.get("pending_launches") or {})
    # The read-only provider names each node's type after the node ("node_<id>"); an
    # autoscaler's types are those of its config.
    if not types or all(t.startswith("node_") for t in types):
        return None
    return report


def pending_nodes(report: dict[str, Any]) -> int:
    launches = report.get("pending_launches") or {}
    return len(report.get("pending_nodes") or []) + sum(int(n) for n in launches.values())


def waiting_text(ray: Any, asked: list[dict[str, float]]) -> str:
    """``waiting for the Ray cluster: 4 ranks of 1 CPU requested, 0 CPU free; 2 nodes
    pending (autoscaler)``."""
    from serverless_gpu.backends.ray.placement import fmt_resources

    one = {k: v for k, v in asked[0].items() if not k.startswith("accelerator_type:")}
    main = "GPU" if "GPU" in one else "CPU"
    free = float(ray.available_resources().get(main, 0.0))
    text = (
        f"waiting for the Ray cluster: {len(asked)} ranks of {fmt_resources(one)} requested, "
        f"{free:g} {main} free" + _missing(ray, len(asked), one, main)
    )
    report = autoscaler_report(ray)
    if report is None:
        return text + "; no autoscaler to add nodes"
    return text + f"; {pending_nodes(report)} nodes pending (autoscaler)"


def _missing(ray: Any, ranks: int, one: dict[str, float], main: str) -> str:
    """What the free total hides: a rank's bundle must fit on one node, so free resources
    spread over nodes hold fewer ranks than they add up to; where they do hold every rank,
    Ray is placing them (behind other reservations, if any). "" where the total says it all,
    or where Ray does not say (a client connection)."""
    from serverless_gpu.backends.ray.placement import fmt_resources

    try:
        from ray._private import state

        per_node: dict[str, dict[str, float]] = state.available_resources_per_node()
    except Exception:  # a Ray without it, or a client connection: the total is all there is
        return ""
    fits = sum(_fits(free, one) for free in per_node.values())
    if fits < ranks and _fits(ray.available_resources(), one) <= fits:
        return ""  # too little free in all: the total says so
    if fits < ranks:
        spread = "; ".join(
            f"node {node[:8]}: {float(free.get(main, 0.0)):g} {main}"
            for node, free in sorted(per_node.items())
            if free.get(main, 0.0) > 0
        )
        return (
            f", but room for only {fits}: each rank needs {fmt_resources(one)} on one node, and "
            f"the free {main} is spread over nodes ({spread or 'none'})"
        )
    ahead = _pending_groups() - 1
    behind = f" behind {ahead} other pending placement group(s)" if ahead > 0 else ""
    return f", room for all {ranks} now: Ray is placing them{behind}"


def _fits(free: dict[str, float], one: dict[str, float]) -> int:
    """How many bundles ``one`` fit into one node's free resources."""
    return min(int(free.get(k, 0.0) // v) for k, v in one.items() if v > 0)


def _pending_groups() -> int:
    try:
        from ray.util.placement_group import placement_group_table

        return sum(1 for g in placement_group_table().values() if g.get("state") == "PENDING")
    except Exception:
        return 0


def never_fits(ray: Any, asked: list[dict[str, float]]) -> str | None:
    """Why the request can never be met, or None: it asks for GPUs (of a type) that no node
    of the cluster has, and no autoscaler could add a node."""
    from serverless_gpu.backends.ray.placement import fmt_resources

    special = [k for k in asked[0] if k == "GPU" or k.startswith("accelerator_type:")]
    if not special:
        return None
    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    missing = [k for k in special if not any(n.get(k, 0) > 0 for n in nodes)]
    if not missing:
        return None
    if autoscaler_report(ray) is not None:
        return None  # it may add such nodes: the reservation waits and says so
    has = "; ".join(
        fmt_resources({k: v for k, v in n.items() if k in ("CPU", "GPU")}) for n in nodes
    )
    return (
        f"the Ray cluster can never hold {len(asked)} ranks of {fmt_resources(asked[0])}: "
        f"no node has {' or '.join(missing)} and no autoscaler could add one; it has "
        f"{len(nodes)} node(s): {has}. Add such nodes, or ask for what the cluster has"
    )
