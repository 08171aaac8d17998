"""One way to become a rank (``rank/become.py``): every backend's rank takes its call through
``run_call``, the prologue's steps are written there only, and a Ray rank receives a typed
``RankSpec``."""

from __future__ import annotations

import ast
import json
import pickle
import subprocess
import sys
import typing
from pathlib import Path

from serverless_gpu.backends.ray.rank_actor import RankActor
from serverless_gpu.backends.ray.rank_spec import RayRankSpec, rank_spec
from serverless_gpu.backends.ray.ranks import RayRank, rank_environment
from serverless_gpu.common.gpus import GPUType, Placement
from serverless_gpu.wire.config import DistributedConfig
from serverless_gpu.wire.protocol import RankSpec
from serverless_gpu.wire.runpaths import RunPaths
from serverless_gpu.wire.runspec import RunSpec

_ROOT = Path(__file__).resolve().parents[2]
_BECOME = "serverless_gpu/rank/become.py"
_PROLOGUE = {
    "set_rank_title",
    "apply_thread_limit",
    "reseed",
    "stop_request.reset",
    "settle",
    "runtime.connect",
    "call_function",
}
"""The prologue's steps, as called: a bare name, or the name with its object."""


def _calls() -> dict[str, set[str]]:
    """Each step of ``_PROLOGUE`` -> the library files that call it."""
    found: dict[str, set[str]] = {}
    for package in ("serverless_gpu", "jupyter_ext"):
        for path in (_ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Call):
                    for name in _names(node.func) & _PROLOGUE:
                        found.setdefault(name, set()).add(str(path.relative_to(_ROOT)))
    return found


def _names(func: ast.expr) -> set[str]:
    if isinstance(func, ast.Name):
        return {func.id}
    if isinstance(func, ast.Attribute):
        owner = func.value.id if isinstance(func.value, ast.Name) else ""
        return {func.attr, f"{owner}.{func.attr}"}
    return set()


def test_the_prologue_of_a_rank_is_written_once() -> None:
    assert _calls() == {name: {_BECOME} for name in _PROLOGUE}


def test_every_backends_rank_becomes_one_through_run_call() -> None:
    callers = {
        str(path.relative_to(_ROOT))
        for path in (_ROOT / "serverless_gpu").rglob("*.py")
        if "run_call(" in path.read_text(encoding="utf-8") and str(path).find("become.py") < 0
    }
    assert callers == {"serverless_gpu/rank/main.py", "serverless_gpu/backends/ray/rank_actor.py"}


def test_a_ray_rank_receives_a_typed_rank_spec(tmp_path: Path) -> None:
    hints = typing.get_type_hints(RankActor.run)
    assert hints["spec"] is RayRankSpec and issubclass(RayRankSpec, RankSpec)
    placement = Placement(2, "cpu", GPUType.parse("cpu"), ())
    run = RunSpec("r1", "fn", placement, RunPaths(tmp_path), DistributedConfig(), {"A": "1"})
    ranks = [
        RayRank(0, place={"ip": "10.0.0.7", "port": 29400, "gpu_ids": []}),
        RayRank(1, place={"ip": "10.0.0.8", "port": None, "gpu_ids": []}, node_rank=1),
    ]
    spec = pickle.loads(pickle.dumps(rank_spec(run, ranks, ranks[1], 3, True, None)))
    assert (spec.run, spec.rank, spec.master_port, spec.warm_group) == (run, 1, 29400, True)
    env = spec.env()
    assert env == rank_environment(run, ranks, ranks[1], 3)
    assert [env[k] for k in ("A", "RANK", "NODE_RANK", "MASTER_ADDR")] == [
        "1",
        "1",
        "1",
        "10.0.0.7",
    ]


def test_run_call_sets_the_rank_up_and_hands_each_outcome_to_the_transport(
    tmp_path: Path,
) -> None:
    out = tmp_path / "seen.json"
    driver = Path(__file__).with_name("become_driver.py")
    cwd = tmp_path.resolve()
    subprocess.run([sys.executable, str(driver), str(out), str(cwd)], check=True, timeout=60)
    seen = json.loads(out.read_text())
    value, steps = seen["returns"]
    assert steps == ["kept_env", "prepare", "started", "load", "to_caller hi 1"]
    assert value[0] == "ok"
    env = {"RANK": "1", "WORLD_SIZE": "2", "KEPT": "node", "A": "1", "LEFT_OVER": None}
    assert value[1]["env"] == env and value[1]["cwd"] == str(cwd)
    assert value[1]["path"][0] == "p1"
    failed, kind, type_name, message, traceback_text = seen["raises"][0]
    assert (failed, kind, type_name, message) == ("failed", "raised", "builtins.ValueError", "boom")
    assert "in raises" in traceback_text and "become.py" not in traceback_text
    assert seen["exits"][0] == ["exited", 3]
    # A rank elsewhere keeps its folder, drops the caller's missing path entries, keeps its own.
    remote = seen["remote"][1]
    assert remote["cwd"] == "/" and "/no" not in remote["path"] and "/own" in remote["path"]
