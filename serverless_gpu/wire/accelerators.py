"""The newer spelling of the decorator's placement: ``num_accelerators=`` and
``accelerator_type=`` (``"GPU_8xH100"``, ``"GPU_1xA10"``, ``"H100"``, ``"h100_80gb"``, ``"cpu"``).

Code written for either generation of the original API runs unchanged: ``num_accelerators`` is
``gpus``; ``accelerator_type`` names a node shape (GPUs per node x GPU family), whose family is
``gpu_type`` and whose count bounds the ranks of one node (see
:attr:`~serverless_gpu.DistributedConfig.accelerator_type`). A legacy value without a count
(``"h100_80gb"``, ``"a10g"``) is a ``gpu_type``. Both spellings at once must agree.
"""

from __future__ import annotations

import enum
import re

from serverless_gpu.common.errors import ConfigurationError, GPUConfigError
from serverless_gpu.common.gpus import GPUType

NUM_ACCELERATORS = "num_accelerators"
ACCELERATOR_TYPE = "accelerator_type"
_SIZED = re.compile(r"GPU_(\d+)x([A-Za-z0-9]+)", re.IGNORECASE)


class AcceleratorType(str, enum.Enum):
    """Node shapes of the original API, for ``accelerator_type=``: GPUs per node x GPU family.

    Strings match case-insensitively (``AcceleratorType("gpu_8xh100")``); ``accelerator_type``
    also takes any other ``"GPU_<n>x<family>"`` of a :class:`GPUType` family (``"GPU_8xH200"``).
    """

    GPU_1xA10 = "GPU_1xA10"
    GPU_1xH100 = "GPU_1xH100"
    GPU_8xH100 = "GPU_8xH100"
    GPU_8xB300 = "GPU_8xB300"

    def __str__(self) -> str:
        return self.value

    @property
    def gpus_per_node(self) -> int:
        """How many GPUs one node of this shape has."""
        return int(_SIZED.fullmatch(self.value)[1])  # type: ignore[index]

    @property
    def gpu_type(self) -> GPUType:
        """The GPU family of this shape, as ``gpu_type`` names it."""
        return GPUType.parse(_SIZED.fullmatch(self.value)[2])  # type: ignore[index]

    @classmethod
    def values(cls) -> list[str]:
        """Every shape's name: ``["GPU_1xA10", "GPU_1xH100", "GPU_8xH100", "GPU_8xB300"]``."""
        return [member.value for member in cls]

    @classmethod
    def from_gpu_type(cls, gpu_type: GPUType | str, num_accelerators: int) -> AcceleratorType:
        """The shape a run of ``num_accelerators`` GPUs of a family gets: the family's one-GPU
        shape for one GPU when there is one, else its largest; a family without a shape here
        raises :class:`GPUConfigError` (the original's ``GPUTypeError``)."""
        family = GPUType.parse(gpu_type)
        shapes = sorted((m for m in cls if m.gpu_type is family), key=lambda m: m.gpus_per_node)
        if not shapes:
            raise GPUConfigError(
                f"no accelerator type has {family.value} GPUs; known: {', '.join(cls.values())}"
            )
        return shapes[0] if num_accelerators == 1 else shapes[-1]

    @classmethod
    def _missing_(cls, value: object) -> AcceleratorType:
        for member in cls:
            if isinstance(value, str) and member.value.lower() == value.strip().lower():
                return member
        known = ", ".join(m.value for m in cls)
        raise GPUConfigError(
            f"unknown accelerator type {value!r}; expected one of {known} (any case), or "
            f"'GPU_<n>x<family>' with a family of GPUType"
        )


def get_gpus_per_node(gpu_type: GPUType | str, gpus: int | None = None) -> int:
    """GPUs on one node of the shape a run of ``gpus`` GPUs of this family gets
    (:meth:`AcceleratorType.from_gpu_type`): ``(H100, 1)`` -> 1, ``(H100, 8)`` -> 8."""
    return AcceleratorType.from_gpu_type(gpu_type, gpus or 0).gpus_per_node


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


def node_shape(value: object) -> tuple[int | None, GPUType, str | None]:
    """``(GPUs per node or None, family, the shape's canonical name or None)``:
    ``"gpu_8xh100"`` -> ``(8, GPUType.H100, AcceleratorType.GPU_8xH100)``, ``"GPU_2xA10G"`` ->
    ``(2, GPUType.A10, "GPU_2xA10")``, ``"a10g"`` -> ``(None, GPUType.A10, None)``."""
    count, family_name = parse_accelerator_type(value)
    family = GPUType.parse(family_name)
    if count is None:
        return None, family, None
    name = f"GPU_{count}x{family.value}"
    try:
        return count, family, AcceleratorType(name)
    except GPUConfigError:
        return count, family, name


def one_count(gpus: object, num_accelerators: object) -> object:
    """The count given in either spelling; both given must be equal."""
    if gpus is not None and num_accelerators is not None and gpus != num_accelerators:
        raise ConfigurationError(
            f"gpus={gpus!r} and {NUM_ACCELERATORS}={num_accelerators!r} are two spellings of one "
            "option with different values: give one of them"
        )
    return num_accelerators if num_accelerators is not None else gpus
