"""``--override`` as the ``air`` CLI takes it: several ``KEY=VALUE`` items after one flag
(``--override a=1 b=2``), and, in a file of air's format, each value typed as the value it
replaces (a key the file does not set, or sets to a string, gets the text as it was written:
``env_variables.MY_FLAG=off`` stays ``"off"``)."""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from typing import Any

OVERRIDE = "--override"


def variadic_overrides(args: Sequence[str], takes_value: set[str]) -> list[str]:
    """``args`` with ``--override`` repeated before each further ``KEY=VALUE`` that follows
    one: ``--override a=1 b=2`` -> ``--override a=1 --override b=2``. Only among the command's
    own options: from the first positional (the script, or the job file) or ``--`` on, the
    arguments are left as they are (they are the script's)."""
    out: list[str] = []
    rest = list(args)
    while rest:
        token = rest.pop(0)
        out.append(token)
        if token == "--" or not token.startswith("-"):
            break
        name, has_value, _ = token.partition("=")
        if name in takes_value and not has_value and rest:
            out.append(rest.pop(0))
        if name == OVERRIDE:
            while rest and "=" in rest[0] and not rest[0].startswith("-"):
                out += [OVERRIDE, rest.pop(0)]
    return out + rest


def air_overrides(data: dict[str, Any], overrides: Sequence[str]) -> list[str]:
    """The items for a file of air's format, each rewritten so that YAML reads its value as
    air types it: the text itself (quoted) where the file has no value or a string there,
    read as YAML (``2`` a number, ``false`` a boolean) where it has another type."""
    data = copy.deepcopy(data)
    typed = []
    for item in overrides:
        key, sep, text = item.partition("=")
        if sep and not isinstance(_current(data, key.strip().split(".")), (str, type(None))):
            typed.append(item)
        elif sep:
            typed.append(f"{key}={json.dumps(text)}")  # a JSON string is a YAML string
        else:
            typed.append(item)  # apply_overrides says what is wrong with it
    return typed


def _current(data: Any, parts: list[str]) -> Any:
    for part in parts:
        if not isinstance(data, dict):
            return None
        data = data.get(part)
    return data
