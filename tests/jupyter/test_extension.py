"""Loading and unloading the extension in a real IPython shell, and the terminal (text) path."""

from __future__ import annotations

import pytest
from IPython.core.interactiveshell import InteractiveShell

from jupyter_ext import lifecycle
from jupyter_ext.hook import render_run
from serverless_gpu.caller import hooks


def _hook_count() -> int:
    return sum(1 for _, hook in hooks._hooks if hook is render_run)


def test_load_twice_alias_and_unload(shell: InteractiveShell) -> None:
    shell.run_line_magic("load_ext", "jupyter_ext")
    shell.run_line_magic("load_ext", "serverless_gpu")  # the alias: same extension, no-op
    assert shell.extension_manager is not None
    shell.extension_manager.load_extension("jupyter_ext")
    assert "distributed" in shell.magics_manager.magics["cell"]
    assert _hook_count() == 1
    shell.run_line_magic("unload_ext", "jupyter_ext")
    assert "distributed" not in shell.magics_manager.magics["cell"]
    assert _hook_count() == 0 and not lifecycle.is_loaded()
    shell.run_line_magic("load_ext", "jupyter_ext")
    assert _hook_count() == 1


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("in_process")
def test_magic_in_terminal_ipython_prints_text(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    shell.run_line_magic("load_ext", "jupyter_ext")
    shell.user_ns["offset"] = 40
    result = shell.run_cell(
        "%%distributed gpus=2 gpu_type=cpu --out values\n"
        "from serverless_gpu.runtime import get_global_rank\n"
        "print('working on', get_global_rank())\n"
        "offset + get_global_rank()\n"
    )
    assert result.success, result.error_in_exec
    assert shell.user_ns["values"] == [40, 41]
    out = capsys.readouterr().out
    assert "on 2 x CPU | logs: " in out and "[rank 0] working on 0" in out
    assert "run succeeded after" in out and "results: rank 0: int 40, rank 1: int 41" in out
    assert "]: [40, 41]" in out  # the list of values is displayed
