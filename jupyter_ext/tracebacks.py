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

import linecache
import re
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import serverless_gpu
from serverless_gpu.errors import (
    CancelledError,
    DistributedError,
    RemoteError,
    RemoteTraceback,
)

from .hook import abandon_unstarted, interrupted_run

_FRAME = re.compile(r'^(?P<indent> *)File "(?P<file>[^"]+)", line (?P<line>\d+)(?P<rest>.*)$')
_MAGIC_CELL = re.compile(r"^<%%distributed (In\[\d+\])>$")
_LIBRARY = str(Path(serverless_gpu.__file__).resolve().parent) + "/"
_OURS = (_LIBRARY, str(Path(__file__).resolve().parent) + "/")
_DIM, _RESET = "\x1b[2m", "\x1b[0m"
HEADLINE = "\x1b[1m"
"""An error's headline: bold in the text's own colour. JupyterLab draws bold red in its
"intense" red (about 2:1 on the dark theme's error background) and red at about 3.9:1; the
error's background already says red."""

_HANDLED = (Exception, KeyboardInterrupt)
"""What the extension's handler sees (IPython shows everything it does not change as usual)."""

Labeler = Callable[[str], "str | None"]
"""Maps a code file name to what IPython calls it (``Cell In[3]``), or None."""


def ipython_labeler(shell: Any) -> Labeler:
    """``Cell In[n]`` for the shell's cells and for ``%%distributed`` cells."""
    compiler = getattr(shell, "compile", None)

    def label(filename: str) -> str | None:
        magic = _MAGIC_CELL.match(filename)
        if magic:
            return f"Cell {magic.group(1)}"
        named = compiler.format_code_name(filename) if compiler is not None else None
        return f"{named[0]} {named[1]}" if named else None

    return label


def clean_traceback(text: str, label: Labeler) -> list[str]:
    """A rank's traceback without the library's frames, cells named as IPython names them.

    A frame in a notebook cell reads ``Cell In[3], line 14, in flaky_step`` and quotes its line
    (from this kernel's own copy of the cell when the rank could not quote it).
    """
    lines = text.rstrip("\n").splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        frame = _FRAME.match(lines[i])
        i += 1
        if frame is None:
            out.append(lines[i - 1])
            continue
        quoted = []
        while i < len(lines) and lines[i].startswith(frame["indent"] + "  "):
            quoted.append(lines[i])
            i += 1
        if frame["file"].startswith(_LIBRARY):
            continue  # the rank's own machinery (worker, runtime): not the user's code
        out.extend(_frame_lines(frame, quoted, label))
    return out


def _frame_lines(frame: re.Match[str], quoted: list[str], label: Labeler) -> Iterator[str]:
    indent, filename, lineno = frame["indent"], frame["file"], int(frame["line"])
    name = label(filename)
    if name is None:
        yield frame.group(0)
    else:
        yield f"{indent}{name}, line {lineno}{frame['rest']}"
    if quoted:
        yield from quoted
        return
    source = linecache.getline(filename, lineno).strip()
    if source:
        yield f"{indent}  {source}"


def render_lines(exc: BaseException, label: Labeler) -> list[str] | None:
    """What IPython shows for an exception that came from a run; None for any other."""
    run_dir = getattr(exc, "serverless_gpu_run_dir", None)
    rank = getattr(exc, "serverless_gpu_rank", None)
    if isinstance(exc, RemoteError):
        rank, run_dir = exc.rank, exc.run_dir
    if isinstance(rank, int):
        return _rank_raised(exc, rank, run_dir, label)
    if isinstance(exc, CancelledError):
        return [f"{HEADLINE}{type(exc).__name__}: {_first_line(exc)}{_RESET}"]
    if isinstance(exc, DistributedError) and exc.run_dir is not None:
        lines = [f"{HEADLINE}{type(exc).__name__}: {_first_line(exc)}{_RESET}"]
        lines += str(exc).splitlines()[1:]
        return [*lines, _run_dir_line(exc.run_dir)]
    return None


def _rank_raised(exc: BaseException, rank: int, run_dir: Path | None, label: Labeler) -> list[str]:
    type_name = exc.type_name if isinstance(exc, RemoteError) else type(exc).__name__
    message = exc.remote_message if isinstance(exc, RemoteError) else _first_line(exc)
    head = f"rank {rank} raised {type_name.rsplit('.', 1)[-1]}"
    lines = [f"{HEADLINE}{head}: {message}{_RESET}" if message else f"{HEADLINE}{head}{_RESET}"]
    cause = exc.__cause__
    if isinstance(cause, RemoteTraceback):
        lines += clean_traceback(cause.traceback_text, label)
    if run_dir is not None:
        lines.append(_run_dir_line(run_dir))
    return lines


def _first_line(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:  # an exception whose __str__ fails still gets a heading
        return ""
    return text.strip().splitlines()[0] if text.strip() else ""


def _run_dir_line(run_dir: Path) -> str:
    return f"{_DIM}run directory: {run_dir}{_RESET}"


def attach(exc: BaseException, label: Labeler) -> bool:
    """Give ``exc`` IPython's ``_render_traceback_`` if it came from a run; True if it did."""
    lines = render_lines(exc, label)
    if lines is None:
        return False
    try:
        exc._render_traceback_ = lambda: lines  # type: ignore[attr-defined]
    except (AttributeError, TypeError):  # an exception type that refuses attributes
        return False
    return True


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
        line = (
            f"{HEADLINE}KeyboardInterrupt{_RESET}: {name} was interrupted; every rank was stopped"
        )
        value._render_traceback_ = lambda: [line]  # type: ignore[attr-defined]


def _user_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    """The traceback without the frames of this library and this extension."""
    kept = []
    while tb is not None:
        if not tb.tb_frame.f_code.co_filename.startswith(_OURS):
            kept.append(tb)
        tb = tb.tb_next
    pruned = None
    for frame in reversed(kept):
        pruned = types.TracebackType(pruned, frame.tb_frame, frame.tb_lasti, frame.tb_lineno)
    return pruned
