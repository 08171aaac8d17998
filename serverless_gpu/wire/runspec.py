"""``RunSpec``: one call, complete and picklable, as every backend receives it.

The caller builds it (``decorator.py``) once the run hooks have added their environment; the
local backend sends it as is to its launcher, which derives each rank's ``RankSpec`` from it.
Nothing in it refers to a process of the caller, so another backend can ship it to other
machines.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from serverless_gpu.common.gpus import Placement
from serverless_gpu.common.lifetime import bounded_grace
from serverless_gpu.wire.config import DistributedConfig
from serverless_gpu.wire.runpaths import RunPaths

CAPTURE_S = 1.5
"""How long a timeout waits for the ranks' stack and flight-recorder dumps before it stops them
(faulthandler's dump takes milliseconds; the flight recorder's, from a thread, a little more)."""


@dataclass(frozen=True)
class RunSpec:
    """Everything needed to start one call's ranks, except the payload's bytes (a file)."""

    run_id: str
    """Our id for the call (12 hex digits); not an MLflow run id."""
    name: str
    """Qualified name of the user's function."""
    placement: Placement
    """How many ranks, on which kind of device."""
    paths: RunPaths
    """The call's files: payload, logs, error records, results."""
    config: DistributedConfig
    """The decorator's options, as the user gave them."""
    env: dict[str, str] = field(default_factory=dict)
    """The caller's environment at call time plus the hooks' additions (not per-rank ones)."""
    cwd: str = ""
    """Where the ranks start: the caller's working directory at call time."""
    sys_path: tuple[str, ...] = ()
    """The caller's ``sys.path`` at call time."""

    @property
    def timeout(self) -> float | None:
        timeout = self.config.timeout
        return None if timeout is None else float(timeout)

    @property
    def grace(self) -> float:
        """Seconds between SIGTERM and SIGKILL when ranks are stopped, as bounded in force."""
        return bounded_grace(self.config.grace, self.timeout)

    @property
    def stop_s(self) -> float:
        """How long stopping this run may take once it is due to stop (a timeout): the stacks
        capture, the graceful stop's grace, then TERM -> KILL."""
        return CAPTURE_S + float(self.config.stop_grace) + self.grace

    @property
    def world_size(self) -> int:
        return self.placement.world_size

    @property
    def device(self) -> str:
        """``"cuda"`` or ``"cpu"``."""
        return self.placement.device
