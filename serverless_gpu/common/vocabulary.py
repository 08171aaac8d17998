"""How a message names an option: in the words of the entry point the user came in by.

"pass gpu_type='cpu'" is right for ``@distributed`` and wrong for the command line, where it
reads ``--gpu-type cpu``, and for ``TorchDistributor``, where it reads ``use_gpu=False``. Every
message that names an option asks :func:`option` (or :func:`option_name`) for its spelling; an
entry point other than the decorator says which it is with :func:`speaking` around its work.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator

DECORATOR = "decorator"
CLI = "cli"
TORCH_DISTRIBUTOR = "torch_distributor"


class Placeholder(str):
    """A value a hint leaves to the user (``N``): written as it is, never quoted."""

    def __repr__(self) -> str:
        return str(self)


def _is_cpu(value: object) -> bool:
    return str(getattr(value, "value", value)).lower() == "cpu"


_NAMES: dict[str, dict[str, str]] = {
    CLI: {
        "gpus": "--gpus",
        "gpu_type": "--gpu-type",
        "remote": "--remote",
        "max_retries": "--max-retries",
    },
    TORCH_DISTRIBUTOR: {"gpus": "num_processes", "gpu_type": "use_gpu", "remote": "local_mode"},
}
_VALUES: dict[str, dict[str, Callable[[object], object]]] = {
    TORCH_DISTRIBUTOR: {"gpu_type": lambda kind: not _is_cpu(kind), "remote": lambda on: not on},
}
"""How a value of the decorator's option reads as the value of the entry point's own."""

_entry_point: contextvars.ContextVar[str] = contextvars.ContextVar(
    "serverless_gpu_entry_point", default=DECORATOR
)


@contextlib.contextmanager
def speaking(entry_point: str) -> Iterator[None]:
    """Messages raised inside name options as ``entry_point`` (:data:`CLI` ...) spells them."""
    token = _entry_point.set(entry_point)
    try:
        yield
    finally:
        _entry_point.reset(token)


def option_name(name: str) -> str:
    """The decorator's option ``name`` (``"gpu_type"``) as the current entry point calls it."""
    return _NAMES.get(_entry_point.get(), {}).get(name, name)


def option(name: str, value: object) -> str:
    """The decorator's option ``name`` set to ``value`` (``gpu_type='cpu'``), as the current
    entry point writes it (``--gpu-type cpu``, ``use_gpu=False``)."""
    entry_point = _entry_point.get()
    spelled = option_name(name)
    value = _VALUES.get(entry_point, {}).get(name, lambda same: same)(value)
    if entry_point != CLI or spelled == name:
        return f"{spelled}={value!r}"
    if value is True:
        return spelled
    return f"no {spelled}" if value is None or value is False else f"{spelled} {value}"
