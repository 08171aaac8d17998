"""What both job-file formats (ours, :mod:`.jobfile`; the ``air`` CLI's, :mod:`.airjob`) share:
the default timeout and the checked field types of their environment variables and arguments."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator
from pydantic_core import PydanticCustomError

from serverless_gpu.wire.config import DEFAULT_TIMEOUT

DEFAULT_TIMEOUT_S = DEFAULT_TIMEOUT
"""A run's timeout unless the command line or the job file says otherwise (``none``: no limit):
a hung nightly job must not run forever."""


def _as_text(value: Any) -> Any:
    """YAML reads ``2`` and ``0.1`` as numbers; arguments and variables are strings."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return value


Text = Annotated[str, BeforeValidator(_as_text)]


def _env_name(name: str) -> str:
    if not name or "=" in name or "\0" in name:
        raise PydanticCustomError(
            "env_name",
            "{name} is not a variable name (no '=', no NUL, not empty)",
            {"name": repr(name)},
        )
    return name


def _env_value(value: str) -> str:
    if "\0" in value:
        raise PydanticCustomError("env_value", "a value cannot hold a NUL character", {})
    return value


EnvName = Annotated[str, AfterValidator(_env_name)]
EnvValue = Annotated[Text, AfterValidator(_env_value)]
