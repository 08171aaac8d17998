"""Runs tied to a real kernel (jupyter_client): Cancel clicked while the cell runs, interrupt,
shutdown, restart and SIGKILL leave no rank or helper process behind."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import psutil
import pytest
from jupyter_helpers import (
    ANSI,
    CellOutput,
    Kernel,
    KernelFactory,
    descendants,
    wait_for,
    wait_gone,
)

pytestmark = pytest.mark.timeout(120)

LONG_CELL = (
    "%%distributed gpus=2 gpu_type=cpu\n"
    "import time\n"
    "from serverless_gpu.runtime import get_global_rank\n"
    "for step in range(100_000):\n"
    "    print(f'rank {get_global_rank()} step {step}', flush=True)\n"
    "    time.sleep(0.1)\n"
)


def _start_long_run(kernel: Kernel, runs: Path) -> tuple[CellOutput, list[psutil.Process]]:
    """Start a run that never ends; return once both ranks print, with the kernel's processes."""
    out = kernel.start(LONG_CELL)

    def both_ranks_print() -> bool:
        logs = [p.read_text() for p in runs.glob("*/logs/rank_*.txt")]
        return len(logs) == 2 and all("step 2" in log for log in logs)

    assert kernel.collect(out, 60, until=both_ranks_print), out.all_text
    procs = descendants(kernel.pid)
    assert len(procs) >= 3, (out.all_text, procs)  # the launcher and two ranks
    return out, procs


def test_cancel_click_while_the_cell_runs(make_kernel: KernelFactory, cpu_mode: Path) -> None:
    kernel = make_kernel(SERVERLESS_GPU_DISPLAY="widget")
    out, procs = _start_long_run(kernel, cpu_mode)
    [cancel] = [c for c in out.comms if c["data"]["state"].get("description") == "Cancel"]
    ranks = [p for p in procs if p.ppid() != kernel.pid]
    kernel.click(cancel["comm_id"])
    clicked = time.monotonic()
    assert kernel.collect(out, 10, until=lambda: out.done)
    assert time.monotonic() - clicked < 3
    assert "CancelledError: run cancelled: cancelled from the notebook widget" in out.all_text
    assert not wait_gone(ranks, 3)
    assert "was cancelled" in out.text[-1]  # the widget's final text form says so
    after = kernel.run("print('next cell runs')")  # the kernel is fine afterwards
    assert "next cell runs" in after.all_text


def test_interrupt_stops_the_ranks(kernel: Kernel, cpu_mode: Path) -> None:
    out, procs = _start_long_run(kernel, cpu_mode)
    ranks = [p for p in procs if p.ppid() != kernel.pid]
    kernel.manager.interrupt_kernel()
    assert kernel.collect(out, 15, until=lambda: out.done)
    [error] = out.errors
    number = re.findall(r"-cell_(\d+)-", " ".join(p.name for p in cpu_mode.iterdir()))[0]
    # The user's own stop: one line, no traceback of the waiting machinery.
    expected = f"KeyboardInterrupt: cell_{number} was interrupted; every rank was stopped"
    assert ANSI.sub("", error) == expected
    assert not wait_gone(ranks, 5)


@pytest.mark.parametrize("how", ["shutdown", "restart", "sigkill"])
def test_kernel_end_ends_every_process(kernel: Kernel, cpu_mode: Path, how: str) -> None:
    _out, procs = _start_long_run(kernel, cpu_mode)
    started = time.monotonic()
    if how == "shutdown":
        kernel.manager.shutdown_kernel(now=False)
    elif how == "restart":
        old_pid = kernel.pid
        kernel.manager.restart_kernel(now=False)
        assert kernel.pid != old_pid
    else:
        os.kill(kernel.pid, signal.SIGKILL)
    left = wait_gone(procs, 5)
    assert not left, [(p.pid, p.cmdline()) for p in left]
    print(f"{how}: every process gone {time.monotonic() - started:.1f} s after the request")
    if how == "restart":
        assert wait_for(lambda: kernel.manager.is_alive(), 10)


def test_load_ext_warms_up_the_launcher(make_kernel: KernelFactory, cpu_mode: Path) -> None:
    kernel = make_kernel(SERVERLESS_GPU_WARMUP="1")

    def launcher_with_standby_ranks() -> bool:
        procs = descendants(kernel.pid)
        launchers = [p for p in procs if p.ppid() == kernel.pid]
        forked = [p for p in procs if p.ppid() != kernel.pid]
        return (
            len(launchers) == 1
            # started as "python -m serverless_gpu.launcher_process",
            # titled "serverless-gpu launcher"
            and re.search(r"serverless[_-]gpu[. ]launcher", " ".join(launchers[0].cmdline()))
            is not None
            and len(forked) == 2  # standby ranks, forked by the launcher
        )

    # No call was made: the extension started the launcher and standby ranks by itself.
    assert wait_for(launcher_with_standby_ranks, 30), descendants(kernel.pid)
    procs = descendants(kernel.pid)
    kernel.close()
    assert not wait_gone(procs, 5)
