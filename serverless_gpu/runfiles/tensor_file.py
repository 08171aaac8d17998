"""Results with tensors: one file holding a pickle, then every storage's bytes, page-aligned.

The rank maps the file and copies each storage into it with ``Tensor.copy_``, so torch's
threads fault the fresh tmpfs pages in parallel, where a ``write()`` into tmpfs is one
thread under the inode lock (``benchmarks/tmpfs_write.py`` measures both). CUDA tensors go
through pinned buffers (:mod:`cuda_copy`). The caller maps the file privately: its tensors
are views of the mapping, read when first touched.

A store into a mapped page that the filesystem cannot back kills the process with SIGBUS
instead of failing a ``write()``. The mapped writer therefore reserves the file's pages
(``posix_fallocate``) before it stores into them: other writers fill the same tmpfs between
any free-space check and the stores. It reserves chunk by chunk in a thread, each chunk's
stores waiting for that chunk (:mod:`file_space`). It is used only where the folder seems to
have room for every local rank's result of this size; elsewhere, or where the filesystem
cannot reserve space, :func:`dump` writes the same file with ``write()``. A full folder
reaches the caller of :func:`dump` as an ``OSError`` (``ENOSPC``) from either writer.
"""

from __future__ import annotations

import ctypes
import io
import itertools
import os
import pickle
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import cloudpickle

from serverless_gpu.runfiles import cuda_copy, file_space

MAGIC = b"SGPUTEN1"
_HEADER = struct.Struct("<8sQ")  # magic, length of the pickle that follows
_ALIGN = 4096
_MARGIN_BYTES = 64 << 20
_MIN_THREADS = 4


class UnsupportedStorage(Exception):
    """A storage this format does not carry (on a device other than CPU and CUDA)."""


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


class _StoragePickler(cloudpickle.Pickler):
    """Pickles everything but storages, which it lays out in the data section instead."""

    def __init__(self, file: BinaryIO, torch: Any) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.torch = torch
        self.storages: list[tuple[int, Any]] = []
        """(offset in the data section, untyped storage), each storage once."""
        self.data_bytes = 0
        self._offsets: dict[int, int] = {}

    def persistent_id(self, obj: Any) -> Any:
        torch = self.torch
        if isinstance(obj, torch.storage.TypedStorage):
            untyped, dtype = obj._untyped_storage, str(obj.dtype).removeprefix("torch.")
        elif isinstance(obj, torch.UntypedStorage):
            untyped, dtype = obj, None
        else:
            return None
        if untyped.device.type not in ("cpu", "cuda"):
            raise UnsupportedStorage(untyped.device.type)
        # Tensors that view one storage share its bytes, as in torch.save.
        offset = self._offsets.get(untyped._cdata)
        if offset is None:
            offset = self._offsets[untyped._cdata] = self.data_bytes
            self.storages.append((offset, untyped))
            self.data_bytes = _aligned(offset + untyped.nbytes())
        return ("storage", offset, untyped.nbytes(), dtype)


def split(obj: Any, torch: Any) -> tuple[bytes, list[tuple[int, Any]]]:
    """``obj`` pickled as :func:`dump` pickles it, without its storages, and the storages left
    out, each with the offset its persistent id names (``("storage", offset, nbytes, dtype)``).
    Raises :class:`UnsupportedStorage` for a storage on a device other than CPU and CUDA."""
    meta = io.BytesIO()
    pickler = _StoragePickler(meta, torch)
    pickler.dump(obj)
    return meta.getvalue(), pickler.storages


def typed(untyped: Any, dtype: str | None, torch: Any) -> Any:
    """The storage a persistent id names, typed even where the writer saw an untyped storage,
    as torch.load does: a tensor of the newer dtypes (float8, uint16, complex32, ...) pickles its
    storage untyped and is rebuilt from ``storage._untyped_storage``."""
    return torch.storage.TypedStorage(
        wrap_storage=untyped,
        dtype=torch.uint8 if dtype is None else getattr(torch, dtype),
        _internal=True,
    )


def dump(
    obj: Any, path: Path, torch: Any, local_ranks: int = 1, mapped: bool | None = None
) -> None:
    """Write ``obj`` to ``path`` (not atomically: the caller renames a temporary file).
    ``mapped`` picks the writer; by default :func:`use_mapping` does."""
    meta = io.BytesIO()
    pickler = _StoragePickler(meta, torch)
    pickler.dump(obj)
    data_start = _aligned(_HEADER.size + len(meta.getbuffer()))
    total = data_start + pickler.data_bytes
    if mapped is None:
        mapped = use_mapping(path, pickler.storages, pickler.data_bytes * local_ranks, torch)
    with open(path, "wb") as f:
        f.write(_HEADER.pack(MAGIC, len(meta.getbuffer())))
        f.write(meta.getbuffer())
        f.truncate(total)
        if mapped and pickler.data_bytes > 0:
            with file_space.Reservation(f.fileno(), total) as reserved:
                into = _map(path, total, torch) if reserved.supported else None
                if into is not None:
                    _store(into, data_start, pickler.storages, torch, reserved.wait)
                    return
    with open(path, "r+b") as f:
        for offset, storage in pickler.storages:
            f.seek(data_start + offset)
            f.write(host_buffer(storage, torch))


def _store(
    into: Any,
    data_start: int,
    storages: list[tuple[int, Any]],
    torch: Any,
    ready: Callable[[int], None],
) -> None:
    """Copy the storages into the mapped file in file order, each chunk once ``ready`` says its
    pages are reserved; CUDA storages next to each other go through :mod:`cuda_copy` together."""
    for on_gpu, group in itertools.groupby(storages, key=lambda s: s[1].device.type == "cuda"):
        parts = [(data_start + offset, _as_bytes(storage, torch)) for offset, storage in group]
        if on_gpu:
            cuda_copy.copy_into(into, parts, torch, ready)
            continue
        for offset, src in (piece for part in parts for piece in file_space.pieces(*part)):
            ready(offset + src.numel())
            into[offset : offset + src.numel()].copy_(src)


def _map(path: Path, nbytes: int, torch: Any) -> Any:
    """The file as a shared uint8 tensor, or None where it cannot be mapped shared."""
    try:
        return torch.from_file(str(path), shared=True, size=nbytes, dtype=torch.uint8)
    except RuntimeError:  # torch reports a failed open or mmap as RuntimeError
        return None


def use_mapping(path: Path, storages: list[tuple[int, Any]], room: int, torch: Any) -> bool:
    """The mapped writer where the folder has ``room`` to spare and it is the faster one: with a
    CUDA storage (one copy instead of two) or several torch threads. With one thread a copy into
    fresh mapped pages ran at half the speed of ``write()`` (``benchmarks/tmpfs_write.py``)."""
    st = os.statvfs(path.parent)
    if st.f_bavail * st.f_frsize < room + _MARGIN_BYTES:
        return False
    on_gpu = any(storage.device.type == "cuda" for _, storage in storages)
    return on_gpu or torch.get_num_threads() >= _MIN_THREADS


def _as_bytes(storage: Any, torch: Any) -> Any:
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def host_buffer(storage: Any, torch: Any) -> memoryview:
    host = _as_bytes(storage, torch).cpu()
    buffer = (ctypes.c_char * host.numel()).from_address(host.data_ptr())
    buffer._keep = host  # the tensor owns the memory
    return memoryview(buffer)


def is_tensor_file(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(len(MAGIC)) == MAGIC


def load(path: Path, torch: Any) -> Any:
    """Read what :func:`dump` wrote; storages are private, lazily read views of the file."""
    with open(path, "rb") as f:
        _, meta_len = _HEADER.unpack(f.read(_HEADER.size))
        meta = f.read(meta_len)
    data_start = _aligned(_HEADER.size + meta_len)
    size = path.stat().st_size
    mapping = (
        torch.UntypedStorage.from_file(str(path), shared=False, nbytes=size)
        if size > data_start
        else None
    )

    class _Unpickler(pickle.Unpickler):
        def persistent_load(self, pid: Any) -> Any:
            _, offset, nbytes, dtype = pid
            start = data_start + offset
            untyped = (
                mapping[start : start + nbytes] if mapping is not None else torch.UntypedStorage(0)
            )
            return typed(untyped, dtype, torch)

    return _Unpickler(io.BytesIO(meta)).load()
