"""Run hooks: how tracking and renderers attach to every run without the core knowing them.

A hook is called once per run, in the caller, before the ranks start. It may add environment
variables for the ranks and links (e.g. the MLflow run page) to the run's context, and may return
a subscriber that receives the run's events.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from serverless_gpu.common import settings
from serverless_gpu.common.gpus import Placement
from serverless_gpu.wire.config import DistributedConfig
from serverless_gpu.wire.events import Subscriber
from serverless_gpu.wire.runpaths import RunPaths
from serverless_gpu.wire.runspec import RunSpec

if TYPE_CHECKING:
    from serverless_gpu.caller.retries import Call


@dataclass
class RunContext:
    """What a hook knows about a run before it starts, and what it may add to it. It stays in
    the caller; what crosses to the ranks is :attr:`spec`, sealed once every hook has run."""

    spec: RunSpec
    """The call; its ``env`` is filled in by :meth:`seal`."""
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
    call: Call | None = None
    """The ``.distributed()`` call this run is an attempt of (``call.attempt``); hooks keep
    per-call state there (``call.state``, ``call.on_end``)."""
    subscribers: list[Any] = field(default_factory=list, repr=False)
    """What sees every event of the run (the console, the hooks' subscribers): the handle takes
    them when it is made, before the run can start, so that a run ending at once (a fast
    attempt on a loaded machine, handled by the finisher thread) is not dispatched to nobody."""
    handle: Any = field(default=None, repr=False)
    """The run's ``RunHandle`` once it is submitted (a notebook table follows it from there)."""
    session_link: Any = field(default=None, repr=False)
    """A session's link to its ranks (``caller/session_links.py``); a backend whose ranks send
    their events through it (``TcpLink.attach``) hands them to the run."""
    _canceller: Callable[..., None] | None = field(default=None, repr=False)
    _stacks_taker: Callable[[], dict[int, str]] | None = field(default=None, repr=False)

    @property
    def run_id(self) -> str:
        return self.spec.run_id

    @property
    def name(self) -> str:
        """Qualified name of the user's function."""
        return self.spec.name

    @property
    def placement(self) -> Placement:
        return self.spec.placement

    @property
    def config(self) -> DistributedConfig:
        return self.spec.config

    @property
    def paths(self) -> RunPaths:
        return self.spec.paths

    @property
    def run_dir(self) -> Path:
        return self.spec.paths.run_dir

    @property
    def timeout(self) -> float | None:
        return self.spec.timeout

    def seal(self, cwd: str, sys_path: tuple[str, ...]) -> RunSpec:
        """The run's final spec, once every hook has run: the caller's environment now with
        the hooks' additions, where the ranks start and their ``sys.path``."""
        env = {**os.environ, **self.env}
        if self.rank_initializers:
            env[settings.RANK_INIT.name] = ",".join(self.rank_initializers)
        self.spec = replace(self.spec, env=env, cwd=cwd, sys_path=sys_path)
        return self.spec

    def set_canceller(self, cancel: Callable[..., None]) -> None:
        """What :meth:`cancel` calls (``reason, force=``): the started run's handle sets it."""
        self._canceller = cancel

    def set_stacks_taker(self, take: Callable[[], dict[int, str]]) -> None:
        """What :meth:`stacks` calls: the started run's handle sets it."""
        self._stacks_taker = take

    def cancel(self, reason: str = "cancelled by the user", *, force: bool = False) -> None:
        """Stop the run (see ``RunHandle.cancel``: with ``stop_grace`` the first cancel asks
        the ranks to stop, a second one stops them at once); returns at once."""
        if self._canceller is not None:
            self._canceller(reason, force=force)

    def stacks(self) -> dict[int, str]:
        """Every running rank's stacks (``RunHandle.stacks``); empty before the run starts."""
        return self._stacks_taker() if self._stacks_taker is not None else {}


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
