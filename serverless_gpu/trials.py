"""One trial of a sweep: the arguments an item stands for, and their names as MLflow params."""

from __future__ import annotations

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


def trial_params(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, str]:
    """The trial's arguments by name (``arg0`` ... for positional ones), as short strings."""
    named = {f"arg{i}": value for i, value in enumerate(args)} | kwargs
    return {str(k): _short(repr(v) if not isinstance(v, str) else v) for k, v in named.items()}


def _short(text: str) -> str:
    return text if len(text) <= _PARAM_CHARS else text[: _PARAM_CHARS - 3] + "..."
