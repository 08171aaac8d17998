"""A result in a few words, as the console, the widget and the run's summary show it."""

from __future__ import annotations

from typing import Any

_SHOWN = 60
"""Characters of a description at most (a long string's value is cut)."""


def describe_value(value: Any) -> str:
    """A short type-and-shape description: ``Tensor (2, 3) torch.float32``, ``list[4]``,
    ``int 3``. Never raises: a value whose ``shape`` or ``len`` fails is named by its type."""
    try:
        return _describe(value)
    except Exception:  # a result whose .shape raises is still a result
        return type(value).__name__


def _describe(value: Any) -> str:
    kind = type(value).__name__
    shape = getattr(value, "shape", None)
    if shape is not None and not callable(shape):
        try:
            dims = tuple(int(d) for d in shape)
        except (TypeError, ValueError):  # symbolic or odd shapes: show them as they print
            dims = None
        dtype = getattr(value, "dtype", None)
        return " ".join(filter(None, [kind, str(dims if dims is not None else shape), str(dtype)]))
    if isinstance(value, (list, tuple, dict, set, frozenset)):
        return f"{kind}[{len(value)}]"
    if isinstance(value, (bool, int, float, complex, str, bytes)) or value is None:
        text = f"{kind} {value!r}"
        return text if len(text) <= _SHOWN else text[: _SHOWN - 1] + "\u2026"
    return kind


def type_name(kind: type[BaseException] | str) -> str:
    """``builtins.ValueError``: how ``retry_on`` names a type."""
    return kind if isinstance(kind, str) else f"{kind.__module__}.{kind.__qualname__}"
