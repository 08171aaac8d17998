"""``@ray_launch`` in a process connected to no Ray cluster: as the original's local mode, the
call starts a Ray cluster of this machine (``ray.init("local")``), runs the function as its
driver, and stops the cluster with every process it started when the call returns."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import STUB

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def test_a_call_without_a_cluster_runs_on_a_local_one_that_it_stops(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_") and k != "PYTHONPATH"}
    env.update(
        HOME=str(tmp_path / "home"),  # Ray 2.60 writes ~/.ray/auth_token on a first local init
        RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",  # before Ray is imported: 127.0.0.1 only
        PYTHONPATH=os.pathsep.join([str(STUB), str(ROOT), str(HERE)]),
        SERVERLESS_GPU_RUNS_DIR=str(tmp_path / "runs"),
        SERVERLESS_GPU_TYPE="cpu",
    )
    (tmp_path / "home").mkdir()
    done = subprocess.run(
        [sys.executable, str(HERE / "ray_local_driver.py")],
        capture_output=True,
        text=True,
        timeout=280,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["value"] == [{"nodes": 1, "gpus": 0, "cpu_mode": False}]
    assert report["connected_after"] is False
    assert report["left_after_call"] == []
    assert "needs 2 H100 GPUs on the Ray cluster, and it has 0" in report["refused"]
    assert report["left_after_refusal"] == []
    assert report["cpu_mode"] == [2, None]  # one entry per rank; refused before CPU mode was
