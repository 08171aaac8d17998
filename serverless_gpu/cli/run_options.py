"""``serverless-gpu run``'s options that are options of the call, made from their declarations
(``common/options.py``): one click option each, and what the command line sets of the job."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import click

from serverless_gpu.common.options import CLI, JOB_FILE, SWITCH, Declared, declared
from serverless_gpu.wire.config import DistributedConfig

F = TypeVar("F", bound=Callable[..., Any])


class _Parsed(click.ParamType):
    """A word parsed as the option's declaration says; its ``ValueError`` is click's error."""

    def __init__(self, option: Declared) -> None:
        self.name = option.kind.metavar
        self._parse = option.kind.parse

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value
        try:
            return self._parse(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def _option(option: Declared) -> Callable[[F], F]:
    """The click option of one declaration. An option of job files has no default here (the
    job's applies); a switch on by default is ``--x/--no-x``."""
    kind, help = option.kind, option.option.help
    default = None if JOB_FILE in option.option.on else option.default
    if kind is SWITCH:
        flag = f"{option.flag}/--no-{option.flag[2:]}" if option.default else option.flag
        return click.option(flag, option.name, is_flag=True, default=default, help=help)
    if kind.choices is not None:
        choices = click.Choice(list(kind.choices()))
        return click.option(
            option.flag, option.name, type=choices, default=default, show_default=True, help=help
        )
    return click.option(option.flag, option.name, type=_Parsed(option), default=default, help=help)


def option_flags(command: F) -> F:
    """Every option declared for the command line, in declaration order."""
    for option in reversed(list(declared(DistributedConfig, CLI))):
        command = _option(option)(command)
    return command


def job_options() -> Iterator[Declared]:
    """The command line's options that set a job file's key (``--gpus`` overrides ``gpus``)."""
    return (o for o in declared(DistributedConfig, CLI) if JOB_FILE in o.option.on)


def job_value(option: Declared, value: Any) -> Any:
    """The command line's value as the job file's key holds it (``--timeout`` in minutes)."""
    unit = option.option.job_unit
    return value / unit if value is not None and unit != 1 else value
