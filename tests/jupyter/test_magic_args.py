"""Arguments of ``%%distributed``: both spellings, and a usage message for mistakes."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError

from jupyter_ext import magic_args
from jupyter_ext.magics import DistributedMagics

MAGIC = DistributedMagics.distributed


@pytest.mark.parametrize(
    "line",
    [
        "gpus=2 gpu_type=cpu timeout=30 --out vals",
        "--gpus 2 --gpu-type cpu --timeout 30 -o vals",
        "--gpus=2 --gpu_type=cpu --timeout=30 --out=vals",
    ],
)
def test_both_spellings_mean_the_same(line: str) -> None:
    args = magic_args.parse(MAGIC, line)
    assert (args.gpus, args.gpu_type, args.timeout, args.out) == (2, "cpu", 30.0, "vals")
    assert args.tracking


def test_defaults_and_switches() -> None:
    args = magic_args.parse(MAGIC, "")
    assert (args.gpus, args.gpu_type, args.out, args.output) == (None, None, None, "default")
    args = magic_args.parse(MAGIC, "timeout=none --no-tracking name='my run' output=all")
    assert (args.timeout, args.tracking, args.run_name, args.output) == (
        None,
        False,
        "my run",
        "all",
    )


@pytest.mark.parametrize(
    ("line", "complaint"),
    [
        ("gpus=0", "positive integer"),
        ("gpus=two", "positive integer"),
        ("timeout=-1", "positive number of seconds"),
        ("--out 1abc", "not a valid Python name"),
        ("--out class", "not a valid Python name"),
        ("--out None", "not a valid Python name"),
        ("output=loud", "invalid choice"),
        ("--bogus", "unrecognized arguments"),
        ("gpus='2", "cannot split"),
    ],
)
def test_mistakes_raise_usage_errors_with_the_usage(line: str, complaint: str) -> None:
    with pytest.raises(UsageError) as info:
        magic_args.parse(MAGIC, line)
    assert complaint in str(info.value)
    if "split" not in complaint:
        assert "%%distributed [--gpus GPUS]" in str(info.value)


def test_key_value_words_become_options() -> None:
    words = magic_args.normalize("gpus=2 --out x gpu_type='a b'")
    assert words == ["--gpus", "2", "--out", "x", "--gpu_type", "a b"]


def test_backend_is_one_of_the_registered_ones() -> None:
    """``--backend`` takes the registry's names (the built-ins, and installed plug-ins)."""
    assert magic_args.parse(MAGIC, "--backend ray").backend == "ray"
    assert magic_args.parse(MAGIC, "backend=local").backend == "local"
    with pytest.raises(UsageError, match=r"invalid choice: 'nope' \(choose from 'local', 'ray'"):
        magic_args.parse(MAGIC, "--backend nope")


@pytest.mark.parametrize("line", ["--remote", "--backend ray", "remote=True"])
def test_a_session_on_the_cluster_is_asked_as_a_call_is(line: str) -> None:
    from jupyter_ext import session_magic

    options = session_magic.session_options(magic_args.parse(MAGIC, f"--session s {line}"))
    assert options["remote"] or options["backend"] == "ray", options
    options = session_magic.session_options(magic_args.parse(MAGIC, "--session s --backend local"))
    assert options["gpus"] is None and not options["remote"]
