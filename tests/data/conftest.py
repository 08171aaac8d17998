"""Fixtures for the serverless_gpu.data tests: storage backends (local directory and a real
moto S3 server), a multi-rank launcher, and a child-process leak check."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import signal
import socket
import time
import uuid
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import fsspec
import psutil
import pytest
from data_support import Launch, RankRun, Storage
from procs import cmdlines, descendants, wait_gone

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


@pytest.fixture(autouse=True)
def no_leaked_children() -> Iterator[None]:
    """Every test must leave no child process behind (after a short grace period); these
    tests start no launcher, so this stands in for the suite's check of the same name."""
    before = descendants()
    yield
    leaked = wait_gone(descendants() - before, 10)
    assert not leaked, f"child processes survived the test: {cmdlines(leaked)}"


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """A moto S3 server on 127.0.0.1 (a real HTTP endpoint), with dummy credentials."""
    from moto.server import ThreadedMotoServer

    saved = {k: os.environ.get(k) for k in _AWS_ENV}
    os.environ.update(_AWS_ENV)
    # One INFO line per request would fill a failing test's report (CI shows only part of it)
    # and push the ranks' own logs out of view.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@pytest.fixture(params=["local", "s3"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    """Parametrized over a local directory and a fresh bucket on the moto S3 server."""
    if request.param == "local":
        root = tmp_path / "storage"
        root.mkdir()
        return Storage("local", str(root), {}, fsspec.filesystem("file"))
    endpoint = request.getfixturevalue("s3_endpoint")
    options = {"endpoint_url": endpoint}
    fs = fsspec.filesystem("s3", skip_instance_cache=True, **options)
    bucket = f"test-{uuid.uuid4().hex[:12]}"
    fs.mkdir(bucket)
    return Storage("s3", f"s3://{bucket}", options, fs)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def launch() -> Iterator[Launch]:
    """Start ranks as real processes forked from a forkserver that has imported torch and
    ``serverless_gpu.data`` once (a fresh interpreter per rank would spend seconds importing).

    Session-scoped, so the forkserver exists before the per-test leak check takes its
    snapshot; the ranks and their DataLoader workers must still be gone after every test.
    """
    from multiprocessing import forkserver

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["data_rank_main"])
    # Python 3.11's forkserver ignores the parent's sys.path when preloading, so it gets the
    # paths through its environment (only the forkserver inherits this temporary value).
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), str(REPO), saved]))
    try:
        forkserver.ensure_running()
    finally:
        if saved is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = saved
    try:
        yield partial(_run_ranks, context)
    finally:
        stop = getattr(forkserver._forkserver, "_stop", None)
        if stop is not None:
            stop()


def _run_ranks(
    context: multiprocessing.context.ForkServerContext,
    config: dict[str, Any],
    workdir: Path,
    *,
    world_size: int = 2,
    timeout: float = 90,
    allow_failure: bool = False,
) -> RankRun:
    """Run ``data_rank_main.entry`` on ``world_size`` processes (gloo over 127.0.0.1).

    When a rank dies, the survivors are killed: after a SIGKILLed coordinator, peers would
    otherwise wait in a collective. Each rank runs in its own session, so its DataLoader
    workers are killed with it.
    """
    import data_rank_main

    workdir.mkdir(parents=True, exist_ok=True)
    config_path = workdir / "config.json"
    config_path.write_text(json.dumps(config))
    port = free_port()
    procs, logs = [], []
    for rank in range(world_size):
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
        }
        log = workdir / f"rank{rank}.log"
        logs.append(log)
        proc = context.Process(target=data_rank_main.entry, args=(str(config_path), env, str(log)))
        proc.start()
        procs.append(proc)
    deadline = time.monotonic() + timeout
    timed_out = False
    try:
        while any(p.exitcode is None for p in procs):
            if any(p.exitcode not in (None, 0) for p in procs):
                time.sleep(0.5)
                break
            if time.monotonic() > deadline:
                timed_out = True
                _dump_stacks([p.pid for p in procs if p.exitcode is None and p.pid is not None])
                break
            time.sleep(0.05)
    finally:
        for proc in procs:
            _kill_session(proc.pid)
    for proc in procs:
        proc.join(10)
    codes = [p.exitcode if p.exitcode is not None else -999 for p in procs]
    texts = [log.read_text(errors="replace") if log.exists() else "" for log in logs]
    # A hang is never an expected outcome, not even where a rank is meant to die: the
    # SIGKILL that ends it would otherwise pass for the death the test expects.
    if timed_out or (not allow_failure and any(codes)):
        keep = 30_000 if timed_out else 3000  # a hang's log ends in every process's stacks
        tails = "\n".join(
            f"--- rank {r} rc={c}\n{t[-keep:]}"
            for r, (c, t) in enumerate(zip(codes, texts, strict=True))
        )
        what = f"did not finish in {timeout:g} s (stacks below)" if timed_out else "failed"
        raise AssertionError(f"ranks {what}:\n{tails}")
    results = []
    for rank in range(world_size):
        out = workdir / f"result{rank}.json"
        results.append(json.loads(out.read_text()) if out.exists() else None)
    return RankRun(codes, results, texts)


def _dump_stacks(pids: list[int]) -> None:
    """Make each rank and its DataLoader workers write every thread's stack to the rank's log
    (``data_rank_main.entry`` registers faulthandler for SIGUSR1; forked workers inherit it)."""
    for pid in pids:
        try:
            rank = psutil.Process(pid)
            procs = [rank, *rank.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        for proc in procs:
            try:
                proc.send_signal(signal.SIGUSR1)
            except psutil.NoSuchProcess:
                continue
            time.sleep(0.3)  # one process at a time, so the stacks do not interleave in the log


def _kill_session(pid: int | None) -> None:
    # Each rank called setsid(), so its session id is its pid: this kills the rank and the
    # DataLoader workers it forked, and nothing else.
    if pid is None:
        return
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
