"""One extra installs what every example notebook imports: a reader who installs
``serverless-gpu[examples]`` (as the README and each notebook that needs more than the library
say) can run them all, DeepSpeed's aside."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STDLIB = set(sys.stdlib_module_names)
# Module -> the distribution that provides it, where the names differ.
DISTRIBUTION = {"serverless_gpu": "serverless-gpu"}
NOT_IN_EXAMPLES = {"deepspeed"}  # built against the installed torch: its notebook says how


def _imports(notebook: Path) -> set[str]:
    cells = json.loads(notebook.read_text())["cells"]
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    return set(re.findall(r"^\s*(?:from|import)\s+(\w+)", code, re.M)) - STDLIB


def _extra(name: str, extras: dict[str, list[str]]) -> set[str]:
    """The distributions an extra installs, its own extras' included."""
    found: set[str] = set()
    for requirement in extras[name]:
        dist = re.split(r"[<>=\[; ]", requirement, maxsplit=1)[0].lower()
        if dist == "serverless-gpu":
            inner = re.search(r"\[(.*)\]", requirement)
            for sub in inner.group(1).split(",") if inner else ():
                found |= _extra(sub.strip(), extras)
        else:
            found.add(dist)
    return found | {"serverless-gpu", "torch"}  # the package and its own dependencies


def test_the_examples_extra_installs_what_every_notebook_imports() -> None:
    tomllib = pytest.importorskip("tomllib")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    installed = _extra("examples", extras)
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        needed = {DISTRIBUTION.get(m, m) for m in _imports(notebook)} - NOT_IN_EXAMPLES
        assert needed <= installed, f"{notebook.name} imports {sorted(needed - installed)}"


@pytest.mark.parametrize("name", ["04_hf_trainer", "05_lightning_fabric", "10_sessions"])
def test_a_notebook_that_needs_more_than_the_library_says_which_extra(name: str) -> None:
    cells = json.loads((ROOT / "notebooks" / f"{name}.ipynb").read_text())["cells"]
    first = "".join(cells[0]["source"])
    assert "pip install -e '.[examples]'" in first, first


def test_the_readme_names_the_examples_extra_for_the_notebooks() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## In a notebook") :]
    assert "pip install -e '.[examples]'" in section[:600]
