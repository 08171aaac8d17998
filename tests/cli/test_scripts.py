"""How a rank runs a script or module (``serverless_gpu.api.scripts``), and the console script."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from serverless_gpu.api.scripts import ScriptTarget, run_target

REPORT = """
    import sys
    import report_box
    report_box.seen.append((__name__, sys.argv[1:]))
    if sys.argv[1:] == ["fail"]:
        sys.exit(3)
    sys.exit(0)
"""


@pytest.fixture
def box(write: Callable[[str, str], Path], monkeypatch: pytest.MonkeyPatch) -> list[object]:
    write("report_box.py", "seen = []\n")
    monkeypatch.syspath_prepend(os.getcwd())
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    import report_box

    report_box.seen.clear()
    return report_box.seen


def test_a_script_runs_as_main_with_its_argv_and_exit_0_is_success(
    write: Callable[[str, str], Path], box: list[object]
) -> None:
    path = write("job.py", REPORT)
    run_target(ScriptTarget.script(path, ("--epochs", "2")))
    assert box == [("__main__", ["--epochs", "2"])]
    with pytest.raises(SystemExit) as info:
        run_target(ScriptTarget.script(path, ("fail",)))
    assert info.value.code == 3


def test_a_module_runs_as_main_from_the_current_directory(
    write: Callable[[str, str], Path], box: list[object]
) -> None:
    write("jobmod.py", REPORT)
    run_target(ScriptTarget(module="jobmod", args=("x",)))
    assert box == [("__main__", ["x"])]


def test_the_console_script_is_the_cli() -> None:
    pyproject = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    assert '\n[project.scripts]\nserverless-gpu = "serverless_gpu.cli:main"\n' in pyproject
    script = "from serverless_gpu.cli import main; main()"
    commands = [[sys.executable, "-c", script]]
    installed = shutil.which("serverless-gpu", path=str(Path(sys.executable).parent))
    if installed:  # an install of this checkout (CI's): the real console script too
        commands.append([installed])
    for command in commands:
        done = subprocess.run(
            [*command, "--help"], capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 0, done.stderr
        assert "Usage: serverless-gpu" in done.stdout and "runs" in done.stdout
