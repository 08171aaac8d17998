"""One call on a Ray cluster, supervised from a thread of the caller.

Root cause = the first failure in time (``wire/outcome.py``, as in the launcher); any failure,
the timeout or a cancel kills every other rank's actor at once (``ray.kill``, also when it is
blocked in a collective). With ``stop_grace`` a cancel or the timeout first asks the ranks to
return (``runtime.should_stop()``) and kills them when that time is over; the timeout takes
every rank's stacks first (``doctor.py``). A call that succeeded leaves its actors, placement
group and event sink to the next call of its shape (``standby.py``); any other end kills and
removes them in ``finally``. If the caller dies, Ray removes them itself (they belong to the
caller's job).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from serverless_gpu.backends.ray import doctor, results, waiting
from serverless_gpu.backends.ray.doctor import STACKS, STOP
from serverless_gpu.backends.ray.placement import (
    PlacementError,
    Reservation,
    _Stopped,
    bundles,
    ray_accelerator,
    reserve,
)
from serverless_gpu.backends.ray.rank_spec import rank_spec
from serverless_gpu.backends.ray.ranks import LIVE, RayRank, rank_environment
from serverless_gpu.backends.ray.standby import ActorSet, Shape, Standby, release
from serverless_gpu.caller.hooks import RunContext
from serverless_gpu.common import settings
from serverless_gpu.common.errors import RankFailure, timeout_sentence
from serverless_gpu.common.timeout_words import ranks_timeout
from serverless_gpu.rank.warm_group import GroupPlan
from serverless_gpu.runfiles.serialization import dump_to_file
from serverless_gpu.wire.env import group_env
from serverless_gpu.wire.events import (
    OutputLines,
    RankFinished,
    RankMessage,
    RankStarted,
    RankState,
    RunStatus,
    RunWaiting,
)
from serverless_gpu.wire.outcome import RunOutcome

_SLICE_S = 0.1
_CALL_S = 30.0
"""Bound on one control call to an actor (its answer, not the rank's work)."""
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


class RayRun:
    """Reserve, start, watch and stop the ranks of one call; feed its handle's events."""

    def __init__(
        self, ctx: RunContext, payload: bytes, push: Callable[[Any], None], standby: Standby
    ) -> None:
        self.ctx = ctx
        self.standby = standby
        self.spec = ctx.spec
        self.payload = payload
        self.push = push
        p = self.ctx.placement
        self.ranks = [RayRank(r) for r in range(p.world_size)]
        self.device = p.device
        self.cpus = settings.RAY_CPUS_PER_RANK.read(self.spec.env)
        self.deadline = None if self.ctx.timeout is None else time.monotonic() + self.ctx.timeout
        self.cancel_reason: str | None = None
        """A cancel that stops the ranks now."""
        self.ask_reason: str | None = None
        """A cancel that asks the ranks to return first (``stop_grace``)."""
        self.stop_grace = float(self.spec.config.stop_grace)
        self.asked: tuple[RunStatus, str] | None = None
        self.ask_deadline = 0.0
        self.adopt = False
        """The call's ranks take the process group formed ahead among their standby set."""
        self.warm = False
        """The call runs on standby actors."""
        self.made_way = False
        self.asked_bundles: list[dict[str, float]] = []
        self.said_waiting = ""
        self.next_say = 0.0
        self.job = ""
        self.outcome = RunOutcome(self.ctx.run_id)
        self.values: list[Any] = []
        self.value_errors: dict[int, BaseException] = {}
        self.reservation: Reservation | None = None
        self.sink: Any = None
        self.thread = threading.Thread(target=self._main, name="serverless-gpu-ray", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def cancel(self, reason: str, force: bool = False) -> None:
        """With ``stop_grace`` the first cancel of running ranks asks them to return; a
        second one, or ``force``, stops them at once."""
        if force or self.stop_grace <= 0 or self.ask_reason is not None:
            self.cancel_reason = reason
        else:
            self.ask_reason = reason

    def request_stacks(self) -> None:
        """Ask every running rank for its stacks (``handle.stacks()``, the widget)."""
        self._command([r.rank for r in self.ranks if r.state is RankState.RUNNING], STACKS)

    @property
    def stopping(self) -> bool:
        """The run was stopped (a failure, the timeout, a cancel): every actor is killed."""
        return self.outcome.stopped

    # -- the run's thread -----------------------------------------------------------------------

    def _main(self) -> None:
        try:
            self._run()
        except _Stopped as stop:
            self._stop(self._stop_status(), stop.reason)
        except PlacementError as exc:
            self._run_failed(str(exc))
        except Exception as exc:  # a fault of ours or of the cluster ends this call, clearly
            self._run_failed(f"the Ray backend failed: {type(exc).__name__}: {exc}")
        finally:
            self._end()

    def _end(self) -> None:
        keep = self._keepable()
        if not keep:
            self._kill_all()
        self._take_events()
        if keep:
            keep = self._keep()
        if not keep:
            self._kill_all()
            self._release()
        self._close_logs()
        self._finish()

    def _run(self) -> None:
        import ray

        self.job = ray.get_runtime_context().get_job_id()
        if not self._take_warm(ray):
            self._start_fresh(ray)
        if self.stopping:
            return
        self._open_logs()
        payload = ray.put(self.payload)
        pending = {}
        place = results.place_for(self.ctx.paths)
        for r in self.ranks:
            spec = rank_spec(self.spec, self.ranks, r, self.cpus, self.adopt, place)
            ref = r.actor.run.remote(payload, spec)
            pending[ref] = r
            r.state = RankState.RUNNING
            doctor.start_dump_file(self.ctx.paths, r.rank, str(r.place.get("main_thread", "")))
            pid = r.place["pid"]
            self.push(RankStarted(self.ctx.run_id, r.rank, pid, time.time(), r.label))
        self._watch(ray, pending)
        if not self.stopping:
            self._fetch_results(ray)

    @property
    def shape(self) -> Shape:
        accelerator = ray_accelerator(self.ctx.placement.gpu_type.value)
        env = tuple(sorted(group_env(self.spec.env).items()))
        return (len(self.ranks), self.device, self.cpus, accelerator, env)

    def _start_fresh(self, ray: Any) -> None:
        timeout = settings.RAY_RESERVE_TIMEOUT.read(self.spec.env)
        world = len(self.ranks)
        accelerator = ray_accelerator(self.ctx.placement.gpu_type.value)
        self.asked_bundles = bundles(world, self.device, self.cpus, accelerator)
        never = waiting.never_fits(ray, self.asked_bundles)
        if never is not None:
            raise PlacementError(never)
        self.reservation = reserve(
            world, self.device, self.cpus, timeout, self._stop_reason, accelerator, self._waiting
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

    # -- standby actors -------------------------------------------------------------------------

    def _take_warm(self, ray: Any) -> bool:
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
            self.ranks = [RayRank(r.rank) for r in self.ranks]
            return False
        self.adopt = bool(formed) and all(formed)
        self.warm = True
        return True

    def _keepable(self) -> bool:
        return (
            self.spec.config.standby
            and not self.stopping
            and not self.outcome.failures
            and not self.value_errors
            and all(r.state is RankState.DONE for r in self.ranks)
            and self.reservation is not None
            and self.sink is not None
        )

    def _keep(self) -> bool:
        """Leave the actors to the next call of this shape, forming its process group among
        them now; False when they cannot be kept (then they are released)."""
        import ray

        idle_s = settings.RAY_IDLE_S.read(self.spec.env)
        if idle_s <= 0 or self.reservation is None:
            return False
        try:
            # Two ports of rank 0's node: the group's formed now, and the next call's own.
            where = ray.get(self.ranks[0].actor.where.remote(True), timeout=_CALL_S)
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

    def _open_logs(self) -> None:
        paths = self.ctx.paths
        paths.logs.mkdir(mode=0o700, exist_ok=True)
        for r in self.ranks:
            r.log = open(paths.log(r.rank), "ab", buffering=0)  # noqa: SIM115

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
                    self._lost(ray, r, exc)
            if refs and warm_by is not None and time.monotonic() >= warm_by:
                raise _WarmLost()
            reason = self._stop_reason()
            if reason is not None:
                raise _Stopped(reason)
            if self.stopping:
                return

    def _watch(self, ray: Any, pending: dict[Any, RayRank]) -> None:
        while pending and not self.stopping:
            ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=_SLICE_S)
            self._take_events()
            for ref in ready:
                self._rank_ended(ray, pending.pop(ref), ref)
            if pending and not self.stopping:
                self._timers()

    def _timers(self) -> None:
        """While the ranks run: a cancel, the timeout (stacks first), the end of
        ``stop_grace``."""
        now = time.monotonic()
        if self.cancel_reason is not None:
            self._stop(RunStatus.CANCELLED, self.cancel_reason)
        elif self.ask_reason is not None and self.asked is None:
            self._ask(RunStatus.CANCELLED, self.ask_reason)
        elif self.deadline is not None and now >= self.deadline:
            self.deadline = None
            running = [r.rank for r in self.ranks if r.state is RankState.RUNNING]
            message = timeout_sentence(self.ctx.timeout or 0.0, running)
            paths = self.ctx.paths
            doctor.take_before_stop(
                paths, running, lambda: self._command(running, STACKS), self._take_events
            )
            self._ask(RunStatus.TIMED_OUT, message)
        elif self.asked is not None and now >= self.ask_deadline:
            self._stop(*self.asked)

    def _ask(self, status: RunStatus, message: str) -> None:
        """Ask the running ranks to return within ``stop_grace``; without it, stop them now."""
        running = [r.rank for r in self.ranks if r.state is RankState.RUNNING]
        if self.stop_grace <= 0 or self.asked is not None or not running:
            self._stop(status, message)
            return
        self.asked = (status, message)
        self.ask_deadline = time.monotonic() + self.stop_grace
        self._command(running, STOP)

    def _command(self, ranks: list[int], command: str) -> None:
        if self.sink is not None and ranks:
            self.sink.command.remote(ranks, command)

    def _rank_ended(self, ray: Any, r: RayRank, ref: Any) -> None:
        try:
            outcome = ray.get(ref, timeout=_CALL_S)
        except ray.exceptions.RayActorError as exc:
            self._lost(ray, r, exc)
            return
        self._take_events()  # the rank's last output before its end
        if outcome[0] == "ok":
            r.state, r.result, r.summary = RankState.DONE, outcome[1][0], outcome[2]
            self._rank_finished(r)
            return
        record, summary = outcome[1], outcome[2]
        dump_to_file(record, self.ctx.paths.error(r.rank))
        r.state, r.summary = RankState.FAILED, summary
        self.outcome.rank_failed(record.failure)
        self._rank_finished(r)
        self._stop(RunStatus.FAILED)

    def _lost(self, ray: Any, r: RayRank, exc: BaseException) -> None:
        """The rank's actor died under it: its node died, or its process was killed."""
        if self.stopping and r.state is not RankState.RUNNING:
            return
        node = r.place.get("node_id") or (
            self.reservation.node_of_rank[r.rank] if self.reservation else ""
        )
        peers = [x.rank for x in self.ranks if x.node_rank == r.node_rank]
        if node and not _node_alive(ray, node):
            what = (
                f"was lost with its node: {r.label} died; "
                f"ranks {', '.join(map(str, peers))} ran there"
            )
        else:
            first = str(exc).strip().splitlines()
            what = "was killed: its Ray actor died" + (f" ({first[0]})" if first else "")
        r.state, r.summary = RankState.FAILED, what
        self.outcome.rank_failed(RankFailure.lost(r.rank, time.time(), what))
        self._rank_finished(r)
        self._stop(RunStatus.FAILED)

    def _fetch_results(self, ray: Any) -> None:
        refs = [r.result for r in self.ranks if not isinstance(r.result, results.ResultFile)]
        while refs:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=_SLICE_S, fetch_local=True)
            if len(ready) == len(refs):
                break
            reason = self._stop_reason()
            if reason is not None:
                raise _Stopped(reason)
        for r in self.ranks:
            try:
                self.values.append(results.load(ray, r.result, _CALL_S))
            except Exception as exc:  # e.g. the result's class cannot be imported here
                self.values.append(None)
                self.value_errors[r.rank] = exc

    # -- stopping -------------------------------------------------------------------------------

    def _stop_reason(self) -> str | None:
        """Before the ranks run (reserving, starting): a cancel, graceful or not, or the
        timeout stops the call now."""
        if self.cancel_reason is not None:
            return self.cancel_reason
        if self.ask_reason is not None:
            return self.ask_reason
        if self.deadline is not None and time.monotonic() >= self.deadline:
            return ranks_timeout(self.ctx.timeout or 0.0, ((r.rank, r.state) for r in self.ranks))
        return None

    def _stop_status(self) -> RunStatus:
        cancelled = self.cancel_reason is not None or self.ask_reason is not None
        return RunStatus.CANCELLED if cancelled else RunStatus.TIMED_OUT

    def _stop(self, status: RunStatus, message: str = "") -> None:
        if self.outcome.stopped_for(status, message):
            self._kill_all()

    def _run_failed(self, message: str) -> None:
        """The run itself failed (its placement, our code or the cluster), unless it was
        stopped already: then that stop is its end."""
        if not self.stopping:
            self.outcome.run_failed(time.time(), message)
            self.outcome.stopped_for(RunStatus.FAILED, message)

    def _kill_all(self) -> None:
        import ray

        for r in self.ranks:
            if r.actor is not None:
                try:
                    ray.kill(r.actor, no_restart=True)
                except Exception:  # already gone
                    pass

    def _release(self) -> None:
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

    def _close_logs(self) -> None:
        for r in self.ranks:
            if r.log is not None:
                r.log.close()

    def _take_events(self) -> None:
        import ray

        if self.sink is None:
            return
        try:
            events = ray.get(self.sink.take.remote(), timeout=_CALL_S)
        except Exception:  # the sink is gone (the caller's node is going away): nothing to show
            return
        for event in events:
            if event.run_id != self.ctx.run_id:
                continue  # a thread the last call of the set left behind
            if isinstance(event, RankMessage) and event.kind == STACKS:
                doctor.append(self.ctx.paths, event.rank, str(event.data))
                continue
            if isinstance(event, OutputLines):
                self._log(event)
            self.push(event)

    def _log(self, event: OutputLines) -> None:
        log = self.ranks[event.rank].log
        if log is not None:
            data = "".join(p for p in event.lines if p.endswith(("\n", "\r")))
            log.write(data.encode("utf-8", "backslashreplace"))

    def _rank_finished(self, r: RayRank) -> None:
        self.push(
            RankFinished(self.ctx.run_id, r.rank, r.state, None, None, time.time(), r.summary)
        )

    def _finish(self) -> None:
        for r in self.ranks:
            if r.state in LIVE:
                r.state = RankState.STOPPED
                if r.actor is not None:
                    self._rank_finished(r)
        unfinished = tuple(r.rank for r in self.ranks if r.state is RankState.STOPPED)
        note = f"stopped early ({self.asked[1]}); every rank returned" if self.asked else ""
        self.push(self.outcome.finished(unfinished, time.time(), note))


def _make_sink(ray: Any) -> Any:
    """The event sink on this node, so that the caller's polls stay local."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from serverless_gpu.backends.ray.rank_actor import EventSink

    node = ray.get_runtime_context().get_node_id()
    strategy = NodeAffinitySchedulingStrategy(node, soft=True) if node else "DEFAULT"
    return ray.remote(EventSink).options(num_cpus=0, scheduling_strategy=strategy).remote()


def _node_alive(ray: Any, node_id: str) -> bool:
    return any(n["NodeID"] == node_id and n.get("Alive") for n in ray.nodes())
