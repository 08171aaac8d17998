"""The Ray actors of one call: a standby set's or fresh ones, and after the call kept for the
next call of its shape or released.

Fresh actors need a reservation (a placement group, waited for, bounded by the call's timeout
and cancel: ``stop_reason``), an event sink on the caller's node, and each actor's place
(node, IP, GPUs; rank 0 picks the process group's port). A standby set is taken only if its
nodes live and its actors answer within 5 s; any fault costs the set, never the call.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from serverless_gpu.backends.ray import waiting
from serverless_gpu.backends.ray.placement import (
    PlacementError,
    Reservation,
    _Stopped,
    bundles,
    ray_accelerator,
    reserve,
)
from serverless_gpu.backends.ray.ranks import RayRank, rank_environment
from serverless_gpu.backends.ray.standby import ActorSet, Shape, Standby, release
from serverless_gpu.caller.hooks import RunContext
from serverless_gpu.common import settings
from serverless_gpu.rank.warm_group import GroupPlan
from serverless_gpu.wire.env import group_env
from serverless_gpu.wire.events import RunWaiting

CALL_S = 30.0
"""Bound on one control call to an actor (its answer, not the rank's work)."""
_SLICE_S = 0.1
_WARM_S = 5.0
"""How long standby actors may take to answer before the call gives up on them (a node that
died under them, a rank whose group formation waits for a dead peer) and starts fresh ones."""
_MAKE_WAY_S = 0.3
"""How long a reservation waits before the standby sets are released to make room for it."""
_SAY_AFTER_S = 1.0
_SAY_EVERY_S = 2.0
"""A reservation that waits this long is announced; what it lacks is checked this often."""


class _WarmLost(Exception):
    """A standby actor did not answer: the call starts fresh actors instead."""


class RunActors:
    """The actors, placement group and event sink of one call's ``ranks`` (their ``RayRank``
    records, shared with the run: filled in here)."""

    def __init__(
        self,
        ctx: RunContext,
        ranks: list[RayRank],
        standby: Standby,
        push: Callable[[Any], None],
        stop_reason: Callable[[], str | None],
        lost: Callable[[Any, RayRank, BaseException], None],
    ) -> None:
        self.ctx = ctx
        self.spec = ctx.spec
        self.ranks = ranks
        self.standby = standby
        self.push = push
        self.stop_reason = stop_reason
        """Why the call was stopped (a cancel, the timeout, a failure), polled while waiting."""
        self.lost = lost
        """A fresh actor died before it said where it runs: the rank failed."""
        self.device = ctx.placement.device
        self.cpus = settings.RAY_CPUS_PER_RANK.read(self.spec.env)
        self.adopt = False
        """The call's ranks take the process group formed ahead among their standby set."""
        self.warm = False
        """The call runs on standby actors."""
        self.made_way = False
        self.asked_bundles: list[dict[str, float]] = []
        self.said_waiting = ""
        self.next_say = 0.0
        self.job = ""
        self.reservation: Reservation | None = None
        self.sink: Any = None

    @property
    def shape(self) -> Shape:
        accelerator = ray_accelerator(self.ctx.placement.gpu_type.value)
        env = tuple(sorted(group_env(self.spec.env).items()))
        return (len(self.ranks), self.device, self.cpus, accelerator, env)

    def start_fresh(self, ray: Any) -> None:
        timeout = settings.RAY_RESERVE_TIMEOUT.read(self.spec.env)
        world = len(self.ranks)
        accelerator = ray_accelerator(self.ctx.placement.gpu_type.value)
        self.asked_bundles = bundles(world, self.device, self.cpus, accelerator)
        never = waiting.never_fits(ray, self.asked_bundles)
        if never is not None:
            raise PlacementError(never)
        self.reservation = reserve(
            world, self.device, self.cpus, timeout, self.stop_reason, accelerator, self._waiting
        )
        if self.said_waiting:
            self.push(RunWaiting(self.ctx.run_id, "", time.time()))
        self.sink = _make_sink(ray)
        self._start_actors(ray, self.cpus)
        self._locate(ray)

    def _waiting(self, waited: float) -> None:
        """The cluster has no room for the call's ranks yet: idle standby actors (of other
        shapes or environments) make way first; then the console and the widget are told
        what is missing, again whenever that changes."""
        if waited >= _MAKE_WAY_S and not self.made_way:
            self.made_way = True
            self.standby.release_all()
        now = time.monotonic()
        if waited < _SAY_AFTER_S or now < self.next_say:
            return
        import ray

        self.next_say = now + _SAY_EVERY_S
        text = waiting.waiting_text(ray, self.asked_bundles)
        if text != self.said_waiting:
            self.said_waiting = text
            self.push(RunWaiting(self.ctx.run_id, text, time.time()))

    def take_warm(self, ray: Any) -> bool:
        """Use the standby set of this call's shape, if one is there: a node of it that died
        since, or actors that did not answer (their group formation, their sink) within 5 s,
        cost the set (released), never the call. An actor process killed on a live node is
        found only when the call runs on it: that call fails as with any rank that dies."""
        found = self.standby.take(self.shape, self.job)
        if found is None:
            return False
        alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
        if not set(found.reservation.node_of_rank) <= alive:
            release(found)
            return False
        self.reservation, self.sink = found.reservation, found.sink
        for r, actor, place in zip(self.ranks, found.actors, found.places, strict=True):
            r.actor, r.node_rank = actor, found.reservation.node_rank[r.rank]
            r.place = place
        try:
            # Nothing of the last call (a late stop or stacks command) may reach this one.
            ray.get(self.sink.clear.remote(), timeout=_WARM_S)
            # Their group formed (or failed to) only if every actor was there to answer.
            formed = ray.get(found.group, timeout=_WARM_S) if found.group else []
            if not found.group:
                self._locate(ray, warm_by=time.monotonic() + _WARM_S)
        except (_WarmLost, ray.exceptions.RayError):
            release(found)
            self.reservation = self.sink = None
            self.ranks[:] = [RayRank(r.rank) for r in self.ranks]
            return False
        self.adopt = bool(formed) and all(formed)
        self.warm = True
        return True

    def keep(self) -> bool:
        """Leave the actors to the next call of this shape, forming its process group among
        them now; False when they cannot be kept (then they are released)."""
        import ray

        idle_s = settings.RAY_IDLE_S.read(self.spec.env)
        if idle_s <= 0 or self.reservation is None:
            return False
        try:
            # Two ports of rank 0's node: the group's formed now, and the next call's own.
            where = ray.get(self.ranks[0].actor.where.remote(True), timeout=CALL_S)
        except Exception:  # rank 0's actor is gone: nothing to keep
            return False
        plans: list[GroupPlan | None] = [None] * len(self.ranks)
        if self.spec.config.warm_process_group:
            plans = [self._group_plan(r, where) for r in self.ranks]
        group = [r.actor.form_group.remote(p) for r, p in zip(self.ranks, plans, strict=True)]
        if not self.spec.config.warm_process_group:
            group = []
        places = [dict(r.place) for r in self.ranks]
        places[0]["port"] = where["next_port"]
        actors = [r.actor for r in self.ranks]
        kept = ActorSet(self.shape, self.reservation, actors, self.sink, self.job, places, group)
        self.standby.keep(kept, idle_s)
        return True

    def _group_plan(self, r: RayRank, where: dict[str, Any]) -> GroupPlan:
        env = rank_environment(self.spec, self.ranks, r, self.cpus)
        env["MASTER_PORT"] = str(where["port"])
        local = int(env["LOCAL_RANK"])
        world = len(self.ranks)
        return GroupPlan(
            r.rank, world, self.device, int(where["port"]), None, env, str(where["ip"]), local
        )

    def _start_actors(self, ray: Any, cpus: int) -> None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from serverless_gpu.backends.ray.rank_actor import RankActor

        assert self.reservation is not None
        remote = ray.remote(RankActor)
        for r in self.ranks:
            r.node_rank = self.reservation.node_rank[r.rank]
            r.actor = remote.options(
                num_cpus=cpus,
                num_gpus=1 if self.device == "cuda" else 0,
                max_restarts=0,
                max_task_retries=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=self.reservation.group,
                    placement_group_bundle_index=self.reservation.bundle_of_rank[r.rank],
                ),
            ).remote(self.ctx.run_id, r.rank, self.sink)

    def _locate(self, ray: Any, warm_by: float | None = None) -> None:
        """Wait (bounded by the call's timeout and cancel) for every actor to report where it
        runs; rank 0 also picks the process group's port on its node. Standby actors must
        answer by ``warm_by``, else :class:`_WarmLost`."""
        refs = {r.actor.where.remote(r.rank == 0): r for r in self.ranks}
        while refs:
            ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=_SLICE_S)
            for ref in ready:
                r = refs.pop(ref)
                try:
                    r.place = ray.get(ref)
                except ray.exceptions.RayActorError as exc:
                    if warm_by is not None:
                        raise _WarmLost() from exc
                    self.lost(ray, r, exc)
            if refs and warm_by is not None and time.monotonic() >= warm_by:
                raise _WarmLost()
            reason = self.stop_reason()
            if reason is not None:
                raise _Stopped(reason)

    def kill_all(self) -> None:
        import ray

        for r in self.ranks:
            if r.actor is not None:
                try:
                    ray.kill(r.actor, no_restart=True)
                except Exception:  # already gone
                    pass

    def remove(self) -> None:
        """Kill the sink, remove the placement group."""
        import ray
        from ray.util.placement_group import remove_placement_group

        if self.sink is not None:
            try:
                ray.kill(self.sink, no_restart=True)
            except Exception:
                pass
        if self.reservation is not None:
            try:
                remove_placement_group(self.reservation.group)
            except Exception:
                pass


def _make_sink(ray: Any) -> Any:
    """The event sink on this node, so that the caller's polls stay local."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from serverless_gpu.backends.ray.rank_actor import EventSink

    node = ray.get_runtime_context().get_node_id()
    strategy = NodeAffinitySchedulingStrategy(node, soft=True) if node else "DEFAULT"
    return ray.remote(EventSink).options(num_cpus=0, scheduling_strategy=strategy).remote()
