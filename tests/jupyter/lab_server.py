"""A JupyterLab server on 127.0.0.1 and headless Debian Chromium, for the browser test."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@dataclass(frozen=True)
class LabServer:
    url: str
    token: str
    process: subprocess.Popen[bytes]
    log: Path

    def page_url(self, path: str) -> str:
        return f"{self.url}/lab/tree/{path}?token={self.token}&reset"

    def notebook7_url(self, path: str) -> str:
        """The same notebook in Notebook 7's page (served by the same server when the
        ``notebook`` package is installed)."""
        return f"{self.url}/notebooks/{path}?token={self.token}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def lab_server(root: Path, env: dict[str, str], log: Path) -> Iterator[LabServer]:
    """JupyterLab serving ``root``; stopped (kernels included) on exit. Its user settings and
    workspaces go beside ``log`` (a test's temporary folder) unless ``env`` names others: an
    answer to a question of the page would otherwise be written into the home folder."""
    env = {
        "JUPYTERLAB_SETTINGS_DIR": str(log.parent / "lab-settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(log.parent / "lab-workspaces"),
        **env,
    }
    port, token = free_port(), secrets.token_hex(16)
    args = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        "--LabApp.news_url=None",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]
    if os.geteuid() == 0:
        args.append("--allow-root")
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, env=env, cwd=root, stdout=out, stderr=subprocess.STDOUT)
    server = LabServer(f"http://127.0.0.1:{port}", token, proc, log)
    try:
        _wait_until_up(server, timeout=90)
        yield server
    finally:
        _stop(proc)


def _wait_until_up(server: LabServer, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"jupyter lab exited: {server.log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{server.url}/api/status?token={server.token}", timeout=2):
                return
        except (urllib.error.URLError, OSError):
            time.sleep(0.3)
    raise TimeoutError(f"jupyter lab did not start: {server.log.read_text()[-3000:]}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGINT twice is how a terminal stops jupyter server cleanly (it shuts its kernels down)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
