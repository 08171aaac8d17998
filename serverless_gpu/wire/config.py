"""``DistributedConfig``: how a decorated function is run, checked once, carried as itself.

The caller builds it with the decorator; it travels unchanged inside the run's ``RunSpec`` to
the launcher, so every reader names a field, never a string key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypeGuard

from serverless_gpu.common import backend_names, settings
from serverless_gpu.common.describe import type_name
from serverless_gpu.common.errors import ConfigurationError, GPUConfigError
from serverless_gpu.common.gpus import GPUType, check_cpu_count, check_gpu_count, cpu_mode_requested
from serverless_gpu.common.options import (
    CLI,
    COUNT,
    JOB_FILE,
    MAGIC,
    POSITIVE_INT,
    SECONDS,
    SIGNATURE,
    SWITCH,
    TEXT,
    choice,
    option,
)
from serverless_gpu.common.vocabulary import option_name
from serverless_gpu.wire.accelerators import node_shape

DEFAULT_TIMEOUT = 10800.0
DEFAULT_GRACE = 1.0
DEFAULT_HANG_WARNING_S = 300.0
# How rank output reaches the console (the widget shows every rank whatever this says).
OUTPUT_CHOICES = ("default", "all", "rank0", "none")


@dataclass(frozen=True)
class DistributedConfig:
    """How a decorated function is run. Every field is checked when the decorator is applied."""

    gpus: int | None = option(
        None,
        "Ranks to start, one per GPU (default: every GPU; CPU mode: 2).",
        (SIGNATURE, MAGIC, CLI, JOB_FILE),
        POSITIVE_INT,
    )
    """Ranks to start, one per GPU; ``None`` means every visible GPU (CPU mode: 2, or
    ``$SERVERLESS_GPU_CPU_RANKS``). CPU mode runs at most ``settings.MAX_CPU_RANKS`` (64)."""
    gpu_type: str | GPUType | None = option(  # noqa: RUF009 - a field, as dataclasses.field()
        None,
        "Expected accelerator (H100, A100, ..., or cpu for CPU ranks over gloo).",
        (SIGNATURE, MAGIC, CLI, JOB_FILE),
        TEXT,
    )
    """Expected accelerator (``"H100"``, ``"a10g"`` ...); ``None`` auto-detects; ``"cpu"`` runs
    CPU ranks over gloo. A mismatch with the machine fails before launch."""
    accelerator_type: str | None = option(None, "A node shape (GPU_8xH100).", (SIGNATURE,))
    """A node shape, the original API's spelling: ``"GPU_8xH100"`` is nodes of 8 H100 (any
    case; :class:`~serverless_gpu.compute.AcceleratorType`, or any ``"GPU_<n>x<family>"``). Its
    family is ``gpu_type``. On this machine a call runs on one node of it: ``gpus`` at most ``n``,
    default every visible GPU up to ``n``; with ``remote=True``, on whole nodes: ``gpus`` a
    multiple of ``n``, default ``n``. A value without a count (``"h100_80gb"``, ``"a10g"``,
    ``"cpu"``) is read as ``gpu_type``. CPU mode ignores the shape as it ignores ``gpu_type``."""
    timeout: float | None = option(
        DEFAULT_TIMEOUT,
        f"Seconds before every rank is stopped, or 'none' (default {DEFAULT_TIMEOUT / 3600:g} h).",
        (SIGNATURE, MAGIC, CLI, JOB_FILE),
        SECONDS,
        job_key="timeout_minutes",
        job_unit=60.0,
    )
    """Seconds before every rank is killed and ``DistributedTimeoutError`` is raised; ``None``
    disables the limit."""
    output: str = option(
        "default",
        "Which ranks' output is printed live; every rank's log is kept.",
        (MAGIC, CLI),
        choice(lambda: OUTPUT_CHOICES),
    )
    """Which rank output is printed live: ``"default"`` (rank 0 and every rank's stderr),
    ``"all"``, ``"rank0"`` or ``"none"``. Every rank's full log is on disk regardless."""
    tracking: bool = option(True, "Record the run in MLflow.", (MAGIC,), SWITCH)
    """Track the call as an MLflow run when mlflow is installed."""
    run_name: str | None = option(
        None,
        "The MLflow run's name (default: the function's, the cell's or the script's).",
        (MAGIC, CLI, JOB_FILE),
        TEXT,
        flag="--name",
    )
    """Name of the MLflow run; defaults to the function's name."""
    max_payload_bytes: int | None = None
    """Limit on the pickled function and arguments, a positive number of bytes (default
    ~100 MB, or ``$SERVERLESS_GPU_MAX_PAYLOAD_MB``); pickling stops as soon as it is passed."""
    grace: float = DEFAULT_GRACE
    """Seconds between SIGTERM and SIGKILL when ranks are stopped: finite, at most
    ``settings.MAX_GRACE_S`` (60) and at most ``timeout`` (the default is shortened to a
    shorter timeout)."""
    standby: bool = True
    """Prepare rank processes ahead of the call (launcher started at decoration time)."""
    warm_process_group: bool = True
    """Standby ranks also form the default process group ahead of the call (NCCL on GPUs,
    gloo on CPU), so ``init_process_group`` in the call returns at once when its backend,
    rank, world size and device agree; and ``destroy_process_group`` in the call returns at
    once, the shutdown following after the result. ``dist.is_initialized()`` is True when the
    function starts. False: ranks start without a group, and both calls are torch's own. On the
    local backend (Ray calls start their actors with the call and form no group ahead)."""
    stop_grace: float = 0.0
    """Seconds a cancel, timeout or interrupt first asks the ranks to stop
    (``runtime.should_stop()`` turns True) before stopping them as usual; a second cancel or
    interrupt stops them at once. 0 (the default): stopped at once. For training, 30-120 s
    leaves time to save a checkpoint; at most 600."""
    hang_warning: float | None = DEFAULT_HANG_WARNING_S
    """Seconds a running rank may show no sign of life (output line, metric,
    ``runtime.heartbeat()``) before the console and widget warn, naming it; nothing is
    stopped. ``None``: no warning."""
    max_retries: int = option(0, "Retries on a crash.", (CLI, JOB_FILE), COUNT)
    """Start the call again, up to this many times, when it fails with a crash, a lost rank or
    a collective error (not an exception of the user's code unless ``retry_on`` names it)."""
    retry_on: tuple[type[BaseException] | str, ...] = ()
    """Exception types that are retried too (``(ValueError,)``, ``(DistributedTimeoutError,)``).
    Kept as their qualified names (``"builtins.ValueError"``): the config travels to processes
    that cannot import a class defined in a notebook."""
    remote: bool = option(
        False,
        "Run on the connected Ray cluster (remote=True).",
        (SIGNATURE, MAGIC, CLI, JOB_FILE),
        SWITCH,
    )
    """Run the ranks on the Ray cluster this process is connected to (``backend="ray"``)."""
    backend: str | None = option(
        None,
        "Where ranks run: this machine (local), the Ray cluster (ray), or an installed "
        "backend plug-in.",
        (MAGIC,),
        choice(backend_names.known_names),
    )
    """``"local"`` (this machine, the default), ``"ray"`` (same as ``remote=True``), or the name
    of an installed backend plug-in (``backends/registry.py``)."""

    @property
    def gpus_per_node(self) -> int | None:
        """The GPUs of one node of ``accelerator_type``; ``None`` when no shape was named."""
        return None if self.accelerator_type is None else node_shape(self.accelerator_type)[0]

    @property
    def backend_name(self) -> str:
        """The backend that runs the calls: ``backend``, ``"ray"`` for ``remote=True``, else
        ``"local"``. The one place the config names its backend."""
        if self.backend is not None:
            return self.backend
        return "ray" if self.remote else backend_names.DEFAULT

    @property
    def on_ray(self) -> bool:
        """The ranks run on a Ray cluster (``remote=True`` or ``backend="ray"``): the original
        API's ``remote``, and whole nodes for a node shape."""
        return self.backend_name == "ray"

    def __post_init__(self) -> None:
        _check_timeout(self.timeout)
        check_gpu_count(self.gpus)
        _apply_shape(self)
        if self.gpu_type is not None:
            GPUType.parse(self.gpu_type)
        if cpu_mode_requested(self.gpu_type):
            check_cpu_count(self.gpus)
        if self.output not in OUTPUT_CHOICES:
            raise ConfigurationError(f"output must be one of {OUTPUT_CHOICES}, not {self.output!r}")
        _check_grace(self.grace, self.timeout)
        _check_options(self)
        _check_recovery(self)


def _apply_shape(config: DistributedConfig) -> None:
    """Fold ``accelerator_type`` into ``gpu_type`` (its family) and check its count against
    ``gpus``: one node on this machine, whole nodes on Ray; not in CPU mode, where the shape
    means nothing (as ``gpu_type`` there)."""
    if config.accelerator_type is None:
        return
    per_node, family, name = node_shape(config.accelerator_type)
    # gpu_type="cpu" is CPU mode, which ignores the shape (as SERVERLESS_GPU_TYPE=cpu does).
    asked = None if config.gpu_type is None else GPUType.parse(config.gpu_type)
    if asked not in (None, family, GPUType.CPU):
        raise ConfigurationError(
            f"gpu_type={_text(config.gpu_type)!r} and "
            f"accelerator_type={_text(config.accelerator_type)!r} "
            "are two spellings of one option with different values: give one of them"
        )
    legacy = per_node is None  # a family alone ("a10g") is a gpu_type, kept as written
    object.__setattr__(
        config, "gpu_type", config.gpu_type or (config.accelerator_type if legacy else family.value)
    )
    object.__setattr__(config, "accelerator_type", name)
    if per_node is not None and config.gpus is not None and not cpu_mode_requested(config.gpu_type):
        _check_shape_count(config, config.gpus, per_node, str(name))


def _text(value: object) -> str:
    """An enum member (``GPUType.H100``) as its value, for messages."""
    return str(getattr(value, "value", value))


def _check_shape_count(config: DistributedConfig, gpus: int, per_node: int, name: str) -> None:
    remote = config.on_ray
    if not remote and gpus > per_node:
        raise GPUConfigError(
            f"num_accelerators={gpus} with accelerator_type='{name}': a call on this "
            f"machine runs on one node, of {per_node} GPU(s); ask for at most {per_node}, or "
            "run on a Ray cluster's nodes with remote=True"
        )
    if remote and gpus % per_node:
        raise GPUConfigError(
            f"num_accelerators={gpus} with accelerator_type='{name}' and remote=True: "
            f"remote calls run on whole nodes of {per_node} GPU(s); ask for a multiple of "
            f"{per_node}"
        )


def _is_number(value: object) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_timeout(timeout: object) -> None:
    if timeout is not None and not (_is_number(timeout) and math.isfinite(timeout) and timeout > 0):
        raise ConfigurationError(
            f"timeout must be a positive number of seconds or None, not {timeout!r}"
        )


def _check_grace(grace: object, timeout: float | None) -> None:
    cap = settings.MAX_GRACE_S
    if not (_is_number(grace) and 0 <= grace <= cap):
        raise ConfigurationError(
            f"grace must be a number of seconds from 0 to {cap:g}, not {grace!r}"
        )
    if timeout is not None and grace > timeout and grace != DEFAULT_GRACE:
        raise ConfigurationError(
            f"grace={grace!r} is longer than timeout={timeout!r}: a stopped rank may take up to "
            "grace seconds to end, so it must not exceed the timeout"
        )


def _check_options(config: DistributedConfig) -> None:
    limit = config.max_payload_bytes
    if limit is not None and not (
        isinstance(limit, int) and not isinstance(limit, bool) and limit > 0
    ):
        raise ConfigurationError(
            f"max_payload_bytes must be a positive whole number of bytes or None, not {limit!r}"
        )
    if config.backend is not None and not (
        isinstance(config.backend, str) and backend_names.is_known(config.backend)
    ):
        known = backend_names.names_text(backend_names.known_names())
        raise ConfigurationError(f"backend must be {known}, not {config.backend!r}")
    if config.remote and config.backend not in (None, "ray"):
        raise ConfigurationError(
            f"remote=True runs on Ray: it cannot go with backend={config.backend!r}"
        )
    for name in ("standby", "warm_process_group", "tracking", "remote"):
        if not isinstance(getattr(config, name), bool):
            raise ConfigurationError(f"{name} must be True or False, not {getattr(config, name)!r}")
    if config.run_name is not None and not isinstance(config.run_name, str):
        raise ConfigurationError(f"run_name must be a string or None, not {config.run_name!r}")


MAX_STOP_GRACE_S = 600.0


def _check_recovery(config: DistributedConfig) -> None:
    """``stop_grace``, ``hang_warning``, ``max_retries``, ``retry_on``."""
    grace = config.stop_grace
    if not (_is_number(grace) and 0 <= grace <= MAX_STOP_GRACE_S):
        raise ConfigurationError(
            f"stop_grace must be a number of seconds from 0 to {MAX_STOP_GRACE_S:g}, not {grace!r}"
        )
    hang = config.hang_warning
    if hang is not None and not (_is_number(hang) and math.isfinite(hang) and hang > 0):
        raise ConfigurationError(
            f"hang_warning must be a positive number of seconds or None, not {hang!r}"
        )
    retries = config.max_retries
    if not (isinstance(retries, int) and not isinstance(retries, bool) and 0 <= retries <= 100):
        raise ConfigurationError(
            f"{option_name('max_retries')} must be a whole number from 0 to 100, not {retries!r}"
        )
    kinds = config.retry_on
    if not (
        isinstance(kinds, tuple)
        and all(
            isinstance(k, str) or (isinstance(k, type) and issubclass(k, BaseException))
            for k in kinds
        )
    ):
        raise ConfigurationError(f"retry_on must be a tuple of exception types, not {kinds!r}")
    object.__setattr__(config, "retry_on", tuple(map(type_name, kinds)))
