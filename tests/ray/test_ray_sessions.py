"""Persistent sessions on the Ray cluster (``Session(remote=True)``): the local sessions' fault
matrix on a 2-node cluster, a node lost while a session idles, a killed caller, and an idle
session that the standby reaper leaves alone."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import ray_fns
import torch
from conftest import leftovers, node_args, node_of
from eventually import eventually

from serverless_gpu import CancelledError, Session, SessionEndedError, distributed
from serverless_gpu.caller.session_links import TcpLink

REPO = Path(__file__).resolve().parents[2]
SESSIONS = REPO / "tests" / "sessions"
sys.path.insert(0, str(SESSIONS))
import session_matrix  # noqa: E402
from procs import run_script  # noqa: E402

pytestmark = pytest.mark.timeout(600)

WORLD = 4
"""Ranks per session: two on each worker node, so every collective crosses nodes."""
RUNS = (
    ("first", "user,no-warm"),
    ("after-call", "pre-formed,user,no-warm"),
)
"""Every origin; a session after another session is the give-back test's case below (the
local matrix runs that situation too)."""
DRIVER = (SESSIONS / "session_matrix.py").read_text()


@pytest.mark.parametrize(("situation", "origins"), RUNS, ids=[f"{s}-{o}" for s, o in RUNS])
def test_every_fault_leaves_a_working_remote_session(
    cluster: Any, situation: str, origins: str, tmp_path: Path
) -> None:
    env = {
        **os.environ,
        "RAY_ADDRESS": cluster.address,
        "SERVERLESS_GPU_TYPE": "cpu",
        "SERVERLESS_GPU_RUNS_DIR": str(tmp_path / "runs"),
        "SESSION_MATRIX_REMOTE": "1",
        "SESSION_MATRIX_WORLD": str(WORLD),
        "SESSION_MATRIX_DRIVER_S": "510",  # its stacks before this test's limit
    }
    done = run_script(DRIVER, situation, origins, env=env, cwd=tmp_path, timeout=540)
    session_matrix.check_output(done.stdout, done.stderr, situation, origins)


def _ranks_nodes(sess: Session) -> list[str]:
    return list(sess.exec("import ray\nray.get_runtime_context().get_node_id()"))


def test_a_node_lost_while_the_session_idles_ends_it_naming_the_node(
    cluster: Any, untracked: None
) -> None:
    sess = Session(gpus=4, gpu_type="cpu", remote=True, name="lost", output="none")
    try:
        sess.exec("x = 1")
        nodes = _ranks_nodes(sess)
        cluster.remove_node(node_of(cluster, nodes[2]))
        eventually(lambda: not sess.alive, "the session saw its node go", timeout=30)
        with pytest.raises(SessionEndedError) as info:
            sess.exec("x")
        text = str(info.value)
        assert "node 1 (127.0.0.1) died" in text and "ranks 2, 3" in text, text
        assert "restart" in text, text
    finally:
        sess.close()
    cluster.add_node(**node_args())  # as the cluster was: a restarted session gets 4 ranks
    cluster.wait_for_nodes()
    with Session(gpus=4, gpu_type="cpu", remote=True, name="lost", output="none") as again:
        assert list(again.exec("x = 2\nx")) == [2] * 4
    assert leftovers() == ([], [])


def test_an_idle_session_holds_its_actors_past_the_standby_idle_time(
    cluster: Any, untracked: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SERVERLESS_GPU_RAY_IDLE_S", "1")
    with Session(gpus=2, gpu_type="cpu", remote=True, name="idle", output="none") as sess:
        sess.exec("kept = 'yes'")
        one = distributed(gpus=1, gpu_type="cpu", remote=True, output="none")(ray_fns.who_am_i)
        one.distributed()  # its actor waits 1 s for a next call, then is released
        eventually(lambda: len(_actors()) == 3, "the 1-rank set released", timeout=30)
        assert list(sess.pull("kept")) == ["yes", "yes"]
        assert "2 ranks alive on" in sess.status_line(), sess.status_line()
    assert leftovers(standby=True) == ([], [])


def _actors() -> list[Any]:
    found, _ = leftovers(timeout=0, standby=True)
    return found


def test_stacks_output_and_values_of_every_rank(cluster: Any, untracked: None) -> None:
    with Session(gpus=4, gpu_type="cpu", remote=True, name="look", output="none") as sess:
        handle = sess.start_exec(
            "import threading, os, torch\nprint('in', os.environ['RANK'], flush=True)\n"
            "def stuck_in_this_cell():\n    threading.Event().wait(60)  # until interrupted\n"
            "stuck_in_this_cell()"
        )
        eventually(lambda: all("in " in sess.handle.logs(r) for r in range(4)), "entered")
        stacks = sess.stacks()
        assert sorted(stacks) == [0, 1, 2, 3]
        assert all("stuck_in_this_cell" in text for text in stacks.values()), stacks
        start = time.monotonic()
        handle.cancel()
        with pytest.raises(CancelledError):
            handle.result(timeout=30)
        assert time.monotonic() - start < 3.0, "every actor interrupted within 3 s"
        sess.push(t=torch.arange(4.0))
        assert [v.tolist() for v in sess.pull("t")] == [[0.0, 1.0, 2.0, 3.0]] * 4
        big = sess.exec("torch.ones(300_000) * int(os.environ['RANK'])")
        assert [float(v.sum()) for v in big] == [0.0, 300_000.0, 600_000.0, 900_000.0]


def test_a_connection_without_the_secret_is_dropped_and_the_session_goes_on(
    cluster: Any, untracked: None
) -> None:
    with Session(gpus=2, gpu_type="cpu", remote=True, name="secret", output="none") as sess:
        link = sess.core.link
        assert isinstance(link, TcpLink)
        with socket.create_connection((link.host, link.port), timeout=10) as intruder:
            intruder.sendall(b"\0" * 36)  # rank 0, a wrong secret
            intruder.settimeout(10)
            assert intruder.recv(1) == b"", "the caller closed it"
        assert list(sess.exec("1 + 1")) == [2, 2]


def test_a_killed_caller_leaves_no_session_actor(cluster: Any, tmp_path: Path) -> None:
    env = {
        **os.environ,
        "RAY_ADDRESS": cluster.address,
        "SERVERLESS_GPU_RUNS_DIR": str(tmp_path / "runs"),
        "SERVERLESS_GPU_TYPE": "cpu",
    }
    code = (
        "from serverless_gpu import Session\n"
        "s = Session(gpus=4, remote=True, tracking=False, output='none')\n"
        "s.exec('x = 1')\n"
        "print('ready', flush=True)\n"
        "import sys; sys.stdin.read()  # until the test kills it\n"
    )
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    caller = subprocess.Popen(
        [sys.executable, "-c", code],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert caller.stdout is not None
        said = []
        for line in iter(caller.stdout.readline, ""):  # the console's line first
            said.append(line.strip())
            if said[-1] == "ready":
                break
        assert said[-1:] == ["ready"], said
        assert len(_actors()) == 5, "4 ranks and the event sink, before the caller dies"
    finally:
        caller.send_signal(signal.SIGKILL)
        caller.wait(10)
    killed = time.monotonic()
    assert leftovers(timeout=5) == ([], []), "Ray removed the dead caller's session actors"
    assert time.monotonic() - killed <= 5.5


def test_a_session_takes_the_standby_actors_of_a_call_and_gives_them_back(
    cluster: Any, untracked: None
) -> None:
    call = distributed(gpus=2, gpu_type="cpu", remote=True, output="none")(
        ray_fns.group_formed_ahead
    )
    before = [pid for pid, _ in call.distributed()]
    with Session(gpus=2, gpu_type="cpu", remote=True, name="warm", output="none") as sess:
        assert list(sess.exec("import os\nos.getpid()")) == before, "the call's actors"
    after = call.distributed()
    assert [pid for pid, _ in after] == before, "given back to the next call"
    assert [formed for _, formed in after] == [True, True], "with the next call's group"
