"""A results tmpfs that fills up costs speed, never the result: the mapped writer reserves its
file's space before it stores into the mapping (a store the tmpfs cannot back is SIGBUS), and a
rank that cannot reserve it writes into the run directory instead."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from procs import run_script

from serverless_gpu.runfiles.rundirs import RESULTS_DIR_ENV, RUNS_DIR_ENV

_CALL_TIMEOUT_S = 240


MountTmpfs = Callable[[str], Path]


@pytest.fixture
def mount_tmpfs(tmp_path: Path) -> Iterator[MountTmpfs]:
    """``mount_tmpfs("300m")``: a fresh tmpfs of that size, unmounted after the test."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root (CI runs the suite as root)")
    mounted: list[Path] = []

    def mount(size: str) -> Path:
        where = tmp_path / f"tmpfs-{len(mounted)}"
        where.mkdir()
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(where)],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounted.append(where)
        return where

    try:
        yield mount
    finally:
        for where in mounted:
            subprocess.run(["umount", "-l", str(where)], timeout=30, check=True)


@pytest.mark.parametrize("chunk", [32 << 20, 1 << 20], ids=["at-once", "in-the-background"])
def test_mapped_writer_reports_a_full_tmpfs_as_oserror(mount_tmpfs: MountTmpfs, chunk: int) -> None:
    small_tmpfs = mount_tmpfs("4m")
    # In a child: on a writer that does not reserve its space, the store is SIGBUS. With 1 MiB
    # chunks the tmpfs fills up in the reservation's thread, while the writer stores.
    code = textwrap.dedent(
        f"""
        import errno, torch
        from pathlib import Path
        from serverless_gpu.runfiles import file_space, tensor_file
        file_space.CHUNK_BYTES = {chunk}
        big = torch.ones(8 << 20, dtype=torch.uint8)  # twice the tmpfs
        try:
            tensor_file.dump(big, Path({str(small_tmpfs / "result")!r}), torch, mapped=True)
        except OSError as exc:
            print("errno", errno.errorcode[exc.errno])
        """
    )
    done = run_script(code)
    assert done.returncode != -signal.SIGBUS, "the mapped writer died of SIGBUS"
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["errno", "ENOSPC"]


_CALLER = """
import os, sys, time
from pathlib import Path

from serverless_gpu import distributed

barrier, tag = Path(sys.argv[1]), sys.argv[2]


@distributed(gpus=2, output="none", tracking=False)
def big():
    import torch

    rank = int(os.environ["RANK"])
    result = torch.full((25 << 20,), float(rank))  # 100 MiB
    # Every rank of both callers writes its result at the same time.
    (barrier / f"{tag}-{rank}").touch()
    deadline = time.monotonic() + 120
    while len(os.listdir(barrier)) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    return result


values = big.distributed()
assert [(float(t[0]), float(t[-1]), t.numel()) for t in values] == [
    (float(r), float(r), 25 << 20) for r in range(2)
], values
print("ok")
"""


@pytest.mark.timeout(_CALL_TIMEOUT_S + 60)
def test_two_callers_filling_the_results_tmpfs_both_get_their_results(
    mount_tmpfs: MountTmpfs, tmp_path: Path
) -> None:
    small_tmpfs = mount_tmpfs("300m")
    script = tmp_path / "caller.py"
    script.write_text(_CALLER)
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    env = dict(os.environ)
    env.update(
        {
            RESULTS_DIR_ENV: str(small_tmpfs / "results"),
            RUNS_DIR_ENV: str(tmp_path / "runs"),
            "OMP_NUM_THREADS": "4",  # the mapped writer: it is the faster one with 4 threads
            "SERVERLESS_GPU_WARMUP": "0",
        }
    )
    callers = [
        subprocess.Popen(
            [sys.executable, str(script), str(barrier), tag],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for tag in ("a", "b")
    ]
    outputs = []
    try:
        for caller in callers:
            outputs.append(caller.communicate(timeout=_CALL_TIMEOUT_S)[0])
    finally:
        for caller in callers:
            caller.kill()
            caller.wait(30)
    for caller, output in zip(callers, outputs, strict=True):
        assert caller.returncode == 0 and output.endswith("ok\n"), output[-3000:]


def test_a_call_starting_on_a_full_results_tmpfs_keeps_its_results_in_the_run_directory(
    mount_tmpfs: MountTmpfs, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from serverless_gpu import distributed

    full = mount_tmpfs("1m")
    (full / "results").mkdir(mode=0o700)
    with open(full / "filler", "wb", buffering=0) as f:  # another program took every page
        try:
            while True:
                f.write(b"x" * 4096)
        except OSError:
            pass
    monkeypatch.setenv(RESULTS_DIR_ENV, str(full / "results"))
    monkeypatch.setenv(RUNS_DIR_ENV, str(tmp_path / "runs"))

    @distributed(gpus=2, output="none", tracking=False)
    def ranks() -> int:
        return int(os.environ["RANK"])

    assert ranks.distributed() == [0, 1]


def test_a_run_that_cannot_be_made_on_a_full_disk_leaves_nothing(
    mount_tmpfs: MountTmpfs, monkeypatch: pytest.MonkeyPatch
) -> None:
    from serverless_gpu.common.errors import DistributedError
    from serverless_gpu.runfiles.rundirs import new_run_dir

    full = mount_tmpfs("1m")
    runs = full / "runs"
    runs.mkdir(mode=0o700)
    with open(full / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"x" * 4096)
        except OSError:
            pass
    monkeypatch.setenv(RUNS_DIR_ENV, str(runs))
    monkeypatch.setenv(RESULTS_DIR_ENV, "off")
    with pytest.raises((OSError, DistributedError)):
        new_run_dir("fn")
    assert os.listdir(runs) == []
