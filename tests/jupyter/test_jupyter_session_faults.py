"""A real kernel's ``%%distributed --session`` after a call (its ranks start with the group
formed): a raising cell and a kernel interrupt each leave the namespace and a working group;
a later cell asking for other options is an error saying how to restart."""

from __future__ import annotations

import re

import pytest
from jupyter_helpers import KernelFactory

START = "%%distributed --session s gpus=2 gpu_type=cpu --no-tracking\n"
CELL = "%%distributed --session s\n"
AFTER_A_CALL = """
import time, psutil
from serverless_gpu import distributed
def rank():
    import os
    return int(os.environ["RANK"])
assert list(distributed(gpus=2, gpu_type="cpu", tracking=False)(rank).distributed()) == [0, 1]
deadline = time.monotonic() + 60
def standby():
    n = 0
    for p in psutil.Process().children(recursive=True):
        try:
            n += "standby" in " ".join(p.cmdline())
        except psutil.Error:
            pass
    return n
while standby() < 2 and time.monotonic() < deadline:
    time.sleep(0.1)
print("standby", standby())
"""
CHECK = CELL + "t = torch.ones(1)\ndist.all_reduce(t)\n(t.item(), keep)"


def _outs(text: str) -> list[str]:
    return re.findall(r"Out\[\d+:\d\]: (.+)", text)


@pytest.mark.timeout(180)
def test_a_session_after_a_call_survives_a_raise_and_an_interrupt(
    make_kernel: KernelFactory,
) -> None:
    kernel = make_kernel(SERVERLESS_GPU_DISPLAY="text")
    call = kernel.run(AFTER_A_CALL)
    assert "standby 2" in call.all_text, call.all_text
    start = kernel.run(
        START + "import os, time, torch, torch.distributed as dist\n"
        "keep = int(os.environ['RANK'])\ndist.is_initialized()"
    )
    assert _outs(start.all_text) == ["True", "True"], start.all_text  # formed ahead
    raised = kernel.run(CELL + "undefined_name")
    assert "NameError" in raised.all_text, raised.all_text
    after_raise = kernel.run(CHECK)
    assert _outs(after_raise.all_text) == ["(2.0, 0)", "(2.0, 1)"], after_raise.all_text
    cell = kernel.start(CELL + "print('sleeping', flush=True)\ntime.sleep(60)")
    assert kernel.collect(cell, 30, until=lambda: "sleeping" in "".join(cell.text))
    kernel.manager.interrupt_kernel()
    assert kernel.collect(cell, 15, until=lambda: cell.done)
    assert "CancelledError" in cell.all_text, cell.all_text
    after_interrupt = kernel.run(CHECK)
    assert _outs(after_interrupt.all_text) == ["(2.0, 0)", "(2.0, 1)"], after_interrupt.all_text
    other = kernel.run("%%distributed --session s gpus=1\n1")
    assert "session 's' runs with gpus=2; this cell asks for gpus=1" in other.all_text
    assert "%distributed_session stop s" in other.all_text
    kernel.close()
