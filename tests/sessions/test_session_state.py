"""A session keeps its ranks and their state from cell to cell; errors, interrupts and bad
input end a cell, never the session."""

from __future__ import annotations

import threading
import time

import pytest
from eventually import eventually

from serverless_gpu import CancelledError, Session, rank_of
from serverless_gpu.common.errors import SerializationError

GROUP = (
    "import torch, torch.distributed as dist\n"
    "from serverless_gpu import runtime\n"
    "if not dist.is_initialized():\n"
    "    runtime.init_process_group()\n"
)


def test_state_pids_model_and_group_persist(sess: Session) -> None:
    pids = sess.exec("import os\nos.getpid()")
    sess.exec(
        "import torch\n"
        "torch.manual_seed(0)\n"
        "model = torch.nn.Linear(4, 1)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "w0 = model.weight.detach().clone()"
    )
    sess.exec("loss = model(torch.ones(2, 4)).sum(); loss.backward(); opt.step()")
    moved = sess.exec("bool((model.weight - w0).abs().sum() > 0)")
    assert list(moved) == [True, True]
    sess.exec(GROUP)
    assert list(sess.exec("dist.is_initialized()")) == [True, True]
    total = sess.exec("t = torch.ones(1) * (dist.get_rank() + 1); dist.all_reduce(t); t.item()")
    assert list(total) == [3.0, 3.0]
    assert sess.exec("os.getpid()") == pids


def test_last_expression_value_per_rank(sess: Session) -> None:
    assert list(sess.exec("r = int(os.environ['RANK'])\nr * 10")) == [0, 10]
    assert list(sess.exec("y = 1")) == [None, None]


def test_exception_keeps_its_type_and_rank_and_the_session(sess: Session) -> None:
    sess.exec("kept = 'yes'")
    with pytest.raises(KeyError) as info:
        sess.exec("if r == 1:\n    raise KeyError('missing')\n")
    assert rank_of(info.value) == 1
    assert sess.alive
    assert list(sess.pull("kept")) == ["yes", "yes"]


def test_peer_blocked_in_a_collective_is_interrupted_and_the_group_re_formed(
    sess: Session, capsys: pytest.CaptureFixture[str]
) -> None:
    sess.exec(GROUP)
    sess.exec("marker = object.__name__")
    with pytest.raises(ValueError, match="rank 1 gave up") as info:
        sess.exec(
            "if dist.get_rank() == 1:\n"
            "    raise ValueError('rank 1 gave up')\n"
            "dist.all_reduce(torch.ones(1))  # rank 0 waits here for rank 1\n"
        )
    assert rank_of(info.value) == 1
    assert "re-formed before the next cell" in capsys.readouterr().out
    total = sess.exec("t = torch.ones(1); dist.all_reduce(t); t.item()")
    assert list(total) == [2.0, 2.0]
    assert list(sess.pull("marker")) == ["object", "object"]


def test_cancel_interrupts_every_rank_and_keeps_the_session(
    sess: Session, capsys: pytest.CaptureFixture[str]
) -> None:
    pids = sess.exec("os.getpid()")
    sess.exec(GROUP)
    handle = sess.start_exec(
        "import time\n"
        "print('entered', flush=True)\n"
        "if dist.get_rank() == 0:\n"
        "    time.sleep(60)\n"
        "else:\n"
        "    dist.all_reduce(torch.ones(1))  # blocked: rank 0 never joins\n"
    )
    for rank in (0, 1):
        eventually(lambda r=rank: sess.handle.logs(r).count("entered"), f"rank {rank} in the cell")
    started = time.monotonic()
    handle.cancel()
    with pytest.raises(CancelledError, match="interrupted"):
        handle.result(timeout=10)
    assert time.monotonic() - started < 3.0
    assert handle.status == "cancelled"
    said = capsys.readouterr().out
    assert "was cancelled while a process group was up" in said, said  # the user's stop,
    assert "error" not in said, said  # not a failure of their code
    assert sess.alive
    assert sess.exec("os.getpid()") == pids
    assert list(sess.exec("t = torch.ones(1); dist.all_reduce(t); t.item()")) == [2.0, 2.0]


def test_cancel_from_another_thread(sess: Session) -> None:
    handle = sess.start_exec("import time\ntime.sleep(60)")
    timer = threading.Timer(0.2, handle.cancel)
    timer.start()
    with pytest.raises(CancelledError):
        handle.result(timeout=10)
    timer.join()
    assert sess.alive


added = 0
"""Set by ``add`` below in the ranks' namespace (this module's copy stays 0)."""


def test_run_uses_the_namespace_as_globals(sess: Session) -> None:
    sess.exec("base = 5")

    def add(k: int) -> int:
        global added
        added = base + k  # type: ignore[name-defined]  # noqa: F821 - the session's own name
        return added

    assert list(sess.run(add, 2)) == [7, 7]
    assert list(sess.exec("added")) == [7, 7]


def test_push_and_pull_tensors(sess: Session) -> None:
    import torch

    sess.push(weights=torch.arange(6.0), note="hi")
    assert list(sess.exec("note")) == ["hi", "hi"]
    got = sess.pull("weights")
    assert all(torch.equal(t, torch.arange(6.0)) for t in got)


def test_code_that_does_not_compile_fails_before_any_rank_runs(sess: Session) -> None:
    sess.exec("ran = False")
    with pytest.raises(SyntaxError) as info:
        sess.exec("ran = True\nx = (1,\n")
    assert info.value.lineno == 2
    assert list(sess.pull("ran")) == [False, False]


def test_push_of_an_unpicklable_value_names_it(sess: Session) -> None:
    with pytest.raises(SerializationError, match="lock"):
        sess.push(fine=1, lock=threading.Lock())
    assert sess.alive


def test_pull_of_a_missing_name_says_which_rank_lacks_it(sess: Session) -> None:
    sess.exec("if r == 0:\n    only_on_0 = 1")
    with pytest.raises(NameError, match="rank 1"):
        sess.pull("only_on_0")


def test_stacks_show_where_a_running_cell_is(sess: Session) -> None:
    handle = sess.start_exec(
        "import time\ndef waiting_for_data():\n    time.sleep(60)\n"
        "print('waiting', flush=True)\nwaiting_for_data()"
    )
    for rank in (0, 1):
        eventually(lambda r=rank: "waiting" in sess.handle.logs(r), f"rank {rank} in the cell")
    found = sess.stacks()
    assert sorted(found) == [0, 1]
    assert all("waiting_for_data" in text for text in found.values()), found
    # The session's own frames and its cell-reading thread are the library's, left out.
    assert not any("session_loop.py" in text for text in found.values()), found
    handle.cancel()
    with pytest.raises(CancelledError):
        handle.result(timeout=10)
    assert sess.alive


@pytest.mark.parametrize("name", ["1x", "", "a-b", "class"])
def test_push_refuses_names_that_are_not_identifiers(sess: Session, name: str) -> None:
    with pytest.raises(ValueError, match="not a Python identifier"):
        sess.push(**{name: 1})


def test_the_users_group_store_listens_on_the_loopback_only(sess: Session) -> None:
    # torch's TCPStore (no authentication) would listen on every interface for the session's
    # whole idle life: every rank is local, so rank 0 binds it to 127.0.0.1.
    import psutil

    sess.exec(
        "import torch.distributed as dist\n"
        "if dist.is_initialized():\n"
        "    dist.destroy_process_group()\n"
        "dist.init_process_group('gloo')"  # env://: rank 0 serves a TCPStore on MASTER_PORT
    )
    pid = sess.exec("os.getpid()")[0]
    port = int(sess.exec("os.environ['MASTER_PORT']")[0])
    listening = [
        c.laddr
        for c in psutil.Process(pid).net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN
    ]
    assert {a.ip for a in listening if a.port == port} == {"127.0.0.1"}, listening
    assert list(sess.exec("t = torch.ones(1)\ndist.all_reduce(t)\nt.item()")) == [2.0, 2.0]


def test_a_model_holding_the_old_group_is_named_after_a_re_form(
    sess: Session, capsys: pytest.CaptureFixture[str]
) -> None:
    sess.exec(
        "import torch.distributed as dist\n"
        "if not dist.is_initialized():\n"
        "    dist.init_process_group('gloo')\n"
        "ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))"
    )
    with pytest.raises(NameError):
        sess.exec("undefined_name")
    assert list(sess.exec("t = torch.ones(1)\ndist.all_reduce(t)\nt.item()")) == [2.0, 2.0]
    out = capsys.readouterr().out
    assert "ddp (DistributedDataParallel) still hold the process group" in out
    assert sess.exec("type(ddp).__name__") == ["DistributedDataParallel"] * 2
