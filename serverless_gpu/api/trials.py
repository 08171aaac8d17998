"""One trial of a sweep: the arguments an item stands for, and their names as MLflow params."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

_PARAM_CHARS = 500
"""Longest parameter value recorded (MLflow stores params as short strings)."""


def trial_arguments(item: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``(args, kwargs)`` of one item: a dict is keyword arguments, a tuple positional ones,
    anything else the single positional argument."""
    if isinstance(item, dict):
        return (), dict(item)
    if isinstance(item, tuple):
        return item, {}
    return (item,), {}


def trial_params(
    args: tuple[Any, ...], kwargs: dict[str, Any], func: Callable[..., Any] | None = None
) -> dict[str, str]:
    """The trial's arguments by the function's own parameter names, as short strings (the
    arguments given; defaults are left out). Positional arguments the signature cannot name
    (no signature, or too many) read ``arg0`` ..."""
    return {
        str(k): _short(repr(v) if not isinstance(v, str) else v)
        for k, v in _named(args, kwargs, func).items()
    }


def _named(
    args: tuple[Any, ...], kwargs: dict[str, Any], func: Callable[..., Any] | None
) -> dict[str, Any]:
    if func is not None and args:
        try:
            return dict(inspect.signature(func).bind_partial(*args, **kwargs).arguments)
        except (TypeError, ValueError):  # no signature, or arguments it does not take
            pass
    return {f"arg{i}": value for i, value in enumerate(args)} | kwargs


def _short(text: str) -> str:
    return text if len(text) <= _PARAM_CHARS else text[: _PARAM_CHARS - 3] + "..."
