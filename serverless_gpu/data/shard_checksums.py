"""A checksum per checkpoint shard: recorded when it is saved, checked when it is loaded.

torch's reader has none: flipped bytes in a shard load "successfully" as wrong values. Each
shard's size and checksum are summed while it is written, from each piece the writer has just
handed the kernel (still in the CPU's cache: a thread that read the shard back from the page
cache behind the writer, a second copy of every byte, left the save at 0.94x of the same
without a checksum where this gives 0.95x-0.97x: ``benchmarks/checkpoint.py --reps 5`` on a
2-core machine, which measures the checksum's cost beside the save and load figures).
The checksum is xxHash's XXH3-64 when the ``xxhash`` package is installed (the ``data``
extra installs it: about 10 GB/s and more a core, and it lets other threads run while it sums), else
``zlib.crc32`` (the standard library's fastest, about 2 GB/s a core: at the disk's speed, it
cost a 2-core machine's save and load a fifth of their rate). The algorithm's name is recorded
with each sum, so a reader checks with the writer's algorithm. They travel in ``.metadata``,
as one more attribute of each item's storage record (``shard_checksum``: a plain tuple
``(size, algorithm, value)``, which torch's own reader unpickles and ignores); older saves
recorded ``shard_crc32`` (``(size, crc32)``), still checked; a shard saved without either
(torch's writer, ``checksums=False``) is not checked.
"""

from __future__ import annotations

import os
import warnings
import zlib
from typing import IO, Any, NamedTuple

from serverless_gpu.data.errors import CorruptCheckpointError

__all__ = [
    "ATTR",
    "ReadSum",
    "Recorded",
    "Sum",
    "WrittenSum",
    "algorithm",
    "check",
    "checked",
    "sum_of",
]

ATTR = "shard_checksum"
"""The attribute of an item's ``_StorageInfo`` holding its shard's ``(size, algorithm, value)``."""
_CRC32_ATTR = "shard_crc32"
"""What older saves recorded there instead: ``(size, crc32)``."""
CRC32, XXH3 = "crc32", "xxh3_64"
_BLOCK = 8 << 20


class Recorded(NamedTuple):
    """A shard's size and checksum, and the algorithm that summed it."""

    size: int
    algorithm: str
    value: int

    def __str__(self) -> str:
        digits = 8 if self.algorithm == CRC32 else 16
        return f"{self.size} bytes, {self.algorithm} {self.value:0{digits}x}"


def algorithm() -> str:
    """The checksum a save records: XXH3-64 where ``xxhash`` imports, else crc32. Asked per
    shard (an import already done is a dictionary look-up)."""
    try:
        import xxhash  # noqa: F401
    except ImportError:
        return CRC32
    return XXH3


class Sum:
    """A running checksum of ``algorithm`` (``ImportError`` for XXH3-64 without ``xxhash``)."""

    def __init__(self, name: str) -> None:
        self.algorithm = name
        self._crc = 0
        self._xxh: Any = None
        if name == XXH3:
            import xxhash

            self._xxh = xxhash.xxh3_64()
        elif name != CRC32:
            raise ValueError(f"unknown checksum algorithm {name!r}")

    def update(self, data: Any) -> None:
        if self._xxh is not None:
            self._xxh.update(data)
        else:
            self._crc = zlib.crc32(data, self._crc)

    def value(self) -> int:
        return int(self._xxh.intdigest()) if self._xxh is not None else self._crc


def can_check(name: str) -> bool:
    """Whether this process has ``name``'s implementation (XXH3-64 needs ``xxhash``)."""
    try:
        Sum(name)
    except (ImportError, ValueError):
        return False
    return True


class WrittenSum:
    """The checksum of a file summed from the bytes its writer hands the kernel, as it writes
    them (still in the CPU's cache: no second read of them). A file not written in one pass
    from its start (a seek) is summed again from the file at the end."""

    def __init__(self, name: str) -> None:
        self._sum = Sum(name)
        self._at = 0
        self._in_order = True

    def wrote(self, offset: int, data: memoryview) -> None:
        if offset != self._at:
            self._in_order = False
        elif self._in_order:
            self._sum.update(data)
            self._at += len(data)

    def result(self, path: str | os.PathLike[str]) -> Recorded:
        size = os.path.getsize(path)
        if self._in_order and self._at == size:
            return Recorded(size, self._sum.algorithm, self._sum.value())
        with open(path, "rb") as stream:
            return sum_of(stream, self._sum.algorithm)


def sum_of(stream: IO[bytes], name: str) -> Recorded:
    """The size and ``name`` checksum of what ``stream`` holds from its position to its end."""
    view = memoryview(bytearray(_BLOCK))
    summed, size = Sum(name), 0
    while got := stream.readinto(view):  # type: ignore[attr-defined]
        summed.update(view[:got])
        size += got
    return Recorded(size, name, summed.value())


def recorded(info: Any) -> Recorded | None:
    """The checksum recorded for the shard of an item's storage record, if any."""
    value = getattr(info, ATTR, None)
    if isinstance(value, tuple) and len(value) == 3:
        return Recorded(int(value[0]), str(value[1]), int(value[2]))
    value = getattr(info, _CRC32_ATTR, None)
    if isinstance(value, tuple) and len(value) == 2:
        return Recorded(int(value[0]), CRC32, int(value[1]))
    return None


def checked(info: Any) -> Recorded | None:
    """:func:`recorded`, where this process can check it: a sum of an algorithm it lacks
    (XXH3-64 without ``xxhash``) is not checked, with a warning that says how to."""
    want = recorded(info)
    if want is None or can_check(want.algorithm):
        return want
    warnings.warn(
        f"not checking checkpoint shard {getattr(info, 'relative_path', '?')}: it was saved "
        f"with a {want.algorithm} checksum, which needs the xxhash package here "
        "(pip install xxhash, or serverless-gpu[data]); pass verify=False to silence this",
        stacklevel=3,
    )
    return None


class ReadSum:
    """The checksum of a shard summed from the bytes a load reads anyway, as they pass, in
    offset order: what the load skips (an archive's header, an item left to torch's reader,
    parts of the shard another rank loads) is read for the sum through ``read_at``. So a load
    checks its shards without a second pass over them."""

    def __init__(self, read_at: Any, name: str) -> None:
        self._read_at = read_at
        """``read_at(view, offset) -> bytes read``: fills ``view`` from ``offset``."""
        self.at = 0
        self._sum = Sum(name)

    def feed(self, start: int, data: memoryview) -> None:
        """The bytes from ``start`` that the load just read."""
        end = start + len(data)
        if end <= self.at:
            return
        if start > self.at:
            self._catch_up(start)
        self._sum.update(data[self.at - start :])
        self.at = end

    def finish(self, size: int) -> Recorded:
        """The sum of the whole shard of ``size`` bytes."""
        self._catch_up(size)
        return Recorded(self.at, self._sum.algorithm, self._sum.value())

    def _catch_up(self, end: int) -> None:
        view = memoryview(bytearray(min(_BLOCK, max(end - self.at, 1))))
        while self.at < end:
            got = self._read_at(view[: min(len(view), end - self.at)], self.at)
            if not got:
                return  # shorter than it should be: the sizes differ, which says so
            self._sum.update(view[:got])
            self.at += got


def check(shard: str, checkpoint: str | os.PathLike[str], found: Recorded, want: Recorded) -> None:
    """Raise :class:`CorruptCheckpointError` naming ``shard`` and its step when it differs."""
    if found != want:
        step = os.fspath(checkpoint).rstrip("/").rsplit("/", 1)[-1]
        raise CorruptCheckpointError(
            f"checkpoint shard {shard} of step {step} does not match what was saved "
            f"({found}; saved: {want}): its bytes changed after the save. Load an earlier step "
            "(latest_checkpoint passes over damaged ones), or pass verify=False to "
            "VolumeReader to load it as it is"
        )
