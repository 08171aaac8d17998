"""``%%distributed``: run a cell's body once per rank and get every rank's value back.

    %%distributed gpus=2 gpu_type=cpu --out losses
    import torch.distributed as dist
    ...
    loss.item()

The body runs as the body of a function on every rank; it sees the notebook names it reads
(copied at call time), and the value of its last expression (or of a top-level ``return``)
comes back as a list in rank order. The magic only builds the function and calls the public
API; the run hook draws it.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any, TypeVar

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from serverless_gpu.api.decorator import DistributedFunction
from serverless_gpu.caller.results import RunResult
from serverless_gpu.common.describe import describe_value
from serverless_gpu.common.errors import ConfigurationError, DistributedError
from serverless_gpu.doctor import stacks
from serverless_gpu.doctor.stack_text import where
from serverless_gpu.wire.config import DistributedConfig

from . import magic_args, session_magic
from .cellfunc import EmptyCellError, build_cell_function
from .hook import abandon_unstarted, last_run, renderer_for
from .traceback_text import HEADLINE, Labeler, attach, clean_traceback, ipython_labeler

T = TypeVar("T")


class CellSyntaxError(Exception):
    """The cell does not parse. Shown as IPython shows a cell's syntax error: the cell's line
    and the caret, without the frames of the magic that parsed it (IPython would list every
    frame of a ``SyntaxError`` raised inside a magic)."""

    def __init__(self, error: SyntaxError, label: Labeler) -> None:
        super().__init__(f"{error.msg} (line {error.lineno})")
        self.error = error
        self._label = label

    def _render_traceback_(self) -> list[str]:
        text = "".join(traceback.format_exception_only(SyntaxError, self.error))
        return clean_traceback(text, self._label)


@magics_class
class DistributedMagics(Magics):
    @cell_magic
    @magic_arguments(name="%distributed")  # usage then reads "%%distributed"
    @magic_args.option_arguments
    @magic_args.result_arguments
    @argument(
        "--session",
        type=magic_args.identifier,
        default=None,
        help="Run in the persistent session of this name (the first such cell starts it; "
        "state stays from cell to cell). See %%distributed_session.",
    )
    @argument(
        "--async",
        dest="run_async",
        action="store_true",
        help="Return at once; --out binds the run's handle (h.result(), h.cancel(), h.status).",
    )
    def distributed(self, line: str, cell: str) -> RunResult[Any] | None:
        """Run this cell once per rank (one process per GPU) and return every rank's value.

        ``key=value`` spellings work too: ``%%distributed gpus=2 gpu_type=cpu --out values``.
        A trailing ``;`` on the last line suppresses the displayed list.
        """
        __tracebackhide__ = True  # IPython hides this frame: the user's error is what matters
        shell = self.shell
        assert shell is not None
        args = magic_args.parse(self.distributed, line)
        count = _cell_number(shell)
        label = ipython_labeler(shell)
        if args.session:
            self._session_cell(args, cell, count, label)
            return None
        config = self._config(args)
        try:
            cell_function = build_cell_function(
                cell,
                shell.user_ns,
                name=f"cell_{count}",
                filename=f"<%%distributed In[{count}]>",
                first_line=2,
                cell_text=f"%%distributed {line}\n{cell}",
            )
        except EmptyCellError as exc:
            raise UsageError(f"{exc}\n\n{magic_args.usage(self.distributed)}") from None
        except SyntaxError as exc:
            raise CellSyntaxError(exc, label) from None
        function: DistributedFunction[[], Any] = DistributedFunction(cell_function, config)
        if args.run_async:
            self._start(function, args.out, label)
            return None
        result = _reporting(shell, label, function.distributed)
        renderer = renderer_for(run_id=result.run_id)
        if renderer is not None:
            renderer.show_results([describe_value(v) for v in result])
        if args.out:
            shell.user_ns[args.out] = result
        if cell_function.has_value and not cell.rstrip().endswith(";"):
            return result
        return None

    def _session_cell(self, args: Any, cell: str, count: int, label: Labeler) -> None:
        __tracebackhide__ = True
        shell = self.shell
        assert shell is not None
        options = session_magic.session_options(args)
        plain = magic_args.parse(self.distributed, f"--session {args.session}")
        defaults = session_magic.session_options(plain)
        session_magic.check_same(
            args.session, {k: v for k, v in options.items() if v != defaults.get(k)}
        )
        quiet = cell.rstrip().endswith(";")
        try:
            result = _reporting(
                shell,
                label,
                lambda: session_magic.run_cell(shell, args.session, options, cell, count, quiet),
            )
        except SyntaxError as exc:
            raise CellSyntaxError(exc, label) from None
        if args.out:
            shell.user_ns[args.out] = result

    @line_magic
    def distributed_session(self, line: str) -> None:
        """``list`` the notebook's sessions (ranks, devices, memory, idle time), ``stop NAME``
        or ``restart NAME`` one (a restart starts with a fresh namespace)."""
        session_magic.session_command(line)

    @line_magic
    def distributed_stacks(self, line: str) -> None:
        """Print every rank's Python stacks for the latest run: taken now while it runs, or
        the ones saved last (a timeout saves them) once it has ended."""
        ctx = last_run()
        if ctx is None:
            print("serverless_gpu: no run has been started in this session")
            return
        found = ctx.stacks() or stacks.load_saved(ctx.paths, ctx.placement.world_size)
        print(stacks_text(ctx.name, found))

    def _start(self, function: DistributedFunction[[], Any], out: str | None, label: Any) -> None:
        """``--async``: start the run and return; its widget goes on updating in the
        background, and ``--out`` binds its handle."""
        shell = self.shell
        assert shell is not None
        handle = _reporting(shell, label, function.start)
        if out:
            shell.user_ns[out] = handle
        from .run_table import follow_handle

        follow_handle(handle)

    def _config(self, args: Any) -> DistributedConfig:
        try:
            # a cell runs once: nothing to prepare ahead of it
            return DistributedConfig(**magic_args.config_options(args), standby=False)
        except ConfigurationError as exc:
            raise UsageError(f"{exc}\n\n{magic_args.usage(self.distributed)}") from None


def stacks_text(name: str, found: dict[int, str]) -> str:
    if not found:
        return f"serverless_gpu: no stacks for {name} (no rank answered, and none were saved)"
    parts = []
    for rank, text in sorted(found.items()):
        parts.append(f"--- rank {rank}: {where(text)} ---\n{text.rstrip()}")
    return "\n\n".join(parts)


def _reporting(shell: Any, label: Any, call: Callable[[], T]) -> T:
    """``call()``; an exception it raises is shown without this module's frames, and a run it
    did not start leaves the cell's widget, before it propagates."""
    try:
        return call()
    except Exception as exc:
        abandon_unstarted(shell, exc)
        _show_without_local_frames(exc, label)
        raise


def _show_without_local_frames(exc: BaseException, label: Labeler) -> None:
    """The cell's code runs only on the ranks: no frame of this process is the user's. A run's
    failure shows the rank's side; the library's own errors (bad arguments, a payload that
    cannot be pickled) show their message."""
    if attach(exc, label) or not isinstance(exc, DistributedError):
        return
    text = str(exc).splitlines() or [""]
    lines = [f"{HEADLINE}{type(exc).__name__}\x1b[0m: {text[0]}", *text[1:]]
    exc._render_traceback_ = lambda: lines  # type: ignore[attr-defined]


def _cell_number(shell: Any) -> int:
    """The ``In[n]`` of the running cell: IPython stores a cell's input before running it."""
    history = getattr(shell.history_manager, "input_hist_raw", None)
    return len(history) - 1 if history else int(shell.execution_count)
