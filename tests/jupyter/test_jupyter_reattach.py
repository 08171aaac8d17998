"""``RunHandle.from_run_id`` in a second real kernel: the status, logs and result of a run
that the first kernel started with ``fn.start()`` and has not read."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from jupyter_helpers import KernelFactory

pytestmark = pytest.mark.timeout(300)

START = """\
import os, time
from serverless_gpu import distributed

@distributed(gpus=2, gpu_type="cpu", standby=False, timeout=120, output="none")
def gated(gate):
    print(f"rank {os.environ['RANK']} waiting", flush=True)
    while not os.path.exists(gate):
        time.sleep(0.05)
    return {"rank": int(os.environ["RANK"]), "pid": os.getpid()}

h = gated.start(GATE)
print("RUN", h.run_id)
"""

ATTACH = """\
from serverless_gpu import RunHandle
from serverless_gpu.compat import TERMINAL_STATUSES, WorkloadStatus
import time
back = RunHandle.from_run_id(RUN_ID)
deadline = time.time() + 60
while "waiting" not in back.logs(1) and time.time() < deadline:
    time.sleep(0.1)
print("TYPE", type(back).__name__)
print("RUNNING", back.status == WorkloadStatus.RUNNING, back.status in TERMINAL_STATUSES)
print("LOG", back.logs(1).strip())
print("LINKS", back.links)
"""

COLLECT = """\
values = back.result(timeout=120, logs=True)
print("VALUES", [v["rank"] for v in values])
print("ENDED", back.status == WorkloadStatus.COMPLETED, back.status in TERMINAL_STATUSES)
"""


def test_a_second_kernel_follows_and_collects_a_run_the_first_one_started(
    make_kernel: KernelFactory, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    first, second = make_kernel(), make_kernel()
    started = first.run(START.replace("GATE", repr(str(gate))))
    assert not started.errors, started.all_text
    match = re.search(r"RUN (\w+)", started.all_text)
    assert match, started.all_text
    run_id = match[1]

    attached = second.run(ATTACH.replace("RUN_ID", repr(run_id)))
    assert not attached.errors, attached.all_text
    assert "TYPE RecordedRun" in attached.all_text
    assert "RUNNING True False" in attached.all_text
    assert "LOG rank 1 waiting" in attached.all_text
    assert "LINKS {}" in attached.all_text  # the test kernels are untracked

    gate.touch()
    collected = second.run(COLLECT)
    assert not collected.errors, collected.all_text
    assert "VALUES [0, 1]" in collected.all_text
    assert "ENDED True True" in collected.all_text
    assert "[rank 0] rank 0 waiting" in collected.all_text  # logs=True printed the logs
    mine = first.run("print('MINE', [v['rank'] for v in h.result(60)])")
    assert "MINE [0, 1]" in mine.all_text, mine.all_text  # the first kernel still has them
