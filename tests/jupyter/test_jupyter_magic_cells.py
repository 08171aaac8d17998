"""Cells the magic cannot run say why in the cell's own terms; a top-level ``return`` is the
cell's value."""

from __future__ import annotations

from pathlib import Path

import pytest
from IPython.core.interactiveshell import InteractiveShell
from jupyter_helpers import ANSI, run_dirs

INTERNAL = ("cellfunc.py", "magics.py", "interactiveshell.py", "run_cell_magic", "Traceback")


@pytest.fixture
def shell(shell: InteractiveShell) -> InteractiveShell:
    """conftest's shell, with the extension loaded."""
    shell.run_line_magic("load_ext", "jupyter_ext")
    return shell


def _run(shell: InteractiveShell, cell: str, capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    shell.run_cell(cell, store_history=True)
    captured = capsys.readouterr()
    return ANSI.sub("", captured.out + captured.err)


def test_a_cell_with_only_comments_has_no_code(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str], cpu_mode: Path
) -> None:
    text = _run(shell, "%%distributed gpus=2 gpu_type=cpu\n# only a comment\n\n", capsys)
    assert "UsageError: the cell has no code to run on the ranks" in text, text
    assert "TypeError" not in text and not run_dirs(cpu_mode)


def test_a_syntax_error_names_the_cells_own_line(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str], cpu_mode: Path
) -> None:
    text = _run(shell, "%%distributed gpus=2 gpu_type=cpu\nx = 1\ny = (1,\n", capsys)
    number = shell.execution_count - 1
    assert text.strip().splitlines() == [
        f"Cell In[{number}], line 3",
        "    y = (1,",
        "        ^",
        "SyntaxError: '(' was never closed",
    ], text
    assert not [word for word in INTERNAL if word in text] and not run_dirs(cpu_mode)


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("in_process")
def test_a_top_level_return_is_the_cells_value(shell: InteractiveShell) -> None:
    result = shell.run_cell(
        "%%distributed gpus=2 gpu_type=cpu\n"
        "from serverless_gpu.runtime import get_global_rank\n"
        "value = 5 + get_global_rank()\n"
        "return value\n",
        store_history=True,
    )
    assert result.success, result.error_in_exec
    assert result.result == [5, 6]
