"""Job files (``serverless-gpu run -f job.yaml``): a YAML mapping checked against a schema.

    command: python train.py --epochs 2   # or script: train.py + args: [...], or module: pkg
    gpus: 2
    gpu_type: cpu
    timeout_minutes: 30
    env: {OMP_NUM_THREADS: 1}
    experiment_name: nightly
    run_name: mlp-nightly
    max_retries: 0
    remote: false

The schema is :class:`JobSpec` (pydantic); an error names the file, the line and the key.
Relative paths are relative to the current directory, as on the command line. A file with a
``compute`` block is one of the ``air`` CLI's format instead (:mod:`.airjob`); both formats
take ``_bases_`` and ``--override key=value``.
"""

from __future__ import annotations

import copy
import difflib
import os
import shlex
import stat
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
)

from serverless_gpu.api.scripts import ScriptTarget
from serverless_gpu.cli.jobtypes import EnvName, EnvValue, Text
from serverless_gpu.cli.overrides import air_overrides
from serverless_gpu.common.errors import ConfigurationError
from serverless_gpu.common.options import JOB_FILE, declared
from serverless_gpu.wire.config import DistributedConfig

if TYPE_CHECKING:
    from serverless_gpu.cli.airjob import AirJob

_PYTHONS = {"python", "python3"}
MAX_JOB_FILE_BYTES = 1 << 20
"""A job file is a few lines; anything larger is not one (``/dev/zero`` never ends)."""
MAX_ALIAS_NODES = 10_000
"""How many values YAML aliases (``*name``) may add to a job file once expanded: each alias
is a copy of what it names, so a few hundred bytes of aliases of aliases expand to 10**10
values, which checking and printing would take minutes and all the memory to build."""


class _JobFile(BaseModel):
    """What a job runs and its environment; the call's options are added from their
    declarations (:func:`_option_fields`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    command: str | list[Text] | None = None
    """``python script.py args`` or ``python -m module args`` (a string or a list)."""
    script: str | None = None
    module: str | None = None
    args: list[Text] = Field(default_factory=list)
    env: dict[EnvName, EnvValue] = Field(default_factory=dict)
    experiment_name: str | None = None

    def target(self) -> ScriptTarget:
        """The script or module every rank runs."""
        given = [k for k in ("command", "script", "module") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ConfigurationError(
                "give exactly one of command, script or module"
                + (f" (got {', '.join(given)})" if given else "")
            )
        if self.command is not None:
            return _parse_command(self.command, self.args)
        if self.module is not None:
            return ScriptTarget(module=self.module, args=tuple(self.args))
        assert self.script is not None
        return ScriptTarget.script(self.script, tuple(self.args))

    def config_options(self) -> dict[str, Any]:
        """The call's options the job sets (all of the job file's), by the decorator's names:
        ``timeout_minutes: 30`` is ``timeout=1800``."""
        values = {}
        for option in declared(DistributedConfig, JOB_FILE):
            value = getattr(self, option.job_key)
            if value is not None and option.option.job_unit != 1:
                value *= option.option.job_unit
            values[option.name] = value
        return values


def _option_fields() -> dict[str, Any]:
    """A key for each option declared for job files: its type (``None`` allowed where the
    option allows it), its default and its limits, in the job file's unit."""
    fields: dict[str, Any] = {}
    for option in declared(DistributedConfig, JOB_FILE):
        kind, default = option.kind, option.default
        schema: Any = kind.schema
        if default is None or kind.none_word:
            schema = schema | None
        if default is not None and option.option.job_unit != 1:
            default /= option.option.job_unit
        fields[option.job_key] = (schema, Field(default=default, **kind.bounds))
    return fields


if TYPE_CHECKING:
    _Job = _JobFile
else:
    _Job = create_model("_Job", __base__=_JobFile, **_option_fields())


class JobSpec(_Job):
    """A run, from a job file or the command line's options. Its keys: ``_JobFile``'s, and
    one per option declared for job files (``gpus``, ``timeout_minutes``, ...)."""


def _parse_command(command: str | list[str], extra: list[str]) -> ScriptTarget:
    argv = shlex.split(command) if isinstance(command, str) else list(command)
    if argv and Path(argv[0]).name in _PYTHONS:
        argv = argv[1:]
    if len(argv) >= 2 and argv[0] == "-m":
        return ScriptTarget(module=argv[1], args=(*argv[2:], *extra))
    if argv and argv[0].endswith(".py"):
        return ScriptTarget.script(argv[0], (*argv[1:], *extra))
    raise ConfigurationError(
        f"command {command!r} does not run a Python script: every rank runs it in-process, so "
        "it must read 'python script.py args' or 'python -m module args'"
    )


def load_job(path: str | Path, overrides: Sequence[str] = ()) -> JobSpec | AirJob:
    """The job file as a :class:`JobSpec`, or an :class:`~.airjob.AirJob` for a file of air's
    format (see :func:`~.airjob.is_air_format`), its ``_bases_`` merged under it and the
    ``--override key=value`` items applied; a ConfigurationError names the line and the key."""
    from serverless_gpu.cli.airjob import (  # airjob builds on this module's types
        AirJob,
        is_air_format,
    )

    path = Path(path)
    node, data = _parse(path)
    data = _with_bases(path, data, frozenset())
    if is_air_format(data):  # air types a value as the one it replaces
        overrides = air_overrides(data, overrides)
    data = apply_overrides(data, overrides)
    air = is_air_format(data)
    model: type[BaseModel] = AirJob if air else JobSpec
    try:
        job = model.model_validate(data)
    except ValidationError as exc:
        raise ConfigurationError(_describe(path, node, exc, model, air)) from None
    assert isinstance(job, (JobSpec, AirJob))
    return job


def _parse(path: Path) -> tuple[yaml.MappingNode, dict[str, Any]]:
    """The file's mapping, as a YAML node (for line numbers) and as data."""
    text = _read_text(path)
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        _check_aliases(f"job file {path}", node)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        raise ConfigurationError(f"{path}{where}: not valid YAML: {exc}") from None
    except RecursionError:
        raise ConfigurationError(
            f"job file {path}: nested too deeply to be a job file (lists or mappings inside "
            "each other thousands of times)"
        ) from None
    if not isinstance(node, yaml.MappingNode) or not isinstance(data, dict):
        line = node.start_mark.line + 1 if node is not None else 1
        raise ConfigurationError(f"{path}:{line}: a job file is a mapping of keys (gpus: 2, ...)")
    _check_duplicates(path, node)
    return node, data


def _with_bases(path: Path, data: dict[str, Any], seen: frozenset[Path]) -> dict[str, Any]:
    """``_bases_: [a.yaml, ...]`` (paths relative to the file): merged in order, each under
    the next and all under the file's own keys (mappings merged key by key)."""
    bases = data.pop("_bases_", None)
    if bases is None:
        return data
    if not isinstance(bases, list) or not all(isinstance(b, str) for b in bases):
        raise ConfigurationError(f"{path}: _bases_ is a list of YAML paths, not {bases!r}")
    seen = seen | {path.resolve()}
    merged: dict[str, Any] = {}
    for base in bases:
        base_path = path.parent / base
        if base_path.resolve() in seen:
            raise ConfigurationError(f"{path}: _bases_ includes {base_path} again (a cycle)")
        merged = _merge(merged, _with_bases(base_path, _parse(base_path)[1], seen))
    return _merge(merged, data)


def _merge(under: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    merged = dict(under)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            value = _merge(merged[key], value)
        merged[key] = value
    return merged


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """``key.sub=value`` items set into ``data`` (a copy); the value is read as YAML, so
    ``compute.num_accelerators=2`` is a number and ``parameters.tags=[a, b]`` a list."""
    data = copy.deepcopy(data)
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ConfigurationError(
                f"--override takes KEY=VALUE (compute.num_accelerators=2), not {item!r}"
            )
        *parents, last = key.strip().split(".")
        target = data
        for i, part in enumerate(parents):
            target = target.setdefault(part, {})
            if not isinstance(target, dict):
                where = ".".join(parents[: i + 1])
                raise ConfigurationError(f"--override {item!r}: {where} is not a mapping")
        try:
            _check_aliases(f"--override {key}", yaml.compose(text, Loader=yaml.SafeLoader))
            target[last] = yaml.safe_load(text) if text else ""
        except yaml.YAMLError:
            target[last] = text
    return data


def _check_aliases(what: str, root: yaml.Node | None) -> None:
    """Refuse YAML whose aliases expand it past :data:`MAX_ALIAS_NODES` extra values, counted
    on the composed graph (each node once, in time linear in the text) before it is built."""
    written: set[int] = set()
    expanded: dict[int, int] = {}

    def count(node: yaml.Node) -> int:
        key = id(node)
        if key in expanded:
            return expanded[key]
        expanded[key] = MAX_ALIAS_NODES + 1  # an alias of a node inside itself: unbounded
        written.add(key)
        total = 1
        for child in _children(node):
            total = min(total + count(child), 1 << 62)
        expanded[key] = total
        return total

    extra = count(root) - len(written) if root is not None else 0
    if extra > MAX_ALIAS_NODES:
        raise ConfigurationError(
            f"{what}: its YAML aliases (*name) expand it by more than {MAX_ALIAS_NODES:,} "
            "values, far more than a job's settings: write the values out, or alias less"
        )


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _read_text(path: Path) -> str:
    """The file's text; only a regular file of at most :data:`MAX_JOB_FILE_BYTES` is read (a
    FIFO is opened without waiting for a writer, and refused)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigurationError(f"cannot read job file {path}: {exc.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ConfigurationError(
            f"job file {path}: not a regular file (give the path of a YAML file)"
        )
    with os.fdopen(fd, "rb") as f:
        try:
            raw = f.read(MAX_JOB_FILE_BYTES + 1)
        except OSError as exc:
            raise ConfigurationError(f"cannot read job file {path}: {exc.strerror}") from None
    if len(raw) > MAX_JOB_FILE_BYTES:
        raise ConfigurationError(
            f"job file {path}: larger than {MAX_JOB_FILE_BYTES >> 20} MiB, so not a job file"
        )
    try:
        return raw.decode()
    except UnicodeDecodeError as exc:
        raise ConfigurationError(
            f"job file {path}: not UTF-8 text ({exc.reason} at byte {exc.start})"
        ) from None


def _check_duplicates(path: Path, node: yaml.MappingNode) -> None:
    seen: dict[Any, int] = {}
    for key, _ in node.value:
        if key.value in seen:
            raise ConfigurationError(
                f"{path}:{key.start_mark.line + 1}: key {key.value!r} appears twice "
                f"(first on line {seen[key.value]})"
            )
        seen[key.value] = key.start_mark.line + 1


def _describe(
    path: Path, node: yaml.Node, exc: ValidationError, model: type[BaseModel], air: bool
) -> str:
    lines = []
    for error in exc.errors():
        line, found = _line_of(node, tuple(error["loc"]))
        if error["loc"][-1:] == ("[key]",):  # a mapping's key: the line is the key's own
            found = found[:-1]
        if error["type"] == "missing":  # not in the file, so not found in it: name it whole
            found = list(error["loc"])
        key = ".".join(str(part) for part in found) or "(job)"
        if error["type"] == "extra_forbidden":
            lines.append(f"{path}:{line}: unknown key {key!r} ({_known(key, model, air)})")
        else:
            lines.append(f"{path}:{line}: {key}: {error['msg']}")
    return "\n".join(lines)


def _known(key: str, model: type[BaseModel], air: bool) -> str:
    """A hint for an unknown key: its place in this format when it belongs to the other
    one, else the closest known key, else the known keys."""
    from serverless_gpu.cli.airjob import mapping_hint

    mapped = mapping_hint(key, air)
    if mapped is not None:
        return mapped
    fields = _fields_at(model, key.split(".")[:-1])
    hint = difflib.get_close_matches(key.rpartition(".")[2], fields, n=1)
    return f"did you mean {hint[0]!r}?" if hint else "known keys: " + ", ".join(fields)


def _fields_at(model: type[BaseModel], parents: list[str]) -> list[str]:
    """The field names of the (nested) model ``parents`` lead to."""
    for name in parents:
        field = model.model_fields.get(name)
        inner = (
            [t for t in typing.get_args(field.annotation) or (field.annotation,)] if field else []
        )
        found = [t for t in inner if isinstance(t, type) and issubclass(t, BaseModel)]
        if not found:
            break
        model = found[0]
    return list(model.model_fields)


def _line_of(node: yaml.Node, loc: tuple[Any, ...]) -> tuple[int, list[Any]]:
    """The line of the key (or item) that ``loc`` leads to, and the part of ``loc`` the YAML
    has (pydantic adds the names of union members, such as ``str``)."""
    line, found = node.start_mark.line + 1, []
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            match = next(((k, v) for k, v in node.value if k.value == str(part)), None)
            if match is None:
                break
            line, node = match[0].start_mark.line + 1, match[1]
        elif (
            isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value)
        ):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
        found.append(part)
    return line, found
