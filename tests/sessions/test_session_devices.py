"""An idle session holds its devices: another call queues for them until the session ends."""

from __future__ import annotations

import time
from typing import Any

import pytest
from eventually import eventually
from procs import launcher_family

from serverless_gpu import RunStatus, Session, distributed


def _rank() -> int:
    import os

    return int(os.environ["RANK"])


def test_an_idle_session_holds_its_devices(
    module_launcher: None, cwd: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SERVERLESS_GPU_CPU_SLOTS", "2")
    sess = Session(gpus=2, gpu_type="cpu", tracking=False, name="holder")
    try:
        sess.exec("x = 1")
        line = sess.status_line()
        assert "holder: 2 ranks alive on CPU slots 0, 1" in line and "idle" in line
        call = distributed(gpus=2, gpu_type="cpu", tracking=False, standby=False)(_rank)
        handle = call.start()
        eventually(lambda: handle.status is RunStatus.QUEUED, "the call waits for the session")
        assert sess.exec("x + 1") == [2, 2]  # the session still serves cells meanwhile
    finally:
        sess.close()
    assert list(handle.result(timeout=60)) == [0, 1]


def test_the_warm_group_is_the_sessions_group(module_launcher: None, cwd: None) -> None:
    # A call of the session's shape first: its end makes the standby set the session takes.
    call = distributed(gpus=2, gpu_type="cpu", tracking=False)(_rank)
    assert list(call.distributed()) == [0, 1]
    eventually(lambda: len(launcher_family()) == 3, "the launcher and 2 standby ranks")
    with Session(gpus=2, gpu_type="cpu", tracking=False, name="warm") as sess:
        assert list(sess.exec("import torch.distributed as dist\ndist.is_initialized()")) == [
            True,
            True,
        ]
        total = sess.exec("import torch\nt = torch.ones(1)\ndist.all_reduce(t)\nt.item()")
        assert list(total) == [2.0, 2.0]
        assert list(sess.exec("dist.is_initialized()")) == [True, True]


def test_a_call_queued_behind_a_session_says_who_holds_what_and_times_out(
    module_launcher: None, cwd: None, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.setenv("SERVERLESS_GPU_CPU_SLOTS", "2")
    with Session(gpus=2, gpu_type="cpu", tracking=False, name="s") as sess:
        sess.exec("x = 1")
        call = distributed(gpus=2, gpu_type="cpu", tracking=False, standby=False, timeout=2)(_rank)
        start = time.monotonic()
        with pytest.raises(Exception, match=r"session 's' holds CPU slots 0, 1") as info:
            call.start().result(timeout=30)
        assert time.monotonic() - start < 15, "the wait was not counted in the timeout"
        assert "timed out after 2 s waiting for devices" in str(info.value)
        assert "queued: session 's' holds CPU slots 0, 1" in capsys.readouterr().out
        assert sess.exec("x") == [1, 1]
