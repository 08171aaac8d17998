"""``Session``: rank processes that keep their state from one cell to the next.

    with Session(gpus=2) as sess:
        sess.exec("import torch; x = torch.ones(3)")
        sess.exec("x.sum()")          # [tensor(3.), tensor(3.)]

A session is one call of the decorator's machinery (devices, events, MLflow run, lifetime)
whose function serves cells (``rank/session_loop.py``); ``caller/session.py`` drives it.
"""

from __future__ import annotations

import atexit
import itertools
import keyword
import pickle
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import cloudpickle

from serverless_gpu.api.decorator import DistributedFunction
from serverless_gpu.backends import registry
from serverless_gpu.caller.handle import RunHandle
from serverless_gpu.caller.hooks import RunContext
from serverless_gpu.caller.results import RunResult
from serverless_gpu.caller.retries import Call
from serverless_gpu.caller.session import CellHandle, SessionEndedError, SessionRun
from serverless_gpu.caller.session_links import FifoLink, TcpLink
from serverless_gpu.common.errors import ConfigurationError, SerializationError
from serverless_gpu.common.gpus import GPUType
from serverless_gpu.rank.session_loop import serve
from serverless_gpu.runfiles.serialization import (
    describe_unpicklable,
    dump_payload,
    dump_result,
    dumps_for_caller,
    max_payload_bytes,
)
from serverless_gpu.runfiles.streamed import streamed
from serverless_gpu.wire.config import DistributedConfig
from serverless_gpu.wire.session import EXEC, PULL, PUSH, RUN

__all__ = ["Session", "SessionEndedError"]

DEFAULT_SESSION_GRACE = 3.0
_numbers = itertools.count(1)
_open: weakref.WeakSet[Session] = weakref.WeakSet()
_exit_lock = threading.Lock()
_exit_registered = False


class Session:
    """Ranks that stay up between cells, each with one namespace that every cell runs in.

    ``gpus``, ``gpu_type`` and the keyword options are the decorator's (``tracking``,
    ``run_name``, ``output``, ``grace``, ``warm_process_group``, ``timeout`` for the whole
    session: none by default). ``grace``: how long a cell's interrupt waits for every rank
    (default 3 s) before the session is stopped. ``name``: how ``%distributed_session`` and the
    messages call it.
    """

    def __init__(
        self,
        gpus: int | None = None,
        gpu_type: str | GPUType | None = None,
        *,
        tracking: bool = True,
        run_name: str | None = None,
        name: str | None = None,
        grace: float = DEFAULT_SESSION_GRACE,
        timeout: float | None = None,
        **options: Any,
    ) -> None:
        unknown = set(options) - set(DistributedConfig.__dataclass_fields__)
        if unknown or "max_retries" in options:
            bad = ", ".join(sorted(unknown | ({"max_retries"} & set(options))))
            raise ConfigurationError(f"option(s) a Session does not take: {bad}")
        self.name = name or f"session{next(_numbers)}"
        options.setdefault("hang_warning", None)  # an idle session is silent by design
        config = DistributedConfig(
            gpus=gpus,
            gpu_type=gpu_type,
            tracking=tracking,
            run_name=run_name or self.name,
            grace=grace,
            timeout=timeout,
            **options,
        )
        self.config = config
        self._max_payload = max_payload_bytes(config.max_payload_bytes)
        plugin = registry.for_config(config)
        if not plugin.sessions:
            raise ConfigurationError(f"the {plugin.name!r} backend does not run sessions")
        function = DistributedFunction(serve, config)
        links: list[FifoLink | TcpLink] = []

        def prepare(ctx: RunContext) -> None:
            world = ctx.placement.world_size
            host = plugin.session_host
            link = TcpLink(host(), world) if host else FifoLink(ctx.paths.session, world)
            links.append(link)
            ctx.env.update(link.env())
            ctx.session_link = link
            ctx.metadata["session"] = self.name

        try:
            handle = function._start_with(Call(), (), {}, prepare=prepare, name=self.name)
        except BaseException:
            for link in links:
                link.close()
            raise
        self.core = SessionRun(handle, links[0], grace, self.name)
        """The caller's side of the ranks (``caller/session.py``)."""
        self.started = time.time()
        _register(self)

    # -- cells -------------------------------------------------------------------------------

    def start_exec(
        self,
        code: str,
        *,
        filename: str | None = None,
        label: str | None = None,
        names: dict[str, Any] | None = None,
    ) -> CellHandle:
        """Start ``code`` in every rank; the handle's ``result()`` waits. ``names``: values for
        names the namespace lacks (set only where missing). Code that does not compile raises
        its ``SyntaxError`` here, before any rank runs it."""
        self.core.check_alive()
        number = self.core._next
        filename = filename or f"<session {self.name} cell {number}>"
        compile(code, filename, "exec")
        fallback = _fallback(names or {}) if names else None
        self._keep_code(number, code)
        return self.core.submit(EXEC, code, filename=filename, label=label, fallback=fallback)

    def exec(self, code: str, **kwargs: Any) -> RunResult[Any]:
        """Run ``code`` in every rank's namespace; per rank, the value of its last line when
        that is an expression (else None). A rank's exception is raised with its own type."""
        __tracebackhide__ = True
        return self._finish(self.start_exec(code, **kwargs))

    def start_run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> CellHandle:
        self.core.check_alive()
        payload = dump_payload(fn, args, kwargs, self._max_payload)
        return self.core.submit(RUN, payload)

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> RunResult[Any]:
        """``fn(*args, **kwargs)`` in every rank with the session's namespace as its globals:
        what it assigns with ``global`` stays for later cells."""
        __tracebackhide__ = True
        return self._finish(self.start_run(fn, *args, **kwargs))

    def push(self, **values: Any) -> None:
        """Set these names in every rank's namespace (tensors arrive on the CPU, mapped)."""
        __tracebackhide__ = True
        bad = [repr(n) for n in values if not n.isidentifier() or keyword.iskeyword(n)]
        if bad:  # a cell could never name it
            raise ValueError(f"cannot push {', '.join(bad)}: not a Python identifier")
        self.core.check_alive()
        if self.core.link.remote:  # the ranks may not see this machine's files
            self._push_bytes(values)
            return
        path = self.core.results_dir / f"push-{self.core._next:04d}.pkl"
        try:
            dump_result(values, path, 1)
        except Exception as exc:
            path.with_name(path.name + ".tmp").unlink(missing_ok=True)
            where = describe_unpicklable(self.push, (), values).replace("argument ", "value ")
            raise SerializationError(
                f"cannot push to session {self.name!r}: {where}: {exc}"
            ) from None
        try:
            self._finish(self.core.submit(PUSH, str(path)))
        finally:
            path.unlink(missing_ok=True)

    def _push_bytes(self, values: dict[str, Any]) -> None:
        __tracebackhide__ = True
        try:  # tensors' bytes follow the request raw; anything else in one pickle
            data: Any = streamed(values) or dumps_for_caller(values)
        except Exception as exc:
            where = describe_unpicklable(self.push, (), values).replace("argument ", "value ")
            raise SerializationError(
                f"cannot push to session {self.name!r}: {where}: {exc}"
            ) from None
        self._finish(self.core.submit(PUSH, data))

    def pull(self, name: str) -> list[Any]:
        """The value of ``name`` in each rank, in rank order; ``NameError`` names a rank
        without it."""
        __tracebackhide__ = True
        return list(self._finish(self.core.submit(PULL, name)))

    def _finish(self, handle: CellHandle) -> RunResult[Any]:
        __tracebackhide__ = True
        try:
            return handle.result()
        except BaseException as exc:
            raise exc.with_traceback(None)  # noqa: B904 - its own cause is the rank's traceback

    def _keep_code(self, number: int, code: str) -> None:
        """Each cell's code in the run directory (``cells/0003.py``); tracking uploads it."""
        folder = self.core.handle.run_dir / "cells"
        folder.mkdir(exist_ok=True)
        (folder / f"{number:04d}.py").write_text(code)

    # -- state ------------------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        """The ranks are up and serve cells."""
        return self.core.alive

    @property
    def handle(self) -> RunHandle[Any]:
        """The session's run: ``run_dir``, ``links``, ``logs(rank)``, ``stacks()``."""
        return self.core.handle

    def stacks(self, timeout: float = 5.0) -> dict[int, str]:
        """Every rank's Python stacks now (all threads), without stopping the cell: where a
        cell that does not return is (the hang doctor's view, as ``RunHandle.stacks``)."""
        return self.core.handle.stacks(timeout)

    @property
    def world_size(self) -> int:
        return self.core.world

    def status_line(self) -> str:
        """One line: ranks, devices, memory per GPU, idle time (``%distributed_session list``)."""
        run = self.core
        if not run.alive:
            return f"{self.name}: ended ({run.ended})"
        cpu = run.handle.context.placement.device == "cpu"
        if run.link.remote:  # which node holds which ranks
            each = "CPU ranks" if cpu else "1 GPU each"
            devices = _on_nodes(run.nodes, each) if run.nodes else "Ray (ranks starting)"
        else:
            kind = "CPU slots" if cpu else "GPUs"
            devices = f"{kind} {', '.join(run.handle.devices) or '(queued)'}"
        memory = [m for _, m in sorted(run.memory.items())]
        mem = (
            " / ".join(f"{m / 2**30:.1f}" for m in memory) + " GiB"
            if any(memory)
            else "no GPU memory"
        )
        idle = time.time() - run.last_used
        return (
            f"{self.name}: {run.world} ranks alive on {devices}; {mem}; idle {idle:.0f} s; "
            f"cells {run._next - 1}"
        )

    def close(self) -> None:
        """End the ranks (the MLflow run ends FINISHED); nothing is left behind."""
        self.core.close()
        _open.discard(self)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Session {self.status_line()}>"


def _on_nodes(nodes: dict[int, str], each: str) -> str:
    """``Ray node 0 (10.0.0.7): ranks 0, 1; node 1 (10.0.0.8): ranks 2, 3 (1 GPU each)``."""
    by_node: dict[str, list[str]] = {}
    for rank, node in sorted(nodes.items()):
        by_node.setdefault(node, []).append(str(rank))
    held = "; ".join(f"{node}: ranks {', '.join(ranks)}" for node, ranks in by_node.items())
    return f"Ray {held} ({each})"


def _fallback(names: dict[str, Any]) -> bytes:
    """The caller's values that pickle (a module, a function of the notebook ...)."""
    kept = {}
    for key, value in names.items():
        try:
            cloudpickle.dumps(value)
        except Exception:
            continue
        kept[key] = value
    return cloudpickle.dumps(kept, protocol=pickle.HIGHEST_PROTOCOL)


def _register(session: Session) -> None:
    """Close every open session at exit, before the launcher's own exit handler (handlers run
    last-registered first: this one is registered after the launcher started)."""
    global _exit_registered
    _open.add(session)
    with _exit_lock:
        if not _exit_registered:
            atexit.register(close_all_sessions)
            _exit_registered = True


def close_all_sessions() -> None:
    """Close every open session of this process (at exit, and by ``shutdown()``)."""
    for session in list(_open):
        try:
            session.close()
        except Exception:
            pass
