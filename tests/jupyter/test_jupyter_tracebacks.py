"""What a failed run shows in IPython: the failing rank first, its traceback without the
library's frames, one line naming the run directory; a cancel is one line."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from IPython.core.interactiveshell import InteractiveShell
from jupyter_helpers import ANSI

from jupyter_ext.traceback_text import clean_traceback, ipython_labeler
from serverless_gpu.caller import hooks
from serverless_gpu.caller.hooks import RunContext
from serverless_gpu.common.errors import LauncherError

INTERNAL = ("rank/main.py", "handle.py", "magics.py", "decorator.py", "run_cell_magic")
FLAKY = (
    "from serverless_gpu import distributed\n"
    "\n"
    "@distributed(gpus=2, gpu_type='cpu', standby=False)\n"
    "def flaky_step(x):\n"
    "    from serverless_gpu.runtime import get_global_rank\n"
    "    if get_global_rank() == 1:\n"
    "        raise ValueError(f'bad value {x}')\n"
    "    import time\n"
    "    time.sleep(30)\n"
)


@pytest.fixture
def shell(shell: InteractiveShell) -> InteractiveShell:
    """conftest's shell, with the extension loaded."""
    shell.run_line_magic("load_ext", "jupyter_ext")
    return shell


def _error_text(shell: InteractiveShell, cell: str, capsys: pytest.CaptureFixture[str]) -> str:
    """The traceback IPython printed for ``cell`` (which must fail), without colours."""
    capsys.readouterr()
    result = shell.run_cell(cell, store_history=True)
    assert not result.success
    text = ANSI.sub("", capsys.readouterr().out)
    # The run's own display (text renderer) comes first; the traceback follows its summary.
    return text[text.rindex("  logs: ") :].split("\n", 1)[1] if "  logs: " in text else text


def _last_run_dir(runs: object) -> str:
    assert isinstance(runs, Path)
    return str(max(runs.iterdir(), key=lambda p: p.stat().st_mtime))


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("in_process")
def test_a_decorated_function_failing_reads_rank_first(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str], cpu_mode: object
) -> None:
    assert shell.run_cell(FLAKY, store_history=True).success
    text = _error_text(shell, "flaky_step.distributed(7)", capsys)
    lines = [line for line in text.strip().splitlines() if line.strip()]
    assert lines[0] == "rank 1 raised ValueError: bad value 7", text
    assert "ValueError: bad value 7" in lines[-2]
    assert lines[-1] == f"run directory: {_last_run_dir(cpu_mode)}", text
    assert not [word for word in INTERNAL if word in text], text
    assert "RemoteTraceback" not in text and "raised on rank" not in text, text


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("in_process")
def test_a_failing_magic_cell_quotes_its_line_as_ipython_does(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str], cpu_mode: object
) -> None:
    cell = "%%distributed gpus=2 gpu_type=cpu\nx = 1\nraise IndexError(f'oops {x}')\n"
    text = _error_text(shell, cell, capsys)
    lines = [line for line in text.strip().splitlines() if line.strip()]
    assert re.fullmatch(r"rank [01] raised IndexError: oops 1", lines[0]), text
    number = shell.execution_count - 1
    frame = lines.index(f"  Cell In[{number}], line 3, in cell_{number}")
    assert lines[frame + 1].strip() == "raise IndexError(f'oops {x}')"
    assert lines[-1] == f"run directory: {_last_run_dir(cpu_mode)}", text
    assert not [word for word in INTERNAL if word in text], text
    # The rank itself names the cell so too: in its output (the rank's tab) and its log.
    root = lines[0].split()[1]  # both ranks raise; the first to fail is reported
    log = (Path(_last_run_dir(cpu_mode)) / "logs" / f"rank_{root}.txt").read_text()
    assert f"  Cell In[{number}], line 3, in cell_{number}\n" in log, log


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("in_process")
def test_a_cancel_ends_with_one_short_line(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    def cancel_once_running(ctx: RunContext) -> None:
        started = time.monotonic()

        def maybe_cancel() -> None:
            if time.monotonic() - started > 1.0:
                ctx.cancel("cancelled from the notebook widget")

        ctx.idle_callbacks.append(maybe_cancel)

    hooks.register_hook(cancel_once_running, order=60)
    try:
        cell = "%%distributed gpus=2 gpu_type=cpu\nimport time\ntime.sleep(60)\n"
        text = _error_text(shell, cell, capsys)
    finally:
        hooks.unregister_hook(cancel_once_running)
    assert text.strip() == "CancelledError: run cancelled: cancelled from the notebook widget"


def test_cells_are_named_and_quoted_as_ipython_does(shell: InteractiveShell) -> None:
    cell = "def step():\n    x = 1\n    return x / 0\n"
    assert shell.run_cell(cell, store_history=True).success
    filename = shell.user_ns["step"].__code__.co_filename
    number = shell.execution_count - 1
    rank_text = (
        "Traceback (most recent call last):\n"
        '  File "/site-packages/serverless_gpu/rank/main.py", line 112, in _run\n'
        "    result = func(*args, **kwargs)\n"
        "             ^^^^^^^^^^^^^^^^^^^^^\n"
        f'  File "{filename}", line 3, in step\n'
        '  File "/elsewhere/lib.py", line 9, in helper\n'
        "    other()\n"
        "ZeroDivisionError: division by zero\n"
    ).replace("/site-packages/serverless_gpu/", _library_dir())
    assert clean_traceback(rank_text, ipython_labeler(shell)) == [
        "Traceback (most recent call last):",
        f"  Cell In[{number}], line 3, in step",
        "    return x / 0",
        '  File "/elsewhere/lib.py", line 9, in helper',
        "    other()",
        "ZeroDivisionError: division by zero",
    ]


def _library_dir() -> str:
    import serverless_gpu

    return str(Path(serverless_gpu.__file__).resolve().parent) + "/"


@pytest.mark.usefixtures("in_process")
@pytest.mark.parametrize("how", ["magic", "decorated"])
def test_a_call_that_fails_before_its_run_starts_ends_its_display(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str], how: str
) -> None:
    def broken(_ctx: RunContext) -> None:
        raise LauncherError("could not reach the launcher process")

    hooks.register_hook(broken, order=20)  # after the display is made, before any event
    try:
        if how == "decorated":
            assert shell.run_cell(FLAKY, store_history=True).success
            cell = "flaky_step.distributed(1)"
        else:
            cell = "%%distributed gpus=2 gpu_type=cpu\n1 + 1\n"
        capsys.readouterr()
        assert not shell.run_cell(cell, store_history=True).success
    finally:
        hooks.unregister_hook(broken)
    text = ANSI.sub("", capsys.readouterr().out)
    assert re.search(
        r"run failed after [\d.]+ s: LauncherError: could not reach the launcher", text
    )
    assert re.search(r"\n  1 +stopped +- +the run did not start\n", text), text
    assert "LauncherError: could not reach the launcher process" in text
    assert ".py:" not in text.split("  logs: ")[-1], text  # no frame of the library


def test_a_ranks_exception_names_the_other_failures() -> None:
    """Every rank's failure reaches the notebook too, from the exception's structured list."""
    from jupyter_ext.traceback_text import render_lines
    from serverless_gpu.common.errors import (
        FailureKind,
        RankFailure,
        attach_remote_context,
        with_failures,
    )

    first = RankFailure.reported(1, 1.0, FailureKind.RAISED, "ValueError", "bad value")
    other = RankFailure.of_exit(0, 1.1, -9)
    exc = attach_remote_context(ValueError("bad value"), 1, "", Path("/runs/x"))
    lines = render_lines(with_failures(exc, (first, other)), lambda _file: None)
    assert lines is not None
    text = ANSI.sub("", "\n".join(lines))
    assert text.splitlines()[0] == "rank 1 raised ValueError: bad value"
    assert "other failures: rank 0 was killed by SIGKILL" in text.splitlines()
    assert text.splitlines()[-1] == "run directory: /runs/x"
