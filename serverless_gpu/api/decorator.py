"""The public API: ``@distributed(gpus=, gpu_type=, timeout=)`` and ``fn.distributed()``."""

from __future__ import annotations

import enum
import functools
import sys
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any, Generic, NoReturn, ParamSpec, TypeVar, overload

from serverless_gpu import tracking as _tracking  # noqa: F401 - registers the MLflow run hook (lazy mlflow)
from serverless_gpu.api.functions import check_function, gpus_per_node
from serverless_gpu.api.prewarm import join_prewarm as join_prewarm
from serverless_gpu.api.prewarm import prewarm, start_prewarm
from serverless_gpu.api.prewarm import warm_up as warm_up
from serverless_gpu.api.start_errors import os_error, working_directory
from serverless_gpu.api.trials import call_params, trial_arguments
from serverless_gpu.backends import registry
from serverless_gpu.backends.base import Backend
from serverless_gpu.caller.console import ConsolePrinter
from serverless_gpu.caller.handle import RunHandle
from serverless_gpu.caller.hooks import RunContext, run_hooks
from serverless_gpu.caller.results import RunResult
from serverless_gpu.caller.retries import (
    Call,
    FailedAttempt,
    add_note,
    attempts_note,
    failed_attempt,
    retryable,
    say_retrying,
)
from serverless_gpu.caller.retrying import RetryingHandle
from serverless_gpu.common import settings
from serverless_gpu.common.errors import (
    CancelledError,
    ConfigurationError,
    DistributedError,
    LauncherError,
    UsageError,
)
from serverless_gpu.common.gpus import GPUType
from serverless_gpu.common.options import check_names
from serverless_gpu.runfiles.rundirs import new_run_dir, runs_root
from serverless_gpu.runfiles.serialization import dump_payload, max_payload_bytes
from serverless_gpu.wire.accelerators import AcceleratorType, one_count
from serverless_gpu.wire.config import DEFAULT_TIMEOUT, DistributedConfig
from serverless_gpu.wire.runpaths import RunPaths
from serverless_gpu.wire.runspec import RunSpec

P = ParamSpec("P")
R = TypeVar("R")
_INTERRUPT_WAIT_S = 10.0


class _Unset(enum.Enum):
    """An argument not given (where ``None`` means something: ``timeout=None``, no limit)."""

    UNSET = enum.auto()


UNSET = _Unset.UNSET


class DistributedFunction(Generic[P, R]):
    """A function decorated with ``@distributed``: run it with ``.distributed(*args)``."""

    def __init__(
        self, func: Callable[P, R], config: DistributedConfig, backend: Backend | None = None
    ) -> None:
        check_function(func)
        self.func = func
        self.config = config
        self._backend = backend
        functools.update_wrapper(self, func)
        if config.standby and registry.for_config(config).standby:
            start_prewarm(
                lambda: prewarm(
                    self.backend,
                    config.gpus,
                    config.gpu_type,
                    config.tracking,
                    config.warm_process_group,
                    config.gpus_per_node,
                )
            )

    @property
    def gpus(self) -> int | None:
        """The ranks to start (``config.gpus``); ``None``: the default count."""
        return self.config.gpus

    num_accelerators = gpus
    """The original API's name of :attr:`gpus`."""

    @property
    def gpus_per_node(self) -> int | None:
        """GPUs of one node: see :func:`~serverless_gpu.api.functions.gpus_per_node`."""
        return gpus_per_node(self.config)

    @property
    def gpu_type(self) -> str | GPUType | None:
        """The GPU family asked for (``config.gpu_type``); ``None``: auto-detected."""
        return self.config.gpu_type

    @property
    def accelerator_type(self) -> str | None:
        """The node shape asked for (an :class:`AcceleratorType`, or ``"GPU_<n>x<family>"``
        for others); ``None`` when none was named."""
        return self.config.accelerator_type

    @property
    def remote(self) -> bool:
        """The ranks run on the Ray cluster this process is connected to."""
        return self.config.on_ray

    @property
    def timeout(self) -> float | None:
        """Seconds before the call is stopped; ``None``: no limit."""
        return self.config.timeout

    def with_overrides(
        self,
        num_accelerators: int | None = None,
        accelerator_type: str | AcceleratorType | GPUType | None = None,
        remote: bool | None = None,
        timeout: float | _Unset | None = UNSET,
        *,
        gpus: int | None = None,
        gpu_type: str | GPUType | None = None,
        **options: Any,
    ) -> DistributedFunction[P, R]:
        """A new decorated function, the same but for the fields given (options are fields of
        :class:`DistributedConfig`); this one is unchanged. A type in either spelling replaces
        both (``gpu_type`` drops the node shape); ``timeout=None`` removes the limit."""
        check_names(DistributedConfig, options, "with_overrides")
        changes = dict(options)
        count = one_count(gpus, num_accelerators)
        if count is not None:
            changes["gpus"] = count
        if accelerator_type is not None or gpu_type is not None:
            changes.update(gpu_type=gpu_type, accelerator_type=accelerator_type)
        if remote is not None:
            changes.setdefault("backend", None)
            changes["remote"] = remote
        if not isinstance(timeout, _Unset):
            changes["timeout"] = timeout
        return DistributedFunction(self.func, replace(self.config, **changes), self._backend)

    def __repr__(self) -> str:
        name = getattr(self.func, "__qualname__", "fn")
        return (
            f"DistributedFunction({name}, gpus={self.gpus!r}, gpu_type={self.gpu_type!r}, "
            f"accelerator_type={self.accelerator_type!r}, remote={self.remote!r}, "
            f"timeout={self.timeout!r})"
        )

    @property
    def backend(self) -> Backend:
        if self._backend is not None:
            return self._backend
        return registry.for_config(self.config).backend(self.config)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> NoReturn:
        name = getattr(self.func, "__name__", "fn")
        raise UsageError(
            f"{name} is decorated with @distributed: call {name}.distributed(...) to run it on "
            f"every rank, or {name}.func(...) to run it once in this process"
        )

    def distributed(self, *args: P.args, **kwargs: P.kwargs) -> RunResult[R]:
        """Run the function once per rank with these arguments; one return value per rank.

        With ``max_retries`` a crashed attempt is started again (see ``retries.py``); the
        caller gets one result, or the last error with every attempt's root cause."""
        __tracebackhide__ = True  # IPython and pytest hide this frame in tracebacks
        call = Call(max_retries=self.config.max_retries)
        failed: list[FailedAttempt] = []
        status = "failed"
        try:
            while True:
                handle = self._begin(call, args, kwargs)  # a call that cannot start: no retry
                try:
                    result = self._wait(handle)
                    status = "succeeded"
                    return result
                except KeyboardInterrupt:
                    status = "cancelled"
                    raise
                except BaseException as exc:
                    failed.append(failed_attempt(call.attempt, exc))
                    if call.attempt >= call.max_retries or not retryable(exc, self.config.retry_on):
                        status = "cancelled" if isinstance(exc, CancelledError) else "failed"
                        if len(failed) > 1:
                            add_note(exc, attempts_note(failed))
                        raise
                    call.attempt += 1
                    say_retrying(failed[-1], call)
        finally:
            call.end(status)

    def _begin(self, call: Call, args: Any, kwargs: Any) -> RunHandle[R]:
        __tracebackhide__ = True
        try:
            return self._start(call, *args, **kwargs)
        except DistributedError as exc:
            # The library's frames below here say nothing; the exception keeps its own cause
            # and context, so no "from".
            raise exc.with_traceback(None)  # noqa: B904

    def _wait(self, handle: RunHandle[R]) -> RunResult[R]:
        """One attempt of the call, started: its results or its root-cause error."""
        __tracebackhide__ = True
        try:
            return handle.result()
        except KeyboardInterrupt as exc:
            _interrupted(handle)
            # The interrupt landed somewhere in the library's waiting loop: its frames
            # (handle.py, queue.py, threading.py) would only hide the user's line.
            raise exc.with_traceback(None)  # noqa: B904
        except BaseException as exc:
            # Frames of result() and wait() say nothing; the rank's traceback is the cause.
            raise exc.with_traceback(None)  # noqa: B904
        finally:
            if not handle.done():
                handle.cancel("the caller stopped waiting")
                handle.wait(_INTERRUPT_WAIT_S)

    def start(self, *args: P.args, **kwargs: P.kwargs) -> RunHandle[R]:
        """Start the ranks and return at once: a :class:`RunHandle` (``result()``,
        ``cancel()``, ``status`` ...). Runs started at once get disjoint devices; one that
        finds too few free waits in a queue (status ``queued``) until others end. With
        ``max_retries`` a crashed attempt is started again (a new run) as ``.distributed``
        would, and the handle follows it: ``result()`` is the last attempt's."""
        return self._start_call(args, kwargs)

    def map(self, items: Iterable[Any]) -> list[RunHandle[R]]:
        """Start one run per item (a dict of keyword arguments, a tuple of positional ones, or
        a single argument) and return their handles in item order, at once. Every item is
        pickled first: one that cannot be raises before any run starts. Each handle is one
        call, as ``start``'s: with ``max_retries`` a crashed item is started again and its
        handle follows the new attempt."""
        calls = [trial_arguments(item) for item in items]
        limit = max_payload_bytes(self.config.max_payload_bytes)
        payloads = []
        for i, (args, kwargs) in enumerate(calls):
            try:
                payloads.append(dump_payload(self.func, args, kwargs, limit))
            except DistributedError as exc:
                add_note(exc, f"(item {i} of the map; no run of the map was started)")
                raise
        return [
            self._start_call(args, kwargs, i, payload)
            for i, ((args, kwargs), payload) in enumerate(zip(calls, payloads, strict=True))
        ]

    def _start_call(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        trial: int | None = None,
        payload: bytes | None = None,
    ) -> RunHandle[R]:
        """One call, started: its run's handle, or with ``max_retries`` a handle that starts
        a crashed attempt again and follows it (``retrying.py``)."""
        cfg = self.config
        if cfg.max_retries == 0:
            return self._start_with(Call(), args, kwargs, trial, payload)

        def start_run(call: Call) -> RunHandle[R]:  # the run of the call's next attempt
            return self._start_with(call, args, kwargs, trial, payload)

        return RetryingHandle(Call(max_retries=cfg.max_retries), cfg.retry_on, start_run)

    def start_trial(self, trial: int, item: Any) -> RunHandle[R]:
        """Start item number ``trial`` of a sweep (``sweep``) as one call, as ``map`` does:
        its arguments become the run's ``params``."""
        args, kwargs = trial_arguments(item)
        return self._start_call(args, kwargs, trial)

    def _start(self, call: Call, *args: Any, **kwargs: Any) -> RunHandle[R]:
        return self._start_with(call, args, kwargs)

    def _start_with(
        self,
        call: Call,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        trial: int | None = None,
        payload: bytes | None = None,
        prepare: Callable[[RunContext], None] | None = None,
        name: str | None = None,
    ) -> RunHandle[R]:
        """Start one run; ``payload``: the call already pickled (``map`` pickles every item
        before it starts any); ``prepare``: called with the run's context before the hooks
        (a session makes its FIFOs there); ``name``: the run's name (the function's)."""
        cfg = self.config
        settings.check()  # before anything exists: no run directory, MLflow run or launcher
        cwd = working_directory()
        # placed by the call's backend (on this machine's GPUs, or on a cluster it connects to
        # first, so that a missing cluster fails before anything is created)
        placement = registry.for_config(cfg).placement(cfg)
        if payload is None:
            limit = max_payload_bytes(cfg.max_payload_bytes)
            payload = dump_payload(self.func, args, kwargs, limit)
        name = name or str(getattr(self.func, "__qualname__", "fn"))
        try:
            run_id, run_dir, results_dir = new_run_dir(name)
        except OSError as exc:
            root = runs_root()  # it was found usable: this failure is the disk's
            what = f"could not create the run directory in {root}"
            raise os_error(what, exc, ConfigurationError, folder=root) from exc
        paths = RunPaths(run_dir, results_dir)
        ctx = RunContext(RunSpec(run_id, name, placement, paths, cfg), call=call)
        ctx.env[settings.ATTEMPT.name] = str(call.attempt)
        ctx.metadata["call_params"] = params = call_params(args, kwargs, self.func)
        if trial is not None:
            ctx.metadata.update(trial=trial, params=params)
        if prepare is not None:
            prepare(ctx)
        subscribers = run_hooks(ctx)
        if not ctx.display_claimed:
            subscribers.insert(0, ConsolePrinter(cfg.output))
        ctx.subscribers.extend(subscribers)  # the handle has them before the run can end
        ctx.seal(cwd, tuple(sys.path))
        try:
            return self.backend.submit(ctx, payload)
        except OSError as exc:
            what = "could not start the run"
            raise os_error(what, exc, LauncherError, run_dir.parent, run_dir) from exc


def _interrupted(handle: RunHandle[Any]) -> None:
    """A KeyboardInterrupt while waiting: ask the ranks to stop (``stop_grace``) and wait for
    them as long as a stop may take; a second interrupt stops them at once."""
    handle.cancel("interrupted (KeyboardInterrupt in the caller)")
    try:
        handle.wait(handle.context.spec.stop_s + _INTERRUPT_WAIT_S)
    except KeyboardInterrupt:
        handle.cancel("interrupted twice (KeyboardInterrupt in the caller)", force=True)
        handle.wait(_INTERRUPT_WAIT_S)


@overload
def distributed(func: Callable[P, R], /) -> DistributedFunction[P, R]: ...


@overload
def distributed(
    num_accelerators: int | None = None,
    accelerator_type: str | AcceleratorType | GPUType | None = None,
    remote: bool = False,
    timeout: float | None = DEFAULT_TIMEOUT,
    *,
    gpus: int | None = None,
    gpu_type: str | GPUType | None = None,
    **options: Any,
) -> Callable[[Callable[P, R]], DistributedFunction[P, R]]: ...


def distributed(
    num_accelerators: Any = None,
    accelerator_type: str | AcceleratorType | GPUType | None = None,
    remote: bool = False,
    timeout: float | None = DEFAULT_TIMEOUT,
    *,
    gpus: int | None = None,
    gpu_type: str | GPUType | None = None,
    **options: Any,
) -> Any:
    """Decorate a function so that ``fn.distributed(*args, **kwargs)`` runs it on every GPU.

    ``gpus`` and ``gpu_type`` (keywords) are this library's spelling; ``num_accelerators`` and
    ``accelerator_type`` (``"GPU_8xH100"``, a node shape) are the original API's, and take the
    positions it gives them. Either spelling, or both when they agree. Options are the fields of
    :class:`DistributedConfig`. Used bare (``@distributed``) it takes every default.
    """
    if callable(num_accelerators):
        return DistributedFunction(num_accelerators, DistributedConfig())
    check_names(DistributedConfig, options, "@distributed")
    config = DistributedConfig(
        gpus=one_count(gpus, num_accelerators),  # type: ignore[arg-type]
        gpu_type=gpu_type,
        accelerator_type=accelerator_type,
        remote=remote,
        timeout=timeout,
        **options,
    )

    def wrap(func: Callable[P, R]) -> DistributedFunction[P, R]:
        return DistributedFunction(func, config)

    return wrap
