"""What the run machine asks its backend to do: plain records, carried out in order.

A backend carries out every action its transport has (the launcher all of them; Ray kills
at ``Terminate`` and has no ``Release``); an action it has no way to take it skips.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple


class Instant(NamedTuple):
    """A moment, as the backend read its clocks: ``mono`` for the run's timers
    (``time.monotonic``), ``wall`` for the events' times (``time.time``)."""

    mono: float
    wall: float


@dataclass(frozen=True)
class SendSpecs:
    """Start the call in every rank; ``warm``: every rank holds its process group, the call
    takes it."""

    warm: bool = False


@dataclass(frozen=True)
class Emit:
    """Send ``event`` (``wire/events.py``) to the caller."""

    event: Any


@dataclass(frozen=True)
class DrainOutput:
    """Read everything ``rank`` wrote so far, partial lines too: its end is reported next."""

    rank: int


@dataclass(frozen=True)
class CaptureStacks:
    """The timeout's first step: ask ``ranks`` for their stacks (nothing to ask if empty)."""

    ranks: tuple[int, ...]


@dataclass(frozen=True)
class SaveStacks:
    """The timeout's stacks are in, or their wait is over: save what came."""


@dataclass(frozen=True)
class RequestStacks:
    """Someone wants the stacks of ``ranks`` now (``handle.stacks()``, the widget)."""

    ranks: tuple[int, ...]


@dataclass(frozen=True)
class AskStop:
    """Ask ``ranks`` to return (``runtime.should_stop()``). A backend that could ask none of
    them says so with ``RunMachine.ask_refused``: they are stopped at once."""

    ranks: tuple[int, ...]


@dataclass(frozen=True)
class Terminate:
    """Stop ``ranks`` (SIGTERM to their process groups; ``Kill`` follows after the grace)."""

    ranks: tuple[int, ...]


@dataclass(frozen=True)
class Kill:
    """Kill ``ranks`` now: their grace is over."""

    ranks: tuple[int, ...]


@dataclass(frozen=True)
class Release:
    """Every rank returned: let them exit (``Kill`` follows for those still there later)."""


Action = (
    SendSpecs
    | Emit
    | DrainOutput
    | CaptureStacks
    | SaveStacks
    | RequestStacks
    | AskStop
    | Terminate
    | Kill
    | Release
)
