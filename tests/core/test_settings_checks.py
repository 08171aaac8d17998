"""Every setting is checked before anything exists: environment variables when a call starts,
decorator fields when the decorator is applied."""

from __future__ import annotations

import ast
import math
import re
from pathlib import Path
from typing import Any

import pytest

from serverless_gpu import ConfigurationError, DistributedError, distributed, runtime
from serverless_gpu.common import settings
from serverless_gpu.common.errors import PayloadTooLargeError, UsageError
from serverless_gpu.common.settings import MAX_CPU_RANKS, MAX_GRACE_S

BAD_ENVIRONMENT = [
    ("SERVERLESS_GPU_CPU_RANKS", "0"),
    ("SERVERLESS_GPU_CPU_RANKS", "-3"),
    ("SERVERLESS_GPU_CPU_RANKS", "two"),
    ("SERVERLESS_GPU_CPU_RANKS", str(MAX_CPU_RANKS + 1)),
    ("SERVERLESS_GPU_MAX_PAYLOAD_MB", "abc"),
    ("SERVERLESS_GPU_MAX_PAYLOAD_MB", "0"),
    ("SERVERLESS_GPU_MAX_PAYLOAD_MB", "inf"),
    ("SERVERLESS_GPU_KEEP_RUNS", "many"),
    ("SERVERLESS_GPU_KEEP_RUNS", "0"),
    ("SERVERLESS_GPU_SYSTEM_METRICS_INTERVAL", "fast"),
    ("SERVERLESS_GPU_SYSTEM_METRICS_INTERVAL", "-1"),
    ("SERVERLESS_GPU_SYSTEM_METRICS_INTERVAL", "nan"),
    ("SERVERLESS_GPU_MLFLOW_FLUSH_INTERVAL", "soon"),
    ("SERVERLESS_GPU_MLFLOW_LOG_UPLOAD_INTERVAL", "-5"),
    ("SERVERLESS_GPU_TYPE", "h100"),
    ("SERVERLESS_GPU_WARMUP", "maybe"),
    ("SERVERLESS_GPU_WIDGET_LINES", "lots"),
    ("SERVERLESS_GPU_DISPLAY", "fancy"),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("name", "value"), BAD_ENVIRONMENT)
def test_bad_environment_variable_is_named_before_anything_is_created(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str, value: str
) -> None:
    runs = tmp_path / "runs"
    monkeypatch.setenv("SERVERLESS_GPU_RUNS_DIR", str(runs))
    cwd = Path.cwd()

    @distributed(timeout=20, standby=False)
    def one() -> int:
        return 1

    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigurationError, match=name) as info:
        one.distributed()
    assert repr(value) in str(info.value)
    assert not runs.exists(), "a run directory (or the launcher's log) was created"
    assert list(cwd.iterdir()) == [], "something (an MLflow store?) was created"


def test_good_environment_values_are_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERVERLESS_GPU_CPU_RANKS", "3")
    monkeypatch.setenv("SERVERLESS_GPU_MAX_PAYLOAD_MB", "0.5")
    monkeypatch.setenv("SERVERLESS_GPU_KEEP_RUNS", "7")

    @distributed(tracking=False)
    def rank(data: bytes) -> int:
        return runtime.get_global_rank()

    assert rank.distributed(b"x" * 1000) == [0, 1, 2]
    with pytest.raises(PayloadTooLargeError, match=r"0\.5 MiB"):
        rank.distributed(b"x" * 2**20)


_NAME = re.compile(r"SERVERLESS_GPU_[A-Z_]+[A-Z]")
_PACKAGE = Path(settings.__file__).parents[1]  # serverless_gpu/
_SOURCES = [
    path
    for root in (_PACKAGE, _PACKAGE.parent / "jupyter_ext")
    for path in sorted(root.rglob("*.py"))
]


def _names_in_code(path: Path) -> set[str]:
    """The SERVERLESS_GPU_* names in ``path``'s string literals; docstrings may mention them
    (they speak to the user), code must take them from settings."""
    tree = ast.parse(path.read_text())
    docs = {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }
    return {
        name
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
        for name in _NAME.findall(node.value)
    }


def test_every_variable_the_package_mentions_is_registered() -> None:
    """A new SERVERLESS_GPU_* variable must be added to settings.py, where start() checks it."""
    named = {name for path in _SOURCES for name in _NAME.findall(path.read_text())}
    known = {var.name for var in settings.USER_SETTINGS + settings.INTERNAL}
    assert named - known == set()


def test_variable_names_are_spelled_only_in_settings() -> None:
    """Every reader and writer takes the name from its settings object (``settings.X.name``,
    ``settings.X.read()``): no second spelling, and no private parser of the value."""
    spelled = {
        str(path.relative_to(_PACKAGE.parent)): sorted(names)
        for path in _SOURCES
        if path != Path(settings.__file__) and (names := _names_in_code(path))
    }
    assert spelled == {}
    by_name = re.compile(r"\.get\(\s*(settings\.)?[A-Z_]+\.name\b|getenv\(")
    parsed = [str(path) for path in _SOURCES if by_name.search(path.read_text())]
    assert parsed == [], "read the value with settings.X.read(environ), not by its name"


def test_internal_variables_read_as_their_writers_wrote_them() -> None:
    environ = {settings.ATTEMPT.name: "2", settings.DEVICE.name: "cpu"}
    assert settings.ATTEMPT.read(environ) == 2
    assert settings.ATTEMPT.read({}) == 0
    assert settings.DEVICE.read(environ) == "cpu"
    assert settings.DEVICE.read({}) == "cuda"
    assert not settings.MLFLOW_RUN_ID.present({})
    assert settings.MLFLOW_RUN_ID.present({settings.MLFLOW_RUN_ID.name: ""})


def test_empty_values_mean_the_default() -> None:
    values = settings.check({var.name: " " for var in settings.USER_SETTINGS})
    assert values == {var.name: var.default for var in settings.USER_SETTINGS}
    assert values["SERVERLESS_GPU_CPU_RANKS"] == 2


def test_a_call_with_empty_variables_uses_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every reader goes through settings: an empty value passes the check and must also be
    the default where it is used (rundirs read KEEP_RUNS with int())."""
    for name in (
        "SERVERLESS_GPU_KEEP_RUNS",
        "SERVERLESS_GPU_RESULTS_DIR",
        "SERVERLESS_GPU_CPU_RANKS",
    ):
        monkeypatch.setenv(name, "")

    @distributed(tracking=False, output="none")
    def rank() -> int:
        return runtime.get_global_rank()

    assert rank.distributed() == [0, 1]


@pytest.mark.parametrize("bad", [float("inf"), math.nan, -1, MAX_GRACE_S + 1, True, "1"])
def test_grace_is_finite_and_capped(bad: Any) -> None:
    with pytest.raises(ConfigurationError, match="grace"):
        distributed(gpus=2, grace=bad, timeout=None)


def test_grace_may_not_exceed_the_timeout() -> None:
    with pytest.raises(ConfigurationError, match="grace"):
        distributed(gpus=2, grace=5, timeout=2)
    distributed(gpus=2, grace=MAX_GRACE_S, timeout=None)
    distributed(gpus=2, grace=0, timeout=1)
    distributed(gpus=2, timeout=0.5)  # the default grace shortens to the timeout


@pytest.mark.parametrize("not_a_function", [5, "hello", None])
def test_non_callables_are_refused_at_decoration(not_a_function: Any) -> None:
    with pytest.raises(UsageError, match="callable"):
        distributed(gpus=2)(not_a_function)


def _generator() -> Any:
    yield 1


async def _coroutine() -> int:
    return 1


async def _async_generator() -> Any:
    yield 1


@pytest.mark.parametrize(
    ("func", "word"),
    [(_generator, "generator"), (_coroutine, "async"), (_async_generator, "async")],
)
def test_generator_and_async_functions_are_refused_with_a_reason(func: Any, word: str) -> None:
    with pytest.raises(UsageError, match=word):
        distributed(gpus=2)(func)
    with pytest.raises(UsageError, match=word):
        distributed(func)


@pytest.mark.parametrize(
    "options",
    [
        {"max_payload_bytes": -5},
        {"max_payload_bytes": 0},
        {"max_payload_bytes": "x"},
        {"max_payload_bytes": True},
        {"max_payload_bytes": 1.5},
        {"standby": "no"},
        {"standby": 0},
        {"tracking": "no"},
        {"tracking": None},
        {"run_name": 5},
    ],
)
def test_option_types_are_checked_at_decoration(options: dict[str, Any]) -> None:
    (field,) = options
    with pytest.raises(ConfigurationError, match=field):
        distributed(gpus=2, **options)


def test_cpu_mode_gpu_count_is_capped() -> None:
    with pytest.raises(ConfigurationError, match=str(MAX_CPU_RANKS)):
        distributed(gpus=10**6, gpu_type="cpu")
    with pytest.raises(ConfigurationError, match=str(MAX_CPU_RANKS)):
        distributed(gpus=MAX_CPU_RANKS + 1)  # CPU mode through SERVERLESS_GPU_TYPE=cpu
    assert issubclass(ConfigurationError, DistributedError)
