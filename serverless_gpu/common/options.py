"""Options declared once: each field of ``DistributedConfig`` (``wire/config.py``) is one option,
and :func:`option` gives it what the other entry points need to offer it (ipyparallel's
traitlets idea): its help text, the surfaces it appears on, its command-line spelling and how
a word of text becomes its value.

From these declarations come the ``%%distributed`` magic's flags (``jupyter_ext/magic_args.py``),
the ``serverless-gpu run`` options (``cli/app.py``) and the job file's keys (``cli/jobfile.py``).
``@distributed`` takes every field as a keyword; those declared :data:`SIGNATURE` are named in
its signature, for IDEs (``tests/core/test_options.py`` holds the two to each other). A new
option is one field here plus its effect (docs/architecture.md, "Adding an option").

The value itself is checked once, by ``DistributedConfig.__post_init__``, whatever the entry
point; :attr:`Option.parse` only turns a command line's word into that value.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from typing import Any

from serverless_gpu.common.errors import ConfigurationError

SIGNATURE = "signature"
"""Named in ``@distributed``'s and ``with_overrides``' signatures (every field is a keyword)."""
MAGIC = "magic"
"""A flag of ``%%distributed`` (``--gpus 2`` or ``gpus=2``)."""
CLI = "cli"
"""An option of ``serverless-gpu run``."""
JOB_FILE = "job file"
"""A key of a job file (``serverless-gpu run -f job.yaml``); the command line's option, when it
has one, overrides it."""
SURFACES = (SIGNATURE, MAGIC, CLI, JOB_FILE)

_METADATA_KEY = "serverless_gpu.option"


@dataclass(frozen=True)
class Kind:
    """How a command line's word becomes an option's value, and the type of a job file's."""

    parse: Callable[[str], Any]
    """The value of a word; ``ValueError`` says what is wrong (each surface words its error)."""
    schema: type
    """The type a job file's value has (``None`` allowed where the option allows it)."""
    bounds: dict[str, Any] = dataclasses.field(default_factory=dict)
    """A job file's limits, as pydantic names them (``{"ge": 1}``)."""
    choices: Callable[[], Collection[str]] | None = None
    """The words allowed, read when a line is parsed (backend plug-ins install later)."""
    none_word: bool = False
    """``none`` means ``None`` (no limit)."""
    metavar: str = "TEXT"
    """How a command line's help names the word."""


@dataclass(frozen=True)
class Option:
    """What a field of ``DistributedConfig`` is on the surfaces other than the decorator."""

    help: str
    on: frozenset[str]
    kind: Kind | None = None
    flag: str = ""
    """The ``--spelling`` of the magic and the command line; default: the name, dashed."""
    job_key: str = ""
    """The job file's key; default: the name."""
    job_unit: float = 1.0
    """A job file's value times this is the option's (``timeout_minutes``: 60)."""


@dataclass(frozen=True)
class Declared:
    """One option as declared: its name, its default and what :func:`option` said of it."""

    name: str
    default: Any
    option: Option

    @property
    def flag(self) -> str:
        return self.option.flag or "--" + self.name.replace("_", "-")

    @property
    def job_key(self) -> str:
        return self.option.job_key or self.name

    @property
    def kind(self) -> Kind:
        assert self.option.kind is not None, f"{self.name}: no kind, so no command-line form"
        return self.option.kind


def option(
    default: Any,
    help: str,
    on: Collection[str] = (),
    kind: Kind | None = None,
    **spelling: Any,
) -> Any:
    """A field of ``DistributedConfig``: its default, and the option it is elsewhere. Typed
    ``Any`` (as :func:`dataclasses.field`) so that the field keeps its own annotation."""
    unknown = set(on) - set(SURFACES)
    assert not unknown, f"unknown surfaces {unknown}"
    assert kind is not None or not set(on) - {SIGNATURE}, "a command-line form needs a kind"
    meta = Option(help=help, on=frozenset(on), kind=kind, **spelling)
    return dataclasses.field(default=default, metadata={_METADATA_KEY: meta})


def declared(config_type: type, surface: str | None = None) -> Iterator[Declared]:
    """The options of ``config_type`` (``DistributedConfig``) in field order; those on
    ``surface`` only, when it is given. A field made without :func:`option` is the
    decorator's only."""
    for field in dataclasses.fields(config_type):
        meta = field.metadata.get(_METADATA_KEY)
        if meta is None:
            meta = Option(help="", on=frozenset())
        if surface is None or surface in meta.on:
            yield Declared(field.name, field.default, meta)


def check_names(config_type: type, options: Collection[str], where: str) -> None:
    """Refuse keywords that name no option of ``config_type``."""
    unknown = set(options) - {field.name for field in dataclasses.fields(config_type)}
    if unknown:
        raise ConfigurationError(f"unknown option(s) for {where}: {', '.join(sorted(unknown))}")


# -- kinds --------------------------------------------------------------------------------------


def _int_at_least(text: str, low: int, words: str) -> int:
    """``text`` as an integer of at least ``low``; ``words`` say what was expected."""
    try:
        value = int(text)
    except ValueError:
        value = low - 1
    if value < low:
        raise ValueError(f"expected {words}, not {text!r}")
    return value


def _positive_int(text: str) -> int:
    return _int_at_least(text, 1, "a positive integer")


def _count(text: str) -> int:
    return _int_at_least(text, 0, "a whole number >= 0")


def _seconds(text: str) -> float | None:
    if text.lower() in ("none", "inf"):
        return None
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"expected seconds, not {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"expected a positive number of seconds, not {text!r}")
    return value


def _bool(text: str) -> bool:
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise ValueError(f"expected True or False, not {text!r}")


def _text(text: str) -> str:
    return text


POSITIVE_INT = Kind(_positive_int, int, {"ge": 1}, metavar="N")
COUNT = Kind(_count, int, {"ge": 0}, metavar="N")
SECONDS = Kind(_seconds, float, {"gt": 0}, none_word=True, metavar="SECONDS")
"""A positive number of seconds, or ``none`` (``inf``): no limit."""
SWITCH = Kind(_bool, bool)
"""True or False: a flag that turns on (``--remote``) or, when on by default, off
(``--no-tracking``)."""
TEXT = Kind(_text, str)


def choice(choices: Callable[[], Collection[str]]) -> Kind:
    """One of the words ``choices()`` gives when a line is parsed."""
    return Kind(_text, str, choices=choices)
