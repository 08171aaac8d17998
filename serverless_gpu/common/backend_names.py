"""Which backends exist, by name: the built-ins, and those installed packages declare as entry
points of the group ``serverless_gpu.backends`` (``name = "package.module:PLUGIN"``, a
:class:`~serverless_gpu.backends.registry.BackendPlugin`). Names only: nothing is loaded here,
so that the config (a lower layer than the backends) can check a name.

The built-ins are known here too, not only from the installed metadata, which may be older
than the code (an editable install): they resolve whatever the metadata says, and an entry
point of another package cannot take their name (``backends/registry.py`` warns and keeps the
built-in).
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from importlib import metadata

GROUP = "serverless_gpu.backends"
DEFAULT = "local"
BUILTINS: dict[str, str] = {
    "local": "serverless_gpu.backends.local:PLUGIN",
    "ray": "serverless_gpu.backends.ray.plugin:PLUGIN",
}
"""The built-in backends' plug-ins, spelled as their entry points are (pyproject.toml)."""


def installed() -> dict[str, metadata.EntryPoint]:
    """The group's entry points by name, as the installed packages declare them now (read
    each time: a package installed while the process runs is found); the first of a name wins,
    as ``sys.path`` orders them. One that takes a built-in's name for another object is left
    out, with a warning: the name stays the built-in's."""
    from importlib import metadata  # only when a name is not a built-in's: not in every process

    found: dict[str, metadata.EntryPoint] = {}
    for entry in metadata.entry_points(group=GROUP):
        builtin = BUILTINS.get(entry.name)
        if builtin is not None and entry.value != builtin:
            warnings.warn(
                f"the backend plug-in {entry.value!r} (entry point {entry.name!r} of the group "
                f"{GROUP!r}) takes the name of a built-in backend: it is ignored, and "
                f"{entry.name!r} is the built-in one; give the plug-in another name",
                RuntimeWarning,
                stacklevel=2,
            )
            continue
        found.setdefault(entry.name, entry)
    return found


def known_names() -> tuple[str, ...]:
    """The built-ins first, then the installed plug-ins' names, sorted."""
    return (*BUILTINS, *sorted(set(installed()) - set(BUILTINS)))


def is_known(name: str) -> bool:
    """``name`` is a built-in or an installed plug-in (the entry points are read only for a
    name that is not a built-in)."""
    return name in BUILTINS or name in installed()


def names_text(names: tuple[str, ...]) -> str:
    """``'local', 'ray' or 'x'``: the names for a message."""
    quoted = [repr(n) for n in names]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"
