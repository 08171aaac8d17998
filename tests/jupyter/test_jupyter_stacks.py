"""``%distributed_stacks`` in a terminal front end: where every rank of the last run is."""

from __future__ import annotations

import pytest
from IPython.core.interactiveshell import InteractiveShell
from jupyter_helpers import ANSI

pytestmark = pytest.mark.timeout(180)

CELL = """%%distributed gpus=2 gpu_type=cpu --timeout 3 --no-tracking
import time
from serverless_gpu.runtime import get_global_rank

def stuck_here():
    time.sleep(60)

if get_global_rank() == 1:
    stuck_here()
"""


def test_distributed_stacks_prints_the_stacks_a_timeout_saved(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str], in_process: None
) -> None:
    shell.run_line_magic("load_ext", "jupyter_ext")
    shell.run_cell(CELL, store_history=True)
    failed = ANSI.sub("", "".join(capsys.readouterr()))
    assert "DistributedTimeoutError" in failed, failed
    assert "rank 1: stuck_here (<%%distributed In[" in failed, failed
    shell.run_line_magic("distributed_stacks", "")
    out = capsys.readouterr().out
    assert "--- rank 1: stuck_here (<%%distributed In[" in out, out
    assert "Main thread 0x" in out and "in stuck_here" in out
