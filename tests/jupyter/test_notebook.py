"""notebooks/07_magic_and_widget.ipynb executed by nbclient in a real kernel."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import nbformat
import pytest
from jupyter_helpers import ANSI, NOTEBOOKS, descendants, run_dirs
from nbclient import NotebookClient

pytestmark = pytest.mark.timeout(240)


def _texts(cell: Any) -> str:
    """Everything a static viewer shows of the cell's outputs, ANSI removed."""
    parts = []
    for output in cell.outputs:
        if output.output_type == "stream":
            parts.append(output.text)
        elif output.output_type == "error":
            parts.append("\n".join(output.traceback))
        else:
            parts.append(output.get("data", {}).get("text/plain", ""))
    return ANSI.sub("", "\n".join(parts))


def _by_tag(nb: Any) -> dict[str, tuple[int, Any]]:
    tags = [(tag, index, cell) for index, cell in enumerate(nb.cells) for tag in _tags(cell)]
    return {tag: (index, cell) for tag, index, cell in tags}


def _tags(cell: Any) -> list[str]:
    return [t for t in cell.metadata.get("tags", []) if t != "raises-exception"]


def _children(pid: int) -> set[int]:
    return {p.pid for p in descendants(pid) if p.ppid() == pid}


def test_demo_notebook(tmp_path: Path, cpu_mode: Path) -> None:
    nb = nbformat.read(NOTEBOOKS / "07_magic_and_widget.ipynb", as_version=4)
    cells = _by_tag(nb)
    client = NotebookClient(
        nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    with client.setup_kernel():
        kernel_pid = client.km.provisioner.process.pid  # type: ignore[union-attr]
        for tag in ("load", "setup", "magic", "out", "decorated", "error"):
            index, cell = cells[tag]
            client.execute_cell(cell, index)
        # Direct children only: the launcher makes standby ranks on its own after a run.
        runs_before, procs_before = run_dirs(cpu_mode), _children(kernel_pid)
        index, cell = cells["bad-args"]
        client.execute_cell(cell, index)
        runs_after, procs_after = run_dirs(cpu_mode), _children(kernel_pid)

    magic = _texts(cells["magic"][1])
    assert "[30.0, 30.0]" in magic  # (1 + 2) * scale on both ranks, after all_reduce
    assert "run succeeded" in magic and "float 30.0" in magic
    assert "[rank 1] hello from rank 1" in magic
    bar_lines = [line for line in magic.splitlines() if re.match(r"\[rank 0\] rank 0: +\d+%", line)]
    assert len(bar_lines) == 1 and "20/20" in bar_lines[0], bar_lines  # tqdm: one line

    assert "[30.0, 30.0]" in _texts(cells["out"][1])  # --out bound the list
    decorated = _texts(cells["decorated"][1])
    assert "[(3, 2), (3, 2)]" in decorated and "[rank 1] rank 1 makes a 3x2 tensor" in decorated
    assert re.search(r"\n  1 +done .* Tensor \(3, 2\) torch.float32", decorated)  # type, shape

    error_cell = cells["error"][1]
    [error] = [o for o in error_cell.outputs if o.output_type == "error"]
    assert error.ename == "ValueError"
    error_lines = "\n".join(error.traceback)
    assert (
        ANSI.sub("", error.traceback[0])
        == "rank 1 raised ValueError: rank 1 does not like this input"
    )
    assert 'raise ValueError("rank 1 does not like this input")' in error_lines  # quoted source
    assert re.search(r"Cell In\[\d+\], line 5, in cell_\d+", error_lines)
    assert ANSI.sub("", error.traceback[-1]).startswith("run directory: ")
    assert "worker.py" not in error_lines and "magics.py" not in error_lines
    assert "ValueError: rank 1 does not like this input" in _texts(error_cell)  # the summary too

    bad = _texts(cells["bad-args"][1])
    assert "UsageError: argument --gpus: expected a positive integer, not '0'" in bad
    assert "%%distributed [--gpus GPUS]" in bad
    assert runs_after == runs_before and procs_after <= procs_before  # nothing launched
