"""How a rank runs a script or module (``serverless_gpu.api.scripts``), and the console script."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
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


# scripts/_install.sh, the install steps of scripts/run-example.sh and scripts/test.sh: its
# functions run here in a folder of their own whose .venv/bin/python is this interpreter (pip
# only with --dry-run: nothing is installed).
ROOT = Path(__file__).resolve().parents[2]
NO_GPU = not os.path.exists("/dev/nvidia0") and shutil.which("nvidia-smi") is None


def _install_sh(tmp_path: Path, script: str, **env: str) -> subprocess.CompletedProcess[str]:
    venv_bin = tmp_path / ".venv" / "bin"
    if not venv_bin.exists():
        venv_bin.mkdir(parents=True)
        (venv_bin / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
        (venv_bin / "python").chmod(0o755)
        (tmp_path / ".ci").mkdir()
        shutil.copy(ROOT / ".ci" / "constraints-ci.txt", tmp_path / ".ci")
    code = f"set -euo pipefail; source {ROOT / 'scripts' / '_install.sh'}; {script}"
    return subprocess.run(
        ["bash", "-c", code],
        cwd=tmp_path,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.skipif(not NO_GPU, reason="the CPU build is chosen on a machine without a GPU")
def test_without_a_gpu_the_cpu_index_is_taken_when_it_answers(tmp_path: Path) -> None:
    index = tmp_path / "index"
    (index / "torch").mkdir(parents=True)
    (index / "torch" / "index.html").write_text("<html></html>")
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", "0", "--bind", "127.0.0.1", "-d", str(index)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert server.stdout is not None
        port = server.stdout.readline().split("port ")[1].split()[0]
        url = f"http://127.0.0.1:{port}"
        done = _install_sh(tmp_path, 'choose_torch; echo "args: ${TORCH_ARGS[*]}"', TORCH_INDEX=url)
    finally:
        server.terminate()
        server.wait(10)
    assert done.returncode == 0, done.stderr
    assert f"torch: no NVIDIA GPU here, so the CPU-only build from {url}" in done.stdout
    assert f"args: --index-url {url}" in done.stdout


@pytest.mark.skipif(not NO_GPU, reason="the CPU build is chosen on a machine without a GPU")
def test_a_cpu_index_that_does_not_answer_falls_back_within_its_bound(tmp_path: Path) -> None:
    """A listener that accepts and never answers (as a blackholed proxy would), and a closed
    port: the default index is used, after at most the probe's few seconds."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, not listening: refused
    try:
        for address in (silent.getsockname(), closed.getsockname()):
            url = f"http://127.0.0.1:{address[1]}"
            start = time.monotonic()
            done = _install_sh(
                tmp_path,
                'choose_torch; echo "args: ${TORCH_ARGS[*]-}"',
                TORCH_INDEX=url,
                TORCH_INDEX_PROBE_S="2",
            )
            assert time.monotonic() - start < 2 + 6
            assert done.returncode == 0, done.stderr
            assert f"but {url} could not be reached within 2 s: the default index's build" in (
                done.stdout
            )
            assert "args: \n" in done.stdout
    finally:
        silent.close()
        closed.close()


def test_pip_install_shows_each_package_and_keeps_its_whole_output(tmp_path: Path) -> None:
    done = _install_sh(tmp_path, "pip_install --dry-run --no-deps --ignore-installed six")
    assert done.returncode == 0, done.stderr
    assert "  collecting six" in done.stdout  # from an index, or a local wheel (its file)
    assert "Would install six" in (tmp_path / ".venv" / "pip-install.log").read_text()
    failed = _install_sh(tmp_path, "pip_install --dry-run --no-deps no-such-package-zz==0.0.1")
    assert failed.returncode != 0
    assert "pip install failed; the last lines of its output" in failed.stderr
    assert "no-such-package-zz" in failed.stderr


def test_say_torch_names_the_build(tmp_path: Path) -> None:
    done = _install_sh(tmp_path, "say_torch")
    assert done.returncode == 0, done.stderr
    import torch

    build = f"(CUDA {torch.version.cuda} build)" if torch.version.cuda else "(CPU-only build)"
    assert f"torch {torch.__version__} {build}" in done.stdout
