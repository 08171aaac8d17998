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
