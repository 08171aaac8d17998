"""Turning a rank's raw output bytes into display lines for the event stream.

A piece that ends in ``"\\n"`` is a finished line. A piece that ends in ``"\\r"`` (a tqdm bar) or
in nothing (text still being written, flushed because the rank went quiet) is *provisional*:
the next piece of the same stream replaces it. Renderers need no terminal emulation beyond that
rule, and a progress bar never turns into thousands of lines.
"""

from __future__ import annotations

import codecs
import re

_PIECE = re.compile(r"[^\r\n]*(?:\r\n|\n|\r(?!$))")
MAX_PENDING = 1 << 16
IDLE_FLUSH_S = 0.1


class LineSplitter:
    """Incrementally splits one stream; holds back an unfinished last line."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""
        self._shown = ""
        self.last_data = 0.0

    def feed(self, data: bytes, now: float) -> list[str]:
        """Pieces completed by ``data`` (terminators kept, ``\\r\\n`` read as ``\\n``)."""
        self.last_data = now
        text = self._pending + self._decoder.decode(data)
        if "\r" not in text:
            return self._split_lines(text)
        pieces: list[str] = []
        end = 0
        for match in _PIECE.finditer(text):
            piece = match.group(0)
            pieces.append(piece[:-2] + "\n" if piece.endswith("\r\n") else piece)
            end = match.end()
        return self._hold(pieces, text[end:])

    def _split_lines(self, text: str) -> list[str]:
        """The common case, no carriage return: a plain split is several times faster."""
        *done, rest = text.split("\n")
        return self._hold([line + "\n" for line in done], rest)

    def _hold(self, pieces: list[str], rest: str) -> list[str]:
        """Keep the unfinished ``rest`` for later, unless it is a giant line without newline."""
        self._pending = rest
        if len(rest) > MAX_PENDING:
            pieces.append(rest + "\n")
            self._pending = ""
        if pieces:
            self._shown = ""
        return pieces

    def flush_idle(self, now: float) -> str | None:
        """The unfinished line, once the stream has been quiet for a moment and not shown yet."""
        if self._pending and self._pending != self._shown and now - self.last_data >= IDLE_FLUSH_S:
            self._shown = self._pending
            return self._pending
        return None

    def close(self) -> list[str]:
        """Whatever is left when the stream ends."""
        rest = self._pending + self._decoder.decode(b"", final=True)
        self._pending = ""
        return [rest] if rest else []


HOT_GAP_S = 0.002
PAUSE_S = 0.005
_FULL_PIPE = 1 << 20


class OutputPacer:
    """Reads a fast stream on a timer instead of on every write.

    A launcher that waits on a rank's pipe while the rank prints in a tight loop is woken for
    each line: each of the rank's writes must wake it, and each line becomes its own read, log
    write and event (``benchmarks/overheads.py --only flood`` measures the cost). A stream that
    had data again within ``HOT_GAP_S`` is taken off the selector and read every ``pause_s`` for
    as long as it keeps producing; meanwhile the rank writes into its pipe without waking
    anyone. Output at training-log rates is still read as it comes.
    """

    def __init__(self, pipe_bytes: int) -> None:
        # The pipe must hold what a rank writes during a pause: a 1 MiB pipe holds 5 ms of
        # 200 MB/s; a smaller one gets a proportionally shorter pause.
        self.pause_s = PAUSE_S * min(1.0, pipe_bytes / _FULL_PIPE)
        self._last: dict[str, float] = {}
        self._paused: dict[str, float] = {}  # stream -> when to read it next

    def is_paused(self, stream: str) -> bool:
        return stream in self._paused

    def forget(self, stream: str) -> None:
        """The stream has ended."""
        self._paused.pop(stream, None)
        self._last.pop(stream, None)

    def after_read(self, stream: str, got_data: bool, now: float) -> bool:
        """Record a read; True if the stream is (still) paused and must not be selected on."""
        hot = got_data and (
            stream in self._paused or now - self._last.get(stream, float("-inf")) < HOT_GAP_S
        )
        if got_data:
            self._last[stream] = now
        if hot:
            self._paused[stream] = now + self.pause_s
        else:
            self._paused.pop(stream, None)
        return hot

    def due(self, now: float) -> list[str]:
        return [stream for stream, at in self._paused.items() if at <= now]

    def next_due(self) -> float | None:
        return min(self._paused.values(), default=None)
