"""Private per-run directories: payload, per-rank logs, results and error records.

They live under ``$SERVERLESS_GPU_RUNS_DIR`` (default: ``<tmp>/serverless-gpu-<uid>``). Bulk
files are deleted once a call returns; logs of the newest runs are kept for the user and older
run directories are pruned.

Result files go to a twin folder on a tmpfs when there is a large enough one (``/dev/shm``):
written there they never wait for disk write-back, and the caller maps them straight from
memory. ``$SERVERLESS_GPU_RESULTS_DIR`` names another root, or ``off`` keeps them in the run
directory.

**Roots.** A default root (``<tmp>/serverless-gpu-<uid>``, ``/dev/shm/serverless-gpu-<uid>``)
sits in a folder every user can write to, so another user may have put something at its name
first. It is created with ``mkdir(0700)`` and then opened with ``O_NOFOLLOW``: a symlink, a
non-directory, a folder of another user or one whose mode is not exactly 0700 is refused with
:class:`RunsDirError`, never followed, chmod'ed or pruned. Once verified it cannot be swapped:
the tmp folders are sticky, so only its owner (us) may rename or remove it. A root named in the
environment is the user's own choice and may be a symlink; it must be a directory owned by us
and not writable by other users. We chmod it to 0700 only when we created it; an existing one
keeps its mode (each run directory in it is 0700 anyway).

**Pruning.** Only what carries our marks (named in ``runpaths.py``) is ever deleted: a run
directory has a run's name and holds a :data:`MARKER` file; a results twin has a run's name and
a link to its run directory; a launcher log has a launcher log's name. Beyond the
newest ``$SERVERLESS_GPU_KEEP_RUNS`` (20) of each kind, one is deleted only when it is not live
and, unless it is a finished run of the pruning process itself, older than :data:`GRACE_S`. A
run is live while its caller holds the ``flock`` on its marker, from :func:`new_run_dir` until
:func:`release_run` (or the caller's exit: the kernel drops the lock of a dead process), and
after that while it holds result files its caller, still running, has not read; a
launcher log while the caller that wrote it (its pid, not started after the log's last write)
runs. A twin goes once its run directory is gone.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import resource
import shutil
import stat
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psutil

from serverless_gpu.common import settings
from serverless_gpu.runfiles.private_dirs import PrivateDirError, default_private_dir, private_dir
from serverless_gpu.wire.runpaths import (
    LAUNCHER_LOG,
    MARKER,
    RUN_NAME,
    TWIN_OWNER,
    RunPaths,
    launcher_log,
    run_dir_name,
)

RUNS_DIR_ENV = settings.RUNS_DIR.name
KEEP_RUNS_ENV = settings.KEEP_RUNS.name
RESULTS_DIR_ENV = settings.RESULTS_DIR.name
GRACE_S = 600.0
"""Nothing younger than this is pruned: a run that is being set up, a log the user was just
pointed at."""
_CLOCK_SLACK_S = 1.0
"""A process's start time is derived from the boot time, which the kernel reports in whole
seconds and moves when the clock is set: start times are compared with this much slack."""
MIN_TMPFS_BYTES = 1 << 30
"""A smaller /dev/shm (Docker's default is 64 MB) is left to NCCL and DataLoader workers."""

_held: dict[Path, int] = {}
"""Run directory -> the descriptor of its marker, locked, for each live run of this process."""
_held_lock = threading.RLock()
"""Reentrant: a dropped handle's finalizer may release its run from a garbage collection that
starts inside one of these short blocks."""


def storage_hint(folder: Path, code: int | None) -> str:
    """What to do when a file of a run in ``folder`` could not be written (``code``: the
    errno), for every file of a run: the run directory, the payload, the results."""
    if code == errno.EROFS:
        return f"{folder} is read-only: set {RUNS_DIR_ENV} to a writable folder."
    if code == errno.EFBIG:
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        if limit != resource.RLIM_INFINITY:
            return f"The file passed this process's file-size limit (ulimit -f, {limit:,} bytes)."
    return f"Free space in {folder} or set {RUNS_DIR_ENV} to a folder with more room."


class RunsDirError(PrivateDirError):
    """A runs or results root is not safe to use (a symlink, another user's, open to others)."""


def runs_root() -> Path:
    configured = settings.RUNS_DIR.read()
    if configured:
        return _configured_root(Path(configured), RUNS_DIR_ENV)
    root = Path(tempfile.gettempdir()) / _user_dir()
    try:
        return _default_root(root, RUNS_DIR_ENV)
    except OSError as exc:  # not writable: a RunsDirError says what to do
        raise RunsDirError(f"cannot create {root} ({exc.strerror}); set {RUNS_DIR_ENV}") from exc


def results_root() -> Path | None:
    """The root of the results twins, or None (results then stay in the run directory)."""
    configured = settings.RESULTS_DIR.read()
    if configured == "off":
        return None
    if configured:
        return _configured_root(Path(configured), RESULTS_DIR_ENV)
    try:
        shm = os.statvfs("/dev/shm")
    except OSError:
        return None
    if shm.f_blocks * shm.f_frsize < MIN_TMPFS_BYTES:
        return None
    try:
        return _default_root(Path("/dev/shm") / _user_dir(), RESULTS_DIR_ENV)
    except OSError:  # read-only or full: the run directory will do
        return None


def _user_dir() -> str:
    return f"serverless-gpu-{os.getuid()}"


def _default_root(root: Path, env: str) -> Path:
    """``root`` in a folder all users share: ours, private, and not a link (see the module)."""
    return default_private_dir(root, env, "run files", RunsDirError)


def _configured_root(root: Path, env: str) -> Path:
    return private_dir(root, env, "run files", RunsDirError)


def new_run_dir(name: str) -> tuple[str, Path, Path | None]:
    """A fresh private directory for one run, the run's id, and its results twin (if any). The
    run is live (never pruned) until :func:`release_run`."""
    run_id = uuid.uuid4().hex[:12]
    root, results_base = runs_root(), results_root()
    path = root / run_dir_name(time.strftime("%Y%m%d-%H%M%S"), name, run_id)
    path.mkdir(mode=0o700)
    try:
        _hold(path)
    except OSError:  # a full disk: no half-made run is left behind
        shutil.rmtree(path, ignore_errors=True)
        raise
    results = None if results_base is None else _new_twin(results_base / path.name, path)
    prune_runs(root, keep=settings.KEEP_RUNS.read())
    if results_base is not None:
        prune_orphans(results_base)
    return run_id, path, results


def _new_twin(twin: Path, run_dir: Path) -> Path | None:
    """The run's results twin, or None where the results root has no room even for that (the
    results then go to the run directory)."""
    try:
        twin.mkdir(mode=0o700)
        # Callers with different runs directories share the results root: the link says whose
        # twin this is, so that a twin is pruned only once its own run directory is gone.
        (twin / TWIN_OWNER).symlink_to(run_dir)
    except OSError:
        shutil.rmtree(twin, ignore_errors=True)
        return None
    return twin


def _hold(run_dir: Path) -> None:
    # O_CLOEXEC: a launcher started later must not inherit the lock (flock belongs to the open
    # file, and every process sharing it would keep the run live).
    fd = os.open(
        run_dir / f"{MARKER}.new",
        os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
        0o600,
    )
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            pass  # a filesystem without flock: liveness is then read from the owner record
        os.write(fd, _own_record())
        # Under its name only once locked: a pruner never sees the marker of a live run
        # unlocked.
        os.rename(run_dir / f"{MARKER}.new", run_dir / MARKER)
    except BaseException:
        os.close(fd)
        raise
    with _held_lock:
        _held[run_dir] = fd


def _own_record() -> bytes:
    """What this process writes into its runs' markers: its pid and start time."""
    pid = os.getpid()
    if pid not in _records:  # a forked child is another owner
        _records[pid] = f"{pid} {psutil.Process(pid).create_time()!r}\n".encode()
    return _records[pid]


_records: dict[int, bytes] = {}


def release_run(run_dir: Path) -> None:
    """The call is over: its run directory may be pruned (after the grace period). Idempotent."""
    with _held_lock:
        fd = _held.pop(run_dir, None)
    if fd is not None:
        fcntl.flock(fd, fcntl.LOCK_UN)  # also for a child that inherited the descriptor by fork
        os.close(fd)


def launcher_log_path() -> Path:
    """Where this process's launcher writes its output (one log per caller process)."""
    return launcher_log(runs_root(), os.getpid())


def drop_launcher_log(path: Path) -> None:
    """Delete a launcher log that stayed empty (at a clean exit); one with text is kept."""
    try:
        st = os.lstat(path)
        if stat.S_ISREG(st.st_mode) and st.st_size == 0:
            path.unlink()
    except FileNotFoundError:
        pass


def prune_orphans(results_base: Path) -> None:
    """Results twins whose run directory no longer exists: left by a caller and launcher that
    were both killed before they could delete them (tmpfs files hold memory)."""
    for twin, _ in _ours(results_base, RUN_NAME, stat.S_ISDIR):
        owner = twin / TWIN_OWNER
        if owner.is_symlink() and not owner.exists():  # the link's target, the run dir, is gone
            shutil.rmtree(twin, ignore_errors=True)


def prune_runs(root: Path, keep: int) -> None:
    """Beyond the newest ``keep`` run directories and launcher logs, delete those that are not
    live and are older than :data:`GRACE_S`; this process's own finished runs go at once (it
    made the newer ones itself, and a loop of calls must not pile up runs for the period)."""
    # Runs in the order they were made (their markers' times): a run directory's own time moves
    # whenever a file in it changes, as late as the launcher's cleanup after the call.
    runs = [(p, st, made) for p, st in _ours(root, RUN_NAME, stat.S_ISDIR) if (made := _made(p))]
    runs.sort(key=lambda run: run[2], reverse=True)
    for path, st, _ in runs[keep:]:
        if _run_expired(path, st):
            shutil.rmtree(path, ignore_errors=True)  # never follows a link inside
    logs = sorted(_ours(root, LAUNCHER_LOG, stat.S_ISREG), key=lambda e: -e[1].st_mtime)
    for path, st in logs[keep:]:
        if _log_expired(path, st):
            path.unlink(missing_ok=True)


def _ours(
    root: Path, name: re.Pattern[str], kind: Callable[[int], bool]
) -> list[tuple[Path, os.stat_result]]:
    """Entries of ``root`` with our name pattern, of that kind (not links), owned by us."""
    found = []
    with os.scandir(root) as entries:
        for entry in entries:
            if not name.fullmatch(entry.name):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # another caller of the same user pruned it meanwhile
            if kind(st.st_mode) and st.st_uid == os.getuid():
                found.append((Path(entry.path), st))
    return found


def _made(run_dir: Path) -> float:
    """When the run was made (its marker's time), or 0.0 where it has no marker: not a run."""
    try:
        st = os.lstat(run_dir / MARKER)
    except OSError:
        return 0.0
    return st.st_mtime if stat.S_ISREG(st.st_mode) else 0.0


def _recent(st: os.stat_result) -> bool:
    return st.st_mtime > time.time() - GRACE_S


def _run_expired(run_dir: Path, st: os.stat_result) -> bool:
    try:
        fd = os.open(run_dir / MARKER, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False  # gone meanwhile
    try:
        record = os.read(fd, 100)
        ours = record == _own_record()
        if not ours and _recent(st):
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
        except BlockingIOError:
            return False  # its caller holds the lock: live
        except OSError:  # no flock on this filesystem
            if (run_dir in _held) if ours else _owner_alive(record):
                return False
        return not _results_unread(run_dir, record, ours)
    finally:
        os.close(fd)


def _results_unread(run_dir: Path, record: bytes, ours: bool) -> bool:
    """A finished run lets go of its lock at once; results its caller (still running) has
    not read yet keep the directory."""
    unread = next(run_dir.glob(RunPaths.RESULT_GLOB), None) is not None
    return unread and (ours or _owner_alive(record))


def _owner_alive(record: bytes) -> bool:
    """Whether the process that wrote ``"<pid> <start time>"`` still runs."""
    try:
        pid, started = record.split()
        return abs(psutil.Process(int(pid)).create_time() - float(started)) < _CLOCK_SLACK_S
    except (ValueError, psutil.Error):  # unreadable record, or no such process
        return False


def _log_expired(log: Path, st: os.stat_result) -> bool:
    """A process with the log's pid that started before the log's last write may be its
    writer; one started later cannot be."""
    if _recent(st):
        return False
    match = LAUNCHER_LOG.fullmatch(log.name)
    assert match is not None
    try:
        return psutil.Process(int(match[1])).create_time() > st.st_mtime + _CLOCK_SLACK_S
    except psutil.Error:
        return True  # no such process
