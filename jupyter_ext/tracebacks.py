"""How a failed run reads in a notebook: the failing rank first, its traceback, the run directory.

IPython would print the caller's side of a failure: the launch machinery's frames, the rank's
traceback as a chained cause and the call line. What the user needs is the rank's side, so an
exception that comes from a run gets IPython's ``_render_traceback_`` (the hook ipyparallel uses
for exceptions raised in its engines) before IPython shows it:

    rank 1 raised ValueError: bad value
    Traceback (most recent call last):
      Cell In[3], line 14, in flaky_step
        raise ValueError("bad value")
    ValueError: bad value
    run directory: /tmp/serverless-gpu-0/20261130-104651-flaky_step-6abdac49f358

A rank's exception keeps its own type (``ValueError``), so IPython cannot be told by type which
exceptions are ours: the extension installs a custom exception handler for ``Exception`` and
``KeyboardInterrupt`` that adds the hook to exceptions from a run (and to the interrupt that
stopped one) and hands every exception to IPython's usual display.
"""

from __future__ import annotations

import types
from typing import Any

from serverless_gpu.common.errors import DistributedError

from .hook import abandon_unstarted, interrupted_run
from .traceback_text import HEADLINE, OURS, RESET, attach, ipython_labeler

_HANDLED = (Exception, KeyboardInterrupt)
"""What the extension's handler sees (IPython shows everything it does not change as usual)."""


class ExceptionDisplay:
    """IPython's custom exception handler while the extension is loaded.

    It is installed only where no other handler is, and every exception still goes through
    IPython's own display (``showtraceback``: ``%debug``, ``%tb`` and SyntaxErrors as usual).
    """

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self.label = ipython_labeler(shell)
        self.installed = False

    def install(self) -> None:
        if tuple(getattr(self.shell, "custom_exceptions", ())) == ():
            self.shell.set_custom_exc(_HANDLED, self._handle)
            self.installed = True

    def uninstall(self) -> None:
        if self.installed and tuple(self.shell.custom_exceptions) == _HANDLED:
            self.shell.set_custom_exc((), None)
        self.installed = False

    def _handle(
        self,
        shell: Any,
        etype: type[BaseException],
        value: BaseException,
        tb: Any,
        tb_offset: int | None = None,
    ) -> None:
        # IPython calls the handler from two places: when the cell does not compile (its own
        # display for that is showsyntaxerror) and when the cell's code raised (run_code).
        if tb is None or tb.tb_frame.f_code.co_name != "run_code":
            shell.showsyntaxerror()
            return
        if isinstance(value, KeyboardInterrupt):
            _attach_interrupt(shell, value)
        if isinstance(value, DistributedError):
            abandon_unstarted(shell, value)
        if not attach(value, self.label) and isinstance(value, DistributedError):
            tb = _user_frames(tb)  # the library's own error: the user's call is what matters
        shell.showtraceback((etype, value, tb), tb_offset=tb_offset, running_compiled_code=True)


def _attach_interrupt(shell: Any, value: KeyboardInterrupt) -> None:
    """The user stopped the kernel while it waited on a run: one line says what happened."""
    name = interrupted_run(shell)
    if name is not None:
        line = f"{HEADLINE}KeyboardInterrupt{RESET}: {name} was interrupted; every rank was stopped"
        value._render_traceback_ = lambda: [line]  # type: ignore[attr-defined]


def _user_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    """The traceback without the frames of this library and this extension."""
    kept = []
    while tb is not None:
        if not tb.tb_frame.f_code.co_filename.startswith(OURS):
            kept.append(tb)
        tb = tb.tb_next
    pruned = None
    for frame in reversed(kept):
        pruned = types.TracebackType(pruned, frame.tb_frame, frame.tb_lasti, frame.tb_lineno)
    return pruned
