"""CUDA storages into a mapped result file at memory speed.

A device -> host copy into pageable memory, such as the mapped result file, goes through the
driver's own small pinned buffers and one CPU thread: about 0.9 GB/s into a fresh tmpfs file on
an H200 machine. Here the bytes go through a few pinned buffers instead, a chunk at a time, on a
side stream: the device fills one buffer (at about 50 GB/s) while torch's CPU threads copy the
previous one into the mapping, and each chunk is stored once the file's pages under it are
reserved (:mod:`file_space`).

Page-locking the mapped file itself (``cudaHostRegister``) and letting the device write it was
measured too and lost: pinning fresh pages walks them in one thread, 0.5 s a GiB there
(``benchmarks/results/cuda-results-1xH200-register.txt``).

Where no pinned memory can be had, torch's own copy does it. Each rank copies into its own file:
nothing here is shared between local ranks. The side stream first waits for the current stream
of each tensor's device, so the result holds what the user's queued work computed. Every wait
for the device is bounded: the copies are polled through CUDA events up to a deadline.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

from serverless_gpu.runfiles import file_space

STAGED = True
"""Copy through pinned buffers (else torch's plain copy); benchmarks turn it off to compare."""
BUFFERS = 2
MIN_STAGED_BYTES = 1 << 20
"""Less than this is copied plainly: setting up the buffers costs more."""
_POLL_S = 0.0002

Part = tuple[int, Any]
"""(offset in the mapped file, contiguous uint8 CUDA tensor to copy there)."""


def copy_into(into: Any, parts: list[Part], torch: Any, ready: Callable[[int], None]) -> str:
    """Copy every CUDA tensor of ``parts`` into ``into`` (the file, mapped shared, as uint8),
    storing into ``[a, b)`` only after ``ready(b)`` returned. Returns the way taken,
    ``staged`` or ``plain``."""
    chunks = [chunk for offset, src in parts for chunk in file_space.pieces(offset, src)]
    staged = STAGED and sum(src.numel() for _, src in chunks) >= MIN_STAGED_BYTES
    if staged and _staged(into, chunks, torch, ready):
        return "staged"
    for offset, src in chunks:
        ready(offset + src.numel())
        into[offset : offset + src.numel()].copy_(src)
    return "plain"


def _staged(into: Any, chunks: list[Part], torch: Any, ready: Callable[[int], None]) -> bool:
    """Copy through pinned buffers, the device filling one while the CPU empties another.
    False where no pinned memory can be had (nothing was copied then)."""
    try:
        buffers = [
            torch.empty(file_space.CHUNK_BYTES, dtype=torch.uint8, pin_memory=True)
            for _ in range(BUFFERS)
        ]
    except RuntimeError:  # torch reports a failed cudaHostAlloc as RuntimeError
        return False
    streams = {}
    for device in dict.fromkeys(src.device for _, src in chunks):
        streams[device] = torch.cuda.Stream(device)
        streams[device].wait_stream(torch.cuda.current_stream(device))
    pending = deque(chunks)
    in_flight: deque[tuple[int, int, Any, Any]] = deque()  # (offset, bytes, buffer, event)

    def fill(buffer: Any) -> None:
        offset, src = pending.popleft()
        stream = streams[src.device]
        with torch.cuda.stream(stream):
            buffer[: src.numel()].copy_(src, non_blocking=True)
            event = torch.cuda.Event()
            event.record(stream)
        in_flight.append((offset, src.numel(), buffer, event))

    for buffer in buffers[: len(pending)]:
        fill(buffer)
    while in_flight:
        offset, nbytes, buffer, event = in_flight.popleft()
        _wait(event, nbytes)
        ready(offset + nbytes)
        into[offset : offset + nbytes].copy_(buffer[:nbytes])  # with torch's CPU threads
        if pending:
            fill(buffer)
    return True


def _wait(event: Any, nbytes: int) -> None:
    limit = file_space.deadline(nbytes)
    while not event.query():
        if time.monotonic() > limit:
            raise TimeoutError(f"copying {nbytes} bytes from the GPU did not finish in time")
        time.sleep(_POLL_S)
