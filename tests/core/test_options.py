"""Options declared once (``common/options.py``): the decorator's signature, the magic's flags,
the command line's options and the job file's keys are those of the declarations, exactly, so
that a declaration missing from a surface, or a surface's option without one, fails here."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from serverless_gpu import ConfigurationError, DistributedConfig, distributed
from serverless_gpu.api.decorator import DistributedFunction
from serverless_gpu.common.options import CLI, JOB_FILE, MAGIC, SIGNATURE, declared

ALIASES = {"num_accelerators": "gpus"}
"""The original API's spelling of an option, named in the signature beside ours."""


def _named(function: Any) -> dict[str, inspect.Parameter]:
    parameters = inspect.signature(function).parameters
    return {
        name: p
        for name, p in parameters.items()
        if p.kind is not p.VAR_KEYWORD and name not in ("self", *ALIASES)
    }


def _declared(surface: str) -> dict[str, Any]:
    return {o.name: o.default for o in declared(DistributedConfig, surface)}


def test_the_decorators_signature_names_the_options_declared_for_it() -> None:
    """Explicit for IDEs (not a generated ``__signature__``): its names and defaults are the
    declarations'; every other option is a keyword of ``**options``."""
    named = _named(distributed)
    assert {n: p.default for n, p in named.items()} == _declared(SIGNATURE)
    assert set(_named(DistributedFunction.with_overrides)) == set(_declared(SIGNATURE))
    assert set(ALIASES.values()) <= set(_declared(SIGNATURE))


def test_every_option_is_a_keyword_of_the_decorator_and_no_other_word_is() -> None:
    for option in declared(DistributedConfig):
        fn = distributed(**{option.name: option.default})(print)
        assert getattr(fn.config, option.name) == DistributedConfig().__getattribute__(option.name)
    with pytest.raises(ConfigurationError, match="unknown option\\(s\\) for @distributed: bogus"):
        distributed(bogus=1)


def test_the_magics_flags_are_the_options_declared_for_it() -> None:
    from jupyter_ext.magics import DistributedMagics

    parser = DistributedMagics.distributed.parser  # type: ignore[union-attr]  # magic_arguments
    own = {"help", "out", "session", "run_async"}  # the magic's own: not options of a call
    flags = {a.dest: a.default for a in parser._actions if a.dest not in own}
    assert flags == _declared(MAGIC)


def test_the_command_lines_options_are_the_options_declared_for_it() -> None:
    from serverless_gpu.cli.app import run

    own = {"job_file", "as_module", "experiment", "env", "detach", "overrides", "watch"}
    own |= {"idempotency_key", "dry_run", "announce_fd", "job_fd", "command"}
    names = {p.name for p in run.params} - own
    assert names == set(_declared(CLI))


def test_the_job_files_keys_are_the_options_declared_for_it() -> None:
    from serverless_gpu.cli.jobfile import JobSpec

    own = {"command", "script", "module", "args", "env", "experiment_name"}
    keys = {k: f.default for k, f in JobSpec.model_fields.items() if k not in own}
    expected = {o.job_key: o.default for o in declared(DistributedConfig, JOB_FILE)}
    expected["timeout_minutes"] /= 60  # the file's unit
    assert keys == expected
    job = JobSpec.model_validate({"script": "t.py", "timeout_minutes": 2, "gpus": 3})
    assert job.config_options() == {**_declared(JOB_FILE), "timeout": 120.0, "gpus": 3}
