"""``%%distributed --session NAME`` in a real kernel: state kept across cells, per-rank values
as ``Out[n:rank]``, notebook names shipped, errors with the cell's line, Ctrl-C, list / stop /
restart, and nothing left once the kernel is gone."""

from __future__ import annotations

import re

import psutil
import pytest
from jupyter_helpers import KernelFactory, wait_gone

START = "%%distributed --session s gpus=2 gpu_type=cpu --no-tracking\n"
CELL = "%%distributed --session s\n"


def _pids(out_text: str, count: int) -> list[int]:
    return [int(p) for p in re.findall(rf"Out\[{count}:\d\]: (\d+)", out_text)]


@pytest.mark.timeout(180)
def test_session_cells_keep_state_and_show_every_rank(make_kernel: KernelFactory) -> None:
    kernel = make_kernel(SERVERLESS_GPU_DISPLAY="text")
    first = kernel.run(
        START + "import os, torch\nx = torch.ones(2) * (int(os.environ['RANK']) + 1)\nos.getpid()"
    )
    assert not first.errors, first.all_text
    (count,) = {int(n) for n in re.findall(r"Out\[(\d+):0\]", first.all_text)}
    pids = _pids(first.all_text, count)
    assert len(pids) == 2, first.all_text
    assert "s: 2 ranks alive" in first.all_text

    second = kernel.run("offset = 10\n" + "")
    assert not second.errors
    third = kernel.run(CELL + "float(x.sum()) + offset")  # offset: the notebook's
    assert "Out[" in third.all_text and ": 12.0" in third.all_text and ": 14.0" in third.all_text, (
        third.all_text
    )

    same = kernel.run(CELL + "os.getpid()")
    assert sorted(int(p) for p in re.findall(r"Out\[\d+:\d\]: (\d+)", same.all_text)) == sorted(
        pids
    )

    failed = kernel.run(
        CELL + "y = 1\nif os.environ['RANK'] == '1':\n    raise ValueError('bad value')\n"
    )
    text = failed.all_text
    assert "ValueError: bad value" in text and "line 4" in text and "rank 1" in text, text
    assert "raise ValueError('bad value')" in text

    bad = kernel.run(CELL + "z = 1\nz = (1,\n")
    assert "line 3" in bad.all_text and "SyntaxError" in bad.all_text, bad.all_text
    assert "z = (1," in bad.all_text and "Traceback" not in bad.all_text

    listed = kernel.run("%distributed_session list")
    assert "s: 2 ranks alive" in listed.all_text and "idle" in listed.all_text

    restarted = kernel.run("%distributed_session restart s")
    assert "restarted" in restarted.all_text, restarted.all_text
    assert not wait_gone([psutil.Process(p) for p in pids if psutil.pid_exists(p)], 10.0)
    fresh = kernel.run(CELL + "'x' in globals()")
    assert "Out[" in fresh.all_text and ": False" in fresh.all_text, fresh.all_text

    stopped = kernel.run("%distributed_session stop s")
    assert stopped.all_text.strip() == "serverless_gpu: session 's' stopped", stopped.all_text


@pytest.mark.timeout(180)
def test_ctrl_c_interrupts_a_session_cell_and_keeps_the_session(make_kernel: KernelFactory) -> None:
    kernel = make_kernel(SERVERLESS_GPU_DISPLAY="text")
    started = kernel.run(START + "import os, time\nos.getpid()")
    assert not started.errors, started.all_text
    ranks = [
        psutil.Process(p) for p in map(int, re.findall(r"Out\[\d+:\d\]: (\d+)", started.all_text))
    ]
    cell = kernel.start(CELL + "print('sleeping', flush=True)\ntime.sleep(60)")
    assert kernel.collect(cell, 30, until=lambda: "sleeping" in "".join(cell.text))
    kernel.manager.interrupt_kernel()
    assert kernel.collect(cell, 10, until=lambda: cell.done)
    assert "CancelledError" in cell.all_text and "interrupted" in cell.all_text, cell.all_text
    after = kernel.run(CELL + "os.getpid()")
    assert sorted(map(int, re.findall(r"Out\[\d+:\d\]: (\d+)", after.all_text))) == sorted(
        p.pid for p in ranks
    )
    kernel.close()
    assert not wait_gone(ranks, 10.0)


@pytest.mark.timeout(180)
def test_the_widgets_cancel_interrupts_the_cell_and_keeps_the_session(
    make_kernel: KernelFactory,
) -> None:
    kernel = make_kernel(SERVERLESS_GPU_DISPLAY="widget")
    started = kernel.run(START + "import os, time\nos.getpid()")
    assert not started.errors, started.all_text
    pids = sorted(map(int, re.findall(r"Out\[\d+:\d\]: (\d+)", started.all_text)))
    assert re.search(r"s In\[\d+\]", started.all_text)  # the cell's widget (its text form)
    cell = kernel.start(CELL + "time.sleep(60)")
    assert kernel.collect(cell, 30, until=lambda: _button(cell, "Cancel") is not None)
    kernel.click(_button(cell, "Cancel") or "")
    assert kernel.collect(cell, 10, until=lambda: cell.done)
    assert "CancelledError" in cell.all_text and "interrupted" in cell.all_text, cell.all_text
    assert "cancelled" in cell.text[-1]  # the record's text form
    after = kernel.run(CELL + "os.getpid()")
    assert sorted(map(int, re.findall(r"Out\[\d+:\d\]: (\d+)", after.all_text))) == pids


def _button(out: object, description: str) -> str | None:
    comms = getattr(out, "comms", [])
    found = [c for c in comms if c["data"]["state"].get("description") == description]
    return found[0]["comm_id"] if found else None


@pytest.mark.timeout(180)
def test_kernel_shutdown_closes_the_session(make_kernel: KernelFactory) -> None:
    kernel = make_kernel(SERVERLESS_GPU_DISPLAY="text")
    started = kernel.run(START + "import os\nos.getpid()")
    ranks = [psutil.Process(p) for p in _pids(started.all_text, _count(started.all_text))]
    assert len(ranks) == 2, started.all_text
    kernel.client.stop_channels()
    kernel.manager.shutdown_kernel(now=False)  # as JupyterLab's "Shut Down Kernel" asks
    assert not wait_gone(ranks, 15.0)


def _count(text: str) -> int:
    return int(re.findall(r"Out\[(\d+):0\]", text)[0])
