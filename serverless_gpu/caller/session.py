"""The caller's side of a persistent session: one long run whose ranks serve cells.

The run is an ordinary call (its events, tracking, devices and lifetime are a call's) whose
function is ``rank/session_loop.serve``. Each cell is a :class:`CellRequest` sent to every rank
through the session's link (``session_links.py``: FIFOs, or TCP to ranks on other machines);
each rank answers with a ``CellDone`` message in the run's event stream, and
:class:`CellHandle` waits for them by dispatching the run's events (so the console, the widget
and MLflow see a cell's output and metrics as they see a call's).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from serverless_gpu.caller.handle import RunHandle
from serverless_gpu.caller.results import RunResult, exception_from_record
from serverless_gpu.caller.session_links import FifoLink, TcpLink
from serverless_gpu.common.errors import (
    CancelledError,
    DistributedError,
    WaitTimeoutError,
    root_cause,
    with_failures,
)
from serverless_gpu.doctor import stack_text
from serverless_gpu.runfiles.serialization import load_result
from serverless_gpu.wire.events import Event, RankMessage, RankStarted
from serverless_gpu.wire.session import (
    CELL_DONE,
    GROUP_NOTE,
    CellDone,
    CellRequest,
    CloseSession,
    Interrupt,
)

_CLOSE_WAIT_S = 10.0
_STACKS_S = 3.0
"""How long a session stopped for a late rank waits for its stacks (a rank answers in ms)."""
_CLOSE_MARGIN_S = 1.0
"""``close()`` waits the session's grace and this for the ranks to end before it stops them."""
_KEPT_CELLS = 100


class SessionEndedError(DistributedError):
    """The session's ranks are gone: start a new session (its state is lost)."""


@dataclass
class CellState:
    number: int
    started: float
    answers: dict[int, CellDone]
    interrupted_at: float | None = None
    outcome: tuple[RunResult[Any] | None, BaseException | None] | None = None
    """Built once (a value file is read once); every ``result()`` gets it."""


class SessionRun:
    """The ranks of one session, as the caller drives them."""

    def __init__(
        self, handle: RunHandle[Any], link: FifoLink | TcpLink, grace: float, name: str
    ) -> None:
        self.handle = handle
        self.name = name
        self.link = link
        self.world = handle.context.placement.world_size
        self.grace = grace
        self._store: Any = None
        """The store of the re-formed group's generation, where the caller keeps it (TCP)."""
        self._cells: dict[int, CellState] = {}
        self._next = 1
        self._reform = 0
        self.ended: str | None = None
        """Why the session ended (None while it lives)."""
        self.last_used = time.time()
        self.memory: dict[int, int] = {}
        self.pids: dict[int, int] = {}
        self.nodes: dict[int, str] = {}
        """Where each rank runs, for ranks on other machines (``node 1 (10.0.0.7)``)."""
        self.names: frozenset[str] = frozenset()
        """The names rank 0's namespace held after the last cell."""
        self.notes: list[Callable[[str], None]] = []
        handle.subscribe(self._on_event)

    # -- events ------------------------------------------------------------------------------

    def _on_event(self, event: Event) -> None:
        if isinstance(event, RankStarted):
            self.pids[event.rank] = event.pid
            if event.node:
                self.nodes[event.rank] = event.node
        if isinstance(event, RankMessage) and event.kind == CELL_DONE:
            done: CellDone = event.data
            cell = self._cells.get(done.number)
            if cell is not None:
                cell.answers[event.rank] = done
            self.memory[event.rank] = done.peak_memory
            if event.rank == 0 and done.error is None:
                self.names = frozenset(done.names)
        if isinstance(event, RankMessage) and event.kind == GROUP_NOTE and event.rank == 0:
            held = event.data[1] if isinstance(event.data, tuple) else ()
            if held:
                self._say(
                    f"session {self.name!r}: {', '.join(held)} still hold the process group "
                    "before the re-form; they are kept as they are: build them again to use "
                    "the new group"
                )

    # -- cells -------------------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        if self.ended is None and self.handle.done():
            self.ended = self._end_reason()
        return self.ended is None

    def check_alive(self) -> None:
        if not self.alive:
            raise SessionEndedError(
                f"session {self.name!r} has ended ({self.ended}); its state is gone. Start a "
                f"new one: Session(...) again, or %distributed_session restart {self.name}"
            )

    def submit(self, kind: str, data: Any, **fields: Any) -> CellHandle:
        self.check_alive()
        number = self._next
        self._next += 1
        request = CellRequest(
            number,
            kind,
            data,
            reform_group=self._reform,
            reform_store=self._group_store() if self._reform else "",
            results_dir="" if self.link.remote else str(self.results_dir),
            **fields,
        )
        self._reform = 0
        self._cells[number] = CellState(number, time.time(), {})
        self._cells.pop(number - _KEPT_CELLS, None)  # a long session keeps no old answers
        self._broadcast(request)
        self.last_used = time.time()
        return CellHandle(self, number)

    @property
    def results_dir(self) -> Path:
        paths = self.handle.context.paths
        return paths.results_dir or paths.run_dir

    def _broadcast(self, message: object) -> None:
        self.link.send(message)

    def _group_store(self) -> str:
        """Where the next generation meets (the link says); a store this process keeps is
        held until the next re-form (the generation's group needs it only while it forms)."""
        self._store, address = self.link.group_store(self.world)
        return address

    def interrupt(self, number: int) -> None:
        cell = self._cells.get(number)
        if cell is None or len(cell.answers) == self.world or not self.alive:
            return
        if cell.interrupted_at is None:
            cell.interrupted_at = time.monotonic()
        self._broadcast(Interrupt(number))

    def cell(self, number: int) -> CellState | None:
        return self._cells.get(number)

    def is_done(self, number: int) -> bool:
        return len(self._cells[number].answers) == self.world

    def wait(self, number: int, timeout: float | None) -> None:
        """Until every rank answered cell ``number`` (or the session ended); a rank that does
        not come back within ``grace`` of an interrupt stops the session."""
        cell = self._cells[number]
        ended = self.handle.wait_for(lambda: self.is_done(number) or self._overdue(cell), timeout)
        self.last_used = time.time()
        if self.is_done(number) or (ended and not self._overdue(cell)):
            return
        if self._overdue(cell):
            self._stop_for(cell)
            return
        raise WaitTimeoutError(
            f"cell {number} of session {self.name!r} still running after {timeout:g} s; "
            "it goes on (result() again to keep waiting, cancel() to interrupt it)",
            run_dir=self.handle.run_dir,
        )

    def _overdue(self, cell: CellState) -> bool:
        since = cell.interrupted_at
        return since is not None and time.monotonic() >= since + self.grace

    def _stop_for(self, cell: CellState) -> None:
        late = sorted(set(range(self.world)) - set(cell.answers))
        ranks = ", ".join(str(r) for r in late)
        self.ended = (
            f"rank {ranks} did not come back within {self.grace:g} s of the interrupt of cell "
            f"{cell.number}{self._where(late)}; the session was stopped"
        )
        self.handle.cancel(self.ended, force=True)
        self.handle.wait(_CLOSE_WAIT_S)

    def _where(self, ranks: list[int]) -> str:
        """Where ``ranks`` are stuck, from their stacks (saved in the run folder too), taken
        before the session is stopped: the one clue to what ignored the interrupt."""
        try:
            found = self.handle.stacks(_STACKS_S)
        except Exception:  # the session is stopped all the same
            return ""
        said = [f"rank {r} was in {stack_text.where(found[r])}" for r in ranks if r in found]
        return f" ({'; '.join(said)})" if said else ""

    def outcome(self, number: int) -> RunResult[Any]:
        cell = self._cells[number]
        if not self.is_done(number):
            self._raise_ended(number)
        if cell.outcome is None:
            try:
                cell.outcome = (self._build_outcome(cell), None)
            except Exception as exc:
                cell.outcome = (None, exc)
        result, error = cell.outcome
        if error is not None:
            raise error.with_traceback(None)
        assert result is not None
        return result

    def _build_outcome(self, cell: CellState) -> RunResult[Any]:
        number = cell.number
        answers = [cell.answers[r] for r in range(self.world)]
        errors = [a.error for a in answers if a.error is not None]
        if errors and any(a.group for a in answers):
            self._reform = number  # generation: unique, and the failed cell's number
            # interrupted_at is set only by cancel() (a Cancel click, Ctrl-C): the user's own
            # stop, which must not read as a failure of their code
            ended = "was cancelled" if cell.interrupted_at is not None else "ended with an error"
            self._say(
                f"session {self.name!r}: cell {number} {ended} while a process group was up; "
                "the group is re-formed before the next cell (the namespace is kept)"
            )
        if errors:
            raise self._cell_error(number, errors)
        values = [self._value(a) for a in answers]
        ctx = self.handle.context
        return RunResult(
            values,
            run_id=ctx.run_id,
            run_dir=ctx.run_dir,
            links=ctx.links,
            metadata={**ctx.metadata, "cell": number},
        )

    def _cell_error(self, number: int, errors: list[Any]) -> BaseException:
        failures = [e.failure for e in errors]
        first = root_cause(failures)
        assert first is not None
        record = next(e for e in errors if e.rank == first.rank)
        run_dir = self.handle.run_dir
        if record.type_name == "builtins.KeyboardInterrupt":
            exc: BaseException = CancelledError(
                f"cell {number} of session {self.name!r} was interrupted (the session goes on)",
                run_dir=run_dir,
            )
        else:
            exc = exception_from_record(record, first, run_dir)
        if isinstance(exc, CancelledError):
            return exc
        others = tuple(f for f in sorted(failures, key=lambda f: f.time) if f is not first)
        return with_failures(exc, (first, *others))

    def _value(self, answer: CellDone) -> Any:
        import pickle

        if answer.streamed is not None:
            return answer.streamed.value
        if answer.value is not None:
            return pickle.loads(answer.value)
        if answer.value_file:
            path = Path(answer.value_file)
            try:
                return load_result(path)
            finally:
                path.unlink(missing_ok=True)
        return None

    def _raise_ended(self, number: int) -> None:
        if self.ended is None:
            self.ended = self._end_reason()
        try:
            self.handle.result()
        except BaseException as exc:
            raise exc.with_traceback(None)  # noqa: B904 - its own cause is the rank's traceback
        raise SessionEndedError(
            f"session {self.name!r} ended during cell {number} ({self.ended})",
            run_dir=self.handle.run_dir,
        )

    def _end_reason(self) -> str:
        finished = self.handle.finished
        if finished is None:
            return "its ranks are gone"
        if finished.status.value == "succeeded":
            return "it was closed"
        if finished.status.value == "timed_out":
            return self._timeout_reason()
        return finished.message or finished.status.value

    def _timeout_reason(self) -> str:
        """A session's ``timeout`` bounds its whole life: say whether a cell or idling used it."""
        timeout = self.handle.context.spec.timeout or 0.0
        running = [n for n, c in self._cells.items() if len(c.answers) < self.world]
        when = (
            f"during cell {running[0]}"
            if running
            else f"while it was idle (after cell {self._next - 1})"
        )
        return f"its timeout of {timeout:g} s passed {when}; a session's timeout bounds its life"

    def _say(self, text: str) -> None:
        print(f"serverless_gpu: {text}", flush=True)
        for note in self.notes:
            note(text)

    # -- the end ----------------------------------------------------------------------------

    def close(self) -> None:
        if self.alive:
            for number, cell in list(self._cells.items()):  # a running cell is interrupted,
                if len(cell.answers) < self.world:  # so the ranks read the close at once
                    self._broadcast(Interrupt(number))
            self._broadcast(CloseSession())
            if not self.handle.wait(self.grace + _CLOSE_MARGIN_S):
                self.handle.cancel("the session was closed", force=True)
                self.handle.wait(_CLOSE_WAIT_S)
            self.ended = "it was closed"
        self.link.close()
        self._store = None


class CellHandle:
    """One cell, started: ``result(timeout=None)``, ``cancel()``, ``status``, ``done()``."""

    def __init__(self, run: SessionRun, number: int) -> None:
        self.session = run
        self.number = number

    def done(self) -> bool:
        self.session.handle.poll(blocking=False)
        return self.session.is_done(self.number) or not self.session.alive

    @property
    def status(self) -> str:
        """``running``, ``succeeded``, ``failed``, ``cancelled`` or ``ended`` (the session
        ended before the cell did)."""
        if not self.done():
            return "running"
        cell = self.session.cell(self.number)
        if cell is None:
            return "forgotten"  # one of the oldest cells of a long session
        if len(cell.answers) < self.session.world:
            return "ended"
        errors = [a.error for a in cell.answers.values() if a.error is not None]
        if not errors:
            return "succeeded"
        if any(e.type_name == "builtins.KeyboardInterrupt" for e in errors):
            return "cancelled"
        return "failed"

    def cancel(self) -> None:
        """Interrupt the cell in every rank (``KeyboardInterrupt``); returns at once. A rank
        not back within the session's ``grace`` stops the session (seen by ``result``)."""
        self.session.interrupt(self.number)

    def result(self, timeout: float | None = None) -> RunResult[Any]:
        """Every rank's value (the last expression's, or the function's), or the cell's
        root-cause exception; Ctrl-C while waiting interrupts the cell."""
        __tracebackhide__ = True
        try:
            self.session.wait(self.number, timeout)
        except KeyboardInterrupt:
            self.cancel()
            self.session.wait(self.number, None)
        return self.session.outcome(self.number)
