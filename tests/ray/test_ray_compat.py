"""The other ways in reach the cluster too: ``TorchDistributor(local_mode=False)`` and
``serverless-gpu run --remote``."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import ray_fns
from click.testing import CliRunner
from conftest import leftovers

from serverless_gpu.cli.app import main
from serverless_gpu.compat import TorchDistributor

pytestmark = pytest.mark.usefixtures("cluster", "untracked")

WHERE_AM_I = """
    import json
    import os
    import sys

    with open(f"out_{os.environ['RANK']}.json", "w") as f:
        json.dump({"node_rank": os.environ["NODE_RANK"], "argv": sys.argv[1:]}, f)
"""


def test_torch_distributor_off_the_driver_runs_on_the_cluster() -> None:
    distributor = TorchDistributor(num_processes=4, local_mode=False, use_gpu=False)

    out = distributor.run(ray_fns.placement_and_all_reduce, 1)

    assert out["rank"] == 0 and out["world_size"] == 4, "rank 0's value"
    assert out["sum"] == 1.0 + 2 + 3 + 4
    assert leftovers() == ([], [])


def test_the_command_line_runs_a_script_on_the_cluster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "where.py").write_text(textwrap.dedent(WHERE_AM_I))

    done = CliRunner().invoke(
        main, ["run", "--gpus", "4", "--gpu-type", "cpu", "--remote", "where.py", "--", "x"]
    )

    assert done.exit_code == 0, done.output
    seen = [json.loads((tmp_path / f"out_{r}.json").read_text()) for r in range(4)]
    assert [s["node_rank"] for s in seen] == ["0", "0", "1", "1"]
    assert {tuple(s["argv"]) for s in seen} == {("x",)}
    assert leftovers() == ([], [])
