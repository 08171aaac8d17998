"""A rank's traceback in the caller's words: frames of cell code named as IPython names them
(``Cell In[3], line 14``), the library's own frames dimmed, the failing rank and its run directory
first. Text only; :mod:`.tracebacks` gives it to IPython's display."""

from __future__ import annotations

import linecache
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from serverless_gpu.common import errors as _errors
from serverless_gpu.common.errors import (
    CancelledError,
    DistributedError,
    RemoteError,
    RemoteTraceback,
    failures_of,
    other_failures_text,
    rank_of,
    run_dir_of,
)

_FRAME = re.compile(r'^(?P<indent> *)File "(?P<file>[^"]+)", line (?P<line>\d+)(?P<rest>.*)$')
_MAGIC_CELL = re.compile(r"^<%%distributed (In\[\d+\])>$")
_LIBRARY = str(Path(_errors.__file__).resolve().parents[1]) + "/"  # serverless_gpu/
OURS = (_LIBRARY, str(Path(__file__).resolve().parent) + "/")
_DIM, RESET = "\x1b[2m", "\x1b[0m"
HEADLINE = "\x1b[1m"
"""An error's headline: bold in the text's own colour. JupyterLab draws bold red in its
"intense" red (about 2:1 on the dark theme's error background) and red at about 3.9:1; the
error's background already says red."""

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
    # A rank's exception (its own type, or a RemoteError for one that does not unpickle) is
    # shown as the rank raised it; the library's other errors as themselves.
    own = isinstance(exc, RemoteError) or not isinstance(exc, DistributedError)
    rank = rank_of(exc) if own else None
    if rank is not None:
        return _rank_raised(exc, rank, run_dir_of(exc), label)
    if isinstance(exc, CancelledError):
        return [f"{HEADLINE}{type(exc).__name__}: {_first_line(exc)}{RESET}"]
    if isinstance(exc, DistributedError) and exc.run_dir is not None:
        lines = [f"{HEADLINE}{type(exc).__name__}: {_first_line(exc)}{RESET}"]
        lines += str(exc).splitlines()[1:]
        return [*lines, _run_dir_line(exc.run_dir)]
    return None


def _rank_raised(exc: BaseException, rank: int, run_dir: Path | None, label: Labeler) -> list[str]:
    type_name = exc.type_name if isinstance(exc, RemoteError) else type(exc).__name__
    message = exc.remote_message if isinstance(exc, RemoteError) else _first_line(exc)
    head = f"rank {rank} raised {type_name.rsplit('.', 1)[-1]}"
    lines = [f"{HEADLINE}{head}: {message}{RESET}" if message else f"{HEADLINE}{head}{RESET}"]
    cause = exc.__cause__
    if isinstance(cause, RemoteTraceback):
        lines += clean_traceback(cause.traceback_text, label)
    others = other_failures_text(failures_of(exc), rank).strip()
    if others:
        lines.append(others)
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
    return f"{_DIM}run directory: {run_dir}{RESET}"


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
