"""``python become_driver.py OUT CWD``: runs ``become.run_call`` in a process of its own (it sets
the process's environment, folder and ``sys.path``) with a transport that records what it is
asked, for a function that returns, one that raises and one that exits, on a local rank and a
remote one; writes what it saw to ``OUT`` as JSON."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from serverless_gpu.common.errors import FailureKind
from serverless_gpu.common.gpus import GPUType, Placement
from serverless_gpu.rank import become, runtime
from serverless_gpu.wire.config import DistributedConfig
from serverless_gpu.wire.protocol import RankSpec
from serverless_gpu.wire.runpaths import RunPaths
from serverless_gpu.wire.runspec import RunSpec


class Recording(become.Transport[Any]):
    def __init__(self, fn: Callable[[], Any], remote: bool) -> None:
        self.fn = fn
        self.remote = remote
        self.steps: list[str] = []

    def kept_env(self, env: dict[str, str]) -> dict[str, str]:
        self.steps.append("kept_env")
        return {"KEPT": "node"}

    def prepare(self) -> None:
        self.steps.append("prepare")

    def to_caller(self, kind: str, data: Any) -> None:
        self.steps.append(f"to_caller {kind} {data}")

    def started(self) -> None:
        self.steps.append("started")

    def load(self) -> become.Payload:
        self.steps.append("load")
        return self.fn, (), {}

    def exited(self, exc: SystemExit) -> Any:
        return ["exited", become.exit_code(exc)]

    def failed(self, exc: BaseException, kind: FailureKind, type_name: str, message: str) -> Any:
        record = become.error_record(1, exc, kind, type_name, message)
        return ["failed", kind.value, type_name, message, record.traceback_text]

    def hand_over(self, result: Any) -> Any:
        return ["ok", result]


def returns() -> Any:
    runtime.send_to_caller("hi", 1)
    env = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "KEPT", "A", "LEFT_OVER")}
    return {"env": env, "cwd": os.getcwd(), "path": list(sys.path)}


def raises() -> Any:
    raise ValueError("boom")


def exits() -> Any:
    sys.exit(3)


def main(out: str, cwd: str) -> None:
    placement = Placement(2, "cpu", GPUType.parse("cpu"), ())
    config = DistributedConfig(gpu_type="cpu", warm_process_group=False)  # torch not needed
    paths = RunPaths(Path(cwd))
    run = RunSpec("r1", "fn", placement, paths, config, {"A": "1"}, cwd, ("p1", *sys.path))
    spec = RankSpec(run, 1, 29500)
    os.environ["LEFT_OVER"] = "launcher"
    seen: dict[str, Any] = {}
    for fn in (returns, raises, exits):
        transport = Recording(fn, remote=False)
        seen[fn.__name__] = [become.run_call(spec, transport), transport.steps]
    elsewhere = RunSpec(
        "r2", "fn", placement, RunPaths(Path(cwd)), config, {}, "/no/such", ("/no",)
    )
    os.chdir("/")
    sys.path.insert(0, "/own")
    seen["remote"] = become.run_call(RankSpec(elsewhere, 0, 1), Recording(returns, remote=True))
    Path(out).write_text(json.dumps(seen))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
