"""Job files: a schema with errors that name the key and its line; a job file's run."""

from __future__ import annotations

import os
import resource
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import COMMAND, Cli
from mlflow import MlflowClient

from serverless_gpu.cli.jobfile import JobSpec, load_job
from serverless_gpu.common.errors import ConfigurationError

GOOD = """
    command: python greet.py --who "nightly run"
    gpus: 2
    gpu_type: cpu
    timeout_minutes: 5
    env:
      GREETING: hello
      REPEAT: 2
    experiment_name: {experiment}
    run_name: greet-nightly
    max_retries: 0
    remote: false
"""

GREET = """
    import os
    import sys

    print(os.environ["GREETING"] * int(os.environ["REPEAT"]), sys.argv[1:], os.environ["RANK"])
"""


def test_an_unknown_key_names_itself_its_line_and_the_key_meant(
    cli: Cli, write: Callable[[str, str], Path]
) -> None:
    write("job.yaml", "script: train.py\ngpus: 2\ngpu_typ: cpu\n")
    done = cli("run", "-f", "job.yaml", timeout=60)
    assert done.returncode == 2
    assert "job.yaml:3: unknown key 'gpu_typ' (did you mean 'gpu_type'?)" in done.stderr


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("script: t.py\ngpus: two\n", "job.yaml:2: gpus: Input should be a valid integer"),
        ("script: t.py\ngpus: 0\n", "job.yaml:2: gpus: Input should be greater than or equal to 1"),
        (
            "script: t.py\nenv:\n  A: 1\n  B: [x]\n",
            "job.yaml:4: env.B: Input should be a valid string",
        ),
        (
            "script: t.py\nargs:\n  - a\n  - {b: 1}\n",
            "job.yaml:4: args.1: Input should be a valid string",
        ),
        (
            "script: t.py\ngpus: 1\ngpus: 2\n",
            "job.yaml:3: key 'gpus' appears twice (first on line 2)",
        ),
        ("- script: t.py\n", "job.yaml:1: a job file is a mapping of keys"),
        ("script: [t.py\n", "job.yaml:2: not valid YAML"),
        (
            "timeout_minutes: -1\nscript: t.py\n",
            "job.yaml:1: timeout_minutes: Input should be greater than 0",
        ),
    ],
)
def test_schema_errors_name_the_key_and_line(
    write: Callable[[str, str], Path], text: str, message: str
) -> None:
    path = write("job.yaml", text)
    with pytest.raises(ConfigurationError) as info:
        load_job(path)
    assert str(info.value).startswith(str(path.parent / message))


def _ours(path: Path) -> JobSpec:
    job = load_job(path)
    assert isinstance(job, JobSpec)
    return job


def test_what_runs_is_one_python_script_or_module(write: Callable[[str, str], Path]) -> None:
    write("t.py", "")
    job = _ours(write("job.yaml", "command: python3 -m pkg.train --lr 0.1\n"))
    assert (job.target().module, job.target().args) == ("pkg.train", ("--lr", "0.1"))
    job = _ours(write("job.yaml", "command: [python, t.py, --n, 3]\nargs: [--m, 4]\n"))
    assert job.target().args == ("--n", "3", "--m", "4")
    for text, error in [
        ("command: bash run.sh\n", "does not run a Python script"),
        ("command: python t.py\nscript: t.py\n", "exactly one of command, script or module"),
        ("gpus: 2\n", "exactly one of command, script or module"),
        ("script: missing.py\n", "no such script: missing.py"),
    ]:
        with pytest.raises(ConfigurationError, match=error):
            _ours(write("job.yaml", text)).target()


def test_a_job_file_runs_with_its_environment_experiment_and_run_name(
    cli: Cli, write: Callable[[str, str], Path], client: MlflowClient, tmp_path: Path
) -> None:
    experiment = f"nightly-{tmp_path.name}"
    write("greet.py", GREET)
    write("job.yaml", GOOD.format(experiment=experiment))
    done = cli("run", "-f", "job.yaml", "--output", "all")
    assert done.returncode == 0, done.stderr
    for rank in (0, 1):
        assert f"[rank {rank}] hellohello ['--who', 'nightly run'] {rank}" in done.stdout
    found = client.get_experiment_by_name(experiment)
    assert found is not None
    (run,) = client.search_runs([found.experiment_id])
    assert run.info.run_name == "greet-nightly" and run.info.status == "FINISHED"


def _deep(depth: int) -> str:
    return "script: t.py\nargs: " + "[" * depth + "]" * depth + "\n"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"script: t.py\nargs: [\xff\xfe]\n", "job.yaml: not UTF-8 text"),
        (_deep(20_000).encode(), "job.yaml: nested too deeply"),
        (b"script: t.py\nenv:\n  A=B: x\n", "job.yaml:3: env: 'A=B' is not a variable name"),
        (b"script: t.py\nenv:\n  '': x\n", "job.yaml:3: env: '' is not a variable name"),
        (b'script: t.py\nenv:\n  A: "x\\0y"\n', "job.yaml:3: env.A: a value cannot hold"),
    ],
)
def test_an_unreadable_job_file_is_one_line_naming_it_and_exit_2(
    cli: Cli, tmp_path: Path, content: bytes, message: str
) -> None:
    (tmp_path / "t.py").write_text("")
    (tmp_path / "job.yaml").write_bytes(content)
    done = cli("run", "-f", "job.yaml", timeout=60)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert message in done.stderr


def test_a_job_file_that_is_a_folder_or_too_large_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=f"job file {tmp_path}: not a regular file"):
        load_job(tmp_path)
    big = tmp_path / "big.yaml"
    big.write_text("script: t.py\n" + "# padding\n" * 200_000)
    with pytest.raises(ConfigurationError, match=f"job file {big}: larger than 1 MiB"):
        load_job(big)


def _at_most_2_gib() -> None:
    # A command that read /dev/zero to the end would take the machine's memory with it.
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


@pytest.mark.parametrize("name", ["job.fifo", "/dev/zero"])
def test_a_fifo_or_a_device_is_refused_at_once(tmp_path: Path, name: str) -> None:
    if name == "job.fifo":
        os.mkfifo(tmp_path / name)  # opening it to read would wait for a writer forever
    done = subprocess.run(
        [*COMMAND, "run", "-f", name],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_at_most_2_gib,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert f"job file {name}: not a regular file" in done.stderr


def _laughs(levels: int) -> str:
    """A job file whose ``parameters`` nest aliases ten wide: 10**levels values once expanded."""
    lines = ["compute: {num_accelerators: 1, accelerator_type: GPU_1xA10}", "command: echo hi"]
    names = "abcdefghijklmnopqrstuvwxyz"
    lines += ["parameters:", f"  a: &a [{','.join('x' * 10)}]"]
    for name, under in zip(names[1:levels], names, strict=False):
        lines.append(f"  {name}: &{name} [{','.join([f'*{under}'] * 10)}]")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("levels", [8, 9, 12])  # 399, 439 and 559 bytes
def test_a_job_file_of_aliases_nested_ten_wide_is_refused_at_once(
    tmp_path: Path, levels: int
) -> None:
    (tmp_path / "job.yaml").write_text(_laughs(levels))
    done = subprocess.run(
        [*COMMAND, "run", "-f", "job.yaml", "--dry-run"],
        cwd=tmp_path,
        env={**os.environ, "SERVERLESS_GPU_TYPE": "cpu"},
        capture_output=True,
        text=True,
        timeout=30,  # the expansion took minutes, or all the memory
        preexec_fn=_at_most_2_gib,
        check=False,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "job file job.yaml: its YAML aliases (*name) expand it by more than" in done.stderr
