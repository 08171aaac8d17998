"""``%%distributed --session NAME``: cells that run in a persistent session's ranks.

    %%distributed --session train gpus=2     # the first cell of a name starts the session
    model = build()
    %%distributed --session train            # later cells run in the same rank processes
    loss.item()

Each rank's value of the last expression is shown as ``Out[n:rank]`` (ipyparallel's habit);
names the cell reads that the session lacks come from the notebook. ``%distributed_session
list | stop NAME | restart NAME`` manages them. Sessions end with the kernel.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import time
from collections.abc import Iterator
from typing import Any

from IPython.core.error import UsageError

from serverless_gpu.api.decorator import DEFAULT_TIMEOUT
from serverless_gpu.api.session import Session
from serverless_gpu.caller.console import ConsolePrinter
from serverless_gpu.caller.results import RunResult

from . import magic_args
from .hook import widgets_wanted

_sessions: dict[str, tuple[Session, dict[str, Any]]] = {}
"""Sessions by name, with the options they were started with (``restart``)."""


def session_options(args: Any) -> dict[str, Any]:
    if args.run_async:
        raise UsageError("--session cells wait for their ranks: --async is for one-off cells")
    # Every option of the magic (--remote: the session's ranks are Ray actors); a session has
    # no limit unless the cell names one.
    options = magic_args.config_options(args)
    if options["timeout"] == DEFAULT_TIMEOUT:
        options["timeout"] = None
    return options


def check_same(name: str, given: dict[str, Any]) -> None:
    """A later cell's options (those it gives) must be the session's: its ranks are running."""
    known = _sessions.get(name)
    if known is None:
        return
    differ = [k for k, v in given.items() if known[1].get(k) != v and k != "run_name"]
    if differ:
        now = ", ".join(f"{k}={known[1].get(k)!r}" for k in differ)
        asked = ", ".join(f"{k}={given[k]!r}" for k in differ)
        raise UsageError(
            f"session {name!r} runs with {now}; this cell asks for {asked}. To start it again "
            f"with these (its state is lost): %distributed_session stop {name}, then run this "
            "cell again; or leave the options out to use the session as it is"
        )


def get_or_start(name: str, options: dict[str, Any]) -> Session:
    known = _sessions.get(name)
    if known is not None:
        return known[0]
    if options.get("run_name") is None:
        options["run_name"] = name
    session = Session(name=name, **options)
    _sessions[name] = (session, options)
    return session


def run_cell(
    shell: Any, name: str, options: dict[str, Any], cell: str, count: int, quiet: bool
) -> RunResult[Any]:
    """Run ``cell`` in session ``name``; its per-rank values (shown as ``Out[n:rank]``)."""
    __tracebackhide__ = True
    widgets = widgets_wanted(shell)
    session = _opened(name, options) if widgets else get_or_start(name, options)
    # One blank line for the magic's own line: tracebacks quote the cell's own line numbers.
    code = "\n" + cell
    names = _shipped(code, shell.user_ns, session)
    cell_handle = session.start_exec(code, filename=f"<%%distributed In[{count}]>", names=names)
    said = False  # whether the cell's folded record says the session's status
    if widgets:
        from .session_view import run_with_widget

        result, said = run_with_widget(shell, session, cell_handle, count)
    else:
        result = cell_handle.result()
    if not quiet and any(v is not None for v in result):
        for rank, value in enumerate(result):
            print(f"Out[{count}:{rank}]: {value!r}")
    if not said:
        print(f"serverless_gpu: {session.status_line()}")
    return result


def _opened(name: str, options: dict[str, Any]) -> Session:
    """The session; one started here says at once what it waits for (the MLflow run and the
    launcher take seconds), then how long it took. Its console printer is dropped: each cell's
    widget shows the ranks' lines and the session's status."""
    if name in _sessions:
        return _sessions[name][0]
    from IPython.display import display

    gpus, kind = options.get("gpus") or 1, options.get("gpu_type") or "the default type"
    awaited = "the MLflow run, the launcher" if options.get("tracking", True) else "the launcher"
    line = display(
        {
            "text/plain": f"serverless_gpu: session {name!r} starting: {gpus} x {kind}; "
            f"waiting for {awaited} and the ranks..."
        },
        raw=True,
        display_id=True,
    )
    began = time.monotonic()
    session = get_or_start(name, options)
    _printers(session)
    if line is not None:
        took = time.monotonic() - began
        line.update(
            {"text/plain": f"serverless_gpu: session {name!r} started ({took:.1f} s)"}, raw=True
        )
    return session


def _printers(session: Session) -> list[Any]:
    """Unsubscribe the console printers of the session's run; returns them (to restore)."""
    handle = session.core.handle
    printers = [s for s in handle.subscribers if isinstance(s, ConsolePrinter)]
    for printer in printers:
        handle.unsubscribe(printer)
    return printers


@contextlib.contextmanager
def _silent(session: Session) -> Iterator[None]:
    """No console line while the session closes: its run's end is not a run's success
    ("run succeeded"); the command says what happened in one line."""
    printers = _printers(session)
    try:
        yield
    finally:
        for printer in printers:
            session.core.handle.subscribe(printer)


def _shipped(code: str, user_ns: dict[str, Any], session: Session) -> dict[str, Any]:
    """Notebook values of the names the cell reads that the session does not hold."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return {}  # exec reports it with the cell's line
    read = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    held = session.core.names
    return {
        n: user_ns[n]
        for n in sorted(read)
        if n in user_ns and n not in held and not hasattr(builtins, n) and not n.startswith("_")
    }


def session_command(line: str) -> None:
    words = line.split()
    if (
        not words
        or words[0] not in ("list", "stop", "restart")
        or (words[0] != "list" and len(words) != 2)
    ):
        raise UsageError("usage: %distributed_session list | stop NAME | restart NAME")
    command = words[0]
    if command == "list":
        if not _sessions:
            print("serverless_gpu: no sessions")
        for session, _ in _sessions.values():
            print(session.status_line())
        return
    name = words[1]
    if name not in _sessions:
        raise UsageError(f"no session named {name!r} (known: {', '.join(_sessions) or 'none'})")
    session, options = _sessions.pop(name)
    with _silent(session):
        session.close()
    if command == "restart":  # one line: what the session is now
        fresh = get_or_start(name, options)
        from IPython import get_ipython

        if widgets_wanted(get_ipython()):
            _printers(fresh)  # the cells' widgets show it; its start line would be a 2nd line
        print(
            f"serverless_gpu: session {name!r} restarted (a fresh namespace): {fresh.status_line()}"
        )
    else:
        print(f"serverless_gpu: session {name!r} stopped")


def close_all() -> None:
    """At kernel shutdown: every session's ranks end (MLflow FINISHED)."""
    while _sessions:
        session, _ = _sessions.popitem()[1]
        session.close()
