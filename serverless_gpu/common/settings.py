"""Every ``SERVERLESS_GPU_*`` environment variable the library reads: name, default, parsing and
limits, in one place. The only module that spells their names: every reader calls
:meth:`Variable.read` and every writer sets ``env[VARIABLE.name]``.

:func:`check` validates all of them when a call starts, before a run directory, an MLflow run
or the launcher exists, so a malformed value is a :class:`ConfigurationError` naming the
variable instead of a ``ValueError`` (or a hang) somewhere in the middle of a run. An empty
value means the default.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from serverless_gpu.common.errors import ConfigurationError

T = TypeVar("T")

MAX_CPU_RANKS = 64
"""CPU mode runs every rank on this machine's cores; more ranks than this only measure how many
processes the machine can fork (thousands of ranks each holding torch), not a training setup."""

MAX_GRACE_S = 60.0
"""The longest ``grace`` between SIGTERM and SIGKILL: a stop (failure, timeout, cancel) always
ends within this much time after it was decided."""


@dataclass(frozen=True)
class Variable(Generic[T]):
    """One environment variable: its name, its default and how its text becomes a value."""

    name: str
    default: T
    parse: Callable[[str], T]
    """Turns the (stripped, non-empty) text into a value; ``ValueError`` says what is wrong."""
    doc: str

    def read(self, environ: Mapping[str, str] | None = None) -> T:
        raw = (os.environ if environ is None else environ).get(self.name, "")
        if not raw.strip():
            return self.default
        try:
            return self.parse(raw.strip())
        except ValueError as exc:
            raise ConfigurationError(
                f"environment variable {self.name}={raw!r} is invalid: {exc}"
            ) from None

    def present(self, environ: Mapping[str, str] | None = None) -> bool:
        """Whether the variable is set at all, even to an empty value."""
        return self.name in (os.environ if environ is None else environ)


def _int_between(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"expected a whole number from {low} to {high}") from None
        if not low <= value <= high:
            raise ValueError(f"expected a whole number from {low} to {high}")
        return value

    return parse


def _seconds(*, zero_allowed: bool) -> Callable[[str], float]:
    wanted = "a number of seconds >= 0" if zero_allowed else "a number of seconds > 0"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"expected {wanted}") from None
        if not math.isfinite(value) or value < 0 or (value == 0 and not zero_allowed):
            raise ValueError(f"expected {wanted}")
        return value

    return parse


def _megabytes(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError("expected a size in MB greater than 0 (such as 100 or 0.5)") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError("expected a size in MB greater than 0 (such as 100 or 0.5)")
    return value


def _choice(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.lower()
        if value not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}")
        return value

    return parse


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _flag(text: str) -> bool:
    value = text.lower()
    if value in _TRUE + _FALSE:
        return value in _TRUE
    raise ValueError(f"expected 1 or 0 ({'/'.join(_TRUE)} or {'/'.join(_FALSE)})")


def _text(text: str) -> str:
    return text


DEVICE_TYPE = Variable(
    "SERVERLESS_GPU_TYPE",
    "auto",
    _choice("auto", "cpu", "gpu", "cuda"),
    "``cpu`` runs every decorator on CPU ranks (gloo); ``auto``/``gpu``/``cuda``: the GPUs.",
)
CPU_RANKS = Variable(
    "SERVERLESS_GPU_CPU_RANKS",
    2,
    _int_between(1, MAX_CPU_RANKS),
    "Ranks of a ``gpus=None`` call in CPU mode.",
)
CPU_SLOTS = Variable(
    "SERVERLESS_GPU_CPU_SLOTS",
    max(2, os.cpu_count() or 1),
    _int_between(1, MAX_CPU_RANKS),
    "Virtual devices CPU-mode runs are allocated from, as GPUs are on a GPU machine: calls "
    "running at once share them, and a call that finds too few free waits in a queue "
    "(default: the core count, at least 2).",
)
MAX_PAYLOAD_MB = Variable(
    "SERVERLESS_GPU_MAX_PAYLOAD_MB",
    100.0,
    _megabytes,
    "Limit on the pickled function and arguments, in MB (2**20 bytes).",
)
RUNS_DIR = Variable(
    "SERVERLESS_GPU_RUNS_DIR",
    "",
    _text,
    "Where private run directories live (default ``<tmp>/serverless-gpu-<uid>``).",
)
RESULTS_DIR = Variable(
    "SERVERLESS_GPU_RESULTS_DIR",
    "",
    _text,
    "Where ranks write results first: a folder, or ``off`` for the run directory.",
)
KEEP_RUNS = Variable(
    "SERVERLESS_GPU_KEEP_RUNS",
    20,
    _int_between(1, 1_000_000),
    "Run directories kept (their logs); older ones are deleted.",
)
WARMUP = Variable(
    "SERVERLESS_GPU_WARMUP",
    True,
    _flag,
    "Whether ``%load_ext`` starts the launcher ahead of the first call.",
)
SYSTEM_METRICS_INTERVAL = Variable(
    "SERVERLESS_GPU_SYSTEM_METRICS_INTERVAL",
    10.0,
    _seconds(zero_allowed=True),
    "Seconds between two system-metric samples; 0 turns sampling off.",
)
MLFLOW_FLUSH_INTERVAL = Variable(
    "SERVERLESS_GPU_MLFLOW_FLUSH_INTERVAL",
    1.0,
    _seconds(zero_allowed=True),
    "Seconds between two batches of metrics a rank sends to the caller.",
)
MLFLOW_LOG_UPLOAD_INTERVAL = Variable(
    "SERVERLESS_GPU_MLFLOW_LOG_UPLOAD_INTERVAL",
    60.0,
    _seconds(zero_allowed=True),
    "Seconds between two uploads of the rank logs to MLflow; 0: only at the end.",
)
MLFLOW_START_TIMEOUT = Variable(
    "SERVERLESS_GPU_MLFLOW_START_TIMEOUT",
    10.0,
    _seconds(zero_allowed=True),
    "Seconds a tracking server may take to open the call's run; past that it runs untracked.",
)
CACHE_DIR = Variable(
    "SERVERLESS_GPU_CACHE_DIR",
    "",
    _text,
    "Where volumes are cached (default ``~/.cache/serverless_gpu/volumes``).",
)
VOLUME_TIMEOUT = Variable(
    "SERVERLESS_GPU_VOLUME_TIMEOUT",
    20.0,
    _seconds(zero_allowed=False),
    "Seconds an object-store request of a volume may wait to connect or for the next bytes.",
)
VOLUME_TRIES = Variable(
    "SERVERLESS_GPU_VOLUME_TRIES",
    3,
    _int_between(1, 20),
    "Tries of an object-store request of a volume before its error reaches the loop.",
)
DISPLAY = Variable(
    "SERVERLESS_GPU_DISPLAY",
    "auto",
    _choice("auto", "text", "widget"),
    "How a notebook shows a run: the widget where it can, or always text.",
)
WIDGET_LINES = Variable(
    "SERVERLESS_GPU_WIDGET_LINES",
    200,
    _int_between(1, 1_000_000),
    "Lines per rank the notebook widget keeps.",
)
RAY_RESERVE_TIMEOUT = Variable(
    "SERVERLESS_GPU_RAY_RESERVE_TIMEOUT",
    60.0,
    _seconds(zero_allowed=False),
    "Seconds a ``remote=True`` call waits for the Ray cluster to hold its ranks.",
)
RAY_CPUS_PER_RANK = Variable(
    "SERVERLESS_GPU_RAY_CPUS_PER_RANK",
    1,
    _int_between(1, 1024),
    "CPUs reserved for each rank of a ``remote=True`` call (with its GPU, if any).",
)
RAY_IDLE_S = Variable(
    "SERVERLESS_GPU_RAY_IDLE_S",
    300.0,
    _seconds(zero_allowed=True),
    "Seconds a ``remote=True`` call's rank actors (and placement group) wait for the next call "
    "of the same shape before they are released; 0 releases them after every call.",
)

USER_SETTINGS: tuple[Variable[Any], ...] = (
    DEVICE_TYPE,
    CPU_RANKS,
    CPU_SLOTS,
    MAX_PAYLOAD_MB,
    RUNS_DIR,
    RESULTS_DIR,
    KEEP_RUNS,
    WARMUP,
    SYSTEM_METRICS_INTERVAL,
    MLFLOW_FLUSH_INTERVAL,
    MLFLOW_LOG_UPLOAD_INTERVAL,
    MLFLOW_START_TIMEOUT,
    CACHE_DIR,
    VOLUME_TIMEOUT,
    VOLUME_TRIES,
    DISPLAY,
    WIDGET_LINES,
    RAY_RESERVE_TIMEOUT,
    RAY_CPUS_PER_RANK,
    RAY_IDLE_S,
)
"""Every variable a user may set."""

# -- internal: set by the library for its own processes, never by a user -------------------

DEVICE = Variable(
    "SERVERLESS_GPU_DEVICE",
    "cuda",
    _text,
    "In a rank: the kind of device its run uses (``wire/env.py``).",
)
RUN_ID = Variable(
    "SERVERLESS_GPU_RUN_ID", "", _text, "In a rank: the id of its run (``wire/env.py``)."
)
RUN_DIR = Variable(
    "SERVERLESS_GPU_RUN_DIR", "", _text, "In a rank: its run directory (``wire/env.py``)."
)
DEVICES = Variable(
    "SERVERLESS_GPU_DEVICES",
    "",
    _text,
    "In a rank: the comma-separated devices its run was allocated"
    " (``launcher_process/allocation.py``).",
)
RANK_INIT = Variable(
    "SERVERLESS_GPU_RANK_INIT",
    "",
    _text,
    "In a rank: comma-separated ``module:function`` initializers run before the user's "
    "function (``caller/hooks.py``).",
)
MLFLOW_RUN_ID = Variable(
    "SERVERLESS_GPU_MLFLOW_RUN_ID",
    "",
    _text,
    "In a tracked rank: the MLflow run its fast logging writes into; set but empty: the store "
    "is unreachable and points go to the run directory. Kept apart from ``MLFLOW_RUN_ID``, "
    "which MLflow's own ``start_run`` deletes from the environment when it resumes the run.",
)
MLFLOW_ARTIFACT_URI = Variable(
    "SERVERLESS_GPU_MLFLOW_ARTIFACT_URI",
    "",
    _text,
    "In a tracked rank: the run's artifact location, so ``log_artifact`` need not look it up.",
)
RAY_LAUNCH_GPUS = Variable(
    "SERVERLESS_GPU_RAY_LAUNCH_GPUS",
    0,
    _int_between(0, 1_000_000),
    "In a ``@ray_launch`` driver: the ``gpus`` it was decorated with (``api/ray_launch.py``).",
)
ATTEMPT = Variable(
    "SERVERLESS_GPU_ATTEMPT",
    0,
    _int_between(0, 1_000_000),
    "In a rank: which run of its call this is, 0 first (``runtime.attempt()``).",
)
SESSION_ADDRESS = Variable(
    "SERVERLESS_GPU_SESSION_ADDRESS",
    "",
    _text,
    "In a rank of a session whose caller is on another machine: ``host:port`` where the caller "
    "listens for its cells (``caller/session_links.py``); empty: the FIFOs of the run directory.",
)
SESSION_TOKEN = Variable(
    "SERVERLESS_GPU_SESSION_TOKEN",
    "",
    _text,
    "In such a rank: the secret it shows the caller's listener before anything else.",
)

INTERNAL: tuple[Variable[Any], ...] = (
    DEVICE,
    RUN_ID,
    RUN_DIR,
    DEVICES,
    RANK_INIT,
    MLFLOW_RUN_ID,
    MLFLOW_ARTIFACT_URI,
    RAY_LAUNCH_GPUS,
    ATTEMPT,
    SESSION_ADDRESS,
    SESSION_TOKEN,
)
"""Set by the library in the environment of its ranks and drivers; not settings (``check``
leaves them alone)."""


def check(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Validate every user setting; their values by name. Raises :class:`ConfigurationError`
    naming the first malformed variable."""
    return {var.name: var.read(environ) for var in USER_SETTINGS}


def cpu_mode() -> bool:
    """``SERVERLESS_GPU_TYPE=cpu``: every decorator runs CPU ranks."""
    return DEVICE_TYPE.read() == "cpu"


def max_payload_bytes() -> int:
    return int(MAX_PAYLOAD_MB.read() * 1024 * 1024)
