"""The launcher's non-blocking channel speaks multiprocessing's Connection framing both ways."""

from __future__ import annotations

import pickle
import socket
import struct
import threading
from multiprocessing.connection import Connection

from serverless_gpu.wire.channel import Channel, Undecodable


def _pair() -> tuple[Channel, Connection]:
    ours, theirs = socket.socketpair()
    return Channel(ours), Connection(theirs.detach())


def test_a_partial_frame_waits_for_the_rest() -> None:
    channel, peer = _pair()
    body = pickle.dumps({"step": 3})
    frame = struct.pack("!i", len(body)) + body
    peer.send_bytes(b"not a pickle")  # reported as such, not fatal to the reader
    raw = socket.socket(fileno=peer.fileno())
    try:
        raw.sendall(frame[:7])
        messages, eof = channel.receive()
        assert len(messages) == 1 and isinstance(messages[0], Undecodable)
        assert not eof
        raw.sendall(frame[7:])
        assert channel.receive() == ([{"step": 3}], False)
    finally:
        raw.detach()
    peer.close()
    assert channel.receive() == ([], True)
    channel.close()


def test_sending_never_blocks_on_a_peer_that_does_not_read() -> None:
    channel, peer = _pair()
    big = b"x" * (32 << 20)  # far beyond a socket's buffer
    channel.send(big)
    channel.send("after")
    assert channel.pending > 0  # queued, not written: the call returned anyway
    got: list[object] = []
    reader = threading.Thread(target=lambda: got.extend([peer.recv(), peer.recv()]))
    reader.start()
    while not channel.flush():
        reader.join(0.01)
    reader.join(30)
    assert got == [big, "after"]
    channel.close()
    peer.close()


def test_a_closed_peer_makes_the_channel_broken() -> None:
    channel, peer = _pair()
    peer.close()
    channel.send("anyone?")
    assert channel.broken
    channel.close()
