"""Smoke test: both benchmark scripts run in --quick mode on CPU ranks, print their tables, write
them with --out, and leave no process behind.

The two scripts run at the same time to keep the test short; their timings are not checked.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[2]
MARKER = "SGPU_BENCH_SMOKE"
SCRIPTS = {
    "launch.py": ["| allreduce | ours, warm (standby ready) |", "| allreduce | torchrun"],
    "overheads.py": ["| DDP step time, ours / torchrun |", "| log flood, slowdown"],
}


def marked_processes(marker: str) -> list[psutil.Process]:
    """Live processes that inherited this test's marker (zombies and unreadable ones skipped)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and proc.environ().get(MARKER) == marker:
                found.append(proc)
        except psutil.Error:
            pass
    return found


def wait_until_none(marker: str, limit: float) -> list[psutil.Process]:
    deadline = time.monotonic() + limit
    left = marked_processes(marker)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = marked_processes(marker)
    return left


def test_scripts_quick_cpu(tmp_path: Path) -> None:
    marker = uuid.uuid4().hex
    env = {**os.environ, MARKER: marker, "SERVERLESS_GPU_RUNS_DIR": str(tmp_path / "runs")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    procs = {}
    for script in SCRIPTS:
        cmd = [sys.executable, str(REPO / "benchmarks" / script), "--quick", "--cpu"]
        cmd += ["--out", str(tmp_path / f"{script}.md")]
        procs[script] = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
    try:
        outputs = {script: proc.communicate(timeout=240)[0] for script, proc in procs.items()}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        left = wait_until_none(marker, limit=10.0)
        for proc in left:  # started by this test: clean up before failing
            proc.kill()
    assert not left, f"processes survived the benchmarks: {[p.pid for p in left]}"
    for script, expected in SCRIPTS.items():
        out = outputs[script]
        assert procs[script].returncode == 0, out[-3000:]
        assert "### Targets" in out, out[-3000:]
        assert "failed" not in out, out[-3000:]
        for fragment in expected:
            assert fragment in out, f"{script}: {fragment!r} missing\n{out[-3000:]}"
        written = (tmp_path / f"{script}.md").read_text()
        assert "### Targets" in written


def test_data_and_checkpoint_benchmarks_tiny(tmp_path: Path) -> None:
    env = {**os.environ, "SERVERLESS_GPU_RUNS_DIR": str(tmp_path / "runs")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    runs = {
        "data.py": (
            ["--files", "16", "--workers", "2"],
            ["| 256KiB | local | VolumeDataset | 2 |", "| 256KiB | s3 | file-list DataLoader |"],
        ),
        "checkpoint.py": (
            ["--mib", "32", "--reps", "1", "--dir", str(tmp_path)],
            ["| VolumeWriter / VolumeReader |", "| dd (1 process) |", "| yes |"],
        ),
        "data_io.py": (
            ["--reps", "1", "--mib", "4", "--dir", str(tmp_path)],
            [
                "| 4 KiB |",
                "| boto3 download_file |",
                "| write() of 8192 KiB |",
                "| written, dropped, read back once |",
            ],
        ),
    }
    for script, (extra, expected) in runs.items():
        out = tmp_path / f"{script}.md"
        cmd = [sys.executable, str(REPO / "benchmarks" / script), *extra, "--out", str(out)]
        done = subprocess.run(
            cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False
        )
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
        written = out.read_text()
        if script != "data_io.py":  # a page of measurements, without targets
            assert "### Targets" in written, written
        for fragment in expected:
            assert fragment in written, f"{script}: {fragment!r} missing\n{written}"


def test_ray_results_benchmark_quick_cpu(tmp_path: Path) -> None:
    """``ray_results.py --quick --cpu``: its three ways side by side, on a Ray cluster of its
    own (private HOME: Ray's first local start writes an auth token there), nothing left.
    Another cluster of this machine (a ``ray start`` one, which names itself in Ray's
    ``ray_current_cluster`` file) is not the benchmark's: a plain ``ray.init()`` would join it."""
    pytest.importorskip("ray")
    marker = uuid.uuid4().hex
    env = {**os.environ, MARKER: marker, "SERVERLESS_GPU_RUNS_DIR": str(tmp_path / "runs")}
    env.update(HOME=str(tmp_path / "home"), RAY_AUTH_MODE="disabled")
    # a short folder: Ray's sockets live under it (a Unix socket's path has 107 characters)
    ray_tmp = Path(tempfile.mkdtemp(prefix="rt"))
    (ray_tmp / "ray").mkdir()
    (ray_tmp / "ray" / "ray_current_cluster").write_text("127.0.0.1:1\n")  # another's cluster
    env["RAY_TMPDIR"] = str(ray_tmp)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    out = tmp_path / "ray_results.md"
    cmd = [sys.executable, str(REPO / "benchmarks" / "ray_results.py"), "--quick", "--cpu"]
    try:
        done = subprocess.run(
            [*cmd, "--out", str(out)],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    finally:
        left = wait_until_none(marker, limit=30.0)
        for proc in left:  # started by this test: clean up before failing
            proc.kill()
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert not left, f"processes survived the benchmark: {[p.pid for p in left]}"
    written = out.read_text()
    assert "### Targets" in written, written
    for way in ("local backend", "Ray, caller's machine", "Ray, object store"):
        assert f"| {way} | CPU tensor |" in written, written
