"""The console's lines: what a run runs on, as the user asked for it."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from serverless_gpu.caller.console import ConsolePrinter
from serverless_gpu.wire.events import RunStarted


@pytest.mark.parametrize(
    ("device", "gpu_type", "names", "shown"),
    [
        ("cuda", "H200", ("NVIDIA H200", "NVIDIA H200"), "2 x NVIDIA H200"),
        ("cuda", "H200", (), "2 x H200"),  # ranks on a Ray cluster's GPUs: no names here
        ("cuda", "OTHER", (), "2 x GPU"),
        ("cpu", "CPU", (), "2 x CPU"),
    ],
)
def test_the_start_line_names_the_devices(
    device: str, gpu_type: str, names: tuple[str, ...], shown: str, tmp_path: Path
) -> None:
    out = io.StringIO()
    ConsolePrinter(stream=out)(
        RunStarted("r1", "train", 2, device, gpu_type, names, tmp_path, None, 0.0)
    )
    assert out.getvalue().startswith(f"serverless_gpu: train on {shown} (logs: "), out.getvalue()


def test_every_event_has_its_subscriber_method() -> None:
    """A new event needs its method in ``EventSubscriber`` (the one dispatch of events)."""
    from typing import get_args

    from serverless_gpu.wire import events

    assert set(events._HANDLERS) == set(get_args(events.Event))
    for name in events._HANDLERS.values():
        assert callable(getattr(events.EventSubscriber, name, None)), name


def test_the_text_lines_are_one_fold(tmp_path: Path) -> None:
    """Failed ranks, silent ranks, long and progress output: the console's words."""
    from serverless_gpu.wire.events import OutputLines, RankFinished, RanksSilent, RankState

    out = io.StringIO()
    printer = ConsolePrinter(stream=out, max_lines=2)
    printer(RunStarted("r1", "train", 2, "cpu", "CPU", (), tmp_path, None, 0.0))
    printer(OutputLines("r1", 0, "stdout", ("a\n", "b\n", "c\n", "d\n", "10%|#\r"), 1.0))
    printer(OutputLines("r1", 1, "stdout", ("not shown\n",), 1.0))
    printer(RanksSilent("r1", (1,), 30.0, False, 2.0))
    printer(RankFinished("r1", 1, RankState.FAILED, -9, "SIGKILL", 3.0))
    lines = out.getvalue().splitlines()[1:]
    assert lines[:3] == [
        "[rank 0] a",
        "[rank 0] b",
        f"[rank 0] ... further output only in {tmp_path / 'logs' / 'rank_0.txt'}",
    ]
    assert lines[3] == "[rank 0] 10%|#"
    assert lines[4].startswith("serverless_gpu: warning: ") and "(handle.stacks())." in lines[4]
    assert lines[5] == "serverless_gpu: rank 1 failed (SIGKILL)"
