"""The Optuna ask/tell example in docs/sweeps.md runs as written (CPU mode)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "sweeps.md"


@pytest.mark.timeout(300)
def test_optuna_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("optuna")
    text = DOC.read_text()
    code = re.search(r"<!-- example: optuna -->\n```python\n(.*?)```", text, re.S)
    assert code is not None
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(compile(code.group(1), str(DOC), "exec"), namespace)
    study = namespace["study"]
    assert len(study.trials) == 4
    assert all(t.state.name == "COMPLETE" for t in study.trials)
    assert "lr" in capsys.readouterr().out
