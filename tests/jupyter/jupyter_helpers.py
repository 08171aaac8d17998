"""Helpers for the Jupyter extension tests: process bookkeeping and a small kernel driver."""

from __future__ import annotations

import queue
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager
from procs import alive
from procs import pid_alive as pid_alive  # the tests import it from here

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO / "notebooks"
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

# Test kernels do not track runs in MLflow: importing mlflow and creating a store costs more
# than the rest of a test, and tracking has its own tests.
NO_TRACKING = (
    "import serverless_gpu.caller.hooks as _h, serverless_gpu.tracking as _t; "
    "_h.unregister_hook(_t.tracking_hook)"
)
# Stands in for the tracking hook where a test needs ``ctx.links["mlflow"]`` (order 10, like it).
FAKE_MLFLOW_LINK = (
    "_h.register_hook(lambda ctx: ctx.links.__setitem__('mlflow', "
    "'http://127.0.0.1:5000/#/experiments/0/runs/' + ctx.run_id), order=10)"
)


def write_ipython_profile(ipython_dir: Path, *exec_lines: str) -> Path:
    """An IPython directory whose kernels run ``exec_lines`` at startup (and keep no history)."""
    profile = ipython_dir / "profile_default"
    profile.mkdir(parents=True, exist_ok=True)
    lines = [NO_TRACKING, *exec_lines]
    (profile / "ipython_kernel_config.py").write_text(
        f"c.InteractiveShellApp.exec_lines = {lines!r}\nc.HistoryManager.enabled = False\n"
    )
    return ipython_dir


def wait_gone(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Those of ``procs`` still alive (zombies count as gone) after up to ``timeout`` s."""
    deadline = time.monotonic() + timeout
    left = procs
    while True:
        left = [p for p in left if alive(p)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.1)


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return [p for p in psutil.Process(pid).children(recursive=True) if alive(p)]
    except psutil.NoSuchProcess:
        return []


def wait_for(predicate: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def run_dirs(runs: Path) -> set[str]:
    """Run directories created so far: every started run creates one before anything else."""
    return {p.name for p in runs.iterdir() if p.is_dir()} if runs.exists() else set()


@dataclass
class CellOutput:
    """What one execute request produced on IOPub."""

    msg_id: str
    text: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    comms: list[dict[str, Any]] = field(default_factory=list)
    done: bool = False

    @property
    def all_text(self) -> str:
        return ANSI.sub("", "".join(self.text) + "\n".join(self.errors))


class Kernel:
    """A real ipykernel started with jupyter_client, and the few things the tests do with it."""

    def __init__(self, env: dict[str, str], cwd: Path) -> None:
        self.manager = KernelManager(kernel_name="python3")
        self.manager.start_kernel(env=env, cwd=str(cwd))
        self.client: BlockingKernelClient = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=60)

    @property
    def pid(self) -> int:
        provisioner = self.manager.provisioner
        assert provisioner is not None
        return int(provisioner.process.pid)  # type: ignore[attr-defined]

    def run(self, code: str, timeout: float = 120) -> CellOutput:
        out = self.start(code)
        self.collect(out, timeout, until=lambda: out.done)
        return out

    def start(self, code: str) -> CellOutput:
        return CellOutput(self.client.execute(code))

    def collect(self, out: CellOutput, timeout: float, until: Callable[[], bool]) -> bool:
        """Read IOPub into ``out`` until ``until()`` holds or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        while not until():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            try:
                msg = self.client.get_iopub_msg(timeout=min(0.2, remaining))
            except queue.Empty:
                continue
            if msg["parent_header"].get("msg_id") == out.msg_id:
                _record(out, msg)
        return True

    def click(self, comm_id: str) -> None:
        """What a browser sends when a widget button is clicked."""
        content = {"comm_id": comm_id, "data": {"method": "custom", "content": {"event": "click"}}}
        self.client.shell_channel.send(self.client.session.msg("comm_msg", content))

    def close(self) -> None:
        self.client.stop_channels()
        if self.manager.has_kernel:
            self.manager.shutdown_kernel(now=True)


KernelFactory = Callable[..., Kernel]
"""``make_kernel(**env)`` (the conftest fixture): a started kernel with the extension loaded."""


def _record(out: CellOutput, msg: dict[str, Any]) -> None:
    kind, content = msg["msg_type"], msg["content"]
    if kind == "stream":
        out.text.append(content["text"])
    elif kind in ("display_data", "execute_result", "update_display_data"):
        out.text.append(content["data"].get("text/plain", "") + "\n")
    elif kind == "error":
        out.errors.append("\n".join(content["traceback"]))
    elif kind == "comm_open":
        out.comms.append(content)
    elif kind == "status" and content["execution_state"] == "idle":
        out.done = True
