"""``run --detach`` with ``-m``, then ``runs list``, ``runs logs --follow`` and ``runs cancel``."""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import shutil
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from conftest import COMMAND, Cli
from eventually import eventually

TICKER = """
    import argparse
    import time

    parser = argparse.ArgumentParser()
    parser.add_argument("--every", type=float)
    args = parser.parse_args()
    for n in range(3000):
        print(f"{__name__} tick {n}", flush=True)
        time.sleep(args.every)
"""


def test_detached_module_is_listed_followed_and_cancelled(
    cli: Cli, write: Callable[[str, str], Path], tmp_path: Path
) -> None:
    write("ticker.py", TICKER)
    started = cli(
        "run", "--detach", "--gpus", "2", "--gpu-type", "cpu", "-m", "ticker", "--every", "0.2"
    )
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.split()[0]
    assert f"serverless-gpu runs cancel {run_id}" in started.stderr
    (record_file,) = (tmp_path / "runs").glob(f"*-{run_id}/run.json")
    record = json.loads(record_file.read_text())
    assert record["detached"] and record["command"] == "-m ticker --every 0.2"
    detached = psutil.Process(record["cli_pid"])
    tree = [detached, *detached.children(recursive=True)]  # the run, its launcher, its ranks

    listed = cli("runs", "list")
    assert any(
        line.split()[:3] == [run_id, "ticker", "running"] for line in listed.stdout.splitlines()
    )

    follow = subprocess.Popen(
        [*COMMAND, "runs", "logs", run_id, "--rank", "0", "--follow"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert follow.stdout is not None
        first = follow.stdout.readline()  # bounded: the run prints every 0.2 s
        assert first.startswith("__main__ tick ")
        cancelled = cli("runs", "cancel", run_id[:8])
        assert cancelled.returncode == 0, cancelled.stderr
        assert cancelled.stdout.strip() == f"{run_id}: cancelled"
        assert follow.wait(timeout=30) == 0  # following ends with the run
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.wait(10)
    _, alive = psutil.wait_procs(tree, timeout=15)
    assert not alive, [p.cmdline() for p in alive]
    shown = cli("runs", "show", run_id).stdout
    assert "status:    cancelled" in shown
    assert "cause:     cancelled by SIGTERM (`serverless-gpu runs cancel`" in shown
    assert "KeyboardInterrupt" not in shown


OTHER_USER = "sgpu-other"

PRINTS_A_DIGEST = """
    import hashlib
    import os
    import time

    for name in ("HF_TOKEN", "JOB_SECRET"):
        print(name, hashlib.sha256(os.environ[name].encode()).hexdigest(), flush=True)
    time.sleep(300)
"""


def _other_user() -> pwd.struct_passwd:
    """A second local user (made once, as the system user it is: no home, no login)."""
    if os.geteuid() != 0:
        pytest.skip("acting as a second local user needs root")
    try:
        return pwd.getpwnam(OTHER_USER)
    except KeyError:
        pass
    if shutil.which("useradd") is None:
        pytest.skip("useradd is missing: no second local user can be made")
    made = subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", OTHER_USER],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert made.returncode in (0, 9), made.stderr  # 9: made meanwhile by another test run
    return pwd.getpwnam(OTHER_USER)


def _as_other(user: pwd.struct_passwd, *command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        cwd="/",
        user=user.pw_uid,
        group=user.pw_gid,
        extra_groups=[],
    )


def test_a_detached_runs_secrets_are_not_readable_by_another_user(
    cli: Cli, write: Callable[[str, str], Path], tmp_path: Path
) -> None:
    other = _other_user()
    token, job_secret = f"hf_{uuid.uuid4().hex}", f"job-{uuid.uuid4().hex}"
    write("digest.py", PRINTS_A_DIGEST)
    write(
        "job.yaml", f"script: digest.py\ngpus: 1\ngpu_type: cpu\nenv:\n  JOB_SECRET: {job_secret}\n"
    )
    started = cli("run", "--detach", "-f", "job.yaml", "-e", f"HF_TOKEN={token}")
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.split()[0]
    (record_file,) = (tmp_path / "runs").glob(f"*-{run_id}/run.json")
    detached = psutil.Process(json.loads(record_file.read_text())["cli_pid"])
    try:
        log = record_file.parent / "logs" / "rank_0.txt"
        eventually(lambda: log.exists() and "JOB_SECRET" in log.read_text(), "the rank's digests")
        for secret in (token, job_secret):  # the ranks got both
            assert hashlib.sha256(secret.encode()).hexdigest() in log.read_text()
        tree = [detached, *detached.children(recursive=True)]
        seen = _as_other(other, "ps", "-eo", "pid,args").stdout
        assert str(detached.pid) in seen  # the other user does see the process
        for proc in tree:
            seen += _as_other(other, "cat", f"/proc/{proc.pid}/cmdline").stdout
            environ = _as_other(other, "cat", f"/proc/{proc.pid}/environ")
            assert environ.returncode != 0 and not environ.stdout
        assert token not in seen and job_secret not in seen
        listing = _as_other(other, "ls", "-R", str(tmp_path / "runs"))
        assert listing.returncode != 0 and run_id not in listing.stdout
        for path in (tmp_path / "runs").rglob("*"):  # nor does any file of ours hold them
            if path.is_file():
                data = path.read_bytes()
                assert token.encode() not in data and job_secret.encode() not in data, path
    finally:
        assert cli("runs", "cancel", run_id).returncode == 0
        psutil.wait_procs([detached], timeout=30)
