"""What tracking writes on this machine is readable by the user only: the SQLite store it
creates (with its default artifact folder) and the per-rank logs it uploads as artifacts, which
come from a private run directory. A store or folder that already exists keeps its modes."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from urllib.parse import urlparse

_FILE = 0o600
_DIR = 0o700

OPENING = threading.Lock()
"""Held while this process makes a store or opens one for the first time (MLflow creates a new
SQLite store's tables when it opens it): the warm-up's early open (``hook.prepare_ahead``) never
meets a call's store half made."""


def create_private_store(uri: str) -> None:
    """Before MLflow creates a new SQLite store: the database file, and the folder where
    MLflow will put its artifacts, made private (a file MLflow finds empty is a new store)."""
    path = sqlite_path(uri)
    if path is None:
        return
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, _FILE)
    except OSError:  # it exists (keep it as it is), or MLflow will report the problem
        return
    os.close(fd)
    root = local_path(client_artifact_root())
    if root is not None:
        try:
            root.mkdir(mode=_DIR)
        except OSError:
            pass  # it exists already: not ours to change


def make_private(path: Path) -> None:
    """An artifact file we uploaded into a local artifact folder, and its folder."""
    try:
        os.chmod(path, _FILE, follow_symlinks=False)
        os.chmod(path.parent, _DIR)
    except (OSError, NotImplementedError):
        pass


def client_artifact_root() -> str:
    """Where an MLflow client in this process puts the artifacts of a database store it creates."""
    from mlflow.store.tracking import DEFAULT_LOCAL_FILE_AND_ARTIFACT_PATH
    from mlflow.utils.uri import resolve_uri_if_local

    # The variable MLflow's own store factory reads before falling back to ./mlruns.
    root = os.environ.get("_MLFLOW_SERVER_ARTIFACT_ROOT", DEFAULT_LOCAL_FILE_AND_ARTIFACT_PATH)
    return str(resolve_uri_if_local(root))


def sqlite_path(uri: str) -> Path | None:
    if not uri.startswith("sqlite:///"):
        return None
    path = uri.removeprefix("sqlite:///").split("?", 1)[0]
    return Path(path) if path and path != ":memory:" else None


def local_path(uri: str) -> Path | None:
    """The folder of a local artifact location (a path or a ``file:`` URI); None otherwise."""
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return Path(parsed.path)
    if parsed.scheme == "":
        return Path(uri)
    return None
