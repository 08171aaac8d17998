"""The original API's ``compute`` module, for notebooks that import from it: GPU families, node
shapes, and GPUs per node.

>>> from serverless_gpu.compute import AcceleratorType, GPUType, get_gpus_per_node
>>> GPUType("h100_80gb") is GPUType.H100
True
>>> AcceleratorType.from_gpu_type(GPUType.H100, 8).gpus_per_node
8
"""

from __future__ import annotations

from serverless_gpu.common.gpus import GPUType
from serverless_gpu.wire.accelerators import AcceleratorType, get_gpus_per_node

__all__ = ["AcceleratorType", "GPUType", "get_gpus_per_node"]
