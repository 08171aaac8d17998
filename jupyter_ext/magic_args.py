"""Reusable argument groups for the magics, in IPython's ``magic_arguments`` style.

``gpus=2 gpu_type=cpu`` (the decorator's keyword spelling) and ``--gpus 2 --gpu-type cpu`` are
both accepted: ``key=value`` words are rewritten to options before parsing.
"""

from __future__ import annotations

import argparse
import keyword
import re
import shlex
from collections.abc import Callable, Collection, Iterator
from typing import Any, TypeVar

from IPython.core.error import UsageError
from IPython.core.magic_arguments import argument

from serverless_gpu.common.options import MAGIC, SWITCH, Declared, declared
from serverless_gpu.wire.config import DistributedConfig

F = TypeVar("F", bound=Callable[..., Any])
_KEY_VALUE = re.compile(r"^([A-Za-z_][A-Za-z0-9_-]*)=(.*)$", re.DOTALL)


class _Choices:
    """An option's words, read when a cell is parsed: ``--backend`` takes the backend plug-ins
    installed by then (``serverless_gpu.backends.registry``)."""

    def __init__(self, choices: Callable[[], Collection[str]]) -> None:
        self._choices = choices

    def __contains__(self, word: object) -> bool:
        return word in self._choices()

    def __iter__(self) -> Iterator[str]:
        return iter(self._choices())


def _typed(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """The option's parser, its ``ValueError`` as argparse's own error (its words kept)."""

    def typed(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    typed.__name__ = getattr(parse, "__name__", "value")
    return typed


def identifier(text: str) -> str:
    if not text.isidentifier() or keyword.iskeyword(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a valid Python name")
    return text


def _apply(func: F, *decorators: Callable[[F], F]) -> F:
    # magic_arguments collects arguments bottom-up; apply in reverse so help lists them in order.
    for decorate in reversed(decorators):
        func = decorate(func)
    return func


def _argument(option: Declared) -> Callable[[F], F]:
    """The flag of one declared option: ``--gpu-type`` (and ``--gpu_type``, the spelling a
    ``gpu_type=`` word becomes), a switch as ``--remote`` or, on by default, ``--no-tracking``."""
    kind = option.kind
    names = [option.flag]
    if not option.option.flag and "_" in option.name:
        names.append("--" + option.name)
    common: dict[str, Any] = {"dest": option.name, "help": option.option.help}
    if kind is SWITCH and option.default is True:
        return argument(f"--no-{option.flag[2:]}", action="store_false", **common)
    if kind is SWITCH:
        common.update(nargs="?", const=True)
    if kind.choices is not None:
        return argument(*names, choices=_Choices(kind.choices), default=option.default, **common)
    return argument(*names, type=_typed(kind.parse), default=option.default, **common)


def option_arguments(func: F) -> F:
    """The flags of every option declared for the magic (``common/options.py``)."""
    return _apply(func, *(_argument(o) for o in declared(DistributedConfig, MAGIC)))


def config_options(args: argparse.Namespace) -> dict[str, Any]:
    """The declared options' values a parsed line holds, by name."""
    return {o.name: getattr(args, o.name) for o in declared(DistributedConfig, MAGIC)}


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
