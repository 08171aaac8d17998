"""A rank that dies, or does not come back from an interrupt, ends the session: a clear error,
``alive`` False, the next use says how to restart, and no process is left."""

from __future__ import annotations

import os
import re
import signal
import textwrap
from collections.abc import Iterator

import pytest
from eventually import eventually
from procs import run_script, wait_gone

from serverless_gpu import CancelledError, RankFailedError, Session, SessionEndedError, rank_of


@pytest.fixture
def fresh(module_launcher: None, cwd: None) -> Iterator[Session]:
    session = Session(gpus=2, gpu_type="cpu", tracking=False, name="faulty", grace=1.0)
    yield session
    session.close()


def _pids(session: Session) -> list[int]:
    return list(session.exec("import os\nos.getpid()"))


def test_a_rank_that_exits_ends_the_session(fresh: Session) -> None:
    pids = _pids(fresh)
    with pytest.raises(RankFailedError, match="rank 1") as info:
        fresh.exec("if os.environ['RANK'] == '1':\n    os._exit(3)\nimport time\ntime.sleep(30)")
    assert rank_of(info.value) == 1
    assert "exit" in str(info.value)
    assert not fresh.alive
    with pytest.raises(SessionEndedError, match="restart"):
        fresh.exec("1")
    assert not wait_gone(pids, 10.0)


def test_a_rank_killed_between_cells_ends_the_session(fresh: Session) -> None:
    pids = _pids(fresh)
    os.kill(pids[0], signal.SIGKILL)
    eventually(lambda: not fresh.alive, "the session sees its rank's death")
    with pytest.raises(SessionEndedError, match="SIGKILL"):
        fresh.exec("1")
    assert not wait_gone(pids, 10.0)


def test_a_rank_that_ignores_the_interrupt_is_stopped_after_grace(fresh: Session) -> None:
    pids = _pids(fresh)
    handle = fresh.start_exec(
        "import time\n"
        "print('entered', flush=True)\n"
        "while True:\n"
        "    try:\n"
        "        time.sleep(30)\n"
        "    except KeyboardInterrupt:\n"
        "        if os.environ['RANK'] == '0':\n"
        "            break\n"
    )
    for rank in (0, 1):
        eventually(lambda r=rank: "entered" in fresh.handle.logs(r), f"rank {rank} in the cell")
    handle.cancel()
    with pytest.raises(CancelledError, match=r"rank 1 did not come back within 1 s") as info:
        handle.result(timeout=20)
    assert re.search(r"\(rank 1 was in <module> \(<session \w+ cell \d+>:5\)\)", str(info.value)), (
        info.value
    )
    assert not fresh.alive
    with pytest.raises(SessionEndedError, match="did not come back"):
        fresh.exec("1")
    assert not wait_gone(pids, 10.0)


_CALLER = textwrap.dedent(
    """
    import os, sys
    from serverless_gpu import Session
    sess = Session(gpus=2, gpu_type="cpu", tracking=False)
    print("PIDS", *sess.exec("import os\\nos.getpid()"), flush=True)
    if sys.argv[1] == "kill":
        os.kill(os.getpid(), 9)
    """
)


@pytest.mark.parametrize("how", ["exit", "kill"])
def test_the_callers_end_leaves_no_rank(how: str, tmp_path: os.PathLike[str]) -> None:
    done = run_script(_CALLER, how, cwd=tmp_path, timeout=120)
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("PIDS ")] or [done.stderr]
    pids = [int(p) for p in line.split()[1:]]
    assert not wait_gone(pids, 10.0)


def test_an_idle_sessions_timeout_says_it_was_idle(module_launcher: None, cwd: None) -> None:
    session = Session(gpus=2, gpu_type="cpu", tracking=False, name="brief", timeout=2, grace=1.0)
    try:
        session.exec("x = 1")
        eventually(lambda: not session.alive, "the session's timeout ends it", timeout=30)
        with pytest.raises(SessionEndedError) as info:
            session.exec("x")
        text = str(info.value)
        assert "still running" not in text
        assert "timeout of 2 s passed while it was idle (after cell 1)" in text
    finally:
        session.close()


def test_close_from_another_thread_honours_the_grace(fresh: Session) -> None:
    import threading
    import time

    fresh.start_exec("import time\nprint('entered', flush=True)\ntime.sleep(60)")
    for rank in (0, 1):
        eventually(lambda r=rank: "entered" in fresh.handle.logs(r), f"rank {rank} in the cell")
    start = time.monotonic()
    closer = threading.Thread(target=fresh.close)
    closer.start()
    closer.join(30)
    took = time.monotonic() - start
    assert not fresh.alive
    assert took < 8.0, f"close() took {took:.1f} s with a grace of 1 s"  # was 10 s and more
