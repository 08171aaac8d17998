"""CUDA storages into a mapped result file at memory speed.

A device -> host copy into pageable memory, such as the mapped result file, goes through the
driver's own small pinned buffers with one CPU thread: 1.0-1.4 GB/s on an H200
(``benchmarks/tmpfs_write.py``). Two faster ways, tried in the order of :data:`ORDER`:

* ``register``: the mapped pages of the file (already allocated: the writer reserved them) are
  page-locked for the device (``cudaHostRegister``) and the device writes them directly;
* ``staged``: chunks go through a few pinned buffers on a side stream, each chunk copied into
  the mapping by torch's CPU threads while the device fills the next buffer;

and ``plain``, torch's own copy, where neither can be set up (registration refused, no pinned
memory). Each rank copies into its own file: nothing here is shared between local ranks.

The copies run on the current stream of each tensor's device, or on a side stream that waits
for it, so the result holds what the user's queued work computed. Every wait for the device is
bounded: the copies are polled through CUDA events up to a deadline that grows with the size.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

ORDER: tuple[str, ...] = ("register", "staged")
"""The fast ways, best first (``plain`` is always the last resort); benchmarks change it to
compare them."""
CHUNK_BYTES = 64 << 20
BUFFERS = 2
REGISTER_THREADS = 4
MIN_FAST_BYTES = 1 << 20
"""A run of CUDA storages smaller than this is copied plainly: setting up costs more."""
_PORTABLE = 1  # cudaHostRegisterPortable: page-locked for every device's context
_POLL_S = 0.0002
_DEADLINE_S = 60.0
_SLOWEST_BYTES_PER_S = 100e6
"""Deadline = _DEADLINE_S + bytes at this rate: far beyond any working copy."""

Part = tuple[int, Any]
"""(offset in the mapped file, contiguous uint8 CUDA tensor to copy there)."""


def copy_into(into: Any, parts: list[Part], torch: Any) -> list[str]:
    """Copy every CUDA tensor of ``parts`` into ``into`` (the file, mapped shared, as uint8).
    Returns the way each run of adjacent parts took (``register``, ``staged`` or ``plain``)."""
    taken = []
    for run in _runs(parts):
        start, end = _span(run)
        ways = ORDER if end - start >= MIN_FAST_BYTES else ()
        taken.append(next((way for way in ways if _WAYS[way](into, run, torch)), "plain"))
        if taken[-1] == "plain":
            _plain(into, run)
    return taken


def _runs(parts: list[Part]) -> Iterator[list[Part]]:
    """``parts`` in file order, grouped where each starts within a page of the last one's end
    (the writer aligns storages to pages), so that one registration covers a state dict."""
    run: list[Part] = []
    for offset, src in sorted(parts, key=lambda p: p[0]):
        if run and offset - _span(run)[1] >= 4096:
            yield run
            run = []
        run.append((offset, src))
    if run:
        yield run


def _span(run: list[Part]) -> tuple[int, int]:
    last_offset, last = run[-1]
    return run[0][0], last_offset + last.numel()


def _deadline(nbytes: int) -> float:
    return time.monotonic() + _DEADLINE_S + nbytes / _SLOWEST_BYTES_PER_S


def _plain(into: Any, run: list[Part]) -> None:
    for offset, src in run:
        into[offset : offset + src.numel()].copy_(src)


def _registered(into: Any, run: list[Part], torch: Any) -> bool:
    """Page-lock the run's range of the mapping, let the devices write it, unlock it. False
    where the range cannot be page-locked (nothing was copied then)."""
    start, end = _span(run)
    cudart, device, nbytes = torch.cuda.cudart(), run[0][1].device, end - start
    pieces = _pieces(start, end)
    base = into.data_ptr()
    register = [(cudart.cudaHostRegister, base + a, b - a, _PORTABLE) for a, b in pieces]
    ok = _in_threads(torch, device, nbytes, register)
    unlock = [
        (cudart.cudaHostUnregister, base + a)
        for (a, _), done in zip(pieces, ok, strict=True)
        if done
    ]
    if not all(ok):
        _in_threads(torch, device, nbytes, unlock)
        return False
    # One copy per piece: a copy across two registrations would be taken for pageable memory.
    for offset, src in _split(run, [a for a, _ in pieces[1:]]):
        into[offset : offset + src.numel()].copy_(src, non_blocking=True)
    # The registration stays on a timeout: the device may still be writing into those pages.
    _wait([_record(torch, torch.cuda.current_stream(d)) for d in _devices(run)], nbytes)
    _in_threads(torch, device, nbytes, unlock)
    return True


def _pieces(start: int, end: int) -> list[tuple[int, int]]:
    """REGISTER_THREADS page-aligned pieces ``[a, b)`` of ``[start, end)`` (``start`` is on a
    page): pinning walks every page, and threads pin their pieces side by side."""
    n = REGISTER_THREADS
    cuts = [start + (end - start) * i // n // 4096 * 4096 for i in range(n)]
    return [(a, b) for a, b in zip(cuts, [*cuts[1:], end], strict=True) if b > a]


def _split(run: list[Part], cuts: list[int]) -> Iterator[Part]:
    """The run's parts, each cut where it crosses one of the offsets ``cuts`` (sorted)."""
    for offset, src in run:
        end = offset + src.numel()
        inside = [c for c in cuts if offset < c < end]
        for a, b in zip([offset, *inside], [*inside, end], strict=True):
            yield a, src[a - offset : b - offset]


def _in_threads(torch: Any, device: Any, nbytes: int, calls: list[tuple[Any, ...]]) -> list[bool]:
    """Each ``(function, *args)`` of ``calls`` (CUDA runtime calls) in a thread of its own, on
    ``device``, all at once: whether each succeeded. A failed runtime call is also left as its
    thread's last CUDA error, which torch would otherwise report at this thread's next kernel
    launch."""
    outcome = [False] * len(calls)

    def run(i: int) -> None:
        torch.cuda.set_device(device)
        call, *args = calls[i]
        outcome[i] = call(*args) == torch.cuda.cudart().cudaError.success

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    deadline = _deadline(nbytes)
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            raise TimeoutError(f"page-locking {nbytes} bytes for the GPU did not end in time")
    return outcome


def _staged(into: Any, run: list[Part], torch: Any) -> bool:
    """Copy through pinned buffers, the device filling one while the CPU empties another.
    False where no pinned memory can be had (nothing was copied then)."""
    try:
        buffers = [
            torch.empty(CHUNK_BYTES, dtype=torch.uint8, pin_memory=True) for _ in range(BUFFERS)
        ]
    except RuntimeError:  # torch reports a failed cudaHostAlloc as RuntimeError
        return False
    streams = {}
    for device in _devices(run):
        streams[device] = torch.cuda.Stream(device)
        streams[device].wait_stream(torch.cuda.current_stream(device))
    chunks = deque(_chunks(run))
    in_flight: deque[tuple[int, int, Any, Any]] = deque()  # (offset, bytes, buffer, event)

    def fill(buffer: Any) -> None:
        offset, src = chunks.popleft()
        stream = streams[src.device]
        with torch.cuda.stream(stream):
            buffer[: src.numel()].copy_(src, non_blocking=True)
        in_flight.append((offset, src.numel(), buffer, _record(torch, stream)))

    for buffer in buffers[: len(chunks)]:
        fill(buffer)
    while in_flight:
        offset, nbytes, buffer, event = in_flight.popleft()
        _wait([event], nbytes)
        into[offset : offset + nbytes].copy_(buffer[:nbytes])  # with torch's CPU threads
        if chunks:
            fill(buffer)
    return True


def _chunks(run: list[Part]) -> Iterator[Part]:
    for offset, src in run:
        yield from _split([(offset, src)], list(range(offset, offset + src.numel(), CHUNK_BYTES)))


def _devices(run: list[Part]) -> list[Any]:
    return list(dict.fromkeys(src.device for _, src in run))


def _record(torch: Any, stream: Any) -> Any:
    event = torch.cuda.Event()
    event.record(stream)
    return event


def _wait(events: list[Any], nbytes: int) -> None:
    deadline = _deadline(nbytes)
    while not all(event.query() for event in events):
        if time.monotonic() > deadline:
            raise TimeoutError(f"copying {nbytes} bytes from the GPU did not finish in time")
        time.sleep(_POLL_S)


_WAYS: dict[str, Callable[[Any, list[Part], Any], bool]] = {
    "register": _registered,
    "staged": _staged,
}
