"""Run hooks: how tracking and renderers attach to every run without the core knowing them.

A hook is called once per run, in the caller, before the ranks start. It may add environment
variables for the ranks and links (e.g. the MLflow run page) to the run's context, and may return
a subscriber that receives the run's events.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .events import Subscriber
from .gpus import Placement


@dataclass
class RunContext:
    """What a hook knows about a run before it starts, and what it may add to it."""

    run_id: str
    name: str
    """Qualified name of the user's function."""
    placement: Placement
    timeout: float | None
    run_dir: Path
    options: dict[str, Any]
    """Decorator options hooks care about (``tracking``, ``run_name``, ``output`` ...)."""
    results_dir: Path | None = None
    """A tmpfs folder the ranks write their results to (deleted once they are loaded); None:
    the run directory."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment variables for every rank; hooks add to it."""
    links: dict[str, str] = field(default_factory=dict)
    """Named URLs about the run (``"mlflow"``); shown by renderers and kept on the result."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """Anything else hooks want on the result (e.g. ``"mlflow_run_id"``)."""
    display_claimed: bool = False
    """Set by a renderer hook that shows the run itself; the console printer then stays quiet."""
    rank_initializers: list[str] = field(default_factory=list)
    """``"module:function"`` names each rank imports and calls before user code (e.g. to install
    a metrics buffer); the function takes no arguments."""
    idle_callbacks: list[Callable[[], None]] = field(default_factory=list)
    """Called repeatedly while the caller blocks waiting for the run (every ~50 ms); the Jupyter
    extension processes widget clicks here so that Cancel works during a blocking call."""
    _cancel: Callable[[str], None] | None = field(default=None, repr=False)

    def cancel(self, reason: str = "cancelled by the user") -> None:
        """Stop every rank of the run (TERM, grace, KILL); returns at once."""
        if self._cancel is not None:
            self._cancel(reason)


RunHook = Callable[[RunContext], "Subscriber | None"]

_hooks: list[tuple[int, RunHook]] = []


def register_hook(hook: RunHook, *, order: int = 100) -> None:
    """Call ``hook`` for every future run (lower ``order`` first). Registering twice is a no-op."""
    if all(h is not hook for _, h in _hooks):
        _hooks.append((order, hook))
        _hooks.sort(key=lambda item: item[0])


def unregister_hook(hook: RunHook) -> None:
    _hooks[:] = [(o, h) for o, h in _hooks if h is not hook]


def run_hooks(ctx: RunContext) -> list[Subscriber]:
    subscribers = []
    for _, hook in list(_hooks):
        sub = hook(ctx)
        if sub is not None:
            subscribers.append(sub)
    return subscribers
