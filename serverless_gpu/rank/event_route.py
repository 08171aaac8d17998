"""Where a rank's events go when they must not wait for the backend's own path: a remote
session's rank (``session_loop.serve`` over TCP) sends them in its connection to the caller, so
a cell's output and its answer arrive together and at once. A backend that batches its ranks'
events (Ray's actors) sends them here while a route is set."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

_route: Callable[[list[Any]], None] | None = None
_lock = threading.Lock()


def set_route(send: Callable[[list[Any]], None] | None) -> None:
    global _route
    with _lock:
        _route = send


def current() -> Callable[[list[Any]], None] | None:
    return _route
