"""The caller's view of the tracking store: where it is, whether it answers, run page links."""

from __future__ import annotations

import shlex
import urllib.error
import urllib.request
from urllib.parse import urlparse

from .settings import PROBE_TIMEOUT_S

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


def ui_address(uri: str) -> str | None:
    """The web UI showing this store: the server itself, or the one ``ui()`` started."""
    if is_http(uri):
        return uri.rstrip("/")
    return _ui_addresses.get(uri)


def set_ui_address(uri: str, address: str | None) -> None:
    if address is None:
        _ui_addresses.pop(uri, None)
    else:
        _ui_addresses[uri] = address


def run_link(uri: str, experiment_id: str, run_id: str) -> str | None:
    base = ui_address(uri)
    if base is None:
        return None
    return f"{base}/#/experiments/{experiment_id}/runs/{run_id}"


MLFLOW_UI_DEFAULT = "http://127.0.0.1:5000"
"""Where ``mlflow ui`` serves when given no ``--port``."""


def open_hint(uri: str, experiment_id: str, run_id: str) -> str:
    """For a store no web UI serves yet: the run, and how to see its page from a terminal
    (MLflow's own command) or a notebook (``ui()``)."""
    page = f"{MLFLOW_UI_DEFAULT}/#/experiments/{experiment_id}/runs/{run_id}"
    return (
        f"run {run_id} in {uri}; to see it, run `mlflow ui --backend-store-uri "
        f"{shlex.quote(uri)}` and open {page} (in Python: serverless_gpu.tracking.ui())"
    )
