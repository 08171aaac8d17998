"""The suite's longest modules first, so that the two workers end together.

xdist hands out one test module at a time (see ``conftest.pytest_xdist_make_scheduler``) and by
default the modules with the most tests first: a module of a few slow tests (a browser, a
notebook, a Ray cluster) then starts last and runs alone at the end. Here each module is
weighed by its seconds in an earlier run (``module_times.json``, written by
``SGPU_MODULE_TIMES=path`` and summed by ``python tests/module_times.py path`` when the
suite's shape changes), a module not listed there by its test count, and the heaviest go first.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

KNOWN = Path(__file__).with_name("module_times.json")
UNKNOWN_TEST_S = 1.5
"""A test of a module with no recorded time: about the suite's mean."""


def known_seconds() -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(KNOWN.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def heaviest_first(workqueue: dict[str, Any]) -> list[str]:
    """The scopes of ``workqueue`` (scope -> its tests), heaviest first."""
    seconds = known_seconds()

    def weight(scope: str) -> float:
        return seconds.get(scope, UNKNOWN_TEST_S * len(workqueue[scope]))

    return sorted(workqueue, key=weight, reverse=True)


class Recorder:
    """Seconds per scope (setup, call and teardown of its tests) in this worker, added to the
    file named by ``SGPU_MODULE_TIMES`` (one JSON object per line) when the worker ends."""

    def __init__(self, path: str, scope_of: Any) -> None:
        self.path, self.scope_of = path, scope_of
        self.seconds: dict[str, float] = defaultdict(float)

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[self.scope_of(report.nodeid)] += report.duration

    @pytest.hookimpl
    def pytest_sessionfinish(self) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps({k: round(v, 1) for k, v in self.seconds.items()}) + "\n")


def scope_of(nodeid: str) -> str:
    """A test's unit of scheduling: its module, or ``tests/ray`` for every Ray test."""
    path = nodeid.split("::", 1)[0]
    return "tests/ray" if path.startswith("tests/ray/") else path


def record_if_asked(config: pytest.Config) -> None:
    """Record where ``SGPU_MODULE_TIMES`` asks, in the process that runs the tests (an xdist
    controller also sees every report: counting there too would count each test twice)."""
    path = os.environ.get("SGPU_MODULE_TIMES")
    controller = bool(getattr(config.option, "numprocesses", None))
    if path and (os.environ.get("PYTEST_XDIST_WORKER") is not None or not controller):
        config.pluginmanager.register(Recorder(path, scope_of), "sgpu-module-times")


def main(argv: list[str]) -> None:
    """``python tests/module_times.py RECORDED``: sum a recorded run's lines (one per worker)
    into ``module_times.json``."""
    totals: dict[str, float] = defaultdict(float)
    for line in Path(argv[0]).read_text().splitlines():
        for scope, seconds in json.loads(line).items():
            totals[scope] += seconds
    KNOWN.write_text(json.dumps({k: round(v, 1) for k, v in sorted(totals.items())}, indent=1))


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
