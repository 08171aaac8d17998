"""What a remote call leaves behind when its caller dies, and a caller with no cluster."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import OUR_ACTORS, leftovers
from ray.util.state import list_actors

HERE = Path(__file__).resolve().parent


def test_a_killed_caller_leaves_no_actor_and_no_placement_group(
    cluster: object, tmp_path: Path
) -> None:
    env = {
        **os.environ,
        "RAY_ADDRESS": cluster.address,  # type: ignore[attr-defined]
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
        "SERVERLESS_GPU_RUNS_DIR": str(tmp_path / "runs"),
    }
    driver = subprocess.Popen(
        [sys.executable, str(HERE / "ray_driver.py")],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert driver.stdout is not None
        seen = []
        for line in iter(driver.stdout.readline, ""):  # the console printer's lines first
            seen.append(line.strip())
            if line.startswith(("running", "not running")):
                break
        assert seen[-1] == "running", seen
        alive = [
            a for a in list_actors(filters=[("state", "=", "ALIVE")]) if a.class_name in OUR_ACTORS
        ]
        assert len(alive) == 5, "4 ranks and the event sink, before the caller dies"
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait(10)
    assert leftovers(timeout=30) == ([], []), "Ray removed the dead caller's actors and group"


@pytest.mark.parametrize(
    "start",
    [
        "s.distributed(gpus=2, gpu_type='cpu', remote=True)(print).distributed()",
        "s.Session(gpus=2, gpu_type='cpu', remote=True)",
    ],
    ids=["call", "session"],
)
def test_no_cluster_is_a_configuration_error_before_anything_starts(
    tmp_path: Path, start: str
) -> None:
    code = (
        "import serverless_gpu as s\n"
        "try:\n"
        f"    {start}\n"
        "except s.ConfigurationError as exc:\n"
        "    print(exc)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["SERVERLESS_GPU_RUNS_DIR"] = str(tmp_path / "runs")
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert "connected to none" in out.stdout and "ray.init(address=" in out.stdout, out
    assert "RAY_ADDRESS" in out.stdout
    assert not (tmp_path / "runs").exists(), "no run directory was made"


def test_a_stale_ray_address_fails_in_seconds_naming_it(tmp_path: Path) -> None:
    """Nothing listens at the address (a cluster since stopped): ray.init would retry it for
    many minutes; the call's timeout covers connecting."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"  # free once closed: nothing listens there
    code = (
        "import serverless_gpu as s\n"
        "fn = s.distributed(gpus=2, gpu_type='cpu', remote=True, timeout=30)(print)\n"
        "try:\n"
        "    fn.distributed()\n"
        "except s.ConfigurationError as exc:\n"
        "    print('ConfigurationError:', exc)\n"
    )
    env = {**os.environ, "RAY_ADDRESS": address, "HOME": str(tmp_path)}
    env["SERVERLESS_GPU_RUNS_DIR"] = str(tmp_path / "runs")
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert f"ConfigurationError: no Ray cluster answers at RAY_ADDRESS={address!r}" in out.stdout, (
        out
    )
    assert "Connection refused" in out.stdout
    assert not (tmp_path / "runs").exists(), "no run directory was made"


_TOKEN_HEAD = """
import os, sys
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
from ray.cluster_utils import Cluster

for attempt in range(4):  # a raylet gives up on a dashboard agent slow to start on a busy box
    try:
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
        break
    except Exception:
        if attempt == 3:
            raise
print(cluster.address, flush=True)
sys.stdin.read()  # until the test closes it
cluster.shutdown()
"""


@pytest.mark.timeout(600)
def test_a_token_the_cluster_refuses_is_named_as_the_cause(tmp_path: Path) -> None:
    """Ray's own words for a refused token are "Failed to connect ... run `ray stop`"."""
    head_env = {**os.environ, "HOME": str(tmp_path / "head"), "RAY_AUTH_MODE": "token"}
    head_env["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    head = subprocess.Popen(
        [sys.executable, "-c", _TOKEN_HEAD],
        env=head_env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert head.stdout is not None and head.stdin is not None
        address = head.stdout.readline().strip()
        assert address, "the head node with token authentication did not start"
        code = (
            "import serverless_gpu as s\n"
            "fn = s.distributed(gpus=1, gpu_type='cpu', remote=True, timeout=30)(print)\n"
            "try:\n"
            "    fn.distributed()\n"
            "except s.ConfigurationError as exc:\n"
            "    print('ConfigurationError:', exc)\n"
        )
        env = {**os.environ, "RAY_ADDRESS": address, "HOME": str(tmp_path / "caller")}
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32))
        env["SERVERLESS_GPU_RUNS_DIR"] = str(tmp_path / "runs")
        start = time.monotonic()
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
        )
        took = time.monotonic() - start
        assert (
            f"ConfigurationError: the Ray cluster at RAY_ADDRESS={address!r} refused this "
            "process's authentication token"
        ) in out.stdout, out
        assert "RAY_AUTH_TOKEN" in out.stdout
        # Asked before ray.init, which would try the refused token 20 times, printing each.
        assert "Failed to connect" not in out.stderr and "ray stop" not in out.stderr, out.stderr
        assert took < 15, took
    finally:
        if head.stdin is not None:
            head.stdin.close()
        try:
            head.wait(60)
        except subprocess.TimeoutExpired:
            head.kill()
            head.wait(10)


@pytest.mark.parametrize("options", [{"backend": "ray"}, {"remote": True}])
def test_backend_ray_is_the_same_as_remote(options: dict[str, Any]) -> None:
    from serverless_gpu import distributed
    from serverless_gpu.backends.ray import RayBackend

    fn = distributed(gpus=2, gpu_type="cpu", **options)(print)
    assert isinstance(fn.backend, RayBackend)


def test_the_test_cluster_listens_on_loopback_only(cluster: object) -> None:
    """RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 keeps every Ray process of the test cluster on
    127.0.0.1: nothing of it can be reached from another machine."""
    listening = []
    for proc in psutil.Process().children(recursive=True):
        try:
            conns = proc.net_connections(kind="inet")
        except psutil.Error:
            continue
        listening += [
            (proc.name(), c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN
        ]
    assert listening, "the cluster's processes are this process's children"
    loopback = ("127.0.0.1", "::ffff:127.0.0.1", "::1")
    assert [x for x in listening if x[1] not in loopback] == []
