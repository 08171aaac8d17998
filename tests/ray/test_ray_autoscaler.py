"""A cluster that must grow, on Ray's own fake multi-node autoscaler: a head without CPUs whose
autoscaler adds nodes of 2 CPUs on this machine. The call waits for them and says so."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import STUB
from eventually import eventually

HERE = Path(__file__).resolve().parent
RAY = Path(sys.executable).with_name("ray")
pytestmark = pytest.mark.timeout(600)


def _config(port: int) -> dict[str, object]:
    return {
        "cluster_name": "fake_multinode",
        "max_workers": 2,
        "provider": {
            "type": "fake_multinode",
            "gcs_address": f"127.0.0.1:{port}",
            "use_node_id_as_ip": True,
            "disable_node_updaters": True,
            "disable_launch_config_check": True,
        },
        "available_node_types": {
            "ray.head.default": {"resources": {"CPU": 0}, "node_config": {}, "max_workers": 0},
            "ray.worker.cpu": {
                "resources": {"CPU": 2, "object_store_memory": 100 * 2**20},
                "node_config": {},
                "min_workers": 0,
                "max_workers": 2,
            },
        },
        "head_node_type": "ray.head.default",
        "upscaling_speed": 1.0,
        "idle_timeout_minutes": 1,
        "docker": {},
        "auth": {"ssh_user": "ubuntu"},
        "file_mounts": {},
        "cluster_synced_files": [],
        "file_mounts_sync_continuously": False,
        "rsync_exclude": [],
        "rsync_filter": [],
        "initialization_commands": [],
        "setup_commands": [],
        "head_setup_commands": [],
        "worker_setup_commands": [],
        "head_start_ray_commands": [],
        "worker_start_ray_commands": [],
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _answers(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


@pytest.fixture(scope="module")
def growing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The head (its own process group, ended by killing the group) and the environment a
    caller of it needs (a private HOME: no token of another cluster)."""
    tmp = tmp_path_factory.mktemp("grow")
    port = _free_port()
    cfg = tmp / "autoscaling.json"
    cfg.write_text(json.dumps(_config(port)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(
        HOME=str(tmp),
        RAY_FAKE_CLUSTER="1",
        RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
        PYTHONPATH=os.pathsep.join([str(STUB), str(HERE), os.environ.get("PYTHONPATH", "")]),
        SERVERLESS_GPU_RUNS_DIR=str(tmp / "runs"),
    )
    # Under ui()'s guard: the cluster's group ends with this process, even killed by a timeout.
    args = [sys.executable, "-m", "serverless_gpu.tracking.ui_guard", "--"]
    args += [str(RAY), "start", "--head", "--block", f"--port={port}", "--num-cpus=0"]
    args += ["--include-dashboard=false", f"--autoscaling-config={cfg}"]
    head = subprocess.Popen(
        args,
        env=env,
        stdin=subprocess.PIPE,  # the guard's lifeline
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        eventually(lambda: _answers(port) or head.poll() is not None, "the head", timeout=180)
        assert head.poll() is None, "the head node did not start"
        yield {**env, "RAY_ADDRESS": f"127.0.0.1:{port}"}
    finally:
        # The head, its GCS and raylet, the monitor and the nodes it added: all one group.
        os.killpg(head.pid, signal.SIGKILL)
        head.wait(30)
        if head.stdin is not None:
            head.stdin.close()
        eventually(lambda: not _group_alive(head.pid), "every process of the cluster gone")


def test_a_call_waits_for_the_autoscaler_and_says_so(growing: dict[str, str]) -> None:
    out = subprocess.run(
        [sys.executable, str(HERE / "ray_grow_driver.py")],
        env={**growing, "SERVERLESS_GPU_RAY_RESERVE_TIMEOUT": "300"},
        capture_output=True,
        text=True,
        timeout=500,
    )
    assert "sums [4.0, 4.0, 4.0, 4.0]" in out.stdout, out
    said = [line for line in out.stdout.splitlines() if "waiting for the Ray cluster" in line]
    assert said, out.stdout
    assert said[0].startswith(
        "serverless_gpu: waiting for the Ray cluster: 4 ranks of 1 CPU requested, 0 CPU free; "
    ), said
    assert any("nodes pending (autoscaler)" in line for line in said), said
