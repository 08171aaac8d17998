"""A Python script or module run on every rank, as ``torchrun script.py args`` would run it.

Each rank runs the script in its own process with ``sys.argv`` set, ``__name__ == "__main__"``
and torchrun's environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` ...), through the public
decorator: the same launcher, supervision, per-rank logs, MLflow run and failure semantics as a
decorated function. ``sys.exit(0)`` (or ``sys.exit()``) at the end of a script is a success;
any other exit code fails the rank with that code.
"""

from __future__ import annotations

import os
import runpy
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from serverless_gpu.api.decorator import DistributedFunction, distributed
from serverless_gpu.common.errors import ConfigurationError


@dataclass(frozen=True)
class ScriptTarget:
    """What every rank runs: a script path or a module name, with its arguments."""

    path: str | None = None
    """Absolute path of a script (``python script.py``)."""
    module: str | None = None
    """A module run as ``python -m module``."""
    args: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if (self.path is None) == (self.module is None):
            raise ConfigurationError("give a script path or a module (-m), not both or neither")

    @classmethod
    def script(cls, path: str | os.PathLike[str], args: tuple[str, ...] = ()) -> ScriptTarget:
        """A script by path (relative to the current directory); it must exist now."""
        resolved = Path(path).expanduser().absolute()
        if not resolved.is_file():
            raise ConfigurationError(f"no such script: {path}")
        return cls(path=str(resolved), args=tuple(str(a) for a in args))

    @property
    def name(self) -> str:
        """How the run is named (run directory, MLflow run, process titles)."""
        return Path(self.path).name if self.path is not None else str(self.module)

    def command_line(self) -> str:
        head = self.path if self.path is not None else f"-m {self.module}"
        return " ".join([str(head), *self.args])


class ScriptFunction:
    """The callable each rank runs: the target script, as ``__main__``. Returns None."""

    def __init__(self, target: ScriptTarget) -> None:
        self.target = target
        # The decorator names the run after the function: name it after the script.
        self.__name__ = self.__qualname__ = target.name

    def __call__(self) -> None:
        run_target(self.target)


def run_target(target: ScriptTarget) -> None:
    """Run the script or module in this process as ``python`` would run it."""
    try:
        if target.module is not None:
            sys.argv = [target.module, *target.args]
            sys.path.insert(0, os.getcwd())  # python -m puts the current directory first
            runpy.run_module(target.module, run_name="__main__", alter_sys=True)
        else:
            assert target.path is not None
            sys.argv = [target.path, *target.args]
            sys.path.insert(0, os.path.dirname(target.path))  # as python script.py does
            runpy.run_path(target.path, run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise  # the rank exits with the script's code, which fails the run


def script_function(
    target: ScriptTarget, *, max_retries: int = 0, remote: bool = False, **options: Any
) -> DistributedFunction[[], None]:
    """``@distributed(**options)`` applied to the script; the MLflow run is named after the
    script unless ``run_name`` says otherwise."""
    options["run_name"] = options.get("run_name") or target.name
    decorate = distributed(**options, max_retries=max_retries, remote=remote)
    fn: DistributedFunction[[], None] = decorate(ScriptFunction(target))
    return fn
