"""One trial of a sweep: the arguments an item stands for, and their names as MLflow params."""

from __future__ import annotations

import inspect
import reprlib
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


class _Bounded(reprlib.Repr):
    """``reprlib``'s bounded ``repr``, which still writes out bytes whole before cutting."""

    def repr_bytes(self, obj: bytes, level: int) -> str:
        return f"<{len(obj)} bytes>"

    repr_bytearray = repr_bytes


_BOUNDED = _Bounded()
_BOUNDED.maxstring = _BOUNDED.maxother = _BOUNDED.maxlong = _PARAM_CHARS
_BOUNDED.maxlist = _BOUNDED.maxtuple = _BOUNDED.maxdict = _BOUNDED.maxset = 20


def call_params(
    args: tuple[Any, ...], kwargs: dict[str, Any], func: Callable[..., Any] | None = None
) -> dict[str, str]:
    """A call's arguments by the function's own parameter names, as short strings (the
    arguments given; defaults are left out): a run's ``params``, as the original API records
    them, and a sweep trial's MLflow params. Positional arguments the signature cannot name
    (no signature, or too many) read ``arg0`` ... Each value is a bounded ``repr``: a large
    container costs a few dozen items' worth of text on every call, not its whole length."""
    return {
        str(k): _short(v if isinstance(v, str) else _BOUNDED.repr(v))
        for k, v in _named(args, kwargs, func).items()
    }


trial_params = call_params


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
