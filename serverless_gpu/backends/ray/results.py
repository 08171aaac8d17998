"""A rank's result on its way from its Ray actor to the caller.

A rank on the caller's machine writes its result as a local rank does (``dump_result``: tensors
as a tensor file, CUDA storages straight from the device) into the call's results twin, and the
caller maps it: a GiB arrives at memory speed instead of crossing Ray's object store twice
(``benchmarks/ray_results.py``). The rank takes that way only where it can tell the folder is
the caller's own: the same machine (boot id and host name), the same user, and the twin holding
the key the caller wrote there for this call (a folder of the same name on another machine or
in another container does not). Any other rank, or one whose write fails (a full tmpfs, a result
``dump_result`` cannot pickle), puts its result into the object store, its tensors' bytes as
numpy arrays that Ray carries out of band (:class:`StoredTensors`).
"""

from __future__ import annotations

import io
import os
import pickle
import secrets
import socket
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from serverless_gpu.backends.ray.ranks import HostCopy
from serverless_gpu.runfiles import tensor_file
from serverless_gpu.runfiles.serialization import dump_result, load_result, partial_path
from serverless_gpu.wire.runpaths import RunPaths, result_name

KEY_FILE = ".ray-results-key"
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


@dataclass(frozen=True)
class ResultsPlace:
    """Where the call's ranks on the caller's machine write their results (sent with the call)."""

    twin: str
    machine: str
    uid: int
    key: str


@dataclass(frozen=True)
class ResultFile:
    """A rank's result written into the caller's results twin (instead of an object ref)."""

    path: str


def place_for(paths: RunPaths) -> ResultsPlace | None:
    """The caller's side: the call's results twin with a fresh key in it, or None (no twin, or
    the key cannot be written): every rank then uses the object store."""
    twin = paths.results_dir
    if twin is None:
        return None
    key = secrets.token_hex(16)
    try:
        fd = os.open(twin / KEY_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(key)
    except OSError:
        return None
    return ResultsPlace(str(twin), machine_id(), os.getuid(), key)


def machine_id() -> str:
    """This machine while it runs: its boot id and host name."""
    try:
        boot = _BOOT_ID.read_text().strip()
    except OSError:
        boot = ""
    return f"{boot}/{socket.gethostname()}"


def reachable(place: ResultsPlace | None) -> Path | None:
    """The rank's side: the caller's twin, where this process is on the caller's machine, runs
    as the caller's user and finds the caller's key in it; else None."""
    if place is None or place.machine != machine_id() or place.uid != os.getuid():
        return None
    twin = Path(place.twin)
    try:
        owner = twin.stat().st_uid
        key = (twin / KEY_FILE).read_text()
    except OSError:
        return None
    return twin if owner == place.uid and key == place.key else None


def hand_over(result: Any, place: ResultsPlace | None, rank: int, world_size: int) -> Any:
    """In the rank: a :class:`ResultFile` where the result could be written into the caller's
    twin, else an object ref of it (``ray.put`` of :func:`for_store`). A result
    that cannot be pickled raises from ``ray.put``, as it did before the twin was tried."""
    twin = reachable(place)
    if twin is not None:
        path = twin / result_name(rank)
        try:
            dump_result(result, path, world_size)
            return ResultFile(str(path))
        except Exception:  # full, or not picklable as a file: the object store decides
            partial_path(path).unlink(missing_ok=True)
    import ray

    return ray.put(for_store(result))


def load(ray: Any, held: Any, timeout: float) -> Any:
    """In the caller: the rank's value from its file (mapped) or from the object store."""
    if isinstance(held, ResultFile):
        return load_result(Path(held.path))
    value = ray.get(held, timeout=timeout)
    return value.load() if isinstance(value, (HostCopy, StoredTensors)) else value


@dataclass(frozen=True)
class StoredTensors:
    """A result holding tensors as it goes through the object store: its pickle without the
    storages (``tensor_file.split``) and each storage's bytes as a numpy array, by the offset
    its persistent id names. Ray carries numpy arrays out of band: one copy into the store and
    one out of it in the caller, where a pickled storage is copied several times over
    (``torch.save`` into bytes, the bytes into the pickle, out of the store, out of the pickle)."""

    meta: bytes
    arrays: dict[int, Any]

    def load(self) -> Any:
        import torch

        arrays = self.arrays
        copies: dict[int, Any] = {}  # tensors that viewed one storage share its copy

        class _Unpickler(pickle.Unpickler):
            def persistent_load(self, pid: Any) -> Any:
                _, offset, _nbytes, dtype = pid
                if offset not in copies:
                    copies[offset] = _own_copy(arrays[offset], torch)
                return tensor_file.typed(copies[offset], dtype, torch)

        return _Unpickler(io.BytesIO(self.meta)).load()


def _own_copy(array: Any, torch: Any) -> Any:
    """The array's bytes in a storage of this process's own: the object store's memory is
    read-only and lives only as long as the object."""
    if array.size == 0:
        return torch.UntypedStorage(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # read-only: it is copied at once
        view = torch.from_numpy(array)
    return view.clone().untyped_storage()


def for_store(result: Any) -> Any:
    """What the rank puts into the object store: a :class:`StoredTensors` where the result holds
    tensors (CUDA ones copied to host: the caller may have no GPU), else ``result`` itself.
    Where that cannot be made (a storage on another device, no numpy, a result this pickler
    refuses), the result as before: ``ray.put`` then decides, and raises what it raised."""
    torch: Any = sys.modules.get("torch")
    if torch is None:
        return result
    try:
        meta, storages = tensor_file.split(result, torch)
        if not storages:
            return result
        return StoredTensors(meta, {offset: _host_bytes(s, torch) for offset, s in storages})
    except Exception:  # see above: the object store's own pickling takes it
        return host_copy(result)


def _host_bytes(storage: Any, torch: Any) -> Any:
    data = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
    return data.cpu().numpy()  # no copy for a CPU storage


def host_copy(result: Any) -> Any:
    """``result`` itself, or a :class:`HostCopy` of it where it holds CUDA tensors (Ray's
    pickling would bring them back onto a GPU in the caller, which may have none)."""
    torch: Any = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return result
    import cloudpickle

    found: list[bool] = []

    class HostPickler(cloudpickle.Pickler):
        def reducer_override(self, obj: Any) -> Any:
            if isinstance(obj, torch.Tensor) and obj.is_cuda:
                found.append(True)
                return obj.detach().cpu().__reduce_ex__(pickle.HIGHEST_PROTOCOL)
            return super().reducer_override(obj)

    buffer = io.BytesIO()
    HostPickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(result)
    return HostCopy(buffer.getvalue()) if found else result
