"""One call on a Ray cluster, supervised from a thread of the caller.

The run's lifecycle is the run machine's (``lifecycle/run_machine.py``), as in the launcher:
this thread turns what Ray says (an actor's answer or death, the time, a cancel queued by the
caller) into its inputs, and its actions into Ray calls. Any failure, the timeout or a cancel
kills every rank's actor at once (``ray.kill``, also one blocked in a collective: Ray has no
TERM); with ``stop_grace`` a cancel or the timeout first asks the ranks to return
(``runtime.should_stop()``); the timeout takes every rank's stacks first (``doctor.py``). The
actors themselves (fresh or a standby set's, kept or released) are ``run_actors.py``'s. A call
that succeeded leaves its actors, placement group and event sink to the next call of its shape
(``standby.py``); any other end kills and removes them in ``finally``. If the caller dies, Ray
removes them itself (they belong to the caller's job).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from serverless_gpu.backends.ray import doctor, results
from serverless_gpu.backends.ray.doctor import FLUSH, STACKS, STOP
from serverless_gpu.backends.ray.placement import PlacementError, _Stopped
from serverless_gpu.backends.ray.rank_spec import rank_spec
from serverless_gpu.backends.ray.ranks import RayRank
from serverless_gpu.backends.ray.run_actors import CALL_S, RunActors
from serverless_gpu.backends.ray.standby import Standby
from serverless_gpu.caller.hooks import RunContext
from serverless_gpu.common import settings
from serverless_gpu.common.errors import RankFailure
from serverless_gpu.doctor import stacks
from serverless_gpu.lifecycle.run_actions import (
    Action,
    AskStop,
    CaptureStacks,
    Emit,
    Instant,
    RequestStacks,
    SaveStacks,
    Terminate,
)
from serverless_gpu.lifecycle.run_machine import RunMachine, Timing
from serverless_gpu.runfiles.serialization import dump_to_file
from serverless_gpu.wire.events import OutputLines, RankMessage, RankState

_SLICE_S = 0.1
FLUSH_S = 1.0
"""How long a stopped tracked call's ranks may take to send what they hold before their actors
are killed (a rank reads the command within 0.3 s)."""
_FLUSH_POLL_S = 0.05


class RayRun:
    """Reserve, start, watch and stop the ranks of one call; feed its handle's events."""

    def __init__(
        self, ctx: RunContext, payload: bytes, push: Callable[[Any], None], standby: Standby
    ) -> None:
        self.ctx = ctx
        self.spec = ctx.spec
        self.payload = payload
        self.push = push
        p = self.ctx.placement
        self.ranks = [RayRank(r) for r in range(p.world_size)]
        self.actors = RunActors(ctx, self.ranks, standby, push, self._stop_reason, self._lost)
        self.cpus = self.actors.cpus
        # Ray kills at once (no TERM, no grace); a timeout's stacks come back as messages.
        timing = Timing(self.ctx.timeout, float(self.spec.config.stop_grace), 0.0, stacks.WAIT_S)
        self.machine = RunMachine(self.ctx.run_id, p.world_size, timing, _now(), False)
        self.cancels: queue.SimpleQueue[tuple[str, bool]] = queue.SimpleQueue()
        """Cancels from the caller's threads, for the run's thread to hand to the machine."""
        self.capture: dict[int, int] = {}
        """The timeout's stacks being taken: each rank's dump file size before they were."""
        self.values: list[Any] = []
        self.value_errors: dict[int, BaseException] = {}
        self.thread = threading.Thread(target=self._main, name="serverless-gpu-ray", daemon=True)
        self._deliver_lock = threading.Lock()
        self._carry: dict[type, Callable[[Any], None]] = {
            Emit: lambda a: self.push(a.event),
            AskStop: lambda a: self._command(list(a.ranks), STOP),
            RequestStacks: lambda a: self._command(list(a.ranks), STACKS),
            CaptureStacks: self._capture_stacks,
            SaveStacks: self._save_stacks,
            Terminate: self._terminate,
        }
        """How the machine's actions are carried out on Ray. The others have no counterpart
        here: the specs go with each rank's call, an actor's output comes with its events,
        ``ray.kill`` at ``Terminate`` leaves no ``Kill`` to do, and no ``Release`` to wait for."""
        self._flushed: set[int] = set()
        """Ranks that answered ``FLUSH``: they have sent what they held."""

    @property
    def adopt(self) -> bool:
        """The call's ranks take the process group formed ahead among their standby set."""
        return self.actors.adopt

    def start(self) -> None:
        self.thread.start()

    def cancel(self, reason: str, force: bool = False) -> None:
        """With ``stop_grace`` the first cancel of running ranks asks them to return; a
        second one, or ``force``, stops them at once (the run's thread carries it out)."""
        self.cancels.put((reason, force))

    def request_stacks(self) -> None:
        """Ask every running rank for its stacks (``handle.stacks()``, the widget)."""
        self._apply(self.machine.stacks_wanted())

    @property
    def stopping(self) -> bool:
        """The run was stopped (a failure, the timeout, a cancel): every actor is killed."""
        return self.machine.stopped

    # -- the run machine ------------------------------------------------------------------------

    def _apply(self, actions: Iterable[Action]) -> None:
        for action in actions:
            carry = self._carry.get(type(action))
            if carry is not None:
                carry(action)

    def _capture_stacks(self, action: CaptureStacks) -> None:
        self.capture = stacks.offsets(self.ctx.paths, action.ranks)
        self._command(list(action.ranks), STACKS)

    def _save_stacks(self, _action: SaveStacks) -> None:
        stacks.save(self.ctx.paths, stacks.read_new(self.ctx.paths, self.capture))
        self.capture = {}

    def _poll(self) -> None:
        """Hand the machine the caller's cancels, the time, and word that the timeout's stacks
        are in (each rank asked has answered)."""
        while not self.cancels.empty():
            reason, force = self.cancels.get_nowait()
            self._apply(self.machine.cancel(reason, _now(), force))
        since = self.capture
        if since and all(n > since[r] for r, n in stacks.offsets(self.ctx.paths, since).items()):
            self._apply(self.machine.stacks_in(_now()))
        else:
            self._apply(self.machine.tick(_now()))

    # -- the run's thread -----------------------------------------------------------------------

    def _main(self) -> None:
        try:
            self._run()
        except _Stopped:
            pass  # the machine stopped the run: its reason is the run's end
        except PlacementError as exc:
            self._run_failed(str(exc))
        except Exception as exc:  # a fault of ours or of the cluster ends this call, clearly
            self._run_failed(f"the Ray backend failed: {type(exc).__name__}: {exc}")
        finally:
            self._end()

    def _end(self) -> None:
        keep = self._keepable()
        if not keep:
            self.actors.kill_all()
        self._take_events()
        if keep:
            keep = self.actors.keep()
        if not keep:
            self.actors.kill_all()
            self.actors.remove()
        self._close_logs()
        self._finish()

    def _run(self) -> None:
        import ray

        self.actors.job = ray.get_runtime_context().get_job_id()
        if not self.actors.take_warm(ray):
            self.actors.start_fresh(ray)
        if self.stopping:
            return
        self._open_logs()
        self.machine.may_start()  # the specs go with each rank's call, below
        payload = ray.put(self.payload)
        pending = {}
        place = results.place_for(self.ctx.paths)
        for r in self.ranks:
            spec = rank_spec(self.spec, self.ranks, r, self.cpus, self.adopt, place)
            ref = r.actor.run.remote(payload, spec)
            pending[ref] = r
            doctor.start_dump_file(self.ctx.paths, r.rank, str(r.place.get("main_thread", "")))
            pid = r.place["pid"]
            self._apply(self.machine.rank_started(r.rank, pid, _now(), r.label))
        self._watch(ray, pending)
        if not self.stopping:
            self._fetch_results(ray)

    def _keepable(self) -> bool:
        return (
            self.spec.config.standby
            and not self.stopping
            and not self.machine.outcome.failures
            and not self.value_errors
            and all(self.machine.state(r.rank) is RankState.DONE for r in self.ranks)
            and self.actors.reservation is not None
            and self.actors.sink is not None
        )

    def _open_logs(self) -> None:
        paths = self.ctx.paths
        paths.logs.mkdir(mode=0o700, exist_ok=True)
        for r in self.ranks:
            r.log = open(paths.log(r.rank), "ab", buffering=0)  # noqa: SIM115

    def _watch(self, ray: Any, pending: dict[Any, RayRank]) -> None:
        while pending and not self.stopping:
            ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=_SLICE_S)
            self._take_events()
            for ref in ready:
                self._rank_ended(ray, pending.pop(ref), ref)
            if pending and not self.stopping:
                self._poll()

    def _command(self, ranks: list[int], command: str) -> None:
        if self.actors.sink is not None and ranks:
            self.actors.sink.command.remote(ranks, command)

    def _rank_ended(self, ray: Any, r: RayRank, ref: Any) -> None:
        try:
            outcome = ray.get(ref, timeout=CALL_S)
        except ray.exceptions.RayActorError as exc:
            self._lost(ray, r, exc)
            return
        self._take_events()  # the rank's last output before its end
        if outcome[0] == "ok":
            r.result = outcome[1][0]
            self._apply(self.machine.rank_done(r.rank, outcome[2], None, _now()))
            return
        record, summary = outcome[1], outcome[2]
        dump_to_file(record, self.ctx.paths.error(r.rank))
        self._apply(self.machine.rank_done(r.rank, summary, record.failure, _now()))

    def _lost(self, ray: Any, r: RayRank, exc: BaseException) -> None:
        """The rank's actor died under it: its node died, or its process was killed."""
        node = r.place.get("node_id") or (
            self.actors.reservation.node_of_rank[r.rank] if self.actors.reservation else ""
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
        failure = RankFailure.lost(r.rank, time.time(), what)
        self._apply(self.machine.rank_lost(r.rank, what, failure, _now()))

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
                self.values.append(results.load(ray, r.result, CALL_S))
            except Exception as exc:  # e.g. the result's class cannot be imported here
                self.values.append(None)
                self.value_errors[r.rank] = exc

    # -- stopping -------------------------------------------------------------------------------

    def _stop_reason(self) -> str | None:
        """Before the ranks run (reserving, starting) and while their results come: the
        reason the machine stopped the run (a cancel, graceful or not, or the timeout)."""
        self._poll()
        stop = self.machine.outcome.stop
        return None if stop is None else stop[1]

    def _terminate(self, action: Terminate) -> None:
        """``ray.kill`` runs nothing in the actor: a tracked call's ranks still running first
        send the points they hold (``runtime.on_stopped``), for ``FLUSH_S`` at most."""
        ranks = {r for r in action.ranks if self.machine.state(r) is RankState.RUNNING}
        if ranks and self.actors.sink is not None and settings.MLFLOW_RUN_ID.name in self.spec.env:
            self._command(sorted(ranks), FLUSH)
            deadline = time.monotonic() + FLUSH_S
            while not ranks <= self._flushed and time.monotonic() < deadline:
                self._take_events()
                if not ranks <= self._flushed:
                    time.sleep(_FLUSH_POLL_S)
        self.actors.kill_all()

    def _run_failed(self, message: str) -> None:
        """The run itself failed (its placement, our code or the cluster), unless it was
        stopped already: then that stop is its end."""
        self._apply(self.machine.run_failed(message, _now()))

    def _close_logs(self) -> None:
        with self._deliver_lock:  # a session's link may still bring a last line
            for r in self.ranks:
                if r.log is not None:
                    r.log.close()
                    r.log = None

    def _take_events(self) -> None:
        import ray

        if self.actors.sink is None:
            return
        try:
            events = ray.get(self.actors.sink.take.remote(), timeout=CALL_S)
        except Exception:  # the sink is gone (the caller's node is going away): nothing to show
            return
        self.deliver(events)

    def deliver(self, events: list[Any]) -> None:
        """The ranks' events, from the sink or a session's link: logs, stacks, the handle."""
        with self._deliver_lock:
            for event in events:
                if event.run_id != self.ctx.run_id:
                    continue  # a thread the last call of the set left behind
                if isinstance(event, RankMessage) and event.kind == STACKS:
                    doctor.append(self.ctx.paths, event.rank, str(event.data))
                    continue
                if isinstance(event, RankMessage) and event.kind == FLUSH:
                    self._flushed.add(event.rank)
                    continue
                if isinstance(event, OutputLines):
                    self._log(event)
                self.push(event)

    def _log(self, event: OutputLines) -> None:
        log = self.ranks[event.rank].log
        if log is not None:
            data = "".join(p for p in event.lines if p.endswith(("\n", "\r")))
            log.write(data.encode("utf-8", "backslashreplace"))

    def _finish(self) -> None:
        """The run is over: ranks still running are stopped (those with an actor say so)."""
        started = [r.rank for r in self.ranks if r.actor is not None]
        self._apply(self.machine.end(_now(), started))


def _now() -> Instant:
    return Instant(time.monotonic(), time.time())


def _node_alive(ray: Any, node_id: str) -> bool:
    return any(n["NodeID"] == node_id and n.get("Alive") for n in ray.nodes())
