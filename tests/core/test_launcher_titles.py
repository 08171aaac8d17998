"""Our processes are named for what they are in ps, top and nvidia-smi: the launcher, standby
ranks waiting for a call and the ranks running one."""

from __future__ import annotations

import contextlib
import time

import psutil
import pytest
from procs import the_launcher

from serverless_gpu import distributed


@pytest.mark.timeout(120)
def test_processes_are_named_for_what_they_are() -> None:
    @distributed(gpus=2, tracking=False, output="none")
    def title() -> str:
        with open("/proc/self/cmdline") as f:
            return f.read().replace("\0", " ").strip()

    titles = title.distributed()
    assert titles[0].startswith("serverless-gpu rank 0/2 ")
    assert titles[1].startswith("serverless-gpu rank 1/2 ")
    assert titles[0].endswith("title")
    launcher = the_launcher()
    assert " ".join(launcher.cmdline()).strip() == "serverless-gpu launcher"
    # Standby ranks for the next call, once the call's own ranks (which exit after their
    # results are back) are gone.
    deadline = time.monotonic() + 60
    while (found := _titles(launcher)) != ["serverless-gpu standby cpu"] * 2:
        assert time.monotonic() < deadline, f"no standby ranks were made: {found}"
        time.sleep(0.05)


def _titles(launcher: psutil.Process) -> list[str]:
    titles = []
    for child in launcher.children():
        with contextlib.suppress(psutil.NoSuchProcess):
            if child.status() != psutil.STATUS_ZOMBIE:
                titles.append(" ".join(child.cmdline()).strip())
    return titles
