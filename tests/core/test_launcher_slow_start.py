"""A call's timeout counts from its start in the launcher, not from the moment it was sent.

A launcher can be slow to reach a call it was sent: a fresh one imports torch, a prewarm asks it
to import slow modules, a loaded machine slows both. The caller's watchdog (which kills a
launcher that does not end a run long after its timeout) must not count that time, or it kills
a healthy launcher and fails a call that would have succeeded.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

IMPORT_S = 22.0
"""Longer than the watchdog's allowance for a 2 s timeout (timeout + capture + grace + 15 s)."""

CALLER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from serverless_gpu import distributed
    from serverless_gpu.backends.local import default_backend
    from serverless_gpu.common.gpus import resolve_placement

    started = Path(sys.argv[1])
    default_backend().prewarm(resolve_placement(2, "cpu"), ("slow_to_import",))
    deadline = time.monotonic() + 120
    while not started.exists():  # the launcher is now busy importing it
        assert time.monotonic() < deadline, "the launcher never imported the module"
        time.sleep(0.1)

    @distributed(gpus=2, gpu_type="cpu", timeout=2, tracking=False, output="none")
    def quick():
        return 7

    print("results", list(quick.distributed()), flush=True)
    """
)


@pytest.mark.timeout(180)
def test_time_before_the_launcher_reaches_a_call_is_not_its_timeout(tmp_path: Path) -> None:
    modules = tmp_path / "modules"
    modules.mkdir()
    started = tmp_path / "import-started"
    (modules / "slow_to_import.py").write_text(
        f"import pathlib, time\npathlib.Path({str(started)!r}).touch()\ntime.sleep({IMPORT_S})\n"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(modules), *filter(None, [env.get("PYTHONPATH", "")])])
    env["SERVERLESS_GPU_RUNS_DIR"] = str(tmp_path / "runs")
    out = subprocess.run(
        [sys.executable, "-c", CALLER, str(started)],
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "results [7, 7]" in out.stdout
