"""The newer spelling: ``num_accelerators=`` and ``accelerator_type=`` as ``gpus``/``gpu_type``."""

from __future__ import annotations

import pytest

from serverless_gpu import ConfigurationError, GPUType, distributed, runtime


def world() -> tuple[int, str]:
    return runtime.get_world_size(), str(runtime.device())


def test_newer_spelling_runs_as_gpus_and_gpu_type() -> None:
    newer = distributed(num_accelerators=2, accelerator_type="cpu")(world)
    older = distributed(gpus=2, gpu_type="cpu")(world)
    assert newer.config == older.config
    assert list(newer.distributed()) == [(2, "cpu"), (2, "cpu")]


@pytest.mark.parametrize(
    ("options", "gpus", "gpu_type"),
    [
        ({"accelerator_type": "GPU_8xH100"}, 8, "H100"),
        ({"accelerator_type": "GPU_1xA10"}, 1, "A10"),
        ({"accelerator_type": "gpu_2xa10g"}, 2, "a10g"),
        ({"num_accelerators": 8, "accelerator_type": "GPU_8xH100"}, 8, "H100"),
        ({"gpus": 4, "accelerator_type": "H100"}, 4, "H100"),
        ({"num_accelerators": 2, "gpu_type": "cpu"}, 2, "cpu"),
        ({"accelerator_type": GPUType.CPU}, None, "CPU"),
    ],
)
def test_accelerator_types_parse_to_count_and_type(
    options: dict[str, object], gpus: int | None, gpu_type: str
) -> None:
    config = distributed(standby=False, **options)(world).config  # type: ignore[call-overload]
    assert (config.gpus, config.gpu_type) == (gpus, gpu_type)
    GPUType.parse(config.gpu_type)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"gpus": 2, "num_accelerators": 2}, "two spellings of one option"),
        ({"gpu_type": "cpu", "accelerator_type": "cpu"}, "two spellings of one option"),
        ({"num_accelerators": 4, "accelerator_type": "GPU_8xH100"}, "names 8 accelerators"),
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
