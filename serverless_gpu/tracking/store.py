"""The caller's view of the tracking store: where it is, whether it answers, run page links."""

from __future__ import annotations

import hashlib
import os
import shlex
import urllib.error
import urllib.request
from urllib.parse import urlparse

from serverless_gpu.tracking import ui_gate
from serverless_gpu.tracking.settings import PROBE_TIMEOUT_S

_ui_addresses: dict[str, str] = {}
"""Store URI -> address of the MLflow UI this process serves for it (see ``ui()``)."""


def is_http(uri: str) -> bool:
    return urlparse(uri).scheme in ("http", "https")


def reachable(uri: str, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """One request, no retries: does an HTTP tracking server answer at all?

    Any HTTP answer counts (a proxy may want credentials for ``/health``); only a refused,
    unresolvable or silent server does not. Other schemes are assumed reachable.
    """
    if not is_http(uri):
        return True
    try:
        with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout):
            return True
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, OSError):
        return False
    except ValueError:  # a URI urllib cannot parse; let MLflow itself decide
        return True


def ui_address(uri: str) -> str:
    """The web UI showing this store: the server itself, the one ``ui()`` started or found, or
    else where ``ui()`` will serve it (its stable port, unless another user holds that), so a
    link made now works later."""
    if is_http(uri):
        return uri.rstrip("/")
    return _ui_addresses.get(uri) or f"http://127.0.0.1:{_unclaimed_port(uri)}"


def _unclaimed_port(uri: str) -> int:
    """The store's first port that no other user's process listens on: a link never leads
    the user to a page someone else serves."""
    ports = ui_ports(uri)
    for port in ports:
        if ui_gate.listener_uid(port) in (None, os.getuid()):
            return port
    return ports[0]


def ui_served(uri: str) -> bool:
    """Whether a web UI is known to serve this store now (a server, or ``ui()``'s)."""
    return is_http(uri) or uri in _ui_addresses


def set_ui_address(uri: str, address: str | None) -> None:
    if address is None:
        _ui_addresses.pop(uri, None)
    else:
        _ui_addresses[uri] = address


UI_PORT_RANGE = range(5100, 5900)
UI_PORT_TRIES = 5


def ui_ports(uri: str) -> list[int]:
    """The ports ``ui()`` tries for this store, stable one first: the same in every process and
    after a kernel restart, so a saved link works whenever a UI serves the store. The next few
    ports follow in case the first is taken by something else."""
    digest = hashlib.sha256(_canonical(uri).encode()).digest()
    first = int.from_bytes(digest[:4], "big") % len(UI_PORT_RANGE)
    return [UI_PORT_RANGE[(first + k) % len(UI_PORT_RANGE)] for k in range(UI_PORT_TRIES)]


def _canonical(uri: str) -> str:
    """The store's URI with a relative database or folder made absolute (MLflow's default
    ``sqlite:///mlflow.db`` names a different store in every working directory)."""
    parsed = urlparse(uri)
    if (
        parsed.scheme == "sqlite"
        and uri.startswith("sqlite:///")
        and not uri.startswith("sqlite:////")
    ):
        return "sqlite:///" + os.path.abspath(uri.removeprefix("sqlite:///"))
    if parsed.scheme in ("", "file"):
        return os.path.abspath(parsed.path or uri)
    return uri


RUN_PAGE_QUERY = "?workflowType=machine_learning"
"""MLflow 3's UI shows a run under "GenAI > Evaluations" unless the page asks for its
"Model training" view; older UIs ignore the query."""


def run_link(uri: str, experiment_id: str, run_id: str) -> str:
    return f"{ui_address(uri)}/#/experiments/{experiment_id}/runs/{run_id}{RUN_PAGE_QUERY}"


def serve_commands(uri: str, run_id: str) -> tuple[str, str]:
    """The shell commands that serve this store: ours (to this user alone, printing the run's
    page) and MLflow's own (to every local user, on the store's stable port)."""
    ours = f"python -m serverless_gpu.tracking.serve_ui {shlex.quote(uri)} {run_id}"
    theirs = f"mlflow ui --backend-store-uri {shlex.quote(uri)} --port {ui_ports(uri)[0]}"
    return ours, theirs


def open_hint(uri: str, experiment_id: str, run_id: str) -> str:
    """The run and its store, with its page; for a store no web UI serves yet, how to serve it
    from a terminal or a notebook (``ui()``) at that page's address."""
    page = run_link(uri, experiment_id, run_id)
    if ui_served(uri):
        return f"run {run_id} in {uri}: {page}"
    ours, theirs = serve_commands(uri, run_id)
    return (
        f"run {run_id} in {uri}; to see it, run `{ours}` (for you alone; or `{theirs}`, "
        f"open to every local user) and open {page} (in Python: serverless_gpu.tracking.ui())"
    )
