"""Running a job from the terminal: in the foreground until it ends, or detached.

Exit status: 0 when every rank succeeded, 1 when the run failed (the message names the rank),
124 when it timed out, 130 when it was interrupted (Ctrl-C) or cancelled (``runs cancel``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import IO

from serverless_gpu.api.scripts import script_function
from serverless_gpu.caller.console import ConsolePrinter
from serverless_gpu.caller.hooks import RunContext, register_hook, unregister_hook
from serverless_gpu.caller.runrecord import read_record, update_record
from serverless_gpu.cli.airjob import AirJob, is_air_format
from serverless_gpu.cli.jobfile import JobSpec
from serverless_gpu.common.errors import CancelledError, ConfigurationError, DistributedTimeoutError
from serverless_gpu.common.vocabulary import CLI, speaking
from serverless_gpu.wire.runpaths import RunPaths

EXIT_FAILED = 1
EXIT_TIMED_OUT = 124
EXIT_INTERRUPTED = 130
_STOP_WAIT_S = 15.0
"""How long a detached run that never started may take to stop."""
_HOOK_ORDER = 60
"""After the run record's hook, which writes the record this one adds to."""
_ANNOUNCE_WAIT_S = 180.0
"""How long ``--detach`` waits for the run to start (a first launcher imports torch)."""
_PIPE_MIN = 65536
"""A pipe's usual buffer; asked for at least, so that a small job never depends on the call."""


def run_job(job: JobSpec, output: str, announce_fd: int | None = None) -> int:
    """Run ``job`` on every rank through ``.distributed()`` (so retries, graceful stops and
    interrupts behave as for a decorated function); the exit status."""
    with speaking(CLI):  # a hint names --gpu-type, not the decorator's gpu_type=
        return _run_job(job, output, announce_fd)


def _run_job(job: JobSpec, output: str, announce_fd: int | None) -> int:
    target = job.target()
    if job.experiment_name:
        os.environ["MLFLOW_EXPERIMENT_NAME"] = job.experiment_name
    os.environ.update(job.env)  # the ranks start with the caller's environment
    options = job.config_options()
    fn = script_function(target, **options, output=output)
    runs = _CommandRuns(options["run_name"] or target.name, target.command_line(), announce_fd)
    register_hook(runs, order=_HOOK_ORDER)
    try:
        with _terminate_as_cancel(runs):
            fn.distributed()
        return 0
    except KeyboardInterrupt as exc:
        _say(f"run {runs.last_id} stopped: {str(exc) or 'interrupted (Ctrl-C)'}")
        return EXIT_INTERRUPTED
    except CancelledError as exc:  # SIGTERM (runs cancel), a hook, the library
        _say(f"run {runs.last_id} {_cancel_reason(runs.last_dir, exc)}")
        return EXIT_INTERRUPTED
    except DistributedTimeoutError as exc:
        _say(f"run {runs.last_id} timed out: {exc}")  # with where each rank was
        return EXIT_TIMED_OUT
    except Exception as exc:
        if runs.last_dir is None:
            raise  # nothing started: a configuration the caller reports as such
        return _failed(runs.last_dir, exc, output)
    finally:
        unregister_hook(runs)


def _cancel_reason(run_dir: Path | None, exc: CancelledError) -> str:
    """``cancelled by ...``: the reason the run's record holds, as ``runs show`` tells it."""
    reason = str(read_record(run_dir).get("message") or "") if run_dir else ""
    if not reason:
        return f"cancelled: {exc}"
    return reason if reason.startswith("cancelled") else f"cancelled: {reason}"


def _failed(run_dir: Path, exc: BaseException, output: str) -> int:
    record = read_record(run_dir)
    rank = record.get("root_cause_rank")
    if not (isinstance(rank, int) and ConsolePrinter(output).wants(rank, "stderr")):
        # The rank's traceback was not printed live: print it now.
        sys.stderr.write("".join(traceback.format_exception(exc)))
    summary = record.get("message") or str(exc)
    logs = RunPaths(run_dir).logs
    _say(f"run {record.get('run_id', '')} failed: {summary.splitlines()[0]} (logs: {logs})")
    return EXIT_FAILED


class _CommandRuns:
    """A run hook for the runs of this command: marks their records as started from the
    command line (what ``runs cancel`` checks) and announces the first to a detaching parent."""

    def __init__(self, run_name: str, command: str, announce_fd: int | None) -> None:
        self.fields = {
            "run_name": run_name,
            "command": command,
            "cli_pid": os.getpid(),
            "detached": announce_fd is not None,
        }
        self.announce_fd = announce_fd
        self.last_id = ""
        self.last_dir: Path | None = None
        self.ctx: RunContext | None = None
        self.terms = 0
        """SIGTERMs received; each one after the first stops the ranks at once."""
        self._terms_sent = 0

    def __call__(self, ctx: RunContext) -> None:
        self.last_id, self.last_dir, self.ctx = ctx.run_id, ctx.run_dir, ctx
        ctx.idle_callbacks.append(self._cancel_on_term)
        update_record(ctx.run_dir, self.fields)
        if self.announce_fd is not None:
            _announce(self.announce_fd, ctx.run_id)
            self.announce_fd = None

    def _cancel_on_term(self) -> None:
        """Cancel the run for each SIGTERM received: from the waiting loop, which may take the
        handle's locks, never from the signal handler."""
        while self.ctx is not None and self._terms_sent < self.terms:
            self._terms_sent += 1
            self.ctx.cancel(CANCELLED_BY_SIGTERM)


CANCELLED_BY_SIGTERM = "cancelled by SIGTERM (`serverless-gpu runs cancel`, or another process)"


@contextlib.contextmanager
def _terminate_as_cancel(runs: _CommandRuns) -> Iterator[None]:
    """SIGTERM (``runs cancel``, a job scheduler) cancels the run, recorded as such; before
    any run has started it stops the command as Ctrl-C does."""

    def on_term(signum: int, frame: FrameType | None) -> None:
        runs.terms += 1
        if runs.ctx is None:
            raise KeyboardInterrupt(CANCELLED_BY_SIGTERM)

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _say(text: str) -> None:
    print(f"serverless-gpu: {text}", file=sys.stderr, flush=True)


def _announce(fd: int, run_id: str) -> None:
    """Tell the detaching parent the run's id, then leave the terminal's streams: the run's
    output is in its per-rank logs and its outcome in its record."""
    os.write(fd, f"{run_id}\n".encode())
    os.close(fd)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    os.close(devnull)


def detach(job: JobSpec | AirJob) -> int:
    """Start the job in a process of its own session and return once it has started."""
    with tempfile.TemporaryFile() as early_output:
        child, read_end = _start_detached(job, early_output)
        try:
            run_id = _read_announcement(read_end)
        except KeyboardInterrupt:  # Ctrl-C before the run started: it must not start unseen
            child.terminate()
            child.wait(_STOP_WAIT_S)
            return EXIT_INTERRUPTED
        finally:
            os.close(read_end)
        if run_id:
            print(run_id)
            _say(
                f"run {run_id} started detached (pid {child.pid}); follow it with "
                f"`serverless-gpu runs logs {run_id} --follow`, stop it with "
                f"`serverless-gpu runs cancel {run_id}`"
            )
            return 0
        if child.poll() is None:  # started nothing in time: it must not run on unseen
            child.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(_STOP_WAIT_S)
        early_output.seek(0)
        sys.stderr.write(early_output.read().decode(errors="replace"))
        _say("the detached run did not start")
        return child.returncode or EXIT_FAILED


def _start_detached(
    job: JobSpec | AirJob, early_output: IO[bytes]
) -> tuple[subprocess.Popen[bytes], int]:
    """The detached child, and the pipe on which it announces its run. The job (its ``env``
    may hold tokens) goes through a pipe too: a command line is every local user's to read."""
    job_fd = _job_pipe(job)
    read_end, write_end = os.pipe()
    try:
        child = subprocess.Popen(
            [
                *(sys.executable, "-m", "serverless_gpu.cli", "run", "--output", "none"),
                *("--announce-fd", str(write_end), "--job-fd", str(job_fd)),
            ],
            pass_fds=(write_end, job_fd),
            stdin=subprocess.DEVNULL,
            stdout=early_output,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C and a closed terminal do not reach it
        )
    except BaseException:
        os.close(read_end)
        raise
    finally:
        os.close(write_end)
        os.close(job_fd)
    return child, read_end


def _job_pipe(job: JobSpec | AirJob) -> int:
    """The read end of a pipe that holds the job's JSON, whole, its write end closed: the
    child reads it to the end at once, and nobody ever waits on a full pipe."""
    data = job.model_dump_json().encode()
    read_end, write_end = os.pipe()
    try:
        with contextlib.suppress(OSError, AttributeError):  # a larger buffer, where allowed
            fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, max(len(data), _PIPE_MIN))
        os.set_blocking(write_end, False)
        view = memoryview(data)
        while view:
            view = view[os.write(write_end, view) :]
    except BlockingIOError:
        os.close(read_end)
        raise ConfigurationError(
            f"the job is too large to pass to a detached run ({len(data)} bytes; the pipe "
            "takes fewer): pass large values in files rather than in env or args"
        ) from None
    finally:
        os.close(write_end)
    return read_end


def read_job(fd: int) -> JobSpec | AirJob:
    """The job a detaching parent put in the pipe ``fd`` (see :func:`_job_pipe`), of either
    format (air's has a ``compute`` block)."""
    with os.fdopen(fd, "rb") as pipe:
        data = json.loads(pipe.read())
    return AirJob.model_validate(data) if is_air_format(data) else JobSpec.model_validate(data)


def _read_announcement(fd: int) -> str:
    """The run id the child writes once its run has started; empty if it ended first."""
    deadline = time.monotonic() + _ANNOUNCE_WAIT_S
    data = b""
    while b"\n" not in data:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return ""
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            return ""
        chunk = os.read(fd, 100)
        if not chunk:
            return ""
        data += chunk
    return data.decode().strip()
