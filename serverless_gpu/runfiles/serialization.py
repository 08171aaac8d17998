"""Shipping functions, arguments and results between processes with cloudpickle.

Functions and classes defined in ``__main__`` (a notebook, a script) travel by value; anything
importable travels by reference, which is cloudpickle's own rule. The payload is pickled once in
the caller and written to one file that every rank reads.
"""

from __future__ import annotations

import inspect
import io
import os
import pickle
import types
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import cloudpickle

from serverless_gpu.common import settings, sources
from serverless_gpu.common.errors import PayloadTooLargeError, SerializationError
from serverless_gpu.runfiles import tensor_file

MAX_PAYLOAD_ENV = settings.MAX_PAYLOAD_MB.name
_SEARCH_DEPTH = 4
_DYNAMIC_FILE = "<dynamic-code>"


def max_payload_bytes(configured: int | None) -> int:
    """The limit in force: the decorator's argument, else the environment, else ~100 MB."""
    return configured if configured is not None else settings.max_payload_bytes()


class _LimitReached(Exception):
    """Raised inside the pickler by the writer as soon as the payload passes its limit."""


class _LimitedWriter:
    """Collects the pickle's bytes and stops it at the limit: a 2 GB argument is refused after
    ~limit bytes were written (pickle hands a large bytes object over in one write, uncopied)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.size = 0
        self.chunks: list[bytes] = []

    def write(self, data: Any) -> int:
        n = memoryview(data).nbytes
        self.size += n
        if self.size > self.limit:
            raise _LimitReached
        self.chunks.append(bytes(data))
        return n


class _PayloadPickler(cloudpickle.Pickler):
    """cloudpickle, except that code objects keep their file name (cloudpickle writes
    ``<dynamic-code>``), so that a rank's traceback names the script or cell and quotes it."""

    def __init__(self, file: _LimitedWriter) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.writer = file
        self.filenames: set[str] = set()

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, types.CodeType) and obj.co_filename != _DYNAMIC_FILE:
            self.filenames.add(obj.co_filename)
            return _code_in_file, (obj.replace(co_filename=_DYNAMIC_FILE), obj.co_filename)
        torch = _torch()
        if torch is not None and isinstance(obj, torch.Tensor):
            self._count_storage(obj)
        return super().reducer_override(obj)

    def _count_storage(self, tensor: Any) -> None:
        # torch serializes a tensor's whole storage into memory before pickle writes it, so
        # the limit is checked first. (A tensor pickled again is a memo reference and does not
        # come here; two views of one storage are two copies of it, as pickle writes them.)
        if self.writer.size + tensor.untyped_storage().nbytes() > self.writer.limit:
            raise _LimitReached


def _code_in_file(code: types.CodeType, filename: str) -> types.CodeType:
    return code.replace(co_filename=filename)


def dump_payload(
    func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], limit: int
) -> bytes:
    """Pickle ``(func, args, kwargs)`` once, preceded by the in-memory source lines the rank
    needs for its tracebacks; name the culprit when it cannot be pickled."""
    writer = _LimitedWriter(limit)
    pickler = _PayloadPickler(writer)
    try:
        pickler.dump((func, args, kwargs))
    except _LimitReached:
        raise PayloadTooLargeError(
            f"the function and its arguments pickle to more than the {limit / 2**20:g} MiB "
            "limit (pickling stopped there). Load large data inside the function (from a file, "
            "a volume or a URL) instead of capturing it or passing it as an argument; or raise "
            f"the limit with max_payload_bytes= or {MAX_PAYLOAD_ENV}.",
            limit=limit,
        ) from None
    except Exception as exc:  # pickling raises many unrelated types (TypeError, PicklingError, ...)
        where = describe_unpicklable(func, args, kwargs)
        raise SerializationError(
            f"cannot serialize the call to {_qualname(func)}: {where}: {type(exc).__name__}: {exc}"
        ) from exc
    header = pickle.dumps(sources.collect(pickler.filenames), protocol=pickle.HIGHEST_PROTOCOL)
    return b"".join([header, *writer.chunks])


def load_payload(f: BinaryIO) -> tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]:
    """In a rank: register the shipped source lines, then unpickle the call."""
    sources.install(pickle.load(f))
    func, args, kwargs = pickle.load(f)
    return func, args, kwargs


def describe_unpicklable(
    func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> str:
    """Say which captured object or argument cannot be pickled, as a readable path."""
    roots: list[tuple[str, Any]] = [(f"argument {i}", a) for i, a in enumerate(args)]
    roots += [(f"argument {k}=", v) for k, v in kwargs.items()]
    roots += [(label, value) for label, value in _captured(func)]
    for label, value in roots:
        path = _find_unpicklable(value, label, _SEARCH_DEPTH)
        if path is not None:
            return path
    return f"{_qualname(func)} itself"


def _captured(func: Callable[..., Any]) -> Iterator[tuple[str, Any]]:
    name = _qualname(func)
    target = inspect.unwrap(func)
    try:
        cv = inspect.getclosurevars(target)
    except TypeError:  # builtins and callable objects have no code to inspect
        yield f"{name}", func
        return
    for var, value in cv.nonlocals.items():
        yield f"variable {var!r} captured by {name} (closure)", value
    for var, value in cv.globals.items():
        yield f"global {var!r} used by {name}", value
    for i, default in enumerate(getattr(target, "__defaults__", None) or ()):
        yield f"default value #{i} of {name}", default


def _find_unpicklable(obj: Any, path: str, depth: int) -> str | None:
    """Depth-first search for the innermost object that fails to pickle."""
    if _picklable(obj):
        return None
    if depth > 0:
        for label, child in _children(obj):
            found = _find_unpicklable(child, f"{path} -> {label}", depth - 1)
            if found is not None:
                return found
    return f"{path} (a {type(obj).__module__}.{type(obj).__qualname__})"


def _picklable(obj: Any) -> bool:
    try:
        cloudpickle.dumps(obj)
    except Exception:  # any failure means "not picklable"; the caller reports the path
        return False
    return True


def _children(obj: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(obj, dict):
        yield from ((f"[{k!r}]", v) for k, v in obj.items())
    elif isinstance(obj, (list, tuple, set, frozenset)):
        yield from ((f"[{i}]", v) for i, v in enumerate(obj))
    elif inspect.isfunction(obj):
        yield from ((label.replace(" used by", " in"), v) for label, v in _captured(obj))
    elif hasattr(obj, "__dict__") and not isinstance(obj, type):
        yield from ((f".{k}", v) for k, v in vars(obj).items())


def _qualname(func: Callable[..., Any]) -> str:
    return getattr(func, "__qualname__", type(func).__qualname__)


class _ResultPickler(cloudpickle.Pickler):
    """Moves CUDA tensors to CPU so a result can be loaded in a process without CUDA."""

    def reducer_override(self, obj: Any) -> Any:
        torch = _torch()
        if torch is not None and isinstance(obj, torch.Tensor) and obj.device.type != "cpu":
            return _identity, (obj.detach().cpu(),)
        return super().reducer_override(obj)


def dumps_for_caller(obj: Any) -> bytes:
    """``obj`` pickled for a caller without CUDA (its CUDA tensors as CPU ones)."""
    buffer = io.BytesIO()
    _ResultPickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buffer.getvalue()


def _identity(value: Any) -> Any:
    return value


def _torch() -> Any:
    import sys

    return sys.modules.get("torch")


def partial_path(path: Path) -> Path:
    """Where ``path`` is written before it is renamed into place (atomic writes)."""
    return path.with_name(path.name + ".tmp")


def dump_to_file(obj: Any, path: Path) -> None:
    """Pickle ``obj`` straight into ``path`` (atomically), never through a pipe."""
    tmp = partial_path(path)
    with open(tmp, "wb") as f:
        _ResultPickler(f, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    os.replace(tmp, path)


class _TensorFound(Exception):
    """Raised by the plain pass at the first tensor: torch's format takes over."""


class _PlainPickler(cloudpickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        torch = _torch()
        if torch is not None and isinstance(obj, (torch.Tensor, torch.UntypedStorage)):
            raise _TensorFound
        return super().reducer_override(obj)


def dump_result(obj: Any, path: Path, local_ranks: int = 1) -> None:
    """Write a rank's result for the caller. A result with tensors is written as a
    :mod:`tensor_file` (raw storages, CUDA tensors from their device) so that the caller can
    map it, or in torch's format where that cannot carry a storage; any other result as a plain
    pickle, so that a caller without torch imported need not import it. ``local_ranks`` is how
    many ranks of this machine write such a result at the same time."""
    tmp = partial_path(path)
    try:
        with open(tmp, "wb") as f:
            _PlainPickler(f, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    except _TensorFound:
        torch = _torch()
        try:
            tensor_file.dump(obj, tmp, torch, local_ranks)
        except tensor_file.UnsupportedStorage:
            _skip_checksums(torch)
            torch.save(obj, tmp, pickle_module=cloudpickle, pickle_protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(tmp, path)


def load_result(path: Path) -> Any:
    """Read what :func:`dump_result` wrote. Tensors are memory-mapped from the file rather than
    copied (deleting the file afterwards is safe: the mapping keeps the pages)."""
    if tensor_file.is_tensor_file(path):
        import torch

        return tensor_file.load(path, torch)
    if not zipfile.is_zipfile(path):
        return load_from_file(path)
    import torch

    return torch.load(path, mmap=True, weights_only=False, map_location="cpu")


def _skip_checksums(torch: Any) -> None:
    # The file lives for one hand-over on the same machine; CRC32 would halve the write speed.
    config = getattr(getattr(torch.utils, "serialization", None), "config", None)
    if config is not None and hasattr(config.save, "compute_crc32"):
        config.save.compute_crc32 = False


def load_from_file(path: Path) -> Any:
    with open(path, "rb") as f:
        return pickle.load(f)
