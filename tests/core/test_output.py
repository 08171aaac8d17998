"""Rank output: captured at the file-descriptor level, logged per rank, streamed as events."""

from __future__ import annotations

from typing import Any

import pytest

from serverless_gpu import distributed, runtime
from serverless_gpu.common.output import HOT_GAP_S, PAUSE_S, LineSplitter, OutputPacer
from serverless_gpu.wire.events import OutputLines


def test_console_shows_rank0_and_all_stderr_and_logs_keep_everything(
    capsys: pytest.CaptureFixture[str],
) -> None:
    @distributed(gpus=2)
    def talk() -> None:
        import ctypes
        import os
        import sys

        rank = runtime.get_global_rank()
        print(f"python stdout {rank}")
        print(f"python stderr {rank}", file=sys.stderr)
        os.write(1, f"fd-level stdout {rank}\n".encode())
        libc = ctypes.CDLL(None)
        libc.printf(f"C printf {rank}\n".encode())
        libc.fflush(None)

    result = talk.distributed()
    shown = capsys.readouterr().out
    assert "[rank 0] python stdout 0" in shown
    assert "[rank 0] C printf 0" in shown
    assert "[rank 1] python stderr 1" in shown
    assert "python stdout 1" not in shown  # default: only rank 0's stdout
    log1 = (result.run_dir / "logs" / "rank_1.txt").read_text()
    for text in ("python stdout 1", "python stderr 1", "fd-level stdout 1", "C printf 1"):
        assert text in log1


def test_output_all_and_none(capsys: pytest.CaptureFixture[str]) -> None:
    @distributed(gpus=2, output="all")
    def loud() -> None:
        print("line from", runtime.get_global_rank())

    loud.distributed()
    shown = capsys.readouterr().out
    assert "[rank 0] line from 0" in shown and "[rank 1] line from 1" in shown

    @distributed(gpus=2, output="none")
    def quiet() -> None:
        print("hidden line")

    quiet.distributed()
    assert "hidden line" not in capsys.readouterr().out


def test_progress_bar_arrives_as_replaceable_pieces() -> None:
    @distributed(gpus=2, output="none")
    def progress() -> None:
        import sys
        import time

        for i in range(3):
            sys.stderr.write(f"\r{i}/3")
            sys.stderr.flush()
            time.sleep(0.3)
        sys.stderr.write("\rdone\n")

    handle = progress.start()
    pieces: list[str] = []
    handle.subscribe(
        lambda e: (
            pieces.extend(e.lines)
            if isinstance(e, OutputLines) and e.rank == 0 and e.stream == "stderr"
            else None
        )
    )
    handle.result()
    # Shown while still being written (idle flush), and never merged into one long line.
    assert "0/3" in pieces or "0/3\r" in pieces
    assert pieces[-1] == "done\n"
    assert all("\n" not in p[:-1] for p in pieces)


def test_line_splitter_rules() -> None:
    s = LineSplitter()
    assert s.feed(b"a\nb", 0.0) == ["a\n"]
    assert s.flush_idle(0.05) is None  # not quiet long enough
    assert s.flush_idle(0.2) == "b"
    assert s.flush_idle(0.3) is None  # already shown
    assert s.feed(b"c\r\n\rx\ry", 1.0) == ["bc\n", "\r", "x\r"]
    assert s.feed("é".encode()[:1], 2.0) == []  # half a UTF-8 character waits
    assert s.feed("é".encode()[1:] + b"\n", 2.1) == ["yé\n"]
    assert s.close() == []


def test_output_pacer_reads_a_fast_stream_on_a_timer() -> None:
    p = OutputPacer(1 << 20)
    assert not p.after_read("stdout", True, 0.0)  # first data: read as it comes
    assert not p.after_read("stdout", True, 1.0)  # a line a second stays on the selector
    assert p.after_read("stdout", True, 1.0 + HOT_GAP_S / 2)  # again at once: paused
    assert p.next_due() == pytest.approx(1.0 + HOT_GAP_S / 2 + PAUSE_S)
    assert p.due(1.0 + HOT_GAP_S) == []
    assert p.due(1.1) == ["stdout"]
    assert p.after_read("stdout", True, 1.1)  # still producing: stays paused
    assert not p.after_read("stdout", False, 1.2)  # quiet: back on the selector
    assert p.next_due() is None
    assert not p.after_read("stderr", True, 1.2 + HOT_GAP_S / 2)  # streams are apart
    assert OutputPacer(1 << 16).pause_s == pytest.approx(PAUSE_S / 16)  # a small pipe
    assert p.after_read("stderr", True, 1.2 + HOT_GAP_S)
    assert p.is_paused("stderr")
    p.forget("stderr")  # the stream ended while paused
    assert not p.is_paused("stderr") and p.next_due() is None


def test_a_flood_arrives_whole_and_in_order() -> None:
    lines = 30_000

    @distributed(gpus=2, output="none")
    def flood(n: int) -> None:
        import sys

        for i in range(n):
            print(f"line {i}")
        print("end", file=sys.stderr)

    handle = flood.start(lines)
    got: dict[tuple[int, str], list[str]] = {}
    handle.subscribe(
        lambda e: (
            got.setdefault((e.rank, e.stream), []).extend(e.lines)
            if isinstance(e, OutputLines)
            else None
        )
    )
    result = handle.result()
    expected = [f"line {i}\n" for i in range(lines)]
    for rank in (0, 1):
        assert got[(rank, "stdout")] == expected
        assert got[(rank, "stderr")] == ["end\n"]
        log = (result.run_dir / "logs" / f"rank_{rank}.txt").read_text().splitlines()
        assert [line for line in log if line.startswith("line ")] == [e[:-1] for e in expected]


def test_large_results_travel_through_files() -> None:
    @distributed(gpus=2, output="none")
    def big() -> Any:
        import torch

        return torch.full((32, 1024, 1024), float(runtime.get_global_rank()))  # 128 MiB

    a, b = big.distributed()
    assert a.shape == (32, 1024, 1024) and float(a[0, 0, 0]) == 0.0 and float(b[-1, -1, -1]) == 1.0
