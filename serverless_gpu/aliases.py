"""The newer spelling of the decorator's placement: ``num_accelerators=`` and
``accelerator_type=`` (``"GPU_8xH100"``, ``"GPU_1xA10"``, ``"H100"``, ``"cpu"``).

Code written for either generation of the original API runs unchanged: the aliases are turned
into ``gpus`` and ``gpu_type`` before the configuration is checked. Giving a placement in both
spellings is an error, as is an accelerator type whose count disagrees with the count given.
"""

from __future__ import annotations

import re
from typing import Any

from .errors import ConfigurationError
from .gpus import GPUType

NUM_ACCELERATORS = "num_accelerators"
ACCELERATOR_TYPE = "accelerator_type"
_SIZED = re.compile(r"GPU_(\d+)x([A-Za-z0-9]+)", re.IGNORECASE)


def parse_accelerator_type(value: object) -> tuple[int | None, str]:
    """``"GPU_8xH100"`` -> ``(8, "H100")``; ``"H100"`` or ``"cpu"`` -> ``(None, value)``."""
    if isinstance(value, GPUType):
        return None, value.value
    if not isinstance(value, str):
        raise ConfigurationError(
            f"{ACCELERATOR_TYPE} must be a string such as 'GPU_8xH100', 'H100' or 'cpu', "
            f"not {value!r}"
        )
    match = _SIZED.fullmatch(value.strip())
    if match is None:
        return None, value
    count = int(match[1])
    if count < 1:
        raise ConfigurationError(f"{ACCELERATOR_TYPE}={value!r} names no accelerator")
    return count, match[2]


def resolve_aliases(
    gpus: Any, gpu_type: Any, options: dict[str, Any]
) -> tuple[Any, Any, dict[str, Any]]:
    """``(gpus, gpu_type, the other options)`` with the newer spelling's options folded in."""
    options = dict(options)
    given_count = NUM_ACCELERATORS in options
    given_type = ACCELERATOR_TYPE in options
    count = options.pop(NUM_ACCELERATORS, None)
    accelerator = options.pop(ACCELERATOR_TYPE, None)
    if given_count and gpus is not None:
        raise ConfigurationError(
            f"gpus={gpus!r} and {NUM_ACCELERATORS}={count!r} are two spellings of one option: "
            "give one of them"
        )
    if given_type and gpu_type is not None:
        raise ConfigurationError(
            f"gpu_type={gpu_type!r} and {ACCELERATOR_TYPE}={accelerator!r} are two spellings of "
            "one option: give one of them"
        )
    if given_count:
        gpus = count
    if given_type and accelerator is not None:
        sized, gpu_type = parse_accelerator_type(accelerator)
        if sized is not None:
            if gpus is not None and gpus != sized:
                raise ConfigurationError(
                    f"{ACCELERATOR_TYPE}={accelerator!r} names {sized} accelerators but "
                    f"{gpus!r} were asked for: one node runs one count"
                )
            gpus = sized
    return gpus, gpu_type, options
