"""One owner of a run's files, and one picklable record of a call."""

from __future__ import annotations

import pickle
import re
from pathlib import Path

from serverless_gpu.common.gpus import GPUType, Placement
from serverless_gpu.wire.config import DistributedConfig
from serverless_gpu.wire.protocol import RankSpec
from serverless_gpu.wire.runpaths import RunPaths
from serverless_gpu.wire.runspec import RunSpec

_ROOT = Path(__file__).parents[2]
_RUN_FILE_NAMES = re.compile(
    r"payload\.pkl|error_[{N*]|result_[{N*]|rank_[{N*][^\n]*\.txt|launcher-[{<(]|"
    r"\.serverless-gpu-run|[\"']stacks[\"'/]|mlflow_unsent|\.error\.txt"
)
"""How the run files' names are spelled: ``payload.pkl``, ``error_{rank}.pkl``, ``result_*``,
``rank_{rank}.txt``, ``launcher-{pid}.log``, the marker, the stacks folder, tracking's unsent
records, a failed flight-recorder dump's ``.error.txt``."""


def test_every_run_file_name_is_spelled_only_in_runpaths() -> None:
    spelled = {
        str(path.relative_to(_ROOT))
        for package in ("serverless_gpu", "jupyter_ext")
        for path in (_ROOT / package).rglob("*.py")
        if _RUN_FILE_NAMES.search(path.read_text())
    }
    assert spelled == {"serverless_gpu/wire/runpaths.py"}


def test_run_paths_name_the_files_of_a_run(tmp_path: Path) -> None:
    twin = tmp_path / "twin"
    paths = RunPaths(tmp_path / "run", twin)
    assert paths.payload == tmp_path / "run" / "payload.pkl"
    assert paths.log(3) == tmp_path / "run" / "logs" / "rank_3.txt"
    assert paths.error(1) == tmp_path / "run" / "error_1.pkl"
    assert paths.unsent == tmp_path / "run" / "mlflow_unsent.jsonl"
    assert paths.stacks(0) == tmp_path / "run" / "stacks" / "rank_0.txt"
    assert paths.flight_recorder_error(2).name == "flight_rank_2.error.txt"
    assert paths.results(2) == [twin / "result_2.pkl", tmp_path / "run" / "result_2.pkl"]
    assert RunPaths(tmp_path).results(0) == [tmp_path / "result_0.pkl"]


def test_a_run_spec_crosses_a_process_boundary_as_itself(tmp_path: Path) -> None:
    placement = Placement(2, "cpu", GPUType.parse("cpu"), ())
    config = DistributedConfig(gpu_type="cpu", timeout=30.0, grace=2.0, run_name="x")
    spec = RunSpec("r1", "train", placement, RunPaths(tmp_path), config, {"A": "1"}, "/", ("p",))
    rank = pickle.loads(pickle.dumps(RankSpec(spec, 1, 29500)))
    assert rank.run == spec
    assert rank.run.config.run_name == "x"
    assert (rank.run.timeout, rank.run.grace) == (30.0, 2.0)
    env = rank.env()
    assert [env[k] for k in ("A", "RANK", "WORLD_SIZE", "MASTER_PORT")] == ["1", "1", "2", "29500"]


_STOP_BUDGET = re.compile(r"stop_grace\s*\+|bounded_grace\(|CAPTURE_S\s*\+")
"""A stop budget added up from its parts (stacks capture, ``stop_grace``, TERM -> KILL); one
step's own deadline (``now + stop_grace``) is not one."""


def test_how_long_a_stop_may_take_is_only_run_spec_stop_s() -> None:
    summed = {
        str(path.relative_to(_ROOT))
        for package in ("serverless_gpu", "jupyter_ext")
        for path in (_ROOT / package).rglob("*.py")
        if _STOP_BUDGET.search(path.read_text())
    }
    assert summed <= {"serverless_gpu/wire/runspec.py", "serverless_gpu/common/lifetime.py"}
