"""The original API's spelling: ``distributed(num_accelerators, accelerator_type, remote, timeout)``
with node shapes (``"GPU_8xH100"``), beside ``gpus=``/``gpu_type=``; ``with_overrides``."""

from __future__ import annotations

import warnings

import pytest

from serverless_gpu import ConfigurationError, DistributedFunction, distributed, runtime
from serverless_gpu.common.errors import GPUConfigError
from serverless_gpu.compute import AcceleratorType, GPUType


def world() -> tuple[int, str]:
    return runtime.get_world_size(), str(runtime.device())


def test_newer_spelling_runs_as_gpus_and_gpu_type() -> None:
    newer = distributed(num_accelerators=2, accelerator_type="cpu")(world)
    older = distributed(gpus=2, gpu_type="cpu")(world)
    assert newer.config == older.config
    assert list(newer.distributed()) == [(2, "cpu"), (2, "cpu")]


def test_positional_arguments_are_the_original_apis() -> None:
    """``distributed(num_accelerators, accelerator_type, remote, timeout)``, in that order."""
    fn = distributed(2, "GPU_8xH100", False, 60, standby=False)(world)
    assert (fn.num_accelerators, fn.accelerator_type, fn.remote, fn.timeout) == (
        2,
        AcceleratorType.GPU_8xH100,
        False,
        60,
    )
    assert (fn.gpus, fn.gpu_type) == (2, "H100")


def test_part_of_a_node_shape_runs_in_cpu_mode() -> None:
    """The documented local use, ``num_accelerators=2`` of a ``GPU_8xH100`` node: 2 ranks (here
    CPU ranks: ``SERVERLESS_GPU_TYPE=cpu``, which ignores the GPU family, as for gpu_type)."""

    @distributed(num_accelerators=2, accelerator_type="GPU_8xH100")
    def ranks() -> tuple[int, str]:
        return runtime.get_global_rank(), str(runtime.device())

    assert list(ranks.distributed()) == [(0, "cpu"), (1, "cpu")]


@pytest.mark.parametrize(
    ("value", "gpu_type", "shape"),
    [
        ("GPU_8xH100", "H100", AcceleratorType.GPU_8xH100),
        ("gpu_8xh100", "H100", AcceleratorType.GPU_8xH100),
        ("GPU_1xA10", "A10", AcceleratorType.GPU_1xA10),
        ("GPU_1xH100", "H100", AcceleratorType.GPU_1xH100),
        ("gpu_8XB300", "B300", AcceleratorType.GPU_8xB300),
        (AcceleratorType.GPU_8xB300, "B300", AcceleratorType.GPU_8xB300),
        ("gpu_2xa10g", "A10", "GPU_2xA10"),
        ("GPU_8xH200", "H200", "GPU_8xH200"),
        ("h100_80gb", "H100", None),
        ("a10", "A10", None),
        ("a10g", "A10", None),
        ("b300", "B300", None),
        (GPUType.CPU, "CPU", None),
    ],
)
def test_accelerator_types_name_a_family_and_a_node_shape(
    value: object, gpu_type: str, shape: object
) -> None:
    fn = distributed(accelerator_type=value, standby=False)(world)  # type: ignore[call-overload]
    assert GPUType.parse(fn.gpu_type) is GPUType.parse(gpu_type)
    assert fn.accelerator_type == shape
    assert fn.gpus is None  # the count is decided at call time (the visible GPUs, at most n)


def test_accelerator_type_enum() -> None:
    assert AcceleratorType("gpu_8xh100") is AcceleratorType.GPU_8xH100
    assert AcceleratorType.GPU_8xH100 == "GPU_8xH100"
    assert (AcceleratorType.GPU_8xB300.gpus_per_node, AcceleratorType.GPU_8xB300.gpu_type) == (
        8,
        GPUType.B300,
    )
    assert AcceleratorType.GPU_1xA10.gpus_per_node == 1
    with pytest.raises(GPUConfigError, match=r"unknown accelerator type 'GPU_3xH100'.*GPU_8xH100"):
        AcceleratorType("GPU_3xH100")


def test_legacy_h100_spelling_is_a_gpu_type() -> None:
    assert GPUType.parse("h100_80gb") is GPUType.H100


def _outside_cpu_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SERVERLESS_GPU_TYPE")


def test_a_local_call_runs_on_one_node_of_the_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    _outside_cpu_mode(monkeypatch)
    assert distributed(8, "GPU_8xH100", standby=False)(world).gpus == 8
    with pytest.raises(GPUConfigError, match=r"one node, of 8 GPU\(s\).*remote=True"):
        distributed(16, "GPU_8xH100", standby=False)


def test_a_remote_call_runs_on_whole_nodes_of_the_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    """``num_accelerators=16`` of ``GPU_8xH100`` with remote=True: 2 nodes of 8."""
    _outside_cpu_mode(monkeypatch)
    fn = distributed(16, "GPU_8xH100", remote=True, standby=False)(world)
    assert (fn.gpus, fn.config.gpus_per_node, fn.remote) == (16, 8, True)
    with pytest.raises(GPUConfigError, match=r"whole nodes of 8 GPU\(s\); ask for a multiple"):
        distributed(12, "GPU_8xH100", remote=True, standby=False)


@pytest.mark.parametrize(
    "options",
    [
        {"num_accelerators": 16, "accelerator_type": "GPU_8xH100"},
        {"num_accelerators": 12, "accelerator_type": "GPU_8xH100", "remote": True},
        {"num_accelerators": 16, "accelerator_type": "GPU_8xH100", "gpu_type": "cpu"},
    ],
)
def test_cpu_mode_ignores_the_shape_as_it_ignores_gpu_type(options: dict[str, object]) -> None:
    """What ``gpus=16, gpu_type="H100"`` accepts in CPU mode, the shape accepts too."""
    distributed(standby=False, **options)  # type: ignore[call-overload]
    distributed(gpus=options["num_accelerators"], gpu_type="H100", standby=False)  # type: ignore[call-overload]


def test_our_spelling_gives_no_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fn = distributed(gpus=2, gpu_type="cpu", standby=False)(world)
        fn.with_overrides(gpus=1, gpu_type="cpu")


@pytest.mark.parametrize(
    "options",
    [
        {"gpus": 2, "num_accelerators": 2},
        {"gpu_type": "H100", "accelerator_type": "GPU_8xH100"},
        {"gpu_type": "h100", "accelerator_type": "h100_80gb"},
    ],
)
def test_both_spellings_that_agree_are_accepted(options: dict[str, object]) -> None:
    distributed(standby=False, **options)  # type: ignore[call-overload]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"gpus": 2, "num_accelerators": 4}, "two spellings of one option with different values"),
        (
            {"gpu_type": "A10", "accelerator_type": "GPU_8xH100"},
            "two spellings of one option with different values",
        ),
        ({"accelerator_type": "GPU_0xH100"}, "names no accelerator"),
        ({"accelerator_type": 8}, "must be a string"),
        ({"accelerator_type": "GPU_8xZ9"}, "unknown gpu_type 'Z9'"),
    ],
)
def test_conflicting_or_malformed_spellings_are_refused(
    options: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        distributed(standby=False, **options)  # type: ignore[call-overload]


# -- with_overrides ---------------------------------------------------------------------------


def test_with_overrides_returns_a_new_function_keeping_what_is_omitted() -> None:
    base = distributed(2, "GPU_8xH100", timeout=600, run_name="base", standby=False)(world)
    changed = base.with_overrides(timeout=None)
    assert isinstance(changed, DistributedFunction) and changed is not base
    assert changed.func is base.func
    assert (changed.timeout, base.timeout) == (None, 600)
    kept = ("num_accelerators", "accelerator_type", "gpus", "gpu_type", "remote")
    assert [getattr(changed, k) for k in kept] == [getattr(base, k) for k in kept]
    assert changed.config.run_name == "base"
    assert base.with_overrides().config == base.config


def test_with_overrides_of_count_type_and_remote(monkeypatch: pytest.MonkeyPatch) -> None:
    _outside_cpu_mode(monkeypatch)
    base = distributed(2, "GPU_8xH100", standby=False)(world)
    assert base.with_overrides(1).accelerator_type is AcceleratorType.GPU_8xH100
    assert base.with_overrides(gpus=4).num_accelerators == 4
    other = base.with_overrides(1, "GPU_1xA10")
    assert (other.gpu_type, other.accelerator_type, other.gpus) == ("A10", "GPU_1xA10", 1)
    with pytest.raises(GPUConfigError, match="num_accelerators=2 with accelerator_type"):
        base.with_overrides(accelerator_type="GPU_1xA10")  # the kept count is checked too
    plain = base.with_overrides(gpu_type="a10g")  # our spelling drops the node shape
    assert (plain.gpu_type, plain.accelerator_type) == ("a10g", None)
    remote = base.with_overrides(16, remote=True)
    assert (remote.remote, remote.gpus, base.remote) == (True, 16, False)
    assert remote.with_overrides(remote=False, num_accelerators=8).remote is False
    with pytest.raises(ConfigurationError, match="different values"):
        base.with_overrides(4, gpus=2)
    with pytest.raises(ConfigurationError, match=r"unknown option.*with_overrides: colour"):
        base.with_overrides(colour="red")


def test_with_overrides_runs_the_new_count() -> None:
    @distributed(num_accelerators=1, accelerator_type="cpu")
    def rank() -> int:
        return runtime.get_global_rank()

    assert list(rank.with_overrides(num_accelerators=2).distributed()) == [0, 1]
