"""Backends as plug-ins: each is a :class:`BackendPlugin`, found by name.

A backend is a package with an entry point in the group ``serverless_gpu.backends``
(``pyproject.toml``: ``[project.entry-points."serverless_gpu.backends"]``,
``mybackend = "my_package.plugin:PLUGIN"``); ``DistributedConfig(backend="mybackend")`` (and so
``@distributed(backend="mybackend")``) names it, and nothing else in the library needs to know
it. ``local`` and ``ray`` are the built-ins (``common/backend_names.py``). A plug-in is loaded
(its module imported) the first time its name is looked up; importing this module imports none,
and Ray is imported by the Ray backend's calls only.
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from serverless_gpu.common import backend_names
from serverless_gpu.common.errors import ConfigurationError

if TYPE_CHECKING:
    from serverless_gpu.backends.base import Backend
    from serverless_gpu.common.gpus import Placement
    from serverless_gpu.wire.config import DistributedConfig


@dataclass(frozen=True)
class BackendPlugin:
    """One backend, as the library sees it."""

    name: str
    backend: Callable[[DistributedConfig], Backend]
    """The :class:`~serverless_gpu.backends.base.Backend` that runs a call of this config."""
    placement: Callable[[DistributedConfig], Placement]
    """Where the call's ranks go, found before anything of the run is created (a backend that
    needs a cluster connects here, so that a missing one fails first)."""
    shutdown: Callable[[], None]
    """Stop every call and helper this backend started in this process (``shutdown()``)."""
    sessions: bool = False
    """Runs a :class:`~serverless_gpu.Session` (ranks kept between cells)."""
    session_host: Callable[[], str] | None = None
    """Where ranks may be on other machines: the address they reach the caller at (a session's
    cells then travel over TCP, ``caller/session_links.py``); None: FIFOs on this machine."""
    stacks: bool = False
    """Takes the ranks' Python stacks on request (``handle.stacks()``)."""
    standby: bool = False
    """Prepares ranks ahead of the first call (``standby=True`` warms up at decoration)."""


_loaded: dict[str, BackendPlugin] = {}
_lock = threading.RLock()  # a plug-in may look another up as it loads


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.RLock()  # another thread may have held it at the fork


os.register_at_fork(after_in_child=_after_fork_in_child)


def names() -> tuple[str, ...]:
    """Every backend that can be named: the built-ins, then the installed plug-ins."""
    return backend_names.known_names()


def plugin(name: str) -> BackendPlugin:
    """The plug-in of this name, loaded the first time it is asked for."""
    with _lock:
        found = _loaded.get(name)
        if found is None:
            found = _loaded[name] = _load(name)
        return found


def for_config(config: DistributedConfig) -> BackendPlugin:
    """The plug-in that runs this config's calls."""
    return plugin(config.backend_name)


def loaded() -> list[BackendPlugin]:
    """The plug-ins this process has looked up, the default one first (a warm-up starts it
    without a lookup)."""
    plugin(backend_names.DEFAULT)
    with _lock:
        return list(_loaded.values())


def shutdown_all() -> None:
    """Stop what every loaded backend started; a backend never used is not imported."""
    for each in loaded():
        each.shutdown()


def _load(name: str) -> BackendPlugin:
    builtin = backend_names.BUILTINS.get(name)
    entry = None if builtin is not None else backend_names.installed().get(name)
    if builtin is not None:
        found = _object_at(builtin)
    elif entry is not None:
        found = entry.load()
    else:
        known = backend_names.names_text(names())
        raise ConfigurationError(f"backend must be {known}, not {name!r}")
    if not isinstance(found, BackendPlugin):
        raise ConfigurationError(
            f"the backend {name!r} ({entry.value if entry else builtin}) is not a BackendPlugin "
            f"(serverless_gpu.backends.registry) but {type(found).__name__}"
        )
    if found.name != name:
        raise ConfigurationError(
            f"the backend plug-in named {name!r} calls itself {found.name!r}: the names must agree"
        )
    return found


def _object_at(value: str) -> object:
    """``"package.module:NAME"``, as an entry point's value, loaded."""
    module, _, attribute = value.partition(":")
    return getattr(importlib.import_module(module), attribute)
