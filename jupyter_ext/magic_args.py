"""Reusable argument groups for the magics, in IPython's ``magic_arguments`` style.

``gpus=2 gpu_type=cpu`` (the decorator's keyword spelling) and ``--gpus 2 --gpu-type cpu`` are
both accepted: ``key=value`` words are rewritten to options before parsing.
"""

from __future__ import annotations

import argparse
import keyword
import math
import re
import shlex
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from IPython.core.error import UsageError
from IPython.core.magic_arguments import argument

from serverless_gpu.api.decorator import DEFAULT_TIMEOUT
from serverless_gpu.common import backend_names
from serverless_gpu.wire.config import OUTPUT_CHOICES

F = TypeVar("F", bound=Callable[..., Any])
_KEY_VALUE = re.compile(r"^([A-Za-z_][A-Za-z0-9_-]*)=(.*)$", re.DOTALL)


class _KnownBackends:
    """``--backend``'s choices, read when a cell is parsed: the built-ins and the backend
    plug-ins installed now (``serverless_gpu.backends.registry``)."""

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and backend_names.is_known(name)

    def __iter__(self) -> Iterator[str]:
        return iter(backend_names.known_names())


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, not {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, not {text!r}")
    return value


def _timeout(text: str) -> float | None:
    if text.lower() in ("none", "inf"):
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, not {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, not {text!r}")
    return value


def _bool(text: str) -> bool:
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected True or False, not {text!r}")


def identifier(text: str) -> str:
    if not text.isidentifier() or keyword.iskeyword(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a valid Python name")
    return text


def _apply(func: F, *decorators: Callable[[F], F]) -> F:
    # magic_arguments collects arguments bottom-up; apply in reverse so help lists them in order.
    for decorate in reversed(decorators):
        func = decorate(func)
    return func


def placement_arguments(func: F) -> F:
    """``--gpus``, ``--gpu-type``, ``--remote`` and ``--backend``: where the ranks run."""
    return _apply(
        func,
        argument("--gpus", type=_positive_int, default=None, help="Ranks to start (one per GPU)."),
        argument(
            "--gpu-type",
            "--gpu_type",
            dest="gpu_type",
            default=None,
            help="Expected accelerator (H100, A100, ..., or cpu for CPU ranks).",
        ),
        argument(
            "--remote",
            type=_bool,
            nargs="?",
            const=True,
            default=False,
            help="Run on the connected Ray cluster (remote=True).",
        ),
        argument(
            "--backend",
            choices=_KnownBackends(),
            default=None,
            help="Where ranks run: this machine (local), the Ray cluster (ray), or an installed "
            "backend plug-in.",
        ),
    )


def run_arguments(func: F) -> F:
    """``--timeout``, ``--name``, ``--no-tracking``, ``--output``: how the run goes and shows."""
    return _apply(
        func,
        argument(
            "--timeout",
            type=_timeout,
            default=DEFAULT_TIMEOUT,
            help="Seconds before every rank is killed ('none' for no limit).",
        ),
        argument("--name", default=None, help="Run name (MLflow); defaults to the cell's name."),
        argument(
            "--no-tracking",
            dest="tracking",
            action="store_false",
            help="Do not record this run in MLflow.",
        ),
        argument(
            "--output",
            choices=OUTPUT_CHOICES,
            default="default",
            help="Which rank output the text display prints.",
        ),
    )


def result_arguments(func: F) -> F:
    """``--out NAME``: bind the list of per-rank values to a notebook variable."""
    return _apply(
        func,
        argument(
            "--out",
            "-o",
            type=identifier,
            default=None,
            help="Store the list of every rank's value in this variable.",
        ),
    )


def normalize(line: str) -> list[str]:
    """``gpus=2 gpu_type=cpu`` -> ``--gpus 2 --gpu_type cpu``; other words are kept."""
    try:
        words = shlex.split(line)
    except ValueError as exc:  # unbalanced quotes
        raise UsageError(f"cannot split the arguments: {exc}") from None
    out: list[str] = []
    for word in words:
        match = _KEY_VALUE.match(word)
        if match and not word.startswith("-"):
            out += [f"--{match.group(1)}", match.group(2)]
        else:
            out.append(word)
    return out


def parse(magic: Callable[..., Any], line: str) -> argparse.Namespace:
    """Parse the magic's line; a mistake raises ``UsageError`` carrying the usage text."""
    parser = magic.parser  # type: ignore[attr-defined]  # set by @magic_arguments
    try:
        args: argparse.Namespace = parser.parse_args(normalize(line))
        return args
    except UsageError as exc:
        raise UsageError(f"{exc}\n\n{usage(magic)}") from None


def usage(magic: Callable[..., Any]) -> str:
    parser = getattr(magic, "parser", None)
    return parser.format_usage().strip() if parser is not None else ""
