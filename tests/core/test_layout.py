"""The package's layout is its design: each package says which process runs its code, and
imports go one way only (docs/architecture.md, "Modules"). These tests read every import of the
library (module level and inside functions; ``TYPE_CHECKING`` blocks left out, they never run)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import networkx

_ROOT = Path(__file__).resolve().parents[2]
_SOURCES = ("serverless_gpu", "jupyter_ext")

LAYERS: tuple[tuple[str, ...], ...] = (
    ("serverless_gpu.common",),
    ("serverless_gpu.wire",),
    ("serverless_gpu.lifecycle",),
    ("serverless_gpu.runfiles",),
    ("serverless_gpu.doctor",),
    ("serverless_gpu.rank",),
    ("serverless_gpu.launcher_process",),
    ("serverless_gpu.caller",),
    ("serverless_gpu.tracking",),
    ("serverless_gpu.data",),
    ("serverless_gpu.backends",),
    ("serverless_gpu.api",),
    ("jupyter_ext",),
    (
        "serverless_gpu",
        "serverless_gpu.runtime",
        "serverless_gpu.exceptions",
        "serverless_gpu.compat",
        "serverless_gpu.asynchronous",
        "serverless_gpu.compute",
        "serverless_gpu.launcher",
        "serverless_gpu.ray",
    ),
    ("serverless_gpu.cli", "serverless_gpu.examples"),
)
"""Lowest first: a module may import its own package and the packages of lower layers only. The
package face (``serverless_gpu`` and its public modules) re-exports; the CLI and the examples use
the face like a user would."""

_EXTENSION_ENTRY = {("serverless_gpu", "jupyter_ext")}
"""``%load_ext serverless_gpu``: the face's two extension functions hand over to the extension
lazily (IPython calls them by the package's name), the one import that goes up."""


def _module_name(path: Path) -> str:
    parts = path.relative_to(_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    found = {}
    for source in _SOURCES:
        for path in (_ROOT / source).rglob("*.py"):
            found[_module_name(path)] = path
    return found


def _type_checking_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(
            node.test, "id", getattr(node.test, "attr", "")
        ) == ("TYPE_CHECKING"):
            for sub in node.body:
                lines.update(n.lineno for n in ast.walk(sub) if hasattr(n, "lineno"))
    return lines


def _imported(node: ast.AST, module: str, is_package: bool) -> Iterator[str]:
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            base = (module if is_package else module.rpartition(".")[0]).split(".")
            base = base[: len(base) - node.level + 1]
            target = ".".join([*base, *([node.module] if node.module else [])])
        else:
            target = node.module or ""
        for alias in node.names:
            yield f"{target}.{alias.name}"  # a submodule, or a name of `target` (trimmed below)


def _edges() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skipped = _type_checking_lines(tree)
        for node in ast.walk(tree):
            if getattr(node, "lineno", None) in skipped:
                continue
            for target in _imported(node, name, path.name == "__init__.py"):
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def _layer(module: str) -> int:
    best, found = -1, -1
    for index, members in enumerate(LAYERS):
        for member in members:
            if (module == member or module.startswith(member + ".")) and len(member) > best:
                best, found = len(member), index
    assert found >= 0, f"{module} is in no layer: add its package to LAYERS"
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules (or packages) that import each other, each sorted."""
    digraph = networkx.DiGraph(
        (node, target) for node, targets in graph.items() for target in targets
    )
    return sorted(sorted(c) for c in networkx.strongly_connected_components(digraph) if len(c) > 1)


def _package(module: str) -> str:
    """The package a module belongs to, for the package-level graph."""
    for members in LAYERS:
        for member in sorted(members, key=len, reverse=True):
            if module == member or module.startswith(member + "."):
                return member
    return module


def test_no_module_imports_a_higher_layer() -> None:
    """rank -> launcher, launcher -> caller, anything -> api: each is an import that goes up."""
    upward = sorted(
        f"{module} imports {target}"
        for module, targets in _edges().items()
        for target in targets
        if _layer(target) > _layer(module)
        and (_package(module), _package(target)) not in _EXTENSION_ENTRY
    )
    assert upward == []


def test_no_import_cycle_between_modules() -> None:
    assert _cycles(_edges()) == []


def test_no_import_cycle_between_packages() -> None:
    packages: dict[str, set[str]] = {}
    for module, targets in _edges().items():
        own = _package(module)
        packages.setdefault(own, set()).update(
            _package(t)
            for t in targets
            if _package(t) != own and (own, _package(t)) not in _EXTENSION_ENTRY
        )
        for target in targets:
            packages.setdefault(_package(target), set())
    assert _cycles(packages) == []


def test_the_fitness_rules_see_an_upward_import() -> None:
    """The checks above are only as good as their reading of imports: a rank module importing
    the launcher, and a cycle, must be found."""
    graph = {
        "serverless_gpu.rank.main": {"serverless_gpu.launcher_process.loop"},
        "serverless_gpu.launcher_process.loop": set(),
    }
    assert _layer("serverless_gpu.rank.main") < _layer("serverless_gpu.launcher_process.loop")
    graph["serverless_gpu.launcher_process.loop"].add("serverless_gpu.rank.main")
    assert _cycles(graph) == [["serverless_gpu.launcher_process.loop", "serverless_gpu.rank.main"]]
    assert (
        "serverless_gpu.launcher_process.loop"
        in _edges()["serverless_gpu.launcher_process"]
        | _edges()["serverless_gpu.launcher_process.__main__"]
    )


def _undocumented_modules(section: str) -> list[str]:
    """Modules of the package and the extension that the architecture's module table leaves out
    (a module is named there in backticks, alone or in a dotted or described name)."""
    named = {
        word for quoted in re.findall(r"`([^`]+)`", section) for word in re.findall(r"\w+", quoted)
    }
    return [
        str(path.relative_to(_ROOT))
        for package in ("serverless_gpu", "jupyter_ext")
        for path in sorted((_ROOT / package).rglob("*.py"))
        if path.stem != "__init__" and path.stem not in named
    ]


def test_the_architecture_names_every_module() -> None:
    text = (_ROOT / "docs" / "architecture.md").read_text()
    section = text[text.index("\n## Modules") :]
    assert _undocumented_modules(section) == []
    assert "serverless_gpu/rank/main.py" in _undocumented_modules("`other`")  # the rule bites
