"""Backends are plug-ins (``serverless_gpu/backends/registry.py``): the built-ins by name, what
each supports, a third-party backend found through a real entry point (a ``*.dist-info`` folder
on ``sys.path``, as ``pip install`` leaves one), and no module outside ``backends/`` that
imports Ray."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from serverless_gpu import DistributedConfig, distributed, runtime
from serverless_gpu.backends import registry
from serverless_gpu.backends.local import LocalBackend
from serverless_gpu.common import backend_names
from serverless_gpu.common.errors import ConfigurationError

_ROOT = Path(__file__).resolve().parents[2]


def _install(
    site: Path, name: str, module_text: str, entry: str | None = None, dist: str | None = None
) -> str:
    """A package in ``site`` as an installer leaves one: the module ``<name>_mod`` and a
    dist-info whose entry point ``name`` (of the backends' group) is ``entry`` (default: the
    module's ``PLUGIN``). Returns the module's name."""
    module = f"{name}_mod"
    (site / f"{module}.py").write_text(textwrap.dedent(module_text), encoding="utf-8")
    info = site / f"{dist or name}-0.1.dist-info"
    info.mkdir()
    info.joinpath("METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {dist or name}\nVersion: 0.1\n", encoding="utf-8"
    )
    info.joinpath("entry_points.txt").write_text(
        f"[{backend_names.GROUP}]\n{name} = {entry or module + ':PLUGIN'}\n", encoding="utf-8"
    )
    return module


_DELEGATING = """\
    from serverless_gpu.backends import registry
    from serverless_gpu.backends.local import PLUGIN as LOCAL

    used = []

    def backend(config):
        used.append(config.backend)
        return LOCAL.backend(config)

    PLUGIN = registry.BackendPlugin(
        name={name!r},
        backend=backend,
        placement=LOCAL.placement,
        shutdown=lambda: used.append("shutdown"),
        stacks=True,
    )
"""
"""A third-party backend that runs its calls on the local backend, and says that it did."""


def _unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def test_the_builtins_are_known_without_installed_metadata() -> None:
    """The shared venv's metadata may predate the entry points: the built-ins resolve anyway."""
    assert registry.names()[:2] == ("local", "ray")
    assert registry.plugin("local").name == "local"
    assert registry.plugin("ray").name == "ray"
    assert registry.for_config(DistributedConfig()).name == "local"
    assert registry.for_config(DistributedConfig(remote=True)).name == "ray"
    assert registry.for_config(DistributedConfig(backend="ray")).name == "ray"


def test_the_builtins_say_what_they_support() -> None:
    local, ray = registry.plugin("local"), registry.plugin("ray")
    assert (local.sessions, local.stacks, local.standby) == (True, True, True)
    # Ray: sessions over TCP (its actors reach the caller at its cluster address), stacks
    # through the rank doctor, actors start with the call (nothing prepared at decoration).
    assert (ray.sessions, ray.stacks, ray.standby) == (True, True, False)
    assert local.session_host is None and ray.session_host is not None
    assert isinstance(local.backend(DistributedConfig()), LocalBackend)


def test_the_entry_points_declared_are_the_builtins() -> None:
    """pyproject.toml declares each built-in where the code knows it."""
    import tomllib

    declared = tomllib.loads((_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    group = declared["project"]["entry-points"][backend_names.GROUP]
    assert group == backend_names.BUILTINS


def test_an_unknown_backend_names_the_known_ones() -> None:
    known = r"backend must be 'local'(, | or )'ray'.*, not 'nope'"
    with pytest.raises(ConfigurationError, match=known):
        DistributedConfig(backend="nope")
    with pytest.raises(ConfigurationError, match=known):
        registry.plugin("nope")
    with pytest.raises(ConfigurationError, match="remote=True runs on Ray"):
        DistributedConfig(remote=True, backend="local")


def test_importing_the_registry_imports_no_backend() -> None:
    """Neither Ray nor a plug-in: only a lookup loads one (the package face imports the Ray
    backend's connection module for ``ray_init``, which imports Ray when called)."""
    code = (
        "import sys; import serverless_gpu.backends.registry, serverless_gpu.wire.config\n"
        "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.') "
        "or m.endswith('.plugin')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=_ROOT, check=True
    )
    assert out.stdout.strip() == "[]"


def test_a_shutdown_imports_no_backend_it_did_not_use() -> None:
    code = (
        "import sys, serverless_gpu\nserverless_gpu.shutdown()\n"
        "print('ray' in sys.modules, 'serverless_gpu.backends.ray.plugin' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=_ROOT, check=True
    )
    assert out.stdout.strip() == "False False"


def test_a_third_party_backend_runs_a_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Installed as a package with an entry point, named by the decorator, nothing else."""
    name = _unique("thirdparty")
    module = _install(tmp_path, name, _DELEGATING.format(name=name))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert name in registry.names()
    plugin = registry.plugin(name)
    assert (plugin.name, plugin.sessions, plugin.stacks, plugin.standby) == (
        name,
        False,
        True,
        False,
    )

    @distributed(gpus=2, gpu_type="cpu", backend=name)
    def rank() -> int:
        return runtime.get_global_rank()

    assert rank.distributed() == [0, 1]
    assert sys.modules[module].used == [name]
    registry.shutdown_all()  # every loaded backend stops what it started
    assert sys.modules[module].used == [name, "shutdown"]


def test_a_plugin_cannot_take_a_builtin_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An entry point named ``ray`` for another object is left out, loudly."""
    dist = _unique("shadow")
    _install(tmp_path, "ray", _DELEGATING.format(name="ray"), entry=f"{dist}_x:PLUGIN", dist=dist)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.warns(RuntimeWarning, match="takes the name of a built-in backend"):
        names = registry.names()
    assert names.count("ray") == 1
    assert registry.plugin("ray").session_host is not None, "the built-in, not the shadow"


def test_a_plugin_must_be_a_backend_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    name = _unique("notaplugin")
    _install(tmp_path, name, "PLUGIN = object()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigurationError, match="is not a BackendPlugin"):
        registry.plugin(name)


# -- fitness: Ray is the Ray backend's ---------------------------------------------------------

_RAY_DOORS = {
    "serverless_gpu/api/ray_launch.py": (
        "@ray_launch runs Ray-native code (Ray Train, Ray Data) on the cluster: it needs the "
        "connection (connect, local_cluster) itself, and it re-exports the original API's "
        "ray_init, so that the package face and serverless_gpu.ray import neither Ray nor the "
        "Ray backend. It cannot move into backends/ (it builds on api.decorator, a higher layer)."
    ),
}
"""Modules outside ``serverless_gpu/backends/`` that may name the Ray backend, with why."""


def _imports_of(path: Path) -> set[str]:
    """Every module an import statement of this file names (in functions too)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _names_ray(module: str) -> bool:
    return module == "ray" or module.startswith(("ray.", "serverless_gpu.backends.ray"))


def test_nothing_outside_the_backends_imports_ray() -> None:
    found = {}
    for source in ("serverless_gpu", "jupyter_ext"):
        for path in sorted((_ROOT / source).rglob("*.py")):
            relative = path.relative_to(_ROOT).as_posix()
            if relative.startswith("serverless_gpu/backends/"):
                continue
            named = sorted(filter(_names_ray, _imports_of(path)))
            if named:
                found[relative] = named
    assert set(found) <= set(_RAY_DOORS), f"Ray named outside backends/: {found}"
    assert set(_RAY_DOORS) <= set(found), "a door that no longer names Ray: drop it from the list"


def test_the_fitness_scan_sees_a_ray_import(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text(
        "def f():\n    from serverless_gpu.backends.ray import connect\n    import ray.util\n"
    )
    assert sorted(filter(_names_ray, _imports_of(path))) == [
        "ray.util",
        "serverless_gpu.backends.ray",
        "serverless_gpu.backends.ray.connect",
    ]
