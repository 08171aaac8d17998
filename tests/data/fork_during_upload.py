"""Fork while a VolumeWriter upload runs on a background thread, as a DataLoader starts its
workers while ``dcp.async_save`` uploads, with the process's first use of ``tempfile`` made slow.
Prints, as JSON, whether the child could still use ``tempfile``.

    python fork_during_upload.py CHECKPOINT_URL S3_ENDPOINT

Run by ``test_data_checkpoint.py`` in a fresh interpreter: ``tempfile`` must not have been used
yet. CPython does not reset ``tempfile``'s module lock in a forked child; a child forked while
another thread holds it (on a process's first ``gettempdir()``) waits on it forever.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import threading
import time

import torch
import torch.distributed.checkpoint as dcp

from serverless_gpu.data import VolumeWriter


def main() -> None:
    url, endpoint = sys.argv[1], sys.argv[2]
    assert tempfile.tempdir is None, "tempfile was used before the check could make it slow"
    inside = threading.Event()
    release = threading.Event()
    find_tempdir = tempfile._get_default_tempdir  # type: ignore[attr-defined]

    def slow_find_tempdir() -> str:
        # A slow disk off the main thread: tempfile holds its module lock all along.
        if threading.current_thread() is not threading.main_thread():
            inside.set()
            release.wait(30)
        return str(find_tempdir())

    tempfile._get_default_tempdir = slow_find_tempdir  # type: ignore[attr-defined]
    writer = VolumeWriter(url, storage_options={"endpoint_url": endpoint})
    save = threading.Thread(
        target=dcp.save,
        args=({"w": torch.ones(4)},),
        kwargs={"storage_writer": writer, "no_dist": True},
    )
    save.start()
    inside.wait(5)  # set only where the upload thread is the first to use tempfile
    pid = os.fork()
    if pid == 0:
        tempfile.gettempdir()
        os._exit(0)
    deadline = time.monotonic() + 10
    exited = False
    while not exited and time.monotonic() < deadline:
        exited = os.waitpid(pid, os.WNOHANG)[0] != 0
        time.sleep(0.02)
    if not exited:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    release.set()
    save.join(60)
    report = {
        "child_used_tempfile": exited,
        "upload_thread_found_the_tempdir": inside.is_set(),
        "saved": not save.is_alive(),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
