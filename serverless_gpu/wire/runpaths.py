"""The names of every file a run writes: the one place that spells them.

A run directory holds the payload, each rank's log and error record, and (when no results twin
takes them) the results. Where the roots are, how run directories are made and when they are
pruned is ``rundirs.py``; this module only names what is inside.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

MARKER = ".serverless-gpu-run"
"""In every run directory: the lock its caller holds while the run is live, and the caller's
pid and start time (what decides liveness where the filesystem has no ``flock``)."""
TWIN_OWNER = "run_dir"
"""In every results twin: a link to its run directory."""
RUN_NAME = re.compile(r"\d{8}-\d{6}-[A-Za-z0-9_.-]{0,40}-[0-9a-f]{12}")
"""A run directory's (and its twin's) name: ``<date>-<time>-<function>-<12 hex>``."""
LAUNCHER_LOG = re.compile(r"launcher-(\d+)\.log")
"""A launcher's own output in the runs root, named for the caller's pid."""
LOG_GLOB = "rank_*.txt"
"""Every rank's log in :attr:`RunPaths.logs`, and every rank's latest stacks in
:attr:`RunPaths.stacks_dir`."""
_LOG_NAME = re.compile(r"rank_(\d+)\.txt")


def result_name(rank: int) -> str:
    """The name of rank ``rank``'s result file (in a results twin or a run directory)."""
    return f"result_{rank}.pkl"


def launcher_log(runs_root: Path, caller_pid: int) -> Path:
    """Where the launcher of caller ``caller_pid`` writes its output."""
    return runs_root / f"launcher-{caller_pid}.log"


def run_dir_name(when: str, function: str, run_id: str) -> str:
    """A run directory's name (see :data:`RUN_NAME`); ``function`` is made safe and short."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", function)[:40]
    return f"{when}-{safe}-{run_id}"


@dataclass(frozen=True)
class RunPaths:
    """Every file of one run. Picklable: it travels with the run to the launcher and ranks."""

    RESULT_GLOB = "result_*.pkl"
    """Every rank's result file, in the results twin or in the run directory."""

    run_dir: Path
    """The run's private directory (0700)."""
    results_dir: Path | None = None
    """The run's results twin on a tmpfs, tried first for results; None: the run directory."""

    @property
    def payload(self) -> Path:
        """The pickled function and arguments, written once by the caller, read by every rank."""
        return self.run_dir / "payload.pkl"

    @property
    def logs(self) -> Path:
        """The folder of the ranks' logs (kept for the user)."""
        return self.run_dir / "logs"

    def log(self, rank: int) -> Path:
        """Rank ``rank``'s stdout and stderr, as the launcher tees them."""
        return self.logs / f"rank_{rank}.txt"

    def existing_logs(self) -> dict[int, Path]:
        """The ranks' logs that exist now, by rank."""
        found = {}
        for path in self.logs.glob(LOG_GLOB):
            match = _LOG_NAME.fullmatch(path.name)
            if match:
                found[int(match[1])] = path
        return dict(sorted(found.items()))

    @property
    def record(self) -> Path:
        """What the run was and how it ended (JSON, ``runrecord.py``): what
        ``serverless-gpu runs`` lists. Kept with the run directory."""
        return self.run_dir / "run.json"

    @property
    def unsent(self) -> Path:
        """What tracking could not write to MLflow, one JSON record per line (``spill.py``)."""
        return self.run_dir / "mlflow_unsent.jsonl"

    @property
    def session(self) -> Path:
        """A persistent session's folder (its cells' pipes); a run with one is a session."""
        return self.run_dir / "session"

    @property
    def stacks_dir(self) -> Path:
        """The ranks' stacks and flight-recorder dumps (``stacks.py``), kept for the user."""
        return self.run_dir / "stacks"

    def stacks_dumps(self, rank: int) -> Path:
        """Every stack dump rank ``rank``'s faulthandler wrote, appended; its first line names
        the rank's main thread."""
        return self.stacks_dir / f".live_rank_{rank}.txt"

    def stacks(self, rank: int) -> Path:
        """Rank ``rank``'s stacks as taken last (a timeout takes them before the stop)."""
        return self.stacks_dir / f"rank_{rank}.txt"

    def flight_recorder(self, rank: int) -> Path:
        """Rank ``rank``'s dump of the collectives' flight recorder (a pickle of torch's)."""
        return self.stacks_dir / f"flight_rank_{rank}.pkl"

    def flight_recorder_error(self, rank: int) -> Path:
        """Why rank ``rank``'s flight-recorder dump failed, when it did (one line of text)."""
        return self.stacks_dir / f"flight_rank_{rank}.error.txt"

    def error(self, rank: int) -> Path:
        """Rank ``rank``'s ``ErrorRecord``, when it failed (kept for the user)."""
        return self.run_dir / f"error_{rank}.pkl"

    def results(self, rank: int) -> list[Path]:
        """Where rank ``rank``'s result may be, preferred first: the results twin when there is
        one (the rank falls back to the run directory when the tmpfs is full)."""
        name = result_name(rank)
        places = [self.run_dir / name]
        return [self.results_dir / name, *places] if self.results_dir else places

    def bulk_files(self) -> list[Path]:
        """Files that may be large and are of no use once the call has ended: the payload and
        results in the run directory (with their partial ``.tmp`` twins)."""
        found = [p for p in self.run_dir.glob(f"{self.RESULT_GLOB}*") if p.is_file()]
        return [self.payload, *found]
