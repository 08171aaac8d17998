"""Loading, unloading, and tying the library's processes to the kernel's life.

A kernel asked to shut down or restart sets ``shell.exit_now`` (ipykernel's ``do_shutdown``,
on its control thread, while a cell may still be blocked in a run). Stopping the launcher right
then ends the ranks, lets the blocked cell return, and the kernel exits promptly. A kernel that
is killed outright is covered by the core: the launcher sees EOF on its socket and stops its
ranks, and the ranks die with the launcher.
"""

from __future__ import annotations

import contextlib
from typing import Any

from serverless_gpu.caller.hooks import register_hook, unregister_hook

from .hook import (
    HOOKS_DONE_ORDER,
    RENDER_HOOK_ORDER,
    cancel_running,
    follow_unfinished,
    hooks_done,
    render_run,
    settle_records,
    shut_down_tables,
    widgets_wanted,
)
from .magics import DistributedMagics
from .tracebacks import ExceptionDisplay

_MAGIC_NAMES = ("distributed",)


class _Loaded:
    """What one ``load`` registered, so ``unload`` can take back exactly that."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self.exceptions = ExceptionDisplay(shell)

    def install(self) -> None:
        self.shell.register_magics(DistributedMagics)
        register_hook(render_run, order=RENDER_HOOK_ORDER)
        register_hook(hooks_done, order=HOOKS_DONE_ORDER)
        self.shell.observe(_stop_on_exit, names="exit_now")
        self.shell.events.register("post_run_cell", follow_unfinished)
        self.shell.events.register("post_run_cell", settle_records)
        self.exceptions.install()

    def uninstall(self) -> None:
        self.exceptions.uninstall()
        unregister_hook(render_run)
        unregister_hook(hooks_done)
        self.shell.unobserve(_stop_on_exit, names="exit_now")
        with contextlib.suppress(ValueError):
            self.shell.events.unregister("post_run_cell", follow_unfinished)
        with contextlib.suppress(ValueError):
            self.shell.events.unregister("post_run_cell", settle_records)
        cell_magics = self.shell.magics_manager.magics.get("cell", {})
        for name in _MAGIC_NAMES:
            cell_magics.pop(name, None)
        for line_magic in ("distributed_stacks", "distributed_session"):
            self.shell.magics_manager.magics.get("line", {}).pop(line_magic, None)


_loaded: _Loaded | None = None


def load(shell: Any) -> None:
    """Idempotent: ``%load_ext jupyter_ext`` and ``%load_ext serverless_gpu`` may both run."""
    global _loaded
    if _loaded is not None and _loaded.shell is shell:
        return
    if _loaded is not None:
        _loaded.uninstall()
    _loaded = _Loaded(shell)
    _loaded.install()
    _import_widgets(shell)
    from serverless_gpu.api.decorator import warm_up

    warm_up()  # the first call of the session then finds the launcher ready


def _import_widgets(shell: Any) -> None:
    """Import the widget now, so that the first run's widget shows without that delay."""
    if widgets_wanted(shell):
        try:
            from . import widget  # noqa: F401
        except Exception:  # the run hook reports a widget that cannot be made, at the run
            pass


def unload(shell: Any) -> None:
    global _loaded
    if _loaded is not None:
        _loaded.uninstall()
        _loaded = None


def is_loaded() -> bool:
    return _loaded is not None


def _stop_on_exit(change: dict[str, Any]) -> None:
    if change["new"]:
        from serverless_gpu.api.shutdown import shutdown

        cancel_running()  # before the launcher stops them for its own reason
        shutdown()
        # The runs have ended (or will within seconds): each runs table leaves its record
        # before the kernel exits, as a single run's widget does when its run ends.
        shut_down_tables()
