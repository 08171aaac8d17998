"""The run hook: every run started from IPython gets a widget or a text renderer.

In a kernel the run is drawn as a widget. A kernel cannot tell whether its client renders
widgets (the widget manager's handshake happens when the client connects, usually before this
extension is loaded, and ends with the comm closed), so the widget carries a text/plain form
with the header, each rank's last lines and the summary: what nbclient, nbconvert and static
viewers show. Terminal IPython gets the text renderer; ``SERVERLESS_GPU_DISPLAY`` = ``text`` /
``widget`` overrides the choice.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from pathlib import Path
from typing import Any, Protocol

from serverless_gpu.caller.hooks import RunContext
from serverless_gpu.common import settings
from serverless_gpu.wire.events import Event, RunStatus

from .text_renderer import TextRenderer

RENDER_HOOK_ORDER = 5
"""Before tracking (order 10), whose MLflow run takes seconds to create: the widget shows the
run as starting at once. Links added later are drawn as they come (``ctx.links`` is shared)."""
HOOKS_DONE_ORDER = 1000
"""After every other hook: the run waits for the launcher next."""
_KEEP_RECENT = 16
KERNEL_SHUTDOWN = "the kernel shut down"
"""Why the runs still going when the kernel exits end: their records say this, not the
launcher's own reason for the runs it stops."""


class Renderer(Protocol):
    def __call__(self, event: Event) -> None: ...

    def show_results(self, descriptions: list[str]) -> None:
        """Add each rank's result type and shape to the summary."""

    def abandon(self, message: str) -> None:
        """The call failed before its run started: end the display with ``message``."""


_recent: OrderedDict[str, tuple[Path, Renderer, int]] = OrderedDict()
"""Recent runs: run id -> (run directory, renderer, the execution count of their cell)."""
_last_run: list[RunContext] = []
"""The latest run started here (``%distributed_stacks`` asks it for its stacks)."""


def render_run(ctx: RunContext) -> Renderer | None:
    """Run hook: show this run in the notebook (or terminal) it was started from."""
    from IPython import get_ipython

    if "session" in ctx.metadata:
        return None  # a session's output goes to each cell that waits on it, as text

    shell = get_ipython()
    if shell is None:
        return None  # a plain script: the core's console printer is the right display
    renderer: Renderer = TextRenderer(ctx)
    if widgets_wanted(shell):
        try:
            from .widget import WidgetRenderer

            trial = "trial" in ctx.metadata  # fn.map / a sweep: one table for the cell's runs
            renderer = WidgetRenderer(ctx, shell, show=not trial)
            if trial:
                _table_for(shell).add(ctx, renderer)
            else:
                _unwaited.append(ctx)
        except Exception as exc:  # a display problem must not stop the run: show it as text
            print(f"serverless_gpu: no run widget ({type(exc).__name__}: {exc})")
    ctx.display_claimed = True
    _last_run[:] = [ctx]
    _forget_ended()
    _running[ctx.run_id] = ctx
    _recent[ctx.run_id] = (ctx.run_dir, renderer, _cell_count(shell))
    while len(_recent) > _KEEP_RECENT:
        _recent.popitem(last=False)
    return renderer


_tables: dict[int, Any] = {}
"""The run table of each recent cell that started trials, by execution count."""
_running: dict[str, RunContext] = {}
"""Every run drawn here, until it ends (cancelled with :data:`KERNEL_SHUTDOWN` at exit)."""
_unwaited: list[RunContext] = []
"""Runs drawn since the last cell ended: the ones still going then are followed."""


def _table_for(shell: Any) -> Any:
    from .run_table import RunTable

    cell = _cell_count(shell)
    table = _tables.get(cell)
    if table is None:
        table = _tables[cell] = RunTable()
        while len(_tables) > _KEEP_RECENT:
            _tables.pop(next(iter(_tables)))
    table.follow()
    return table


def shut_down_tables() -> None:
    """The kernel is going away: every table still drawn leaves its record, all of them within
    one bounded wait for their runs to report their end."""
    from .run_table import SHUTDOWN_WAIT_S

    deadline = time.monotonic() + SHUTDOWN_WAIT_S
    for table in list(_tables.values()):
        table.shut_down(max(0.0, deadline - time.monotonic()))


def _forget_ended() -> None:
    for run_id, ctx in list(_running.items()):
        handle = ctx.handle
        if handle is not None and handle.finished is not None:
            del _running[run_id]


def cancel_running() -> None:
    """The kernel is going away: the runs drawn here that have not ended are stopped, saying
    so (force: nothing waits for them)."""
    for ctx in list(_running.values()):
        handle = ctx.handle
        if handle is None or handle.finished is None:
            ctx.cancel(KERNEL_SHUTDOWN, force=True)
    _running.clear()


def follow_unfinished(*_: Any) -> None:
    """``post_run_cell``: a run the cell started and did not wait for (``fn.start()``) keeps its
    widget updating from a background poll."""
    from .run_table import follow_handle

    while _unwaited:
        handle = _unwaited.pop().handle
        if handle is not None and not handle.done():
            follow_handle(handle)


def settle_records(*_: Any) -> None:
    """``post_run_cell``: a table whose runs have all ended leaves its record now, while the
    cell that waited on them is still the kernel's parent: a headless executor (nbclient,
    papermill) saves what it receives before the cell's end and nothing after."""
    for table in list(_tables.values()):
        if not table.record and table.pump():
            table.finish()


def hooks_done(ctx: RunContext) -> None:
    """Run hook, last: tell the run's renderer that the launcher is what the run waits for."""
    entry = _recent.get(ctx.run_id)
    set_phase = getattr(entry[1], "set_phase", None) if entry is not None else None
    if set_phase is not None:
        set_phase("launcher")


def abandon_unstarted(shell: Any, error: BaseException) -> None:
    """The running cell's call raised before its run sent a single event (a hook or the
    launcher failed): its renderer would read "starting" for good, so it ends with the error."""
    lines = str(error).strip().splitlines()
    message = f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
    cell = _cell_count(shell)
    for _directory, renderer, count in list(_recent.values()):
        view = getattr(renderer, "view", None)
        if count == cell and view is not None and view.version == 0 and not view.done:
            renderer.abandon(message)


def interrupted_run(shell: Any) -> str | None:
    """The name of the running cell's run that a KeyboardInterrupt cancelled, if any."""
    cell = _cell_count(shell)
    for _directory, renderer, count in reversed(list(_recent.values())):
        view = getattr(renderer, "view", None)
        if count == cell and view is not None and view.status is RunStatus.CANCELLED:
            return str(view.name)
    return None


def _cell_count(shell: Any) -> int:
    return int(getattr(shell, "execution_count", 0) or 0)


def last_run() -> RunContext | None:
    return _last_run[0] if _last_run else None


def renderer_for(run_id: str | None = None, run_dir: Path | None = None) -> Renderer | None:
    """The renderer of a recent run, by id or directory (the magic completes its summary)."""
    for key, (directory, renderer, _cell) in reversed(_recent.items()):
        if key == run_id or (run_dir is not None and directory == run_dir):
            return renderer
    return None


def widgets_wanted(shell: Any) -> bool:
    mode = settings.DISPLAY.read()
    if mode == "text" or getattr(shell, "kernel", None) is None:
        return False
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return False
    return True
