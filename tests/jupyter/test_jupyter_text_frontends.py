"""A frontend that draws no widgets (here a ``jupyter_client`` driver) sees the ranks' lines
while a call or a session cell runs, as text, as ``%%px`` shows them; a page that draws the
widget hides that text (the widget's style sheet) and keeps the widget as it is."""

from __future__ import annotations

from pathlib import Path

import pytest
from jupyter_helpers import CellOutput, Kernel

from jupyter_ext.live_status import LiveStatus
from jupyter_ext.text_mirror import HIDDEN_CLASS

pytestmark = pytest.mark.timeout(180)

SESSION = "%%distributed --session s gpus=2 gpu_type=cpu --no-tracking\n"


def _body(go: Path) -> str:
    """Each rank prints a line, waits (bounded) for ``go`` to exist, then prints another."""
    return (
        "import os, time\n"
        "r = os.environ['RANK']\n"
        "print(f'first line of rank {r}', flush=True)\n"
        "deadline = time.monotonic() + 150\n"
        f"while not os.path.exists({str(go)!r}) and time.monotonic() < deadline:\n"
        "    time.sleep(0.05)\n"
        "print(f'second line of rank {r}', flush=True)\n"
    )


def _live_text(out: CellOutput) -> str:
    return "\n".join(d.get("text/plain", "") for d in out.displays)


def _check_live_lines(kernel: Kernel, cell: str, go: Path) -> CellOutput:
    out = kernel.start(cell)
    wanted = ("[rank 0] first line of rank 0", "[rank 1] first line of rank 1")
    # The ranks wait for `go` far longer than this: lines seen now were seen while they ran.
    seen = kernel.collect(out, 60, until=lambda: all(w in _live_text(out) for w in wanted))
    assert seen and not out.done, out.all_text
    [live] = [d for d in out.displays if wanted[0] in d.get("text/plain", "")][-1:]
    assert f'class="{HIDDEN_CLASS}"' in live["text/html"]  # what a widget page hides
    assert "second line" not in _live_text(out)
    go.touch()
    assert kernel.collect(out, 60, until=lambda: out.done), out.all_text
    assert not out.errors, out.all_text
    return out


def test_a_calls_lines_reach_a_client_without_widgets(kernel: Kernel, tmp_path: Path) -> None:
    go = tmp_path / "go"
    out = _check_live_lines(kernel, "%%distributed gpus=2 gpu_type=cpu\n" + _body(go), go)
    emptied = out.displays.index({"text/plain": ""})  # the live text, once the run ended
    record = out.displays[-1]["text/plain"]  # the record, in the widget's place, comes after
    assert emptied < len(out.displays) - 1 and "[rank 1] second line of rank 1" in record


def test_a_session_cells_lines_reach_a_client_without_widgets(
    kernel: Kernel, tmp_path: Path
) -> None:
    started = kernel.run(SESSION + "1")
    assert not started.errors, started.all_text
    go = tmp_path / "go"
    out = _check_live_lines(kernel, "%%distributed --session s\n" + _body(go), go)
    assert "second line of rank 1" in out.all_text
    assert kernel.run("%distributed_session stop s").done


def test_a_page_that_draws_the_widget_hides_the_text_copy() -> None:
    assert f".{HIDDEN_CLASS}" in LiveStatus._css and "display: none" in LiveStatus._css
