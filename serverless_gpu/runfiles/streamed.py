"""Values whose tensors travel beside their frame on a stream (``wire/session.Streamed``): a
remote session's pushes and large cell values. The frame carries the value pickled without its
storages (``tensor_file.split``); each storage's bytes follow it raw, sent from the tensor's own
memory (a CUDA one copied to the host first) and received straight into a new storage: no
pickle of the bytes, no copy in between."""

from __future__ import annotations

import ctypes
import io
import pickle
import sys
from collections.abc import Callable
from typing import Any

from serverless_gpu.runfiles import tensor_file
from serverless_gpu.wire.session import Streamed, read_frame, read_into, streamed_in


def streamed(value: Any) -> Streamed | None:
    """``value`` as a :class:`Streamed` with its buffers to send, or None where it holds no
    tensor (or one on a device other than CPU and CUDA): then it is pickled whole."""
    torch: Any = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        meta, storages = tensor_file.split(value, torch)
    except tensor_file.UnsupportedStorage:
        return None
    if not storages:
        return None
    out = Streamed(meta, tuple((offset, int(s.nbytes())) for offset, s in storages))
    out.buffers = [tensor_file.host_buffer(s, torch) for _, s in storages]
    return out


def receive(value: Streamed, read_into: Callable[[memoryview], None]) -> Any:
    """Read the storages that follow ``value``'s frame (``read_into`` fills a buffer) and
    rebuild the value on the CPU."""
    import torch

    storages: dict[int, Any] = {}
    for offset, nbytes in value.parts:
        data = torch.empty(nbytes, dtype=torch.uint8)
        if nbytes:
            read_into(memoryview((ctypes.c_char * nbytes).from_address(data.data_ptr())))
        storages[offset] = data.untyped_storage()

    class _Unpickler(pickle.Unpickler):
        def persistent_load(self, pid: Any) -> Any:
            _, offset, _nbytes, dtype = pid
            return tensor_file.typed(storages[offset], dtype, torch)

    return _Unpickler(io.BytesIO(value.meta)).load()


def read_message(fd: int) -> object | None:
    """The next frame on ``fd`` with its :class:`Streamed` values read in (``read_frame``'s
    None at EOF)."""
    message = read_frame(fd)
    for value in streamed_in(message):
        value.value = receive(value, lambda view: read_into(fd, view))
    return message
