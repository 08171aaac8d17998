"""Every notebook in notebooks/ runs top to bottom in a real kernel (nbclient), in CPU mode,
under its own time limit; any error fails the test. The executed copy is written to the test's
temporary folder, never over the tracked notebook. The demo notebook's outputs are then read
by their own test, from that one execution."""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat
import psutil
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
DEMO = "07_magic_and_widget"
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

# Hang bounds, not speed claims: seconds for any one cell (nbclient) and, plus 30, for the whole
# notebook (pytest-timeout). One entry per notebook: a new notebook without one fails its test.
# A notebook takes 1-2 minutes on a 2-core CPU machine (DeepSpeed's first run also builds its op).
LIMITS = {
    "01_quickstart": 300,
    "02_fsdp2": 300,
    "03_deepspeed": 600,
    "04_hf_trainer": 300,
    "05_lightning_fabric": 300,
    "06_data_and_resume": 300,
    "07_magic_and_widget": 300,
    "08_sweeps": 300,
    "09_migration": 300,
    "10_sessions": 300,
    "11_original_api": 300,
}
RAY_NOTEBOOKS = {"11_original_api"}
"""Notebooks that start a Ray cluster of this machine: they get a HOME of their own, as Ray
writes ``~/.ray/auth_token`` on a first local ``ray.init``."""


@dataclass
class Executed:
    """A notebook as executed, and what was seen around its cells tagged ``bad-args``."""

    nb: Any
    runs: Path
    seen: dict[str, tuple[set[str], set[int]]] = field(default_factory=dict)
    """``before``/``after`` that cell: the run directories and the kernel's direct children."""


def _params() -> list[object]:
    return [
        pytest.param(path, marks=pytest.mark.timeout(LIMITS.get(path.stem, 1) + 30), id=path.stem)
        for path in sorted(NOTEBOOKS.glob("*.ipynb"))
    ]


@pytest.fixture(scope="module")
def mlflow_store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One MLflow store for all the notebooks: creating a store costs seconds, each time."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


@pytest.fixture(scope="module")
def executed() -> dict[str, Executed]:
    """The notebooks executed so far in this module, by name (each is executed once)."""
    return {}


@pytest.fixture
def notebook_env(
    tmp_path: Path, mlflow_store: str, monkeypatch: pytest.MonkeyPatch, no_leaked_children: None
) -> Path:
    """CPU ranks, the shared store, runs and IPython folders of the test's own; the runs folder."""
    monkeypatch.setenv("SERVERLESS_GPU_TYPE", "cpu")
    monkeypatch.setenv("SERVERLESS_GPU_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_store)
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    # DeepSpeed's compiled CPU op is kept with the environment, so only the first run builds it.
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))
    for name in ("ACCELERATE_USE_CPU", "GLOO_SOCKET_IFNAME", "SERVERLESS_GPU_DISPLAY"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "runs"


def _execute(path: Path, tmp_path: Path, runs: Path) -> Executed:
    """Run every cell of ``path`` in a fresh kernel; the executed copy goes to ``tmp_path``."""
    nb = nbformat.read(path, as_version=4)
    done = Executed(nb, runs)
    client = NotebookClient(
        nb,
        timeout=LIMITS[path.stem],
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )

    def look(cell: Any, when: str) -> None:
        if "bad-args" in cell.metadata.get("tags", []):
            kernel = client.km.provisioner.process.pid  # type: ignore[union-attr]
            done.seen[when] = (_run_dirs(runs), _children(kernel))

    client.on_cell_start = lambda cell, cell_index: look(cell, "before")
    client.on_cell_executed = lambda cell, cell_index, execute_reply: look(cell, "after")
    try:
        client.execute()  # raises CellExecutionError on the first failing cell
    finally:
        nbformat.write(nb, tmp_path / path.name)
        print(f"executed copy: {tmp_path / path.name}", file=sys.stderr)
    assert os.path.getsize(tmp_path / path.name) > 0
    return done


def _run_dirs(runs: Path) -> set[str]:
    """Run directories created so far: every started run creates one before anything else."""
    return {p.name for p in runs.iterdir() if p.is_dir()} if runs.exists() else set()


def _children(pid: int) -> set[int]:
    """Direct children only: the launcher makes standby ranks on its own after a run."""
    try:
        return {p.pid for p in psutil.Process(pid).children()}
    except psutil.NoSuchProcess:
        return set()


@pytest.mark.parametrize("path", _params())
def test_notebook_runs(
    path: Path,
    tmp_path: Path,
    notebook_env: Path,
    executed: dict[str, Executed],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert path.stem in LIMITS, f"give {path.name} a time limit in LIMITS"
    if path.stem in RAY_NOTEBOOKS:
        pytest.importorskip("ray")
        (tmp_path / "home").mkdir()
        monkeypatch.setenv("HOME", str(tmp_path / "home"))
        monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # 127.0.0.1 only
    executed[path.stem] = _execute(path, tmp_path, notebook_env)


@pytest.mark.timeout(LIMITS[DEMO] + 30)
def test_demo_notebook(tmp_path: Path, notebook_env: Path, executed: dict[str, Executed]) -> None:
    """notebooks/07_magic_and_widget.ipynb's outputs say what its text promises (its execution
    by test_notebook_runs, or a fresh one when that test did not run)."""
    demo = executed.get(DEMO) or _execute(NOTEBOOKS / f"{DEMO}.ipynb", tmp_path, notebook_env)
    cells = _by_tag(demo.nb)

    magic = _texts(cells["magic"])
    assert "[30.0, 30.0]" in magic  # (1 + 2) * scale on both ranks, after all_reduce
    assert "run succeeded" in magic and "float 30.0" in magic
    assert "[rank 1] hello from rank 1" in magic
    bar_lines = [line for line in magic.splitlines() if re.match(r"\[rank 0\] rank 0: +\d+%", line)]
    assert len(bar_lines) == 1 and "20/20" in bar_lines[0], bar_lines  # tqdm: one line

    assert "[30.0, 30.0]" in _texts(cells["out"])  # --out bound the list
    decorated = _texts(cells["decorated"])
    assert "[(3, 2), (3, 2)]" in decorated and "[rank 1] rank 1 makes a 3x2 tensor" in decorated
    assert re.search(r"\n  1 +done .* Tensor \(3, 2\) torch.float32", decorated)  # type, shape

    error_cell = cells["error"]
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
    assert "rank/main.py" not in error_lines and "magics.py" not in error_lines
    assert "ValueError: rank 1 does not like this input" in _texts(error_cell)  # the summary too

    bad = _texts(cells["bad-args"])
    assert "UsageError: argument --gpus: expected a positive integer, not '0'" in bad
    assert "%%distributed [--gpus GPUS]" in bad
    (runs_before, procs_before), (runs_after, procs_after) = demo.seen["before"], demo.seen["after"]
    assert runs_after == runs_before and procs_after <= procs_before  # nothing launched


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


def _by_tag(nb: Any) -> dict[str, Any]:
    tags = [(tag, cell) for cell in nb.cells for tag in _tags(cell)]
    return dict(tags)


def _tags(cell: Any) -> list[str]:
    return [t for t in cell.metadata.get("tags", []) if t != "raises-exception"]
