"""What a finished run's files become: its bulk (payload, results) deleted once read, or its
unread results moved from the tmpfs twin into the run directory."""

from __future__ import annotations

import contextlib
import os
import shutil

from serverless_gpu.caller.runrecord import note_results_gone
from serverless_gpu.runfiles.rundirs import release_run
from serverless_gpu.wire.runpaths import RunPaths


def drop_bulk_files(paths: RunPaths, because: str) -> None:
    """Payload and result files can be GBs; logs and error records stay. The record says why
    they went (``from_run_id`` tells that from a deletion by anything else)."""
    note_results_gone(paths.run_dir, because)
    for path in paths.bulk_files():
        path.unlink(missing_ok=True)
    if paths.results_dir is not None:
        shutil.rmtree(paths.results_dir, ignore_errors=True)  # mapped results keep their pages
    release_run(paths.run_dir)  # the call is over: pruning may take its directory now


def spill_results(paths: RunPaths) -> bool:
    """A finished run nobody reads yet: its results move from the tmpfs twin into the run
    directory (disk, not memory), the payload goes, and the run's descriptor is let go (its
    unread results keep the directory from pruning). False, and nothing released, where the
    run directory has no room: the results then wait in the twin, as the run's lock does."""
    paths.payload.unlink(missing_ok=True)
    twin = paths.results_dir
    if twin is not None:
        try:
            for source in sorted(twin.glob(RunPaths.RESULT_GLOB)):
                _move(source, paths.run_dir / source.name)
        except OSError:
            return False
        shutil.rmtree(twin, ignore_errors=True)
    release_run(paths.run_dir)
    return True


def _move(source: os.PathLike[str], target: os.PathLike[str]) -> None:
    """Copied under a temporary name, then renamed: a reader never sees half a result."""
    partial = f"{os.fspath(target)}.spill"
    try:
        shutil.copyfile(source, partial)
        os.replace(partial, target)
    except OSError:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(partial)  # a full disk keeps no half copy
        raise
    os.unlink(source)
