"""A remote session's values travel as their pickle without storages plus each storage's raw
bytes (``runfiles/streamed.py``): what arrives equals what was sent, dtypes, shared storages
and empty tensors included."""

from __future__ import annotations

import socket
import threading

import torch

from serverless_gpu.runfiles.streamed import receive, streamed
from serverless_gpu.wire.session import CellRequest, frame_bytes, read_frame, read_into, streamed_in


def test_tensors_arrive_as_sent_through_a_stream() -> None:
    base = torch.arange(12.0).reshape(3, 4)
    values = {
        "base": base,
        "row": base[1],  # a view: one storage, sent once
        "half": torch.ones(5, dtype=torch.bfloat16),
        "empty": torch.empty(0, dtype=torch.int64),
        "plain": {"lr": 0.1},
    }
    out = streamed(values)
    assert out is not None and len(out.parts) == 3
    request = CellRequest(1, "push", out)
    left, right = socket.socketpair()
    with left, right:

        def send() -> None:
            for part in [frame_bytes(request), *out.buffers]:
                left.sendall(part)

        sender = threading.Thread(target=send)
        sender.start()
        got = read_frame(right.fileno())
        (arrived,) = streamed_in(got)
        value = receive(arrived, lambda view: read_into(right.fileno(), view))
        sender.join(10)
    assert torch.equal(value["base"], base) and value["half"].dtype == torch.bfloat16
    assert value["row"].untyped_storage().data_ptr() == value["base"].untyped_storage().data_ptr()
    assert value["empty"].shape == (0,) and value["plain"] == {"lr": 0.1}


def test_a_value_without_tensors_is_not_streamed() -> None:
    assert streamed({"a": 1}) is None
